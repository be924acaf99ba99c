"""Relocation: `butter balance start`, `butter device remove`, `butter filesystem resize`
(shrink), judged by the kernel and btrfs check.

The images are aged by the kernel the way users age them: files of every extent kind
(inline, regular, compressed, prealloc, holes, nodatacow), reflinks, a subvolume and
snapshots (read-only and writable) taken between rewrites, so that tree blocks are shared
by several trees and some carry full back references. After butter moved block groups:

- btrfs check --readonly is clean (strict: no warning either) and butter check agrees;
- the kernel mounts the image and shows exactly the tree it showed before (manifest:
  content, modes, times, xattrs, holes);
- sharing is kept: `btrfs filesystem du` gives every subvolume the same total, exclusive
  and shared bytes as before, and the data the filesystem uses is within 1 % of before;
- the chunks are where the operation said: converted profiles (`btrfs filesystem df`), no
  chunk on a removed device or past a shrunk device's new end (dump-tree of the chunk and
  dev trees);
- the kernel can balance the result in turn (and butter a result of the kernel's).
Refusals leave the image as it was: same content, still clean.
"""
import os
import re
import time

import pytest

from butter_it import kfs, manifest, oracle

SUBVOLS = ("", "sv", "snap-ro", "snap-rw", "sv/snap2")


def write_file(path, size, seed, chunk=1 << 20):
    import random
    rng = random.Random(seed)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, chunk)
            f.write(rng.randbytes(n))
            left -= n


def age(mnt):
    """Fill a kernel mount with every kind of extent, shared in every way."""
    run = kfs.run
    os.makedirs(os.path.join(mnt, "d"))
    for i in range(300):  # small files: inline extents, many leaves
        with open(os.path.join(mnt, "d", f"small{i}"), "wb") as f:
            f.write(os.urandom(i * 7 % 3000))
    write_file(os.path.join(mnt, "big"), 24 << 20, 1)
    write_file(os.path.join(mnt, "frag"), 4 << 20, 2, chunk=8192)
    run(["cp", "--reflink=always", os.path.join(mnt, "big"), os.path.join(mnt, "big.clone")])
    with open(os.path.join(mnt, "text"), "wb") as f:  # compresses (mounted compress=zstd)
        f.write(b"butter relocates block groups\n" * 200000)
    run(["fallocate", "-l", str(3 << 20), os.path.join(mnt, "prealloc")])
    with open(os.path.join(mnt, "holes"), "wb") as f:
        f.seek(5 << 20)
        f.write(os.urandom(70000))
        f.seek(11 << 20)
        f.write(b"end")
    os.mknod(os.path.join(mnt, "nocow"))
    run(["chattr", "+C", os.path.join(mnt, "nocow")])
    write_file(os.path.join(mnt, "nocow"), 2 << 20, 3)
    os.setxattr(os.path.join(mnt, "big"), "user.k", b"v" * 100)
    run(["btrfs", "subvolume", "create", os.path.join(mnt, "sv")])
    write_file(os.path.join(mnt, "sv", "inner"), 6 << 20, 4)
    run(["cp", "--reflink=always", os.path.join(mnt, "frag"), os.path.join(mnt, "sv", "frag")])
    run(["btrfs", "filesystem", "sync", mnt])
    run(["btrfs", "subvolume", "snapshot", "-r", mnt, os.path.join(mnt, "snap-ro")])
    run(["btrfs", "subvolume", "snapshot", mnt, os.path.join(mnt, "snap-rw")])
    run(["btrfs", "subvolume", "snapshot", os.path.join(mnt, "sv"), os.path.join(mnt, "sv", "snap2")])
    # rewrites after the snapshots: the owners copy shared blocks (full back refs)
    with open(os.path.join(mnt, "big"), "r+b") as f:
        f.seek(3 << 20)
        f.write(os.urandom(1 << 20))
    for i in range(0, 300, 7):
        with open(os.path.join(mnt, "d", f"small{i}"), "ab") as f:
            f.write(b"more")
    with open(os.path.join(mnt, "snap-rw", "frag"), "r+b") as f:
        f.seek(1 << 20)
        f.write(os.urandom(100000))
    os.unlink(os.path.join(mnt, "d", "small3"))
    write_file(os.path.join(mnt, "sv", "later"), 3 << 20, 5)
    run(["btrfs", "filesystem", "sync", mnt])


def du(mnt):
    """{subvolume: (total, exclusive, shared)} from `btrfs filesystem du -s --raw`."""
    out = kfs.run(["btrfs", "filesystem", "du", "-s", "--raw"]
                  + [os.path.join(mnt, s) for s in SUBVOLS]).stdout
    got = {}
    for line in out.splitlines()[1:]:
        total, excl, shared, path = line.split(None, 3)
        got[os.path.relpath(path, mnt)] = (int(total), int(excl), int(shared))
    return got


def space(mnt):
    """{(kind, profile): used bytes} from `btrfs filesystem df --raw`."""
    out = kfs.run(["btrfs", "filesystem", "df", "--raw", mnt]).stdout
    return {(m.group(1), m.group(2)): int(m.group(4))
            for m in re.finditer(r"^([\w+]+), (\w+): total=(\d+), used=(\d+)", out, re.M)}


def observe(image, *devices, mnt):
    """What the kernel shows of the filesystem: (manifest, du, space)."""
    with oracle.kernel_mount(image, *devices, mnt=mnt) as root:
        return manifest.take(root), du(root), space(root)


def chunks(image, *devices):
    """[(logical, type, [(devid, physical, length)])] from the chunk tree."""
    with kfs.attached([image, *devices]) as loops:
        out = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", "chunk", loops[0]]).stdout
    found = []
    for m in re.finditer(r"key \(FIRST_CHUNK_TREE CHUNK_ITEM (\d+)\) itemoff \d+ itemsize \d+\n"
                         r"\s+length (\d+) owner \d+ stripe_len \d+ type ([\w|]+)\n"
                         r"(.*?)(?=\n\s+item|\Z)", out, re.S):
        stripes = [(int(d), int(p)) for d, p in
                   re.findall(r"stripe \d+ devid (\d+) offset (\d+)", m.group(4))]
        found.append((int(m.group(1)), m.group(3), int(m.group(2)), stripes))
    return found


@pytest.fixture(scope="module")
def aged(tmp_path_factory):
    """A 1 GiB image aged by the kernel, and what the kernel showed of it."""
    workdir = str(tmp_path_factory.mktemp("relocate"))
    with kfs.kernel_fs(workdir, size=1 << 30, mount_opts=["compress=zstd"]) as fs:
        age(fs.mnt)
        fs.release()
        image = fs.images[0]
    oracle.btrfs_check(image, strict=True)
    seen = observe(image, mnt=os.path.join(workdir, "look"))
    return image, seen


def copy_of(src, workdir, name="img"):
    dst = os.path.join(workdir, name)
    kfs.run(["cp", "--sparse=always", src, dst])
    return dst


def assert_same_fs(before, image, *devices, mnt, profiles=None):
    """The kernel shows `before`'s tree and sharing; data used within 1 %."""
    tree, shares, used = before
    got_tree, got_shares, got_used = observe(image, *devices, mnt=mnt)
    oracle.assert_tree(tree, got_tree, "the kernel's mount after the relocation")
    assert got_shares == shares, f"sharing changed:\nbefore {shares}\nafter  {got_shares}"
    data_before = sum(v for (k, _), v in used.items() if k.startswith("Data"))
    data_after = sum(v for (k, _), v in got_used.items() if k.startswith("Data"))
    assert abs(data_after - data_before) <= data_before / 100, (used, got_used)
    if profiles:
        kinds = {(k, p) for (k, p) in got_used if k in profiles}
        assert kinds == {(k, profiles[k]) for k in profiles}, got_used
    return got_used


def balance(butter, image, *args, devices=(), check=True):
    argv = [butter.path, "balance", "start", *args]
    for d in devices:
        argv += ["--device", d]
    r = kfs.run(argv + [image], check=False, timeout=900)
    if check:
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    return r


def test_full_balance_keeps_everything_shared(kernel, butter, workdir, aged):
    src, before = aged
    img = copy_of(src, workdir)
    old = chunks(img)
    r = balance(butter, img)
    assert re.search(r"(\d+) block groups moved", r.stdout), r.stdout
    oracle.btrfs_check(img, strict=True)
    # every chunk moved: none of the old logical addresses is left
    new = chunks(img)
    assert not {c[0] for c in old} & {c[0] for c in new}, (old, new)
    assert_same_fs(before, img, mnt=os.path.join(workdir, "mnt"))
    # the kernel balances butter's result, and butter the kernel's
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "k"), opts=("rw",)) as m:
        kfs.run(["btrfs", "balance", "start", "--full-balance", m], timeout=900)
    oracle.btrfs_check(img, strict=True)
    balance(butter, img)
    oracle.btrfs_check(img, strict=True)
    assert_same_fs(before, img, mnt=os.path.join(workdir, "mnt"))


def test_convert_profiles_and_back(kernel, butter, workdir, aged):
    src, before = aged
    img = copy_of(src, workdir)
    # lowering metadata redundancy needs --force; refused, the image is untouched
    r = balance(butter, img, "-mconvert=single", check=False)
    assert r.returncode != 0 and "redundancy" in r.stderr, r.stderr
    oracle.btrfs_check(img, strict=True)
    balance(butter, img, "-dconvert=dup", "-mconvert=single", "-f")
    oracle.btrfs_check(img, strict=True)
    assert_same_fs(before, img, mnt=os.path.join(workdir, "mnt"),
                   profiles={"Data": "DUP", "Metadata": "single", "System": "single"})
    # soft: only what is not converted yet; the data is all dup already
    r = balance(butter, img, "-dconvert=dup,soft", "-mconvert=dup")
    assert "0 data extents" in r.stdout, r.stdout
    balance(butter, img, "-dconvert=single")
    oracle.btrfs_check(img, strict=True)
    assert_same_fs(before, img, mnt=os.path.join(workdir, "mnt"),
                   profiles={"Data": "single", "Metadata": "DUP", "System": "DUP"})
    # raid1 cannot live on one device: refused before anything moves
    r = balance(butter, img, "-dconvert=raid1", check=False)
    assert r.returncode != 0 and "raid1" in r.stderr, r.stderr
    oracle.btrfs_check(img, strict=True)


def test_filters_choose_the_groups(kernel, butter, workdir, aged):
    src, before = aged
    img = copy_of(src, workdir)
    old = chunks(img)
    data = [c for c in old if c[1].startswith("DATA")]
    # limit=1: exactly one data group (the highest) moves, nothing else
    balance(butter, img, "-dlimit=1")
    new = chunks(img)
    gone = {c[0] for c in old} - {c[0] for c in new}
    assert gone == {max(c[0] for c in data)}, (old, new)
    # vrange: only the group holding that logical address
    target = min(c[0] for c in new if c[1].startswith("METADATA"))
    balance(butter, img, f"-mvrange={target}..{target + 1}")
    after = chunks(img)
    assert {c[0] for c in new} - {c[0] for c in after} == {target}, (new, after)
    # usage=0: only empty groups (there are none with data in them here)
    r = balance(butter, img, "-dusage=0")
    assert "0 data extents" in r.stdout, r.stdout
    # a bad filter is a usage error naming it
    r = balance(butter, img, "-dusage=abc", check=False)
    assert r.returncode == 2 and "usage=abc" in r.stderr, r.stderr
    oracle.btrfs_check(img, strict=True)
    assert_same_fs(before, img, mnt=os.path.join(workdir, "mnt"))


def test_offline_shrink_and_grow(kernel, butter, workdir, aged):
    src, before = aged
    img = copy_of(src, workdir)
    # below what the data needs: refused, nothing lost
    r = kfs.run([butter.path, "filesystem", "resize", "60M", img], check=False, timeout=900)
    assert r.returncode != 0, r.stdout
    oracle.btrfs_check(img, strict=True)
    r = kfs.run([butter.path, "filesystem", "resize", "320M", img], check=False, timeout=900)
    assert r.returncode == 0, r.stderr
    oracle.btrfs_check(img, strict=True)
    for logical, kind, length, stripes in chunks(img):
        for devid, physical in stripes:
            assert physical + length <= 320 << 20, (logical, kind, length, stripes)
    fields = kfs.super_fields(img)
    assert int(fields["total_bytes"]) == 320 << 20, fields["total_bytes"]
    os.truncate(img, 320 << 20)  # the file may go now
    assert_same_fs(before, img, mnt=os.path.join(workdir, "mnt"))
    # and grow back, offline, to the whole file
    os.truncate(img, 600 << 20)
    r = kfs.run([butter.path, "filesystem", "resize", "max", img], check=False)
    assert r.returncode == 0 and str(600 << 20) in r.stdout, r.stdout + r.stderr
    oracle.btrfs_check(img, strict=True)
    assert_same_fs(before, img, mnt=os.path.join(workdir, "mnt"))


def test_offline_shrink_past_a_group_across_the_end(kernel, butter, workdir):
    """A kernel-made image whose data sits in two big chunks, the lower one across the
    wanted end and fuller than the room below it: it is moved out of the way first, then
    everything packs below the end (1.6x the bytes used). Where the kernel puts the 440 MiB
    varies from run to run (into the lower chunk, or mostly into the next one, the lower then
    nearly empty); 800 MiB can be reached from both layouts, 700 MiB from the first only
    (it needs the 256 MiB DUP metadata chunk moved into a smaller one first)."""
    import random
    with kfs.kernel_fs(workdir, size=4 << 30) as fs:
        age(fs.mnt)
        rng = random.Random(3)
        left, i = 440 << 20, 0
        while left > 0:
            n = min(left, rng.randint(1, 64) << 20)
            write_file(os.path.join(fs.mnt, f"f{i}"), n, 1000 + i, chunk=4 << 20)
            left -= n
            i += 1
        fs.release()
        img = fs.images[0]
    before = observe(img, mnt=os.path.join(workdir, "look"))
    r = kfs.run([butter.path, "filesystem", "resize", "800M", img], check=False, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    oracle.btrfs_check(img, strict=True)
    for logical, kind, length, stripes in chunks(img):
        for devid, physical in stripes:
            assert physical + length <= 800 << 20, (logical, kind, length, stripes)
    os.truncate(img, 800 << 20)
    assert_same_fs(before, img, mnt=os.path.join(workdir, "mnt"))


def test_device_remove(kernel, butter, workdir):
    with kfs.kernel_fs(workdir, ndevices=3, size=512 << 20,
                       mkfs_args=["-d", "raid1", "-m", "raid1"]) as fs:
        age(fs.mnt)
        fs.release()
        images = list(fs.images)
    dev2 = next(i for i in images if int(kfs.super_fields(i)["dev_item.devid"]) == 2)
    others = [i for i in images if i != dev2]
    before = observe(*images, mnt=os.path.join(workdir, "look"))
    argv = [butter.path, "device", "remove", "2"]
    for extra in images[1:]:
        argv += ["--device", extra]
    r = kfs.run(argv + [images[0]], check=False, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    oracle.btrfs_check(*others, strict=True)
    for logical, kind, length, stripes in chunks(*others):
        assert all(d != 2 for d, _ in stripes), (logical, kind, stripes)
    # its superblock is wiped: nobody takes it for a member any more
    with open(dev2, "rb") as f:
        f.seek(65536 + 64)
        assert f.read(8) != b"_BHRfS_M"
    assert_same_fs(before, *others, mnt=os.path.join(workdir, "mnt"),
                   profiles={"Data": "RAID1", "Metadata": "RAID1", "System": "RAID1"})
    # raid1 on two devices cannot lose one: refused, untouched
    argv = [butter.path, "device", "remove", others[1]]
    r = kfs.run(argv + ["--device", others[1], others[0]], check=False, timeout=900)
    assert r.returncode != 0 and "raid1" in r.stderr, r.stdout + r.stderr
    oracle.btrfs_check(*others, strict=True)
    # the kernel goes on from butter's result: it replaces a device and balances
    new = os.path.join(workdir, "new.img")
    with open(new, "wb") as f:
        f.truncate(512 << 20)
    third = next(i for i in others if int(kfs.super_fields(i)["dev_item.devid"]) == 3)
    with kfs.attached([new]) as (loop,):
        with oracle.kernel_mount(*others, mnt=os.path.join(workdir, "k"), opts=("rw",)) as mnt:
            kfs.run(["btrfs", "replace", "start", "-B", "3", loop, mnt], timeout=900)
            kfs.run(["btrfs", "balance", "start", "--full-balance", mnt], timeout=900)
    survivors = [i for i in others if i != third] + [new]
    oracle.btrfs_check(*survivors, strict=True)
    assert_same_fs(before, *survivors, mnt=os.path.join(workdir, "mnt2"))


def test_balance_on_a_live_mount(fuse, butter, workdir, aged):
    """`butter balance start MNT` moves every group while the mount serves reads and
    writes: every read returns the right bytes throughout, what was written during the
    balance is there after, and the kernel agrees."""
    import hashlib
    import threading

    from butter_it.fusemount import FuseMount

    src, before = aged
    img = copy_of(src, workdir)
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "k0")) as m:
        want = {q: kfs.file_sha256(os.path.join(m, q))
                for q in ("big", "big.clone", "frag", "text", "holes", "sv/inner",
                          "snap-ro/big", "snap-rw/frag", "sv/snap2/frag")}
    errors, written = [], {}
    stop = threading.Event()
    with FuseMount(butter.path, [img], os.path.join(workdir, "mnt")) as fm:
        mnt = fm.mnt
        os.mkdir(os.path.join(mnt, "during"))

        def reader():
            while not stop.is_set():
                for q, digest in want.items():
                    got = kfs.file_sha256(os.path.join(mnt, q))
                    if got != digest:
                        errors.append(f"{q}: read {got}, want {digest}")

        def writer():
            n = 0
            while not stop.is_set():
                data = os.urandom(50000 + n * 1000)
                path = os.path.join(mnt, "during", f"w{n}")
                with open(path, "wb") as f:
                    f.write(data)
                written[f"during/w{n}"] = hashlib.sha256(data).hexdigest()
                n += 1

        threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
        for t in threads:
            t.start()
        try:
            r = kfs.run([butter.path, "balance", "start", mnt], check=False, timeout=900)
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert r.returncode == 0, r.stdout + r.stderr
        m = re.search(r"(\d+) block groups moved", r.stdout)
        assert m and int(m.group(1)) >= 4, r.stdout
        assert not errors, errors[:5]
        assert len(written) > 3, written
        kfs.run([butter.path, "umount", mnt], timeout=300)
        fm.wait()
    oracle.btrfs_check(img, strict=True)
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "k1")) as m:
        for q, digest in {**want, **written}.items():
            assert kfs.file_sha256(os.path.join(m, q)) == digest, q
        shares = du(m)
    for sv in SUBVOLS[1:]:
        assert shares[sv] == before[1][sv], (sv, before[1][sv], shares[sv])


def test_failed_disk_degraded_write_then_rebuild(fuse, butter, workdir):
    """raid1 over two devices, one dies: the filesystem mounts degraded read-write (new
    chunks on the one left), takes writes, then a new device is added, the missing one
    removed (its copies rebuilt from the others) and the new chunks converted back to
    raid1. The kernel then mounts it whole, not degraded, with everything in it."""
    import hashlib

    from butter_it.fusemount import FuseMount

    with kfs.kernel_fs(workdir, ndevices=2, size=512 << 20,
                       mkfs_args=["-d", "raid1", "-m", "raid1"]) as fs:
        age(fs.mnt)
        fs.release()
        images = list(fs.images)
    before = observe(*images, mnt=os.path.join(workdir, "look"))
    keep = next(i for i in images if int(kfs.super_fields(i)["dev_item.devid"]) == 1)
    os.unlink(next(i for i in images if i != keep))  # the disk is gone
    data = os.urandom(3 << 20)
    with FuseMount(butter.path, [keep], os.path.join(workdir, "mnt"), options=["degraded"]) as m:
        with open(os.path.join(m.mnt, "written-degraded"), "wb") as f:
            f.write(data)
        kfs.run([butter.path, "umount", m.mnt], timeout=300)
        m.wait()
    assert "degraded" in open(m.log, "rb").read().decode("utf-8", "replace")
    new = os.path.join(workdir, "new.img")
    with open(new, "wb") as f:
        f.truncate(512 << 20)
    r = kfs.run([butter.path, "device", "add", keep, new], check=False)
    assert r.returncode == 0, r.stderr
    r = kfs.run([butter.path, "device", "remove", "--device", new, "missing", keep], check=False,
                timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    r = kfs.run([butter.path, "balance", "start", "--device", new, "-dconvert=raid1,soft",
                 "-mconvert=raid1,soft", keep], check=False, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    oracle.btrfs_check(keep, new, strict=True)
    for logical, kind, length, stripes in chunks(keep, new):
        assert "RAID1" in kind and sorted(d for d, _ in stripes) == [1, 3], (logical, kind, stripes)
    with oracle.kernel_mount(keep, new, mnt=os.path.join(workdir, "k")) as mnt:
        got = manifest.take(mnt)
        with open(os.path.join(mnt, "written-degraded"), "rb") as f:
            assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
    del got["written-degraded"]
    oracle.assert_tree(before[0], got, "the kernel after the rebuild", exclude=(".",))


def many_groups(workdir, name):
    """A 1 GiB image whose data fills several block groups (so a balance takes a while)."""
    with kfs.kernel_fs(workdir, size=1 << 30, name=name) as fs:
        for i in range(12):
            write_file(os.path.join(fs.mnt, f"f{i}"), 16 << 20, 100 + i)
            fs.sync()
        tree = manifest.take(fs.mnt)
        fs.release()
        return fs.images[0], tree


def balance_item(image):
    """The balance item as btrfs-progs dumps it, or None."""
    out = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", "root", image]).stdout
    m = re.search(r"key \(BALANCE TEMPORARY_ITEM 0\).*?(?=\n\titem|\Z)", out, re.S)
    return m.group(0) if m else None


def test_kernel_paused_balance_resumed_by_butter(kernel, butter, workdir):
    img, tree = many_groups(workdir, "k")
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "m"), opts=("rw",)) as mnt:
        kfs.run(["btrfs", "balance", "start", "--bg", "-dconvert=dup", mnt])
        r = kfs.run(["btrfs", "balance", "pause", mnt], check=False)
        if r.returncode != 0:
            pytest.skip(f"the kernel's balance ended before it could be paused: {r.stderr}")
    assert balance_item(img), "the kernel left no balance item"
    r = kfs.run([butter.path, "balance", "status", img], check=False)
    assert r.returncode == 1 and "paused" in r.stdout and "convert=dup" in r.stdout, r.stdout
    # a new balance is refused while one is recorded
    r = kfs.run([butter.path, "balance", "start", "-dusage=50", img], check=False)
    assert r.returncode != 0 and "resume or cancel" in r.stderr, r.stderr
    r = kfs.run([butter.path, "balance", "resume", img], check=False, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert balance_item(img) is None
    oracle.btrfs_check(img, strict=True)
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "m2")) as mnt:
        oracle.assert_tree(tree, mnt, "the kernel after butter resumed its balance",
                           check_atime=False)
        assert {(k, p) for (k, p) in space(mnt) if k == "Data"} == {("Data", "DUP")}


def test_butter_paused_balance_resumed_by_the_kernel(fuse, butter, workdir):
    from butter_it.fusemount import FuseMount

    img, tree = many_groups(workdir, "b")
    with FuseMount(butter.path, [img], os.path.join(workdir, "mnt")) as fm:
        r = kfs.run([butter.path, "balance", "start", "--bg", "-dconvert=dup", fm.mnt])
        assert "in the background" in r.stdout, r.stdout
        r = kfs.run([butter.path, "balance", "pause", fm.mnt], check=False)
        assert r.returncode == 0, r.stderr
        deadline = 0
        while True:
            r = kfs.run([butter.path, "balance", "status", fm.mnt], check=False)
            if "running" not in r.stdout or deadline > 300:
                break
            deadline += 1
            import time
            time.sleep(0.2)
        assert r.returncode == 1 and "paused" in r.stdout, r.stdout
        kfs.run([butter.path, "umount", fm.mnt], timeout=300)
        fm.wait()
    assert balance_item(img), "butter left no balance item"
    oracle.btrfs_check(img, strict=True)
    # the kernel resumes it at mount and finishes it
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "k"), opts=("rw",)) as mnt:
        for _ in range(600):
            r = kfs.run(["btrfs", "balance", "status", mnt], check=False)
            if "No balance found" in r.stdout:
                break
            import time
            time.sleep(0.5)
        assert "No balance found" in r.stdout, r.stdout
        oracle.assert_tree(tree, mnt, "the kernel after it resumed butter's balance",
                           check_atime=False)
    assert balance_item(img) is None
    oracle.btrfs_check(img, strict=True)
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "k2")) as mnt:
        assert {(k, p) for (k, p) in space(mnt) if k == "Data"} == {("Data", "DUP")}


def test_mount_resumes_a_recorded_balance_unless_skip_balance(fuse, butter, workdir):
    from butter_it.fusemount import FuseMount

    img, tree = many_groups(workdir, "r")
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "m"), opts=("rw",)) as mnt:
        kfs.run(["btrfs", "balance", "start", "--bg", "-dconvert=dup", mnt])
        r = kfs.run(["btrfs", "balance", "pause", mnt], check=False)
        if r.returncode != 0:
            pytest.skip(f"the kernel's balance ended before it could be paused: {r.stderr}")
    with FuseMount(butter.path, [img], os.path.join(workdir, "mnt"),
                   options=["skip_balance"]) as fm:
        r = kfs.run([butter.path, "balance", "status", fm.mnt], check=False)
        assert r.returncode == 1 and "paused" in r.stdout, r.stdout
        kfs.run([butter.path, "umount", fm.mnt], timeout=300)
        fm.wait()
    assert balance_item(img)
    with FuseMount(butter.path, [img], os.path.join(workdir, "mnt")) as fm:
        import time
        for _ in range(600):
            r = kfs.run([butter.path, "balance", "status", fm.mnt], check=False)
            if r.returncode == 0:
                break
            time.sleep(0.2)
        assert "No balance found" in r.stdout, r.stdout
        kfs.run([butter.path, "umount", fm.mnt], timeout=300)
        fm.wait()
    assert balance_item(img) is None
    oracle.btrfs_check(img, strict=True)
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "k")) as mnt:
        oracle.assert_tree(tree, mnt, "the kernel after butter's mount resumed the balance",
                           check_atime=False)
        assert {(k, p) for (k, p) in space(mnt) if k == "Data"} == {("Data", "DUP")}


REPLACE_CASES = [
    # name, devices, mkfs profile args, the old device missing
    ("raid1", 2, ["-d", "raid1", "-m", "raid1"], False),
    ("raid1-missing", 2, ["-d", "raid1", "-m", "raid1"], True),
    ("raid10", 4, ["-d", "raid10", "-m", "raid10"], False),
    ("raid5-missing", 3, ["-d", "raid5", "-m", "raid1"], True),
    ("raid6", 4, ["-d", "raid6", "-m", "raid1c3"], False),
]


@pytest.mark.parametrize("name,ndev,mkfs,missing", REPLACE_CASES, ids=[c[0] for c in REPLACE_CASES])
def test_replace(kernel, butter, workdir, name, ndev, mkfs, missing):
    """Replace device 2 by a new image: only what is used is copied, the new device takes
    devid 2, and the kernel finds every copy on it good (scrub) and the same tree."""
    with kfs.kernel_fs(workdir, ndevices=ndev, size=512 << 20, mkfs_args=mkfs) as fs:
        age(fs.mnt)
        big = kfs.fiemap(os.path.join(fs.mnt, "big"))[0]
        fs.umount()
        cmap = fs.chunk_map()
        fs.detach()
        images = list(fs.images)
    before = observe(*images, mnt=os.path.join(workdir, "look"))
    devids = {int(kfs.super_fields(i)["dev_item.devid"]): i for i in images}
    if not missing:
        # a failing disk: a stretch of the old device's copy of "big" is garbage; the
        # replace must read it from the other copy (or parity), never copy the garbage
        hits = [(d, p) for d, p in cmap.locate(big[1] + (1 << 20)) if d == 2]
        if hits:
            kfs.flip_bytes(devids[2], hits[0][1], 65536)
    used = sum(before[2].values())  # data, metadata and system bytes, one copy each
    src = next(i for i in images if int(kfs.super_fields(i)["dev_item.devid"]) == 2)
    first = next(i for i in images if int(kfs.super_fields(i)["dev_item.devid"]) == 1)
    others = [i for i in images if i not in (src, first)]
    new = os.path.join(workdir, "new.img")
    with open(new, "wb") as f:
        f.truncate(600 << 20)
    if missing:
        os.unlink(src)
    argv = [butter.path, "replace", "start"]
    for extra in ([] if missing else [src]) + others:
        argv += ["--device", extra]
    r = kfs.run(argv + ["missing" if missing else "2", new, first], check=False, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"([\d.]+)(KiB|MiB|GiB) copied", r.stdout)
    copied = float(m.group(1)) * {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]
    if "raid5" not in name and "raid6" not in name:
        # the old device held at most one copy of everything: no more is written
        assert copied <= used * 1.05 + (1 << 20), (copied, used)
    assert int(kfs.super_fields(new)["dev_item.devid"]) == 2
    if not missing:
        with open(src, "rb") as f:
            f.seek(65536 + 64)
            assert f.read(8) != b"_BHRfS_M", "the old device still looks like a member"
    members = [first, new] + others
    oracle.btrfs_check(*members, strict=True)
    with oracle.kernel_mount(*members, mnt=os.path.join(workdir, "k"), opts=("rw",)) as mnt:
        oracle.assert_tree(before[0], mnt, "the kernel after the replace", check_atime=False)
        r = kfs.run(["btrfs", "scrub", "start", "-B", "-d", mnt], check=False, timeout=900)
        assert r.returncode == 0 and "no errors found" in r.stdout, r.stdout + r.stderr


def test_replace_avoid_src(kernel, butter, workdir):
    """`replace start -r`: the old device is read only where no other copy is good. Its
    reads fail (a dying disk past its first MiB, `--fault`); each failed read counts in
    its read_io_errs (btrfs device stats), which a replace without -r raises by reading
    there first wherever the old device is the first copy, and one with -r does not."""
    with kfs.kernel_fs(workdir, ndevices=2, size=512 << 20,
                       mkfs_args=["-d", "raid1", "-m", "raid1"]) as fs:
        age(fs.mnt)
        fs.release()
        images = list(fs.images)
    first = next(i for i in images if int(kfs.super_fields(i)["dev_item.devid"]) == 1)
    src = next(i for i in images if i != first)
    before = observe(first, src, mnt=os.path.join(workdir, "look"))
    errs = {}
    for flag in ("", "-r"):
        a, b = copy_of(first, workdir, "a" + flag), copy_of(src, workdir, "b" + flag)
        new = os.path.join(workdir, "new" + flag)
        with open(new, "wb") as f:
            f.truncate(600 << 20)
        argv = [butter.path, "--fault", "read-eio,dev=1,start=1M", "replace", "start"]
        argv += ([flag] if flag else []) + ["--device", b, "2", new, a]
        r = kfs.run(argv, check=False, timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
        r = kfs.run([butter.path, "device", "stats", "--device", new, a], check=False)
        m = re.search(r"devid 2\]?\.read_io_errs\s+(\d+)|\[.*new.*\]\.read_io_errs\s+(\d+)",
                      r.stdout)
        assert m, r.stdout + r.stderr
        errs[flag] = int(m.group(1) or m.group(2))
        oracle.btrfs_check(a, new, strict=True)
        assert_same_fs(before, a, new, mnt=os.path.join(workdir, "mnt" + flag))
    assert errs["-r"] < errs[""], errs


def reloc_roots(image):
    """[(subvolume, refs)] of the relocation trees in `image`'s root tree."""
    out = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", "root", image]).stdout
    return [(m.group(1), int(m.group(2))) for m in
            re.finditer(r"key \(TREE_RELOC ROOT_ITEM (\S+)\).*?\n.*?\n.*?refs (\d+)", out)]


def test_kernel_balance_cut_by_a_crash(kernel, butter, workdir):
    """A kernel balance cut while it relocates (what a power cut leaves: the kernel's
    relocation trees in the root tree, merged or not, the data relocation tree's orphan
    inode, the balance item). The states are taken as a crash would leave them: the
    image lives on an outer btrfs and is cloned (reflink, atomic against the loop
    device's writes) again and again while the balance runs. butter opens each
    read-write: it drops the relocation trees and the orphan, and resumes the balance;
    btrfs check is clean and the kernel shows the tree as it was before the balance.
    For one state the kernel resumes the balance after butter's open instead."""
    import random
    import subprocess
    with kfs.kernel_fs(workdir, size=8 << 30, name="outer") as outer:
        pristine = os.path.join(outer.mnt, "pristine.img")
        with open(pristine, "wb") as f:
            f.truncate(4 << 30)
        kfs.run(["mkfs.btrfs", "-q", "-f", pristine])
        inner = os.path.join(workdir, "inner")
        with kfs.attached([pristine]) as loops:
            kfs.mount(loops[0], inner, [])
            try:
                rng = random.Random(7)
                for i in range(96):  # enough for several commits inside each block group
                    with open(os.path.join(inner, f"f{i}"), "wb") as f:
                        f.write(rng.randbytes(12 << 20))
                kfs.run(["btrfs", "subvolume", "snapshot", inner, os.path.join(inner, "snap")])
                for i in range(0, 96, 3):
                    with open(os.path.join(inner, f"f{i}"), "r+b") as f:
                        f.seek(20480)
                        f.write(rng.randbytes(40960))
                os.makedirs(os.path.join(inner, "d"))
                for i in range(3000):
                    with open(os.path.join(inner, "d", f"s{i}"), "w") as f:
                        f.write(str(i))
            finally:
                kfs.umount(inner)
        def tree_of(image, mnt):
            with oracle.kernel_mount(image, mnt=mnt) as root:
                return manifest.take(root)

        before = tree_of(pristine, os.path.join(workdir, "look"))
        hits = []
        for attempt in range(4):
            work = os.path.join(outer.mnt, "work.img")
            kfs.run(["cp", "--reflink=always", pristine, work])
            copies = []
            with kfs.attached([work]) as loops:
                kfs.mount(loops[0], inner, [])
                try:
                    bal = subprocess.Popen(["btrfs", "balance", "start", "--full-balance", inner],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    while bal.poll() is None:
                        copy = os.path.join(outer.mnt, f"cut{attempt}-{len(copies)}.img")
                        kfs.run(["cp", "--reflink=always", work, copy])
                        copies.append(copy)
                    bal.wait()
                finally:
                    kfs.umount(inner)
            for copy in copies:
                roots = reloc_roots(copy)
                if roots:
                    hits.append((copy, roots))
                else:
                    os.unlink(copy)
            if any(r for _, roots in hits for _, r in roots) and \
                    any(not r for _, roots in hits for _, r in roots):
                break  # both kinds: not yet merged (refs 1), merged (refs 0)
        assert hits, "no state with relocation trees was caught"
        picked = hits[:: max(1, len(hits) // 4)][:4]
        for n, (copy, roots) in enumerate(picked):
            img = os.path.join(workdir, f"state{n}.img")
            kfs.run(["cp", "--sparse=always", copy, img])
            # butter's own check reads the relocation trees' references too
            r = kfs.run([butter.path, "check", img], check=False, timeout=900)
            assert r.returncode == 0 and "\n0 error(s) found" in r.stdout, r.stdout + r.stderr
            r = kfs.run([butter.path, "balance", "resume", "-v", img], check=False, timeout=900)
            assert r.returncode == 0, f"{roots}: {r.stdout}{r.stderr}"
            assert "dropping the relocation tree" in r.stderr, r.stderr
            assert reloc_roots(img) == [], roots
            oracle.btrfs_check(img, strict=True)
            got = tree_of(img, os.path.join(workdir, f"k{n}"))
            oracle.assert_tree(before, got, f"the kernel after butter resumed a cut balance {roots}")
        # butter's open alone, then the kernel resumes the recorded balance itself
        img = os.path.join(workdir, "kernel-resumes.img")
        kfs.run(["cp", "--sparse=always", picked[0][0], img])
        r = kfs.run([butter.path, "filesystem", "label", img, "cut"], check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        assert reloc_roots(img) == []
        with kfs.attached([img]) as loops:
            kfs.mount(loops[0], inner, [])
            try:
                for _ in range(600):
                    st = kfs.run(["btrfs", "balance", "status", inner], check=False)
                    if "running" not in st.stdout.lower():
                        break
                    time.sleep(0.5)
            finally:
                kfs.umount(inner)
        oracle.btrfs_check(img, strict=True)
        out = kfs.run(["btrfs", "inspect-internal", "dump-tree", "-t", "root", img]).stdout
        assert "BALANCE" not in out, "the kernel did not finish the recorded balance"


def test_replace_refusals(kernel, butter, workdir):
    with kfs.kernel_fs(workdir, ndevices=2, size=512 << 20,
                       mkfs_args=["-d", "raid1", "-m", "raid1"]) as fs:
        fs.release()
        a, b = fs.images
    small = os.path.join(workdir, "small.img")
    with open(small, "wb") as f:
        f.truncate(100 << 20)
    r = kfs.run([butter.path, "replace", "start", "--device", b, "2", small, a], check=False)
    assert r.returncode != 0 and "bytes" in r.stderr, r.stderr
    other = kfs.make_image(os.path.join(workdir, "other.img"), 600 << 20)
    r = kfs.run([butter.path, "replace", "start", "--device", b, "2", other, a], check=False)
    assert r.returncode != 0 and "another btrfs" in r.stderr, r.stderr
    r = kfs.run([butter.path, "replace", "start", "--device", b, "2", b, a], check=False)
    assert r.returncode != 0 and "already" in r.stderr, r.stderr
    oracle.btrfs_check(a, b, strict=True)
    r = kfs.run([butter.path, "replace", "start", "-f", "--device", b, "2", other, a],
                check=False, timeout=600)
    assert r.returncode == 0, r.stderr
    oracle.btrfs_check(a, other, strict=True)


def test_device_work_on_a_live_mount(fuse, butter, workdir):
    """On a live mount: add a device, remove another (one block group at a time, the mount
    serving reads between), replace one, shrink and grow; every read right throughout, the
    kernel agrees at the end."""
    import threading

    from butter_it.fusemount import FuseMount

    with kfs.kernel_fs(workdir, ndevices=2, size=512 << 20,
                       mkfs_args=["-d", "raid1", "-m", "raid1"]) as fs:
        age(fs.mnt)
        fs.release()
        a, b = fs.images
    if int(kfs.super_fields(a)["dev_item.devid"]) != 1:
        a, b = b, a
    before = observe(a, b, mnt=os.path.join(workdir, "look"))
    want = {}
    with oracle.kernel_mount(a, b, mnt=os.path.join(workdir, "k0")) as m:
        want = {q: kfs.file_sha256(os.path.join(m, q)) for q in ("big", "frag", "sv/inner")}
    c, d = os.path.join(workdir, "c.img"), os.path.join(workdir, "d.img")
    for img in (c, d):
        with open(img, "wb") as f:
            f.truncate(600 << 20)
    errors = []
    stop = threading.Event()
    with FuseMount(butter.path, [a, b], os.path.join(workdir, "mnt")) as fm:
        mnt = fm.mnt

        def reader():
            while not stop.is_set():
                for q, digest in want.items():
                    if kfs.file_sha256(os.path.join(mnt, q)) != digest:
                        errors.append(q)

        t = threading.Thread(target=reader)
        t.start()
        try:
            kfs.run([butter.path, "device", "add", "--device", b, a, c], check=False)  # refused: mounted
            r = kfs.run([butter.path, "device", "remove", "2", mnt], check=False, timeout=900)
            assert r.returncode != 0 and "Invalid argument" in r.stderr, r.stdout + r.stderr
            assert "raid1 needs 2" in fm.log_text(), fm.log_text()[-2000:]
            r = kfs.run([butter.path, "replace", "start", "-B", "2", d, mnt], check=False,
                        timeout=900)
            assert r.returncode == 0, r.stdout + r.stderr
            r = kfs.run([butter.path, "filesystem", "resize", "2:max", mnt], check=False)
            assert r.returncode == 0 and str(600 << 20) in r.stdout, r.stdout + r.stderr
            r = kfs.run([butter.path, "filesystem", "resize", "1:360M", mnt], check=False,
                        timeout=900)
            assert r.returncode == 0, r.stdout + r.stderr
        finally:
            stop.set()
            t.join()
        assert not errors, errors[:5]
        kfs.run([butter.path, "umount", mnt], timeout=300)
        fm.wait()
    oracle.btrfs_check(a, d, strict=True)
    assert int(kfs.super_fields(d)["dev_item.devid"]) == 2
    for logical, kind, length, stripes in chunks(a, d):
        for devid, physical in stripes:
            if devid == 1:
                assert physical + length <= 360 << 20, (logical, kind, stripes)
    with oracle.kernel_mount(a, d, mnt=os.path.join(workdir, "k1"), opts=("rw",)) as m:
        oracle.assert_tree(before[0], m, "the kernel after device work on butter's mount",
                           check_atime=False)
        r = kfs.run(["btrfs", "scrub", "start", "-B", m], check=False, timeout=900)
        assert r.returncode == 0 and "no errors found" in r.stdout, r.stdout + r.stderr


def test_replace_on_a_live_mount_while_writing(fuse, butter, workdir):
    """A replace on a live mount runs in the background, a piece at a time, while a writer
    keeps writing and rewriting files: `replace status` follows it, writes made during the
    copy reach the new device too (the kernel's scrub of the result finds every copy on it
    good), and a second replace cancelled at once leaves the old device in place."""
    import hashlib
    import threading
    import time

    from butter_it.fusemount import FuseMount

    with kfs.kernel_fs(workdir, ndevices=2, size=1 << 30,
                       mkfs_args=["-d", "raid1", "-m", "raid1"]) as fs:
        age(fs.mnt)
        for i in range(6):  # enough used space for several pieces of 256 MiB
            write_file(os.path.join(fs.mnt, f"fill{i}"), 96 << 20, 100 + i)
        fs.release()
        a, b = fs.images
    if int(kfs.super_fields(a)["dev_item.devid"]) != 1:
        a, b = b, a
    d, e = os.path.join(workdir, "d.img"), os.path.join(workdir, "e.img")
    for img in (d, e):
        with open(img, "wb") as f:
            f.truncate(1 << 30)
    written, errors = {}, []
    stop = threading.Event()
    # reads turn slow (a slow disk) once the trigger exists: the copy takes seconds, so
    # its progress can be seen and a cancel arrives while it runs
    # (very slow while a cancel is to arrive in time, less so while status follows)
    trigger, crawl = os.path.join(workdir, "slow-now"), os.path.join(workdir, "crawl-now")
    fm = FuseMount(butter.path, [a, b], os.path.join(workdir, "mnt"))
    plain = fm.command
    spec = f"slow-read,ms=20,when={trigger};slow-read,ms=300,when={crawl}"
    fm.command = lambda: [butter.path, "--fault", spec] + plain()[1:]
    with fm:
        mnt = fm.mnt
        os.makedirs(os.path.join(mnt, "w"))
        open(crawl, "w").close()

        def writer():
            n = 0
            while not stop.is_set():
                name = f"w/f{n % 40}"  # rewrites too: old extents freed, new ones written
                data = os.urandom(1 << 20) * 2 + os.urandom(n % 5000)
                try:
                    with open(os.path.join(mnt, name), "wb") as f:
                        f.write(data)
                        if n % 3 == 0:
                            os.fsync(f.fileno())
                except OSError as err:
                    errors.append((name, err))
                    return
                written[name] = hashlib.sha256(data).hexdigest()
                n += 1

        t = threading.Thread(target=writer)
        t.start()
        try:
            # a replace cancelled at once: nothing changes
            r = kfs.run([butter.path, "replace", "start", "2", e, mnt], check=False)
            assert r.returncode == 0 and "started" in r.stdout, r.stdout + r.stderr
            r = kfs.run([butter.path, "replace", "cancel", mnt], check=False, timeout=600)
            if r.returncode == 1 and "replace finished" in r.stderr:
                # the copy won the race against the cancel (a loaded machine starts the
                # command late): known timing flake, not a wrong result
                stop.set()
                pytest.xfail("the replace finished before the cancel arrived")
            assert r.returncode == 0 and "canceled" in r.stdout, (r.stdout + r.stderr +
                                                                  fm.log_text()[-3000:])
            r = kfs.run([butter.path, "replace", "status", "-1", mnt], check=False)
            assert r.stdout.startswith("Canceled"), r.stdout
            os.unlink(crawl)
            open(trigger, "w").close()
            # and one that runs to its end, followed by status
            r = kfs.run([butter.path, "replace", "start", "2", d, mnt], check=False)
            assert r.returncode == 0 and "started" in r.stdout, r.stdout + r.stderr
            seen = set()
            deadline = time.time() + 600
            while time.time() < deadline:
                r = kfs.run([butter.path, "replace", "status", "-1", mnt], check=False)
                assert r.returncode == 0, r.stdout + r.stderr
                seen.add(r.stdout.split("(")[0].strip())
                if r.stdout.startswith(("Finished", "Failed", "Canceled")):
                    break
                time.sleep(0.2)
            assert r.stdout.startswith("Finished"), r.stdout + fm.log_text()[-2000:]
            assert any(x.endswith("% done") for x in seen), seen
            # a loaded machine (ASan, 2 CPUs) may have written fewer files while the
            # replace ran: let the writer reach ten on the new device before it stops
            deadline = time.time() + 120
            while len(written) < 10 and not errors and t.is_alive() and time.time() < deadline:
                time.sleep(0.1)
        finally:
            stop.set()
            t.join()
        assert not errors, errors[:5]
        assert len(written) >= 10, len(written)
        kfs.run([butter.path, "umount", mnt], timeout=300)
        fm.wait()
    assert int(kfs.super_fields(d)["dev_item.devid"]) == 2
    r = kfs.run(["btrfs", "inspect-internal", "dump-super", e], check=False)
    assert "BTRFS_MAGIC" not in r.stdout or "bad magic" in r.stdout or "csum_type" not in r.stdout, r.stdout
    oracle.btrfs_check(a, d, strict=True)
    with oracle.kernel_mount(a, d, mnt=os.path.join(workdir, "k1"), opts=("rw",)) as m:
        for name, digest in written.items():
            assert kfs.file_sha256(os.path.join(m, name)) == digest, name
        r = kfs.run(["btrfs", "scrub", "start", "-B", m], check=False, timeout=900)
        assert r.returncode == 0 and "no errors found" in r.stdout, r.stdout + r.stderr


def test_profile_conversion_chain(kernel, butter, workdir):
    """Four devices, data and metadata converted through every family of profiles (raid5
    and raid6 included) and back; after each step btrfs check is clean and the kernel sees
    the same tree, the same sharing and only the profiles asked for."""
    with kfs.kernel_fs(workdir, ndevices=4, size=512 << 20,
                       mkfs_args=["-d", "single", "-m", "dup"]) as fs:
        age(fs.mnt)
        fs.release()
        images = list(fs.images)
    first = next(i for i in images if int(kfs.super_fields(i)["dev_item.devid"]) == 1)
    rest = [i for i in images if i != first]
    before = observe(first, *rest, mnt=os.path.join(workdir, "look"))
    steps = [("raid1", "raid1c3", "RAID1", "RAID1C3"), ("raid5", "raid1c4", "RAID5", "RAID1C4"),
             ("raid6", "raid10", "RAID6", "RAID10"), ("raid10", "raid1", "RAID10", "RAID1"),
             ("raid0", "raid6", "RAID0", "RAID6"), ("single", "dup", "single", "DUP")]
    for data, meta, dname, mname in steps:
        r = balance(butter, first, f"-dconvert={data}", f"-mconvert={meta}", "-f", devices=rest)
        assert "block groups moved" in r.stdout, r.stdout
        oracle.btrfs_check(first, *rest, strict=True)
        assert_same_fs(before, first, *rest, mnt=os.path.join(workdir, "mnt"),
                       profiles={"Data": dname, "Metadata": mname, "System": mname})


def test_replace_target_failing(kernel, butter, workdir):
    """The new device fails in the middle of the copy (its file lives on a 40 MiB tmpfs:
    writes past that fail): the replace stops saying so, and the filesystem is as it was,
    the old device in place."""
    with kfs.kernel_fs(workdir, ndevices=2, size=512 << 20,
                       mkfs_args=["-d", "raid1", "-m", "raid1"]) as fs:
        age(fs.mnt)
        fs.release()
        a, b = fs.images
    if int(kfs.super_fields(a)["dev_item.devid"]) != 1:
        a, b = b, a
    before = observe(a, b, mnt=os.path.join(workdir, "look"))
    small = os.path.join(workdir, "small")
    os.makedirs(small)
    kfs.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", small])
    try:
        target = os.path.join(small, "target.img")
        with open(target, "wb") as f:
            f.truncate(600 << 20)
        r = kfs.run([butter.path, "replace", "start", "--device", b, "2", target, a],
                    check=False, timeout=600)
    finally:
        kfs.run(["umount", small], check=False)
    assert r.returncode != 0 and "new device" in r.stderr and "stays in place" in r.stderr, \
        r.stdout + r.stderr
    assert int(kfs.super_fields(b)["dev_item.devid"]) == 2
    oracle.btrfs_check(a, b, strict=True)
    assert_same_fs(before, a, b, mnt=os.path.join(workdir, "mnt"))


def test_full_balance_mixed_groups(kernel, butter, workdir):
    """mkfs.btrfs -M: data and tree blocks share the groups being moved."""
    with kfs.kernel_fs(workdir, size=1 << 30, mkfs_args=["-M"]) as fs:
        age(fs.mnt)
        fs.release()
        img = fs.images[0]
    before = observe(img, mnt=os.path.join(workdir, "look"))
    balance(butter, img)
    oracle.btrfs_check(img, strict=True)
    got = assert_same_fs(before, img, mnt=os.path.join(workdir, "mnt"))
    assert {k for k, _ in got} == {"Data+Metadata", "System", "GlobalReserve"}, got
