/*
 * received.c — what receiving a send stream leaves on a subvolume: the
 * sender's uuid and transid in its root item (received_uuid, stransid, with
 * rtransid and rtime of the receive), listed in the uuid tree under
 * RECEIVED_SUBVOL, and the read-only flag. The kernel does the same for
 * `btrfs receive` (SET_RECEIVED_SUBVOL, then SUBVOL_SETFLAGS), and an
 * incremental receive later finds its parent by that uuid.
 */
#include <errno.h>
#include <string.h>

#include "subvol/subvol.h"

static int null_uuid(const u8 *uuid)
{
	static const u8 zero[BTRFS_UUID_SIZE];

	return memcmp(uuid, zero, BTRFS_UUID_SIZE) == 0;
}

int subvol_set_received(struct butter_fs *fs, uint64_t id, const uint8_t uuid[16],
			uint64_t stransid, unsigned flags)
{
	struct fs_write_state *w;
	struct btrfs_root_item ri, *item;
	struct btrfs_key key;
	struct tree_path path;
	struct subvol *sv;
	u8 old[BTRFS_UUID_SIZE];
	u32 size;
	int ret, err = 0;

	if (flags & ~BUTTER_RECEIVED_RDONLY)
		return -EINVAL;
	if (id == BTRFS_FS_TREE_OBJECTID)
		return -EPERM;
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	sv = fs_subvol_cached(fs, id, &err);
	if (!sv)
		ret = err;
	if (ret == 0)
		ret = fs_read_root_item(fs, id, &ri, &key);
	if (ret)
		return fs_end_change(w, ret, 0);
	memcpy(old, ri.received_uuid, sizeof(old));

	/* phase 2: from here a failure aborts the transaction */
	tree_path_init(&path);
	ret = tree_search_slot(&w->txn.tt, &fs->root_tree, &key, &path, 0, 1);
	if (ret > 0)
		ret = -EUCLEAN;
	if (ret == 0) {
		item = (struct btrfs_root_item *)path_item_mut(&path, &size);
		if (size < sizeof(*item)) {
			ret = BLOG_CORRUPT(&fs->log, "root item of subvolume %llu: %u bytes, no "
					   "room for a received uuid", (unsigned long long)id, size);
		} else {
			memcpy(item->received_uuid, uuid, BTRFS_UUID_SIZE);
			put_le64(&item->stransid, stransid);
			put_le64(&item->rtransid, w->txn.tt.transid);
			fs_now_ts(&item->rtime);
			if (flags & BUTTER_RECEIVED_RDONLY)
				btrfs_set_root_flags(item, btrfs_root_flags(item) |
							   BTRFS_ROOT_SUBVOL_RDONLY);
		}
	}
	tree_path_release(&fs->cache, &path);
	if (ret == 0 && !null_uuid(old))
		ret = subvol_uuid_tree_remove(fs, old, BTRFS_UUID_KEY_RECEIVED_SUBVOL, id);
	if (ret == 0)
		ret = subvol_uuid_tree_add(fs, uuid, BTRFS_UUID_KEY_RECEIVED_SUBVOL, id);
	if (ret == 0 && (flags & BUTTER_RECEIVED_RDONLY)) {
		pthread_mutex_lock(&fs->subvol_lock);
		sv->flags |= BTRFS_ROOT_SUBVOL_RDONLY;
		pthread_mutex_unlock(&fs->subvol_lock);
	}
	if (ret == 0)
		ret = txn_commit(&w->txn);
	return fs_end_change(w, ret, 1);
}
