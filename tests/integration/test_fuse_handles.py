"""File handles through `butter mount` (name_to_handle_at / open_by_handle_at, what an
NFS export uses), with the kernel's btrfs as the reference for the same sequence.

  handles   a directory, a file in it, a subvolume and a file in the subvolume, and a
            file then unlinked: handles taken, the kernel's inode and dentry caches
            dropped (so the kernel must ask the daemon: FUSE looks up "." in the node
            id the handle holds, ops.c lookup_self), then each handle opened: the live
            ones open and read what was written; the unlinked one is ESTALE. After an
            unmount and a new mount of the same image, the same handles (with the new
            mount's fd) still open the live files, as on the kernel's btrfs.
Needs root (CAP_DAC_READ_SEARCH), loop devices, kernel btrfs, /dev/fuse, fusermount3.
"""
import ctypes
import errno
import os
import subprocess

from butter_it import kfs
from butter_it.fusemount import FuseMount

_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
NAMES = ("d", "d/f", "sub", "sub/g", "gone")


class FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                ("f_handle", ctypes.c_ubyte * 128)]


def name_to_handle(path):
    fh = FileHandle(handle_bytes=128)
    mount_id = ctypes.c_int()
    if _libc.name_to_handle_at(AT_FDCWD, os.fsencode(path), ctypes.byref(fh),
                               ctypes.byref(mount_id), 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
    return bytes(fh)


def open_by_handle(mount_fd, handle):
    fd = _libc.open_by_handle_at(mount_fd, ctypes.byref(FileHandle.from_buffer_copy(handle)),
                                 os.O_RDONLY)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return fd


def make_tree(root, make_subvol):
    os.mkdir(os.path.join(root, "d"))
    with open(os.path.join(root, "d", "f"), "w") as f:
        f.write("in d")
    make_subvol(os.path.join(root, "sub"))
    with open(os.path.join(root, "sub", "g"), "w") as f:
        f.write("in sub")
    with open(os.path.join(root, "gone"), "w") as f:
        f.write("unlinked")
    handles = {n: name_to_handle(os.path.join(root, n)) for n in NAMES}
    os.unlink(os.path.join(root, "gone"))
    return handles


def open_all(root, handles):
    """What each handle opens to: a listing, the file's bytes, or an errno name."""
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")                         # inodes and dentries: the kernel must ask
    mount_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    seen = {}
    try:
        for name, h in handles.items():
            try:
                fd = open_by_handle(mount_fd, h)
            except OSError as e:
                seen[name] = errno.errorcode[e.errno]
                continue
            try:
                seen[name] = sorted(os.listdir(fd)) if name in ("d", "sub") else os.read(fd, 64)
            finally:
                os.close(fd)
    finally:
        os.close(mount_fd)
    return seen


EXPECT = {"d": ["f"], "d/f": b"in d", "sub": ["g"], "sub/g": b"in sub", "gone": "ESTALE"}


def test_handles_open_and_survive_a_remount(fuse, butter, workdir):
    def kernel_subvol(path):
        kfs.run(["btrfs", "subvolume", "create", path])

    with kfs.kernel_fs(workdir, name="ref") as fs:
        handles = make_tree(fs.mnt, kernel_subvol)
        assert open_all(fs.mnt, handles) == EXPECT
        fs.umount()
        fs.mount()
        assert open_all(fs.mnt, handles) == EXPECT, "the kernel's btrfs after a remount"

    def butter_subvol(path):
        subprocess.run([butter.path, "subvolume", "create", path], check=True,
                       capture_output=True)

    image = kfs.mkfs_image(workdir)
    mnt = os.path.join(workdir, "mnt")
    with FuseMount(butter.path, [image], mnt) as m:
        handles = make_tree(m.mnt, butter_subvol)
        assert open_all(m.mnt, handles) == EXPECT
    with FuseMount(butter.path, [image], mnt) as m:
        assert open_all(m.mnt, handles) == EXPECT, "butter after a remount"
