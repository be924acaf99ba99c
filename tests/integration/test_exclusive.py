"""Exclusive access: one writer per filesystem, and truncated devices.

A filesystem open read-write (a `butter mount`, an offline edit) is claimed with open file
description locks (lib/device/claim.c); a second read-write open is refused with a message
naming the holder (pid, command, mount point), and the image is left as it was.
Read-only commands still read a mounted image. An image the kernel has mounted through a
loop device (and the loop device itself) is refused for writing. `butter check` refuses a
filesystem open read-write elsewhere unless --force. A new mount made the moment
`fusermount3 -u` returns waits for the old daemon's last commit instead of reading the
image under it (the old daemon's commit is slowed down with strace's syscall delay, so the
race is certain); one made before the old daemon has even noticed its unmount waits as
well (lib/device/claim.c rule 5). An image truncated below its recorded device size is refused
read-write, read with a warning, and an error for `butter check`. A read-only block device
is refused for writing up front.
"""
import glob
import hashlib
import os
import shutil
import subprocess
import time

import pytest

from butter_it import env, kfs, oracle
from butter_it.fusemount import FuseMount, is_mounted


def run(butter, argv, timeout=120):
    return kfs.run([butter.path] + [os.fspath(a) for a in argv], check=False, timeout=timeout)


def make_image(butter, workdir, name="fs.img", size="256M"):
    img = os.path.join(workdir, name)
    kfs.run([butter.path, "mkfs", "-q", "-b", size, img])
    return img


def host_file(workdir, name, size, seed):
    import random
    path = os.path.join(workdir, name)
    with open(path, "wb") as f:
        f.write(random.Random(seed).randbytes(size))
    return path


def fusermount_unmount(mnt):
    """fusermount3 -u, asked again on EBUSY: the kernel keeps the mount busy until the daemon
    answers the release of a file closed just before, which it sends in the background (the
    daemon's answers come a second late where strace slows it)."""
    for _ in range(50):
        r = kfs.run(["fusermount3", "-u", mnt], check=False)
        if r.returncode == 0 or "busy" not in r.stderr:
            break
        time.sleep(0.1)
    assert r.returncode == 0, r.stderr


def refused(proc, *names):
    """Assert that a command failed with a message that says the image is in use."""
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, None) and proc.returncode < 128, out
    assert "in use" in out, out
    for name in names:
        assert name in out, f"{name!r} not named:\n{out}"


def test_second_mount_shares_the_first(kernel, butter, workdir):
    """A second `butter mount` of an image a live mount serves is that filesystem again, as
    the kernel's btrfs mounts one device at two places (generic/732): a bind mount of the
    first (or of the subvolume subvol= names in it, read-only with -o ro); either unmount
    leaves the other, the daemon ends with the last. A read-write mount of an image mounted
    read-only is refused, naming the mount."""
    img = make_image(butter, workdir)
    b, c, d = (os.path.join(workdir, n) for n in "bcd")
    for p in (b, c, d):
        os.makedirs(p)
    with FuseMount(butter.path, [img], os.path.join(workdir, "a")) as first:
        with open(os.path.join(first.mnt, "kept"), "w") as f:
            f.write("written through the first mount\n")
        kfs.run([butter.path, "subvolume", "create", os.path.join(first.mnt, "sv")])
        with open(os.path.join(first.mnt, "sv", "x"), "w") as f:
            f.write("in the subvolume\n")
        try:
            for argv, where in ((["mount", img, b], b), (["mount", "-o", "subvol=sv", img, c], c),
                                (["mount", "-o", "ro", img, d], d)):
                r = run(butter, argv, timeout=30)
                assert r.returncode == 0 and is_mounted(where), r.stdout + r.stderr
            with open(os.path.join(b, "kept")) as f:
                assert f.read() == "written through the first mount\n"
            with open(os.path.join(b, "new"), "w") as f:
                f.write("written through the second\n")
            with open(os.path.join(first.mnt, "new")) as f:
                assert f.read() == "written through the second\n"
            assert os.listdir(c) == ["x"]
            with pytest.raises(OSError) as e:
                open(os.path.join(d, "nope"), "w")
            assert e.value.errno == 30  # EROFS
            for p in (b, c, d):
                t0 = time.monotonic()
                r = run(butter, ["umount", p], timeout=60)
                assert r.returncode == 0 and not is_mounted(p), r.stderr
                assert time.monotonic() - t0 < 10, "umount waited for a daemon that serves on"
            with open(os.path.join(first.mnt, "kept")) as f:      # the first one goes on
                assert f.read() == "written through the first mount\n"
            assert first.proc.poll() is None
        finally:
            for p in (b, c, d):
                if is_mounted(p):
                    kfs.run(["umount", "-l", p], check=False)
        assert first.unmount() == 0
    assert run(butter, ["cat", img, "/new"]).stdout == "written through the second\n"
    oracle.btrfs_check(img, strict=True)
    # read-only first: a read-write second is refused, naming the mount
    with FuseMount(butter.path, [img], os.path.join(workdir, "ro"), ["ro"]) as first:
        r = run(butter, ["mount", img, b], timeout=30)
        assert r.returncode != 0 and not is_mounted(b), r.stdout + r.stderr
        assert f"mounted at {first.mnt}" in r.stderr and "read-only" in r.stderr, r.stderr
        assert first.unmount() == 0
    # the kernel's btrfs: one device at two places, one filesystem
    with kfs.kernel_fs(workdir, name="k") as fs:
        second = os.path.join(workdir, "k2")
        os.makedirs(second)
        kfs.mount(fs.loops[0], second, [])
        try:
            with open(os.path.join(fs.mnt, "seen"), "w") as f:
                f.write("both\n")
            with open(os.path.join(second, "seen")) as f:
                assert f.read() == "both\n"
        finally:
            kfs.umount(second)


def test_offline_writes_refused_beside_mount(fuse, butter, workdir):
    img = make_image(butter, workdir)
    src = host_file(workdir, "src", 100 << 10, 1)
    kfs.run([butter.path, "put", img, src, "/keep"])
    kfs.run([butter.path, "subvolume", "create", img, "/sv"])
    kfs.run([butter.path, "subvolume", "snapshot", "-r", img, "/sv", "/snap"])
    stream = os.path.join(workdir, "stream")
    kfs.run([butter.path, "send", "-f", stream, img, "/snap"])
    kfs.run([butter.path, "subvolume", "delete", img, "/snap"])
    newdev = host_file(workdir, "newdev", 64 << 20, 2)
    newdev_sha = kfs.file_sha256(newdev)
    with FuseMount(butter.path, [img], os.path.join(workdir, "mnt")) as m:
        before = kfs.file_sha256(img)
        holder = [f"pid {m.proc.pid} (butter)", f"mounted at {m.mnt}"]
        for argv in (["put", img, src, "/new"],
                     ["rm", img, "/keep"],
                     ["mkdir", img, "/dir"],
                     ["ln", "-s", "keep", img, "/link"],
                     ["subvolume", "create", img, "/sv2"],
                     ["receive", "-f", stream, img],
                     ["scrub", img],
                     ["device", "add", img, newdev],
                     ["mkfs", "-f", img]):
            r = run(butter, argv)
            refused(r, *holder)
            assert kfs.file_sha256(img) == before, f"butter {' '.join(argv)} changed the image"
        assert kfs.file_sha256(newdev) == newdev_sha, "device add wrote to the new device"
        # read-only commands still read it (as it was last committed)
        assert "keep" in run(butter, ["ls", img]).stdout
        r = butter.cat([img], "/keep", check=False)
        assert r.returncode == 0 and len(r.stdout) == 100 << 10
        assert run(butter, ["info", img]).returncode == 0
        assert m.unmount() == 0
    assert sorted(n.rstrip("/") for n in run(butter, ["ls", img]).stdout.split()) == \
        ["keep", "sv"]
    oracle.btrfs_check(img, strict=True)


def test_kernel_loop_mount_refused(kernel, butter, workdir):
    img = make_image(butter, workdir)
    src = host_file(workdir, "src", 10 << 10, 3)
    kfs.run([butter.path, "put", img, src, "/keep"])
    mnt = os.path.join(workdir, "mnt")
    dev = kfs.loop_attach(img)
    try:
        kfs.mount(dev, mnt, [])
        try:
            for argv in (["put", img, src, "/new"], ["mkfs", "-f", img],
                         ["put", dev, src, "/new"]):
                refused(run(butter, argv), f"mounted at {os.path.realpath(mnt)}")
            assert "keep" in run(butter, ["ls", img]).stdout
        finally:
            kfs.umount(mnt)
    finally:
        kfs.loop_detach(dev)
    # the kernel writes the image itself while mounted: compare what butter would have added
    assert [n.rstrip("/") for n in run(butter, ["ls", img]).stdout.split()] == ["keep"]
    kfs.run([butter.path, "put", img, src, "/new"])
    oracle.btrfs_check(img, strict=True)


def test_read_only_block_device_refused_for_writing(kernel, butter, workdir):
    """A read-only block device (losetup -r) opens read-write at open(2) and fails only at the
    first write: butter asks the device (BLKROGET) and refuses up front, naming it."""
    img = make_image(butter, workdir)
    digest = hashlib.sha256(open(img, "rb").read()).hexdigest()
    dev = kfs.run(["losetup", "-r", "-f", "--show", img], timeout=60).stdout.strip()
    assert dev.startswith("/dev/loop"), dev
    try:
        r = run(butter, ["mkdir", dev, "/new"])
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"{dev}: the block device is read-only" in r.stderr, r.stderr
        assert "device missing" not in r.stderr and "Sanitizer" not in r.stderr, r.stderr
        assert run(butter, ["ls", dev, "/"]).returncode == 0
    finally:
        kfs.loop_detach(dev)
    assert hashlib.sha256(open(img, "rb").read()).hexdigest() == digest


def test_check_refuses_mounted_unless_forced(fuse, butter, workdir):
    img = make_image(butter, workdir)
    with FuseMount(butter.path, [img], os.path.join(workdir, "mnt")) as m:
        r = run(butter, ["check", img])
        refused(r, f"pid {m.proc.pid}", "--force")
        r = run(butter, ["check", "--force", img])
        assert r.returncode == 0 and "0 error(s) found" in r.stdout, r.stdout + r.stderr
        assert m.unmount() == 0
    assert run(butter, ["check", img]).returncode == 0


def traced_threads(pid):
    """How many threads of `pid` are traced, and how many it has."""
    traced = total = 0
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(status) as f:
                tracer = [ln for ln in f if ln.startswith("TracerPid:")]
        except OSError:
            continue
        total += 1
        traced += bool(tracer) and tracer[0].split()[1] != "0"
    return traced, total


def delay_syscalls(pid, syscalls, when, seconds=1):
    """Make every call of `syscalls` (comma-separated) in `pid` take `seconds` more, at
    `when` (strace's delay_enter or delay_exit); returns the strace process once it
    traces every thread of `pid`."""
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-o", "/dev/null", "-p", str(pid),
                               "-e", f"trace={syscalls}", "-e",
                               f"inject={syscalls}:{when}={seconds * 1000000}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while True:
        traced, total = traced_threads(pid)
        if total and traced == total:
            return tracer
        assert tracer.poll() is None and time.monotonic() < deadline, \
            f"strace did not attach: {tracer.stderr.read() if tracer.poll() else ''}"
        time.sleep(0.05)


def holds_file(pid, path):
    """Whether process `pid` has `path` open (False once it is gone)."""
    want = os.path.realpath(path)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == want:
                return True
        except FileNotFoundError:
            continue
    return False


def start_untraceable_leaks(mount):
    """Start `mount` without LeakSanitizer, which cannot run in a traced process."""
    asan = os.environ.get("ASAN_OPTIONS")
    os.environ["ASAN_OPTIONS"] = ((asan + ":") if asan else "") + "detect_leaks=0"
    try:
        mount.start()
    finally:
        if asan is None:
            del os.environ["ASAN_OPTIONS"]
        else:
            os.environ["ASAN_OPTIONS"] = asan


def test_remount_at_once_waits_for_the_last_commit(fuse, butter, workdir):
    if shutil.which("strace") is None:
        env.unavailable("needs strace (to slow the old daemon's last commit down)")
    img = make_image(butter, workdir, size="512M")
    want = {}
    first = FuseMount(butter.path, [img], os.path.join(workdir, "a"))
    tracer = None
    try:
        start_untraceable_leaks(first)
        os.makedirs(os.path.join(first.mnt, "d"))
        for i in range(50):
            data = os.urandom(1 << 20)
            with open(os.path.join(first.mnt, "d", str(i)), "wb") as f:
                f.write(data)
            want[str(i)] = hashlib.sha256(data).hexdigest()
        # every fdatasync of the old daemon from now on takes 3 s: its last commit is still
        # running well after fusermount3 -u has returned (the new mount says whom it waits
        # for after 2 s)
        tracer = delay_syscalls(first.proc.pid, "fdatasync", "delay_enter", seconds=3)
        fusermount_unmount(first.mnt)
        with FuseMount(butter.path, [img], os.path.join(workdir, "b")) as second:
            assert f"waiting for {first.proc.pid} (butter) to finish closing" in \
                second.log_text(), second.log_text()
            # the claim is the image's descriptor: closed after the old daemon's last commit,
            # a moment before that process exits (which a loaded machine may not have reached)
            assert first.proc.poll() is not None or not holds_file(first.proc.pid, img), \
                "mounted while the old daemon still had the image open"
            got = {}
            for name in os.listdir(os.path.join(second.mnt, "d")):
                got[name] = kfs.file_sha256(os.path.join(second.mnt, "d", name))
            assert got == want
            with open(os.path.join(second.mnt, "after"), "w") as f:
                f.write("written through the second mount\n")
            assert second.unmount() == 0
        assert first.wait() == 0
        first.check_log()
    finally:
        if tracer:
            tracer.kill()
            tracer.wait()
        first.close()
    assert len(run(butter, ["ls", img, "/d"]).stdout.split()) == 50
    assert run(butter, ["cat", img, "/after"]).stdout == "written through the second mount\n"
    oracle.btrfs_check(img, strict=True)


def test_mount_right_after_unmount_before_the_daemon_noticed(fuse, butter, workdir):
    """A mount made while the old daemon has not yet seen its unmount waits, not EBUSY.

    The kernel forgets the mount at once; the daemon learns of it at its next read of
    /dev/fuse and only then starts closing. strace delays each return from the daemon's
    epoll_wait by a second, so the new mount comes surely inside that window.
    """
    if shutil.which("strace") is None:
        env.unavailable("needs strace (to slow the old daemon's noticing down)")
    img = make_image(butter, workdir)
    first = FuseMount(butter.path, [img], os.path.join(workdir, "a"))
    tracer = None
    try:
        start_untraceable_leaks(first)
        with open(os.path.join(first.mnt, "kept"), "w") as f:
            f.write("written through the first mount\n")
        tracer = delay_syscalls(first.proc.pid, "epoll_wait,epoll_pwait", "delay_exit")
        fusermount_unmount(first.mnt)
        with FuseMount(butter.path, [img], os.path.join(workdir, "b")) as second:
            with open(os.path.join(second.mnt, "kept")) as f:
                assert f.read() == "written through the first mount\n"
            assert second.unmount() == 0
        assert first.wait() == 0
    finally:
        if tracer:
            tracer.kill()
            tracer.wait()
        first.close()
    oracle.btrfs_check(img, strict=True)


def test_truncated_image(kernel, butter, workdir):
    img = make_image(butter, workdir)
    src = host_file(workdir, "src", 10 << 10, 4)
    kfs.run([butter.path, "put", img, src, "/keep"])
    os.truncate(img, 20 << 20)
    before = kfs.file_sha256(img)
    sizes = ("20971520", "268435456")

    r = run(butter, ["put", img, src, "/new"])
    assert r.returncode == 1, r.stdout + r.stderr
    assert "smaller" in r.stderr and all(s in r.stderr for s in sizes), r.stderr
    assert kfs.file_sha256(img) == before and os.path.getsize(img) == 20 << 20

    r = run(butter, ["info", img])
    assert r.returncode == 0 and "smaller" in r.stderr, r.stdout + r.stderr
    assert "keep" in run(butter, ["ls", img]).stdout  # the trees are below 20 MiB

    r = run(butter, ["check", img])
    assert r.returncode == 1 and "smaller" in r.stderr, r.stdout + r.stderr
    # the kernel's view: btrfs check says the same
    k = oracle.run_btrfs_check(img)
    assert k.returncode != 0
