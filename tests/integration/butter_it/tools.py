"""The test programs of tests/tools (built next to the butter binary) and their files.

  tool(name)            path of butter-workload / crashreplay; fails the test if missing
                        (BUTTER_TOOLS overrides the directory)
  prng_bytes(seed, n)   the bytes butter-fileop's and butter-logtool's `write PATH OFF LEN
                        SEED` write (tests/tools/toolutil.h tool_fill, an xorshift)
  parse_summary(text)   the figures of crashreplay's summary line, as a dict (rw_* and
                        deg_* too when it has them)
  log_records(log)      (type, device, offset, length) of each record of a record log
                        (format: lib/device/recorder.c)
"""
import os
import re
import struct

import pytest

from . import env

SUMMARY = re.compile(
    r"crashreplay: records (\d+) \(writes (\d+), flushes (\d+)\); states (\d+) \(prefix (\d+), "
    r"torn (\d+), reordered (\d+)\); consistent (\d+); failed (\d+); btrfs-check (\d+); "
    r"kernel-mounted (\d+), agreed (\d+); durable-bytes-verified (\d+)")
FIELDS = ("records", "writes", "flushes", "states", "prefix", "torn", "reordered",
          "consistent", "failed", "checked", "kmounted", "kagreed", "durable_bytes")
REC_DEVICE, REC_WRITE, REC_FLUSH = 1, 2, 3
# the read-write and degraded checks (crashreplay --rw-check, --degraded)
SUMMARY_RW = re.compile(
    r"rw-opened (\d+), agreed (\d+), drops-finished (\d+), logs-replayed (\d+); "
    r"degraded-opened (\d+), agreed (\d+), tolerated (\d+), at-commits (\d+)")
FIELDS_RW = ("rw_opened", "rw_agreed", "rw_drops", "rw_logs", "deg_opened", "deg_agreed",
             "deg_tolerated", "deg_commits")


def tools_dir():
    """The directory of the test programs: next to the butter binary's build tree."""
    if os.environ.get("BUTTER_TOOLS"):
        return os.environ["BUTTER_TOOLS"]
    return os.path.join(os.path.dirname(os.path.dirname(env.butter_bin())), "tests", "tools")


def tool(name):
    path = os.path.join(tools_dir(), name)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name} missing: {path} (build it, or set BUTTER_TOOLS)", pytrace=False)
    return path


def prng_bytes(seed, length):
    """The bytes `write PATH OFF LEN SEED` of butter-fileop / butter-logtool writes."""
    mask = (1 << 64) - 1
    x = (seed * 2654435761 + 1) & mask
    out = bytearray(length)
    for i in range(length):
        x ^= (x << 13) & mask
        x ^= x >> 7
        x ^= (x << 17) & mask
        out[i] = x & 0xFF
    return bytes(out)


def parse_summary(out):
    m = SUMMARY.search(out)
    assert m, f"no summary line from crashreplay:\n{out[-3000:]}"
    figures = dict(zip(FIELDS, (int(g) for g in m.groups())))
    m = SUMMARY_RW.search(out)
    if m:
        figures.update(zip(FIELDS_RW, (int(g) for g in m.groups())))
    return figures


def log_records(log):
    """Yield (type, device, offset, length, payload start) for each record of `log`."""
    with open(log, "rb") as f:
        data = f.read()
    assert data[:8] == b"BTRREC01", f"{log}: not a record log"
    pos = 16
    while pos + 24 <= len(data):
        rtype, = struct.unpack_from("<B", data, pos)
        dev, value, length = struct.unpack_from("<IQQ", data, pos + 4)
        yield rtype, dev, value, length, pos
        pos += 24 + length
