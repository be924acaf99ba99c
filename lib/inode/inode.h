/*
 * inode.h — the inode layer: inode items (read, change, create), the name
 * items of directories and inodes (names.c), xattr items (xattr.c) and the
 * paths that name an inode in messages (ino_path.c). It knows nothing of
 * file data, of the namespace rules above it (permissions, orphans, ACLs) or
 * of subvolume creation. Not a public header.
 */
#ifndef BUTTER_INODE_INODE_H
#define BUTTER_INODE_INODE_H

#include <errno.h>

#include "fs/change.h"

/* ---- inode.c: reading inodes and names ---- */

/* Read an inode item; -ENOENT if absent, -EUCLEAN if malformed. */
int inode_read(struct butter_fs *fs, butter_ino_t ino, struct btrfs_inode_item *item);

/*
 * Turn a directory entry's location key inside subvolume @subvol into the
 * inode it names (crossing into a subvolume's root for ROOT_ITEM locations).
 */
int inode_location_to_ino(struct butter_fs *fs, u64 subvol, const struct btrfs_key *location,
			  butter_ino_t *out);

/*
 * Walk the dir_item entries packed in one DIR_ITEM/XATTR_ITEM item. Calls
 * @fn(arg, di, name, value) for each; a non-zero return stops and is
 * returned. Returns -EUCLEAN if an entry overruns the item.
 */
int inode_walk_dir_items(struct butter_fs *fs, const u8 *item, u32 size,
			 int (*fn)(void *arg, const struct btrfs_dir_item *di, const char *name,
				const u8 *value),
			 void *arg);

/*
 * chattr's +i and +a (BTRFS_INODE_IMMUTABLE_FLAG, _APPEND_FLAG): -EPERM when
 * @ii has any of @forbidding, else 0. Callers name what forbids their change
 * (butter.h, BUTTER_FL_IMMUTABLE has the rules): INODE_FIXED for removing
 * the inode's names, its xattrs, its attributes; IMMUTABLE alone for data
 * writes and new names in a directory.
 */
#define INODE_FIXED (BTRFS_INODE_IMMUTABLE_FLAG | BTRFS_INODE_APPEND_FLAG)
static inline int inode_may_change(const struct btrfs_inode_item *ii, u64 forbidding)
{
	return (btrfs_inode_flags(ii) & forbidding) ? -EPERM : 0;
}

/* Device numbers: on disk the kernel's internal form (major << 20 | minor). */
u64 inode_rdev_to_user(u64 disk);
u64 inode_rdev_to_disk(u64 user);

/* DT_* type of a mode, and of a directory entry's BTRFS_FT_* type. */
unsigned inode_mode_to_dtype(u32 mode);
unsigned inode_ft_to_dtype(u8 ft);

/* ---- inode_item.c: changing inode items (phase 2 of a change) ---- */

/* Apply @fn to the inode item of @ino (COW), stamp the transid, move the sequence. */
int inode_modify(struct butter_fs *fs, struct subvol *sv, u64 ino,
		 void (*fn)(struct btrfs_inode_item *ii, void *arg), void *arg);
/* inode_modify(), and the item as it is after it into *@after. */
int inode_modify_get(struct butter_fs *fs, struct subvol *sv, u64 ino,
		     void (*fn)(struct btrfs_inode_item *ii, void *arg), void *arg,
		     struct btrfs_inode_item *after);
/* inode_modify() without the sequence bump (an atime is not a change, lib/namespace/atime.c rule 2). */
int inode_modify_keep_sequence(struct butter_fs *fs, struct subvol *sv, u64 ino,
			       void (*fn)(struct btrfs_inode_item *ii, void *arg), void *arg);
/* The next free inode number of @sv. */
int inode_next_ino(struct butter_fs *fs, struct subvol *sv, u64 *out);
/* The BTRFS_FT_* type of a mode. */
u8 inode_mode_to_ft(u32 mode);
/* inode_modify() edits: a directory's size by a struct dir_update, its times; a ctime. */
void inode_touch_dir(struct btrfs_inode_item *ii, void *arg);
void inode_touch_ctime(struct btrfs_inode_item *ii, void *arg);
/* A new inode item in @sv (nlink 1, or as @a says), @size bytes, flags @iflags; its number in *ino. */
int inode_create(struct butter_fs *fs, struct subvol *sv, const struct butter_new_inode *a,
		 u64 size, u64 iflags, u64 *ino);

/* ---- names.c: the name items ---- */

/* The next free DIR_INDEX of @dir. */
int inode_next_dir_index(struct butter_fs *fs, struct subvol *sv, u64 dir, u64 *out);
/* Give @ino the name @name in @dir: DIR_ITEM, DIR_INDEX, INODE_REF/EXTREF; @dir grows. */
int inode_add_name(struct butter_fs *fs, struct subvol *sv, u64 dir, const char *name, size_t namelen,
		   u64 ino, u32 mode);
/*
 * The directory side of a name: a DIR_ITEM entry and the DIR_INDEX item
 * @index for @location in @dir (items only: -EEXIST if the index is taken,
 * -EUCLEAN for a name of more than 255 bytes).
 */
int inode_insert_dir_entries(struct tree_trans *t, struct tree_root *root, u64 dir, const char *name,
			     size_t namelen, const struct btrfs_key *location, u8 ft, u64 index);
/* inode_insert_dir_entries() in a running change, @dir's size and times following. */
int inode_add_dir_entries(struct butter_fs *fs, struct subvol *sv, u64 dir, const char *name,
		       size_t namelen, const struct btrfs_key *location, u8 ft, u64 index);
/* Remove the DIR_ITEM entry @name and DIR_INDEX @index from @dir; shrink and touch @dir. */
int inode_remove_dir_entry(struct butter_fs *fs, struct subvol *sv, u64 dir, const char *name,
			   size_t len, u64 index);
/* Remove the name @name of @ino from @dir: its back reference and inode_remove_dir_entry(). */
int inode_remove_name(struct butter_fs *fs, struct subvol *sv, u64 dir, const char *name,
		   size_t len, u64 ino);
/*
 * Cut the entry named @name (a dir_item with its name) out of the DIR_ITEM or
 * XATTR_ITEM item at @key, deleting the item when it was alone. 0, 1 if no
 * such item or entry, -EUCLEAN for a malformed item, -errno.
 */
int inode_cut_dir_entry(struct butter_fs *fs, struct tree_root *root, const struct btrfs_key *key,
			const char *name, size_t len);
/* Make the root directory (inode 256) of a new subvolume tree. */
int inode_make_root_dir(struct tree_trans *t, struct tree_root *root, u64 nbytes);
/* Insert directory @objectid's inode item @ii and its ".." ref to itself. */
int inode_insert_top_dir(struct tree_trans *t, struct tree_root *root, u64 objectid,
			 const struct btrfs_inode_item *ii);

/*
 * Decoding the entries packed in one name item. The lengths are 0 for an
 * entry that overruns the @left bytes; the finds return the entry's offset,
 * -ENOENT if absent, -EUCLEAN if the item is malformed.
 */
/* One name of an inode ref or extref item, decoded. */
struct inode_ref_name {
	u64 parent, index;
	const char *name;
	u32 len;
};
u32 inode_dir_entry_len(const u8 *p, u32 left);
u32 inode_ref_entry_len(u8 type, const u8 *p, u32 left);
/* Decode the INODE_REF (@type) or INODE_EXTREF entry at @p of the item keyed @key_offset. */
void inode_ref_decode(u8 type, u64 key_offset, const u8 *p, struct inode_ref_name *r);
/* The ref entry named @name with @parent in the item (@type, @key_offset) @data. */
long inode_find_ref_entry(u8 type, u64 key_offset, const u8 *data, u32 size, u64 parent,
			  const char *name, u32 len, struct inode_ref_name *out);
/* The dir entry named @name in the DIR_ITEM/DIR_INDEX item @data; its location in *location. */
long inode_find_dir_entry(const u8 *data, u32 size, const char *name, u32 len,
			  struct btrfs_key *location);

/* ---- xattr.c ---- */

/*
 * Check an xattr name against the namespaces btrfs has handlers for (user.,
 * trusted., security., btrfs., and of system. only the two POSIX ACLs), as
 * the kernel resolves a name before it reaches btrfs. Returns 0,
 * -EOPNOTSUPP for another namespace, -EINVAL for a bare prefix ("user.").
 */
int inode_xattr_name_check(const char *name, size_t len);

/*
 * Check a btrfs property (an xattr named btrfs.*) before it is set on an
 * inode with flags @iflags, as the kernel validates one: btrfs.compression
 * is the only name, its value zlib, lzo or zstd (a level may follow), no,
 * none, or empty. Returns 0 (also for every other namespace), 1 for an
 * empty btrfs.compression (the kernel removes the property then), or -EINVAL.
 */
int inode_xattr_prop_check(const char *name, size_t len, const void *value, size_t size,
			   u64 iflags);

/* Set (@value) or remove (NULL) xattr @name of @ino inside a running change (phase 2). */
int inode_set_xattr_locked(struct butter_fs *fs, struct subvol *sv, u64 ino, const char *name,
			   const void *value, size_t size);

/* ---- ino_path.c ---- */
/*
 * The first name of @ino in @root among its refs of @type (INODE_REF or
 * INODE_EXTREF): the parent directory and the name (not NUL-terminated, up
 * to BTRFS_NAME_LEN bytes). 0, -ENOENT if it has none, -EUCLEAN for a
 * malformed ref (logged), or -errno.
 */
int inode_first_name(struct butter_fs *fs, const struct tree_root *root, u64 ino, u8 type,
		     u64 *parent, char *name, size_t *name_len);
/*
 * One path of inode @ino from its subvolume's root directory ("a/b") into
 * @out. 0, -ENOENT (no name), -ENAMETOOLONG, -ELOOP, -EUCLEAN or -errno.
 */
int inode_path(struct butter_fs *fs, u64 subvol, u64 ino, char *out, size_t cap);
/*
 * "subvolume S inode I path "P" file offset O" into @buf (the path said to
 * be unknown, and why, when it cannot be resolved); returns @buf.
 */
const char *inode_describe_file_pos(struct butter_fs *fs, u64 subvol, u64 ino, u64 file_offset,
				    char *buf, size_t size);

/*
 * The bodies of the public calls of this layer: butter_getxattr(), butter_listxattr(), butter_lookup() and the rest below.
 * lib/api/api.c takes the handle's lock and calls them; butter.h has the
 * contract of each. Library code calls these, never butter_*() (the lock
 * is not taken twice).
 */
ssize_t inode_getxattr(struct butter_fs *fs, butter_ino_t ino, const char *name, void *buf,
	size_t size);
ssize_t inode_listxattr(struct butter_fs *fs, butter_ino_t ino, char *buf, size_t size);
int inode_lookup(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
	butter_ino_t *out);
int inode_root(struct butter_fs *fs, uint64_t subvolid, butter_ino_t *out);
int inode_stat(struct butter_fs *fs, butter_ino_t ino, struct butter_stat *st);
/* What butter_stat() says of @ino from its inode item @item alone (no buffered data). */
void inode_item_stat(struct butter_fs *fs, butter_ino_t ino, const struct btrfs_inode_item *item,
		     struct butter_stat *st);
/*
 * inode_lookup(), and (where not NULL) the entry's type as DT_* (what the
 * directory entry says) and the directory's own inode item, read on the way:
 * that one is filled whenever the call gets past reading it (it returns 0,
 * or -ENOENT for a name that is not there), but for the placeholder
 * directory of a missing subvolume, which has no item.
 */
int inode_lookup_full(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		      butter_ino_t *out, unsigned *dtype, struct btrfs_inode_item *dir_item);

#endif
