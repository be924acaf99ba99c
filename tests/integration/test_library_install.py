"""libbutter as another program uses it: `meson install` into a temporary tree, then
examples/list-and-read.c built against that tree through pkg-config alone and run on an
image that mkfs.btrfs made (the independent writer), its output compared with the tree
the image was made from.

Also what the installed tree must hold: libbutter.so with the soname libbutter.so.0,
exporting every function the installed headers declare and nothing but butter_*
symbols; butter.pc; the headers without the tests' testing.h; the binary, whose
--version (and `butter version`) is the project's; the man pages (help2man), which render and whose help keeps the test-only
options (--record, --fault) to `butter help testing`; the bash completion, which completes
commands, subcommands and options from the installed binary.

Needs meson, pkg-config, a C compiler and the build directory of BUTTER_BIN. A build
with sanitizers installs an instrumented library: the example is then built with the
same -fsanitize flags (a sanitizer runtime must come first in a program).
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from butter_it import env, kfs, oracle

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def introspect(build, what):
    r = kfs.run(["meson", "introspect", build, what], timeout=120)
    return json.loads(r.stdout)


@pytest.fixture
def installed(butter, workdir):
    """(build dir, root of the install under --destdir, its options by name)."""
    for tool in ("meson", "pkg-config", "cc", "nm", "readelf"):
        if not shutil.which(tool):
            env.unavailable(f"needs {tool}")
    build = env.build_dir_of(butter.path)
    if not build:
        env.unavailable(f"{butter.path} is not in a meson build directory")
    opts = {o["name"]: o["value"] for o in introspect(build, "--buildoptions")}
    dest = os.path.join(workdir, "destdir")
    kfs.run(["meson", "install", "-C", build, "--destdir", dest, "--no-rebuild", "--quiet"],
            timeout=300)
    return build, dest + opts["prefix"], opts


def exported(lib):
    r = kfs.run(["nm", "-D", "--defined-only", lib])
    return {line.split()[-1].split("@")[0] for line in r.stdout.splitlines()
            if len(line.split()) >= 3 and line.split()[1] in "TtWiDdBbRr"}


def declared(headers):
    """Function names declared in the headers: `butter_x(` at a declaration's name."""
    names = set()
    for h in headers:
        with open(h) as f:
            text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
        names |= set(re.findall(r"^[a-z_][a-z0-9_ \*]*?\**\b(butter_[a-z0-9_]+)\(", text, re.M))
    return names


def test_installed_tree(installed, butter):
    build, root, opts = installed
    libdir = os.path.join(root, opts["libdir"])
    lib = os.path.join(libdir, "libbutter.so")
    assert os.path.islink(lib) and os.path.exists(lib), os.listdir(libdir)
    r = kfs.run(["readelf", "-d", lib])
    assert "Library soname: [libbutter.so.0]" in r.stdout, r.stdout
    assert os.path.exists(os.path.join(libdir, "libbutter.so.0"))

    incdir = os.path.join(root, opts["includedir"], "butter")
    headers = sorted(os.listdir(incdir))
    assert headers == ["butter.h", "control.h", "version.h"], headers
    syms = exported(lib)
    assert syms and all(s.startswith("butter_") for s in syms), \
        sorted(s for s in syms if not s.startswith("butter_"))[:20]
    want = declared([os.path.join(incdir, h) for h in headers])
    assert len(want) > 50, want
    assert want <= syms, sorted(want - syms)
    assert "butter_open_testing" not in syms        # the tests' entry, not installed

    pc = os.path.join(libdir, "pkgconfig", "butter.pc")
    assert os.path.isfile(pc), os.listdir(libdir)
    version = introspect(build, "--projectinfo")["version"]
    exe = os.path.join(root, opts["bindir"], "butter")
    for how in ("--version", "version"):
        r = kfs.run([exe, how])
        assert r.stdout.strip() == f"butter {version}", r.stdout
    # the test-only global options are out of the user's help, in `help testing`
    r = kfs.run([exe, "--help"])
    assert "version" in r.stdout and "--record" not in r.stdout and "--fault" not in r.stdout
    r = kfs.run([exe, "help", "testing"])
    assert "--record LOG" in r.stdout and "--fault SPEC" in r.stdout, r.stdout

    # bash completion, installed where bash-completion looks, completing from the binary
    comp = os.path.join(root, opts["datadir"], "bash-completion", "completions", "butter")
    assert os.path.isfile(comp), os.listdir(os.path.dirname(comp))
    for words, want in ((["butter", "subv"], "subvolume"),
                        (["butter", "subvolume", "sh"], "show"),
                        (["butter", "property", ""], "get list set"),
                        (["butter", "subvolume", "show", "--ro"], "--rootid")):
        script = (f"PATH={os.path.dirname(exe)}:$PATH; source {comp}; "
                  f"COMP_WORDS=({' '.join(repr(w) for w in words)}); "
                  f"COMP_CWORD={len(words) - 1}; _butter; echo \"${{COMPREPLY[*]}}\"")
        r = kfs.run(["bash", "-c", script])
        assert " ".join(sorted(r.stdout.split())) == want, (words, r.stdout, r.stderr)


def test_man_pages(installed, butter):
    """The man pages meson installs (help2man, from the commands' own help; go-md2man for
    libbutter(3)) render with man(1) and say what each group's subcommands are."""
    if not shutil.which("help2man") or not shutil.which("man"):
        env.unavailable("needs help2man and man (scripts/install-deps.sh installs them)")
    build, root, opts = installed
    mandir = os.path.join(root, opts["mandir"], "man8")
    pages = sorted(os.listdir(mandir))
    want = ["butter-balance.8", "butter-device.8", "butter-filesystem.8", "butter-property.8",
            "butter-replace.8", "butter-subvolume.8", "butter.8", "mount.fuse.butter.8"]
    assert [p for p in want if p not in pages] == [], pages
    def render(page):
        r = subprocess.run(["man", "--warnings", "-l", os.path.join(mandir, page)],
                           env=dict(os.environ, MANWIDTH="100"), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0 and r.stderr.strip() == "", (page, r.stderr[-2000:])
        text = re.sub(r".\x08", "", r.stdout)  # nroff's overstrike (bold, underline)
        return re.sub(r"\s+", " ", text)  # justified lines have doubled spaces, wrap anywhere

    for page in want:
        text = render(page)
        assert "NAME" in text and page[:-2] in text, (page, text[:500])
    text = render("butter-subvolume.8")
    for sub in ("list", "show", "get-default", "set-default", "create", "snapshot", "delete",
                "find-new"):
        assert f"butter subvolume {sub}" in text, sub
    # libbutter(3), from docs/libbutter.3.md by go-md2man
    if not shutil.which("go-md2man"):
        env.unavailable("needs go-md2man for libbutter(3) (scripts/install-deps.sh installs it)")
    text = render(os.path.join("..", "man3", "libbutter.3"))
    for words in ("LIBBUTTER(3)", "#include <butter/butter.h>", "butter_open()", "RETURN VALUE",
                  "pkg-config --cflags --libs butter"):
        assert words in text, (words, text[:800])


def test_example_program_against_installed_library(installed, workdir):
    build, root, opts = installed
    libdir = os.path.join(root, opts["libdir"])
    # the image: a tree written by mkfs.btrfs, the independent writer
    src = os.path.join(workdir, "src")
    os.makedirs(os.path.join(src, "docs", "sub"))
    payload = os.urandom(300 << 10) + b"the end\n"
    with open(os.path.join(src, "docs", "big.bin"), "wb") as f:
        f.write(payload)
    with open(os.path.join(src, "docs", "note.txt"), "w") as f:
        f.write("hello\n")
    os.symlink("note.txt", os.path.join(src, "docs", "link"))
    img = os.path.join(workdir, "fs.img")
    with open(img, "wb") as f:
        f.truncate(256 << 20)
    kfs.run(["mkfs.btrfs", "-q", "-f", "--rootdir", src, img], timeout=300)

    # built from pkg-config's answer alone, as a packager's program would be
    env_pc = dict(os.environ, PKG_CONFIG_PATH=os.path.join(libdir, "pkgconfig"))
    r = subprocess.run(["pkg-config", f"--define-variable=prefix={root}", "--cflags", "--libs",
                        "butter"], env=env_pc, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    flags = r.stdout.split()
    assert f"-I{os.path.join(root, opts['includedir'])}" in flags, flags
    assert f"-L{libdir}" in flags and "-lbutter" in flags, flags
    sanitize = opts.get("b_sanitize", "none")
    if isinstance(sanitize, list):
        sanitize = ",".join(sanitize)
    san = [f"-fsanitize={sanitize}"] if sanitize not in ("", "none") else []
    exe = os.path.join(workdir, "list-and-read")
    kfs.run(["cc", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror"] + san +
            [os.path.join(REPO, "examples", "list-and-read.c"), "-o", exe] + flags, timeout=300)
    r = kfs.run(["readelf", "-d", exe])
    assert "Shared library: [libbutter.so.0]" in r.stdout, r.stdout  # the shared one, not .a

    run_env = dict(os.environ, LD_LIBRARY_PATH=libdir)
    r = subprocess.run([exe, img, "/docs", "/docs/big.bin"], env=run_env, capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    entries, rest = [], r.stdout
    while rest.startswith(b"entry "):
        line, rest = rest.split(b"\n", 1)
        entries.append(line.decode())
    assert sorted(entries) == ["entry big.bin file", "entry link link", "entry note.txt file",
                               "entry sub dir"], entries
    assert rest == payload

    # a missing file: an error naming it, exit 1, nothing on standard output past the listing
    r = subprocess.run([exe, img, "/docs", "/docs/none"], env=run_env, capture_output=True,
                       timeout=300)
    assert r.returncode == 1 and b"/docs/none" in r.stderr and b"No such file" in r.stderr, r


def test_python_bindings_against_installed_library(installed, workdir):
    """The installed Python module (python/butter, ctypes) opens an image mkfs.btrfs wrote,
    lists, stats and reads it, and writes new files that btrfs check and the kernel accept."""
    build, root, opts = installed
    libdir = os.path.join(root, opts["libdir"])
    found = [d for d, _, files in os.walk(root)
             if os.path.basename(d) == "butter" and "__init__.py" in files]
    assert found, f"no installed python package butter under {root}"
    src = os.path.join(workdir, "src")
    os.makedirs(os.path.join(src, "docs"))
    payload = os.urandom(200 << 10)
    with open(os.path.join(src, "docs", "big.bin"), "wb") as f:
        f.write(payload)
    os.symlink("big.bin", os.path.join(src, "docs", "link"))
    img = os.path.join(workdir, "fs.img")
    with open(img, "wb") as f:
        f.truncate(256 << 20)
    kfs.run(["mkfs.btrfs", "-q", "-f", "--rootdir", src, img], timeout=300)
    script = f"""
import butter, stat, sys
with butter.Filesystem({img!r}) as fs:
    assert sorted(fs.listdir("/docs")) == [("big.bin", "file"), ("link", "link")], fs.listdir("/docs")
    st = fs.stat("/docs/big.bin")
    assert st.size == {len(payload)} and stat.S_ISREG(st.mode) and st.subvol == 5, st
    assert fs.read("/docs/big.bin") == open({os.path.join(src, "docs", "big.bin")!r}, "rb").read()
    assert fs.read("/docs/big.bin", 1000, 10) == fs.read("/docs/big.bin")[1000:1010]
    assert fs.readlink("/docs/link") == "big.bin"
    assert fs.info().nodesize in (4096, 16384) and fs.info().num_devices == 1
    try:
        fs.stat("/docs/none")
        raise SystemExit("no error for a missing file")
    except FileNotFoundError:
        pass
    try:
        fs.mkdir("/ro")
        raise SystemExit("a read-only handle took a change")
    except OSError as e:
        assert e.errno == 30, e
with butter.Filesystem({img!r}, writable=True) as fs:
    fs.mkdir("/made")
    fs.write_file("/made/by-python", b"written from python\\n" * 5000)
print(butter.version())
"""
    env_run = dict(os.environ, LD_LIBRARY_PATH=libdir, PYTHONPATH=os.path.dirname(found[0]))
    sanitize = opts.get("b_sanitize", "none")
    if isinstance(sanitize, list):
        sanitize = ",".join(sanitize)
    if sanitize not in ("", "none"):
        # python itself is not built with the sanitizers: their runtimes must come first
        runtimes = [kfs.run(["cc", f"-print-file-name=lib{n}.so"]).stdout.strip()
                    for n in ("asan", "ubsan") if n in sanitize.replace("address", "asan")
                    .replace("undefined", "ubsan")]
        env_run.update(LD_PRELOAD=":".join(runtimes), ASAN_OPTIONS="detect_leaks=0")
    r = subprocess.run([sys.executable, "-c", script], env=env_run, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    kfs.run(["btrfs", "check", "--readonly", img], timeout=300)
    with oracle.kernel_mount(img, mnt=os.path.join(workdir, "k")) as m:
        with open(os.path.join(m, "made", "by-python"), "rb") as f:
            assert f.read() == b"written from python\n" * 5000
        with open(os.path.join(m, "docs", "big.bin"), "rb") as f:
            assert f.read() == payload
