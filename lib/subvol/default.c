/*
 * default.c — two settings of a subvolume kept in the root tree: which one
 * is the default and whether one is read-only.
 *
 * The default subvolume: the one a mount without subvol= or
 * subvolid= shows. It is named by the "default" entry of the root tree's
 * directory (objectid 6), whose location is the subvolume's root item key;
 * setting it rewrites that location (or adds the entry an old image lacks)
 * and sets the DEFAULT_SUBVOL incompat flag, as the kernel's
 * BTRFS_IOC_DEFAULT_SUBVOL does.
 *
 * Read-only: BTRFS_ROOT_SUBVOL_RDONLY in the root item, as the kernel's
 * SUBVOL_SETFLAGS sets it (`btrfs property set ro`). What was written
 * before and is still buffered is written back first (it could not be after). A received read-only
 * subvolume is not made writable (-EBUSY): its received uuid would then lie
 * to an incremental send, which btrfs-progs refuses too without -f.
 *
 * Both changes are committed at once.
 */
#include <errno.h>
#include <string.h>

#include "format/checksum.h"
#include "subvol/subvol.h"

static const char default_name[] = "default";
#define DEFAULT_LEN (sizeof(default_name) - 1)

/* The "default" entry inside the DIR_ITEM item at @path, or NULL. */
static struct btrfs_dir_item *find_entry(const struct tree_path *path)
{
	u32 size, off = 0;
	u8 *item = path_item_mut(path, &size);

	while (off + sizeof(struct btrfs_dir_item) <= size) {
		struct btrfs_dir_item *di = (struct btrfs_dir_item *)(item + off);
		u32 len = sizeof(*di) + btrfs_dir_name_len(di) + btrfs_dir_data_len(di);

		if (off + len > size)
			break;
		if (btrfs_dir_name_len(di) == DEFAULT_LEN && !memcmp(di + 1, default_name, DEFAULT_LEN))
			return di;
		off += len;
	}
	return NULL;
}

/*
 * Phase 1 of both changes: the live subvolume @id (0: the top level) and
 * its root item with the item's key. 0, or a negative errno (-ENOENT).
 */
static int find_subvol(struct butter_fs *fs, u64 *id, struct subvol **svp,
		       struct btrfs_root_item *ri, struct btrfs_key *key)
{
	int err = 0;

	if (*id == 0)
		*id = BTRFS_FS_TREE_OBJECTID; /* as btrfs: 0 names the top level */
	if (*id != BTRFS_FS_TREE_OBJECTID && (*id < BTRFS_FIRST_FREE_OBJECTID ||
					      *id > BTRFS_LAST_FREE_OBJECTID))
		return -ENOENT;
	*svp = fs_subvol_cached(fs, *id, &err);
	if (!*svp)
		return err;
	if ((*svp)->deleted)
		return -ENOENT;
	return fs_read_root_item(fs, *id, ri, key);
}

int subvol_set_default(struct butter_fs *fs, uint64_t id)
{
	struct btrfs_key key = { BTRFS_ROOT_TREE_DIR_OBJECTID, BTRFS_DIR_ITEM_KEY,
				 btrfs_name_hash(default_name, DEFAULT_LEN) };
	struct btrfs_super_block *sb = &fs->vol.super;
	struct btrfs_root_item ri;
	struct btrfs_key root_key;
	struct fs_write_state *w;
	struct tree_path path;
	struct subvol *sv;
	int ret;

	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = find_subvol(fs, &id, &sv, &ri, &root_key);
	if (ret)
		return fs_end_change(w, ret, 0);

	/* phase 2 */
	tree_path_init(&path);
	ret = tree_search_slot(&w->txn.tt, &fs->root_tree, &key, &path, 0, 1);
	if (ret == 0) {
		struct btrfs_dir_item *di = find_entry(&path);

		if (di)
			btrfs_cpu_to_disk_key(&di->location, &root_key);
		else
			ret = 1; /* another name with the same hash only: add ours */
	}
	tree_path_release(&fs->cache, &path);
	if (ret == 1) {
		u8 item[sizeof(struct btrfs_dir_item) + DEFAULT_LEN];
		struct btrfs_dir_item *di = (struct btrfs_dir_item *)item;

		memset(item, 0, sizeof(item));
		btrfs_cpu_to_disk_key(&di->location, &root_key);
		btrfs_set_dir_name_len(di, DEFAULT_LEN);
		di->type = BTRFS_FT_DIR;
		memcpy(di + 1, default_name, DEFAULT_LEN);
		ret = fs_insert_or_extend(&w->txn.tt, &fs->root_tree, &key, item, sizeof(item));
	}
	if (ret == 0) {
		btrfs_set_super_incompat_flags(sb, btrfs_super_incompat_flags(sb) |
						   BTRFS_FEATURE_INCOMPAT_DEFAULT_SUBVOL);
		fs->default_subvol = id;
		ret = txn_commit(&w->txn);
	}
	return fs_end_change(w, ret, 1);
}

int subvol_set_readonly(struct butter_fs *fs, uint64_t id, int readonly)
{
	static const u8 zero[BTRFS_UUID_SIZE];
	struct fs_write_state *w;
	struct btrfs_root_item ri, *item;
	struct btrfs_key key;
	struct tree_path path;
	struct subvol *sv;
	u32 size;
	int ret;

	/* what is written but buffered (lib/data/delalloc.c) goes first: read-only, it could not */
	ret = readonly ? data_flush_all(fs) : 0;
	if (ret)
		return ret;
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = find_subvol(fs, &id, &sv, &ri, &key);
	/* a received subvolume made writable could no longer be an incremental send's parent */
	if (ret == 0 && !readonly && (btrfs_root_flags(&ri) & BTRFS_ROOT_SUBVOL_RDONLY) &&
	    memcmp(ri.received_uuid, zero, sizeof(zero)))
		ret = -EBUSY;
	if (ret)
		return fs_end_change(w, ret, 0);

	/* phase 2 */
	tree_path_init(&path);
	ret = tree_search_slot(&w->txn.tt, &fs->root_tree, &key, &path, 0, 1);
	if (ret > 0)
		ret = -EUCLEAN;
	if (ret == 0) {
		u64 flags;

		item = (struct btrfs_root_item *)path_item_mut(&path, &size);
		flags = btrfs_root_flags(item) & ~(u64)BTRFS_ROOT_SUBVOL_RDONLY;
		btrfs_set_root_flags(item, flags | (readonly ? BTRFS_ROOT_SUBVOL_RDONLY : 0));
	}
	tree_path_release(&fs->cache, &path);
	if (ret == 0) {
		pthread_mutex_lock(&fs->subvol_lock);
		if (readonly)
			sv->flags |= BTRFS_ROOT_SUBVOL_RDONLY;
		else
			sv->flags &= ~(u64)BTRFS_ROOT_SUBVOL_RDONLY;
		pthread_mutex_unlock(&fs->subvol_lock);
		ret = txn_commit(&w->txn);
	}
	return fs_end_change(w, ret, 1);
}
