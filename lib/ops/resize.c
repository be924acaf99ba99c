/*
 * resize.c — changing how much of a device the filesystem uses (offline or
 * on an open handle): grow into space the device has, or shrink down to the
 * end of its last allocated chunk. Moving chunks out of the way to shrink
 * further is balance's work and comes with it.
 *
 * The new size is committed at once: the dev item in the chunk tree, the
 * superblock's total_bytes and every device's superblock copy of its own dev
 * item change in one transaction.
 */
#include <errno.h>

#include "ops/ops.h"

int ops_device_resize(struct butter_fs *fs, uint64_t devid, uint64_t *size)
{
	struct fs_write_state *w;
	u64 want = *size;
	int ret;

	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = txn_commit(&w->txn);
	if (ret == 0)
		ret = txn_begin(&w->txn);
	if (ret)
		return fs_end_change(w, ret, 0);
	ret = chunk_resize_device(&w->es, &w->txn.tt, devid, &want);
	if (ret == -ENOSPC || ret == -EFBIG || ret == -ENODEV)
		return fs_end_change(w, ret, 0); /* refused before any change */
	if (ret == 0)
		ret = txn_commit(&w->txn);
	if (ret == 0)
		*size = want;
	return fs_end_change(w, ret, 1);
}
