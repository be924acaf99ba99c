"""Controlling a live `butter mount`: subvolume create/snapshot/delete/list and filesystem
df/show/sync/label on paths inside the mount (the control ioctls of butter/control.h).

Judged by the kernel after the unmount: btrfs check clean, `btrfs subvolume list` shows the
same subvolumes, every snapshot holds exactly what was written before the command (no
sync in between), a read-only snapshot refuses writes, a deleted one is gone.
"""
import errno
import os

import pytest

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount
from butter_it.tree import read_tree


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def kernel_view(workdir, image):
    """(subvolume paths, {relative file path: bytes}) as the kernel shows them."""
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kmnt")) as mnt:
        lines = kfs.run(["btrfs", "subvolume", "list", mnt]).stdout.splitlines()
        subvols = sorted(line.split(" path ")[1] for line in lines)
        files = read_tree(mnt)
        label = kfs.run(["btrfs", "filesystem", "label", mnt]).stdout.strip()
    return subvols, files, label


def test_subvolumes_on_a_live_mount(fuse, butter, workdir):
    b = butter.path
    image = os.path.join(workdir, "img")
    kfs.run([b, "mkfs", "-q", "-b", "512M", image])
    with FuseMount(b, [image], os.path.join(workdir, "mnt")) as m:
        mnt = m.mnt
        r = kfs.run([b, "subvolume", "create", f"{mnt}/vol"])
        assert "Create subvolume" in r.stdout
        write(f"{mnt}/vol/a", b"first version\n")
        os.mkdir(f"{mnt}/snaps")
        # the snapshot sees what was just written: no sync before it
        kfs.run([b, "subvolume", "snapshot", f"{mnt}/vol", f"{mnt}/snaps/one"])
        write(f"{mnt}/vol/a", b"second version\n")
        write(f"{mnt}/vol/b", os.urandom(300000))
        kfs.run([b, "subvolume", "snapshot", "-r", f"{mnt}/vol", f"{mnt}/snaps/ro"])
        assert read(f"{mnt}/snaps/one/a") == b"first version\n"
        assert read(f"{mnt}/snaps/ro/a") == b"second version\n"
        with pytest.raises(OSError) as e:
            write(f"{mnt}/snaps/ro/new", b"x")
        assert e.value.errno == errno.EROFS
        write(f"{mnt}/snaps/one/c", b"written into a snapshot\n")
        # snapshot of the top level: nested subvolumes are empty placeholders in it
        kfs.run([b, "subvolume", "snapshot", mnt, f"{mnt}/top"])
        assert os.listdir(f"{mnt}/top/vol") == []
        listing = kfs.run([b, "subvolume", "list", mnt]).stdout
        assert sorted(line.split(" path ")[1] for line in listing.splitlines()) == \
            ["snaps/one", "snaps/ro", "top", "vol"]
        # refusals
        r = kfs.run([b, "subvolume", "delete", f"{mnt}/snaps"], check=False)
        assert r.returncode != 0 and "not a subvolume" in r.stderr
        r = kfs.run([b, "subvolume", "create", f"{mnt}/vol"], check=False)
        assert r.returncode != 0 and "File exists" in r.stderr
        r = kfs.run([b, "subvolume", "snapshot", f"{mnt}/snaps", f"{mnt}/x"], check=False)
        assert r.returncode != 0 and "not a subvolume" in r.stderr
        r = kfs.run([b, "subvolume", "create", "/tmp/not-butter-here"], check=False)
        assert r.returncode != 0 and "not inside a butter mount" in r.stderr
        # delete: gone at once from the mount
        kfs.run([b, "subvolume", "delete", f"{mnt}/top"])
        assert not os.path.exists(f"{mnt}/top")
        # filesystem commands
        kfs.run([b, "filesystem", "label", mnt, "live-label"])
        assert kfs.run([b, "filesystem", "label", mnt]).stdout.strip() == "live-label"
        df = kfs.run([b, "filesystem", "df", mnt]).stdout
        assert "Data, single: total=" in df and "Metadata, DUP: total=" in df, df
        assert "live-label" in kfs.run([b, "filesystem", "show", mnt]).stdout
        kfs.run([b, "filesystem", "sync", mnt])
        assert m.unmount() == 0
    oracle.btrfs_check(image)
    subvols, files, label = kernel_view(workdir, image)
    assert subvols == ["snaps/one", "snaps/ro", "vol"]
    assert label == "live-label"
    assert files["vol/a"] == b"second version\n"
    assert files["snaps/one/a"] == b"first version\n"
    assert files["snaps/one/c"] == b"written into a snapshot\n"
    assert "snaps/one/b" not in files
    assert files["snaps/ro/b"] == files["vol/b"]


def test_readonly_mount_refuses_changes(fuse, butter, workdir):
    b = butter.path
    image = os.path.join(workdir, "img")
    kfs.run([b, "mkfs", "-q", "-b", "256M", image])
    kfs.run([b, "subvolume", "create", image, "/vol"])
    with FuseMount(b, [image], os.path.join(workdir, "mnt"), ["ro"]) as m:
        for args in (["subvolume", "create", f"{m.mnt}/new"],
                     ["subvolume", "snapshot", f"{m.mnt}/vol", f"{m.mnt}/s"],
                     ["subvolume", "delete", f"{m.mnt}/vol"],
                     ["filesystem", "label", m.mnt, "x"]):
            r = kfs.run([b] + args, check=False)
            assert r.returncode != 0 and "Read-only file system" in r.stderr, (args, r.stderr)
        assert "path vol" in kfs.run([b, "subvolume", "list", m.mnt]).stdout
        assert m.unmount() == 0
    oracle.btrfs_check(image)
