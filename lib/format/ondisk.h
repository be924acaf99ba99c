/*
 * ondisk.h — the btrfs on-disk format: packed little-endian structs, item key
 * types, object ids and flag bits. Nothing here does I/O or allocates.
 *
 * Rules:
 *  1. Every multi-byte field on disk is little-endian and declared with an
 *     le16/le32/le64 type; code reads it only through the accessors at the end
 *     of this file (or get_le*() on a raw pointer), never by dereferencing.
 *  2. struct btrfs_disk_key is the on-disk key; struct btrfs_key (CPU order) is
 *     a different type. Convert with btrfs_disk_to_cpu_key()/btrfs_cpu_to_disk_key().
 *  3. Sizes are asserted at compile time below: if a struct changes size the
 *     build breaks, because every image on earth depends on these numbers.
 *
 * The superblock layout (4096 bytes, at 64 KiB, 64 MiB and 256 GiB):
 *
 *   OFFSET  SIZE  FIELD
 *   0x000     32  csum (of bytes 0x20..0xfff)
 *   0x020     16  fsid
 *   0x030      8  bytenr (physical address of this copy)
 *   0x038      8  flags
 *   0x040      8  magic "_BHRfS_M"
 *   0x048      8  generation
 *   0x050      8  root (logical address of the root tree root)
 *   0x058      8  chunk_root
 *   0x060      8  log_root
 *   0x068      8  (unused, was log_root_transid)
 *   0x070      8  total_bytes
 *   0x078      8  bytes_used
 *   0x080      8  root_dir_objectid (6)
 *   0x088      8  num_devices
 *   0x090      4  sectorsize
 *   0x094      4  nodesize
 *   0x098      4  (unused, was leafsize)
 *   0x09c      4  stripesize
 *   0x0a0      4  sys_chunk_array_size
 *   0x0a4      8  chunk_root_generation
 *   0x0ac      8  compat_flags
 *   0x0b4      8  compat_ro_flags
 *   0x0bc      8  incompat_flags
 *   0x0c4      2  csum_type
 *   0x0c6      1  root_level
 *   0x0c7      1  chunk_root_level
 *   0x0c8      1  log_root_level
 *   0x0c9     98  dev_item (this device)
 *   0x12b    256  label
 *   0x22b      8  cache_generation
 *   0x233      8  uuid_tree_generation
 *   0x23b     16  metadata_uuid
 *   0x24b      8  nr_global_roots
 *   0x253    216  reserved
 *   0x32b   2048  sys_chunk_array (disk_key + chunk, repeated)
 *   0xb2b    672  super_roots[4] (backup roots)
 *   0xdcb    565  padding
 */
#ifndef BUTTER_FORMAT_ONDISK_H
#define BUTTER_FORMAT_ONDISK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <endian.h>

typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;
typedef int64_t s64;

/* Little-endian storage types: distinct names so a reader sees what is raw. */
typedef uint16_t le16;
typedef uint32_t le32;
typedef uint64_t le64;

#define BTRFS_PACKED __attribute__((__packed__))

/* ---- constants ---------------------------------------------------------- */

#define BTRFS_MAGIC 0x4d5f53665248425fULL /* "_BHRfS_M" */
#define BTRFS_SUPER_INFO_OFFSET 65536ULL
#define BTRFS_SUPER_INFO_SIZE 4096
#define BTRFS_SUPER_MIRROR_MAX 3
#define BTRFS_SUPER_MIRROR_SHIFT 12
#define BTRFS_SYSTEM_CHUNK_ARRAY_SIZE 2048
#define BTRFS_NUM_BACKUP_ROOTS 4
#define BTRFS_CSUM_SIZE 32
#define BTRFS_FSID_SIZE 16
#define BTRFS_UUID_SIZE 16
#define BTRFS_LABEL_SIZE 256
#define BTRFS_MAX_LEVEL 8
#define BTRFS_NAME_LEN 255
#define BTRFS_STRIPE_LEN 65536ULL
#define BTRFS_MIN_SECTORSIZE 4096
#define BTRFS_MAX_SECTORSIZE 65536
#define BTRFS_MAX_NODESIZE 65536

/* Physical offset of superblock copy @mirror (0, 1, 2): 64K, 64M, 256G. */
static inline u64 btrfs_sb_offset(int mirror)
{
	u64 start = 16 * 1024;
	if (mirror)
		return start << (BTRFS_SUPER_MIRROR_SHIFT * mirror);
	return BTRFS_SUPER_INFO_OFFSET;
}

/* checksum algorithms */
#define BTRFS_CSUM_TYPE_CRC32 0
#define BTRFS_CSUM_TYPE_XXHASH 1
#define BTRFS_CSUM_TYPE_SHA256 2
#define BTRFS_CSUM_TYPE_BLAKE2 3

/* object ids */
#define BTRFS_ROOT_TREE_OBJECTID 1ULL
#define BTRFS_EXTENT_TREE_OBJECTID 2ULL
#define BTRFS_CHUNK_TREE_OBJECTID 3ULL
#define BTRFS_DEV_TREE_OBJECTID 4ULL
#define BTRFS_FS_TREE_OBJECTID 5ULL
#define BTRFS_ROOT_TREE_DIR_OBJECTID 6ULL
#define BTRFS_CSUM_TREE_OBJECTID 7ULL
#define BTRFS_QUOTA_TREE_OBJECTID 8ULL
#define BTRFS_UUID_TREE_OBJECTID 9ULL
#define BTRFS_FREE_SPACE_TREE_OBJECTID 10ULL
#define BTRFS_BLOCK_GROUP_TREE_OBJECTID 11ULL
#define BTRFS_DEV_STATS_OBJECTID 0ULL
#define BTRFS_BALANCE_OBJECTID ((u64)-4)
#define BTRFS_ORPHAN_OBJECTID ((u64)-5)
#define BTRFS_TREE_LOG_OBJECTID ((u64)-6)
#define BTRFS_TREE_LOG_FIXUP_OBJECTID ((u64)-7)
#define BTRFS_TREE_RELOC_OBJECTID ((u64)-8)
#define BTRFS_DATA_RELOC_TREE_OBJECTID ((u64)-9)
#define BTRFS_EXTENT_CSUM_OBJECTID ((u64)-10)
#define BTRFS_FREE_SPACE_OBJECTID ((u64)-11)
#define BTRFS_FREE_INO_OBJECTID ((u64)-12)
#define BTRFS_MULTIPLE_OBJECTIDS ((u64)-255)
#define BTRFS_FIRST_FREE_OBJECTID 256ULL
#define BTRFS_LAST_FREE_OBJECTID ((u64)-256)
#define BTRFS_FIRST_CHUNK_TREE_OBJECTID 256ULL
#define BTRFS_DEV_ITEMS_OBJECTID 1ULL
#define BTRFS_BTREE_INODE_OBJECTID 1ULL
#define BTRFS_EMPTY_SUBVOL_DIR_OBJECTID 2ULL

/* item key types */
#define BTRFS_INODE_ITEM_KEY 1
#define BTRFS_INODE_REF_KEY 12
#define BTRFS_INODE_EXTREF_KEY 13
#define BTRFS_XATTR_ITEM_KEY 24
#define BTRFS_VERITY_DESC_ITEM_KEY 36
#define BTRFS_VERITY_MERKLE_ITEM_KEY 37
#define BTRFS_ORPHAN_ITEM_KEY 48
#define BTRFS_DIR_LOG_ITEM_KEY 60
#define BTRFS_DIR_LOG_INDEX_KEY 72
#define BTRFS_DIR_ITEM_KEY 84
#define BTRFS_DIR_INDEX_KEY 96
#define BTRFS_EXTENT_DATA_KEY 108
#define BTRFS_EXTENT_CSUM_KEY 128
#define BTRFS_ROOT_ITEM_KEY 132
#define BTRFS_ROOT_BACKREF_KEY 144
#define BTRFS_ROOT_REF_KEY 156
#define BTRFS_EXTENT_ITEM_KEY 168
#define BTRFS_METADATA_ITEM_KEY 169
#define BTRFS_EXTENT_OWNER_REF_KEY 172
#define BTRFS_TREE_BLOCK_REF_KEY 176
#define BTRFS_EXTENT_DATA_REF_KEY 178
#define BTRFS_SHARED_BLOCK_REF_KEY 182
#define BTRFS_SHARED_DATA_REF_KEY 184
#define BTRFS_BLOCK_GROUP_ITEM_KEY 192
#define BTRFS_FREE_SPACE_INFO_KEY 198
#define BTRFS_FREE_SPACE_EXTENT_KEY 199
#define BTRFS_FREE_SPACE_BITMAP_KEY 200
#define BTRFS_DEV_EXTENT_KEY 204
#define BTRFS_DEV_ITEM_KEY 216
#define BTRFS_CHUNK_ITEM_KEY 228
#define BTRFS_QGROUP_STATUS_KEY 240
#define BTRFS_QGROUP_INFO_KEY 242
#define BTRFS_QGROUP_LIMIT_KEY 244
#define BTRFS_QGROUP_RELATION_KEY 246
#define BTRFS_TEMPORARY_ITEM_KEY 248
#define BTRFS_PERSISTENT_ITEM_KEY 249

/*
 * Device statistics: item (BTRFS_DEV_STATS_OBJECTID, BTRFS_PERSISTENT_ITEM_KEY,
 * devid) in the device tree, BTRFS_DEV_STAT_VALUES_MAX __le64 counters in this
 * order (an older, shorter item holds a prefix of them).
 */
#define BTRFS_DEV_STAT_WRITE_ERRS 0      /* a write failed (I/O error) */
#define BTRFS_DEV_STAT_READ_ERRS 1       /* a read failed */
#define BTRFS_DEV_STAT_FLUSH_ERRS 2      /* a flush failed */
#define BTRFS_DEV_STAT_CORRUPTION_ERRS 3 /* checksum, bytenr or other header mismatch */
#define BTRFS_DEV_STAT_GENERATION_ERRS 4 /* a tree block older than its parent expects */
#define BTRFS_DEV_STAT_VALUES_MAX 5
#define BTRFS_DEV_REPLACE_KEY 250
#define BTRFS_UUID_KEY_SUBVOL 251
#define BTRFS_UUID_KEY_RECEIVED_SUBVOL 252
#define BTRFS_STRING_ITEM_KEY 253

/* directory entry types (struct btrfs_dir_item.type) */
/* Inode item flags (btrfs_inode_item.flags), as the kernel defines them. */
#define BTRFS_INODE_NODATASUM_FLAG (1ULL << 0)
#define BTRFS_INODE_NODATACOW_FLAG (1ULL << 1)
#define BTRFS_INODE_READONLY_FLAG (1ULL << 2)
#define BTRFS_INODE_NOCOMPRESS_FLAG (1ULL << 3)
#define BTRFS_INODE_PREALLOC_FLAG (1ULL << 4)
#define BTRFS_INODE_SYNC_FLAG (1ULL << 5)
#define BTRFS_INODE_IMMUTABLE_FLAG (1ULL << 6)
#define BTRFS_INODE_APPEND_FLAG (1ULL << 7)
#define BTRFS_INODE_NODUMP_FLAG (1ULL << 8)
#define BTRFS_INODE_NOATIME_FLAG (1ULL << 9)
#define BTRFS_INODE_DIRSYNC_FLAG (1ULL << 10)
#define BTRFS_INODE_COMPRESS_FLAG (1ULL << 11)

#define BTRFS_FT_UNKNOWN 0
#define BTRFS_FT_REG_FILE 1
#define BTRFS_FT_DIR 2
#define BTRFS_FT_CHRDEV 3
#define BTRFS_FT_BLKDEV 4
#define BTRFS_FT_FIFO 5
#define BTRFS_FT_SOCK 6
#define BTRFS_FT_SYMLINK 7
#define BTRFS_FT_XATTR 8
#define BTRFS_FT_MAX 9
#define BTRFS_FT_ENCRYPTED 0x80

/* superblock flags */
#define BTRFS_SUPER_FLAG_ERROR (1ULL << 2)
#define BTRFS_SUPER_FLAG_SEEDING (1ULL << 32)
#define BTRFS_SUPER_FLAG_METADUMP (1ULL << 33)
#define BTRFS_SUPER_FLAG_METADUMP_V2 (1ULL << 34)
#define BTRFS_SUPER_FLAG_CHANGING_FSID (1ULL << 35)
#define BTRFS_SUPER_FLAG_CHANGING_FSID_V2 (1ULL << 36)

/* incompat features */
#define BTRFS_FEATURE_INCOMPAT_MIXED_BACKREF (1ULL << 0)
#define BTRFS_FEATURE_INCOMPAT_DEFAULT_SUBVOL (1ULL << 1)
#define BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS (1ULL << 2)
#define BTRFS_FEATURE_INCOMPAT_COMPRESS_LZO (1ULL << 3)
#define BTRFS_FEATURE_INCOMPAT_COMPRESS_ZSTD (1ULL << 4)
#define BTRFS_FEATURE_INCOMPAT_BIG_METADATA (1ULL << 5)
#define BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF (1ULL << 6)
#define BTRFS_FEATURE_INCOMPAT_RAID56 (1ULL << 7)
#define BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA (1ULL << 8)
#define BTRFS_FEATURE_INCOMPAT_NO_HOLES (1ULL << 9)
#define BTRFS_FEATURE_INCOMPAT_METADATA_UUID (1ULL << 10)
#define BTRFS_FEATURE_INCOMPAT_RAID1C34 (1ULL << 11)
#define BTRFS_FEATURE_INCOMPAT_ZONED (1ULL << 12)
#define BTRFS_FEATURE_INCOMPAT_EXTENT_TREE_V2 (1ULL << 13)
#define BTRFS_FEATURE_INCOMPAT_RAID_STRIPE_TREE (1ULL << 14)
#define BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA (1ULL << 16)

/* compat_ro features */
#define BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE (1ULL << 0)
#define BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID (1ULL << 1)
#define BTRFS_FEATURE_COMPAT_RO_VERITY (1ULL << 2)
#define BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE (1ULL << 3)

/* node header flags; the top byte of header.flags is the backref revision */
#define BTRFS_HEADER_FLAG_WRITTEN (1ULL << 0)
#define BTRFS_HEADER_FLAG_RELOC (1ULL << 1)
#define BTRFS_BACKREF_REV_SHIFT 56
#define BTRFS_MIXED_BACKREF_REV 1

/* block group / chunk type bits */
#define BTRFS_BLOCK_GROUP_DATA (1ULL << 0)
#define BTRFS_BLOCK_GROUP_SYSTEM (1ULL << 1)
#define BTRFS_BLOCK_GROUP_METADATA (1ULL << 2)
#define BTRFS_BLOCK_GROUP_RAID0 (1ULL << 3)
#define BTRFS_BLOCK_GROUP_RAID1 (1ULL << 4)
#define BTRFS_BLOCK_GROUP_DUP (1ULL << 5)
#define BTRFS_BLOCK_GROUP_RAID10 (1ULL << 6)
#define BTRFS_BLOCK_GROUP_RAID5 (1ULL << 7)
#define BTRFS_BLOCK_GROUP_RAID6 (1ULL << 8)
#define BTRFS_BLOCK_GROUP_RAID1C3 (1ULL << 9)
#define BTRFS_BLOCK_GROUP_RAID1C4 (1ULL << 10)
#define BTRFS_BLOCK_GROUP_TYPE_MASK \
	(BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_SYSTEM | BTRFS_BLOCK_GROUP_METADATA)
#define BTRFS_BLOCK_GROUP_RAID56_MASK (BTRFS_BLOCK_GROUP_RAID5 | BTRFS_BLOCK_GROUP_RAID6)
#define BTRFS_BLOCK_GROUP_RAID1_MASK \
	(BTRFS_BLOCK_GROUP_RAID1 | BTRFS_BLOCK_GROUP_RAID1C3 | BTRFS_BLOCK_GROUP_RAID1C4)
#define BTRFS_BLOCK_GROUP_PROFILE_MASK                                              \
	(BTRFS_BLOCK_GROUP_RAID0 | BTRFS_BLOCK_GROUP_RAID1_MASK | BTRFS_BLOCK_GROUP_DUP | \
	 BTRFS_BLOCK_GROUP_RAID10 | BTRFS_BLOCK_GROUP_RAID56_MASK)
/* "single" spelled out where 0 would mean "no profile given" (balance args) */
#define BTRFS_AVAIL_ALLOC_BIT_SINGLE (1ULL << 48)

/* root item flags */
#define BTRFS_ROOT_SUBVOL_RDONLY (1ULL << 0)
#define BTRFS_ROOT_SUBVOL_DEAD (1ULL << 48) /* deletion under way */
/* in a root item's embedded inode flags: the root item's flags are valid (else a kernel clears them) */
#define BTRFS_INODE_ROOT_ITEM_INIT (1ULL << 31)

/* file extent types and compression */
#define BTRFS_FILE_EXTENT_INLINE 0
#define BTRFS_FILE_EXTENT_REG 1
#define BTRFS_FILE_EXTENT_PREALLOC 2
#define BTRFS_COMPRESS_NONE 0
#define BTRFS_COMPRESS_ZLIB 1
#define BTRFS_COMPRESS_LZO 2
#define BTRFS_COMPRESS_ZSTD 3
#define BTRFS_NR_COMPRESS_TYPES 4

/* extent item flags */
#define BTRFS_EXTENT_FLAG_DATA (1ULL << 0)
#define BTRFS_EXTENT_FLAG_TREE_BLOCK (1ULL << 1)
#define BTRFS_BLOCK_FLAG_FULL_BACKREF (1ULL << 8)

/* free space info flags */
#define BTRFS_FREE_SPACE_USING_BITMAPS (1U << 0)

/* ---- structs ------------------------------------------------------------ */

struct btrfs_disk_key {
	le64 objectid;
	u8 type;
	le64 offset;
} BTRFS_PACKED;

/* CPU-order key; compare with btrfs_comp_keys(). */
struct btrfs_key {
	u64 objectid;
	u8 type;
	u64 offset;
};

struct btrfs_header {
	u8 csum[BTRFS_CSUM_SIZE];
	u8 fsid[BTRFS_FSID_SIZE];
	le64 bytenr;
	le64 flags;
	u8 chunk_tree_uuid[BTRFS_UUID_SIZE];
	le64 generation;
	le64 owner;
	le32 nritems;
	u8 level;
} BTRFS_PACKED;

/* Leaf item header; offset is relative to the end of struct btrfs_header. */
struct btrfs_item {
	struct btrfs_disk_key key;
	le32 offset;
	le32 size;
} BTRFS_PACKED;

/* Internal node pointer. */
struct btrfs_key_ptr {
	struct btrfs_disk_key key;
	le64 blockptr;
	le64 generation;
} BTRFS_PACKED;

struct btrfs_dev_item {
	le64 devid;
	le64 total_bytes;
	le64 bytes_used;
	le32 io_align;
	le32 io_width;
	le32 sector_size;
	le64 type;
	le64 generation;
	le64 start_offset;
	le32 dev_group;
	u8 seek_speed;
	u8 bandwidth;
	u8 uuid[BTRFS_UUID_SIZE];
	u8 fsid[BTRFS_UUID_SIZE];
} BTRFS_PACKED;

struct btrfs_root_backup {
	le64 tree_root;
	le64 tree_root_gen;
	le64 chunk_root;
	le64 chunk_root_gen;
	le64 extent_root;
	le64 extent_root_gen;
	le64 fs_root;
	le64 fs_root_gen;
	le64 dev_root;
	le64 dev_root_gen;
	le64 csum_root;
	le64 csum_root_gen;
	le64 total_bytes;
	le64 bytes_used;
	le64 num_devices;
	le64 unused_64[4];
	u8 tree_root_level;
	u8 chunk_root_level;
	u8 extent_root_level;
	u8 fs_root_level;
	u8 dev_root_level;
	u8 csum_root_level;
	u8 unused_8[10];
} BTRFS_PACKED;

struct btrfs_super_block {
	u8 csum[BTRFS_CSUM_SIZE];
	u8 fsid[BTRFS_FSID_SIZE];
	le64 bytenr;
	le64 flags;
	le64 magic;
	le64 generation;
	le64 root;
	le64 chunk_root;
	le64 log_root;
	le64 unused_log_root_transid;
	le64 total_bytes;
	le64 bytes_used;
	le64 root_dir_objectid;
	le64 num_devices;
	le32 sectorsize;
	le32 nodesize;
	le32 unused_leafsize;
	le32 stripesize;
	le32 sys_chunk_array_size;
	le64 chunk_root_generation;
	le64 compat_flags;
	le64 compat_ro_flags;
	le64 incompat_flags;
	le16 csum_type;
	u8 root_level;
	u8 chunk_root_level;
	u8 log_root_level;
	struct btrfs_dev_item dev_item;
	char label[BTRFS_LABEL_SIZE];
	le64 cache_generation;
	le64 uuid_tree_generation;
	u8 metadata_uuid[BTRFS_FSID_SIZE];
	le64 nr_global_roots;
	le64 reserved[27];
	u8 sys_chunk_array[BTRFS_SYSTEM_CHUNK_ARRAY_SIZE];
	struct btrfs_root_backup super_roots[BTRFS_NUM_BACKUP_ROOTS];
	u8 padding[565];
} BTRFS_PACKED;

struct btrfs_stripe {
	le64 devid;
	le64 offset;
	u8 dev_uuid[BTRFS_UUID_SIZE];
} BTRFS_PACKED;

/* A chunk item; num_stripes stripes follow, the first one inline. */
struct btrfs_chunk {
	le64 length;
	le64 owner;
	le64 stripe_len;
	le64 type;
	le32 io_align;
	le32 io_width;
	le32 sector_size;
	le16 num_stripes;
	le16 sub_stripes;
	struct btrfs_stripe stripe;
} BTRFS_PACKED;

/* Stripe @i of a chunk item (the array continues past the struct). */
static inline struct btrfs_stripe *btrfs_chunk_stripe(const struct btrfs_chunk *c, unsigned i)
{
	return (struct btrfs_stripe *)((uintptr_t)c + offsetof(struct btrfs_chunk, stripe) +
				       i * sizeof(struct btrfs_stripe));
}

static inline size_t btrfs_chunk_item_size(unsigned num_stripes)
{
	return sizeof(struct btrfs_chunk) + (num_stripes - 1) * sizeof(struct btrfs_stripe);
}

struct btrfs_dev_extent {
	le64 chunk_tree;
	le64 chunk_objectid;
	le64 chunk_offset;
	le64 length;
	u8 chunk_tree_uuid[BTRFS_UUID_SIZE];
} BTRFS_PACKED;

struct btrfs_timespec {
	le64 sec;
	le32 nsec;
} BTRFS_PACKED;

struct btrfs_inode_item {
	le64 generation;
	le64 transid;
	le64 size;
	le64 nbytes;
	le64 block_group;
	le32 nlink;
	le32 uid;
	le32 gid;
	le32 mode;
	le64 rdev;
	le64 flags;
	le64 sequence;
	le64 reserved[4];
	struct btrfs_timespec atime;
	struct btrfs_timespec ctime;
	struct btrfs_timespec mtime;
	struct btrfs_timespec otime;
} BTRFS_PACKED;

/* INODE_REF: key (ino, INODE_REF, parent dir ino); entries repeat in one item. */
struct btrfs_inode_ref {
	le64 index;
	le16 name_len;
	/* name follows */
} BTRFS_PACKED;

/* INODE_EXTREF: key (ino, INODE_EXTREF, hash(parent, name)); entries repeat. */
struct btrfs_inode_extref {
	le64 parent_objectid;
	le64 index;
	le16 name_len;
	/* name follows */
} BTRFS_PACKED;

/* DIR_ITEM / DIR_INDEX / XATTR_ITEM entry: name then data_len bytes follow. */
struct btrfs_dir_item {
	struct btrfs_disk_key location;
	le64 transid;
	le16 data_len;
	le16 name_len;
	u8 type;
} BTRFS_PACKED;

struct btrfs_root_item {
	struct btrfs_inode_item inode;
	le64 generation;
	le64 root_dirid;
	le64 bytenr;
	le64 byte_limit;
	le64 bytes_used;
	le64 last_snapshot;
	le64 flags;
	le32 refs;
	struct btrfs_disk_key drop_progress;
	u8 drop_level;
	u8 level;
	/* the fields below are valid only when generation_v2 == generation */
	le64 generation_v2;
	u8 uuid[BTRFS_UUID_SIZE];
	u8 parent_uuid[BTRFS_UUID_SIZE];
	u8 received_uuid[BTRFS_UUID_SIZE];
	le64 ctransid;
	le64 otransid;
	le64 stransid;
	le64 rtransid;
	struct btrfs_timespec ctime;
	struct btrfs_timespec otime;
	struct btrfs_timespec stime;
	struct btrfs_timespec rtime;
	le64 reserved[8];
} BTRFS_PACKED;

/* The part of a root item written by old kernels (before generation_v2). */
#define BTRFS_ROOT_ITEM_V1_SIZE offsetof(struct btrfs_root_item, generation_v2)

/*
 * The balance in progress: item (BALANCE_OBJECTID, TEMPORARY_ITEM, 0) in the
 * root tree, written when a balance starts and deleted when it ends, is
 * cancelled or fails; a paused or interrupted one keeps it, and the next
 * mount (kernel) or `butter balance resume` goes on with these arguments.
 */
#define BTRFS_BALANCE_ITEM_DATA (1ULL << 0)
#define BTRFS_BALANCE_ITEM_SYSTEM (1ULL << 1)
#define BTRFS_BALANCE_ITEM_METADATA (1ULL << 2)
#define BTRFS_BALANCE_ITEM_FORCE (1ULL << 3)
#define BTRFS_BALANCE_ITEM_RESUME (1ULL << 4)

#define BTRFS_BALANCE_ARGS_PROFILES (1ULL << 0)
#define BTRFS_BALANCE_ARGS_USAGE (1ULL << 1)       /* usage: 0..N (one u64) */
#define BTRFS_BALANCE_ARGS_DEVID (1ULL << 2)
#define BTRFS_BALANCE_ARGS_DRANGE (1ULL << 3)
#define BTRFS_BALANCE_ARGS_VRANGE (1ULL << 4)
#define BTRFS_BALANCE_ARGS_LIMIT (1ULL << 5)       /* limit: one u64 */
#define BTRFS_BALANCE_ARGS_LIMIT_RANGE (1ULL << 6)
#define BTRFS_BALANCE_ARGS_STRIPES_RANGE (1ULL << 7)
#define BTRFS_BALANCE_ARGS_CONVERT (1ULL << 8)
#define BTRFS_BALANCE_ARGS_SOFT (1ULL << 9)
#define BTRFS_BALANCE_ARGS_USAGE_RANGE (1ULL << 10)

struct btrfs_disk_balance_args {
	le64 profiles;
	le32 usage_min;      /* with USAGE alone these two are one u64: usage */
	le32 usage_max;
	le64 devid;
	le64 pstart, pend;   /* [pstart, pend) on devid */
	le64 vstart, vend;   /* [vstart, vend) logical */
	le64 target;         /* convert to; single is AVAIL_ALLOC_BIT_SINGLE */
	le64 flags;          /* BTRFS_BALANCE_ARGS_* */
	le32 limit_min;      /* with LIMIT alone these two are one u64: limit */
	le32 limit_max;
	le32 stripes_min, stripes_max;
	le64 unused[6];
} BTRFS_PACKED;

struct btrfs_balance_item {
	le64 flags;          /* BTRFS_BALANCE_ITEM_* */
	struct btrfs_disk_balance_args data, meta, sys;
	le64 unused[4];
} BTRFS_PACKED;

/* ROOT_REF (parent, ROOT_REF, child) and ROOT_BACKREF (child, ROOT_BACKREF, parent). */
struct btrfs_root_ref {
	le64 dirid;
	le64 sequence;
	le16 name_len;
	/* name follows */
} BTRFS_PACKED;

/*
 * The quota tree (objectid 8), all keys with objectid 0:
 *   (0, QGROUP_STATUS, 0)          one btrfs_qgroup_status_item
 *   (0, QGROUP_INFO, qgroupid)     the counts of one qgroup
 *   (0, QGROUP_LIMIT, qgroupid)    its limits
 * and (child, QGROUP_RELATION, parent), (parent, QGROUP_RELATION, child).
 * A qgroupid is level << 48 | id; level 0 qgroups are subvolumes (id = tree id).
 */
#define BTRFS_QGROUP_LEVEL_SHIFT 48
#define BTRFS_QGROUP_STATUS_FLAG_ON (1ULL << 0)
#define BTRFS_QGROUP_STATUS_FLAG_RESCAN (1ULL << 1)
#define BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT (1ULL << 2) /* counts stale: rescan */

struct btrfs_qgroup_status_item {
	le64 version;     /* 1 */
	le64 generation;  /* the commit that last wrote the qgroups */
	le64 flags;       /* BTRFS_QGROUP_STATUS_FLAG_* */
	le64 rescan;      /* progress of a running rescan (a logical address) */
} BTRFS_PACKED;

struct btrfs_qgroup_info_item {
	le64 generation;
	le64 rfer;
	le64 rfer_cmpr;
	le64 excl;
	le64 excl_cmpr;
} BTRFS_PACKED;

struct btrfs_qgroup_limit_item {
	le64 flags;
	le64 max_rfer;
	le64 max_excl;
	le64 rsv_rfer;
	le64 rsv_excl;
} BTRFS_PACKED;

struct btrfs_file_extent_item {
	le64 generation;
	le64 ram_bytes;
	u8 compression;
	u8 encryption;
	le16 other_encoding;
	u8 type;
	/* inline data starts here for BTRFS_FILE_EXTENT_INLINE */
	le64 disk_bytenr;
	le64 disk_num_bytes;
	le64 offset;
	le64 num_bytes;
} BTRFS_PACKED;

#define BTRFS_FILE_EXTENT_INLINE_DATA_START offsetof(struct btrfs_file_extent_item, disk_bytenr)

struct btrfs_extent_item {
	le64 refs;
	le64 generation;
	le64 flags;
} BTRFS_PACKED;

struct btrfs_tree_block_info {
	struct btrfs_disk_key key;
	u8 level;
} BTRFS_PACKED;

struct btrfs_extent_inline_ref {
	u8 type;
	le64 offset;
} BTRFS_PACKED;

struct btrfs_extent_data_ref {
	le64 root;
	le64 objectid;
	le64 offset;
	le32 count;
} BTRFS_PACKED;

struct btrfs_shared_data_ref {
	le32 count;
} BTRFS_PACKED;

struct btrfs_block_group_item {
	le64 used;
	le64 chunk_objectid;
	le64 flags;
} BTRFS_PACKED;

struct btrfs_free_space_info {
	le32 extent_count;
	le32 flags;
} BTRFS_PACKED;

/* ---- size checks -------------------------------------------------------- */

_Static_assert(sizeof(struct btrfs_disk_key) == 17, "disk_key");
_Static_assert(sizeof(struct btrfs_header) == 101, "header");
_Static_assert(sizeof(struct btrfs_item) == 25, "item");
_Static_assert(sizeof(struct btrfs_disk_balance_args) == 136, "disk_balance_args");
_Static_assert(sizeof(struct btrfs_balance_item) == 448, "balance_item");
_Static_assert(sizeof(struct btrfs_key_ptr) == 33, "key_ptr");
_Static_assert(sizeof(struct btrfs_dev_item) == 98, "dev_item");
_Static_assert(sizeof(struct btrfs_root_backup) == 168, "root_backup");
_Static_assert(sizeof(struct btrfs_super_block) == 4096, "super_block");
_Static_assert(offsetof(struct btrfs_super_block, sys_chunk_array) == 0x32b, "sys_chunk_array");
_Static_assert(offsetof(struct btrfs_super_block, label) == 0x12b, "label");
_Static_assert(sizeof(struct btrfs_stripe) == 32, "stripe");
_Static_assert(sizeof(struct btrfs_chunk) == 80, "chunk");
_Static_assert(sizeof(struct btrfs_inode_item) == 160, "inode_item");
_Static_assert(sizeof(struct btrfs_dir_item) == 30, "dir_item");
_Static_assert(sizeof(struct btrfs_root_item) == 439, "root_item");
_Static_assert(sizeof(struct btrfs_file_extent_item) == 53, "file_extent_item");
_Static_assert(BTRFS_FILE_EXTENT_INLINE_DATA_START == 21, "inline start");
_Static_assert(sizeof(struct btrfs_dev_extent) == 48, "dev_extent");
_Static_assert(sizeof(struct btrfs_extent_item) == 24, "extent_item");

/* ---- accessors ---------------------------------------------------------- */

static inline u16 get_le16(const void *p) { u16 v; memcpy(&v, p, 2); return le16toh(v); }
static inline u32 get_le32(const void *p) { u32 v; memcpy(&v, p, 4); return le32toh(v); }
static inline u64 get_le64(const void *p) { u64 v; memcpy(&v, p, 8); return le64toh(v); }
static inline void put_le16(void *p, u16 v) { v = htole16(v); memcpy(p, &v, 2); }
static inline void put_le32(void *p, u32 v) { v = htole32(v); memcpy(p, &v, 4); }
static inline void put_le64(void *p, u64 v) { v = htole64(v); memcpy(p, &v, 8); }

#define BTRFS_GET_LE(bits, p) get_le##bits(p)

/*
 * BTRFS_ACCESSOR(name, type, field, bits) defines
 *   u<bits> btrfs_<name>(const type *s)  and  void btrfs_set_<name>(type *s, u<bits> v)
 * The width is checked against the field at compile time.
 */
#define BTRFS_ACCESSOR(name, type, field, bits)                                   \
	static inline u##bits btrfs_##name(const type *s)                             \
	{                                                                             \
		_Static_assert(sizeof(((type *)0)->field) == (bits) / 8, #name " width"); \
		return get_le##bits(&s->field);                                           \
	}                                                                             \
	static inline void btrfs_set_##name(type *s, u##bits v)                       \
	{                                                                             \
		put_le##bits(&s->field, v);                                               \
	}

static inline u8 get_u8(const void *p) { return *(const u8 *)p; }

BTRFS_ACCESSOR(super_bytenr, struct btrfs_super_block, bytenr, 64)
BTRFS_ACCESSOR(super_flags, struct btrfs_super_block, flags, 64)
BTRFS_ACCESSOR(super_magic, struct btrfs_super_block, magic, 64)
BTRFS_ACCESSOR(super_generation, struct btrfs_super_block, generation, 64)
BTRFS_ACCESSOR(super_root, struct btrfs_super_block, root, 64)
BTRFS_ACCESSOR(super_chunk_root, struct btrfs_super_block, chunk_root, 64)
BTRFS_ACCESSOR(super_log_root, struct btrfs_super_block, log_root, 64)
BTRFS_ACCESSOR(super_total_bytes, struct btrfs_super_block, total_bytes, 64)
BTRFS_ACCESSOR(super_bytes_used, struct btrfs_super_block, bytes_used, 64)
BTRFS_ACCESSOR(super_root_dir, struct btrfs_super_block, root_dir_objectid, 64)
BTRFS_ACCESSOR(super_num_devices, struct btrfs_super_block, num_devices, 64)
BTRFS_ACCESSOR(super_sectorsize, struct btrfs_super_block, sectorsize, 32)
BTRFS_ACCESSOR(super_nodesize, struct btrfs_super_block, nodesize, 32)
BTRFS_ACCESSOR(super_stripesize, struct btrfs_super_block, stripesize, 32)
BTRFS_ACCESSOR(super_sys_array_size, struct btrfs_super_block, sys_chunk_array_size, 32)
BTRFS_ACCESSOR(super_chunk_root_generation, struct btrfs_super_block, chunk_root_generation, 64)
BTRFS_ACCESSOR(super_compat_flags, struct btrfs_super_block, compat_flags, 64)
BTRFS_ACCESSOR(super_compat_ro_flags, struct btrfs_super_block, compat_ro_flags, 64)
BTRFS_ACCESSOR(super_incompat_flags, struct btrfs_super_block, incompat_flags, 64)
BTRFS_ACCESSOR(super_csum_type, struct btrfs_super_block, csum_type, 16)
BTRFS_ACCESSOR(super_cache_generation, struct btrfs_super_block, cache_generation, 64)
BTRFS_ACCESSOR(super_uuid_tree_generation, struct btrfs_super_block, uuid_tree_generation, 64)

BTRFS_ACCESSOR(header_bytenr, struct btrfs_header, bytenr, 64)
BTRFS_ACCESSOR(header_flags, struct btrfs_header, flags, 64)
BTRFS_ACCESSOR(header_generation, struct btrfs_header, generation, 64)
BTRFS_ACCESSOR(header_owner, struct btrfs_header, owner, 64)
BTRFS_ACCESSOR(header_nritems, struct btrfs_header, nritems, 32)

BTRFS_ACCESSOR(item_offset, struct btrfs_item, offset, 32)
BTRFS_ACCESSOR(item_size, struct btrfs_item, size, 32)
BTRFS_ACCESSOR(key_ptr_blockptr, struct btrfs_key_ptr, blockptr, 64)
BTRFS_ACCESSOR(key_ptr_generation, struct btrfs_key_ptr, generation, 64)

BTRFS_ACCESSOR(dev_item_devid, struct btrfs_dev_item, devid, 64)
BTRFS_ACCESSOR(dev_item_total_bytes, struct btrfs_dev_item, total_bytes, 64)
BTRFS_ACCESSOR(dev_item_bytes_used, struct btrfs_dev_item, bytes_used, 64)
BTRFS_ACCESSOR(dev_item_generation, struct btrfs_dev_item, generation, 64)

BTRFS_ACCESSOR(chunk_length, struct btrfs_chunk, length, 64)
BTRFS_ACCESSOR(chunk_owner, struct btrfs_chunk, owner, 64)
BTRFS_ACCESSOR(chunk_stripe_len, struct btrfs_chunk, stripe_len, 64)
BTRFS_ACCESSOR(chunk_type, struct btrfs_chunk, type, 64)
BTRFS_ACCESSOR(chunk_sector_size, struct btrfs_chunk, sector_size, 32)
BTRFS_ACCESSOR(chunk_num_stripes, struct btrfs_chunk, num_stripes, 16)
BTRFS_ACCESSOR(chunk_sub_stripes, struct btrfs_chunk, sub_stripes, 16)
BTRFS_ACCESSOR(stripe_devid, struct btrfs_stripe, devid, 64)
BTRFS_ACCESSOR(stripe_offset, struct btrfs_stripe, offset, 64)

BTRFS_ACCESSOR(timespec_sec, struct btrfs_timespec, sec, 64)
BTRFS_ACCESSOR(timespec_nsec, struct btrfs_timespec, nsec, 32)

BTRFS_ACCESSOR(inode_generation, struct btrfs_inode_item, generation, 64)
BTRFS_ACCESSOR(inode_transid, struct btrfs_inode_item, transid, 64)
BTRFS_ACCESSOR(inode_size, struct btrfs_inode_item, size, 64)
BTRFS_ACCESSOR(inode_nbytes, struct btrfs_inode_item, nbytes, 64)
BTRFS_ACCESSOR(inode_nlink, struct btrfs_inode_item, nlink, 32)
BTRFS_ACCESSOR(inode_uid, struct btrfs_inode_item, uid, 32)
BTRFS_ACCESSOR(inode_gid, struct btrfs_inode_item, gid, 32)
BTRFS_ACCESSOR(inode_mode, struct btrfs_inode_item, mode, 32)
BTRFS_ACCESSOR(inode_rdev, struct btrfs_inode_item, rdev, 64)
BTRFS_ACCESSOR(inode_flags, struct btrfs_inode_item, flags, 64)
BTRFS_ACCESSOR(inode_sequence, struct btrfs_inode_item, sequence, 64)

BTRFS_ACCESSOR(inode_ref_index, struct btrfs_inode_ref, index, 64)
BTRFS_ACCESSOR(inode_ref_name_len, struct btrfs_inode_ref, name_len, 16)
BTRFS_ACCESSOR(inode_extref_parent, struct btrfs_inode_extref, parent_objectid, 64)
BTRFS_ACCESSOR(inode_extref_index, struct btrfs_inode_extref, index, 64)
BTRFS_ACCESSOR(inode_extref_name_len, struct btrfs_inode_extref, name_len, 16)

BTRFS_ACCESSOR(dir_transid, struct btrfs_dir_item, transid, 64)
BTRFS_ACCESSOR(dir_data_len, struct btrfs_dir_item, data_len, 16)
BTRFS_ACCESSOR(dir_name_len, struct btrfs_dir_item, name_len, 16)

BTRFS_ACCESSOR(root_generation, struct btrfs_root_item, generation, 64)
BTRFS_ACCESSOR(root_dirid, struct btrfs_root_item, root_dirid, 64)
BTRFS_ACCESSOR(root_bytenr, struct btrfs_root_item, bytenr, 64)
BTRFS_ACCESSOR(root_bytes_used, struct btrfs_root_item, bytes_used, 64)
BTRFS_ACCESSOR(root_last_snapshot, struct btrfs_root_item, last_snapshot, 64)
BTRFS_ACCESSOR(root_flags, struct btrfs_root_item, flags, 64)
BTRFS_ACCESSOR(root_refs, struct btrfs_root_item, refs, 32)
BTRFS_ACCESSOR(root_generation_v2, struct btrfs_root_item, generation_v2, 64)
BTRFS_ACCESSOR(root_ctransid, struct btrfs_root_item, ctransid, 64)
BTRFS_ACCESSOR(root_otransid, struct btrfs_root_item, otransid, 64)

BTRFS_ACCESSOR(root_ref_dirid, struct btrfs_root_ref, dirid, 64)
BTRFS_ACCESSOR(root_ref_sequence, struct btrfs_root_ref, sequence, 64)
BTRFS_ACCESSOR(root_ref_name_len, struct btrfs_root_ref, name_len, 16)

BTRFS_ACCESSOR(qgroup_status_generation, struct btrfs_qgroup_status_item, generation, 64)
BTRFS_ACCESSOR(qgroup_status_flags, struct btrfs_qgroup_status_item, flags, 64)
BTRFS_ACCESSOR(qgroup_info_generation, struct btrfs_qgroup_info_item, generation, 64)
BTRFS_ACCESSOR(qgroup_info_rfer, struct btrfs_qgroup_info_item, rfer, 64)
BTRFS_ACCESSOR(qgroup_info_excl, struct btrfs_qgroup_info_item, excl, 64)

BTRFS_ACCESSOR(file_extent_generation, struct btrfs_file_extent_item, generation, 64)
BTRFS_ACCESSOR(file_extent_ram_bytes, struct btrfs_file_extent_item, ram_bytes, 64)
BTRFS_ACCESSOR(file_extent_other_encoding, struct btrfs_file_extent_item, other_encoding, 16)
BTRFS_ACCESSOR(file_extent_disk_bytenr, struct btrfs_file_extent_item, disk_bytenr, 64)
BTRFS_ACCESSOR(file_extent_disk_num_bytes, struct btrfs_file_extent_item, disk_num_bytes, 64)
BTRFS_ACCESSOR(file_extent_offset, struct btrfs_file_extent_item, offset, 64)
BTRFS_ACCESSOR(file_extent_num_bytes, struct btrfs_file_extent_item, num_bytes, 64)

BTRFS_ACCESSOR(extent_refs, struct btrfs_extent_item, refs, 64)
BTRFS_ACCESSOR(extent_generation, struct btrfs_extent_item, generation, 64)
BTRFS_ACCESSOR(extent_flags, struct btrfs_extent_item, flags, 64)

BTRFS_ACCESSOR(block_group_used, struct btrfs_block_group_item, used, 64)
BTRFS_ACCESSOR(block_group_chunk_objectid, struct btrfs_block_group_item, chunk_objectid, 64)
BTRFS_ACCESSOR(block_group_flags, struct btrfs_block_group_item, flags, 64)

BTRFS_ACCESSOR(dev_extent_chunk_offset, struct btrfs_dev_extent, chunk_offset, 64)
BTRFS_ACCESSOR(dev_extent_length, struct btrfs_dev_extent, length, 64)

/* ---- keys --------------------------------------------------------------- */

static inline void btrfs_disk_to_cpu_key(struct btrfs_key *cpu, const struct btrfs_disk_key *disk)
{
	cpu->objectid = get_le64(&disk->objectid);
	cpu->type = disk->type;
	cpu->offset = get_le64(&disk->offset);
}

static inline void btrfs_cpu_to_disk_key(struct btrfs_disk_key *disk, const struct btrfs_key *cpu)
{
	put_le64(&disk->objectid, cpu->objectid);
	disk->type = cpu->type;
	put_le64(&disk->offset, cpu->offset);
}

/* Compare two CPU keys: <0, 0, >0 as k1 sorts before, equal to, after k2. */
static inline int btrfs_comp_keys(const struct btrfs_key *k1, const struct btrfs_key *k2)
{
	if (k1->objectid != k2->objectid)
		return k1->objectid < k2->objectid ? -1 : 1;
	if (k1->type != k2->type)
		return k1->type < k2->type ? -1 : 1;
	if (k1->offset != k2->offset)
		return k1->offset < k2->offset ? -1 : 1;
	return 0;
}

#endif /* BUTTER_FORMAT_ONDISK_H */
