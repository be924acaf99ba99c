"""Several processes changing the same directories at once through `butter mount`.

Each worker process runs a seeded sequence in the shared directories d0..d3: create and
write files, overwrite and append and truncate them, rename them within and across the
directories (also over its own other files), hard-link and unlink them, make and remove
directories, read the directories, and replace the shared names dN/common (write a
private file, rename it over the shared name: the other workers do the same at the same
time). Every worker keeps a model of its own files (names and inodes) and checks them
as it goes and at the end: contents byte for byte, no name of its own missing and none
left over (no lost update). A common file must always be one complete version some
worker wrote (self-checking contents).

  no deadlock   every worker must finish within a time limit, and the mount must still
                answer afterwards
  no lost update  the workers' own checks
  the oracles   before the unmount the mount's tree is recorded; after it `btrfs check
                --readonly` must be clean and the kernel's view of the image equal to that
                record

Scale with BUTTER_CONCURRENCY_OPS (operations per worker, default 1500; 6 workers: about 10 s).
Needs root, loop devices, kernel btrfs, /dev/fuse and fusermount3.
"""
import hashlib
import multiprocessing
import os
import random
import time
import traceback

import pytest

from butter_it import kfs, manifest, oracle
from butter_it.fusemount import FuseMount

WORKERS = 6
OPS = int(os.environ.get("BUTTER_CONCURRENCY_OPS", "1500"))
DIRS = ["d0", "d1", "d2", "d3"]
WORKER_TIMEOUT = 420
INLINE_MAX = 2048                 # files this small may be inline extents


def versioned(worker, seq, size):
    """Self-checking contents: a header naming the writer, then a body derived from it."""
    head = b"W%02d S%07d L%09d\n" % (worker, seq, size)
    body = hashlib.shake_256(head).digest(size)
    return head + body


def check_versioned(data):
    """Return None if `data` is one complete version, else what is wrong."""
    if len(data) < 24 or data[23:24] != b"\n":
        return f"no header ({len(data)} bytes: {data[:40]!r})"
    try:
        w, s, n = int(data[1:3]), int(data[5:12]), int(data[14:23])
    except ValueError:
        return f"bad header {data[:24]!r}"
    if data != versioned(w, s, n):
        return f"torn or mixed version of worker {w} seq {s} ({len(data)} bytes, want {24 + n})"
    return None


class Worker:
    def __init__(self, root, wid, seed):
        self.root, self.w = root, wid
        self.rng = random.Random(seed)
        self.names = {}           # relative path -> inode key
        self.data = {}            # inode key -> bytearray
        self.dirs = set()         # own directories (relative paths), empty ones
        self.seq = 0

    def p(self, rel):
        return os.path.join(self.root, rel)

    def fresh(self, prefix="f"):
        self.seq += 1
        return f"{self.rng.choice(DIRS)}/w{self.w}-{prefix}{self.seq}"

    def payload(self, n):
        self.seq += 1
        return bytearray(hashlib.shake_128(b"%d-%d" % (self.w, self.seq)).digest(n))

    def size(self):
        return self.rng.choice([0, 1, 100, 2000, 3000, 4096, 5000, 70000, 300000])

    def verify(self, rel):
        with open(self.p(rel), "rb") as f:
            got = f.read()
        want = bytes(self.data[self.names[rel]])
        if got != want:
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                         min(len(got), len(want)))
            raise AssertionError(f"worker {self.w}: {rel}: {len(got)} bytes read, {len(want)} "
                                 f"expected (first difference at {first})")

    def verify_dir(self, d):
        mine = {n for n in os.listdir(self.p(d)) if n.startswith(f"w{self.w}-")}
        want = {os.path.basename(r) for r in list(self.names) + list(self.dirs)
                if os.path.dirname(r) == d}
        assert mine == want, (f"worker {self.w}: {d}: missing {sorted(want - mine)}, "
                              f"unexpected {sorted(mine - want)}")

    def step(self):
        r = self.rng.random()
        own = sorted(self.names)
        if r < 0.18 or not own:                       # create and write
            rel = self.fresh()
            data = self.payload(self.size())
            with open(self.p(rel), "wb") as f:
                f.write(data)
            self.names[rel] = rel
            self.data[rel] = data
        elif r < 0.30:                                # overwrite a range
            rel = self.rng.choice(own)
            buf = self.data[self.names[rel]]
            off = self.rng.randrange(0, len(buf) + 5000)
            data = self.payload(self.rng.choice([1, 500, 4096, 9000]))
            fd = os.open(self.p(rel), os.O_WRONLY)
            try:
                os.pwrite(fd, data, off)
            finally:
                os.close(fd)
            if off > len(buf):
                buf.extend(bytes(off - len(buf)))
            buf[off:off + len(data)] = data
        elif r < 0.36:                                # append
            rel = self.rng.choice(own)
            data = self.payload(self.rng.choice([10, 4096, 20000]))
            with open(self.p(rel), "ab") as f:
                f.write(data)
            self.data[self.names[rel]].extend(data)
        elif r < 0.41:                                # truncate
            rel = self.rng.choice(own)
            buf = self.data[self.names[rel]]
            n = self.rng.randrange(0, len(buf) + 8000)
            os.truncate(self.p(rel), n)
            if n < len(buf):
                del buf[n:]
            else:
                buf.extend(bytes(n - len(buf)))
        elif r < 0.53:                                # rename to a new name, any directory
            rel = self.rng.choice(own)
            new = self.fresh("r")
            os.rename(self.p(rel), self.p(new))
            self.names[new] = self.names.pop(rel)
        elif r < 0.58 and len(own) > 1:               # rename over another own file
            a, b = self.rng.sample(own, 2)
            os.rename(self.p(a), self.p(b))
            if self.names[a] == self.names[b]:
                return                                # hard links of one inode: no-op
            gone = self.names.pop(b)
            self.names[b] = self.names.pop(a)
            if gone not in self.names.values():
                del self.data[gone]
        elif r < 0.64:                                # unlink
            rel = self.rng.choice(own)
            os.unlink(self.p(rel))
            key = self.names.pop(rel)
            if key not in self.names.values():
                del self.data[key]
        elif r < 0.69:                                # hard link
            rel = self.rng.choice(own)
            new = self.fresh("l")
            os.link(self.p(rel), self.p(new))
            self.names[new] = self.names[rel]
        elif r < 0.74:                                # directories: make or remove
            if self.dirs and self.rng.random() < 0.5:
                d = self.rng.choice(sorted(self.dirs))
                os.rmdir(self.p(d))
                self.dirs.discard(d)
            else:
                d = self.fresh("dir")
                os.mkdir(self.p(d))
                self.dirs.add(d)
        elif r < 0.84:                                # replace a shared name
            d = self.rng.choice(DIRS)
            self.seq += 1
            tmp = f"{d}/w{self.w}-tmp{self.seq}"
            with open(self.p(tmp), "wb") as f:
                f.write(versioned(self.w, self.seq, self.rng.choice([0, 3000, 5000, 100000])))
            os.rename(self.p(tmp), self.p(f"{d}/common"))
        elif r < 0.90:                                # read a shared name
            try:
                with open(self.p(f"{self.rng.choice(DIRS)}/common"), "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                return
            bad = check_versioned(data)
            assert bad is None, f"worker {self.w}: a common file: {bad}"
        elif r < 0.95:                                # read back an own file
            self.verify(self.rng.choice(own))
        else:                                         # list a shared directory
            self.verify_dir(self.rng.choice(DIRS))

    def finish(self):
        for rel in sorted(self.names):
            self.verify(rel)
        for d in DIRS:
            self.verify_dir(d)


def worker_main(root, wid, seed, ops, errors):
    try:
        w = Worker(root, wid, seed)
        for _ in range(ops):
            w.step()
        w.finish()
        errors.put((wid, None))
    except BaseException:
        errors.put((wid, traceback.format_exc()))


@pytest.mark.butter_timeout(900)
def test_concurrent_processes_same_directories(fuse, butter, workdir):
    image = kfs.mkfs_image(workdir)
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        for d in DIRS:
            os.mkdir(os.path.join(m.mnt, d))
        ctx = multiprocessing.get_context("fork")
        errors = ctx.Queue()
        procs = [ctx.Process(target=worker_main, args=(m.mnt, w, 1000 + w, OPS, errors))
                 for w in range(WORKERS)]
        start = time.monotonic()
        for p in procs:
            p.start()
        results = {}
        deadline = start + WORKER_TIMEOUT
        while len(results) < WORKERS and time.monotonic() < deadline:
            try:
                wid, err = errors.get(timeout=1)
                results[wid] = err
            except Exception:
                pass
        hung = [w for w in range(WORKERS) if w not in results]
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=30)
        assert not hung, (f"workers {hung} did not finish within {WORKER_TIMEOUT} s "
                          f"(deadlock?)\n{m.log_text()[-3000:]}")
        failed = {w: e for w, e in results.items() if e}
        assert not failed, "\n".join(f"worker {w}:\n{e}" for w, e in failed.items())
        print(f"{WORKERS} workers x {OPS} operations in {time.monotonic() - start:.1f} s")
        # the mount still answers, and every common file is one complete version
        for d in DIRS:
            path = os.path.join(m.mnt, d, "common")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    bad = check_versioned(f.read())
                assert bad is None, f"{d}/common: {bad}"
        through_fuse = manifest.take(m.mnt)
        assert m.unmount() == 0
        assert "aborted" not in m.log_text(), m.log_text()
    oracle.btrfs_check(image)
    oracle.kernel_sees(through_fuse, image, mnt=os.path.join(workdir, "kview"))


def test_truncate_grown_inline_file_down(fuse, butter, workdir):
    image = kfs.mkfs_image(workdir)
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        path = os.path.join(m.mnt, "small")
        with open(path, "wb") as f:
            f.write(b"x" * 100)                       # an inline extent
        os.truncate(path, 8000)
        os.truncate(path, 4457)
        with open(path, "rb") as f:
            assert f.read() == b"x" * 100 + bytes(4357)
        assert m.unmount() == 0
    oracle.btrfs_check(image)
