"""Running the butter CLI under test: argument order, timeouts, readable failures.

Every command takes the filesystem as IMAGE plus `--device DEV` for each further member
of a multi-device filesystem; Butter.args() builds that from a list of image files
(the first is IMAGE). Commands run with a timeout: a hang is a failure that names the
command, never a stuck test run.

Also: Butter.mkfs() (`butter mkfs -f -b SIZE`), image_paths() (image files for it to
create) and failed() (did butter exit with a status by itself, not a sanitizer's abort).
"""
import os
import subprocess

DEFAULT_TIMEOUT = 600


def image_paths(workdir, n, name="img"):
    """Return `n` image file paths (not created: butter mkfs -b creates them)."""
    d = os.path.join(workdir, name)
    os.makedirs(d, exist_ok=True)
    return [os.path.join(d, f"dev{i + 1}.img") for i in range(n)]


def failed(proc, status=1):
    """Did butter exit with `status`, by itself (not a sanitizer's report and abort)?"""
    return proc.returncode == status and "Sanitizer" not in proc.stderr


class Butter:
    def __init__(self, path):
        self.path = path

    @staticmethod
    def device_args(images):
        images = [os.fspath(i) for i in images]
        out = []
        for extra in images[1:]:
            out += ["--device", extra]
        return out + [images[0]]

    def run(self, argv, timeout=DEFAULT_TIMEOUT, check=True):
        """Run `butter argv...`; return CompletedProcess (stdout bytes, stderr text).

        With check, a non-zero exit raises AssertionError naming the command, its exit
        status and the end of its stderr. A timeout always raises AssertionError.
        """
        cmd = [self.path] + [os.fspath(a) for a in argv]
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"butter did not finish in {timeout} s (killed): "
                                 f"{' '.join(cmd)}") from None
        proc.stderr = proc.stderr.decode("utf-8", "surrogateescape")
        if check and proc.returncode != 0:
            raise AssertionError(f"butter exited with status {proc.returncode}: {' '.join(cmd)}\n"
                                 f"stderr (last 3000 bytes):\n{proc.stderr[-3000:]}")
        return proc

    def mkfs(self, images, *args, size="512M", check=True):
        """Run `butter mkfs -f -b size args... images...`; return the CompletedProcess."""
        return self.run(["mkfs", "-f", "-b", size] + list(args) + list(images), check=check)

    def extract(self, images, dest, src=None, check=True, timeout=DEFAULT_TIMEOUT):
        argv = ["extract"] + self.device_args(images) + ([src] if src else []) + [dest]
        return self.run(argv, timeout=timeout, check=check)

    def ls(self, images, path=None, long=False, check=True):
        argv = ["ls"] + (["-l"] if long else []) + self.device_args(images)
        return self.run(argv + ([path] if path else []), check=check)

    def cat(self, images, path, check=True):
        return self.run(["cat"] + self.device_args(images) + [path], check=check)

    def info(self, images, check=True):
        return self.run(["info"] + self.device_args(images), check=check)

    def subvolume_list(self, images, check=True):
        return self.run(["subvolume", "list"] + self.device_args(images), check=check)
