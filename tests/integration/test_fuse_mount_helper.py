"""`mount -t fuse.butter` and fstab lines: butter as a mount(8) helper.

The build is installed (`meson install --destdir`) into a temporary tree; each test then
runs in a private mount namespace (unshare -m) where that tree is bind-mounted on
/usr/local, as a `--prefix=/usr/local` install would be, so mount(8) and mount.fuse3
find the installed programs exactly where they look (mount(8) clears PATH for its
helpers: only the shell's default PATH and /sbin count):

  fuse3     mount -t fuse.butter IMAGE MNT -o ...: no /sbin/mount.fuse.butter, so
            mount(8) runs mount.fuse3, which runs `butter IMAGE MNT -o ...`
  fstab     `butter#IMAGE MNT fuse OPTIONS` and `IMAGE MNT fuse.butter OPTIONS` lines
            (mount -T FSTAB MNT), with options only mount(8)/systemd know
  helper    /sbin/mount.fuse.butter (a link to the installed helper, put into /sbin by
            an overlay inside the namespace): mount(8) runs it directly
  direct    the helper's own flags: -f (fake), -v, bad arguments

Every mount writes a file, is unmounted with umount(8), and its daemon must exit; the
image is then judged by `btrfs check` and the kernel. Needs root, unshare, overlayfs,
mount.fuse3 (fuse3), /dev/fuse and the build directory of BUTTER_BIN (for meson
install; without it the installed layout is made by hand from BUTTER_BIN).
"""
import os
import shutil
import signal
import subprocess
import time

import pytest

from butter_it import env, kfs, oracle
from butter_it.fusemount import require_fuse
from butter_it.tree import read_file

PREFIX = "/usr/local"


@pytest.fixture
def fuse(kernel):
    require_fuse()
    for tool in ("unshare", "mount.fuse3"):
        if not shutil.which(tool) and not os.path.exists(f"/sbin/{tool}"):
            env.unavailable(f"needs {tool}")


@pytest.fixture
def installed(butter, workdir):
    """A tree with butter installed under PREFIX, as `meson install` lays it out."""
    dest = os.path.join(workdir, "destdir")
    build = env.build_dir_of(butter.path)
    if build and shutil.which("meson"):
        kfs.run(["meson", "install", "-C", build, "--destdir", dest, "--no-rebuild",
                 "--quiet"], timeout=300)
    else:                                  # an installed or copied binary: same layout
        os.makedirs(dest + PREFIX + "/bin")
        os.makedirs(dest + PREFIX + "/sbin")
        shutil.copy2(butter.path, dest + PREFIX + "/bin/butter")
        os.symlink("../bin/butter", dest + PREFIX + "/sbin/mount.fuse.butter")
    root = dest + PREFIX
    assert os.access(root + "/bin/butter", os.X_OK), os.listdir(root)
    link = root + "/sbin/mount.fuse.butter"
    assert os.path.islink(link) and os.path.realpath(link) == os.path.realpath(
        root + "/bin/butter"), "meson install made no mount.fuse.butter link to butter"
    return root


def daemons_of(image):
    """PIDs of processes with `image` on their command line (the daemons)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if os.fsencode(image) in f.read().split(b"\0"):
                        pids.append(int(name))
            except OSError:
                pass
    return pids


def in_namespace(installed, workdir, script, sbin_helper=False, timeout=300):
    """Run the shell `script` in a private mount namespace with `installed` on PREFIX
    (and /sbin/mount.fuse.butter if asked). Returns the CompletedProcess."""
    setup = [f"mount --bind {installed} {PREFIX}"]
    if sbin_helper:
        layer = os.path.join(workdir, "sbin-layer")
        os.makedirs(layer, exist_ok=True)
        link = os.path.join(layer, "mount.fuse.butter")
        if not os.path.lexists(link):
            os.symlink(PREFIX + "/sbin/mount.fuse.butter", link)
        sbin = os.path.realpath("/sbin")
        setup.append(f"mount -t overlay overlay -o lowerdir={layer}:{sbin} {sbin}")
    text = "set -e\n" + "\n".join(setup) + "\n" + script
    path = os.path.join(workdir, "ns.sh")
    with open(path, "w") as f:
        f.write(text)
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", path],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def run_mounts(installed, workdir, image, mounts, sbin_helper=False):
    """For each (mount command, file name): mount, check the type, write the file,
    umount, wait for the daemon to exit. Returns the namespace's output."""
    mnt = os.path.join(workdir, "mnt")
    os.makedirs(mnt, exist_ok=True)
    lines = []
    for cmd, name in mounts:
        lines += [
            cmd,
            f"grep -q ' {mnt} fuse.butter ' /proc/self/mounts || "
            f"{{ echo 'not mounted: {cmd}'; exit 1; }}",
            f"grep ' {mnt} ' /proc/self/mounts",
            f"echo \"daemon: $(pgrep -af '{image}')\"",
            f"echo {name} > {mnt}/{name}",
            f"umount {mnt}",
            # the daemon commits after the unmount: wait for it
            f"for i in $(seq 600); do pgrep -f '{image}' >/dev/null || break; sleep 0.1; done",
            f"! pgrep -f '{image}' >/dev/null || {{ echo 'daemon still running'; exit 1; }}",
        ]
    try:
        proc = in_namespace(installed, workdir, "\n".join(lines), sbin_helper)
    finally:
        for pid in daemons_of(image):     # a failed script leaves its daemon: stop it
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while daemons_of(image) and time.monotonic() < deadline:
            time.sleep(0.1)
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, f"namespace script failed ({proc.returncode}):\n{out}"
    return out


def judge(workdir, image, names):
    oracle.btrfs_check(image)
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kview")) as kmnt:
        assert sorted(os.listdir(kmnt)) == sorted(names)
        for name in names:
            assert read_file(os.path.join(kmnt, name)) == (name + "\n").encode()


def test_mount_t_fuse_butter_through_mount_fuse3(fuse, installed, workdir):
    image = kfs.mkfs_image(workdir)
    mnt = os.path.join(workdir, "mnt")
    out = run_mounts(installed, workdir, image, [
        (f"mount -t fuse.butter {image} {mnt} -o noatime,commit=5,nofail,x-systemd.foo",
         "typed"),
    ])
    assert "noatime" in out, out              # the option reached the kernel
    assert f" butter {image} {mnt} -o " in out and "mount.fuse.butter" not in out, out
    judge(workdir, image, ["typed"])


def test_fstab_lines(fuse, installed, workdir):
    image = kfs.mkfs_image(workdir)
    mnt = os.path.join(workdir, "mnt")
    fstab_old = os.path.join(workdir, "fstab-old")
    fstab_new = os.path.join(workdir, "fstab-new")
    with open(fstab_old, "w") as f:
        f.write(f"# the older form, type fuse\n"
                f"butter#{image} {mnt} fuse noauto,nofail,_netdev,x-systemd.automount,"
                f"noatime 0 0\n")
    with open(fstab_new, "w") as f:
        f.write(f"{image} {mnt} fuse.butter defaults,noauto,commit=10 0 0\n")
    run_mounts(installed, workdir, image, [
        (f"mount -T {fstab_old} {mnt}", "from-old-fstab"),
        (f"mount -T {fstab_new} {mnt}", "from-new-fstab"),
    ])
    judge(workdir, image, ["from-old-fstab", "from-new-fstab"])


def test_sbin_helper_run_by_mount(fuse, installed, workdir):
    """/sbin/mount.fuse.butter present: mount(8) runs it, by -t and by an fstab line."""
    image = kfs.mkfs_image(workdir)
    mnt = os.path.join(workdir, "mnt")
    fstab = os.path.join(workdir, "fstab")
    with open(fstab, "w") as f:
        f.write(f"{image} {mnt} fuse.butter noatime,noauto,x-mount.foo 0 0\n")
    out = run_mounts(installed, workdir, image, [
        (f"mount -t fuse.butter {image} {mnt} -o noatime,nofail", "by-sbin-helper"),
        (f"mount -T {fstab} {mnt}", "by-sbin-helper-fstab"),
    ], sbin_helper=True)
    assert "noatime" in out, out
    assert out.count(f"/sbin/mount.fuse.butter {image} {mnt}") == 2, out
    judge(workdir, image, ["by-sbin-helper", "by-sbin-helper-fstab"])


def test_helper_flags(fuse, installed, workdir):
    image = kfs.mkfs_image(workdir)
    mnt = os.path.join(workdir, "mnt")
    os.makedirs(mnt)
    helper = installed + "/sbin/mount.fuse.butter"
    before = read_file(image)
    proc = kfs.run([helper, image, mnt, "-f", "-v", "-o", "rw,noauto,_netdev,commit=9",
                    "-t", "fuse.butter"], check=False)
    assert proc.returncode == 0, proc.stderr
    assert f"butter mount -o dev,suid,rw,commit=9 {image} {mnt}" in proc.stderr, proc.stderr
    assert not any(m == os.path.realpath(mnt) for m, _ in kfs.mount_table())
    assert read_file(image) == before, "a fake mount (-f) wrote the image"
    for args, message in [([image], "usage"), ([image, mnt, "-N", "ns"], "not supported"),
                          ([image, mnt, "-o"], "needs a value"), ([image, mnt, "-q"],
                                                                   "unknown option")]:
        proc = kfs.run([helper] + args, check=False)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
    # an unknown first word that is no file stays an unknown command
    proc = kfs.run([installed + "/bin/butter", "no-such-command", mnt], check=False)
    assert proc.returncode != 0 and "unknown command" in proc.stderr


def test_remount_ro_rw_through_mount(fuse, installed, workdir):
    """`mount -o remount,ro MNT` and back to rw, as mount(8) runs it (through mount.fuse3
    and `butter SOURCE MNT -o remount,...`): the kernel's flag and the daemon follow."""
    image = kfs.mkfs_image(workdir)
    mnt = os.path.join(workdir, "mnt")
    os.makedirs(mnt, exist_ok=True)
    script = "\n".join([
        f"mount -t fuse.butter {image} {mnt}",
        f"echo before > {mnt}/before",
        f"mount -o remount,ro {mnt}",
        f"grep ' {mnt} fuse.butter ro,' /proc/self/mounts || {{ echo 'not ro'; exit 1; }}",
        f"! echo no > {mnt}/refused 2>/dev/null || {{ echo 'wrote while ro'; exit 1; }}",
        f"mount -o remount,rw {mnt}",
        f"grep ' {mnt} fuse.butter rw,' /proc/self/mounts || {{ echo 'not rw'; exit 1; }}",
        f"echo after > {mnt}/after",
        f"umount {mnt}",
        f"for i in $(seq 600); do pgrep -f '{image}' >/dev/null || break; sleep 0.1; done",
    ])
    try:
        proc = in_namespace(installed, workdir, script)
    finally:
        for pid in daemons_of(image):
            os.kill(pid, signal.SIGTERM)
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, f"namespace script failed ({proc.returncode}):\n{out}"
    judge(workdir, image, ["before", "after"])
