/*
 * super.c — reading and validating superblocks.
 *
 * A device carries up to three copies (64 KiB, 64 MiB, 256 GiB); each is
 * checked on its own (magic, bytenr, checksum, sane sizes) and the valid copy
 * with the highest generation wins. A copy that fails is reported but does not
 * stop the open while another copy is good.
 *
 * Promises:
 *  1. btrfs_read_super() returns only a superblock whose checksum matched and
 *     which passed btrfs_check_super().
 *  2. Unknown incompat bits are refused by name (btrfs_unsupported_incompat).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "format/checksum.h"
#include "volumes/volumes.h"

static int is_pow2(u64 v)
{
	return v && !(v & (v - 1));
}

/* Validate the fields of @sb that the rest of the library relies on. */
int btrfs_check_super(const struct btrfs_super_block *sb, const struct blog *log,
		      const char *where)
{
	u32 sectorsize = btrfs_super_sectorsize(sb);
	u32 nodesize = btrfs_super_nodesize(sb);
	u32 array_size = btrfs_super_sys_array_size(sb);

	if (btrfs_csum_size(btrfs_super_csum_type(sb)) == 0)
		return BLOG_CORRUPT(log, "%s: unknown checksum type %u", where,
				    btrfs_super_csum_type(sb));
	if (!is_pow2(sectorsize) || sectorsize < BTRFS_MIN_SECTORSIZE ||
	    sectorsize > BTRFS_MAX_SECTORSIZE)
		return BLOG_CORRUPT(log, "%s: invalid sectorsize %u", where, sectorsize);
	if (!is_pow2(nodesize) || nodesize < sectorsize || nodesize > BTRFS_MAX_NODESIZE)
		return BLOG_CORRUPT(log, "%s: invalid nodesize %u", where, nodesize);
	if (sb->root_level >= BTRFS_MAX_LEVEL || sb->chunk_root_level >= BTRFS_MAX_LEVEL ||
	    sb->log_root_level >= BTRFS_MAX_LEVEL)
		return BLOG_CORRUPT(log, "%s: invalid tree level", where);
	if (array_size > BTRFS_SYSTEM_CHUNK_ARRAY_SIZE ||
	    array_size < sizeof(struct btrfs_disk_key) + sizeof(struct btrfs_chunk))
		return BLOG_CORRUPT(log, "%s: invalid sys_chunk_array_size %u", where, array_size);
	if (btrfs_super_root(sb) % sectorsize || btrfs_super_chunk_root(sb) % sectorsize ||
	    btrfs_super_log_root(sb) % sectorsize)
		return BLOG_CORRUPT(log, "%s: unaligned tree root address", where);
	if (btrfs_super_num_devices(sb) == 0 || btrfs_super_num_devices(sb) > 65536)
		return BLOG_CORRUPT(log, "%s: invalid number of devices %llu", where,
				    (unsigned long long)btrfs_super_num_devices(sb));
	if (btrfs_super_generation(sb) == 0)
		return BLOG_CORRUPT(log, "%s: generation 0", where);
	return 0;
}

static const struct {
	u64 bit;
	const char *name;
} unsupported[] = {
	{ BTRFS_FEATURE_INCOMPAT_ZONED, "zoned" },
	{ BTRFS_FEATURE_INCOMPAT_EXTENT_TREE_V2, "extent-tree-v2" },
	{ BTRFS_FEATURE_INCOMPAT_RAID_STRIPE_TREE, "raid-stripe-tree" },
};

#define SUPPORTED_INCOMPAT                                                              \
	(BTRFS_FEATURE_INCOMPAT_MIXED_BACKREF | BTRFS_FEATURE_INCOMPAT_DEFAULT_SUBVOL |     \
	 BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS | BTRFS_FEATURE_INCOMPAT_COMPRESS_LZO |        \
	 BTRFS_FEATURE_INCOMPAT_COMPRESS_ZSTD | BTRFS_FEATURE_INCOMPAT_BIG_METADATA |       \
	 BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF | BTRFS_FEATURE_INCOMPAT_RAID56 |             \
	 BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA | BTRFS_FEATURE_INCOMPAT_NO_HOLES |         \
	 BTRFS_FEATURE_INCOMPAT_METADATA_UUID | BTRFS_FEATURE_INCOMPAT_RAID1C34 |           \
	 BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA)

const char *btrfs_unsupported_incompat(u64 incompat)
{
	u64 extra = incompat & ~SUPPORTED_INCOMPAT;
	size_t i;

	if (!extra)
		return NULL;
	for (i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]); i++)
		if (extra & unsupported[i].bit)
			return unsupported[i].name;
	return "unknown incompat bit";
}

int btrfs_read_super_copy(struct blockdev *dev, int mirror, const struct blog *log,
			  struct btrfs_super_block *sb, int *has_magic)
{
	u64 offset = btrfs_sb_offset(mirror);
	u8 csum[BTRFS_CSUM_SIZE];
	char where[600];
	int ret, csize;

	if (offset + BTRFS_SUPER_INFO_SIZE > dev->size)
		return 1;
	ret = blockdev_read(dev, sb, sizeof(*sb), offset);
	if (ret)
		return ret;
	if (btrfs_super_magic(sb) != BTRFS_MAGIC)
		return -EINVAL;
	*has_magic = 1;
	snprintf(where, sizeof(where), "%s: superblock copy %d (physical %llu)", dev->name, mirror,
		 (unsigned long long)offset);
	if (btrfs_super_bytenr(sb) != offset)
		return BLOG_CORRUPT(log, "%s: bytenr %llu does not match its offset", where,
				    (unsigned long long)btrfs_super_bytenr(sb));
	csize = btrfs_csum_size(btrfs_super_csum_type(sb));
	if (csize == 0)
		return BLOG_CORRUPT(log, "%s: unknown checksum type %u", where,
				    btrfs_super_csum_type(sb));
	btrfs_csum_compute(btrfs_super_csum_type(sb), (const u8 *)sb + BTRFS_CSUM_SIZE,
			   BTRFS_SUPER_INFO_SIZE - BTRFS_CSUM_SIZE, csum);
	if (memcmp(csum, sb->csum, (size_t)csize) != 0)
		return BLOG_CORRUPT(log, "%s: checksum mismatch", where);
	return btrfs_check_super(sb, log, where);
}

int btrfs_read_super(struct blockdev *dev, const struct blog *log, struct btrfs_super_block *sb)
{
	struct btrfs_super_block cand;
	int mirror, found = 0, has_magic = 0, first_err = 0, io_err = 0;

	for (mirror = 0; mirror < BTRFS_SUPER_MIRROR_MAX; mirror++) {
		int ret = btrfs_read_super_copy(dev, mirror, log, &cand, &has_magic);

		if (ret == 1)
			break;
		if (ret < 0) {
			if (!first_err)
				first_err = ret;
			if (ret != -EINVAL && ret != -EUCLEAN && !io_err)
				io_err = ret;
			continue;
		}
		if (!found || btrfs_super_generation(&cand) > btrfs_super_generation(sb)) {
			/* a mirror only counts if it belongs to the same filesystem */
			if (found && memcmp(cand.fsid, sb->fsid, BTRFS_FSID_SIZE) != 0)
				continue;
			memcpy(sb, &cand, sizeof(cand));
			found = 1;
		}
	}
	if (found)
		return 0;
	if (!has_magic && io_err) {
		blog_err(log, "%s: cannot read the superblock: %s", dev->name, strerror(-io_err));
		return io_err;
	}
	if (!has_magic) {
		blog_err(log, "%s: not a btrfs filesystem (no superblock magic)", dev->name);
		return -EINVAL;
	}
	return first_err ? first_err : -EUCLEAN;
}
