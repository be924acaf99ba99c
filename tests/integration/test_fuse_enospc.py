"""ENOSPC only when the space is really gone, through `butter mount`, with the kernel's
btrfs on an image of the same size as the reference.

  avail     statfs's available bytes can be allocated: a preallocation of "available
            - 512 KiB" succeeds (it failed when statfs counted device space that
            chunks cannot use: the first MiB of a device and the ends of free ranges
            off the 1 MiB grid stripes are placed on; lib/extent/chunk.c
            chunk_usable_bytes).
  cycles    preallocate 1 GiB, delete it, six times on a 3 GiB filesystem, with no
            commit between: space freed in the running transaction comes back only
            at its commit, so a reservation that fails while such space is pending
            commits and tries again (lib/fs/change.c fs_begin_change_rsv), as the kernel
            does.
After each: btrfs check --readonly.
"""
import os

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount

GiB = 1 << 30
SIZE = 3 * GiB


def prealloc(path, length):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, length)
    finally:
        os.close(fd)


def fill_available(root):
    st = os.statvfs(root)
    avail = st.f_bavail * st.f_frsize
    prealloc(os.path.join(root, "all"), avail - (512 << 10))
    return avail


def cycles(root):
    for i in range(6):
        path = os.path.join(root, f"big{i}")
        prealloc(path, GiB)
        os.unlink(path)


def on_kernel(workdir, fn):
    with kfs.kernel_fs(workdir, name="ref", size=SIZE) as fs:
        return fn(fs.mnt)


def on_butter(butter, workdir, fn):
    image = kfs.mkfs_image(workdir, size=SIZE)
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        result = fn(m.mnt)
    oracle.btrfs_check(image)
    return result


def test_available_space_can_be_allocated(fuse, butter, workdir):
    kernel_avail = on_kernel(workdir, fill_available)
    butter_avail = on_butter(butter, workdir, fill_available)
    assert butter_avail <= kernel_avail + (1 << 20), (butter_avail, kernel_avail)


def test_preallocate_delete_cycles(fuse, butter, workdir):
    on_kernel(workdir, cycles)
    on_butter(butter, workdir, cycles)
