"""Where a `butter mount` must behave as the kernel's btrfs mount (issue 17), each scenario run
on butter's mount and on a kernel btrfs side by side.

- readdir while renaming what it lists: a rename gives the entry a new DIR_INDEX past the last
  one; the kernel bounds a listing by the last index at opendir (commit 9b378f6ad48c), so the
  listing ends with each original name seen once. Unbounded, it never ends.
"""
import os

from butter_it import kfs
from butter_it.fusemount import FuseMount

LISTED_FILES = 5000  # the issue had 15,000; 5000 span many readdir replies


def rename_while_listing(d, nfiles):
    """List @d with os.scandir, renaming each entry as it comes; return the names seen.

    Stops (and the caller's assertion fails) once more than twice @nfiles names came.
    """
    seen = []
    with os.scandir(d) as it:
        for e in it:
            seen.append(e.name)
            if len(seen) > 2 * nfiles:
                break
            os.rename(os.path.join(d, e.name), os.path.join(d, f"r{len(seen)}"))
    return seen


def check_listing(seen, nfiles):
    assert len(seen) <= nfiles, f"the listing did not end: {len(seen)} names for {nfiles} files"
    originals = [n for n in seen if n.startswith("f")]
    assert len(originals) == len(set(originals)), "an original name was listed twice"
    assert set(seen) == set(originals), f"renamed entries listed: {sorted(set(seen) - set(originals))[:5]}"
    # every name of the directory at opendir comes, none added since
    assert len(originals) == nfiles


def fill(d, nfiles):
    os.makedirs(d, exist_ok=True)
    for i in range(nfiles):
        open(os.path.join(d, f"f{i:05d}"), "wb").close()


def test_readdir_ends_while_entries_are_renamed(fuse, butter, workdir):
    b = butter.path
    tree = os.path.join(workdir, "tree")
    fill(os.path.join(tree, "d"), LISTED_FILES)
    image = os.path.join(workdir, "img")
    butter.run(["mkfs", "-q", "-b", "256M", "--rootdir", tree, image])
    with FuseMount(b, [image], os.path.join(workdir, "mnt")) as m:
        seen = rename_while_listing(os.path.join(m.mnt, "d"), LISTED_FILES)
        check_listing(seen, LISTED_FILES)
        # a listing opened now sees every entry under its new name, once
        now = os.listdir(os.path.join(m.mnt, "d"))
        assert len(now) == len(set(now)) == LISTED_FILES
        assert all(n.startswith("r") for n in now)
        assert m.unmount() == 0
    r = kfs.run(["btrfs", "check", "--readonly", image], check=False, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    # the kernel's btrfs does the same
    with kfs.kernel_fs(workdir, size=256 << 20) as fs:
        fill(os.path.join(fs.mnt, "d"), LISTED_FILES)
        fs.sync()
        seen = rename_while_listing(os.path.join(fs.mnt, "d"), LISTED_FILES)
        check_listing(seen, LISTED_FILES)
