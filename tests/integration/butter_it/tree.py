"""The tree generator: fills a mounted btrfs with everything the read path must read.

populate(root, seed, scale) is deterministic for a given seed and scale: the same names,
sizes, contents, modes, owners, xattrs and explicit timestamps every time (times the
kernel sets itself, ctime and the mtimes of files changed late, are whatever they are:
the manifest records them from the mount). Scale "small" (CI) keeps a tree to ~45 MiB
and a few seconds; "large" adds big files, a 10k-entry directory and more of the rest.

What it makes, by top-level directory:
  sizes/     files at and around the inline limit (2 KiB), 4 KiB and 64/128 KiB
             boundaries, random (incompressible) and text (compressible) content
  big/       a file of tens of MiB mixing random and text MiBs
  sparse/    holes at the start, middle, end; data beyond a hole; truncate-extended and
             truncate-shrunk files; an inline extent followed by a far write; explicit
             zeros; a file that is one hole
  prealloc/  fallocate'd ranges (read as zeros), partly written prealloc, prealloc past
             EOF (FALLOC_FL_KEEP_SIZE), punched holes, zeroed ranges
  meta/      user/trusted/security xattrs (many, long, empty, binary, long names),
             POSIX ACLs (access and default, and inherited ones)
  links/     symlinks (relative, absolute, dangling, to a dir, ~1000-byte target,
             Unicode), hard links across directories, a hard-linked symlink and fifo,
             100 long-named links in one directory (INODE_EXTREF)
  special/   fifos, char and block device nodes (small and large major:minor), a socket
  names/     Unicode, control characters, invalid UTF-8, 255-byte names
  deep/      a 50-level path
  modes/     setuid, setgid, sticky, 0000, 7777; arbitrary uids and gids; edge timestamps
  cow/       reflinked copies (cp --reflink=always, FICLONERANGE, also within one file),
             partial overwrites after a commit (extents split and referenced at an
             offset, also inside compressed extents), appends, many small rewrites
  many/      a directory of several hundred entries (10 000 at scale "large")
  nodatacow  a file with chattr +C (no data checksums)
  sv1 ...    subvolumes: sv1 with nested subvolumes sv1/nested and sv1/nested/deeper,
             dir_a/sv_in_dir, sv_empty; a cross-subvolume reflink; snapshots in snaps/:
             read-only and writable, of the top level (showing placeholder directories
             for the subvolumes it does not contain), of a snapshot; files changed
             after each snapshot (overwritten, appended, truncated, deleted, renamed,
             chmod, xattr changed, a hard link removed)
"""
import ctypes
import errno
import fcntl
import functools
import hashlib
import os
import random
import stat
import struct

from . import env, kfs

KiB = 1 << 10
MiB = 1 << 20

SIZES = [0, 1, 2, 100, 1000, 2047, 2048, 2049, 3000, 4095, 4096, 4097, 8191, 8192, 8193,
         12288, 65535, 65536, 65537, 131071, 131072, 131073, 1048575, 1048576, 1048577,
         3 * MiB + 5]
FILE_MODES = [0o644, 0o600, 0o755, 0o000, 0o4755, 0o2755, 0o6711, 0o1644, 0o7777, 0o444,
              0o640, 0o777, 0o2644]
DIR_MODES = [0o755, 0o700, 0o1777, 0o2775, 0o555, 0o000, 0o3777, 0o751]
OWNERS = [(0, 0), (1000, 1000), (65534, 65534), (123456, 654321), (2**31 - 1, 2**31 + 5),
          (4294967294, 4294967294), (1, 0)]
SPECIAL_TIMES = [
    (0, 0),
    (1, 999_999_999),
    (-1_234_567_890 * 10**9 + 123_456_789, -5 * 10**9),   # before 1970
    (4_102_444_800 * 10**9 + 999_999_999, 4_102_444_800 * 10**9 + 1),  # year 2100
    (1_600_000_000 * 10**9, 1_500_000_000 * 10**9 + 500),  # atime after mtime
]

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10
FICLONERANGE = 0x4020940D

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def fallocate(fd, mode, offset, length):
    """Call fallocate(2) with `mode` flags (os.posix_fallocate has no flags)."""
    if _libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"fallocate(mode={mode:#x}, {offset}, {length}): {os.strerror(e)}")


def syncfs(path):
    """Commit the filesystem holding `path` (syncfs(2): only that one, unlike sync)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc.syncfs(fd) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"syncfs({path}): {os.strerror(e)}")
    finally:
        os.close(fd)


def walk_files(root):
    """Yield (path relative to `root`, bytes) of every file below `root`, one at a time
    (os.walk's file names: symlinks to files are read through)."""
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                yield os.path.relpath(path, root), f.read()


def read_tree(root):
    """Return {relative path: bytes} of every regular file below `root`."""
    return dict(walk_files(root))


def read_file(path):
    """Return the bytes of the file at `path`."""
    with open(path, "rb") as f:
        return f.read()


def clone_range(src_fd, src_off, length, dst_fd, dst_off):
    """Share `length` bytes of src at src_off into dst at dst_off (FICLONERANGE)."""
    fcntl.ioctl(dst_fd, FICLONERANGE, struct.pack("=qQQQ", src_fd, src_off, length, dst_off))


class Content:
    """Deterministic file contents: random (SHAKE-128 stream) or compressible text."""

    POOL = 1 * MiB

    def __init__(self, seed):
        self.seed = seed
        rng = random.Random(f"text-pool-{seed}")
        letters = "etaoinshrdlucmfwypvbgkqjxz"
        words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(600)]
        picked = rng.choices(words, k=self.POOL // 4)
        lines = [" ".join(picked[i:i + 10]) for i in range(0, len(picked), 10)]
        self.pool = "\n".join(lines).encode()[:self.POOL + 128 * KiB]

    @classmethod
    @functools.lru_cache(maxsize=8)
    def of(cls, seed):
        """Return the (shared) Content of `seed`: its text pool takes a while to make."""
        return cls(seed)

    def random(self, label, index, length):
        return hashlib.shake_128(os.fsencode(f"{self.seed}/{label}/{index}")).digest(length)

    def text(self, label, index, length):
        key = int.from_bytes(hashlib.blake2b(os.fsencode(f"{self.seed}/{label}/{index}"),
                                             digest_size=8).digest(), "little")
        off = key % self.POOL
        header = os.fsencode(f"<{label} block {index}>\n")
        return (header + self.pool[off:off + length])[:length]

    def chunks(self, label, size, kind, chunk=MiB):
        """Yield the bytes of a `size`-byte file of `kind`, one chunk at a time."""
        for i, pos in enumerate(range(0, size, chunk)):
            n = min(chunk, size - pos)
            if kind == "random":
                yield self.random(label, i, n)
            elif kind == "text":
                yield self.text(label, i, n)
            elif kind == "zeros":
                yield bytes(n)
            elif kind == "mixed":
                yield (self.random if i % 2 == 0 else self.text)(label, i, n)
            else:
                raise ValueError(kind)

    def bytes(self, label, size, kind):
        return b"".join(self.chunks(label, size, kind))


class Gen:
    """One run of the generator over one mounted filesystem."""

    def __init__(self, root, seed=1, scale="small"):
        self.root = os.path.realpath(root)
        self.seed = seed
        self.scale = scale
        self.large = scale == "large"
        self.rng = random.Random(seed)
        self.content = Content.of(seed)
        self.dirs = ["."]                # directories to stamp with times at the end
        self.dir_times = {}              # ... with these times rather than random ones
        self.subvolumes = []             # relative paths of subvolumes and snapshots made

    # -- small helpers ---------------------------------------------------------------

    def p(self, rel):
        return os.path.join(self.root, rel)

    def times(self):
        if self.rng.random() < 0.15:
            return self.rng.choice(SPECIAL_TIMES)
        a = self.rng.randrange(0, 2**31) * 10**9 + self.rng.randrange(10**9)
        m = self.rng.randrange(0, 2**31) * 10**9 + self.rng.randrange(10**9)
        return a, m

    def stamp(self, rel, times=None):
        os.utime(self.p(rel), ns=times or self.times(), follow_symlinks=False)

    def mkdir(self, rel, mode=None, owner=None):
        implicit, parent = [], os.path.dirname(rel)
        while parent and not os.path.isdir(self.p(parent)):
            implicit.append(parent)
            parent = os.path.dirname(parent)
        os.makedirs(self.p(rel), exist_ok=True)
        self.dirs.append(rel)
        for made in implicit:
            # made on the way by makedirs: stamped too, else its times are the clock's and
            # differ between two runs of the same workload; a fixed time, so the random
            # sequence (and every tree made from it) stays as it was
            self.dirs.append(made)
            self.dir_times.setdefault(made, (1_234_567_890_123_456_789, 987_654_321_000_000_001))
        if owner:
            os.lchown(self.p(rel), *owner)
        if mode is not None:
            os.chmod(self.p(rel), mode)

    def attrs(self, rel, mode=None, owner=None, xattrs=None, times=True):
        """Set owner, then mode (chown clears setuid), xattrs, then the timestamps."""
        path = self.p(rel)
        if owner is None and self.rng.random() < 0.3:
            owner = self.rng.choice(OWNERS)
        if owner:
            os.lchown(path, *owner)
        if mode is None and self.rng.random() < 0.3:
            mode = self.rng.choice(FILE_MODES)
        if mode is not None and not os.path.islink(path):
            os.chmod(path, mode)
        for name, value in (xattrs or {}).items():
            os.setxattr(path, name, value, follow_symlinks=False)
        if times:
            self.stamp(rel, times if isinstance(times, tuple) else None)

    def write(self, rel, size=0, kind="random", label=None, **attrs):
        """Create file `rel` of `size` bytes of `kind` content; set its attributes."""
        fd = os.open(self.p(rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for chunk in self.content.chunks(label or rel, size, kind):
                os.write(fd, chunk)
        finally:
            os.close(fd)
        self.attrs(rel, **attrs)

    def pwrite(self, rel, offset, data):
        fd = os.open(self.p(rel), os.O_WRONLY)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)

    def truncate(self, rel, size):
        os.truncate(self.p(rel), size)

    def sync(self):
        syncfs(self.root)                 # on btrfs: commits the transaction

    def btrfs(self, *args):
        kfs.run(["btrfs"] + list(args))

    def setfacl(self, rel, *args):
        kfs.run(["setfacl"] + list(args) + [self.p(rel)])

    # -- the sections ----------------------------------------------------------------

    def sizes(self, top="sizes", extra=()):
        self.mkdir(top)
        sizes = SIZES + list(extra)
        if self.large:
            sizes += [16 * MiB - 1, 33 * MiB + 7] + [self.rng.randrange(0, 600 * KiB)
                                                    for _ in range(150)]
        for size in sizes:
            for kind in ("random", "text"):
                rel = f"{top}/{kind}-{size}"
                if not os.path.exists(self.p(rel)):
                    self.write(rel, size, kind)

    def big(self):
        self.mkdir("big")
        self.write("big/mixed", 24 * MiB + 12345, "mixed", mode=0o644)
        if self.large:
            self.write("big/random", 64 * MiB + 1, "random", mode=0o644)
            self.write("big/text", 96 * MiB - 1, "text", mode=0o644)

    def sparse(self):
        c = self.content
        self.mkdir("sparse")
        # hole at the start: data only in the last 256 KiB of 1 MiB
        self.write("sparse/hole-start", 0, times=False)
        self.pwrite("sparse/hole-start", 768 * KiB, c.random("hs", 0, 256 * KiB))
        self.attrs("sparse/hole-start")
        # hole in the middle
        self.write("sparse/hole-middle", 64 * KiB, "random", times=False)
        self.pwrite("sparse/hole-middle", 960 * KiB + 7, c.text("hm", 0, 64 * KiB))
        self.attrs("sparse/hole-middle")
        # hole at the end: truncate-extended
        self.write("sparse/hole-end", 64 * KiB + 3, "random", times=False)
        self.truncate("sparse/hole-end", 5 * MiB + 1)
        self.attrs("sparse/hole-end")
        # data far beyond a hole, at an unaligned offset
        self.write("sparse/data-beyond-hole", 0, times=False)
        self.pwrite("sparse/data-beyond-hole", 10 * MiB + 123, c.random("dbh", 0, 5000))
        self.attrs("sparse/data-beyond-hole")
        # nothing but a hole
        self.write("sparse/all-hole", 0, times=False)
        self.truncate("sparse/all-hole", 7 * MiB + 4095)
        self.attrs("sparse/all-hole")
        # islands of data at random places in 8 MiB
        self.write("sparse/islands", 0, times=False)
        for i in range(12):
            off = self.rng.randrange(0, 8 * MiB)
            n = self.rng.choice([1, 100, 4096, 5000, 65536, 200000])
            self.pwrite("sparse/islands", off, c.random("isl", i, n))
        self.truncate("sparse/islands", 8 * MiB + 77)
        self.attrs("sparse/islands")
        # shrunk in the middle of an extent, after a commit
        self.write("sparse/shrunk", 1 * MiB, "random", times=False)
        self.sync()
        self.truncate("sparse/shrunk", 300001)
        self.attrs("sparse/shrunk")
        # an inline extent, then a write far away (and one truncated up)
        self.write("sparse/inline-then-far", 100, "text", times=False)
        self.sync()
        self.pwrite("sparse/inline-then-far", 64 * KiB, b"far away")
        self.attrs("sparse/inline-then-far")
        self.write("sparse/inline-then-truncated-up", 1500, "random", times=False)
        self.sync()
        self.truncate("sparse/inline-then-truncated-up", 200 * KiB)
        self.attrs("sparse/inline-then-truncated-up")
        # explicit zeros are data, not holes
        self.write("sparse/written-zeros", 256 * KiB, "zeros")

    def prealloc(self):
        c = self.content
        self.mkdir("prealloc")

        def with_fd(rel, fn):
            fd = os.open(self.p(rel), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fn(fd)
            finally:
                os.close(fd)
        with_fd("prealloc/whole", lambda fd: os.posix_fallocate(fd, 0, 1 * MiB))
        self.attrs("prealloc/whole")

        def partly(fd):
            os.posix_fallocate(fd, 0, 2 * MiB)
            os.pwrite(fd, c.random("pp", 0, 256 * KiB), 512 * KiB)
            os.pwrite(fd, b"x" * 10, 2 * MiB - 10)
        with_fd("prealloc/partly-written", partly)
        self.attrs("prealloc/partly-written")

        def past_eof(fd):
            os.write(fd, c.random("pe", 0, 10000))
            fallocate(fd, FALLOC_FL_KEEP_SIZE, 1 * MiB, 1 * MiB)
        with_fd("prealloc/past-eof", past_eof)
        self.attrs("prealloc/past-eof")

        def into_hole(fd):
            os.pwrite(fd, c.random("ih", 0, 64 * KiB), 0)
            os.pwrite(fd, c.random("ih", 1, 64 * KiB), 1 * MiB)
            fallocate(fd, 0, 256 * KiB, 256 * KiB)
        with_fd("prealloc/into-hole", into_hole)
        self.attrs("prealloc/into-hole")

        def punched(fd):
            os.write(fd, c.random("pu", 0, 1 * MiB))
            os.fsync(fd)
            fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 64 * KiB, 128 * KiB)
            fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1 * MiB - 4 * KiB, 4 * KiB)
        with_fd("prealloc/punched", punched)
        self.attrs("prealloc/punched")

        def zeroed(fd):
            os.write(fd, c.text("zr", 0, 512 * KiB))
            os.fsync(fd)
            fallocate(fd, FALLOC_FL_ZERO_RANGE, 100 * KiB, 200 * KiB)
        with_fd("prealloc/zero-range", zeroed)
        self.attrs("prealloc/zero-range")

    def meta(self):
        c = self.content
        self.mkdir("meta")
        many = {f"user.k{i:02d}": c.random("xa", i, self.rng.randrange(0, 41)) for i in range(30)}
        self.write("meta/xattr-many", 10, "text", xattrs=many)
        self.write("meta/xattr-long", 5000, "random",
                   xattrs={"user.long": c.random("xl", 0, 2000), "user.empty": b"",
                           "user." + "n" * 250: b"v", "user.binary": b"\x00\x01\xff\x00"})
        self.write("meta/xattr-security", 0,
                   xattrs={"security.butter": b"label\x00x", "trusted.butter": b"tv",
                           "user.utf8": "värde ✓".encode()})
        self.mkdir("meta/xattr-dir")
        os.setxattr(self.p("meta/xattr-dir"), "user.dirattr", b"on a directory")
        os.setxattr(self.p("meta/xattr-dir"), "trusted.t", c.random("xd", 0, 300))
        self.write("meta/acl-file", 123, "text", times=False)
        self.setfacl("meta/acl-file", "-m", "u:1234:rwx,g:5678:r-x,u:0:r,m::rwx")
        self.attrs("meta/acl-file", mode=None, owner=(1000, 1000))
        self.mkdir("meta/acl-dir")
        self.setfacl("meta/acl-dir", "-m", "u:1000:rx,g:1001:rwx")
        self.setfacl("meta/acl-dir", "-d", "-m", "u:1000:rwx,g:1001:rx,o::-")
        self.write("meta/acl-dir/inherited", 50, "text", mode=None, owner=(0, 0))
        self.mkdir("meta/acl-dir/subdir-inherits")
        self.write("meta/acl-dir/subdir-inherits/file", 4097, "random", owner=(0, 0))
        self.write("meta/acl-and-xattrs", 3000, "text", times=False,
                   xattrs={"user.a": b"1", "security.s": b"2"})
        self.setfacl("meta/acl-and-xattrs", "-m", "g:42:r")
        self.attrs("meta/acl-and-xattrs", owner=(0, 0))

    def links(self):
        self.mkdir("links")
        self.mkdir("links/sub1")
        self.mkdir("links/sub2/deeper")
        self.write("links/target-file", 3000, "text")
        targets = {
            "rel": "target-file", "up": "../sizes/random-100", "abs": "/etc/passwd",
            "dangling": "does/not/exist", "to-dir": "../sizes", "self-loop": "self-loop",
            "unicode": "ファイル/ünïcödé", "dot": ".", "spaces": "a b  c",
            "long": "/".join(f"component{i:03d}" for i in range(84))[:1000],
        }
        for name, target in targets.items():
            os.symlink(target, self.p(f"links/{name}"))
            owner = self.rng.choice(OWNERS) if self.rng.random() < 0.5 else None
            self.attrs(f"links/{name}", owner=owner)
        os.setxattr(self.p("links/rel"), "trusted.on-symlink", b"yes", follow_symlinks=False)
        os.setxattr(self.p("links/rel"), "security.on-symlink", b"s", follow_symlinks=False)
        self.stamp("links/rel")
        # hard links across directories
        self.write("links/hl-a", 70000, "random", times=False)
        for other in ["links/hl-b", "links/sub1/hl-c", "links/sub2/deeper/hl-d", "sizes/hl-e"]:
            os.link(self.p("links/hl-a"), self.p(other))
        self.attrs("links/hl-a", xattrs={"user.shared": b"one inode"})
        # a hard-linked symlink and fifo, an empty hard-linked file
        os.link(self.p("links/dangling"), self.p("links/sub1/dangling-link"),
                follow_symlinks=False)
        os.mkfifo(self.p("links/fifo"))
        os.link(self.p("links/fifo"), self.p("links/sub2/fifo-link"))
        self.attrs("links/fifo")
        self.write("links/empty-linked", 0)
        os.link(self.p("links/empty-linked"), self.p("links/sub1/empty-linked-2"))
        # many long-named links in one directory: INODE_REF overflows into INODE_EXTREF
        self.mkdir("links/extref")
        self.write("links/extref/base", 4096, "random", times=False)
        for i in range(100):
            try:
                os.link(self.p("links/extref/base"), self.p(f"links/extref/{i:03d}-" + "L" * 196))
            except OSError as e:
                if e.errno != errno.EMLINK:       # without the extref feature: the limit
                    raise
                break
        self.attrs("links/extref/base")
        # a linked file that loses a name
        self.write("links/was-linked", 10, "text")
        os.link(self.p("links/was-linked"), self.p("links/sub1/was-linked-2"))
        os.unlink(self.p("links/sub1/was-linked-2"))

    def special(self):
        self.mkdir("special")
        nodes = [("fifo", stat.S_IFIFO, 0), ("chr-null", stat.S_IFCHR, os.makedev(1, 3)),
                 ("chr-big", stat.S_IFCHR, os.makedev(4095, 1048575)),
                 ("blk-loop", stat.S_IFBLK, os.makedev(7, 123)),
                 ("blk-big", stat.S_IFBLK, os.makedev(259, 70000)),
                 ("sock", stat.S_IFSOCK, 0)]
        for name, kind, dev in nodes:
            os.mknod(self.p(f"special/{name}"), kind | 0o640, dev)
            self.attrs(f"special/{name}")
        os.setxattr(self.p("special/chr-null"), "security.dev", b"x")
        os.setxattr(self.p("special/fifo"), "trusted.fifo", b"y")
        self.stamp("special/fifo")
        self.stamp("special/chr-null")

    def names(self):
        self.mkdir("names")
        names = ["café", "naïve-ñ", "日本語のファイル名", "Ελληνικά", "🦀🚀", "a\u0301-combining",
                 "zero\u200bwidth", "name with spaces", " leading-space", "trailing-space ",
                 "-dash", "new\nline", "tab\there", "back\\slash", "quote\"'", "*?[glob]",
                 "A", "a", ".hidden", "..dots", "...", "%s%n", "\x01ctrl",
                 os.fsdecode(b"bad-utf8-\xff\xfe"), os.fsdecode(b"\xc3\x28-invalid"),
                 "n" * 255, "日" * 85, "x" * 253 + "é"]
        for i, name in enumerate(names):
            self.write(f"names/{name}", i * 37, "text")
        self.mkdir("names/" + "d" * 255)
        self.write("names/" + "d" * 255 + "/" + "f" * 255, 5, "text")
        self.mkdir("names/目录")
        self.write("names/目录/файл", 4096, "random")

    def deep(self, levels=50):
        rel = "deep"
        self.mkdir(rel)
        for i in range(levels):
            rel += f"/level-{i:02d}"
            self.mkdir(rel)
            if i % 10 == 9:
                self.write(f"{rel}/file-at-{i}", i * 100, "text")
        self.write(f"{rel}/bottom", 4097, "random")
        os.symlink("../" * levels, self.p(f"{rel}/to-top"))

    def modes(self):
        self.mkdir("modes")
        for mode in FILE_MODES:
            self.write(f"modes/file-{mode:04o}", 10, "text", mode=mode, owner=(0, 0))
        for i, (uid, gid) in enumerate(OWNERS):
            self.write(f"modes/owner-{uid}-{gid}", 5, "text", owner=(uid, gid), mode=0o640)
            self.write(f"modes/setid-owner-{uid}-{gid}", 5, "text", owner=(uid, gid), mode=0o6755)
        for mode in DIR_MODES:
            rel = f"modes/dir-{mode:04o}"
            self.mkdir(rel, mode=mode, owner=self.rng.choice(OWNERS))
            self.write(f"{rel}/inside", 3, "text")
        for i, times in enumerate(SPECIAL_TIMES):
            self.write(f"modes/time-{i}", 1, "text", times=times)
            os.symlink("time-target", self.p(f"modes/time-symlink-{i}"))
            self.stamp(f"modes/time-symlink-{i}", times)
            self.mkdir(f"modes/time-dir-{i}")
            self.dir_times[f"modes/time-dir-{i}"] = times

    def cow(self):
        c = self.content
        self.mkdir("cow")
        self.write("cow/orig", 3 * MiB, "random", times=False)
        self.write("cow/text-orig", 2 * MiB, "text", times=False)
        self.write("cow/rewritten", 1 * MiB, "random", times=False)
        self.write("cow/appended", 5000, "text", times=False)
        self.sync()
        for src, dst in [("cow/orig", "cow/reflink"), ("cow/text-orig", "cow/text-reflink")]:
            kfs.run(["cp", "--reflink=always", self.p(src), self.p(dst)])
        # overwrite the middle of a reflinked copy and of a (possibly compressed) original
        self.pwrite("cow/reflink", 1 * MiB + 5, c.random("ow", 0, 10000))
        self.pwrite("cow/text-orig", 700 * KiB + 100, c.random("ow", 1, 4096))
        self.pwrite("cow/text-reflink", 128 * KiB, c.text("ow", 2, 128 * KiB))
        # clone ranges: into another file at another offset, and within one file
        src = os.open(self.p("cow/orig"), os.O_RDONLY)
        tsrc = os.open(self.p("cow/text-orig"), os.O_RDONLY)
        dst = os.open(self.p("cow/cloned"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.write(dst, c.random("cl", 0, 64 * KiB))
            clone_range(src, 512 * KiB, 1 * MiB, dst, 2 * MiB)
            clone_range(tsrc, 256 * KiB, 384 * KiB, dst, 4 * MiB)
            clone_range(dst, 2 * MiB, 128 * KiB, dst, 6 * MiB)
            os.pwrite(dst, b"tail", 6 * MiB + 128 * KiB + 5)
        finally:
            for fd in (src, tsrc, dst):
                os.close(fd)
        self.sync()
        # many small rewrites, some after commits: extents referenced at many offsets
        for i in range(24):
            off = self.rng.randrange(0, 1 * MiB)
            self.pwrite("cow/rewritten", off, c.random("rw", i, self.rng.randrange(1, 20000)))
            if i % 8 == 7:
                self.sync()
        fd = os.open(self.p("cow/appended"), os.O_WRONLY | os.O_APPEND)
        os.write(fd, c.text("ap", 0, 3000))
        os.close(fd)
        for rel in ["cow/orig", "cow/text-orig", "cow/rewritten", "cow/appended", "cow/reflink",
                    "cow/text-reflink", "cow/cloned"]:
            self.attrs(rel)

    def many(self, rel="many", n=None):
        n = n if n is not None else (10000 if self.large else 400)
        populate_many(self.root, rel, n, self.seed)
        self.dirs.append(rel)

    def nodatacow(self):
        self.write("nodatacow", 0, times=False)
        kfs.run(["chattr", "+C", self.p("nodatacow")], check=False)
        fd = os.open(self.p("nodatacow"), os.O_WRONLY)
        for chunk in self.content.chunks("nodatacow", 300 * KiB + 3, "random"):
            os.write(fd, chunk)
        os.close(fd)
        self.attrs("nodatacow")

    def subvolume(self, rel, mode=None, owner=None):
        self.btrfs("subvolume", "create", self.p(rel))
        self.subvolumes.append(rel)
        self.dirs.append(rel)
        if owner:
            os.lchown(self.p(rel), *owner)
        if mode is not None:
            os.chmod(self.p(rel), mode)

    def snapshot(self, src, dst, readonly):
        self.btrfs("subvolume", "snapshot", *(["-r"] if readonly else []), self.p(src), self.p(dst))
        self.subvolumes.append(dst)

    def subvolumes_and_snapshots(self):
        c = self.content
        self.subvolume("sv1")
        for size in [0, 100, 4096, 70000, 1 * MiB + 3]:
            self.write(f"sv1/file-{size}", size, "mixed")
        self.write("sv1/overwrite-me", 1 * MiB, "random")
        self.write("sv1/append-me", 3000, "text")
        self.write("sv1/truncate-me", 200 * KiB, "random")
        self.write("sv1/delete-me", 50, "text")
        self.write("sv1/rename-me", 60, "text")
        self.write("sv1/linked", 7000, "random")
        os.link(self.p("sv1/linked"), self.p("sv1/linked-2"))
        self.mkdir("sv1/dir")
        self.write("sv1/dir/xattr", 10, "text", xattrs={"user.v": b"before"})
        os.symlink("../file-100", self.p("sv1/dir/symlink"))
        self.write("sv1/sparse", 0, times=False)
        self.pwrite("sv1/sparse", 3 * MiB, b"end")
        self.attrs("sv1/sparse")
        kfs.run(["cp", "--reflink=always", self.p("cow/orig"), self.p("sv1/reflink-from-top")])
        self.subvolume("sv1/nested", mode=0o750, owner=(1000, 1000))
        self.write("sv1/nested/file", 5000, "text")
        self.subvolume("sv1/nested/deeper")
        self.write("sv1/nested/deeper/file", 10, "random")
        self.mkdir("dir_a")
        self.subvolume("dir_a/sv_in_dir")
        self.write("dir_a/sv_in_dir/file", 4096, "random")
        self.subvolume("sv_empty", mode=0o1777, owner=(123456, 654321))
        self.sync()

        self.mkdir("snaps")
        self.snapshot("sv1", "snaps/sv1-ro", readonly=True)
        self.snapshot("sv1", "snaps/sv1-rw", readonly=False)
        self.snapshot(".", "snaps/top-ro", readonly=True)

        # change sv1 after its snapshots
        self.pwrite("sv1/overwrite-me", 300 * KiB + 1, c.random("after", 0, 5000))
        fd = os.open(self.p("sv1/append-me"), os.O_WRONLY | os.O_APPEND)
        os.write(fd, c.random("after", 1, 70000))
        os.close(fd)
        self.truncate("sv1/truncate-me", 10 * KiB + 1)
        os.unlink(self.p("sv1/delete-me"))
        os.rename(self.p("sv1/rename-me"), self.p("sv1/dir/renamed"))
        os.chmod(self.p("sv1/file-100"), 0o600)
        os.setxattr(self.p("sv1/dir/xattr"), "user.v", b"after")
        os.unlink(self.p("sv1/linked-2"))
        self.write("sv1/new-after-snapshot", 9000, "text")
        # and the writable snapshot differently
        self.pwrite("snaps/sv1-rw/file-1048579", 0, c.random("rw-snap", 0, 4096))
        os.link(self.p("snaps/sv1-rw/file-100"), self.p("snaps/sv1-rw/dir/link-in-snap"))
        self.write("snaps/sv1-rw/new-in-snapshot", 1234, "random")
        self.snapshot("snaps/sv1-rw", "snaps/sv1-rw-ro", readonly=True)
        # and top-level files after the top-level snapshot
        self.pwrite("cow/orig", 0, c.random("after-top", 0, 8192))
        self.truncate("sizes/random-4097", 4096)
        os.unlink(self.p("sizes/text-100"))
        self.write("after-top-snapshot", 100, "text")

    def stamp_dirs(self):
        """Give every directory made here explicit times, deepest first."""
        for rel in sorted(set(self.dirs), key=lambda r: (-r.count("/"), r)):
            try:
                self.stamp(rel, self.dir_times.get(rel))
            except OSError as e:
                if e.errno not in (errno.EROFS, errno.ENOENT):
                    raise

    def run_all(self, subvolumes=True):
        self.sizes()
        self.big()
        self.sparse()
        self.prealloc()
        self.meta()
        self.links()
        self.special()
        self.names()
        self.deep(100 if self.large else 50)
        self.modes()
        self.cow()
        self.many()
        self.nodatacow()
        if subvolumes:
            self.subvolumes_and_snapshots()
        self.stamp_dirs()
        self.sync()


def populate(root, seed=1, scale=None, subvolumes=True):
    """Fill the mounted btrfs at `root` with the full tree; return the Gen (its record)."""
    gen = Gen(root, seed, scale or env.SCALE)
    gen.run_all(subvolumes=subvolumes)
    return gen


def small_tree(root, seed=3):
    """Fill `root` with a small tree of every kind of entry (about 5 MiB); return the Gen.
    Any directory will do (the host's too): no subvolume, no ioctl."""
    gen = Gen(root, seed)
    c = gen.content
    for size in [0, 1, 100, 2047, 2048, 2049, 4095, 4096, 4097, 70000, 3 * MiB + 5]:
        gen.write(f"size-{size}", size, "random")
    gen.mkdir("dir/sub", mode=0o750, owner=(1000, 1001))
    gen.write("dir/sub/text", 300 * KiB + 1, "text", xattrs={"user.k": b"v", "trusted.t": b"x"})
    gen.write("dir/sparse", 0, times=False)
    gen.pwrite("dir/sparse", 1 * MiB + 100, c.random("sp", 0, 5000))
    gen.truncate("dir/sparse", 3 * MiB)
    gen.attrs("dir/sparse")
    os.symlink("sub/text", gen.p("dir/link"))
    gen.stamp("dir/link")
    os.link(gen.p("size-4097"), gen.p("dir/hard"))
    os.mkfifo(gen.p("dir/fifo"))
    gen.attrs("dir/fifo")
    os.mknod(gen.p("dir/chr"), stat.S_IFCHR | 0o600, os.makedev(4, 64))
    gen.attrs("dir/chr")
    gen.stamp_dirs()
    return gen


def populate_many(root, rel, n, seed=1):
    """Make directory `rel` with `n` entries: mostly empty and tiny files, some others."""
    rng = random.Random(f"many-{seed}-{n}")
    path = os.path.join(root, rel)
    os.makedirs(path, exist_ok=True)
    for i in range(n):
        name = f"entry-{i:05d}" + "-x" * rng.randrange(0, 40)
        r = rng.random()
        full = os.path.join(path, name)
        if r < 0.9:
            with open(full, "wb") as f:
                if r < 0.5:
                    f.write(name.encode())
        elif r < 0.95:
            os.symlink(name, full)
        else:
            os.mkdir(full)
        os.utime(full, ns=(rng.randrange(2**40), rng.randrange(2**40)), follow_symlinks=False)


def populate_long_path(root, rel, depth=40, name_len=120):
    """Make a chain of directories whose full path is longer than PATH_MAX (4096).

    Works through directory file descriptors, as nothing else can address it.
    """
    os.makedirs(os.path.join(root, rel), exist_ok=True)
    fd = os.open(os.path.join(root, rel), os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(depth):
            name = f"{i:03d}-" + "p" * (name_len - 4)
            os.mkdir(name, dir_fd=fd)
            nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
            if i % 8 == 0:
                f = os.open(f"file-{i}", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
                os.write(f, hashlib.shake_128(str(i).encode()).digest(5000 + i))
                os.close(f)
        os.symlink("/".join([".."] * depth), "up", dir_fd=fd)
        f = os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(f, b"the bottom of a path longer than PATH_MAX\n")
        os.close(f)
        os.utime("bottom", ns=(1, 2), dir_fd=fd)
    finally:
        os.close(fd)


def write_big_file(path, size, seed=1):
    """Write a `size`-byte file of alternating random and text MiBs, with holes."""
    content = Content.of(seed)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i, pos in enumerate(range(0, size, MiB)):
            n = min(MiB, size - pos)
            if i % 17 == 16:
                continue                   # leave a 1 MiB hole
            kind = content.random if i % 2 == 0 else content.text
            os.pwrite(fd, kind("big", i, n), pos)
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def copy_tree_standin(src, dst):
    """Copy a mounted tree to `dst` with cp -a: the stand-in extractor of the self-test."""
    kfs.run(["cp", "-a", "--sparse=always", src, dst], timeout=600)
    if not os.path.isdir(dst):
        raise RuntimeError(f"cp -a made no {dst}")
    return dst

