"""Power cuts at every instant of butter's write path.

Each case runs a seeded workload (tests/tools/workload.c) through libbutter with the
recorder device under it (butter_open_opts.record_log): every write and flush that
reached the image goes to a log, and the workload writes a manifest of what each
commit holds and at which log position it was durable. Then tests/tools/crashreplay
rebuilds every state a power cut could have left on the disk, from a copy of the
starting image:

  - every prefix of the log (each write count between flushes, every flush boundary),
  - the last write torn at 4 KiB granularity (a prefix and a random subset of its
    sectors),
  - random subsets of the writes issued since the last flush (the device may persist
    them in any order),

and requires of each: butter opens it and reads every file; its generation is at least
the last one the manifest says was durable (nothing synced is lost); the tree equals
the manifest's state for that generation (every file holds the content of one commit,
never a mix); `btrfs check --readonly` is clean; and for a sample, the kernel mounts it
read-only and shows the same tree. A last case removes the flushes from a real log and
requires the replay to find damage, so the tool is known to be able to fail.

Workloads: a create/write/rename/unlink/link/xattr mix (16 KiB and 4 KiB nodes), large
overwrites of a few files, and an image that runs out of space (prefilled by the
kernel with a preallocated file, then filled until ENOSPC). About 3000 states in all,
1.5-3 minutes on 2 cores with the sanitizer build (BUTTER_CRASH_SCALE=N multiplies
the operations for a longer soak; bench/reliability.sh runs bigger ones).
"""
import os
import re

import pytest

from butter_it import kfs
from butter_it.tools import REC_FLUSH, log_records, make_image, parse_summary, tool

SCALE = int(os.environ.get("BUTTER_CRASH_SCALE", "1"))


def prefill(workdir, image, size):
    """Let the kernel take `size` bytes of the image's data space with a preallocated file."""
    mnt = os.path.join(workdir, "prefill")
    dev = kfs.loop_attach(image)
    try:
        kfs.mount(dev, mnt, [])
        try:
            kfs.run(["fallocate", "-l", str(size), os.path.join(mnt, "filler")])
        finally:
            kfs.umount(mnt)
    finally:
        kfs.loop_detach(dev)


def record_workload(workdir, start, args, seed, ops, sync_every):
    """Run the workload on a copy of `start` with the recorder; return (log, manifest, stdout)."""
    image = os.path.join(workdir, "img")
    ref = os.path.join(workdir, "ref")
    log = os.path.join(workdir, "log")
    manifest = os.path.join(workdir, "manifest")
    os.mkdir(ref)
    kfs.run(["cp", "--sparse=always", start, image])
    r = kfs.run([tool("butter-workload"), "--record", log, "--manifest", manifest] + args +
                [image, ref, str(seed), str(ops), str(sync_every)], check=False, timeout=900)
    assert r.returncode == 0, f"workload failed:\n{r.stdout}\n{r.stderr}"
    assert "AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr
    check = kfs.run(["btrfs", "check", "--readonly", image], check=False)
    assert check.returncode == 0, f"the workload's own image fails btrfs check:\n{check.stdout}"
    return log, manifest, r.stdout


def replay(workdir, log, manifest, start, extra=()):
    r = kfs.run([tool("crashreplay"), "--work", workdir, "--kernel", "4", "--seed", "1"] +
                list(extra) + [log, manifest, start], check=False, timeout=1800)
    assert "AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr[-5000:]
    return r, parse_summary(r.stdout)


CASES = [
    # name, image size, nodesize, workload options, seed, operations, sync every
    ("mix", 128 << 20, 16384, ["--profile", "mix", "--max-file", str(1 << 20)], 3, 300, 20),
    ("mix-4k-nodes", 128 << 20, 4096, ["--profile", "mix", "--max-file", str(1 << 20)], 4, 300,
     7),
    ("overwrite", 128 << 20, 16384, ["--profile", "overwrite", "--max-file", str(4 << 20)],
     11, 80, 4),
    ("enospc", 110 << 20, 16384,
     ["--profile", "fill", "--max-file", str(2 << 20), "--enospc-ok"], 7, 150, 5),
]


@pytest.mark.butter_timeout(1200)
@pytest.mark.parametrize("name,size,nodesize,args,seed,ops,sync_every", CASES,
                         ids=[c[0] for c in CASES])
def test_crash_states(kernel, workdir, name, size, nodesize, args, seed, ops, sync_every):
    start = os.path.join(workdir, "start.img")
    make_image(start, size, nodesize)
    if name == "enospc":
        prefill(workdir, start, 22 << 20)
    log, manifest, out = record_workload(workdir, start, args, seed, ops * SCALE, sync_every)
    if name == "enospc":
        m = re.search(r"(\d+) ENOSPC", out)
        assert m and int(m.group(1)) > 0, f"the image never filled up: {out}"
    r, s = replay(workdir, log, manifest, start)
    print(r.stdout.strip().splitlines()[-1])
    assert s["failed"] == 0, f"inconsistent crash states:\n{r.stderr[-8000:]}"
    assert s["consistent"] == s["states"]
    assert s["states"] >= 300, f"too few states to mean anything: {s}"
    assert s["torn"] > 0 and s["reordered"] > 0
    assert s["checked"] == s["states"]
    assert s["kmounted"] >= 3 and s["kagreed"] == s["kmounted"]
    assert s["durable_bytes"] > 0


def drop_flushes(src, dst):
    """Copy the record log `src` without its FLUSH records."""
    with open(src, "rb") as f:
        data = f.read()
    out = bytearray(data[:16])
    for rtype, _, _, length, pos in log_records(src):
        if rtype != REC_FLUSH:
            out += data[pos:pos + 24 + length]
    with open(dst, "wb") as f:
        f.write(out)


@pytest.mark.butter_timeout(900)
def test_replay_finds_missing_flushes(kernel, workdir):
    """Without its flushes a log lets the superblock land before the tree: damage must show."""
    start = os.path.join(workdir, "start.img")
    make_image(start, 128 << 20)
    log, manifest, _ = record_workload(workdir, start, ["--profile", "mix", "--max-file",
                                                        str(1 << 19)], 5, 120, 30)
    r, s = replay(workdir, log, manifest, start, ["--no-check", "--kernel", "0"])
    assert s["failed"] == 0, r.stderr[-4000:]
    broken = os.path.join(workdir, "log.noflush")
    drop_flushes(log, broken)
    r, s = replay(workdir, broken, manifest, start, ["--no-check", "--kernel", "0",
                                                     "--reorder", "8"])
    assert s["flushes"] == 0
    assert s["failed"] > 0, f"a log without flushes replayed clean:\n{r.stdout}"
    assert "FAIL" in r.stderr


def test_enospc_never_aborts(kernel, workdir):
    """A write the space reservation accepted must not run out of space half way.

    Known bug (lib/fs/file_write.c, alloc_data): allocation halves the request down to
    16 sectors only, then tries a new chunk; when the data block groups' free space is
    fragmented into runs shorter than 64 KiB and no device space is left, the write fails
    with ENOSPC after part of it was allocated, in phase 2, and the transaction aborts
    (the filesystem turns read-only). The image stays the last committed state.
    """
    start = os.path.join(workdir, "img")
    make_image(start, 110 << 20)
    ref = os.path.join(workdir, "ref")
    os.mkdir(ref)
    r = kfs.run([tool("butter-workload"), "--profile", "fill", "--max-file", str(8 << 20),
                 "--enospc-ok", start, ref, "5", "300", "10"], check=False, timeout=600)
    check = kfs.run(["btrfs", "check", "--readonly", start], check=False)
    assert check.returncode == 0, check.stdout
    if "aborted" in r.stderr:
        pytest.xfail("known bug: ENOSPC in the middle of a write aborts the transaction "
                     "(lib/fs/file_write.c alloc_data stops halving at 16 sectors)")
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
