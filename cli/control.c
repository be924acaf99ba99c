/*
 * control.c — the `butter` commands on a live mount: subvolume create,
 * snapshot, delete and list, and filesystem df/show/sync/label on paths
 * inside a `butter mount`, through the ioctls of <butter/control.h>.
 *
 * A path that is not inside a butter mount is reported as such (the ioctl
 * answers ENOTTY there), never guessed at.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <linux/btrfs.h>

#include <butter/control.h>

#include "cli.h"

int ctl_open(const char *path, struct butter_ioc_info *info)
{
	struct butter_ioc_info local;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0 && errno == ELOOP)
		fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		cli_error("%s: %s", path, strerror(errno));
		return -1;
	}
	if (ioctl(fd, BUTTER_IOC_INFO, info ? info : &local) < 0) {
		cli_error("%s: %s", path,
			  errno == ENOTTY || errno == EINVAL || errno == ENOSYS
				  ? "not inside a butter mount (give the image file instead)"
				  : strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

/* Split @path into its parent directory (opened) and last name. fd or -1. */
static int open_parent(const char *path, char **copy, const char **name)
{
	char *c, *slash;
	int fd;

	if (cli_split_subvol_path(path, copy, name, &slash))
		return -1;
	c = *copy;
	if (strlen(*name) > BUTTER_IOC_NAME_MAX) {
		cli_error("%s: %s", path, strerror(ENAMETOOLONG));
		return -1;
	}
	if (slash == c) {
		fd = ctl_open("/", NULL);
	} else if (slash) {
		*slash = '\0';
		fd = ctl_open(c, NULL);
	} else {
		fd = ctl_open(".", NULL);
	}
	return fd;
}

int ctl_subvol(const char *what, const char *src, const char *path, bool readonly)
{
	struct butter_ioc_subvol req;
	const char *name;
	char *copy = NULL;
	unsigned long cmd;
	int fd, ret = -1;

	memset(&req, 0, sizeof(req));
	if (src) {
		struct butter_ioc_info info;
		int sfd = ctl_open(src, &info);

		if (sfd < 0)
			return CLI_EXIT_ERROR;
		close(sfd);
		if (info.ino != BUTTER_SUBVOL_ROOT_INO) {
			cli_error("%s: not a subvolume", src);
			return CLI_EXIT_ERROR;
		}
		req.src_subvol = info.subvol;
		req.flags = readonly ? BUTTER_SNAPSHOT_RDONLY : 0;
	}
	fd = open_parent(path, &copy, &name);
	if (fd >= 0) {
		strcpy(req.name, name);
		cmd = src ? BUTTER_IOC_SNAPSHOT
		      : !strcmp(what, "delete") ? BUTTER_IOC_SUBVOL_DELETE : BUTTER_IOC_SUBVOL_CREATE;
		ret = ioctl(fd, cmd, &req);
		if (ret < 0)
			cli_error("%s: %s", path,
				  errno == EINVAL && cmd == BUTTER_IOC_SUBVOL_DELETE ? "not a subvolume"
										     : strerror(errno));
		close(fd);
	}
	free(copy);
	if (ret < 0)
		return CLI_EXIT_ERROR;
	if (src)
		printf("Create %ssnapshot of '%s' in '%s' (id %" PRIu64 ")\n",
		       readonly ? "a readonly " : "", src, path, req.id);
	else if (!strcmp(what, "delete"))
		printf("Delete subvolume '%s'\n", path);
	else
		printf("Create subvolume '%s' (id %" PRIu64 ")\n", path, req.id);
	return cli_finish_stdout(CLI_EXIT_OK);
}

int ctl_subvol_list(const char *path, int (*print)(void *arg, const struct butter_subvol_info *si),
		    void *arg)
{
	struct butter_ioc_subvol_next *n = malloc(sizeof(*n));
	struct butter_subvol_info *si = malloc(sizeof(*si));
	struct butter_ioc_subvol_get *g = malloc(sizeof(*g));
	int fd = n && si && g ? ctl_open(path, NULL) : -1, status = CLI_EXIT_OK;
	uint64_t next = 256;

	if (fd < 0) {
		free(n);
		free(si);
		free(g);
		return CLI_EXIT_ERROR;
	}
	for (;;) {
		memset(n, 0, sizeof(*n));
		n->id = next;
		if (ioctl(fd, BUTTER_IOC_SUBVOL_NEXT, n) < 0) {
			if (errno != ENOENT) {
				cli_error("%s: listing subvolumes: %s", path, strerror(errno));
				status = CLI_EXIT_ERROR;
			}
			break;
		}
		memset(g, 0, sizeof(*g));
		g->id = n->id;
		if (ioctl(fd, BUTTER_IOC_SUBVOL_GET, g) == 0) {
			*si = g->info; /* all the library says (times too) */
		} else {
			memset(si, 0, sizeof(*si));
			si->id = n->id;
			si->parent_id = n->parent;
			si->generation = n->generation;
			si->otransid = n->otransid;
			si->flags = n->flags;
			memcpy(si->uuid, n->uuid, 16);
			memcpy(si->parent_uuid, n->parent_uuid, 16);
			memcpy(si->received_uuid, n->received_uuid, 16);
			snprintf(si->path, sizeof(si->path), "%s", n->path);
		}
		print(arg, si);
		next = n->id + 1;
	}
	close(fd);
	free(n);
	free(si);
	free(g);
	return cli_finish_stdout(status);
}

int ctl_filesystem(const char *what, const char *path, const char *label,
		   const struct cli_units *units)
{
	struct butter_ioc_fs_info fi;
	int fd = ctl_open(path, NULL), ret = 0;

	if (fd < 0)
		return CLI_EXIT_ERROR;
	if (!strcmp(what, "sync")) {
		ret = ioctl(fd, BUTTER_IOC_SYNC);
	} else if (!strcmp(what, "label") && label) {
		struct butter_ioc_label l;

		memset(&l, 0, sizeof(l));
		if (strlen(label) > BUTTER_IOC_LABEL_MAX) {
			errno = EINVAL;
			ret = -1;
		} else {
			strcpy(l.label, label);
			ret = ioctl(fd, BUTTER_IOC_SET_LABEL, &l);
		}
	} else {
		ret = ioctl(fd, BUTTER_IOC_FS_INFO, &fi);
		if (ret == 0 && !strcmp(what, "label")) {
			printf("%s\n", fi.label);
		} else if (ret == 0 && !strcmp(what, "show")) {
			char u[37];

			printf("Label: %s  uuid: %s\n", fi.label[0] ? fi.label : "none",
			       cli_uuid(u, fi.fsid));
			printf("\tTotal devices %" PRIu64 " FS bytes used %" PRIu64 "\n",
			       fi.num_devices, fi.bytes_used);
		} else if (ret == 0) {
			int count = 0;

			if (cli_json)
				cli_json_begin("filesystem-df");
			for (uint64_t i = 0;; i++) {
				struct butter_ioc_space sp = { .idx = i };

				if (ioctl(fd, BUTTER_IOC_SPACE, &sp) < 0) {
					if (errno != ENOENT)
						ret = -1;
					break;
				}
				cli_print_space("", sp.flags, sp.total, sp.used, units, &count);
			}
			if (cli_json)
				cli_json_end(count > 0);
		}
	}
	if (ret < 0)
		cli_error("%s: %s", path, strerror(errno));
	close(fd);
	return cli_finish_stdout(ret < 0 ? CLI_EXIT_ERROR : CLI_EXIT_OK);
}

int ctl_fs_info(const char *path, struct butter_ioc_fs_info *fi)
{
	int fd = ctl_open(path, NULL), ret;

	if (fd < 0)
		return -1;
	ret = ioctl(fd, BUTTER_IOC_FS_INFO, fi);
	if (ret < 0)
		cli_error("%s: %s", path, strerror(errno));
	close(fd);
	return ret < 0 ? -1 : 0;
}

int ctl_scrub(const char *path, uint32_t cmd, uint32_t flags, uint64_t limit,
	      struct butter_ioc_scrub *io)
{
	int fd = ctl_open(path, NULL), ret = 0;

	if (fd < 0)
		return -EBADF;
	memset(io, 0, sizeof(*io));
	io->cmd = cmd;
	io->flags = flags;
	io->limit = limit;
	if (ioctl(fd, BUTTER_IOC_SCRUB, io) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

/* Messages of a read-only open beside the daemon: errors only (that it reads the last commit is the point). */
static void errors_only(void *arg, int level, const char *msg)
{
	(void)arg;
	if (level == BUTTER_LOG_ERROR)
		fprintf(stderr, "butter: %s\n", msg);
}

int ctl_open_committed(const char *path, struct butter_fs **fs)
{
	struct btrfs_ioctl_fs_info_args fi;
	struct butter_open_opts opts = { .flags = BUTTER_OPEN_RDONLY | BUTTER_OPEN_DEGRADED,
					 .log = errors_only };
	char (*paths)[BTRFS_DEVICE_PATH_NAME_MAX + 1] = NULL;
	const char **devices = NULL;
	size_t n = 0;
	int fd = ctl_open(path, NULL), ret = -1;

	if (fd < 0)
		return -1;
	if (syncfs(fd) < 0 || ioctl(fd, BUTTER_IOC_SYNC) < 0) {
		cli_error("%s: the mount did not commit: %s", path, strerror(errno));
		goto out;
	}
	if (ioctl(fd, BTRFS_IOC_FS_INFO, &fi) < 0) {
		cli_error("%s: %s", path, strerror(errno));
		goto out;
	}
	paths = calloc(fi.num_devices ? fi.num_devices : 1, sizeof(*paths));
	devices = calloc(fi.num_devices ? fi.num_devices : 1, sizeof(*devices));
	if (!paths || !devices) {
		cli_error("out of memory");
		goto out;
	}
	for (uint64_t id = 1; id <= fi.max_id && n < fi.num_devices; id++) {
		struct btrfs_ioctl_dev_info_args di = { .devid = id };

		if (ioctl(fd, BTRFS_IOC_DEV_INFO, &di) < 0 || !di.path[0])
			continue; /* no such device, or missing: a degraded open does without */
		memcpy(paths[n], di.path, sizeof(di.path));
		paths[n][BTRFS_DEVICE_PATH_NAME_MAX] = '\0';
		devices[n] = paths[n];
		n++;
	}
	if (n == 0) {
		cli_error("%s: the mount names no device", path);
		goto out;
	}
	opts.devices = devices + 1;
	opts.ndevices = n - 1;
	ret = butter_open(devices[0], &opts, fs);
	if (ret < 0)
		cli_error("%s: %s", devices[0], cli_open_error(-ret));
	ret = ret < 0 ? -1 : 0;
out:
	free(devices);
	free(paths);
	close(fd);
	return ret;
}
