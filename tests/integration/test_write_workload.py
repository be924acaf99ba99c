"""butter's write path judged by btrfs itself.

A seeded random workload (tests/tools/workload.c: create, overwrite and append at
random offsets, truncate, fallocate in every mode btrfs has (allocate, KEEP_SIZE,
PUNCH_HOLE, ZERO_RANGE) and refused ones, FICLONERANGE clones within one file and
across files (aligned, unaligned, to the source's end), unlink, rename with and without
RENAME_NOREPLACE, mkdir, rmdir, hard links, symlinks, xattrs, with commits every few
operations) runs through libbutter on an image made by mkfs.btrfs, and with system calls
on a reference directory on a kernel-mounted btrfs (so that the kernel's answers are
btrfs's own, FICLONERANGE included). The workload itself fails when butter and the
kernel disagree on an operation's result, and reports how often each operation ran and
succeeded (fallocate and clone must have succeeded at least once). Then:

  1. `btrfs check --readonly` must find no error;
  2. the kernel mounts the image and shows exactly the reference tree (types, modes,
     owners, sizes, contents, symlink targets, xattrs, hard-link groups; times differ
     by construction and are not compared);
  3. the kernel can write to it, and btrfs check still finds no error.
"""
import os
import re

import pytest

from butter_it import kfs, manifest, oracle, tree

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKLOAD = os.environ.get("BUTTER_WORKLOAD",
                          os.path.join(REPO, "build", "tests", "tools", "butter-workload"))

FIELDS = ("type", "mode", "uid", "gid", "size", "target", "sha256", "xattrs")


def _compare(ref, img):
    diffs = []
    for p in sorted(set(ref) | set(img)):
        if p not in img:
            diffs.append(f"{p!r}: missing from the image")
            continue
        if p not in ref:
            diffs.append(f"{p!r}: in the image only")
            continue
        for f in FIELDS:
            if f == "size" and ref[p]["type"] == "dir":
                continue  # directory sizes are filesystem-specific
            if ref[p].get(f) != img[p].get(f):
                diffs.append(f"{p!r}: {f}: reference={ref[p].get(f)!r} image={img[p].get(f)!r}")
    groups = {}
    for name, m in (("ref", ref), ("img", img)):
        g = {}
        for p, e in m.items():
            if e["type"] != "dir":
                g.setdefault((e["_dev"], e["_ino"]), []).append(p)
        groups[name] = sorted(sorted(v) for v in g.values())
    if groups["ref"] != groups["img"]:
        diffs.append(f"hard-link groups differ: reference={groups['ref']} image={groups['img']}")
    return diffs


SEEDS = int(os.environ.get("BUTTER_WORKLOAD_SEEDS", "24"))
OPS = int(os.environ.get("BUTTER_WORKLOAD_OPS", "1000"))
# every fifth seed on images without the NO_HOLES feature (explicit hole items); every
# eighth starts from files the kernel wrote compressed (zstd) into both images, so that
# clones, punches and writes meet compressed and inline-compressed extents
CASES = [(seed, OPS, (4096, 16384, 65536)[seed % 3], (1, 7, 50, 1000)[seed % 4],
          "^no-holes" if seed % 5 == 0 else "", seed % 8 == 3)
         for seed in range(1, SEEDS + 1)]
PRELUDE_DIRS = ("", "a", "b", "a/c")
PRELUDE_SIZES = (100, 3000, 5000, 70000, 300001, 600000)


def _prelude(root, seed):
    """Write compressible files at names of the workload's pool (n0..n5 of four dirs)."""
    for d, dirname in enumerate(PRELUDE_DIRS):
        os.makedirs(os.path.join(root, dirname), exist_ok=True)
        for i, size in enumerate(PRELUDE_SIZES):
            line = b"seed %d file %d/%d: some text that compresses well\n" % (seed, d, i)
            data = (line * (size // len(line) + 1))[:size]
            with open(os.path.join(root, dirname, f"n{i}"), "wb") as f:
                f.write(data)
    tree.syncfs(root)


@pytest.mark.parametrize("seed,ops,nodesize,sync_every,features,prelude", CASES)
def test_random_workload(kernel, workdir, seed, ops, nodesize, sync_every, features, prelude):
    if not os.access(WORKLOAD, os.X_OK):
        pytest.fail(f"workload tool missing: {WORKLOAD} (build with ninja -C build)",
                    pytrace=False)
    mkfs_args = ["-n", str(nodesize)] + (["-O", features] if features else [])
    mount_opts = ["compress-force=zstd"] if prelude else []
    if prelude:
        with kfs.kernel_fs(workdir, size=1 << 30, mkfs_args=["-q"] + mkfs_args,
                           mount_opts=mount_opts, name="image") as imgfs:
            _prelude(imgfs.mnt, seed)
        image = imgfs.images[0]
    else:
        image = os.path.join(workdir, "img")
        with open(image, "wb") as f:
            f.truncate(1 << 30)
        kfs.run(["mkfs.btrfs", "-q", "-f"] + mkfs_args + [image])
    with kfs.kernel_fs(workdir, size=1 << 30, mkfs_args=["-q"] + mkfs_args,
                       mount_opts=mount_opts, name="reference") as reffs:
        ref = reffs.mnt
        if prelude:
            _prelude(ref, seed)
        r = kfs.run([WORKLOAD, image, ref, str(seed), str(ops), str(sync_every)], check=False,
                    timeout=600)
        assert r.returncode == 0, f"workload failed:\n{r.stdout}\n{r.stderr}"
        assert "AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr
        tally = {m.group(1): (int(m.group(2)), int(m.group(3)))
                 for m in re.finditer(r"^(\w+) (\d+) ok (\d+)$", r.stdout, re.M)}
        for op in ("write", "fallocate", "clone"):
            assert tally.get(op, (0, 0))[1] > 0, f"no {op} succeeded: {r.stdout}"
        oracle.btrfs_check(image, butter_agrees=True)
        refman = manifest.take(ref)
    mnt = os.path.join(workdir, "mnt")
    os.mkdir(mnt)
    dev = kfs.loop_attach(image)
    try:
        kfs.mount(dev, mnt, ["ro"])
        try:
            diffs = _compare(refman, manifest.take(mnt))
        finally:
            kfs.umount(mnt)
        assert not diffs, "\n".join(diffs[:40])
        # the kernel must be able to carry on writing where butter left off
        kfs.mount(dev, mnt, [])
        try:
            with open(os.path.join(mnt, "kernel-was-here"), "wb") as f:
                f.write(os.urandom(100000))
            for name in sorted(os.listdir(mnt))[:3]:
                p = os.path.join(mnt, name)
                if os.path.isfile(p) and not os.path.islink(p):
                    os.unlink(p)
        finally:
            kfs.umount(mnt)
    finally:
        kfs.loop_detach(dev)
    oracle.btrfs_check(image, butter_agrees=True)
