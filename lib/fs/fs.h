/*
 * fs.h — the filesystem handle (struct butter_fs) and the fs-objects layer's
 * internal helpers shared by inode.c, dir.c, file.c, xattr.c and subvol.c.
 *
 * Invariants:
 *  1. Tree roots in the handle were read from the superblock or the root tree
 *     at open time and do not change while the handle is read-only.
 *  2. The subvolume cache only grows; entries never move or go away before
 *     close; the write path changes an entry's root in place under its lock,
 *     readers copy entries under subvol_lock.
 */
#ifndef BUTTER_FS_FS_H
#define BUTTER_FS_FS_H

#include <pthread.h>

#include "butter/butter.h"
#include "log.h"
#include "tree/cow.h"
#include "volumes/volumes.h"

struct subvol {
	u64 id;
	struct tree_root root;       /* canonical: the write path moves it in place */
	u64 next_ino;                /* 0: not computed yet (write side) */
	u64 dirid;   /* inode number of its root directory (256) */
	u64 flags;   /* root item flags (BTRFS_ROOT_SUBVOL_RDONLY) */
	int deleted; /* unlinked: lookups fail; the record stays until close */
};

struct butter_fs {
	struct blog log;
	unsigned open_flags;
	struct btrfs_volumes vol;
	struct node_cache cache;

	struct tree_root root_tree;
	struct tree_root chunk_tree;
	struct tree_root extent_tree;
	struct tree_root csum_tree;
	struct tree_root block_group_tree;
	int has_csum_tree;
	int has_block_group_tree;
	u64 default_subvol;

	pthread_mutex_t subvol_lock;
	struct subvol **subvols;    /* protected by subvol_lock; entries never move */
	size_t nsubvols;
	/*
	 * The highest subvolume id handed out by this handle: ids never repeat
	 * within it (a deleted subvolume's record stays in the cache, and its id
	 * would find it), as the kernel never reuses one within a mount.
	 * Protected by the write lock.
	 */
	u64 last_subvol_id;

	/* write side (NULL/0 when opened read-only); see write.c */
	struct fs_write_state *w;
};

/*
 * Open the filesystem on the already opened devices @bdevs[0..n): all of
 * butter_open() after opening the files. @path names the filesystem in
 * messages; @opts is not NULL.
 * Ownership of every device passes to the handle, also on failure (they are
 * closed); the array itself stays the caller's. Errors as butter_open().
 */
int fs_open_bdevs(const char *path, struct blockdev **bdevs, size_t n,
		  const struct butter_open_opts *opts, struct butter_fs **out);

/* Dirent callback used internally for name/location pairs. */

/*
 * Find subvolume @id's tree. Returns 0, -ENOENT if there is no such
 * subvolume, negative errno.
 */
int fs_get_subvol(struct butter_fs *fs, u64 id, struct subvol *out);

/* The canonical subvolume record; NULL with *err set (-ENOENT, also once deleted). */
struct subvol *fs_subvol_cached(struct butter_fs *fs, u64 id, int *err);

/* The same for a change inside the subvolume: -EROFS if it is read-only. */
struct subvol *fs_subvol_mut(struct butter_fs *fs, u64 id, int *err);

/* Make the root directory (inode 256) of a new subvolume tree (write.c). */
int fs_make_root_dir(struct tree_trans *t, struct tree_root *root, u64 nbytes);
/* Insert directory @objectid's inode item @ii and its ".." ref to itself (write.c). */
int fs_insert_top_dir(struct tree_trans *t, struct tree_root *root, u64 objectid,
		      const struct btrfs_inode_item *ii);

/* Set up the write side of a handle opened read-write (write.c). */
int fs_setup_write(struct butter_fs *fs);
void fs_teardown_write(struct butter_fs *fs);
/* Free the orphan inodes of every writable subvolume, after fs_setup_write() (orphan.c). */
int fs_orphan_cleanup(struct butter_fs *fs);

/*
 * Free every deleted subvolume still waiting (orphan item, root refs 0):
 * called when a handle opens read-write. Returns how many, or -errno.
 */
int fs_drop_orphan_subvols(struct butter_fs *fs);

/* Read the ROOT_ITEM of tree @objectid from the root tree (first key offset). */
int fs_read_root_item(struct butter_fs *fs, u64 objectid, struct btrfs_root_item *item,
		      struct btrfs_key *found_key);

/*
 * Move @path (initialised by the caller, who releases it) to the first ROOT_ITEM of a
 * subvolume tree (the top level, or an id in 256..LAST_FREE) at or after @key, and set
 * @key to its key. Returns 0 found, 1 none left, or -errno.
 */
int fs_next_subvol_root_item(struct butter_fs *fs, struct btrfs_key *key, struct tree_path *path);

/* Read an inode item; -ENOENT if absent, -EUCLEAN if malformed. */
int fs_read_inode(struct butter_fs *fs, butter_ino_t ino, struct btrfs_inode_item *item);

/*
 * Turn a directory entry's location key inside subvolume @subvol into the
 * inode it names (crossing into a subvolume's root for ROOT_ITEM locations).
 */
int fs_location_to_ino(struct butter_fs *fs, u64 subvol, const struct btrfs_key *location,
		       butter_ino_t *out);

/*
 * Walk the dir_item entries packed in one DIR_ITEM/XATTR_ITEM item. Calls
 * @fn(arg, di, name, value) for each; a non-zero return stops and is
 * returned. Returns -EUCLEAN if an entry overruns the item.
 */
int fs_walk_dir_items(struct butter_fs *fs, const u8 *item, u32 size,
		      int (*fn)(void *arg, const struct btrfs_dir_item *di, const char *name,
				const u8 *value),
		      void *arg);

/*
 * Check an xattr name against the namespaces btrfs has handlers for (user.,
 * trusted., security., btrfs., and of system. only the two POSIX ACLs), as
 * the kernel resolves a name before it reaches btrfs. Returns 0,
 * -EOPNOTSUPP for another namespace, -EINVAL for a bare prefix ("user.").
 */
int fs_xattr_name_check(const char *name, size_t len);

/*
 * Check a btrfs property (an xattr named btrfs.*) before it is set on an
 * inode with flags @iflags, as the kernel validates one: btrfs.compression
 * is the only name, its value zlib, lzo or zstd (a level may follow), no,
 * none, or empty. Returns 0 (also for every other namespace), 1 for an
 * empty btrfs.compression (the kernel removes the property then), or -EINVAL.
 */
int fs_xattr_prop_check(const char *name, size_t len, const void *value, size_t size,
			u64 iflags);

/*
 * Whose data a read is, for its error messages: file byte @file_offset of
 * inode @ino in @subvol is the byte at the read's @logical (for a compressed
 * extent, @file_offset is where the extent's data starts in the file and
 * @compressed is set: its sectors have no file offset of their own).
 */
struct data_owner {
	u64 subvol, ino;
	u64 file_offset;
	int compressed;
};

/*
 * Read @len bytes of data at @logical (both sector-aligned) into @buf,
 * verifying each sector against the csum tree unless @nodatasum; bad or
 * unreadable sectors are retried on every other copy. -EIO if some sector
 * has no good copy. Each bad copy is logged once, naming its device and
 * physical place and (@who not NULL) the file, and counted in the device's
 * statistics (corruption or read errors).
 */
int fs_read_data(struct butter_fs *fs, u64 logical, u64 len, u8 *buf, int nodatasum,
		 const struct data_owner *who);

/* device.c: add the DEV_STATS items of the device tree to the counters (at open; warns). */
void fs_load_dev_stats(struct butter_fs *fs);

/* ino_path.c */
/*
 * The first name of @ino in @root among its refs of @type (INODE_REF or
 * INODE_EXTREF): the parent directory and the name (not NUL-terminated, up
 * to BTRFS_NAME_LEN bytes). 0, -ENOENT if it has none, -EUCLEAN for a
 * malformed ref (logged), or -errno.
 */
int fs_inode_first_name(struct butter_fs *fs, const struct tree_root *root, u64 ino, u8 type,
			u64 *parent, char *name, size_t *name_len);
/*
 * One path of inode @ino from its subvolume's root directory ("a/b") into
 * @out. 0, -ENOENT (no name), -ENAMETOOLONG, -ELOOP, -EUCLEAN or -errno.
 */
int fs_inode_path(struct butter_fs *fs, u64 subvol, u64 ino, char *out, size_t cap);
/*
 * "subvolume S inode I path "P" file offset O" into @buf (the path said to
 * be unknown, and why, when it cannot be resolved); returns @buf.
 */
const char *fs_describe_file_pos(struct butter_fs *fs, u64 subvol, u64 ino, u64 file_offset,
				 char *buf, size_t size);

/*
 * The data checksums of the @nsectors sectors from @logical, as the csum tree
 * holds them: csum_size bytes per sector into @csums, and have[i] set for
 * each sector that has one (prealloc and nodatasum data have none).
 */
int fs_lookup_csums(struct butter_fs *fs, u64 logical, u32 nsectors, u8 *csums, u8 *have);

/* Device numbers: on disk the kernel's internal form (major << 20 | minor). */
u64 fs_rdev_to_user(u64 disk);
u64 fs_rdev_to_disk(u64 user);

/* DT_* type of a mode. */
unsigned fs_mode_to_dtype(u32 mode);

#endif
