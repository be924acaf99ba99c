/*
 * namespace.h — the namespace layer: the rules of names and files as POSIX
 * states them, on top of the inode and data layers. Creating (create.c),
 * removing and renaming (namei.c), path resolution (path.c), directory
 * listing (dir.c), attributes and xattrs (attr.c), POSIX ACLs (acl.c), files
 * that outlive their last name (orphan.c) and access times (atime.c).
 * Not a public header.
 */
#ifndef BUTTER_NAMESPACE_NAMESPACE_H
#define BUTTER_NAMESPACE_NAMESPACE_H

#include "data/data.h"

/* ---- create.c ---- */
/* Phase 1 of a new name: @dir is a writable directory and @name is free in it. */
int ns_check_new_name(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		      struct subvol **svp);

/* ---- namei.c ---- */
/* Delete every item of inode @ino (its data references too). */
int ns_delete_inode(struct butter_fs *fs, struct subvol *sv, u64 ino);

/* ---- acl.c: POSIX ACLs kept in step with modes (see its header comment) ---- */
struct fs_acl_set {
	u8 *access, *dflt;   /* xattr values to give a new inode, NULL for none */
	size_t len;          /* both have the parent's default ACL's length */
};
/* New inode in @dir: narrow *mode (umask when @dir has no default ACL) and give its ACLs. */
int ns_acl_inherit(struct butter_fs *fs, butter_ino_t dir, u32 *mode, u32 umask,
		   struct fs_acl_set *out);
void ns_acl_set_free(struct fs_acl_set *s);
/* The mode bits an access ACL implies; 1 if it says no more than them, 0 if more, -EINVAL. */
int ns_acl_update_mode(const void *value, size_t len, u32 *mode);
/* chmod: give an access ACL the owner, group-or-mask and other bits of @mode. */
int ns_acl_chmod(void *value, size_t len, u32 mode);

/* ---- orphan.c (open files and orphan items; its header comment has the rules) ---- */
/* At a read-write open, after fs_setup_write(); destroyed at close (lib/ops/open.c). */
int ns_open_files_init(struct fs_write_state *w);
void ns_open_files_destroy(struct fs_write_state *w);
/*
 * The last name of @ino went (phase 2): delete the inode, or, if it is open,
 * keep it with nlink 0 and an ORPHAN_ITEM until its last butter_release().
 */
int ns_drop_last_link(struct butter_fs *fs, struct subvol *sv, u64 ino);
/*
 * A new inode @ino without a name (O_TMPFILE, phase 2): counted open once,
 * nlink 0 and an ORPHAN_ITEM, marked linkable.
 */
int ns_orphan_tmpfile(struct butter_fs *fs, struct subvol *sv, u64 ino);
/* Is @ino an orphan made by butter_create_tmpfile() that a link may name? */
bool ns_orphan_linkable(struct butter_fs *fs, butter_ino_t ino);
/* A linkable orphan gets its first name (phase 2): its orphan item goes. */
int ns_orphan_relink(struct butter_fs *fs, struct subvol *sv, u64 ino);
/* Free every orphan still open (at close: nobody can reach them any more). */
void ns_orphan_free_open(struct butter_fs *fs);
/* Free the orphan inodes of every writable subvolume, at a read-write open. */
int ns_orphan_cleanup(struct butter_fs *fs);

/*
 * The bodies of the public calls of this layer: butter_atime_due(), butter_create(), butter_create_tmpfile() and the rest below.
 * lib/api/api.c takes the handle's lock and calls them; butter.h has the
 * contract of each. Library code calls these, never butter_*() (the lock
 * is not taken twice).
 */
int ns_atime_due(struct butter_fs *fs, butter_ino_t ino, unsigned policy);
int ns_create(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
	const struct butter_new_inode *attr, butter_ino_t *out);
int ns_create_tmpfile(struct butter_fs *fs, butter_ino_t dir, const struct butter_new_inode *attr,
	butter_ino_t *out);
int ns_link(struct butter_fs *fs, butter_ino_t ino, butter_ino_t dir, const char *name,
	size_t namelen);
int ns_open_ref(struct butter_fs *fs, butter_ino_t ino);
int ns_readdir(struct butter_fs *fs, butter_ino_t dir, uint64_t pos, butter_dirent_fn fn,
	void *arg);
int ns_readdir_end(struct butter_fs *fs, butter_ino_t dir, uint64_t *end);
int ns_readdir_until(struct butter_fs *fs, butter_ino_t dir, uint64_t pos, uint64_t end,
	butter_dirent_fn fn, void *arg);
int ns_release(struct butter_fs *fs, butter_ino_t ino, unsigned flags);
int ns_removexattr(struct butter_fs *fs, butter_ino_t ino, const char *name);
int ns_rename(struct butter_fs *fs, butter_ino_t olddir, const char *oldname, size_t oldlen,
	butter_ino_t newdir, const char *newname, size_t newlen, unsigned flags);
int ns_resolve(struct butter_fs *fs, const char *path, butter_ino_t *out);
int ns_rmdir(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen);
int ns_setattr(struct butter_fs *fs, butter_ino_t ino, const struct butter_stat *st, unsigned mask,
	       struct butter_stat *out);
int ns_get_fileattr(struct butter_fs *fs, butter_ino_t ino, uint32_t *flags);
int ns_set_fileattr(struct butter_fs *fs, butter_ino_t ino, uint32_t flags);
int ns_setxattr(struct butter_fs *fs, butter_ino_t ino, const char *name, const void *value,
	size_t size);
int ns_symlink(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
	const char *target, uint32_t uid, uint32_t gid, butter_ino_t *out);
int ns_touch_atime(struct butter_fs *fs, butter_ino_t ino, unsigned policy);
int ns_unlink(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen);

#endif
