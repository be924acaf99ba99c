"""Remounting a live `butter mount` read-only and read-write (`butter mount -o
remount,ro|rw IMAGE MNT`, fuse/remount.c; mount(8)'s `mount -o remount` through the
helper is in test_fuse_mount_helper.py), with the kernel's btrfs as the reference.

  rw-ro-rw  a file open for writing makes the read-only remount fail (EBUSY, as on the
            kernel's btrfs) and changes nothing; once closed, the remount commits: a
            SIGKILL of the daemon right after loses nothing. Read-only: writes, creates
            and opens for writing fail with EROFS, reads work. Back to read-write:
            writes work again and reach the image.
  ro-rw     a mount begun with -o ro becomes writable (the daemon opens the filesystem
            read-write again); files opened before keep working.
After each: btrfs check, and the kernel's view holds what was written.
Needs root, loop devices, kernel btrfs, /dev/fuse and fusermount3.
"""
import errno
import os
import signal
import subprocess

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount
from butter_it.tree import read_file


def remount(butter, image, mnt, mode):
    return subprocess.run([butter.path, "mount", "-o", f"remount,{mode}", image, mnt],
                          capture_output=True, text=True, timeout=120)


def kernel_remount(mnt, mode):
    return subprocess.run(["mount", "-o", f"remount,{mode}", mnt], capture_output=True,
                          text=True, timeout=120)


def errno_of(fn):
    try:
        fn()
        return 0
    except OSError as e:
        return errno.errorcode[e.errno]


def write(path, data):
    with open(path, "w") as f:
        f.write(data)


def read_only_refusals(root):
    return {
        "write": errno_of(lambda: write(os.path.join(root, "a"), "changed")),
        "create": errno_of(lambda: write(os.path.join(root, "new"), "x")),
        "mkdir": errno_of(lambda: os.mkdir(os.path.join(root, "dir"))),
        "read": read_file(os.path.join(root, "a")),
    }


def test_remount_rw_ro_rw(fuse, butter, workdir):
    # the kernel's btrfs: busy with a file open for writing, then the refusals
    with kfs.kernel_fs(workdir, name="ref") as fs:
        write(os.path.join(fs.mnt, "a"), "first")
        with open(os.path.join(fs.mnt, "open-w"), "w"):
            busy = kernel_remount(fs.mnt, "ro").returncode
        assert busy != 0
        assert kernel_remount(fs.mnt, "ro").returncode == 0
        expect = read_only_refusals(fs.mnt)
        assert kernel_remount(fs.mnt, "rw").returncode == 0

    image = kfs.mkfs_image(workdir)
    m = FuseMount(butter.path, [image], os.path.join(workdir, "mnt")).start()
    try:
        write(os.path.join(m.mnt, "a"), "first")
        with open(os.path.join(m.mnt, "open-w"), "w") as f:
            f.write("held")
            p = remount(butter, image, m.mnt, "ro")
            assert p.returncode != 0 and "open for writing" in p.stderr, p.stderr
            write(os.path.join(m.mnt, "still-rw"), "yes")
        p = remount(butter, image, m.mnt, "ro")
        assert p.returncode == 0, p.stderr
        assert read_only_refusals(m.mnt) == expect
        p = remount(butter, image, m.mnt, "rw")
        assert p.returncode == 0, p.stderr
        write(os.path.join(m.mnt, "b"), "after rw")
        p = remount(butter, image, m.mnt, "ro")      # commits b
        assert p.returncode == 0, p.stderr
        m.signal(signal.SIGKILL)
    finally:
        m.close()
    oracle.btrfs_check(image)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kview")) as kmnt:
        assert sorted(os.listdir(kmnt)) == ["a", "b", "open-w", "still-rw"]
        assert read_file(os.path.join(kmnt, "a")) == b"first"
        assert read_file(os.path.join(kmnt, "b")) == b"after rw"


def test_mounted_ro_then_rw(fuse, butter, workdir):
    image = kfs.mkfs_image(workdir)
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        write(os.path.join(m.mnt, "a"), "first")
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt"), ["ro"]) as m:
        held = open(os.path.join(m.mnt, "a"))
        assert errno_of(lambda: write(os.path.join(m.mnt, "b"), "x")) == "EROFS"
        p = remount(butter, image, m.mnt, "rw")
        assert p.returncode == 0, p.stderr
        write(os.path.join(m.mnt, "b"), "written after remount")
        assert held.read() == "first"
        held.close()
        assert m.unmount() == 0
        assert "release of node" not in m.log_text(), m.log_text()[-2000:]
    oracle.btrfs_check(image)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kview")) as kmnt:
        assert read_file(os.path.join(kmnt, "b")) == b"written after remount"
