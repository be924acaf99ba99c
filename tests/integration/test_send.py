"""`butter send`: a read-only subvolume as a btrfs send stream, judged by the kernel.

The kernel fills a subvolume with the full test tree (every file type, holes, hard
links, xattrs and ACLs, odd modes and owners, long names, many entries) and snapshots it
read-only. `butter send` writes the snapshot's stream from the image; `btrfs receive`
(btrfs-progs, into a fresh kernel btrfs) must accept it and make a tree equal to the
snapshot, stat for stat and byte for byte (manifest.compare), read-only, with the
snapshot's uuid as its received uuid. The kernel's own `btrfs send` of the same snapshot,
received beside it, gives the same tree. A writable subvolume is refused, as btrfs send
refuses it.
"""
import os
import re

from butter_it import kfs, manifest, oracle, tree


def subvol_show(path):
    out = kfs.run(["btrfs", "subvolume", "show", path]).stdout
    get = lambda k: re.search(rf"^\s*{k}:\s*(.*)$", out, re.M).group(1).strip()
    return {"uuid": get("UUID"), "received": get("Received UUID"), "flags": get("Flags")}


def receive(stream, into):
    os.makedirs(into, exist_ok=True)
    r = kfs.run(["btrfs", "receive", "-f", stream, into], check=False, timeout=600)
    assert r.returncode == 0, f"btrfs receive failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def test_send_kernel_tree(kernel, butter, workdir):
    bstream = os.path.join(workdir, "butter.stream")
    kstream = os.path.join(workdir, "kernel.stream")
    with kfs.kernel_fs(workdir, name="src") as fs:
        kfs.run(["btrfs", "subvolume", "create", os.path.join(fs.mnt, "vol")])
        tree.populate(os.path.join(fs.mnt, "vol"), seed=7, subvolumes=False)
        snap = os.path.join(fs.mnt, "snap")
        kfs.run(["btrfs", "subvolume", "snapshot", "-r", os.path.join(fs.mnt, "vol"), snap])
        fs.sync()
        src = manifest.take(snap)
        src_uuid = subvol_show(snap)["uuid"]
        kfs.run(["btrfs", "send", "-q", "-f", kstream, snap], timeout=600)
        fs.release()
        r = kfs.run([butter.path, "send", "-f", bstream, fs.images[0], "/snap"], check=False,
                    timeout=600)
        assert r.returncode == 0, f"butter send: {r.returncode}\n{r.stderr[-3000:]}"
        r = kfs.run([butter.path, "send", fs.images[0], "/vol"], check=False)
        assert r.returncode == 1 and "not a read-only subvolume" in r.stderr, \
            f"a writable subvolume was not refused: {r.returncode}\n{r.stderr}"
    r = kfs.run(["btrfs", "receive", "--dump", "-f", bstream], check=False, timeout=600)
    assert r.returncode == 0, f"btrfs receive --dump:\n{r.stderr[-3000:]}"
    with kfs.kernel_fs(workdir, name="dst") as dst:
        receive(bstream, os.path.join(dst.mnt, "b"))
        receive(kstream, os.path.join(dst.mnt, "k"))
        got = os.path.join(dst.mnt, "b", "snap")
        info = subvol_show(got)
        assert info["received"] == src_uuid, f"received uuid {info} vs source {src_uuid}"
        assert "readonly" in info["flags"], info
        manifest.assert_same(src, manifest.take(got))
        manifest.assert_same(manifest.take(os.path.join(dst.mnt, "k", "snap")),
                             manifest.take(got))


def test_send_butter_written(kernel, butter, workdir):
    """An image butter wrote (mkfs --rootdir, then a read-only snapshot made by butter)."""
    src_dir = os.path.join(workdir, "tree")
    os.makedirs(os.path.join(src_dir, "d", "e"))
    with open(os.path.join(src_dir, "d", "f"), "wb") as f:
        f.write(os.urandom(300000))
    with open(os.path.join(src_dir, "sparse"), "wb") as f:
        f.seek(3 << 20)
        f.write(b"end")
    os.link(os.path.join(src_dir, "d", "f"), os.path.join(src_dir, "d", "e", "g"))
    os.symlink("../f", os.path.join(src_dir, "d", "e", "s"))
    os.mkfifo(os.path.join(src_dir, "fifo"))
    os.setxattr(os.path.join(src_dir, "d", "f"), "user.note", b"value")
    os.chmod(os.path.join(src_dir, "d"), 0o1777)
    img = os.path.join(workdir, "b.img")
    kfs.run([butter.path, "mkfs", "-q", "-b", "512M", "--rootdir", src_dir, img])
    kfs.run([butter.path, "subvolume", "snapshot", "-r", img, "/", "/snap"])
    stream = os.path.join(workdir, "s.stream")
    kfs.run([butter.path, "send", "-f", stream, img, "/snap"])
    # the snapshot carries the ctransid of the top level's last change (as the kernel
    # keeps it: every inode change moves a subvolume's ctransid), not 0
    dump = kfs.run(["btrfs", "receive", "--dump", "-f", stream]).stdout
    m = re.search(r"^subvol\s+\S+\s+uuid=\S+ transid=(\d+)", dump, re.M)
    assert m and int(m.group(1)) > 0, dump[:500]
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "bmnt")) as mnt:
        src = manifest.take(os.path.join(mnt, "snap"))
    with kfs.kernel_fs(workdir, name="dst") as dst:
        receive(stream, dst.mnt)
        manifest.assert_same(src, manifest.take(os.path.join(dst.mnt, "snap")))


def butter_receive(butter, img, stream):
    r = kfs.run([butter.path, "receive", "-f", stream, img], check=False, timeout=600)
    return r


def kernel_view(workdir, img, paths):
    """Mount the butter-written image read-only: btrfs check first, then manifests."""
    oracle.btrfs_check(img)
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "view")) as mnt:
        return [manifest.take(os.path.join(mnt, p)) for p in paths], \
            [subvol_show(os.path.join(mnt, p)) for p in paths]


def change_tree(root):
    """Renames, removals, rewrites, new files and a clone: what an incremental stream
    carries."""
    for dirpath, dirnames, filenames in os.walk(root):
        for i, name in enumerate(sorted(filenames)):
            p = os.path.join(dirpath, name)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            if i % 7 == 0:
                os.rename(p, p + ".moved")
            elif i % 7 == 1:
                os.unlink(p)
            elif i % 7 == 2 and os.path.getsize(p) > 0:
                with open(p, "r+b") as f:
                    f.seek(os.path.getsize(p) // 2)
                    f.write(b"changed in the second snapshot")
        break
    os.makedirs(os.path.join(root, "incremental", "deep"))
    with open(os.path.join(root, "incremental", "deep", "new"), "wb") as f:
        f.write(os.urandom(1 << 20))
    kfs.run(["cp", "--reflink=always", os.path.join(root, "incremental", "deep", "new"),
             os.path.join(root, "incremental", "copy")])


def test_receive_kernel_streams(kernel, butter, workdir):
    """Full and incremental streams from the kernel's btrfs send, received by butter."""
    full = os.path.join(workdir, "full.stream")
    inc = os.path.join(workdir, "inc.stream")
    with kfs.kernel_fs(workdir, name="src") as fs:
        vol = os.path.join(fs.mnt, "vol")
        kfs.run(["btrfs", "subvolume", "create", vol])
        tree.populate(vol, seed=11, subvolumes=False)
        s1, s2 = os.path.join(fs.mnt, "s1"), os.path.join(fs.mnt, "s2")
        kfs.run(["btrfs", "subvolume", "snapshot", "-r", vol, s1])
        change_tree(vol)
        kfs.run(["btrfs", "subvolume", "snapshot", "-r", vol, s2])
        fs.sync()
        want = [manifest.take(s1), manifest.take(s2)]
        uuids = [subvol_show(s1)["uuid"], subvol_show(s2)["uuid"]]
        kfs.run(["btrfs", "send", "-q", "-f", full, s1], timeout=600)
        kfs.run(["btrfs", "send", "-q", "-p", s1, "-f", inc, s2], timeout=600)
    dump = kfs.run(["btrfs", "receive", "--dump", "-f", inc], timeout=600).stdout
    kinds = {line.split()[0] for line in dump.splitlines() if line.strip()}
    assert {"snapshot", "rename", "unlink", "clone", "write"} <= kinds, kinds
    img = os.path.join(workdir, "recv.img")
    kfs.run([butter.path, "mkfs", "-q", "-b", "2G", img])
    for stream in (full, inc):
        r = butter_receive(butter, img, stream)
        assert r.returncode == 0, f"butter receive {stream}: {r.returncode}\n{r.stderr[-3000:]}"
    got, shows = kernel_view(workdir, img, ["s1", "s2"])
    for w, g in zip(want, got):
        manifest.assert_same(w, g)
    for show, uuid in zip(shows, uuids):
        assert show["received"] == uuid and "readonly" in show["flags"], (show, uuid)


def test_receive_damaged_stream(kernel, butter, workdir):
    """A stream with a flipped byte is refused with a message; the image stays sound."""
    src = os.path.join(workdir, "tree")
    os.makedirs(src)
    for i in range(20):
        with open(os.path.join(src, f"f{i}"), "wb") as f:
            f.write(os.urandom(5000 * (i + 1)))
    img = os.path.join(workdir, "a.img")
    kfs.run([butter.path, "mkfs", "-q", "-b", "512M", "--rootdir", src, img])
    kfs.run([butter.path, "subvolume", "snapshot", "-r", img, "/", "/snap"])
    stream = os.path.join(workdir, "s.stream")
    kfs.run([butter.path, "send", "-f", stream, img, "/snap"])
    with open(stream, "r+b") as f:
        f.seek(os.path.getsize(stream) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x5A]))
    dst = os.path.join(workdir, "b.img")
    kfs.run([butter.path, "mkfs", "-q", "-b", "512M", dst])
    r = butter_receive(butter, dst, stream)
    assert r.returncode == 1, f"a damaged stream was accepted: {r.returncode}\n{r.stdout}"
    assert "checksum mismatch" in r.stderr and "damaged" in r.stderr, r.stderr
    oracle.btrfs_check(dst)             # after a refused stream
    truncated = os.path.join(workdir, "t.stream")
    with open(stream, "rb") as f, open(truncated, "wb") as g:
        g.write(f.read(40))
    r = butter_receive(butter, dst, truncated)
    assert r.returncode == 1 and "ends inside" in r.stderr, r.stderr


def test_send_incremental(kernel, butter, workdir):
    """butter send -p: the kernel's btrfs receive turns the parent into the child."""
    full = os.path.join(workdir, "full.stream")
    inc = os.path.join(workdir, "inc.stream")
    with kfs.kernel_fs(workdir, name="src") as fs:
        vol = os.path.join(fs.mnt, "vol")
        kfs.run(["btrfs", "subvolume", "create", vol])
        tree.populate(vol, seed=13, subvolumes=False)
        s1, s2 = os.path.join(fs.mnt, "s1"), os.path.join(fs.mnt, "s2")
        kfs.run(["btrfs", "subvolume", "snapshot", "-r", vol, s1])
        change_tree(vol)
        # a renamed directory, a new hard link to a kept file, an xattr change
        subdirs = sorted(d for d in os.listdir(vol) if os.path.isdir(os.path.join(vol, d))
                         and not os.path.islink(os.path.join(vol, d)))
        os.rename(os.path.join(vol, subdirs[0]), os.path.join(vol, subdirs[0] + ".renamed"))
        kept = next(os.path.join(r, f) for r, _, fs_ in os.walk(vol) for f in fs_
                    if os.path.isfile(os.path.join(r, f))
                    and not os.path.islink(os.path.join(r, f)))
        os.link(kept, os.path.join(vol, "new-link"))
        os.setxattr(kept, "user.incremental", b"yes")
        kfs.run(["btrfs", "subvolume", "snapshot", "-r", vol, s2])
        fs.sync()
        want = manifest.take(s2)
        fs.release()
        img = fs.images[0]
        kfs.run([butter.path, "send", "-f", full, img, "/s1"], timeout=600)
        r = kfs.run([butter.path, "send", "-p", "/s1", "-f", inc, img, "/s2"], check=False,
                    timeout=600)
        assert r.returncode == 0, f"butter send -p: {r.returncode}\n{r.stderr[-3000:]}"
    dump = kfs.run(["btrfs", "receive", "--dump", "-f", inc], timeout=600).stdout
    assert dump.startswith("snapshot"), dump[:300]
    assert os.path.getsize(inc) < os.path.getsize(full), "the incremental stream resent all"
    with kfs.kernel_fs(workdir, name="dst") as dst:
        receive(full, dst.mnt)
        receive(inc, dst.mnt)
        manifest.assert_same(want, manifest.take(os.path.join(dst.mnt, "s2")))
    # butter receives its own incremental stream too
    img2 = os.path.join(workdir, "r.img")
    kfs.run([butter.path, "mkfs", "-q", "-b", "2G", img2])
    for stream in (full, inc):
        r = butter_receive(butter, img2, stream)
        assert r.returncode == 0, f"butter receive {stream}:\n{r.stderr[-3000:]}"
    got, _ = kernel_view(workdir, img2, ["s2"])
    manifest.assert_same(want, got[0])


def test_send_from_a_live_mount(fuse, butter, workdir):
    """`butter send [-p PARENT] MOUNTED-PATH` on a live butter mount: the mount commits, the
    stream comes from that commit (written just before, through the kernel's cache, without
    sync), and the kernel's btrfs receive makes the same trees the mount shows."""
    from butter_it.fusemount import FuseMount
    b = butter.path
    img = os.path.join(workdir, "img")
    kfs.run([b, "mkfs", "-q", "-b", "1G", img])
    full = os.path.join(workdir, "full.stream")
    inc = os.path.join(workdir, "inc.stream")
    with FuseMount(b, [img], os.path.join(workdir, "m")) as m:
        vol = os.path.join(m.mnt, "vol")
        kfs.run([b, "subvolume", "create", vol])
        tree.small_tree(vol, seed=21)
        kfs.run([b, "subvolume", "snapshot", "-r", vol, os.path.join(m.mnt, "s1")])
        r = kfs.run([b, "send", "-f", full, os.path.join(m.mnt, "s1")], check=False)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        # changes (change_tree's reflinks are not FUSE's: copy_file_range shares extents here)
        files = sorted(os.path.join(r, f) for r, _, fs_ in os.walk(vol) for f in fs_
                       if os.path.isfile(os.path.join(r, f)) and not os.path.islink(os.path.join(r, f)))
        with open(files[0], "r+b") as f:
            f.seek(100)
            f.write(b"changed")
        os.unlink(files[1])
        with open(files[-1], "rb") as src, open(os.path.join(vol, "copied"), "wb") as dst:
            os.copy_file_range(src.fileno(), dst.fileno(), os.fstat(src.fileno()).st_size)
        os.mkdir(os.path.join(vol, "newdir"))
        with open(os.path.join(vol, "late"), "wb") as f:
            f.write(b"written just before the snapshot\n" * 1000)
        kfs.run([b, "subvolume", "snapshot", "-r", vol, os.path.join(m.mnt, "s2")])
        r = kfs.run([b, "send", "-p", os.path.join(m.mnt, "s1"), "-f", inc,
                     os.path.join(m.mnt, "s2")], check=False)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        want1 = manifest.take(os.path.join(m.mnt, "s1"))
        want2 = manifest.take(os.path.join(m.mnt, "s2"))
        # a writable subvolume and a directory that is no subvolume are refused
        r = kfs.run([b, "send", "-f", full + ".x", vol], check=False)
        assert r.returncode == 1 and "read-only" in r.stderr, r.stderr
        os.makedirs(os.path.join(vol, "plain-dir"), exist_ok=True)
        r = kfs.run([b, "send", "-f", full + ".x", os.path.join(vol, "plain-dir")], check=False)
        assert r.returncode == 1 and "not a subvolume" in r.stderr, r.stderr
    assert os.path.getsize(inc) < os.path.getsize(full)
    with kfs.kernel_fs(workdir, name="dst") as dst:
        receive(full, dst.mnt)
        receive(inc, dst.mnt)
        manifest.assert_same(want1, manifest.take(os.path.join(dst.mnt, "s1")))
        manifest.assert_same(want2, manifest.take(os.path.join(dst.mnt, "s2")))


def test_receive_into_a_live_mount(kernel, butter, workdir):
    """`butter receive [-f FILE] DIR-IN-MOUNT`: the kernel's full and incremental streams
    (the second through a pipe) received into a directory of a live butter mount make the
    trees the kernel sent, read-only with the senders' uuids as received uuids, visible
    through the mount at once (the kernel had looked the names up as missing before); the
    mount serves other requests while a slow sender's stream comes. A damaged stream is
    refused with the mount's log saying where, a caller other than root is refused, and
    the mount stays sound: btrfs check and the kernel's view of the image judge."""
    import subprocess
    import time
    from butter_it.fusemount import FuseMount
    full = os.path.join(workdir, "full.stream")
    inc = os.path.join(workdir, "inc.stream")
    with kfs.kernel_fs(workdir, name="src") as fs:
        vol = os.path.join(fs.mnt, "vol")
        kfs.run(["btrfs", "subvolume", "create", vol])
        tree.populate(vol, seed=12, subvolumes=False)
        s1, s2 = os.path.join(fs.mnt, "s1"), os.path.join(fs.mnt, "s2")
        kfs.run(["btrfs", "subvolume", "snapshot", "-r", vol, s1])
        change_tree(vol)
        kfs.run(["btrfs", "subvolume", "snapshot", "-r", vol, s2])
        fs.sync()
        want = [manifest.take(s1), manifest.take(s2)]
        uuids = [subvol_show(s1)["uuid"], subvol_show(s2)["uuid"]]
        kfs.run(["btrfs", "send", "-q", "-f", full, s1], timeout=600)
        kfs.run(["btrfs", "send", "-q", "-p", s1, "-f", inc, s2], timeout=600)
    b = butter.path
    img = os.path.join(workdir, "recv.img")
    kfs.run([b, "mkfs", "-q", "-b", "2G", img])
    with FuseMount(b, [img], os.path.join(workdir, "m"), ["allow_other"]) as m:
        into = os.path.join(m.mnt, "backups")
        os.mkdir(into)
        assert not os.path.exists(os.path.join(into, "s1"))   # cached as missing now
        r = kfs.run([b, "receive", "-f", full, into], check=False, timeout=600)
        assert r.returncode == 0 and "received 1 subvolume(s)" in r.stdout, r.stderr
        # a slow sender: the stream trickles in while the mount answers other requests
        with open(inc, "rb") as f:
            data = f.read()
        p = subprocess.Popen([b, "receive", into], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdin.write(data[:len(data) // 2])
        p.stdin.flush()
        time.sleep(0.5)
        t0 = time.monotonic()
        with open(os.path.join(m.mnt, "meanwhile"), "w") as f:
            f.write("written while a receive waits for its sender\n")
        assert os.listdir(into)
        assert time.monotonic() - t0 < 5, "the mount stalled while the receive waited"
        p.stdin.write(data[len(data) // 2:])
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        for name, w, uuid in zip(("s1", "s2"), want, uuids):
            manifest.assert_same(w, manifest.take(os.path.join(into, name)))
            r = kfs.run([b, "subvolume", "show", os.path.join(into, name)])
            assert re.search(rf"Received UUID:\s+{uuid}", r.stdout), r.stdout
        try:
            open(os.path.join(into, "s2", "x"), "w").close()
            raise AssertionError("a received subvolume is writable")
        except OSError as e:
            assert e.errno == 30, e   # EROFS
        # a damaged stream is refused; the mount goes on
        damaged = bytearray(data)
        damaged[len(damaged) // 2] ^= 0x5A
        r = subprocess.run([b, "receive", m.mnt], input=bytes(damaged), capture_output=True)
        assert r.returncode == 1 and "damaged" in r.stderr.decode(), r.stderr
        os.chmod(workdir, 0o755)  # nobody may reach the mount
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            b, "receive", m.mnt], input=data, capture_output=True)
        assert r.returncode == 1 and "needs root" in r.stderr.decode(), r.stderr
        assert m.unmount() == 0, m.log_text()[-3000:]
        assert "checksum mismatch" in m.log_text(), m.log_text()[-3000:]
    got, shows = kernel_view(workdir, img, ["backups/s1", "backups/s2"])
    for w, g in zip(want, got):
        manifest.assert_same(w, g)
    for show, uuid in zip(shows, uuids):
        assert show["received"] == uuid and "readonly" in show["flags"], (show, uuid)


DUMP_RECORD = re.compile(r"^([a-z_]+) +(\./\S*)(?: +(.*))?$", re.S)


def dump_records(text):
    """A dump's lines as records: a raw xattr value of progs before 6.9.1 may hold newlines,
    which continue the record of the line before."""
    records = []
    for line in text.split("\n"):
        if re.match(r"^[a-z_]+ +\./", line) or not records:
            records.append(line)
        else:
            records[-1] += "\n" + line
    return [r for r in records if r]


def assert_same_dump(got, wanted):
    """butter's --dump against the installed btrfs-progs' (Debian's 6.2): equal line for line,
    but where progs 6.9.1 changed its own output, which butter follows: an xattr's value and
    a clone's source are escaped (6.2 printed them raw, with "data=" before the value), so
    there only the command, the path, the name, the lengths and offsets are compared."""
    got, wanted = dump_records(got), dump_records(wanted)
    assert len(got) == len(wanted), (len(got), len(wanted))
    for g, w in zip(got, wanted):
        if not w.startswith(("set_xattr", "clone")):
            assert g == w
            continue
        gm, wm = DUMP_RECORD.match(g), DUMP_RECORD.match(w)
        assert gm and wm and gm.group(1, 2) == wm.group(1, 2), (g, w)
        if w.startswith("set_xattr"):
            assert gm.group(3).split(" ")[0] == wm.group(3).split(" ")[0], (g, w)  # name=
            assert g.rsplit(" ", 1)[1] == w.rsplit(" ", 1)[1], (g, w)              # len=
        else:
            num = lambda t: re.findall(r"(?:^| )(offset|len|clone_offset)=(\d+)", t)
            assert num(gm.group(3)) == num(wm.group(3)), (g, w)


def test_receive_dump_and_end_marker(kernel, butter, workdir):
    """`butter receive --dump` prints the kernel's full and incremental streams line for line
    as `btrfs receive --dump` does (every command kind of populate's tree: odd names, xattrs,
    special files, renames, clones, times); `-e` stops at the first end marker, on an image
    and on a mount, so what follows (here: junk) is never read, while without -e the junk
    is an error."""
    from butter_it.fusemount import FuseMount
    full = os.path.join(workdir, "full.stream")
    inc = os.path.join(workdir, "inc.stream")
    with kfs.kernel_fs(workdir, name="src") as fs:
        vol = os.path.join(fs.mnt, "vol")
        kfs.run(["btrfs", "subvolume", "create", vol])
        tree.populate(vol, seed=13, subvolumes=False)
        s1, s2 = os.path.join(fs.mnt, "s1"), os.path.join(fs.mnt, "s2")
        kfs.run(["btrfs", "subvolume", "snapshot", "-r", vol, s1])
        change_tree(vol)
        kfs.run(["btrfs", "subvolume", "snapshot", "-r", vol, s2])
        fs.sync()
        want = manifest.take(s1)
        kfs.run(["btrfs", "send", "-q", "-f", full, s1], timeout=600)
        kfs.run(["btrfs", "send", "-q", "-p", s1, "-f", inc, s2], timeout=600)
    b = butter.path
    kinds = set()
    for stream in (full, inc):
        got = kfs.run([b, "receive", "--dump", "-f", stream], timeout=600).stdout
        wanted = kfs.run(["btrfs", "receive", "--dump", "-f", stream], timeout=600).stdout
        assert_same_dump(got, wanted)
        kinds |= {line.split()[0] for line in got.splitlines()}
    assert {"snapshot", "rename", "clone", "write", "set_xattr", "utimes"} <= kinds, kinds
    junk = os.path.join(workdir, "junk.stream")
    with open(full, "rb") as f, open(junk, "wb") as g:
        g.write(f.read() + b"not a stream at all")
    img = os.path.join(workdir, "e.img")
    kfs.run([b, "mkfs", "-q", "-b", "1G", img])
    r = kfs.run([b, "receive", "-f", junk, img], check=False, timeout=600)
    assert r.returncode == 1, r.stderr          # the junk is read as a second stream
    r = kfs.run([b, "receive", "-e", "-f", junk, img, "/e"], check=False, timeout=600)
    assert r.returncode == 1, r.stderr          # /e does not exist
    kfs.run([b, "mkdir", img, "/e"])
    r = kfs.run([b, "receive", "-e", "-f", junk, img, "/e"], check=False, timeout=600)
    assert r.returncode == 0 and "received 1 subvolume(s)" in r.stdout, r.stderr
    with FuseMount(b, [img], os.path.join(workdir, "m")) as m:
        os.mkdir(os.path.join(m.mnt, "viamount"))
        r = kfs.run([b, "receive", "-e", "-f", junk, os.path.join(m.mnt, "viamount")],
                    check=False, timeout=600)
        assert r.returncode == 0, r.stderr
        manifest.assert_same(want, manifest.take(os.path.join(m.mnt, "viamount", "s1")))
        assert m.unmount() == 0
    got, shows = kernel_view(workdir, img, ["e/s1", "viamount/s1"])
    for g in got:
        manifest.assert_same(want, g)
