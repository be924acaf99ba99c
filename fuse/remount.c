/*
 * remount.c — `butter mount -o remount,ro|rw [IMAGE] MOUNTPOINT`, which is
 * also what `mount -o remount,ro MOUNTPOINT` runs through the mount(8) helper
 * (helper.c): switch a live butter mount between read-only and read-write.
 *
 * Two parties must agree: the kernel's superblock (its read-only flag makes
 * the VFS refuse every change with EROFS, also through files already open,
 * and refuses to go read-only while files are open for writing: EBUSY) and
 * the daemon (BUTTER_IOC_REMOUNT: commit, then refuse changes). The order
 * keeps every write:
 *   read-only   mount(2) MS_REMOUNT|MS_RDONLY first (the kernel writes its
 *               cached pages back to the daemon before the flag is set),
 *               then the ioctl, which commits
 *   read-write  the ioctl first (the daemon may have to open the filesystem
 *               read-write again), then mount(2) without MS_RDONLY
 * The mount's own flags (nosuid, nodev, noexec, atime flags) are kept.
 * mount(2) needs CAP_SYS_ADMIN: users who mounted with fusermount3 unmount
 * and mount again instead.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <butter/control.h>

#include "daemon.h"

/* The MS_* flags of the mount at @fd other than read-only, from statvfs. */
static unsigned long kept_flags(int fd)
{
	static const struct { unsigned long st, ms; } map[] = {
		{ ST_NOSUID, MS_NOSUID }, { ST_NODEV, MS_NODEV }, { ST_NOEXEC, MS_NOEXEC },
		{ ST_SYNCHRONOUS, MS_SYNCHRONOUS }, { ST_MANDLOCK, MS_MANDLOCK },
		{ ST_NOATIME, MS_NOATIME }, { ST_NODIRATIME, MS_NODIRATIME },
		{ ST_RELATIME, MS_RELATIME },
	};
	struct statvfs sv;
	unsigned long flags = 0;

	if (fstatvfs(fd, &sv) < 0)
		return 0;
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (sv.f_flag & map[i].st)
			flags |= map[i].ms;
	return flags;
}

static int kernel_remount(const char *mnt, int fd, bool readonly)
{
	unsigned long flags = MS_REMOUNT | kept_flags(fd) | (readonly ? MS_RDONLY : 0);

	if (mount(NULL, mnt, NULL, flags, NULL) == 0)
		return 0;
	if (errno == EBUSY && readonly)
		fprintf(stderr, "butter: %s: files are open for writing: close them first\n", mnt);
	else if (errno == EPERM)
		fprintf(stderr, "butter: %s: remount needs root (CAP_SYS_ADMIN); unmount and "
			"mount again instead\n", mnt);
	else
		fprintf(stderr, "butter: %s: remount: %s\n", mnt, strerror(errno));
	return -1;
}

static int daemon_switch(const char *mnt, int fd, bool readonly)
{
	struct butter_ioc_remount r = { .version = BUTTER_IOC_VERSION,
					.flags = readonly ? BUTTER_REMOUNT_RDONLY : 0 };

	if (ioctl(fd, BUTTER_IOC_REMOUNT, &r) == 0)
		return 0;
	fprintf(stderr, "butter: %s: the daemon could not switch to %s: %s\n", mnt,
		readonly ? "read-only" : "read-write", strerror(errno));
	return -1;
}

int butter_remount_main(const struct mount_opts *o)
{
	const char *mnt = o->mountpoint;
	struct butter_ioc_daemon_info info = { .version = BUTTER_IOC_VERSION };
	int fd = open(mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC), status = 1;

	if (fd < 0) {
		fprintf(stderr, "butter: %s: %s\n", mnt, strerror(errno));
		return 1;
	}
	if (ioctl(fd, BUTTER_IOC_DAEMON_INFO, &info) < 0) {
		fprintf(stderr, "butter: %s: not a butter mount (%s)\n", mnt, strerror(errno));
		goto out;
	}
	if (o->readonly)
		status = kernel_remount(mnt, fd, true) || daemon_switch(mnt, fd, true) ? 1 : 0;
	else
		status = daemon_switch(mnt, fd, false) || kernel_remount(mnt, fd, false) ? 1 : 0;
out:
	close(fd);
	return status;
}
