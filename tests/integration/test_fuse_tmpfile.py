"""open(2) with O_TMPFILE through `butter mount` (FUSE_TMPFILE, answered by the daemon's
own request loop: fuse/tmpfile.c), with the kernel's btrfs as the reference.

  sequence  a nameless file is made, written, given a name by linkat(AT_SYMLINK_FOLLOW);
            another is written and closed (gone); an O_EXCL one refuses a name (ENOENT).
            Every observation equals the kernel's; after the unmount btrfs check is
            clean and the kernel sees the named file with its bytes and nothing else.
  crash     a nameless file still open when the daemon is killed after a commit: the
            image holds it as an orphan (nlink 0 + ORPHAN_ITEM); btrfs check accepts
            it and the next read-write open (the kernel's) frees it.
Needs root, loop devices, kernel btrfs, /dev/fuse and fusermount3.
"""
import ctypes
import os
import signal
import subprocess

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount
from butter_it.tree import read_file

_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, AT_SYMLINK_FOLLOW = -100, 0x400


def link_fd(fd, path):
    """linkat(/proc/self/fd/FD, path, AT_SYMLINK_FOLLOW): names an O_TMPFILE file."""
    if _libc.linkat(AT_FDCWD, f"/proc/self/fd/{fd}".encode(), AT_FDCWD, os.fsencode(path),
                    AT_SYMLINK_FOLLOW) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)


def sequence(root):
    out = {}
    fd = os.open(root, os.O_TMPFILE | os.O_RDWR, 0o640)
    os.write(fd, b"made nameless")
    st = os.fstat(fd)
    out["before link"] = (oct(st.st_mode), st.st_nlink, sorted(os.listdir(root)))
    link_fd(fd, os.path.join(root, "named"))
    out["after link"] = (os.fstat(fd).st_nlink, sorted(os.listdir(root)),
                         read_file(os.path.join(root, "named")))
    os.close(fd)
    fd = os.open(root, os.O_TMPFILE | os.O_WRONLY, 0o600)
    os.write(fd, b"x" * 300000)
    os.close(fd)
    fd = os.open(root, os.O_TMPFILE | os.O_WRONLY | os.O_EXCL, 0o600)
    try:
        link_fd(fd, os.path.join(root, "refused"))
        out["O_EXCL link"] = "linked"
    except OSError as e:
        out["O_EXCL link"] = os.strerror(e.errno)
    os.close(fd)
    out["at the end"] = sorted(os.listdir(root))
    return out


def test_tmpfile_like_kernel_btrfs(fuse, butter, workdir):
    with kfs.kernel_fs(workdir, name="ref") as fs:
        expect = sequence(fs.mnt)
    image = kfs.mkfs_image(workdir)
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        got = sequence(m.mnt)
    assert got == expect
    oracle.btrfs_check(image)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kview")) as kmnt:
        assert os.listdir(kmnt) == ["named"]
        assert read_file(os.path.join(kmnt, "named")) == b"made nameless"


def test_open_tmpfile_at_a_crash(fuse, butter, workdir):
    image = kfs.mkfs_image(workdir)
    m = FuseMount(butter.path, [image], os.path.join(workdir, "mnt")).start()
    try:
        fd = os.open(m.mnt, os.O_TMPFILE | os.O_RDWR, 0o600)
        os.write(fd, b"y" * (1 << 20))
        os.fsync(fd)
        subprocess.run([butter.path, "filesystem", "sync", m.mnt], check=True)
        m.signal(signal.SIGKILL)
        os.close(fd)
    finally:
        m.close()
    oracle.btrfs_check(image)
    tree = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", "5", image]).stdout
    assert "ORPHAN_ITEM" in tree and " links 0 " in tree, tree[-3000:]
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "rw"), opts=()) as view:
        assert os.listdir(view) == []
    oracle.btrfs_check(image)
    tree = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", "5", image]).stdout
    assert "ORPHAN_ITEM" not in tree, "the kernel's open left the orphan"

