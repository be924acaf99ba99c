"""pytest glue for butter's integration tests (see README.md here).

Fixtures:
  kernel    (session) skip, or under CI fail, unless root + loop devices + kernel btrfs
            + the tools are all here (butter_it.env)
  butter    (session) a butter_it.butter.Butter for the binary under test; fails with a
            clear message when the binary is missing (tests never hang waiting for it)
  workdir   (function) a fresh directory for one test's images, mounts and extracted
            trees; unmounted, detached and deleted afterwards (BUTTER_KEEP=1 keeps it)
  fuse      (function) what `kernel` asks, plus /dev/fuse and fusermount3
            (butter_it.fusemount.require_fuse); a test file may define its own

Every test runs under a SIGALRM timeout covering its setup, call and teardown
(BUTTER_TEST_TIMEOUT, default 600 s; a test can ask for more with
@pytest.mark.butter_timeout(seconds)). Mounts and loop devices left by anything are
undone at the end of the session, at exit and on SIGTERM; those of earlier runs that
died are reaped when the session starts.
"""
import atexit
import os
import signal

import pytest

from butter_it import env, kfs
from butter_it.butter import Butter
from butter_it.fusemount import require_fuse


class ButterTestTimeout(Exception):
    """Raised in a test that ran longer than its time limit."""


def pytest_configure(config):
    config.addinivalue_line("markers", "butter_timeout(seconds): time limit of this test "
                            "(default BUTTER_TEST_TIMEOUT or 600 s)")
    if os.geteuid() == 0 and os.path.isdir("/sys/block"):
        kfs.reap_stale()
    atexit.register(kfs.cleanup_all)

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt("SIGTERM")         # unwinds through every `finally`
    signal.signal(signal.SIGTERM, on_sigterm)


def pytest_unconfigure(config):
    kfs.cleanup_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    marker = item.get_closest_marker("butter_timeout")
    limit = int(marker.args[0]) if marker else env.TEST_TIMEOUT

    def on_alarm(signum, frame):
        raise ButterTestTimeout(f"{item.nodeid} ran longer than {limit} s "
                          f"(BUTTER_TEST_TIMEOUT / butter_timeout marker)")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="session")
def kernel():
    env.require_kernel()


@pytest.fixture(scope="session")
def butter():
    path = env.butter_bin()
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        pytest.fail(f"butter binary missing or not executable: {path} -- build it "
                    f"(meson setup build && ninja -C build) or point BUTTER_BIN at it",
                    pytrace=False)
    return Butter(path)


@pytest.fixture
def fuse(kernel):
    require_fuse()


@pytest.fixture
def workdir(request):
    path = kfs.make_workdir(request.node.name)
    try:
        yield path
    finally:
        kfs.remove_workdir(path)
