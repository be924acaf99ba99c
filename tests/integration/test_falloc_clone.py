"""fallocate and reflink/clone in butter, judged by the kernel and btrfs check.

Every case builds two twin images with the kernel (the same files written the same way),
then applies one script of file operations (fallocate in every mode, FICLONERANGE,
writes, truncates) to one twin through libbutter (tests/tools/fileop.c) and to the other
through the kernel. Then:

  1. every operation gave the same result (0 or the same errno) on both;
  2. `btrfs check --readonly` finds no error in butter's twin;
  3. the kernel, mounting butter's twin, shows the same files (size and bytes) as its
     own twin;
  4. FIEMAP on the kernel mount of butter's twin shows what the operations promise:
     preallocated ranges unwritten, cloned ranges shared (FIEMAP_EXTENT_SHARED) by both
     files, compressed extents still compressed (ENCODED) and shared;
  5. the kernel can go on writing to butter's twin, and btrfs check stays clean.

Cases: every mode on a plain kernel image; clones of zstd-compressed extents; an image
without the NO_HOLES feature (explicit hole items); kernel-made reflinks and prealloc
then changed by butter (overwrite part of a shared extent, punch into prealloc, ...);
and through the FUSE mount: fallocate(1) -l/-n/-p/-z/-d, copy_file_range (os and cp),
cp --reflink=always, checked by the kernel afterwards.

Runtime: about 5 s per case on 2 cores (sanitizer build), 6 cases.
"""
import errno
import fcntl
import os
import struct
import subprocess

import pytest

from butter_it import kfs, manifest, oracle, tools, tree
from butter_it.fusemount import FuseMount, require_fuse

KiB = 1024
MiB = 1 << 20

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILEOP = os.environ.get("BUTTER_FILEOP",
                        os.path.join(REPO, "build", "tests", "tools", "butter-fileop"))

KEEP, PUNCH, COLLAPSE, ZERO = 0x01, 0x02, 0x08, 0x10
FIEMAP_EXTENT_ENCODED = 0x8
FIEMAP_EXTENT_UNWRITTEN = 0x800
FIEMAP_EXTENT_SHARED = 0x2000


@pytest.fixture(scope="module")
def fileop():
    if not os.access(FILEOP, os.X_OK):
        pytest.fail(f"test tool missing: {FILEOP} (build with ninja -C build, or set "
                    f"BUTTER_FILEOP)", pytrace=False)
    return FILEOP


# ---------------------------------------------------------------------------------
# the operation scripts: one language for butter-fileop and for the kernel

def kernel_apply(mnt, script):
    """Run `script` (butter-fileop lines) with system calls under `mnt`; return the results."""
    results = []
    p = lambda rel: os.path.join(mnt, rel)                          # noqa: E731
    for line in script:
        w = line.split()
        try:
            if w[0] == "create":
                os.close(os.open(p(w[1]), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            elif w[0] == "write":
                fd = os.open(p(w[1]), os.O_WRONLY)
                try:
                    os.pwrite(fd, tools.prng_bytes(int(w[4], 0), int(w[3], 0)), int(w[2], 0))
                finally:
                    os.close(fd)
            elif w[0] == "truncate":
                os.truncate(p(w[1]), int(w[2], 0))
            elif w[0] == "falloc":
                fd = os.open(p(w[1]), os.O_WRONLY)
                try:
                    tree.fallocate(fd, int(w[2], 0), int(w[3], 0), int(w[4], 0))
                finally:
                    os.close(fd)
            elif w[0] == "clone":
                src = os.open(p(w[1]), os.O_RDONLY)
                try:
                    dst = os.open(p(w[3]), os.O_WRONLY)
                    try:
                        fcntl.ioctl(dst, tree.FICLONERANGE,
                                    struct.pack("=qQQQ", src, int(w[2], 0), int(w[5], 0),
                                                int(w[4], 0)))
                    finally:
                        os.close(dst)
                finally:
                    os.close(src)
            elif w[0] == "sync":
                tree.syncfs(mnt)
            else:
                raise ValueError(f"unknown command {line!r}")
            results.append(0)
        except OSError as e:
            results.append(-e.errno)
    tree.syncfs(mnt)
    return results


def butter_apply(fileop, image, script):
    r = kfs.run([fileop, image], input="\n".join(script).encode() + b"\n", check=False,
                timeout=600)
    assert r.returncode == 0, f"butter-fileop failed:\n{r.stdout}\n{r.stderr}"
    assert "AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr
    return [int(x) for x in r.stdout.split()]


# ---------------------------------------------------------------------------------
# twins, and what the kernel says about butter's twin

def make_twin(workdir, name, setup, mkfs_args=(), mount_opts=()):
    """A kernel-made image with `setup(mnt)` applied; returns (KernelFs, image path)."""
    fs = kfs.KernelFs(workdir, size=1 << 30, mkfs_args=list(mkfs_args),
                      mount_opts=list(mount_opts), name=name)
    try:
        fs.create()
        fs.mount()
        setup(fs.mnt)
        tree.syncfs(fs.mnt)
    except BaseException:
        fs.close()
        raise
    return fs


def files_of(m):
    return {p: (e["size"], e.get("sha256")) for p, e in m.items() if e["type"] == "file"}


def extent_flags(path, offset):
    """FIEMAP flags of the extent holding byte `offset` of `path` (None in a hole)."""
    for logical, physical, length, flags in kfs.fiemap(path):
        if logical <= offset < logical + length:
            return flags
    return None


def assert_flags(path, offset, want, dont=0):
    flags = extent_flags(path, offset)
    assert flags is not None, f"{path} at {offset}: a hole, expected flags {want:#x}"
    assert flags & want == want, f"{path} at {offset}: flags {flags:#x}, expected {want:#x}"
    assert flags & dont == 0, f"{path} at {offset}: flags {flags:#x}, not expected {dont:#x}"


def run_twins(workdir, fileop, setup, steps, checks=None, mkfs_args=(), mount_opts=()):
    """The whole comparison of the module comment for one script of (line, result) steps.

    The result is what the kernel must answer (0 or a negative errno): the premise of
    the step, checked before butter is compared with the kernel.
    """
    script = [line for line, _ in steps]
    mine = make_twin(workdir, "butter", setup, mkfs_args, mount_opts)
    mine.release()
    image = mine.images[0]
    with make_twin_ctx(workdir, "kernel", setup, mkfs_args, mount_opts) as ref:
        want = kernel_apply(ref.mnt, script)
        premises = [f"{line!r}: kernel {w}, the test expects {e}"
                    for (line, e), w in zip(steps, want) if w != e]
        assert not premises, "\n".join(premises)
        ref_files = files_of(manifest.take(ref.mnt))
        if checks:
            checks(ref.mnt)        # the promises hold on the kernel's own twin too
    got = butter_apply(fileop, image, script)
    diffs = [f"{line!r}: kernel {w} butter {g}" for line, w, g in zip(script, want, got)
             if w != g]
    assert len(got) == len(script) and not diffs, "\n".join(diffs)
    oracle.btrfs_check(image)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "view"), opts=mount_opts) as mnt:
        mine_files = files_of(manifest.take(mnt))
        assert mine_files == ref_files, "\n".join(
            f"{p}: kernel {ref_files.get(p)} butter {mine_files.get(p)}"
            for p in sorted(set(ref_files) | set(mine_files))
            if ref_files.get(p) != mine_files.get(p))
        if checks:
            checks(mnt)
        # the kernel carries on: overwrite and append to every file
        for p in sorted(mine_files):
            with open(os.path.join(mnt, p), "r+b") as f:
                f.seek(4096)
                f.write(b"k" * 5000)
                f.seek(0, os.SEEK_END)
                f.write(b"end")
    oracle.btrfs_check(image)
    return want


class make_twin_ctx:
    def __init__(self, *args):
        self.args = args

    def __enter__(self):
        self.fs = make_twin(*self.args)
        return self.fs

    def __exit__(self, *exc):
        self.fs.close()
        return False


def write_file(path, data):
    with open(path, "wb") as f:
        f.write(data)


def plain_setup(mnt):
    write_file(os.path.join(mnt, "dense"), tools.prng_bytes(1, 1 * MiB))
    write_file(os.path.join(mnt, "small"), tools.prng_bytes(2, 100))
    write_file(os.path.join(mnt, "mid"), tools.prng_bytes(3, 10000))
    with open(os.path.join(mnt, "sparse"), "wb") as f:
        f.write(tools.prng_bytes(4, 64 * KiB))
        f.seek(512 * KiB)
        f.write(tools.prng_bytes(5, 64 * KiB))
        f.truncate(1 * MiB)
    with open(os.path.join(mnt, "holes"), "wb") as f:
        f.truncate(2 * MiB)
    os.mkdir(os.path.join(mnt, "dir"))
    kfs.run(["btrfs", "subvolume", "create", os.path.join(mnt, "sv")])
    write_file(os.path.join(mnt, "sv", "inside"), tools.prng_bytes(6, 200 * KiB))
    write_file(os.path.join(mnt, "nocow"), b"")
    kfs.run(["chattr", "+C", os.path.join(mnt, "nocow")])
    write_file(os.path.join(mnt, "nocow"), tools.prng_bytes(7, 64 * KiB))


# ---------------------------------------------------------------------------------
# the cases

MODES_SCRIPT = [
    ("falloc holes 0 0 65536", 0),                        # prealloc inside i_size
    (f"falloc holes {KEEP} {2 * MiB} {1 * MiB}", 0),      # past EOF, size kept
    ("falloc sparse 0 100000 300000", 0),                 # a sparse file's hole, odd edges
    ("falloc mid 0 5000 20000", 0),                       # grows the file
    ("falloc small 0 50 10000", 0),                       # an inline file grows
    (f"falloc dense {PUNCH | KEEP} 4096 8192", 0),        # aligned punch
    (f"falloc dense {PUNCH | KEEP} 100001 50000", 0),     # unaligned at both edges
    (f"falloc dense {PUNCH | KEEP} 1045000 5000", 0),     # across EOF
    (f"falloc dense {ZERO} 300000 70000", 0),
    (f"falloc dense {ZERO | KEEP} 1000000 100000", 0),
    (f"falloc dense {ZERO} 1040000 10000", 0),            # grows
    (f"falloc sparse {PUNCH | KEEP} 60000 10000", 0),     # across data and hole
    (f"falloc sparse {PUNCH | KEEP} 700000 4096", 0),     # all hole already: nothing
    (f"falloc small {PUNCH | KEEP} 10 20", 0),            # inside an inline extent
    (f"falloc mid {ZERO | KEEP} 8192 100", 0),            # inside the last partial sector
    (f"falloc holes {PUNCH} 0 4096", -errno.EOPNOTSUPP),  # PUNCH_HOLE needs KEEP_SIZE
    (f"falloc holes {COLLAPSE} 0 4096", -errno.EOPNOTSUPP),  # not on btrfs
    ("falloc holes 0 0 0", -errno.EINVAL),                # no length
    ("falloc dir 0 0 4096", -errno.EISDIR),               # open for writing fails
    ("create c1", 0),
    ("clone dense 0 c1 0 0", 0),                          # the whole file
    ("create c2", 0),
    ("clone dense 65536 c2 4096 131072", 0),
    (f"clone dense 0 dense {1 * MiB + 64 * KiB} 262144", 0),  # within one file, past its end
    ("clone dense 0 dense 4096 8192", -errno.EINVAL),     # overlapping
    ("clone dense 100 c2 0 4096", -errno.EINVAL),         # unaligned offset
    ("clone dense 0 c2 0 5000", -errno.EINVAL),           # unaligned length inside dst
    ("clone dense 0 c2 0 8388608", -errno.EINVAL),        # past the source's end
    ("clone mid 0 c2 0 0", -errno.EINVAL),                # mid's unaligned tail inside c2
    ("create c3", 0),
    ("clone mid 0 c3 0 0", 0),                            # ... but fine at c3's end
    ("create c4", 0),
    ("clone small 0 c4 0 0", 0),                          # inline into an empty file: stays inline
    ("create c5", 0),
    ("clone small 0 c5 8192 0", 0),                       # inline to an offset: written as data
    ("create c6", 0),
    ("clone sparse 0 c6 0 0", 0),                         # holes and prealloc come along
    ("clone holes 0 c6 65536 131072", 0),                 # prealloc into the middle of data
    ("clone dir 0 c6 0 4096", -errno.EISDIR),
    ("create sv/x", 0),
    ("clone dense 0 sv/x 0 0", 0),                        # across subvolumes
    (f"clone sv/inside 0 c6 {1 * MiB} 0", 0),             # and back
    ("clone dense 0 nocow 0 4096", -errno.EINVAL),        # NODATASUM on one side only
    ("clone nocow 0 c3 0 4096", -errno.EINVAL),           # likewise
    (f"falloc nocow {PUNCH | KEEP} 1000 10000", 0),
    (f"falloc nocow {ZERO} 60000 10000", 0),
    ("write c1 5000 10000 7", 0),                         # overwrite part of a shared extent
    ("write holes 10000 5000 3", 0),                      # into prealloc
    (f"write holes {2 * MiB + 100} 4096 4", 0),           # into prealloc past EOF
    ("truncate c2 100000", 0),
    ("sync", 0),
    ("falloc c1 0 0 2097152", 0),                         # data already there: only the size
]


def test_modes_on_kernel_image(kernel, workdir, fileop):
    def checks(mnt):
        p = lambda rel: os.path.join(mnt, rel)                      # noqa: E731
        # prealloc: unwritten, also past EOF; the part written into it is not
        assert_flags(p("holes"), 0, FIEMAP_EXTENT_UNWRITTEN)
        assert_flags(p("holes"), 60000, FIEMAP_EXTENT_UNWRITTEN)
        assert_flags(p("holes"), 2 * MiB + 512 * KiB, FIEMAP_EXTENT_UNWRITTEN)
        assert_flags(p("holes"), 12288, 0, FIEMAP_EXTENT_UNWRITTEN)
        assert_flags(p("sparse"), 200000, FIEMAP_EXTENT_UNWRITTEN)
        # punched: holes
        assert extent_flags(p("dense"), 4096) is None
        assert extent_flags(p("dense"), 110000) is None
        # clones share with their source
        for path, off in [("c1", 512 * KiB), ("dense", 512 * KiB), ("c2", 8192),
                          ("dense", 1 * MiB + 64 * KiB + 200000), ("c6", 0),
                          ("sparse", 0), ("c6", 200000), ("sv/x", 300 * KiB),
                          ("c6", 1 * MiB + 4096), ("sv/inside", 4096)]:
            assert_flags(p(path), off, FIEMAP_EXTENT_SHARED)
        # the overwritten part of c1 no longer is shared
        assert_flags(p("c1"), 8192, 0, FIEMAP_EXTENT_SHARED)
    run_twins(workdir, fileop, plain_setup, MODES_SCRIPT, checks)


def compressed_setup(mnt):
    text = b"".join(b"line %06d of a compressible file\n" % i for i in range(40000))
    write_file(os.path.join(mnt, "text"), text[:1 * MiB + 5000])
    write_file(os.path.join(mnt, "small-text"), text[:3000])


COMPRESSED_SCRIPT = [
    ("create whole", 0),
    ("clone text 0 whole 0 0", 0),
    ("create part", 0),
    (f"clone text {64 * KiB} part 4096 {200 * KiB}", 0),  # starts and ends inside extents
    (f"clone text {128 * KiB} text {2 * MiB} {128 * KiB}", 0),
    ("create inl", 0),
    ("clone small-text 0 inl 0 0", 0),                    # a compressed inline extent
    ("create inl2", 0),
    ("write inl2 0 9000 9", 0),
    ("clone small-text 0 inl2 12288 0", 0),               # decompressed into data
    ("write part 10000 3000 5", 0),                       # a write into a shared compressed extent
    (f"falloc whole {PUNCH | KEEP} 300000 20000", 0),     # a punch inside a compressed extent
]


def test_clone_compressed(kernel, workdir, fileop):
    def checks(mnt):
        p = lambda rel: os.path.join(mnt, rel)                      # noqa: E731
        for path, off in [("whole", 0), ("whole", 900 * KiB), ("text", 0),
                          ("part", 100 * KiB), ("text", 2 * MiB + 4096)]:
            assert_flags(p(path), off, FIEMAP_EXTENT_SHARED | FIEMAP_EXTENT_ENCODED)
    run_twins(workdir, fileop, compressed_setup, COMPRESSED_SCRIPT, checks,
              mount_opts=["compress-force=zstd"])


NO_HOLES_SCRIPT = [
    (f"falloc dense {PUNCH | KEEP} 8192 65536", 0),       # hole items where extents were
    (f"falloc holes {KEEP} {4 * MiB} 8192", 0),           # growing past EOF: hole items
    (f"falloc mid 0 {100 * KiB} 4096", 0),                # likewise, size grows
    (f"falloc small {ZERO} {64 * KiB} 4096", 0),
    ("create c", 0),
    (f"clone sparse 0 c {256 * KiB} 0", 0),               # a gap before, holes inside
    ("create d", 0),
    (f"write d {300 * KiB} 100 1", 0),                    # a write past EOF
    ("truncate d 1000000", 0),                            # growing truncate
]


def test_without_no_holes(kernel, workdir, fileop):
    run_twins(workdir, fileop, plain_setup, NO_HOLES_SCRIPT,
              mkfs_args=["-O", "^no-holes"])


def kernel_made_setup(mnt):
    plain_setup(mnt)
    p = lambda rel: os.path.join(mnt, rel)                          # noqa: E731
    kfs.run(["cp", "--reflink=always", p("dense"), p("ref1")])
    fd = os.open(p("pre"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        tree.fallocate(fd, 0, 0, 1 * MiB)
        os.pwrite(fd, tools.prng_bytes(6, 4096), 300 * KiB)
        tree.fallocate(fd, KEEP, 1 * MiB, 256 * KiB)
        src = os.open(p("dense"), os.O_RDONLY)
        try:
            tree.clone_range(src, 128 * KiB, 256 * KiB, fd, 512 * KiB)
        finally:
            os.close(src)
    finally:
        os.close(fd)


KERNEL_MADE_SCRIPT = [
    ("write ref1 200000 50000 11", 0),                    # overwrite part of a shared extent
    ("write dense 0 100 12", 0),                          # and of the other owner
    (f"falloc pre {PUNCH | KEEP} 100000 150000", 0),      # punch in prealloc
    (f"falloc pre {PUNCH | KEEP} 600000 4096", 0),        # punch in a cloned range
    (f"falloc pre {ZERO} 290000 20000", 0),               # zero over written prealloc
    ("write pre 1100000 5000 13", 0),                     # into prealloc past EOF
    ("truncate ref1 300000", 0),
    ("create c", 0),
    ("clone pre 0 c 0 0", 0),                             # clone prealloc + shared + written
    (f"falloc dense {PUNCH | KEEP} 0 {1 * MiB}", 0),      # drop all of dense: ref1 keeps its refs
]


def test_kernel_made_shared_and_prealloc(kernel, workdir, fileop):
    def checks(mnt):
        p = lambda rel: os.path.join(mnt, rel)                      # noqa: E731
        assert_flags(p("ref1"), 100 * KiB, FIEMAP_EXTENT_SHARED)
        assert_flags(p("pre"), 50000, FIEMAP_EXTENT_UNWRITTEN | FIEMAP_EXTENT_SHARED)
        assert_flags(p("c"), 50000, FIEMAP_EXTENT_UNWRITTEN | FIEMAP_EXTENT_SHARED)
        assert extent_flags(p("pre"), 150000) is None
    run_twins(workdir, fileop, kernel_made_setup, KERNEL_MADE_SCRIPT, checks)


# ---------------------------------------------------------------------------------
# through the FUSE mount

def fuse_ops(mnt):
    """The same commands on butter's mount and on the kernel's; returns cp --reflink's status."""
    p = lambda rel: os.path.join(mnt, rel)                          # noqa: E731
    write_file(p("a"), tools.prng_bytes(21, 1 * MiB + 5000))
    write_file(p("b"), tools.prng_bytes(22, 300 * KiB))
    write_file(p("c"), tools.prng_bytes(23, 1 * MiB + 5000))     # dense, for cp to share whole
    tree.syncfs(mnt)
    kfs.run(["fallocate", "-l", str(2 * MiB), p("f")])
    kfs.run(["fallocate", "-n", "-o", str(2 * MiB), "-l", str(1 * MiB), p("f")])
    kfs.run(["fallocate", "-p", "-o", "100000", "-l", "50000", p("a")])
    kfs.run(["fallocate", "-z", "-o", "300000", "-l", "70001", p("a")])
    kfs.run(["fallocate", "-z", "-o", str(1 * MiB), "-l", str(100 * KiB), p("b")])
    kfs.run(["fallocate", "-d", p("b")])                   # dig holes where zeros are
    kfs.run(["cp", "--reflink=auto", p("c"), p("copy-auto")])
    src = os.open(p("a"), os.O_RDONLY)
    dst = os.open(p("cfr"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert os.copy_file_range(src, dst, 256 * KiB, 0, 0) == 256 * KiB
        assert os.copy_file_range(src, dst, 10000, 5, 256 * KiB) == 10000   # unaligned: bytes
        assert os.copy_file_range(src, dst, 10 * MiB, 1 * MiB, 1 * MiB) == 5000  # src's end
    finally:
        os.close(src)
        os.close(dst)
    always = subprocess.run(["cp", "--reflink=always", p("c"), p("copy-always")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tree.syncfs(mnt)
    return always


def test_fuse_fallocate_and_reflink(kernel, butter, workdir):
    require_fuse()
    with kfs.kernel_fs(workdir, size=1 << 30, name="reference") as ref:
        k_always = fuse_ops(ref.mnt)
        assert k_always.returncode == 0, k_always.stderr
        ref_files = files_of(manifest.take(ref.mnt))
    image = os.path.join(workdir, "img")
    with open(image, "wb") as f:
        f.truncate(1 << 30)
    kfs.run(["mkfs.btrfs", "-q", "-f", image])
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        always = fuse_ops(m.mnt)
        if always.returncode != 0:
            # FICLONE never reaches a FUSE daemon: the kernel's VFS answers it for FUSE
            # (no remap_file_range), so cp --reflink=always cannot work on any FUSE mount
            assert b"Operation not supported" in always.stderr, always.stderr
            os.unlink(os.path.join(m.mnt, "copy-always"))
            kfs.run(["cp", "--reflink=auto", os.path.join(m.mnt, "c"),
                     os.path.join(m.mnt, "copy-always")])
        through_fuse = files_of(manifest.take(m.mnt))
        assert m.unmount() == 0
        assert "aborted" not in m.log_text(), m.log_text()
    assert through_fuse == ref_files, "\n".join(
        f"{p}: kernel {ref_files.get(p)} fuse {through_fuse.get(p)}"
        for p in sorted(set(ref_files) | set(through_fuse))
        if ref_files.get(p) != through_fuse.get(p))
    oracle.btrfs_check(image)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "view")) as mnt:
        assert files_of(manifest.take(mnt)) == ref_files
        p = lambda rel: os.path.join(mnt, rel)                  # noqa: E731
        assert_flags(p("f"), 0, FIEMAP_EXTENT_UNWRITTEN)
        assert_flags(p("f"), 2 * MiB + 4096, FIEMAP_EXTENT_UNWRITTEN)
        assert extent_flags(p("a"), 110000) is None           # punched
        assert_flags(p("a"), 310000, FIEMAP_EXTENT_UNWRITTEN)  # zeroed
        for path, off in [("copy-auto", 0), ("copy-auto", 1 * MiB), ("cfr", 0),
                          ("cfr", 1 * MiB), ("copy-always", 0), ("a", 0), ("c", 0)]:
            assert_flags(p(path), off, FIEMAP_EXTENT_SHARED)
        assert_flags(p("cfr"), 256 * KiB, 0, FIEMAP_EXTENT_SHARED)  # copied bytes


def test_fileop_errors_are_reported(kernel, workdir, fileop):
    """The tool itself: a refused operation shows as its errno (the test can fail)."""
    fs = make_twin(workdir, "t", plain_setup)
    fs.release()
    got = butter_apply(fileop, fs.images[0], ["falloc nope 0 0 4096", "falloc holes 2 0 1",
                                              "clone dense 0 dense 0 4096"])
    assert got == [-errno.ENOENT, -errno.EOPNOTSUPP, -errno.EINVAL]
