/*
 * transaction.h — begin and commit. A transaction gathers every change
 * between two consistent on-disk states; the commit makes the new state
 * durable at one instant: the superblock write.
 *
 * State machine of a struct txn_ctx:
 *
 *   IDLE --txn_begin()--> RUNNING --txn_commit()--> IDLE
 *                            |                       ^
 *                            +--error anywhere------> ABORTED (read-only for good)
 *
 * Commit order (written once, here and in txn_commit()):
 *   0. the device error counters that changed go into the device tree
 *      (a commit runs for them alone if nothing else changed); then the
 *      pre_commit hook: the tree log's blocks are pinned and the
 *      superblock's log root is cleared (this commit holds what it held);
 *      then, if anything changed, the pre_write hook (quota status);
 *   1. until nothing changes: run delayed refs (extent tree), write block
 *      group items, write free space tree entries, update root items;
 *   2. write every dirty tree block (checksummed) to every copy;
 *   3. flush every device;
 *   4. write the superblocks (with the backup roots) on every device;
 *   5. flush again;
 *   6. unpin the extents this transaction freed.
 * A crash before 4 leaves the previous state (its blocks were never
 * overwritten); after 4 the new one.
 */
#ifndef BUTTER_TRANS_TRANSACTION_H
#define BUTTER_TRANS_TRANSACTION_H

#include "extent/extent.h"

struct txn_ctx {
	struct btrfs_volumes *vol;
	struct node_cache *cache;
	struct extent_state *es;
	const struct blog *log;
	struct tree_root *root_tree;   /* its root lives in the superblock */
	struct tree_root *chunk_tree;  /* likewise */
	struct tree_root **roots;      /* trees with a ROOT_ITEM in the root tree */
	size_t nroots;
	int running;
	int super_dirty;               /* the superblock alone changed (label): commit anyway */
	int aborted;                   /* an error poisoned the filesystem: no more commits */
	struct tree_trans tt;
	/*
	 * Called first by every commit (NULL: none): the tree log
	 * (lib/treelog/writer.c) pins its blocks and clears the superblock's log
	 * root, since the commit holds everything the log held.
	 */
	int (*pre_commit)(void *arg);
	void *pre_commit_arg;

	/*
	 * Called by every commit that has changes to write, after pre_commit,
	 * before step 1 (NULL: none): quotas (lib/subvol/qgroup.c) mark their
	 * counts stale and stamp the commit's transid.
	 */
	int (*pre_write)(void *arg);
	void *pre_write_arg;
};

/* Register a tree whose root item must follow its root at commit. */
int txn_track_root(struct txn_ctx *ctx, struct tree_root *root);

/* Stop tracking @root (a tree whose creation failed; the transaction is aborted). */
void txn_ctx_forget_root(struct txn_ctx *ctx, struct tree_root *root);

int txn_begin(struct txn_ctx *ctx);

/* Commit the running transaction (see the order above). */
int txn_commit(struct txn_ctx *ctx);

/*
 * Write the DEV_STATS item of every device whose error counters changed
 * (dev_stats.c); part of every commit, which starts a transaction for them
 * alone when nothing else changed.
 */
int txn_write_dev_stats(struct txn_ctx *ctx);

/* Abort: the filesystem refuses further changes; @err is logged. */
void txn_abort(struct txn_ctx *ctx, int err, const char *where);

void txn_ctx_destroy(struct txn_ctx *ctx);

#endif
