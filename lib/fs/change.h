/*
 * change.h — the write side of a handle (struct fs_write_state, set up at a
 * read-write open) and the lifecycle every change follows (change.c):
 * fs_begin_change() (space reserved, a transaction running), phase 1 checks,
 * phase 2 tree changes, fs_end_change() (abort on a failure in phase 2).
 * Not a public header.
 */
#ifndef BUTTER_FS_CHANGE_H
#define BUTTER_FS_CHANGE_H

#include <stdbool.h>

#include "fs/fs.h"
#include "trans/transaction.h"

#define MAX_INLINE_DEFAULT 2048u /* the kernel's max_inline default */
#define MAX_EXTENT_SIZE (128ULL << 20)
#define MAX_FILE_BYTES ((u64)INT64_MAX) /* the largest file offset; more is corrupt */
#define DIRTY_COMMIT_BYTES (64ULL << 20)
#define META_LOW_WATER (32ULL << 20)  /* below this much free metadata, add a chunk */
#define META_RESERVE (4ULL << 20)     /* changes stop here; deletions may use a quarter */
#define COMPRESSED_EXTENT_MAX (128ULL << 10) /* ram bytes of one compressed extent */

struct fs_write_state {
	pthread_mutex_t lock;
	struct extent_state es;
	struct txn_ctx txn;
	struct tree_root dev_tree;
	struct tree_root fst;
	struct tree_root uuid_tree;  /* objectid 0: the filesystem has none */
	u64 data_profile;
	/* compression of new data: BTRFS_COMPRESS_* (NONE: off), level (0: default) */
	int compress_type, compress_level;
	int compress_force;          /* keep trying after data did not compress */
	/*
	 * Files up to this many bytes are stored inline, in the leaf
	 * (butter_set_max_inline(); the kernel's max_inline=). Always below
	 * the sector size and within what one leaf item holds.
	 */
	u32 max_inline;
	struct fs_open_files *open_files; /* lib/namespace/orphan.c: opens the front end counts */
	bool readonly;               /* butter_set_readonly(): changes refused; protected by lock */
	void (*space_commit_fn)(void *arg); /* butter_set_space_commit_hook() */
	void *space_commit_arg;
	struct tree_log *tlog;       /* lib/treelog/writer.c: the fsync log of the running transaction */
	/* lib/subvol/qgroup.c: objectid 0 unless quotas are on; quota_marked: INCONSISTENT is set */
	struct tree_root quota_tree;
	int quota_marked;
	struct ops_replace_state *replace; /* lib/ops/replace.c: the running replace, or NULL */
	/*
	 * lib/data/delalloc.c: file data waiting for its extents (NULL until the
	 * first buffered write), the bytes it holds (every change reserves room
	 * for them) and the bound (0: butter_write() writes at once).
	 */
	struct data_buffers *buffers;
	u64 delalloc_bytes, delalloc_limit;
	/*
	 * Writes every buffer back inside the running transaction (NULL while
	 * nothing was buffered): called by the commits that promise everything
	 * written is on disk (fs_sync(), the final commit, the read-only
	 * switch); other commits (fsync's fallback, space, size) leave buffered
	 * data in memory, as the kernel's commits leave delalloc.
	 */
	int (*flush_data)(void *arg);
	void *flush_data_arg;
};

struct dir_update {
	s64 size_delta;
};

/*
 * Set up the write side of a handle opened read-write (change.c), and tear it
 * down at close: fs_final_commit() commits what is left (unless the
 * transaction was aborted), fs_teardown_write() frees the state. The layers
 * above keep state of their own in it (open files, the tree log, quotas):
 * lib/ops/open.c sets those up after fs_setup_write() and frees them before
 * fs_teardown_write().
 */
int fs_setup_write(struct butter_fs *fs);
void fs_final_commit(struct butter_fs *fs);
void fs_teardown_write(struct butter_fs *fs);

/* Start a change: take the lock and make sure a transaction runs. */
int fs_begin_change(struct butter_fs *fs, struct fs_write_state **wp);
/* The same, first making sure the change will find room (see reserve_space()). */
int fs_begin_change_rsv(struct butter_fs *fs, struct fs_write_state **wp, u64 data_bytes,
			int deleting);
/*
 * End a change; @failed_in_trees: the error came from changing trees, so the
 * transaction is aborted, and the message names the caller's function and
 * line, the errno and the transaction: "transaction 7 aborted in
 * ns_rename() line 294 (errno -5): ...".
 */
int fs_end_change_at(struct fs_write_state *w, int ret, int failed_in_trees, const char *func,
		     int line);
#define fs_end_change(w, ret, failed_in_trees) \
	fs_end_change_at((w), (ret), (failed_in_trees), __func__, __LINE__)

/*
 * Data space of a writable handle as it is now (statfs): *total and *used
 * over the block groups that hold data (mixed ones too), used being all that
 * is not free: extents of the running transaction, pinned extents and super
 * stripes count, as the kernel's statfs counts them. 0, or -ENOENT without a
 * write state (then the committed block group items are the truth).
 */
int fs_live_data_usage(struct butter_fs *fs, u64 *total, u64 *used);

void fs_now_ts(struct btrfs_timespec *t);
int fs_insert_or_extend(struct tree_trans *t, struct tree_root *root, const struct btrfs_key *key,
			const void *data, u32 size);

/*
 * The bodies of the public calls of this layer: butter_get_device(), butter_get_info(), butter_get_space() and the rest below.
 * lib/api/api.c takes the handle's lock and calls them; butter.h has the
 * contract of each. Library code calls these, never butter_*() (the lock
 * is not taken twice).
 */
int fs_get_device(struct butter_fs *fs, size_t idx, struct butter_device_info *out);
int fs_get_info(struct butter_fs *fs, struct butter_info *info);
int fs_get_space(struct butter_fs *fs, size_t idx, struct butter_space_info *out);
int fs_set_compression(struct butter_fs *fs, const char *spec, int force);
/* butter_set_max_inline(): the bound in effect afterwards, or -EROFS. */
int fs_set_max_inline(struct butter_fs *fs, u64 bytes);
int fs_set_label(struct butter_fs *fs, const char *label);
int fs_set_readonly(struct butter_fs *fs, int readonly);
void fs_set_space_commit_hook(struct butter_fs *fs, void (*fn)(void *arg), void *arg);
int fs_statfs(struct butter_fs *fs, struct butter_statfs *out);
int fs_sync(struct butter_fs *fs);

#endif
