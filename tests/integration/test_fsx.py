"""The file exerciser (tests/tools/fsx.c) through `butter mount`, judged by its model
and by the kernel.

  butter    several seeded runs (100k+ operations in all: reads, writes, truncates, mmap
            reads and writes, fallocate in five modes, copy_file_range, fsync, reopen), each
            on its own file of one mount, with file size limits from 8 KiB (inline extents)
            to 4 MiB; fsx checks every byte against its model as it goes. After the
            unmount: `btrfs check --readonly`, and the kernel, mounting the image, must
            show every file exactly as fsx's model ended (written with -g).
  harness   the same tool on a kernel btrfs mount must pass (no false alarms), and a
            model corrupted on purpose (-X) must fail, leaving an operation log whose
            replay (-r) fails at the same operation, and passes without the corruption.

Fallocate modes the mount refuses with EOPNOTSUPP are counted by fsx and skipped; the
counts are printed. Scale with BUTTER_FSX_SCALE (a factor on every run's operations,
default 1: about 110k operations, 1-3 minutes under ASan on 2 cores).
Needs root, loop devices, kernel btrfs, /dev/fuse and fusermount3.
"""
import os
import re

import pytest

from butter_it import env, kfs, oracle
from butter_it.fusemount import FuseMount, require_fuse
from butter_it.tree import read_file

SCALE = float(os.environ.get("BUTTER_FSX_SCALE", "1"))

# (seed, operations, largest file, largest operation)
RUNS = [
    (1, 25000, "256K", "64K"),
    (2, 25000, "256K", "64K"),
    (3, 20000, "8K", "3K"),        # inline extents and their growth into regular ones
    (4, 20000, "1M", "128K"),
    (5, 8000, "4M", "1M"),
    (6, 15000, "64K", "4K"),
]


def fsx_path(butter_path):
    if os.environ.get("BUTTER_FSX"):
        return os.environ["BUTTER_FSX"]
    near = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(butter_path))),
                        "tests", "tools", "butter-fsx")
    return near if os.path.exists(near) else os.path.join(env.REPO, "build", "tests", "tools",
                                                          "butter-fsx")


@pytest.fixture
def fsx(butter):
    path = fsx_path(butter.path)
    if not os.access(path, os.X_OK):
        pytest.fail(f"fsx missing: {path} (build with ninja, or set BUTTER_FSX)", pytrace=False)
    return path


def run_fsx(fsx, target, seed, ops, maxlen, maxop, cwd, extra=(), timeout=900, expect=0):
    cmd = [fsx, "-S", str(seed), "-N", str(ops), "-l", maxlen, "-o", maxop] + list(extra) + \
        [target]
    proc = kfs.run(cmd, check=False, timeout=timeout) if cwd is None else \
        run_in(cmd, cwd, timeout)
    assert proc.returncode == expect, (f"{' '.join(cmd)}: status {proc.returncode}\n"
                                       f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def run_in(cmd, cwd, timeout):
    old = os.getcwd()
    os.chdir(cwd)                  # fsx writes its failure log to the current directory
    try:
        return kfs.run(cmd, check=False, timeout=timeout)
    finally:
        os.chdir(old)


def counts(stdout):
    """{op: (done, unsupported)} from fsx's summary."""
    return {m.group(1): (int(m.group(2)), int(m.group(3)))
            for m in re.finditer(r"^\s+(\S+)\s+(\d+) done\s+(\d+) unsupported", stdout, re.M)}


@pytest.mark.butter_timeout(1500)
def test_fsx_on_butter_mount(fuse_ok, butter, fsx, workdir):
    image = kfs.mkfs_image(workdir)
    goods = {}
    total = 0
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        for seed, ops, maxlen, maxop in RUNS:
            n = max(1, int(ops * SCALE))
            name = f"fsx-{seed}"
            good = os.path.join(workdir, name + ".good")
            proc = run_fsx(fsx, os.path.join(m.mnt, name), seed, n, maxlen, maxop, workdir,
                           ["-g", good])
            c = counts(proc.stdout)
            assert sum(done + unsup for done, unsup in c.values()) == n, proc.stdout
            for op in ("read", "write", "mapread", "mapwrite", "truncate", "copy_range"):
                assert c[op][0] > 0, f"seed {seed}: no {op} ran\n{proc.stdout}"
            print(f"seed {seed}: {n} operations; unsupported: "
                  f"{ {op: u for op, (_, u) in c.items() if u} }")
            goods[name] = good
            total += n
        assert read_file(os.path.join(m.mnt, "fsx-1")) == read_file(goods["fsx-1"])
        assert m.unmount() == 0
    assert total >= 100000 * min(SCALE, 1)
    oracle.btrfs_check(image)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kview")) as kmnt:
        assert sorted(os.listdir(kmnt)) == sorted(goods)
        for name, good in goods.items():
            got, want = read_file(os.path.join(kmnt, name)), read_file(good)
            assert len(got) == len(want), f"{name}: kernel sees {len(got)} bytes, fsx {len(want)}"
            assert got == want, f"{name}: the kernel reads other bytes than fsx wrote"


@pytest.fixture
def fuse_ok(kernel):
    require_fuse()


def test_fsx_harness_on_kernel_btrfs(kernel, butter, fsx, workdir):
    with kfs.kernel_fs(workdir, name="k") as fs:
        # no false alarms on the kernel's btrfs, every fallocate mode supported there
        proc = run_fsx(fsx, os.path.join(fs.mnt, "clean"), 11, 20000, "256K", "64K", workdir)
        c = counts(proc.stdout)
        assert all(u == 0 for _, u in c.values()), proc.stdout
        assert all(done > 0 for done, _ in c.values()), proc.stdout
        # a model corrupted on purpose after operation 700 must be caught
        bad = run_fsx(fsx, os.path.join(fs.mnt, "bad"), 12, 3000, "256K", "64K", workdir,
                      ["-X", "700", "-c", "100"], expect=1)
        m = re.search(r"FAILED at operation (\d+)", bad.stderr)
        assert m and 700 <= int(m.group(1)) <= 800, bad.stderr
        log = os.path.join(workdir, "bad.fsxlog")
        assert os.path.exists(log), bad.stderr
        with open(log) as f:
            lines = f.read().splitlines()
        assert len(lines) == int(m.group(1)) and lines[0].startswith("1 ")
        # the log replays the same run: the same failure with -X, none without
        again = run_fsx(fsx, os.path.join(fs.mnt, "replay"), 99, 1, "256K", "64K", workdir,
                        ["-r", log, "-X", "700", "-c", "100"], expect=1)
        assert f"FAILED at operation {m.group(1)}" in again.stderr, again.stderr
        run_fsx(fsx, os.path.join(fs.mnt, "replay2"), 99, 1, "256K", "64K", workdir,
                ["-r", log, "-c", "100", "-g", os.path.join(workdir, "replay2.good")])
        fs.release()
