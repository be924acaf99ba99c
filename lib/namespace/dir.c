/*
 * dir.c — directory iteration in DIR_INDEX order.
 *
 * Each DIR_INDEX item (dir, DIR_INDEX, index) holds exactly one entry; the
 * index is the position a reader resumes from (next_pos = index + 1). Entries
 * naming subvolumes are resolved to their root directory here, so a caller
 * walking the tree crosses subvolume boundaries like the kernel's mount does.
 *
 * A rename gives the new name a fresh index past the directory's last one, so
 * a listing that renames what it lists would never reach the end: a caller
 * that lists while others change the directory takes the bound of
 * butter_readdir_end() first (at opendir, as the kernel) and passes it to
 * butter_readdir_until(); each name present then is reported at most once.
 */
#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "namespace/namespace.h"

/* Read @dir's inode and subvolume: 0, -ENOTDIR, negative errno. */
static int dir_subvol(struct butter_fs *fs, butter_ino_t dir, struct subvol *sv)
{
	struct btrfs_inode_item inode;
	int ret = inode_read(fs, dir, &inode);

	if (ret)
		return ret;
	if (!S_ISDIR(btrfs_inode_mode(&inode)))
		return -ENOTDIR;
	return fs_get_subvol(fs, dir.subvol, sv);
}

int ns_readdir_end(struct butter_fs *fs, butter_ino_t dir, uint64_t *end)
{
	struct btrfs_key key = { dir.ino, BTRFS_DIR_INDEX_KEY, (u64)-1 };
	struct subvol sv;
	int ret;

	*end = 0;
	if (dir.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID)
		return 0;
	ret = dir_subvol(fs, dir, &sv);
	if (ret == 0)
		ret = tree_find_key(&fs->cache, &sv.root, &key, 1, &key);
	if (ret < 0)
		return ret;
	if (ret == 0 && key.objectid == dir.ino && key.type == BTRFS_DIR_INDEX_KEY)
		*end = key.offset == UINT64_MAX ? UINT64_MAX : key.offset + 1;
	return 0;
}

int ns_readdir(struct butter_fs *fs, butter_ino_t dir, uint64_t pos, butter_dirent_fn fn,
	       void *arg)
{
	return ns_readdir_until(fs, dir, pos, UINT64_MAX, fn, arg);
}

int ns_readdir_until(struct butter_fs *fs, butter_ino_t dir, uint64_t pos, uint64_t end,
		     butter_dirent_fn fn, void *arg)
{
	struct btrfs_key key;
	struct tree_path path;
	struct subvol sv;
	int ret, stopped = 0;

	if (dir.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID)
		return 0;
	ret = dir_subvol(fs, dir, &sv);
	if (ret)
		return ret;
	key.objectid = dir.ino;
	key.type = BTRFS_DIR_INDEX_KEY;
	key.offset = pos;
	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &sv.root, &key, &path);
	while (ret == 0) {
		const struct btrfs_dir_item *di;
		struct btrfs_key location;
		butter_ino_t ino;
		const u8 *item;
		u32 size, name_len;

		path_key(&path, &key);
		if (key.objectid != dir.ino || key.type != BTRFS_DIR_INDEX_KEY || key.offset >= end)
			break;
		item = path_item(&path, &size);
		di = (const struct btrfs_dir_item *)item;
		if (size < sizeof(*di)) {
			ret = BLOG_CORRUPT(&fs->log, "dir %llu index %llu: short item",
					   (unsigned long long)dir.ino, (unsigned long long)key.offset);
			break;
		}
		name_len = btrfs_dir_name_len(di);
		if (name_len == 0 || name_len > BTRFS_NAME_LEN || sizeof(*di) + name_len > size) {
			ret = BLOG_CORRUPT(&fs->log, "dir %llu index %llu: bad name length %u",
					   (unsigned long long)dir.ino, (unsigned long long)key.offset,
					   name_len);
			break;
		}
		btrfs_disk_to_cpu_key(&location, &di->location);
		ret = inode_location_to_ino(fs, dir.subvol, &location, &ino);
		if (ret)
			break;
		ret = fn(arg, (const char *)(di + 1), name_len, ino, inode_ft_to_dtype(di->type),
			 key.offset + 1);
		if (ret) {
			stopped = ret;
			break;
		}
		if (key.offset == UINT64_MAX)
			break;
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	if (stopped)
		return stopped;
	return ret == 1 ? 0 : ret;
}
