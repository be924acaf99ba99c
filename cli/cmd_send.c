/*
 * cmd_send.c — send streams: `butter send` writes a read-only subvolume of
 * an image as a btrfs send stream (butter_send()) to a file or standard
 * output, for `btrfs receive`; `butter receive` applies a stream (from
 * `btrfs send` or `butter send`) to an image (butter_receive()), or to a
 * directory of a live `butter mount`: there the daemon receives
 * (BUTTER_IOC_RECEIVE) from a pipe this command fills from its input.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
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

	if (!file && cli_json) {
		free(args.devices);
		cli_error("--format json needs -f FILE: the stream goes to standard output");
		return CLI_EXIT_USAGE;
	}
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
	if (status == CLI_EXIT_OK && cli_json) { /* the summary (layout in README) */
		cli_jw_open(NULL, '{');
		cli_jw_open("send", '{');
		cli_jw_str("subvolume", path);
		cli_jw_u64("subvol", ino.subvol);
		cli_jw_str("parent", parent ? parent : "");
		cli_jw_u64("parent_subvol", parent ? pino.subvol : 0);
		cli_jw_str("file", file);
		cli_jw_u64("bytes", o.bytes);
		cli_jw_close();
		cli_jw_close();
		status = cli_finish_stdout(status);
	}
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

static void print_line(void *arg, const char *line)
{
	(void)arg;
	puts(line);
}

static void log_to_stderr(void *arg, int level, const char *msg)
{
	(void)arg;
	(void)level;
	fprintf(stderr, "butter: %s\n", msg);
}

/* `receive --dump`: the stream's commands as progs prints them; exit status. */
static int receive_dump(const char *file)
{
	struct in in = { .fd = STDIN_FILENO };
	int ret;

	if (file && (in.fd = open(file, O_RDONLY | O_CLOEXEC)) < 0) {
		cli_error("%s: %s", file, strerror(errno));
		return CLI_EXIT_ERROR;
	}
	if (!file && isatty(STDIN_FILENO)) {
		cli_error("no send stream on a terminal (redirect one, or use -f FILE)");
		return CLI_EXIT_ERROR;
	}
	cli_progress_begin(&in.progress, "dump", 0, true);
	ret = butter_receive_dump(read_some, &in, print_line, NULL, log_to_stderr, NULL);
	if (file)
		close(in.fd);
	if (ret < 0) {
		cli_error("%s: %s", file ? file : "standard input",
			  ret == -EBADMSG ? "the send stream is damaged (see above)" : strerror(-ret));
		return CLI_EXIT_ERROR;
	}
	return cli_finish_stdout(CLI_EXIT_OK);
}

/* What a receive made: a line, or with --format json the summary (layout in README). */
static void print_received(const char *dir, uint64_t subvolumes, uint64_t last_subvol,
			   uint64_t bytes)
{
	if (!cli_json) {
		printf("received %llu subvolume(s) into %s\n", (unsigned long long)subvolumes, dir);
		return;
	}
	cli_jw_open(NULL, '{');
	cli_jw_open("receive", '{');
	cli_jw_str("into", dir);
	cli_jw_u64("subvolumes", subvolumes);
	cli_jw_u64("last_subvol", last_subvol);
	cli_jw_u64("bytes", bytes);
	cli_jw_close();
	cli_jw_close();
}

/* The input, copied into the daemon's pipe by a thread (the progress line is drawn there). */
struct feeder {
	struct in *in;
	int pipe_w;
	int error; /* a read error of the input (the daemon then sees a cut stream) */
};

static void *feed(void *arg)
{
	struct feeder *f = arg;
	char buf[64 * 1024];

	for (;;) {
		ssize_t n = read_some(f->in, buf, sizeof(buf)), off = 0;

		if (n <= 0) {
			f->error = (int)n;
			break;
		}
		while (off < n) {
			ssize_t w = write(f->pipe_w, buf + off, (size_t)(n - off));

			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0)
				goto out; /* EPIPE: the daemon stopped reading (its answer says why) */
			off += w;
		}
	}
out:
	close(f->pipe_w); /* the end of the stream, for the daemon */
	return NULL;
}

/* Receive into DIR of a live mount: the daemon reads our pipe. Exit status. */
static int receive_into_mount(const char *dir, struct in *in, unsigned flags)
{
	struct butter_ioc_receive io;
	struct feeder f = { in, -1, 0 };
	pthread_t thread;
	int p[2], fd, ret;

	fd = ctl_open(dir, NULL);
	if (fd < 0)
		return CLI_EXIT_ERROR;
	if (pipe2(p, O_CLOEXEC) != 0) {
		cli_error("pipe: %s", strerror(errno));
		close(fd);
		return CLI_EXIT_ERROR;
	}
	signal(SIGPIPE, SIG_IGN); /* a write to a pipe the daemon closed is EPIPE */
	memset(&io, 0, sizeof(io));
	io.cmd = BUTTER_RECEIVE_CMD_START;
	io.fd = p[0];
	io.flags = flags;
	ret = ioctl(fd, BUTTER_IOC_RECEIVE, &io) < 0 ? -errno : 0;
	close(p[0]); /* the daemon has its own now */
	if (ret == 0) {
		f.pipe_w = p[1];
		ret = -pthread_create(&thread, NULL, feed, &f);
		if (ret)
			close(p[1]); /* the daemon sees an empty stream and ends */
	} else {
		close(p[1]);
	}
	if (ret) {
		cli_error("%s: %s", dir,
			  ret == -EPERM	       ? "receiving into a mount needs root (as btrfs receive)"
			  : ret == -EINPROGRESS ? "a receive runs on this mount already"
			  : ret == -ENOTDIR     ? "not a directory"
			  : ret == -EBADF       ? "the daemon cannot read this process's pipe "
						"(another pid namespace?)"
						: strerror(-ret));
		close(fd);
		return CLI_EXIT_ERROR;
	}
	/* follow the daemon's receive; it ends when the stream does */
	for (;;) {
		struct butter_ioc_receive st;

		memset(&st, 0, sizeof(st));
		st.cmd = BUTTER_RECEIVE_CMD_STATUS;
		st.id = io.id;
		if (ioctl(fd, BUTTER_IOC_RECEIVE, &st) < 0) {
			ret = -errno;
			break;
		}
		if (st.state == BUTTER_RECEIVE_STATE_DONE) {
			io = st;
			break;
		}
		usleep(50 * 1000);
	}
	pthread_join(thread, NULL);
	cli_progress_end(&in->progress);
	close(fd);
	if (ret == -ESRCH)
		cli_error("%s: the receive ended, and a later one took its place before its result "
			  "was read: the mount's log says how it went", dir);
	else if (ret)
		cli_error("%s: receive status: %s", dir, strerror(-ret));
	else if (f.error)
		cli_error("reading the stream: %s", strerror(-f.error));
	else if (io.error == -EBADMSG)
		cli_error("%s: the send stream is damaged (the mount's log says where)", dir);
	else if (io.error)
		cli_error("%s: receiving: %s (the mount's log says more)", dir, strerror(-io.error));
	if (ret || f.error || io.error)
		return CLI_EXIT_ERROR;
	print_received(dir, io.subvolumes, io.last_subvol, in->bytes);
	return cli_finish_stdout(CLI_EXIT_OK);
}

int cmd_receive(const struct cli_command *cmd, int argc, char **argv)
{
	enum { OPT_DUMP = 0x200 };
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "quiet", no_argument, NULL, 'q' },
		{ "dump", no_argument, NULL, OPT_DUMP },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_receive_result res = { 0 };
	struct in in = { .fd = STDIN_FILENO };
	const char *file = NULL, *dir = "/";
	struct butter_fs *fs;
	butter_ino_t dest;
	int c, ret, status = CLI_EXIT_OK;
	bool quiet = false, dump = false;
	unsigned flags = 0;
	struct stat sb;

	while ((c = cli_getopt(&args, argc, argv, ":hf:qe", longopts)) != -1) {
		if (c == 'f')
			file = optarg;
		else if (c == 'q')
			quiet = true;
		else if (c == 'e')
			flags |= BUTTER_RECEIVE_END_STOPS;
		else if (c == OPT_DUMP)
			dump = true;
	}
	if (dump) {
		free(args.devices);
		if (argc - optind != 0)
			return cli_usage_error(cmd, "--dump takes no IMAGE or DIR");
		if (cli_json)
			return cli_json_unsupported();
		return receive_dump(file);
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
	if (argc - optind == 1 && cli_is_mount_path(image, &args)) {
		free(args.devices);
		cli_progress_begin(&in.progress, "receive",
				   fstat(in.fd, &sb) == 0 && S_ISREG(sb.st_mode) ? (uint64_t)sb.st_size : 0,
				   quiet);
		status = receive_into_mount(image, &in, flags);
		if (file)
			close(in.fd);
		return status;
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
		ret = butter_receive_flags(fs, dest, flags, read_some, &in, &res);
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
		print_received(dir, res.subvolumes, res.last_subvol, in.bytes);
	}
	if (file)
		close(in.fd);
	butter_close(fs);
	return cli_finish_stdout(status);
}
