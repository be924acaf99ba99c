/*
 * replay.h — what the two files of the log replay share (replay.c: steps
 * 1-4, replay_check.c: step 0). Private to lib/treelog.
 */
#ifndef BUTTER_TREELOG_REPLAY_H
#define BUTTER_TREELOG_REPLAY_H

#include "treelog/treelog.h"

struct u64_list {
	u64 *v;
	size_t n, cap;
};

/* Logged data extents without extent items, taken out of free space (step 0). */
struct excluded {
	struct u64_list disk, len;
	u64 cur_inode;               /* objectid of the last inode item seen in the walk */
};

/* One log tree named in the log root tree: the subvolume it belongs to, its root. */
struct log_tree {
	u64 subvol;
	struct tree_root root;
};

/* Log why the log cannot be replayed (at the item @key, or NULL) and return -EOPNOTSUPP. */
int tlog_refuse(struct butter_fs *fs, const char *why, const struct btrfs_key *key);
/* Append @v to @l; -ENOMEM. */
int tlog_u64_push(struct u64_list *l, u64 v);

/* ---- replay_check.c (step 0) ---- */
/*
 * Pin every block of the tree @root; with @items (a subvolume's log tree)
 * also check each item and exclude the data extents it names.
 */
int tlog_walk_tree(struct butter_fs *fs, struct excluded *ex, const struct tree_root *root,
		   int items);
/* The log trees named in the log root tree @lrt, in subvolume order (*out freed by the caller). */
int tlog_read_log_roots(struct butter_fs *fs, const struct tree_root *lrt, struct log_tree **out,
			size_t *n);
/* Give the excluded extents the log does not keep back to free space. */
int tlog_release_unused(struct butter_fs *fs, struct excluded *ex);

#endif
