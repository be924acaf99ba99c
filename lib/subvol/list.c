/*
 * list.c — listing subvolumes and describing one: id, parent, generation,
 * uuids, read-only flag, and its path from the top level, built by walking
 * ROOT_BACKREF items up to subvolume 5 and INODE_REF items up to each
 * parent's root directory. Walks are bounded so a damaged tree with a cycle
 * ends in -EUCLEAN, not a hang.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "subvol/subvol.h"

#define MAX_PATH_DEPTH 4096

/* Prepend @name (length @len) and a '/' to the path being built backwards. */
static int prepend(char *buf, size_t *start, const char *name, size_t len)
{
	if (len + 1 > *start)
		return -ENAMETOOLONG;
	*start -= len;
	memcpy(buf + *start, name, len);
	buf[--*start] = '/';
	return 0;
}

/* First ROOT_BACKREF of @id: parent subvolume, dirid and name. */
static int read_backref(struct butter_fs *fs, u64 id, u64 *parent, u64 *dirid, char *name,
			size_t *name_len)
{
	struct btrfs_key key = { id, BTRFS_ROOT_BACKREF_KEY, 0 };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &fs->root_tree, &key, &path);
	if (ret == 0) {
		const u8 *item;
		u32 size, nlen;

		path_key(&path, &key);
		item = path_item(&path, &size);
		if (key.objectid != id || key.type != BTRFS_ROOT_BACKREF_KEY) {
			ret = -ENOENT;
		} else if (size < sizeof(struct btrfs_root_ref) ||
			   (nlen = btrfs_root_ref_name_len((const void *)item)) >
				   size - sizeof(struct btrfs_root_ref) ||
			   nlen == 0 || nlen > BTRFS_NAME_LEN) {
			ret = BLOG_CORRUPT(&fs->log, "root backref of %llu: malformed",
					   (unsigned long long)id);
		} else {
			*parent = key.offset;
			*dirid = btrfs_root_ref_dirid((const void *)item);
			memcpy(name, item + sizeof(struct btrfs_root_ref), nlen);
			*name_len = nlen;
		}
	} else if (ret == 1) {
		ret = -ENOENT;
	}
	tree_path_release(&fs->cache, &path);
	return ret;
}

/* Build @id's path from the top level into @out (no leading slash). */
static int subvol_path(struct butter_fs *fs, u64 id, char *out, size_t cap, u64 *parent_id,
		       u64 *dirid_out)
{
	char buf[8192], name[BTRFS_NAME_LEN];
	size_t start = sizeof(buf) - 1, name_len = 0;
	int depth = 0, ret, first = 1;

	buf[start] = '\0';
	*parent_id = 0;
	*dirid_out = 0;
	while (id != BTRFS_FS_TREE_OBJECTID) {
		u64 parent = 0, dirid = 0;
		struct subvol psv;

		if (++depth > MAX_PATH_DEPTH)
			return BLOG_CORRUPT(&fs->log, "subvolume %llu: path loops",
					    (unsigned long long)id);
		ret = read_backref(fs, id, &parent, &dirid, name, &name_len);
		if (ret)
			return ret;
		if (first) {
			*parent_id = parent;
			*dirid_out = dirid;
			first = 0;
		}
		ret = prepend(buf, &start, name, name_len);
		if (ret)
			return ret;
		ret = fs_get_subvol(fs, parent, &psv);
		if (ret)
			return ret;
		while (dirid != psv.dirid) {
			u64 up = 0;

			if (++depth > MAX_PATH_DEPTH)
				return BLOG_CORRUPT(&fs->log, "subvolume %llu: directory path loops",
						    (unsigned long long)parent);
			ret = inode_first_name(fs, &psv.root, dirid, BTRFS_INODE_REF_KEY, &up, name,
					       &name_len);
			if (ret)
				return ret;
			ret = prepend(buf, &start, name, name_len);
			if (ret)
				return ret;
			dirid = up;
		}
		id = parent;
	}
	if (buf[start] == '/')
		start++;
	if (strlen(buf + start) >= cap)
		return -ENAMETOOLONG;
	strcpy(out, buf + start);
	return 0;
}

int subvol_get(struct butter_fs *fs, uint64_t id, struct butter_subvol_info *info)
{
	struct btrfs_root_item item;
	int ret;

	memset(info, 0, sizeof(*info));
	ret = fs_read_root_item(fs, id, &item, NULL);
	if (ret)
		return ret;
	info->id = id;
	info->generation = btrfs_root_generation(&item);
	info->flags = btrfs_root_flags(&item);
	if (btrfs_root_generation_v2(&item) == btrfs_root_generation(&item)) {
		memcpy(info->uuid, item.uuid, 16);
		memcpy(info->parent_uuid, item.parent_uuid, 16);
		memcpy(info->received_uuid, item.received_uuid, 16);
		info->ctransid = btrfs_root_ctransid(&item);
		info->otransid = btrfs_root_otransid(&item);
		info->otime.tv_sec = (time_t)btrfs_timespec_sec(&item.otime);
		info->otime.tv_nsec = (long)btrfs_timespec_nsec(&item.otime);
		info->stransid = get_le64(&item.stransid);
		info->rtransid = get_le64(&item.rtransid);
		info->stime.tv_sec = (time_t)btrfs_timespec_sec(&item.stime);
		info->stime.tv_nsec = (long)btrfs_timespec_nsec(&item.stime);
		info->rtime.tv_sec = (time_t)btrfs_timespec_sec(&item.rtime);
		info->rtime.tv_nsec = (long)btrfs_timespec_nsec(&item.rtime);
	}
	if (id == BTRFS_FS_TREE_OBJECTID)
		return 0;
	return subvol_path(fs, id, info->path, sizeof(info->path), &info->parent_id, &info->dirid);
}

int subvol_list(struct butter_fs *fs,
		int (*fn)(void *arg, const struct butter_subvol_info *info), void *arg)
{
	struct btrfs_key key = { BTRFS_FIRST_FREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, 0 };
	struct butter_subvol_info *info = malloc(sizeof(*info));
	struct tree_path path;
	int ret;

	if (!info)
		return -ENOMEM;
	for (;;) {
		u64 id;

		/* the next subvolume's ROOT_ITEM at or after @key (ids from 256) */
		tree_path_init(&path);
		ret = fs_next_subvol_root_item(fs, &key, &path);
		tree_path_release(&fs->cache, &path);
		if (ret)
			break;
		id = key.objectid;
		ret = subvol_get(fs, id, info);
		if (ret == -ENOENT) {
			/* no backref: a deleted subvolume waiting to be cleaned */
			ret = 0;
		} else if (ret) {
			break;
		} else {
			ret = fn(arg, info);
			if (ret)
				break;
		}
		key.objectid = id + 1;
		key.type = 0;
		key.offset = 0;
	}
	free(info);
	return ret == 1 ? 0 : ret;
}
