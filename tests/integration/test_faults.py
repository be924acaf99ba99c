"""A failing disk: reads fall back to good copies, failing writes never corrupt.

The fault-injection device (lib/device/fault.c, reached through `butter --fault SPEC`
and `butter-workload --fault SPEC`) makes chosen device operations fail:

1. Reads: on a raid1 filesystem the kernel wrote, every read of one device past its
   first MiB fails (its superblock stays readable, every chunk copy on it does not).
   `butter extract` must still give every file exactly, from the other copy; with both
   devices failing it must fail with the path named, never hand out bad bytes.
2. Writes, flushes, torn writes, a vanishing device (single device and raid1): a seeded
   workload (tests/tools/workload.c) runs until the fault stops it; the library must
   say the transaction aborted and the filesystem is read-only, refuse further changes
   and commits with EROFS, and leave on disk the last committed state: crashreplay
   --verify checks that butter reads exactly the manifest's state for the image's
   generation (never older than the last completed sync), that `btrfs check --readonly`
   is clean, and that the kernel mounts it and shows the same tree.
3. A full disk at every stage of a commit: the device answers ENOSPC at each write
   (data, every tree block copy, each superblock copy) and at each flush of a commit
   in turn; each time the commit fails with ENOSPC and the image is intact.

Runtime: about 2 minutes on 2 cores (sanitizer build).
"""
import os
import random
import re

import pytest

from butter_it import kfs, oracle
from butter_it.kfs import make_image
from butter_it.tools import REC_FLUSH, REC_WRITE, log_records, tool


def tree_digests(root):
    """{relative path: sha256} of every regular file below `root`."""
    out = {}
    for d, _, files in os.walk(root):
        for name in files:
            p = os.path.join(d, name)
            if os.path.isfile(p) and not os.path.islink(p):
                out[os.path.relpath(p, root)] = kfs.file_sha256(p)
    return out


# ---- 1. reads --------------------------------------------------------------------

@pytest.mark.butter_timeout(900)
def test_raid1_read_eio_on_one_mirror(kernel, workdir, butter):
    rnd = random.Random(5)
    with kfs.kernel_fs(workdir, ndevices=2, size=1 << 30,
                       mkfs_args=["-d", "raid1", "-m", "raid1"]) as fs:
        os.makedirs(os.path.join(fs.mnt, "dir", "sub"))
        for i in range(40):
            size = rnd.choice([0, 100, 3000, 4096, 70000, 1 << 20, 3 << 20])
            path = os.path.join(fs.mnt, "dir" if i % 3 else "dir/sub", f"f{i}")
            with open(path, "wb") as f:
                f.write(rnd.randbytes(size))
        src = tree_digests(fs.mnt)
        fs.release()
        images = fs.images
    assert len(src) == 40

    for dev in (0, 1):
        dest = os.path.join(workdir, f"out{dev}")
        p = butter.run(["--fault", f"read-eio,dev={dev},start=1M", "extract"] +
                       butter.device_args(images) + [dest], check=False)
        assert p.returncode == 0, f"extract with device {dev} failing: {p.stderr}"
        assert tree_digests(dest) == src, f"wrong data with device {dev} failing"

    dest = os.path.join(workdir, "out-both")
    p = butter.run(["--fault", "read-eio,dev=0,start=1M;read-eio,dev=1,start=1M", "extract"] +
                   butter.device_args(images) + [dest], check=False)
    assert 0 < p.returncode < 128, "reads failing on both copies went unnoticed"
    assert "Input/output error" in p.stderr or "no good copy" in p.stderr, p.stderr
    # whatever was extracted is exact, or its file is reported as unreadable
    if os.path.isdir(dest):
        for path, digest in tree_digests(dest).items():
            assert digest == src[path] or path in p.stderr, f"{path}: bad bytes extracted"


# ---- 2. writes, flushes, torn writes, a vanishing device ----------------------------

def count_records(log, dev=None):
    """(writes, flushes) of a record log, of device index `dev` or all devices."""
    writes = flushes = 0
    for rtype, d, _, _, _ in log_records(log):
        if dev is None or d == dev:
            writes += rtype == REC_WRITE
            flushes += rtype == REC_FLUSH
    return writes, flushes


def run_workload(workdir, images, tag, fault=None, record=None, ops=100, sync_every=10,
                 seed=3):
    """Run the workload on fresh copies of `images`; return (proc, copies, manifest)."""
    d = os.path.join(workdir, tag)
    os.makedirs(os.path.join(d, "ref"))
    copies = []
    for i, img in enumerate(images):
        copies.append(os.path.join(d, f"dev{i}.img"))
        kfs.run(["cp", "--sparse=always", img, copies[-1]])
    manifest = os.path.join(d, "manifest")
    args = [tool("butter-workload"), "--profile", "mix", "--manifest", manifest, "--max-file",
            str(1 << 20)]
    for extra in copies[1:]:
        args += ["--device", extra]
    if fault:
        args += ["--fault", fault]
    if record:
        args += ["--record", record]
    r = kfs.run(args + [copies[0], os.path.join(d, "ref"), str(seed), str(ops),
                        str(sync_every)], check=False, timeout=600)
    assert "AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr
    return r, copies, manifest


def verify_image(workdir, manifest, copies, kernel_mount=True):
    args = [tool("crashreplay"), "--verify", "--work", workdir]
    if kernel_mount:
        args += ["--kernel", "1"]
    r = kfs.run(args + [manifest] + copies, check=False, timeout=600)
    assert r.returncode == 0 and "failed 0;" in r.stdout, \
        f"the image is not the last committed state:\n{r.stdout}\n{r.stderr[-4000:]}"
    if kernel_mount:
        assert "kernel-mounted 1, agreed 1" in r.stdout, r.stdout
    if len(copies) == 1:
        oracle.btrfs_check(copies[0])
    return r


def assert_stopped(r, message, aborted=True):
    assert r.returncode == 3, f"the fault did not stop the workload:\n{r.stdout}\n{r.stderr}"
    assert "stopped:" in r.stdout and message in r.stdout, r.stdout
    if aborted:
        assert re.search(r"transaction \d+ aborted in .*: " + re.escape(message) +
                         r"; the filesystem is now read-only", r.stderr), r.stderr
        assert "after: create Read-only file system, sync Read-only file system" in r.stdout, \
            r.stdout


@pytest.fixture(scope="module")
def single_image(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("faults") / "start.img")
    make_image(path, 128 << 20)
    return [path]


@pytest.fixture(scope="module")
def raid1_images(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults-raid1")
    paths = [str(d / "a.img"), str(d / "b.img")]
    for p in paths:
        with open(p, "wb") as f:
            f.truncate(256 << 20)
    kfs.run(["mkfs.btrfs", "-q", "-f", "-d", "raid1", "-m", "raid1"] + paths)
    return paths


def fault_points(workdir, images, dev):
    """Record a clean run; return device `dev`'s (writes, flushes) to spread faults over."""
    log = os.path.join(workdir, "clean.log")
    r, copies, manifest = run_workload(workdir, images, "clean", record=log)
    assert r.returncode == 0, r.stderr
    return count_records(log, dev)


@pytest.mark.butter_timeout(1200)
@pytest.mark.parametrize("layout", ["single", "raid1"])
def test_write_faults_keep_last_commit(kernel, workdir, layout, single_image, raid1_images):
    images = single_image if layout == "single" else raid1_images
    writes, flushes = fault_points(workdir, images, 1 if layout == "raid1" else 0)
    assert writes > 50 and flushes > 10, (writes, flushes)
    dev = ",dev=1" if layout == "raid1" else ""
    cases = []
    for frac in (0.05, 0.3, 0.55, 0.8, 0.97):
        cases.append((f"write-eio={int(writes * frac)}{dev}", "Input/output error", True))
    for frac in (0.2, 0.7):
        cases.append((f"torn={int(writes * frac)}{dev}", "Input/output error", True))
    for k in (1, flushes // 2, flushes - 1):
        cases.append((f"flush-eio={k}{dev}", "Input/output error", True))
    for frac in (0.3, 0.9):
        # N counts reads too: the device may vanish on a read (no abort needed then)
        cases.append((f"vanish={int((writes + flushes) * frac)}{dev},err=ENXIO",
                      "No such device or address", False))
    for i, (spec, message, aborted) in enumerate(cases):
        r, copies, manifest = run_workload(workdir, images, f"fault{i}", fault=spec)
        assert_stopped(r, message, aborted)
        verify_image(workdir, manifest, copies, kernel_mount=i % 2 == 0)


# ---- 3. a full disk at every stage of a commit ------------------------------------

@pytest.mark.butter_timeout(1200)
def test_enospc_at_every_stage_of_a_commit(kernel, workdir, single_image):
    """One commit (8 operations, then sync): ENOSPC at each of its writes and flushes."""
    log = os.path.join(workdir, "one-commit.log")
    r, _, _ = run_workload(workdir, single_image, "clean", record=log, ops=8, sync_every=8)
    assert r.returncode == 0, r.stderr
    writes, flushes = count_records(log)
    assert writes >= 8 and flushes >= 2, (writes, flushes)
    specs = [f"write-eio={n},err=ENOSPC" for n in range(writes)]
    specs += [f"flush-eio={k},err=ENOSPC" for k in range(flushes)]
    for i, spec in enumerate(specs):
        r, copies, manifest = run_workload(workdir, single_image, f"enospc{i}", fault=spec,
                                           ops=8, sync_every=8)
        assert_stopped(r, "No space left on device")
        verify_image(workdir, manifest, copies, kernel_mount=i % 8 == 0)
