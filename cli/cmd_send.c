/*
 * cmd_send.c — `butter send`: write a read-only subvolume of an image as a
 * btrfs send stream (butter_send()) to a file or standard output, for
 * `btrfs receive` (or `butter receive` when it comes).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

struct out {
	int fd;
	const char *name;
};

static int write_all(void *arg, const void *buf, size_t len)
{
	struct out *o = arg;
	const char *p = buf;

	while (len) {
		ssize_t n = write(o->fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int cmd_send(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct out o = { STDOUT_FILENO, "standard output" };
	const char *file = NULL;
	struct butter_fs *fs;
	butter_ino_t ino;
	int c, ret, status = CLI_EXIT_OK;

	while ((c = cli_getopt(&args, argc, argv, ":hf:", longopts)) != -1) {
		if (c == 'f')
			file = optarg;
	}
	if (argc - optind != 2) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 2 ? "missing IMAGE or PATH"
							     : "too many arguments");
	}
	const char *image = argv[optind], *path = argv[optind + 1];

	if (!file && isatty(STDOUT_FILENO)) {
		free(args.devices);
		cli_error("not writing a send stream to a terminal (redirect it, or use -f FILE)");
		return CLI_EXIT_ERROR;
	}
	ret = cli_open(&args, image, &fs);
	free(args.devices);
	if (ret < 0)
		return CLI_EXIT_ERROR;
	ret = cli_resolve(fs, path, true, &ino);
	if (ret == 0 && ino.ino != BUTTER_SUBVOL_ROOT_INO)
		ret = -ENOTDIR;
	if (ret) {
		cli_error("%s: %s: %s", image, path,
			  ret == -ENOTDIR ? "not a subvolume" : strerror(-ret));
		butter_close(fs);
		return CLI_EXIT_ERROR;
	}
	if (file) {
		o.fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		o.name = file;
		if (o.fd < 0) {
			cli_error("%s: %s", file, strerror(errno));
			butter_close(fs);
			return CLI_EXIT_ERROR;
		}
	}
	ret = butter_send(fs, ino.subvol, write_all, &o);
	if (ret == -EPERM)
		cli_error("%s: %s: not a read-only subvolume (send needs one: make a snapshot "
			  "with -r)", image, path);
	else if (ret < 0)
		cli_error("%s: sending %s to %s: %s", image, path, o.name, strerror(-ret));
	if (ret < 0)
		status = CLI_EXIT_ERROR;
	if (file && close(o.fd) < 0 && status == CLI_EXIT_OK) {
		cli_error("%s: %s", file, strerror(errno));
		status = CLI_EXIT_ERROR;
	}
	butter_close(fs);
	return status;
}
