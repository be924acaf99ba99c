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


SMALL = 256 << 20


def write_until_full(root):
    """Write 1 MiB pieces to one file until write(2) fails, as dd from /dev/zero does: the
    errno and how much went in; then, with the file gone, a new file takes data again."""
    import errno
    path = os.path.join(root, "fill")
    chunk = b"\0" * (1 << 20)
    written, err = 0, None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while written < 8 * SMALL:          # a runaway writer stops here, and fails below
            try:
                written += os.write(fd, chunk)
            except OSError as e:
                err = e.errno
                break
    finally:
        try:
            os.close(fd)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e  # the pages the kernel could not write back
    os.unlink(path)
    with open(os.path.join(root, "after"), "wb") as f:
        f.write(b"room again\n" * 1000)
    return err, written


def test_write_into_a_full_filesystem_fails(fuse, butter, workdir):
    """write(2) into a full filesystem fails with ENOSPC, as on the kernel's btrfs, also
    under the writeback cache (generic/015 wrote on forever: the kernel took every write
    into its cache and dropped what the daemon could not store); the space comes back."""
    import errno
    with kfs.kernel_fs(workdir, name="ref", size=SMALL) as fs:
        want_err, want_written = write_until_full(fs.mnt)
    image = kfs.mkfs_image(workdir, size=SMALL)
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        got_err, got_written = write_until_full(m.mnt)
        with open(os.path.join(m.mnt, "after"), "rb") as f:
            assert f.read() == b"room again\n" * 1000
    oracle.btrfs_check(image)
    assert want_err == got_err == errno.ENOSPC, (want_err, got_err)
    assert got_written < 2 * SMALL, f"{got_written} bytes accepted by a {SMALL}-byte filesystem"
