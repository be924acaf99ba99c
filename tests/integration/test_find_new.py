"""`butter subvolume find-new` against `btrfs subvolume find-new` on the kernel's mount.

The kernel writes an image (plain, compressed, inline and preallocated extents, a
subvolume) and notes the generation; then files are changed and added, by the kernel and by
butter's read-write mount, and find-new since that generation (and since 0) must print the
same lines as progs on the kernel's mount: from the image offline, through butter's mount
(read-write: it commits first, the kernel's cached writes included; and read-only), for the
top level and for a subvolume. A path that is not a subvolume and a bad generation fail as
progs fails them.
"""
import os
import subprocess

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount


def run(argv):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=300)


def marker(text):
    last = text.strip().splitlines()[-1]
    assert last.startswith("transid marker was "), text
    return int(last.split()[-1])


def test_find_new_like_progs(fuse, butter, workdir):
    b = butter.path
    image = os.path.join(workdir, "img")
    kfs.make_image(image, 1 << 30)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "k0"), opts=("compress=zstd",)) as k:
        os.makedirs(f"{k}/a/b")
        with open(f"{k}/a/b/text", "wb") as f:
            f.write(b"".join(b"%d\n" % i for i in range(100000)))
        with open(f"{k}/small", "w") as f:
            f.write("inline\n")
        kfs.run(["fallocate", "-l", "1M", f"{k}/prealloc"])
        kfs.run(["btrfs", "subvolume", "create", f"{k}/vol"])
        with open(f"{k}/vol/data", "wb") as f:
            f.write(os.urandom(300000))
        kfs.run(["sync"])
        gen = marker(run(["btrfs", "subvolume", "find-new", k, "999999"]).stdout)
        with open(f"{k}/a/b/text", "r+b") as f:
            f.seek(4096 * 7)
            f.write(b"changed by the kernel")
    with FuseMount(b, [image], os.path.join(workdir, "m0"), ["compress=lzo"]) as m:
        with open(f"{m.mnt}/a/by-butter", "wb") as f:
            f.write(b"butter wrote this\n" * 5000)
        with open(f"{m.mnt}/vol/data", "r+b") as f:
            f.seek(8192)
            f.write(b"x" * 10000)
        # no sync: find-new on the live mount commits what is written first
        live_top = run([b, "subvolume", "find-new", m.mnt, str(gen)])
        live_vol = run([b, "subvolume", "find-new", f"{m.mnt}/vol", str(gen)])
        assert live_top.returncode == 0 and live_vol.returncode == 0, live_top.stderr
        assert "a/by-butter" in live_top.stdout and "data" in live_vol.stdout, live_top.stdout
    cases = [("", gen), ("", 0), ("vol", gen), ("vol", 0)]
    want = {}
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "k1")) as k:
        for path, since in cases:
            r = run(["btrfs", "subvolume", "find-new", os.path.join(k, path), str(since)])
            assert r.returncode == 0, r.stderr
            want[(path, since)] = r.stdout
        r = run(["btrfs", "subvolume", "find-new", f"{k}/a", "0"])
        assert r.returncode == 1
    assert want[("", gen)].count("\n") >= 3 and "a/b/text" in want[("", gen)]
    assert "COMPRESS" in want[("", 0)] and "PREALLOC" in want[("", 0)] and "INLINE" in want[("", 0)]
    assert live_top.stdout == want[("", gen)], (live_top.stdout, want[("", gen)])
    assert live_vol.stdout == want[("vol", gen)], (live_vol.stdout, want[("vol", gen)])
    for (path, since), text in want.items():
        r = run([b, "subvolume", "find-new", image, "/" + path, str(since)])
        assert r.returncode == 0 and r.stdout == text, (path, since, r.stdout, r.stderr, text)
    with FuseMount(b, [image], os.path.join(workdir, "m1"), ["ro"]) as m:
        for (path, since), text in want.items():
            r = run([b, "subvolume", "find-new", os.path.join(m.mnt, path), str(since)])
            assert r.returncode == 0 and r.stdout == text, (path, since, r.stdout, r.stderr, text)
        r = run([b, "subvolume", "find-new", f"{m.mnt}/a", "0"])
        assert r.returncode == 1 and "not a subvolume" in r.stderr and r.stdout == ""
    r = run([b, "subvolume", "find-new", image, "/a", "0"])
    assert r.returncode == 1 and "not a subvolume" in r.stderr and r.stdout == ""
    r = run([b, "subvolume", "find-new", image, "/", "x1"])
    assert r.returncode == 2 and "x1" in r.stderr
