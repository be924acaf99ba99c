"""Tree log replay: butter opens read-write what the kernel left after fsync and a crash.

Each case makes its crashed image with the kernel (the oracle, nothing written by us):
mkfs, mount with commit=300 so no transaction commits on its own, a committed setup
(`btrfs filesystem sync`), then writes, renames, unlinks, xattrs... and fsync/O_SYNC.
Right after the last fsync returned, the image file is copied while still mounted: the
copy holds the log and a superblock pointing at it, exactly what a power cut leaves.

The expected state is what the kernel shows after replaying a second copy itself (a
mount); the fsynced facts each case names are checked there too (a sanity check of the
case, not of butter). Then butter opens the crashed image read-write (setting the label
it already has: the open replays the log and commits), and
  1. btrfs check --readonly is clean and the superblock has no log root any more;
  2. the kernel mounts butter's result and shows exactly the expected manifest;
  3. the kernel writes, renames and deletes there, and btrfs check stays clean;
  4. butter writes again (mkdir) and btrfs check stays clean.
Cases butter must refuse are opened read-write and must fail with a clear message,
leaving the image unchanged.

Runtime: about 1 s per case on this 2-core machine (two mounts of kernel copies, three
btrfs checks); the whole file (48 cases) about 50 s. More random seeds:
scripts/logreplay-soak.sh (LOG_REPLAY_SEEDS=a-b).
"""
import errno
import os
import random
import shutil

import pytest

from butter_it import kfs, manifest, oracle

IMAGE_SIZE = 1 << 30
LABEL = "logreplay"


# ---------------------------------------------------------------------------------
# Making crashed images

def _copy(src, dst):
    kfs.run(["cp", "--sparse=always", src, dst])


def make_crashed(workdir, case, attempts=3):
    """Run `case` on a fresh kernel filesystem; return the crashed image's path.

    The kernel may commit the whole transaction instead of logging (its own choice, e.g.
    when something else commits at that moment): then the case is run again, and skipped
    (not failed: it says nothing about butter) if the kernel never leaves a log."""
    base = os.path.join(workdir, "base.img")
    crashed = os.path.join(workdir, "crashed.img")
    for _ in range(attempts):
        with open(base, "wb") as f:
            f.truncate(IMAGE_SIZE)
        kfs.run(["mkfs.btrfs", "-q", "-f", "-L", LABEL] + list(case.mkfs) + [base])
        mnt = os.path.join(workdir, "mnt")
        with oracle.kernel_mount(base, mnt=mnt, opts=["commit=300"] + list(case.mount)):
            case.setup(mnt)
            kfs.run(["btrfs", "filesystem", "sync", mnt])
            case.crash(mnt)
            _copy(base, crashed)                       # the power cut
        os.unlink(base)
        if int(kfs.super_fields(crashed)["log_root"]) != 0:
            return crashed
    pytest.skip(f"the kernel committed instead of leaving a tree log, {attempts} times")


def _fsync(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path, data, offset=None, fsync=True, flags=0, mode=0o644):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, mode)
    try:
        if offset is None:
            os.write(fd, data)
        else:
            os.pwrite(fd, data, offset)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _rand(seed, n):
    return random.Random(seed).randbytes(n)


def _text(seed, n):
    rng = random.Random(seed)
    words = [bytes(rng.choices(b"abcdefghij", k=rng.randint(2, 8))) for _ in range(50)]
    out = b" ".join(rng.choice(words) for _ in range(n // 3 + 1))
    return out[:n]


class Case:
    def __init__(self, name, setup, crash, expect=None, mkfs=(), mount=()):
        self.name, self.setup, self.crash = name, setup, crash
        self.expect = expect or {}
        self.mkfs, self.mount = mkfs, mount

    def __repr__(self):
        return self.name


CASES = []


def case(name, expect=None, mkfs=(), mount=()):
    def deco(fn):
        def setup(m):
            fn(m, "setup")

        def crash(m):
            fn(m, "crash")
        CASES.append(Case(name, setup, crash, expect, mkfs, mount))
        return fn
    return deco


# ---------------------------------------------------------------------------------
# Hand-written cases: each fn(m, phase) does the committed setup, then the crash part

@case("new_file", {"d/a": _rand(1, 100000)})
def _(m, phase):
    if phase == "setup":
        os.mkdir(f"{m}/d")
    else:
        _write(f"{m}/d/a", _rand(1, 100000))


@case("append_inline_xattr", {"f": b"hello\nmore"})
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/f", b"hello\n", fsync=False)
    else:
        os.setxattr(f"{m}/f", "user.a", b"v1")
        _write(f"{m}/f", b"more", flags=os.O_APPEND)


@case("overwrite_middle", {"big": _rand(2, 1 << 20)[:300000] + _rand(3, 8192) +
                           _rand(2, 1 << 20)[308192:]})
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/big", _rand(2, 1 << 20), fsync=False)
        _write(f"{m}/other", _rand(4, 50000), fsync=False)
    else:
        _write(f"{m}/other", b"not fsynced", offset=0, fsync=False)
        _write(f"{m}/big", _rand(3, 8192), offset=300000)


@case("truncate_shrink", {"f": _rand(5, 1 << 20)[:5000]})
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/f", _rand(5, 1 << 20), fsync=False)
    else:
        os.truncate(f"{m}/f", 5000)
        _fsync(f"{m}/f")


@case("truncate_grow", {"f": _rand(6, 70000) + bytes((2 << 20) - 70000)})
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/f", _rand(6, 70000), fsync=False)
    else:
        os.truncate(f"{m}/f", 2 << 20)
        _fsync(f"{m}/f")


@case("prealloc_keep_size", {"f": _rand(7, 40000) + _rand(8, 4096)})
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/f", _rand(7, 40000), fsync=False)
    else:
        _fallocate(f"{m}/f", 1, 40000, 1 << 20)     # FALLOC_FL_KEEP_SIZE
        _write(f"{m}/f", _rand(8, 4096), offset=40000)
        _write(f"{m}/f", _rand(8, 4096), offset=40000)  # the first fsync may commit


@case("prealloc_no_holes_off", {"f": _rand(9, 12288) + bytes(200000 - 12288) + b"x" * 100 +
                                bytes(300000 - 100)},
      mkfs=["-O", "^no-holes"])
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/f", _rand(9, 12288), fsync=False)
    else:
        _fallocate(f"{m}/f", 0, 100000, 400000)
        _fsync(f"{m}/f")                           # (may commit)
        _write(f"{m}/f", b"x" * 100, offset=200000)
        _write(f"{m}/f", _rand(9, 12288), offset=0)


@case("punch_hole", {"f": _rand(10, 1 << 20)[:131072] + bytes(65536) +
                     _rand(10, 1 << 20)[196608:]})
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/f", _rand(10, 1 << 20), fsync=False)
    else:
        _fallocate(f"{m}/f", 3, 131072, 65536)      # PUNCH_HOLE | KEEP_SIZE
        _fsync(f"{m}/f")


@case("xattr_changes")
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/f", b"x", fsync=False)
        os.setxattr(f"{m}/f", "user.a", b"1")
        os.setxattr(f"{m}/f", "user.b", b"2" * 300)
    else:
        os.removexattr(f"{m}/f", "user.a")
        os.setxattr(f"{m}/f", "user.b", b"3")
        os.setxattr(f"{m}/f", "user.c", b"4" * 1000)
        _fsync(f"{m}/f")


@case("hard_link_added")
def _(m, phase):
    if phase == "setup":
        os.mkdir(f"{m}/d")
        _write(f"{m}/f", _rand(11, 5000), fsync=False)
    else:
        os.link(f"{m}/f", f"{m}/d/g")
        _fsync(f"{m}/f")


@case("hard_link_removed", {"g": None})
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/f", _rand(12, 5000), fsync=False)
        os.link(f"{m}/f", f"{m}/g")
    else:
        os.unlink(f"{m}/g")
        _fsync(f"{m}/f")


@case("rename_file_across", {"d1/a": None, "d2/b": _rand(13, 3000) + b"more"})
def _(m, phase):
    if phase == "setup":
        os.mkdir(f"{m}/d1")
        os.mkdir(f"{m}/d2")
        _write(f"{m}/d1/a", _rand(13, 3000), fsync=False)
        _write(f"{m}/d1/c", _rand(13, 3000), fsync=False)
    else:
        os.rename(f"{m}/d1/a", f"{m}/d2/b")
        _fsync(f"{m}/d2/b")                        # (may commit)
        os.rename(f"{m}/d1/c", f"{m}/d2/c")
        _write(f"{m}/d2/b", b"more", flags=os.O_APPEND)
        _fsync(f"{m}/d2", directory=True)


@case("rename_over_existing", {"a": None, "b": _rand(14, 9000)})
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/a", _rand(14, 9000), fsync=False)
        _write(f"{m}/b", _rand(15, 20000), fsync=False)
    else:
        os.rename(f"{m}/a", f"{m}/b")
        _fsync(f"{m}/b")


@case("new_dir_fsynced", {"n/x": b"x" * 10, "n/y": _rand(16, 70000)})
def _(m, phase):
    if phase == "crash":
        os.mkdir(f"{m}/n")
        _write(f"{m}/n/x", b"x" * 10)
        _write(f"{m}/n/y", _rand(16, 70000))
        os.symlink("x", f"{m}/n/link")
        os.mkfifo(f"{m}/n/fifo")
        _fsync(f"{m}/n", directory=True)


@case("unlink_then_fsync_dir", {"d/b": None})
def _(m, phase):
    if phase == "setup":
        os.mkdir(f"{m}/d")
        for n in "abc":
            _write(f"{m}/d/{n}", n.encode() * 100, fsync=False)
    else:
        os.unlink(f"{m}/d/b")
        _write(f"{m}/d/e", b"e" * 5000)
        _fsync(f"{m}/d", directory=True)


@case("rmdir_tree_fsync_parent", {"d/sub": None})
def _(m, phase):
    if phase == "setup":
        os.makedirs(f"{m}/d/sub/deeper")
        _write(f"{m}/d/sub/file", _rand(17, 10000), fsync=False)
        _write(f"{m}/d/sub/deeper/f2", b"z", fsync=False)
        _write(f"{m}/d/keep", b"k", fsync=False)
    else:
        shutil.rmtree(f"{m}/d/sub")
        _fsync(f"{m}/d", directory=True)


@case("unlinked_open_file", {"a": None, "b": b"b" * 5000})
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/old", _rand(33, 9000), fsync=False)
    else:
        _write(f"{m}/a", _rand(34, 70000), fsync=False)
        for name in ("a", "old"):                  # a new inode and a committed one
            fd = os.open(f"{m}/{name}", os.O_RDWR)
            os.unlink(f"{m}/{name}")
            os.pwrite(fd, b"late", 100)
            os.fsync(fd)                           # logged with no links
            os.close(fd)
        _write(f"{m}/b", b"b" * 5000)


@case("o_sync_writes", {"s": _rand(18, 4096 * 7)})
def _(m, phase):
    if phase == "crash":
        fd = os.open(f"{m}/s", os.O_WRONLY | os.O_CREAT | os.O_SYNC, 0o600)
        data = _rand(18, 4096 * 7)
        for i in range(7):
            os.pwrite(fd, data[i * 4096:(i + 1) * 4096], i * 4096)
        os.close(fd)


@case("attributes_changed")
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/f", b"attrs", fsync=False)
    else:
        os.chmod(f"{m}/f", 0o4751)
        os.chown(f"{m}/f", 1234, 5678)
        os.utime(f"{m}/f", ns=(1_000_000_123, 2_000_000_456))
        _fsync(f"{m}/f")


@case("many_files_one_dir")
def _(m, phase):
    if phase == "setup":
        os.mkdir(f"{m}/many")
        for i in range(50):
            _write(f"{m}/many/old{i:03}", b"o" * i, fsync=False)
    else:
        for i in range(0, 50, 3):
            os.unlink(f"{m}/many/old{i:03}")
        for i in range(400):
            _write(f"{m}/many/file-with-a-longer-name-{i:04}", _rand(i, 100 + i * 7), fsync=False)
        _fsync(f"{m}/many", directory=True)
        _fsync(f"{m}/many/file-with-a-longer-name-0399")


@case("small_nodes_deep_log", mkfs=["-n", "4096"])
def _(m, phase):
    if phase == "setup":
        os.mkdir(f"{m}/d")
        for i in range(100):
            _write(f"{m}/d/old{i:03}", _rand(i, 1000), fsync=False)
    else:                                          # a log tree of several levels
        for i in range(0, 100, 2):
            os.rename(f"{m}/d/old{i:03}", f"{m}/d/renamed-{i:03}-" + "r" * 100)
        for i in range(300):
            _write(f"{m}/d/new-{i:04}-" + "n" * 100, _rand(i + 1000, 5000), fsync=False)
            os.setxattr(f"{m}/d/new-{i:04}-" + "n" * 100, "user.k", b"v" * 200)
        _fsync(f"{m}/d", directory=True)
        _write(f"{m}/d/big", _rand(39, 3 << 20))


@case("large_file", {"L": _rand(19, 24 << 20)})
def _(m, phase):
    if phase == "setup":
        # data chunks made now: a new chunk in the crashed transaction forces a commit
        _fallocate(f"{m}/ballast", 0, 0, 40 << 20)
    else:
        _write(f"{m}/L", _rand(19, 24 << 20))


@case("many_links_extrefs")
def _(m, phase):
    name = lambda i: f"{m}/d/{i:03}-" + "n" * 240   # noqa: E731
    if phase == "setup":
        os.mkdir(f"{m}/d")
        _write(f"{m}/d/target", b"t" * 3000, fsync=False)
        for i in range(90):                        # past one ref item: extrefs
            os.link(f"{m}/d/target", name(i))
    else:
        # (new or removed names of such an inode make the kernel commit instead)
        _write(f"{m}/d/target", b"u", offset=0)


@case("fsync_twice")
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/f", _rand(20, 200000), fsync=False)
    else:
        _write(f"{m}/f", _rand(21, 50000), offset=10000)
        _write(f"{m}/f", _rand(22, 4096), offset=300000)
        os.truncate(f"{m}/f", 250000)
        _fsync(f"{m}/f")


@case("reflink", {"copy": _rand(23, 300000)})
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/orig", _rand(23, 300000), fsync=False)
    else:
        kfs.run(["cp", "--reflink=always", f"{m}/orig", f"{m}/copy"])
        _fsync(f"{m}/copy")


@case("rename_dir_fsync_inside")
def _(m, phase):
    if phase == "setup":
        os.makedirs(f"{m}/a/sub")
        os.mkdir(f"{m}/b")
    else:
        os.rename(f"{m}/a/sub", f"{m}/b/sub")
        _write(f"{m}/b/sub/f", _rand(24, 5000))


@case("compressed_zstd", {"c": _text(25, 600000)}, mount=["compress=zstd"])
def _(m, phase):
    if phase == "setup":
        _write(f"{m}/c0", _text(26, 300000), fsync=False)
    else:
        _write(f"{m}/c", _text(25, 600000))
        _write(f"{m}/c0", _text(27, 9000), offset=4096)


@case("compressed_zlib", {"c": _text(28, 400000)}, mount=["compress-force=zlib"])
def _(m, phase):
    if phase == "crash":
        _write(f"{m}/c", _text(28, 400000))


@case("compressed_lzo", {"c": _text(29, 300000)}, mount=["compress=lzo"])
def _(m, phase):
    if phase == "crash":
        _write(f"{m}/c", _text(29, 300000))


@case("subvolumes", {"sv1/f": _rand(30, 70000), "sv2/deep/g": _rand(31, 5000)})
def _(m, phase):
    if phase == "setup":
        kfs.run(["btrfs", "subvolume", "create", f"{m}/sv1"])
        kfs.run(["btrfs", "subvolume", "create", f"{m}/sv2"])
        os.mkdir(f"{m}/sv2/deep")
        _write(f"{m}/sv1/old", b"old", fsync=False)
    else:
        _write(f"{m}/sv1/f", _rand(30, 70000))
        os.unlink(f"{m}/sv1/old")
        _write(f"{m}/sv2/deep/g", _rand(31, 5000))
        _write(f"{m}/top", b"top")


@case("snapshot_shares_blocks", {"sv/f": _rand(35, 1 << 20)[:200000] + _rand(36, 4096) +
                                 _rand(35, 1 << 20)[204096:]})
def _(m, phase):
    if phase == "setup":
        kfs.run(["btrfs", "subvolume", "create", f"{m}/sv"])
        _write(f"{m}/sv/f", _rand(35, 1 << 20), fsync=False)
        for i in range(200):                       # a subvolume tree of several leaves
            _write(f"{m}/sv/small{i:03}", _rand(i, 300), fsync=False)
        kfs.run(["btrfs", "subvolume", "snapshot", f"{m}/sv", f"{m}/snap"])
    else:
        _write(f"{m}/sv/f", _rand(36, 4096), offset=200000)
        os.unlink(f"{m}/sv/small007")
        _fsync(f"{m}/sv", directory=True)


@case("subvolume_deleted_after_fsync", {"gone/f": _rand(37, 20000), "kept": b"k" * 3000})
def _(m, phase):
    if phase == "setup":
        kfs.run(["btrfs", "subvolume", "create", f"{m}/gone"])
        _write(f"{m}/gone/f", b"g", fsync=False)
    else:
        _write(f"{m}/gone/f", _rand(37, 20000))     # a log tree for that subvolume
        kfs.run(["btrfs", "subvolume", "delete", f"{m}/gone"])  # not committed: it stays
        _write(f"{m}/kept", b"k" * 3000)


@case("dir_holding_subvolume_fsynced", {"d/old": None})
def _(m, phase):
    if phase == "setup":
        os.mkdir(f"{m}/d")
        kfs.run(["btrfs", "subvolume", "create", f"{m}/d/sv"])
        _write(f"{m}/d/sv/inside", b"i", fsync=False)
        _write(f"{m}/d/old", b"o", fsync=False)
    else:
        os.unlink(f"{m}/d/old")
        _write(f"{m}/d/new", b"n" * 100, fsync=False)
        _fsync(f"{m}/d", directory=True)


@case("no_free_space_tree", {"f": _rand(32, 90000)}, mkfs=["-R", "^free-space-tree"],
      mount=["space_cache=v1"])
def _(m, phase):
    if phase == "crash":
        _write(f"{m}/f", _rand(32, 90000))


def _fallocate(path, mode, offset, length):
    import ctypes
    import ctypes.util
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if libc.fallocate(fd, mode, ctypes.c_long(offset), ctypes.c_long(length)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------
# Seeded random cases: a committed tree, then a random mix of changes and fsyncs

def _random_case(seed):
    def run(m, phase):
        rng = random.Random(f"{seed}-{phase}")
        if phase == "setup" and seed % 4 == 0:      # changes in two subvolumes: two logs
            kfs.run(["btrfs", "subvolume", "create", f"{m}/sv"])
        files = sorted(p for p in _all(m) if os.path.isfile(p) and not os.path.islink(p))
        dirs = sorted([m] + [p for p in _all(m) if os.path.isdir(p)])
        steps = 25 if phase == "setup" else 18
        for step in range(steps):
            op = rng.choice(["create", "create", "write", "mkdir", "link", "unlink", "rename",
                             "truncate", "xattr", "fsync", "fsync", "fsync_dir", "symlink",
                             "rename_dir", "rmdir", "falloc", "punch", "attrs", "rename_over",
                             "unxattr"])
            tag = f"{seed}-{phase}-{step}"
            try:
                if op == "create" or (op in ("write", "link", "unlink", "truncate", "xattr",
                                             "fsync", "rename", "falloc", "punch", "attrs",
                                             "rename_over", "unxattr") and not files):
                    p = os.path.join(rng.choice(dirs), f"f{tag}")
                    _write(p, _rand(rng.random(), rng.choice([10, 3000, 5000, 70000, 300000])),
                           fsync=phase == "crash" and rng.random() < 0.5)
                    files.append(p)
                elif op == "write":
                    p = rng.choice(files)
                    _write(p, _rand(rng.random(), rng.choice([100, 4096, 20000])),
                           offset=rng.randrange(0, 200000), fsync=rng.random() < 0.5)
                elif op == "mkdir":
                    p = os.path.join(rng.choice(dirs), f"d{tag}")
                    os.mkdir(p)
                    dirs.append(p)
                elif op == "link":
                    p = os.path.join(rng.choice(dirs), f"l{tag}")
                    os.link(rng.choice(files), p)
                    files.append(p)
                elif op == "unlink":
                    p = rng.choice(files)
                    os.unlink(p)
                    files.remove(p)
                elif op == "rename":
                    p = rng.choice(files)
                    q = os.path.join(rng.choice(dirs), f"r{tag}")
                    os.rename(p, q)
                    files[files.index(p)] = q
                    if rng.random() < 0.5:
                        _fsync(q)
                elif op == "rename_over":
                    p, q = rng.choice(files), rng.choice(files)
                    if p != q and os.stat(p).st_ino != os.stat(q).st_ino:
                        os.rename(p, q)
                        files.remove(p)
                        if rng.random() < 0.5:
                            _fsync(q)
                elif op == "rename_dir":
                    d = rng.choice(dirs)
                    to = rng.choice(dirs)
                    if d not in (m, f"{m}/sv") and not (to + "/").startswith(d + "/"):
                        q = os.path.join(to, f"rd{tag}")
                        os.rename(d, q)
                        dirs = [q + x[len(d):] if (x + "/").startswith(d + "/") else x
                                for x in dirs]
                        files = [q + x[len(d):] if x.startswith(d + "/") else x for x in files]
                        if rng.random() < 0.5:
                            _fsync(q, directory=True)
                elif op == "rmdir":
                    d = rng.choice(dirs)
                    if d not in (m, f"{m}/sv") and not os.listdir(d):
                        os.rmdir(d)
                        dirs.remove(d)
                elif op == "truncate":
                    p = rng.choice(files)
                    os.truncate(p, rng.randrange(0, 400000))
                    if rng.random() < 0.6:
                        _fsync(p)
                elif op == "falloc":
                    p = rng.choice(files)
                    _fallocate(p, rng.choice([0, 1]), rng.randrange(0, 300000) // 4096 * 4096,
                               rng.choice([4096, 65536, 200000]))
                elif op == "punch":
                    p = rng.choice(files)
                    _fallocate(p, 3, rng.randrange(0, 300000), rng.choice([1000, 8192, 100000]))
                elif op == "attrs":
                    p = rng.choice(files)
                    os.chmod(p, rng.choice([0o600, 0o755, 0o2644]))
                    os.utime(p, ns=(rng.randrange(2**40), rng.randrange(2**40)))
                elif op == "xattr":
                    p = rng.choice(files)
                    os.setxattr(p, f"user.x{rng.randrange(3)}", _rand(rng.random(), 50))
                elif op == "unxattr":
                    os.removexattr(rng.choice(files), f"user.x{rng.randrange(3)}")
                elif op == "fsync":
                    _fsync(rng.choice(files))
                elif op == "fsync_dir":
                    _fsync(rng.choice(dirs), directory=True)
                elif op == "symlink":
                    p = os.path.join(rng.choice(dirs), f"s{tag}")
                    os.symlink("t" * rng.randrange(1, 300), p)
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.EEXIST, errno.ENODATA, errno.ENOTEMPTY,
                                   errno.EXDEV):
                    raise
        if phase == "crash":
            # one last fsync so that a log exists even when an earlier one committed
            # (the last one again: a change before may have made the kernel commit)
            for name in (f"last-{seed}", f"last2-{seed}"):
                _write(os.path.join(m, name), _rand(seed, 5000))
    mount = [["compress=zstd"], ["compress=lzo"], ["compress-force=zlib"], [], [], []][seed % 6]
    mkfs = ["-O", "^no-holes"] if seed % 5 == 0 else []
    return Case(f"random_{seed}", lambda m: run(m, "setup"), lambda m: run(m, "crash"),
                mkfs=mkfs, mount=mount)


def _seeds():
    """Seeds of the random cases: LOG_REPLAY_SEEDS="a-b" (soaks), else 1-12."""
    spec = os.environ.get("LOG_REPLAY_SEEDS", "1-12")
    lo, _, hi = spec.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def _all(m):
    out = []
    for root, ds, fs in os.walk(m):
        out += [os.path.join(root, d) for d in ds] + [os.path.join(root, f) for f in fs]
    return out


RANDOM_CASES = [_random_case(seed) for seed in _seeds()]


# ---------------------------------------------------------------------------------
# The test

def _kernel_expected(workdir, crashed, c):
    kimg = os.path.join(workdir, "kernel.img")
    _copy(crashed, kimg)
    with oracle.kernel_mount(kimg, mnt=os.path.join(workdir, "kmnt"), opts=()) as mnt:
        expected = manifest.take(mnt)
        for rel, want in c.expect.items():
            path = os.path.join(mnt, rel)
            if want is None:
                assert not os.path.lexists(path), f"kernel replay: {rel} should be gone"
            else:
                with open(path, "rb") as f:
                    assert f.read() == want, f"kernel replay: {rel} lacks its fsynced content"
    os.unlink(kimg)
    return expected


def _kernel_writes(mnt):
    _write(f"{mnt}/after-replay", _rand(99, 200000))
    os.mkdir(f"{mnt}/after-dir")
    for rel in sorted(os.listdir(mnt)):
        p = os.path.join(mnt, rel)
        if os.path.isfile(p) and not os.path.islink(p) and rel != "after-replay":
            os.rename(p, os.path.join(mnt, "after-dir", rel))
            break
    kfs.run(["btrfs", "filesystem", "sync", mnt])


@pytest.mark.parametrize("c", CASES + RANDOM_CASES, ids=repr)
def test_log_replay(kernel, butter, workdir, c):
    crashed = make_crashed(workdir, c)
    expected = _kernel_expected(workdir, crashed, c)

    r = butter.run(["filesystem", "label", crashed, LABEL], check=False)
    assert r.returncode == 0, f"butter refused or failed the replay:\n{r.stderr[-3000:]}"
    sb = kfs.super_fields(crashed)
    assert int(sb["log_root"]) == 0 and int(sb["log_root_level"]) == 0
    oracle.btrfs_check(crashed)

    with oracle.kernel_mount(crashed, mnt=os.path.join(workdir, "bmnt"), opts=()) as mnt:
        got = manifest.take(mnt)
        manifest.assert_same(expected, got)
        _kernel_writes(mnt)
    oracle.btrfs_check(crashed)
    butter.run(["mkdir", crashed, "/made-by-butter-after"])
    oracle.btrfs_check(crashed)


# ---------------------------------------------------------------------------------
# What butter must refuse (never replay wrongly): the open fails, the image is unchanged

def test_log_replay_refused_leaves_image(kernel, butter, workdir):
    """A log butter cannot replay (mixed block groups): refused, image untouched."""
    c = Case("mixed", lambda m: _write(f"{m}/a", b"a", fsync=False),
             lambda m: _write(f"{m}/b", _rand(38, 9000)), mkfs=["-M"])
    crashed = make_crashed(workdir, c)
    before = kfs.run(["sha256sum", crashed]).stdout.split()[0]
    r = butter.run(["filesystem", "label", crashed, "changed"], check=False)
    assert r.returncode != 0
    assert "cannot replay the tree log: mixed block groups" in r.stderr
    assert kfs.run(["sha256sum", crashed]).stdout.split()[0] == before
    # the kernel still can
    with oracle.kernel_mount(crashed, mnt=os.path.join(workdir, "kmnt"), opts=()) as mnt:
        with open(f"{mnt}/b", "rb") as f:
            assert f.read() == _rand(38, 9000)


def test_log_replay_read_only_open_leaves_log(kernel, butter, workdir):
    crashed = make_crashed(workdir, CASES[0])
    before = open(crashed, "rb").read(1 << 20)
    r = butter.run(["ls", crashed, "/"])
    assert "tree log" in r.stderr
    assert open(crashed, "rb").read(1 << 20) == before
    assert int(kfs.super_fields(crashed)["log_root"]) != 0
