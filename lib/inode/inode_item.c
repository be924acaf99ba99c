/*
 * inode_item.c — changing inode items inside a running change: applying an
 * edit to an inode item (copy-on-write, stamping the transid and moving the
 * sequence), handing out inode numbers, and making a new inode item.
 *
 * Every function here runs in phase 2 of a change (lib/fs/change.c): a
 * failure leaves a half-made change, and the caller aborts the transaction.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "inode/inode.h"

/*
 * Apply @fn to the inode item of @ino (COW) and stamp the running transid;
 * @bump_sequence: move the inode's sequence too (every change but an atime).
 * @after (may be NULL): the item as it now is.
 */
static int change_inode_item(struct butter_fs *fs, struct subvol *sv, u64 ino,
			     void (*fn)(struct btrfs_inode_item *ii, void *arg), void *arg,
			     int bump_sequence, struct btrfs_inode_item *after)
{
	struct fs_write_state *w = fs->w;
	struct btrfs_key key = { ino, BTRFS_INODE_ITEM_KEY, 0 };
	struct tree_path path;
	int ret;

	ASSERT(w && w->txn.running); /* phase 2 of a change */
	tree_path_init(&path);
	ret = tree_search_slot(&w->txn.tt, &sv->root, &key, &path, 0, 1);
	if (ret == 0) {
		u32 size;
		struct btrfs_inode_item *ii = (void *)path_item_mut(&path, &size);

		if (size < sizeof(*ii)) {
			ret = BLOG_CORRUPT(&fs->log, "inode %llu: item of %u bytes",
					   (unsigned long long)ino, size);
		} else {
			fn(ii, arg);
			btrfs_set_inode_transid(ii, w->txn.tt.transid);
			if (bump_sequence)
				btrfs_set_inode_sequence(ii, btrfs_inode_sequence(ii) + 1);
			if (after)
				memcpy(after, ii, sizeof(*after));
		}
	} else if (ret == 1) {
		ret = -ENOENT;
	}
	tree_path_release(&fs->cache, &path);
	if (ret == 0)
		ret = txn_track_root(&w->txn, &sv->root);
	return ret;
}

/* Apply @fn to the inode item of @ino (COW). */
int inode_modify(struct butter_fs *fs, struct subvol *sv, u64 ino,
			void (*fn)(struct btrfs_inode_item *ii, void *arg), void *arg)
{
	return change_inode_item(fs, sv, ino, fn, arg, 1, NULL);
}

int inode_modify_get(struct butter_fs *fs, struct subvol *sv, u64 ino,
		     void (*fn)(struct btrfs_inode_item *ii, void *arg), void *arg,
		     struct btrfs_inode_item *after)
{
	return change_inode_item(fs, sv, ino, fn, arg, 1, after);
}

/* The same, leaving the inode's sequence where it is (atime updates). */
int inode_modify_keep_sequence(struct butter_fs *fs, struct subvol *sv, u64 ino,
			       void (*fn)(struct btrfs_inode_item *ii, void *arg), void *arg)
{
	return change_inode_item(fs, sv, ino, fn, arg, 0, NULL);
}

int inode_next_ino(struct butter_fs *fs, struct subvol *sv, u64 *out)
{
	if (!sv->next_ino) {
		struct btrfs_key key = { BTRFS_LAST_FREE_OBJECTID, 0xff, (u64)-1 };
		int ret = tree_find_key(&fs->cache, &sv->root, &key, 1, &key);

		if (ret < 0)
			return ret;
		sv->next_ino = BTRFS_FIRST_FREE_OBJECTID + 1;
		if (ret == 0 && key.objectid + 1 > sv->next_ino)
			sv->next_ino = key.objectid + 1;
	}
	if (sv->next_ino > BTRFS_LAST_FREE_OBJECTID)
		return -ENOSPC;
	*out = sv->next_ino++;
	return 0;
}

u8 inode_mode_to_ft(u32 mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG: return BTRFS_FT_REG_FILE;
	case S_IFDIR: return BTRFS_FT_DIR;
	case S_IFCHR: return BTRFS_FT_CHRDEV;
	case S_IFBLK: return BTRFS_FT_BLKDEV;
	case S_IFIFO: return BTRFS_FT_FIFO;
	case S_IFSOCK: return BTRFS_FT_SOCK;
	case S_IFLNK: return BTRFS_FT_SYMLINK;
	default: return BTRFS_FT_UNKNOWN;
	}
}

void inode_touch_ctime(struct btrfs_inode_item *ii, void *arg)
{
	(void)arg;
	fs_now_ts(&ii->ctime);
}

void inode_touch_dir(struct btrfs_inode_item *ii, void *arg)
{
	struct dir_update *u = arg;

	btrfs_set_inode_size(ii, (u64)((s64)btrfs_inode_size(ii) + u->size_delta));
	fs_now_ts(&ii->mtime);
	ii->ctime = ii->mtime;
}

int inode_create(struct butter_fs *fs, struct subvol *sv, const struct butter_new_inode *a,
			u64 size, u64 iflags, u64 *ino)
{
	struct fs_write_state *w = fs->w;
	struct btrfs_inode_item ii;
	struct btrfs_key key;
	int ret;

	ret = inode_next_ino(fs, sv, ino);
	if (ret)
		return ret;
	memset(&ii, 0, sizeof(ii));
	btrfs_set_inode_generation(&ii, w->txn.tt.transid);
	btrfs_set_inode_transid(&ii, w->txn.tt.transid);
	btrfs_set_inode_size(&ii, size);
	if (S_ISLNK(a->mode))
		btrfs_set_inode_nbytes(&ii, size); /* the target is an inline extent */
	btrfs_set_inode_nlink(&ii, 1);
	btrfs_set_inode_uid(&ii, a->uid);
	btrfs_set_inode_gid(&ii, a->gid);
	btrfs_set_inode_mode(&ii, a->mode);
	btrfs_set_inode_rdev(&ii, inode_rdev_to_disk(a->rdev));
	btrfs_set_inode_flags(&ii, iflags);
	fs_now_ts(&ii.atime);
	ii.ctime = ii.mtime = ii.otime = ii.atime;
	key.objectid = *ino;
	key.type = BTRFS_INODE_ITEM_KEY;
	key.offset = 0;
	ret = tree_insert_item(&w->txn.tt, &sv->root, &key, &ii, sizeof(ii));
	if (ret == 0)
		ret = txn_track_root(&w->txn, &sv->root);
	return ret;
}
