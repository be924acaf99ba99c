"""`butter extract -j N`: copying several files at once changes nothing but the time.

The kernel makes each image and is the oracle: the manifest of its mount. One image holds
the generated tree (holes, prealloc, xattrs and ACLs, every file type, subvolumes), a
directory of 2 000 entries, and hard links across directories whose first names carry
data from empty to several MiB, everything written with compress=zstd; it is extracted
with -j 4 and -j 1, and each result must match the kernel's manifest. Both runs must
walk in the same order (-v lists the same paths in the same order).

The other image has data blocks flipped on its only copy, in files among many others:
with -j 4 (and -j 1) the command must exit 1, name each bad range exactly as
"butter: /PATH: unreadable bytes START-END: Input/output error", leave the bad sector a
hole, and extract everything else exactly. Both runs print the same messages (their
order may differ).
"""
import collections
import os

from butter_it import kfs, manifest, tree
from butter_it.butter import failed

KiB = 1024
MiB = 1 << 20


def linked_files(root):
    """hl-a/fNN (sizes 0 to 2 MiB+3, text or random, some with xattrs), with second
    names in hl-b/deep/ and (every third) third names in hl-c/."""
    content = tree.Content.of(11)
    for d in ("hl-a", "hl-b/deep", "hl-c"):
        os.makedirs(os.path.join(root, d))
    sizes = [0, 1, 5000, 70000, 2 * MiB + 3, 300 * KiB]
    for i in range(60):
        size = sizes[i % len(sizes)]
        p = os.path.join(root, "hl-a", f"f{i:02d}")
        with open(p, "wb") as f:
            for chunk in content.chunks(f"hl-{i}", size, "random" if i % 2 else "text"):
                f.write(chunk)
        if i % 4 == 0:
            os.setxattr(p, "user.linked", f"value-{i}".encode())
        os.chmod(p, 0o640 if i % 2 else 0o604)
        os.utime(p, ns=(1_500_000_000 * 10**9 + i, 1_400_000_000 * 10**9 + 7 * i))
        os.link(p, os.path.join(root, "hl-b", "deep", f"g{i:02d}"))
        if i % 3 == 0:
            os.link(p, os.path.join(root, "hl-c", f"h{i:02d}"))


def run_extract(butter, images, dest, jobs, *extra):
    argv = ["extract", "-j", str(jobs)] + list(extra) + butter.device_args(images) + [dest]
    return butter.run(argv, check=False)


def test_parallel_extract_matches_kernel(kernel, butter, workdir):
    with kfs.kernel_fs(workdir, mount_opts=["compress=zstd"]) as fs:
        tree.populate(fs.mnt)
        tree.populate_many(fs.mnt, "many-more", 2000, seed=5)
        linked_files(fs.mnt)
        fs.sync()
        src = manifest.take(fs.mnt)
        fs.release()
    names = collections.Counter((e["_dev"], e["_ino"]) for e in src.values()
                                if e["type"] == "file")
    links = sum(n for n in names.values() if n > 1)
    assert src.count("file") > 2000 and links >= 100, \
        f"the tree is not what the test needs: {src.count('file')} files, {links} linked names"

    listings = {}
    for jobs in (4, 1):
        dest = os.path.join(workdir, f"extracted-j{jobs}")
        proc = run_extract(butter, fs.images, dest, jobs, "-v")
        assert proc.returncode == 0 and not proc.stderr, \
            f"extract -j {jobs}: status {proc.returncode}, stderr:\n{proc.stderr[-3000:]}"
        manifest.assert_same(src, manifest.take(dest))
        listings[jobs] = proc.stdout.split(b"\n")
    assert listings[4] == listings[1], "-j 4 and -j 1 walked the tree in different orders"
    assert len(listings[1]) > len(src) // 2


def victim_blocks(root, names):
    """[(rel, file offset, logical, the 4 KiB expected there)]: one block of each file,
    the second 4 KiB of its first extent."""
    found = []
    for name in names:
        path = os.path.join(root, name)
        off, logical, length, flags = kfs.fiemap(path)[0]
        assert not flags & (kfs.FIEMAP_EXTENT_ENCODED | kfs.FIEMAP_EXTENT_DATA_INLINE), \
            f"{name}: its first extent is compressed or inline"
        assert length > 4096, f"{name}: first extent of {length} bytes"
        with open(path, "rb") as f:
            f.seek(off + 4096)
            found.append((name, off + 4096, logical + 4096, f.read(4096)))
    return found


def test_parallel_extract_unreadable_blocks(kernel, butter, workdir):
    victims = {"victims/a": 256 * KiB, "victims/sub/b": 1 * MiB + 5, "victims/c": 64 * KiB,
               "many/victim-d": 3 * MiB}
    with kfs.kernel_fs(workdir, mkfs_args=["-d", "single", "-m", "single"]) as fs:
        tree.small_tree(fs.mnt)
        tree.populate_many(fs.mnt, "many", 1500, seed=7)
        content = tree.Content.of(9)
        for rel, size in victims.items():
            p = os.path.join(fs.mnt, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                for chunk in content.chunks(f"victim-{rel}", size, "random"):
                    f.write(chunk)
        fs.sync()
        src = manifest.take(fs.mnt)
        blocks = victim_blocks(fs.mnt, sorted(victims))
        originals = {rel: tree.read_file(os.path.join(fs.mnt, rel)) for rel in victims}
        fs.umount()
        chunks, devids = fs.chunk_map(), fs.devids()
        fs.detach()

    for rel, off, logical, expected in blocks:
        (devid, phys), = chunks.locate(logical)
        assert kfs.read_image(devids[devid], phys, 4096) == expected, \
            f"mapping check failed for {rel}@{off}: logical {logical} -> devid {devid} {phys}"
        kfs.flip_bytes(devids[devid], phys + 100, 64)
    want = sorted(f"butter: /{rel}: unreadable bytes {off}-{off + 4095}: Input/output error"
                  for rel, off, _, _ in blocks)

    messages = {}
    for jobs in (4, 1):
        dest = os.path.join(workdir, f"extracted-j{jobs}")
        proc = run_extract(butter, fs.images, dest, jobs)
        assert failed(proc), \
            f"extract -j {jobs}: status {proc.returncode} (want 1), stderr:\n{proc.stderr[-3000:]}"
        ours = sorted(l for l in proc.stderr.splitlines() if "unreadable bytes" in l)
        assert ours == want, f"extract -j {jobs}: messages {ours}, want {want}"
        messages[jobs] = sorted(proc.stderr.splitlines())
        manifest.assert_same(src, manifest.take(dest), exclude=list(victims))
        for rel, off, _, _ in blocks:
            with open(os.path.join(dest, rel), "rb") as f:
                got = f.read()
            orig = originals[rel]
            assert len(got) == len(orig), f"-j {jobs}: {rel}: {len(got)} bytes, want {len(orig)}"
            assert got[off:off + 4096] == bytes(4096), \
                f"-j {jobs}: {rel}: the unreadable sector at {off} is not left as zeros"
            assert got[:off] == orig[:off] and got[off + 4096:] == orig[off + 4096:], \
                f"-j {jobs}: {rel}: bytes outside the unreadable sector differ"
            st = os.stat(os.path.join(dest, rel))
            assert st.st_mtime_ns == src[rel]["mtime_ns"] and \
                (st.st_mode & 0o7777) == src[rel]["mode"], \
                f"-j {jobs}: {rel}: attributes not set after the failed read"
    assert messages[4] == messages[1], \
        f"-j 4 and -j 1 printed different messages:\n{messages[4]}\n{messages[1]}"
