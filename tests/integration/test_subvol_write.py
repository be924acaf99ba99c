"""Subvolumes created by butter, judged by btrfs check and the kernel.

butter makes an image, creates nested subvolumes and fills them; btrfs check must be
clean, the kernel must list exactly those subvolumes with those paths and show the
files, and it must be able to snapshot and write to them (after which btrfs check must
still be clean and butter must read the kernel's changes).
"""
import os

from butter_it import kfs, oracle


def test_subvolume_create(kernel, butter, workdir):
    b = butter.path
    image = os.path.join(workdir, "img")
    host = os.path.join(workdir, "file")
    with open(host, "wb") as f:
        f.write(os.urandom(300000))
    kfs.run([b, "mkfs", "-q", "-b", "300M", image])
    kfs.run([b, "subvolume", "create", image, "/vol"])
    kfs.run([b, "mkdir", image, "/vol/dir"])
    kfs.run([b, "subvolume", "create", image, "/vol/dir/nested"])
    kfs.run([b, "put", image, host, "/vol/dir/nested/data"])
    r = kfs.run([b, "subvolume", "create", image, "/vol"], check=False)
    assert r.returncode != 0 and "File exists" in r.stderr
    oracle.btrfs_check(image)

    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "mnt"), opts=()) as mnt:
        lines = kfs.run(["btrfs", "subvolume", "list", mnt]).stdout.splitlines()
        paths = sorted(line.split(" path ")[1] for line in lines)
        assert paths == ["vol", "vol/dir/nested"]
        with open(os.path.join(mnt, "vol/dir/nested/data"), "rb") as f, open(host, "rb") as g:
            assert f.read() == g.read()
        kfs.run(["btrfs", "subvolume", "snapshot", os.path.join(mnt, "vol"),
                 os.path.join(mnt, "snap")])
        with open(os.path.join(mnt, "vol/dir/kernel-file"), "wb") as f:
            f.write(b"written by the kernel\n")
    oracle.btrfs_check(image)
    out = kfs.run([b, "cat", image, "/vol/dir/kernel-file"]).stdout
    assert out == "written by the kernel\n"
    listing = kfs.run([b, "subvolume", "list", image]).stdout
    assert " path snap" in listing and " path vol/dir/nested" in listing
