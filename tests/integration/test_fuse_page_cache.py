"""What the kernel's page cache holds and the daemon must see, through `butter mount`:
data written and acknowledged is what every later read and seek sees.

  async-dio   tests/tools/dio_race.c: asynchronous O_DIRECT writes (io_submit) race
              buffered reads of the same file through another descriptor; once a
              write has completed, a buffered read of its range must return the new
              bytes. The kernel's FUSE drops cached pages before an asynchronous direct
              write is sent, not after it completes, so a read in between caches the
              old bytes; the daemon drops the range again before it answers (ops.c,
              drop_cached_pages). The same tool on the kernel's btrfs is the reference
              (and shows the tool raises no false alarm). After the unmount: btrfs
              check, and the kernel's view holds the last pattern written.
  seek        SEEK_DATA / SEEK_HOLE on files whose data is still dirty in the kernel's
              page cache (written, no fsync): the kernel sends LSEEK without writing
              back; the daemon has it written back first (ops.c, op_lseek). Answers
              equal the kernel's btrfs for the same writes, and `cp` (which probes with
              SEEK_DATA) copies such a file whole.
Needs root, loop devices, kernel btrfs, /dev/fuse and fusermount3.
"""
import os
import subprocess

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount
from butter_it.tools import tool
from butter_it.tree import read_file

ROUNDS = 24          # an even count: the file ends as 0x55 everywhere
FILES = 4            # stale pages showed in most runs of 8 rounds before the fix


def run_race(path):
    return kfs.run([tool("butter-dio-race"), path, str(ROUNDS)], check=False, timeout=300)


def test_async_direct_write_then_buffered_read(fuse, butter, workdir):
    with kfs.kernel_fs(workdir, name="ref") as fs:
        proc = run_race(os.path.join(fs.mnt, "f"))
        assert proc.returncode == 0, f"the kernel's btrfs:\n{proc.stdout}{proc.stderr}"

    image = kfs.mkfs_image(workdir)
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        for i in range(FILES):
            proc = run_race(os.path.join(m.mnt, f"f{i}"))
            assert proc.returncode == 0, f"butter, file f{i}:\n{proc.stdout}{proc.stderr}"
    oracle.btrfs_check(image)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kview")) as kmnt:
        for i in range(FILES):
            assert read_file(os.path.join(kmnt, f"f{i}")) == b"\x55" * (1 << 20)


# (offset, length) writes into a new file, and the seeks asked afterwards
SPARSE_WRITES = [(1 << 20, 4096), (3 << 20, 8192), (5 << 20, 100)]
SEEKS = [(0, os.SEEK_DATA), (1 << 20, os.SEEK_HOLE), ((1 << 20) + 4096, os.SEEK_DATA),
         ((3 << 20) + 1, os.SEEK_HOLE), ((3 << 20) + 8192, os.SEEK_DATA), (0, os.SEEK_HOLE)]


def seek_answers(root):
    """Write SPARSE_WRITES into a new file and seek it before any fsync: the answers."""
    path = os.path.join(root, "sparse")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for off, length in SPARSE_WRITES:
            os.pwrite(fd, bytes([0x5a]) * length, off)
        answers = []
        for off, whence in SEEKS:
            try:
                answers.append(os.lseek(fd, off, whence))
            except OSError as e:
                answers.append(f"errno {e.errno}")
        copy = os.path.join(root, "copy")
        subprocess.run(["cp", "--sparse=always", path, copy], check=True)
        same = read_file(copy) == read_file(path)
    finally:
        os.close(fd)
    return answers, same


def test_seek_data_before_writeback(fuse, butter, workdir):
    with kfs.kernel_fs(workdir, name="ref") as fs:
        expect, same = seek_answers(fs.mnt)
    assert same
    image = kfs.mkfs_image(workdir)
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        got, same = seek_answers(m.mnt)
    assert got == expect, f"butter {got}, the kernel's btrfs {expect}"
    assert same, "cp of a file with dirty pages differs from the file"
    oracle.btrfs_check(image)
