"""Offline editing judged by btrfs-progs and the kernel: `butter put`, `mkdir`, `ln`.

Two images are edited, one the kernel made and filled (mkfs.btrfs + a mount) and one
`butter mkfs --rootdir` made. After the edits `btrfs check --readonly` must be clean and
the kernel must show (manifest comparison, stat for stat and byte for byte):
  - every copied host tree and file exactly as on the host (the host tree lives on the
    host filesystem, not btrfs: its holes come from that filesystem's SEEK_DATA),
  - the directories, symlinks and hard links made with mkdir and ln,
  - everything that was in the image before, unchanged (but the mtime of directories
    that received new names).
Refusals (an existing name, a missing or non-directory parent, a missing host file)
exit 1 and leave the image byte for byte as it was; so does `mkdir -p` of a directory
that exists (and it exits 0).
"""
import os

import pytest

from butter_it import kfs, manifest, oracle, tree
from butter_it.butter import failed, image_paths

MiB = 1 << 20


@pytest.fixture(scope="module")
def host_src(kernel):
    """(read-only view of a generated tree on the host filesystem, its manifest)."""
    work = kfs.make_workdir("edit-host-src")
    try:
        src = os.path.join(work, "src")
        os.makedirs(src)
        gen = tree.Gen(src, seed=11)
        gen.sizes()
        gen.sparse()
        gen.meta()
        gen.links()
        gen.special()
        gen.names()
        gen.modes()
        gen.deep(20)
        gen.stamp_dirs()
        with kfs.readonly_view(src, os.path.join(work, "view")) as view:
            yield view, manifest.take(view)
    finally:
        kfs.remove_workdir(work)


def kernel_image(workdir):
    """A kernel-made and kernel-filled image; return (images, manifest before edits)."""
    with kfs.kernel_fs(workdir, name="kimg") as fs:
        tree.small_tree(fs.mnt, seed=5)
        tree.populate_many(fs.mnt, "many", 300)
        fs.sync()
        before = manifest.take(fs.mnt)
        fs.release()
    return fs.images, before


def butter_image(butter, workdir):
    """A butter-made image, filled with --rootdir; return (images, manifest before edits)."""
    src = os.path.join(workdir, "initial")
    os.makedirs(src)
    tree.small_tree(src, seed=6)
    images = image_paths(workdir, 1)
    with kfs.readonly_view(src, os.path.join(workdir, "initial-view")) as view:
        butter.mkfs(images, "--rootdir", view, "-q", size="1G")
    with oracle.kernel_mount(*images, mnt=os.path.join(workdir, "before")) as mnt:
        before = manifest.take(mnt)
    return images, before


def run_edits(butter, image, src_view):
    """The edits of both tests: copy trees and files in, make directories and links."""
    butter.run(["put", image, src_view, "/new-tree"])
    proc = butter.run(["mkdir", image, "/a/b/c"], check=False)
    assert failed(proc) and "No such file or directory" in proc.stderr, proc.stderr
    butter.run(["mkdir", "-p", image, "a/b/c"])
    butter.run(["mkdir", "-m", "0700", image, "/a/private"])
    butter.run(["put", image, os.path.join(src_view, "sizes", "random-4097"), "/a/b/"])
    butter.run(["put", image, os.path.join(src_view, "links", "rel"), "/a/b/c/copied-symlink"])
    butter.run(["put", image, os.path.join(src_view, "sparse"), "/a/sparse-copy"])
    butter.run(["ln", "-s", "b/random-4097", image, "/a/sym"])
    butter.run(["ln", "/a/b/random-4097", image, "/a/hard"])


def verify_edits(after, before, src):
    # the copied tree, its root directory's attributes included
    manifest.assert_same(src, manifest.subtree(after, "new-tree"))
    manifest.assert_same(manifest.subtree(src, "sparse"), manifest.subtree(after, "a/sparse-copy"))
    for copied, orig in [("a/b/random-4097", "sizes/random-4097"),
                         ("a/b/c/copied-symlink", "links/rel")]:
        a, s = after[copied], src[orig]
        for field in ("type", "mode", "uid", "gid", "mtime_ns", "atime_ns", "xattrs", "size",
                      "sha256", "target"):
            assert a.get(field) == s.get(field), f"{copied}: {field}: {a.get(field)!r} != {s.get(field)!r}"
    # what mkdir and ln made
    for d in ("a", "a/b", "a/b/c", "a/private"):
        assert after[d]["type"] == "dir" and after[d]["uid"] == os.geteuid(), d
    assert after["a/private"]["mode"] == 0o700
    umask = os.umask(0)
    os.umask(umask)
    assert after["a/b/c"]["mode"] == 0o777 & ~umask
    assert after["a/sym"]["type"] == "symlink" and after["a/sym"]["target"] == "b/random-4097"
    h, f = after["a/hard"], after["a/b/random-4097"]
    assert (h["_dev"], h["_ino"]) == (f["_dev"], f["_ino"]), "ln did not make a hard link"
    # everything that was there is as it was (the root got new names: its mtime moved)
    old = manifest.Manifest(after.root, after.fstype)
    old.update({p: e for p, e in after.items() if p in before})
    diffs = [d for d in manifest.compare(before, old) if not d.startswith("'.': mtime_ns")]
    assert not diffs, "the edits changed what was in the image:\n" + "\n".join(diffs[:40])


def edit_and_verify(butter, workdir, images, before, src_view, src):
    run_edits(butter, images[0], src_view)
    oracle.btrfs_check(*images, strict=True)
    with oracle.kernel_mount(*images, mnt=os.path.join(workdir, "after")) as mnt:
        after = manifest.take(mnt)
    verify_edits(after, before, src)
    # and butter reads back what it wrote
    dest = os.path.join(workdir, "extracted")
    butter.extract(images, dest, src="/new-tree")
    manifest.assert_same(src, manifest.take(dest))


@pytest.mark.butter_timeout(900)
def test_edit_kernel_made_image(kernel, butter, workdir, host_src):
    view, src = host_src
    images, before = kernel_image(workdir)
    edit_and_verify(butter, workdir, images, before, view, src)


@pytest.mark.butter_timeout(900)
def test_edit_butter_made_image(kernel, butter, workdir, host_src):
    view, src = host_src
    images, before = butter_image(butter, workdir)
    edit_and_verify(butter, workdir, images, before, view, src)


def test_refusals_leave_the_image_unchanged(kernel, butter, workdir, host_src):
    view, _ = host_src
    images, _ = butter_image(butter, workdir)
    image = images[0]
    butter.run(["put", image, os.path.join(view, "sizes"), "/sizes"])
    butter.run(["mkdir", image, "/dir-x"])
    digest = manifest.image_digest(image)

    refused = [
        (["put", image, os.path.join(view, "sparse"), "/sizes"], "File exists"),
        (["put", image, os.path.join(view, "sparse"), "/size-100"], "File exists"),
        (["put", image, os.path.join(view, "sizes"), "/"], "File exists"),
        (["put", image, os.path.join(view, "sizes", "text-100"), "/sizes/"], "File exists"),
        (["put", image, os.path.join(view, "sparse"), "/missing/sparse"], "No such file"),
        (["put", image, os.path.join(view, "sparse"), "/size-100/x"], "Not a directory"),
        (["put", image, os.path.join(view, "no-such-host-file"), "/x"], "No such file"),
        (["put", image, view, "/x/."], "cannot create an entry"),
        (["mkdir", image, "/dir-x"], "File exists"),
        (["mkdir", "-p", image, "/size-100"], "File exists"),
        (["mkdir", "-p", image, "/size-100/sub"], "Not a directory"),
        (["ln", "-s", "t", image, "/dir-x"], "File exists"),
        (["ln", "/dir", image, "/dir-hard"], "is a directory"),
        (["ln", "/no-such", image, "/x"], "No such file"),
    ]
    for argv, message in refused:
        proc = butter.run(argv, check=False)
        assert failed(proc) and message in proc.stderr, \
            f"butter {' '.join(argv)}: exit {proc.returncode}, stderr:\n{proc.stderr}"
        assert manifest.image_digest(image) == digest, f"butter {' '.join(argv)} changed the image"
    for argv in (["mkdir", "-p", image, "/dir-x"], ["mkdir", "-p", image, "/"]):
        butter.run(argv)
        assert manifest.image_digest(image) == digest, f"butter {' '.join(argv)} changed the image"
    oracle.btrfs_check(*images, strict=True)


def test_put_into_multi_device_image(kernel, butter, workdir, host_src):
    view, src = host_src
    images = image_paths(workdir, 3)
    butter.mkfs(images, "-d", "raid1c3", "-m", "raid1c3", "-q")
    proc = butter.run(["put", images[0], view, "/t"], check=False)
    assert failed(proc) and "--device" in proc.stderr, proc.stderr
    butter.run(["put", "--device", images[1], "--device", images[2], images[0], view, "/t"])
    oracle.btrfs_check(*images, strict=True)
    with oracle.kernel_mount(*images, mnt=os.path.join(workdir, "mnt")) as mnt:
        manifest.assert_same(src, manifest.take(os.path.join(mnt, "t")))
