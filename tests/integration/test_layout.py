"""`butter layout --trace`: the files a trace reads, placed one after another in its order.

An image aged by the kernel (files grown together, so each is scattered among the
others), a read-only snapshot sharing them, and a trace reading some of them in a
shuffled order. After `butter layout`, judged by the kernel:

- btrfs check --readonly is clean (strict) and the kernel shows the same tree;
- sharing is kept (`btrfs filesystem du` per subvolume unchanged), the snapshot's files
  lie where the live ones do;
- reading the trace's ranges in order, the kernel's FIEMAP shows one physical run (≤ 1
  per 100 files is the issue's goal): each file starts where the previous one ended;
- a second layout of the same trace moves nothing.
Both trace forms are read: a recorded trace (subvolume, inode, ranges, escaped names) and
a plain list of paths; and the same through a live mount.
"""
import os
import random

from butter_it import kfs, manifest, oracle
from butter_it.fusemount import FuseMount

NFILES = 240
TRACED = 120


def age(mnt, seed=1):
    rng = random.Random(seed)
    d = os.path.join(mnt, "usr", "lib")
    os.makedirs(d)
    names = [f"lib{i}.so" for i in range(NFILES - 1)] + ["odd\tname\nwith\\escapes"]
    fds = [os.open(os.path.join(d, n), os.O_CREAT | os.O_WRONLY, 0o644) for n in names]
    for _ in range(3):  # every file grows a little in each round: scattered
        for fd in fds:
            os.write(fd, rng.randbytes(rng.choice([4096, 12288, 30000, 65536])))
        os.sync()
    for fd in fds:
        os.close(fd)
    order = list(range(NFILES))
    rng.shuffle(order)
    return [os.path.join("/usr/lib", names[i]) for i in order[:TRACED]]


def escape(path):
    out = []
    for ch in path.encode():
        if ch == 0x5C:
            out.append("\\\\")
        elif ch == 0x0A:
            out.append("\\n")
        elif ch == 0x09:
            out.append("\\t")
        elif ch < 0x20 or ch == 0x7F:
            out.append("\\%03o" % ch)
        else:
            out.append(chr(ch))
    return "".join(out)


def write_recorded(path, mnt, traced):
    """A trace as the recorder writes it: a line per read, two reads per file."""
    with open(path, "w") as f:
        f.write("# butter-trace 1\n# comment lines are skipped\n")
        for p in traced:
            st = os.stat(mnt + p)
            half = st.st_size // 2
            f.write(f"5\t{st.st_ino}\t0\t{half}\t{escape(p)}\n")
        for p in traced:  # the second halves, read later: ranges merge per file
            st = os.stat(mnt + p)
            half = st.st_size // 2
            f.write(f"5\t{st.st_ino}\t{half}\t{st.st_size - half}\t{escape(p)}\n")


def trace_runs(root, traced):
    """Physical runs met reading the traced files in order (the kernel's FIEMAP)."""
    runs, prev_end = 0, None
    for p in traced:
        for _, phys, length, _ in kfs.fiemap(root + p):
            if phys != prev_end:
                runs += 1
            prev_end = phys + length
    return runs


def du(root):
    out = kfs.run(["btrfs", "filesystem", "du", "-s", "--raw", root,
                   os.path.join(root, "snap")]).stdout
    return [tuple(line.split()[:3]) for line in out.splitlines()[1:]]


def make_aged(workdir):
    with kfs.kernel_fs(workdir, size=1 << 30) as fs:
        traced = age(fs.mnt)
        write_recorded(os.path.join(workdir, "recorded.trace"), fs.mnt, traced)
        kfs.run(["btrfs", "subvolume", "snapshot", "-r", fs.mnt, os.path.join(fs.mnt, "snap")])
        fs.release()
        return fs.images[0], traced


def check_laid_out(img, workdir, before, traced):
    oracle.btrfs_check(img, strict=True)
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "look")) as root:
        oracle.assert_tree(before[0], manifest.take(root), "the kernel's mount after layout")
        assert du(root) == before[1], (before[1], du(root))
        runs = trace_runs(root, traced)
        assert runs <= max(1, len(traced) // 100), f"{runs} runs over {len(traced)} files"
        for p in traced[:10]:
            assert kfs.fiemap(root + p) == kfs.fiemap(os.path.join(root, "snap") + p), p


def observe(img, workdir, traced):
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "look")) as root:
        runs = trace_runs(root, traced)
        return manifest.take(root), du(root), runs


def test_layout_a_recorded_trace_and_a_list(kernel, butter, workdir):
    img, traced = make_aged(workdir)
    before = observe(img, workdir, traced)
    assert before[2] > len(traced), f"not scattered: {before[2]} runs"
    r = kfs.run([butter.path, "layout", "--trace", os.path.join(workdir, "recorded.trace"), img])
    assert f"{TRACED} files traced, 0 gone" in r.stdout, r.stdout
    assert "runs:" in r.stdout and "-> 1\n" in r.stdout, r.stdout
    check_laid_out(img, workdir, before, traced)
    r = kfs.run([butter.path, "layout", "--trace", os.path.join(workdir, "recorded.trace"), img])
    assert "0 extents moved" in r.stdout, r.stdout
    # a plain list in another order, with a path that is gone: laid out anew in its order
    rng = random.Random(7)
    other = traced[:]
    rng.shuffle(other)
    lst = os.path.join(workdir, "list")
    with open(lst, "w") as f:
        f.write("".join(p + "\n" for p in other if "\n" not in p and "\t" not in p))
        f.write("/usr/lib/not-there\n")
    other = [p for p in other if "\n" not in p and "\t" not in p]
    r = kfs.run([butter.path, "layout", "--trace", lst, img])
    assert f"{len(other)} files traced, 1 gone" in r.stdout, r.stdout
    check_laid_out(img, workdir, before, other)


def test_bad_traces_are_refused(kernel, butter, workdir):
    img = os.path.join(workdir, "img")
    kfs.run(["truncate", "-s", "256M", img])
    kfs.run([butter.path, "mkfs", "-q", img])
    cases = {
        "# butter-trace 1\n5\t256\tx\t0\t/a\n": ":2: not a trace line",
        "# butter-trace 1\n5\t257\t0\t0\n": ":2: not a trace line",
        "# butter-trace 1\n5\t257\t0\t10\t/bad\\q\n": ":2: not a trace line",
        "a\tb\n": "a tab in a list of paths",
        "": "names no file",
        "x\0y\n": "NUL bytes",
    }
    for i, (text, want) in enumerate(cases.items()):
        path = os.path.join(workdir, f"t{i}")
        with open(path, "w") as f:
            f.write(text)
        r = kfs.run([butter.path, "layout", "--trace", path, img], check=False)
        assert r.returncode == 1 and want in r.stderr, (text, r.stderr)
    r = kfs.run([butter.path, "layout", img], check=False)
    assert r.returncode == 2 and "--trace" in r.stderr, r.stderr
    # mutated traces: an error or a layout, never a crash (the ASan build reports any)
    rng = random.Random(11)
    seed = b"# butter-trace 1\n5\t256\t0\t4096\t/\n5\t257\t0\t0\t/a\\tb\\101\n"
    for i in range(60):
        b = bytearray(seed)
        for _ in range(rng.randint(1, 6)):
            b[rng.randrange(len(b))] = rng.choice(b"\t\n\\0123456789/#x\x00\xff")
        path = os.path.join(workdir, "m%d" % i)
        with open(path, "wb") as f:
            f.write(bytes(b))
        r = kfs.run([butter.path, "layout", "--trace", path, img], check=False)
        assert r.returncode in (0, 1), (bytes(b), r.returncode, r.stderr)
        assert "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr
    oracle.btrfs_check(img, strict=True)


def test_layout_on_a_live_mount(fuse, butter, workdir):
    img, traced = make_aged(workdir)
    before = observe(img, workdir, traced)
    mnt = os.path.join(workdir, "m")
    with FuseMount(butter.path, [img], mnt, options=["noatime"]) as fm:  # reads below
        want = {p: kfs.file_sha256(mnt + p) for p in traced[:20]}
        r = kfs.run([butter.path, "layout", "--trace",
                     os.path.join(workdir, "recorded.trace"), mnt], check=False)
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
        assert "-> 1\n" in r.stdout, r.stdout
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        for p, h in want.items():
            assert kfs.file_sha256(mnt + p) == h, p
        fm.unmount()
    check_laid_out(img, workdir, before, traced)
