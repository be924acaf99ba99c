/*
 * fs.h — the filesystem handle (struct butter_fs): what fs.c opens (devices,
 * chunk tree, root tree, the default subvolume) and the subvolume records
 * (subvols.c). The write side of a handle is change.h's.
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
#include "butter/testing.h"
#include "log.h"
#include "turn_lock.h"
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

	/* write side (NULL/0 when opened read-only); see change.c */
	struct fs_write_state *w;

	/*
	 * The handle's lock, taken by every public call (lib/api/api.c has the
	 * modes): readers share it, a change holds it alone, callers enter in
	 * the order they came (lib/turn_lock.h). Allocated on its own: it
	 * outlives a reload (fs_unload() clears the handle while others wait on
	 * it). api_held is the per-thread record of the mode a thread holds
	 * (NULL: none).
	 */
	struct turn_lock *api_lock;
	pthread_key_t api_held;

	/*
	 * What opening the filesystem again needs (lib/ops/open.c: a read-only
	 * handle made read-write in place by butter_set_readonly()): the device
	 * paths as butter_open() was given them (NULL: opened otherwise, in
	 * memory or with test devices: no reopen) and the node cache bound.
	 */
	struct {
		char **paths;
		size_t npaths;
		u64 cache_bytes;
		unsigned flags;          /* BUTTER_OPEN_* other than RDONLY */
	} reopen;
	/* A reload failed: the handle holds nothing; every call fails (-EIO). */
	int dead;
};

/*
 * Open the filesystem on the already opened devices @bdevs[0..n) read-only
 * as far as this layer goes: volumes, chunk tree, root tree, default
 * subvolume, device statistics. The write side and recovery of a read-write
 * open are lib/ops/open.c's (ops_open_bdevs()). @path names the filesystem
 * in messages; @opts is not NULL.
 * Ownership of every device passes to the handle, also on failure (they are
 * closed); the array itself stays the caller's. Errors as butter_open().
 */
int fs_open_bdevs(const char *path, struct blockdev **bdevs, size_t n,
		  const struct butter_open_opts *opts, struct butter_fs **out);

/*
 * Open a handle again in place (lib/ops/open.c): fs_unload() closes its
 * devices and frees what fs_open_bdevs() read, keeping the lock, the log and
 * the reopen record, and leaves it dead; fs_reload() reads the filesystem
 * from @bdevs (ownership passes, as with fs_open_bdevs()) into it and makes
 * it live again. The write side must be gone first.
 */
void fs_unload(struct butter_fs *fs);
int fs_reload(struct butter_fs *fs, const char *path, struct blockdev **bdevs, size_t n,
	      const struct butter_open_opts *opts);

/* Close the devices and free @fs, whose write side is gone (fs_teardown_write()). */
void fs_destroy(struct butter_fs *fs);

/*
 * Find subvolume @id's tree. Returns 0, -ENOENT if there is no such
 * subvolume, negative errno (subvols.c).
 */
int fs_get_subvol(struct butter_fs *fs, u64 id, struct subvol *out);

/* The canonical subvolume record; NULL with *err set (-ENOENT, also once deleted). */
struct subvol *fs_subvol_cached(struct butter_fs *fs, u64 id, int *err);

/* The same for a change inside the subvolume: -EROFS if it is read-only. */
struct subvol *fs_subvol_mut(struct butter_fs *fs, u64 id, int *err);

/* Read the ROOT_ITEM of tree @objectid from the root tree (first key offset). */
int fs_read_root_item(struct butter_fs *fs, u64 objectid, struct btrfs_root_item *item,
		      struct btrfs_key *found_key);

/* A tree's root (bytenr, generation, level, bytes used) from its ROOT_ITEM; -EUCLEAN for a bad level. */
int fs_load_root(struct butter_fs *fs, u64 objectid, struct tree_root *root);

/*
 * Move @path (initialised by the caller, who releases it) to the first ROOT_ITEM of a
 * subvolume tree (the top level, or an id in 256..LAST_FREE) at or after @key, and set
 * @key to its key. Returns 0 found, 1 none left, or -errno.
 */
int fs_next_subvol_root_item(struct butter_fs *fs, struct btrfs_key *key, struct tree_path *path);

/* Add the DEV_STATS items of the device tree to the counters (at open; warns). */
void fs_load_dev_stats(struct butter_fs *fs);

#endif
