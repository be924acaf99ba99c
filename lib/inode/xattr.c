/*
 * xattr.c — extended attributes: XATTR_ITEM items keyed (ino, XATTR_ITEM,
 * name_hash(name)); one item may hold several entries whose names collide,
 * each a dir_item followed by the name and the value. POSIX ACLs are the
 * xattrs system.posix_acl_access/default, stored in the kernel's binary form,
 * which is what getxattr(2) returns too.
 *
 * Names outside the namespaces the kernel's btrfs handles are refused, by
 * get, set and remove alike (inode_xattr_name_check); listing shows whatever
 * the items hold. A btrfs property (btrfs.compression) is checked as the
 * kernel checks it (inode_xattr_prop_check) and stored as the kernel stores
 * it, as an xattr; the kernel applies it to the inode when it loads one.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/checksum.h"
#include "inode/inode.h"

int inode_xattr_name_check(const char *name, size_t len)
{
	static const char *const prefixes[] = { "user.", "trusted.", "security.", "btrfs." };
	static const char *const system_names[] = { "system.posix_acl_access",
						    "system.posix_acl_default" };
	size_t i;

	for (i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
		size_t plen = strlen(prefixes[i]);

		if (len >= plen && !memcmp(name, prefixes[i], plen))
			return len == plen ? -EINVAL : 0;
	}
	for (i = 0; i < sizeof(system_names) / sizeof(system_names[0]); i++) {
		if (len == strlen(system_names[i]) && !memcmp(name, system_names[i], len))
			return 0;
	}
	return -EOPNOTSUPP;
}

int inode_xattr_prop_check(const char *name, size_t len, const void *value, size_t size,
			   u64 iflags)
{
	static const char *const algos[] = { "zlib", "lzo", "zstd" };
	static const char prop[] = "btrfs.compression";
	size_t i;

	if (len < 6 || memcmp(name, "btrfs.", 6))
		return 0;
	if (len != sizeof(prop) - 1 || memcmp(name, prop, len))
		return -EINVAL;
	if (iflags & (BTRFS_INODE_NODATACOW_FLAG | BTRFS_INODE_NODATASUM_FLAG))
		return -EINVAL; /* such files are never compressed */
	if (size == 0)
		return 1; /* no value: remove the property (back to the mount's default) */
	if ((size == 2 && !memcmp(value, "no", 2)) || (size == 4 && !memcmp(value, "none", 4)))
		return 0;
	for (i = 0; i < sizeof(algos) / sizeof(algos[0]); i++) {
		size_t alen = strlen(algos[i]);

		if (size >= alen && !memcmp(value, algos[i], alen))
			return 0; /* a level may follow ("zstd:3"), as the kernel reads it */
	}
	return -EINVAL;
}

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

ssize_t inode_listxattr(struct butter_fs *fs, butter_ino_t ino, char *buf, size_t size)
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
		ret = inode_walk_dir_items(fs, item, isize, list_one, &c);
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

ssize_t inode_getxattr(struct butter_fs *fs, butter_ino_t ino, const char *name, void *buf,
		       size_t size)
{
	struct get_ctx c = { name, strlen(name), buf, size, -ENODATA };
	struct btrfs_key key;
	struct tree_path path;
	struct subvol sv;
	int ret;

	if (c.len == 0 || c.len > 255)
		return -ERANGE;
	ret = inode_xattr_name_check(name, c.len);
	if (ret)
		return ret;
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
		ret = inode_walk_dir_items(fs, item, isize, get_one, &c);
	}
	tree_path_release(&fs->cache, &path);
	if (ret < 0)
		return ret;
	return c.result;
}

struct xattr_ctx {
	const char *name;
	size_t len;
	u8 *keep;       /* entries other than @name */
	u32 keep_len;
	int found;
};

static int keep_other(void *arg, const struct btrfs_dir_item *di, const char *name,
		      const u8 *value)
{
	struct xattr_ctx *c = arg;
	u32 total = (u32)sizeof(*di) + btrfs_dir_name_len(di) + btrfs_dir_data_len(di);

	(void)value;
	if (btrfs_dir_name_len(di) == c->len && memcmp(name, c->name, c->len) == 0) {
		c->found = 1;
		return 0;
	}
	memcpy(c->keep + c->keep_len, di, total);
	c->keep_len += total;
	return 0;
}

int inode_set_xattr_locked(struct butter_fs *fs, struct subvol *sv, u64 ino, const char *name,
			   const void *value, size_t size)
{
	struct fs_write_state *w = fs->w;
	size_t nlen = strlen(name);
	struct btrfs_key key = { ino, BTRFS_XATTR_ITEM_KEY, btrfs_name_hash(name, nlen) };
	struct btrfs_key zero = { 0, 0, 0 };
	struct xattr_ctx c = { name, nlen, NULL, 0, 0 };
	u32 entry = (u32)(sizeof(struct btrfs_dir_item) + nlen + size);
	struct tree_path path;
	u8 *buf;
	int ret;

	/* take out an existing entry of that name, keeping colliding others */
	tree_path_init(&path);
	ret = tree_search_slot(&w->txn.tt, &sv->root, &key, &path, 0, 1);
	if (ret == 0) {
		u32 isize;
		const u8 *item = path_item(&path, &isize);

		c.keep = malloc(isize);
		if (!c.keep)
			ret = -ENOMEM;
		else
			ret = inode_walk_dir_items(fs, item, isize, keep_other, &c);
		if (ret == 0)
			ret = tree_del_items(&w->txn.tt, &sv->root, &path, 1);
	} else if (ret == 1) {
		ret = 0;
	}
	tree_path_release(&fs->cache, &path);
	if (ret == 0 && c.keep_len) {
		tree_path_init(&path);
		ret = tree_insert_item(&w->txn.tt, &sv->root, &key, c.keep, c.keep_len);
	}
	free(c.keep);
	if (ret || !value)
		return ret;
	buf = calloc(1, entry);
	if (!buf)
		return -ENOMEM;
	{
		struct btrfs_dir_item *di = (void *)buf;

		btrfs_cpu_to_disk_key(&di->location, &zero);
		btrfs_set_dir_transid(di, w->txn.tt.transid);
		btrfs_set_dir_data_len(di, (u16)size);
		btrfs_set_dir_name_len(di, (u16)nlen);
		di->type = BTRFS_FT_XATTR;
		memcpy(buf + sizeof(*di), name, nlen);
		memcpy(buf + sizeof(*di) + nlen, value, size);
		ret = fs_insert_or_extend(&w->txn.tt, &sv->root, &key, buf, entry);
	}
	free(buf);
	return ret;
}
