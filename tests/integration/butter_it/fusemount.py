"""Mounts made with `butter mount`: one daemon per mount, its log, and an unmount that
always happens.

    with fusemount.FuseMount(butter_bin, images, mnt, options=["ro"]) as m:
        ... use m.mnt ...
        m.unmount()              # fusermount3 -u; wait for the daemon; its exit status
    # leaving the block always unmounts and stops the daemon, even after a failure

Invariants:
  1. A mount made here is gone when its `with` block ends, whatever happened inside:
     fusermount3 -u (retried while busy), then fusermount3 -uz, then umount -l; a daemon
     still running after that gets SIGTERM, then SIGKILL.
  2. The daemon commits after the kernel lets go of the mount, so an image is final only
     once the daemon has exited: unmount() waits for that and returns the exit status.
  3. The daemon runs in the foreground (-f) with stdout and stderr in a log file; a
     sanitizer report in the log fails the test (check_log), also when the block ends.
"""
import os
import shutil
import signal
import subprocess
import time

from . import env, kfs, oracle

SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                   "UndefinedBehaviorSanitizer", "runtime error:", "ThreadSanitizer",
                   "AddressSanitizer:DEADLYSIGNAL")
FSTYPE = "fuse.butter"


def require_fuse():
    """Skip (or under CI fail) the current test unless FUSE mounts can be made here."""
    env.require_kernel()
    if not os.path.exists("/dev/fuse"):
        env.unavailable("needs /dev/fuse (FUSE in the kernel)")
    if shutil.which("fusermount3") is None:
        env.unavailable("needs the fusermount3 command (Debian package fuse3)")


def is_mounted(mnt):
    mnt = os.path.realpath(mnt)
    return any(m == mnt and t == FSTYPE for m, t in kfs.mount_table())


def sanitizer_report(text):
    """Return the first line of a sanitizer report in `text`, or None."""
    for line in text.splitlines():
        if any(mark in line for mark in SANITIZER_MARKS):
            return line
    return None



def read_log(path):
    """The text of the log file at `path` (undecodable bytes replaced), "" if unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""

class FuseMount:
    def __init__(self, butter_bin, images, mnt, options=(), args=(), log=None):
        self.bin = butter_bin
        self.images = [os.fspath(i) for i in images]
        self.mnt = os.path.realpath(mnt)
        self.options = list(options)
        self.args = list(args)
        self.log = log or self.mnt.rstrip("/") + ".log"
        self.proc = None
        self._logf = None

    def command(self):
        opts = ["-o", ",".join(self.options)] if self.options else []
        return [self.bin, "mount", "-f"] + self.args + opts + self.images + [self.mnt]

    def log_text(self):
        return read_log(self.log)

    def check_log(self):
        bad = sanitizer_report(self.log_text())
        if bad:
            raise AssertionError(f"sanitizer report from the daemon ({self.log}): {bad}\n"
                                 f"{self.log_text()[-4000:]}")

    def start(self, timeout=60):
        os.makedirs(self.mnt, exist_ok=True)
        self._logf = open(self.log, "wb")
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL,
                                     stdout=self._logf, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not is_mounted(self.mnt):
            if self.proc.poll() is not None:
                raise AssertionError(f"butter mount exited with status {self.proc.returncode} "
                                     f"before mounting: {' '.join(self.command())}\n"
                                     f"{self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"butter mount did not mount in {timeout} s: "
                                     f"{' '.join(self.command())}\n{self.log_text()[-3000:]}")
            time.sleep(0.05)
        return self

    def wait(self, timeout=120):
        """Wait for the daemon to exit; return its status (AssertionError on a timeout)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the daemon did not exit within {timeout} s after the "
                                 f"unmount\n{self.log_text()[-3000:]}") from None

    def unmount(self, timeout=120):
        """fusermount3 -u (retried while busy), wait for the daemon, check its log.

        Returns the daemon's exit status.
        """
        for attempt in range(80):
            if not is_mounted(self.mnt):
                break
            proc = kfs.run(["fusermount3", "-u", self.mnt], check=False, timeout=60)
            if proc.returncode == 0:
                break
            time.sleep(0.25)
        else:
            raise AssertionError(f"fusermount3 -u {self.mnt} kept failing: {proc.stderr}")
        status = self.wait(timeout)
        self.check_log()
        return status

    def signal(self, sig, timeout=120):
        """Send `sig` to the daemon, wait for it to exit, check its log; return the status."""
        self.proc.send_signal(sig)
        status = self.wait(timeout)
        self.check_log()
        return status

    def close(self):
        """Unmount whatever way works and stop the daemon (invariant 1)."""
        if is_mounted(self.mnt):
            kfs.run(["fusermount3", "-u", self.mnt], check=False, timeout=60)
        if is_mounted(self.mnt):
            kfs.run(["fusermount3", "-uz", self.mnt], check=False, timeout=60)
        if is_mounted(self.mnt):
            kfs.run(["umount", "-l", self.mnt], check=False, timeout=60)
        if self.proc and self.proc.poll() is None:
            for sig, grace in ((None, 30), (signal.SIGTERM, 30), (signal.SIGKILL, 30)):
                if sig:
                    self.proc.send_signal(sig)
                try:
                    self.proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._logf:
            self._logf.close()
            self._logf = None

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, exc_type, exc, tb):
        self.close()
        if exc_type is None:
            self.check_log()
        return False


def steps_like_kernel(butter_bin, workdir, run_script, want, options, prepare=None):
    """Run `run_script(mnt)` on a new 256M butter image mounted with `options` (after
    `prepare(mnt)` if given) and assert that each step's outcome is the one `want` (the
    same script's on kernel btrfs) has, and that btrfs check finds the image clean after
    the unmount. Returns the image's path and the outcomes."""
    image = os.path.join(workdir, "img")
    kfs.run([butter_bin, "mkfs", "-q", "-b", "256M", image])
    with FuseMount(butter_bin, [image], os.path.join(workdir, "mnt"), options) as m:
        if prepare:
            prepare(m.mnt)
        got = run_script(m.mnt)
        assert m.unmount() == 0
    for w, g in zip(want, got):
        assert w == g, f"step {w[0]!r}: kernel btrfs {w[1:]!r}, butter {g[1:]!r}"
    oracle.btrfs_check(image)
    return image, got
