#!/usr/bin/python3
"""A stand-in for the butter CLI that lets the kernel do the reading: a harness check.

    BUTTER_BIN=tests/integration/kernel_butter.py /usr/bin/python3 -m pytest tests/integration

implements the commands the integration tests call (extract, ls [-l], cat, info,
subvolume list) by attaching the images to loop devices, mounting them read-only
(degraded when members are missing, always the top-level subvolume, subvolid=5) and
using cp -a, os.listdir, open, `btrfs filesystem show`, `btrfs subvolume list`. If the
harness is right, the whole suite passes with it; a failure is a bug of the harness (or
of the kernel). It is not butter and never part of it. Needs root.
"""
import os
import stat
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from butter_it import env, kfs  # noqa: E402

USAGE = """usage: kernel_butter.py COMMAND [--device DEV]... IMAGE ...
  extract [--device DEV]... IMAGE [SRC] DEST
  ls [-l] [--device DEV]... IMAGE [PATH]
  cat [--device DEV]... IMAGE PATH
  info [--device DEV]... IMAGE
  subvolume list [--device DEV]... IMAGE
"""


def fail(msg, status=1):
    print(f"kernel_butter: {msg}", file=sys.stderr)
    sys.exit(status)


def parse(args):
    devices, flags, rest = [], set(), []
    i = 0
    while i < len(args):
        if args[i] == "--device":
            devices.append(args[i + 1])
            i += 2
        elif args[i] in ("-l", "--help"):
            flags.add(args[i])
            i += 1
        else:
            rest.append(args[i])
            i += 1
    return devices, flags, rest


class Mounted:
    """The images attached and mounted read-only at .mnt for the life of a `with`."""

    def __init__(self, image, devices):
        self.files = [image] + devices
        self.dir = tempfile.mkdtemp(prefix=f"{kfs.WORKDIR_PREFIX}{os.getpid()}-kbutter-",
                                    dir=env.TMPDIR)
        self.mnt = os.path.join(self.dir, "mnt")
        self.loops = []

    def __enter__(self):
        try:
            for f in self.files:
                if not os.path.isfile(f):
                    fail(f"{f}: no such image file")
                self.loops.append(kfs.loop_attach(f))
            kfs.run(["btrfs", "device", "scan"] + self.loops, check=False)
            opts = ["ro", "subvolid=5", "degraded"] + [f"device={d}" for d in self.loops[1:]]
            kfs.mount(self.loops[0], self.mnt, opts)
        except kfs.CommandError as e:
            self.__exit__()
            fail(f"{self.files[0]}: cannot read this filesystem: {str(e).splitlines()[-1]}")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        kfs.cleanup_all()
        kfs.remove_workdir(self.dir)


def inside(mnt, path):
    return os.path.join(mnt, path.lstrip("/")) if path not in ("", "/") else mnt


def main(argv):
    if argv[:2] == ["subvolume", "list"]:
        command, args = "subvolume list", argv[2:]
    elif argv:
        command, args = argv[0], argv[1:]
    else:
        fail(USAGE.strip(), 2)
    devices, flags, rest = parse(args)
    if "--help" in flags:
        print(USAGE)
        return 0
    if not rest:
        fail(f"{command}: no IMAGE given\n{USAGE}", 2)
    image, rest = rest[0], rest[1:]
    with Mounted(image, devices) as m:
        if command == "extract":
            src, dest = (rest[0], rest[1]) if len(rest) == 2 else ("/", rest[0])
            proc = kfs.run(["cp", "-a", "--sparse=always", inside(m.mnt, src), dest],
                           check=False, timeout=3000)
            sys.stderr.write(proc.stderr)
            return 1 if proc.returncode else 0
        if command == "ls":
            d = inside(m.mnt, rest[0] if rest else "/")
            for name in sorted(os.listdir(d)):
                st = os.lstat(os.path.join(d, name))
                if "-l" in flags:
                    line = f"{stat.filemode(st.st_mode)} {st.st_uid} {st.st_gid} {st.st_size} {name}"
                    if stat.S_ISLNK(st.st_mode):
                        line += " -> " + os.readlink(os.path.join(d, name))
                    print(line)
                else:
                    print(name)
            return 0
        if command == "cat":
            try:
                with open(inside(m.mnt, rest[0]), "rb") as f:
                    sys.stdout.buffer.write(f.read())
            except OSError as e:
                fail(f"{rest[0]}: {e.strerror}")
            return 0
        if command == "info":
            print(kfs.run(["btrfs", "filesystem", "show", m.mnt]).stdout)
            super_ = kfs.run(["btrfs", "inspect-internal", "dump-super", m.loops[0]]).stdout
            print("\n".join(l for l in super_.splitlines() if l.startswith("csum_type")))
            return 0
        if command == "subvolume list":
            print(kfs.run(["btrfs", "subvolume", "list", m.mnt]).stdout)
            return 0
    fail(f"unknown command {command!r}\n{USAGE}", 2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
