"""`butter filesystem du --compression` against compsize(8) on the kernel's mount.

The kernel writes an image with every way data is stored: plain, zlib, lzo and zstd
compressed files, inline files, a preallocated range, holes, reflinked copies, a hard link
and a snapshot sharing everything with its origin; butter adds compressed files through its
own mount. compsize on a kernel mount of the image is the oracle: butter's report must be
the same text, byte for byte, read from the image offline, through a butter mount (the
TREE_SEARCH ioctl the daemon answers) and on the kernel's mount, for the whole filesystem and
for a set of paths that share extents, in short sizes and in bytes (-b).
"""
import os
import shutil
import subprocess

import pytest

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount


def populate_with_kernel(k):
    os.makedirs(f"{k}/plain")
    with open(f"{k}/plain/text", "wb") as f:
        f.write(b"".join(b"%d\n" % i for i in range(200000)))
    with open(f"{k}/plain/random", "wb") as f:
        f.write(os.urandom(1 << 20))
    with open(f"{k}/plain/small", "w") as f:
        f.write("inline\n")
    with open(f"{k}/plain/sparse", "wb") as f:
        f.seek(1 << 20)
        f.write(b"tail" * 1000)
    kfs.run(["fallocate", "-l", "2M", f"{k}/plain/prealloc"])
    for algo in ("zlib", "lzo", "zstd"):
        os.makedirs(f"{k}/{algo}")
        kfs.run(["btrfs", "property", "set", f"{k}/{algo}", "compression", algo])
        with open(f"{k}/{algo}/text", "wb") as f:
            f.write(b"".join(b"line %d of %s\n" % (i, algo.encode()) for i in range(100000)))
        with open(f"{k}/{algo}/small", "wb") as f:
            f.write(b"a" * 1500)
    kfs.run(["cp", "--reflink=always", f"{k}/zstd/text", f"{k}/plain/reflink"])
    os.link(f"{k}/zlib/text", f"{k}/plain/hardlink")
    kfs.run(["btrfs", "subvolume", "create", f"{k}/vol"])
    with open(f"{k}/vol/data", "wb") as f:
        f.write(b"subvolume data\n" * 50000)
    kfs.run(["btrfs", "subvolume", "snapshot", f"{k}/vol", f"{k}/snap"])


def run(argv):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=300)


def test_du_compression_like_compsize(fuse, butter, workdir):
    if not shutil.which("compsize"):
        pytest.skip("compsize is not installed (apt-get install btrfs-compsize)")
    b = butter.path
    image = os.path.join(workdir, "img")
    kfs.make_image(image, 1 << 30)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "k0"), opts=("compress=zstd",)) as k:
        populate_with_kernel(k)
    with FuseMount(b, [image], os.path.join(workdir, "m0"), ["compress=zlib"]) as m:
        with open(f"{m.mnt}/vol/by-butter", "wb") as f:
            f.write(b"written through butter's mount\n" * 40000)
    sets = [[""], ["plain", "zstd"], ["vol", "snap"], ["plain/reflink", "zstd/text"]]
    want = {}
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "k1")) as k:
        for paths in sets:
            for raw in ([], ["-b"]):
                r = run(["compsize"] + raw + [os.path.join(k, p) for p in paths])
                assert r.returncode == 0, r.stderr
                want[(tuple(paths), tuple(raw))] = r.stdout
                # butter's command reads the kernel's mount the same way
                r = run([b, "filesystem", "du", "--compression"] + raw +
                        [os.path.join(k, p) for p in paths])
                assert (r.returncode, r.stdout) == (0, r.stdout) and r.stdout == want[
                    (tuple(paths), tuple(raw))], (paths, raw, r.stdout, r.stderr)
        r = run(["compsize", os.path.join(k, "nonexistent")])
        assert r.returncode != 0
    # the whole set is reached: every kind appears
    whole = want[(("",), ())]
    for kind in ("none", "zlib", "lzo", "zstd", "prealloc"):
        assert f"\n{kind} " in whole, whole
    # offline, from the image
    for (paths, raw), text in want.items():
        r = run([b, "filesystem", "du", "--compression", *raw, image] +
                ["/" + p for p in paths])
        assert r.returncode == 0 and r.stdout == text, (paths, raw, r.stdout, r.stderr, text)
    # through butter's mount
    with FuseMount(b, [image], os.path.join(workdir, "m1"), ["ro"]) as m:
        for (paths, raw), text in want.items():
            r = run([b, "filesystem", "du", "--compression", *raw] +
                    [os.path.join(m.mnt, p) for p in paths])
            assert r.returncode == 0 and r.stdout == text, (paths, raw, r.stdout, r.stderr, text)
        r = run([b, "filesystem", "du", "--compression", os.path.join(m.mnt, "nonexistent")])
        assert r.returncode == 1 and "nonexistent" in r.stderr and r.stdout == ""
    r = run([b, "filesystem", "du", "--compression", image, "/nonexistent"])
    assert r.returncode == 1 and "nonexistent" in r.stderr and r.stdout == ""
    r = run([b, "filesystem", "du", "--compression", "--bogus", image])
    assert r.returncode == 2 and "--bogus" in r.stderr


def test_du_like_btrfs_progs(fuse, butter, workdir):
    """`butter filesystem du` (total, exclusive, set shared) equals `btrfs filesystem du` on the
    kernel's mount of the same image: reflinked copies, a snapshot partly rewritten since, a
    hard link (counted once), an extent split by a punched hole (not shared with itself),
    compressed, preallocated and inline files, and extents butter's own mount cloned
    (copy_file_range) and wrote; per file and directory, with -s, in bytes and human units;
    on the image and through butter's mount."""
    b = butter.path
    image = os.path.join(workdir, "img")
    kfs.make_image(image, 1 << 30)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "k0"), opts=("rw",)) as k:
        with open(f"{k}/a", "wb") as f:
            f.write(os.urandom(3 << 20))
        kfs.run(["cp", "--reflink=always", f"{k}/a", f"{k}/a2"])
        os.makedirs(f"{k}/d")
        with open(f"{k}/d/b", "wb") as f:
            f.write(os.urandom(2 << 20))
        os.link(f"{k}/d/b", f"{k}/d/hard")
        with open(f"{k}/d/s", "w") as f:
            f.write("inline\n")
        kfs.run(["fallocate", "-l", "1M", f"{k}/d/pre"])
        with open(f"{k}/d/punch", "wb") as f:
            f.write(os.urandom(1 << 20))
        kfs.run(["sync"])
        kfs.run(["fallocate", "-p", "-o", "100000", "-l", "200000", f"{k}/d/punch"])
        kfs.run(["btrfs", "subvolume", "create", f"{k}/sv"])
        os.makedirs(f"{k}/sv/z")
        kfs.run(["btrfs", "property", "set", f"{k}/sv/z", "compression", "zstd"])
        with open(f"{k}/sv/z/text", "wb") as f:
            f.write(b"".join(b"%d\n" % i for i in range(200000)))
        with open(f"{k}/sv/f", "wb") as f:
            f.write(os.urandom(1 << 20))
        kfs.run(["sync"])
        kfs.run(["btrfs", "subvolume", "snapshot", f"{k}/sv", f"{k}/snap"])
        with open(f"{k}/sv/f", "r+b") as f:
            f.seek(40960)
            f.write(os.urandom(4096))
    with FuseMount(b, [image], os.path.join(workdir, "m0")) as m:
        with open(f"{m.mnt}/d/b", "rb") as src, open(f"{m.mnt}/d/clone", "wb") as dst:
            os.copy_file_range(src.fileno(), dst.fileno(), 1 << 20)
        with open(f"{m.mnt}/new", "wb") as f:
            f.write(os.urandom(300000))
        # through the live mount, right after (it commits first)
        live = run([b, "filesystem", "du", "-s", os.path.join(m.mnt, "")])
        assert live.returncode == 0, live.stderr
    cases = [([""], []), ([""], ["-s"]), (["", "d", "sv", "a"], ["-s"]), (["d"], ["--raw"]),
             ([""], ["-s", "--kbytes"]), (["snap", "sv"], [])]
    want = {}
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "k1")) as k:
        for paths, opts in cases:
            r = run(["btrfs", "filesystem", "du"] + opts + [os.path.join(k, p) for p in paths])
            assert r.returncode == 0, r.stderr
            # the paths as butter's mount will print them
            want[(tuple(paths), tuple(opts))] = r.stdout.replace(k, "MNT")
    whole = want[(("",), ())]
    assert "MNT/d/punch" in whole and "MNT/d/hard" not in whole, whole
    live_want = want[(("",), ("-s",))].replace("MNT", m.mnt)
    assert live.stdout == live_want, (live.stdout, live_want)
    with FuseMount(b, [image], os.path.join(workdir, "m1"), ["ro"]) as m:
        for (paths, opts), text in want.items():
            r = run([b, "filesystem", "du"] + list(opts) + [os.path.join(m.mnt, p) for p in paths])
            assert r.returncode == 0 and r.stdout == text.replace("MNT", m.mnt), \
                (paths, opts, r.stdout, r.stderr, text)
        r = run([b, "filesystem", "du", os.path.join(m.mnt, "none")])
        assert r.returncode == 1 and "none" in r.stderr
    # offline: the same numbers, the paths inside the image
    for (paths, opts), text in want.items():
        r = run([b, "filesystem", "du"] + list(opts) + [image] + ["/" + p for p in paths])
        got = r.stdout
        assert r.returncode == 0, r.stderr
        assert [line[:36] for line in got.splitlines()] == \
            [line[:36] for line in text.splitlines()], (paths, opts, got, text)
    oracle.btrfs_check(image)
