/*
 * ops.h — the operations on a whole filesystem, above every other layer:
 * opening and closing (open.c, with the recovery of a read-write open),
 * scrub, device add and statistics, resize, mkfs, send, receive and check.
 * Not a public header.
 */
#ifndef BUTTER_OPS_OPS_H
#define BUTTER_OPS_OPS_H

#include "treelog/treelog.h"

/*
 * butter_set_readonly(): fs_set_readonly(), and for a handle opened
 * read-only and made read-write, the reopen in place (open.c).
 */
int ops_set_readonly(struct butter_fs *fs, int readonly);

/*
 * Open the filesystem on the already opened devices @bdevs[0..n): all of
 * butter_open() after opening the files (fs_open_bdevs(), then for a
 * read-write open the write side and the recovery steps). Ownership of every
 * device passes to the handle, also on failure. Errors as butter_open().
 */
int ops_open_bdevs(const char *path, struct blockdev **bdevs, size_t n,
		   const struct butter_open_opts *opts, struct butter_fs **out);

/*
 * The bodies of the public calls of this layer: butter_check(), butter_close(), butter_device_add() and the rest below.
 * lib/api/api.c takes the handle's lock and calls them; butter.h has the
 * contract of each. Library code calls these, never butter_*() (the lock
 * is not taken twice).
 */
int ops_balance(struct butter_fs *fs, const struct butter_balance_args *args,
	struct butter_balance_stats *st);
int ops_balance_step(struct butter_fs *fs, const struct butter_balance_args *args,
	uint64_t *cursor, struct butter_balance_stats *st);
int ops_balance_item(struct butter_fs *fs, struct butter_balance_args *out);
int ops_balance_cancel(struct butter_fs *fs);
int ops_check(struct butter_fs *fs, struct butter_check_result *res);
int ops_defrag(struct butter_fs *fs, butter_ino_t ino, const struct butter_defrag_args *args,
	struct butter_defrag_stats *st);
/*
 * Call @fn for each place on disk (logical address, bytes) that file @ino's
 * data in [off, off + len) (len 0: to the end) is read from, in file order;
 * holes and inline data have none. (layout.c)
 */
int ops_file_pieces(struct butter_fs *fs, butter_ino_t ino, u64 off, u64 len,
		    int (*fn)(void *arg, u64 logical, u64 len), void *arg);
/* The body of butter_space_map() (spacemap.c). */
int ops_space_map(struct butter_fs *fs, uint64_t devid, uint64_t cell_bytes,
		  const struct butter_layout_range *marks, size_t nmarks,
		  struct butter_space_cell *cells, size_t ncells);
/* The body of butter_file_extents() (fiemap.c). */
int ops_file_extents(struct butter_fs *fs, butter_ino_t ino, uint64_t start,
		     struct butter_file_extent *out, size_t n, size_t *got);
/* The body of butter_tree_search() (search.c). */
int ops_tree_search(struct butter_fs *fs, const struct butter_search_key *sk, uint32_t nr_items,
		    void *buf, size_t bufsize, uint32_t *nr_found);
int ops_layout(struct butter_fs *fs, const struct butter_layout_range *ranges, size_t n,
	unsigned flags, struct butter_layout_stats *st);
void ops_close(struct butter_fs *fs);
int ops_device_add(struct butter_fs *fs, const char *path, unsigned flags, uint64_t *devid);
int ops_device_remove(struct butter_fs *fs, uint64_t devid);
int ops_device_remove_step(struct butter_fs *fs, uint64_t devid, uint64_t *cursor,
	struct butter_balance_stats *st);
int ops_device_resize_step(struct butter_fs *fs, uint64_t devid, uint64_t size, uint64_t *cursor,
	struct butter_balance_stats *st);
int ops_replace(struct butter_fs *fs, uint64_t srcdevid, const char *target, unsigned flags,
	struct butter_replace_stats *st);
int ops_replace_start(struct butter_fs *fs, uint64_t srcdevid, const char *target, unsigned flags);
int ops_replace_step(struct butter_fs *fs, struct butter_replace_stats *st);
int ops_replace_cancel(struct butter_fs *fs);
int ops_replace_status(struct butter_fs *fs, struct butter_replace_stats *st);
int ops_device_resize(struct butter_fs *fs, uint64_t devid, uint64_t *size);
int ops_device_stats(struct butter_fs *fs, size_t idx, unsigned flags,
	struct butter_device_stats *out);
int ops_receive(struct butter_fs *fs, butter_ino_t dest, unsigned flags,
		butter_receive_read_fn read, void *arg, struct butter_receive_result *result);
/* butter_receive_dump()'s work: the stream as text, errors to @log. */
struct blog;
int ops_receive_dump(butter_receive_read_fn read, void *arg, butter_dump_line_fn line,
		     void *line_arg, const struct blog *log);
int ops_scrub(struct butter_fs *fs, unsigned flags, struct butter_scrub_stats *st);
int ops_scrub_range(struct butter_fs *fs, unsigned flags, uint64_t *cursor, uint64_t budget,
	struct butter_scrub_stats *st);
int ops_scrub_supers(struct butter_fs *fs, unsigned flags, struct butter_scrub_stats *st);
int ops_send(struct butter_fs *fs, uint64_t subvol, uint64_t parent, butter_send_write_fn write,
	void *arg);

/*
 * Empty the block group at @start and remove its chunk (relocate.c), with
 * the write lock @w held and no change running: it commits what runs, then
 * moves the group in transactions of its own. Adds to @st (may be NULL).
 * A failure after trees changed aborts the transaction.
 */
int ops_relocate_group_locked(struct butter_fs *fs, struct fs_write_state *w, u64 start,
			      struct butter_balance_stats *st);

/* A data extent to move: its bytenr and length (the length sizes the destination). */
struct ops_move_item {
	u64 bytenr, len;
};

struct ops_move_stats {
	u64 extents, bytes, tree_blocks; /* moved (added to) */
	u64 hint;  /* in: where the previous call's copies ended (0: none); out: where these end */
};

#define OPS_MOVE_FRESH 0x1u /* copies go to new chunks first, free space of old groups after */

/*
 * Move the data extents @items[0..n) (relocate.c), in this order, to one
 * contiguous run of free space each batch allows (each copy right after the
 * previous one; a new region only when the current one is full), with every
 * file extent item in every tree that names one following it, so nothing
 * shared becomes unshared. Bytes and checksums are copied as stored
 * (compressed extents stay so). An item named twice or no longer allocated
 * is skipped. With the write lock @w held and no change running: it commits
 * what runs, then moves in transactions of 256 MiB of data each, committed.
 * A failure after trees changed aborts the transaction.
 */
int ops_move_data_locked(struct butter_fs *fs, struct fs_write_state *w,
			 const struct ops_move_item *items, size_t n, unsigned flags,
			 struct ops_move_stats *st);

/*
 * Before shrinking device @devid to @want bytes (balance.c): keep new chunks
 * out of the space past @want and move every group with a stripe there.
 * 0 (the space stays out of allocation), or the error with it given back.
 */
int ops_shrink_prepare(struct butter_fs *fs, u64 devid, u64 want);

/*
 * The same one block group per call (a mount's daemon steps it): *cursor is
 * UINT64_MAX to start; 0 after a group, 1 when none is left, or -errno (the
 * space given back).
 */
int ops_shrink_step(struct butter_fs *fs, u64 devid, u64 want, uint64_t *cursor,
		    struct butter_balance_stats *st);

/* Is a replace running (replace.c) of device @devid (0: of any)? */
int ops_replace_running(const struct butter_fs *fs, u64 devid);
/* Closing the write side: a running replace stops, the old device stays. */
void ops_replace_abandon(struct butter_fs *fs);

/*
 * A device taken out of the filesystem (device.c): wipe its superblocks
 * (warning if that fails), close it, forget its path for reopens, free it.
 */
void ops_retire_device(struct butter_fs *fs, struct btrfs_device *dev);

/*
 * A device about to join @fs (device.c): refuse one of this filesystem, one
 * of another unless @force, one too small; then wipe its first MiB and
 * superblock places. 0 or -errno (logged).
 */
int ops_prepare_new_device(struct butter_fs *fs, struct blockdev *bdev, const char *path,
			   int force);

/* Is @path (by inode, or device number for block devices) a present member of @vol? */
int ops_is_member(const struct btrfs_volumes *vol, const char *path);

/*
 * fs_begin_change() for a change that wants a transaction of its own: what
 * runs is committed first. 0 with the write lock held (end with
 * fs_end_change()), or -errno with nothing held.
 */
int ops_begin_alone(struct butter_fs *fs, struct fs_write_state **wp);

/* The reopen record names @new_path where it named @old_path (NULL: adds it). */
int ops_reopen_path_swap(struct butter_fs *fs, const char *old_path, const char *new_path);

#endif
