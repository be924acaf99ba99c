"""Trees of three and more levels, built and changed by butter, judged by the kernel.

A directory of many small files and hard links gives one subvolume well over 100 000 items
(inode item, inode ref, dir item, dir index and an inline extent per file); with 4 KiB nodes
that makes a tree of at least three levels. butter builds it (mkfs --rootdir), snapshots it,
removes every other file from the original (leaves empty out, nodes merge or shrink), adds
files to the snapshot, deletes the snapshot again, and between steps btrfs check must be
clean and the kernel must show exactly the expected tree.

BUTTER_DEEP_FILES sets the number of files (default 30 000, about 150 000 items).
"""
import os
import re

from butter_it import kfs, oracle

FILES = int(os.environ.get("BUTTER_DEEP_FILES", "30000"))


def tree_levels(image, tree_id):
    out = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", str(tree_id), image],
                  timeout=900).stdout
    levels = [int(x) for x in re.findall(r"^(?:node|leaf) \d+ level (\d+)", out, re.M)]
    items = len(re.findall(r"^\titem \d+ key ", out, re.M))
    return (max(levels) + 1 if levels else 0), items


def kernel_listing(image, workdir, paths):
    """{path: content} for `paths` (relative, under the top level) as the kernel reads them,
    and the sorted names of each directory in `paths` that is a directory."""
    got = {}
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "mnt")) as mnt:
        for p in paths:
            full = os.path.join(mnt, p)
            if os.path.isdir(full):
                got[p] = sorted(os.listdir(full))
            else:
                with open(full, "rb") as f:
                    got[p] = f.read()
    return got


def content(i):
    return (f"file {i}\n" * (1 + i % 7)).encode()


def test_three_level_tree(kernel, butter, workdir):
    b = butter.path
    src = os.path.join(workdir, "src")
    os.makedirs(os.path.join(src, "many"))
    names = [f"entry-{i:06d}-{'x' * (i % 40)}" for i in range(FILES)]
    for i, name in enumerate(names):
        with open(os.path.join(src, "many", name), "wb") as f:
            f.write(content(i))
    image = os.path.join(workdir, "img")
    kfs.run([b, "mkfs", "-q", "-n", "4096", "-b", "1G", "--rootdir", src, "--subvol", "many",
             image], timeout=1800)
    oracle.btrfs_check(image, timeout=900)
    levels, items = tree_levels(image, 256)
    assert levels >= 3 and items >= 100000, f"tree 256: {levels} levels, {items} items"

    # snapshot, then thin out the original: every other file goes
    kfs.run([b, "subvolume", "snapshot", image, "/many", "/snap"])
    gone = names[::2]
    for k in range(0, len(gone), 2000):
        r = kfs.run([b, "rm", image] + [f"/many/{n}" for n in gone[k:k + 2000]],
                    timeout=1800, check=False)
        assert r.returncode == 0, f"butter rm of names {k}..{k + 1999} failed:\n{r.stderr[-3000:]}"
    kfs.run([b, "put", image, os.path.join(src, "many", names[1]), "/snap/added"])
    oracle.btrfs_check(image, timeout=900)
    kept = names[1::2]
    sample = [f"many/{n}" for n in kept[::997]] + [f"snap/{n}" for n in names[::991]]
    got = kernel_listing(image, workdir, ["many", "snap"] + sample + ["snap/added"])
    assert got["many"] == sorted(kept)
    assert got["snap"] == sorted(names + ["added"])
    for p in sample:
        i = int(p.split("-")[1])
        assert got[p] == content(i), p
    assert got["snap/added"] == content(1)

    # deleting the snapshot frees what only it held; the original stays whole
    kfs.run([b, "subvolume", "delete", image, "/snap"], timeout=1800)
    oracle.btrfs_check(image, timeout=900)
    got = kernel_listing(image, workdir, ["", "many"] + [f"many/{n}" for n in kept[::499]])
    assert got[""] == ["many"]
    assert got["many"] == sorted(kept)
    for n in kept[::499]:
        assert got[f"many/{n}"] == content(int(n.split("-")[1]))
    levels, items = tree_levels(image, 256)
    assert levels >= 2, f"tree 256 after removals: {levels} levels, {items} items"
