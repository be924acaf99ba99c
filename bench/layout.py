#!/usr/bin/env python3
"""bench/layout.py — the file work of bench/layout.sh (run by it; see there).

  age DIR SEED          fill DIR (a mount) like a system: ~3,000 files of /usr-like sizes,
                        written many at a time in interleaved pieces, then a fifth rewritten
                        and a tenth deleted, so files lie scattered; prints the boot set:
                        1,000 of them in a fixed shuffled order, one path a line (from DIR)
  read DIR LIST         read every file of LIST (paths from DIR) whole, in order; prints
                        "SECONDS BYTES"
  runs DIR LIST         the kernel's FIEMAP of LIST's files in order (btrfs reports logical
                        addresses there; inline files, which live in tree leaves, are left
                        out): prints "RUNS SEEK BYTES FIRST": runs met, bytes skipped
                        between them, bytes, and the address of the first
  frag DIR N MIB        N files of MIB MiB grown together in 64 KiB appends, each synced
"""
import array
import fcntl
import os
import random
import struct
import sys
import time

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_EXTENT_DATA_INLINE = 0x200


def fiemap(path, max_extents=8192):
    hdr = struct.Struct("=QQIIII")
    ext = struct.Struct("=QQQQQIIII")
    buf = bytearray(hdr.size + ext.size * max_extents)
    hdr.pack_into(buf, 0, 0, 0xFFFFFFFFFFFFFFFF, 1, 0, max_extents, 0)  # FIEMAP_FLAG_SYNC
    arr = array.array("B", buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, FS_IOC_FIEMAP, arr, True)
    finally:
        os.close(fd)
    buf = arr.tobytes()
    out = []
    for i in range(hdr.unpack_from(buf, 0)[3]):
        _, phys, length, _, _, flags, _, _, _ = ext.unpack_from(buf, hdr.size + i * ext.size)
        if not flags & FIEMAP_EXTENT_DATA_INLINE:  # inline data lives in tree leaves
            out.append((phys, length))
    return out


def size_like_usr(rng):
    r = rng.random()
    if r < 0.45:
        return rng.randint(200, 8 << 10)
    if r < 0.80:
        return rng.randint(8 << 10, 64 << 10)
    if r < 0.97:
        return rng.randint(64 << 10, 512 << 10)
    return rng.randint(512 << 10, 4 << 20)


def age(top, seed):
    rng = random.Random(seed)
    files = []
    for d in range(60):
        sub = os.path.join(top, "usr", f"d{d:02d}")
        os.makedirs(sub, exist_ok=True)
        for f in range(50):
            files.append((os.path.join(sub, f"f{f:02d}"), size_like_usr(rng)))
    rng.shuffle(files)
    # 64 files at a time, each growing by up to 32 KiB in turn, synced every round
    for g in range(0, len(files), 64):
        group = files[g:g + 64]
        fds = [os.open(p, os.O_CREAT | os.O_WRONLY, 0o644) for p, _ in group]
        left = [s for _, s in group]
        while any(left):
            for i, fd in enumerate(fds):
                if left[i]:
                    n = min(left[i], rng.randint(4 << 10, 32 << 10))
                    os.write(fd, rng.randbytes(n))
                    left[i] -= n
            for fd in fds:
                os.fdatasync(fd)
        for fd in fds:
            os.close(fd)
    for p, s in rng.sample(files, len(files) // 5):  # rewritten in place
        with open(p, "r+b") as f:
            f.write(rng.randbytes(min(s, 16 << 10)))
            os.fdatasync(f.fileno())
    gone = set(p for p, _ in rng.sample(files, len(files) // 10))
    for p in gone:
        os.unlink(p)
    live = [p for p, _ in files if p not in gone]
    boot = rng.sample(live, 1000)
    for p in boot:
        print(os.path.relpath(p, top))


def read_all(top, lst):
    paths = [os.path.join(top, line.rstrip("\n")) for line in open(lst) if line.strip()]
    total = 0
    t0 = time.monotonic()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                total += len(b)
    print(f"{time.monotonic() - t0:.3f} {total}")


def runs(top, lst):
    nruns, seek, total, prev_end, first = 0, 0, 0, None, 0
    for line in open(lst):
        if not line.strip():
            continue
        for phys, length in fiemap(os.path.join(top, line.rstrip("\n"))):
            if phys != prev_end:
                nruns += 1
                if prev_end is not None:
                    seek += abs(phys - prev_end)
            prev_end = phys + length
            total += length
            first = first or phys
    print(f"{nruns} {seek} {total} {first}")


def frag(top, n, mib):
    rng = random.Random(3)
    fds = [os.open(os.path.join(top, f"big{i}"), os.O_CREAT | os.O_WRONLY, 0o644) for i in range(n)]
    for _ in range(mib * 16):
        for fd in fds:
            os.write(fd, rng.randbytes(64 << 10))
            os.fdatasync(fd)
    for fd in fds:
        os.close(fd)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "age":
        age(sys.argv[2], int(sys.argv[3]))
    elif cmd == "read":
        read_all(sys.argv[2], sys.argv[3])
    elif cmd == "runs":
        runs(sys.argv[2], sys.argv[3])
    elif cmd == "frag":
        frag(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(f"unknown command {cmd}")
