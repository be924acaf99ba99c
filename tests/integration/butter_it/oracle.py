"""The oracle: what btrfs-progs and the kernel say about a finished image.

Every test judges an image butter wrote (or changed) the same ways, through this module:

  btrfs_check(image, *devices)       `btrfs check --readonly` must find the filesystem
                                     clean; returns its output. strict=True also refuses
                                     error/warning lines and asks `butter check` to agree
                                     (butter_agrees=True: only the latter).
  run_btrfs_check(image, *devices)   the same run, for a test that expects a failure or
                                     reads the figures (returns the CompletedProcess)
  kernel_mount(image, *devices, mnt=...)
                                     a context manager: the kernel mounts the image
                                     (read-only unless opts say otherwise; noatime always),
                                     yields the mount point, unmounts and detaches after
  kernel_sees(expected, image, *devices, mnt=...)
                                     the kernel's mount shows exactly `expected` (a
                                     manifest.take() of butter's mount, of a source tree or
                                     of the kernel's own mount of a twin); returns what the
                                     kernel showed
  assert_tree(expected, got, what)   manifest.assert_same with `what` naming the reader

An image with several members is given as the first image plus the others (`devices`):
they are attached to loop devices and scanned, so btrfs check and the kernel find every
member; a single image file is checked as a file and mounted through one loop device.
The loop devices and mounts themselves are kfs's (kfs.attached, kfs.mount).
"""
import contextlib
import re

from . import env, kfs, manifest

CHECK_TIMEOUT = 600

# lines of btrfs check's output that strict=True refuses, and those it lets pass
_BAD_LINE = re.compile(r"\berror|\bERROR|\bwarning|\bWARNING|mismatch|corrupt|wanted")
_GOOD_LINE = re.compile(r"no error found"
                        # btrfs check scans every block device: other loop devices
                        # coming and going
                        r"|cannot scan /dev/\S+: ")


def run_btrfs_check(image, *devices, timeout=CHECK_TIMEOUT):
    """Run `btrfs check --readonly` on the filesystem; return the CompletedProcess."""
    images = [image, *devices]
    if len(images) == 1:
        return kfs.run(["btrfs", "check", "--readonly", image], check=False, timeout=timeout)
    # btrfs check finds the other members through the block devices it scans
    with kfs.attached(images) as loops:
        return kfs.run(["btrfs", "check", "--readonly", loops[0]], check=False, timeout=timeout)


def btrfs_check(image, *devices, strict=False, butter_agrees=None, timeout=CHECK_TIMEOUT):
    """Assert that `btrfs check --readonly` finds the filesystem clean (exit 0); return its
    output (stdout and stderr).

    strict: besides, no line of the output may report an error, a warning, a mismatch or
    corruption. butter_agrees (by default: strict): `butter check` must find it clean too
    (a second opinion on the reference counts of shared blocks and the block groups' used
    bytes).
    """
    images = [image, *devices]
    proc = run_btrfs_check(image, *devices, timeout=timeout)
    out = proc.stdout + proc.stderr
    what = f"btrfs check --readonly {' '.join(images)} (exit {proc.returncode})"
    assert proc.returncode == 0, f"{what}:\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
    if strict:
        bad = [line for line in out.splitlines()
               if _BAD_LINE.search(line) and not _GOOD_LINE.search(line)]
        assert not bad, f"{what} reports problems:\n" + out[-6000:]
    if butter_agrees is None:
        butter_agrees = strict
    if butter_agrees:
        argv = [env.butter_bin(), "check"]
        for extra in devices:
            argv += ["--device", extra]
        proc = kfs.run(argv + [image], check=False, timeout=timeout)
        assert proc.returncode == 0, (
            f"btrfs check finds {images} clean, butter check does not:\n"
            + (proc.stdout + proc.stderr)[-6000:])
    return out


@contextlib.contextmanager
def kernel_mount(image, *devices, mnt, opts=("ro",)):
    """Mount the filesystem with the kernel at `mnt` (noatime and `opts`: read-only unless
    they say otherwise); yield the mount point; always unmount and detach afterwards."""
    with kfs.attached([image, *devices]) as loops:
        kfs.mount(loops[0], mnt, list(opts) + [f"device={d}" for d in loops[1:]])
        try:
            yield mnt
        finally:
            kfs.umount(mnt)


def assert_tree(expected, got, what, **compare):
    """Assert that `got` (a manifest, or the root of a tree to take one of) is `expected`,
    a manifest; `what` names the reader in the message. `compare`: manifest.assert_same's
    exclude= and check_atime=."""
    if not isinstance(got, dict):
        got = manifest.take(got)
    try:
        manifest.assert_same(expected, got, **compare)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None
    return got


def kernel_sees(expected, image, *devices, mnt, opts=("ro",), what="the kernel's mount",
                **compare):
    """Mount the filesystem with the kernel (kernel_mount) and assert that it shows
    `expected`, a manifest (assert_tree); return the manifest of the kernel's view."""
    with kernel_mount(image, *devices, mnt=mnt, opts=opts) as root:
        return assert_tree(expected, root, what, **compare)
