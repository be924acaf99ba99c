/*
 * write.h — what the write side of the fs layer shares between its files
 * (write.c: handle setup, names and inodes; file_write.c: file data;
 * namei.c: removing and renaming names). Not a public header.
 */
#ifndef BUTTER_FS_WRITE_H
#define BUTTER_FS_WRITE_H

#include <stdbool.h>

#include "fs/fs.h"
#include "trans/transaction.h"

#define MAX_INLINE 2048u
#define MAX_EXTENT_SIZE (128ULL << 20)
#define MAX_FILE_BYTES ((u64)INT64_MAX) /* the largest file offset; more is corrupt */
#define DIRTY_COMMIT_BYTES (64ULL << 20)
#define META_LOW_WATER (32ULL << 20)  /* below this much free metadata, add a chunk */
#define META_RESERVE (4ULL << 20)     /* changes stop here; deletions may use a quarter */
#define BTRFS_INODE_NODATASUM_FLAG (1ULL << 0)
#define BTRFS_INODE_NODATACOW_FLAG (1ULL << 1)
#define BTRFS_INODE_NOCOMPRESS_FLAG (1ULL << 3)
#define BTRFS_INODE_COMPRESS_FLAG (1ULL << 11)
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
	struct fs_open_files *open_files; /* orphan.c: opens the front end counts */
	bool readonly;               /* butter_set_readonly(): changes refused; protected by lock */
	void (*space_commit_fn)(void *arg); /* butter_set_space_commit_hook() */
	void *space_commit_arg;
	struct tree_log *tlog;       /* tree_log.c: the fsync log of the running transaction */
	/* qgroup.c: objectid 0 unless quotas are on; quota_marked: INCONSISTENT is set */
	struct tree_root quota_tree;
	int quota_marked;
};

struct dir_update {
	s64 size_delta;
};

/* Start a change: take the lock and make sure a transaction runs. */
int begin_change(struct butter_fs *fs, struct fs_write_state **wp);
/* The same, first making sure the change will find room (see reserve_space()). */
int begin_change_rsv(struct butter_fs *fs, struct fs_write_state **wp, u64 data_bytes,
		     int deleting);
/* End a change; @failed_in_trees: the error came from changing trees (abort). */
int end_change(struct fs_write_state *w, int ret, int failed_in_trees);

/*
 * Data space of a writable handle as it is now (statfs): *total and *used
 * over the block groups that hold data (mixed ones too), used being all that
 * is not free: extents of the running transaction, pinned extents and super
 * stripes count, as the kernel's statfs counts them. 0, or -ENOENT without a
 * write state (then the committed block group items are the truth).
 */
int fs_live_data_usage(struct butter_fs *fs, u64 *total, u64 *used);

void now_ts(struct btrfs_timespec *t);
int insert_or_extend(struct tree_trans *t, struct tree_root *root, const struct btrfs_key *key,
		     const void *data, u32 size);
int modify_inode(struct butter_fs *fs, struct subvol *sv, u64 ino,
		 void (*fn)(struct btrfs_inode_item *ii, void *arg), void *arg);
/* modify_inode() without the sequence bump (an atime is not a change, atime.c rule 2). */
int modify_inode_keep_sequence(struct butter_fs *fs, struct subvol *sv, u64 ino,
			       void (*fn)(struct btrfs_inode_item *ii, void *arg), void *arg);
int next_ino(struct butter_fs *fs, struct subvol *sv, u64 *out);
int next_dir_index(struct butter_fs *fs, struct subvol *sv, u64 dir, u64 *out);
u8 mode_to_ft(u32 mode);
void touch_dir(struct btrfs_inode_item *ii, void *arg);
void touch_ctime(struct btrfs_inode_item *ii, void *arg);
int check_new_name(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		   struct subvol **svp);
int add_name(struct butter_fs *fs, struct subvol *sv, u64 dir, const char *name, size_t namelen,
	     u64 ino, u32 mode);
int create_inode(struct butter_fs *fs, struct subvol *sv, const struct butter_new_inode *a,
		 u64 size, u64 *ino);
int insert_inline(struct butter_fs *fs, struct subvol *sv, u64 ino, const void *data, u32 len);
/* The next free subvolume id (largest root item id + 1, at least 256). */
int fs_next_subvol_id(struct butter_fs *fs, u64 *id);
/* Phase 1 of a new subvolume: check_new_name(), fs_next_subvol_id(), next_dir_index(). */
int check_new_subvol(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		     struct subvol **parent, u64 *id, u64 *index);
/* Add @sv to the handle's subvolume records (under subvol_lock); -ENOMEM. */
int fs_add_subvol_record(struct butter_fs *fs, struct subvol *sv);
/* Name subvolume @id as @name in @dir of @parent: ROOT_REF, ROOT_BACKREF, dir entries. */
int fs_link_subvol(struct butter_fs *fs, struct subvol *parent, u64 dir, const char *name,
		   size_t namelen, u64 id, u64 index);

/* file_write.c */
/* Remove file data in [start, end) of @ino, dropping extent references. */
int fs_drop_extents(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 start, u64 end);
/* Shrink @ino to @size bytes (phase 2). */
int fs_truncate(struct butter_fs *fs, struct subvol *sv, butter_ino_t ino, u64 size);

/* acl.c: POSIX ACLs kept in step with modes (see its header comment) */
struct fs_acl_set {
	u8 *access, *dflt;   /* xattr values to give a new inode, NULL for none */
	size_t len;          /* both have the parent's default ACL's length */
};
/* New inode in @dir: narrow *mode (umask when @dir has no default ACL) and give its ACLs. */
int fs_acl_inherit(struct butter_fs *fs, butter_ino_t dir, u32 *mode, u32 umask,
		   struct fs_acl_set *out);
void fs_acl_set_free(struct fs_acl_set *s);
/* The mode bits an access ACL implies; 1 if it says no more than them, 0 if more, -EINVAL. */
int fs_acl_update_mode(const void *value, size_t len, u32 *mode);
/* chmod: give an access ACL the owner, group-or-mask and other bits of @mode. */
int fs_acl_chmod(void *value, size_t len, u32 mode);
/* Set (@value) or remove (NULL) xattr @name of @ino inside a running change (phase 2). */
int fs_set_xattr_locked(struct butter_fs *fs, struct subvol *sv, u64 ino, const char *name,
			const void *value, size_t size);

/* uuid_tree.c: list / unlist subvolume @id under @uuid (type UUID_KEY_*). */
int fs_uuid_tree_add(struct butter_fs *fs, const u8 *uuid, u8 type, u64 id);
int fs_uuid_tree_remove(struct butter_fs *fs, const u8 *uuid, u8 type, u64 id);

/* namei.c */
/* Remove the DIR_ITEM entry @name and DIR_INDEX @index from @dir; shrink and touch @dir. */
int fs_remove_dir_entry(struct butter_fs *fs, struct subvol *sv, u64 dir, const char *name,
			size_t len, u64 index);
/* Delete every item of inode @ino (its data references too). */
int fs_delete_inode(struct butter_fs *fs, struct subvol *sv, u64 ino);

/* ---- shared with fallocate.c and clone.c ---- */

/* Allocate a data extent of up to @want bytes (at least a sector); *got is its size. */
int fs_alloc_data(struct butter_fs *fs, u64 want, u64 *logical, u64 *got);
/* Queue a change of @delta to the EXTENT_DATA_REF (root, ino, offset) of an extent. */
int fs_queue_data_ref(struct fs_write_state *w, u64 bytenr, u64 num_bytes, u64 root, u64 ino,
		      u64 offset, int delta);
/*
 * Write @len bytes at @off into the regular file @ino inside a running change
 * (what butter_write() does between begin and end). Returns @len or a
 * negative errno; *changed says whether trees were touched (a failure then
 * must abort the transaction).
 */
ssize_t fs_write_locked(struct butter_fs *fs, butter_ino_t ino, const void *buf, size_t len,
			u64 off, int *changed);
/*
 * On filesystems without the NO_HOLES feature, give every gap between the
 * EXTENT_DATA items of @ino inside [start, end) (sector-aligned) an explicit
 * hole item; with NO_HOLES, nothing (fallocate.c).
 */
int fs_fill_holes(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 start, u64 end);
/* orphan.c (open files and orphan items; its header comment has the rules) */
int fs_open_files_init(struct fs_write_state *w);
void fs_open_files_destroy(struct fs_write_state *w);
/*
 * The last name of @ino went (phase 2): delete the inode, or, if it is open,
 * keep it with nlink 0 and an ORPHAN_ITEM until its last butter_release().
 */
int fs_drop_last_link(struct butter_fs *fs, struct subvol *sv, u64 ino);
/*
 * A new inode @ino without a name (O_TMPFILE, phase 2): counted open once,
 * nlink 0 and an ORPHAN_ITEM, marked linkable.
 */
int fs_orphan_tmpfile(struct butter_fs *fs, struct subvol *sv, u64 ino);
/* Is @ino an orphan made by butter_create_tmpfile() that a link may name? */
bool fs_orphan_linkable(struct butter_fs *fs, butter_ino_t ino);
/* A linkable orphan gets its first name (phase 2): its orphan item goes. */
int fs_orphan_relink(struct butter_fs *fs, struct subvol *sv, u64 ino);
/* Free every orphan still open (at close: nobody can reach them any more). */
void fs_orphan_free_open(struct butter_fs *fs);

/* qgroup.c (quotas: its header comment has the rules) */
/* At the end of fs_setup_write(): find the quota tree, hook the commit. -EOPNOTSUPP: squota. */
int fs_qgroup_setup(struct butter_fs *fs);
/* Give new subvolume @id its qgroup items (phase 2); @src: a snapshot's source, or 0. */
int fs_qgroup_create(struct butter_fs *fs, u64 id, u64 src);
/* Remove the qgroup of subvolume @id, dropped completely (phase 2). */
int fs_qgroup_remove(struct butter_fs *fs, u64 id);

/* log_replay.c */
/*
 * Replay the tree log (super log_root) into the subvolumes and commit with
 * the log root cleared; right after fs_setup_write(), before anything else
 * allocates. 0 if there is no log; -EOPNOTSUPP (logged) for a log it
 * cannot replay exactly; any error leaves the disk as it was.
 */
int fs_replay_log(struct butter_fs *fs);

/* tree_log.c: the write side of the tree log (butter_fsync(); its header comment has the rules) */
/* Free the log state at close (after the last commit). */
void fs_tree_log_destroy(struct fs_write_state *w);

#endif
