"""Manifests: a tree described stat for stat and byte for byte, and their comparison.

take(root) walks a directory tree without crossing into other mounts (btrfs subvolumes
are not mounts: they are walked) and records, per path relative to root ("." is root):

  type       file, dir, symlink, fifo, chr, blk, sock
  mode       permission bits with setuid, setgid and sticky (S_IMODE)
  uid, gid
  mtime_ns, atime_ns
  xattrs     {name: value bytes}, every namespace (user, trusted, security, system ACLs)
  size, sha256, data      (files) data = [(start, end)] from SEEK_DATA/SEEK_HOLE;
                          sha256 is over per-64 KiB digests (content_digests)
  target     (symlinks)
  rdev       (chr, blk)
  placeholder             (dirs) True for the empty directory the kernel shows where a
                          snapshot holds a subvolume it did not snapshot (btrfs inode 2)
  _dev, _ino              identity, for hard-link groups (never compared directly)

Reading must not change what it reads: every file and directory is opened with O_NOATIME
and lstat comes before any read, so atimes are recorded as they were (readlink cannot
avoid touching a symlink's atime; its lstat comes first). Paths longer than PATH_MAX are
fine: the walk goes through directory file descriptors.

compare(source, extracted) lists every difference, by path and field. The rules:
  1. Every path in the source exists in the extracted tree, with the same type, and no
     other path exists there.
  2. mode, uid, gid, mtime_ns, atime_ns, xattrs are equal for every path; size, content
     for files; target for symlinks; rdev for device nodes. Directory sizes and link
     counts are filesystem-specific and not compared.
  3. Holes: at 4 KiB granularity, the extracted file has data only where the source has
     data (extracted data is a subset of source data); content must be equal anyway.
  4. Hard links: two paths are links of one inode in the extracted tree exactly when
     they are in the source. Source identity is (st_dev, st_ino): each btrfs subvolume
     has its own st_dev, so hard-link groups never span subvolumes.
  5. Subvolume roots are ordinary directories (extract flattens them); placeholder
     directories are compared by type only (the kernel makes up their mode and times).

image_digest(path) is a digest of a sparse image file's size and data: equal digests, an
unchanged image.
"""
import errno
import functools
import hashlib
import os
import stat

from . import kfs

BLOCK = 4096
CHUNK = 64 * 1024                      # content is hashed per chunk (holes unread), see content_digests
BTRFS_EMPTY_SUBVOL_DIR_OBJECTID = 2
BTRFS_FIRST_FREE_OBJECTID = 256

_TYPES = [(stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"), (stat.S_ISLNK, "symlink"),
          (stat.S_ISFIFO, "fifo"), (stat.S_ISCHR, "chr"), (stat.S_ISBLK, "blk"),
          (stat.S_ISSOCK, "sock")]


class Manifest(dict):
    """{relative path: entry dict}, plus where it was taken and on what filesystem."""

    def __init__(self, root, fstype):
        super().__init__()
        self.root = root
        self.fstype = fstype

    def count(self, kind):
        return sum(1 for e in self.values() if e["type"] == kind)


def _type_of(mode):
    for test, name in _TYPES:
        if test(mode):
            return name
    raise ValueError(f"unknown file type {mode:o}")


def _open_noatime(name, flags, dir_fd):
    try:
        return os.open(name, flags | os.O_NOATIME | os.O_NOFOLLOW, dir_fd=dir_fd)
    except PermissionError:                          # O_NOATIME needs ownership or CAP_FOWNER
        return os.open(name, flags | os.O_NOFOLLOW, dir_fd=dir_fd)


def _xattrs(dir_fd, name):
    path = f"/proc/self/fd/{dir_fd}" if name is None else f"/proc/self/fd/{dir_fd}/{name}"
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return {}
        raise
    return {n: os.getxattr(path, n, follow_symlinks=False) for n in sorted(names)}


def data_ranges(fd, size):
    """Return [(start, end)] of the data (not hole) ranges of the open file `fd`."""
    ranges, off = [], 0
    while off < size:
        try:
            start = os.lseek(fd, off, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:
                break
            raise
        if start >= size:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        ranges.append((start, end))
        off = end
    return ranges


def image_digest(path):
    """SHA-256 of the size and the data ranges (SEEK_DATA) of a sparse image file: equal
    digests, the same image (whatever its holes are punched as)."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        h.update(str(size).encode())
        for start, end in data_ranges(fd, size):
            h.update(f"@{start}".encode())
            for off in range(start, end, 8 << 20):
                h.update(os.pread(fd, min(8 << 20, end - off), off))
    finally:
        os.close(fd)
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _zero_digest(n):
    return hashlib.sha256(bytes(n)).digest()


def content_digests(fd, size, data):
    """Return (sha256 hex, [per-chunk digest]) of the open file `fd`.

    The file is cut in CHUNK-sized pieces; a piece that lies wholly in a hole (per
    `data`, its SEEK_DATA ranges) is not read: its digest is that of zeros. The file's
    sha256 is the SHA-256 of the concatenated piece digests, so it depends only on the
    bytes a reader sees, never on where the holes are.
    """
    with_data = set()
    for a, b in data:
        with_data.update(range(a // CHUNK, -(-b // CHUNK)))
    whole = hashlib.sha256()
    chunks = []
    for i in range(-(-size // CHUNK)):
        n = min(CHUNK, size - i * CHUNK)
        if i in with_data:
            buf = os.pread(fd, n, i * CHUNK)
            if len(buf) != n:
                raise OSError(errno.EIO, f"short read: {len(buf)} of {n} bytes at {i * CHUNK}")
            d = hashlib.sha256(buf).digest()
        else:
            d = _zero_digest(n)
        chunks.append(d)
        whole.update(d)
    return whole.hexdigest(), chunks


def _entry(st, kind):
    e = {"type": kind, "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
         "mtime_ns": st.st_mtime_ns, "atime_ns": st.st_atime_ns,
         "_dev": st.st_dev, "_ino": st.st_ino}
    if kind in ("chr", "blk"):
        e["rdev"] = st.st_rdev
    return e


def take(root, contents=True):
    """Return the Manifest of the tree at `root` (see the module comment)."""
    root = os.path.realpath(root)
    fstype = kfs.fstype_at(root)
    m = Manifest(root, fstype)
    other_mounts = set(kfs.mounts_below(root))
    btrfs = fstype == "btrfs"
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOATIME)
    try:
        st = os.fstat(fd)
        e = _entry(st, "dir")
        e["xattrs"] = _xattrs(fd, None)
        m["."] = e
        _walk(m, fd, ".", st, root, other_mounts, btrfs, contents, {})
    finally:
        os.close(fd)
    return m


def _walk(m, dir_fd, rel, dir_st, abspath, other_mounts, btrfs, contents, first_atime):
    for name in sorted(os.listdir(dir_fd)):
        path = name if rel == "." else f"{rel}/{name}"
        if f"{abspath}/{path}" in other_mounts:
            continue
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        kind = _type_of(st.st_mode)
        e = _entry(st, kind)
        if kind != "dir":
            # a hard-linked symlink's atime may have moved when its first name was read
            e["atime_ns"] = first_atime.setdefault((st.st_dev, st.st_ino), st.st_atime_ns)
        e["xattrs"] = _xattrs(dir_fd, name)
        m[path] = e
        if kind == "dir":
            if btrfs and st.st_dev != dir_st.st_dev:
                e["subvol"] = True
                e["placeholder"] = st.st_ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID
            child = _open_noatime(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd)
            try:
                _walk(m, child, path, st, abspath, other_mounts, btrfs, contents, first_atime)
            finally:
                os.close(child)
        elif kind == "file":
            e["size"] = st.st_size
            f = _open_noatime(name, os.O_RDONLY, dir_fd)
            try:
                e["data"] = data_ranges(f, st.st_size)
                if contents:
                    e["sha256"], e["_chunks"] = content_digests(f, st.st_size, e["data"])
            finally:
                os.close(f)
        elif kind == "symlink":
            e["target"] = os.readlink(name, dir_fd=dir_fd)


def subtree(m, path):
    """Return the manifest of the subtree of `m` at `path`, re-rooted at "."."""
    path = path.strip("/")
    if not path or path == ".":
        return m
    out = Manifest(os.path.join(m.root, path), m.fstype)
    for p, e in m.items():
        if p == path:
            out["."] = dict(e, placeholder=False, subvol=False)
        elif p.startswith(path + "/"):
            out[p[len(path) + 1:]] = e
    if "." not in out:
        raise KeyError(f"{path!r} is not in the manifest of {m.root}")
    return out


# ---------------------------------------------------------------------------------
# Comparison

def _ns(v):
    sign = "-" if v < 0 else ""
    s, ns = divmod(abs(v), 10**9)
    return f"{sign}{s}.{ns:09d}"


def _fmt(field, v):
    if field == "mode":
        return f"{v:04o}"
    if field.endswith("_ns"):
        return _ns(v)
    if field == "rdev":
        return f"{os.major(v)}:{os.minor(v)}"
    return repr(v)


def _short(v, n=48):
    r = repr(v)
    return r if len(r) <= n else r[:n] + f"...({len(v)} bytes)"


def _block_intervals(ranges):
    out = []
    for a, b in ranges:
        lo, hi = a // BLOCK, -(-b // BLOCK)
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def hole_violations(src_ranges, dst_ranges):
    """Return the extracted data ranges (bytes, 4 KiB blocks) where the source has a hole."""
    src = _block_intervals(src_ranges)
    bad = []
    for lo, hi in _block_intervals(dst_ranges):
        cur = lo
        for a, b in src:
            if b <= cur or a >= hi:
                continue
            if a > cur:
                bad.append((cur * BLOCK, a * BLOCK))
            cur = max(cur, b)
            if cur >= hi:
                break
        if cur < hi:
            bad.append((cur * BLOCK, hi * BLOCK))
    return bad


def _first_content_difference(s, d):
    for i, (a, b) in enumerate(zip(s.get("_chunks", []), d.get("_chunks", []))):
        if a != b:
            return i * CHUNK
    return min(s["size"], d["size"])


def _link_groups(m, paths):
    groups = {}
    for p in paths:
        e = m[p]
        if e["type"] != "dir":
            groups.setdefault((e["_dev"], e["_ino"]), []).append(p)
    return {p: tuple(sorted(g)) for g in groups.values() for p in g}


def _under_any(path, prefixes):
    return any(path == x or path.startswith(x + "/") for x in prefixes)


def compare(src, dst, exclude=(), check_atime=True):
    """Return every difference between manifests `src` and `dst` as readable lines.

    `exclude` names paths (with everything below them) left out of the comparison.
    """
    diffs = []
    exclude = [p.strip("/") for p in exclude]
    src_paths = {p for p in src if not _under_any(p, exclude)}
    dst_paths = {p for p in dst if not _under_any(p, exclude)}

    reported = []
    for p in sorted(src_paths - dst_paths):
        if _under_any(p, reported):
            continue
        below = sum(1 for q in src_paths - dst_paths if q.startswith(p + "/"))
        more = f" (and {below} entries below it)" if below else ""
        diffs.append(f"{p!r}: missing from the extracted tree ({src[p]['type']}){more}")
        reported.append(p)
    reported = []
    for p in sorted(dst_paths - src_paths):
        if _under_any(p, reported):
            continue
        below = sum(1 for q in dst_paths - src_paths if q.startswith(p + "/"))
        more = f" (and {below} entries below it)" if below else ""
        diffs.append(f"{p!r}: in the extracted tree but not in the source ({dst[p]['type']}){more}")
        reported.append(p)

    common = sorted(src_paths & dst_paths)
    for p in common:
        s, d = src[p], dst[p]
        if s["type"] != d["type"]:
            diffs.append(f"{p!r}: type: source={s['type']} extracted={d['type']}")
            continue
        if s.get("placeholder"):
            continue
        fields = ["mode", "uid", "gid", "mtime_ns"] + (["atime_ns"] if check_atime else [])
        fields += {"file": ["size"], "symlink": ["target"], "chr": ["rdev"],
                   "blk": ["rdev"]}.get(s["type"], [])
        for f in fields:
            if s[f] != d[f]:
                diffs.append(f"{p!r}: {f}: source={_fmt(f, s[f])} extracted={_fmt(f, d[f])}")
        if s["type"] == "file":
            if "sha256" in s and "sha256" in d and s["sha256"] != d["sha256"]:
                at = _first_content_difference(s, d)
                diffs.append(f"{p!r}: content: differs (first in the 64 KiB chunk at offset "
                             f"{at}; sha256 source={s['sha256'][:16]}... "
                             f"extracted={d['sha256'][:16]}...)")
            bad = hole_violations(s["data"], d["data"])
            if bad:
                shown = ", ".join(f"[{a}, {b})" for a, b in bad[:4])
                diffs.append(f"{p!r}: holes: the extracted file has data where the source has "
                             f"a hole: {shown}{' ...' if len(bad) > 4 else ''} "
                             f"(source data: {s['data'][:6]})")
        if s["xattrs"] != d["xattrs"]:
            sx, dx = s["xattrs"], d["xattrs"]
            parts = []
            for n in sorted(set(sx) - set(dx)):
                parts.append(f"missing {n}")
            for n in sorted(set(dx) - set(sx)):
                parts.append(f"unexpected {n}={_short(dx[n])}")
            for n in sorted(set(sx) & set(dx)):
                if sx[n] != dx[n]:
                    parts.append(f"{n}: source={_short(sx[n])} extracted={_short(dx[n])}")
            diffs.append(f"{p!r}: xattrs: " + "; ".join(parts))

    sg, dg = _link_groups(src, common), _link_groups(dst, common)
    for p in common:
        if p in sg and p in dg and sg[p] != dg[p] and src[p]["type"] == dst[p]["type"]:
            others_s = [q for q in sg[p] if q != p]
            others_d = [q for q in dg[p] if q != p]
            diffs.append(f"{p!r}: hard links: in the source it is one inode with {others_s}, "
                         f"extracted with {others_d}")
    return diffs


def assert_same(src, dst, exclude=(), check_atime=True, limit=40):
    """Raise AssertionError listing the first `limit` differences, if there are any."""
    diffs = compare(src, dst, exclude=exclude, check_atime=check_atime)
    if diffs:
        head = (f"{len(diffs)} difference(s) between the source tree (as the kernel showed "
                f"it, {src.root}) and the extracted tree ({dst.root}); first {min(limit, len(diffs))}:")
        raise AssertionError("\n".join([head] + ["  " + x for x in diffs[:limit]]))
