"""Where butter once differed from the kernel's btrfs (issue 10, parts 6 and 7).

Each case makes the kernel the oracle: a kernel loop mount of the same image shows what
butter (the library through the CLI, and `butter mount`) must show, and
`btrfs check --readonly` must find every image butter wrote clean.

  - st_blocks: the kernel reports an inode's bytes (nbytes) rounded up to whole sectors,
    so a file of 5 inline bytes takes 8 blocks; compressed, sparse, prealloc, reflinked
    files and directories alike, read offline (`butter ls -l` totals), through
    `butter mount`, and for files `butter mount` wrote, read back by the kernel.
  - mkfs --rootdir --subvol: a hard-link group split by a subvolume stays one inode on
    each side (st_ino and st_nlink per side in the kernel's mount).
  - a failed mkfs prints one line naming the cause and removes only the image files it
    created (never a file or device that existed).
  - mixed block groups (mkfs.btrfs -M, butter mkfs -M): workloads through `butter mount`
    and offline up to ENOSPC and back; fsync commits there; a csum item sorting before all
    others on 4 KiB nodes (which mixed groups always have).

Runtime: a few seconds per case, 15-50 s for each mixed-group workload (sanitizer build).
"""
import errno
import os
import random
import re
import subprocess

import pytest

from butter_it import kfs, oracle, tools
from butter_it.fusemount import FuseMount
from butter_it.tree import read_tree

KiB = 1024
MiB = 1 << 20


def ls_total(butter, image, path):
    """Return the `total` line of `butter ls -l IMAGE PATH` (KiB, as ls prints it)."""
    out = butter.run(["ls", "-l", image, path]).stdout.decode()
    m = re.search(r"^total (\d+)$", out, re.M)
    assert m, out
    return int(m.group(1))


# ---------------------------------------------------------------------------------
# st_blocks

# each kind lives alone in its own directory, so `butter ls -l DIR` totals one file
BLOCK_KINDS = ["inline", "inline_big", "compressed", "sparse", "prealloc", "prealloc_keep",
               "reflink", "plain", "empty", "emptydir"]


def make_block_kinds(root):
    """Write one file of each kind under root/<kind>/f (reflink: also root/reflink/src)."""
    for kind in BLOCK_KINDS:
        os.makedirs(os.path.join(root, kind), exist_ok=True)

    def put(kind, data=b"", name="f"):
        with open(os.path.join(root, kind, name), "wb") as f:
            f.write(data)
        return os.path.join(root, kind, name)

    put("inline", b"hello")
    put("inline_big", b"x" * 1500)
    path = put("compressed", b"")
    os.setxattr(path, "btrfs.compression", b"zstd")
    with open(path, "wb") as f:
        f.write(b"abcdefgh" * (40 * KiB))
    path = put("sparse")
    with open(path, "r+b") as f:
        f.seek(1 * MiB + 100)
        f.write(b"y" * 5000)
        f.truncate(3 * MiB)
    path = put("prealloc")
    with open(path, "r+b") as f:
        os.posix_fallocate(f.fileno(), 0, 100 * KiB)
        f.write(b"z" * 3000)
    path = put("prealloc_keep")
    subprocess.run(["fallocate", "-n", "-l", str(64 * KiB), path], check=True)
    src = put("reflink", os.urandom(200 * KiB), "src")
    with open(src, "rb") as fin, open(os.path.join(root, "reflink", "f"), "wb") as fout:
        # shares the extents on btrfs and through butter mount (cp --reflink=always
        # cannot work on a FUSE mount)
        assert os.copy_file_range(fin.fileno(), fout.fileno(), 200 * KiB) == 200 * KiB
    put("plain", os.urandom(10 * KiB + 1))
    put("empty")


def blocks_of(root):
    """Return {kind: st_blocks of root/<kind>/f (emptydir: the directory itself)}, plus the
    blocks of root ("/"), of each kind's directory ("kind/") and of reflink/src."""
    found = {"/": os.lstat(root).st_blocks}
    for kind in BLOCK_KINDS:
        path = os.path.join(root, kind) if kind == "emptydir" else os.path.join(root, kind, "f")
        found[kind] = os.lstat(path).st_blocks
        found[kind + "/"] = os.lstat(os.path.join(root, kind)).st_blocks
    found["reflink/src"] = os.lstat(os.path.join(root, "reflink", "src")).st_blocks
    return found


def ls_totals(butter, image, kinds):
    """Return {kind: total of `butter ls -l` over the directory of that kind} (KiB)."""
    return {kind: ls_total(butter, image, "/" + kind) for kind in kinds}


def test_st_blocks_like_kernel(fuse, butter, workdir):
    with kfs.kernel_fs(workdir, size=1 << 30, mount_opts=["max_inline=2048"]) as fs:
        make_block_kinds(fs.mnt)
        fs.sync()
        kernel = blocks_of(fs.mnt)
        fs.release()
        image = fs.images[0]
    assert kernel["inline"] == 8, kernel            # the premise: 5 bytes take a sector

    # offline: each directory's `ls -l` total is its entries' blocks in KiB
    want = {kind: kernel[kind] // 2 for kind in BLOCK_KINDS}
    want["reflink"] = (kernel["reflink"] + kernel["reflink/src"]) // 2
    want["emptydir"] = 0
    assert ls_totals(butter, image, BLOCK_KINDS) == want

    # through butter mount: the kernel's blocks for the kernel's files, and files
    # written by butter mount read back by the kernel with the same blocks
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        assert blocks_of(m.mnt) == kernel
        os.makedirs(os.path.join(m.mnt, "b"))
        make_block_kinds(os.path.join(m.mnt, "b"))
        os.sync()
        butter_made = blocks_of(os.path.join(m.mnt, "b"))
        m.unmount()
    oracle.btrfs_check(image, strict=True)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "mnt")) as mnt:
        assert blocks_of(os.path.join(mnt, "b")) == butter_made


# ---------------------------------------------------------------------------------
# mkfs --rootdir --subvol: hard links on each side of a subvolume stay one inode

# groups of host hard links: the names of one group are one host file; the walk
# (sorted by name) meets the names in the order given, `dir1` being the subvolume
LINK_GROUPS = {
    "inside_first": ["dir1/g1", "z1", "z2"],
    "outside_first": ["a1", "dir1/g2", "zz"],
    "two_inside": ["b_out", "dir1/h1", "dir1/h2"],
    "all_inside": ["dir1/k1", "dir1/k2"],
}


def test_rootdir_subvol_keeps_links_per_side(kernel, butter, workdir):
    src = os.path.join(workdir, "src")
    os.makedirs(os.path.join(src, "dir1"))
    for group, names in LINK_GROUPS.items():
        first = os.path.join(src, names[0])
        with open(first, "wb") as f:
            f.write(group.encode() * 1000)
        for name in names[1:]:
            os.link(first, os.path.join(src, name))
    image = os.path.join(workdir, "img")
    butter.run(["mkfs", "-b", "256M", "--rootdir", src, "--subvol", "dir1", image])
    oracle.btrfs_check(image, strict=True)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "mnt")) as mnt:
        top_dev = os.lstat(mnt).st_dev
        assert os.lstat(os.path.join(mnt, "dir1")).st_dev != top_dev   # a subvolume
        for group, names in LINK_GROUPS.items():
            sides = {}
            for name in names:
                st = os.lstat(os.path.join(mnt, name))
                with open(os.path.join(mnt, name), "rb") as f:
                    assert f.read() == group.encode() * 1000, name
                sides.setdefault(name.startswith("dir1/"), []).append((name, st))
            for inside, found in sides.items():
                # one inode per side, with as many links as names on that side
                assert len({(st.st_dev, st.st_ino) for _, st in found}) == 1, (group, found)
                assert all(st.st_nlink == len(found) for _, st in found), (group, found)


# ---------------------------------------------------------------------------------
# a failed mkfs: one line naming the cause, and no image file left that it created

def one_line_failure(proc, cause):
    """Assert that butter exited 1 by itself with exactly one stderr line, holding `cause`."""
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and "Sanitizer" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and cause in lines[0], proc.stderr


def test_failed_mkfs_removes_what_it_created(butter, workdir):
    new = os.path.join(workdir, "new.img")
    one_line_failure(butter.run(["mkfs", "-b", "10M", new], check=False), "too small")
    assert not os.path.exists(new)

    # a profile the devices cannot hold: refused after the files were created
    one_line_failure(butter.run(["mkfs", "-b", "100M", "-d", "raid6", new], check=False),
                     "raid6 needs at least 3")
    assert not os.path.exists(new)

    # two new files and one that exists: the new ones go, the old one stays as it was
    old = os.path.join(workdir, "old.img")
    with open(old, "wb") as f:
        f.write(b"keep me" * 1000)
    new2 = os.path.join(workdir, "new2.img")
    one_line_failure(butter.run(["mkfs", "-b", "10M", new, old, new2], check=False),
                     "too small")
    assert not os.path.exists(new) and not os.path.exists(new2)
    with open(old, "rb") as f:
        assert f.read(7000) == b"keep me" * 1000

    # an existing file that is too small is never removed
    small = os.path.join(workdir, "small.img")
    with open(small, "wb") as f:
        f.truncate(20 * MiB)
    one_line_failure(butter.run(["mkfs", "-f", small], check=False), "too small")
    assert os.path.getsize(small) == 20 * MiB

    # an existing filesystem without -f: kept, one line
    fsimg = os.path.join(workdir, "fs.img")
    butter.run(["mkfs", "-q", "-b", "128M", fsimg])
    one_line_failure(butter.run(["mkfs", "-b", "128M", fsimg], check=False), "use -f")
    assert os.path.exists(fsimg)
    oracle.btrfs_check(fsimg)


def test_failed_mkfs_on_small_device(kernel, butter, workdir):
    backing = os.path.join(workdir, "backing.img")
    with open(backing, "wb") as f:
        f.truncate(20 * MiB)
    dev = kfs.loop_attach(backing)
    try:
        one_line_failure(butter.run(["mkfs", "-f", dev], check=False), "too small")
        assert os.path.exists(dev)
    finally:
        kfs.loop_detach(dev)
    assert os.path.getsize(backing) == 20 * MiB


# ---------------------------------------------------------------------------------
# mixed block groups (mkfs.btrfs -M, butter mkfs -M): data and metadata share groups

FILL_PIECE = 8 * MiB


def pattern(seed, length):
    """Return `length` bytes that differ per seed (cheap: one random MiB, repeated)."""
    block = random.Random(seed).randbytes(MiB)
    return (block * (length // MiB + 1))[:length]


def write_file(path, data):
    with open(path, "wb") as f:
        f.write(data)


def fill_until_enospc(directory, model, rel_dir, limit):
    """Write FILL_PIECE files into `directory` until ENOSPC; return the bytes written.

    The file that hit ENOSPC is removed again (its size is whatever the write left).
    """
    os.makedirs(directory, exist_ok=True)
    written = 0
    for i in range(limit):
        path = os.path.join(directory, f"f{i:04d}")
        data = pattern(1000 + i, FILL_PIECE)
        try:
            write_file(path, data)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
            os.unlink(path)
            return written
        model[f"{rel_dir}/f{i:04d}"] = data
        written += len(data)
    raise AssertionError(f"no ENOSPC after {limit} files of {FILL_PIECE} bytes")


def mount_workload(butter_bin, mnt, model):
    """create/write/overwrite/rename/unlink/snapshot/fill/delete through a mount; `model`
    ends up holding {relative path: bytes} of every regular file."""
    rng = random.Random(7)
    os.makedirs(os.path.join(mnt, "d1"))
    os.makedirs(os.path.join(mnt, "d2"))
    for i in range(200):
        rel = f"d1/s{i:03d}"
        model[rel] = rng.randbytes(rng.randrange(0, 3000))
        write_file(os.path.join(mnt, rel), model[rel])
    for i in range(20):
        rel = f"d2/m{i:02d}"
        model[rel] = pattern(i, rng.randrange(64 * KiB, 2 * MiB))
        write_file(os.path.join(mnt, rel), model[rel])
    for i in range(0, 20, 3):                       # overwrite inside and past the end
        rel = f"d2/m{i:02d}"
        off = rng.randrange(0, len(model[rel]))
        new = rng.randbytes(rng.randrange(1, 300 * KiB))
        with open(os.path.join(mnt, rel), "r+b") as f:
            f.seek(off)
            f.write(new)
        data = bytearray(model[rel])
        data[off:off + len(new)] = new
        model[rel] = bytes(data)
    for i in range(0, 200, 4):                      # rename across directories
        os.rename(os.path.join(mnt, f"d1/s{i:03d}"), os.path.join(mnt, f"d2/r{i:03d}"))
        model[f"d2/r{i:03d}"] = model.pop(f"d1/s{i:03d}")
    for i in range(1, 200, 4):
        os.unlink(os.path.join(mnt, f"d1/s{i:03d}"))
        del model[f"d1/s{i:03d}"]
    kfs.run([butter_bin, "subvolume", "create", f"{mnt}/vol"])
    for i in range(10):
        model[f"vol/v{i}"] = pattern(100 + i, 300 * KiB)
        write_file(os.path.join(mnt, f"vol/v{i}"), model[f"vol/v{i}"])
    kfs.run([butter_bin, "subvolume", "snapshot", f"{mnt}/vol", f"{mnt}/snap"])
    for i in range(10):
        model[f"snap/v{i}"] = model[f"vol/v{i}"]
    os.unlink(os.path.join(mnt, "vol/v0"))
    del model["vol/v0"]

    # fill most of the space, then give it back
    st = os.statvfs(mnt)
    total = st.f_blocks * st.f_frsize
    written = fill_until_enospc(os.path.join(mnt, "fill"), model, "fill", 1000)
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    assert written > total * 0.8 and free < total * 0.05, (written, free, total)
    for rel in [r for r in model if r.startswith("fill/")][1:]:
        os.unlink(os.path.join(mnt, rel))
        del model[rel]
    # the space comes back (after a commit the daemon makes by itself)
    for i in range(8):
        rel = f"d2/after{i}"
        model[rel] = pattern(500 + i, FILL_PIECE)
        write_file(os.path.join(mnt, rel), model[rel])


def check_model(workdir, image, model):
    """btrfs check clean; the kernel's mount shows exactly the files of `model`."""
    oracle.btrfs_check(image, strict=True)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "mnt")) as mnt:
        got = read_tree(mnt)
        assert sorted(got) == sorted(model)
        bad = [rel for rel in model if got[rel] != model[rel]]
        assert not bad, bad[:10]


MIXED_SIZE = 256 * MiB       # the bug showed on 1 GiB; a quarter of it fills 4 times as fast


def make_mixed(butter, image, maker, size=MIXED_SIZE):
    if maker == "mkfs.btrfs":
        with open(image, "wb") as f:
            f.truncate(size)
        kfs.run(["mkfs.btrfs", "-q", "-M", image])
    else:
        butter.run(["mkfs", "-q", "-M", "-b", str(size), image])


def mixed_chunks(image):
    """Return the type strings of the chunk items, as dump-tree prints them."""
    out = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", "chunk", image]).stdout
    return re.findall(r"owner \d+ stripe_len \d+ type (\S+)", out)


@pytest.mark.parametrize("maker", ["mkfs.btrfs", "butter"])
def test_mixed_groups_through_mount(fuse, butter, workdir, maker):
    image = os.path.join(workdir, "mixed.img")
    make_mixed(butter, image, maker)
    model = {}
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt")) as m:
        mount_workload(butter.path, m.mnt, model)
        assert read_tree(m.mnt) == model
        m.unmount()
    check_model(workdir, image, model)
    # every chunk butter added is mixed, as the kernel would make it
    types = mixed_chunks(image)
    assert len(types) > 2 and set(types) == {"SYSTEM|single", "DATA|METADATA|single"}, types


PUT_PIECE = 16 * MiB


def put(butter, image, host, dest, check=True):
    return butter.run(["put", image, host, dest], check=check)


@pytest.mark.parametrize("maker", ["mkfs.btrfs", "butter"])
def test_mixed_groups_offline(kernel, butter, workdir, maker):
    image = os.path.join(workdir, "mixed.img")
    make_mixed(butter, image, maker)
    host = os.path.join(workdir, "host")
    rng = random.Random(11)
    model = {}
    for i in range(60):
        rel = f"tree/s{i:02d}"
        model[rel] = rng.randbytes(rng.randrange(0, 3000))
        os.makedirs(os.path.dirname(os.path.join(host, rel)), exist_ok=True)
        write_file(os.path.join(host, rel), model[rel])
    for i in range(6):
        model[f"tree/m{i}"] = pattern(i, rng.randrange(64 * KiB, 3 * MiB))
        write_file(os.path.join(host, f"tree/m{i}"), model[f"tree/m{i}"])
    put(butter, image, os.path.join(host, "tree"), "/tree")
    butter.run(["rm", image] + [f"/tree/s{i:02d}" for i in range(0, 60, 3)])
    for i in range(0, 60, 3):
        del model[f"tree/s{i:02d}"]
    butter.run(["subvolume", "create", image, "/vol"])
    put(butter, image, os.path.join(host, "tree", "m1"), "/vol/m1")
    model["vol/m1"] = model["tree/m1"]
    butter.run(["subvolume", "snapshot", image, "/vol", "/snap"])
    model["snap/m1"] = model["tree/m1"]
    butter.run(["rm", image, "/vol/m1"])
    del model["vol/m1"]

    # fill with PUT_PIECE files until a put runs out of space (what it copied stays;
    # removing it on the full filesystem must work)
    big = os.path.join(host, "big")
    write_file(big, pattern(99, PUT_PIECE))
    butter.run(["mkdir", image, "/fill"])
    n = 0
    while True:
        proc = put(butter, image, big, f"/fill/f{n:02d}", check=False)
        if proc.returncode != 0:
            assert "no space left" in proc.stderr and "Sanitizer" not in proc.stderr, proc.stderr
            butter.run(["rm", image, f"/fill/f{n:02d}"])
            break
        model[f"fill/f{n:02d}"] = pattern(99, PUT_PIECE)
        n += 1
        assert n * PUT_PIECE <= MIXED_SIZE, "no ENOSPC when the filesystem is full"
    assert n * PUT_PIECE > MIXED_SIZE * 0.8, n
    check_model(workdir, image, model)
    butter.run(["rm", "-r", image, "/fill"])
    model = {rel: data for rel, data in model.items() if not rel.startswith("fill/")}
    for i in range(n - 1):                           # the space came back
        put(butter, image, big, f"/again{i}")
        model[f"again{i}"] = pattern(99, PUT_PIECE)
    check_model(workdir, image, model)
    types = mixed_chunks(image)
    assert set(types) == {"SYSTEM|single", "DATA|METADATA|single"}, types


def test_mkfs_mixed_like_mkfs_btrfs(kernel, butter, workdir):
    """butter mkfs -M writes what mkfs.btrfs -M writes: the MIXED_GROUPS flag, nodesize
    4096, one DATA|METADATA chunk beside the system chunk, one profile; the same refusals."""
    mine = os.path.join(workdir, "mine.img")
    butter.run(["mkfs", "-q", "-M", "-b", "256M", mine])
    theirs = os.path.join(workdir, "theirs.img")
    make_mixed(butter, theirs, "mkfs.btrfs", 256 * MiB)
    for image in (mine, theirs):
        sb = kfs.run(["btrfs", "inspect-internal", "dump-super", image]).stdout
        assert "MIXED_GROUPS" in sb and re.search(r"^nodesize\s+4096$", sb, re.M), sb
        assert mixed_chunks(image) == ["SYSTEM|single", "DATA|METADATA|single"]
    oracle.btrfs_check(mine, strict=True)
    dup = os.path.join(workdir, "dup.img")
    butter.run(["mkfs", "-q", "-M", "-d", "dup", "-b", "256M", dup])
    assert mixed_chunks(dup) == ["SYSTEM|DUP", "DATA|METADATA|DUP"]
    oracle.btrfs_check(dup, strict=True)
    for args, cause in ((["-n", "16K"], "node size 16384 must equal the sector size"),
                        (["-d", "single", "-m", "dup"], "profiles must be the same")):
        bad = os.path.join(workdir, "bad.img")
        one_line_failure(butter.run(["mkfs", "-M", "-b", "256M"] + args + [bad], check=False),
                         cause)
        assert not os.path.exists(bad)



def test_mixed_groups_fsync_commits(kernel, butter, workdir):
    """butter_fsync on mixed block groups commits instead of writing a tree log (butter's
    own replay refuses logs on mixed groups, so it must never leave one); the power cut
    right after the fsync (butter-logtool's `crash`) keeps the fsynced data."""
    image = os.path.join(workdir, "mixed.img")
    make_mixed(butter, image, "mkfs.btrfs")
    script = "create f\nsync\nwrite f 0 100000 1\nfsync f\ncrash\n"
    r = subprocess.run([tools.tool("butter-logtool"), image], input=script.encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    assert r.returncode == 0 and r.stdout.split() == [b"0"] * 4, r.stderr.decode()[-3000:]
    sb = kfs.run(["btrfs", "inspect-internal", "dump-super", image]).stdout
    assert re.search(r"^log_root\s+0$", sb, re.M), sb
    oracle.btrfs_check(image, strict=True)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "mnt")) as mnt:
        assert os.path.getsize(os.path.join(mnt, "f")) == 100000
    butter.run(["ls", image, "/f"])                  # butter opens it (no log to refuse)


def test_data_below_all_others_on_4k_nodes(kernel, butter, workdir):
    """A full-size csum item that sorts before every other one, on 4 KiB nodes (where such
    an item fills a leaf alone; mixed groups always have 4 KiB nodes): the write reusing the
    freed start of the data space used to abort the transaction (EOVERFLOW)."""
    image = os.path.join(workdir, "img")
    butter.run(["mkfs", "-q", "-n", "4096", "-b", "256M", image])
    host = os.path.join(workdir, "host")
    os.makedirs(host)
    model = {"a": pattern(1, 4 * MiB), "b": pattern(2, 8 * MiB)}
    for name, data in model.items():
        write_file(os.path.join(host, name), data)
        put(butter, image, os.path.join(host, name), "/" + name)
    butter.run(["rm", image, "/a"])                 # the lowest data addresses are free again
    put(butter, image, os.path.join(host, "a"), "/c")   # a new open allocates from there
    model["c"] = model.pop("a")
    check_model(workdir, image, model)
