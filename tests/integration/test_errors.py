"""Errors that name what they hit, and the per-device error counters the kernel reads.

A kernel-made filesystem gets one data sector (or one copy of a tree block) damaged in
its image file, at a place computed from the chunk tree and checked by reading the bytes
there first. Then:

  - `butter cat` and a `butter mount` fail the read with EIO, and the one message per bad
    copy names the device (path and devid), the logical and the physical address, the
    copy, the subvolume, the inode, the file's path and the file offset;
  - a read-only open counts but never writes; a read-write one (the mount) commits the
    count into the device tree's DEV_STATS item, where `btrfs device stats` on a kernel
    mount finds it, as does `butter device stats` (image, and live mount by ioctl);
  - `butter device stats -z` resets them (the kernel then shows 0); `-c` exits 64 while
    a counter is not zero;
  - counters the kernel wrote are kept, and added to, by butter; btrfs check stays clean.
"""
import errno
import hashlib
import os
import random
import re
import struct

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount

SECTOR = 4096
DEV_SIZE = 256 * kfs.MiB
NAMES = ("write_io_errs", "read_io_errs", "flush_io_errs", "corruption_errs",
         "generation_errs")


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()


def parse_stats(text):
    """{device: {counter: value}} from `btrfs device stats` style lines."""
    out = {}
    for dev, name, value in re.findall(r"^\[(.+)\]\.(\w+)\s+(\d+)\s*$", text, re.M):
        out.setdefault(dev, {})[name] = int(value)
    return out


def kernel_stats(workdir, image, reset=False):
    """`btrfs device stats` on a kernel mount of `image`: {counter: value}."""
    mnt = os.path.join(workdir, "kstats")
    with kfs.attached([image]) as devs:
        kfs.mount(devs[0], mnt, [])
        try:
            r = kfs.run(["btrfs", "device", "stats"] + (["-z"] if reset else []) + [mnt],
                        check=False)
        finally:
            kfs.umount(mnt)
    stats = parse_stats(r.stdout)
    assert len(stats) == 1, f"cannot read btrfs device stats:\n{r.stdout}\n{r.stderr}"
    return next(iter(stats.values()))


def butter_stats(butter, target, *args, check=True):
    r = butter.run(["device", "stats", *args, target], check=check)
    stats = parse_stats(r.stdout.decode())
    assert len(stats) == 1, f"cannot read butter device stats:\n{r.stdout}\n{r.stderr}"
    return r, next(iter(stats.values()))


def made(workdir, name="fs"):
    """A kernel-made btrfs (single data, dup metadata) with dir/victim and others.

    Returns (image, data of victim, its inode, its extents, chunk map, fs-tree blocks)."""
    rng = random.Random("errors")
    victim = rng.randbytes(64 * 1024)
    with kfs.kernel_fs(workdir, size=DEV_SIZE, name=name) as fs:
        os.mkdir(os.path.join(fs.mnt, "dir"))
        path = os.path.join(fs.mnt, "dir", "victim")
        with open(path, "wb") as f:
            f.write(victim)
        for i in range(20):
            with open(os.path.join(fs.mnt, f"other{i}"), "wb") as f:
                f.write(rng.randbytes(5000))
        fs.sync()
        ino = os.stat(path).st_ino
        extents = kfs.fiemap(path)
        fs.umount()
        cm = fs.chunk_map()
        blocks = fs.tree_blocks(5)
        fs.detach()
        return fs.images[0], victim, ino, extents, cm, blocks


def damage_sector(image, victim, extents, cm, file_off):
    """Flip the data sector at `file_off` of the victim; return (logical, physical)."""
    (off, logical, length, flags), = extents
    assert flags & (kfs.FIEMAP_EXTENT_ENCODED | kfs.FIEMAP_EXTENT_DATA_INLINE) == 0
    logical += file_off - off
    (devid, phys), = cm.locate(logical)
    assert devid == 1
    got = kfs.read_image(image, phys, SECTOR)
    assert got == victim[file_off:file_off + SECTOR], "the mapping is wrong (bytes differ)"
    kfs.flip_bytes(image, phys, SECTOR)
    return logical, phys


def assert_names_everything(text, image, ino, logical, phys, file_off):
    line = next((ln for ln in text.splitlines() if "checksum mismatch" in ln), None)
    assert line, f"no checksum mismatch reported:\n{text[-3000:]}"
    for part in (f"logical {logical} ", "copy 1 ", f"on {image} (devid 1)", f"physical {phys}",
                 "subvolume 5 ", f"inode {ino} ", 'path "dir/victim"', f"file offset {file_off}"):
        assert part in line, f"{part!r} missing from the message: {line}"


def test_cat_names_the_damage_and_counts_nothing_on_disk(kernel, butter, workdir):
    image, victim, ino, extents, cm, _ = made(workdir)
    file_off = 3 * SECTOR
    logical, phys = damage_sector(image, victim, extents, cm, file_off)
    before = sha(image)
    r = butter.run(["cat", image, "dir/victim"], check=False)
    assert 0 < r.returncode < 128, f"cat of a damaged file exited {r.returncode}"
    assert_names_everything(r.stderr, image, ino, logical, phys, file_off)
    # a read-only open counts in memory only
    assert sha(image) == before, "a read-only cat changed the image"
    _, st = butter_stats(butter, image)
    assert st == dict.fromkeys(NAMES, 0), st
    assert kernel_stats(workdir, image)["corruption_errs"] == 0


def test_mount_counts_commits_and_resets(fuse, butter, workdir):
    image, victim, ino, extents, cm, _ = made(workdir)
    file_off = 5 * SECTOR
    logical, phys = damage_sector(image, victim, extents, cm, file_off)
    mnt = os.path.join(workdir, "mnt")
    with FuseMount(butter.path, [image], mnt) as m:
        with open(os.path.join(mnt, "dir", "victim"), "rb") as f:
            f.seek(file_off)
            try:
                f.read(SECTOR)
                raise AssertionError("reading a damaged sector through the mount succeeded")
            except OSError as e:
                assert e.errno == errno.EIO, e
            f.seek(0)
            assert f.read(file_off) == victim[:file_off], "the good sectors before changed"
        # the live mount answers through BUTTER_IOC_DEV_STATS
        _, live = butter_stats(butter, mnt)
        assert live["corruption_errs"] >= 1 and live["read_io_errs"] == 0, live
        assert m.unmount() == 0
        assert_names_everything(m.log_text(), image, ino, logical, phys, file_off)
    oracle.btrfs_check(image, strict=True)
    r, st = butter_stats(butter, image, "-c", check=False)
    assert r.returncode == 64, f"device stats -c exited {r.returncode} with {st}"
    assert st["corruption_errs"] == live["corruption_errs"], (st, live)
    ks = kernel_stats(workdir, image)
    assert ks == st, f"the kernel shows {ks}, butter counted {st}"
    # -z prints the values, then zeroes them (committed)
    _, shown = butter_stats(butter, image, "-z")
    assert shown == st, shown
    r, st = butter_stats(butter, image, "-c")
    assert r.returncode == 0 and st == dict.fromkeys(NAMES, 0), st
    assert kernel_stats(workdir, image) == dict.fromkeys(NAMES, 0)
    oracle.btrfs_check(image, strict=True)


def test_kernel_counts_are_kept_and_added_to(fuse, butter, workdir):
    image, victim, ino, extents, cm, _ = made(workdir)
    damage_sector(image, victim, extents, cm, 0)
    # the kernel counts its own failed read and writes the item at unmount
    mnt = os.path.join(workdir, "kmnt")
    with kfs.attached([image]) as devs:
        kfs.mount(devs[0], mnt, [])
        try:
            with open(os.path.join(mnt, "dir", "victim"), "rb") as f:
                try:
                    f.read()
                except OSError as e:
                    assert e.errno == errno.EIO, e
            with open(os.path.join(mnt, "touched"), "wb") as f:
                f.write(b"a change, so the kernel commits (and writes its counters)")
            kfs.run(["btrfs", "filesystem", "sync", mnt])
        finally:
            kfs.umount(mnt)
    k = kernel_stats(workdir, image)["corruption_errs"]
    assert k >= 1, "the kernel did not count its checksum error"
    _, st = butter_stats(butter, image)
    assert st["corruption_errs"] == k, (st, k)
    # butter writes something: the kernel's counts stay
    butter.run(["mkdir", image, "newdir"])
    oracle.btrfs_check(image, strict=True)
    assert kernel_stats(workdir, image)["corruption_errs"] == k
    # and a read-write open that meets the damage adds to them
    bm = os.path.join(workdir, "bmnt")
    with FuseMount(butter.path, [image], bm) as m:
        try:
            with open(os.path.join(bm, "dir", "victim"), "rb") as f:
                f.read()
            raise AssertionError("reading a damaged sector through the mount succeeded")
        except OSError as e:
            assert e.errno == errno.EIO, e
        assert m.unmount() == 0
    _, st = butter_stats(butter, image)
    assert st["corruption_errs"] > k, (st, k)
    assert kernel_stats(workdir, image) == st
    oracle.btrfs_check(image, strict=True)


def read_bad_copy_one(butter, image, bytenr, phys, what):
    """Read `dir` past a bad copy 1 (at `phys`) of the tree block at `bytenr`: the file is
    listed from copy 2, the stderr line saying `what` names copy 1 by device and physical
    address. Then a read-write open (which reads the block too, and commits the count);
    the device stats after it."""
    r = butter.run(["ls", image, "dir"])
    assert "victim" in r.stdout.decode()
    line = next((ln for ln in r.stderr.splitlines() if what in ln), "")
    for part in (f"tree block logical {bytenr} ", "copy 1 ", f"on {image} (devid 1)",
                 f"physical {phys}"):
        assert part in line, f"{part!r} missing from: {r.stderr[-2000:]}"
    butter.run(["mkdir", image, "newdir"])
    oracle.btrfs_check(image, strict=True)
    return butter_stats(butter, image)[1]


def test_tree_block_copy_named_and_counted(kernel, butter, workdir):
    """A bad first copy of a tree block (DUP metadata): read from the second, the bad
    one named by device and physical address and counted once committed."""
    image, victim, ino, extents, cm, blocks = made(workdir)
    bytenr = blocks[-1]
    places = cm.locate(bytenr)
    assert len(places) == 2, places
    (devid, phys) = places[0]
    good = kfs.read_image(image, places[1][1], 4096)
    assert kfs.read_image(image, phys, 4096) == good, "the two copies differ"
    kfs.flip_bytes(image, phys + 1024, 512)
    st = read_bad_copy_one(butter, image, bytenr, phys, "checksum mismatch")
    assert st["corruption_errs"] >= 1, st
    assert kernel_stats(workdir, image) == st


def test_stale_tree_block_copy_counts_generation(kernel, butter, workdir):
    """Copy 1 of a tree block made stale (an older generation, checksum recomputed): read
    from copy 2, named, and counted as a generation error once committed."""
    image, victim, ino, extents, cm, blocks = made(workdir)
    bytenr = blocks[-1]
    (devid, phys), (_, phys2) = cm.locate(bytenr)
    nodesize = 16384
    block = bytearray(kfs.read_image(image, phys, nodesize))
    assert block == kfs.read_image(image, phys2, nodesize), "the two copies differ"
    assert struct.unpack_from("<Q", block, 48)[0] == bytenr, "not the block's header"
    gen = struct.unpack_from("<Q", block, 80)[0]
    struct.pack_into("<Q", block, 80, gen - 1)
    struct.pack_into("<I", block, 0, kfs.crc32c(bytes(block[32:])))
    with open(image, "r+b") as f:
        f.seek(phys)
        f.write(block)
    st = read_bad_copy_one(butter, image, bytenr, phys, "generation")
    assert st["generation_errs"] >= 1 and st["corruption_errs"] == 0, st
    assert kernel_stats(workdir, image) == st


def test_read_errors_named_and_counted(kernel, butter, workdir):
    """I/O errors (the fault device): a data sector that cannot be read is named like a
    bad checksum; a tree block copy that cannot be read is read from the other copy and
    counted as a read error by a read-write open."""
    image, victim, ino, extents, cm, blocks = made(workdir)
    (off, logical, _, _), = extents
    file_off = 2 * SECTOR
    logical += file_off - off
    (_, phys), = cm.locate(logical)
    r = butter.run(["--fault", f"read-eio,start={phys},len={SECTOR}", "cat", image,
                    "dir/victim"], check=False)
    assert 0 < r.returncode < 128, r.returncode
    line = next((ln for ln in r.stderr.splitlines() if "read error" in ln), "")
    for part in (f"logical {logical} ", "copy 1 ", f"on {image} (devid 1)", f"physical {phys}",
                 f"inode {ino} ", 'path "dir/victim"', f"file offset {file_off}"):
        assert part in line, f"{part!r} missing from: {r.stderr[-2000:]}"
    # copy 1 of an fs tree block unreadable while butter changes the image
    bytenr = blocks[-1]
    (_, tphys), _ = cm.locate(bytenr)
    r = butter.run(["--fault", f"read-eio,start={tphys},len=16384", "mkdir", image, "newdir"])
    assert f"tree block logical {bytenr} copy 1 on {image} (devid 1) physical {tphys}: " \
           f"read error" in r.stderr, r.stderr
    oracle.btrfs_check(image, strict=True)
    _, st = butter_stats(butter, image)
    assert st["read_io_errs"] >= 1 and st["corruption_errs"] == 0, st
    assert kernel_stats(workdir, image) == st
