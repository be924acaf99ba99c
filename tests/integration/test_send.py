"""`butter send`: a read-only subvolume as a btrfs send stream, judged by the kernel.

The kernel fills a subvolume with the full test tree (every file type, holes, hard
links, xattrs and ACLs, odd modes and owners, long names, many entries) and snapshots it
read-only. `butter send` writes the snapshot's stream from the image; `btrfs receive`
(btrfs-progs, into a fresh kernel btrfs) must accept it and make a tree equal to the
snapshot, stat for stat and byte for byte (manifest.compare), read-only, with the
snapshot's uuid as its received uuid. The kernel's own `btrfs send` of the same snapshot,
received beside it, gives the same tree. A writable subvolume is refused, as btrfs send
refuses it.
"""
import os
import re

from butter_it import kfs, manifest, tree


def subvol_show(path):
    out = kfs.run(["btrfs", "subvolume", "show", path]).stdout
    get = lambda k: re.search(rf"^\s*{k}:\s*(.*)$", out, re.M).group(1).strip()
    return {"uuid": get("UUID"), "received": get("Received UUID"), "flags": get("Flags")}


def receive(stream, into):
    os.makedirs(into, exist_ok=True)
    r = kfs.run(["btrfs", "receive", "-f", stream, into], check=False, timeout=600)
    assert r.returncode == 0, f"btrfs receive failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def test_send_kernel_tree(kernel, butter, workdir):
    bstream = os.path.join(workdir, "butter.stream")
    kstream = os.path.join(workdir, "kernel.stream")
    with kfs.kernel_fs(workdir, name="src") as fs:
        kfs.run(["btrfs", "subvolume", "create", os.path.join(fs.mnt, "vol")])
        tree.populate(os.path.join(fs.mnt, "vol"), seed=7, subvolumes=False)
        snap = os.path.join(fs.mnt, "snap")
        kfs.run(["btrfs", "subvolume", "snapshot", "-r", os.path.join(fs.mnt, "vol"), snap])
        fs.sync()
        src = manifest.take(snap)
        src_uuid = subvol_show(snap)["uuid"]
        kfs.run(["btrfs", "send", "-q", "-f", kstream, snap], timeout=600)
        fs.release()
        r = kfs.run([butter.path, "send", "-f", bstream, fs.images[0], "/snap"], check=False,
                    timeout=600)
        assert r.returncode == 0, f"butter send: {r.returncode}\n{r.stderr[-3000:]}"
        r = kfs.run([butter.path, "send", fs.images[0], "/vol"], check=False)
        assert r.returncode == 1 and "not a read-only subvolume" in r.stderr, \
            f"a writable subvolume was not refused: {r.returncode}\n{r.stderr}"
    r = kfs.run(["btrfs", "receive", "--dump", "-f", bstream], check=False, timeout=600)
    assert r.returncode == 0, f"btrfs receive --dump:\n{r.stderr[-3000:]}"
    with kfs.kernel_fs(workdir, name="dst") as dst:
        receive(bstream, os.path.join(dst.mnt, "b"))
        receive(kstream, os.path.join(dst.mnt, "k"))
        got = os.path.join(dst.mnt, "b", "snap")
        info = subvol_show(got)
        assert info["received"] == src_uuid, f"received uuid {info} vs source {src_uuid}"
        assert "readonly" in info["flags"], info
        manifest.assert_same(src, manifest.take(got))
        manifest.assert_same(manifest.take(os.path.join(dst.mnt, "k", "snap")),
                             manifest.take(got))


def test_send_butter_written(kernel, butter, workdir):
    """An image butter wrote (mkfs --rootdir, then a read-only snapshot made by butter)."""
    src_dir = os.path.join(workdir, "tree")
    os.makedirs(os.path.join(src_dir, "d", "e"))
    with open(os.path.join(src_dir, "d", "f"), "wb") as f:
        f.write(os.urandom(300000))
    with open(os.path.join(src_dir, "sparse"), "wb") as f:
        f.seek(3 << 20)
        f.write(b"end")
    os.link(os.path.join(src_dir, "d", "f"), os.path.join(src_dir, "d", "e", "g"))
    os.symlink("../f", os.path.join(src_dir, "d", "e", "s"))
    os.mkfifo(os.path.join(src_dir, "fifo"))
    os.setxattr(os.path.join(src_dir, "d", "f"), "user.note", b"value")
    os.chmod(os.path.join(src_dir, "d"), 0o1777)
    img = os.path.join(workdir, "b.img")
    kfs.run([butter.path, "mkfs", "-q", "-b", "512M", "--rootdir", src_dir, img])
    kfs.run([butter.path, "subvolume", "snapshot", "-r", img, "/", "/snap"])
    stream = os.path.join(workdir, "s.stream")
    kfs.run([butter.path, "send", "-f", stream, img, "/snap"])
    mnt = os.path.join(workdir, "bmnt")
    loop = kfs.loop_attach(img)
    try:
        kfs.mount(loop, mnt, ["ro"])
        try:
            src = manifest.take(os.path.join(mnt, "snap"))
        finally:
            kfs.umount(mnt)
    finally:
        kfs.loop_detach(loop)
    with kfs.kernel_fs(workdir, name="dst") as dst:
        receive(stream, dst.mnt)
        manifest.assert_same(src, manifest.take(os.path.join(dst.mnt, "snap")))
