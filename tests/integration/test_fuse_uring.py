"""FUSE over io_uring (`butter mount -o uring`, fuse/uring.c), judged by the kernel.

  workload  a POSIX workload through a mount with -o uring (the butter_it.tree sections
            that need no ioctl, O_TMPFILE files given names, and threads that write and
            fsync at once, so fsync.c answers one thread's request from another) leaves
            the tree the same workload leaves on a kernel mount; the ring's threads
            (butter-ring<CPU>) exist and served; after the unmount `btrfs check
            --readonly` is clean and the kernel, mounting the image, shows that tree
  signal    SIGTERM ends a -o uring daemon with its commit: data still in the kernel's
            writeback cache survives
  fallback  with the kernel not offering the ring (enable_uring=N), -o uring warns and
            /dev/fuse serves: the same workload, the same tree

The tests set the fuse module's parameter /sys/module/fuse/parameters/enable_uring (Y,
or N for the fallback) and restore it. Skipped (failed under CI) when the kernel has no
FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING) or butter was built without
liburing. Needs root, loop devices, kernel btrfs, /dev/fuse and fusermount3.
"""
import ctypes
import hashlib
import os
import signal
import threading

import pytest

from butter_it import env, kfs, manifest, oracle, tree
from butter_it.fusemount import FuseMount, is_mounted
from butter_it.tree import read_file

PARAM = "/sys/module/fuse/parameters/enable_uring"
SECTIONS = ("sizes", "big", "sparse", "prealloc", "meta", "special", "names", "links", "many")
# as test_fuse.py: ACLs are compared there, not here
ACL_PATHS = ["meta/acl-file", "meta/acl-dir", "meta/acl-and-xattrs"]
FSYNC_THREADS, FSYNC_ROUNDS = 6, 15

_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, AT_SYMLINK_FOLLOW = -100, 0x400


@pytest.fixture
def enable_uring(fuse, butter, workdir):
    """The module parameter, settable (Y by default here); restored after the test."""
    if not os.path.exists(PARAM):
        env.unavailable("needs FUSE over io_uring in the kernel (Linux 6.14+, "
                        "CONFIG_FUSE_IO_URING)")
    proc = kfs.run([butter.path, "mount", "-o", "uring", os.path.join(workdir, "none.img"),
                    os.path.join(workdir, "none")], check=False)
    if "without liburing" in proc.stderr:
        env.unavailable("needs butter built with liburing (liburing-dev)")
    with open(PARAM) as f:
        old = f.read().strip()

    def set_param(value):
        with open(PARAM, "w") as f:
            f.write(value)

    set_param("Y")
    try:
        yield set_param
    finally:
        set_param(old)


def link_fd(fd, path):
    """linkat(/proc/self/fd/FD, path, AT_SYMLINK_FOLLOW): names an O_TMPFILE file."""
    if _libc.linkat(AT_FDCWD, f"/proc/self/fd/{fd}".encode(), AT_FDCWD, os.fsencode(path),
                    AT_SYMLINK_FOLLOW) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)


def fsync_writer(root, n):
    """Append to one file and fsync it, round after round (in its own thread)."""
    path = os.path.join(root, "fsync", f"f{n}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for r in range(FSYNC_ROUNDS):
            os.write(fd, hashlib.shake_128(b"%d.%d" % (n, r)).digest(3000 + 97 * r))
            os.fsync(fd)
    finally:
        os.close(fd)


def workload(root):
    gen = tree.Gen(root, seed=11, scale=env.SCALE)
    for section in SECTIONS:
        getattr(gen, section)()
    os.mkdir(os.path.join(root, "tmpfile"))
    for i in range(3):
        fd = os.open(os.path.join(root, "tmpfile"), os.O_TMPFILE | os.O_RDWR, 0o640)
        os.write(fd, hashlib.shake_128(b"tmp%d" % i).digest(5000 * (i + 1)))
        link_fd(fd, os.path.join(root, "tmpfile", f"named{i}"))
        os.close(fd)
    os.mkdir(os.path.join(root, "fsync"))
    errors = []

    def run(n):
        try:
            fsync_writer(root, n)
        except Exception as e:  # reported below, in the test's thread
            errors.append(e)
    threads = [threading.Thread(target=run, args=(n,)) for n in range(FSYNC_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    gen.stamp_dirs()
    for d in ("tmpfile", "fsync"):          # their files' times are the clock's: fix them
        for name in os.listdir(os.path.join(root, d)):
            os.utime(os.path.join(root, d, name), ns=(10**9, 2 * 10**9))
        os.utime(os.path.join(root, d), ns=(10**9, 2 * 10**9))
    tree.syncfs(root)


def ring_threads(pid):
    """{tid: voluntary context switches} of the daemon's ring threads (butter-ring<CPU>)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if not f.read().startswith("butter-ring"):
                    continue
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        out[int(tid)] = int(line.split()[1])
        except FileNotFoundError:
            continue
    return out


def through_mount(butter, workdir, image, ref):
    """Run the workload on `image` mounted with -o uring, compare it with `ref`; return
    the manifest of the mount, the ring threads' switches and the daemon's log."""
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt"), ["uring"]) as m:
        workload(m.mnt)
        got = manifest.take(m.mnt)
        manifest.assert_same(ref, got, exclude=ACL_PATHS)
        ring = ring_threads(m.proc.pid)
        assert m.unmount() == 0
        log = m.log_text()
    assert "aborted" not in log, log
    oracle.btrfs_check(image)
    seen = oracle.kernel_sees(ref, image, mnt=os.path.join(workdir, "kview"), exclude=ACL_PATHS)
    oracle.assert_tree(got, seen, "the kernel against butter's mount")
    return got, ring, log


def kernel_reference(workdir):
    with kfs.kernel_fs(workdir, name="ref") as fs:
        workload(fs.mnt)
        fs.sync()
        ref = manifest.take(fs.mnt)
        fs.release()
    return ref


@pytest.mark.butter_timeout(900)
def test_workload_through_the_ring(enable_uring, butter, workdir):
    ref = kernel_reference(workdir)
    _, ring, log = through_mount(butter, workdir, kfs.mkfs_image(workdir), ref)
    assert "FUSE over io_uring" not in log, log  # no warning: the ring ran
    # a queue a possible CPU, two threads each at least, and they served requests
    assert len(ring) >= 2 * len(os.sched_getaffinity(0)), ring
    assert sum(ring.values()) > 1000, f"the ring's threads hardly ran: {ring}"


def test_signal_commits(enable_uring, butter, workdir):
    image = kfs.mkfs_image(workdir)
    payload = hashlib.shake_128(b"open").digest(3 * 4096 + 100)
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt"), ["uring"]) as m:
        with open(os.path.join(m.mnt, "closed"), "wb") as f:
            f.write(b"closed file")
        fd = os.open(os.path.join(m.mnt, "open"), os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, payload)
        assert ring_threads(m.proc.pid)
        try:
            assert m.signal(signal.SIGTERM) == 0
        finally:
            try:
                os.close(fd)
            except OSError:
                pass                  # the connection is gone
        assert not is_mounted(m.mnt)
    oracle.btrfs_check(image)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kview")) as kmnt:
        assert read_file(os.path.join(kmnt, "closed")) == b"closed file"
        assert read_file(os.path.join(kmnt, "open")) == payload


@pytest.mark.butter_timeout(900)
def test_fallback_when_the_kernel_does_not_offer_it(enable_uring, butter, workdir):
    enable_uring("N")
    ref = kernel_reference(workdir)
    _, ring, log = through_mount(butter, workdir, kfs.mkfs_image(workdir), ref)
    assert "the kernel does not offer it" in log, log
    assert ring == {}
