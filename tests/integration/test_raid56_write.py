"""RAID5 and RAID6 written by butter, judged by the kernel.

Images made by `butter mkfs -d raidN -m raidN` (and kernel-made RAID5/6 images changed by
butter) get files written, removed and rewritten in small and large pieces, so stripe rows
are written whole and in part (read-modify-write of parity). Then:
  - btrfs check --readonly is clean;
  - the kernel's scrub (which verifies every data checksum and every parity block of
    RAID5/6) finds no error;
  - the kernel mounts the image degraded with each device missing (RAID6: also each pair)
    and reads every file byte for byte: only right parity can rebuild the missing data.
"""
import hashlib
import itertools
import os
import random
import re

import pytest

from butter_it import kfs, oracle
from butter_it.tree import walk_files


def images_of(workdir, n):
    return [os.path.join(workdir, f"dev{i}") for i in range(n)]


def make_tree(root, rng, nfiles, big):
    """Files of assorted sizes; returns {relative path: sha256}."""
    want = {}
    os.makedirs(root, exist_ok=True)
    for i in range(nfiles):
        size = rng.choice([0, 100, 4095, 4096, 5000, 65536, 65537, 200000, 300001])
        if i < big:
            size = rng.randrange(1 << 20, 5 << 20)
        data = rng.randbytes(size)
        rel = f"d{i % 5}/f{i}"
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
        want[rel] = hashlib.sha256(data).hexdigest()
    return want


def read_all(mnt):
    """{relative path: SHA-256 (hex)} of every file below `mnt`."""
    return {rel: hashlib.sha256(data).hexdigest() for rel, data in walk_files(mnt)}


def scrub_and_compare(workdir, images, want):
    mnt = os.path.join(workdir, "mnt")
    with oracle.kernel_mount(*images, mnt=mnt, opts=()):
        r = kfs.run(["btrfs", "scrub", "start", "-B", "-R", mnt], check=False, timeout=600)
        out = r.stdout + r.stderr
        errors = {k: int(v) for k, v in re.findall(r"^\s*(\w+_errors): (\d+)", out, re.M)}
        assert r.returncode == 0 and errors and not any(errors.values()), \
            f"scrub found problems:\n{out}"
        assert read_all(mnt) == want


def degraded_reads(workdir, images, want, tolerance):
    for missing in itertools.combinations(range(len(images)), tolerance):
        present = [img for i, img in enumerate(images) if i not in missing]
        mnt = os.path.join(workdir, "dmnt")
        with oracle.kernel_mount(*present, mnt=mnt, opts=("ro", "degraded")):
            got = read_all(mnt)
        assert got == want, f"degraded without devices {missing}: contents differ"


def butter_changes(butter, images, workdir, rng, want):
    """put more, rm some, put again (rows written whole and in part)."""
    b = butter.path
    dev_args = [x for img in images[1:] for x in ("--device", img)]
    extra = os.path.join(workdir, "extra")
    more = make_tree(extra, rng, 25, 2)
    kfs.run([b, "put"] + dev_args + [images[0], extra, "/extra"], timeout=600)
    want.update({f"extra/{k}": v for k, v in more.items()})
    gone = sorted(k for k in want if k.startswith("d1/"))
    kfs.run([b, "rm"] + dev_args + [images[0]] + ["/" + g for g in gone], timeout=600)
    for g in gone:
        del want[g]
    again = os.path.join(workdir, "again")
    more = make_tree(again, rng, 15, 1)
    kfs.run([b, "put"] + dev_args + [images[0], again, "/again"], timeout=600)
    want.update({f"again/{k}": v for k, v in more.items()})


@pytest.mark.parametrize("profile,ndev", [("raid5", 2), ("raid5", 3), ("raid5", 4),
                                          ("raid6", 3), ("raid6", 4)])
def test_butter_made(kernel, butter, workdir, profile, ndev):
    rng = random.Random(f"{profile}{ndev}")
    src = os.path.join(workdir, "src")
    want = make_tree(src, rng, 40, 3)
    images = images_of(workdir, ndev)
    kfs.run([butter.path, "mkfs", "-q", "-b", "400M", "-d", profile, "-m", profile,
             "--rootdir", src] + images, timeout=600)
    oracle.btrfs_check(*images)
    butter_changes(butter, images, workdir, rng, want)
    oracle.btrfs_check(*images)
    scrub_and_compare(workdir, images, want)
    degraded_reads(workdir, images, want, 1 if profile == "raid5" else 2)


@pytest.mark.parametrize("profile", ["raid5", "raid6"])
def test_kernel_made(kernel, butter, workdir, profile):
    rng = random.Random(profile)
    want = {}
    with kfs.kernel_fs(workdir, ndevices=4, mkfs_args=["-d", profile, "-m", profile]) as fs:
        want = make_tree(fs.mnt, rng, 30, 2)
        fs.sync()
        fs.release()
        images = fs.images
    butter_changes(butter, images, workdir, rng, want)
    oracle.btrfs_check(*images)
    scrub_and_compare(workdir, images, want)
    degraded_reads(workdir, images, want, 1)
