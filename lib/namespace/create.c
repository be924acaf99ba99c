/*
 * create.c — giving new inodes their first name: create (files, directories,
 * device nodes, fifos, sockets), O_TMPFILE inodes (no name, an orphan until
 * linked), symlinks, and hard links. The name items they add are
 * lib/inode/names.c's; a new inode inherits its directory's default ACL
 * (acl.c).
 *
 * Every call runs as a change (lib/fs/change.c): phase 1 checks that the
 * name is free and the directory writable, phase 2 changes the trees.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "namespace/namespace.h"

/* Phase-1 checks for a new name in @dir; returns the canonical subvolume. */
int ns_check_new_name(struct butter_fs *fs, butter_ino_t dir, const char *name,
			  size_t namelen, struct subvol **svp)
{
	struct btrfs_inode_item ii;
	butter_ino_t existing;
	int ret, err = 0;

	if (namelen == 0 || memchr(name, '/', namelen) || memchr(name, '\0', namelen))
		return -EINVAL;
	if (namelen > BTRFS_NAME_LEN)
		return -ENAMETOOLONG;
	if ((namelen == 1 && name[0] == '.') || (namelen == 2 && !memcmp(name, "..", 2)))
		return -EEXIST;
	if (dir.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID)
		return -EPERM;
	ret = inode_read(fs, dir, &ii);
	if (ret)
		return ret;
	if (!S_ISDIR(btrfs_inode_mode(&ii)))
		return -ENOTDIR;
	if (btrfs_inode_nlink(&ii) == 0)
		return -ENOENT; /* a removed directory still open (orphan.c) */
	ret = inode_lookup(fs, dir, name, namelen, &existing);
	if (ret == 0)
		return -EEXIST;
	if (ret != -ENOENT)
		return ret;
	ret = inode_may_change(&ii, BTRFS_INODE_IMMUTABLE_FLAG); /* no new name in +i */
	if (ret)
		return ret;
	*svp = fs_subvol_mut(fs, dir.subvol, &err);
	return *svp ? 0 : err;
}

/*
 * A new inode in directory @dir (inode_create), with what it inherits from
 * @dir as on the kernel's btrfs: chattr's +c or +m (the compression
 * flags) and +C (nodatacow, and nodatasum for a regular file), and the
 * btrfs.compression property unless the new inode is nodatacow.
 */
static int create_in(struct butter_fs *fs, struct subvol *sv, butter_ino_t dir,
		     const struct butter_new_inode *a, u64 size, u64 *ino)
{
	static const char prop[] = "btrfs.compression";
	struct btrfs_inode_item dii;
	u64 dflags, iflags = 0;
	char value[64];
	ssize_t n;
	int ret = inode_read(fs, dir, &dii);

	if (ret)
		return ret;
	dflags = btrfs_inode_flags(&dii);
	if (dflags & BTRFS_INODE_NOCOMPRESS_FLAG)
		iflags |= BTRFS_INODE_NOCOMPRESS_FLAG;
	else if (dflags & BTRFS_INODE_COMPRESS_FLAG)
		iflags |= BTRFS_INODE_COMPRESS_FLAG;
	if (dflags & BTRFS_INODE_NODATACOW_FLAG)
		iflags |= BTRFS_INODE_NODATACOW_FLAG |
			  (S_ISREG(a->mode) ? BTRFS_INODE_NODATASUM_FLAG : 0);
	ret = inode_create(fs, sv, a, size, iflags, ino);
	if (ret || (iflags & BTRFS_INODE_NODATACOW_FLAG))
		return ret;
	n = inode_getxattr(fs, dir, prop, value, sizeof(value));
	if (n == -ENODATA || n == -ERANGE)
		return 0; /* none (a value too long for a property was never valid) */
	if (n < 0)
		return (int)n;
	return n ? inode_set_xattr_locked(fs, sv, *ino, prop, value, (size_t)n) : 0;
}

/*
 * Create an empty inode (create_in) and give it the ACLs ns_acl_inherit() chose
 * (@acls: an access and, for a directory, a default ACL, either NULL for none).
 * Frees @acls whatever happens.
 */
static int create_inode_with_acls(struct butter_fs *fs, struct subvol *sv, butter_ino_t dir,
				  const struct butter_new_inode *a, struct fs_acl_set *acls,
				  u64 *ino)
{
	int ret = create_in(fs, sv, dir, a, 0, ino);

	if (ret == 0 && acls->access)
		ret = inode_set_xattr_locked(fs, sv, *ino, "system.posix_acl_access", acls->access,
					     acls->len);
	if (ret == 0 && acls->dflt)
		ret = inode_set_xattr_locked(fs, sv, *ino, "system.posix_acl_default", acls->dflt,
					     acls->len);
	ns_acl_set_free(acls);
	return ret;
}

int ns_create(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
	      const struct butter_new_inode *attr, butter_ino_t *out)
{
	struct butter_new_inode a = *attr;
	struct fs_acl_set acls = { NULL, NULL, 0 };
	struct fs_write_state *w;
	struct subvol *sv;
	u64 ino;
	int ret;

	switch (attr->mode & S_IFMT) {
	case S_IFREG: case S_IFDIR: case S_IFCHR: case S_IFBLK: case S_IFIFO: case S_IFSOCK:
		break;
	default:
		return -EINVAL;
	}
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = ns_check_new_name(fs, dir, name, namelen, &sv);
	if (ret == 0 && (attr->flags & BUTTER_NEW_INHERIT_ACL))
		ret = ns_acl_inherit(fs, dir, &a.mode, attr->umask, &acls);
	if (ret)
		return fs_end_change(w, ret, 0);
	ret = create_inode_with_acls(fs, sv, dir, &a, &acls, &ino);
	if (ret == 0)
		ret = inode_add_name(fs, sv, dir.ino, name, namelen, ino, a.mode);
	if (ret == 0 && out) {
		out->subvol = sv->id;
		out->ino = ino;
	}
	return fs_end_change(w, ret, 1);
}

int ns_create_tmpfile(struct butter_fs *fs, butter_ino_t dir,
		      const struct butter_new_inode *attr, butter_ino_t *out)
{
	struct butter_new_inode a = *attr;
	struct fs_acl_set acls = { NULL, NULL, 0 };
	struct btrfs_inode_item dii;
	struct fs_write_state *w;
	struct subvol *sv = NULL;
	u64 ino;
	int ret, err = 0;

	if ((attr->mode & S_IFMT) != S_IFREG)
		return -EINVAL;
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = dir.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID ? -EPERM : inode_read(fs, dir, &dii);
	if (ret == 0 && !S_ISDIR(btrfs_inode_mode(&dii)))
		ret = -ENOTDIR;
	if (ret == 0 && btrfs_inode_nlink(&dii) == 0)
		ret = -ENOENT;
	if (ret == 0)
		ret = inode_may_change(&dii, BTRFS_INODE_IMMUTABLE_FLAG);
	if (ret == 0 && !(sv = fs_subvol_mut(fs, dir.subvol, &err)))
		ret = err;
	if (ret == 0 && (attr->flags & BUTTER_NEW_INHERIT_ACL))
		ret = ns_acl_inherit(fs, dir, &a.mode, attr->umask, &acls);
	if (ret)
		return fs_end_change(w, ret, 0);
	ret = create_inode_with_acls(fs, sv, dir, &a, &acls, &ino);
	if (ret == 0)
		ret = ns_orphan_tmpfile(fs, sv, ino);
	if (ret == 0 && out) {
		out->subvol = sv->id;
		out->ino = ino;
	}
	return fs_end_change(w, ret, 1);
}

int ns_symlink(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
	       const char *target, uint32_t uid, uint32_t gid, butter_ino_t *out)
{
	struct butter_new_inode a = { .mode = S_IFLNK | 0777, .uid = uid, .gid = gid };
	struct fs_write_state *w;
	size_t tlen = strlen(target);
	struct subvol *sv;
	u64 ino;
	int ret;

	if (tlen == 0)
		return -ENOENT;
	if (tlen >= 4096 ||
	    tlen > tree_max_item_size(&fs->cache) - BTRFS_FILE_EXTENT_INLINE_DATA_START)
		return -ENAMETOOLONG; /* as btrfs: the target is one inline extent */
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = ns_check_new_name(fs, dir, name, namelen, &sv);
	if (ret)
		return fs_end_change(w, ret, 0);
	ret = create_in(fs, sv, dir, &a, tlen, &ino);
	if (ret == 0)
		ret = data_insert_inline(fs, sv, ino, target, (u32)tlen);
	if (ret == 0)
		ret = inode_add_name(fs, sv, dir.ino, name, namelen, ino, a.mode);
	if (ret == 0 && out) {
		out->subvol = sv->id;
		out->ino = ino;
	}
	return fs_end_change(w, ret, 1);
}

static void inc_nlink(struct btrfs_inode_item *ii, void *arg)
{
	(void)arg;
	btrfs_set_inode_nlink(ii, btrfs_inode_nlink(ii) + 1);
	fs_now_ts(&ii->ctime);
}

int ns_link(struct butter_fs *fs, butter_ino_t ino, butter_ino_t dir, const char *name,
	    size_t namelen)
{
	struct btrfs_inode_item ii;
	struct fs_write_state *w;
	struct subvol *sv;
	int ret;

	if (ino.subvol != dir.subvol)
		return -EXDEV;
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = inode_read(fs, ino, &ii);
	if (ret == 0 && S_ISDIR(btrfs_inode_mode(&ii)))
		ret = -EPERM;
	if (ret == 0 && btrfs_inode_nlink(&ii) >= 65535)
		ret = -EMLINK;
	/* an open orphan (orphan.c) gets no new name, unless it was made nameless */
	if (ret == 0 && btrfs_inode_nlink(&ii) == 0 && !ns_orphan_linkable(fs, ino))
		ret = -ENOENT;
	if (ret == 0)
		ret = ns_check_new_name(fs, dir, name, namelen, &sv);
	if (ret == 0) /* +i and +a files get no new name */
		ret = inode_may_change(&ii, INODE_FIXED);
	if (ret)
		return fs_end_change(w, ret, 0);
	ret = btrfs_inode_nlink(&ii) == 0 ? ns_orphan_relink(fs, sv, ino.ino) : 0;
	if (ret == 0)
		ret = inode_modify(fs, sv, ino.ino, inc_nlink, NULL);
	if (ret == 0)
		ret = inode_add_name(fs, sv, dir.ino, name, namelen, ino.ino, btrfs_inode_mode(&ii));
	return fs_end_change(w, ret, 1);
}
