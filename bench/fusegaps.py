#!/usr/bin/env python3
"""bench/fusegaps.py — where the time of a rename(2) or unlink(2) on a FUSE mount goes, by the kernel's clock.

Makes N files (100 bytes each) in D directories of a fresh directory on the mount, stats them, optionally
waits, then renames (or, with --op unlink, removes) each one while a tracing instance of its own records the kernel's
`fuse:fuse_request_send` / `fuse:fuse_request_end` events of the mount's connection (its st_dev) and this
process's `syscalls:sys_enter_OP` / `sys_exit_OP`. For every call it takes the gaps between
consecutive events: inside a request (send -> end: the daemon's service time, queueing included) and
between them (end -> next send: the caller's wake-up and the kernel's own work), and prints the median and
mean of each kind of gap, and calls/s.

A mean far above its median is a tail (waits, wake-ups on other CPUs); a gap that differs between two
daemons doing the same requests is not the daemons' work. bench/RESULTS.md "io: the request loop's bench"
shows what it found once.

Usage: sudo bench/fusegaps.py [-n N] [-d DIRS] [--pause S] [--op rename|unlink] MOUNTPOINT
Needs root (tracefs) and a kernel with fuse trace events (6.14+).
"""
import argparse
import collections
import os
import sys
import time

TRACING = "/sys/kernel/tracing"
FUSE_EVENTS = ("fuse/fuse_request_send", "fuse/fuse_request_end")


def write(path, value):
    with open(path, "w") as f:
        f.write(value)


def timestamp(line):
    for p in line.split():
        if p.endswith(":") and p[:-1].replace(".", "").isdigit():
            return float(p[:-1])
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=20000, help="files (default 20000)")
    ap.add_argument("-d", type=int, default=100, help="directories (default 100)")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds to wait (after sync) between the stats and the renames")
    ap.add_argument("--op", choices=("rename", "unlink"), default="rename",
                    help="the call to time (default rename)")
    ap.add_argument("mount")
    a = ap.parse_args()
    events = FUSE_EVENTS + (f"syscalls/sys_enter_{a.op}", f"syscalls/sys_exit_{a.op}")
    if not os.path.isdir(os.path.join(TRACING, "events/fuse")):
        sys.exit("fusegaps.py: no fuse trace events in this kernel (6.14+ has them)")
    root = os.path.join(os.path.abspath(a.mount), f"gaps-{os.getpid()}")
    os.mkdir(root)
    per = max(1, a.n // a.d)
    names = []
    for k in range(a.d):
        os.mkdir(f"{root}/d{k:03d}")
        for i in range(per):
            p = f"{root}/d{k:03d}/f{i:06d}"
            names.append(p)
            fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
            os.write(fd, b"x" * 100)
            os.close(fd)
    for p in names:
        os.stat(p)
    if a.pause:
        os.sync()
        time.sleep(a.pause)

    inst = os.path.join(TRACING, "instances", f"fusegaps-{os.getpid()}")
    os.mkdir(inst)
    try:
        write(os.path.join(inst, "buffer_size_kb"), "65536")
        dev = os.stat(a.mount).st_dev
        for ev in events:
            flt = f"connection == {dev}" if ev.startswith("fuse") else f"common_pid == {os.getpid()}"
            write(os.path.join(inst, "events", ev, "filter"), flt)
            write(os.path.join(inst, "events", ev, "enable"), "1")
        t0 = time.perf_counter()
        for p in names:
            if a.op == "unlink":
                os.unlink(p)
            else:
                os.rename(p, p[:p.rindex("/f")] + "/g" + p[p.rindex("/f") + 2:])
        elapsed = time.perf_counter() - t0
        time.sleep(0.3)
        for ev in events:
            write(os.path.join(inst, "events", ev, "enable"), "0")
        with open(os.path.join(inst, "trace")) as f:
            lines = f.readlines()
    finally:
        os.rmdir(inst)

    gaps = collections.defaultdict(list)
    totals = []
    start = last = None
    what = ""
    for line in lines:
        if line.startswith("#"):
            continue
        ts = timestamp(line)
        if ts is None:
            continue
        if f"sys_{a.op}(" in line:
            start = last = ts
            what = "enter"
            continue
        if f"sys_{a.op} ->" in line:
            kind = "exit"
        elif "fuse_request_send" in line:
            kind = "send " + line.split("(", 1)[1].split(")", 1)[0].replace("FUSE_", "")
        elif "fuse_request_end" in line:
            kind = "end"
        else:
            continue
        if start is None:
            continue
        gaps[f"{what} -> {kind}"].append((ts - last) * 1e6)
        last, what = ts, kind
        if kind == "exit":
            totals.append((ts - start) * 1e6)
            start = None

    def median(v):
        v = sorted(v)
        return v[len(v) // 2]

    print(f"{len(names) / elapsed:.0f} {a.op}s/s; {a.op}(2) median {median(totals):.1f} us, "
          f"mean {sum(totals) / len(totals):.1f} us (n={len(totals)})")
    for k, v in sorted(gaps.items(), key=lambda kv: -len(kv[1])):
        if len(v) >= len(totals) // 100:
            print(f"  {k:30} n={len(v):6d}  median {median(v):7.1f} us  mean {sum(v) / len(v):7.1f} us")


if __name__ == "__main__":
    main()
