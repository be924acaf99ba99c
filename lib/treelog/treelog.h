/*
 * treelog.h — the tree log: fsync without a commit (writer.c) and, at a
 * read-write open, the replay of a log the kernel or butter left
 * (replay.c). Not a public header.
 */
#ifndef BUTTER_TREELOG_TREELOG_H
#define BUTTER_TREELOG_TREELOG_H

#include "subvol/subvol.h"
#include "tree/item_list.h"

/*
 * Replay the tree log (super log_root) into the subvolumes and commit with
 * the log root cleared; right after fs_setup_write(), before anything else
 * allocates. 0 if there is no log; -EOPNOTSUPP (logged) for a log it
 * cannot replay exactly; any error leaves the disk as it was.
 */
int tlog_replay(struct butter_fs *fs);

/* Free the log state at close (after the last commit). */
void tlog_destroy(struct fs_write_state *w);

/*
 * The bodies of the public calls of this layer: butter_fsync(), butter_fsync_many().
 * lib/api/api.c takes the handle's lock and calls them; butter.h has the
 * contract of each. Library code calls these, never butter_*() (the lock
 * is not taken twice).
 */
int tlog_fsync(struct butter_fs *fs, butter_ino_t ino, int datasync);
int tlog_fsync_many(struct butter_fs *fs, const butter_ino_t *inos, size_t n, int datasync);

#endif
