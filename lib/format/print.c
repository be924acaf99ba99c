/*
 * print.c — human names of on-disk flag bits: features and chunk profiles,
 * as btrfs-progs spells them.
 */
#include <stddef.h>

#include "butter/butter.h"
#include "format/ondisk.h"

static const char *const compat_ro_names[64] = {
	[0] = "free-space-tree",
	[1] = "free-space-tree-valid",
	[2] = "verity",
	[3] = "block-group-tree",
};

static const char *const incompat_names[64] = {
	[0] = "mixed-backref",
	[1] = "default-subvol",
	[2] = "mixed-groups",
	[3] = "compress-lzo",
	[4] = "compress-zstd",
	[5] = "big-metadata",
	[6] = "extended-iref",
	[7] = "raid56",
	[8] = "skinny-metadata",
	[9] = "no-holes",
	[10] = "metadata-uuid",
	[11] = "raid1c34",
	[12] = "zoned",
	[13] = "extent-tree-v2",
	[14] = "raid-stripe-tree",
	[16] = "simple-quota",
};

const char *butter_feature_name(int kind, int bit)
{
	if (bit < 0 || bit >= 64)
		return NULL;
	if (kind == 1)
		return compat_ro_names[bit];
	if (kind == 2)
		return incompat_names[bit];
	return NULL;
}

const char *butter_profile_name(uint64_t flags)
{
	if (flags & BTRFS_BLOCK_GROUP_RAID0)
		return "raid0";
	if (flags & BTRFS_BLOCK_GROUP_RAID1)
		return "raid1";
	if (flags & BTRFS_BLOCK_GROUP_RAID1C3)
		return "raid1c3";
	if (flags & BTRFS_BLOCK_GROUP_RAID1C4)
		return "raid1c4";
	if (flags & BTRFS_BLOCK_GROUP_DUP)
		return "dup";
	if (flags & BTRFS_BLOCK_GROUP_RAID10)
		return "raid10";
	if (flags & BTRFS_BLOCK_GROUP_RAID5)
		return "raid5";
	if (flags & BTRFS_BLOCK_GROUP_RAID6)
		return "raid6";
	return "single";
}
