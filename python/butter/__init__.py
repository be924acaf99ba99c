"""butter — open btrfs images from Python, without the kernel or FUSE (libbutter through ctypes).

    import butter
    with butter.Filesystem("fs.img") as fs:          # read-only unless writable=True
        for name, kind in fs.listdir("/docs"):
            print(name, kind)
        data = fs.read("/docs/note.txt")

    with butter.Filesystem("fs.img", writable=True) as fs:
        fs.mkdir("/new")
        fs.write_file("/new/hello", b"hi\\n")        # committed at close (or fs.sync())

Errors come as OSError with the errno libbutter returned (FileNotFoundError, ...). The shared
library is found as libbutter.so.0 by the dynamic loader, or at the path in $BUTTER_LIBRARY.
Each function's whole contract is in <butter/butter.h> and libbutter(3).
"""
import ctypes
import errno as _errno
import os
import stat as _stat
from collections import namedtuple

__all__ = ["Filesystem", "Stat", "Info"]

_lib = ctypes.CDLL(os.environ.get("BUTTER_LIBRARY") or "libbutter.so.0", use_errno=False)

_OPEN_RDONLY = 0x1
_DT = {1: "fifo", 2: "chr", 4: "dir", 6: "blk", 8: "file", 10: "link", 12: "sock"}


class _Ino(ctypes.Structure):
    _fields_ = [("subvol", ctypes.c_uint64), ("ino", ctypes.c_uint64)]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Stat(ctypes.Structure):
    _fields_ = [("subvol", ctypes.c_uint64), ("ino", ctypes.c_uint64),
                ("mode", ctypes.c_uint32), ("nlink", ctypes.c_uint32),
                ("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32),
                ("rdev", ctypes.c_uint64), ("size", ctypes.c_uint64),
                ("blocks", ctypes.c_uint64), ("generation", ctypes.c_uint64),
                ("transid", ctypes.c_uint64), ("flags", ctypes.c_uint64),
                ("atime", _Timespec), ("mtime", _Timespec), ("ctime", _Timespec),
                ("otime", _Timespec)]


class _Info(ctypes.Structure):
    _fields_ = [("label", ctypes.c_char * 257), ("fsid", ctypes.c_uint8 * 16),
                ("metadata_uuid", ctypes.c_uint8 * 16), ("generation", ctypes.c_uint64),
                ("total_bytes", ctypes.c_uint64), ("bytes_used", ctypes.c_uint64),
                ("num_devices", ctypes.c_uint64), ("sectorsize", ctypes.c_uint32),
                ("nodesize", ctypes.c_uint32), ("csum_type", ctypes.c_uint16),
                ("csum_name", ctypes.c_char_p), ("compat_flags", ctypes.c_uint64),
                ("compat_ro_flags", ctypes.c_uint64), ("incompat_flags", ctypes.c_uint64),
                ("default_subvol", ctypes.c_uint64)]


class _OpenOpts(ctypes.Structure):
    _fields_ = [("devices", ctypes.POINTER(ctypes.c_char_p)), ("ndevices", ctypes.c_size_t),
                ("cache_bytes", ctypes.c_uint64), ("flags", ctypes.c_uint),
                ("log", ctypes.c_void_p), ("log_arg", ctypes.c_void_p),
                ("log_level", ctypes.c_int)]


class _NewInode(ctypes.Structure):
    _fields_ = [("mode", ctypes.c_uint32), ("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32),
                ("rdev", ctypes.c_uint64), ("umask", ctypes.c_uint32), ("flags", ctypes.c_uint32)]


_DIRENT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_char),
                              ctypes.c_size_t, _Ino, ctypes.c_uint, ctypes.c_uint64)

_P = ctypes.POINTER
_FS = ctypes.c_void_p
for _name, _res, _args in [
        ("butter_version", ctypes.c_char_p, []),
        ("butter_open", ctypes.c_int, [ctypes.c_char_p, _P(_OpenOpts), _P(_FS)]),
        ("butter_close", None, [_FS]),
        ("butter_get_info", ctypes.c_int, [_FS, _P(_Info)]),
        ("butter_resolve", ctypes.c_int, [_FS, ctypes.c_char_p, _P(_Ino)]),
        ("butter_stat", ctypes.c_int, [_FS, _Ino, _P(_Stat)]),
        ("butter_readdir", ctypes.c_int, [_FS, _Ino, ctypes.c_uint64, _DIRENT_FN, ctypes.c_void_p]),
        ("butter_read", ctypes.c_ssize_t, [_FS, _Ino, ctypes.c_void_p, ctypes.c_size_t,
                                           ctypes.c_uint64]),
        ("butter_readlink", ctypes.c_ssize_t, [_FS, _Ino, ctypes.c_char_p, ctypes.c_size_t]),
        ("butter_listxattr", ctypes.c_ssize_t, [_FS, _Ino, ctypes.c_char_p, ctypes.c_size_t]),
        ("butter_getxattr", ctypes.c_ssize_t, [_FS, _Ino, ctypes.c_char_p, ctypes.c_void_p,
                                               ctypes.c_size_t]),
        ("butter_create", ctypes.c_int, [_FS, _Ino, ctypes.c_char_p, ctypes.c_size_t,
                                         _P(_NewInode), _P(_Ino)]),
        ("butter_write", ctypes.c_ssize_t, [_FS, _Ino, ctypes.c_void_p, ctypes.c_size_t,
                                            ctypes.c_uint64]),
        ("butter_unlink", ctypes.c_int, [_FS, _Ino, ctypes.c_char_p, ctypes.c_size_t]),
        ("butter_sync", ctypes.c_int, [_FS]),
]:
    _fn = getattr(_lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args

Stat = namedtuple("Stat", "subvol ino mode nlink uid gid rdev size blocks generation flags "
                          "atime mtime ctime otime")
Info = namedtuple("Info", "label fsid generation total_bytes bytes_used num_devices sectorsize "
                          "nodesize csum default_subvol")


def version():
    """The version of the libbutter in use."""
    return _lib.butter_version().decode()


def _check(ret, what):
    if ret < 0:
        raise OSError(-ret, f"{what}: {os.strerror(-ret)}")
    return ret


def _name(path):
    """@path for a message: the path, or the (subvolume, inode) pair."""
    if isinstance(path, _Ino):
        return f"subvolume {path.subvol} inode {path.ino}"
    return os.fsdecode(path)


def _ts(t):
    return t.tv_sec + t.tv_nsec / 1e9


class Filesystem:
    """An open btrfs filesystem: image files or block devices (the first, then the others)."""

    def __init__(self, path, *devices, writable=False):
        opts = _OpenOpts()
        self._devices = (ctypes.c_char_p * max(len(devices), 1))(
            *[os.fsencode(d) for d in devices])
        opts.devices = ctypes.cast(self._devices, _P(ctypes.c_char_p)) if devices else None
        opts.ndevices = len(devices)
        opts.flags = 0 if writable else _OPEN_RDONLY
        self._fs = _FS()
        _check(_lib.butter_open(os.fsencode(path), ctypes.byref(opts), ctypes.byref(self._fs)),
               os.fspath(path))

    def close(self):
        """Commit what is left (writable) and release the filesystem."""
        if self._fs:
            _lib.butter_close(self._fs)
            self._fs = _FS()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _handle(self):
        if not self._fs:
            raise ValueError("the filesystem is closed")
        return self._fs

    def _ino(self, path):
        if isinstance(path, _Ino):
            return path
        ino = _Ino()
        _check(_lib.butter_resolve(self._handle(), os.fsencode(path), ctypes.byref(ino)),
               _name(path))
        return ino

    def info(self):
        i = _Info()
        _check(_lib.butter_get_info(self._handle(), ctypes.byref(i)), "info")
        return Info(i.label.decode(errors="surrogateescape"), bytes(i.fsid).hex(), i.generation,
                    i.total_bytes, i.bytes_used, i.num_devices, i.sectorsize, i.nodesize,
                    i.csum_name.decode(), i.default_subvol)

    def stat(self, path):
        st = _Stat()
        _check(_lib.butter_stat(self._handle(), self._ino(path), ctypes.byref(st)),
               _name(path))
        return Stat(st.subvol, st.ino, st.mode, st.nlink, st.uid, st.gid, st.rdev, st.size,
                    st.blocks, st.generation, st.flags, _ts(st.atime), _ts(st.mtime),
                    _ts(st.ctime), _ts(st.otime))

    def listdir(self, path="/"):
        """[(name, kind)] of a directory in index order; kind: file, dir, link, fifo, ..."""
        entries = []

        def take(arg, name, namelen, ino, dtype, pos):
            entries.append((os.fsdecode(ctypes.string_at(name, namelen)),
                            _DT.get(dtype, "other")))
            return 0

        _check(_lib.butter_readdir(self._handle(), self._ino(path), 0, _DIRENT_FN(take), None),
               _name(path))
        return entries

    def read(self, path, offset=0, size=None):
        """The bytes of a file from @offset (all of them, or @size)."""
        ino = self._ino(path)
        if size is None:
            size = max(self.stat(ino).size - offset, 0)
        buf = ctypes.create_string_buffer(size)
        done = 0
        while done < size:
            n = _check(_lib.butter_read(self._handle(), ino, ctypes.byref(buf, done),
                                        size - done, offset + done), _name(path))
            if n == 0:
                break
            done += n
        return buf.raw[:done]

    def readlink(self, path):
        buf = ctypes.create_string_buffer(4096)
        n = _check(_lib.butter_readlink(self._handle(), self._ino(path), buf, 4096),
                   _name(path))
        return os.fsdecode(buf.raw[:n])

    def listxattr(self, path):
        ino = self._ino(path)
        n = _check(_lib.butter_listxattr(self._handle(), ino, None, 0), _name(path))
        buf = ctypes.create_string_buffer(max(n, 1))
        n = _check(_lib.butter_listxattr(self._handle(), ino, buf, n), _name(path))
        return [os.fsdecode(x) for x in buf.raw[:n].split(b"\0") if x]

    def getxattr(self, path, name):
        ino = self._ino(path)
        key = os.fsencode(name)
        n = _check(_lib.butter_getxattr(self._handle(), ino, key, None, 0), _name(path))
        buf = ctypes.create_string_buffer(max(n, 1))
        n = _check(_lib.butter_getxattr(self._handle(), ino, key, buf, n), _name(path))
        return buf.raw[:n]

    def _create(self, path, mode):
        parent, name = os.path.split(os.fsencode(path).rstrip(b"/"))
        if not name:
            raise OSError(_errno.EEXIST, "the root exists", _name(path))
        attr = _NewInode(mode=mode, uid=os.getuid(), gid=os.getgid())
        out = _Ino()
        _check(_lib.butter_create(self._handle(), self._ino(parent or b"/"), name, len(name),
                                  ctypes.byref(attr), ctypes.byref(out)), _name(path))
        return out

    def mkdir(self, path, mode=0o755):
        self._create(path, _stat.S_IFDIR | mode)

    def write_file(self, path, data, mode=0o644):
        """Create the regular file @path (or write over an existing one) holding @data."""
        try:
            ino = self._ino(path)
            if self.stat(ino).size > len(data):
                raise OSError(_errno.EEXIST, "exists and is longer", _name(path))
        except FileNotFoundError:
            ino = self._create(path, _stat.S_IFREG | mode)
        done = 0
        while done < len(data):
            chunk = data[done:done + (1 << 20)]
            done += _check(_lib.butter_write(self._handle(), ino, chunk, len(chunk), done),
                           _name(path))

    def unlink(self, path):
        parent, name = os.path.split(os.fsencode(path).rstrip(b"/"))
        _check(_lib.butter_unlink(self._handle(), self._ino(parent or b"/"), name, len(name)),
               _name(path))

    def sync(self):
        """Commit every change so far."""
        _check(_lib.butter_sync(self._handle()), "sync")
