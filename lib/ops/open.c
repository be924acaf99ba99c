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
 * Any failure undoes what was set up and returns the error.
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

int butter_open(const char *path, const struct butter_open_opts *opts, struct butter_fs **out)
{
	struct butter_open_opts none = { 0 };
	struct blockdev **bdevs;
	struct blog log;
	size_t i, n;
	int ret, readonly;

	if (!opts)
		opts = &none;
	log.fn = opts->log;
	log.arg = opts->log_arg;
	log.level = opts->log_level ? opts->log_level : BUTTER_LOG_WARNING;
	readonly = !!(opts->flags & BUTTER_OPEN_RDONLY);

	n = 1 + opts->ndevices;
	bdevs = calloc(n, sizeof(*bdevs));
	if (!bdevs)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		const char *p = i == 0 ? path : opts->devices[i - 1];
		unsigned bflags = readonly ? BLOCKDEV_OPEN_RDONLY : 0;

		if (readonly && (opts->flags & BUTTER_OPEN_NO_WRITER))
			bflags |= BLOCKDEV_OPEN_NO_WRITER;
		ret = blockdev_open_file(p, bflags, &log, &bdevs[i]);
		if (ret) {
			if (ret != -EBUSY) /* the claim named the holder */
				blog_err(&log, "%s: %s", p, strerror(-ret));
			while (i--)
				blockdev_close(bdevs[i]);
			free(bdevs);
			return ret;
		}
	}
	if (opts->record_log || opts->fault_spec) {
		ret = blockdev_stack_test(bdevs, n, opts->record_log, opts->fault_spec);
		if (ret) {
			blog_err(&log, "%s: test devices (record log %s, fault spec \"%s\"): %s", path,
				 opts->record_log ? opts->record_log : "none",
				 opts->fault_spec ? opts->fault_spec : "", strerror(-ret));
			free(bdevs);
			return ret;
		}
	}
	ret = ops_open_bdevs(path, bdevs, n, opts, out);
	free(bdevs);
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
	if (commit) {
		if (w->open_files)
			ns_orphan_free_open(fs);
		fs_final_commit(fs);
	}
	tlog_destroy(w);
	ns_open_files_destroy(w);
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
