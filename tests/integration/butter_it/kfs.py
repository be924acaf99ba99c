"""Kernel-made btrfs images: image files, loop devices, mkfs, mount, and cleanup.

A KernelFs is N sparse image files that mkfs.btrfs made into one filesystem, attached
to loop devices and mounted by the kernel (always with noatime, so reading the source
tree never changes its atimes). The usual life of one:

    with kfs.kernel_fs(workdir, ndevices=4, mkfs_args=["-d", "raid1", "-m", "raid1"],
                       mount_opts=["compress=zstd"]) as fs:
        tree.populate(fs.mnt)            # the kernel writes the tree
        src = manifest.take(fs.mnt)      # what the kernel shows
        fs.release()                     # unmount, detach: the images are final
        ... run butter on fs.images ...

Invariants:
  1. Every mount and loop device made here is recorded in a registry until it is
     undone; kernel_fs() undoes its own in `finally`, and cleanup_all() (called at the
     end of the session, at exit and on SIGTERM) undoes whatever is left.
  2. Work directories are named butter-it-<pid>-...; reap_stale() undoes the mounts and
     loop devices of work directories whose process is gone (a crashed earlier run) and
     never touches those of a live process (a concurrent run).
  3. Loop devices are detached only by name, never all at once (no `losetup -D`).

Mapping file data to bytes on the images (for the corruption tests): fiemap() gives a
file's extents in btrfs logical addresses; ChunkMap (parsed from `btrfs inspect-internal
dump-tree -t chunk`) maps a logical address to (devid, physical offset) for every copy
of every profile; KernelFs.devids() maps devids to image files. Callers verify a
mapping by comparing the bytes found there with the bytes they expect before changing
them, so a wrong mapping is an error of the test, never a silent pass.

Other pieces: attached() (image files on loop devices for the life of a `with`; the
oracle's kernel_mount and multi-device btrfs check use it), readonly_view() (a read-only,
noatime bind mount of a host directory), make_image() / mkfs_image() (an empty btrfs in
a sparse file, no mount), super_fields() (dump-super as a dict), file_sha256(), and
crc32c() for checksums recomputed after an edit of on-disk bytes. Judging an image
(btrfs check, the kernel's view of it) is butter_it.oracle's.
"""
import array
import contextlib
import dataclasses
import fcntl
import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

from . import env

MiB = 1 << 20
GiB = 1 << 30
DEFAULT_DEVICE_SIZE = 2 * GiB          # sparse: costs only what is written
WORKDIR_PREFIX = "butter-it-"

_live_mounts = []                      # mount points mounted here, not yet unmounted
_live_loops = []                       # loop devices attached here, not yet detached


class CommandError(RuntimeError):
    """A command the harness ran failed; the message holds the command and its output."""


def run(cmd, *, timeout=300, check=True, input=None):
    """Run `cmd` (a list), capture its output as text, and return the CompletedProcess.

    Raises CommandError when check is set and the exit status is not 0, and
    subprocess.TimeoutExpired (after killing the command) when it runs too long.
    """
    cmd = [os.fspath(c) for c in cmd]
    proc = subprocess.run(cmd, input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout)
    proc.stdout = proc.stdout.decode("utf-8", "surrogateescape")
    proc.stderr = proc.stderr.decode("utf-8", "surrogateescape")
    if check and proc.returncode != 0:
        raise CommandError(f"command failed with exit status {proc.returncode}: "
                           f"{' '.join(cmd)}\nstdout: {proc.stdout[-2000:]}\n"
                           f"stderr: {proc.stderr[-2000:]}")
    return proc


# ---------------------------------------------------------------------------------
# Work directories and the leak guard

def make_workdir(tag):
    """Create and return a fresh work directory named after this process and `tag`."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", tag)[:80]
    os.makedirs(env.TMPDIR, exist_ok=True)
    path = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-{safe}-", dir=env.TMPDIR)
    return os.path.realpath(path)


def remove_workdir(path):
    """Unmount and detach whatever of ours is still below `path`, then delete it.

    Refuses (and says so on stderr) to delete a directory that still has a mount below
    it, so that a failed unmount can never turn into deleting a filesystem's contents.
    """
    path = os.path.realpath(path)
    for mnt in mounts_below(path):
        umount(mnt)
    for dev in [d for d in _live_loops if _loop_backing_file(d).startswith(path + "/")]:
        loop_detach(dev)
    if env.KEEP:
        print(f"BUTTER_KEEP=1: kept {path}", file=sys.stderr)
        return
    left = mounts_below(path)
    if left:
        print(f"not removing {path}: still mounted: {left}", file=sys.stderr)
        return
    run(["rm", "-rf", "--one-file-system", path], check=False, timeout=1800)


def _unescape_mountinfo(field):
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_table():
    """Return [(mount point, fstype)] from /proc/self/mountinfo, in mount order."""
    table = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            table.append((_unescape_mountinfo(fields[4]), fields[sep + 1]))
    return table


def mounts_below(path):
    """Return the mount points strictly below `path`, deepest first."""
    path = os.path.realpath(path)
    found = []
    for mnt, _ in mount_table():
        if mnt.startswith(path + "/"):
            found.append(mnt)
    return sorted(set(found), key=len, reverse=True)


def fstype_at(path):
    """Return the type of the filesystem holding `path` (the innermost mount)."""
    path = os.path.realpath(path)
    best, best_type = "", None
    for mnt, fstype in mount_table():
        if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, best_type = mnt, fstype
    return best_type


def _loop_backing_file(dev):
    name = os.path.basename(dev)
    try:
        with open(f"/sys/block/{name}/loop/backing_file") as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale_owner(path):
    """Return True if `path` lies in a work directory of a process that is gone."""
    m = re.search(r"/" + re.escape(WORKDIR_PREFIX) + r"(\d+)-", path)
    return bool(m) and path.startswith(env.TMPDIR + "/") and not _pid_alive(int(m.group(1)))


def reap_stale():
    """Undo mounts and loop devices left by earlier runs that died (invariant 2)."""
    if not all(shutil.which(t) for t in ("umount", "losetup", "btrfs")):
        return                                     # the tests will skip (or fail) anyway
    for mnt, _ in reversed(mount_table()):
        if _stale_owner(mnt):
            print(f"reaping stale mount {mnt}", file=sys.stderr)
            run(["umount", "-l", mnt], check=False)
    for name in sorted(os.listdir("/sys/block")):
        if name.startswith("loop"):
            backing = _loop_backing_file(name)
            if backing and _stale_owner(backing):
                print(f"reaping stale loop device /dev/{name} ({backing})", file=sys.stderr)
                run(["btrfs", "device", "scan", "--forget", f"/dev/{name}"], check=False)
                run(["losetup", "-d", f"/dev/{name}"], check=False)


def cleanup_all():
    """Unmount and detach everything still recorded in the registry (invariant 1)."""
    for mnt in list(reversed(_live_mounts)):
        try:
            umount(mnt)
        except Exception as e:                       # keep going: detach the rest
            print(f"cleanup: {e}", file=sys.stderr)
    for dev in list(reversed(_live_loops)):
        try:
            loop_detach(dev)
        except Exception as e:
            print(f"cleanup: {e}", file=sys.stderr)


# ---------------------------------------------------------------------------------
# Loop devices and mounts

def loop_attach(image):
    """Attach `image` to a free loop device and return the device's path."""
    dev = run(["losetup", "-f", "--show", image], timeout=60).stdout.strip()
    if not dev.startswith("/dev/loop"):
        raise CommandError(f"losetup printed {dev!r} for {image}")
    _live_loops.append(dev)
    return dev


def loop_detach(dev):
    """Make the kernel forget btrfs on `dev`, then detach the loop device."""
    run(["btrfs", "device", "scan", "--forget", dev], check=False, timeout=60)
    for attempt in range(20):
        proc = run(["losetup", "-d", dev], check=False, timeout=60)
        if proc.returncode == 0 or not _loop_backing_file(dev):
            break
        time.sleep(0.25)
    else:
        raise CommandError(f"losetup -d {dev} kept failing: {proc.stderr.strip()}")
    while dev in _live_loops:
        _live_loops.remove(dev)


def mount(dev, mnt, opts):
    """Mount btrfs on `dev` at `mnt` with the options list `opts` (noatime is added)."""
    os.makedirs(mnt, exist_ok=True)
    options = ",".join(["noatime"] + [o for o in opts if o != "noatime"])
    run(["mount", "-t", "btrfs", "-o", options, dev, mnt], timeout=120)
    _live_mounts.append(os.path.realpath(mnt))


def umount(mnt):
    """Unmount `mnt`, retrying while it is busy, lazily as the last resort."""
    mnt = os.path.realpath(mnt)
    for attempt in range(20):
        if mnt not in [m for m, _ in mount_table()]:
            break
        proc = run(["umount", mnt], check=False, timeout=300)
        if proc.returncode == 0:
            break
        time.sleep(0.25)
    else:
        run(["umount", "-l", mnt], check=False, timeout=60)
        print(f"{mnt} was busy; unmounted lazily", file=sys.stderr)
    while mnt in _live_mounts:
        _live_mounts.remove(mnt)


@contextlib.contextmanager
def attached(images):
    """Attach the image files to loop devices (the kernel scanning them for btrfs when
    there are several); yield the devices; detach them after."""
    loops = []
    try:
        for img in images:
            loops.append(loop_attach(img))
        if len(loops) > 1:
            run(["btrfs", "device", "scan"] + loops, timeout=60)
        yield loops
    finally:
        for dev in reversed(loops):
            loop_detach(dev)


@contextlib.contextmanager
def readonly_view(path, mnt):
    """Bind-mount `path` at `mnt` read-only and noatime: reading it (readlink too) changes
    nothing; yield `mnt`."""
    os.makedirs(mnt, exist_ok=True)
    run(["mount", "--bind", path, mnt])
    try:
        run(["mount", "-o", "remount,bind,ro,noatime", mnt])
        yield mnt
    finally:
        umount(mnt)


# ---------------------------------------------------------------------------------
# Image files made by mkfs.btrfs without a mount

def make_image(path, size, nodesize=None, mkfs_args=()):
    """Make `path` a sparse file of `size` bytes holding a fresh, empty btrfs (mkfs.btrfs
    on the file: no loop device needed; nodesize None: mkfs's default, 16 KiB); return
    `path`."""
    with open(path, "wb") as f:
        f.truncate(size)
    node = ["-n", str(nodesize)] if nodesize else []
    run(["mkfs.btrfs", "-q", "-f"] + node + list(mkfs_args) + [path], timeout=300)
    return path


def mkfs_image(workdir, name="img", size=2 << 30):
    """make_image() of `workdir`/`name` (2 GiB, default mkfs options); return its path."""
    return make_image(os.path.join(workdir, name), size)


def super_fields(image):
    """{field: last word of its line} of `btrfs inspect-internal dump-super`."""
    out = run(["btrfs", "inspect-internal", "dump-super", image]).stdout
    fields = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            fields[parts[0]] = parts[-1]
    return fields


# ---------------------------------------------------------------------------------
# A kernel-made filesystem

class KernelFs:
    """N image files made into one btrfs; see the module comment for its life."""

    def __init__(self, workdir, ndevices=1, size=DEFAULT_DEVICE_SIZE, mkfs_args=(),
                 mount_opts=(), label="butter-it", name="fs"):
        self.dir = os.path.join(workdir, name)
        os.makedirs(self.dir)
        self.images = [os.path.join(self.dir, f"dev{i + 1}.img") for i in range(ndevices)]
        self.size = size
        self.mkfs_args = list(mkfs_args)
        self.mount_opts = list(mount_opts)
        self.label = label
        self.loops = []
        self.mnt = os.path.join(self.dir, "mnt")
        self.mounted = False

    def create(self):
        """Make the sparse image files, attach them, and run mkfs.btrfs over them."""
        for img in self.images:
            with open(img, "wb") as f:
                f.truncate(self.size)
        for img in self.images:
            self.loops.append(loop_attach(img))
        run(["mkfs.btrfs", "-f", "-L", self.label] + self.mkfs_args + self.loops, timeout=120)

    def mount(self):
        """Mount the filesystem (noatime, plus the options given at creation)."""
        opts = self.mount_opts + [f"device={d}" for d in self.loops[1:]]
        mount(self.loops[0], self.mnt, opts)
        self.mounted = True

    def sync(self):
        """Commit everything written so far (a full transaction commit)."""
        run(["btrfs", "filesystem", "sync", self.mnt], timeout=300)
        run(["sync"], timeout=300)

    def umount(self):
        if self.mounted:
            umount(self.mnt)
            self.mounted = False

    def detach(self):
        for dev in list(self.loops):
            loop_detach(dev)
            self.loops.remove(dev)

    def release(self):
        """Unmount and detach: afterwards the image files hold the final filesystem."""
        self.umount()
        self.detach()

    def close(self):
        """Release, and report (on stderr) rather than raise what goes wrong doing so."""
        try:
            self.umount()
        except Exception as e:
            print(f"KernelFs.close: {e}", file=sys.stderr)
        for dev in list(self.loops):
            try:
                loop_detach(dev)
            except Exception as e:
                print(f"KernelFs.close: {e}", file=sys.stderr)
            self.loops.remove(dev)

    # -- what the kernel and btrfs-progs say about it (mounted) --------------------

    def show(self):
        """Return (label, fsid) as `btrfs filesystem show` prints them."""
        out = run(["btrfs", "filesystem", "show", self.mnt]).stdout
        m = re.search(r"Label: (?:'(.*)'|none)\s+uuid: ([0-9a-f-]{36})", out)
        if not m:
            raise CommandError(f"cannot parse `btrfs filesystem show`:\n{out}")
        return m.group(1), m.group(2)

    def subvolume_list(self):
        """Return [(id, path)] as `btrfs subvolume list` prints them."""
        out = run(["btrfs", "subvolume", "list", self.mnt]).stdout
        found = []
        for line in out.splitlines():
            m = re.match(r"ID (\d+) gen \d+ top level \d+ path (.*)$", line)
            if m:
                found.append((int(m.group(1)), m.group(2)))
        return found

    # -- on-disk layout (unmounted, loop devices still attached) --------------------

    def chunk_map(self):
        """Parse the chunk tree; needs the loop devices attached and the fs unmounted."""
        out = run(["btrfs", "inspect-internal", "dump-tree", "-t", "chunk", self.loops[0]]).stdout
        return ChunkMap.parse(out)

    def tree_blocks(self, tree):
        """Return the logical addresses of every node and leaf of tree `tree`."""
        out = run(["btrfs", "inspect-internal", "dump-tree", "-t", str(tree), self.loops[0]],
                  timeout=300).stdout
        return sorted({int(m.group(2)) for m in
                       re.finditer(r"^(leaf|node) (\d+) (?:items|level)", out, re.M)})

    def devids(self):
        """Return {devid: image file} read from each image's superblock."""
        found = {}
        for img in self.images:
            out = run(["btrfs", "inspect-internal", "dump-super", img]).stdout
            m = re.search(r"^dev_item\.devid\s+(\d+)", out, re.M)
            found[int(m.group(1))] = img
        return found


@contextlib.contextmanager
def kernel_fs(workdir, **kwargs):
    """Create, mount and yield a KernelFs; always unmount and detach it afterwards."""
    fs = KernelFs(workdir, **kwargs)
    try:
        fs.create()
        fs.mount()
        yield fs
    finally:
        fs.close()


# ---------------------------------------------------------------------------------
# Chunk mapping: logical address -> (devid, physical) for every profile

PARITY = {"RAID5": 1, "RAID6": 2}


@dataclasses.dataclass
class Chunk:
    start: int
    length: int
    flags: tuple             # e.g. ("DATA", "RAID1")
    stripe_len: int
    sub_stripes: int
    stripes: list            # [(devid, physical offset of the chunk's stripe)]

    @property
    def profile(self):
        for p in ("RAID1C3", "RAID1C4", "RAID10", "RAID1", "RAID0", "RAID5", "RAID6", "DUP"):
            if p in self.flags:
                return p
        return "SINGLE"

    def full_stripe(self, logical):
        """Return the RAID5/6 full stripe holding `logical` as (chunk start, index), or None."""
        if self.profile not in PARITY:
            return None
        width = self.stripe_len * (len(self.stripes) - PARITY[self.profile])
        return self.start, (logical - self.start) // width

    def locate(self, logical):
        """Return where the byte at `logical` lives: [(devid, physical)].

        For mirrored profiles (DUP, RAID1*, RAID10) every copy; for SINGLE, RAID0 and
        the data of RAID5/6 the one place (parity is not listed).
        """
        off = logical - self.start
        assert 0 <= off < self.length
        n = len(self.stripes)
        p, sl = self.profile, self.stripe_len
        if p in ("SINGLE", "DUP", "RAID1", "RAID1C3", "RAID1C4"):
            return [(dev, phys + off) for dev, phys in self.stripes]
        strip, within = divmod(off, sl)
        if p == "RAID0":
            row, idx = divmod(strip, n)
            dev, phys = self.stripes[idx]
            return [(dev, phys + row * sl + within)]
        if p == "RAID10":
            factor = n // self.sub_stripes
            row, col = divmod(strip, factor)
            first = col * self.sub_stripes
            return [(dev, phys + row * sl + within)
                    for dev, phys in self.stripes[first:first + self.sub_stripes]]
        if p in PARITY:
            ndata = n - PARITY[p]
            full, idx = divmod(strip, ndata)
            dev, phys = self.stripes[(idx + full) % n]
            return [(dev, phys + full * sl + within)]
        raise ValueError(f"no mapping for profile {p}")


class ChunkMap:
    def __init__(self, chunks):
        self.chunks = sorted(chunks, key=lambda c: c.start)

    @classmethod
    def parse(cls, dump):
        chunks = []
        cur = None
        for line in dump.splitlines():
            m = re.search(r"key \(FIRST_CHUNK_TREE CHUNK_ITEM (\d+)\)", line)
            if m:
                cur = Chunk(int(m.group(1)), 0, (), 0, 1, [])
                chunks.append(cur)
                continue
            if re.search(r"\bkey \(", line):
                cur = None
            if cur is None:
                continue
            m = re.search(r"length (\d+) owner \d+ stripe_len (\d+) type (\S+)", line)
            if m:
                cur.length, cur.stripe_len = int(m.group(1)), int(m.group(2))
                cur.flags = tuple(m.group(3).split("|"))
            m = re.search(r"num_stripes \d+ sub_stripes (\d+)", line)
            if m:
                cur.sub_stripes = max(1, int(m.group(1)))
            m = re.search(r"stripe \d+ devid (\d+) offset (\d+)", line)
            if m:
                cur.stripes.append((int(m.group(1)), int(m.group(2))))
        if not chunks:
            raise CommandError(f"no chunk items in dump-tree output:\n{dump[:2000]}")
        return cls(chunks)

    def chunk_of(self, logical):
        for c in self.chunks:
            if c.start <= logical < c.start + c.length:
                return c
        raise KeyError(f"logical address {logical} is in no chunk")

    def locate(self, logical):
        return self.chunk_of(logical).locate(logical)


# ---------------------------------------------------------------------------------
# File extents (FIEMAP) and raw image bytes

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_ENCODED = 0x8          # compressed: the bytes on disk are not the file's
FIEMAP_EXTENT_DATA_INLINE = 0x200
FIEMAP_EXTENT_UNWRITTEN = 0x800      # prealloc


def fiemap(path, max_extents=4096):
    """Return [(file offset, btrfs logical address, length, flags)] of `path`'s extents."""
    hdr = struct.Struct("=QQIIII")
    ext = struct.Struct("=QQQQQIIII")
    buf = bytearray(hdr.size + ext.size * max_extents)
    hdr.pack_into(buf, 0, 0, 0xFFFFFFFFFFFFFFFF, FIEMAP_FLAG_SYNC, 0, max_extents, 0)
    arr = array.array("B", buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, FS_IOC_FIEMAP, arr, True)
    finally:
        os.close(fd)
    buf = arr.tobytes()
    mapped = hdr.unpack_from(buf, 0)[3]
    out = []
    for i in range(mapped):
        logical, physical, length, _, _, flags, _, _, _ = ext.unpack_from(buf, hdr.size + i * ext.size)
        out.append((logical, physical, length, flags))
    return out


def file_sha256(path):
    """The SHA-256 of a file's bytes (hex), read a MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def read_image(image, offset, length):
    with open(image, "rb") as f:
        f.seek(offset)
        return f.read(length)


def flip_bytes(image, offset, length):
    """Invert `length` bytes of `image` at `offset` (every bit flipped), durably."""
    with open(image, "r+b") as f:
        f.seek(offset)
        old = f.read(length)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in old))
        f.flush()
        os.fsync(f.fileno())


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data):
    """crc32c (Castagnoli) of `data` as btrfs stores it, to recompute a checksum after an
    edit of on-disk bytes."""
    c = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
