/*
 * device.c — adding a device to a filesystem (offline or on an open
 * handle), as `btrfs device add` does: the device gets the next devid, a
 * new device uuid and a DEV_ITEM; the superblock counts it; new chunks may
 * be allocated on it from then on. Nothing already allocated moves (that is
 * balance's work), so existing chunks keep their profiles and places.
 *
 * The new device's first MiB and its superblock mirror places are zeroed
 * first, so no stale superblock of an earlier filesystem remains on it. It
 * becomes a member at the commit that ends the call, which writes the
 * superblocks to every device including the new one; a crash before that
 * leaves the filesystem as it was (the device is then just zeroed space).
 *
 * Test plumbing: when the filesystem's devices are recorded (a crash test's
 * record log, butter_open_testing()), the new device joins the log before
 * its first write (record_new_device(): a replace target, a device added),
 * so a replay sees every device the filesystem ever wrote.
 *
 * Also the device statistics' read side: fs_load_dev_stats() adds the
 * DEV_STATS items of the device tree to the counters at open, and
 * butter_device_stats() reports (and resets) them; the commit writes them
 * (lib/trans/dev_stats.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <uuid/uuid.h>

#include "ops/ops.h"

#define MIN_DEVICE_BYTES (16ull << 20)
#define ZERO_BYTES (1ull << 20)

/* Does @bdev hold a btrfs superblock? 1 with its fsid in @fsid, 0 if not, or -errno. */
static int has_btrfs(struct blockdev *bdev, u8 *fsid)
{
	struct btrfs_super_block *sb = malloc(sizeof(*sb));
	int ret = 0;

	if (!sb)
		return -ENOMEM;
	if (bdev->size >= BTRFS_SUPER_INFO_OFFSET + BTRFS_SUPER_INFO_SIZE) {
		ret = blockdev_read(bdev, sb, sizeof(*sb), BTRFS_SUPER_INFO_OFFSET);
		if (ret == 0 && btrfs_super_magic(sb) == BTRFS_MAGIC) {
			memcpy(fsid, sb->fsid, BTRFS_FSID_SIZE);
			ret = 1;
		}
	}
	free(sb);
	return ret;
}

/* Zero the first MiB and every superblock mirror place of @bdev. */
static int wipe(struct blockdev *bdev)
{
	u8 *zero = calloc(1, ZERO_BYTES);
	int mirror, ret;

	if (!zero)
		return -ENOMEM;
	ret = blockdev_write(bdev, zero, bdev->size < ZERO_BYTES ? bdev->size : ZERO_BYTES, 0);
	for (mirror = 1; ret == 0 && mirror < BTRFS_SUPER_MIRROR_MAX; mirror++) {
		u64 at = btrfs_sb_offset(mirror);

		if (at + BTRFS_SUPER_INFO_SIZE <= bdev->size)
			ret = blockdev_write(bdev, zero, BTRFS_SUPER_INFO_SIZE, at);
	}
	if (ret == 0)
		ret = blockdev_flush(bdev);
	free(zero);
	return ret;
}

/* Is @path (by inode, or by device number for block devices) a present member of @vol? */
int ops_is_member(const struct btrfs_volumes *vol, const char *path)
{
	struct stat st, mst;
	size_t i;

	if (stat(path, &st) < 0)
		return 0;
	for (i = 0; i < vol->ndevs; i++) {
		const struct btrfs_device *dev = vol->devs[i];

		if (!dev->bdev || !dev->path || stat(dev->path, &mst) < 0)
			continue;
		if (S_ISBLK(st.st_mode) ? S_ISBLK(mst.st_mode) && st.st_rdev == mst.st_rdev
					: st.st_dev == mst.st_dev && st.st_ino == mst.st_ino)
			return 1;
	}
	return 0;
}

/*
 * May @bdev (@path) become a device of @fs? Not one of another filesystem
 * unless @force, not one of this one, not too small. 0 or -errno (logged).
 */
static int check_new_device(struct butter_fs *fs, struct blockdev *bdev, const char *path,
			    int force)
{
	u8 fsid[BTRFS_FSID_SIZE];
	int ret = has_btrfs(bdev, fsid);

	if (ret == 1 && !memcmp(fsid, fs->vol.fsid, BTRFS_FSID_SIZE)) {
		blog_err(&fs->log, "%s: already a device of this filesystem", path);
		return -EEXIST;
	}
	if (ret == 1 && !force) {
		blog_err(&fs->log, "%s: holds another btrfs filesystem (force to overwrite it)", path);
		return -EBUSY;
	}
	if (ret >= 0 && bdev->size < MIN_DEVICE_BYTES) {
		blog_err(&fs->log, "%s: %llu bytes; a device needs at least %llu", path,
			 (unsigned long long)bdev->size, (unsigned long long)MIN_DEVICE_BYTES);
		return -ENOSPC;
	}
	return ret < 0 ? ret : 0;
}

/* A crash test records @fs's devices: @bdev joins the record log (lib/device/recorder.c). */
static int record_new_device(struct butter_fs *fs, struct blockdev *bdev)
{
	for (size_t i = 0; i < fs->vol.ndevs; i++)
		if (fs->vol.devs[i]->bdev)
			return blockdev_record_new(fs->vol.devs[i]->bdev, bdev);
	return 0;
}

int ops_begin_alone(struct butter_fs *fs, struct fs_write_state **wp)
{
	int ret = fs_begin_change(fs, wp);

	if (ret)
		return ret;
	ret = txn_commit(&(*wp)->txn);
	if (ret == 0)
		ret = txn_begin(&(*wp)->txn);
	return ret ? fs_end_change(*wp, ret, 0) : 0;
}

int ops_prepare_new_device(struct butter_fs *fs, struct blockdev *bdev, const char *path,
			   int force)
{
	int ret = check_new_device(fs, bdev, path, force);

	if (ret == 0)
		ret = record_new_device(fs, bdev);
	return ret ? ret : wipe(bdev);
}

int ops_reopen_path_swap(struct butter_fs *fs, const char *old_path, const char *new_path)
{
	char *copy = strdup(new_path), **paths;
	size_t i;

	if (!copy)
		return -ENOMEM;
	if (!fs->reopen.paths) {
		free(copy); /* no reopen record: nothing to keep true */
		return 0;
	}
	for (i = 0; old_path && i < fs->reopen.npaths; i++) {
		if (strcmp(fs->reopen.paths[i], old_path) == 0) {
			free(fs->reopen.paths[i]);
			fs->reopen.paths[i] = copy;
			return 0;
		}
	}
	paths = realloc(fs->reopen.paths, (fs->reopen.npaths + 1) * sizeof(*paths));
	if (!paths) {
		free(copy);
		return -ENOMEM;
	}
	fs->reopen.paths = paths;
	paths[fs->reopen.npaths++] = copy;
	return 0;
}

int ops_device_add(struct butter_fs *fs, const char *path, unsigned flags, uint64_t *devid)
{
	struct btrfs_volumes *vol = &fs->vol;
	struct fs_write_state *w = NULL;
	struct btrfs_device *dev;
	struct blockdev *bdev;
	u64 id = 0;
	size_t i;
	int ret;

	if (flags & ~BUTTER_DEVICE_ADD_FORCE)
		return -EINVAL;
	if (!fs->w)
		return -EROFS;
	if (ops_is_member(vol, path)) { /* before the open: our own claim would refuse it */
		blog_err(&fs->log, "%s: already a device of this filesystem", path);
		return -EEXIST;
	}
	ret = blockdev_open(path, 0, &fs->log, &bdev);
	if (ret) {
		blog_err(&fs->log, "%s: cannot open: %s", path, strerror(-ret));
		return ret;
	}
	ret = check_new_device(fs, bdev, path, flags & BUTTER_DEVICE_ADD_FORCE);
	if (ret == 0)
		ret = record_new_device(fs, bdev);
	if (ret) {
		blockdev_close(bdev);
		return ret;
	}
	dev = calloc(1, sizeof(*dev));
	if (dev)
		dev->path = strdup(path);
	if (!dev || !dev->path) {
		if (dev)
			free(dev);
		blockdev_close(bdev);
		return -ENOMEM;
	}
	ret = fs_begin_change(fs, &w);
	if (ret == 0)
		ret = txn_commit(&w->txn); /* the device joins at a commit of its own */
	if (ret == 0)
		ret = txn_begin(&w->txn);
	if (ret == 0)
		ret = wipe(bdev);
	if (ret) {
		free(dev->path);
		free(dev);
		blockdev_close(bdev);
		return w ? fs_end_change(w, ret, 0) : ret;
	}
	for (i = 0; i < vol->ndevs; i++)
		if (vol->devs[i]->devid > id)
			id = vol->devs[i]->devid;
	dev->devid = id + 1;
	uuid_generate(dev->uuid);
	dev->total_bytes = bdev->size & ~((u64)vol->sectorsize - 1);
	dev->generation = btrfs_super_generation(&vol->super);
	dev->bdev = bdev;

	/* phase 2: from here a failure aborts the transaction */
	ret = volumes_insert_device(vol, dev);
	if (ret) {
		free(dev->path);
		free(dev);
		blockdev_close(bdev);
		return fs_end_change(w, ret, 1);
	}
	ret = chunk_add_device(&w->es, &w->txn.tt, dev);
	if (ret == 0) {
		w->txn.super_dirty = 1;
		ret = txn_commit(&w->txn);
	}
	if (ret == 0 && devid)
		*devid = dev->devid;
	return fs_end_change(w, ret, 1);
}

void ops_retire_device(struct butter_fs *fs, struct btrfs_device *dev)
{
	size_t i;
	int ret;

	if (!dev)
		return;
	if (dev->bdev) {
		ret = wipe(dev->bdev);
		if (ret)
			blog_warn(&fs->log, "device %llu (%s) was removed, but wiping its superblocks "
					    "failed: %s", (unsigned long long)dev->devid,
				  dev->path ? dev->path : "?", strerror(-ret));
		blockdev_close(dev->bdev);
	}
	/* a reopen in place must not look for it */
	for (i = 0; dev->path && i < fs->reopen.npaths; i++) {
		if (strcmp(fs->reopen.paths[i], dev->path) != 0)
			continue;
		free(fs->reopen.paths[i]);
		memmove(&fs->reopen.paths[i], &fs->reopen.paths[i + 1],
			(fs->reopen.npaths - i - 1) * sizeof(fs->reopen.paths[0]));
		fs->reopen.npaths--;
		break;
	}
	free(dev->path);
	free(dev);
}

int ops_device_stats(struct butter_fs *fs, size_t idx, unsigned flags,
		     struct butter_device_stats *out)
{
	struct btrfs_device *dev;
	int k;

	if (flags & ~BUTTER_DEV_STATS_RESET)
		return -EINVAL;
	if (idx >= fs->vol.ndevs)
		return -ENOENT;
	if ((flags & BUTTER_DEV_STATS_RESET) && !fs->w)
		return -EROFS;
	dev = fs->vol.devs[idx];
	memset(out, 0, sizeof(*out));
	out->devid = dev->devid;
	out->path = dev->bdev ? dev->path : NULL;
	for (k = 0; k < BTRFS_DEV_STAT_VALUES_MAX && k < BUTTER_DEV_STAT_NR; k++) {
		if (flags & BUTTER_DEV_STATS_RESET)
			out->values[k] = __atomic_exchange_n(&dev->stats[k], 0, __ATOMIC_RELAXED);
		else
			out->values[k] = __atomic_load_n(&dev->stats[k], __ATOMIC_RELAXED);
	}
	if (flags & BUTTER_DEV_STATS_RESET)
		__atomic_store_n(&dev->stats_dirty, 1, __ATOMIC_RELEASE);
	return 0;
}
