"""`butter check`, with btrfs check --readonly as the oracle.

Clean images (the kernel's full test tree with subvolumes and snapshots; images butter
wrote, with snapshots and a deleted subvolume) must pass both checkers. Damage that
btrfs check reports (an extent item's reference count, a block group's used bytes,
written into both DUP copies of a leaf with its checksum recomputed, so only the
bookkeeping is wrong) must make butter check fail too, naming the extent or block group.
"""
import os
import re
import struct

from butter_it import kfs, oracle, tree

HEADER = 101            # btrfs_header
ITEM = 25               # btrfs_item: key (17) + offset (4) + size (4)


def butter_check(butter, img):
    # --readonly as btrfs check is called: butter takes it (and never writes)
    return kfs.run([butter.path, "check", "--readonly", img], check=False, timeout=600)


def both_clean(butter, img):
    oracle.btrfs_check(img)
    r = butter_check(butter, img)
    assert r.returncode == 0 and "0 error(s)" in r.stdout, f"{r.stdout}\n{r.stderr[-3000:]}"


def test_clean_kernel_tree(kernel, butter, workdir):
    with kfs.kernel_fs(workdir) as fs:
        tree.populate(fs.mnt, seed=5, subvolumes=True)
        fs.release()
        both_clean(butter, fs.images[0])


def test_clean_butter_images(kernel, butter, workdir):
    src = os.path.join(workdir, "src")
    os.makedirs(os.path.join(src, "d"))
    for i in range(50):
        with open(os.path.join(src, "d", f"f{i}"), "wb") as f:
            f.write(os.urandom(i * 3000))
    img = os.path.join(workdir, "a.img")
    b = butter.path
    kfs.run([b, "mkfs", "-q", "-b", "512M", "--rootdir", src, img])
    kfs.run([b, "subvolume", "snapshot", "-r", img, "/", "/s1"])
    kfs.run([b, "rm", "-r", img, "/d/f3", "/d/f7"])
    kfs.run([b, "subvolume", "create", img, "/sub"])
    kfs.run([b, "put", img, os.path.join(src, "d"), "/sub/d"])
    kfs.run([b, "subvolume", "snapshot", img, "/sub", "/s2"])
    kfs.run([b, "subvolume", "delete", img, "/s1"])
    both_clean(butter, img)


def leaf_items(img, tree_name):
    """[(leaf bytenr, slot, key triple, item offset, item size)] from dump-tree."""
    out = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", tree_name, img],
                  timeout=300).stdout
    items, leaf = [], None
    for line in out.splitlines():
        m = re.match(r"leaf (\d+) items", line)
        if m:
            leaf = int(m.group(1))
            continue
        m = re.match(r"\s+item (\d+) key \((\S+) (\S+) (\S+)\) itemoff (\d+) itemsize (\d+)",
                     line)
        if m and leaf is not None:
            items.append((leaf, int(m.group(1)), (m.group(2), m.group(3), m.group(4)),
                          int(m.group(5)), int(m.group(6))))
    return items


def patch_leaf(img, cm, bytenr, at, value, nodesize=16384):
    """Write `value` at byte `at` of tree block `bytenr` (every copy), fixing its csum."""
    for _, phys in cm.locate(bytenr):
        with open(img, "r+b") as f:
            f.seek(phys)
            block = bytearray(f.read(nodesize))
            assert struct.unpack_from("<Q", block, 48)[0] == bytenr, "not the block"
            block[at:at + len(value)] = value
            block[0:4] = struct.pack("<I", kfs.crc32c(bytes(block[32:])))
            f.seek(phys)
            f.write(block)


def damaged(workdir, butter):
    img = os.path.join(workdir, "d.img")
    src = os.path.join(workdir, "src")
    os.makedirs(src)
    for i in range(10):
        with open(os.path.join(src, f"f{i}"), "wb") as f:
            f.write(os.urandom(100000))
    kfs.run([butter.path, "mkfs", "-q", "-b", "512M", "--rootdir", src, img])
    loop = kfs.loop_attach(img)
    try:
        cm = kfs.ChunkMap.parse(kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t",
                                         "chunk", loop]).stdout)
    finally:
        kfs.loop_detach(loop)
    return img, cm


def test_wrong_refcount(kernel, butter, workdir):
    img, cm = damaged(workdir, butter)
    leaf, _, key, off, _ = next(x for x in leaf_items(img, "extent")
                                 if x[2][1] == "EXTENT_ITEM" and int(x[2][2]) == 102400)
    patch_leaf(img, cm, leaf, HEADER + off, struct.pack("<Q", 2))   # refs 1 -> 2
    assert oracle.run_btrfs_check(img).returncode != 0, \
        "btrfs check missed the damage (test is wrong)"
    r = butter_check(butter, img)
    assert r.returncode == 1, f"{r.stdout}\n{r.stderr}"
    assert f"extent {key[0]}: the extent item counts 2 references, the trees hold 1" \
        in r.stderr, r.stderr


def test_wrong_block_group_used(kernel, butter, workdir):
    img, cm = damaged(workdir, butter)
    leaf, _, key, off, _ = next(x for x in leaf_items(img, "extent")
                                 if x[2][1] == "BLOCK_GROUP_ITEM")
    with open(img, "rb") as f:
        f.seek(cm.locate(leaf)[0][1] + HEADER + off)
        used = struct.unpack("<Q", f.read(8))[0]
    patch_leaf(img, cm, leaf, HEADER + off, struct.pack("<Q", used + 4096))
    assert oracle.run_btrfs_check(img).returncode != 0, \
        "btrfs check missed the damage (test is wrong)"
    r = butter_check(butter, img)
    assert r.returncode == 1, f"{r.stdout}\n{r.stderr}"
    assert f"block group {key[0]}: used {used + 4096}, its extents add up to {used}" \
        in r.stderr, r.stderr
