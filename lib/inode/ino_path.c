/*
 * ino_path.c — naming an inode for messages: one path from its subvolume's
 * root directory, found by following the first INODE_REF (or, for an inode
 * that has only extended refs, the first INODE_EXTREF) of each inode up to
 * the root, and the "subvolume S inode I path P file offset O" text every
 * data error carries (lib/data/read.c, lib/ops/scrub.c).
 *
 * It is also the one reader of "the first name of an inode" for the rest of
 * the library (lib/subvol/list.c builds subvolume paths with it).
 *
 * Promises:
 *  1. Only reads: safe from any reader, at any time, on any handle.
 *  2. A name that cannot be found (an orphan, a damaged ref, a loop, a path
 *     longer than the buffer) ends the walk with an error; the description
 *     then says the path is unknown instead of guessing.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "inode/inode.h"

#define MAX_DEPTH 4096

int inode_first_name(struct butter_fs *fs, const struct tree_root *root, u64 ino, u8 type,
		     u64 *parent, char *name, size_t *name_len)
{
	struct btrfs_key key = { ino, type, 0 };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, root, &key, &path);
	if (ret == 0) {
		struct inode_ref_name rn;
		const u8 *item;
		u32 size, len;

		path_key(&path, &key);
		item = path_item(&path, &size);
		if (key.objectid != ino || key.type != type) {
			ret = -ENOENT;
		} else {
			/* the first entry of the item, decoded by names.c */
			len = inode_ref_entry_len(type, item, size);
			if (len)
				inode_ref_decode(type, key.offset, item, &rn);
			if (!len || rn.len == 0 || rn.len > BTRFS_NAME_LEN) {
				ret = BLOG_CORRUPT(&fs->log, "inode ref of %llu: malformed",
						   (unsigned long long)ino);
			} else {
				*parent = rn.parent;
				memcpy(name, rn.name, rn.len);
				*name_len = rn.len;
			}
		}
	} else if (ret == 1) {
		ret = -ENOENT;
	}
	tree_path_release(&fs->cache, &path);
	return ret;
}

/*
 * Write one path of inode @ino of subvolume @subvol, from the subvolume's
 * root directory ("a/b/c"; "" for the root itself), into @out (@cap bytes).
 * Returns 0, -ENOENT (no name: an orphan, or a missing ref), -ENAMETOOLONG,
 * -ELOOP, -EUCLEAN, or -errno.
 */
int inode_path(struct butter_fs *fs, u64 subvol, u64 ino, char *out, size_t cap)
{
	char name[BTRFS_NAME_LEN];
	struct subvol sv;
	size_t start = cap, nlen;
	int depth, ret;

	if (cap == 0)
		return -ENAMETOOLONG;
	ret = fs_get_subvol(fs, subvol, &sv);
	if (ret)
		return ret;
	out[--start] = '\0';
	for (depth = 0; ino != sv.dirid; depth++) {
		u64 parent = 0;

		if (depth == MAX_DEPTH)
			return -ELOOP;
		ret = inode_first_name(fs, &sv.root, ino, BTRFS_INODE_REF_KEY, &parent, name,
				       &nlen);
		if (ret == -ENOENT)
			ret = inode_first_name(fs, &sv.root, ino, BTRFS_INODE_EXTREF_KEY, &parent,
					       name, &nlen);
		if (ret)
			return ret;
		if (parent == ino)
			return -ELOOP;
		if (nlen + (depth ? 1 : 0) > start)
			return -ENAMETOOLONG;
		if (depth)
			out[--start] = '/';
		start -= nlen;
		memcpy(out + start, name, nlen);
		ino = parent;
	}
	memmove(out, out + start, cap - start);
	return 0;
}

const char *inode_describe_file_pos(struct butter_fs *fs, u64 subvol, u64 ino, u64 file_offset,
				    char *buf, size_t size)
{
	char path[1024];
	int ret = inode_path(fs, subvol, ino, path, sizeof(path));

	if (ret == 0)
		snprintf(buf, size, "subvolume %llu inode %llu path \"%s\" file offset %llu",
			 (unsigned long long)subvol, (unsigned long long)ino, path,
			 (unsigned long long)file_offset);
	else
		snprintf(buf, size,
			 "subvolume %llu inode %llu (path unknown: %s) file offset %llu",
			 (unsigned long long)subvol, (unsigned long long)ino,
			 ret == -ENOENT ? "no name found" : strerror(-ret),
			 (unsigned long long)file_offset);
	return buf;
}
