/*
 * api.c — the public calls of libbutter (include/butter/butter.h) and the
 * handle's lock they take. Each call is one line: take the lock in the mode
 * the call needs, run its body in the layer that owns it, let the lock go.
 * The body's name carries its layer's prefix (fs_, inode_, data_, ns_,
 * subvol_, tlog_, ops_); library code calls bodies, never butter_*().
 *
 * The lock (struct butter_fs.api_lock, a reader-writer lock that lets callers
 * in the order they came: lib/turn_lock.h):
 *   shared     calls that only read: lookups, stat, read, readdir, xattrs,
 *              readlink, seek, statfs and info, subvolume listing, send,
 *              the open count (butter_open_ref: the table has its own mutex);
 *   exclusive  calls that change anything or commit: every change, sync,
 *              fsync, scrub, receive, device add/resize, check, the settings;
 *   adaptive   butter_release() runs shared unless it frees an orphan (then
 *              again, exclusive); butter_seek() shared unless the file has
 *              buffered data (lib/data/delalloc.c) to write first; butter_device_stats() runs shared unless it
 *              resets the counters; butter_close() waits for every call.
 *   none       calls without a handle (open, mkfs, parsers, names) and
 *              butter_begin_close(), which only drops device claims.
 *
 * A handle whose reopen failed is dead (fs->dead): every call fails with
 * -EIO once it has the lock.
 *
 * A thread that holds the lock (a call's callback, or a butter_lock()
 * section) calls through without taking it again: per thread, the handle's
 * key api_held says which mode it holds and how many sections are open.
 * Sections nest; the lock goes when the section that took it ends. A change
 * (or an exclusive section) asked for under a shared hold would wait for
 * itself: it fails with -EDEADLK instead.
 */
#include <errno.h>
#include <stdint.h>

#include "ops/ops.h"

enum { HOLD_NONE = 0, HOLD_SHARED = 1, HOLD_EXCL = 2 };

/*
 * The per-thread record (api_held): the mode held (HOLD_*, low two bits),
 * HELD_BY_SECTION when butter_lock() took the lock (else a call did), and
 * above HELD_DEPTH_SHIFT how many butter_lock() sections are open.
 */
#define HELD_MODE_MASK 3
#define HELD_BY_SECTION 4
#define HELD_DEPTH_SHIFT 3

static intptr_t held_get(struct butter_fs *fs)
{
	return (intptr_t)pthread_getspecific(fs->api_held);
}

static void held_set(struct butter_fs *fs, intptr_t v)
{
	pthread_setspecific(fs->api_held, (void *)v);
}

static void unlock(struct butter_fs *fs, int mode)
{
	if (mode == HOLD_EXCL)
		turn_unlock_exclusive(fs->api_lock);
	else
		turn_unlock_shared(fs->api_lock);
}

/* Take the lock in @mode unless this thread holds it: 1 taken, 0 held already, -EDEADLK, -EIO. */
static int enter(struct butter_fs *fs, int mode)
{
	intptr_t held = held_get(fs) & HELD_MODE_MASK;

	if (held != HOLD_NONE)
		return mode == HOLD_EXCL && held == HOLD_SHARED ? -EDEADLK : 0;
	if (mode == HOLD_EXCL)
		turn_lock_exclusive(fs->api_lock);
	else
		turn_lock_shared(fs->api_lock);
	if (fs->dead) { /* a reopen failed (ops/open.c): nothing to serve from */
		unlock(fs, mode);
		return -EIO;
	}
	held_set(fs, mode);
	return 1;
}

static void leave(struct butter_fs *fs, int taken)
{
	intptr_t mode = held_get(fs) & HELD_MODE_MASK;

	if (taken != 1)
		return;
	ASSERT(mode != HOLD_NONE);
	held_set(fs, HOLD_NONE);
	unlock(fs, (int)mode);
}

#define LOCKED(fs, mode, type, call)                \
	do {                                        \
		int taken_ = enter((fs), (mode));   \
		type ret_;                          \
		if (taken_ < 0)                     \
			return (type)taken_;        \
		ret_ = (call);                      \
		leave((fs), taken_);                \
		return ret_;                        \
	} while (0)

#define LOCKED_VOID(fs, mode, call)                 \
	do {                                        \
		int taken_ = enter((fs), (mode));   \
		if (taken_ < 0)                     \
			return;                     \
		call;                               \
		leave((fs), taken_);                \
	} while (0)

const char *butter_version(void)
{
	return BUTTER_VERSION_STRING;
}

int butter_lock(struct butter_fs *fs, int exclusive)
{
	int mode = exclusive ? HOLD_EXCL : HOLD_SHARED, ret;
	intptr_t held = held_get(fs);

	if (held != HOLD_NONE) {
		/* a section inside a hold of this thread: counted; exclusive inside shared cannot be */
		if (mode == HOLD_EXCL && (held & HELD_MODE_MASK) == HOLD_SHARED)
			return -EDEADLK;
		held_set(fs, held + ((intptr_t)1 << HELD_DEPTH_SHIFT));
		return 0;
	}
	ret = enter(fs, mode);
	if (ret < 0)
		return ret;
	held_set(fs, mode | HELD_BY_SECTION | ((intptr_t)1 << HELD_DEPTH_SHIFT));
	return 0;
}

void butter_unlock(struct butter_fs *fs)
{
	intptr_t held = held_get(fs), depth = held >> HELD_DEPTH_SHIFT;

	if (depth == 0)
		return; /* no section is open on this thread */
	if (depth == 1 && (held & HELD_BY_SECTION)) {
		leave(fs, 1);
		return;
	}
	held_set(fs, held - ((intptr_t)1 << HELD_DEPTH_SHIFT));
}

int butter_release(struct butter_fs *fs, butter_ino_t ino, unsigned flags)
{
	int taken = enter(fs, HOLD_SHARED), ret;

	if (taken < 0)
		return taken;
	/* shared: every release but the last of an orphan, which says 1 here */
	ret = ns_release(fs, ino, flags | BUTTER_RELEASE_NOFREE);
	leave(fs, taken);
	if (ret != 1 || (flags & BUTTER_RELEASE_NOFREE))
		return ret;
	LOCKED(fs, HOLD_EXCL, int, ns_release(fs, ino, flags));
}

int butter_device_stats(struct butter_fs *fs, size_t idx, unsigned flags,
			struct butter_device_stats *out)
{
	LOCKED(fs, (flags & BUTTER_DEV_STATS_RESET) ? HOLD_EXCL : HOLD_SHARED, int,
	       ops_device_stats(fs, idx, flags, out));
}

void butter_close(struct butter_fs *fs)
{
	if (!fs)
		return;
	/* wait for the calls still running; nobody may start one now */
	if (enter(fs, HOLD_EXCL) == 1)
		leave(fs, 1);
	ops_close(fs);
}

/* ---- the handle, commits and settings (lib/fs) ---- */

int butter_get_device(struct butter_fs *fs, size_t idx, struct butter_device_info *out)
{
	LOCKED(fs, HOLD_SHARED, int, fs_get_device(fs, idx, out));
}

int butter_device_is_nbd(const char *name)
{
	return name && blockdev_name_is_nbd(name);
}

int butter_nbd_open_error(int err)
{
	return blockdev_nbd_open_error(err);
}

int butter_device_size(const char *name, uint64_t *size)
{
	/* connection messages to stderr: no handle, so no caller's log yet */
	struct blog log = { NULL, NULL, BUTTER_LOG_ERROR };

	return blockdev_probe_size(name, &log, size);
}

int butter_get_info(struct butter_fs *fs, struct butter_info *info)
{
	LOCKED(fs, HOLD_SHARED, int, fs_get_info(fs, info));
}

int butter_get_space(struct butter_fs *fs, size_t idx, struct butter_space_info *out)
{
	LOCKED(fs, HOLD_SHARED, int, fs_get_space(fs, idx, out));
}

int butter_set_compression(struct butter_fs *fs, const char *spec, int force)
{
	LOCKED(fs, HOLD_EXCL, int, fs_set_compression(fs, spec, force));
}

int butter_set_max_inline(struct butter_fs *fs, uint64_t max_bytes)
{
	LOCKED(fs, HOLD_EXCL, int, fs_set_max_inline(fs, max_bytes));
}

int butter_set_write_buffer(struct butter_fs *fs, uint64_t max_bytes)
{
	LOCKED(fs, HOLD_EXCL, int, data_set_write_buffer(fs, max_bytes));
}

int butter_set_label(struct butter_fs *fs, const char *label)
{
	LOCKED(fs, HOLD_EXCL, int, fs_set_label(fs, label));
}

int butter_set_readonly(struct butter_fs *fs, int readonly)
{
	LOCKED(fs, HOLD_EXCL, int, ops_set_readonly(fs, readonly));
}

void butter_set_space_commit_hook(struct butter_fs *fs, void (*fn)(void *arg), void *arg)
{
	LOCKED_VOID(fs, HOLD_EXCL, fs_set_space_commit_hook(fs, fn, arg));
}

int butter_statfs(struct butter_fs *fs, struct butter_statfs *out)
{
	LOCKED(fs, HOLD_SHARED, int, fs_statfs(fs, out));
}

int butter_sync(struct butter_fs *fs)
{
	LOCKED(fs, HOLD_EXCL, int, fs_sync(fs));
}

/* ---- inodes and xattrs (lib/inode) ---- */

ssize_t butter_getxattr(struct butter_fs *fs, butter_ino_t ino, const char *name, void *buf,
	size_t size)
{
	LOCKED(fs, HOLD_SHARED, ssize_t, inode_getxattr(fs, ino, name, buf, size));
}

ssize_t butter_listxattr(struct butter_fs *fs, butter_ino_t ino, char *buf, size_t size)
{
	LOCKED(fs, HOLD_SHARED, ssize_t, inode_listxattr(fs, ino, buf, size));
}

int butter_lookup(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
	butter_ino_t *out)
{
	LOCKED(fs, HOLD_SHARED, int, inode_lookup(fs, dir, name, namelen, out));
}

int butter_lookup_type(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
	butter_ino_t *out, unsigned *dtype)
{
	LOCKED(fs, HOLD_SHARED, int, inode_lookup_full(fs, dir, name, namelen, out, dtype, NULL));
}

int butter_root(struct butter_fs *fs, uint64_t subvolid, butter_ino_t *out)
{
	LOCKED(fs, HOLD_SHARED, int, inode_root(fs, subvolid, out));
}

int butter_stat(struct butter_fs *fs, butter_ino_t ino, struct butter_stat *st)
{
	LOCKED(fs, HOLD_SHARED, int, data_stat(fs, ino, st));
}

/* ---- file data (lib/data) ---- */

int butter_clone_range(struct butter_fs *fs, butter_ino_t src, uint64_t src_off, butter_ino_t dst,
	uint64_t dst_off, uint64_t len)
{
	LOCKED(fs, HOLD_EXCL, int, data_clone_range(fs, src, src_off, dst, dst_off, len));
}

int butter_fallocate(struct butter_fs *fs, butter_ino_t ino, int mode, uint64_t off, uint64_t len)
{
	LOCKED(fs, HOLD_EXCL, int, data_fallocate(fs, ino, mode, off, len));
}

ssize_t butter_read(struct butter_fs *fs, butter_ino_t ino, void *buf, size_t len, uint64_t off)
{
	LOCKED(fs, HOLD_SHARED, ssize_t, data_read(fs, ino, buf, len, off));
}

ssize_t butter_readlink(struct butter_fs *fs, butter_ino_t ino, char *buf, size_t size)
{
	LOCKED(fs, HOLD_SHARED, ssize_t, data_readlink(fs, ino, buf, size));
}

int butter_seek(struct butter_fs *fs, butter_ino_t ino, uint64_t off, int whence, uint64_t *result)
{
	int taken = enter(fs, HOLD_SHARED), ret = 0, buffered;

	if (taken < 0)
		return taken;
	/* shared, unless the file has buffered data: then it is written first */
	buffered = data_buffered(fs, ino);
	if (!buffered)
		ret = data_seek(fs, ino, off, whence, result);
	leave(fs, taken);
	if (!buffered)
		return ret;
	LOCKED(fs, HOLD_EXCL, int, data_seek_written(fs, ino, off, whence, result));
}

ssize_t butter_write(struct butter_fs *fs, butter_ino_t ino, const void *buf, size_t len,
	uint64_t off)
{
	LOCKED(fs, HOLD_EXCL, ssize_t, data_write_buffered(fs, ino, buf, len, off));
}

/* ---- names, attributes, open files (lib/namespace) ---- */

int butter_atime_due(struct butter_fs *fs, butter_ino_t ino, unsigned policy)
{
	LOCKED(fs, HOLD_SHARED, int, ns_atime_due(fs, ino, policy));
}

int butter_create(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
	const struct butter_new_inode *attr, butter_ino_t *out)
{
	LOCKED(fs, HOLD_EXCL, int, ns_create(fs, dir, name, namelen, attr, out));
}

int butter_create_tmpfile(struct butter_fs *fs, butter_ino_t dir,
	const struct butter_new_inode *attr, butter_ino_t *out)
{
	LOCKED(fs, HOLD_EXCL, int, ns_create_tmpfile(fs, dir, attr, out));
}

int butter_link(struct butter_fs *fs, butter_ino_t ino, butter_ino_t dir, const char *name,
	size_t namelen)
{
	LOCKED(fs, HOLD_EXCL, int, ns_link(fs, ino, dir, name, namelen));
}

int butter_open_ref(struct butter_fs *fs, butter_ino_t ino)
{
	LOCKED(fs, HOLD_SHARED, int, ns_open_ref(fs, ino));
}

int butter_readdir(struct butter_fs *fs, butter_ino_t dir, uint64_t pos, butter_dirent_fn fn,
	void *arg)
{
	LOCKED(fs, HOLD_SHARED, int, ns_readdir(fs, dir, pos, fn, arg));
}

int butter_readdir_end(struct butter_fs *fs, butter_ino_t dir, uint64_t *end)
{
	LOCKED(fs, HOLD_SHARED, int, ns_readdir_end(fs, dir, end));
}

int butter_readdir_until(struct butter_fs *fs, butter_ino_t dir, uint64_t pos, uint64_t end,
	butter_dirent_fn fn, void *arg)
{
	LOCKED(fs, HOLD_SHARED, int, ns_readdir_until(fs, dir, pos, end, fn, arg));
}

int butter_removexattr(struct butter_fs *fs, butter_ino_t ino, const char *name)
{
	LOCKED(fs, HOLD_EXCL, int, ns_removexattr(fs, ino, name));
}

int butter_rename(struct butter_fs *fs, butter_ino_t olddir, const char *oldname, size_t oldlen,
	butter_ino_t newdir, const char *newname, size_t newlen, unsigned flags)
{
	LOCKED(fs, HOLD_EXCL, int, ns_rename(fs, olddir, oldname, oldlen, newdir, newname, newlen, flags));
}

int butter_resolve(struct butter_fs *fs, const char *path, butter_ino_t *out)
{
	LOCKED(fs, HOLD_SHARED, int, ns_resolve(fs, path, out));
}

int butter_rmdir(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen)
{
	LOCKED(fs, HOLD_EXCL, int, ns_rmdir(fs, dir, name, namelen));
}

int butter_setattr(struct butter_fs *fs, butter_ino_t ino, const struct butter_stat *st,
	unsigned mask)
{
	LOCKED(fs, HOLD_EXCL, int, ns_setattr(fs, ino, st, mask, NULL));
}

int butter_setattr_stat(struct butter_fs *fs, butter_ino_t ino, const struct butter_stat *st,
	unsigned mask, struct butter_stat *out)
{
	LOCKED(fs, HOLD_EXCL, int, ns_setattr(fs, ino, st, mask, out));
}

int butter_get_fileattr(struct butter_fs *fs, butter_ino_t ino, uint32_t *flags)
{
	LOCKED(fs, HOLD_SHARED, int, ns_get_fileattr(fs, ino, flags));
}

int butter_set_fileattr(struct butter_fs *fs, butter_ino_t ino, uint32_t flags)
{
	LOCKED(fs, HOLD_EXCL, int, ns_set_fileattr(fs, ino, flags));
}

int butter_setxattr(struct butter_fs *fs, butter_ino_t ino, const char *name, const void *value,
	size_t size)
{
	LOCKED(fs, HOLD_EXCL, int, ns_setxattr(fs, ino, name, value, size));
}

int butter_symlink(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
	const char *target, uint32_t uid, uint32_t gid, butter_ino_t *out)
{
	LOCKED(fs, HOLD_EXCL, int, ns_symlink(fs, dir, name, namelen, target, uid, gid, out));
}

int butter_touch_atime(struct butter_fs *fs, butter_ino_t ino, unsigned policy)
{
	LOCKED(fs, HOLD_EXCL, int, ns_touch_atime(fs, ino, policy));
}

int butter_unlink(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen)
{
	LOCKED(fs, HOLD_EXCL, int, ns_unlink(fs, dir, name, namelen));
}

/* ---- subvolumes (lib/subvol) ---- */

int butter_snapshot(struct butter_fs *fs, uint64_t src_id, butter_ino_t dir, const char *name,
	size_t namelen, unsigned flags, uint64_t *out_id)
{
	LOCKED(fs, HOLD_EXCL, int, subvol_snapshot(fs, src_id, dir, name, namelen, flags, out_id));
}

int butter_subvol_create(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
	uint64_t *out_id)
{
	LOCKED(fs, HOLD_EXCL, int, subvol_create(fs, dir, name, namelen, out_id));
}

int butter_subvol_delete(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen)
{
	LOCKED(fs, HOLD_EXCL, int, subvol_delete(fs, dir, name, namelen));
}

int butter_subvol_set_default(struct butter_fs *fs, uint64_t id)
{
	LOCKED(fs, HOLD_EXCL, int, subvol_set_default(fs, id));
}

int butter_subvol_set_readonly(struct butter_fs *fs, uint64_t id, int readonly)
{
	LOCKED(fs, HOLD_EXCL, int, subvol_set_readonly(fs, id, readonly));
}

int butter_subvol_get(struct butter_fs *fs, uint64_t id, struct butter_subvol_info *info)
{
	LOCKED(fs, HOLD_SHARED, int, subvol_get(fs, id, info));
}

int butter_subvol_list(struct butter_fs *fs, int (*fn)(void *arg,
	const struct butter_subvol_info *info), void *arg)
{
	LOCKED(fs, HOLD_SHARED, int, subvol_list(fs, fn, arg));
}

int butter_subvol_set_received(struct butter_fs *fs, uint64_t id, const uint8_t uuid[16],
	uint64_t stransid, unsigned flags)
{
	LOCKED(fs, HOLD_EXCL, int, subvol_set_received(fs, id, uuid, stransid, flags));
}

/* ---- fsync (lib/treelog) ---- */

int butter_fsync(struct butter_fs *fs, butter_ino_t ino, int datasync)
{
	LOCKED(fs, HOLD_EXCL, int, tlog_fsync(fs, ino, datasync));
}

int butter_fsync_many(struct butter_fs *fs, const butter_ino_t *inos, size_t n, int datasync)
{
	LOCKED(fs, HOLD_EXCL, int, tlog_fsync_many(fs, inos, n, datasync));
}

/* ---- whole-filesystem operations (lib/ops) ---- */

int butter_check(struct butter_fs *fs, struct butter_check_result *res)
{
	LOCKED(fs, HOLD_EXCL, int, ops_check(fs, res));
}

int butter_device_add(struct butter_fs *fs, const char *path, unsigned flags, uint64_t *devid)
{
	LOCKED(fs, HOLD_EXCL, int, ops_device_add(fs, path, flags, devid));
}

int butter_device_resize(struct butter_fs *fs, uint64_t devid, uint64_t *size)
{
	LOCKED(fs, HOLD_EXCL, int, ops_device_resize(fs, devid, size));
}

int butter_replace(struct butter_fs *fs, uint64_t srcdevid, const char *target, unsigned flags,
	struct butter_replace_stats *st)
{
	LOCKED(fs, HOLD_EXCL, int, ops_replace(fs, srcdevid, target, flags, st));
}

int butter_replace_start(struct butter_fs *fs, uint64_t srcdevid, const char *target,
	unsigned flags)
{
	LOCKED(fs, HOLD_EXCL, int, ops_replace_start(fs, srcdevid, target, flags));
}

int butter_replace_step(struct butter_fs *fs, struct butter_replace_stats *st)
{
	LOCKED(fs, HOLD_EXCL, int, ops_replace_step(fs, st));
}

int butter_replace_cancel(struct butter_fs *fs)
{
	LOCKED(fs, HOLD_EXCL, int, ops_replace_cancel(fs));
}

int butter_replace_status(struct butter_fs *fs, struct butter_replace_stats *st)
{
	LOCKED(fs, HOLD_EXCL, int, ops_replace_status(fs, st));
}

int butter_device_remove(struct butter_fs *fs, uint64_t devid)
{
	LOCKED(fs, HOLD_EXCL, int, ops_device_remove(fs, devid));
}

int butter_device_remove_step(struct butter_fs *fs, uint64_t devid, uint64_t *cursor,
	struct butter_balance_stats *st)
{
	LOCKED(fs, HOLD_EXCL, int, ops_device_remove_step(fs, devid, cursor, st));
}

int butter_device_resize_step(struct butter_fs *fs, uint64_t devid, uint64_t size,
	uint64_t *cursor, struct butter_balance_stats *st)
{
	LOCKED(fs, HOLD_EXCL, int, ops_device_resize_step(fs, devid, size, cursor, st));
}

int butter_balance(struct butter_fs *fs, const struct butter_balance_args *args,
	struct butter_balance_stats *st)
{
	LOCKED(fs, HOLD_EXCL, int, ops_balance(fs, args, st));
}

int butter_balance_step(struct butter_fs *fs, const struct butter_balance_args *args,
	uint64_t *cursor, struct butter_balance_stats *st)
{
	LOCKED(fs, HOLD_EXCL, int, ops_balance_step(fs, args, cursor, st));
}

int butter_ino_path(struct butter_fs *fs, butter_ino_t ino, char *out, size_t cap)
{
	LOCKED(fs, HOLD_SHARED, int, inode_path(fs, ino.subvol, ino.ino, out, cap));
}

int butter_defrag(struct butter_fs *fs, butter_ino_t ino, const struct butter_defrag_args *args,
		  struct butter_defrag_stats *st)
{
	LOCKED(fs, HOLD_EXCL, int, ops_defrag(fs, ino, args, st));
}

int butter_layout(struct butter_fs *fs, const struct butter_layout_range *ranges, size_t n,
		  unsigned flags, struct butter_layout_stats *st)
{
	if (!st)
		return -EINVAL;
	LOCKED(fs, HOLD_EXCL, int, ops_layout(fs, ranges, n, flags, st));
}

int butter_space_map(struct butter_fs *fs, uint64_t devid, uint64_t cell_bytes,
		     const struct butter_layout_range *marks, size_t nmarks,
		     struct butter_space_cell *cells, size_t ncells)
{
	LOCKED(fs, HOLD_SHARED, int, ops_space_map(fs, devid, cell_bytes, marks, nmarks, cells,
						   ncells));
}

int butter_file_extents(struct butter_fs *fs, butter_ino_t ino, uint64_t start,
			struct butter_file_extent *out, size_t n, size_t *got)
{
	LOCKED(fs, HOLD_SHARED, int, ops_file_extents(fs, ino, start, out, n, got));
}

int butter_tree_search(struct butter_fs *fs, const struct butter_search_key *key,
		       uint32_t nr_items, void *buf, size_t bufsize, uint32_t *nr_found)
{
	LOCKED(fs, HOLD_SHARED, int, ops_tree_search(fs, key, nr_items, buf, bufsize, nr_found));
}

int butter_balance_item(struct butter_fs *fs, struct butter_balance_args *out)
{
	LOCKED(fs, HOLD_SHARED, int, ops_balance_item(fs, out));
}

int butter_balance_cancel(struct butter_fs *fs)
{
	LOCKED(fs, HOLD_EXCL, int, ops_balance_cancel(fs));
}

/*
 * The stream is read with the lock let go (when this call took it): a
 * receive from a pipe would otherwise stop every other caller for as long
 * as the sender takes. ops_receive() reads only between commands, and each
 * command is whole changes of its own, so other callers see the subvolume
 * being built as it grows, as the kernel's receive shows it.
 */
struct unlocked_read {
	struct butter_fs *fs;
	butter_receive_read_fn read;
	void *arg;
	int lost; /* the lock could not be taken again (-EIO: the handle died) */
};

static ssize_t read_unlocked(void *arg, void *buf, size_t len)
{
	struct unlocked_read *u = arg;
	ssize_t n;
	int taken;

	leave(u->fs, 1);
	n = u->read(u->arg, buf, len);
	taken = enter(u->fs, HOLD_EXCL);
	if (taken < 0) {
		u->lost = 1;
		return taken;
	}
	return n;
}

int butter_receive_flags(struct butter_fs *fs, butter_ino_t dest, unsigned flags,
	butter_receive_read_fn read, void *arg, struct butter_receive_result *result)
{
	struct unlocked_read u = { fs, read, arg, 0 };
	int taken, ret;

	if (flags & ~BUTTER_RECEIVE_END_STOPS)
		return -EINVAL;
	taken = enter(fs, HOLD_EXCL);
	if (taken < 0)
		return taken;
	if (taken == 1)
		ret = ops_receive(fs, dest, flags, read_unlocked, &u, result);
	else /* inside the caller's section: it keeps the lock throughout */
		ret = ops_receive(fs, dest, flags, read, arg, result);
	if (!u.lost)
		leave(fs, taken);
	return ret;
}

int butter_receive(struct butter_fs *fs, butter_ino_t dest, butter_receive_read_fn read, void *arg,
	struct butter_receive_result *result)
{
	return butter_receive_flags(fs, dest, 0, read, arg, result);
}

int butter_receive_dump(butter_receive_read_fn read, void *arg, butter_dump_line_fn line,
	void *line_arg, butter_log_fn log, void *log_arg)
{
	struct blog b = { log, log_arg, BUTTER_LOG_WARNING };

	return ops_receive_dump(read, arg, line, line_arg, &b);
}

int butter_scrub(struct butter_fs *fs, unsigned flags, struct butter_scrub_stats *st)
{
	LOCKED(fs, HOLD_EXCL, int, ops_scrub(fs, flags, st));
}

int butter_scrub_range(struct butter_fs *fs, unsigned flags, uint64_t *cursor, uint64_t budget,
	struct butter_scrub_stats *st)
{
	LOCKED(fs, HOLD_EXCL, int, ops_scrub_range(fs, flags, cursor, budget, st));
}

int butter_scrub_supers(struct butter_fs *fs, unsigned flags, struct butter_scrub_stats *st)
{
	LOCKED(fs, HOLD_EXCL, int, ops_scrub_supers(fs, flags, st));
}

int butter_send(struct butter_fs *fs, uint64_t subvol, uint64_t parent, butter_send_write_fn write,
	void *arg)
{
	LOCKED(fs, HOLD_SHARED, int, ops_send(fs, subvol, parent, write, arg));
}
