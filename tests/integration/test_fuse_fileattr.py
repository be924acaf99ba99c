"""chattr(1) and lsattr(1) on a butter mount, against the kernel's btrfs.

The same script runs as root on a kernel btrfs mount and on a butter mount: it sets each
flag btrfs keeps (i immutable, a append-only, C nocow, c compress, m no compression, A, S,
d, D) and then tries what each forbids or changes: writes, truncation, chmod, chown,
times, xattrs, links, renames, unlinks, new names in a directory, what new files inherit
from their directory, the btrfs.compression property the flags and the flags the property
set, and flags btrfs refuses. Every step's exit status and output (lsattr's letters, the
tools' error messages) must be the kernel's. The image butter wrote is then judged by btrfs
check, and the kernel reads the flags butter stored: its lsattr -R equals butter's.

Known difference, kept out of the script: on an append-only file butter's mount lets an
explicit mtime alone be set (`touch -m -d`), which the kernel refuses: a FUSE kernel with
the writeback cache sends the mtime its own writes made the same way.
"""
import os
import subprocess

from butter_it import kfs, oracle
from butter_it.fusemount import steps_like_kernel

SETUP = [
    "mkdir d sub adir cowdir compdir",
    "echo data > d/f && echo log > d/log && echo x > d/full && echo y > sub/kept",
    "touch d/empty d/e2 d/e3",
]
STEPS = [
    # immutable
    "chattr +i d/f && lsattr d/f",
    "echo more >> d/f",
    "echo new > d/f",
    "truncate -s 0 d/f",
    "chmod 600 d/f",
    "chown nobody d/f",
    "touch d/f",
    "touch -d 2001-01-01 d/f",
    "setfattr -n user.x -v 1 d/f",
    "ln d/f d/f2",
    "mv d/f d/g",
    "rm -f d/f",
    "fallocate -l 1M d/f",
    "cat d/f",
    "chattr -i d/f && lsattr d/f && echo ok >> d/f && cat d/f",
    # append-only
    "chattr +a d/log && lsattr d/log",
    "echo more >> d/log",
    "echo new > d/log",
    "truncate -s 0 d/log",
    "chmod 600 d/log",
    "touch d/log",
    "touch -d 2001-01-01 d/log",
    "setfattr -n user.x -v 1 d/log",
    "ln d/log d/log2",
    "mv d/log d/log3",
    "rm -f d/log",
    "fallocate -l 64K d/log && stat -c %s d/log",
    "fallocate -p -o 0 -l 4K d/log",
    "head -c 20 d/log | od -c | head -2",
    "chattr -a d/log && truncate -s 9 d/log && cat d/log",
    # an immutable directory
    "chattr +i sub && lsattr -d sub",
    "touch sub/new",
    "mkdir sub/dd",
    "ln -s x sub/l",
    "mv d/full sub/",
    "rm -f sub/kept",
    "mv sub/kept d/",
    "echo z >> sub/kept && cat sub/kept",
    "chattr -i sub && ls sub",
    # an append-only directory
    "chattr +a adir && lsattr -d adir",
    "touch adir/new && ls adir",
    "rm -f adir/new",
    "mv adir/new d/",
    "mv d/full adir/ && ls adir",
    "chattr -a adir && rm adir/new && ls adir",
    # nocow: empty files, files with data, directories and what they pass on
    "chattr +C d/empty && lsattr d/empty",
    "chattr +C d/e3 && echo data > d/e3 && chattr -C d/e3; lsattr d/e3",
    "chattr +C adir/full; lsattr adir/full",
    "chattr +C cowdir && lsattr -d cowdir",
    "touch cowdir/new && mkdir cowdir/sd && ln -s x cowdir/l && lsattr cowdir",
    "chattr +c d/empty",
    # compression: flags and the property
    "chattr +c d/e2 && lsattr d/e2 && getfattr --absolute-names -n btrfs.compression d/e2",
    "chattr -c d/e2 && lsattr d/e2 && getfattr --absolute-names -n btrfs.compression d/e2",
    "chattr +m d/e2 && lsattr d/e2 && getfattr --absolute-names -n btrfs.compression d/e2",
    "chattr +c d/e2",
    "chattr -m +c d/e2 && lsattr d/e2",
    "chattr -c d/e2 && setfattr -n btrfs.compression -v zstd d/e2 && lsattr d/e2",
    "setfattr -n btrfs.compression -v none d/e2 && lsattr d/e2",
    "setfattr -x btrfs.compression d/e2 && lsattr d/e2",
    "chattr +c compdir && touch compdir/a && mkdir compdir/b && lsattr compdir",
    "getfattr --absolute-names -n btrfs.compression compdir/a compdir/b",
    "setfattr -n btrfs.compression -v zstd compdir && touch compdir/z && lsattr compdir/z",
    "getfattr --absolute-names -n btrfs.compression compdir/z",
    "chattr -c +m compdir && touch compdir/m && lsattr compdir/m",
    # the rest btrfs keeps, and what it refuses
    "chattr +AdSD d/e2 && lsattr d/e2",
    "chattr -AdSD d/e2 && lsattr d/e2",
    "chattr +s d/e2",
    "chattr +u d/e2",
    "chattr +t d/e2",
    "chattr +j d/e2",
    "lsattr d/e2",
    # immutable again, left so for the kernel to read
    "chattr +i d/g 2>/dev/null; chattr +i d/f && chattr +a d/log",
    "lsattr -R . 2>&1 | sort",
]


def sh(cmd, cwd):
    p = subprocess.run(cmd, shell=True, cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    return p.returncode, p.stdout


def run_script(root):
    for step in SETUP:
        rc, out = sh(step, root)
        assert rc == 0, f"setup step {step!r} failed: {out}"
    return [(step,) + sh(step, root) for step in STEPS]


def lsattr_all(root):
    return sh("lsattr -R . 2>&1 | sort", root)


def test_chattr_like_kernel_btrfs(fuse, butter, workdir):
    with kfs.kernel_fs(workdir, name="kernel") as fs:
        want = run_script(fs.mnt)
        fs.release()
    image, got = steps_like_kernel(butter.path, workdir, run_script, want, [])
    assert len(got) == len(want)
    # what butter stored, the kernel reads: the same letters on every file
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "k")) as m:
        assert lsattr_all(m) == got[-1][1:], lsattr_all(m)
