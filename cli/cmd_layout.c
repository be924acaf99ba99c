/*
 * cmd_layout.c — `butter layout --trace FILE IMAGE|PATH`: place the data an
 * access trace reads one after another, in the order it reads it
 * (butter_layout()), and say what changed: runs, seek distance, bytes moved.
 *
 * IMAGE is worked on offline; a PATH inside a live `butter mount` (its top,
 * where the trace's paths start) sends the trace to the daemon in pieces of
 * BUTTER_IOC_LAYOUT_MAX ranges, each going on where the previous one ended.
 * Files of a plain list of paths are looked up by path; a recorded trace
 * names them by subvolume and inode, as the recorder saw them.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <butter/control.h>

#include "cli.h"
#include "copyin.h"
#include "trace.h"

static void print_stats(const struct butter_layout_stats *st, size_t unresolved)
{
	char a[32], b[32];

	printf("%" PRIu64 " files traced, %" PRIu64 " gone", st->files, st->missing + unresolved);
	printf("; %" PRIu64 " extents moved (%s)\n", st->extents_moved,
	       cli_size(a, sizeof(a), st->bytes_moved, false));
	printf("runs:          %" PRIu64 " -> %" PRIu64 "\n", st->runs_before, st->runs_after);
	printf("seek distance: %s -> %s\n", cli_size(a, sizeof(a), st->seek_before, false),
	       cli_size(b, sizeof(b), st->seek_after, false));
}

static int run_on_mount(const char *path, struct butter_layout_range *r, size_t n,
			struct butter_layout_stats *st)
{
	struct butter_ioc_layout *req = calloc(1, sizeof(*req));
	size_t done = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECTORY), ret = 0;

	if (!req || fd < 0) {
		ret = req ? -errno : -ENOMEM;
		goto out;
	}
	while (done < n) {
		size_t k = n - done < BUTTER_IOC_LAYOUT_MAX ? n - done : BUTTER_IOC_LAYOUT_MAX;

		req->count = (uint32_t)k;
		req->flags = done ? BUTTER_LAYOUT_CONTINUE : 0;
		memcpy(req->ranges, r + done, k * sizeof(*r));
		req->stats = *st;
		if (ioctl(fd, BUTTER_IOC_LAYOUT, req) < 0) {
			ret = -errno;
			break;
		}
		*st = req->stats;
		done += k;
	}
out:
	if (fd >= 0)
		close(fd);
	free(req);
	return ret;
}

int cmd_layout(const struct cli_command *cmd, int argc, char **argv)
{
	enum { OPT_TRACE = CLI_OPT_FIRST_FREE };
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "trace", required_argument, NULL, OPT_TRACE },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_layout_range *ranges = NULL;
	struct butter_layout_stats st;
	struct butter_fs *fs = NULL;
	const char *trace_path = NULL, *target;
	struct trace t;
	size_t n = 0, unresolved = 0;
	int c, ret, on_mount = 0, top_fd = -1;

	while ((c = cli_getopt(&args, argc, argv, ":h", longopts)) != -1)
		if (c == OPT_TRACE)
			trace_path = optarg;
	if (!trace_path || argc - optind != 1) {
		free(args.devices);
		return cli_usage_error(cmd, !trace_path ? "--trace FILE is required"
				       : argc - optind < 1 ? "missing IMAGE or PATH" : "too many arguments");
	}
	target = argv[optind];
	if (cli_is_mount_path(target, &args)) {
		struct butter_ioc_info info;

		top_fd = open(target, O_RDONLY | O_CLOEXEC | O_DIRECTORY);
		if (top_fd < 0 || ioctl(top_fd, BUTTER_IOC_INFO, &info) < 0) {
			cli_error("%s: not inside a butter mount (give the image file instead)", target);
			if (top_fd >= 0)
				close(top_fd);
			free(args.devices);
			return CLI_EXIT_ERROR;
		}
		on_mount = 1;
	}
	if (trace_load(trace_path, &t) < 0) {
		if (top_fd >= 0)
			close(top_fd);
		free(args.devices);
		return CLI_EXIT_ERROR;
	}
	if (!on_mount && copyin_open_rw(target, args.devices, args.ndevices, &fs) < 0) {
		trace_free(&t);
		free(args.devices);
		return CLI_EXIT_ERROR;
	}
	free(args.devices);
	ret = trace_resolve(&t, fs, top_fd, &unresolved);
	if (ret == 0) {
		ranges = trace_to_ranges(&t, &n);
		if (!ranges)
			ret = -ENOMEM;
	}
	memset(&st, 0, sizeof(st));
	if (ret == 0 && n)
		ret = on_mount ? run_on_mount(target, ranges, n, &st) : butter_layout(fs, ranges, n, 0, &st);
	if (ret == 0 && fs)
		ret = butter_sync(fs);
	if (fs)
		butter_close(fs);
	if (top_fd >= 0)
		close(top_fd);
	free(ranges);
	trace_free(&t);
	if (ret < 0) {
		cli_error("%s: %s", target, strerror(-ret));
		return CLI_EXIT_ERROR;
	}
	print_stats(&st, unresolved);
	return cli_finish_stdout(CLI_EXIT_OK);
}
