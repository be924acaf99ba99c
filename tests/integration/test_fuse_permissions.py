"""Permissions through `butter mount -o allow_other` (no other option), against kernel btrfs.

The mount checks mode bits and POSIX ACLs by default, as the kernel's btrfs does; allow_other
lets other users in but does not turn the checks off. The same script (setup as root, then
operation by operation as user nobody: read, write, create and unlink in a root-owned 0755
directory, a 0600 file, files whose ACL grants or denies nobody, the execute bit, chmod and
chown by a non-owner) runs on a kernel btrfs mount and on a butter mount; every exit status
and output must be the same. `-o no_permission_checks` turns the checks off (and so differs).
"""
import os
import subprocess

from butter_it import kfs
from butter_it.fusemount import FuseMount, steps_like_kernel

SETUP = [
    "mkdir d && chmod 755 d",
    "echo secret > d/secret && chmod 600 d/secret",
    "echo shared > d/granted && chmod 600 d/granted && setfacl -m u:nobody:rw d/granted",
    "echo hidden > d/denied && chmod 644 d/denied && setfacl -m u:nobody:--- d/denied",
    "printf '#!/bin/sh\\necho ran\\n' > d/tool && chmod 744 d/tool",
    "cp d/tool d/runnable && chmod 755 d/runnable",
    "mkdir open && chmod 777 open",
    "mkdir sticky && chmod 1777 sticky && echo mine > sticky/roots && chmod 666 sticky/roots",
    "mkdir aclgrant && chmod 700 aclgrant && setfacl -m u:nobody:rwx aclgrant",
]
AS_NOBODY = [
    "cat d/secret",
    "echo more >> d/secret",
    "truncate -s 0 d/secret",
    "touch d/new",
    "rm -f d/secret",
    "mv d/secret d/moved",
    "ls d",
    "cat d/granted",
    "echo more >> d/granted",
    "cat d/denied",
    "echo more >> d/denied",
    "./d/tool",
    "./d/runnable",
    "chmod 777 d/granted",
    "chown nobody d/granted",
    "touch -d 2001-01-01 d/granted",
    "touch d/granted",
    "setfacl -m u:nobody:rwx d/secret",
    "echo mine > open/nobodys && chmod 600 open/nobodys && cat open/nobodys",
    "chmod 644 open/nobodys && stat -c %a open/nobodys",
    "rm sticky/roots",
    "echo x >> sticky/roots",
    "touch aclgrant/f && ls aclgrant",
    "mkdir d/sub",
    "ln -s x d/link",
]
AFTER = ["cat d/secret d/granted d/denied", "ls -a d open sticky aclgrant",
         "stat -c '%n %a %u %s' d/secret d/granted open/nobodys"]


def sh(cmd, cwd):
    p = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout


def run_script(root):
    os.chmod(root, 0o755)
    for step in SETUP:
        rc, out = sh(step, root)
        assert rc == 0, f"setup step {step!r} failed: {out}"
    out = []
    for step in AS_NOBODY:
        quoted = step.replace("'", "'\\''")
        out.append((step,) + sh(f"runuser -u nobody -- sh -c '{quoted}'", root))
    for step in AFTER:
        out.append((step,) + sh(step, root))
    return out


def kernel_reference(workdir):
    with kfs.kernel_fs(workdir, name="kernel") as fs:
        want = run_script(fs.mnt)
        fs.release()
    return want


def test_permissions_like_kernel_btrfs(fuse, butter, workdir):
    want = kernel_reference(workdir)
    steps_like_kernel(butter.path, workdir, run_script, want, ["allow_other"])


def test_no_permission_checks_opts_out(fuse, butter, workdir):
    image = os.path.join(workdir, "img")
    kfs.run([butter.path, "mkfs", "-q", "-b", "256M", image])
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt"),
                   ["allow_other", "no_permission_checks"]) as m:
        os.chmod(m.mnt, 0o755)
        with open(os.path.join(m.mnt, "secret"), "w") as f:
            f.write("secret\n")
        os.chmod(os.path.join(m.mnt, "secret"), 0o600)
        assert sh("runuser -u nobody -- cat secret", m.mnt) == (0, "secret\n")
        assert m.unmount() == 0
    # and the default_permissions of older command lines is still accepted
    with FuseMount(butter.path, [image], os.path.join(workdir, "mnt"),
                   ["allow_other", "default_permissions"]) as m:
        assert sh("runuser -u nobody -- cat secret", m.mnt)[0] != 0
        assert m.unmount() == 0
