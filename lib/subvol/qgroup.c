/*
 * qgroup.c — quota groups butter does not count, kept honest.
 *
 * butter does not do quota accounting (the kernel's qgroup.c walks the
 * backrefs of every changed extent at each commit). On a filesystem whose
 * quota tree says quotas are on (as `btrfs quota enable` or snapper leave it),
 * butter instead keeps the quota tree truthful about what it knows:
 *
 *  1. The first commit of a handle that changes anything sets
 *     BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT in the status item, as the kernel
 *     does when it cannot account, and logs one warning: the counts are
 *     stale until `btrfs quota rescan`. A RESCAN flag left by an interrupted
 *     kernel rescan is cleared with it (its progress would skip what butter
 *     changed); the user's rescan starts from the beginning.
 *  2. Every commit writes its transid into the status item's generation, as
 *     the kernel's commits do (a kernel mount compares it with the
 *     superblock's generation and marks the qgroups inconsistent if they
 *     differ). A commit of the superblock alone (a label) moves no count.
 *  3. A new subvolume or snapshot gets its level-0 qgroup as the kernel makes
 *     it: QGROUP_INFO (0, QGROUP_INFO, id) and QGROUP_LIMIT (0, QGROUP_LIMIT,
 *     id) without limits; its counts are what the kernel would start from
 *     (one tree block; a snapshot refers to what its source referred to).
 *  4. A subvolume dropped completely loses its qgroup (info, limit and
 *     relations), as the kernel (6.7 and later) removes it then.
 * Simple quotas (the SIMPLE_QUOTA incompat feature) cannot be rebuilt by a
 * rescan, so a handle refuses to write such a filesystem.
 *
 * State: fs_write_state.quota_tree (objectid 0 when quotas are off or
 * absent: then every function here does nothing) and quota_marked; both
 * change only under the write lock.
 */
#include <errno.h>
#include <string.h>

#include "subvol/subvol.h"

#define QGROUP_STATUS_VERSION 1

/* The commit hook (txn_ctx.pre_write): rules 1 and 2. */
static int qgroup_commit_hook(void *arg)
{
	struct butter_fs *fs = arg;
	struct fs_write_state *w = fs->w;
	struct btrfs_key key = { 0, BTRFS_QGROUP_STATUS_KEY, 0 };
	struct btrfs_qgroup_status_item *st;
	struct tree_path path;
	u64 flags;
	u32 size;
	int ret, counts_moved;

	/* the superblock alone changed (a label): no count moved, only the generation */
	counts_moved = w->txn.tt.dirty || extent_commit_pending(&w->es);
	tree_path_init(&path);
	ret = tree_search_slot(&w->txn.tt, &w->quota_tree, &key, &path, 0, 1);
	if (ret == 1)
		ret = BLOG_CORRUPT(&fs->log, "quota tree: the status item vanished");
	if (ret) {
		tree_path_release(&fs->cache, &path);
		return ret;
	}
	st = (struct btrfs_qgroup_status_item *)path_item_mut(&path, &size);
	if (size < sizeof(*st)) {
		tree_path_release(&fs->cache, &path);
		return BLOG_CORRUPT(&fs->log, "quota tree: status item of %u bytes", size);
	}
	flags = btrfs_qgroup_status_flags(st);
	if (!w->quota_marked && counts_moved) {
		flags |= BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT;
		if (flags & BTRFS_QGROUP_STATUS_FLAG_RESCAN) {
			flags &= ~BTRFS_QGROUP_STATUS_FLAG_RESCAN;
			put_le64(&st->rescan, 0);
		}
		btrfs_set_qgroup_status_flags(st, flags);
		w->quota_marked = 1;
		blog_warn(&fs->log, "quotas are on and butter does not count them: the qgroups "
				    "are marked inconsistent; run `btrfs quota rescan` on a kernel mount");
	}
	btrfs_set_qgroup_status_generation(st, w->txn.tt.transid);
	tree_path_release(&fs->cache, &path);
	return 0;
}

int subvol_qgroup_setup(struct butter_fs *fs)
{
	struct fs_write_state *w = fs->w;
	struct btrfs_key key = { 0, BTRFS_QGROUP_STATUS_KEY, 0 };
	struct btrfs_qgroup_status_item st;
	struct btrfs_root_item ri;
	struct tree_root quota;
	u64 flags;
	int ret;

	if (btrfs_super_incompat_flags(&fs->vol.super) & BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA) {
		blog_err(&fs->log, "simple quotas cannot be kept up to date by butter: open read-only");
		return -EOPNOTSUPP;
	}
	ret = fs_read_root_item(fs, BTRFS_QUOTA_TREE_OBJECTID, &ri, NULL);
	if (ret == -ENOENT)
		return 0;
	if (ret)
		return ret;
	memset(&quota, 0, sizeof(quota));
	quota.objectid = BTRFS_QUOTA_TREE_OBJECTID;
	quota.bytenr = btrfs_root_bytenr(&ri);
	quota.generation = btrfs_root_generation(&ri);
	quota.level = ri.level;
	quota.bytes_used = btrfs_root_bytes_used(&ri);
	ret = tree_lookup_item(&fs->cache, &quota, &key, &st, sizeof(st));
	if (ret == -ENOENT)
		return 0; /* a quota tree without status: quotas are not on */
	if (ret < 0)
		return ret;
	if ((size_t)ret < sizeof(st))
		return BLOG_CORRUPT(&fs->log, "quota tree: status item of %d bytes", ret);
	flags = btrfs_qgroup_status_flags(&st);
	if (!(flags & BTRFS_QGROUP_STATUS_FLAG_ON))
		return 0;
	w->quota_tree = quota;
	ret = txn_track_root(&w->txn, &w->quota_tree);
	if (ret) {
		memset(&w->quota_tree, 0, sizeof(w->quota_tree));
		return ret;
	}
	/* already stale and not being rescanned: only the generation is kept */
	w->quota_marked = (flags & BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT) &&
			  !(flags & BTRFS_QGROUP_STATUS_FLAG_RESCAN);
	w->txn.pre_write = qgroup_commit_hook;
	w->txn.pre_write_arg = fs;
	return 0;
}

/* Insert the item @key with @size bytes of @data, or overwrite the one there. */
static int put_item(struct butter_fs *fs, const struct btrfs_key *key, const void *data, u32 size)
{
	struct fs_write_state *w = fs->w;
	struct tree_path path;
	u32 have;
	u8 *p;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(&w->txn.tt, &w->quota_tree, key, &path, 0, 1);
	if (ret == 0) {
		p = path_item_mut(&path, &have);
		if (have == size)
			memcpy(p, data, size);
		else
			ret = BLOG_CORRUPT(&fs->log, "quota tree: item (0 %u %llu) of %u bytes",
					   key->type, (unsigned long long)key->offset, have);
	}
	tree_path_release(&fs->cache, &path);
	if (ret == 1)
		ret = tree_insert_item(&w->txn.tt, &w->quota_tree, key, data, size);
	return ret;
}

int subvol_qgroup_create(struct butter_fs *fs, u64 id, u64 src)
{
	struct fs_write_state *w = fs->w;
	struct btrfs_key key = { 0, BTRFS_QGROUP_INFO_KEY, id };
	struct btrfs_qgroup_info_item info;
	struct btrfs_qgroup_limit_item limit;
	u64 rfer = fs->vol.nodesize;
	int ret;

	if (!w->quota_tree.objectid)
		return 0;
	if (src) {
		struct btrfs_key skey = { 0, BTRFS_QGROUP_INFO_KEY, src };

		ret = tree_lookup_item(&fs->cache, &w->quota_tree, &skey, &info, sizeof(info));
		if (ret >= (int)sizeof(info))
			rfer = btrfs_qgroup_info_rfer(&info);
		else if (ret != -ENOENT && ret < 0)
			return ret;
	}
	memset(&info, 0, sizeof(info));
	btrfs_set_qgroup_info_generation(&info, w->txn.tt.transid);
	btrfs_set_qgroup_info_rfer(&info, rfer);
	put_le64(&info.rfer_cmpr, rfer);
	btrfs_set_qgroup_info_excl(&info, fs->vol.nodesize);
	put_le64(&info.excl_cmpr, fs->vol.nodesize);
	ret = put_item(fs, &key, &info, sizeof(info));
	if (ret)
		return ret;
	memset(&limit, 0, sizeof(limit));
	key.type = BTRFS_QGROUP_LIMIT_KEY;
	return put_item(fs, &key, &limit, sizeof(limit));
}

/* Delete every item with a key from @first to @last (inclusive). */
static int delete_range(struct butter_fs *fs, const struct btrfs_key *first,
			const struct btrfs_key *last)
{
	struct fs_write_state *w = fs->w;

	for (;;) {
		struct tree_path path;
		struct btrfs_key found;
		int ret;

		ret = tree_find_key(&fs->cache, &w->quota_tree, first, 0, &found);
		if (ret < 0)
			return ret;
		if (ret == 1 || btrfs_comp_keys(&found, last) > 0)
			return 0;
		tree_path_init(&path);
		ret = tree_search_slot(&w->txn.tt, &w->quota_tree, &found, &path, 0, 1);
		if (ret == 0)
			ret = tree_del_items(&w->txn.tt, &w->quota_tree, &path, 1);
		else if (ret == 1)
			ret = -EUCLEAN;
		tree_path_release(&fs->cache, &path);
		if (ret)
			return ret;
	}
}

int subvol_qgroup_remove(struct butter_fs *fs, u64 id)
{
	struct fs_write_state *w = fs->w;
	struct btrfs_key first = { 0, BTRFS_QGROUP_INFO_KEY, id };
	struct btrfs_key last = first;
	struct btrfs_key rel = { id, BTRFS_QGROUP_RELATION_KEY, 0 };
	struct btrfs_key rel_last = { id, BTRFS_QGROUP_RELATION_KEY, (u64)-1 };
	int ret;

	if (!w->quota_tree.objectid)
		return 0;
	/* the parents' side of each relation first: (parent, RELATION, id) */
	for (;;) {
		struct btrfs_key found, back;

		ret = tree_find_key(&fs->cache, &w->quota_tree, &rel, 0, &found);
		if (ret < 0)
			return ret;
		if (ret == 1 || btrfs_comp_keys(&found, &rel_last) > 0)
			break;
		back.objectid = found.offset;
		back.type = BTRFS_QGROUP_RELATION_KEY;
		back.offset = id;
		ret = delete_range(fs, &back, &back);
		if (ret == 0)
			ret = delete_range(fs, &found, &found);
		if (ret)
			return ret;
	}
	ret = delete_range(fs, &first, &last);
	if (ret)
		return ret;
	first.type = last.type = BTRFS_QGROUP_LIMIT_KEY;
	return delete_range(fs, &first, &last);
}
