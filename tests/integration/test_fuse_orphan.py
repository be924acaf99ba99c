"""Files unlinked while open, through `butter mount`: orphans, judged by the kernel.

  live      a file (or directory) whose last name goes while it is open stays readable
            and writable through its descriptors, with st_nlink 0; a committed image
            then holds the inode with nlink 0 and an ORPHAN_ITEM and is `btrfs check`
            clean; after the last close the inode, its orphan item and its data are
            gone (the space comes back); unlink, rmdir, rename over, hard links and a
            second descriptor (reopened through /proc) all follow the rule
  shutdown  SIGTERM with an unlinked file still open: the daemon frees it before its
            last commit
  crash     kill -9 of the daemon after a commit that holds an orphan: the image is
            `btrfs check` clean with the orphan in it; the kernel (mounting a copy) and
            butter (mounting another copy) both free it, and the two results agree:
            the same items in every subvolume tree, the same data extents, the same
            data bytes by `btrfs check`
  kernel    orphans the kernel left (a copy of its image taken after syncfs while the
            files were still open), in the top level and in a subvolume: butter frees
            them as the kernel does, compared the same way

Needs root, loop devices, kernel btrfs, /dev/fuse and fusermount3.
"""
import ctypes
import errno
import hashlib
import mmap
import os
import re
import signal
import time

import pytest

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount
from butter_it.tree import read_file

MiB = 1 << 20
ORPHAN_RE = re.compile(r"key \(ORPHAN ORPHAN_ITEM (\d+)\)")
ITEM_RE = re.compile(r"^\s*item \d+ key \((\S+) (\S+) (\S+)\)", re.M)

_libc = ctypes.CDLL(None, use_errno=True)


def payload(tag, size):
    return hashlib.shake_128(tag.encode()).digest(size)


def commit(mnt):
    """Make the daemon commit: an fsync through the mount (syncfs does not reach FUSE)."""
    fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dump_tree(image, tree):
    return kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", str(tree), image],
                   timeout=300).stdout


def orphans(image, tree=5):
    return sorted(int(x) for x in ORPHAN_RE.findall(dump_tree(image, tree)))


def inode_items(image, ino, tree=5):
    """The keys of the items of inode `ino` in `tree` (as dump-tree prints them)."""
    return [k for k in ITEM_RE.findall(dump_tree(image, tree)) if k[0] == str(ino)]


def nlink_of(image, ino, tree=5):
    text = dump_tree(image, tree)
    m = re.search(r"key \(%d INODE_ITEM 0\).*?\n.*?\n\s*block group \d+ mode \d+ links (\d+)"
                  % ino, text)
    return int(m.group(1)) if m else None


def data_bytes(image):
    """`btrfs check --readonly` (must be clean) and its data totals."""
    text = oracle.btrfs_check(image)
    alloc = int(re.search(r"file data blocks allocated: (\d+)", text).group(1))
    ref = int(re.search(r"referenced (\d+)", text).group(1))
    return alloc, ref


def subvol_trees(image):
    """Ids of the subvolume trees (5 and every ROOT_ITEM >= 256) of the image."""
    ids = {5}
    for obj, typ, _ in ITEM_RE.findall(dump_tree(image, "root")):
        if typ == "ROOT_ITEM" and obj.isdigit() and int(obj) >= 256:
            ids.add(int(obj))
    return sorted(ids)


def data_extents(image):
    """(bytenr, length) of every data extent item in the extent tree."""
    text = dump_tree(image, "extent")
    found = []
    for m in re.finditer(r"key \((\d+) EXTENT_ITEM (\d+)\)[^\n]*\n\s*refs \d+ gen \d+ flags DATA",
                         text):
        found.append((int(m.group(1)), int(m.group(2))))
    return sorted(found)


def fs_state(image):
    """What an orphan cleanup must leave equal: every subvolume tree's item keys, the
    data extents and check's data totals (tree blocks and generations may differ)."""
    trees = {t: sorted(ITEM_RE.findall(dump_tree(image, t))) for t in subvol_trees(image)}
    return {"trees": trees, "data_extents": data_extents(image),
            "data_bytes": data_bytes(image)}


def wait_for(cond, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def free_bytes(mnt):
    st = os.statvfs(mnt)
    return st.f_bfree * st.f_frsize


def ino_of(path):
    return os.lstat(path).st_ino         # the top-level subvolume: st_ino is the btrfs inode


# ---------------------------------------------------------------------------------
# live: unlinked while open

def test_unlinked_open_file_lives_until_last_close(fuse, butter, workdir):
    image = kfs.mkfs_image(workdir)
    data = bytearray(payload("victim", 3 * MiB + 123))
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        p = lambda rel: os.path.join(m.mnt, rel)                     # noqa: E731
        with open(p("keep"), "wb") as f:
            f.write(payload("keep", 200000))
        commit(m.mnt)
        before = free_bytes(m.mnt)
        with open(p("victim"), "wb") as f:
            f.write(data)
        ino = ino_of(p("victim"))
        fd = os.open(p("victim"), os.O_RDWR)
        os.unlink(p("victim"))
        assert not os.path.exists(p("victim"))
        assert os.fstat(fd).st_nlink == 0
        # write and read through the descriptor: pwrite, append, mmap
        os.pwrite(fd, b"W" * 10000, 4000)
        data[4000:14000] = b"W" * 10000
        os.lseek(fd, 0, os.SEEK_END)
        os.write(fd, b"tail" * 1000)
        data += b"tail" * 1000
        with mmap.mmap(fd, len(data)) as mm:
            assert mm[:] == data
            mm[100:105] = b"mmap!"
            data[100:105] = b"mmap!"
            mm.flush()
        assert os.pread(fd, len(data) + 10, 0) == data
        # a second descriptor, reopened through /proc: the inode outlives the first
        fd2 = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
        commit(m.mnt)
        assert orphans(image) == [ino]
        assert nlink_of(image, ino) == 0
        oracle.btrfs_check(image)           # an orphan is a legal state on disk
        os.close(fd)
        time.sleep(0.5)                     # the kernel sends release asynchronously
        assert os.pread(fd2, len(data), 0) == data
        assert os.fstat(fd2).st_size == len(data)
        commit(m.mnt)
        assert orphans(image) == [ino], "freed while a descriptor was still open"
        os.close(fd2)

        def freed():
            commit(m.mnt)
            return orphans(image) == [] and not inode_items(image, ino)
        wait_for(freed, "the orphan to be freed after the last close")
        assert free_bytes(m.mnt) >= before - 64 * 1024, "the orphan's data was not freed"
        assert m.unmount() == 0
    assert data_bytes(image)[0] == 200704       # only "keep" (200000 bytes, in sectors)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kview")) as kmnt:
        assert sorted(os.listdir(kmnt)) == ["keep"]


def test_last_name_goes_every_way(fuse, butter, workdir):
    """unlink of the last hard link, rename over an open file, rmdir of an open directory."""
    image = kfs.mkfs_image(workdir)
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        p = lambda rel: os.path.join(m.mnt, rel)                     # noqa: E731
        for name in ("linked", "over", "target"):
            with open(p(name), "wb") as f:
                f.write(payload(name, 70000))
        os.link(p("linked"), p("linked2"))
        os.mkdir(p("dir"))
        inos = {n: ino_of(p(n)) for n in ("linked", "over", "dir")}
        fds = {n: os.open(p(n), os.O_RDONLY) for n in ("linked", "over", "dir")}
        os.unlink(p("linked"))
        commit(m.mnt)
        assert orphans(image) == [], "a file with a name left became an orphan"
        os.unlink(p("linked2"))
        os.rename(p("target"), p("over"))
        os.rmdir(p("dir"))
        assert os.fstat(fds["dir"]).st_nlink == 0
        with pytest.raises(OSError) as e:
            os.open(os.path.join(f"/proc/self/fd/{fds['dir']}", "new"), os.O_CREAT | os.O_WRONLY)
        assert e.value.errno == errno.ENOENT
        commit(m.mnt)
        assert orphans(image) == sorted(inos.values())
        oracle.btrfs_check(image)
        for n in ("linked", "over"):
            assert os.pread(fds[n], 80000, 0) == payload(n, 70000)
        assert read_file(p("over")) == payload("target", 70000)
        for fd in fds.values():
            os.close(fd)

        def freed():
            commit(m.mnt)
            return orphans(image) == [] and not any(inode_items(image, i) for i in inos.values())
        wait_for(freed, "the orphans to be freed")
        assert m.unmount() == 0
    oracle.btrfs_check(image)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kview")) as kmnt:
        assert sorted(os.listdir(kmnt)) == ["over"]
        assert read_file(os.path.join(kmnt, "over")) == payload("target", 70000)


def test_sigterm_frees_open_orphans(fuse, butter, workdir):
    image = kfs.mkfs_image(workdir)
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        with open(os.path.join(m.mnt, "victim"), "wb") as f:
            f.write(payload("victim", 2 * MiB))
        fd = os.open(os.path.join(m.mnt, "victim"), os.O_RDONLY)
        os.unlink(os.path.join(m.mnt, "victim"))
        commit(m.mnt)
        assert len(orphans(image)) == 1
        try:
            assert m.signal(signal.SIGTERM) == 0
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
    assert orphans(image) == []
    assert data_bytes(image) == (0, 0)


# ---------------------------------------------------------------------------------
# crash: orphans on disk, freed by the kernel and by butter alike

def copy_image(src, dst):
    kfs.run(["cp", "--sparse=always", src, dst], timeout=300)
    return dst


def kernel_cleanup(workdir, image, subvols=()):
    """Mount `image` read-write with the kernel (which frees orphans), touch each of
    `subvols` (the kernel cleans a subvolume when it first looks it up), unmount."""
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kclean"), opts=()) as mnt:
        for sv in subvols:
            os.listdir(os.path.join(mnt, sv))
        tree_fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _libc.syncfs(tree_fd)
        finally:
            os.close(tree_fd)


def butter_cleanup(butter, workdir, image):
    with FuseMount(butter.path, [image], os.path.join(workdir, "bclean")) as m:
        assert m.unmount() == 0


def assert_cleaned_alike(butter, workdir, crashed, expect_orphans, subvols=()):
    """Clean copies of `crashed` with the kernel and with butter; compare the two."""
    for tree, inos in expect_orphans.items():
        assert orphans(crashed, tree) == sorted(inos), f"tree {tree} of the crashed image"
    oracle.btrfs_check(crashed)
    by_kernel = copy_image(crashed, os.path.join(workdir, "by-kernel.img"))
    by_butter = copy_image(crashed, os.path.join(workdir, "by-butter.img"))
    kernel_cleanup(workdir, by_kernel, subvols)
    butter_cleanup(butter, workdir, by_butter)
    k, b = fs_state(by_kernel), fs_state(by_butter)
    for tree, inos in expect_orphans.items():
        assert orphans(by_kernel, tree) == [], "the kernel left an orphan (harness)"
        for ino in inos:
            assert not inode_items(by_kernel, ino, tree), "the kernel left the inode (harness)"
    if b["trees"] != k["trees"]:
        lines = []
        for t in sorted(set(b["trees"]) | set(k["trees"])):
            bt, kt = set(b["trees"].get(t, [])), set(k["trees"].get(t, []))
            lines.append(f"tree {t}: butter-only {sorted(bt - kt)} kernel-only {sorted(kt - bt)}")
        raise AssertionError("subvolume trees differ after cleanup:\n" + "\n".join(lines))
    assert b["data_extents"] == k["data_extents"]
    assert b["data_bytes"] == k["data_bytes"]
    assert k["data_bytes"][0] < data_bytes(crashed)[0], "nothing was freed (harness)"
    return by_kernel, by_butter


def test_crash_with_open_orphan(fuse, butter, workdir):
    image = kfs.mkfs_image(workdir)
    m = FuseMount(butter.path, [image], os.path.join(workdir, "mnt"))
    with m:
        with open(os.path.join(m.mnt, "keep"), "wb") as f:
            f.write(payload("keep", 100000))
            # durable by its own fsync: a commit does not carry data still in the daemon's
            # write buffer (delayed allocation), as the kernel's commits do not carry delalloc
            f.flush()
            os.fsync(f.fileno())
        with open(os.path.join(m.mnt, "victim"), "wb") as f:
            f.write(payload("victim", 3 * MiB))
        ino = ino_of(os.path.join(m.mnt, "victim"))
        fd = os.open(os.path.join(m.mnt, "victim"), os.O_RDWR)
        os.unlink(os.path.join(m.mnt, "victim"))
        os.pwrite(fd, b"after unlink" * 1000, MiB)
        os.fsync(fd)                         # a commit with the orphan in it
        m.proc.kill()                        # kill -9: no release, no final commit
        m.proc.wait(timeout=60)
        try:
            os.close(fd)
        except OSError:
            pass                             # the connection is gone
    by_kernel, by_butter = assert_cleaned_alike(butter, workdir, image, {5: [ino]})
    with oracle.kernel_mount(by_butter, mnt=os.path.join(workdir, "kview")) as kmnt:
        assert sorted(os.listdir(kmnt)) == ["keep"]
        assert read_file(os.path.join(kmnt, "keep")) == payload("keep", 100000)


KERNEL_ORPHANS = r"""
import ctypes, os, subprocess, sys
mnt, image, copy = sys.argv[1:4]
fds = []
for rel in ("victim", "sv/victim", "sv/d/victim2"):
    path = os.path.join(mnt, rel)
    fd = os.open(path, os.O_RDWR)
    os.unlink(path)
    os.pwrite(fd, b"written after the unlink" * 100, 4096)
    fds.append(fd)
tfd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
assert ctypes.CDLL(None).syncfs(tfd) == 0
os.close(tfd)
subprocess.run(["cp", "--sparse=always", image, copy], check=True)
for fd in fds:
    os.close(fd)
"""


def test_orphans_left_by_the_kernel(fuse, butter, workdir):
    """A copy of the kernel's image taken while unlinked files were open (after syncfs,
    as a crash would leave it): orphans in the top level and in a subvolume."""
    crashed = os.path.join(workdir, "crashed.img")
    with kfs.kernel_fs(workdir, name="k") as fs:
        kfs.run(["btrfs", "subvolume", "create", os.path.join(fs.mnt, "sv")])
        os.mkdir(os.path.join(fs.mnt, "sv", "d"))
        for rel in ("victim", "sv/victim", "sv/d/victim2", "keep", "sv/keep"):
            with open(os.path.join(fs.mnt, rel), "wb") as f:
                f.write(payload(rel, 1 * MiB + len(rel)))
        fs.sync()
        inos = {rel: os.lstat(os.path.join(fs.mnt, rel)).st_ino
                for rel in ("victim", "sv/victim", "sv/d/victim2")}
        script = os.path.join(workdir, "orphans.py")
        with open(script, "w") as f:
            f.write(KERNEL_ORPHANS)
        kfs.run(["/usr/bin/python3", script, fs.mnt, fs.images[0], crashed], timeout=300)
        fs.release()
    sv_id = [t for t in subvol_trees(crashed) if t != 5]
    assert len(sv_id) == 1
    expect = {5: [inos["victim"]], sv_id[0]: [inos["sv/victim"], inos["sv/d/victim2"]]}
    by_kernel, by_butter = assert_cleaned_alike(butter, workdir, crashed, expect, ["sv"])
    with oracle.kernel_mount(by_butter, mnt=os.path.join(workdir, "kview")) as kmnt:
        assert sorted(os.listdir(kmnt)) == ["keep", "sv"]
        assert sorted(os.listdir(os.path.join(kmnt, "sv"))) == ["d", "keep"]
        assert os.listdir(os.path.join(kmnt, "sv", "d")) == []
        assert read_file(os.path.join(kmnt, "sv/keep")) == payload("sv/keep", 1 * MiB + 7)


KERNEL_ORPHANS_SNAPSHOT = r"""
import ctypes, os, subprocess, sys
mnt, image, copy = sys.argv[1:4]
fds = []
for rel in ("victim", "sv/victim"):
    path = os.path.join(mnt, rel)
    fds.append(os.open(path, os.O_RDWR))
    os.unlink(path)
subprocess.run(["btrfs", "subvolume", "snapshot", os.path.join(mnt, "sv"),
                os.path.join(mnt, "snap")], check=True, stdout=subprocess.DEVNULL)
tfd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
assert ctypes.CDLL(None).syncfs(tfd) == 0
os.close(tfd)
subprocess.run(["cp", "--sparse=always", image, copy], check=True)
for fd in fds:
    os.close(fd)
"""


def test_orphans_shared_with_a_snapshot_are_freed(fuse, butter, workdir):
    """An orphan in a subvolume that has a snapshot sits in tree blocks the snapshot
    shares: butter frees it through the shared-block copy rules (no aborted transaction,
    a clean image), the snapshot keeps its own copy of the tree, and the kernel finds
    nothing left to do. (The kernel cleans the new snapshot's copy itself when it makes
    it.)"""
    crashed = os.path.join(workdir, "crashed.img")
    with kfs.kernel_fs(workdir, name="k") as fs:
        kfs.run(["btrfs", "subvolume", "create", os.path.join(fs.mnt, "sv")])
        for rel in ("victim", "sv/victim"):
            with open(os.path.join(fs.mnt, rel), "wb") as f:
                f.write(payload(rel, 300000))
        fs.sync()
        inos = {rel: os.lstat(os.path.join(fs.mnt, rel)).st_ino for rel in ("victim", "sv/victim")}
        script = os.path.join(workdir, "orphans.py")
        with open(script, "w") as f:
            f.write(KERNEL_ORPHANS_SNAPSHOT)
        kfs.run(["/usr/bin/python3", script, fs.mnt, fs.images[0], crashed], timeout=300)
        fs.release()
    sv, snap = [t for t in subvol_trees(crashed) if t != 5]
    for tree, ino in ((5, inos["victim"]), (sv, inos["sv/victim"])):
        assert orphans(crashed, tree) == [ino], f"tree {tree} (harness)"
    assert orphans(crashed, snap) == [] and not inode_items(crashed, inos["sv/victim"], snap)
    by_butter = copy_image(crashed, os.path.join(workdir, "by-butter.img"))
    with FuseMount(butter.path, [by_butter], os.path.join(workdir, "bclean"),
                   args=["-d"]) as m:
        assert sorted(os.listdir(m.mnt)) == ["snap", "sv"]
        assert m.unmount() == 0
        assert "aborted" not in m.log_text() and "orphan inodes: 2 freed" in \
            m.log_text(), m.log_text()[-3000:]
    oracle.btrfs_check(by_butter)
    assert orphans(by_butter, 5) == []
    assert orphans(by_butter, sv) == [] and not inode_items(by_butter, inos["sv/victim"], sv)
    kernel_cleanup(workdir, by_butter, ["sv", "snap"])
    oracle.btrfs_check(by_butter)
    assert orphans(by_butter, sv) == [] and not inode_items(by_butter, inos["sv/victim"], sv)
