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

/*
 * The inode flags the btrfs.compression property implies, as the kernel
 * applies it: an algorithm sets COMPRESS, "no" or "none" NOCOMPRESS, no
 * value (the property removed) neither.
 */
struct compress_prop {
	const char *value; /* NULL: removed */
	size_t size;
};

static void apply_compress_prop(struct btrfs_inode_item *ii, void *arg)
{
	const struct compress_prop *c = arg;
	u64 flags = btrfs_inode_flags(ii) & ~(BTRFS_INODE_COMPRESS_FLAG | BTRFS_INODE_NOCOMPRESS_FLAG);

	if (c->value && ((c->size == 2 && !memcmp(c->value, "no", 2)) ||
			 (c->size == 4 && !memcmp(c->value, "none", 4))))
		flags |= BTRFS_INODE_NOCOMPRESS_FLAG;
	else if (c->value)
		flags |= BTRFS_INODE_COMPRESS_FLAG;
	btrfs_set_inode_flags(ii, flags);
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
		ret = inode_may_change(&ii, INODE_FIXED);
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
	if (ret == 0 && !strcmp(name, "btrfs.compression")) {
		struct compress_prop c = { remove_only ? NULL : value, remove_only ? 0 : size };

		ret = inode_modify(fs, sv, ino.ino, apply_compress_prop, &c);
	} else if (ret == 0) {
		ret = is_access ? inode_modify(fs, sv, ino.ino, set_mode_bits, &mode)
				: inode_modify(fs, sv, ino.ino, inode_touch_ctime, NULL);
	}
	return fs_end_change(w, ret, 1);
}

struct attr_update {
	const struct butter_stat *st;
	unsigned mask;
	/*
	 * BUTTER_SET_KEEP_FILE_TIMES on a regular file: the mtime and ctime it
	 * had before the change, which the times the mask does not give keep
	 * (a truncate's too).
	 */
	bool keep_times;
	struct btrfs_timespec mtime, ctime;
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
	else if (a->keep_times)
		ii->mtime = a->mtime;
	if (a->mask & BUTTER_SET_CTIME)
		set_ts(&ii->ctime, &st->ctime);
	else if (a->keep_times)
		ii->ctime = a->ctime;
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

/* What chattr +i and +a leave settable (butter.h, butter_setattr()): 0 or -EPERM. */
static int setattr_allowed(const struct btrfs_inode_item *ii, unsigned mask)
{
	u64 flags = btrfs_inode_flags(ii);
	unsigned times = BUTTER_SET_ATIME | BUTTER_SET_MTIME;

	if (!(flags & INODE_FIXED))
		return 0;
	if (mask & (BUTTER_SET_MODE | BUTTER_SET_UID | BUTTER_SET_GID | BUTTER_SET_SIZE))
		return -EPERM;
	if (flags & BTRFS_INODE_IMMUTABLE_FLAG)
		return (mask & times) ? -EPERM : 0;
	/* append-only: times set to now, and an mtime alone (the writeback cache's) */
	if ((mask & BUTTER_SET_ATIME) && !(mask & BUTTER_SET_TIMES_NOW))
		return -EPERM;
	return 0;
}

int ns_setattr(struct butter_fs *fs, butter_ino_t ino, const struct butter_stat *st,
	       unsigned mask, struct butter_stat *out)
{
	struct attr_update a = { .st = st, .mask = mask };
	struct btrfs_inode_item ii;
	struct fs_write_state *w;
	struct subvol *sv;
	int ret, err = 0, stat_err = 0;

	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = inode_read(fs, ino, &ii);
	if (ret == 0)
		ret = setattr_allowed(&ii, mask);
	if (ret == 0 && (mask & BUTTER_SET_KEEP_FILE_TIMES) && S_ISREG(btrfs_inode_mode(&ii))) {
		a.keep_times = true;
		a.mtime = ii.mtime;
		a.ctime = ii.ctime;
	}
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
		ret = inode_modify_get(fs, sv, ino.ino, apply_attr, &a, &ii);
	if (ret == 0 && out) {
		/* before a commit the change may end with: what butter_stat() says now */
		inode_item_stat(fs, ino, &ii, out);
		stat_err = data_stat_buffered(fs, ino, out); /* a read: the change stands */
	}
	ret = fs_end_change(w, ret, 1);
	return ret ? ret : stat_err;
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
	if (ret == 0)
		ret = inode_may_change(&ii, INODE_FIXED);
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
	if (ret == 0 && !strcmp(name, "btrfs.compression")) {
		struct compress_prop c = { NULL, 0 };

		ret = inode_modify(fs, sv, ino.ino, apply_compress_prop, &c);
	} else if (ret == 0) {
		ret = inode_modify(fs, sv, ino.ino, inode_touch_ctime, NULL);
	}
	return fs_end_change(w, ret, 1);
}

/* ---- chattr's flags (butter.h, BUTTER_FL_*) ---- */

/* The pairs of a btrfs inode flag and the BUTTER_FL_ (FS_*_FL) flag that shows it one to one. */
static const struct {
	u64 btrfs;
	u32 fl;
} plain_flags[] = {
	{ BTRFS_INODE_SYNC_FLAG, BUTTER_FL_SYNC },
	{ BTRFS_INODE_IMMUTABLE_FLAG, BUTTER_FL_IMMUTABLE },
	{ BTRFS_INODE_APPEND_FLAG, BUTTER_FL_APPEND },
	{ BTRFS_INODE_NODUMP_FLAG, BUTTER_FL_NODUMP },
	{ BTRFS_INODE_NOATIME_FLAG, BUTTER_FL_NOATIME },
	{ BTRFS_INODE_DIRSYNC_FLAG, BUTTER_FL_DIRSYNC },
};
#define NPLAIN (sizeof(plain_flags) / sizeof(plain_flags[0]))

/* The read-only flags live in the upper half of the item's flags (the kernel's ro_flags). */
#define INODE_RO_VERITY (1ULL << 32)

static u32 fl_of(u64 iflags)
{
	u32 fl = 0;
	size_t i;

	for (i = 0; i < NPLAIN; i++)
		if (iflags & plain_flags[i].btrfs)
			fl |= plain_flags[i].fl;
	if (iflags & BTRFS_INODE_NODATACOW_FLAG)
		fl |= BUTTER_FL_NOCOW;
	if (iflags & BTRFS_INODE_NOCOMPRESS_FLAG)
		fl |= BUTTER_FL_NOCOMP;
	else if (iflags & BTRFS_INODE_COMPRESS_FLAG)
		fl |= BUTTER_FL_COMPR;
	if (iflags & INODE_RO_VERITY)
		fl |= BUTTER_FL_VERITY;
	return fl;
}

int ns_get_fileattr(struct butter_fs *fs, butter_ino_t ino, uint32_t *flags)
{
	struct btrfs_inode_item ii;
	int ret = inode_read(fs, ino, &ii);

	if (ret == 0)
		*flags = fl_of(btrfs_inode_flags(&ii));
	return ret;
}

struct fileattr_update {
	u64 iflags;
};

static void set_iflags(struct btrfs_inode_item *ii, void *arg)
{
	const struct fileattr_update *u = arg;

	btrfs_set_inode_flags(ii, u->iflags);
	fs_now_ts(&ii->ctime);
}

/*
 * The btrfs inode flags @fl makes of @old, as btrfs's SETFLAGS (@ii: the
 * inode, @size: its size with what is buffered, for NOCOW's rules).
 */
static u64 iflags_of(const struct btrfs_inode_item *ii, u64 size, u64 old, u32 fl)
{
	u64 nocow = BTRFS_INODE_NODATACOW_FLAG | BTRFS_INODE_NODATASUM_FLAG, f = old;
	int reg = S_ISREG(btrfs_inode_mode(ii)), empty = size == 0;
	size_t i;

	for (i = 0; i < NPLAIN; i++)
		f = (fl & plain_flags[i].fl) ? f | plain_flags[i].btrfs : f & ~plain_flags[i].btrfs;
	/* a regular file changes its COW only while it has no data (its csums follow) */
	if (!reg)
		f = (fl & BUTTER_FL_NOCOW) ? f | BTRFS_INODE_NODATACOW_FLAG
					   : f & ~BTRFS_INODE_NODATACOW_FLAG;
	else if (empty)
		f = (fl & BUTTER_FL_NOCOW) ? f | nocow : f & ~nocow;
	f &= ~(BTRFS_INODE_COMPRESS_FLAG | BTRFS_INODE_NOCOMPRESS_FLAG);
	if (fl & BUTTER_FL_NOCOMP)
		f |= BTRFS_INODE_NOCOMPRESS_FLAG;
	else if (fl & BUTTER_FL_COMPR)
		f |= BTRFS_INODE_COMPRESS_FLAG;
	return f;
}

int ns_set_fileattr(struct butter_fs *fs, butter_ino_t ino, uint32_t fl)
{
	const u32 settable = BUTTER_FL_SYNC | BUTTER_FL_IMMUTABLE | BUTTER_FL_APPEND |
			     BUTTER_FL_NODUMP | BUTTER_FL_NOATIME | BUTTER_FL_DIRSYNC |
			     BUTTER_FL_NOCOW | BUTTER_FL_COMPR | BUTTER_FL_NOCOMP;
	static const char *const algo[] = { "zlib", "zlib", "lzo", "zstd" };
	struct fileattr_update u;
	struct btrfs_inode_item ii;
	struct fs_write_state *w;
	struct subvol *sv = NULL;
	u32 old;
	int ret, err = 0;

	if (fl & ~settable)
		return -EOPNOTSUPP;
	if ((fl & BUTTER_FL_NOCOMP) && (fl & BUTTER_FL_COMPR))
		return -EINVAL;
	if ((fl & BUTTER_FL_COMPR) && (fl & BUTTER_FL_NOCOW))
		return -EINVAL;
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = inode_read(fs, ino, &ii);
	old = ret == 0 ? fl_of(btrfs_inode_flags(&ii)) : 0;
	if (ret == 0 && (old & BUTTER_FL_NOCOW) && (fl & (BUTTER_FL_COMPR | BUTTER_FL_NOCOMP)))
		ret = -EINVAL; /* compression means nothing to a nodatacow inode */
	if (ret == 0 && !(sv = fs_subvol_mut(fs, ino.subvol, &err)))
		ret = err;
	if (ret)
		return fs_end_change(w, ret, 0);
	u.iflags = iflags_of(&ii, data_buffered_size(fs, ino, btrfs_inode_size(&ii)),
			     btrfs_inode_flags(&ii), fl);
	ret = inode_modify(fs, sv, ino.ino, set_iflags, &u);
	/* the property follows: the algorithm for COMPR, gone otherwise */
	if (ret == 0 && (fl & BUTTER_FL_COMPR)) {
		int type = fs->w->compress_type;
		const char *name = type > 0 && type <= BTRFS_COMPRESS_ZSTD ? algo[type] : "zlib";

		ret = inode_set_xattr_locked(fs, sv, ino.ino, "btrfs.compression", name,
					     strlen(name));
	} else if (ret == 0 && inode_getxattr(fs, ino, "btrfs.compression", NULL, 0) >= 0) {
		ret = inode_set_xattr_locked(fs, sv, ino.ino, "btrfs.compression", NULL, 0);
	}
	return fs_end_change(w, ret, 1);
}
