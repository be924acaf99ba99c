/*
 * atime.c — access times: when a read sets a file's atime, and setting it.
 *
 * A front end reports reads (file data, directory entries); the library
 * decides, under the policy the mount asked for, as the kernel does for a
 * local filesystem:
 *   BUTTER_ATIME_NEVER     (noatime) never;
 *   BUTTER_ATIME_STRICT    (strictatime) at every read;
 *   BUTTER_ATIME_RELATIME  (relatime, the kernel's default) when the atime is
 *                          not later than the mtime or the ctime, or is a day
 *                          old or more;
 *   BUTTER_ATIME_NODIR     (nodiratime, or-ed in) never for directories.
 *
 * Rules:
 *  1. A read that cannot write (read-only handle, read-only subvolume, an
 *     inode flagged NOATIME by chattr +A, a placeholder directory) sets
 *     nothing and is not an error: reads never fail for their atime.
 *  2. Only the atime moves: not the ctime, and not the inode's sequence
 *     (the kernel's i_version moves with ctime changes only); the inode
 *     item's transid says it changed in this transaction, as for any change.
 *  3. butter_atime_due() changes nothing and holds the library's lock only
 *     shared, so a front end can ask it after every read and call
 *     butter_touch_atime() (exclusive) only when there is work to do;
 *     ns_touch_atime() decides again inside its change, since the inode may
 *     have moved on between the two calls.
 */
#include <errno.h>
#include <sys/stat.h>
#include <time.h>

#include "namespace/namespace.h"

#define RELATIME_MAX_AGE (24 * 60 * 60) /* seconds, as the kernel's relatime */

/* Compare two on-disk times: <0, 0, >0. */
static int ts_cmp(const struct btrfs_timespec *a, const struct btrfs_timespec *b)
{
	u64 as = btrfs_timespec_sec(a), bs = btrfs_timespec_sec(b);
	u32 an = btrfs_timespec_nsec(a), bn = btrfs_timespec_nsec(b);

	if (as != bs)
		return as < bs ? -1 : 1;
	return an == bn ? 0 : an < bn ? -1 : 1;
}

/* Does a read now set the atime of the inode @ii under @policy? */
static int atime_due(const struct btrfs_inode_item *ii, unsigned policy)
{
	const struct btrfs_timespec *atime = &ii->atime;
	struct btrfs_timespec now;

	if ((policy & BUTTER_ATIME_MODE_MASK) == BUTTER_ATIME_NEVER ||
	    (btrfs_inode_flags(ii) & BTRFS_INODE_NOATIME_FLAG) ||
	    ((policy & BUTTER_ATIME_NODIR) && S_ISDIR(btrfs_inode_mode(ii))))
		return 0;
	fs_now_ts(&now);
	if (ts_cmp(atime, &now) == 0)
		return 0;
	if ((policy & BUTTER_ATIME_MODE_MASK) == BUTTER_ATIME_STRICT)
		return 1;
	if (ts_cmp(&ii->mtime, atime) >= 0 || ts_cmp(&ii->ctime, atime) >= 0)
		return 1;
	return (s64)(btrfs_timespec_sec(&now) - btrfs_timespec_sec(atime)) >= RELATIME_MAX_AGE;
}

/* Phase-1 checks: the inode and whether its atime is due; 0 when nothing is to be done. */
static int check_due(struct butter_fs *fs, butter_ino_t ino, unsigned policy,
		     struct btrfs_inode_item *ii)
{
	int ret;

	if (!fs->w || ino.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID)
		return 0;
	ret = inode_read(fs, ino, ii);
	if (ret)
		return ret;
	return atime_due(ii, policy);
}

int ns_atime_due(struct butter_fs *fs, butter_ino_t ino, unsigned policy)
{
	struct btrfs_inode_item ii;

	return check_due(fs, ino, policy, &ii);
}

/* Phase 2: the atime to now; the sequence stays (rule 2). */
static void set_atime_now(struct btrfs_inode_item *ii, void *arg)
{
	(void)arg;
	fs_now_ts(&ii->atime);
}

int ns_touch_atime(struct butter_fs *fs, butter_ino_t ino, unsigned policy)
{
	struct btrfs_inode_item ii;
	struct fs_write_state *w;
	struct subvol *sv;
	int ret, err = 0;

	if (!fs->w)
		return 0;
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret == -EROFS ? 0 : ret;
	ret = check_due(fs, ino, policy, &ii);
	if (ret <= 0)
		return fs_end_change(w, ret, 0);
	sv = fs_subvol_mut(fs, ino.subvol, &err);
	if (!sv)
		return fs_end_change(w, err == -EROFS ? 0 : err, 0);
	ret = inode_modify_keep_sequence(fs, sv, ino.ino, set_atime_now, NULL);
	return fs_end_change(w, ret ? ret : 1, 1);
}
