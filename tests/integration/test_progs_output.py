"""What butter prints where btrfs-progs prints the same thing, against btrfs-progs on a kernel
mount of the same image: `subvolume list` (its column options and -t tables), `show`,
`get-default` and `set-default`, `filesystem df` and `show`, `property`, `scrub start -B`.

The kernel makes subvolumes (nested ones, a snapshot, a read-only snapshot) and sets a
default; butter's show of each prints exactly what `btrfs subvolume show` prints, and its
get-default what `btrfs subvolume get-default` prints. Then butter sets the default: btrfs
check is clean, the kernel's get-default agrees, and a kernel mount without subvol= shows
that subvolume's files, as does a butter mount; `set-default IMAGE 0` goes back to the top
level. Wrong ids and paths that are not subvolumes fail with a message and change nothing.
"""
import json
import stat
import os
import re
import subprocess

import pytest

from butter_it import kfs, oracle
from butter_it.fusemount import FuseMount, require_fuse


def progs(cmd, mnt, *paths):
    return kfs.run(["btrfs", "subvolume", cmd] + [os.path.join(mnt, p) for p in paths]).stdout


def test_show_and_default_like_btrfs_progs(fuse, butter, workdir):
    b = butter.path
    with kfs.kernel_fs(workdir, name="k") as fs:
        m = fs.mnt
        kfs.run(["btrfs", "subvolume", "create", os.path.join(m, "a")])
        os.makedirs(os.path.join(m, "a", "dir"))
        kfs.run(["btrfs", "subvolume", "create", os.path.join(m, "a", "dir", "n")])
        with open(os.path.join(m, "a", "dir", "n", "marker"), "w") as f:
            f.write("in n\n")
        kfs.run(["btrfs", "subvolume", "snapshot", os.path.join(m, "a"), os.path.join(m, "s")])
        kfs.run(["btrfs", "subvolume", "snapshot", "-r", os.path.join(m, "a"),
                 os.path.join(m, "ro")])
        kfs.run(["btrfs", "subvolume", "set-default", os.path.join(m, "s")])
        fs.release()
        image = fs.images[0]
    subvols = ["a", "a/dir/n", "s", "ro", ""]

    def kernel_view():
        with oracle.kernel_mount(image, mnt=os.path.join(workdir, "k5"),
                                 opts=("ro", "subvolid=5")) as k:
            return ({p: progs("show", k, p) for p in subvols}, progs("get-default", k, ""))

    shows, default = kernel_view()
    list_options = [[], ["-p"], ["-a"], ["-s"], ["-t"], ["-t", "-p"], ["-c"], ["-g"], ["-r"],
                    ["-p", "-c", "-u", "-q", "-R"], ["-t", "-c"], ["-t", "-u"], ["-t", "-s"],
                    ["-t", "-q", "-R"], ["-s", "-p"]]
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "k5"),
                             opts=("ro", "subvolid=5")) as k:
        lists = {tuple(o): kfs.run(["btrfs", "subvolume", "list"] + o + [k]).stdout
                 for o in list_options}
    assert "path a/dir/n" in lists[()] and "otime" in lists[("-s",)], lists
    for o in list_options:
        assert kfs.run([b, "subvolume", "list"] + o + [image]).stdout == lists[tuple(o)], o
    # --format json (progs 6.2 has none for list; butter's layout, README): every column, the
    # values progs prints with -p -c -u -q -R
    def progs_fields(line):
        words = line.split(" path ")[0].replace("top level", "top_level").split()
        d = dict(zip(words[::2], words[1::2]))
        d["top level"] = d.pop("top_level")
        d["path"] = line.split(" path ", 1)[1]
        return d
    want = [progs_fields(line) for line in lists[("-p", "-c", "-u", "-q", "-R")].splitlines()]
    got = json.loads(kfs.run([b, "--format", "json", "subvolume", "list", image]).stdout)
    assert got["__header"] == {"version": "1"}
    assert [{k: v for k, v in item.items() if k in want[0]} for item in got["subvolume-list"]] \
        == want, (got, want)
    assert [item["flags"] for item in got["subvolume-list"]] == \
        ["ro" if line.endswith(" path ro") else "-" for line in lists[()].splitlines()]
    assert "Snapshot(s):\n\t\t\t\ts\n\t\t\t\tro\n" in shows["a"], shows["a"]
    for p in subvols:
        assert kfs.run([b, "subvolume", "show", image, "/" + p]).stdout == shows[p], p
    assert kfs.run([b, "subvolume", "get-default", image]).stdout == default
    assert default.endswith(" path s\n"), default
    assert kfs.run([b, "subvolume", "show", "-r", "256", image]).stdout == shows["a"]

    # butter sets the default: the kernel and a butter mount show it
    kfs.run([b, "subvolume", "set-default", image, "/a/dir/n"])
    oracle.btrfs_check(image)
    shows_after, default = kernel_view()
    assert shows_after == {p: shows[p] for p in subvols}  # nothing else changed
    assert default == kfs.run([b, "subvolume", "get-default", image]).stdout
    assert " path a/dir/n\n" in default, default
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kd")) as k:
        assert os.listdir(k) == ["marker"]
    require_fuse()
    with FuseMount(b, [image], os.path.join(workdir, "fm"), ["ro"]) as fm:
        assert os.listdir(fm.mnt) == ["marker"]
        assert fm.unmount() == 0

    # bad requests: a message, exit 1, the default unchanged
    for arg, msg in (("999", "no such subvolume"), ("/a/dir", "not a subvolume"),
                     ("/none", "No such file")):
        r = kfs.run([b, "subvolume", "set-default", image, arg], check=False)
        assert r.returncode == 1 and msg in r.stderr, (arg, r.stderr)
    assert kfs.run([b, "subvolume", "get-default", image]).stdout == default

    # the same on a butter mount (paths inside it, no IMAGE), as progs is used on a mount
    with FuseMount(b, [image], os.path.join(workdir, "fm5"), ["ro", "subvolid=5"]) as fm:
        for p in subvols:
            assert kfs.run([b, "subvolume", "show", os.path.join(fm.mnt, p)]).stdout == shows[p], p
        assert kfs.run([b, "subvolume", "get-default", fm.mnt]).stdout == default
        for o in list_options:
            assert kfs.run([b, "subvolume", "list"] + o + [fm.mnt]).stdout == lists[tuple(o)], o
        assert fm.unmount() == 0
    with FuseMount(b, [image], os.path.join(workdir, "fm5"), ["subvolid=5"]) as fm:
        kfs.run([b, "subvolume", "set-default", os.path.join(fm.mnt, "s")])
        assert kfs.run([b, "subvolume", "get-default", fm.mnt]).stdout.endswith(" path s\n")
        r = kfs.run([b, "subvolume", "set-default", "999", fm.mnt], check=False)
        assert r.returncode == 1 and "no such subvolume" in r.stderr, r.stderr
        r = kfs.run([b, "subvolume", "show", os.path.join(fm.mnt, "a/dir")], check=False)
        assert r.returncode == 1 and "not a subvolume" in r.stderr, r.stderr
        assert fm.unmount() == 0
    oracle.btrfs_check(image)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kd")) as k:
        assert progs("get-default", k, "").endswith(" path s\n")

    kfs.run([b, "subvolume", "set-default", image, "0"])
    oracle.btrfs_check(image)
    assert kfs.run([b, "subvolume", "get-default", image]).stdout == "ID 5 (FS_TREE)\n"
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kd")) as k:
        assert progs("get-default", k, "") == "ID 5 (FS_TREE)\n"
        assert sorted(os.listdir(k)) == ["a", "ro", "s"]


def test_filesystem_df_like_btrfs_progs(kernel, butter, workdir):
    """`butter filesystem df` of an image the kernel wrote (two devices, raid1 metadata), with
    each of progs' unit options (-b -h -H -k -m -g -t --iec --si and the long forms), and as
    --format json (with `device stats` too) equals btrfs-progs' df on the kernel mount line for line (progs adds
    GlobalReserve, the kernel's in-memory reserve, which an image does not have)."""
    with kfs.kernel_fs(workdir, name="k", ndevices=2, mkfs_args=["-d", "single", "-m", "raid1"]) as fs:
        with open(os.path.join(fs.mnt, "f"), "wb") as f:
            f.write(os.urandom(3 << 20))
        fs.release()
        images = fs.images
    unit_options = [[], ["-b"], ["--raw"], ["-h"], ["-H"], ["-k"], ["-m"], ["-g"], ["-t"],
                    ["--iec"], ["--si"], ["-k", "--si"], ["-m", "--si"], ["--gbytes"],
                    ["--human-readable"]]
    with oracle.kernel_mount(*images, mnt=os.path.join(workdir, "km")) as k:
        want = {tuple(o): kfs.run(["btrfs", "filesystem", "df"] + o + [k]).stdout.splitlines()
                for o in unit_options}
        want_json = json.loads(kfs.run(["btrfs", "--format", "json", "filesystem", "df", k]).stdout)
        want_stats = json.loads(kfs.run(["btrfs", "--format", "json", "device", "stats", k]).stdout)
    devs = ["--device", images[1]]
    # --format json: progs' layout, less the kernel's in-memory GlobalReserve row
    want_json["filesystem-df"] = [row for row in want_json["filesystem-df"]
                                  if row["bg-type"] != "GlobalReserve"]
    got = kfs.run([butter.path, "--format", "json", "filesystem", "df"] + devs + [images[0]])
    assert json.loads(got.stdout) == want_json
    got = json.loads(kfs.run([butter.path, "--format", "json", "device", "stats"] + devs +
                             [images[0]]).stdout)
    # the same members and values, but "device": an image path here, a loop device there
    assert [list(r) for r in got["device-stats"]] == [list(r) for r in want_stats["device-stats"]]
    assert ([{k: v for k, v in r.items() if k != "device"} for r in got["device-stats"]] ==
            [{k: v for k, v in r.items() if k != "device"} for r in want_stats["device-stats"]])
    assert [r["device"] for r in got["device-stats"]] == images
    assert got["__header"] == want_stats["__header"]
    r = kfs.run([butter.path, "--format", "json", "check", images[0]], check=False)
    assert r.returncode == 1 and "output format json is unsupported for this command" in r.stderr
    # info's JSON (butter's layout): its "space" items are df's, the rest dump-super's
    info = json.loads(kfs.run([butter.path, "--format", "json", "info"] + devs +
                              [images[0]]).stdout)["filesystem-info"]
    assert info["space"] == want_json["filesystem-df"]
    sb = kfs.run(["btrfs", "inspect-internal", "dump-super", images[0]]).stdout
    field = lambda k: re.search(rf"^{k}\s+(\S+)", sb, re.M).group(1)
    assert info["uuid"] == field("fsid") and info["generation"] == field("generation")
    assert info["nodesize"] == field("nodesize") and info["sectorsize"] == field("sectorsize")
    assert info["total_bytes"] == field("total_bytes") and info["bytes_used"] == field("bytes_used")
    assert info["num_devices"] == field("num_devices") == "2"
    assert [d["path"] for d in info["devices"]] == images and info["csum"] == "crc32c"
    assert "skinny-metadata" in info["features"]["incompat"], info["features"]
    for o in unit_options:
        lines = [line for line in want[tuple(o)] if not line.startswith("GlobalReserve")]
        assert any(line.startswith("Metadata, RAID1:") for line in lines), lines
        got = kfs.run([butter.path, "filesystem", "df"] + o + devs + [images[0]]).stdout
        assert got.splitlines() == lines, o


def test_property_like_btrfs_progs(fuse, butter, workdir):
    """`butter property get|list` print what btrfs-progs prints for the top level, a
    subvolume, a file and a directory; `set` of ro, label and compression is what the kernel
    then shows (progs' get, lsattr's c, a refused write in the read-only subvolume)."""
    b = butter.path
    objects = ["", "sv", "sv/file", "sv/dir"]
    with kfs.kernel_fs(workdir, name="k", mkfs_args=["-L", "first"]) as fs:
        m = fs.mnt
        kfs.run(["btrfs", "subvolume", "create", os.path.join(m, "sv")])
        os.makedirs(os.path.join(m, "sv", "dir"))
        open(os.path.join(m, "sv", "file"), "w").close()
        kfs.run(["btrfs", "property", "set", os.path.join(m, "sv", "dir"), "compression", "lzo"])
        fs.release()
        image = fs.images[0]

    def kernel_props():
        with oracle.kernel_mount(image, mnt=os.path.join(workdir, "k5")) as k:
            return {p: (kfs.run(["btrfs", "property", "get", os.path.join(k, p)]).stdout,
                        kfs.run(["btrfs", "property", "list", os.path.join(k, p)]).stdout)
                    for p in objects}

    want = kernel_props()
    assert want["sv/dir"][0] == "compression=lzo\n", want
    for p in objects:
        got = (kfs.run([b, "property", "get", image, "/" + p]).stdout,
               kfs.run([b, "property", "list", image, "/" + p]).stdout)
        assert got == want[p], (p, got, want[p])
    assert kfs.run([b, "property", "get", image, "/sv", "ro"]).stdout == "ro=false\n"

    kfs.run([b, "property", "set", image, "/sv/file", "compression", "zstd"])
    kfs.run([b, "property", "set", image, "/sv/dir", "compression", ""])
    kfs.run([b, "property", "set", image, "/", "label", "second"])
    kfs.run([b, "property", "set", image, "/sv", "ro", "true"])
    r = kfs.run([b, "property", "set", image, "/sv/file", "compression", "zlib"], check=False)
    assert r.returncode == 1 and "Read-only file system" in r.stderr, r.stderr
    for args, msg in ((["/sv", "ro", "maybe"], "true or false"),
                      (["/sv/file", "compression", "bogus"], "invalid value"),
                      (["/sv/file", "ro", "true"], "subvolume root"),
                      (["/sv", "colour", "red"], "unknown property")):
        r = kfs.run([b, "property", "set", image] + args, check=False)
        assert r.returncode != 0 and msg in r.stderr, (args, r.stderr)
    oracle.btrfs_check(image)
    # `filesystem show` of the image file: progs reads it offline too
    for o in ([], ["--raw"], ["--mbytes"], ["--si"], ["--kbytes"]):
        want_show = kfs.run(["btrfs", "filesystem", "show"] + o + [image]).stdout
        assert "Label: 'second'" in want_show, want_show
        assert kfs.run([b, "filesystem", "show"] + o + [image]).stdout == want_show, o
    after = kernel_props()
    assert after[""][0] == "ro=false\nlabel=second\n", after
    assert after["sv"][0] == "ro=true\n" and after["sv/dir"][0] == ""
    assert after["sv/file"][0] == "compression=zstd\n"
    for p in objects:
        assert kfs.run([b, "property", "get", image, "/" + p]).stdout == after[p][0], p
    # on a butter mount: get and list as progs, set as on the image
    with FuseMount(b, [image], os.path.join(workdir, "fm")) as fm:
        for p in objects:
            got = (kfs.run([b, "property", "get", os.path.join(fm.mnt, p)]).stdout,
                   kfs.run([b, "property", "list", os.path.join(fm.mnt, p)]).stdout)
            assert got == after[p], (p, got, after[p])
        kfs.run([b, "property", "set", os.path.join(fm.mnt, "sv"), "ro", "false"])
        kfs.run([b, "property", "set", os.path.join(fm.mnt, "sv/dir"), "compression", "zlib"])
        kfs.run([b, "property", "set", fm.mnt, "label", "third"])
        with open(os.path.join(fm.mnt, "sv/new-file"), "w") as f:
            f.write("writable again\n")
        kfs.run([b, "property", "set", os.path.join(fm.mnt, "sv"), "ro", "true"])
        assert fm.unmount() == 0
    oracle.btrfs_check(image)
    after = kernel_props()
    assert after[""][0] == "ro=false\nlabel=third\n" and after["sv"][0] == "ro=true\n", after
    assert after["sv/dir"][0] == "compression=zlib\n", after
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kw"), opts=("rw",)) as k:
        with open(os.path.join(k, "sv/new-file")) as f:
            assert f.read() == "writable again\n"
        assert kfs.run(["lsattr", os.path.join(k, "sv/file")]).stdout.split()[0][8] == "c"
        r = subprocess.run(["touch", os.path.join(k, "sv/new")], capture_output=True, text=True)
        assert r.returncode != 0 and "Read-only file system" in r.stderr, r.stderr


def test_scrub_grammar_like_btrfs_progs(fuse, butter, workdir):
    """`butter scrub start -B` prints progs' summary lines (Status, Error summary) with its exit
    status, on an image and on a butter mount; `scrub cancel` and `resume` with nothing running
    exit 2 as progs does on a kernel mount, and `status` exits 0. On a terminal a progress
    line is drawn (and erased) by scrub and mkfs --rootdir, on a pipe or with -q not."""
    b = butter.path
    with kfs.kernel_fs(workdir, name="k") as fs:
        with open(os.path.join(fs.mnt, "f"), "wb") as f:
            f.write(os.urandom(1 << 20))
        fs.release()
        image = fs.images[0]

    def key_lines(out):
        return [line for line in out.splitlines()
                if line.startswith(("Status:", "Error summary:", "scrub done for"))]

    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "km"), opts=("rw",)) as k:
        want = kfs.run(["btrfs", "scrub", "start", "-B", k])
        codes = {w: kfs.run(["btrfs", "scrub", w, k], check=False).returncode
                 for w in ("status", "cancel", "resume")}
    assert "Error summary:    no errors found" in want.stdout, want.stdout
    got = kfs.run([b, "scrub", "start", "-B", image])
    assert key_lines(got.stdout) == key_lines(want.stdout)
    assert kfs.run([b, "scrub", "start", "-q", image]).stdout == ""
    for w, code in codes.items():
        assert kfs.run([b, "scrub", w, image], check=False).returncode == code, w
    assert codes == {"status": 0, "cancel": 2, "resume": 2}
    # a progress line on a terminal only (script(1) gives the command a pty), never with -q
    def on_tty(argv):
        r = subprocess.run(["script", "-qec", " ".join(argv), "/dev/null"], capture_output=True,
                           timeout=300)  # bytes: text mode would turn \r into \n
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout.decode(errors="replace")

    src = os.path.join(workdir, "src")
    os.makedirs(src)
    with open(os.path.join(src, "blob"), "wb") as f:
        f.write(os.urandom(4 << 20))
    made = os.path.join(workdir, "made.img")
    assert "\rcopying: " in on_tty([b, "mkfs", "-b", "256M", "--rootdir", src, made])
    r = kfs.run([b, "mkfs", "-f", "-b", "256M", "--rootdir", src, made])
    assert "copying:" not in r.stderr + r.stdout
    oracle.btrfs_check(made)
    # send (no total: bytes and rate) and receive (from a file: percent of its length)
    kfs.run([b, "subvolume", "snapshot", "-r", made, "/", "/snap"])
    stream = os.path.join(workdir, "stream")
    assert "\rsend: " in on_tty([b, "send", "-f", stream, made, "/snap"])
    assert "send: " not in on_tty([b, "send", "-q", "-f", stream, made, "/snap"])
    target = os.path.join(workdir, "target.img")
    kfs.run([b, "mkfs", "-q", "-b", "256M", target])
    line = on_tty([b, "receive", "-f", stream, target])
    assert re.search(r"\rreceive: +\d+% .* of 4\.\d\dMiB", line), line
    assert os.path.getsize(stream) > 4 << 20
    assert "receive: " not in kfs.run([b, "receive", "-f", stream, target, "/"],
                                      check=False).stderr
    oracle.btrfs_check(target)
    assert "\rscrub: 100% " in on_tty([b, "scrub", image])
    assert "scrub: " not in on_tty([b, "scrub", "-q", image])
    assert "\rscrub" not in kfs.run([b, "scrub", image]).stderr
    # balance and replace count block groups and chunks
    line = on_tty([b, "balance", "start", image])
    assert re.search(r"\rbalance: +\d+% \d+ of \d+ block groups", line), line
    assert "balance: " not in on_tty([b, "balance", "start", "-q", image])
    new_dev = os.path.join(workdir, "new-dev.img")
    with open(new_dev, "wb") as f:
        f.truncate(os.path.getsize(image))
    line = on_tty([b, "replace", "start", "1", new_dev, image])
    assert re.search(r"\rreplace: +\d+% \d+ of \d+ chunks", line), line
    image = new_dev
    with FuseMount(b, [image], os.path.join(workdir, "fm")) as fm:
        got = kfs.run([b, "scrub", "start", "-B", fm.mnt])
        assert key_lines(got.stdout) == key_lines(want.stdout)
        assert "\rscrub: 100% " in on_tty([b, "scrub", fm.mnt])
        assert fm.unmount() == 0
    oracle.btrfs_check(image)


USAGE_RUNTIME = ("    Free (statfs, df):", "    Global reserve:")


@pytest.mark.parametrize("layout", [
    (1, []),
    (2, ["-d", "raid1", "-m", "raid1"]),
    (2, ["-d", "raid0", "-m", "raid1"]),
    (3, ["-d", "raid5", "-m", "raid1c3"]),
])
def test_filesystem_and_device_usage_like_btrfs_progs(fuse, butter, workdir, layout):
    """`butter filesystem usage` and `butter device usage` of an image the kernel wrote equal
    progs' on the kernel's mount of it, with several unit options, on the image and through a
    butter mount: every line but the device names (a loop device there, the image here) and
    the two the kernel takes from its memory (statfs's free bytes, its global reserve)."""
    ndev, mkfs_args = layout
    with kfs.kernel_fs(workdir, name="k", ndevices=ndev, mkfs_args=mkfs_args) as fs:
        with open(os.path.join(fs.mnt, "f"), "wb") as f:
            f.write(os.urandom(5 << 20))
        os.makedirs(os.path.join(fs.mnt, "d"))
        for i in range(200):
            with open(os.path.join(fs.mnt, "d", str(i)), "w") as f:
                f.write("x" * 3000)
        fs.release()
        images = fs.images
    options = [[], ["-b"], ["-k"], ["--si"], ["-h"]]
    want = {}
    with kfs.attached(images) as loops:
        mnt = os.path.join(workdir, "km")
        kfs.mount(loops[0], mnt, ["ro"] + [f"device={d}" for d in loops[1:]])
        try:
            for o in options:
                for what in (["filesystem", "usage"], ["device", "usage"]):
                    text = kfs.run(["btrfs"] + what + o + [mnt]).stdout
                    for loop, image in zip(loops, images):
                        text = re.sub(re.escape(loop) + r"\b", os.path.realpath(image), text)
                    want[(tuple(what), tuple(o))] = text
        finally:
            kfs.umount(mnt)

    def same(got, text, key):
        keep = [line for line in text.splitlines() if not line.startswith(USAGE_RUNTIME)]
        assert [line for line in got.splitlines() if not line.startswith(USAGE_RUNTIME)] == keep, \
            (key, got, text)

    devs = [a for d in images[1:] for a in ("--device", d)]
    for (what, o), text in want.items():
        assert "Data," in text
        same(kfs.run([butter.path] + list(what) + list(o) + devs + [images[0]]).stdout, text,
             (what, o))
    with FuseMount(butter.path, images, os.path.join(workdir, "fm"), ["ro"]) as m:
        for (what, o), text in want.items():
            same(kfs.run([butter.path] + list(what) + list(o) + [m.mnt]).stdout, text, (what, o))


def test_ls_send_receive_json(kernel, butter, workdir):
    """--format json of `ls` (every entry's stat as the kernel's mount of the image shows it:
    lstat field for field, symlink targets), `send -f` and `receive` (their byte counts are
    the stream's size, the subvolume ids what `subvolume list` says)."""
    b = butter.path
    with kfs.kernel_fs(workdir, name="k") as fs:
        d = os.path.join(fs.mnt, "d")
        os.mkdir(d)
        with open(os.path.join(d, "file"), "wb") as f:
            f.write(os.urandom(70000))
        os.symlink("file", os.path.join(d, "link"))
        os.mkfifo(os.path.join(d, "fifo"))
        os.link(os.path.join(d, "file"), os.path.join(d, "hard"))
        os.chmod(os.path.join(d, "file"), 0o4750)
        os.chown(os.path.join(d, "fifo"), 1234, 567)
        kfs.run(["btrfs", "subvolume", "snapshot", "-r", fs.mnt, os.path.join(fs.mnt, "snap")])
        fs.release()
        image = fs.images[0]
    got = json.loads(kfs.run([b, "--format", "json", "ls", image, "/d"]).stdout)
    items = got["directory-listing"]
    assert [i["name"] for i in items] == ["fifo", "file", "hard", "link"]
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "km")) as k:
        for i in items:
            st = os.lstat(os.path.join(k, "d", i["name"]))
            assert int(i["mode"], 8) == stat.S_IMODE(st.st_mode), i
            assert (int(i["ino"]), int(i["nlink"]), int(i["uid"]), int(i["gid"]),
                    int(i["size"]), int(i["blocks"])) == \
                (st.st_ino, st.st_nlink, st.st_uid, st.st_gid, st.st_size, st.st_blocks), i
            assert i["mtime"] == f"{st.st_mtime_ns // 10**9}.{st.st_mtime_ns % 10**9:09d}", i
            kind = {stat.S_IFREG: "file", stat.S_IFLNK: "symlink", stat.S_IFIFO: "fifo"}
            assert i["type"] == kind[stat.S_IFMT(st.st_mode)], i
            if i["type"] == "symlink":
                assert i["target"] == os.readlink(os.path.join(k, "d", i["name"]))
    one = json.loads(kfs.run([b, "--format", "json", "ls", image, "/d/file"]).stdout)
    assert one["directory-listing"] == [dict(items[1], name="/d/file")]
    stream = os.path.join(workdir, "s.stream")
    sent = json.loads(kfs.run([b, "--format", "json", "send", "-f", stream, image,
                               "/snap"]).stdout)["send"]
    assert int(sent["bytes"]) == os.path.getsize(stream) > 70000, sent
    assert sent["subvolume"] == "/snap" and sent["file"] == stream and sent["parent"] == ""
    r = kfs.run([b, "--format", "json", "send", image, "/snap"], check=False)
    assert r.returncode == 2 and "-f FILE" in r.stderr, r.stderr
    target = os.path.join(workdir, "t.img")
    kfs.run([b, "mkfs", "-q", "-b", "512M", target])
    got = json.loads(kfs.run([b, "--format", "json", "receive", "-f", stream,
                              target]).stdout)["receive"]
    assert got["subvolumes"] == "1" and int(got["bytes"]) == os.path.getsize(stream), got
    listed = json.loads(kfs.run([b, "--format", "json", "subvolume", "list",
                                 target]).stdout)["subvolume-list"]
    assert [(s["ID"], s["path"]) for s in listed] == [(got["last_subvol"], "snap")], listed
