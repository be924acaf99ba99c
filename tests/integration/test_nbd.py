"""NBD exports as devices (lib/device/nbd.c): URIs wherever a device path goes.

The NBD servers are real ones, run here in the foreground and owned by the test (killed,
stopped and resumed by it): nbdkit's file plugin over a sparse image file (with its error
and blocksize-policy filters), qemu-nbd for a second implementation, over a Unix socket
(`nbd+unix:///?socket=PATH`, `nbd+unix:///NAME?socket=PATH`) or TCP (`nbd://127.0.0.1:PORT/`).
Whatever lands on disk is judged on the image files behind the servers, after the servers
are gone: `btrfs check --readonly` must be clean and the kernel's (loop device) mount must
show what butter's mount showed (butter_it.oracle).

  workload    mkfs onto an export, a POSIX workload through `butter mount` (files from 0 B to
              3 MiB, hard links, symlinks, xattrs, fifo, device node, rename, truncate,
              unlink), then check and the kernel; the same file exported by qemu-nbd
              (read-only, named export) read back by `butter check`, `extract` and a
              read-only mount: the same tree, the image unchanged
  raid1       two servers (Unix and TCP); one lost during a write-and-fsync loop, SIGKILLed
              (the connection closes) or SIGSTOPped (no answer: BUTTER_NBD_TIMEOUT): the
              writer gets an error within a bounded time, the log names the URI and why, the
              mount turns read-only, every fsynced file reads back right (from the other
              copy); a degraded mount of the survivor alone finds every fsynced file (the tree
              log replayed), `replace start -B` onto a third server, more writes; the kernel
              mounts survivor + new device without -o degraded, no device missing
  raid5       three servers (`-o device=URI`), one SIGKILLed under a cold mount: every file
              reads back right (rebuilt from parity); a degraded mount, replace onto a
              fourth; check, the kernel's tree and its read-only scrub
  errors      nbdkit's error filter: every read of one raid1 mirror fails, on each mirror in
              turn: files read right (from the other copy), a read-only scrub finds the
              errors (exit 3), and once the trigger file is gone the same connection serves
              again (a second scrub is clean: a server error is not a dead device); the
              read errors are counted by `device stats` of the mount, offline, and by the
              kernel alike. Write errors on one device: the fsync fails with EIO at once,
              the mount turns read-only (EROFS), `butter umount` reports the failed commit;
              remounted over the same server, the last commit is intact
  timeout     a SIGSTOPped server: `butter info` and `butter mount` give up after
              BUTTER_NBD_TIMEOUT seconds (not much later) naming the URI; on a live mount a
              read fails with EIO as late, the device stays dead (later reads fail at once,
              also after SIGCONT) until it is opened again
  read-only   `nbdkit -r`: read-write opens (mount, mkdir, mkfs) refused naming the URI and
              "the server exports it read-only", `-o ro` shows the kernel's tree, the image
              unchanged
  block size  servers advertising a minimum block size (4 KiB; 64 KiB, where 16 KiB nodes
              need read-modify-write) and a small maximum, refusing (EINVAL, logged as
              "rejected") any request that breaks them: mkfs, the workload, concurrent
              writers, check and the kernel
  device add  `device add` of an export, `balance -dconvert=raid1`: check and the kernel
  bad names   connection refused, a missing socket, a stale socket, a wrong export name, a
              malformed URI, `mkfs -b` larger than the export, a multi-device mkfs, device add
              and replace naming an unreachable URI: exit status 1, the URI named, the image
              untouched
  messages    a refused open's last line does not blame IMAGE when a --device URI is
              unreachable; a read-only export is not refused by the offline write commands
              as "cannot be written with a device missing"

Needs root, loop devices, kernel btrfs, FUSE, nbdkit, qemu-nbd and nbdinfo (skipped, or
failed under CI, without them). About 20 s under ASan on 2 cores.
"""
import errno
import hashlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from butter_it import env, kfs, manifest, oracle, tree
from butter_it.fusemount import FuseMount, is_mounted, read_log

MiB = 1 << 20
EXPORT_SIZE = 512 * MiB
TIMEOUT = 3                     # BUTTER_NBD_TIMEOUT where a test waits for it
SLACK = 12                      # seconds an ASan build may take beyond a bound


# ---------------------------------------------------------------------------------
# NBD servers owned by the test

class NbdServer:
    """One NBD server process in the foreground: started, waited for (a full handshake by
    nbdinfo), stopped, resumed and killed by the test; its output in a log file."""

    def __init__(self, argv, uri, log, sock=None):
        self.argv = argv
        self.uri = uri
        self.log = log
        self.sock = sock
        self.proc = None

    def log_text(self):
        return read_log(self.log)

    def start(self, timeout=30):
        if self.sock and os.path.lexists(self.sock):
            os.unlink(self.sock)            # nbdkit leaves its socket behind when killed
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.argv[0]} exited with status {self.proc.returncode}"
                                     f": {' '.join(self.argv)}\n{self.log_text()[-2000:]}")
            r = subprocess.run(["nbdinfo", "--size", self.uri], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=30)
            if r.returncode == 0:
                return self
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.uri} did not answer within {timeout} s: "
                                     f"{' '.join(self.argv)}\n{self.log_text()[-2000:]}")
            time.sleep(0.05)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        """SIGSTOP: the server is there (its socket accepts) but answers nothing."""
        self.proc.send_signal(signal.SIGSTOP)

    def cont(self):
        if self.running():
            self.proc.send_signal(signal.SIGCONT)

    def kill(self):
        """SIGKILL and reap (the image is then final); its socket stays, as after a crash."""
        if self.running():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=60)


class Servers:
    """The `nbd` fixture: makes servers for a test and kills every one of them after it."""

    def __init__(self, workdir, sockdir):
        self.workdir = workdir
        self.sockdir = sockdir              # short: a Unix socket's path has 107 bytes at most
        self.all = []

    def _image(self, image, size):
        if not os.path.exists(image):
            with open(image, "wb") as f:
                f.truncate(size)

    def _start(self, argv, uri, name, sock):
        srv = NbdServer(argv, uri, os.path.join(self.workdir, f"nbd-{name}.log"), sock)
        self.all.append(srv)
        return srv.start()

    def nbdkit(self, image, name, *, filters=(), params=(), readonly=False, tcp=False,
               size=EXPORT_SIZE):
        """nbdkit's file plugin over `image` (a sparse file of `size` made if missing)."""
        self._image(image, size)
        flags = (["-f", "--exit-with-parent"] + (["-r"] if readonly else [])
                 + [f"--filter={f}" for f in filters])
        if not tcp:
            sock = os.path.join(self.sockdir, f"{name}.sock")
            argv = ["nbdkit"] + flags + ["-U", sock, "file", image] + list(params)
            return self._start(argv, f"nbd+unix:///?socket={sock}", name, sock)
        for attempt in range(5):            # a free port now may be taken by the time we bind
            port = free_tcp_port()
            argv = (["nbdkit"] + flags + ["-i", "127.0.0.1", "-p", str(port), "file", image]
                    + list(params))
            try:
                return self._start(argv, f"nbd://127.0.0.1:{port}/", name, None)
            except AssertionError:
                if attempt == 4:
                    raise

    def qemu(self, image, name, *, export="butter", readonly=False, size=EXPORT_SIZE):
        """qemu-nbd over `image`, the export named `export`, persistent (-t)."""
        self._image(image, size)
        sock = os.path.join(self.sockdir, f"{name}.sock")
        argv = (["qemu-nbd", "-k", sock, "-f", "raw", "-t", "-x", export]
                + (["-r"] if readonly else []) + [image])
        return self._start(argv, f"nbd+unix:///{export}?socket={sock}", name, sock)

    def close(self):
        for srv in self.all:
            try:
                srv.kill()
            except Exception as e:          # keep going: kill the rest
                print(f"nbd server {srv.uri}: {e}")


def free_tcp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def nbd(fuse, butter, workdir):
    for tool, package in (("nbdkit", "nbdkit"), ("qemu-nbd", "qemu-utils"),
                          ("nbdinfo", "libnbd-bin")):
        if shutil.which(tool) is None:
            env.unavailable(f"needs the {tool} command (Debian package {package})")
    probe = butter.run(["info", "nbd+unix:///?socket=/nonexistent/x.sock"], check=False)
    if "without libnbd" in probe.stderr:
        env.unavailable("needs a butter built with libnbd (NBD devices)")
    sockdir = tempfile.mkdtemp(prefix="butter-nbd-")
    servers = Servers(workdir, sockdir)
    try:
        yield servers
    finally:
        servers.close()
        shutil.rmtree(sockdir, ignore_errors=True)


# ---------------------------------------------------------------------------------
# helpers

def sha(data):
    return hashlib.sha256(data).hexdigest()


def write_synced(path, data):
    """Write `path` whole and fsync it; raises OSError as the mount answers."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_digests(root, names):
    """{name: sha256 of its bytes, or the errno name of the failed read}."""
    out = {}
    for name in names:
        try:
            with open(os.path.join(root, name), "rb") as f:
                out[name] = sha(f.read())
        except OSError as e:
            out[name] = errno.errorcode.get(e.errno, str(e.errno))
    return out


def drop_caches():
    """Forget the kernel's page cache: reads through a FUSE mount reach the daemon."""
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def payloads(tag, sizes):
    rnd = random.Random(tag)
    return {f"{tag}/f{i}-{size}": rnd.randbytes(size) for i, size in enumerate(sizes)}


SIZES = [0, 1, 4095, 4096, 70000, 300 * 1024 + 3, MiB + 7, 3 * MiB]


def posix_workload(root, seed=11):
    """tree.small_tree (every file type, 0 B to 3 MiB, xattrs, hard link, symlink, fifo,
    device node, a sparse file), then renames, truncates, unlinks, xattr changes, a file
    written in odd pieces and overwritten in its middle, new links; ends with syncfs."""
    tree.small_tree(root, seed=seed)
    rnd = random.Random(seed)
    p = lambda rel: os.path.join(root, rel)                      # noqa: E731
    with open(p("pieces"), "wb") as f:                           # 2+ MiB in odd pieces
        for i in range(40):
            f.write(rnd.randbytes(53 * 1024 + i))
    fd = os.open(p("pieces"), os.O_WRONLY)
    os.pwrite(fd, rnd.randbytes(10000), MiB + 123)               # overwrite in the middle
    os.close(fd)
    os.rename(p("size-70000"), p("dir/renamed"))                 # rename across directories
    os.replace(p("size-100"), p("size-2047"))                    # rename over a file
    os.truncate(p(f"size-{3 * MiB + 5}"), MiB + 3)               # shrink
    os.truncate(p("size-4096"), 200000)                          # grow: a hole
    os.unlink(p("size-2048"))
    os.link(p("pieces"), p("dir/sub/pieces-link"))               # hard link, then unlink
    os.link(p("size-4097"), p("dir/sub/third-link"))             # a group of three
    os.unlink(p("size-1"))
    os.symlink("../../pieces", p("dir/sub/up"))
    os.setxattr(p("dir/sub/text"), "user.new", rnd.randbytes(300))
    os.removexattr(p("dir/sub/text"), "user.k")
    os.setxattr(p("dir"), "user.on-a-dir", b"yes")
    os.makedirs(p("gone/deeper"))
    os.rmdir(p("gone/deeper"))
    os.rmdir(p("gone"))
    tree.syncfs(root)


def concurrent_writers(root, n=4, files=12):
    """`n` threads writing small files of odd sizes into one directory at once."""
    os.makedirs(os.path.join(root, "conc"))
    errors = []

    def work(t):
        rnd = random.Random(f"conc-{t}")
        try:
            for i in range(files):
                with open(os.path.join(root, "conc", f"t{t}-{i}"), "wb") as f:
                    f.write(rnd.randbytes(rnd.randrange(1, 40000)))
        except OSError as e:
            errors.append((t, e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    tree.syncfs(root)


def fs_show_devids(mnt):
    """The kernel's `btrfs filesystem show` of a mount: (devids, output)."""
    out = kfs.run(["btrfs", "filesystem", "show", "--raw", mnt]).stdout
    devids = sorted(int(line.split()[1]) for line in out.splitlines()
                    if line.strip().startswith("devid"))
    return devids, out


def butter_umount(butter, m, status=0):
    """`butter umount`; the daemon's exit status must be `status` (None: any)."""
    r = kfs.run([butter.path, "umount", m.mnt], check=False, timeout=300)
    got = m.wait(120)
    m.check_log()
    if status is not None:
        assert got == status, (f"daemon exit status {got} (umount: {r.returncode} "
                               f"{r.stderr.strip()})\n{m.log_text()[-3000:]}")
    return got


# ---------------------------------------------------------------------------------
# 1. a POSIX workload over nbdkit, read back over qemu-nbd

def test_workload_over_nbdkit_then_read_over_qemu_nbd(nbd, butter, workdir):
    image = os.path.join(workdir, "disk.img")
    srv = nbd.nbdkit(image, "kit")
    butter.run(["mkfs", "-q", "-L", "over-nbd", srv.uri])
    with FuseMount(butter.path, [srv.uri], os.path.join(workdir, "mnt")) as m:
        posix_workload(m.mnt)
        seen = manifest.take(m.mnt)
        assert seen["pieces"]["size"] > 2 * MiB and seen["dir/fifo"]["type"] == "fifo"
        assert m.unmount() == 0
        assert "abort" not in m.log_text(), m.log_text()[-3000:]
    srv.kill()
    oracle.btrfs_check(image, strict=True)
    oracle.kernel_sees(seen, image, mnt=os.path.join(workdir, "kview"))
    digest = manifest.image_digest(image)

    q = nbd.qemu(image, "qemu", export="butter", readonly=True)
    assert "/butter?socket=" in q.uri
    r = butter.run(["check", q.uri])
    assert b"0 error(s) found" in r.stdout, r.stdout
    assert b"over-nbd" in butter.info([q.uri]).stdout
    out = os.path.join(workdir, "extracted")
    butter.extract([q.uri], out)
    oracle.assert_tree(seen, out, "butter extract over qemu-nbd")
    with FuseMount(butter.path, [q.uri], os.path.join(workdir, "mnt-ro"), ["ro"]) as m:
        oracle.assert_tree(seen, m.mnt, "a read-only butter mount over qemu-nbd")
        assert m.unmount() == 0
    q.kill()
    assert manifest.image_digest(image) == digest, "reading over qemu-nbd changed the image"


# ---------------------------------------------------------------------------------
# 2. raid1: a server lost in the middle of a write loop

@pytest.mark.butter_timeout(300)
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_raid1_server_lost_mid_write_then_degraded_replace(nbd, butter, workdir, monkeypatch,
                                                            how):
    """kill: SIGKILL, the connection closes (noticed at once); stop: SIGSTOP, the server
    never answers (noticed after BUTTER_NBD_TIMEOUT seconds)."""
    monkeypatch.setenv("BUTTER_NBD_TIMEOUT", str(TIMEOUT))
    img = {n: os.path.join(workdir, f"{n}.img") for n in ("a", "b", "c")}
    a = nbd.nbdkit(img["a"], "a")
    b = nbd.nbdkit(img["b"], "b", tcp=True)                      # nbd://127.0.0.1:PORT/
    butter.run(["mkfs", "-q", "-d", "raid1", "-m", "raid1", a.uri, b.uri])
    first = payloads("first", SIZES)
    synced = {}                                                   # every file fsync accepted
    with FuseMount(butter.path, [a.uri, b.uri], os.path.join(workdir, "mnt")) as m:
        for rel, data in first.items():
            write_synced(os.path.join(m.mnt, rel), data)
        synced.update(first)

        result = {}
        started = threading.Event()

        def writer():
            rnd = random.Random("loop")
            try:
                for i in range(100000):
                    rel, data = f"loop/f{i}", rnd.randbytes(128 * 1024 + i)
                    write_synced(os.path.join(m.mnt, rel), data)
                    synced[rel] = data
                    if i == 5:
                        started.set()
            except OSError as e:
                result["error"], result["when"] = e, time.monotonic()
            started.set()

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        assert started.wait(120), "the writer made no progress"
        assert "error" not in result, f"the writer failed before the server went: {result}"
        gone = time.monotonic()
        if how == "kill":
            b.kill()
        else:
            b.stop()
        t.join(TIMEOUT + 60)
        assert not t.is_alive(), f"the writer still runs {TIMEOUT + 60} s after the {how}"
        assert "error" in result, "the writer never saw the device go"
        took = result["when"] - gone
        assert took < TIMEOUT + SLACK, f"the write failed only {took:.1f} s after the {how}"
        if how == "stop":        # a request sent just before the stop times out a bit sooner
            assert took > TIMEOUT - 1, f"the write failed {took:.1f} s after the stop"
        assert result["error"].errno in (errno.EIO, errno.EROFS), result["error"]
        log = m.log_text()
        why = ("the server closed the connection" if how == "kill"    # or a flush, a read:
               else rf"no answer to a (write|read) within {TIMEOUT} s|no answer to a flush in time")
        assert re.search(rf"{re.escape(b.uri)}: ({why}); the device is gone until it is opened "
                         "again", log), log[-3000:]

        # read-only now; every fsynced file reads back right, from the surviving copy
        with pytest.raises(OSError) as e:
            write_synced(os.path.join(m.mnt, "after"), b"x")
        assert e.value.errno in (errno.EROFS, errno.EIO), e.value
        drop_caches()
        want = {rel: sha(data) for rel, data in synced.items()}
        assert read_digests(m.mnt, want) == want
        butter_umount(butter, m, status=None)      # the final commit may fail: b is gone

    # the survivor alone, degraded: fsynced files are there (the tree log replayed)
    c = nbd.nbdkit(img["c"], "c")
    later = payloads("later", [5000, 2 * MiB])
    with FuseMount(butter.path, [a.uri], os.path.join(workdir, "mnt2"), ["degraded"]) as m:
        assert read_digests(m.mnt, want) == want
        r = kfs.run([butter.path, "replace", "start", "-B", "2", c.uri, m.mnt], check=False,
                    timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        for rel, data in later.items():
            write_synced(os.path.join(m.mnt, rel), data)
        butter_umount(butter, m)
    a.kill()
    c.kill()
    want.update({rel: sha(data) for rel, data in later.items()})
    assert int(kfs.super_fields(img["c"])["dev_item.devid"]) == 2
    oracle.btrfs_check(img["a"], img["c"], strict=True)
    # not degraded: the kernel refuses raid1 with a device missing without -o degraded
    with oracle.kernel_mount(img["a"], img["c"], mnt=os.path.join(workdir, "kview")) as k:
        devids, out = fs_show_devids(k)
        assert devids == [1, 2] and "missing" not in out.lower(), out
        assert read_digests(k, want) == want


# ---------------------------------------------------------------------------------
# 3. raid5: a server killed, reads rebuilt from parity, replace onto a fourth

@pytest.mark.butter_timeout(300)
def test_raid5_server_killed_reads_rebuilt_then_replace(nbd, butter, workdir, monkeypatch):
    monkeypatch.setenv("BUTTER_NBD_TIMEOUT", str(TIMEOUT))
    img = [os.path.join(workdir, f"d{i}.img") for i in range(1, 5)]
    srv = [nbd.nbdkit(img[i], f"d{i + 1}") for i in range(3)]
    uris = [s.uri for s in srv]
    butter.run(["mkfs", "-q", "-d", "raid5", "-m", "raid5"] + uris)
    files = payloads("r5", SIZES + [5 * MiB + 11, 200 * 1024])
    want = {rel: sha(data) for rel, data in files.items()}
    opts = [f"device={uris[1]}", f"device={uris[2]}"]
    with FuseMount(butter.path, uris[:1], os.path.join(workdir, "mnt"), opts) as m:
        os.mkdir(os.path.join(m.mnt, "r5"))
        for rel, data in files.items():
            with open(os.path.join(m.mnt, rel), "wb") as f:
                f.write(data)
        assert m.unmount() == 0

    # a cold mount (nothing cached), then device 2 goes: every byte from data + parity
    with FuseMount(butter.path, uris[:1], os.path.join(workdir, "mnt"), opts) as m:
        os.listdir(m.mnt)
        srv[1].kill()
        got = read_digests(m.mnt, want)
        assert got == want, {k: v for k, v in got.items() if v != want[k]}
        butter_umount(butter, m, status=None)
        log = m.log_text()
        assert uris[1] in log, log[-3000:]
        # once gone, the device counts as missing: no line per sector read around it
        assert log.count("data read error") <= 4, log[-3000:]

    d4 = nbd.nbdkit(img[3], "d4")
    with FuseMount(butter.path, [uris[0], uris[2]], os.path.join(workdir, "mnt2"),
                   ["degraded"]) as m:
        assert read_digests(m.mnt, want) == want
        r = kfs.run([butter.path, "replace", "start", "-B", "2", d4.uri, m.mnt], check=False,
                    timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        butter_umount(butter, m)
    for s in (srv[0], srv[2], d4):
        s.kill()
    members = [img[0], img[2], img[3]]
    assert int(kfs.super_fields(img[3])["dev_item.devid"]) == 2
    oracle.btrfs_check(*members, strict=True)
    with oracle.kernel_mount(*members, mnt=os.path.join(workdir, "kview")) as k:
        devids, out = fs_show_devids(k)
        assert devids == [1, 2, 3] and "missing" not in out.lower(), out
        assert read_digests(k, want) == want
        r = kfs.run(["btrfs", "scrub", "start", "-B", "-r", k], check=False, timeout=300)
        assert r.returncode == 0 and "no errors found" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------------------------
# 4. server errors (nbdkit's error filter): the request fails, the connection stays

def stats_by_devid(text):
    """butter/btrfs `device stats` output → {devid-or-path: {counter: n}}."""
    out = {}
    for line in text.splitlines():
        if line.startswith("[") and "]." in line:
            dev, rest = line[1:].split("].", 1)
            name, value = rest.split()
            out.setdefault(dev, {})[name] = int(value)
    return out


def test_raid1_read_errors_read_around_and_counted(nbd, butter, workdir):
    img = {n: os.path.join(workdir, f"{n}.img") for n in ("a", "b")}
    trig = {n: os.path.join(workdir, f"fail-reads-{n}") for n in ("a", "b")}
    srv = {n: nbd.nbdkit(img[n], n, filters=["error"],
                         params=["error-pread=EIO", "error-pread-rate=100%",
                                 f"error-pread-file={trig[n]}"]) for n in ("a", "b")}
    uris = [srv["a"].uri, srv["b"].uri]
    butter.run(["mkfs", "-q", "-d", "raid1", "-m", "raid1"] + uris)
    files = payloads("e", SIZES)
    want = {rel: sha(data) for rel, data in files.items()}
    mnt = os.path.join(workdir, "mnt")
    with FuseMount(butter.path, uris, mnt) as m:
        for rel, data in files.items():
            write_synced(os.path.join(m.mnt, rel), data)
        assert m.unmount() == 0

    # each mirror fails every read in turn, on a cold mount: reads go on from the other
    # copy (butter reads copy 1 first, so `a` failing is read around), a read-only scrub
    # counts the failing mirror's errors, and once the errors stop the same connection
    # serves again (a server error is not a dead device): a second scrub finds nothing
    counted = {u: 0 for u in uris}
    for n in ("a", "b"):
        with FuseMount(butter.path, uris, mnt) as m:
            os.listdir(m.mnt)
            open(trig[n], "w").close()
            try:
                assert read_digests(m.mnt, want) == want, f"reads with {n} failing"
                r = kfs.run([butter.path, "scrub", "start", "-B", "-r", m.mnt], check=False)
                assert r.returncode == 3 and "read=" in r.stdout, r.stdout + r.stderr
            finally:
                os.unlink(trig[n])
            r = kfs.run([butter.path, "scrub", "start", "-B", "-r", m.mnt], check=False)
            assert r.returncode == 0 and "no errors found" in r.stdout, r.stdout + r.stderr
            log = m.log_text()
            assert "the device is gone" not in log, log[-3000:]
            assert f"on {srv[n].uri} (devid {1 if n == 'a' else 2})" in log, log[-3000:]
            stats = stats_by_devid(butter.run(["device", "stats", m.mnt]).stdout.decode())
            now = {u: stats[u]["read_io_errs"] for u in uris}
            assert now[srv[n].uri] > counted[srv[n].uri], (n, counted, stats)
            counted = now
            assert m.unmount() == 0
    for s in srv.values():
        assert "error: injecting EIO error into pread" in s.log_text()

    # committed at the unmount: butter offline and the kernel count the same
    r = butter.run(["device", "stats", "--device", uris[1], uris[0]])
    offline = stats_by_devid(r.stdout.decode())
    assert {u: offline[u]["read_io_errs"] for u in uris} == counted, (offline, counted)
    for s in srv.values():
        s.kill()
    oracle.btrfs_check(img["a"], img["b"], strict=True)
    with oracle.kernel_mount(img["a"], img["b"], mnt=os.path.join(workdir, "kview")) as k:
        kernel = stats_by_devid(kfs.run(["btrfs", "device", "stats", k]).stdout)
        assert read_digests(k, want) == want
    # the kernel names loop devices: a is devid 1, b devid 2 (mkfs order); its lines come
    # in devid order
    assert [c["read_io_errs"] for c in kernel.values()] == [counted[u] for u in uris], \
        (kernel, counted)


@pytest.mark.parametrize("err", ["EIO", "ENOSPC"])
def test_write_errors_abort_and_keep_the_last_commit(nbd, butter, workdir, err):
    """The server's errno reaches the writer and the log; the connection stays (reads
    through it go on); BUTTER_NBD_TIMEOUT is the default 30 s: no waiting for it."""
    image = os.path.join(workdir, "disk.img")
    trig = os.path.join(workdir, "fail-writes")
    srv = nbd.nbdkit(image, "w", filters=["error"],
                     params=[f"error-pwrite={err}", "error-pwrite-rate=100%",
                             f"error-pwrite-file={trig}"])
    code = getattr(errno, err)
    butter.run(["mkfs", "-q", srv.uri])
    kept = payloads("kept", [10, 70000, 2 * MiB])
    mnt = os.path.join(workdir, "mnt")
    with FuseMount(butter.path, [srv.uri], mnt, ["commit=300"]) as m:
        for rel, data in kept.items():
            write_synced(os.path.join(m.mnt, rel), data)
        kfs.run([butter.path, "filesystem", "sync", m.mnt])
        open(trig, "w").close()                  # from now on every write fails
        start = time.monotonic()
        with pytest.raises(OSError) as e:
            write_synced(os.path.join(m.mnt, "lost"), os.urandom(300000))
        assert e.value.errno == code, e.value
        assert time.monotonic() - start < SLACK, "a server error took a timeout"
        for change in (lambda: open(os.path.join(m.mnt, "new"), "w"),
                       lambda: os.mkdir(os.path.join(m.mnt, "dir"))):
            with pytest.raises(OSError) as e:
                change()
            assert e.value.errno == errno.EROFS, e.value
        drop_caches()
        assert read_digests(m.mnt, kept) == {rel: sha(d) for rel, d in kept.items()}
        log = m.log_text()
        assert re.search(rf"write error: .* on {re.escape(srv.uri)} \(devid 1\) .*: "
                         rf"{os.strerror(code)}", log), log[-3000:]
        assert "the filesystem is now read-only" in log and "the device is gone" not in log, \
            log[-3000:]
        butter_umount(butter, m, status=1)
    os.unlink(trig)
    # the same server, errors off: the last commit is intact
    with FuseMount(butter.path, [srv.uri], mnt) as m:
        assert read_digests(m.mnt, kept) == {rel: sha(d) for rel, d in kept.items()}
        assert sorted(os.listdir(m.mnt)) == ["kept"]
        assert m.unmount() == 0
    srv.kill()
    oracle.btrfs_check(image, strict=True)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kview")) as k:
        assert tree.read_tree(k) == kept


# ---------------------------------------------------------------------------------
# 5. a server that stops answering

def test_stopped_server_times_out_naming_the_uri(nbd, butter, workdir, monkeypatch):
    monkeypatch.setenv("BUTTER_NBD_TIMEOUT", "2")
    image = os.path.join(workdir, "disk.img")
    srv = nbd.nbdkit(image, "s")
    butter.run(["mkfs", "-q", srv.uri])
    files = payloads("s", [5000, MiB + 1, 70000])
    want = {rel: sha(d) for rel, d in files.items()}
    mnt = os.path.join(workdir, "mnt")
    with FuseMount(butter.path, [srv.uri], mnt) as m:
        for rel, data in files.items():
            write_synced(os.path.join(m.mnt, rel), data)
        assert m.unmount() == 0

    try:
        srv.stop()
        start = time.monotonic()
        r = butter.run(["info", srv.uri], check=False, timeout=120)
        took = time.monotonic() - start
        assert r.returncode == 1 and "Sanitizer" not in r.stderr, r.stderr
        assert srv.uri in r.stderr and "no answer" in r.stderr, r.stderr
        assert 2 <= took < 2 + SLACK, f"butter info gave up after {took:.1f} s"
        start = time.monotonic()
        r = butter.run(["mount", srv.uri, mnt], check=False, timeout=120)
        took = time.monotonic() - start
        assert r.returncode == 1 and f"{srv.uri}: no answer" in r.stderr, r.stderr
        assert 2 <= took < 2 + SLACK and not is_mounted(mnt), f"mount gave up after {took:.1f} s"
    finally:
        srv.cont()

    with FuseMount(butter.path, [srv.uri], mnt) as m:
        names = sorted(files)
        os.listdir(os.path.join(m.mnt, "s"))
        try:
            srv.stop()
            start = time.monotonic()
            with pytest.raises(OSError) as e:
                with open(os.path.join(m.mnt, names[0]), "rb") as f:
                    f.read()
            took = time.monotonic() - start
            assert e.value.errno == errno.EIO, e.value
            assert 2 <= took < 2 + SLACK, f"the read failed after {took:.1f} s"
        finally:
            srv.cont()
        log = m.log_text()
        assert f"{srv.uri}: no answer to a read within 2 s" in log, log[-3000:]
        # dead until opened again, though the server answers now: later reads fail at once
        start = time.monotonic()
        got = read_digests(m.mnt, names[1:])
        assert set(got.values()) == {"EIO"}, got
        assert time.monotonic() - start < 2, "a dead device waited for an answer again"
        butter_umount(butter, m, status=None)
    # opened again: the server answers, the image is as the last commit left it
    assert b"Generation" in butter.info([srv.uri]).stdout
    with FuseMount(butter.path, [srv.uri], mnt, ["ro"]) as m:
        assert read_digests(m.mnt, want) == want
        assert m.unmount() == 0
    srv.kill()
    oracle.btrfs_check(image, strict=True)


# ---------------------------------------------------------------------------------
# 6. a read-only export

def test_readonly_export(nbd, butter, workdir):
    with kfs.kernel_fs(workdir, size=512 * MiB, name="k") as fs:
        tree.small_tree(fs.mnt)
        fs.sync()
        expected = manifest.take(fs.mnt)
        fs.release()
        image = fs.images[0]
    digest = manifest.image_digest(image)
    srv = nbd.nbdkit(image, "ro", readonly=True)
    mnt = os.path.join(workdir, "mnt")
    os.makedirs(mnt)
    for argv in (["mount", srv.uri, mnt], ["mkdir", srv.uri, "/new"],
                 ["mkfs", "-f", srv.uri]):
        r = butter.run(argv, check=False, timeout=120)
        assert r.returncode == 1 and "Sanitizer" not in r.stderr, (argv, r.stderr)
        assert f"{srv.uri}: the server exports it read-only" in r.stderr, (argv, r.stderr)
        assert not is_mounted(mnt)
    with FuseMount(butter.path, [srv.uri], mnt, ["ro"]) as m:
        oracle.assert_tree(expected, m.mnt, "a read-only mount of a read-only export")
        assert m.unmount() == 0
    srv.kill()
    assert manifest.image_digest(image) == digest


# ---------------------------------------------------------------------------------
# 7. servers with block size constraints

@pytest.mark.parametrize("minimum,maximum", [(4096, 65536), (65536, 262144)],
                         ids=["min4k-max64k", "min64k-max256k"])
def test_block_size_constraints(nbd, butter, workdir, minimum, maximum):
    image = os.path.join(workdir, "disk.img")
    srv = nbd.nbdkit(image, "bs", filters=["blocksize-policy"],
                     params=[f"blocksize-minimum={minimum}", f"blocksize-preferred={minimum}",
                             f"blocksize-maximum={maximum}", "blocksize-error-policy=error"])
    info = kfs.run(["nbdinfo", srv.uri]).stdout
    assert f"block_size_minimum: {minimum}" in info and \
        f"block_size_maximum: {maximum}" in info, info
    butter.run(["mkfs", "-q", srv.uri])
    with FuseMount(butter.path, [srv.uri], os.path.join(workdir, "mnt")) as m:
        posix_workload(m.mnt)
        concurrent_writers(m.mnt)
        seen = manifest.take(m.mnt)
        assert m.unmount() == 0
        assert "abort" not in m.log_text(), m.log_text()[-3000:]
    srv.kill()
    # the filter logs what it refuses ("client pwrite request rejected: ...")
    assert "rejected" not in srv.log_text(), srv.log_text()[-3000:]
    oracle.btrfs_check(image, strict=True)
    oracle.kernel_sees(seen, image, mnt=os.path.join(workdir, "kview"))


# ---------------------------------------------------------------------------------
# 8. device add of an export, then a conversion to raid1 onto it

def test_device_add_and_convert_onto_an_export(nbd, butter, workdir):
    img = {n: os.path.join(workdir, f"{n}.img") for n in ("a", "d")}
    a = nbd.nbdkit(img["a"], "a")
    d = nbd.nbdkit(img["d"], "d")
    butter.run(["mkfs", "-q", a.uri])
    files = payloads("add", SIZES)
    with FuseMount(butter.path, [a.uri], os.path.join(workdir, "mnt")) as m:
        for rel, data in files.items():
            write_synced(os.path.join(m.mnt, rel), data)
        seen = manifest.take(m.mnt)
        assert m.unmount() == 0
    butter.run(["device", "add", a.uri, d.uri])
    butter.run(["balance", "start", "-dconvert=raid1", "-mconvert=raid1", "--device", d.uri,
                a.uri])
    a.kill()
    d.kill()
    oracle.btrfs_check(img["a"], img["d"], strict=True)
    with oracle.kernel_mount(img["a"], img["d"], mnt=os.path.join(workdir, "kview")) as k:
        oracle.assert_tree(seen, k, "the kernel after device add and balance")
        df = kfs.run(["btrfs", "filesystem", "df", k]).stdout
        for kind in ("Data", "Metadata", "System"):
            assert f"{kind}, RAID1" in df and f"{kind}, single" not in df and \
                f"{kind}, DUP" not in df, df


# ---------------------------------------------------------------------------------
# 9. names that lead nowhere

def test_bad_names_fail_naming_the_uri(nbd, butter, workdir):
    image = os.path.join(workdir, "small.img")
    srv = nbd.nbdkit(image, "small", size=256 * MiB)
    butter.run(["mkfs", "-q", srv.uri])
    digest = manifest.image_digest(image)
    mnt = os.path.join(workdir, "mnt")
    os.makedirs(mnt)

    def refused(argv, uri, *why):
        r = butter.run(argv, check=False, timeout=120)
        assert r.returncode == 1 and "Sanitizer" not in r.stderr, (argv, r.returncode, r.stderr)
        assert uri in r.stderr and all(w in r.stderr for w in why), (argv, r.stderr)
        return r

    # larger than the export
    refused(["mkfs", "-f", "-b", "1G", srv.uri], srv.uri, "smaller than the")
    # nothing listens on the port
    tcp = f"nbd://127.0.0.1:{free_tcp_port()}/"
    for argv in (["info", tcp], ["mkfs", "-f", "-b", "256M", tcp], ["mount", tcp, mnt],
                 ["mount", "-o", f"device={tcp}", srv.uri, mnt]):
        refused(argv, tcp, "Connection refused")
    # no such socket
    nosock = f"nbd+unix:///?socket={nbd.sockdir}/none.sock"
    for argv in (["ls", nosock], ["device", "add", srv.uri, nosock],
                 ["mkfs", "-f", "-d", "raid1", srv.uri, nosock],
                 ["replace", "start", "1", nosock, srv.uri]):
        refused(argv, nosock, "No such file or directory")
    # a wrong export name (qemu-nbd names its export)
    q = nbd.qemu(os.path.join(workdir, "q.img"), "q", export="right", size=64 * MiB)
    wrong = q.uri.replace("/right?", "/wrong?")
    refused(["info", wrong], wrong, "wrong")
    q.kill()
    # no socket given at all
    bad = "nbd+unix:///?sock=/tmp/x"
    refused(["info", bad], bad)
    # a stale socket: the server was killed, its socket stays behind
    srv.kill()
    assert os.path.exists(srv.sock)
    refused(["info", srv.uri], srv.uri, "Connection refused")
    refused(["mount", srv.uri, mnt], srv.uri, "Connection refused")
    assert not is_mounted(mnt)
    assert manifest.image_digest(image) == digest, "a refused command changed the image"
    oracle.btrfs_check(image)


# ---------------------------------------------------------------------------------
# messages of refused opens: the failing device named, nothing else blamed

def test_only_the_unreachable_member_is_blamed(nbd, butter, workdir):
    a = nbd.nbdkit(os.path.join(workdir, "a.img"), "a")
    b = nbd.nbdkit(os.path.join(workdir, "b.img"), "b")
    butter.run(["mkfs", "-q", "-d", "raid1", "-m", "raid1", a.uri, b.uri])
    b.kill()
    mnt = os.path.join(workdir, "mnt")
    os.makedirs(mnt)
    for argv in (["info", "--device", b.uri, a.uri], ["mkdir", "--device", b.uri, a.uri, "/d"],
                 ["mount", "-o", f"device={b.uri}", a.uri, mnt]):
        r = butter.run(argv, check=False, timeout=120)
        assert r.returncode == 1 and f"{b.uri}: " in r.stderr, (argv, r.stderr)
        assert f"butter: {a.uri}: Connection refused" not in r.stderr, \
            f"{argv}: the reachable {a.uri} is blamed:\n{r.stderr}"


def test_readonly_export_refusal_blames_no_missing_device(nbd, butter, workdir):
    image = os.path.join(workdir, "disk.img")
    srv = nbd.nbdkit(image, "rw")
    butter.run(["mkfs", "-q", srv.uri])
    srv.kill()
    srv = nbd.nbdkit(image, "ro", readonly=True)
    for argv in (["mkdir", srv.uri, "/new"], ["put", srv.uri, "/etc/hostname", "/h"],
                 ["scrub", srv.uri], ["filesystem", "label", srv.uri, "x"]):
        r = butter.run(argv, check=False, timeout=120)
        assert r.returncode == 1 and "the server exports it read-only" in r.stderr, \
            (argv, r.stderr)
        assert "device missing" not in r.stderr, f"{argv}:\n{r.stderr}"


# ---------------------------------------------------------------------------------
# one writer per export on this machine (the claim on the URI's lock file)

def test_one_writer_per_uri_on_this_machine(nbd, butter, workdir):
    """While a mount writes an export, an offline writer of the same URI is refused naming the
    mount, a reader sees the last commit, and a second mount binds to the first (one daemon,
    one filesystem): without the claim both would write and one's commits would be lost."""
    image = os.path.join(workdir, "disk.img")
    srv = nbd.nbdkit(image, "one")
    butter.run(["mkfs", "-q", srv.uri])
    mnt, mnt2 = os.path.join(workdir, "mnt"), os.path.join(workdir, "mnt2")
    os.makedirs(mnt2)
    with FuseMount(butter.path, [srv.uri], mnt) as m:
        write_synced(os.path.join(m.mnt, "from-mount"), b"kept")
        r = butter.run(["mkdir", srv.uri, "/offline"], check=False, timeout=120)
        assert r.returncode == 1, r.stderr
        assert f"{srv.uri}: in use: open read-write by" in r.stderr and m.mnt in r.stderr, \
            r.stderr
        r = butter.run(["ls", srv.uri, "/"], check=False, timeout=120)
        assert r.returncode == 0 and "reading it as its last commit left it" in r.stderr, \
            r.stderr
        r = butter.run(["mount", srv.uri, mnt2], check=False, timeout=120)
        assert r.returncode == 0, r.stderr
        try:
            assert os.stat(mnt2).st_dev == os.stat(m.mnt).st_dev, "a second daemon, not a bind"
            write_synced(os.path.join(mnt2, "from-second"), b"also kept")
            assert os.path.exists(os.path.join(m.mnt, "from-second"))
        finally:
            kfs.run([butter.path, "umount", mnt2], check=False, timeout=300)
        assert m.unmount() == 0
    butter.run(["mkdir", srv.uri, "/offline"])       # free again once the mount is gone
    srv.kill()
    oracle.btrfs_check(image, strict=True)
    names = set(butter.run(["ls", image, "/"]).stdout.decode().split())
    assert {"from-mount", "from-second", "offline"} <= names, names
