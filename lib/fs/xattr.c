/*
 * xattr.c — extended attributes: XATTR_ITEM items keyed (ino, XATTR_ITEM,
 * name_hash(name)); one item may hold several entries whose names collide,
 * each a dir_item followed by the name and the value. POSIX ACLs are the
 * xattrs system.posix_acl_access/default, stored in the kernel's binary form,
 * which is what getxattr(2) returns too.
 */
#include <errno.h>
#include <string.h>

#include "format/checksum.h"
#include "fs/fs.h"

struct list_ctx {
	char *buf;
	size_t size, used;
	int overflow;
};

static int list_one(void *arg, const struct btrfs_dir_item *di, const char *name, const u8 *value)
{
	struct list_ctx *c = arg;
	size_t len = btrfs_dir_name_len(di);

	(void)value;
	if (c->size && c->used + len + 1 > c->size)
		c->overflow = 1;
	else if (c->size) {
		memcpy(c->buf + c->used, name, len);
		c->buf[c->used + len] = '\0';
	}
	c->used += len + 1;
	return 0;
}

ssize_t butter_listxattr(struct butter_fs *fs, butter_ino_t ino, char *buf, size_t size)
{
	struct list_ctx c = { buf, size, 0, 0 };
	struct btrfs_key key = { ino.ino, BTRFS_XATTR_ITEM_KEY, 0 };
	struct tree_path path;
	struct subvol sv;
	int ret;

	if (ino.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID)
		return 0;
	ret = fs_get_subvol(fs, ino.subvol, &sv);
	if (ret)
		return ret;
	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &sv.root, &key, &path);
	while (ret == 0) {
		const u8 *item;
		u32 isize;

		path_key(&path, &key);
		if (key.objectid != ino.ino || key.type != BTRFS_XATTR_ITEM_KEY)
			break;
		item = path_item(&path, &isize);
		ret = fs_walk_dir_items(fs, item, isize, list_one, &c);
		if (ret)
			break;
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	if (ret < 0)
		return ret;
	if (c.overflow)
		return -ERANGE;
	return (ssize_t)c.used;
}

struct get_ctx {
	const char *name;
	size_t len;
	void *buf;
	size_t size;
	ssize_t result;
};

static int get_one(void *arg, const struct btrfs_dir_item *di, const char *name, const u8 *value)
{
	struct get_ctx *c = arg;
	size_t vlen = btrfs_dir_data_len(di);

	if (btrfs_dir_name_len(di) != c->len || memcmp(name, c->name, c->len) != 0)
		return 0;
	if (c->size == 0) {
		c->result = (ssize_t)vlen;
	} else if (vlen > c->size) {
		c->result = -ERANGE;
	} else {
		memcpy(c->buf, value, vlen);
		c->result = (ssize_t)vlen;
	}
	return 1;
}

ssize_t butter_getxattr(struct butter_fs *fs, butter_ino_t ino, const char *name, void *buf,
			size_t size)
{
	struct get_ctx c = { name, strlen(name), buf, size, -ENODATA };
	struct btrfs_key key;
	struct tree_path path;
	struct subvol sv;
	int ret;

	if (c.len == 0 || c.len > 255)
		return -ERANGE;
	if (ino.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID)
		return -ENODATA;
	ret = fs_get_subvol(fs, ino.subvol, &sv);
	if (ret)
		return ret;
	key.objectid = ino.ino;
	key.type = BTRFS_XATTR_ITEM_KEY;
	key.offset = btrfs_name_hash(name, c.len);
	tree_path_init(&path);
	ret = tree_search(&fs->cache, &sv.root, &key, &path);
	if (ret == 0) {
		const u8 *item;
		u32 isize;

		item = path_item(&path, &isize);
		ret = fs_walk_dir_items(fs, item, isize, get_one, &c);
	}
	tree_path_release(&fs->cache, &path);
	if (ret < 0)
		return ret;
	return c.result;
}
