/*
 * cmd_property.c — `butter property get|set|list` on a path inside an image
 * (IMAGE PATH ...) or inside a live mount (PATH ...: ioctls and xattrs),
 * with btrfs-progs' names and output ("name=value" lines):
 *
 *   ro           a subvolume's read-only flag (PATH is its root directory)
 *   label        the filesystem's label (PATH is the top level's root, "/")
 *   compression  an inode's btrfs.compression property (zlib, lzo, zstd[:N],
 *                no, none; empty removes it), which also sets chattr's c or m
 *
 * Which of them PATH has follows what it is, as for progs' object types:
 * every inode has compression, a subvolume root ro, the top level's root
 * also label. get without NAME prints all of them (compression only when
 * set), in progs' order: ro, label, compression.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <butter/control.h>

#include "cli.h"
#include "copyin.h"

#define ROOT_SUBVOL_RDONLY 0x1ull /* BTRFS_ROOT_SUBVOL_RDONLY */

static const struct {
	const char *name, *help;
} props[] = {
	{ "ro", "read-only status of a subvolume" },
	{ "label", "label of the filesystem" },
	{ "compression", "compression algorithm for the file or directory" },
};
#define NPROPS (sizeof(props) / sizeof(props[0]))

/* Does the object at @ino have property @k (an index into props)? */
static bool has_prop(butter_ino_t ino, size_t k)
{
	if (k == 0)
		return ino.ino == BUTTER_SUBVOL_ROOT_INO;
	if (k == 1)
		return ino.ino == BUTTER_SUBVOL_ROOT_INO && ino.subvol == 5;
	return true;
}

static int prop_index(const char *name)
{
	for (size_t k = 0; k < NPROPS; k++)
		if (!strcmp(props[k].name, name))
			return (int)k;
	return -1;
}

/* Print property @k of @ino as "name=value"; 0, or a negative errno. */
static int print_prop(struct butter_fs *fs, butter_ino_t ino, size_t k)
{
	if (k == 0) {
		struct butter_subvol_info si;
		int ret = butter_subvol_get(fs, ino.subvol, &si);

		if (ret == 0)
			printf("ro=%s\n", (si.flags & ROOT_SUBVOL_RDONLY) ? "true" : "false");
		return ret;
	}
	if (k == 1) {
		struct butter_info bi;
		int ret = butter_get_info(fs, &bi);

		if (ret == 0)
			printf("label=%s\n", bi.label);
		return ret;
	}
	{
		char value[256];
		ssize_t n = butter_getxattr(fs, ino, "btrfs.compression", value, sizeof(value) - 1);

		if (n == -ENODATA)
			return 0; /* unset: not shown (asked by name or not, as progs) */
		if (n < 0)
			return (int)n;
		value[n] = '\0';
		printf("compression=%s\n", value);
		return 0;
	}
}

/* Is @path inside a live `butter mount`? Its subvolume and inode in @info (quietly: no message). */
static bool in_mount(const char *path, struct butter_ioc_info *info)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	bool yes;

	if (fd < 0)
		return false;
	yes = ioctl(fd, BUTTER_IOC_INFO, info) == 0;
	close(fd);
	return yes;
}

/* The mount form: `property get|set|list PATH [NAME [VALUE]]`, through ioctls and xattrs. */
static int mount_property(const char *what, const char *path, const char *name, const char *value,
			  const struct butter_ioc_info *info)
{
	butter_ino_t ino = { info->subvol, info->ino };
	int idx = name ? prop_index(name) : -1, ret = 0, fd;

	if (name && idx < 0) {
		cli_error("%s: unknown property (ro, label, compression)", name);
		return CLI_EXIT_USAGE;
	}
	if (idx >= 0 && !has_prop(ino, (size_t)idx)) {
		cli_error("%s: property %s is %s's only", path, name,
			  idx == 0 ? "a subvolume root" : "the top level's root (/)");
		return CLI_EXIT_ERROR;
	}
	if (!strcmp(what, "list")) {
		for (size_t k = 0; k < NPROPS; k++)
			if (has_prop(ino, k))
				printf("%-20s%s\n", props[k].name, props[k].help);
		return cli_finish_stdout(CLI_EXIT_OK);
	}
	if ((fd = ctl_open(path, NULL)) < 0)
		return CLI_EXIT_ERROR;
	if (!strcmp(what, "set")) {
		if (idx == 0) {
			struct butter_ioc_subvol_set set = { 0, BUTTER_SUBVOL_SET_READONLY, 0 };

			set.value = !strcmp(value, "true");
			if (!set.value && strcmp(value, "false")) {
				cli_error("ro: value must be true or false, not '%s'", value);
				close(fd);
				return CLI_EXIT_ERROR;
			}
			/* the kernel's cached writes reach the daemon first: after, they could not */
			if (set.value && syncfs(fd) < 0)
				ret = -errno;
			if (ret == 0)
				ret = ioctl(fd, BUTTER_IOC_SUBVOL_SET, &set) < 0 ? -errno : 0;
		} else if (idx == 1) {
			struct butter_ioc_label l;

			memset(&l, 0, sizeof(l));
			ret = strlen(value) > BUTTER_IOC_LABEL_MAX ? -EINVAL : 0;
			if (ret == 0) {
				strcpy(l.label, value);
				ret = ioctl(fd, BUTTER_IOC_SET_LABEL, &l) < 0 ? -errno : 0;
			}
		} else {
			ret = *value ? setxattr(path, "btrfs.compression", value, strlen(value), 0)
				     : removexattr(path, "btrfs.compression");
			ret = ret < 0 && !(errno == ENODATA && !*value) ? -errno : 0;
		}
		close(fd);
		if (ret < 0) {
			cli_error("%s: setting %s: %s", path, name,
				  ret == -EINVAL ? "invalid value"
				  : ret == -EBUSY ? "a received subvolume stays read-only" : strerror(-ret));
			return CLI_EXIT_ERROR;
		}
		return CLI_EXIT_OK;
	}
	for (size_t k = 0; k < NPROPS && ret == 0; k++) {
		if ((idx >= 0 && (size_t)idx != k) || !has_prop(ino, k))
			continue;
		if (k == 0) {
			struct butter_ioc_subvol_get *g = calloc(1, sizeof(*g));

			ret = g && ioctl(fd, BUTTER_IOC_SUBVOL_GET, g) == 0 ? 0 : -errno;
			if (ret == 0)
				printf("ro=%s\n", (g->info.flags & ROOT_SUBVOL_RDONLY) ? "true" : "false");
			free(g);
		} else if (k == 1) {
			struct butter_ioc_fs_info fi;

			ret = ioctl(fd, BUTTER_IOC_FS_INFO, &fi) == 0 ? 0 : -errno;
			if (ret == 0)
				printf("label=%s\n", fi.label);
		} else {
			char v[256];
			ssize_t n = getxattr(path, "btrfs.compression", v, sizeof(v) - 1);

			if (n >= 0) {
				v[n] = '\0';
				printf("compression=%s\n", v);
			} else if (errno != ENODATA) {
				ret = -errno;
			}
		}
		if (ret < 0)
			cli_error("%s: %s: %s", path, props[k].name, strerror(-ret));
	}
	close(fd);
	return ret < 0 ? CLI_EXIT_ERROR : cli_finish_stdout(CLI_EXIT_OK);
}

int cmd_property(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ 0 },
	};
	const char *what = strchr(cmd->name, ' ') + 1;
	bool set = !strcmp(what, "set"), list = !strcmp(what, "list");
	struct cli_args args = { .cmd = cmd };
	struct butter_fs *fs = NULL;
	const char *image, *path, *name = NULL, *value = NULL;
	int nargs, idx = -1, ret, status = CLI_EXIT_ERROR;
	butter_ino_t ino;

	while (cli_getopt(&args, argc, argv, ":h", longopts) != -1)
		;
	nargs = argc - optind;
	{
		struct butter_ioc_info info;

		/* PATH inside a live mount, no IMAGE: PATH [NAME [VALUE]] */
		if (nargs >= 1 && args.ndevices == 0 && (set ? nargs == 3 : nargs <= (list ? 1 : 2)) &&
		    in_mount(argv[optind], &info)) {
			free(args.devices);
			return mount_property(what, argv[optind], nargs >= 2 ? argv[optind + 1] : NULL,
					      set ? argv[optind + 2] : NULL, &info);
		}
	}
	if (set ? nargs != 4 : (nargs < 2 || nargs > (list ? 2 : 3))) {
		free(args.devices);
		return cli_usage_error(cmd, set ? "IMAGE PATH NAME VALUE needed"
					       : nargs < 2 ? "IMAGE and PATH needed" : "too many arguments");
	}
	image = argv[optind];
	path = argv[optind + 1];
	if (nargs >= 3)
		name = argv[optind + 2];
	if (set)
		value = argv[optind + 3];
	if (name && (idx = prop_index(name)) < 0) {
		free(args.devices);
		cli_error("%s: unknown property (ro, label, compression)", name);
		return CLI_EXIT_USAGE;
	}
	if ((set ? copyin_open_rw(image, args.devices, args.ndevices, &fs)
		 : cli_open(&args, image, &fs)) < 0)
		goto out;
	ret = butter_resolve(fs, path, &ino);
	if (ret < 0) {
		cli_error("%s: %s", path, strerror(-ret));
		goto out;
	}
	if (idx >= 0 && !has_prop(ino, (size_t)idx)) {
		cli_error("%s: property %s is %s's only", path, name,
			  idx == 0 ? "a subvolume root" : "the top level's root (/)");
		goto out;
	}
	if (list) {
		for (size_t k = 0; k < NPROPS; k++)
			if (has_prop(ino, k))
				printf("%-20s%s\n", props[k].name, props[k].help);
		status = CLI_EXIT_OK;
	} else if (!set) {
		for (size_t k = 0; k < NPROPS; k++) {
			if ((idx >= 0 && (size_t)idx != k) || !has_prop(ino, k))
				continue;
			ret = print_prop(fs, ino, k);
			if (ret < 0) {
				cli_error("%s: %s: %s", path, props[k].name, strerror(-ret));
				goto out;
			}
		}
		status = CLI_EXIT_OK;
	} else {
		if (idx == 0) {
			bool ro = !strcmp(value, "true");

			if (!ro && strcmp(value, "false")) {
				cli_error("ro: value must be true or false, not '%s'", value);
				goto out;
			}
			ret = butter_subvol_set_readonly(fs, ino.subvol, ro);
			if (ret == -EBUSY) {
				cli_error("%s: a received subvolume stays read-only (its received uuid "
					  "is what an incremental send relies on): snapshot it instead", path);
				goto out;
			}
		} else if (idx == 1) {
			ret = butter_set_label(fs, value);
		} else {
			ret = butter_setxattr(fs, ino, "btrfs.compression", value, strlen(value));
			if (ret == -ENODATA && !*value)
				ret = 0; /* removing what is not there */
		}
		if (ret == 0)
			ret = butter_sync(fs);
		if (ret < 0) {
			cli_error("%s: setting %s: %s", path, name,
				  ret == -EINVAL ? "invalid value" : strerror(-ret));
			goto out;
		}
		status = CLI_EXIT_OK;
	}
out:
	if (fs)
		butter_close(fs);
	free(args.devices);
	return status == CLI_EXIT_OK && !set ? cli_finish_stdout(status) : status;
}
