"""POSIX ACLs through `butter mount -o default_permissions`, against kernel btrfs.

The same script of setfacl, chmod, file and directory creation (inheriting default ACLs,
or taking the umask where there are none) and access checks as an unprivileged user runs
on a kernel btrfs mount and on a butter mount. Every getfacl listing, every mode and every
access verdict must be the same (also the setgid bit an access ACL set by a non-member
clears); then btrfs check must be clean and the kernel must show
butter's ACLs.
"""
import os
import subprocess

from butter_it import kfs, oracle
from butter_it.fusemount import steps_like_kernel


def sh(cmd, cwd):
    p = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


SCRIPT = [
    "mkdir d",
    "setfacl -d -m u:nobody:rwx,g::r-x,o::--- d",
    "setfacl -m u:nobody:r-x d",
    "touch d/f && mkdir d/sub && mkfifo d/fifo && (umask 077; touch d/masked)",
    "mkdir d/sub/deeper && touch d/sub/deeper/g",
    "(umask 027; touch plain && mkdir plaindir)",
    "echo secret > own && chmod 600 own && setfacl -m u:nobody:r own",
    "runuser -u nobody -- cat own",
    "chmod 640 own",
    "runuser -u nobody -- cat own",
    "setfacl -m u:nobody:rw,m::r own",
    "runuser -u nobody -- sh -c 'echo x >> own'",
    "setfacl -b own",
    "runuser -u nobody -- cat own",
    "setfacl -m g::rwx,o::r own",
    "runuser -u nobody -- ls d",
    "runuser -u nobody -- touch d/by-nobody",
    "runuser -u nobody -- touch d/sub/by-nobody",
    "setfacl -k d/sub",
    "touch d/sub/after-k",
    # an access ACL set by an owner outside the file's group, without CAP_FSETID, clears
    # S_ISGID (an extended ACL, and one equal to the mode); a member keeps it
    "touch sg sgmin sgmember && chown nobody:4321 sg sgmin && chown nobody:nogroup sgmember",
    "chmod 2775 sg sgmin sgmember",
    "runuser -u nobody -- setfacl -m u:nobody:rw sg",
    "runuser -u nobody -- setfacl -m u::rwx,g::r-x,o::r-x sgmin",
    "runuser -u nobody -- setfacl -m u:nobody:rw sgmember",
]
LISTINGS = ["d", "d/f", "d/sub", "d/fifo", "d/masked", "d/sub/deeper", "d/sub/deeper/g",
            "plain", "plaindir", "own", "d/sub/after-k", "sg", "sgmin", "sgmember"]


def run_script(root):
    out = []
    for step in SCRIPT:
        rc, so, se = sh(step, root)
        out.append((step, rc, so))
    for p in LISTINGS:
        rc, so, se = sh(f"getfacl -n -p {p} && stat -c '%A %a' {p}", root)
        out.append((p, rc, so))
    return out


def test_acls_like_kernel_btrfs(fuse, butter, workdir):
    with kfs.kernel_fs(workdir, name="kernel") as fs:
        os.chmod(fs.mnt, 0o755)
        want = run_script(fs.mnt)
        fs.release()
    image, _ = steps_like_kernel(butter.path, workdir, run_script, want,
                                 ["default_permissions", "allow_other"],
                                 prepare=lambda mnt: os.chmod(mnt, 0o755))
    with oracle.kernel_mount(image, mnt=os.path.join(workdir, "kview")) as mnt:
        for p in LISTINGS:
            rc, so, _ = sh(f"getfacl -n -p {p} && stat -c '%A %a' {p}", mnt)
            assert (p, rc, so) in want, f"{p}: the kernel reads butter's image as {so!r}"
