"""Tree log, write side: butter_fsync() logs instead of committing, and what it logged
survives a power cut in the eyes of the kernel, btrfs check and butter itself.

Each case runs file operations through libbutter (tests/tools/logtool.c: butter-logtool),
fsyncs, and then "loses power" (`crash`: _exit without a commit or a close), so the
image holds exactly what a power cut right after the fsync leaves. Then:
  (a) btrfs check --readonly is clean on that image (it reads the log tree), and the
      superblock names a log (or, for the cases that must fall back to a commit, none);
  (b) the kernel mounts a copy (replaying our log) and shows the fsynced files exactly
      (bytes, size, xattrs, link count, names), and btrfs check is clean after unmount;
  (c) butter opens another copy read-write (lib/treelog/replay.c replays the log and
      commits), btrfs check is clean, the log root is gone, and the kernel shows the
      same files.
FUSE cases (a `butter mount` killed with SIGKILL right after fsync returned, and the
`butter fsync` command) are at the end.

Runtime: under a second per case (two kernel mounts, four btrfs checks); the file (38 cases,
the power-cut case with 16 states and the 1100-file limits case included) about 35 s on this
2-core machine.
"""
import os
import signal
import subprocess
import time

import pytest

from butter_it import env, kfs, oracle, tools
from butter_it.fusemount import FuseMount, require_fuse
# the bytes butter-logtool's `write PATH OFF LEN SEED` writes (tests/tools/toolutil.h tool_fill)
from butter_it.tools import prng_bytes as data

IMAGE_SIZE = 1 << 30
SECTOR = 4096


def pattern(seed, length):
    """The compressible bytes of `writec PATH OFF LEN SEED`: runs of 64 equal bytes."""
    runs = b"".join(bytes([(k * 7 + seed) & 0xFF]) * 64 for k in range(length // 64 + 1))
    return runs[:length]


class Model:
    """What the fsynced files must hold: path -> bytearray, xattrs, links."""

    def __init__(self):
        self.files = {}
        self.xattrs = {}

    def write(self, path, off, buf):
        f = self.files.setdefault(path, bytearray())
        if len(f) < off:
            f.extend(b"\0" * (off - len(f)))
        f[off:off + len(buf)] = buf

    def truncate(self, path, size):
        f = self.files.setdefault(path, bytearray())
        if len(f) > size:
            del f[size:]
        else:
            f.extend(b"\0" * (size - len(f)))


@pytest.fixture(scope="module")
def logtool():
    env.require_kernel()
    return tools.tool("butter-logtool")


@pytest.fixture
def workdir(request):
    path = kfs.make_workdir(request.node.name)
    yield path
    kfs.cleanup_all()
    kfs.remove_workdir(path)


def run_tool(logtool, image, lines, expect_fail=()):
    """Run butter-logtool on `image` with `lines`; every command must answer 0."""
    script = "".join(line + "\n" for line in lines)
    r = subprocess.run([logtool, image], input=script.encode(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=600)
    assert r.returncode == 0, f"butter-logtool exited {r.returncode}:\n{r.stderr.decode()[-3000:]}"
    answers = r.stdout.decode().split()
    sent = [line for line in lines if line.split()[0] != "crash"]
    assert len(answers) == len(sent), f"answers {answers} for {lines}\n{r.stderr.decode()}"
    for line, ans in zip(sent, answers):
        if line in expect_fail:
            assert ans != "0", f"{line!r} should have failed"
        else:
            assert ans == "0", f"{line!r} answered {ans}\n{r.stderr.decode()[-3000:]}"
    return r.stderr.decode()


def compare(mnt, model, absent=(), nlinks=None):
    for path, content in model.files.items():
        full = os.path.join(mnt, path)
        assert os.path.isfile(full), f"{path} missing"
        with open(full, "rb") as f:
            got = f.read()
        assert len(got) == len(content), f"{path}: size {len(got)}, expected {len(content)}"
        assert got == bytes(content), f"{path}: content differs"
        want = model.xattrs.get(path)
        if want is not None:
            names = [n for n in os.listxattr(full) if n.startswith("user.")]
            got_x = {n: os.getxattr(full, n) for n in names}
            assert got_x == want, f"{path}: xattrs {got_x}, expected {want}"
    for path in absent:
        assert not os.path.lexists(os.path.join(mnt, path)), f"{path} should not exist"
    for path, n in (nlinks or {}).items():
        assert os.stat(os.path.join(mnt, path)).st_nlink == n, f"{path}: link count"


def kernel_view(image, mnt, model, absent=(), nlinks=None):
    with oracle.kernel_mount(image, mnt=mnt, opts=()):
        compare(mnt, model, absent, nlinks)


def verify(logtool, workdir, image, model, logged=True, absent=(), nlinks=None):
    """The three oracles (a), (b), (c) of the module docstring."""
    sb = kfs.super_fields(image)
    if logged:
        assert sb["log_root"] != "0", "the fsync committed instead of logging"
    else:
        assert sb["log_root"] == "0", "expected a full commit, found a log"
    oracle.btrfs_check(image)
    mnt = os.path.join(workdir, "mnt")
    os.makedirs(mnt, exist_ok=True)
    # (b) the kernel replays our log
    kimg = os.path.join(workdir, "kernel.img")
    kfs.run(["cp", "--sparse=always", image, kimg])
    kernel_view(kimg, mnt, model, absent, nlinks)
    oracle.btrfs_check(kimg)
    # (c) butter replays it at a read-write open
    bimg = os.path.join(workdir, "butter.img")
    kfs.run(["cp", "--sparse=always", image, bimg])
    run_tool(logtool, bimg, [])
    assert kfs.super_fields(bimg)["log_root"] == "0"
    oracle.btrfs_check(bimg)
    kernel_view(bimg, mnt, model, absent, nlinks)
    os.unlink(kimg)
    os.unlink(bimg)


def fresh_image(workdir, mkfs_args=()):
    image = os.path.join(workdir, "fs.img")
    with open(image, "wb") as f:
        f.truncate(IMAGE_SIZE)
    kfs.run(["mkfs.btrfs", "-q", *mkfs_args, image])
    return image


# ---------------------------------------------------------------------------------

def test_new_file_in_committed_dir(logtool, workdir):
    image = fresh_image(workdir)
    m = Model()
    m.write("d/f", 0, data(7, 100000))
    m.write("small", 0, data(8, 300))          # inline
    run_tool(logtool, image, ["mkdir d", "sync", "create d/f", "write d/f 0 100000 7",
                              "create small", "write small 0 300 8",
                              "create notsynced", "write notsynced 0 5000 9",
                              "fsync d/f", "fsync small", "crash"])
    verify(logtool, workdir, image, m, absent=["notsynced"])


@pytest.mark.parametrize("mkfs_args", [(), ("-O", "^no-holes", "--csum", "xxhash"),
                                       ("-n", "4096", "--csum", "sha256")],
                         ids=["default", "holes-xxhash", "node4k-sha256"])
def test_overwrite_append_truncate(logtool, workdir, mkfs_args):
    image = fresh_image(workdir, mkfs_args)
    m = Model()
    m.write("f", 0, data(1, 300000))
    m.write("f", 4096 * 3 + 100, data(2, 9000))
    m.write("f", 300000, data(3, 50000))
    m.write("g", 0, data(4, 200000))
    m.truncate("g", 10001)
    m.write("h", 0, data(5, 20000))
    m.truncate("h", 1 << 20)                  # grown: a hole to the new size
    run_tool(logtool, image, ["create f", "write f 0 300000 1", "create g",
                              "write g 0 200000 4", "create h", "write h 0 20000 5", "sync",
                              f"write f {4096 * 3 + 100} 9000 2", "write f 300000 50000 3",
                              "truncate g 10001", f"truncate h {1 << 20}",
                              "fsync f", "fsync g", "fsync h", "crash"])
    verify(logtool, workdir, image, m)


def test_holes_prealloc_punch(logtool, workdir):
    image = fresh_image(workdir)
    m = Model()
    m.write("f", 0, data(1, 1 << 20))
    # punch 64K..192K of the committed data, write far out past a hole
    m.files["f"][65536:196608] = b"\0" * 131072
    m.write("f", 4 << 20, data(2, 10000))
    m.write("p", 0, b"\0" * (256 << 10))       # preallocated: reads as zeros
    m.write("p", 8192, data(3, 4096))
    run_tool(logtool, image, ["create f", "write f 0 1048576 1", "create p", "sync",
                              "falloc f 3 65536 131072", f"write f {4 << 20} 10000 2",
                              f"falloc p 0 0 {256 << 10}", "falloc p 1 1048576 65536",
                              "write p 8192 4096 3", "fsync f p", "crash"])
    verify(logtool, workdir, image, m)


def test_xattrs(logtool, workdir):
    image = fresh_image(workdir)
    m = Model()
    m.write("f", 0, data(1, 5000))
    m.xattrs["f"] = {"user.b": b"bee", "user.c": b"sea"}
    run_tool(logtool, image, ["create f", "write f 0 5000 1", "setxattr f user.a aaa",
                              "setxattr f user.b b0", "sync", "rmxattr f user.a",
                              "setxattr f user.b bee", "setxattr f user.c sea",
                              "fsync f", "crash"])
    verify(logtool, workdir, image, m)


@pytest.mark.parametrize("algo", ["zlib", "lzo", "zstd"])
def test_compressed(logtool, workdir, algo):
    image = fresh_image(workdir)
    m = Model()
    m.write("c", 0, pattern(3, 600000))
    m.write("c", 200000, data(4, 30000))
    run_tool(logtool, image, ["create c", "sync", f"compress {algo}",
                              "writec c 0 600000 3", "write c 200000 30000 4",
                              "fsync c", "crash"])
    verify(logtool, workdir, image, m)


def test_hard_links(logtool, workdir):
    image = fresh_image(workdir)
    m = Model()
    m.write("d1/f", 0, data(1, 20000))
    m.write("d2/g", 0, data(1, 20000))
    m.write("d2/n1", 0, data(2, 7000))
    m.write("d1/n2", 0, data(2, 7000))
    run_tool(logtool, image, ["mkdir d1", "mkdir d2", "create d1/f", "write d1/f 0 20000 1",
                              "sync", "link d1/f d2/g",
                              "create d2/n1", "write d2/n1 0 7000 2", "link d2/n1 d1/n2",
                              "fsync d1/f d2/n1", "crash"])
    verify(logtool, workdir, image, m, nlinks={"d1/f": 2, "d2/n1": 2})


@pytest.mark.parametrize("mkfs_args", [(), ("-n", "4096")], ids=["default", "node4k"])
def test_many_files_one_fsync(logtool, workdir, mkfs_args):
    """Enough inodes for a log tree of several levels (with 4 KiB nodes)."""
    image = fresh_image(workdir, mkfs_args)
    m = Model()
    lines = ["mkdir d", "sync"]
    names = []
    for i in range(150):
        name = f"d/file{i:03d}"
        size = 1000 + i * 97
        lines += [f"create {name}", f"write {name} 0 {size} {i}"]
        m.write(name, 0, data(i, size))
        names.append(name)
    lines += ["fsync " + " ".join(names), "crash"]
    run_tool(logtool, image, lines)
    verify(logtool, workdir, image, m)


def test_repeated_fsyncs(logtool, workdir):
    image = fresh_image(workdir)
    m = Model()
    lines = ["create a", "create b", "sync"]
    for i in range(12):
        lines += [f"write a {i * 70000} 70000 {i}", "fsync a"]
        m.write("a", i * 70000, data(i, 70000))
        if i % 3 == 0:
            lines += [f"write b {i * 5000} 5000 {100 + i}", "fdatasync b"]
            m.write("b", i * 5000, data(100 + i, 5000))
    lines += ["write a 0 100 77", "fsync a", "crash"]
    m.write("a", 0, data(77, 100))
    run_tool(logtool, image, lines)
    verify(logtool, workdir, image, m)


def test_relog_shrinks_and_converts(logtool, workdir):
    """A file logged, then cut down (to inline size and below), logged again: the newer
    log items replace the older ones."""
    image = fresh_image(workdir)
    m = Model()
    m.write("f", 0, data(1, 100000))
    m.truncate("f", 500)
    m.write("g", 0, data(2, 700))
    m.write("g", 700, data(3, 60000))
    run_tool(logtool, image, ["create f", "create g", "sync", "write f 0 100000 1", "fsync f",
                              "truncate f 500", "fsync f", "write g 0 700 2", "fsync g",
                              "write g 700 60000 3", "fsync g", "crash"])
    verify(logtool, workdir, image, m)


def test_fdatasync(logtool, workdir):
    """fdatasync logs a same-size overwrite, and skips a change of metadata alone."""
    image = fresh_image(workdir)
    m = Model()
    m.write("f", 0, data(1, 50000))
    run_tool(logtool, image, ["create f", "write f 0 50000 1", "sync",
                              "setxattr f user.x y", "fdatasync f", "crash"])
    verify(logtool, workdir, image, m, logged=False)
    m.write("f", 4096, data(2, 8192))
    run_tool(logtool, image, ["write f 4096 8192 2", "fdatasync f", "crash"])
    verify(logtool, workdir, image, m)


@pytest.mark.parametrize("change", ["punch-leaf", "overwrite-middle", "append", "shrink-grow",
                                    "punch-all"])
def test_fragmented_file(logtool, workdir, change):
    """A file of 600 extents over a dozen leaves (4 KiB nodes): only the leaves a change
    touched are logged, and holes stand for committed extents the change removed,
    including a whole leaf of them (its neighbours, old leaves, now sit side by side)."""
    image = fresh_image(workdir, ("-n", "4096"))
    m = Model()
    lines = ["create f"]
    for i in range(600):
        lines.append(f"write f {i * 4096} 4096 {i}")
        m.write("f", i * 4096, data(i, 4096))
    lines += ["create g", "write g 0 4096 7", "sync"]
    m.write("g", 0, data(7, 4096))
    if change == "punch-leaf":
        lines.append(f"falloc f 3 {200 * 4096} {120 * 4096}")
        m.files["f"][200 * 4096:320 * 4096] = b"\0" * (120 * 4096)
    elif change == "overwrite-middle":
        lines.append(f"write f {300 * 4096 + 100} 10000 1000")
        m.write("f", 300 * 4096 + 100, data(1000, 10000))
    elif change == "append":
        lines.append(f"write f {600 * 4096} 5000 1001")
        m.write("f", 600 * 4096, data(1001, 5000))
    elif change == "shrink-grow":
        lines += [f"truncate f {100 * 4096 + 10}", f"truncate f {400 * 4096}"]
        m.truncate("f", 100 * 4096 + 10)
        m.truncate("f", 400 * 4096)
    elif change == "punch-all":
        lines.append(f"falloc f 3 0 {600 * 4096}")
        m.files["f"][:] = b"\0" * (600 * 4096)
    lines += ["fsync f", "write g 0 100 8", "fsync g", "crash"]
    m.write("g", 0, data(8, 100))
    run_tool(logtool, image, lines)
    verify(logtool, workdir, image, m)


def test_log_limits(logtool, workdir):
    """Past LOG_MAX_INODES (1024) logged inodes the next fsync commits and the log starts
    over; a log sync of more than LOG_MAX_ITEMS (1024) items commits instead."""
    image = fresh_image(workdir)
    m = Model()
    lines = ["mkdir d", "sync"]
    for i in range(1100):
        lines += [f"create d/s{i}", f"write d/s{i} 0 100 {i}", f"fsync d/s{i}"]
        m.write(f"d/s{i}", 0, data(i, 100))
    lines.append("crash")
    run_tool(logtool, image, lines)
    verify(logtool, workdir, image, m)       # the last 76 are in a log
    lines = ["create big"]
    for i in range(1500):                     # 1500 extents: more items than one log sync takes
        lines.append(f"write big {i * 8192} 4096 {i}")
        m.write("big", i * 8192, data(i, 4096))
    lines += ["fsync big", "crash"]
    run_tool(logtool, image, lines)
    verify(logtool, workdir, image, m, logged=False)


def test_subvolume(logtool, workdir):
    image = fresh_image(workdir)
    m = Model()
    m.write("sv/f", 0, data(1, 40000))
    m.write("top", 0, data(2, 5000))
    run_tool(logtool, image, ["subvol sv", "sync", "create sv/f", "write sv/f 0 40000 1",
                              "create top", "write top 0 5000 2", "fsync sv/f top", "crash"])
    verify(logtool, workdir, image, m)


def test_after_snapshot(logtool, workdir):
    """A file changed and fsynced in a subvolume whose blocks a snapshot shares: replay
    copies the shared leaves; the snapshot keeps the old bytes."""
    image = fresh_image(workdir)
    m = Model()
    m.write("sv/f", 0, data(1, 300000))
    m.write("snap/f", 0, data(1, 300000))
    m.write("sv/f", 100000, data(2, 5000))
    m.write("sv/g", 0, data(3, 7000))
    run_tool(logtool, image, ["subvol sv", "create sv/f", "write sv/f 0 300000 1",
                              "snapshot sv snap", "write sv/f 100000 5000 2", "create sv/g",
                              "write sv/g 0 7000 3", "fsync sv/f sv/g", "crash"])
    verify(logtool, workdir, image, m)


def test_fsync_after_rename_commits(logtool, workdir):
    image = fresh_image(workdir)
    m = Model()
    m.write("g", 0, data(1, 8000))
    m.write("g", 8000, data(2, 3000))
    run_tool(logtool, image, ["create f", "write f 0 8000 1", "sync", "rename f g",
                              "write g 8000 3000 2", "fsync g", "crash"])
    verify(logtool, workdir, image, m, logged=False, absent=["f"])


def test_new_dir_commits(logtool, workdir):
    image = fresh_image(workdir)
    m = Model()
    m.write("nd/f", 0, data(1, 8000))
    run_tool(logtool, image, ["mkdir nd", "create nd/f", "write nd/f 0 8000 1",
                              "fsync nd/f", "crash"])
    verify(logtool, workdir, image, m, logged=False)


def test_unlink_of_logged_file_commits(logtool, workdir):
    """A file logged, then unlinked: the next log sync must not leave its name behind."""
    image = fresh_image(workdir)
    m = Model()
    m.write("b", 0, data(2, 3000))
    run_tool(logtool, image, ["mkdir d", "sync", "create a", "write a 0 3000 1", "fsync a",
                              "unlink a", "create b", "write b 0 3000 2", "fsync b", "crash"])
    verify(logtool, workdir, image, m, logged=False, absent=["a"])


def test_commit_after_log(logtool, workdir):
    image = fresh_image(workdir)
    m = Model()
    m.write("f", 0, data(1, 50000))
    m.write("f", 50000, data(2, 50000))
    m.write("g", 0, data(3, 1000))
    run_tool(logtool, image, ["create f", "write f 0 50000 1", "sync", "fsync f",
                              "write f 50000 50000 2", "fsync f", "sync",
                              "create g", "write g 0 1000 3", "fsync g", "sync", "crash"])
    verify(logtool, workdir, image, m, logged=False)
    # and after a normal close, the log blocks freed by the commit are reusable
    run_tool(logtool, image, ["create h", "write h 0 100000 4", "fsync h", "sync",
                              "write h 0 100000 5", "fsync h"])
    m.write("h", 0, data(5, 100000))
    verify(logtool, workdir, image, m, logged=False)


def test_new_chunk_commits(logtool, workdir):
    """Data in a block group made after the commit: the committed state cannot name it."""
    image = fresh_image(workdir)
    m = Model()
    m.write("big", 0, pattern(1, 24 << 20))
    run_tool(logtool, image, ["create big", "sync", f"writec big 0 {24 << 20} 1",
                              "fsync big", "crash"])
    verify(logtool, workdir, image, m, logged=False)


# ---------------------------------------------------------------------------------
# Through `butter mount`: fsync(2), and `butter fsync` (one ioctl for many files)

def _fuse_case(logtool, workdir, body, logged=True, mount_opts=()):
    """Mount, commit a setup, run body(mnt, model) (it fsyncs), then SIGKILL the daemon."""
    require_fuse()
    image = fresh_image(workdir)
    mnt = os.path.join(workdir, "fmnt")
    m = Model()
    fm = FuseMount(env.butter_bin(), [image], mnt, options=["commit=300", *mount_opts])
    with fm:
        os.makedirs(os.path.join(mnt, "d"))
        with open(os.path.join(mnt, "d", "old"), "wb") as f:
            f.write(data(99, 30000))
        kfs.run([env.butter_bin(), "filesystem", "sync", mnt])
        body(mnt, m)
        fm.signal(signal.SIGKILL)
    verify(logtool, workdir, image, m, logged=logged)


def test_fuse_fsync_then_kill9(logtool, workdir):
    def body(mnt, m):
        with open(os.path.join(mnt, "d", "new"), "wb") as f:
            f.write(data(1, 123456))
            f.flush()
            os.fsync(f.fileno())
        m.write("d/new", 0, data(1, 123456))
        with open(os.path.join(mnt, "d", "old"), "r+b") as f:
            f.seek(5000)
            f.write(data(2, 70000))
            f.flush()
            os.fdatasync(f.fileno())
        m.write("d/old", 0, data(99, 30000))
        m.write("d/old", 5000, data(2, 70000))
    _fuse_case(logtool, workdir, body)


def test_fuse_fsync_writeback_cache(logtool, workdir):
    def body(mnt, m):
        with open(os.path.join(mnt, "d", "wb"), "wb") as f:
            f.write(data(3, 200000))
            f.flush()
            os.fsync(f.fileno())
        m.write("d/wb", 0, data(3, 200000))
    _fuse_case(logtool, workdir, body, mount_opts=["writeback_cache"])


def test_cli_fsync_many(logtool, workdir):
    names = [f"d/m{i:03d}" for i in range(200)]    # two ioctl batches

    def body(mnt, m):
        for i, name in enumerate(names):
            with open(os.path.join(mnt, name), "wb") as f:
                f.write(data(i, 2000 + 31 * i))
            m.write(name, 0, data(i, 2000 + 31 * i))
        outside = os.path.join(workdir, "outside")
        with open(outside, "wb") as f:
            f.write(b"x")
        r = kfs.run([env.butter_bin(), "fsync", "--data", outside] +
                    [os.path.join(mnt, n) for n in names], check=False)
        assert r.returncode == 0, r.stderr
    _fuse_case(logtool, workdir, body)


def test_cli_fsync_outside_butter(workdir):
    path = os.path.join(workdir, "plain")
    with open(path, "wb") as f:
        f.write(b"abc")
    r = kfs.run([env.butter_bin(), "fsync", path], check=False)
    assert r.returncode == 0, r.stderr
    r = kfs.run([env.butter_bin(), "fsync", os.path.join(workdir, "missing")], check=False)
    assert r.returncode == 1 and "missing" in r.stderr


# ---------------------------------------------------------------------------------
# Power cuts during log syncs: every prefix of the device writes (lib/device/recorder.c)

SUPER_PRIMARY = 65536


def _records(log):
    """(type, offset, length, payload position, record end) of each record of `log`."""
    out = []
    for rtype, dev, value, length, pos in tools.log_records(log):
        assert dev == 0
        out.append((rtype, value, length, pos + 24, pos + 24 + length))
    return out


def test_power_cut_during_log_syncs(logtool, workdir):
    """Cut the power after every n-th write of a run of fsyncs: each state is consistent
    (btrfs check, kernel and butter replays) and holds every fsync that finished, i.e.
    whose primary superblock write reached the disk (the instant a log sync takes effect).

    Runtime: about 20 s (16 states, each checked as in verify()).
    """
    image = fresh_image(workdir)
    run_tool(logtool, image, ["mkdir d", "create d/a", "write d/a 0 20000 1", "sync"])
    base = os.path.join(workdir, "base.img")
    kfs.run(["cp", "--sparse=always", image, base])
    log = os.path.join(workdir, "rec.log")
    steps = [("write d/a 20000 30000 2", None), ("fsync d/a", "a1"),
             ("create d/b", None), ("write d/b 0 70000 3", None), ("fsync d/b", "b1"),
             ("write d/a 0 8192 4", None), ("create d/c", None), ("write d/c 0 3000 5", None),
             ("fsync d/a d/c", "ac")]
    script = "".join(cmd + "\n" for cmd, _ in steps) + "crash\n"
    r = subprocess.run([logtool, image], input=script.encode(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env={**os.environ, "BUTTER_RECORD": log},
                       timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    answers = [line.split() for line in r.stdout.decode().splitlines()]
    assert len(answers) == len(steps) and all(a[0] == "0" for a in answers), answers
    assert kfs.super_fields(image)["log_root"] != "0"

    # the model after each durable point, and where each took effect in the log
    models, m = [], Model()
    m.write("d/a", 0, data(1, 20000))
    models.append((0, {"d/a": bytes(m.files["d/a"])}))
    cur = {"d/a": bytearray(m.files["d/a"])}
    durable = {"d/a": bytes(cur["d/a"])}
    recs = _records(log)
    for (cmd, point), ans in zip(steps, answers):
        words = cmd.split()
        if words[0] == "create":
            cur[words[1]] = bytearray()
        elif words[0] == "write":
            path, off, length, seed = words[1], int(words[2]), int(words[3]), int(words[4])
            f = cur[path]
            if len(f) < off:
                f.extend(b"\0" * (off - len(f)))
            f[off:off + length] = data(seed, length)
        if point:
            for path in words[1:]:
                durable[path] = bytes(cur[path])
            end = int(ans[1])
            supers = [rec for rec in recs if rec[0] == tools.REC_WRITE and
                      rec[1] == SUPER_PRIMARY and rec[4] <= end]
            models.append((supers[-1][4], dict(durable)))

    # cut points: around each superblock write, and writes spread over the rest
    writes = [rec[4] for rec in recs if rec[0] == tools.REC_WRITE]
    cuts = {0, writes[-1]}
    for take_effect, _ in models[1:]:
        i = writes.index(take_effect)
        cuts.update(writes[max(i - 1, 0):i + 1])
    step = max(len(writes) // 8, 1)
    cuts.update(writes[::step])
    cuts = sorted(cuts)
    print(f"{len(recs)} records, {len(writes)} writes, cuts at {cuts}, points {[t for t, _ in models]}")
    assert len(cuts) >= 8

    state = os.path.join(workdir, "state.img")
    kfs.run(["cp", "--sparse=always", base, state])
    with open(log, "rb") as lf:
        raw = lf.read()
    applied = 0
    with open(state, "r+b") as img:
        for cut in cuts:
            for rtype, off, length, payload, end in recs:
                if end <= applied or end > cut or rtype != tools.REC_WRITE:
                    continue
                img.seek(off)
                img.write(raw[payload:payload + length])
            applied = cut
            img.flush()
            expect = [files for took, files in models if took <= cut][-1]
            cut_image = os.path.join(workdir, "cut.img")
            kfs.run(["cp", "--sparse=always", state, cut_image])
            cm = Model()
            for path, content in expect.items():
                cm.write(path, 0, content)
                cm.truncate(path, len(content))
            sb = kfs.super_fields(cut_image)
            verify(logtool, workdir, cut_image, cm, logged=sb["log_root"] != "0")
            os.unlink(cut_image)


# ---------------------------------------------------------------------------------
# Random sequences: writes, truncates, preallocation, xattrs, links, renames, unlinks,
# fsyncs (one or many files) and commits, then a power cut

class Inode:
    def __init__(self):
        self.content = bytearray()
        self.xattrs = {}
        self.names = set()
        self.dirty = True      # changed since its last fsync or the last commit


def _random_script(rng):
    """A random workload and the state each clean inode must have after the power cut."""
    names = [f"{d}/n{i}" for d in ("d1", "d2") for i in range(5)]
    lines = ["mkdir d1", "mkdir d2", "sync"]
    by_name, inodes = {}, []
    if rng.random() < 0.3:
        lines.append("compress zstd")
    for _ in range(rng.randint(30, 120)):
        free = [n for n in names if n not in by_name]
        used = sorted(by_name)
        op = rng.choice(["create", "write", "write", "write", "truncate", "falloc", "xattr",
                         "link", "rename", "unlink", "fsync", "fsync", "fsync", "sync"])
        if op == "create" or not used:
            if not free:
                continue
            n = rng.choice(free)
            ino = Inode()
            ino.names.add(n)
            by_name[n] = ino
            inodes.append(ino)
            lines.append(f"create {n}")
            continue
        n = rng.choice(used)
        ino = by_name[n]
        if op == "write":
            off = rng.choice([0, rng.randrange(0, 400000), len(ino.content)])
            length = rng.choice([1, 100, 3000, 4096, 4096, 8192, 70000, 200000])
            seed = rng.randrange(1 << 30)
            if rng.random() < 0.5:
                lines.append(f"write {n} {off} {length} {seed}")
                buf = data(seed, length)
            else:
                lines.append(f"writec {n} {off} {length} {seed}")
                buf = pattern(seed, length)
            if len(ino.content) < off:
                ino.content.extend(b"\0" * (off - len(ino.content)))
            ino.content[off:off + length] = buf
        elif op == "truncate":
            size = rng.choice([0, 500, 4096, 10000, len(ino.content) // 2, len(ino.content) + 9000])
            lines.append(f"truncate {n} {size}")
            if size < len(ino.content):
                del ino.content[size:]
            else:
                ino.content.extend(b"\0" * (size - len(ino.content)))
        elif op == "falloc":
            mode = rng.choice([0, 1, 3])
            off = rng.randrange(0, 300000) // 4096 * 4096
            length = rng.choice([4096, 65536, 200704])
            lines.append(f"falloc {n} {mode} {off} {length}")
            if mode == 3:
                end = min(off + length, len(ino.content))
                if end > off:
                    ino.content[off:end] = b"\0" * (end - off)
            elif mode == 0 and off + length > len(ino.content):
                ino.content.extend(b"\0" * (off + length - len(ino.content)))
        elif op == "xattr":
            key = f"user.k{rng.randrange(3)}"
            if key in ino.xattrs and rng.random() < 0.4:
                lines.append(f"rmxattr {n} {key}")
                del ino.xattrs[key]
            else:
                val = f"v{rng.randrange(1000)}"
                lines.append(f"setxattr {n} {key} {val}")
                ino.xattrs[key] = val.encode()
        elif op == "link":
            if not free:
                continue
            t = rng.choice(free)
            lines.append(f"link {n} {t}")
            ino.names.add(t)
            by_name[t] = ino
        elif op == "rename":
            if not free:
                continue
            t = rng.choice(free)
            lines.append(f"rename {n} {t}")
            ino.names.discard(n)
            ino.names.add(t)
            del by_name[n]
            by_name[t] = ino
        elif op == "unlink":
            lines.append(f"unlink {n}")
            ino.names.discard(n)
            del by_name[n]
            if not ino.names:
                inodes.remove(ino)
        elif op == "fsync":
            pick = rng.sample(used, rng.randint(1, min(3, len(used))))
            lines.append("fsync " + " ".join(pick))
            for p in pick:
                by_name[p].dirty = False
            continue
        elif op == "sync":
            lines.append("sync")
            for i in inodes:
                i.dirty = False
            continue
        ino.dirty = True
    lines.append("crash")
    return lines, [i for i in inodes if not i.dirty]


@pytest.mark.parametrize("seed", range(int(os.environ.get("TREE_LOG_SEEDS", "6"))))
def test_random_fsyncs(logtool, workdir, seed):
    """Every inode not changed since its last fsync (or the last commit) is exactly as it was
    then, under every name it had, whatever mix of logs and fallback commits the run made.

    Runtime: about 2 s per seed.
    """
    import random
    rng = random.Random(seed)
    image = fresh_image(workdir, ("-n", "4096") if seed % 2 else ())
    lines, clean = _random_script(rng)
    run_tool(logtool, image, lines)
    m = Model()
    nlinks = {}
    for ino in clean:
        for name in ino.names:
            m.files[name] = ino.content
            m.xattrs[name] = dict(ino.xattrs)
            nlinks[name] = len(ino.names)
    logged = kfs.super_fields(image)["log_root"] != "0"
    print(f"seed {seed}: logged {logged}, clean inodes {len(clean)}, ops {len(lines)}")
    verify(logtool, workdir, image, m, logged=logged, nlinks=nlinks)


def test_fuse_concurrent_fsyncs(logtool, workdir):
    """Threads fsync their own files at once: the daemon groups the requests that wait
    into one log sync (fuse/fsync.c); every file a returned fsync covered survives."""
    import threading

    def body(mnt, m):
        errors = []

        def worker(t):
            try:
                for i in range(20):
                    name = f"d/t{t}-{i}"
                    with open(os.path.join(mnt, name), "wb") as f:
                        f.write(data(t * 100 + i, 3000 + 500 * i))
                        if i % 2:
                            f.flush()
                            os.fdatasync(f.fileno())
                        else:
                            f.flush()
                            os.fsync(f.fileno())
            except Exception as exc:           # reported after the join
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        for t in range(8):
            for i in range(20):
                m.write(f"d/t{t}-{i}", 0, data(t * 100 + i, 3000 + 500 * i))
    _fuse_case(logtool, workdir, body)
