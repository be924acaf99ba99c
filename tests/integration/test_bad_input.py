"""Bad input: damaged, truncated, inconsistent and foreign images given to `butter`.

Every case must end with a clear error on stderr ("butter: ..."), a non-zero exit, and no
crash, hang or sanitizer report (the binary under test is built with ASan + UBSan; their
reports fail the test even when the exit status looks right).

Images are made without root or the kernel: `mkfs.btrfs --mixed --rootdir` of a generated
tree (mixed block groups, so metadata is single-profile and a damaged tree block has no
second copy to fall back to), then edited in Python: the helpers below parse the
superblock, map logical to physical addresses through the chunk tree, walk B-trees, edit
leaf items and node pointers, and recompute crc32c checksums so that an edit reaches the
parsers behind the checksum gate.

Environment: BUTTER_BIN (default <repo>/build/cli/butter), BUTTER_TEST_TIMEOUT (per
command, default 60 s here).
"""
import os
import shutil
import struct
import subprocess

import pytest

from butter_it import kfs

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUTTER = os.environ.get("BUTTER_BIN") or os.path.join(REPO, "build", "cli", "butter")
CMD_TIMEOUT = min(int(os.environ.get("BUTTER_TEST_TIMEOUT", "60")), 60)
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer",
                   "runtime error:", "MemorySanitizer", "ThreadSanitizer")

# ---- on-disk layout (the subset the edits need; offsets from ctree.h) -------------------

SUPER_OFFSET = 0x10000
SUPER_SIZE = 4096
CSUM_SIZE = 32
HEADER_SIZE = 101
ITEM_SIZE = 25          # btrfs_item: disk key (17) + offset (4) + size (4)
KEY_PTR_SIZE = 33       # btrfs_key_ptr: disk key (17) + blockptr (8) + generation (8)

# superblock fields: name -> (offset, struct format)
SB = {
    "magic": (0x40, "<Q"), "generation": (0x48, "<Q"), "root": (0x50, "<Q"),
    "chunk_root": (0x58, "<Q"), "total_bytes": (0x70, "<Q"), "num_devices": (0x88, "<Q"),
    "sectorsize": (0x90, "<I"), "nodesize": (0x94, "<I"), "stripesize": (0x9c, "<I"),
    "sys_chunk_array_size": (0xa0, "<I"), "incompat_flags": (0xbc, "<Q"),
    "csum_type": (0xc4, "<H"), "root_level": (0xc6, "<B"), "chunk_root_level": (0xc7, "<B"),
    "bytenr": (0x30, "<Q"),
}
SYS_CHUNK_ARRAY = 0x32b
BTRFS_MAGIC = 0x4D5F53665248425F

ROOT_TREE_OBJECTID = 1
FS_TREE_OBJECTID = 5
INODE_ITEM_KEY = 1
INODE_REF_KEY = 12
XATTR_ITEM_KEY = 24
DIR_ITEM_KEY = 84
DIR_INDEX_KEY = 96
EXTENT_DATA_KEY = 108
ROOT_ITEM_KEY = 132
CHUNK_ITEM_KEY = 228

# ---- an image in memory -----------------------------------------------------------------


class Image:
    """A single-device btrfs image as a bytearray, with just enough structure to edit it."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self.data = bytearray(f.read())
        self.nodesize = self.sb("nodesize")
        self.sectorsize = self.sb("sectorsize")
        assert self.sb("csum_type") == 0, "the edits recompute crc32c only"
        self.chunks = []          # (logical, length, physical of stripe 0)
        self._load_sys_array()
        self._load_chunk_tree()

    def save(self, path=None):
        with open(path or self.path, "wb") as f:
            f.write(self.data)

    # superblock

    def sb(self, name):
        off, fmt = SB[name]
        return struct.unpack_from(fmt, self.data, SUPER_OFFSET + off)[0]

    def set_sb(self, name, value):
        off, fmt = SB[name]
        struct.pack_into(fmt, self.data, SUPER_OFFSET + off, value)

    def fix_super_csum(self):
        sb = SUPER_OFFSET
        c = kfs.crc32c(self.data[sb + CSUM_SIZE:sb + SUPER_SIZE])
        self.data[sb:sb + CSUM_SIZE] = struct.pack("<I", c) + bytes(CSUM_SIZE - 4)

    # chunk map (single and dup: stripe 0 holds the whole chunk)

    def _add_chunk(self, logical, buf, off):
        length, _owner, _stripe_len, _type = struct.unpack_from("<QQQQ", buf, off)
        num_stripes = struct.unpack_from("<H", buf, off + 44)[0]
        physical = struct.unpack_from("<Q", buf, off + 48 + 8)[0]
        if not any(c[0] == logical for c in self.chunks):
            self.chunks.append((logical, length, physical))
        return 48 + 32 * num_stripes

    def _load_sys_array(self):
        size = self.sb("sys_chunk_array_size")
        arr = bytes(self.data[SUPER_OFFSET + SYS_CHUNK_ARRAY:SUPER_OFFSET + SYS_CHUNK_ARRAY + size])
        pos = 0
        while pos < size:
            _objectid, ktype, logical = struct.unpack_from("<QBQ", arr, pos)
            assert ktype == CHUNK_ITEM_KEY
            pos += 17
            pos += self._add_chunk(logical, arr, pos)

    def _load_chunk_tree(self):
        for leaf in self.all_leaves(self.sb("chunk_root")):
            for (objectid, ktype, offset), data_off, _size in self.items(leaf):
                if ktype == CHUNK_ITEM_KEY:
                    self._add_chunk(offset, self.data, data_off)

    def physical(self, logical):
        for start, length, phys in self.chunks:
            if start <= logical < start + length:
                return phys + (logical - start)
        raise KeyError(f"logical {logical} is not mapped")

    # tree blocks, addressed by physical offset once mapped

    def block(self, logical):
        """Physical offset of the tree block at @logical."""
        return self.physical(logical)

    def header(self, phys):
        bytenr, = struct.unpack_from("<Q", self.data, phys + 0x30)
        generation, owner, nritems = struct.unpack_from("<QQI", self.data, phys + 0x50)
        level = self.data[phys + 0x64]
        return {"bytenr": bytenr, "generation": generation, "owner": owner,
                "nritems": nritems, "level": level}

    def fix_node_csum(self, phys):
        c = kfs.crc32c(self.data[phys + CSUM_SIZE:phys + self.nodesize])
        self.data[phys:phys + CSUM_SIZE] = struct.pack("<I", c) + bytes(CSUM_SIZE - 4)

    def items(self, phys):
        """Leaf items: ((objectid, type, offset), physical offset of the data, size)."""
        h = self.header(phys)
        assert h["level"] == 0
        out = []
        for i in range(h["nritems"]):
            p = phys + HEADER_SIZE + i * ITEM_SIZE
            key = struct.unpack_from("<QBQ", self.data, p)
            off, size = struct.unpack_from("<II", self.data, p + 17)
            out.append((key, phys + HEADER_SIZE + off, size))
        return out

    def ptrs(self, phys):
        """Node pointers: ((objectid, type, offset), blockptr, generation)."""
        h = self.header(phys)
        assert h["level"] > 0
        out = []
        for i in range(h["nritems"]):
            p = phys + HEADER_SIZE + i * KEY_PTR_SIZE
            key = struct.unpack_from("<QBQ", self.data, p)
            blockptr, gen = struct.unpack_from("<QQ", self.data, p + 17)
            out.append((key, blockptr, gen))
        return out

    def nodes(self, root_logical):
        """Every tree block of a tree, parents before children: (logical, physical, level)."""
        out = []
        stack = [root_logical]
        while stack:
            logical = stack.pop(0)
            phys = self.block(logical)
            h = self.header(phys)
            out.append((logical, phys, h["level"]))
            if h["level"] > 0:
                stack.extend(bp for _k, bp, _g in self.ptrs(phys))
        return out

    def all_leaves(self, root_logical):
        return [phys for _l, phys, level in self.nodes(root_logical) if level == 0]

    def tree_root(self, objectid):
        """Logical address of tree @objectid's root, from its ROOT_ITEM."""
        for leaf in self.all_leaves(self.sb("root")):
            for (oid, ktype, _off), data_off, _size in self.items(leaf):
                if oid == objectid and ktype == ROOT_ITEM_KEY:
                    return struct.unpack_from("<Q", self.data, data_off + 176)[0]
        raise KeyError(f"no root item for tree {objectid}")

    def find_item(self, root_logical, pred):
        """First leaf item of the tree with pred(key, data_off, size): (leaf phys, slot, ...)."""
        for leaf in self.all_leaves(root_logical):
            for slot, (key, data_off, size) in enumerate(self.items(leaf)):
                if pred(key, data_off, size):
                    return leaf, slot, key, data_off, size
        raise KeyError("no such item")


# ---- making the base image ----------------------------------------------------------------


def _fill_tree(root):
    os.makedirs(os.path.join(root, "dir", "sub"))
    with open(os.path.join(root, "hello.txt"), "w") as f:
        f.write("hello, butter\n")
    with open(os.path.join(root, "dir", "regular.bin"), "wb") as f:
        f.write(bytes(range(256)) * 80)
    with open(os.path.join(root, "dir", "sub", "inline.txt"), "w") as f:
        f.write("small inline file\n" * 10)
    os.symlink("hello.txt", os.path.join(root, "link"))
    many = os.path.join(root, "many")
    os.mkdir(many)
    # enough entries that the fs tree has internal nodes two levels deep (4 KiB nodes) and
    # that /many's DIR_INDEX items fill more leaves than one level-1 node can point to
    for i in range(6000):
        with open(os.path.join(many, f"entry-with-a-fairly-long-name-{i:05d}"), "w") as f:
            f.write(f"{i}\n")


@pytest.fixture(scope="module")
def base_image(tmp_path_factory):
    """A mixed-block-group image (single-profile metadata, crc32c, 4 KiB nodes)."""
    if not shutil.which("mkfs.btrfs"):
        pytest.skip("mkfs.btrfs (btrfs-progs) is not installed")
    if not os.path.exists(BUTTER):
        pytest.fail(f"butter binary not found at {BUTTER} (set BUTTER_BIN)", pytrace=False)
    d = tmp_path_factory.mktemp("bad-input-base")
    tree = d / "tree"
    tree.mkdir()
    _fill_tree(str(tree))
    img = d / "base.img"
    with open(img, "wb") as f:
        f.truncate(256 << 20)
    subprocess.run(["mkfs.btrfs", "-q", "-f", "--mixed", "--rootdir", str(tree), "--shrink",
                    str(img)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                   timeout=300)
    image = Image(str(img))
    fs_root = image.tree_root(FS_TREE_OBJECTID)
    assert image.header(image.block(fs_root))["level"] >= 2, "want a fs tree two levels deep"
    return str(img)


@pytest.fixture
def image(base_image, tmp_path):
    """A private copy of the base image, opened for editing."""
    path = tmp_path / "case.img"
    shutil.copyfile(base_image, path)
    return Image(str(path))


# ---- running butter -------------------------------------------------------------------------


def run_butter(*args):
    try:
        p = subprocess.run([BUTTER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=CMD_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"butter {' '.join(args)}: still running after {CMD_TIMEOUT} s (a hang?)",
                    pytrace=False)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def check_sane(args, rc, err):
    """No crash, no sanitizer report, no silent failure."""
    what = f"butter {' '.join(args)}"
    assert rc >= 0, f"{what}: killed by signal {-rc}\n{err[-3000:]}"
    for mark in SANITIZER_MARKS:
        assert mark not in err, f"{what}: sanitizer report\n{err[-6000:]}"
    if rc != 0:
        assert "butter" in err and err.strip(), f"{what}: exit {rc} with no message on stderr"


def expect_error(*args, words=()):
    """Run butter, require a clean failure: non-zero exit and a clear message."""
    rc, _out, err = run_butter(*args)
    check_sane(args, rc, err)
    assert rc != 0, f"butter {' '.join(args)}: exit 0 on a damaged image\nstderr: {err}"
    lines = [ln for ln in err.splitlines() if ln.startswith("butter")]
    assert lines, f"butter {' '.join(args)}: no 'butter: ...' line on stderr:\n{err}"
    if words:
        low = err.lower()
        assert any(w.lower() in low for w in words), \
            f"butter {' '.join(args)}: stderr names none of {words}:\n{err}"
    return err


def expect_survives(*args):
    """Run butter; any exit status is fine as long as it is clean."""
    rc, _out, err = run_butter(*args)
    check_sane(args, rc, err)
    return rc, err


def every_command_fails(path, tmp_path, words=()):
    """Damage that stops the open: every command must fail the same clear way."""
    expect_error("info", path, words=words)
    expect_error("ls", "-l", path, "/", words=words)
    expect_error("cat", path, "/hello.txt", words=words)
    expect_error("subvolume", "list", path, words=words)
    expect_error("extract", path, "/", str(tmp_path / "out"), words=words)


def walk_fails(path, tmp_path, words=()):
    """Damage inside the trees: every command survives, a full extract fails clearly."""
    expect_survives("info", path)
    expect_survives("ls", "-l", path, "/")
    expect_survives("ls", "-l", path, "/many")
    expect_survives("cat", path, "/hello.txt")
    expect_survives("subvolume", "list", path)
    return expect_error("extract", path, "/", str(tmp_path / "out"), words=words)


# ---- the base image is sound ------------------------------------------------------------


def test_base_image_reads(base_image, tmp_path):
    """The unedited image extracts cleanly: failures below come from the edits."""
    rc, out, err = run_butter("extract", base_image, "/", str(tmp_path / "out"))
    check_sane(("extract",), rc, err)
    assert rc == 0, err
    with open(tmp_path / "out" / "hello.txt") as f:
        assert f.read() == "hello, butter\n"


# ---- not a btrfs image at all -------------------------------------------------------------


def test_image_is_a_directory(tmp_path):
    every_command_fails(str(tmp_path), tmp_path)


def test_image_does_not_exist(tmp_path):
    missing = str(tmp_path / "no-such-image")
    err = expect_error("ls", missing, "/", words=("no such file",))
    assert "no-such-image" in err


@pytest.mark.parametrize("kind", ["empty", "zeros", "text", "random"])
def test_not_btrfs(tmp_path, kind):
    path = tmp_path / f"{kind}.img"
    content = {
        "empty": b"",
        "zeros": bytes(4 << 20),
        "text": b"this is not a filesystem\n" * 50000,
        "random": os.urandom(1 << 20),
    }[kind]
    path.write_bytes(content)
    every_command_fails(str(path), tmp_path, words=("btrfs", "superblock", "too small"))


# ---- truncated images -----------------------------------------------------------------------


def _cut_points(img):
    fs_root = img.block(img.tree_root(FS_TREE_OBJECTID))
    return {
        "at-0": 0,
        "at-100": 100,
        "before-super": SUPER_OFFSET,
        "inside-super": SUPER_OFFSET + 2000,
        "after-super": SUPER_OFFSET + SUPER_SIZE,
        "inside-chunk-root": img.block(img.sb("chunk_root")) + img.nodesize // 2,
        "at-root-tree": img.block(img.sb("root")),
        "inside-fs-root": fs_root + 1000,
    }


@pytest.mark.parametrize("where", ["at-0", "at-100", "before-super", "inside-super",
                                   "after-super", "inside-chunk-root", "at-root-tree",
                                   "inside-fs-root"])
def test_truncated(image, tmp_path, where):
    cut = _cut_points(image)[where]
    with open(image.path, "r+b") as f:
        f.truncate(cut)
    if where in ("at-root-tree", "inside-fs-root"):
        # the superblock and chunk tree are intact: open may work, the walk may not
        walk_fails(image.path, tmp_path)
    else:
        every_command_fails(image.path, tmp_path)


def test_truncated_everywhere(image, tmp_path):
    """Cut at many sizes across the image: never a crash or hang."""
    size = len(image.data)
    for frac in range(1, 16):
        cut = size * frac // 16 + 123
        with open(image.path, "wb") as f:
            f.write(image.data[:cut])
        expect_survives("extract", image.path, "/", str(tmp_path / f"out{frac}"))
        expect_survives("ls", "-l", image.path, "/many")


# ---- superblock damage -------------------------------------------------------------------


def test_wrong_magic(image, tmp_path):
    image.data[SUPER_OFFSET + 0x40] ^= 0x20
    image.save()
    every_command_fails(image.path, tmp_path, words=("not a btrfs",))


def test_super_checksum_mismatch(image, tmp_path):
    image.set_sb("generation", image.sb("generation") + 1)   # csum not updated
    image.save()
    every_command_fails(image.path, tmp_path, words=("checksum", "superblock"))


def test_garbage_superblock_keeping_magic(image, tmp_path):
    garbage = bytearray(os.urandom(SUPER_SIZE))
    struct.pack_into("<Q", garbage, 0x40, BTRFS_MAGIC)
    image.data[SUPER_OFFSET:SUPER_OFFSET + SUPER_SIZE] = garbage
    image.save()
    every_command_fails(image.path, tmp_path)


def test_garbage_superblock_with_valid_checksum(image, tmp_path):
    garbage = bytearray(os.urandom(SUPER_SIZE))
    struct.pack_into("<Q", garbage, 0x40, BTRFS_MAGIC)
    struct.pack_into("<Q", garbage, 0x30, SUPER_OFFSET)
    struct.pack_into("<H", garbage, 0xc4, 0)
    image.data[SUPER_OFFSET:SUPER_OFFSET + SUPER_SIZE] = garbage
    image.fix_super_csum()
    image.save()
    every_command_fails(image.path, tmp_path)


# (field, value, words expected in the message); the checksum is recomputed after the edit
INCONSISTENT_SUPERS = [
    ("nodesize", 3000, ("nodesize",)),
    ("nodesize", 1 << 17, ("nodesize",)),
    ("nodesize", 2048, ("nodesize",)),
    ("sectorsize", 0, ("sectorsize",)),
    ("sectorsize", 3000, ("sectorsize",)),
    ("sectorsize", 8192, ("sectorsize", "nodesize")),
    ("sys_chunk_array_size", 5000, ("sys_chunk_array",)),
    ("sys_chunk_array_size", 0, ("sys_chunk_array",)),
    ("sys_chunk_array_size", 20, ("sys_chunk_array",)),
    ("root_level", 200, ("level",)),
    ("chunk_root_level", 8, ("level",)),
    ("root_level", 1, ("level", "tree block", "root")),
    ("num_devices", 0, ("devices",)),
    ("generation", 0, ("generation",)),
    ("bytenr", 4096, ("bytenr", "superblock")),
    ("csum_type", 7, ("checksum",)),
    ("root", 12345, ("unaligned", "root")),
    ("root", 1 << 50, ("tree block", "root", "chunk")),
    ("chunk_root", 1 << 40, ("chunk",)),
    ("incompat_flags", 1 << 40, ("unsupported", "feature")),
]


@pytest.mark.parametrize("field,value,words", INCONSISTENT_SUPERS,
                         ids=[f"{f}={v}" for f, v, _w in INCONSISTENT_SUPERS])
def test_inconsistent_superblock(image, tmp_path, field, value, words):
    image.set_sb(field, value)
    image.fix_super_csum()
    image.save()
    every_command_fails(image.path, tmp_path, words=words)


SYS_ARRAY_DAMAGE = {
    # (offset in the array's first entry, struct format, value)
    "num-stripes-past-array": (17 + 44, "<H", 5000),
    "num-stripes-zero": (17 + 44, "<H", 0),
    "key-type-not-chunk": (8, "<B", 1),
    "length-zero": (17, "<Q", 0),
    "stripe-len-not-pow2": (17 + 16, "<Q", 3 << 16),
    "type-data-only": (17 + 24, "<Q", 1),
    "stripe-offset-past-device": (17 + 48 + 8, "<Q", 1 << 50),
}


@pytest.mark.parametrize("how", sorted(SYS_ARRAY_DAMAGE))
def test_sys_chunk_array_damage(image, tmp_path, how):
    off, fmt, value = SYS_ARRAY_DAMAGE[how]
    struct.pack_into(fmt, image.data, SUPER_OFFSET + SYS_CHUNK_ARRAY + off, value)
    image.fix_super_csum()
    image.save()
    every_command_fails(image.path, tmp_path)


# ---- tree block damage (single-profile metadata: no other copy) -------------------------
#
# mkfs --rootdir numbers inodes after the host's, so where an item lands differs from run to
# run. Edits therefore aim at blocks found by key: the leaves holding the DIR_INDEX items of
# /many (which every listing and extract of /many iterates) and the nodes above them.


def _many_objectid(img):
    _leaf, _slot, _key, data_off, _size = _dir_entry(img, DIR_INDEX_KEY, b"many")
    return struct.unpack_from("<Q", img.data, data_off)[0]   # dir_item.location.objectid


def _path_to(img, root_logical, key):
    """[(logical, physical, slot)] from the root down to the leaf where @key is or would be."""
    path = []
    logical = root_logical
    while True:
        phys = img.block(logical)
        h = img.header(phys)
        if h["level"] == 0:
            items = img.items(phys)
            slot = max([i for i, it in enumerate(items) if it[0] <= key] or [0])
            path.append((logical, phys, slot))
            return path
        ptrs = img.ptrs(phys)
        slot = max([i for i, p in enumerate(ptrs) if p[0] <= key] or [0])
        path.append((logical, phys, slot))
        logical = ptrs[slot][1]


def _listing_path(img):
    """Path to a leaf in the middle of /many's DIR_INDEX items (root first, leaf last)."""
    return _path_to(img, img.tree_root(FS_TREE_OBJECTID),
                    (_many_objectid(img), DIR_INDEX_KEY, 2 + 3000))


def _listing_leaf(img):
    return _listing_path(img)[-1][1]


def test_node_checksum_error_in_fs_tree_leaf(image, tmp_path):
    leaf = _listing_leaf(image)
    image.data[leaf + 2000] ^= 0xff
    image.save()
    expect_error("ls", image.path, "/many", words=("checksum",))
    walk_fails(image.path, tmp_path, words=("checksum", "tree block", "input/output"))


def test_node_checksum_error_in_root_tree(image, tmp_path):
    root = image.block(image.sb("root"))
    image.data[root + image.nodesize - 10] ^= 0x01
    image.save()
    every_command_fails(image.path, tmp_path, words=("checksum", "tree block", "corrupt"))


def test_node_checksum_error_in_chunk_tree(image, tmp_path):
    root = image.block(image.sb("chunk_root"))
    image.data[root + 200] ^= 0x01
    image.save()
    every_command_fails(image.path, tmp_path, words=("checksum", "chunk"))


def test_node_checksum_error_in_fs_tree_root(image, tmp_path):
    root = image.block(image.tree_root(FS_TREE_OBJECTID))
    image.data[root + 500] ^= 0x01
    image.save()
    walk_fails(image.path, tmp_path, words=("checksum", "tree block"))


def test_wrong_bytenr_in_header(image, tmp_path):
    leaf = _listing_leaf(image)
    struct.pack_into("<Q", image.data, leaf + 0x30, 4096)
    image.fix_node_csum(leaf)
    image.save()
    walk_fails(image.path, tmp_path, words=("bytenr", "tree block"))


def test_wrong_fsid_in_header(image, tmp_path):
    leaf = _listing_leaf(image)
    image.data[leaf + 0x20] ^= 0x55
    image.fix_node_csum(leaf)
    image.save()
    walk_fails(image.path, tmp_path, words=("fsid", "tree block"))


def test_wrong_level_in_header(image, tmp_path):
    leaf = _listing_leaf(image)
    image.data[leaf + 0x64] = 1
    image.fix_node_csum(leaf)
    image.save()
    walk_fails(image.path, tmp_path, words=("level", "tree block"))


ITEM_DAMAGE = ["offset-past-end", "offset-huge", "size-huge", "overlap-headers",
               "nritems-huge", "nritems-zero", "keys-out-of-order"]


@pytest.mark.parametrize("how", ITEM_DAMAGE)
def test_leaf_items_outside_node(image, tmp_path, how):
    leaf = _listing_leaf(image)
    item0 = leaf + HEADER_SIZE
    if how == "offset-past-end":
        struct.pack_into("<I", image.data, item0 + 17, image.nodesize)
    elif how == "offset-huge":
        struct.pack_into("<I", image.data, item0 + 17, 0xFFFFFF00)
    elif how == "size-huge":
        struct.pack_into("<I", image.data, item0 + 21, 0xFFFFFFF0)
    elif how == "overlap-headers":
        n = image.header(leaf)["nritems"]
        last = item0 + (n - 1) * ITEM_SIZE
        struct.pack_into("<I", image.data, last + 17, 10)
    elif how == "nritems-huge":
        struct.pack_into("<I", image.data, leaf + 0x60, 0xFFFF)
    elif how == "nritems-zero":
        struct.pack_into("<I", image.data, leaf + 0x60, 0)
    elif how == "keys-out-of-order":
        struct.pack_into("<Q", image.data, item0 + ITEM_SIZE, 0)   # item 1 objectid -> 0
    image.fix_node_csum(leaf)
    image.save()
    expect_error("ls", image.path, "/many")
    walk_fails(image.path, tmp_path)


# ---- loops and cross-links in the tree ------------------------------------------------------


def _set_ptr(img, node_phys, slot, target_logical, target_gen=None, key_from=None):
    p = node_phys + HEADER_SIZE + slot * KEY_PTR_SIZE
    if key_from is not None:
        img.data[p:p + 17] = img.data[key_from:key_from + 17]
    struct.pack_into("<Q", img.data, p + 17, target_logical)
    if target_gen is not None:
        struct.pack_into("<Q", img.data, p + 25, target_gen)
    img.fix_node_csum(node_phys)


def _gen(img, logical):
    return img.header(img.block(logical))["generation"]


def test_loop_pointer_to_itself(image, tmp_path):
    path = _listing_path(image)
    assert len(path) == 3, "want root (level 2) / node (level 1) / leaf"
    logical, phys, slot = path[1]
    _set_ptr(image, phys, slot, logical, _gen(image, logical))
    image.save()
    expect_error("ls", image.path, "/many", words=("level", "tree block", "parent"))
    walk_fails(image.path, tmp_path, words=("level", "tree block", "parent"))


def test_loop_pointer_to_root(image, tmp_path):
    path = _listing_path(image)
    root_logical = path[0][0]
    _lg, phys, slot = path[1]
    _set_ptr(image, phys, slot, root_logical, _gen(image, root_logical))
    image.save()
    expect_error("ls", image.path, "/many", words=("level", "tree block", "parent"))
    walk_fails(image.path, tmp_path, words=("level", "tree block", "parent"))


def test_loop_root_pointer_to_root(image, tmp_path):
    path = _listing_path(image)
    root_logical, root_phys, slot = path[0]
    _set_ptr(image, root_phys, slot, root_logical, _gen(image, root_logical))
    image.save()
    expect_error("ls", image.path, "/many", words=("level", "tree block", "parent"))
    walk_fails(image.path, tmp_path, words=("level", "tree block", "parent"))


def test_cross_link_back_to_first_leaf(image, tmp_path):
    """A level-1 pointer names the tree's first leaf, with the right level and generation:
    the walk would go back to the start of the tree; the first-key check must stop it."""
    path = _listing_path(image)
    root_logical = path[0][0]
    _lg, phys, slot = path[1]
    first_leaf = [lg for lg, _ph, lv in image.nodes(root_logical) if lv == 0][0]
    _set_ptr(image, phys, slot, first_leaf, _gen(image, first_leaf))
    image.save()
    expect_error("ls", image.path, "/many", words=("key", "tree block", "parent"))
    walk_fails(image.path, tmp_path, words=("key", "tree block", "parent"))


def test_cross_linked_subtree(image, tmp_path):
    """A root pointer names its left neighbour's subtree (its key kept): the first-key check
    must catch the subtree standing in for another."""
    path = _listing_path(image)
    _root_logical, root_phys, slot = path[0]
    ptrs = image.ptrs(root_phys)
    other = slot - 1 if slot > 0 else slot + 1
    _k, bp, gen = ptrs[other]
    _set_ptr(image, root_phys, slot, bp, gen)
    image.save()
    expect_error("ls", image.path, "/many", words=("key", "tree block", "parent"))
    walk_fails(image.path, tmp_path, words=("key", "tree block", "parent"))


def test_cross_linked_overlapping_subtree(image, tmp_path):
    """Two level-1 nodes B and A, consecutive under the root, where /many's listing crosses
    from B into A. B's last pointer is replaced by A's second pointer, key and all: every
    block still validates alone (keys sorted, each child's first key equal to its pointer's),
    but iteration would run B's leaves, A's second leaf, then A's first leaf — backwards —
    and A's second leaf again. It must be reported, not listed twice."""
    many = _many_objectid(image)
    root_logical = image.tree_root(FS_TREE_OBJECTID)
    root_phys = image.block(root_logical)
    children = image.ptrs(root_phys)
    pair = None
    for i in range(len(children) - 1):
        b_phys = image.block(children[i][1])
        a_phys = image.block(children[i + 1][1])
        b_last = image.items(image.block(image.ptrs(b_phys)[-1][1]))[-1][0]
        a_first = image.ptrs(a_phys)[0][0]
        if b_last[:2] == (many, DIR_INDEX_KEY) and a_first[:2] == (many, DIR_INDEX_KEY):
            pair = (b_phys, a_phys)
    assert pair, "/many's DIR_INDEX items should span two level-1 nodes"
    b_phys, a_phys = pair
    a_ptrs = image.ptrs(a_phys)
    last = image.header(b_phys)["nritems"] - 1
    _set_ptr(image, b_phys, last, a_ptrs[1][1], a_ptrs[1][2],
             key_from=a_phys + HEADER_SIZE + 1 * KEY_PTR_SIZE)
    image.save()
    rc, out, err = run_butter("ls", image.path, "/many")
    check_sane(("ls", "/many"), rc, err)
    names = out.split()
    assert len(names) == len(set(names)), "a directory listed the same name twice"
    assert rc != 0 and "overlap" in err, f"ls /many: exit {rc}, stderr: {err}"
    walk_fails(image.path, tmp_path, words=("overlap", "cross-linked"))


def test_leaf_last_key_past_next_leaf(image, tmp_path):
    """A leaf's last key moved past the first key of the next leaf (sorted inside the leaf,
    checksum fixed): iteration would go backwards."""
    leaf = _listing_leaf(image)
    n = image.header(leaf)["nritems"]
    last = leaf + HEADER_SIZE + (n - 1) * ITEM_SIZE
    objectid, ktype, _offset = struct.unpack_from("<QBQ", image.data, last)
    assert (objectid, ktype) == (_many_objectid(image), DIR_INDEX_KEY)
    struct.pack_into("<Q", image.data, last + 9, 1 << 40)
    image.fix_node_csum(leaf)
    image.save()
    expect_error("ls", image.path, "/many", words=("overlap",))
    walk_fails(image.path, tmp_path, words=("overlap",))


# ---- names ------------------------------------------------------------------------------------


def _dir_entry(img, ktype, name):
    root = img.tree_root(FS_TREE_OBJECTID)

    def pred(key, data_off, size):
        if key[1] != ktype:
            return False
        name_len, = struct.unpack_from("<H", img.data, data_off + 27)
        return bytes(img.data[data_off + 30:data_off + 30 + name_len]) == name
    return img.find_item(root, pred)


# dir_item: location key (17) transid (8) data_len (2) name_len (2) type (1) = 30 bytes


@pytest.mark.parametrize("name_len", [0, 256, 300, 0xFFFF])
def test_oversized_name_in_dir_index(image, tmp_path, name_len):
    leaf, _slot, _key, data_off, _size = _dir_entry(image, DIR_INDEX_KEY, b"hello.txt")
    struct.pack_into("<H", image.data, data_off + 27, name_len)
    image.fix_node_csum(leaf)
    image.save()
    expect_error("ls", image.path, "/", words=("name", "dir"))
    walk_fails(image.path, tmp_path, words=("name", "dir"))


@pytest.mark.parametrize("name_len", [0, 300, 0xFFFF])
def test_oversized_name_in_dir_item(image, tmp_path, name_len):
    leaf, _slot, _key, data_off, _size = _dir_entry(image, DIR_ITEM_KEY, b"hello.txt")
    struct.pack_into("<H", image.data, data_off + 27, name_len)
    image.fix_node_csum(leaf)
    image.save()
    expect_error("cat", image.path, "/hello.txt", words=("name", "dir", "corrupt"))


def test_oversized_data_len_in_xattr_or_dir_item(image, tmp_path):
    leaf, _slot, _key, data_off, _size = _dir_entry(image, DIR_INDEX_KEY, b"dir")
    struct.pack_into("<H", image.data, data_off + 25, 0xFFFF)
    image.fix_node_csum(leaf)
    image.save()
    expect_survives("ls", "-l", image.path, "/")
    expect_survives("extract", image.path, "/", str(tmp_path / "out"))


def test_oversized_inode_ref_name(image, tmp_path):
    root = image.tree_root(FS_TREE_OBJECTID)
    leaf, _slot, _key, data_off, _size = image.find_item(
        root, lambda k, d, s: k[1] == INODE_REF_KEY and k[0] > 256)
    struct.pack_into("<H", image.data, data_off + 8, 0xFFFF)
    image.fix_node_csum(leaf)
    image.save()
    expect_survives("ls", "-l", image.path, "/")
    expect_survives("extract", image.path, "/", str(tmp_path / "out"))


# ---- file extents --------------------------------------------------------------------------

EXTENT_DAMAGE = ["inline-ram-huge", "type-bad", "compression-bad", "disk-bytenr-unmapped",
                 "offset-huge", "num-bytes-huge", "item-short"]


@pytest.mark.parametrize("how", EXTENT_DAMAGE)
def test_bad_file_extent(image, tmp_path, how):
    root = image.tree_root(FS_TREE_OBJECTID)
    inline = how.startswith("inline") or how in ("type-bad", "compression-bad", "item-short")

    def pred(key, data_off, size):
        if key[1] != EXTENT_DATA_KEY:
            return False
        is_inline = image.data[data_off + 20] == 0
        return is_inline == inline
    leaf, slot, _key, data_off, size = image.find_item(root, pred)
    # file_extent_item: generation 8, ram_bytes 8, compression 1, encryption 1,
    # other_encoding 2, type 1 (= 21 bytes); then disk_bytenr, disk_num_bytes, offset, num_bytes
    if how == "inline-ram-huge":
        struct.pack_into("<Q", image.data, data_off + 8, 1 << 40)
    elif how == "type-bad":
        image.data[data_off + 20] = 7
    elif how == "compression-bad":
        image.data[data_off + 16] = 9
    elif how == "disk-bytenr-unmapped":
        struct.pack_into("<Q", image.data, data_off + 21, 1 << 50)
    elif how == "offset-huge":
        struct.pack_into("<Q", image.data, data_off + 37, (1 << 64) - 4096)
    elif how == "num-bytes-huge":
        struct.pack_into("<Q", image.data, data_off + 45, (1 << 64) - 4096)
    elif how == "item-short":
        struct.pack_into("<I", image.data, leaf + HEADER_SIZE + slot * ITEM_SIZE + 21, 10)
        # keep the leaf's data contiguous: the item now claims fewer bytes than it spans,
        # which node validation must reject (or the parser must catch)
    image.fix_node_csum(leaf)
    image.save()
    walk_fails(image.path, tmp_path)
