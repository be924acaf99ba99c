/*
 * cmd_scrub.c — `butter scrub`: check every copy of every allocated block
 * and repair what a good copy allows, then print the totals.
 *
 * Two targets. An image is scrubbed here, in the foreground (butter_scrub_
 * range() in steps, for the progress line; each error is logged on stderr as
 * found). A path inside a live `butter mount` is scrubbed by the daemon in a
 * thread of its own (BUTTER_IOC_SCRUB, fuse/scrub.c), which logs the errors
 * in its log and outlives this command, as the kernel's scrub outlives
 * `btrfs scrub start`.
 *
 * Two grammars. butter's, `butter scrub [-r] [-q] TARGET`, waits for the end
 * and prints butter's totals. btrfs-progs', `scrub start [-B] [-r] [-q] [-d]
 * [-R]`, `status [-d] [-R] [units]`, `cancel`, `resume [-B] [-r]`, answers
 * as progs does: on a mount, start and resume return at once unless -B;
 * status prints progs' report of the running or last scrub (or, with
 * --format json, butter's layout: README). An image has no background scrub:
 * start runs it as -B does; status finds no stats, cancel and resume nothing.
 *
 * Exit status: 0 when nothing is wrong any more (no error found, or every
 * one repaired), 3 when errors remain (found with -r, or without a good
 * copy), 1 when the scrub could not run, 2 for cancel or resume of nothing.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <butter/control.h>

#include "cli.h"
#include "copyin.h"

#define CLI_EXIT_ERRORS_LEFT 3
#define CLI_EXIT_NOTHING 2 /* progs: cancel or resume with nothing to act on */

static uint64_t errors_of(const struct butter_scrub_stats *st)
{
	return st->read_errors + st->csum_errors + st->verify_errors + st->super_errors +
	       st->parity_errors;
}

static int exit_status(const struct butter_scrub_stats *st)
{
	return errors_of(st) > st->corrected ? CLI_EXIT_ERRORS_LEFT : CLI_EXIT_OK;
}

static void print_stats(const char *target, const struct butter_scrub_stats *st, bool readonly)
{
	char a[32], b[32], c[32];

	printf("scrub of %s%s\n", target, readonly ? " (read-only)" : "");
	printf("  checked:       tree %s, data %s (without checksums %s)\n",
	       cli_size(a, sizeof(a), st->tree_bytes, false),
	       cli_size(b, sizeof(b), st->data_bytes, false),
	       cli_size(c, sizeof(c), st->no_csum_bytes, false));
	printf("  errors:        %" PRIu64 " (read %" PRIu64 ", csum %" PRIu64 ", verify %" PRIu64
	       ", super %" PRIu64 ", parity %" PRIu64 ")\n",
	       errors_of(st), st->read_errors, st->csum_errors, st->verify_errors,
	       st->super_errors, st->parity_errors);
	printf("  corrected:     %" PRIu64 "\n", st->corrected);
	printf("  uncorrectable: %" PRIu64 "\n", st->uncorrectable);
}

static void print_time(const char *label, time_t when)
{
	char t[128];
	struct tm tm;

	/* progs prints "%c": the C locale's spelling of it, whatever the locale */
	if (!localtime_r(&when, &tm) || !strftime(t, sizeof(t), "%a %b %e %H:%M:%S %Y", &tm))
		strcpy(t, "-");
	printf("%s%s\n", label, t);
}

/*
 * progs' report of one scrub (print_fs_stat: its times and status, then
 * print_scrub_summary): @state BUTTER_SCRUB_STATE_*. butter counts every
 * allocated byte once, so "Total to scrub" is the allocated bytes, not
 * progs' sum over the copies.
 */
static void print_progs_report(const struct butter_ioc_scrub *io, const struct cli_units *units)
{
	const struct butter_scrub_stats *st = &io->stats;
	static const char *const status[] = { "no stats", "running", "finished", "aborted",
					      "interrupted" };
	struct cli_units rate_units = { 0, units->si };
	uint64_t done = st->tree_bytes + st->data_bytes, rate, left = 0, total = io->bytes_total;
	char a[32], b[32];

	if (io->resumed)
		print_time("Scrub resumed:    ", (time_t)io->resumed);
	else
		print_time("Scrub started:    ", (time_t)io->started);
	printf("Status:           %s\n", status[io->state <= 4 ? io->state : 4]);
	printf("Duration:         %" PRIu64 ":%02" PRIu64 ":%02" PRIu64 "\n", io->seconds / 3600,
	       io->seconds / 60 % 60, io->seconds % 60);
	rate = io->seconds ? done / io->seconds : done;
	if (units->fixed < 0)
		rate_units.fixed = -1; /* progs: the rate follows --raw only */
	if (total < done)
		total = done; /* what was written since the start */
	if (io->state == BUTTER_SCRUB_STATE_RUNNING) {
		if (rate)
			left = (total - done) / rate;
		printf("Time left:        %" PRIu64 ":%02" PRIu64 ":%02" PRIu64 "\n", left / 3600,
		       left / 60 % 60, left % 60);
		print_time("ETA:              ", time(NULL) + (time_t)left);
		printf("Total to scrub:   %s\n", cli_size_units(a, sizeof(a), total, units));
		printf("Bytes scrubbed:   %s  (%.2f%%)\n", cli_size_units(b, sizeof(b), done, units),
		       total ? 100.0 * (double)done / (double)total : 100.0);
	} else {
		printf("Total to scrub:   %s\n", cli_size_units(a, sizeof(a), total, units));
	}
	printf("Rate:             %s/s", cli_size_units(b, sizeof(b), rate, &rate_units));
	if (io->limit)
		printf(" (limit %s/s)", cli_size_units(a, sizeof(a), io->limit, &rate_units));
	printf("\n");
	if (!errors_of(st) && !st->corrected && !st->uncorrectable) {
		printf("Error summary:    no errors found\n");
		return;
	}
	printf("Error summary:   ");
	if (st->read_errors)
		printf(" read=%" PRIu64, st->read_errors);
	if (st->super_errors)
		printf(" super=%" PRIu64, st->super_errors);
	if (st->verify_errors)
		printf(" verify=%" PRIu64, st->verify_errors);
	if (st->csum_errors)
		printf(" csum=%" PRIu64, st->csum_errors);
	if (st->parity_errors)
		printf(" parity=%" PRIu64, st->parity_errors);
	printf("\n  Corrected:      %" PRIu64 "\n  Uncorrectable:  %" PRIu64
	       "\n  Unverified:     0\n", st->corrected, st->uncorrectable);
}

/* --format json of `scrub status`: one item, butter's layout (README). */
static void print_json(const uint8_t fsid[16], const struct butter_ioc_scrub *io)
{
	static const char *const status[] = { "none", "running", "finished", "canceled",
					      "interrupted" };
	const struct butter_scrub_stats *st = &io->stats;
	char u[37];

	cli_json_begin("scrub-status");
	cli_json_item_begin(true);
	cli_json_member("uuid", cli_uuid(u, fsid), false);
	cli_json_member("status", status[io->state <= 4 ? io->state : 4], false);
	cli_json_member_u64("readonly", io->flags & BUTTER_SCRUB_READONLY ? 1 : 0, false);
	cli_json_member_u64("started", (uint64_t)io->started, false);
	cli_json_member_u64("resumed", (uint64_t)io->resumed, false);
	cli_json_member_u64("duration", io->seconds, false);
	cli_json_member_u64("limit", io->limit, false);
	cli_json_member_u64("bytes_total", io->bytes_total, false);
	cli_json_member_u64("bytes_scrubbed", st->tree_bytes + st->data_bytes, false);
	cli_json_member_u64("tree_bytes", st->tree_bytes, false);
	cli_json_member_u64("data_bytes", st->data_bytes, false);
	cli_json_member_u64("no_csum_bytes", st->no_csum_bytes, false);
	cli_json_member_u64("read_errors", st->read_errors, false);
	cli_json_member_u64("csum_errors", st->csum_errors, false);
	cli_json_member_u64("verify_errors", st->verify_errors, false);
	cli_json_member_u64("super_errors", st->super_errors, false);
	cli_json_member_u64("parity_errors", st->parity_errors, false);
	cli_json_member_u64("corrected", st->corrected, false);
	cli_json_member_u64("uncorrectable", st->uncorrectable, true);
	cli_json_item_end();
	cli_json_end(true);
}

/* With a limit: sleep until @done bytes since @start are no faster than @limit a second. */
static void pace(const struct timespec *start, uint64_t done, uint64_t limit)
{
	struct timespec now;
	double ahead;

	clock_gettime(CLOCK_MONOTONIC, &now);
	ahead = (double)done / (double)limit - ((double)(now.tv_sec - start->tv_sec) +
						(double)(now.tv_nsec - start->tv_nsec) / 1e9);
	if (ahead > 0)
		usleep((useconds_t)(ahead * 1e6));
}

/* An image, in the foreground; 0 with @st filled, or CLI_EXIT_ERROR after a message. */
static int scrub_image(struct cli_args *args, const char *image, bool readonly, bool quiet,
		       uint64_t limit, struct butter_scrub_stats *st, uint8_t fsid[16])
{
	unsigned flags = readonly ? BUTTER_SCRUB_READONLY : 0;
	struct cli_progress progress;
	struct butter_info info;
	struct butter_fs *fs;
	uint64_t cursor = 0, step = limit && limit < (64ULL << 20) ? limit : 64ULL << 20;
	int ret;

	ret = readonly ? cli_open(args, image, &fs)
		       : copyin_open_rw(image, args->devices, args->ndevices, &fs);
	if (ret < 0)
		return CLI_EXIT_ERROR;
	memset(&info, 0, sizeof(info));
	ret = butter_get_info(fs, &info);
	memcpy(fsid, info.fsid, 16);
	/* in 64 MiB steps, for the progress line */
	memset(st, 0, sizeof(*st));
	cli_progress_begin(&progress, "scrub", ret == 0 ? info.bytes_used : 0, quiet);
	do {
		ret = ret < 0 ? ret : butter_scrub_range(fs, flags, &cursor, step, st);
		cli_progress_update(&progress, st->tree_bytes + st->data_bytes);
		if (limit)
			pace(&progress.start, st->tree_bytes + st->data_bytes, limit);
	} while (ret == 1);
	if (ret == 0)
		ret = butter_scrub_supers(fs, flags, st);
	cli_progress_end(&progress);
	butter_close(fs);
	if (ret < 0) {
		cli_error("%s: scrub stopped: %s", image, strerror(-ret));
		return CLI_EXIT_ERROR;
	}
	return 0;
}

/* Follow the mount's scrub until it stops (progress line meanwhile); 0, or -1 after a message. */
static int wait_mount(const char *path, bool quiet, struct butter_ioc_scrub *io)
{
	struct cli_progress progress;
	int ret;

	cli_progress_begin(&progress, "scrub", io->bytes_total, quiet);
	while (io->state == BUTTER_SCRUB_STATE_RUNNING) {
		usleep(100 * 1000);
		ret = ctl_scrub(path, BUTTER_SCRUB_CMD_STATUS, 0, 0, io);
		if (ret < 0) {
			cli_progress_end(&progress);
			if (ret != -EBADF)
				cli_error("%s: scrub status: %s", path, strerror(-ret));
			return -1;
		}
		if (io->state != BUTTER_SCRUB_STATE_RUNNING)
			progress.last = (struct timespec){ 0 }; /* the end is drawn, however soon */
		cli_progress_update(&progress, io->stats.tree_bytes + io->stats.data_bytes);
	}
	cli_progress_end(&progress);
	if (io->state == BUTTER_SCRUB_STATE_INTERRUPTED) {
		cli_error("%s: scrub stopped: %s", path, strerror(-io->error));
		return -1;
	}
	if (io->state == BUTTER_SCRUB_STATE_CANCELED) {
		cli_error("%s: scrub cancelled", path);
		return -1;
	}
	return 0;
}

/* START or RESUME on a mount; on failure the message and exit status. */
static int start_mount(const char *path, uint32_t cmd, bool readonly, uint64_t limit,
		       const uint8_t fsid[16], struct butter_ioc_scrub *io)
{
	char u[37];
	int ret = ctl_scrub(path, cmd, readonly ? BUTTER_SCRUB_READONLY : 0, limit, io);

	if (ret == 0)
		return CLI_EXIT_OK;
	if (ret == -EBADF)
		return CLI_EXIT_ERROR;
	if (ret == -EINPROGRESS) {
		cli_error("%s: a scrub runs already (`butter scrub status` or `cancel` on it)", path);
		return CLI_EXIT_ERROR;
	}
	if (ret == -ENOENT && cmd == BUTTER_SCRUB_CMD_RESUME) {
		printf("scrub: nothing to resume for %s, fsid %s\n", path, cli_uuid(u, fsid));
		return CLI_EXIT_NOTHING;
	}
	cli_error("%s: scrub: %s", path, strerror(-ret));
	return CLI_EXIT_ERROR;
}

enum verb { VERB_BUTTER, VERB_START, VERB_RESUME, VERB_STATUS, VERB_CANCEL };

int cmd_scrub(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "readonly", no_argument, NULL, 'r' },
		{ "limit", required_argument, NULL, 'L' },
		CLI_UNITS_LONGOPTS,
		{ 0 },
	};
	static const char *const verbs[] = { "start", "resume", "status", "cancel" };
	struct cli_args args = { .cmd = cmd };
	struct cli_units units = { 0, false };
	struct butter_ioc_scrub io;
	struct butter_ioc_fs_info fi;
	struct timespec t0, t1;
	enum verb verb = VERB_BUTTER;
	bool readonly = false, quiet = false, wait = false, mount;
	uint64_t limit = 0;
	char u[37];
	int c, ret;

	for (size_t i = 0; argc > 1 && i < sizeof(verbs) / sizeof(*verbs); i++)
		if (!strcmp(argv[1], verbs[i])) {
			verb = (enum verb)(VERB_START + i);
			argv[1] = argv[0];
			argv++;
			argc--;
			break;
		}
	while ((c = cli_getopt(&args, argc, argv, verb == VERB_BUTTER ? ":hrq" : ":hrBdqR",
			       longopts)) != -1) {
		if (c == 'r' && (verb == VERB_BUTTER || verb == VERB_START || verb == VERB_RESUME))
			readonly = true;
		else if (c == 'q')
			quiet = true; /* no progress line, no summary */
		else if (c == 'B')
			wait = true;
		else if (c == 'L' && verb != VERB_STATUS && verb != VERB_CANCEL) {
			if (cli_parse_size(optarg, &limit) < 0) {
				free(args.devices);
				return cli_usage_error(cmd, "--limit takes a size (bytes a second)");
			}
		}
		else if (verb == VERB_STATUS && cli_units_option(&units, c))
			;
		else if (c == 'R' && verb != VERB_CANCEL)
			units.fixed = -1; /* progs: raw numbers */
		else if (c != 'd' || verb == VERB_CANCEL) /* -d: one filesystem, one report here */
			return free(args.devices), cli_usage_error(cmd, "unknown option");
	}
	if (optind >= argc) {
		free(args.devices);
		return cli_usage_error(cmd, "missing IMAGE or PATH");
	}
	if (argc - optind > 1) {
		free(args.devices);
		return cli_usage_error(cmd, "too many arguments");
	}
	if (cli_json && verb != VERB_STATUS) {
		free(args.devices);
		return cli_json_unsupported();
	}
	const char *target = argv[optind];

	mount = cli_is_mount_path(target, &args);
	if (!mount) {
		struct butter_scrub_stats st;
		uint8_t fsid[16];

		switch (verb) {
		case VERB_STATUS:
			free(args.devices);
			if (cli_json)
				return cli_json_unsupported();
			printf("no stats available (an image's scrub runs inside `scrub start`)\n");
			return cli_finish_stdout(CLI_EXIT_OK);
		case VERB_CANCEL:
			free(args.devices);
			cli_error("scrub cancel failed on %s: not running", target);
			return CLI_EXIT_NOTHING;
		case VERB_RESUME:
			free(args.devices);
			printf("scrub: nothing to resume for %s\n", target);
			return cli_finish_stdout(CLI_EXIT_NOTHING);
		default:
			break;
		}
		clock_gettime(CLOCK_MONOTONIC, &t0);
		ret = scrub_image(&args, target, readonly, quiet, limit, &st, fsid);
		free(args.devices);
		if (ret)
			return ret;
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if (verb == VERB_BUTTER) {
			print_stats(target, &st, readonly);
		} else if (!quiet) {
			memset(&io, 0, sizeof(io));
			io.state = BUTTER_SCRUB_STATE_FINISHED;
			io.seconds = (uint64_t)(t1.tv_sec - t0.tv_sec);
			io.started = time(NULL) - (time_t)io.seconds;
			io.stats = st;
			io.bytes_total = st.tree_bytes + st.data_bytes;
			io.limit = limit;
			printf("scrub done for %s\n", cli_uuid(u, fsid));
			print_progs_report(&io, &units);
		}
		return cli_finish_stdout(exit_status(&st));
	}

	/* a path inside a live `butter mount`: the daemon's scrub */
	free(args.devices);
	if (ctl_fs_info(target, &fi) < 0)
		return CLI_EXIT_ERROR;
	switch (verb) {
	case VERB_STATUS:
		ret = ctl_scrub(target, BUTTER_SCRUB_CMD_STATUS, 0, 0, &io);
		if (ret < 0) {
			if (ret != -EBADF)
				cli_error("%s: scrub status: %s", target, strerror(-ret));
			return CLI_EXIT_ERROR;
		}
		if (cli_json) {
			print_json(fi.fsid, &io);
		} else {
			printf("UUID:             %s\n", cli_uuid(u, fi.fsid));
			if (io.state == BUTTER_SCRUB_STATE_NONE)
				printf("\tno stats available\n");
			else
				print_progs_report(&io, &units);
		}
		return cli_finish_stdout(CLI_EXIT_OK);
	case VERB_CANCEL:
		ret = ctl_scrub(target, BUTTER_SCRUB_CMD_CANCEL, 0, 0, &io);
		if (ret == -ENOTCONN) {
			cli_error("scrub cancel failed on %s: not running", target);
			return CLI_EXIT_NOTHING;
		}
		if (ret < 0) {
			if (ret != -EBADF)
				cli_error("scrub cancel failed on %s: %s", target, strerror(-ret));
			return CLI_EXIT_ERROR;
		}
		printf("scrub cancelled\n");
		return cli_finish_stdout(CLI_EXIT_OK);
	case VERB_BUTTER:
	case VERB_START:
	case VERB_RESUME:
		break;
	}
	ret = start_mount(target, verb == VERB_RESUME ? BUTTER_SCRUB_CMD_RESUME : BUTTER_SCRUB_CMD_START,
			  readonly, limit, fi.fsid, &io);
	if (ret != CLI_EXIT_OK)
		return cli_finish_stdout(ret);
	if (verb != VERB_BUTTER) {
		if (!quiet)
			printf("scrub %s on %s, fsid %s (pid=%" PRIu64 ")\n",
			       verb == VERB_RESUME ? "resumed" : "started", target,
			       cli_uuid(u, fi.fsid), io.pid);
		if (!wait)
			return cli_finish_stdout(CLI_EXIT_OK);
		fflush(stdout);
	}
	if (wait_mount(target, quiet, &io) < 0)
		return CLI_EXIT_ERROR;
	if (verb == VERB_BUTTER) {
		print_stats(target, &io.stats, readonly);
	} else if (!quiet) {
		printf("scrub done for %s\n", cli_uuid(u, fi.fsid));
		print_progs_report(&io, &units);
	}
	return cli_finish_stdout(exit_status(&io.stats));
}
