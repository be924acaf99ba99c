/*
 * uuid_tree.c — the uuid tree: from a subvolume's uuid (and a received
 * subvolume's received_uuid) to its id, which `btrfs receive` and the
 * kernel use to find a snapshot's parent.
 *
 * Layout (one item per uuid and kind):
 *   key (le64 uuid[0..8], UUID_KEY_SUBVOL or UUID_KEY_RECEIVED_SUBVOL,
 *        le64 uuid[8..16])   payload: le64 subvolume ids, unsorted, no repeats
 *
 * Only kept when the filesystem has a uuid tree (mkfs.btrfs and the kernel
 * make one). butter does not claim it complete: the superblock's
 * uuid_tree_generation is left as it was, so a kernel mounting the image
 * after butter wrote it rescans every subvolume and repairs the tree.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "subvol/subvol.h"

static void uuid_key(const u8 *uuid, u8 type, struct btrfs_key *key)
{
	key->objectid = get_le64(uuid);
	key->type = type;
	key->offset = get_le64(uuid + 8);
}

static int uuid_is_null(const u8 *uuid)
{
	static const u8 zero[BTRFS_UUID_SIZE];

	return !memcmp(uuid, zero, BTRFS_UUID_SIZE);
}

int subvol_uuid_tree_add(struct butter_fs *fs, const u8 *uuid, u8 type, u64 id)
{
	struct fs_write_state *w = fs->w;
	struct btrfs_key key;
	struct tree_path path;
	int ret, listed = 0;
	le64 v;

	if (!w->uuid_tree.objectid || uuid_is_null(uuid))
		return 0;
	uuid_key(uuid, type, &key);
	tree_path_init(&path);
	ret = tree_search(&fs->cache, &w->uuid_tree, &key, &path);
	if (ret == 0) {
		u32 size, i;
		const u8 *p = path_item(&path, &size);

		for (i = 0; i + 8 <= size; i += 8)
			if (get_le64(p + i) == id)
				listed = 1;
	}
	tree_path_release(&fs->cache, &path);
	if (ret < 0)
		return ret;
	if (listed)
		return 0;
	put_le64(&v, id);
	ret = fs_insert_or_extend(&w->txn.tt, &w->uuid_tree, &key, &v, sizeof(v));
	if (ret == 0)
		ret = txn_track_root(&w->txn, &w->uuid_tree);
	return ret;
}

int subvol_uuid_tree_remove(struct butter_fs *fs, const u8 *uuid, u8 type, u64 id)
{
	struct fs_write_state *w = fs->w;
	struct tree_trans *t = &w->txn.tt;
	struct btrfs_key key;
	struct tree_path path;
	int ret;

	if (!w->uuid_tree.objectid || uuid_is_null(uuid))
		return 0;
	uuid_key(uuid, type, &key);
	tree_path_init(&path);
	ret = tree_search_slot(t, &w->uuid_tree, &key, &path, 0, 1);
	if (ret == 0) {
		u32 size, i;
		u8 *p = path_item_mut(&path, &size);

		for (i = 0; i + 8 <= size; i += 8)
			if (get_le64(p + i) == id)
				break;
		if (i + 8 > size) {
			ret = 0; /* not listed: nothing to do */
		} else if (size <= 8) {
			ret = tree_del_items(t, &w->uuid_tree, &path, 1);
		} else {
			memmove(p + i, p + i + 8, size - i - 8);
			ret = tree_truncate_item(t, &path, size - 8);
		}
	} else if (ret == 1) {
		ret = 0;
	}
	tree_path_release(&fs->cache, &path);
	if (ret == 0)
		ret = txn_track_root(&w->txn, &w->uuid_tree);
	return ret;
}
