"""`butter mount -o trace=FILE`: the first read of each file range, in order, for layout.

A mount records the reads that reach it; the trace lists the files in the order they were
first read, with their subvolume and inode (as stat shows them) and the ranges read, names
escaped; a file read again adds nothing; a file in a nested subvolume gets its path from the
top of the mount. The trace then drives `butter layout` of the unmounted image, which the
kernel judges (FIEMAP: the traced files in one run, in trace order).
"""
import fcntl
import os
import struct

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount

NAMES = ["boot", "lib/libc.so", "lib/odd\tname\\x", "sv/inner", "etc/conf"]


BUTTER_IOC_INFO = (2 << 30) | (24 << 16) | (0xB7 << 8) | 1  # _IOR(0xB7, 1, 24 bytes)


def ids(path):
    """(subvolume, inode) of a file of the mount, as the daemon names it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = fcntl.ioctl(fd, BUTTER_IOC_INFO, bytes(24))
    finally:
        os.close(fd)
    _, _, subvol, ino = struct.unpack("=IIQQ", buf)
    return subvol, ino


def unescape(s):
    out, i = bytearray(), 0
    b = s.encode()
    while i < len(b):
        if b[i] == 0x5C:
            nxt = b[i + 1:i + 2]
            if nxt in (b"\\", b"n", b"t"):
                out += {b"\\": b"\\", b"n": b"\n", b"t": b"\t"}[nxt]
                i += 2
            else:
                out.append(int(b[i + 1:i + 4], 8))
                i += 4
        else:
            out.append(b[i])
            i += 1
    return out.decode()


def read_trace(path):
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0] == "# butter-trace 1", lines[:2]
    rows = []
    for line in lines[1:]:
        if line.startswith("#"):
            continue
        sv, ino, off, length, p = line.split("\t")
        rows.append((int(sv), int(ino), int(off), int(length), unescape(p)))
    return rows


def test_trace_records_first_reads_and_drives_layout(fuse, butter, workdir):
    img = os.path.join(workdir, "img")
    kfs.run(["truncate", "-s", "512M", img])
    kfs.run([butter.path, "mkfs", "-q", img])
    mnt = os.path.join(workdir, "m")
    sizes = {}
    with FuseMount(butter.path, [img], mnt) as fm:
        os.makedirs(os.path.join(mnt, "lib"))
        os.makedirs(os.path.join(mnt, "etc"))
        kfs.run([butter.path, "subvolume", "create", os.path.join(mnt, "sv")])
        # written interleaved, each piece synced: scattered on disk
        fds = {n: os.open(os.path.join(mnt, n), os.O_CREAT | os.O_WRONLY, 0o644) for n in NAMES}
        for r in range(4):
            for n, fd in fds.items():
                os.write(fd, os.urandom(40000 + 4096 * r))
                os.fsync(fd)
        for n, fd in fds.items():
            sizes[n] = os.fstat(fd).st_size
            os.close(fd)
        fm.unmount()
    trace = os.path.join(workdir, "boot.trace")
    order = ["etc/conf", "lib/odd\tname\\x", "boot", "sv/inner", "lib/libc.so"]
    with FuseMount(butter.path, [img], mnt, options=[f"trace={trace}"]) as fm:
        inos = {n: ids(os.path.join(mnt, n)) for n in NAMES}
        for n in order:
            with open(os.path.join(mnt, n), "rb") as f:
                f.read(8192)       # the start first
        for n in order:
            with open(os.path.join(mnt, n), "rb") as f:
                f.read()           # then all of it (the start again: nothing new)
        fm.unmount()
    rows = read_trace(trace)
    first = []
    for sv, ino, off, length, p in rows:
        if p not in first:
            first.append(p)
    assert first == ["/" + n for n in order], first
    for n in order:
        mine = [r for r in rows if r[4] == "/" + n]
        assert {(r[0], r[1]) for r in mine} == {inos[n]}, (n, mine, inos[n])
        assert (mine[0][0] == 5) == (not n.startswith("sv/")), mine
        # the ranges cover the file once, without overlap
        covered = sorted((r[2], r[2] + r[3]) for r in mine)
        assert covered[0][0] == 0 and covered[-1][1] >= sizes[n], (n, covered)
        assert all(a[1] <= b[0] for a, b in zip(covered, covered[1:])), covered
    # the trace drives the layout of the unmounted image
    r = kfs.run([butter.path, "layout", "--trace", trace, img])
    assert f"{len(NAMES)} files traced, 0 gone" in r.stdout and "-> 1\n" in r.stdout, r.stdout
    oracle.btrfs_check(img, strict=True)
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "k")) as root:
        prev_end, runs = None, 0
        for n in order:
            for _, phys, length, _ in kfs.fiemap(os.path.join(root, n)):
                runs += phys != prev_end
                prev_end = phys + length
        assert runs == 1, runs


def test_trace_file_inside_the_mount_is_refused(fuse, butter, workdir):
    img = os.path.join(workdir, "img")
    kfs.run(["truncate", "-s", "256M", img])
    kfs.run([butter.path, "mkfs", "-q", img])
    mnt = os.path.join(workdir, "m")
    os.makedirs(mnt)
    r = kfs.run([butter.path, "mount", "-o", f"trace={mnt}/t", img, mnt], check=False)
    assert r.returncode != 0 and "inside the mountpoint" in r.stderr, r.stderr
    r = kfs.run([butter.path, "mount", "-o", "trace=/nonexistent/dir/t", img, mnt], check=False)
    assert r.returncode != 0 and "/nonexistent/dir/t" in r.stderr, r.stderr
