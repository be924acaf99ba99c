"""`butter device add`, judged by the kernel and btrfs check.

A device added by butter must be a full member for the kernel: btrfs check accepts the
devices together, the kernel mounts them and lists the new devid with its size, data
written after the add can land on the new device (it is the one with room) and reads
back through the kernel, and the kernel can write to the grown filesystem in turn.
Refused: a device that is already a member, one holding another btrfs (unless -f), one
too small; and the grown filesystem no longer opens without its new device.
"""
import os
import re

from butter_it import kfs, oracle


def device_usage(mnt):
    """{devid: bytes of chunks on it} from `btrfs filesystem show --raw`."""
    out = kfs.run(["btrfs", "filesystem", "show", "--raw", mnt]).stdout
    return {int(d): (int(size), int(used)) for d, size, used in
            re.findall(r"devid\s+(\d+) size (\d+) used (\d+)", out)}


def make_file(path, size, seed):
    import random
    rng = random.Random(seed)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 1 << 20)
            f.write(rng.randbytes(n))
            left -= n
    return kfs.file_sha256(path)


def test_add_to_single_device(kernel, butter, workdir):
    a, b = os.path.join(workdir, "a.img"), os.path.join(workdir, "b.img")
    for img, size in ((a, 300 << 20), (b, 500 << 20)):
        with open(img, "wb") as f:
            f.truncate(size)
    src = os.path.join(workdir, "f1")
    want = {"f1": make_file(src, 20 << 20, 1)}
    kfs.run([butter.path, "mkfs", "-q", a])
    kfs.run([butter.path, "put", a, src, "/f1"])
    r = kfs.run([butter.path, "device", "add", a, b], check=False)
    assert r.returncode == 0 and "as device 2" in r.stdout, f"{r.stdout}\n{r.stderr}"
    oracle.btrfs_check(a, b)
    # more than device 1 can hold: the rest has to go to device 2
    big = os.path.join(workdir, "big")
    want["big"] = make_file(big, 350 << 20, 2)
    kfs.run([butter.path, "put", "--device", b, a, big, "/big"], timeout=600)
    oracle.btrfs_check(a, b)
    mnt = os.path.join(workdir, "mnt")
    with kfs.attached([a, b]) as devs:
        kfs.mount(devs[0], mnt, [f"device={devs[1]}"])
        try:
            usage = device_usage(mnt)
            assert set(usage) == {1, 2}, usage
            assert usage[2][0] == 500 << 20 and usage[2][1] > 100 << 20, usage
            for name, digest in want.items():
                assert kfs.file_sha256(os.path.join(mnt, name)) == digest, name
            # the kernel writes to the grown filesystem too
            want["kernel"] = make_file(os.path.join(mnt, "kernel"), 30 << 20, 3)
        finally:
            kfs.umount(mnt)
    oracle.btrfs_check(a, b)
    r = kfs.run([butter.path, "cat", "--device", b, a, "/kernel"], check=False)
    assert r.returncode == 0
    # without its new device the filesystem does not open
    r = kfs.run([butter.path, "ls", a, "/"], check=False)
    assert r.returncode != 0 and "missing" in r.stderr.lower(), r.stderr


def test_add_to_kernel_raid1(kernel, butter, workdir):
    with kfs.kernel_fs(workdir, ndevices=2, size=512 << 20,
                       mkfs_args=["-d", "raid1", "-m", "raid1"]) as fs:
        want = {"x": make_file(os.path.join(fs.mnt, "x"), 40 << 20, 4)}
        fs.release()
        images = list(fs.images)
    new = os.path.join(workdir, "c.img")
    with open(new, "wb") as f:
        f.truncate(512 << 20)
    r = kfs.run([butter.path, "device", "add", "--device", images[1], images[0], new],
                check=False)
    assert r.returncode == 0 and "as device 3" in r.stdout, f"{r.stdout}\n{r.stderr}"
    images.append(new)
    oracle.btrfs_check(*images)
    mnt = os.path.join(workdir, "mnt")
    with kfs.attached(images) as devs:
        kfs.mount(devs[0], mnt, [f"device={d}" for d in devs[1:]])
        try:
            assert set(device_usage(mnt)) == {1, 2, 3}
            assert kfs.file_sha256(os.path.join(mnt, "x")) == want["x"]
            want["y"] = make_file(os.path.join(mnt, "y"), 200 << 20, 5)
        finally:
            kfs.umount(mnt)
    oracle.btrfs_check(*images)


def test_add_refused(kernel, butter, workdir):
    a, other, tiny = (os.path.join(workdir, n) for n in ("a.img", "o.img", "t.img"))
    for img, size in ((a, 256 << 20), (other, 256 << 20), (tiny, 8 << 20)):
        with open(img, "wb") as f:
            f.truncate(size)
    kfs.run([butter.path, "mkfs", "-q", a])
    kfs.run(["mkfs.btrfs", "-q", "-f", other])
    before = kfs.file_sha256(a)
    r = kfs.run([butter.path, "device", "add", a, a], check=False)
    assert r.returncode == 1 and "already a device of this filesystem" in r.stderr, r.stderr
    r = kfs.run([butter.path, "device", "add", a, other], check=False)
    assert r.returncode == 1 and "another btrfs" in r.stderr, r.stderr
    r = kfs.run([butter.path, "device", "add", a, tiny], check=False)
    assert r.returncode == 1 and "at least" in r.stderr, r.stderr
    assert kfs.file_sha256(a) == before, "a refused add changed the image"
    r = kfs.run([butter.path, "device", "add", "-f", a, other], check=False)
    assert r.returncode == 0, r.stderr
    oracle.btrfs_check(a, other)
