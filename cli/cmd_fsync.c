/*
 * cmd_fsync.c — `butter fsync [--data] FILE...`: make files durable, many at
 * once. Files inside a live `butter mount` go to its daemon in batches of up
 * to BUTTER_IOC_FSYNC_MAX per mount, each batch one BUTTER_IOC_FSYNC ioctl:
 * one tree log sync (one flush sequence) for the whole batch. Before the
 * ioctl each file's dirty pages in the kernel reach the daemon
 * (sync_file_range), as fsync(2) would send them. Any other file gets
 * fsync(2) (fdatasync(2) with --data), one by one.
 *
 * Exit status 0 if every file was made durable; 1 (each failure reported) if
 * not; 2 for usage errors.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <butter/control.h>

#include "cli.h"

struct fsync_file {
	const char *path;
	int fd;
	int on_butter;              /* inside a butter mount: goes in a batch */
	dev_t dev;                  /* the mount (files of one batch share it) */
	struct butter_ioc_info info;
};

/* Send the batch of butter files @v[0..n) (same mount) in one ioctl. */
static int send_batch(struct fsync_file **v, size_t n, unsigned flags)
{
	struct butter_ioc_fsync *req = calloc(1, sizeof(*req));
	size_t i;
	int ret = 0;

	if (!req) {
		cli_error("%s", strerror(ENOMEM));
		return -1;
	}
	for (i = 0; i < n; i++) {
		/* the kernel's dirty pages (writeback cache) must reach the daemon first */
		if (sync_file_range(v[i]->fd, 0, 0,
				    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
					    SYNC_FILE_RANGE_WAIT_AFTER) < 0 &&
		    errno != EINVAL && errno != ESPIPE) {
			cli_error("%s: %s", v[i]->path, strerror(errno));
			ret = -1;
		}
		req->inos[i].subvol = v[i]->info.subvol;
		req->inos[i].ino = v[i]->info.ino;
	}
	req->count = (uint32_t)n;
	req->flags = flags;
	if (ioctl(v[0]->fd, BUTTER_IOC_FSYNC, req) < 0) {
		int err = errno;

		for (i = 0; i < n; i++)
			cli_error("%s: %s", v[i]->path, strerror(err));
		ret = -1;
	}
	free(req);
	return ret;
}

int cmd_fsync(const struct cli_command *cmd, int argc, char **argv)
{
	enum { OPT_DATA = CLI_OPT_FIRST_FREE };
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "data", no_argument, NULL, OPT_DATA },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct fsync_file *files = NULL, **batch = NULL;
	int c, datasync = 0, status = CLI_EXIT_OK;
	size_t i, j, n;

	while ((c = cli_getopt(&args, argc, argv, ":hd", longopts)) != -1)
		if (c == OPT_DATA || c == 'd')
			datasync = 1;
	free(args.devices);
	if (args.ndevices)
		return cli_usage_error(cmd, "--device does not apply: name files");
	if (argc - optind < 1)
		return cli_usage_error(cmd, "missing FILE");
	n = (size_t)(argc - optind);
	files = calloc(n, sizeof(*files));
	batch = calloc(BUTTER_IOC_FSYNC_MAX, sizeof(*batch));
	if (!files || !batch) {
		cli_error("%s", strerror(ENOMEM));
		free(files);
		free(batch);
		return CLI_EXIT_ERROR;
	}
	for (i = 0; i < n; i++) {
		struct fsync_file *f = &files[i];
		struct stat st;

		f->path = argv[optind + (int)i];
		f->fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
		if (f->fd < 0 && errno == EACCES) /* a file one may write but not read */
			f->fd = open(f->path, O_WRONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
		if (f->fd < 0) {
			cli_error("%s: %s", f->path, strerror(errno));
			status = CLI_EXIT_ERROR;
			continue;
		}
		if (fstat(f->fd, &st) == 0)
			f->dev = st.st_dev;
		f->on_butter = ioctl(f->fd, BUTTER_IOC_INFO, &f->info) == 0;
		if (!f->on_butter &&
		    (datasync ? fdatasync(f->fd) : fsync(f->fd)) < 0) {
			cli_error("%s: %s", f->path, strerror(errno));
			status = CLI_EXIT_ERROR;
		}
	}
	/* butter files: batches per mount, in the order given */
	for (i = 0; i < n; i++) {
		size_t nb = 0;

		if (files[i].fd < 0 || !files[i].on_butter)
			continue;
		for (j = i; j < n && nb < BUTTER_IOC_FSYNC_MAX; j++) {
			if (files[j].fd < 0 || !files[j].on_butter || files[j].dev != files[i].dev)
				continue;
			batch[nb++] = &files[j];
			files[j].on_butter = 0; /* sent */
		}
		if (send_batch(batch, nb, datasync ? BUTTER_FSYNC_DATA : 0) < 0)
			status = CLI_EXIT_ERROR;
	}
	for (i = 0; i < n; i++)
		if (files[i].fd >= 0)
			close(files[i].fd);
	free(files);
	free(batch);
	return status;
}
