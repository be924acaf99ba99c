/*
 * dev_stats.c — writing the per-device error counters at commit: the
 * DEV_STATS items of the device tree, key (BTRFS_DEV_STATS_OBJECTID,
 * BTRFS_PERSISTENT_ITEM_KEY, devid), value BTRFS_DEV_STAT_VALUES_MAX __le64
 * counters (write, read, flush, corruption, generation errors), as the
 * kernel keeps them; `btrfs device stats` on a kernel mount shows them.
 *
 * Rules:
 *  1. Only devices whose counters changed since the last write (stats_dirty,
 *     see struct btrfs_device) get their item rewritten; the flag is cleared
 *     before the values are read, so a count taken meanwhile makes the next
 *     commit write again and none is lost.
 *  2. An item shorter than the five counters (an older kernel's) is replaced
 *     by a full one; bytes past the five in a longer item are kept.
 *  3. Only a read-write handle commits, so a read-only open never writes.
 */
#include <errno.h>
#include <string.h>

#include "trans/transaction.h"

#define DEV_STATS_BYTES ((u32)(BTRFS_DEV_STAT_VALUES_MAX * sizeof(le64)))

static int write_one(struct txn_ctx *ctx, struct tree_root *root, u64 devid,
		     const le64 *values)
{
	struct btrfs_key key = { BTRFS_DEV_STATS_OBJECTID, BTRFS_PERSISTENT_ITEM_KEY, devid };
	struct tree_path path;
	u32 size;
	u8 *p;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(&ctx->tt, root, &key, &path,
			       (int)(DEV_STATS_BYTES + sizeof(struct btrfs_item)), 1);
	if (ret == 0) {
		p = path_item_mut(&path, &size);
		if (size >= DEV_STATS_BYTES) {
			memcpy(p, values, DEV_STATS_BYTES);
			goto out;
		}
		/* rule 2: a short item is replaced */
		ret = tree_del_items(&ctx->tt, root, &path, 1);
		tree_path_release(ctx->cache, &path);
		if (ret)
			return ret;
		return tree_insert_item(&ctx->tt, root, &key, values, DEV_STATS_BYTES);
	}
	if (ret == 1) {
		ret = tree_insert_empty_item(&ctx->tt, root, &path, &key, DEV_STATS_BYTES);
		if (ret == 0) {
			p = path_item_mut(&path, &size);
			memcpy(p, values, DEV_STATS_BYTES);
		}
	}
out:
	tree_path_release(ctx->cache, &path);
	return ret;
}

int txn_write_dev_stats(struct txn_ctx *ctx)
{
	struct tree_root *root = ctx->es->dev_root;
	size_t i;
	int k, ret;

	if (!root)
		return 0;
	for (i = 0; i < ctx->vol->ndevs; i++) {
		struct btrfs_device *dev = ctx->vol->devs[i];
		le64 values[BTRFS_DEV_STAT_VALUES_MAX];

		if (!__atomic_exchange_n(&dev->stats_dirty, 0, __ATOMIC_ACQ_REL))
			continue;
		for (k = 0; k < BTRFS_DEV_STAT_VALUES_MAX; k++)
			put_le64(&values[k], __atomic_load_n(&dev->stats[k], __ATOMIC_RELAXED));
		ret = write_one(ctx, root, dev->devid, values);
		if (ret) {
			__atomic_store_n(&dev->stats_dirty, 1, __ATOMIC_RELEASE);
			return ret;
		}
	}
	return 0;
}
