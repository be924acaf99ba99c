"""Delayed allocation through `butter mount` (lib/data/delalloc.c), judged by the kernel.

- Two files written at the same time, 64 MiB each: FIEMAP on the kernel's mount shows one
  extent each (before delayed allocation: 33 and 23), and the kernel reads the same bytes.
- A 1 GiB file written sequentially with a 256 MiB write buffer (memory pressure writes
  back in the middle): at most 8 extents, as the kernel's btrfs makes.
- An fsync writes its own file only: 192 MiB written to another file and left unsynced
  are nowhere in the image file (so no flush of the image can carry them), a small file
  is written and fsynced, the daemon writes little during that fsync (/proc/PID/io) and
  the other file's bytes are still not in the image; after SIGKILL the kernel finds the
  small file (the tree log) and the other one without its unsynced data.
Each image passes `btrfs check`.
"""
import hashlib
import os
import threading
import time

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount


def runs(path):
    """Contiguous stretches on disk of `path` (FIEMAP extents that do not continue the last)."""
    n, end = 0, None
    for _, phys, length, _ in kfs.fiemap(path):
        if phys != end:
            n += 1
        end = phys + length
    return n


def pattern(seed, size):
    block = hashlib.sha256(seed.encode()).digest() * 32768  # 1 MiB
    return (block * (size // len(block) + 1))[:size]


def write_file(path, data, piece=1 << 20):
    with open(path, "wb") as f:
        for off in range(0, len(data), piece):
            f.write(data[off:off + piece])


def mkfs(butter, workdir, size):
    image = os.path.join(workdir, "img")
    kfs.run([butter.path, "mkfs", "-q", "-b", size, image])
    return image


def test_two_writers_at_once_get_one_extent_each(fuse, butter, workdir):
    image = mkfs(butter, workdir, "2G")
    data = {name: pattern(name, 64 << 20) for name in ("a", "b")}
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        threads = [threading.Thread(target=write_file, args=(os.path.join(m.mnt, n), d))
                   for n, d in data.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    oracle.btrfs_check(image)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "k")) as k:
        for name, d in data.items():
            p = os.path.join(k, name)
            assert kfs.file_sha256(p) == hashlib.sha256(d).hexdigest()
            assert runs(p) == 1, f"{name}: {kfs.fiemap(p)}"


def test_one_gib_sequential_in_at_most_eight_extents(fuse, butter, workdir):
    image = mkfs(butter, workdir, "3G")
    size = 1 << 30
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt"),
                   options=["write_buffer=256M"]) as m:
        with open(os.path.join(m.mnt, "big"), "wb") as f:
            block = pattern("big", 1 << 20)
            for i in range(size >> 20):
                f.write(block[i:] + block[:i])
    oracle.btrfs_check(image)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "k")) as k:
        p = os.path.join(k, "big")
        assert os.path.getsize(p) == size
        with open(p, "rb") as f:
            for i in (0, 1, 255, 256, 700, 1023):
                f.seek(i << 20)
                assert f.read(1 << 20) == block[i:] + block[:i], f"MiB {i}"
        assert runs(p) <= 8, kfs.fiemap(p)


def daemon_wchar(pid):
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("wchar:")).split()[1])


def image_holds(image, needle):
    with open(image, "rb") as f:
        tail = b""
        for chunk in iter(lambda: f.read(16 << 20), b""):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle):]
    return False


def test_fsync_writes_its_own_file_only(fuse, butter, workdir):
    image = mkfs(butter, workdir, "1G")
    small = b"written and fsynced\n" * 5
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt"),
                   options=["write_buffer=512M", "commit=300"]) as m:
        # committed first: the files exist on disk, empty
        for name in ("big", "small"):
            open(os.path.join(m.mnt, name), "wb").close()
        fd = os.open(m.mnt, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        time.sleep(1.5)
        # changes every 0.2 s keep the daemon's idle commit (1 s after the last change) away
        stop = threading.Event()

        def keep_busy():
            while not stop.wait(0.2):
                os.utime(os.path.join(m.mnt, "small"))

        busy = threading.Thread(target=keep_busy)
        busy.start()
        big = pattern("big", 192 << 20)
        write_file(os.path.join(m.mnt, "big"), big)
        marker = big[:64]
        try:
            assert not image_holds(image, marker), "unsynced data of big is in the image already"
        except BaseException:
            stop.set()
            busy.join()
            raise
        before = daemon_wchar(m.proc.pid)
        fd = os.open(os.path.join(m.mnt, "small"), os.O_WRONLY)
        os.write(fd, small)
        os.fsync(fd)
        os.close(fd)
        written = daemon_wchar(m.proc.pid) - before
        try:
            assert not image_holds(image, marker), "the fsync of small wrote big's data"
        finally:
            stop.set()
            busy.join()
        m.proc.kill()
        m.proc.wait(timeout=60)
    assert written < (16 << 20), f"the fsync wrote {written} bytes"
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "k"), opts=("rw",)) as k:
        with open(os.path.join(k, "small"), "rb") as f:
            assert f.read() == small
        assert os.path.getsize(os.path.join(k, "big")) == 0
    oracle.btrfs_check(image)
