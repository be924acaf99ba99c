/*
 * cmd_send.c — send streams: `butter send` writes a read-only subvolume of
 * an image as a btrfs send stream (butter_send()) to a file or standard
 * output, for `btrfs receive`; `butter receive` applies a stream (from
 * `btrfs send` or `butter send`) to an image (butter_receive()).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <butter/control.h>

#include "cli.h"
#include "copyin.h"

struct out {
	int fd;
	const char *name;
	struct cli_progress progress;
	uint64_t bytes;
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
		o->bytes += (uint64_t)n;
	}
	cli_progress_update(&o->progress, o->bytes);
	return 0;
}

/* The subvolume whose root directory is @path inside a live mount; 0 or -1 after a message. */
static int mount_subvol(const char *path, butter_ino_t *out)
{
	struct butter_ioc_info info;
	int fd = ctl_open(path, &info);

	if (fd < 0)
		return -1;
	close(fd);
	if (info.ino != BUTTER_SUBVOL_ROOT_INO) {
		cli_error("%s: not a subvolume", path);
		return -1;
	}
	*out = (butter_ino_t){ info.subvol, info.ino };
	return 0;
}

int cmd_send(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "quiet", no_argument, NULL, 'q' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct out o = { .fd = STDOUT_FILENO, .name = "standard output" };
	const char *file = NULL, *parent = NULL;
	struct butter_fs *fs;
	butter_ino_t ino, pino = { 0, 0 };
	int c, ret, status = CLI_EXIT_OK;
	bool quiet = false;

	while ((c = cli_getopt(&args, argc, argv, ":hf:p:q", longopts)) != -1) {
		if (c == 'f')
			file = optarg;
		else if (c == 'p')
			parent = optarg;
		else if (c == 'q')
			quiet = true;
	}
	struct stat sb;
	bool mounted = argc - optind == 1 && args.ndevices == 0 && stat(argv[optind], &sb) == 0 &&
		       S_ISDIR(sb.st_mode);

	if (!mounted && argc - optind != 2) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 2 ? "missing IMAGE or PATH"
							     : "too many arguments");
	}
	const char *image = argv[optind], *path = mounted ? argv[optind] : argv[optind + 1];

	if (!file && isatty(STDOUT_FILENO)) {
		free(args.devices);
		cli_error("not writing a send stream to a terminal (redirect it, or use -f FILE)");
		return CLI_EXIT_ERROR;
	}
	if (mounted) {
		/* a live mount: its subvolumes by path, the stream from its last commit */
		ret = mount_subvol(path, &ino) || (parent && mount_subvol(parent, &pino)) ||
		      ctl_open_committed(path, &fs) ? -1 : 0;
		free(args.devices);
		if (ret)
			return CLI_EXIT_ERROR;
		image = path;
		goto send;
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
	if (parent) {
		ret = cli_resolve(fs, parent, true, &pino);
		if (ret == 0 && pino.ino != BUTTER_SUBVOL_ROOT_INO)
			ret = -ENOTDIR;
		if (ret) {
			cli_error("%s: parent %s: %s", image, parent,
				  ret == -ENOTDIR ? "not a subvolume" : strerror(-ret));
			butter_close(fs);
			return CLI_EXIT_ERROR;
		}
	}
send:
	if (file) {
		o.fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		o.name = file;
		if (o.fd < 0) {
			cli_error("%s: %s", file, strerror(errno));
			butter_close(fs);
			return CLI_EXIT_ERROR;
		}
	}
	cli_progress_begin(&o.progress, "send", 0, quiet);
	ret = butter_send(fs, ino.subvol, pino.subvol, write_all, &o);
	cli_progress_end(&o.progress);
	if (ret == -EPERM)
		cli_error("%s: %s%s%s: not a read-only subvolume (send needs them: make snapshots "
			  "with -r)", image, path, parent ? " or " : "", parent ? parent : "");
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

struct in {
	int fd;
	struct cli_progress progress;
	uint64_t bytes;
};

static ssize_t read_some(void *arg, void *buf, size_t len)
{
	struct in *i = arg;

	for (;;) {
		ssize_t n = read(i->fd, buf, len);

		if (n >= 0) {
			i->bytes += (uint64_t)n;
			cli_progress_update(&i->progress, i->bytes);
			return n;
		}
		if (errno != EINTR)
			return -errno;
	}
}

int cmd_receive(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "quiet", no_argument, NULL, 'q' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_receive_result res = { 0 };
	struct in in = { .fd = STDIN_FILENO };
	const char *file = NULL, *dir = "/";
	struct butter_fs *fs;
	butter_ino_t dest;
	int c, ret, status = CLI_EXIT_OK;
	bool quiet = false;
	struct stat sb;

	while ((c = cli_getopt(&args, argc, argv, ":hf:q", longopts)) != -1) {
		if (c == 'f')
			file = optarg;
		else if (c == 'q')
			quiet = true;
	}
	if (argc - optind < 1 || argc - optind > 2) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 1 ? "missing IMAGE"
							     : "too many arguments");
	}
	const char *image = argv[optind];

	if (argc - optind == 2)
		dir = argv[optind + 1];
	if (file) {
		in.fd = open(file, O_RDONLY | O_CLOEXEC);
		if (in.fd < 0) {
			cli_error("%s: %s", file, strerror(errno));
			free(args.devices);
			return CLI_EXIT_ERROR;
		}
	} else if (isatty(STDIN_FILENO)) {
		cli_error("no send stream on a terminal (redirect one, or use -f FILE)");
		free(args.devices);
		return CLI_EXIT_ERROR;
	}
	ret = copyin_open_rw(image, args.devices, args.ndevices, &fs);
	free(args.devices);
	if (ret < 0) {
		if (file)
			close(in.fd);
		return CLI_EXIT_ERROR;
	}
	ret = cli_resolve(fs, dir, true, &dest);
	if (ret)
		cli_error("%s: %s: %s", image, dir, strerror(-ret));
	else {
		/* a stream from a regular file has a known length; a pipe has none */
		cli_progress_begin(&in.progress, "receive",
				   fstat(in.fd, &sb) == 0 && S_ISREG(sb.st_mode) ? (uint64_t)sb.st_size : 0,
				   quiet);
		ret = butter_receive(fs, dest, read_some, &in, &res);
		cli_progress_end(&in.progress);
	}
	if (ret == 0)
		ret = butter_sync(fs);
	if (ret < 0) {
		if (ret == -EBADMSG)
			cli_error("%s: the send stream is damaged (see above)", image);
		else
			cli_error("%s: receiving into %s: %s", image, dir, strerror(-ret));
		status = CLI_EXIT_ERROR;
	} else {
		printf("received %llu subvolume(s) into %s\n", (unsigned long long)res.subvolumes,
		       dir);
	}
	if (file)
		close(in.fd);
	butter_close(fs);
	return cli_finish_stdout(status);
}
