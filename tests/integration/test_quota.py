"""Quotas (qgroups) on filesystems butter writes: butter does not count them, so it says so.

A kernel-made image with quotas on (`btrfs quota enable`, as snapper leaves it) is changed by
butter offline and through `butter mount` (files, a new subvolume, a snapshot, a deletion).
Then, judged by btrfs-progs and the kernel:
  - `btrfs check --readonly` exits 0 (before, it failed: "Counts for qgroup id ... are
    different") and the qgroup status item carries INCONSISTENT;
  - butter's new subvolume and snapshot have their qgroups (`btrfs qgroup show`); the deleted
    subvolume's qgroup is gone, as the kernel removes it once the subvolume is dropped;
  - `btrfs quota rescan -w` on a kernel mount clears the flag, and btrfs check, which verifies
    every count when the flag is clear, stays clean.
"""
import os
import re

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount


def status_flags(image):
    out = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", "quota", image]).stdout
    m = re.search(r"key \(0 QGROUP_STATUS 0\).*\n\s+version \d+ generation \d+ flags (\S+)", out)
    assert m, out
    return set(m.group(1).split("|"))


def qgroup_items(image):
    out = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", "quota", image]).stdout
    return sorted(re.findall(r"key \(0 (QGROUP_INFO|QGROUP_LIMIT) (0/\d+)\)", out))


def qgroup_show(mnt):
    """{qgroupid: (referenced, exclusive)} in bytes."""
    out = kfs.run(["btrfs", "qgroup", "show", "--raw", mnt]).stdout
    return {m.group(1): (int(m.group(2)), int(m.group(3)))
            for m in re.finditer(r"^(0/\d+)\s+(\d+)\s+(\d+)", out, re.M)}


def make_quota_image(workdir):
    """A kernel image with quotas on: subvolumes sv (id 256) and gone (257), files in both."""
    image = os.path.join(workdir, "q.img")
    with open(image, "wb") as f:
        f.truncate(512 << 20)
    kfs.run(["mkfs.btrfs", "-q", image])
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kmnt"), opts=()) as mnt:
        kfs.run(["btrfs", "quota", "enable", mnt])
        kfs.run(["btrfs", "subvolume", "create", f"{mnt}/sv"])
        kfs.run(["btrfs", "subvolume", "create", f"{mnt}/gone"])
        with open(f"{mnt}/sv/old", "wb") as f:
            f.write(os.urandom(256 << 10))
        with open(f"{mnt}/gone/x", "wb") as f:
            f.write(os.urandom(128 << 10))
    oracle.btrfs_check(image)
    assert "ON" in status_flags(image) and "INCONSISTENT" not in status_flags(image)
    return image


def rescan_and_judge(workdir, image, expect_subvols):
    """Kernel: qgroups of exactly @expect_subvols' ids (plus 0/5), rescan; then check clean."""
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kmnt"), opts=()) as mnt:
        before = qgroup_show(mnt)
        assert sorted(before) == sorted(["0/5"] + [f"0/{i}" for i in expect_subvols]), before
        kfs.run(["btrfs", "quota", "rescan", "-w", mnt])
        after = qgroup_show(mnt)
    assert "INCONSISTENT" not in status_flags(image)
    out = oracle.btrfs_check(image)
    assert "marked as inconsistent" not in out and "Rescan hasn" not in out, out
    return after


def test_offline_changes_mark_quotas_inconsistent(kernel, butter, workdir):
    image = make_quota_image(workdir)
    host = os.path.join(workdir, "new")
    with open(host, "wb") as f:
        f.write(os.urandom(1 << 20))
    r = butter.run(["put", image, host, "/sv/new"])
    assert "btrfs quota rescan" in r.stderr
    assert "INCONSISTENT" in status_flags(image)
    oracle.btrfs_check(image)
    r = butter.run(["subvolume", "create", image, "/made"])
    assert "quota" not in r.stderr  # one warning: the flag is set already
    butter.run(["subvolume", "snapshot", image, "/sv", "/snap"])
    butter.run(["subvolume", "delete", image, "/gone"])
    assert "INCONSISTENT" in status_flags(image)
    oracle.btrfs_check(image)
    # what the kernel writes for a new qgroup: an info and a limit item each; 0/257 dropped
    assert qgroup_items(image) == sorted(
        (kind, q) for kind in ("QGROUP_INFO", "QGROUP_LIMIT")
        for q in ("0/5", "0/256", "0/258", "0/259"))
    after = rescan_and_judge(workdir, image, [256, 258, 259])
    # the snapshot refers to everything of sv; sv's 1.25 MiB of data is shared with it
    assert after["0/256"][0] >= (1 << 20) + (256 << 10)
    assert after["0/259"][0] == after["0/256"][0]
    assert after["0/256"][1] < (64 << 10)


def test_mount_changes_mark_quotas_inconsistent(fuse, butter, workdir):
    image = make_quota_image(workdir)
    b = butter.path
    with FuseMount(b, [image], os.path.join(workdir, "mnt")) as m:
        mnt = m.mnt
        with open(f"{mnt}/sv/new", "wb") as f:
            f.write(os.urandom(1 << 20))
        os.unlink(f"{mnt}/sv/old")
        kfs.run([b, "subvolume", "create", f"{mnt}/made"])
        with open(f"{mnt}/made/a", "wb") as f:
            f.write(os.urandom(300 << 10))
        kfs.run([b, "subvolume", "snapshot", f"{mnt}/sv", f"{mnt}/snap"])
        kfs.run([b, "subvolume", "delete", f"{mnt}/gone"])
        assert m.unmount() == 0
        assert m.log_text().count("btrfs quota rescan") == 1
    assert "INCONSISTENT" in status_flags(image)
    oracle.btrfs_check(image)
    after = rescan_and_judge(workdir, image, [256, 258, 259])
    assert after["0/258"][0] >= 300 << 10
    assert after["0/259"][0] == after["0/256"][0] >= 1 << 20
