#!/usr/bin/env python3
"""bench/fusereqs.py — how many FUSE requests each common operation costs on a FUSE mount.

Counts what the kernel sends, not what a daemon says it got: the kernel's `fuse:fuse_request_send`
trace event (kernel 6.14+), in a tracing instance of its own, filtered to the mount's connection
(its st_dev). Each operation runs N times in a fresh directory of the mount; the count per
operation is the requests seen divided by N, split by opcode.

Operations (what users do most):
  create        open(O_CREAT|O_EXCL), write 4 KiB, close           (a new file)
  write-close   open an existing file, write 4 KiB at 0, close      (an edit)
  write-4k      one 4 KiB pwrite to an open file (the file stays open)
  stat-after    write 4 KiB to an existing file, close, then stat it (is it there yet?)
  rename        rename within the directory
  unlink        unlink
  readdir-stat  list a directory of N files and stat each (ls -l); counted per file
  chmod, chown, utimens
                on existing files

Usage: sudo bench/fusereqs.py [-n N] [--json] MOUNTPOINT [NAME=MOUNTPOINT ...]
Prints one column per mount (the first is named by its path's last part unless NAME= is given).
Needs root (tracefs) and /sys/kernel/tracing/events/fuse.
"""
import argparse
import collections
import json
import os
import shutil
import sys
import time

TRACING = "/sys/kernel/tracing"
OPS = ["create", "write-close", "write-4k", "stat-after", "rename", "unlink", "readdir-stat",
       "chmod", "chown", "utimens"]


class Tracer:
    """A tracing instance counting fuse_request_send events of one connection."""

    def __init__(self, name):
        self.dir = os.path.join(TRACING, "instances", name)
        if os.path.isdir(self.dir):
            os.rmdir(self.dir)
        os.mkdir(self.dir)
        self._w("buffer_size_kb", "65536")
        self.ev = os.path.join(self.dir, "events/fuse/fuse_request_send")

    def _w(self, rel, value):
        with open(os.path.join(self.dir, rel), "w") as f:
            f.write(value)

    def start(self, dev):
        self._w("trace", "")  # clear
        with open(os.path.join(self.ev, "filter"), "w") as f:
            f.write(f"connection == {dev}")
        with open(os.path.join(self.ev, "enable"), "w") as f:
            f.write("1")

    def stop(self):
        with open(os.path.join(self.ev, "enable"), "w") as f:
            f.write("0")
        counts = collections.Counter()
        with open(os.path.join(self.dir, "trace")) as f:
            for line in f:
                if line.startswith("#") or "opcode" not in line:
                    continue
                # "... fuse_request_send: connection 45 req 12 opcode 1 (FUSE_LOOKUP) len 42"
                name = line.split("(", 1)[-1].split(")", 1)[0]
                counts[name.replace("FUSE_", "")] += 1
        return counts

    def close(self):
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


def settle():
    time.sleep(0.3)  # the kernel's written-back pages and background releases reach the daemon


def run_op(op, d, n, tracer, dev):
    buf = os.urandom(4096)
    names = [os.path.join(d, f"f{i:05d}") for i in range(n)]
    # setup (not counted)
    if op != "create":
        for name in names:
            with open(name, "wb") as f:
                f.write(buf)
    os.sync()
    settle()  # counted on warm caches, as users run them: the setup's requests are not
    tracer.start(dev)
    def write_close(name, flags):
        fd = os.open(name, os.O_WRONLY | flags, 0o644)
        os.write(fd, buf)
        os.close(fd)

    if op == "create":
        for name in names:
            write_close(name, os.O_CREAT | os.O_EXCL)
    elif op == "write-close":
        for name in names:
            write_close(name, 0)
    elif op == "write-4k":
        fd = os.open(names[0], os.O_WRONLY)
        for i in range(n):
            os.pwrite(fd, buf, i * 4096)
        os.close(fd)
    elif op == "stat-after":
        for name in names:
            write_close(name, 0)
            os.stat(name)
    elif op == "rename":
        for name in names:
            os.rename(name, name + "r")
    elif op == "unlink":
        for name in names:
            os.unlink(name)
    elif op == "readdir-stat":
        for ent in os.scandir(d):
            ent.stat(follow_symlinks=False)
    elif op == "chmod":
        for name in names:
            os.chmod(name, 0o600)
    elif op == "chown":
        for name in names:
            os.chown(name, 1, 1)
    elif op == "utimens":
        for name in names:
            os.utime(name, (1, 1))
    settle()
    counts = tracer.stop()
    return counts


def measure(mnt, n, tracer):
    dev = os.stat(mnt).st_dev
    res = {}
    for op in OPS:
        d = os.path.join(mnt, f"fusereqs-{op}")
        if os.path.exists(d):
            shutil.rmtree(d)
        os.mkdir(d)
        os.sync()
        # a fresh directory: its lookups are counted where the operation makes them
        counts = run_op(op, d, n, tracer, dev)
        res[op] = {k: v / n for k, v in sorted(counts.items())}
        shutil.rmtree(d)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=200, help="operations per kind (default 200)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("mounts", nargs="+", help="MOUNTPOINT or NAME=MOUNTPOINT")
    a = ap.parse_args()
    if not os.path.isdir(os.path.join(TRACING, "events/fuse")):
        sys.exit("fusereqs.py: no fuse trace events in this kernel (6.14+ has them)")
    tracer = Tracer(f"fusereqs-{os.getpid()}")
    results = {}
    try:
        for m in a.mounts:
            name, _, path = m.rpartition("=")
            name = name or os.path.basename(os.path.normpath(path))
            results[name] = measure(path, a.n, tracer)
    finally:
        tracer.close()
    if a.json:
        print(json.dumps(results, indent=1))
        return
    names = list(results)
    print(f"FUSE requests per operation (n={a.n}; the kernel's fuse_request_send events)")
    print(f"{'operation':14}" + "".join(f"{nm:>10}" for nm in names) + "   by opcode (" + names[0] + ")")
    for op in OPS:
        tot = [sum(results[nm][op].values()) for nm in names]
        detail = " ".join(f"{k}:{v:.2f}" for k, v in results[names[0]][op].items() if v >= 0.01)
        print(f"{op:14}" + "".join(f"{t:10.2f}" for t in tot) + "   " + detail)
        for nm in names[1:]:
            other = " ".join(f"{k}:{v:.2f}" for k, v in results[nm][op].items() if v >= 0.01)
            print(f"{'':14}" + " " * 10 * len(names) + f"   ({nm}) {other}")


if __name__ == "__main__":
    main()
