"""butter's read path judged by the kernel: images the kernel wrote, read back by butter.

Each test makes a btrfs with mkfs.btrfs and the kernel (loop devices, a mount), fills it
with the generated tree (butter_it.tree), takes the manifest of what the mounted kernel
shows, unmounts, and then checks that `butter extract IMAGE DEST` reproduces that tree
byte for byte and stat for stat (butter_it.manifest.compare: the rules are there).

Matrix: every checksum, every nodesize, every compression (and compress-force), every
profile over 4 image files, on-disk feature variants, degraded sets (image files left
out), corrupted copies (data and tree blocks on one mirror, data on RAID5/6: must still
read exactly; data on a single copy: EIO for that file only, the rest exact), the other
commands (ls, cat, info, subvolume list) against what the kernel showed, subtrees,
a 10k-entry directory, a 200 MiB file, paths longer than PATH_MAX.
"""
import os
import re
import stat

import pytest

from butter_it import kfs, manifest, tree

KiB = 1024
MiB = 1 << 20


class Image:
    """A finished kernel-made filesystem: its image files and what the kernel showed."""

    def __init__(self, fs, src, gen, mounted, unmounted):
        self.fs = fs
        self.images = list(fs.images)
        self.src = src                   # manifest taken from the kernel's mount
        self.gen = gen                   # what fill() returned
        self.mounted = mounted           # what while_mounted() returned
        self.unmounted = unmounted       # what while_unmounted() returned


def full_tree(fs):
    return tree.populate(fs.mnt)


def build(workdir, fill=full_tree, while_mounted=None, while_unmounted=None, **fs_args):
    """Make, fill and release a kernel filesystem; return an Image.

    while_mounted(fs) runs after the manifest is taken; while_unmounted(fs, mounted),
    given what while_mounted returned, runs after the unmount with the loop devices
    still attached (for btrfs inspect-internal).
    """
    with kfs.kernel_fs(workdir, **fs_args) as fs:
        gen = fill(fs)
        fs.sync()
        src = manifest.take(fs.mnt)
        mounted = while_mounted(fs) if while_mounted else None
        fs.umount()
        unmounted = while_unmounted(fs, mounted) if while_unmounted else None
        fs.detach()
    return Image(fs, src, gen, mounted, unmounted)


def extract_and_compare(butter, images, src, workdir, name="extracted", sub=None, exclude=()):
    dest = os.path.join(workdir, name)
    butter.extract(images, dest, src=sub)
    expected = manifest.subtree(src, sub) if sub else src
    manifest.assert_same(expected, manifest.take(dest), exclude=exclude)
    return dest


# ---------------------------------------------------------------------------------
# The format matrix

@pytest.mark.parametrize("csum", ["crc32c", "xxhash", "sha256", "blake2"])
def test_checksum_algorithm(kernel, butter, workdir, csum):
    img = build(workdir, mkfs_args=["--csum", csum])
    extract_and_compare(butter, img.images, img.src, workdir)


@pytest.mark.parametrize("nodesize", [4096, 16384, 65536])
def test_nodesize(kernel, butter, workdir, nodesize):
    img = build(workdir, mkfs_args=["--nodesize", str(nodesize)])
    extract_and_compare(butter, img.images, img.src, workdir)


@pytest.mark.parametrize("option", ["compress=zlib", "compress=lzo", "compress=zstd",
                                    "compress-force=zlib", "compress-force=lzo",
                                    "compress-force=zstd"])
def test_compression(kernel, butter, workdir, option):
    img = build(workdir, mount_opts=[option])
    extract_and_compare(butter, img.images, img.src, workdir)


@pytest.mark.parametrize("profile", ["single", "dup", "raid0", "raid1", "raid1c3", "raid1c4",
                                     "raid10", "raid5", "raid6"])
def test_profile_over_four_devices(kernel, butter, workdir, profile):
    img = build(workdir, ndevices=4, mkfs_args=["-d", profile, "-m", profile])
    extract_and_compare(butter, img.images, img.src, workdir)


FEATURES = {
    "explicit-holes": dict(mkfs_args=["-O", "^no-holes"]),
    "mixed-block-groups": dict(mkfs_args=["--mixed"]),
    "no-skinny-metadata": dict(mkfs_args=["-O", "^skinny-metadata"]),
    "quota": dict(mkfs_args=["-R", "quota"]),
    "nodatasum": dict(mount_opts=["nodatasum"]),
    "holes-lzo-4k-nodes": dict(mkfs_args=["-O", "^no-holes", "--nodesize", "4096"],
                               mount_opts=["compress-force=lzo"]),
    "max-inline-0": dict(mount_opts=["max_inline=0", "compress=zlib"]),
}


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_feature_variant(kernel, butter, workdir, feature):
    img = build(workdir, **FEATURES[feature])
    extract_and_compare(butter, img.images, img.src, workdir)


# ---------------------------------------------------------------------------------
# Degraded: image files left out

def data_logicals(fs):
    """Return the btrfs logical addresses of every regular file's data extents."""
    found = []
    for path, e in manifest.take(fs.mnt, contents=False).items():
        if e["type"] == "file" and e["data"]:
            for _, logical, _, flags in kfs.fiemap(os.path.join(fs.mnt, path)):
                if not flags & kfs.FIEMAP_EXTENT_DATA_INLINE:
                    found.append(logical)
    return found


@pytest.mark.parametrize("profile,missing", [("raid1", 1), ("raid10", 1), ("raid5", 1),
                                             ("raid6", 2), ("raid1c3", 2), ("raid1c4", 3)])
def test_degraded(kernel, butter, workdir, profile, missing):
    img = build(workdir, ndevices=4, mkfs_args=["-d", profile, "-m", profile],
                while_mounted=data_logicals,
                while_unmounted=lambda fs, _: (fs.chunk_map(), fs.devids()))
    chunks, devids = img.unmounted
    used = {chunks.chunk_of(lg).start: chunks.chunk_of(lg) for lg in img.mounted}
    # leave out the devices holding the most stripes of chunks with file data
    weight = {d: sum(1 for c in used.values() for dev, _ in c.stripes if dev == d) for d in devids}
    gone = sorted(devids, key=lambda d: (-weight[d], d))[:missing]
    for d in gone:
        assert weight[d] > 0, (f"devid {d} holds no file data: leaving it out tests nothing "
                               f"(weights {weight})")
    left = [devids[d] for d in sorted(devids) if d not in gone]
    extract_and_compare(butter, left, img.src, workdir)


# ---------------------------------------------------------------------------------
# Corruption

def add_victims(fs):
    """Fill the usual tree, then add incompressible files made after every snapshot."""
    gen = tree.populate(fs.mnt)
    os.makedirs(os.path.join(fs.mnt, "victims"))
    content = tree.Content.of(7)
    for name, size in [("a", 256 * KiB), ("b", 1 * MiB + 5), ("c", 64 * KiB)]:
        with open(os.path.join(fs.mnt, "victims", name), "wb") as f:
            for chunk in content.chunks(f"victim-{name}", size, "random"):
                f.write(chunk)
    return gen


def victim_blocks(fs):
    """Return [(path, file offset, logical, the 4 KiB expected there)], one per extent."""
    found = []
    for name in sorted(os.listdir(os.path.join(fs.mnt, "victims"))):
        path = os.path.join(fs.mnt, "victims", name)
        with open(path, "rb") as f:
            for off, logical, length, flags in kfs.fiemap(path):
                assert not flags & (kfs.FIEMAP_EXTENT_ENCODED | kfs.FIEMAP_EXTENT_DATA_INLINE), \
                    f"victims/{name}: extent at {off} is compressed or inline"
                delta = 4096 if length > 4096 else 0
                f.seek(off + delta)
                found.append((f"victims/{name}", off + delta, logical + delta, f.read(4096)))
    return found


def one_per_full_stripe(chunks, logicals):
    """Yield the logical addresses to corrupt: all, but one per RAID5/6 full stripe."""
    seen = set()
    for logical in logicals:
        full = chunks.chunk_of(logical).full_stripe(logical)
        if full is None or full not in seen:
            seen.add(full)
            yield logical


def corrupt_data(img, copy):
    """Flip bytes of each victim block on copy `copy`; return what was corrupted."""
    chunks, devids, _ = img.unmounted
    done = []
    wanted = set(one_per_full_stripe(chunks, [v[2] for v in img.mounted]))
    for rel, off, logical, expected in img.mounted:
        if logical not in wanted:
            continue
        where = chunks.locate(logical)
        devid, phys = where[copy % len(where)]
        found = kfs.read_image(devids[devid], phys, 4096)
        assert found == expected, (f"mapping check failed for {rel}@{off}: logical {logical} -> "
                                   f"devid {devid} offset {phys} does not hold the file's bytes")
        kfs.flip_bytes(devids[devid], phys + 100, 64)
        done.append((rel, off, devids[devid], phys))
    assert done
    return done


TREES = [1, 2, 3, 4, 5, 7, 9, 10]          # root, extent, chunk, dev, fs, csum, uuid, free space


def subvolume_ids(fs):
    return [i for i, _ in fs.subvolume_list()]


def data_layout(fs, _):
    return fs.chunk_map(), fs.devids(), None


def tree_layout(fs, subvols):
    """Return (chunk map, devids, logical addresses of every block of every tree)."""
    blocks = set()
    for t in TREES + subvols:
        try:
            blocks.update(fs.tree_blocks(t))
        except kfs.CommandError:
            pass                                           # e.g. no such tree here
    return fs.chunk_map(), fs.devids(), sorted(blocks)


def corrupt_tree_blocks(img, copy):
    """Flip bytes of every tree block on copy `copy` (RAID5/6: one per full stripe)."""
    chunks, devids, blocks = img.unmounted
    done = 0
    for logical in one_per_full_stripe(chunks, blocks):
        where = chunks.locate(logical)
        devid, phys = where[copy % len(where)]
        header = kfs.read_image(devids[devid], phys, 0x38)
        assert int.from_bytes(header[0x30:0x38], "little") == logical, \
            f"mapping check failed: tree block {logical} is not at devid {devid} offset {phys}"
        kfs.flip_bytes(devids[devid], phys + 0x70, 32)
        done += 1
    assert done
    return done


MIRRORED = [("raid1", 2, "data", 0), ("raid1", 2, "data", 1), ("raid1", 2, "tree", 0),
            ("raid1", 2, "tree", 1), ("dup", 1, "data", 0), ("dup", 1, "data", 1),
            ("dup", 1, "tree", 0), ("dup", 1, "tree", 1), ("raid10", 4, "data", 1),
            ("raid1c3", 3, "tree", 2), ("raid5", 4, "data", 0), ("raid6", 4, "data", 0),
            ("raid5", 4, "tree", 0), ("raid6", 4, "tree", 0)]


@pytest.mark.parametrize("profile,ndevices,what,copy", MIRRORED,
                         ids=[f"{p}-{w}-copy{c}" for p, _, w, c in MIRRORED])
def test_corrupt_one_copy_still_exact(kernel, butter, workdir, profile, ndevices, what, copy):
    data = what == "data"
    img = build(workdir, fill=add_victims, ndevices=ndevices,
                mkfs_args=["-d", profile, "-m", profile],
                while_mounted=victim_blocks if data else subvolume_ids,
                while_unmounted=data_layout if data else tree_layout)
    if data:
        corrupt_data(img, copy)
    else:
        corrupt_tree_blocks(img, copy)
    extract_and_compare(butter, img.images, img.src, workdir)


def test_corrupt_single_copy_fails_that_file_only(kernel, butter, workdir):
    img = build(workdir, fill=add_victims, mkfs_args=["-d", "single", "-m", "single"],
                while_mounted=victim_blocks, while_unmounted=data_layout)
    img.mounted = [v for v in img.mounted if v[0] == "victims/a"][:1]
    (rel, off, image, phys), = corrupt_data(img, 0)
    bad = kfs.read_image(image, phys, 4096)
    dest = os.path.join(workdir, "extracted")
    proc = butter.extract(img.images, dest, check=False)
    assert proc.returncode != 0, "butter extract exited 0 although victims/a has a bad block"
    assert proc.returncode < 128, f"butter extract died of a signal (status {proc.returncode})"
    assert rel in proc.stderr, f"stderr does not name {rel}:\n{proc.stderr[-3000:]}"
    manifest.assert_same(img.src, manifest.take(dest), exclude=[rel])
    victim = os.path.join(dest, rel)
    if os.path.isfile(victim):
        with open(victim, "rb") as f:
            f.seek(off)
            assert f.read(4096) != bad, f"{rel}: the corrupted bytes reached the extracted file"


# ---------------------------------------------------------------------------------
# The other commands, against what the mounted kernel showed

def _lines(out):
    return [l for l in out.decode("utf-8", "surrogateescape").split("\n") if l.strip()]


def test_ls_cat_info_subvolume_list(kernel, butter, workdir):
    cat_paths = ["sizes/random-4097", "sizes/text-2049", "big/mixed", "sparse/islands",
                 "prealloc/partly-written", "cow/cloned", "cow/text-orig", "nodatacow",
                 "sv1/nested/deeper/file", "snaps/sv1-ro/append-me", "snaps/sv1-rw/file-1048579",
                 "links/hl-a"]
    ls_paths = ["", "sizes", "sv1", "snaps/sv1-ro", "prealloc"]

    def facts(fs):
        def listing(rel):
            d = os.path.join(fs.mnt, rel)
            return {n: os.lstat(os.path.join(d, n)) for n in os.listdir(d)}
        got = {"show": fs.show(), "subvolumes": fs.subvolume_list(),
               "ls": {p: listing(p) for p in ls_paths}, "cat": {}}
        for p in cat_paths:
            with open(os.path.join(fs.mnt, p), "rb") as f:
                got["cat"][p] = f.read()
        sv1 = [i for i, path in got["subvolumes"] if path == "sv1"][0]
        kfs.run(["btrfs", "subvolume", "set-default", str(sv1), fs.mnt])   # must not matter
        return got

    img = build(workdir, ndevices=2, label="butter-it-cli", while_mounted=facts,
                mkfs_args=["-d", "raid1", "-m", "raid1", "--csum", "xxhash"])
    label, fsid = img.mounted["show"]
    assert label == "butter-it-cli"

    info = butter.info(img.images).stdout.decode("utf-8", "surrogateescape")
    assert label in info, f"`butter info` does not show the label {label!r}:\n{info}"
    assert fsid.lower() in info.lower(), f"`butter info` does not show the fsid {fsid}:\n{info}"
    assert "xxhash" in info.lower(), f"`butter info` does not show the csum type xxhash:\n{info}"

    lines = _lines(butter.subvolume_list(img.images).stdout)
    for sid, path in img.mounted["subvolumes"]:
        ok = any(re.search(rf"\b{sid}\b", l) and re.search(rf"(^|[\s/]){re.escape(path)}\s*$", l)
                 for l in lines)
        assert ok, (f"`butter subvolume list` has no line with id {sid} and path {path!r} "
                    f"(as `btrfs subvolume list` showed):\n" + "\n".join(lines))

    for rel, entries in img.mounted["ls"].items():
        args = ["/" + rel] if rel else []
        names = {l.rstrip("/") for l in _lines(butter.ls(img.images, *args).stdout)}
        assert names == set(entries), (f"`butter ls {'/' + rel}`: missing {sorted(set(entries) - names)}, "
                                       f"unexpected {sorted(names - set(entries))}")
        long_lines = _lines(butter.ls(img.images, *args, long=True).stdout)
        for name, st in entries.items():
            mine = [l for l in long_lines
                    if l.split(" -> ")[0].split()[-1].rstrip("/") == name]
            assert mine, f"`butter ls -l /{rel}` has no line for {name!r}"
            if stat.S_ISREG(st.st_mode):
                assert str(st.st_size) in mine[0].split(), \
                    f"`butter ls -l /{rel}`: no size {st.st_size} on the line {mine[0]!r}"

    for rel, data in img.mounted["cat"].items():
        out = butter.cat(img.images, "/" + rel).stdout
        assert out == data, f"`butter cat /{rel}`: {len(out)} bytes, differing from the file's {len(data)}"

    proc = butter.cat(img.images, "/no/such/file", check=False)
    assert 0 < proc.returncode < 128 and "no/such/file" in proc.stderr, \
        f"`butter cat /no/such/file`: status {proc.returncode}, stderr {proc.stderr!r}"


def test_extract_subtrees(kernel, butter, workdir):
    img = build(workdir)
    for i, sub in enumerate(["/sv1", "/snaps/sv1-ro", "/snaps/top-ro", "/meta", "/deep/level-00"]):
        extract_and_compare(butter, img.images, img.src, workdir, name=f"sub{i}", sub=sub)


# ---------------------------------------------------------------------------------
# Sizes

def test_ten_thousand_entries(kernel, butter, workdir):
    def fill(fs):
        tree.populate_many(fs.mnt, "ten-thousand", 10000)
    img = build(workdir, fill=fill)
    extract_and_compare(butter, img.images, img.src, workdir)


@pytest.mark.butter_timeout(1200)
def test_file_of_200_mib(kernel, butter, workdir):
    def fill(fs):
        big = os.path.join(fs.mnt, "big200")
        tree.write_big_file(big, 200 * MiB + 12345)
        fs.sync()
        kfs.run(["cp", "--reflink=always", big, big + "-reflink"])
        with open(big + "-reflink", "r+b") as f:
            f.seek(77 * MiB + 3)
            f.write(b"overwritten in the middle of a reflinked copy" * 100)
    img = build(workdir, fill=fill, mount_opts=["compress=zstd"])
    extract_and_compare(butter, img.images, img.src, workdir)


def test_path_longer_than_path_max(kernel, butter, workdir):
    def fill(fs):
        tree.populate_long_path(fs.mnt, "long")
    img = build(workdir, fill=fill)
    assert max(len(os.fsencode(p)) for p in img.src) > 4096
    extract_and_compare(butter, img.images, img.src, workdir)


# ---------------------------------------------------------------------------------
# Without a kernel image

@pytest.mark.parametrize("command", ["extract", "ls", "cat", "info", "subvolume list"])
def test_help(butter, command):
    proc = butter.run(command.split() + ["--help"], timeout=30, check=False)
    out = proc.stdout.decode("utf-8", "replace") + proc.stderr
    assert proc.returncode == 0 and out.strip(), \
        f"`butter {command} --help`: status {proc.returncode}, output {out!r}"


def test_bad_images_give_a_clear_error(butter, tmp_path):
    cases = {"missing.img": None, "empty.img": b"", "garbage.img": os.urandom(1 << 20),
             "zeros.img": bytes(1 << 20)}
    for name, data in cases.items():
        path = tmp_path / name
        if data is not None:
            path.write_bytes(data)
        for argv in (["info", str(path)], ["ls", str(path)],
                     ["extract", str(path), str(tmp_path / f"out-{name}")]):
            proc = butter.run(argv, timeout=60, check=False)
            assert 0 < proc.returncode < 128, \
                f"`butter {' '.join(argv)}`: status {proc.returncode} (want an error, not a crash)"
            assert name in proc.stderr, \
                f"`butter {' '.join(argv)}`: stderr does not name the image: {proc.stderr!r}"
