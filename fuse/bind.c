/*
 * bind.c — a second mount of an image that a live `butter mount` serves.
 *
 * The kernel's btrfs mounts one device at several places as one filesystem
 * (one superblock; each mount may show another subvolume). butter gives the
 * same: when the image is the source of a live fuse.butter mount, the new
 * mount is a bind mount of that one (of the subvolume asked for inside it),
 * so both show the one daemon's filesystem, instead of a refusal (the image
 * is the daemon's alone). Unmounting either leaves the other; the daemon
 * ends with the last (the kernel keeps the FUSE connection while a mount of
 * it stays).
 *
 * Which mount: a line of /proc/self/mountinfo of type fuse.butter whose root
 * is "/" and whose source names the same file as the image (device and inode
 * numbers), or is the same NBD URI (an export has no inode to compare; the
 * URI as typed is what this machine's mounts can be matched by). Which
 * directory in it: the subvolume the options name (subvol=, subvolid=,
 * else the default), found through the mount's control ioctls: the
 * mount's own root if it is that subvolume, or its path below the mount when
 * the mount shows the top level. Bind mounts need root (CAP_SYS_ADMIN), as
 * the kernel's mount does.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <butter/control.h>

#include "daemon.h"

#define TOP_LEVEL 5ULL

/* mountinfo's octal escapes (\040 for a space ...) undone in place. */
static void unescape(char *s)
{
	char *out = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*out++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*out++ = *s;
		}
	}
	*out = '\0';
}

/*
 * The mountpoint of a live fuse.butter mount of the file @img (or, @img
 * NULL, of the NBD URI @uri: the same string) into @mnt: 1, or 0 if none.
 */
static int find_mount(const struct stat *img, const char *uri, char *mnt, size_t size)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL;
	size_t cap = 0;
	int found = 0;

	if (!f)
		return 0;
	while (!found && getline(&line, &cap, f) > 0) {
		char *fields[16], *save = NULL, *tok, *dash = strstr(line, " - ");
		char *type, *source;
		struct stat st;
		int n = 0;

		if (!dash)
			continue;
		*dash = '\0';
		for (tok = strtok_r(line, " ", &save); tok && n < 16; tok = strtok_r(NULL, " ", &save))
			fields[n++] = tok;
		type = strtok_r(dash + 3, " ", &save);
		source = strtok_r(NULL, " ", &save);
		if (n < 5 || !type || !source || strcmp(type, "fuse.butter") || strcmp(fields[3], "/"))
			continue;
		unescape(source);
		unescape(fields[4]);
		if ((img ? stat(source, &st) == 0 && st.st_dev == img->st_dev &&
				   st.st_ino == img->st_ino
			 : strcmp(source, uri) == 0) &&
		    strlen(fields[4]) < size) {
			strcpy(mnt, fields[4]);
			found = 1;
		}
	}
	free(line);
	fclose(f);
	return found;
}

/* The subvolume id the options ask for, or 0 for "the default"; path from subvol=. */
static int wanted_dir(struct daemon *d, int fd, const char *mnt, char *dir, size_t size)
{
	const struct mount_opts *o = d->opts;
	struct butter_ioc_info root;
	struct butter_ioc_subvol_get sv;
	uint64_t want;

	if (ioctl(fd, BUTTER_IOC_INFO, &root) < 0)
		return -errno;
	if (o->subvol) {
		if (root.subvol != TOP_LEVEL)
			return -EXDEV;
		if ((size_t)snprintf(dir, size, "%s/%s", mnt, o->subvol) >= size)
			return -ENAMETOOLONG;
		/* a subvolume's root, and (both given) the one subvolid= names, as pick_root() asks */
		int sub = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		struct butter_ioc_info at;
		int ok = sub >= 0 && ioctl(sub, BUTTER_IOC_INFO, &at) == 0 &&
			 at.ino == BUTTER_SUBVOL_ROOT_INO && (!o->subvolid || at.subvol == o->subvolid);

		if (sub >= 0)
			close(sub);
		return ok ? 0 : -EINVAL;
	}
	memset(&sv, 0, sizeof(sv));
	if (ioctl(fd, BUTTER_IOC_SUBVOL_GET, &sv) < 0)
		return -errno;
	want = o->subvolid ? o->subvolid : sv.default_id;
	if (want == root.subvol)
		return (size_t)snprintf(dir, size, "%s", mnt) >= size ? -ENAMETOOLONG : 0;
	if (root.subvol != TOP_LEVEL)
		return -EXDEV;
	memset(&sv, 0, sizeof(sv));
	sv.id = want;
	if (ioctl(fd, BUTTER_IOC_SUBVOL_GET, &sv) < 0)
		return -errno;
	if ((size_t)snprintf(dir, size, "%s/%s", mnt, sv.info.path) >= size)
		return -ENAMETOOLONG;
	return 0;
}

int bind_if_mounted(struct daemon *d)
{
	const struct mount_opts *o = d->opts;
	struct butter_ioc_daemon_info info;
	char mnt[PATH_MAX], dir[PATH_MAX + 512];
	struct stat img;
	int fd, ret;

	if (butter_device_is_nbd(o->devices[0])) {
		if (!find_mount(NULL, o->devices[0], mnt, sizeof(mnt)))
			return 0;
	} else if (stat(o->devices[0], &img) != 0 || !find_mount(&img, NULL, mnt, sizeof(mnt))) {
		return 0;
	}
	if (geteuid() != 0) {
		daemon_log(d, BUTTER_LOG_ERROR, "%s: mounted at %s already; a second mount of it is a "
						"bind mount of that one, which needs root",
			   o->devices[0], mnt);
		return -EBUSY;
	}
	fd = open(mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return 0; /* gone meanwhile: an ordinary mount (the image's claim decides) */
	memset(&info, 0, sizeof(info));
	ret = ioctl(fd, BUTTER_IOC_DAEMON_INFO, &info) < 0 ? -errno : 0;
	if (ret == 0 && !o->readonly && (info.flags & (BUTTER_DAEMON_READONLY | BUTTER_DAEMON_FAILED)))
		ret = -EROFS;
	if (ret == 0)
		ret = wanted_dir(d, fd, mnt, dir, sizeof(dir));
	close(fd);
	if (ret == 0 && mount(dir, o->mountpoint, NULL, MS_BIND, NULL) != 0)
		ret = -errno;
	if (ret == 0 && o->readonly &&
	    mount(NULL, o->mountpoint, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) != 0) {
		ret = -errno;
		umount2(o->mountpoint, MNT_DETACH);
	}
	if (ret) {
		daemon_log(d, BUTTER_LOG_ERROR, "%s: mounted at %s already, and %s", o->devices[0], mnt,
			   ret == -EROFS  ? "read-only there: remount it read-write first"
			   : ret == -EXDEV ? "that mount shows one subvolume only: mount the "
					     "subvolume asked for from the top level's mount"
					   : strerror(-ret));
		return ret;
	}
	return 1; /* silent, as a mount that worked (findmnt shows it: the same source, a root below) */
}
