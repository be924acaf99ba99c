/*
 * namei.c — taking names away: unlink, rmdir, rename, removexattr, and
 * deleting an inode whose last name went.
 *
 * A name is removed from three places (see lib/inode/names.c for the layout): the
 * DIR_ITEM entry (cut out of its item, or the item deleted if it was alone),
 * the DIR_INDEX item, and the INODE_REF (or INODE_EXTREF) entry that gives
 * the index. The parent's i_size drops by 2 * name_len.
 *
 * An inode with no names left is deleted at once, data references included,
 * unless a front end holds it open (butter_open_ref): then it becomes an
 * orphan, freed at its last release (ns_drop_last_link, orphan.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/checksum.h"
#include "namespace/namespace.h"

int ns_delete_inode(struct butter_fs *fs, struct subvol *sv, u64 ino)
{
	struct tree_trans *t = &fs->w->txn.tt;
	int ret;

	data_discard_ino(fs, sv->id, ino); /* buffered data dies with the inode */
	ret = data_drop_extents(fs, sv, ino, 0, (u64)-1);
	if (ret)
		return ret;
	for (;;) {
		struct btrfs_key key = { ino, 0, 0 };
		struct tree_path path;
		u32 slot, nr = 0;

		/* find the first item of @ino, then take the path to it for changing */
		ret = tree_find_key(&fs->cache, &sv->root, &key, 0, &key);
		if (ret)
			return ret < 0 ? ret : 0;
		if (key.objectid != ino)
			return 0;
		tree_path_init(&path);
		ret = tree_search_slot(t, &sv->root, &key, &path, 0, 1);
		if (ret) {
			tree_path_release(&fs->cache, &path);
			return ret < 0 ? ret : -EUCLEAN;
		}
		slot = path.slots[0];
		while (slot + nr < path.nodes[0]->nritems) {
			node_key(path.nodes[0], slot + nr, &key);
			if (key.objectid != ino)
				break;
			nr++;
		}
		ret = tree_del_items(t, &sv->root, &path, nr);
		tree_path_release(&fs->cache, &path);
		if (ret)
			return ret;
	}
}

static void dec_nlink(struct btrfs_inode_item *ii, void *arg)
{
	(void)arg;
	if (btrfs_inode_nlink(ii))
		btrfs_set_inode_nlink(ii, btrfs_inode_nlink(ii) - 1);
	fs_now_ts(&ii->ctime);
}

/*
 * chattr +i or +a on @dir or on the inode @ii that a name of @dir names
 * keep that name (-EPERM), as the kernel's may_delete() rules.
 */
static int may_remove(const struct btrfs_inode_item *dii, const struct btrfs_inode_item *ii)
{
	int ret = inode_may_change(dii, INODE_FIXED);

	return ret ? ret : inode_may_change(ii, INODE_FIXED);
}

/* Phase-1 checks for removing @name from @dir: the target and its inode (and chattr's flags). */
static int check_old_name(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t len,
			  butter_ino_t *target, struct btrfs_inode_item *ii, struct subvol **svp)
{
	struct btrfs_inode_item dii;
	int ret, err = 0;

	if ((len == 1 && name[0] == '.') || (len == 2 && !memcmp(name, "..", 2)))
		return -EINVAL;
	ret = inode_lookup_full(fs, dir, name, len, target, NULL, &dii);
	if (ret)
		return ret;
	if (target->subvol != dir.subvol || target->ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID)
		return -EPERM; /* a subvolume: use subvolume delete */
	ret = inode_read(fs, *target, ii);
	if (ret == 0)
		ret = may_remove(&dii, ii);
	if (ret)
		return ret;
	*svp = fs_subvol_mut(fs, dir.subvol, &err);
	return *svp ? 0 : err;
}

static int dir_is_empty(struct butter_fs *fs, struct subvol *sv, u64 dir)
{
	struct btrfs_key key = { dir, BTRFS_DIR_INDEX_KEY, 0 };
	int ret = tree_find_key(&fs->cache, &sv->root, &key, 0, &key);

	if (ret < 0)
		return ret;
	return ret == 1 || key.objectid != dir || key.type != BTRFS_DIR_INDEX_KEY;
}

/* Drop one link of @target (phase 2); deletes the inode with its last. */
static int drop_link(struct butter_fs *fs, struct subvol *sv, const struct btrfs_inode_item *ii,
		     u64 target)
{
	if (S_ISDIR(btrfs_inode_mode(ii)) || btrfs_inode_nlink(ii) <= 1)
		return ns_drop_last_link(fs, sv, target);
	return inode_modify(fs, sv, target, dec_nlink, NULL);
}

int ns_unlink(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen)
{
	struct btrfs_inode_item ii;
	struct fs_write_state *w;
	butter_ino_t target;
	struct subvol *sv;
	int ret;

	ret = fs_begin_change_rsv(fs, &w, 0, 1);
	if (ret)
		return ret;
	ret = check_old_name(fs, dir, name, namelen, &target, &ii, &sv);
	if (ret == 0 && S_ISDIR(btrfs_inode_mode(&ii)))
		ret = -EISDIR;
	if (ret)
		return fs_end_change(w, ret, 0);
	ret = inode_remove_name(fs, sv, dir.ino, name, namelen, target.ino);
	if (ret == 0)
		ret = drop_link(fs, sv, &ii, target.ino);
	return fs_end_change(w, ret, 1);
}

/* The DIR_INDEX of entry @name in @dir, by walking the directory's index items. */
static int find_dir_index(struct butter_fs *fs, struct subvol *sv, u64 dir, const char *name,
			  size_t len, u64 *index)
{
	struct btrfs_key key = { dir, BTRFS_DIR_INDEX_KEY, 0 };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &sv->root, &key, &path);
	while (ret == 0) {
		const struct btrfs_dir_item *di;
		u32 size;

		path_key(&path, &key);
		if (key.objectid != dir || key.type != BTRFS_DIR_INDEX_KEY) {
			ret = 1;
			break;
		}
		di = (const void *)path_item(&path, &size);
		if (size >= sizeof(*di) && btrfs_dir_name_len(di) == len &&
		    size - sizeof(*di) >= len && !memcmp(di + 1, name, len)) {
			*index = key.offset;
			break;
		}
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	return ret == 1 ? BLOG_CORRUPT(&fs->log, "dir %llu: entry without its index",
				       (unsigned long long)dir)
			: ret;
}

int ns_rmdir(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen)
{
	struct btrfs_inode_item ii;
	struct fs_write_state *w;
	butter_ino_t target;
	struct subvol *sv;
	int ret;

	ret = fs_begin_change_rsv(fs, &w, 0, 1);
	if (ret)
		return ret;
	if (!(namelen == 1 && name[0] == '.') && !(namelen == 2 && !memcmp(name, "..", 2)) &&
	    inode_lookup(fs, dir, name, namelen, &target) == 0 &&
	    target.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID && target.subvol == dir.subvol) {
		/*
		 * A placeholder: the empty directory standing for a subvolume in a
		 * snapshot of its parent. Only its directory entry exists (no
		 * inode, no ROOT_REF), and it goes, as with the kernel's rmdir.
		 */
		u64 index = 0;
		int err = 0;

		sv = fs_subvol_mut(fs, dir.subvol, &err);
		ret = sv ? find_dir_index(fs, sv, dir.ino, name, namelen, &index) : err;
		if (ret)
			return fs_end_change(w, ret, 0);
		ret = inode_remove_dir_entry(fs, sv, dir.ino, name, namelen, index);
		return fs_end_change(w, ret, 1);
	}
	ret = check_old_name(fs, dir, name, namelen, &target, &ii, &sv);
	if (ret == 0 && !S_ISDIR(btrfs_inode_mode(&ii)))
		ret = -ENOTDIR;
	if (ret == 0) {
		ret = dir_is_empty(fs, sv, target.ino);
		ret = ret < 0 ? ret : ret ? 0 : -ENOTEMPTY;
	}
	if (ret)
		return fs_end_change(w, ret, 0);
	ret = inode_remove_name(fs, sv, dir.ino, name, namelen, target.ino);
	if (ret == 0)
		ret = ns_drop_last_link(fs, sv, target.ino);
	return fs_end_change(w, ret, 1);
}

/* Is @anc an ancestor of (or equal to) directory @dir? Walks INODE_REFs up. */
static int is_ancestor(struct butter_fs *fs, butter_ino_t anc, butter_ino_t dir)
{
	int depth = 0;

	while (depth++ < 100000) {
		butter_ino_t up;
		int ret;

		if (dir.subvol == anc.subvol && dir.ino == anc.ino)
			return 1;
		ret = inode_lookup(fs, dir, "..", 2, &up);
		if (ret)
			return ret;
		if (up.subvol == dir.subvol && up.ino == dir.ino)
			return 0;
		dir = up;
	}
	return -ELOOP;
}

int ns_rename(struct butter_fs *fs, butter_ino_t olddir, const char *oldname, size_t oldlen,
	      butter_ino_t newdir, const char *newname, size_t newlen, unsigned flags)
{
	struct btrfs_inode_item src_ii, dst_ii, ndii;
	struct fs_write_state *w;
	butter_ino_t src, dst;
	struct subvol *sv;
	int ret, have_dst;

	if (flags & ~(BUTTER_RENAME_NOREPLACE | BUTTER_RENAME_EXCHANGE) ||
	    (flags & BUTTER_RENAME_NOREPLACE && flags & BUTTER_RENAME_EXCHANGE))
		return -EINVAL;
	if (olddir.subvol != newdir.subvol)
		return -EXDEV;
	if (newlen > BTRFS_NAME_LEN)
		return -ENAMETOOLONG;
	if (newlen == 0 || (newlen == 1 && newname[0] == '.') ||
	    (newlen == 2 && !memcmp(newname, "..", 2)) || memchr(newname, '/', newlen))
		return -EINVAL;
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = check_old_name(fs, olddir, oldname, oldlen, &src, &src_ii, &sv);
	if (ret)
		return fs_end_change(w, ret, 0);
	ret = inode_lookup_full(fs, newdir, newname, newlen, &dst, NULL, &ndii);
	have_dst = ret == 0;
	if (ret && ret != -ENOENT)
		return fs_end_change(w, ret, 0);
	if (flags & BUTTER_RENAME_NOREPLACE && have_dst)
		return fs_end_change(w, -EEXIST, 0);
	if (have_dst && dst.subvol == src.subvol && dst.ino == src.ino)
		return fs_end_change(w, 0, 0); /* same inode: nothing to do */
	if (have_dst) {
		if (dst.subvol != newdir.subvol || dst.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID)
			return fs_end_change(w, -EPERM, 0);
		ret = inode_read(fs, dst, &dst_ii);
		if (ret == 0) /* the name replaced goes as an unlink's would */
			ret = may_remove(&ndii, &dst_ii);
		if (ret)
			return fs_end_change(w, ret, 0);
	} else {
		/* the lookup read ndii, but for a missing subvolume's placeholder (no item) */
		ret = newdir.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID ? inode_read(fs, newdir, &ndii) : 0;
		if (ret == 0) /* a new name: not in an immutable directory */
			ret = inode_may_change(&ndii, BTRFS_INODE_IMMUTABLE_FLAG);
		if (ret)
			return fs_end_change(w, ret, 0);
	}
	if (flags & BUTTER_RENAME_NOREPLACE && have_dst)
		return fs_end_change(w, -EEXIST, 0);
	if (flags & BUTTER_RENAME_EXCHANGE && !have_dst)
		return fs_end_change(w, -ENOENT, 0);
	if (!(flags & BUTTER_RENAME_EXCHANGE) && have_dst) {
		if (S_ISDIR(btrfs_inode_mode(&src_ii)) && !S_ISDIR(btrfs_inode_mode(&dst_ii)))
			return fs_end_change(w, -ENOTDIR, 0);
		if (!S_ISDIR(btrfs_inode_mode(&src_ii)) && S_ISDIR(btrfs_inode_mode(&dst_ii)))
			return fs_end_change(w, -EISDIR, 0);
		if (S_ISDIR(btrfs_inode_mode(&dst_ii))) {
			ret = dir_is_empty(fs, sv, dst.ino);
			if (ret <= 0)
				return fs_end_change(w, ret < 0 ? ret : -ENOTEMPTY, 0);
		}
	}
	/* a directory may not move below itself */
	if (S_ISDIR(btrfs_inode_mode(&src_ii))) {
		ret = is_ancestor(fs, src, newdir);
		if (ret)
			return fs_end_change(w, ret < 0 ? ret : -EINVAL, 0);
	}
	if (flags & BUTTER_RENAME_EXCHANGE && S_ISDIR(btrfs_inode_mode(&dst_ii))) {
		ret = is_ancestor(fs, dst, olddir);
		if (ret)
			return fs_end_change(w, ret < 0 ? ret : -EINVAL, 0);
	}
	/* phase 2 */
	ret = inode_remove_name(fs, sv, olddir.ino, oldname, oldlen, src.ino);
	if (ret == 0 && have_dst)
		ret = inode_remove_name(fs, sv, newdir.ino, newname, newlen, dst.ino);
	if (ret == 0)
		ret = inode_add_name(fs, sv, newdir.ino, newname, newlen, src.ino, btrfs_inode_mode(&src_ii));
	if (ret == 0 && have_dst) {
		if (flags & BUTTER_RENAME_EXCHANGE)
			ret = inode_add_name(fs, sv, olddir.ino, oldname, oldlen, dst.ino,
					     btrfs_inode_mode(&dst_ii));
		else
			ret = drop_link(fs, sv, &dst_ii, dst.ino);
	}
	if (ret == 0) /* rename changes the inode's ctime */
		ret = inode_modify(fs, sv, src.ino, inode_touch_ctime, NULL);
	return fs_end_change(w, ret, 1);
}
