/*
 * open.c — opening and closing a filesystem: the devices (claimed, with the
 * test devices stacked when asked), the handle (lib/fs/fs.c), and for a
 * read-write open the write side and the recovery steps, in this order, as
 * the kernel does at a read-write mount:
 *   1. the write state (lib/fs/change.c), the open-file counts of orphans
 *      (lib/namespace/orphan.c) and the quota hook (lib/subvol/qgroup.c);
 *   2. the tree log replayed (lib/treelog/replay.c): what was fsynced after
 *      the last commit, before anything else allocates;
 *   3. subvolumes whose deletion a crash interrupted are freed
 *      (lib/subvol/snapshot.c);
 *   4. orphan inodes are freed (lib/namespace/orphan.c).
 * A failure in step 1 undoes what was set up; a failure in steps 2-4 closes
 * the write side as a close does (what the steps before it committed, such
 * as a replayed log, stays committed) and returns the error.
 *
 * Close: butter_begin_close() drops the "in service" half of the claims, so
 * an opener waiting for the devices knows the holder is on its way out and
 * waits (instead of being refused); butter_close() frees the orphans still
 * open, commits what its caller left, closes the devices and so drops the
 * claims.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "ops/ops.h"

/*
 * Open the devices @paths[0..n) (read-only: shared claims, else exclusive)
 * into a new array *out. Each failure is logged, naming the path (a busy
 * device's claim names its holder itself); nothing stays open then.
 */
static int open_devices(const char *const *paths, size_t n, unsigned flags, const struct blog *log,
			struct blockdev ***out)
{
	struct blockdev **bdevs = calloc(n, sizeof(*bdevs));
	int readonly = !!(flags & BUTTER_OPEN_RDONLY);
	size_t i;
	int ret;

	if (!bdevs)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		unsigned bflags = readonly ? BLOCKDEV_OPEN_RDONLY : 0;

		if (readonly && (flags & BUTTER_OPEN_NO_WRITER))
			bflags |= BLOCKDEV_OPEN_NO_WRITER;
		ret = blockdev_open(paths[i], bflags, log, &bdevs[i]);
		if (ret) {
			/* a busy claim named the holder; the NBD backend names its URI */
			if (ret != -EBUSY && !blockdev_name_is_nbd(paths[i]))
				blog_err(log, "%s: %s", paths[i], strerror(-ret));
			while (i--)
				blockdev_close(bdevs[i]);
			free(bdevs);
			return ret;
		}
	}
	*out = bdevs;
	return 0;
}

/* Keep what opening @fs again needs (fs->reopen); -ENOMEM. */
static int keep_reopen(struct butter_fs *fs, const char *const *paths, size_t n,
		       const struct butter_open_opts *opts)
{
	char **copy = calloc(n, sizeof(*copy));
	size_t i;

	if (!copy)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		copy[i] = strdup(paths[i]);
		if (!copy[i]) {
			while (i--)
				free(copy[i]);
			free(copy);
			return -ENOMEM;
		}
	}
	fs->reopen.paths = copy;
	fs->reopen.npaths = n;
	fs->reopen.cache_bytes = opts->cache_bytes;
	fs->reopen.flags = opts->flags & ~(unsigned)BUTTER_OPEN_RDONLY;
	return 0;
}

int butter_open(const char *path, const struct butter_open_opts *opts, struct butter_fs **out)
{
	return butter_open_testing(path, opts, NULL, out);
}

int butter_open_testing(const char *path, const struct butter_open_opts *opts,
			const struct butter_test_devices *test, struct butter_fs **out)
{
	struct butter_test_devices none_test = { 0 };
	struct butter_open_opts none = { 0 };
	struct blockdev **bdevs;
	const char **paths;
	struct blog log;
	struct butter_fs *fs;
	size_t i, n;
	int ret;

	if (!opts)
		opts = &none;
	if (!test)
		test = &none_test;
	log.fn = opts->log;
	log.arg = opts->log_arg;
	log.level = opts->log_level ? opts->log_level : BUTTER_LOG_WARNING;

	n = 1 + opts->ndevices;
	paths = calloc(n, sizeof(*paths));
	if (!paths)
		return -ENOMEM;
	paths[0] = path;
	for (i = 1; i < n; i++)
		paths[i] = opts->devices[i - 1];
	ret = open_devices(paths, n, opts->flags, &log, &bdevs);
	if (ret) {
		free(paths);
		return ret;
	}
	if (test->record_log || test->fault_spec) {
		ret = blockdev_stack_test(bdevs, n, test->record_log, test->fault_spec);
		if (ret) {
			blog_err(&log, "%s: test devices (record log %s, fault spec \"%s\"): %s", path,
				 test->record_log ? test->record_log : "none",
				 test->fault_spec ? test->fault_spec : "", strerror(-ret));
			free(bdevs);
			free(paths);
			return ret;
		}
	}
	ret = ops_open_bdevs(path, bdevs, n, opts, &fs);
	free(bdevs);
	/* test devices are not stacked again: such a handle is not reopened */
	if (ret == 0 && !test->record_log && !test->fault_spec) {
		ret = keep_reopen(fs, paths, n, opts);
		if (ret)
			ops_close(fs);
	}
	free(paths);
	if (ret == 0)
		*out = fs;
	return ret;
}

void butter_begin_close(struct butter_fs *fs)
{
	if (!fs)
		return;
	for (size_t i = 0; i < fs->vol.ndevs; i++)
		blockdev_end_service(fs->vol.devs[i]->bdev);
}

/* Free the write side of @fs: what the layers above keep in it, then the state itself. */
static void close_write(struct butter_fs *fs, int commit)
{
	struct fs_write_state *w = fs->w;

	if (!w)
		return;
	ops_replace_abandon(fs);
	if (commit) {
		if (w->open_files)
			ns_orphan_free_open(fs);
		fs_final_commit(fs);
	}
	tlog_destroy(w);
	ns_open_files_destroy(w);
	data_buffers_destroy(w);
	fs_teardown_write(fs);
}

/* Steps 1-4 of a read-write open (see the top of this file). */
static int open_write(struct butter_fs *fs)
{
	int ret = fs_setup_write(fs);

	if (ret)
		return ret;
	ret = ns_open_files_init(fs->w);
	if (ret == 0)
		ret = subvol_qgroup_setup(fs);
	if (ret) {
		close_write(fs, 0);
		return ret;
	}
	/* what was fsynced after the last commit, before any allocation */
	ret = tlog_replay(fs);
	/* finish deleting subvolumes whose freeing a crash interrupted */
	if (ret >= 0)
		ret = subvol_drop_orphans(fs);
	/* and the relocation trees of a kernel balance that was cut */
	if (ret >= 0)
		ret = subvol_drop_reloc_trees(fs);
	if (ret >= 0)
		ret = ns_orphan_cleanup(fs); /* as the kernel at a read-write mount */
	if (ret < 0) {
		close_write(fs, 1);
		return ret;
	}
	return 0;
}

int ops_open_bdevs(const char *path, struct blockdev **bdevs, size_t n,
		   const struct butter_open_opts *opts, struct butter_fs **out)
{
	struct butter_fs *fs;
	int ret = fs_open_bdevs(path, bdevs, n, opts, &fs);

	if (ret)
		return ret;
	if (!(opts->flags & BUTTER_OPEN_RDONLY)) {
		ret = open_write(fs);
		if (ret) {
			fs_destroy(fs);
			return ret;
		}
	}
	*out = fs;
	return 0;
}

void ops_close(struct butter_fs *fs)
{
	if (!fs)
		return;
	butter_begin_close(fs);
	close_write(fs, 1);
	fs_destroy(fs);
}

/* Read @fs from its devices again, opened read-only (@readonly) or read-write. */
static int reload(struct butter_fs *fs, int readonly)
{
	struct butter_open_opts o = {
		.cache_bytes = fs->reopen.cache_bytes,
		.flags = fs->reopen.flags | (readonly ? BUTTER_OPEN_RDONLY : 0),
		.log = fs->log.fn,
		.log_arg = fs->log.arg,
		.log_level = fs->log.level,
	};
	const char *const *paths = (const char *const *)fs->reopen.paths;
	struct blockdev **bdevs;
	int ret;

	ret = open_devices(paths, fs->reopen.npaths, o.flags, &fs->log, &bdevs);
	if (ret)
		return ret;
	ret = fs_reload(fs, paths[0], bdevs, fs->reopen.npaths, &o);
	free(bdevs);
	if (ret == 0 && !readonly) {
		ret = open_write(fs);
		if (ret)
			fs_unload(fs);
	}
	return ret;
}

/*
 * A handle opened read-only made read-write in place: its devices are closed
 * (dropping the shared claims) and opened again exclusively, and the open
 * sequence runs again into the same handle, recovery included, so callers
 * keep their handle (and those waiting on its lock find it changed). If that
 * fails, the filesystem is opened read-only again and the error returned; if
 * even that fails the handle is dead: every call on it fails with -EIO.
 */
static int reopen_rw(struct butter_fs *fs)
{
	int ret, back;

	if (!fs->reopen.paths)
		return -EROFS; /* opened in memory or with test devices */
	fs_unload(fs);
	ret = reload(fs, 0);
	if (ret == 0) {
		blog_info(&fs->log, "%s: opened again read-write", fs->reopen.paths[0]);
		return 0;
	}
	back = reload(fs, 1);
	if (back)
		blog_err(&fs->log, "%s: cannot open the filesystem again, not even read-only (%s): "
				   "the handle is closed", fs->reopen.paths[0], strerror(-back));
	return ret;
}

int ops_set_readonly(struct butter_fs *fs, int readonly)
{
	if (!readonly && !fs->w && (fs->open_flags & BUTTER_OPEN_RDONLY))
		return reopen_rw(fs);
	return fs_set_readonly(fs, readonly);
}
