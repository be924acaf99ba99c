/*
 * checksum.h — the four btrfs checksum algorithms and the name hashes.
 *
 * Metadata blocks, superblocks and data sectors carry a checksum of the type
 * named in the superblock (csum_type). The digest is stored in the first
 * btrfs_csum_size() bytes of a 32-byte field, the rest zero.
 *   crc32c   4 bytes  standard CRC-32C (init ~0, final xor ~0), little-endian
 *   xxhash   8 bytes  XXH64 with seed 0, little-endian
 *   sha256  32 bytes  SHA-256
 *   blake2  32 bytes  BLAKE2b with a 256-bit digest, no key
 * Directory entries are keyed by btrfs_name_hash(); extended inode refs by
 * btrfs_extref_hash().
 */
#ifndef BUTTER_FORMAT_CHECKSUM_H
#define BUTTER_FORMAT_CHECKSUM_H

#include "format/ondisk.h"

/* Digest size in bytes of @csum_type, or 0 if the type is unknown. */
int btrfs_csum_size(u16 csum_type);

/* Name of @csum_type ("crc32c", "xxhash64", "sha256", "blake2b"), or NULL. */
const char *btrfs_csum_name(u16 csum_type);

/*
 * Compute the checksum of @len bytes at @data into @out (BTRFS_CSUM_SIZE
 * bytes, zero padded). Returns 0, or -EINVAL for an unknown type.
 */
int btrfs_csum_compute(u16 csum_type, const void *data, size_t len, u8 out[BTRFS_CSUM_SIZE]);

/* Raw CRC-32C update with no pre/post inversion (the kernel's crc32c()). */
u32 btrfs_crc32c_raw(u32 seed, const void *data, size_t len);

/* Hash of a name for DIR_ITEM and XATTR_ITEM key offsets. */
static inline u64 btrfs_name_hash(const char *name, size_t len)
{
	return btrfs_crc32c_raw((u32)~1, name, len);
}

/* Hash of (parent inode, name) for INODE_EXTREF key offsets. */
static inline u64 btrfs_extref_hash(u64 parent_objectid, const char *name, size_t len)
{
	return btrfs_crc32c_raw((u32)parent_objectid, name, len);
}

#endif
