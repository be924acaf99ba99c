"""`butter scrub` on kernel-written filesystems, judged by the kernel.

Each test lets the kernel write files on a fresh btrfs of some profile, then damages
chosen copies of data sectors, tree blocks, RAID5/6 parity or superblocks in the image
files, at places computed from the chunk tree (kfs.ChunkMap) and checked by reading the
bytes there first (a wrong mapping fails the test, it never passes silently). Then:

  - the kernel's read-only scrub sees the damage (and, for data sectors, counts exactly
    as many errors as butter);
  - `butter scrub -r` reports it, exits 3 and changes no byte of any image;
  - `butter scrub` repairs it and exits 0: every damaged place holds its bytes from
    before the damage again (the scrub's commit also writes the device error counters,
    so the images are not byte for byte as before: the kernel's device stats show the
    errors butter found; a superblock repair commits too);
  - the kernel's scrub then finds nothing, btrfs check is clean and every file reads
    back as written.
A copy with no good twin is reported as uncorrectable, naming the inode.
"""
import hashlib
import os
import random
import re

import pytest

from butter_it import kfs, oracle

SECTOR = 4096
DEV_SIZE = 512 * kfs.MiB


def sha_file(path):
    h = hashlib.sha1()
    with open(path, "rb") as f:
        while True:
            b = f.read(4 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


def snapshot(images):
    return [sha_file(p) for p in images]


def kernel_scrub(workdir, images):
    """The kernel's read-only scrub on a read-only mount: {counter: value}."""
    mnt = os.path.join(workdir, "kmnt")
    with kfs.attached(images) as devs:
        kfs.mount(devs[0], mnt, ["ro"] + [f"device={d}" for d in devs[1:]])
        try:
            r = kfs.run(["btrfs", "scrub", "start", "-B", "-R", "-r", mnt], check=False,
                        timeout=600)
        finally:
            kfs.umount(mnt)
    out = r.stdout + r.stderr
    counts = {k: int(v) for k, v in re.findall(r"^\s*(\w+): (\d+)\s*$", out, re.M)}
    assert "csum_errors" in counts, f"cannot read the kernel's scrub report:\n{out}"
    return counts


def kernel_errors(counts):
    return sum(counts.get(k, 0) for k in ("read_errors", "csum_errors", "verify_errors",
                                           "super_errors", "uncorrectable_errors"))


def kernel_check_and_read(workdir, images, want):
    oracle.btrfs_check(*images)
    with oracle.kernel_mount(*images, mnt=os.path.join(workdir, "rmnt")) as mnt:
        for name, data in want.items():
            with open(os.path.join(mnt, name), "rb") as f:
                assert f.read() == data, f"{name} reads back differently"


def butter_scrub(butter, images, readonly=False):
    """Run butter scrub; return (exit status, {field: number}, stderr)."""
    cmd = [butter.path, "scrub"] + (["-r"] if readonly else [])
    for img in images[1:]:
        cmd += ["--device", img]
    r = kfs.run(cmd + [images[0]], check=False, timeout=600)
    m = re.search(r"errors:\s+(\d+) \(read (\d+), csum (\d+), verify (\d+), super (\d+), "
                  r"parity (\d+)\)", r.stdout)
    assert m, f"cannot read butter's scrub report (rc {r.returncode}):\n{r.stdout}\n{r.stderr}"
    f = dict(zip(("errors", "read", "csum", "verify", "super", "parity"), map(int, m.groups())))
    f["corrected"] = int(re.search(r"corrected:\s+(\d+)", r.stdout).group(1))
    f["uncorrectable"] = int(re.search(r"uncorrectable:\s+(\d+)", r.stdout).group(1))
    return r.returncode, f, r.stderr


def write_files(fs, rng):
    """The kernel writes a few files; returns ({name: bytes}, {name: [fiemap extents]})."""
    want = {"big": rng.randbytes(2 * kfs.MiB + 12345), "small": rng.randbytes(9000)}
    for i in range(40):
        want[f"f{i}"] = rng.randbytes(rng.choice([100, 3000, 5000, 70000]))
    for name, data in want.items():
        with open(os.path.join(fs.mnt, name), "wb") as f:
            f.write(data)
    fs.sync()
    maps = {n: kfs.fiemap(os.path.join(fs.mnt, n)) for n in ("big", "small")}
    inodes = {n: os.stat(os.path.join(fs.mnt, n)).st_ino for n in ("big", "small")}
    return want, maps, inodes


def logical_of(extents, file_off):
    """btrfs logical address of byte `file_off` of a file (plain extents only)."""
    for off, logical, length, flags in extents:
        assert not flags & (kfs.FIEMAP_EXTENT_ENCODED | kfs.FIEMAP_EXTENT_DATA_INLINE)
        if off <= file_off < off + length:
            return logical + (file_off - off)
    raise AssertionError(f"no extent holds file offset {file_off}")


# (image, offset, bytes before the damage) of every damage() so far
DAMAGED = []


def damage(image, offset, expect):
    """Flip the sector at `offset` of `image` after checking it holds `expect`."""
    got = kfs.read_image(image, offset, len(expect))
    assert got == expect, f"{image}@{offset}: the mapping is wrong (bytes differ)"
    kfs.flip_bytes(image, offset, len(expect))
    DAMAGED.append((image, offset, expect))


def damaged_places(images):
    return [d for d in DAMAGED if d[0] in images]


def kernel_corruption_errs(workdir, images):
    """The sum of corruption_errs that `btrfs device stats` shows on a kernel mount."""
    mnt = os.path.join(workdir, "kstats")
    with kfs.attached(images) as devs:
        kfs.mount(devs[0], mnt, ["ro"] + [f"device={d}" for d in devs[1:]])
        try:
            out = kfs.run(["btrfs", "device", "stats", mnt]).stdout
        finally:
            kfs.umount(mnt)
    return sum(int(v) for v in re.findall(r"\.corruption_errs\s+(\d+)", out))


def made(workdir, profile, ndev, rng):
    """A kernel-made filesystem with files; returns (images, want, maps, inodes, chunkmap,
    devids) once released."""
    args = ["-d", profile, "-m", profile]
    with kfs.kernel_fs(workdir, ndevices=ndev, size=DEV_SIZE, mkfs_args=args) as fs:
        want, maps, inodes = write_files(fs, rng)
        fs.umount()
        cm = fs.chunk_map()
        devids = fs.devids()
        blocks = fs.tree_blocks(5)
        fs.detach()
        return fs.images, want, maps, inodes, cm, devids, blocks


def repaired_as_before(workdir, butter, images, want, before, expect, said=()):
    """butter scrub -r reports `expect` (with each text of `said` in its messages) and
    changes nothing; butter scrub repairs to `before`; the kernel agrees."""
    damaged = snapshot(images)
    rc, f, err = butter_scrub(butter, images, readonly=True)
    assert rc == 3, f"scrub -r exit {rc}, want 3\n{err}"
    for text in said:
        assert text in err, f"{text!r} not in the scrub's messages:\n{err[-3000:]}"
    for k, v in expect.items():
        assert f[k] == v, f"scrub -r: {k} {f[k]}, want {v}\n{f}\n{err}"
    assert f["corrected"] == 0 and f["uncorrectable"] == 0, f
    assert snapshot(images) == damaged, "scrub -r changed an image"
    rc, f, err = butter_scrub(butter, images)
    assert rc == 0, f"scrub exit {rc}\n{f}\n{err}"
    assert f["corrected"] == f["errors"] and f["errors"] > 0 and f["uncorrectable"] == 0, f
    for image, offset, was in damaged_places(images):
        assert kfs.read_image(image, offset, len(was)) == was, f"{image}@{offset} not repaired"
    assert kernel_corruption_errs(workdir, images) >= f["errors"] - expect.get("parity", 0), \
        "the scrub's errors are not in the device stats"
    rc, f, err = butter_scrub(butter, images, readonly=True)
    assert rc == 0 and f["errors"] == 0, f"after the repair:\n{f}\n{err}"
    assert kernel_errors(kernel_scrub(workdir, images)) == 0
    kernel_check_and_read(workdir, images, want)


@pytest.mark.parametrize("profile,ndev", [("dup", 1), ("raid1", 2), ("raid1c3", 3),
                                          ("raid10", 4)])
def test_mirrored_data(kernel, butter, workdir, profile, ndev):
    rng = random.Random(f"data-{profile}")
    images, want, maps, inodes, cm, devids, _ = made(workdir, profile, ndev, rng)
    before = snapshot(images)
    # copy 2 of a sector of "big"; on RAID1C3 also copy 3 of another sector
    hits = [(256 * 1024, 1)] + ([(512 * 1024 + 3 * SECTOR, 2)] if profile == "raid1c3" else [])
    for file_off, copy in hits:
        places = cm.locate(logical_of(maps["big"], file_off))
        assert len(places) >= 2, f"{profile}: {len(places)} copies"
        devid, phys = places[copy]
        damage(devids[devid], phys, want["big"][file_off:file_off + SECTOR])
    counts = kernel_scrub(workdir, images)
    assert counts["csum_errors"] == len(hits), f"the kernel counted {counts}"
    said = []
    for file_off, copy in hits:
        devid, phys = cm.locate(logical_of(maps["big"], file_off))[copy]
        said.append(f"scrub: data logical {logical_of(maps['big'], file_off)} copy {copy + 1} "
                    f"on {devids[devid]} (devid {devid}) physical {phys}: checksum mismatch, "
                    f"subvolume 5 inode {inodes['big']} path \"big\" file offset {file_off}")
    repaired_as_before(workdir, butter, images, want, before, {"csum": len(hits), "verify": 0},
                       said)


def test_tree_block(kernel, butter, workdir):
    rng = random.Random("tree")
    images, want, _, _, cm, devids, blocks = made(workdir, "dup", 1, rng)
    before = snapshot(images)
    bytenr = blocks[-1]
    devid, phys = cm.locate(bytenr + 1024)[1]          # copy 2, inside the block
    damage(devids[devid], phys, kfs.read_image(devids[cm.locate(bytenr + 1024)[0][0]],
                                               cm.locate(bytenr + 1024)[0][1], 512))
    assert kernel_errors(kernel_scrub(workdir, images)) > 0
    repaired_as_before(workdir, butter, images, want, before, {"verify": 1, "csum": 0})


def test_no_good_copy(kernel, butter, workdir):
    rng = random.Random("lost")
    images, want, maps, inodes, cm, devids, _ = made(workdir, "dup", 1, rng)
    file_off = 64 * 1024
    for devid, phys in cm.locate(logical_of(maps["big"], file_off)):
        damage(devids[devid], phys, want["big"][file_off:file_off + SECTOR])
    damaged = snapshot(images)
    rc, f, err = butter_scrub(butter, images)
    assert rc == 3, f"exit {rc}\n{f}\n{err}"
    assert f["csum"] == 2 and f["uncorrectable"] == 2 and f["corrected"] == 0, f
    assert (f"inode {inodes['big']} path \"big\" file offset {file_off}" in err), err
    for image, offset, was in damaged_places(images):
        assert kfs.read_image(image, offset, len(was)) != was, "a damaged copy changed"
    assert snapshot(images) != damaged, "the device stats were not committed"
    assert kernel_corruption_errs(workdir, images) == 2
    counts = kernel_scrub(workdir, images)
    assert counts["csum_errors"] == 2, counts


def parity_place(chunk, logical):
    """(devid, physical) of the P stripe byte of the row holding `logical`, at the same
    column offset, and the data places of that row at that offset."""
    n = len(chunk.stripes)
    ndata = n - kfs.PARITY[chunk.profile]
    sl = chunk.stripe_len
    off = logical - chunk.start
    row = (off // sl) // ndata
    within = off % sl
    at = lambda k: (chunk.stripes[(row + k) % n][0],
                    chunk.stripes[(row + k) % n][1] + row * sl + within)
    return at(ndata), [at(k) for k in range(ndata)]


@pytest.mark.parametrize("profile,ndev", [("raid5", 3), ("raid6", 4)])
def test_raid56(kernel, butter, workdir, profile, ndev):
    rng = random.Random(f"parity-{profile}")
    images, want, maps, _, cm, devids, _ = made(workdir, profile, ndev, rng)
    before = snapshot(images)
    # a data sector (rebuilt from parity) ...
    file_off = 8 * SECTOR
    (devid, phys), = cm.locate(logical_of(maps["big"], file_off))
    damage(devids[devid], phys, want["big"][file_off:file_off + SECTOR])
    counts = kernel_scrub(workdir, images)
    assert counts["csum_errors"] == 1, counts
    # ... and the P stripe of a row further on, checked to be the XOR of the row's data.
    # (After the kernel's scrub: its read-only scrub of RAID5/6, kernel 6.18, rewrote a
    # damaged P stripe.)
    chunk = cm.chunk_of(logical_of(maps["big"], 0))
    row_bytes = chunk.stripe_len * (len(chunk.stripes) - kfs.PARITY[chunk.profile])
    target = logical_of(maps["big"], 0) + 3 * row_bytes
    assert target + SECTOR <= logical_of(maps["big"], 0) + len(want["big"])
    (pdev, pphys), data = parity_place(chunk, target)
    xor = bytearray(SECTOR)
    for d, p in data:
        for i, b in enumerate(kfs.read_image(devids[d], p, SECTOR)):
            xor[i] ^= b
    damage(devids[pdev], pphys, bytes(xor))
    repaired_as_before(workdir, butter, images, want, before, {"csum": 1, "parity": 1},
                       [f"parity on {devids[pdev]} (devid {pdev}) physical ",
                        f"on {devids[devid]} (devid {devid}) physical {phys}: checksum mismatch"])


def test_superblock(kernel, butter, workdir):
    rng = random.Random("super")
    images, want, _, _, _, _, _ = made(workdir, "dup", 1, rng)
    sb1 = 64 * kfs.MiB                                  # superblock copy 1
    head = kfs.read_image(images[0], sb1 + 64, 8)
    assert head == b"_BHRfS_M", "no superblock copy at 64 MiB"
    kfs.flip_bytes(images[0], sb1 + 0x100, 64)          # inside, past the magic
    rc, f, err = butter_scrub(butter, images, readonly=True)
    assert rc == 3 and f["super"] == 1 and f["errors"] == 1, f"{rc}\n{f}\n{err}"
    rc, f, err = butter_scrub(butter, images)
    assert rc == 0 and f["super"] == 1 and f["corrected"] == 1, f"{rc}\n{f}\n{err}"
    r = kfs.run(["btrfs", "inspect-internal", "dump-super", "-s", "1", images[0]])
    assert "[match]" in r.stdout and "[DON'T MATCH]" not in r.stdout, r.stdout[:2000]
    rc, f, err = butter_scrub(butter, images, readonly=True)
    assert rc == 0 and f["errors"] == 0, f"{f}\n{err}"
    kernel_check_and_read(workdir, images, want)


def test_live_mount(kernel, butter, workdir):
    """`butter scrub PATH` on a live `butter mount`: the daemon scrubs in steps while the
    mount has uncommitted writes, repairs the damaged copy and logs it."""
    from butter_it import fusemount
    fusemount.require_fuse()
    rng = random.Random("live")
    images, want, maps, _, cm, devids, _ = made(workdir, "raid1", 2, rng)
    file_off = 300 * 1024
    devid, phys = cm.locate(logical_of(maps["big"], file_off))[1]
    good = want["big"][file_off:file_off + SECTOR]
    damage(devids[devid], phys, good)
    mnt = os.path.join(workdir, "bmnt")
    with fusemount.FuseMount(butter.path, images, mnt) as m:
        want["new"] = rng.randbytes(300000)               # written, not committed yet
        with open(os.path.join(mnt, "new"), "wb") as f:
            f.write(want["new"])
        r = kfs.run([butter.path, "scrub", mnt], check=False, timeout=600)
        assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert re.search(r"errors:\s+1 \(read 0, csum 1,", r.stdout), r.stdout
        assert re.search(r"corrected:\s+1\b", r.stdout), r.stdout
        for name, data in want.items():
            with open(os.path.join(mnt, name), "rb") as f:
                assert f.read() == data, f"{name} through the mount"
        assert m.unmount() == 0, m.log_text()[-3000:]
        assert "rewritten from copy 1" in m.log_text(), m.log_text()[-3000:]
    assert kfs.read_image(devids[devid], phys, SECTOR) == good, "copy 2 was not repaired"
    assert kernel_errors(kernel_scrub(workdir, images)) == 0
    kernel_check_and_read(workdir, images, want)


def test_background_scrub_on_mount(kernel, butter, workdir):
    """On a live `butter mount` the scrub runs in the daemon's thread, as the kernel's does:
    `scrub start` returns at once, `status` reports it running in progs' words, `cancel`
    stops it ("aborted"), `resume -B` goes on to the end and its totals include what the
    first run found (the damaged copy, repaired), `--format json` says the same; with
    nothing to act on, cancel and resume exit 2 as progs does. The mount serves reads and
    writes meanwhile, and an unmount in the middle of a scrub ends it and the daemon
    cleanly. The kernel judges the repair and the image."""
    from butter_it import fusemount
    import json
    fusemount.require_fuse()
    b = butter.path
    rng = random.Random("background")
    images, want, maps, _, cm, devids, _ = made(workdir, "raid1", 2, rng)
    file_off = 300 * 1024
    devid, phys = cm.locate(logical_of(maps["big"], file_off))[1]
    good = want["big"][file_off:file_off + SECTOR]
    damage(devids[devid], phys, good)
    mnt = os.path.join(workdir, "bmnt")
    with fusemount.FuseMount(b, images, mnt) as m:
        want["filler"] = rng.randbytes(24 << 20)          # so that the paced scrub takes seconds
        with open(os.path.join(mnt, "filler"), "wb") as f:
            f.write(want["filler"])
        kfs.run([b, "filesystem", "sync", mnt])
        r = kfs.run([b, "scrub", "status", mnt])
        assert r.stdout.splitlines()[1:] == ["\tno stats available"], r.stdout
        r = kfs.run([b, "scrub", "start", "--limit", "4M", mnt], timeout=30)
        assert re.match(r"scrub started on .*, fsid [0-9a-f-]{36} \(pid=\d+\)$", r.stdout), r.stdout
        assert kfs.run([b, "scrub", "start", mnt], check=False).returncode == 1  # one at a time
        # the mount stays usable while the scrub runs
        want["during"] = rng.randbytes(100000)
        with open(os.path.join(mnt, "during"), "wb") as f:
            f.write(want["during"])
        with open(os.path.join(mnt, "big"), "rb") as f:
            assert f.read() == want["big"]
        r = kfs.run([b, "scrub", "status", mnt])
        assert "Status:           running" in r.stdout, r.stdout
        assert re.search(r"^Bytes scrubbed:   .*\(\d+\.\d\d%\)$", r.stdout, re.M), r.stdout
        assert re.search(r"^Rate:  .*/s \(limit 4\.00MiB/s\)$", r.stdout, re.M), r.stdout
        r = kfs.run([b, "scrub", "cancel", mnt], timeout=30)
        assert r.stdout == "scrub cancelled\n"
        r = kfs.run([b, "scrub", "status", "--raw", mnt])
        assert "Status:           aborted" in r.stdout, r.stdout
        done = int(re.search(r"^Total to scrub:   (\d+)$", r.stdout, re.M).group(1))
        assert done > 24 << 20, r.stdout
        r = kfs.run([b, "scrub", "cancel", mnt], check=False)
        assert r.returncode == 2 and "not running" in r.stderr, r.stderr
        r = kfs.run([b, "scrub", "resume", "-B", mnt], check=False, timeout=600)
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
        assert "scrub resumed on " in r.stdout and "Status:           finished" in r.stdout, r.stdout
        assert re.search(r"^Error summary:    csum=1$", r.stdout, re.M), r.stdout
        assert re.search(r"^  Corrected:      1$", r.stdout, re.M), r.stdout
        st = json.loads(kfs.run([b, "--format", "json", "scrub", "status", mnt]).stdout)
        st = st["scrub-status"][0]
        assert st["status"] == "finished" and int(st["resumed"]) >= int(st["started"]) > 0, st
        assert int(st["csum_errors"]) == 1 and int(st["corrected"]) == 1, st
        assert int(st["bytes_scrubbed"]) >= 24 << 20, st
        r = kfs.run([b, "scrub", "resume", mnt], check=False)
        assert r.returncode == 2 and r.stdout.startswith("scrub: nothing to resume for "), r.stdout
        # an unmount while a scrub runs ends both
        kfs.run([b, "scrub", "start", "--limit", "1M", mnt])
        assert m.unmount() == 0, m.log_text()[-3000:]
        log = m.log_text()
        assert "rewritten from copy 1" in log and "scrub cancelled" in log, log[-3000:]
    assert kfs.read_image(devids[devid], phys, SECTOR) == good, "copy 2 was not repaired"
    assert kernel_errors(kernel_scrub(workdir, images)) == 0
    kernel_check_and_read(workdir, images, want)
