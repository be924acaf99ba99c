/*
 * attr.c — changing what an inode says about itself: setting and removing
 * xattrs (with the mode kept in step with an access ACL, and btrfs
 * properties checked as the kernel checks them) and setattr (mode, owner,
 * size, times; a chmod rewrites the access ACL, acl.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "format/checksum.h"
#include "namespace/namespace.h"

static void set_mode_bits(struct btrfs_inode_item *ii, void *arg)
{
	const u32 *mode = arg;

	btrfs_set_inode_mode(ii, (btrfs_inode_mode(ii) & ~(u32)0777) | (*mode & 0777));
	fs_now_ts(&ii->ctime);
}

int ns_setxattr(struct butter_fs *fs, butter_ino_t ino, const char *name, const void *value,
		size_t size)
{
	size_t nlen = strlen(name);
	u32 entry = (u32)(sizeof(struct btrfs_dir_item) + nlen + size);
	struct btrfs_inode_item ii;
	struct fs_write_state *w;
	struct subvol *sv;
	int ret, err = 0, equiv = 0, is_access = !strcmp(name, "system.posix_acl_access");
	int remove_only = 0;
	u32 mode = 0;

	if (nlen == 0 || nlen > 255)
		return -ERANGE;
	ret = inode_xattr_name_check(name, nlen);
	if (ret)
		return ret;
	if (entry > tree_max_item_size(&fs->cache))
		return -E2BIG; /* btrfs's limit: the name and value fit one leaf item */
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = inode_read(fs, ino, &ii);
	if (ret == 0)
		ret = inode_xattr_prop_check(name, nlen, value, size, btrfs_inode_flags(&ii));
	if (ret == 1) {
		remove_only = 1; /* an empty property: removed, as the kernel does */
		ret = 0;
	}
	sv = ret == 0 ? fs_subvol_mut(fs, ino.subvol, &err) : NULL;
	if (ret == 0 && !sv)
		ret = err;
	if (ret == 0 && is_access) {
		/* as btrfs: the mode follows the ACL; an ACL the mode says all of is not kept */
		mode = btrfs_inode_mode(&ii);
		equiv = ns_acl_update_mode(value, size, &mode);
		if (equiv < 0)
			ret = equiv;
	}
	if (ret)
		return fs_end_change(w, ret, 0);
	ret = inode_set_xattr_locked(fs, sv, ino.ino, name, equiv == 1 || remove_only ? NULL : value,
				     size);
	if (ret == 0)
		ret = is_access ? inode_modify(fs, sv, ino.ino, set_mode_bits, &mode)
				: inode_modify(fs, sv, ino.ino, inode_touch_ctime, NULL);
	return fs_end_change(w, ret, 1);
}

struct attr_update {
	const struct butter_stat *st;
	unsigned mask;
};

static void set_ts(struct btrfs_timespec *t, const struct timespec *ts)
{
	btrfs_set_timespec_sec(t, (u64)ts->tv_sec);
	btrfs_set_timespec_nsec(t, (u32)ts->tv_nsec);
}

static void apply_attr(struct btrfs_inode_item *ii, void *arg)
{
	struct attr_update *a = arg;
	const struct butter_stat *st = a->st;

	if (a->mask & BUTTER_SET_MODE)
		btrfs_set_inode_mode(ii, (btrfs_inode_mode(ii) & S_IFMT) | (st->mode & 07777));
	if (a->mask & BUTTER_SET_UID)
		btrfs_set_inode_uid(ii, st->uid);
	if (a->mask & BUTTER_SET_GID)
		btrfs_set_inode_gid(ii, st->gid);
	if (a->mask & BUTTER_SET_SIZE)
		btrfs_set_inode_size(ii, st->size);
	if (a->mask & BUTTER_SET_ATIME)
		set_ts(&ii->atime, &st->atime);
	if (a->mask & BUTTER_SET_MTIME)
		set_ts(&ii->mtime, &st->mtime);
	if (a->mask & BUTTER_SET_CTIME)
		set_ts(&ii->ctime, &st->ctime);
	else
		fs_now_ts(&ii->ctime);
}

/* chmod: an access ACL follows the new mode, as on btrfs (phase 2). */
static int chmod_acl(struct butter_fs *fs, struct subvol *sv, butter_ino_t ino, u32 mode)
{
	static const char name[] = "system.posix_acl_access";
	ssize_t len = inode_getxattr(fs, ino, name, NULL, 0);
	u8 *acl;
	int ret;

	if (len == -ENODATA || len == 0)
		return 0;
	if (len < 0)
		return (int)len;
	acl = malloc((size_t)len);
	if (!acl)
		return -ENOMEM;
	len = inode_getxattr(fs, ino, name, acl, (size_t)len);
	ret = len < 0 ? (int)len : ns_acl_chmod(acl, (size_t)len, mode);
	if (ret == 0)
		ret = inode_set_xattr_locked(fs, sv, ino.ino, name, acl, (size_t)len);
	else if (ret == -EINVAL)
		ret = 0; /* a malformed ACL stays as it is */
	free(acl);
	return ret;
}

int ns_setattr(struct butter_fs *fs, butter_ino_t ino, const struct butter_stat *st,
	       unsigned mask)
{
	struct attr_update a = { st, mask };
	struct btrfs_inode_item ii;
	struct fs_write_state *w;
	struct subvol *sv;
	int ret, err = 0;

	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = inode_read(fs, ino, &ii);
	if (ret == 0 && (mask & BUTTER_SET_SIZE) && !S_ISREG(btrfs_inode_mode(&ii)))
		ret = S_ISDIR(btrfs_inode_mode(&ii)) ? -EISDIR : -EINVAL;
	if (ret == 0 && (mask & BUTTER_SET_SIZE) && st->size > MAX_FILE_BYTES)
		ret = -EFBIG;
	sv = ret == 0 ? fs_subvol_mut(fs, ino.subvol, &err) : NULL;
	if (ret == 0 && !sv)
		ret = err;
	if (ret)
		return fs_end_change(w, ret, 0);
	if (mask & BUTTER_SET_SIZE) {
		ret = data_truncate(fs, sv, ino, st->size);
		a.mask &= ~BUTTER_SET_SIZE;
	}
	if (ret == 0 && (mask & BUTTER_SET_MODE))
		ret = chmod_acl(fs, sv, ino, st->mode);
	if (ret == 0)
		ret = inode_modify(fs, sv, ino.ino, apply_attr, &a);
	return fs_end_change(w, ret, 1);
}

struct xname {
	const char *name;
	size_t len;
};

int ns_removexattr(struct butter_fs *fs, butter_ino_t ino, const char *name)
{
	struct xname x = { name, strlen(name) };
	struct btrfs_key key = { ino.ino, BTRFS_XATTR_ITEM_KEY, btrfs_name_hash(name, x.len) };
	struct btrfs_inode_item ii;
	struct fs_write_state *w;
	struct subvol *sv = NULL;
	ssize_t have;
	int ret, err = 0;

	if (x.len == 0 || x.len > 255)
		return -ERANGE;
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = inode_read(fs, ino, &ii);
	if (ret == 0) {
		have = inode_getxattr(fs, ino, name, NULL, 0);
		if (have < 0)
			ret = (int)have;
	}
	if (ret == 0 && !(sv = fs_subvol_mut(fs, ino.subvol, &err)))
		ret = err;
	if (ret)
		return fs_end_change(w, ret, 0);
	ret = inode_cut_dir_entry(fs, &sv->root, &key, x.name, x.len);
	if (ret == 1)
		ret = -EUCLEAN;
	if (ret == 0)
		ret = inode_modify(fs, sv, ino.ino, inode_touch_ctime, NULL);
	return fs_end_change(w, ret, 1);
}
