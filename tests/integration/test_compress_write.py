"""Compression on write through the FUSE mount, judged by the kernel.

`butter mount -o compress=ALGO` (and compress-force=) must store compressible data as
compressed extents of that type (checked in the extent items with dump-tree), leave
incompressible data plain without force, and every byte must read back the same through
the kernel after partial overwrites, truncates and appends that cut compressed extents;
btrfs check must be clean. Kernel-made compressed files are then overwritten in part by
butter (a compressed extent shared by what remains of it).
"""
import os
import random
import re

import pytest

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount


def extent_types(image):
    out = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", "5", image]).stdout
    return [int(x) for x in re.findall(r"extent compression (\d+)", out)]


def kernel_read_all(workdir, image):
    got = {}
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kmnt")) as mnt:
        for name in sorted(os.listdir(mnt)):
            with open(os.path.join(mnt, name), "rb") as f:
                got[name] = f.read()
    return got


def text(rng, n):
    words = [b"alpha", b"beta", b"gamma", b"delta", b"butter", b"btrfs", b"\n"]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + b" "
    return bytes(out[:n])


def workload(mnt, rng):
    """Write files through the mount; return {name: expected bytes}."""
    want = {}

    def put(name, data):
        with open(os.path.join(mnt, name), "wb") as f:
            f.write(data)
        want[name] = bytearray(data)

    put("text", text(rng, 3 * 1024 * 1024 + 123))
    put("random", rng.randbytes(700 * 1024))
    put("mixed", text(rng, 400 * 1024) + rng.randbytes(300 * 1024) + text(rng, 200 * 1024))
    put("small", text(rng, 1500))
    # partial overwrites cut compressed extents; truncate and append
    for name in ("text", "mixed"):
        for _ in range(20):
            off = rng.randrange(0, len(want[name]))
            data = text(rng, rng.randrange(1, 200000))
            with open(os.path.join(mnt, name), "r+b") as f:
                f.seek(off)
                f.write(data)
            end = off + len(data)
            if end > len(want[name]):
                want[name].extend(b"\0" * (end - len(want[name])))
            want[name][off:end] = data
    os.truncate(os.path.join(mnt, "text"), 2 * 1024 * 1024 + 7)
    del want["text"][2 * 1024 * 1024 + 7:]
    with open(os.path.join(mnt, "text"), "ab") as f:
        more = text(rng, 300000)
        f.write(more)
    want["text"].extend(more)
    return {k: bytes(v) for k, v in want.items()}


@pytest.mark.parametrize("option,ctype", [("compress=zstd", 3), ("compress=lzo", 2),
                                          ("compress=zlib:9", 1), ("compress-force=zstd:1", 3),
                                          ("compress", 1)])
def test_mount_compress(fuse, butter, workdir, option, ctype):
    image = os.path.join(workdir, "img")
    kfs.run([butter.path, "mkfs", "-q", "-b", "512M", image])
    rng = random.Random(option)
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt"), [option]) as m:
        want = workload(m.mnt, rng)
        assert m.unmount() == 0
    oracle.btrfs_check(image)
    types = extent_types(image)
    assert ctype in types, f"{option}: no extent of type {ctype}: {sorted(set(types))}"
    if option.startswith("compress="):
        assert 0 in types, f"{option}: random data should stay plain: {sorted(set(types))}"
    got = kernel_read_all(workdir, image)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], f"{option}: {name} differs"


def test_unknown_algorithm_refused(fuse, butter, workdir):
    image = os.path.join(workdir, "img")
    kfs.run([butter.path, "mkfs", "-q", "-b", "256M", image])
    mnt = os.path.join(workdir, "mnt")
    os.makedirs(mnt)
    r = kfs.run([butter.path, "mount", "-f", "-o", "compress=gzip", image, mnt], check=False,
                timeout=60)
    assert r.returncode != 0 and "unknown algorithm" in r.stderr + r.stdout


def test_overwrite_kernel_compressed(fuse, butter, workdir):
    """Kernel-written zstd extents, overwritten in part by butter with compress=lzo."""
    rng = random.Random(7)
    data = text(rng, 2 * 1024 * 1024)
    with kfs.kernel_fs(workdir, mount_opts=("compress-force=zstd",)) as fs:
        with open(os.path.join(fs.mnt, "f"), "wb") as f:
            f.write(data)
        fs.sync()
        fs.release()
    image = fs.images[0]
    want = bytearray(data)
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt"), ["compress=lzo"]) as m:
        for off in (5, 131072 - 3, 700000, 2 * 1024 * 1024 - 10):
            piece = text(rng, 50000)
            with open(os.path.join(m.mnt, "f"), "r+b") as f:
                f.seek(off)
                f.write(piece)
            end = off + len(piece)
            if end > len(want):
                want.extend(b"\0" * (end - len(want)))
            want[off:end] = piece
        assert m.unmount() == 0
    oracle.btrfs_check(image)
    types = set(extent_types(image))
    assert {2, 3} <= types, types
    assert kernel_read_all(workdir, image)["f"] == bytes(want)
