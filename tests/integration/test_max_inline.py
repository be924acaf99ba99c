"""How small files are stored: inline in the leaf or in a data extent (max_inline).

- `butter mkfs --rootdir` inlines the same files mkfs.btrfs --rootdir inlines (everything
  below a sector that a leaf item holds), with 16 KiB and with 4 KiB nodes: the set of
  inline inodes in dump-tree is compared with mkfs.btrfs's on the same tree.
- `--max-inline N` bounds it (2048, the kernel's default; 0: nothing inline).
- The mount option `max_inline=` does the same for new writes through `butter mount`, and
  an inline file of 3000 bytes grows past a sector correctly (a regular extent).
Every image passes `btrfs check`, and the kernel reads the same bytes.
"""
import os
import re

import pytest

from butter_it import kfs, oracle
from butter_it.butter import image_paths
from butter_it.fusemount import FuseMount

SIZES = [1, 100, 2047, 2048, 2049, 3000, 3948, 3949, 3950, 4000, 4095, 4096, 4097, 9000]


def inline_sizes(image):
    """{inode: inline data size} and the set of inodes with a regular extent, from dump-tree."""
    dump = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", "5", image]).stdout
    inline, regular = {}, set()
    for m in re.finditer(r"key \((\d+) EXTENT_DATA \d+\) itemoff \d+ itemsize \d+\n"
                         r"(?:.*\n){1}.*?(inline extent data size (\d+)|extent data disk byte)",
                         dump):
        ino = int(m.group(1))
        if m.group(3):
            inline[ino] = int(m.group(3))
        else:
            regular.add(ino)
    return inline, regular


def inline_files(image, mnt):
    """The names (under `mnt`, a mount of `image`) of files stored inline."""
    inline, regular = inline_sizes(image)
    names = set()
    for name in os.listdir(mnt):
        ino = os.stat(os.path.join(mnt, name)).st_ino
        if ino in inline:
            names.add(name)
            assert inline[ino] == os.path.getsize(os.path.join(mnt, name)), name
        else:
            assert ino in regular, f"{name}: neither inline nor regular"
    return names


@pytest.fixture
def src(workdir):
    path = os.path.join(workdir, "src")
    os.makedirs(path)
    for size in SIZES:
        with open(os.path.join(path, f"f{size}"), "wb") as f:
            f.write(os.urandom(size))
    return path


def made_by(tool, butter, workdir, src, name, *args):
    image = os.path.join(workdir, name)
    with open(image, "wb") as f:
        f.truncate(512 << 20)
    if tool == "butter":
        kfs.run([butter.path, "mkfs", "-q", "-f", "--rootdir", src, *args, image])
    else:
        kfs.run(["mkfs.btrfs", "-q", "-f", "--rootdir", src, *args, image])
    oracle.btrfs_check(image, strict=tool == "butter")
    return image


def names_inline(image, workdir, src):
    """The inline files of `image`, after checking the kernel reads each file's bytes
    (mkfs.btrfs 6.2 keeps whole seconds only, so times are not compared here)."""
    mnt = os.path.join(workdir, "mnt")
    with oracle.kernel_mount(image, mnt=mnt) as m:
        assert sorted(os.listdir(m)) == sorted(os.listdir(src))
        for name in os.listdir(src):
            with open(os.path.join(src, name), "rb") as a, open(os.path.join(m, name), "rb") as b:
                assert a.read() == b.read(), name
        return inline_files(image, m)


@pytest.mark.parametrize("nodesize", ["16k", "4k"])
def test_rootdir_inlines_what_mkfs_btrfs_inlines(kernel, butter, workdir, src, nodesize):
    ours = names_inline(made_by("butter", butter, workdir, src, "b.img", "-n", nodesize),
                        workdir, src)
    theirs = names_inline(made_by("progs", butter, workdir, src, "p.img", "-n", nodesize),
                          workdir, src)
    assert ours == theirs, f"butter inlines {sorted(ours)}, mkfs.btrfs {sorted(theirs)}"
    assert "f3000" in ours and "f4096" not in ours


@pytest.mark.parametrize("limit", [0, 2048, 3000])
def test_rootdir_max_inline_option(kernel, butter, workdir, src, limit):
    image = made_by("butter", butter, workdir, src, "b.img", "--max-inline", str(limit))
    got = names_inline(image, workdir, src)
    assert got == {f"f{s}" for s in SIZES if s <= limit}


def test_max_inline_needs_rootdir(butter, workdir):
    proc = butter.mkfs(image_paths(workdir, 1), "--max-inline", "100", check=False)
    assert proc.returncode == 2 and "--max-inline needs --rootdir" in proc.stderr, proc.stderr


def test_mount_option_and_growth_past_a_sector(kernel, fuse, butter, workdir, src):
    image = os.path.join(workdir, "img")
    kfs.run([butter.path, "mkfs", "-q", "-b", "512M", image])
    data = {}
    with FuseMount(butter.path, [image], os.path.join(workdir, "fmnt"),
                   options=["max_inline=3000"]) as m:
        for size in (2048, 3000, 3001):
            data[f"w{size}"] = os.urandom(size)
        data["grown"] = os.urandom(3000)
        for name, d in data.items():
            with open(os.path.join(m.mnt, name), "wb") as f:
                f.write(d)
                f.flush()
                os.fsync(f.fileno())  # written back now (else delayed allocation holds it)
        # an inline file that grows past a sector becomes a regular extent
        tail = os.urandom(5000)
        with open(os.path.join(m.mnt, "grown"), "ab") as f:
            f.write(tail)
        data["grown"] += tail
    oracle.btrfs_check(image, strict=True)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "mnt")) as mnt:
        for name, d in data.items():
            with open(os.path.join(mnt, name), "rb") as f:
                assert f.read() == d, name
        assert inline_files(image, mnt) == {"w2048", "w3000"}
