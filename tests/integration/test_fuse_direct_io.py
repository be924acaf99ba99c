"""O_DIRECT through `butter mount`: data written and acknowledged is what every later
read sees.

  async-dio   tests/tools/dio_race.c: asynchronous O_DIRECT writes (io_submit) race
              buffered reads of the same file through another descriptor; once a
              write has completed, a buffered read of its range must return the new
              bytes. The kernel's FUSE drops cached pages before an asynchronous direct
              write is sent, not after it completes, so a read in between caches the
              old bytes; the daemon drops the range again before it answers (ops.c,
              drop_cached_pages). The same tool on the kernel's btrfs is the reference
              (and shows the tool raises no false alarm). After the unmount: btrfs
              check, and the kernel's view holds the last pattern written.
Needs root, loop devices, kernel btrfs, /dev/fuse and fusermount3.
"""
import os

from butter_it import kfs
from butter_it.fusemount import FuseMount
from butter_it.tools import tool
from test_fuse import KernelView, btrfs_check, mkfs_image, read_file

ROUNDS = 24          # an even count: the file ends as 0x55 everywhere
FILES = 4            # stale pages showed in most runs of 8 rounds before the fix


def run_race(path):
    return kfs.run([tool("butter-dio-race"), path, str(ROUNDS)], check=False, timeout=300)


def test_async_direct_write_then_buffered_read(fuse, butter, workdir):
    with kfs.kernel_fs(workdir, name="ref") as fs:
        proc = run_race(os.path.join(fs.mnt, "f"))
        assert proc.returncode == 0, f"the kernel's btrfs:\n{proc.stdout}{proc.stderr}"

    image = mkfs_image(workdir)
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        for i in range(FILES):
            proc = run_race(os.path.join(m.mnt, f"f{i}"))
            assert proc.returncode == 0, f"butter, file f{i}:\n{proc.stdout}{proc.stderr}"
    btrfs_check(image)
    with KernelView(workdir, [image]) as kv:
        for i in range(FILES):
            assert read_file(os.path.join(kv.mnt, f"f{i}")) == b"\x55" * (1 << 20)
