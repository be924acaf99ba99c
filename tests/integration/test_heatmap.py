"""`butter heatmap`: the picture of where things lie, judged by btrfs-progs and the kernel.

- On a mkfs.btrfs image written through `butter mount`: the allocated bytes butter counts on
  the device are the DEV_EXTENT lengths `btrfs inspect-internal dump-tree -t dev` lists; the
  used bytes are the extent tree's data extents once and its tree blocks twice (DUP
  metadata); the traced bytes are what FIEMAP on the kernel's mount says the traced files
  occupy. The PNG (read back here) is PIXELS x PIXELS, its black share is the unallocated
  share of the device, and orange pixels appear with a trace and not without.
- Two devices (raid1): two squares side by side, each device's allocation as the dev tree
  says.
- A PATH inside a live mount: the mount commits first, so a file just written counts.
- Bad input: a size that is not a power of two is a usage error (2), a missing image an
  error (1), each with a message and no picture.
"""
import os
import re
import struct
import zlib

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount


def read_png(path):
    """(width, height, rows of (r, g, b)) of an 8-bit RGB PNG written without filters."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert (depth, colour) == (8, 2), "not 8-bit RGB"
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 1 + 3 * width
    rows = []
    for y in range(height):
        line = raw[y * stride:(y + 1) * stride]
        assert line[0] == 0, "a filtered row"
        rows.append([tuple(line[1 + 3 * x:4 + 3 * x]) for x in range(width)])
    return width, height, rows


def dev_extents(image):
    """{devid: bytes of its DEV_EXTENT items}."""
    out = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", "dev", image]).stdout
    total = {}
    for devid, length in re.findall(r"key \((\d+) DEV_EXTENT \d+\).*?length (\d+)", out, re.S):
        total[int(devid)] = total.get(int(devid), 0) + int(length)
    return total


def extent_bytes(image, nodesize=16384):
    """(data extent bytes, tree block bytes) the extent tree lists."""
    out = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", "extent", image]).stdout
    data = sum(int(n) for n in re.findall(r"key \(\d+ EXTENT_ITEM (\d+)\)", out))
    meta = len(re.findall(r"key \(\d+ METADATA_ITEM \d+\)", out)) * nodesize
    return data, meta


def heatmap(butter, *args, check=True):
    return kfs.run([butter.path, "heatmap"] + list(args), check=check)


def counted(stdout):
    """[(allocated, used, traced)] per device from heatmap's output."""
    return [tuple(int(x) for x in m) for m in
            re.findall(r"bytes: allocated (\d+), used (\d+), traced (\d+)", stdout)]


def is_orange(p):
    return p[0] > 200 and 60 < p[1] < 200 and p[2] < 120


def test_heatmap_counts_what_progs_and_the_kernel_see(fuse, butter, workdir):
    image = os.path.join(workdir, "img")
    with open(image, "wb") as f:
        f.truncate(1 << 30)
    kfs.run(["mkfs.btrfs", "-q", "-f", image])
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        os.mkdir(os.path.join(m.mnt, "d"))
        for i in range(1, 25):
            with open(os.path.join(m.mnt, "d", f"f{i}"), "wb") as f:
                f.write(os.urandom(i * 150000))
    traced = ["/d/f3", "/d/f11", "/d/f20"]
    trace = os.path.join(workdir, "trace.txt")
    with open(trace, "w") as f:
        f.write("\n".join(traced) + "\n")
    png = os.path.join(workdir, "h.png")
    out = heatmap(butter, "--trace", trace, "--size", "128", "-o", png, image).stdout
    (allocated, used, marked), = counted(out)
    assert allocated == dev_extents(image)[1]
    data, meta = extent_bytes(image)
    assert used == data + 2 * meta
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "k")) as k:
        want = sum(length for p in traced for _, _, length, _ in kfs.fiemap(k + p))
    assert marked == want
    width, height, rows = read_png(png)
    assert (width, height) == (128, 128)
    pixels = [p for row in rows for p in row]
    black = sum(p == (0, 0, 0) for p in pixels) / len(pixels)
    assert abs(black - (1 - allocated / (1 << 30))) < 0.02, (black, allocated)
    assert sum(map(is_orange, pixels)) > 0
    plain = os.path.join(workdir, "plain.png")
    heatmap(butter, "--size", "128", "-o", plain, image)
    assert not any(is_orange(p) for row in read_png(plain)[2] for p in row)
    oracle.btrfs_check(image)


def test_heatmap_two_devices(butter, workdir):
    images = []
    for i in range(2):
        images.append(os.path.join(workdir, f"d{i}"))
        with open(images[-1], "wb") as f:
            f.truncate(512 << 20)
    kfs.run(["mkfs.btrfs", "-q", "-f", "-d", "raid1", "-m", "raid1"] + images)
    png = os.path.join(workdir, "h.png")
    out = heatmap(butter, "--size", "64", "-o", png, "--device", images[1], images[0]).stdout
    per_dev = counted(out)
    ext = dev_extents(images[0])
    assert [a for a, _, _ in per_dev] == [ext[1], ext[2]]
    width, height, _ = read_png(png)
    assert (width, height) == (64 * 2 + 8, 64)


def test_heatmap_of_a_live_mount_commits_first(fuse, butter, workdir):
    image = os.path.join(workdir, "img")
    kfs.run([butter.path, "mkfs", "-q", "-b", "512M", image])
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt"),
                   options=["commit=300"]) as m:
        before = counted(heatmap(butter, "-o", os.path.join(workdir, "a.png"), m.mnt).stdout)
        with open(os.path.join(m.mnt, "new"), "wb") as f:
            f.write(os.urandom(8 << 20))
        after = counted(heatmap(butter, "-o", os.path.join(workdir, "b.png"), m.mnt).stdout)
    assert after[0][1] - before[0][1] >= 8 << 20


def test_heatmap_bad_input(butter, workdir):
    image = os.path.join(workdir, "img")
    kfs.run([butter.path, "mkfs", "-q", "-b", "256M", image])
    png = os.path.join(workdir, "x.png")
    r = heatmap(butter, "--size", "100", "-o", png, image, check=False)
    assert r.returncode == 2 and "power of two" in r.stderr
    r = heatmap(butter, "-o", png, os.path.join(workdir, "nothing"), check=False)
    assert r.returncode == 1 and "nothing" in r.stderr
    r = heatmap(butter, "--trace", os.path.join(workdir, "nothing.txt"), "-o", png, image,
                check=False)
    assert r.returncode == 1 and "nothing.txt" in r.stderr
    assert not os.path.exists(png)
