"""Tests of the harness itself: the generator, the manifest and the comparison.

The butter tests are only as good as compare(): a comparison that misses a difference
passes a broken extractor. Here a stand-in extractor (cp -a from the kernel's mount)
must reproduce the tree with no difference reported, and then a copy with one
deliberate change per field (a byte, an mtime, an xattr, a broken hard link, a filled
hole, ...) must be reported at exactly those paths and fields and nowhere else.
The first tests need no kernel: they check the hole rule and compare() on made-up
manifests.
"""
import os
import stat

import pytest

from butter_it import kfs, manifest, tree
from butter_it.manifest import Manifest, hole_violations

KiB = 1024
MiB = 1 << 20


# ---------------------------------------------------------------------------------
# Without a kernel

def test_hole_rule():
    src = [(0, 64 * KiB), (1 * MiB, 1 * MiB + 10)]
    assert hole_violations(src, src) == []
    assert hole_violations(src, []) == []                      # all holes: allowed
    assert hole_violations(src, [(4 * KiB, 8 * KiB)]) == []    # a subset: allowed
    assert hole_violations(src, [(0, 68 * KiB)]) == [(64 * KiB, 68 * KiB)]
    assert hole_violations(src, [(1 * MiB, 1 * MiB + 4096)]) == []   # same 4 KiB block
    assert hole_violations(src, [(100, 200), (512 * KiB, 516 * KiB + 1)]) == \
        [(512 * KiB, 520 * KiB)]
    assert hole_violations([], [(0, 1)]) == [(0, 4096)]
    assert hole_violations([(0, 4096), (4096, 8192)], [(0, 8192)]) == []


def _fake(entries):
    m = Manifest("/fake", "fake")
    base = {"mode": 0o755, "uid": 0, "gid": 0, "mtime_ns": 1, "atime_ns": 2, "xattrs": {},
            "_dev": 1}
    for i, (path, extra) in enumerate(entries.items()):
        e = dict(base, _ino=i + 10)
        e.update(extra)
        m[path] = e
    return m


def _file(ino, content="x", size=1, data=((0, 1),), **kw):
    return dict({"type": "file", "size": size, "sha256": content, "_chunks": [content],
                 "data": list(data), "_ino": ino}, **kw)


def test_compare_made_up_manifests():
    src = _fake({".": {"type": "dir"}, "a": _file(1), "b": _file(1), "d": {"type": "dir"},
                 "d/e": _file(3), "s": {"type": "symlink", "target": "x"},
                 "ph": {"type": "dir", "placeholder": True}})
    assert manifest.compare(src, src) == []
    dst = _fake({".": {"type": "dir"}, "a": _file(1), "b": _file(2), "d": {"type": "dir"},
                 "s": {"type": "symlink", "target": "y", "mtime_ns": 5},
                 "ph": {"type": "dir", "mode": 0o700, "mtime_ns": 99}, "new": _file(7)})
    diffs = manifest.compare(src, dst)
    text = "\n".join(diffs)
    assert "'d/e': missing" in text
    assert "'new': in the extracted tree but not in the source" in text
    assert "'s': target" in text and "'s': mtime_ns" in text
    assert "'a': hard links" in text and "'b': hard links" in text
    assert "'ph'" not in text                                   # placeholders: type only
    assert len(diffs) == 6, text
    assert manifest.compare(src, dst, exclude=["d", "new", "s", "a", "b"]) == []
    with pytest.raises(AssertionError, match="6 difference"):
        manifest.assert_same(src, dst)


# ---------------------------------------------------------------------------------
# With a kernel-made tree and the cp -a stand-in

@pytest.fixture(scope="module")
def kernel_tree(kernel):
    """A populated, mounted kernel filesystem and its manifest, shared by this module."""
    wd = kfs.make_workdir("selftest")
    try:
        with kfs.kernel_fs(wd, mount_opts=["compress=zstd"]) as fs:
            gen = tree.populate(fs.mnt)
            fs.sync()
            yield fs, gen, manifest.take(fs.mnt), wd
    finally:
        kfs.remove_workdir(wd)


def test_generator_made_everything(kernel_tree):
    fs, gen, src, _ = kernel_tree
    for kind, at_least in [("file", 500), ("dir", 100), ("symlink", 20), ("fifo", 2),
                           ("chr", 2), ("blk", 2), ("sock", 1)]:
        assert src.count(kind) >= at_least, kind
    files = {p: e for p, e in src.items() if e["type"] == "file"}
    assert max(e["size"] for e in files.values()) > 20 * MiB
    assert any(e["size"] == 0 for e in files.values())
    # holes, and prealloc reading as holes
    assert files["sparse/hole-middle"]["data"][0] == (0, 64 * KiB)
    assert files["sparse/all-hole"]["data"] == []
    assert files["prealloc/whole"]["data"] == [] and files["prealloc/whole"]["size"] == MiB
    assert files["prealloc/past-eof"]["size"] == 10000
    # xattrs of every namespace, ACLs
    xattr_names = {n for e in src.values() for n in e["xattrs"]}
    for name in ["user.long", "security.butter", "trusted.butter", "system.posix_acl_access",
                 "system.posix_acl_default", "trusted.on-symlink"]:
        assert name in xattr_names, name
    assert "system.posix_acl_access" in src["meta/acl-dir/inherited"]["xattrs"]
    # hard links, also the INODE_EXTREF ones
    groups = {}
    for p, e in src.items():
        if e["type"] != "dir":
            groups.setdefault((e["_dev"], e["_ino"]), []).append(p)
    sizes = sorted(len(g) for g in groups.values())
    assert sizes[-1] >= 101 and sizes[-2] >= 5
    # subvolumes, snapshots and the placeholders inside snapshots
    assert {"sv1", "sv1/nested", "sv1/nested/deeper", "dir_a/sv_in_dir", "snaps/sv1-ro",
            "snaps/top-ro"} <= {p for p, e in src.items() if e.get("subvol")}
    assert src["snaps/top-ro/sv1"]["placeholder"]
    assert src["snaps/sv1-ro/delete-me"]["type"] == "file" and "sv1/delete-me" not in src
    assert src["snaps/sv1-ro/append-me"]["size"] == 3000 and src["sv1/append-me"]["size"] == 73000
    # modes, owners, times, names
    modes = {e["mode"] for e in src.values()}
    assert {0o4755, 0o1777, 0o0000, 0o7777} <= modes
    assert {4294967294, 2**31 - 1} <= {e["uid"] for e in src.values()}
    assert any(e["mtime_ns"] < 0 for e in src.values())
    assert any(len(os.fsencode(os.path.basename(p))) == 255 for p in src)
    assert max(p.count("/") for p in src) >= 50
    assert src["special/chr-big"]["rdev"] == os.makedev(4095, 1048575)


def test_standin_extract_has_no_differences(kernel_tree):
    fs, gen, src, wd = kernel_tree
    dest = tree.copy_tree_standin(fs.mnt, os.path.join(wd, "equal"))
    manifest.assert_same(src, manifest.take(dest))


def _keep_times(*paths):
    saved = [(p, os.lstat(p)) for p in paths]

    def restore():
        for p, st in saved:
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    return restore


def _perturb(dest):
    """Change the copy at `dest` in one field per path; return {path: expected words}."""
    d = lambda rel: os.path.join(dest, rel)
    parents = {d(x) for x in [".", "links", "links/sub1", "names", "special", "snaps/sv1-ro"]}
    restore = _keep_times(*parents)
    expect = {}

    # one byte of content
    p = d("big/mixed")
    r = _keep_times(p)
    with open(p, "r+b") as f:
        f.seek(5 * MiB + 3)
        b = f.read(1)
        f.seek(5 * MiB + 3)
        f.write(bytes([b[0] ^ 1]))
    r()
    expect["big/mixed"] = "content"

    # one nanosecond of one mtime, one second of one atime, a directory's mtime
    st = os.lstat(d("sizes/random-4096"))
    os.utime(d("sizes/random-4096"), ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    expect["sizes/random-4096"] = "mtime_ns"
    st = os.lstat(d("links/target-file"))
    os.utime(d("links/target-file"), ns=(st.st_atime_ns + 10**9, st.st_mtime_ns))
    expect["links/target-file"] = "atime_ns"
    st = os.lstat(d("deep/level-00"))
    os.utime(d("deep/level-00"), ns=(st.st_atime_ns, st.st_mtime_ns - 7))
    expect["deep/level-00"] = "mtime_ns"

    # xattrs: a changed value, a missing ACL
    os.setxattr(d("meta/xattr-long"), "user.long", b"changed")
    expect["meta/xattr-long"] = "xattrs"
    os.removexattr(d("meta/acl-file"), "system.posix_acl_access")
    expect["meta/acl-file"] = "xattrs"

    # a hard link broken: same content and metadata, another inode
    r = _keep_times(d("links/hl-a"))                 # cp reads it: relatime moves its atime
    kfs.run(["cp", "-a", d("links/sub1/hl-c"), d("links/sub1/hl-c.tmp")])
    r()
    os.rename(d("links/sub1/hl-c.tmp"), d("links/sub1/hl-c"))
    for q in ["links/hl-a", "links/hl-b", "links/sub1/hl-c", "links/sub2/deeper/hl-d", "sizes/hl-e"]:
        expect[q] = "hard links"

    # two snapshots' files made one inode (identity is per subvolume)
    os.unlink(d("snaps/sv1-ro/file-0"))
    os.link(d("sv1/file-0"), d("snaps/sv1-ro/file-0"))
    expect["snaps/sv1-ro/file-0"] = "hard links"
    expect["sv1/file-0"] = "hard links"

    # a hole filled with zeros: same content, data where the source has none
    p = d("sparse/hole-middle")
    r = _keep_times(p)
    fd = os.open(p, os.O_WRONLY)
    os.pwrite(fd, bytes(8192), 512 * KiB)
    os.close(fd)
    r()
    expect["sparse/hole-middle"] = "holes"

    # mode, owner, symlink target, rdev, size, type
    os.chmod(d("special/fifo"), 0o604)
    expect["special/fifo"] = "mode"
    st = os.lstat(d("links/abs"))
    os.lchown(d("links/abs"), st.st_uid + 1, st.st_gid)
    expect["links/abs"] = "uid"
    st = os.lstat(d("links/long"))
    os.unlink(d("links/long"))
    os.symlink("other", d("links/long"))
    os.lchown(d("links/long"), st.st_uid, st.st_gid)
    os.utime(d("links/long"), ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    expect["links/long"] = "target"
    st = os.lstat(d("special/chr-big"))
    xattrs = {n: os.getxattr(d("special/chr-big"), n) for n in os.listxattr(d("special/chr-big"))}
    os.unlink(d("special/chr-big"))
    os.mknod(d("special/chr-big"), st.st_mode, os.makedev(4095, 1048574))
    os.chown(d("special/chr-big"), st.st_uid, st.st_gid)
    os.chmod(d("special/chr-big"), stat.S_IMODE(st.st_mode))
    for n, v in xattrs.items():
        os.setxattr(d("special/chr-big"), n, v)
    os.utime(d("special/chr-big"), ns=(st.st_atime_ns, st.st_mtime_ns))
    expect["special/chr-big"] = "rdev"
    p = d("cow/cloned")
    r = _keep_times(p)
    os.truncate(p, os.lstat(p).st_size - 1)
    r()
    expect["cow/cloned"] = ("size", "content")
    st = os.lstat(d("special/sock"))
    os.unlink(d("special/sock"))
    os.mkfifo(d("special/sock"))
    expect["special/sock"] = "type"

    # a path missing, a path added
    os.unlink(d("names/café"))
    expect["names/café"] = "missing"
    with open(d("extra-file"), "w") as f:
        f.write("x")
    expect["extra-file"] = "not in the source"
    restore()
    return expect


def test_compare_catches_every_perturbation(kernel_tree):
    fs, gen, src, wd = kernel_tree
    dest = tree.copy_tree_standin(fs.mnt, os.path.join(wd, "perturbed"))
    expect = _perturb(dest)
    diffs = manifest.compare(src, manifest.take(dest))
    by_path = {}
    for line in diffs:
        path = eval(line.split(": ", 1)[0])             # lines start with repr(path)
        by_path.setdefault(path, []).append(line)
    def explained(path, line):
        words = expect.get(path, ())
        return any(w in line for w in ([words] if isinstance(words, str) else words))
    unexplained = [line for p, lines in by_path.items() for line in lines
                   if not explained(p, line)]
    assert not unexplained, "differences nobody made:\n" + "\n".join(unexplained)
    missed = [f"{p}: {w}" for p, w in expect.items() if p not in by_path]
    assert not missed, "perturbations compare() did not report:\n" + "\n".join(missed)
