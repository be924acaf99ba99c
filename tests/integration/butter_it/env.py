"""Environment knobs of the integration tests, and the skip-or-fail rule.

Knobs (environment variables):
  BUTTER_BIN            the butter binary (default <repo>/build/cli/butter)
  BUTTER_TEST_SCALE     "small" (default, CI) or "large" (bigger files, a 10k-entry
                        directory in every tree, more of everything)
  BUTTER_TEST_TIMEOUT   seconds one test may take, setup and teardown included (600)
  BUTTER_TEST_TMPDIR    where work directories (images, mount points, extracted
                        trees) are made (default: the system temp dir)
  BUTTER_KEEP=1         keep every work directory (default: removed after the test)
  CI=true or BUTTER_REQUIRE_ALL=1
                        a missing capability (root, loop devices, kernel btrfs,
                        a tool) FAILS the test instead of skipping it

The rule: a test that needs root, loop devices or kernel btrfs calls require_kernel()
(through the `kernel` fixture); where those are missing it is skipped with the reason,
except under CI, where it fails, so that CI can never go green by skipping.
"""
import functools
import os
import shutil
import subprocess
import tempfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

SCALE = os.environ.get("BUTTER_TEST_SCALE", "small").strip().lower() or "small"
if SCALE not in ("small", "large"):
    raise RuntimeError(f"BUTTER_TEST_SCALE must be 'small' or 'large', not {SCALE!r}")

TEST_TIMEOUT = int(os.environ.get("BUTTER_TEST_TIMEOUT", "600"))
TMPDIR = os.path.abspath(os.environ.get("BUTTER_TEST_TMPDIR") or tempfile.gettempdir())
KEEP = os.environ.get("BUTTER_KEEP", "") == "1"
REQUIRE_ALL = (os.environ.get("CI", "").strip().lower() == "true"
               or os.environ.get("BUTTER_REQUIRE_ALL", "") == "1")

# Tools the kernel-image tests call. (Package in Debian in parentheses.)
TOOLS = {
    "losetup": "mount", "mount": "mount", "umount": "mount",
    "mkfs.btrfs": "btrfs-progs", "btrfs": "btrfs-progs",
    "setfacl": "acl", "cp": "coreutils", "rm": "coreutils",
}


def butter_bin():
    """Return the path of the butter binary under test (it may not exist)."""
    return os.environ.get("BUTTER_BIN") or os.path.join(REPO, "build", "cli", "butter")


def build_dir_of(binary):
    """The meson build directory `binary` was built in (holding meson-info), or None."""
    d = os.path.dirname(os.path.realpath(binary))
    while d != "/":
        if os.path.isdir(os.path.join(d, "meson-info")):
            return d
        d = os.path.dirname(d)
    return None


def unavailable(reason):
    """Skip the current test for `reason`, or fail it when CI demands every test run."""
    if REQUIRE_ALL:
        pytest.fail(f"{reason} [CI=true or BUTTER_REQUIRE_ALL=1: a missing capability is a "
                    f"failure, not a skip]", pytrace=False)
    pytest.skip(reason)


def _btrfs_in_kernel():
    def listed():
        try:
            with open("/proc/filesystems") as f:
                return any(line.split()[-1:] == ["btrfs"] for line in f)
        except OSError:
            return False
    if listed():
        return True
    if shutil.which("modprobe"):
        subprocess.run(["modprobe", "btrfs"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60)
    return listed()


@functools.lru_cache(maxsize=None)
def missing_kernel_capabilities():
    """Return what this machine lacks for kernel-image tests, as readable strings."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (loop devices, mount, mknod, chown)")
    if not os.path.exists("/dev/loop-control"):
        missing.append("/dev/loop-control (loop device support)")
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None:
            missing.append(f"the {tool} command (Debian package {package})")
    if not _btrfs_in_kernel():
        missing.append("btrfs in the running kernel (/proc/filesystems)")
    return tuple(missing)


def require_kernel():
    """Skip (or under CI fail) the current test unless kernel-image tests can run here."""
    missing = missing_kernel_capabilities()
    if missing:
        unavailable("needs " + "; ".join(missing))

