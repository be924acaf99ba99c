/*
 * resize.c — changing how much of a device the filesystem uses (offline or
 * on an open handle): grow into space the device has, or shrink: the block
 * groups with a stripe past the new end move elsewhere first (balance.c's
 * ops_shrink_prepare()), then the size is set.
 *
 * The new size is committed at once: the dev item in the chunk tree, the
 * superblock's total_bytes and every device's superblock copy of its own dev
 * item change in one transaction.
 */
#include <errno.h>

#include "log.h"

#include "ops/ops.h"

int ops_device_resize_step(struct butter_fs *fs, uint64_t devid, uint64_t size, uint64_t *cursor,
			   struct butter_balance_stats *st)
{
	int ret = ops_shrink_step(fs, devid, size & ~((u64)fs->vol.sectorsize - 1), cursor, st);

	if (ret == 1) {
		ret = ops_device_resize(fs, devid, &size);
		return ret ? ret : 1;
	}
	return ret;
}

int ops_device_resize(struct butter_fs *fs, uint64_t devid, uint64_t *size)
{
	struct fs_write_state *w;
	u64 want = *size;
	size_t i;
	int ret;

	if (!fs->w)
		return -EROFS;
	if (ops_replace_running(fs, devid)) {
		blog_err(&fs->log, "devid %llu is being replaced: cancel the replace first",
			 (unsigned long long)devid);
		return -EBUSY;
	}
	for (i = 0; i < fs->vol.ndevs; i++) {
		struct btrfs_device *dev = fs->vol.devs[i];

		if (dev->devid != devid || !dev->bdev)
			continue;
		if (want && want < dev->total_bytes) {
			ret = ops_shrink_prepare(fs, devid, want & ~((u64)fs->vol.sectorsize - 1));
			if (ret)
				return ret;
		}
	}
	ret = ops_begin_alone(fs, &w);
	if (ret)
		return ret;
	ret = chunk_resize_device(&w->es, &w->txn.tt, devid, &want);
	if (ret == -ENOSPC || ret == -EFBIG || ret == -ENODEV)
		return fs_end_change(w, ret, 0); /* refused before any change */
	if (ret == 0)
		ret = txn_commit(&w->txn);
	if (ret == 0)
		*size = want;
	return fs_end_change(w, ret, 1);
}
