/*
 * cmd_scrub.c — `butter scrub`: check every copy of every allocated block of
 * an image and repair what a good copy allows (butter_scrub() does the work;
 * each error is logged on stderr as it is found), then print the totals. On a
 * directory inside a live `butter mount` the daemon scrubs, step by step
 * through BUTTER_IOC_SCRUB (cli/control.c), and logs the errors itself.
 *
 * btrfs-progs' grammar works too: `scrub start [-B] [-r] [-d] [-q]` runs the
 * same scrub in the foreground (as -B) and prints progs' summary ("Error
 * summary:    no errors found"); `status`, `cancel` and `resume` answer as
 * progs does when no scrub runs in the background, which is always here: a
 * butter scrub runs inside the command that starts it.
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

#include <butter/control.h>

#include "cli.h"
#include "copyin.h"

#define CLI_EXIT_ERRORS_LEFT 3

static void print_stats(const char *image, const struct butter_scrub_stats *st, bool readonly)
{
	char a[32], b[32], c[32];
	uint64_t errors = st->read_errors + st->csum_errors + st->verify_errors +
			  st->super_errors + st->parity_errors;

	printf("scrub of %s%s\n", image, readonly ? " (read-only)" : "");
	printf("  checked:       tree %s, data %s (without checksums %s)\n",
	       cli_size(a, sizeof(a), st->tree_bytes, false),
	       cli_size(b, sizeof(b), st->data_bytes, false),
	       cli_size(c, sizeof(c), st->no_csum_bytes, false));
	printf("  errors:        %" PRIu64 " (read %" PRIu64 ", csum %" PRIu64 ", verify %" PRIu64
	       ", super %" PRIu64 ", parity %" PRIu64 ")\n",
	       errors, st->read_errors, st->csum_errors, st->verify_errors, st->super_errors,
	       st->parity_errors);
	printf("  corrected:     %" PRIu64 "\n", st->corrected);
	printf("  uncorrectable: %" PRIu64 "\n", st->uncorrectable);
}

/* The summary `btrfs scrub start -B` prints, for `butter scrub start`. */
static void print_progs_summary(const uint8_t fsid[16], time_t started, double seconds,
				const struct butter_scrub_stats *st)
{
	char u[37], when[64], a[32], r[32];
	uint64_t total = st->tree_bytes + st->data_bytes, secs = (uint64_t)seconds;
	struct tm tm;

	if (!localtime_r(&started, &tm) || !strftime(when, sizeof(when), "%a %b %e %H:%M:%S %Y", &tm))
		strcpy(when, "-");
	printf("scrub done for %s\n", cli_uuid(u, fsid));
	printf("Scrub started:    %s\n", when);
	printf("Status:           finished\n");
	printf("Duration:         %" PRIu64 ":%02" PRIu64 ":%02" PRIu64 "\n", secs / 3600,
	       secs / 60 % 60, secs % 60);
	printf("Total to scrub:   %s\n", cli_size_units(a, sizeof(a), total, NULL));
	printf("Rate:             %s/s\n",
	       cli_size_units(r, sizeof(r), seconds > 0 ? (uint64_t)((double)total / seconds) : 0, NULL));
	if (!(st->read_errors + st->csum_errors + st->verify_errors + st->super_errors +
	      st->parity_errors)) {
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

int cmd_scrub(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "readonly", no_argument, NULL, 'r' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_scrub_stats st;
	struct butter_fs *fs;
	struct butter_info info;
	struct cli_progress progress;
	struct timespec t0, t1;
	bool readonly = false, progs = false, quiet = false;
	int c, ret, status;

	/* progs' subcommands: start runs the scrub; the rest find none running */
	if (argc > 1 && (!strcmp(argv[1], "status") || !strcmp(argv[1], "cancel") ||
			 !strcmp(argv[1], "resume"))) {
		const char *target = argc > 2 ? argv[argc - 1] : "";

		if (!strcmp(argv[1], "status")) {
			printf("no stats available (a butter scrub runs inside `scrub start`)\n");
			return cli_finish_stdout(CLI_EXIT_OK);
		}
		if (!strcmp(argv[1], "cancel"))
			cli_error("scrub cancel failed on %s: not running", target);
		else
			cli_error("scrub: nothing to resume for %s", target);
		return CLI_EXIT_USAGE;
	}
	if (argc > 1 && !strcmp(argv[1], "start")) {
		progs = true;
		argv[1] = argv[0];
		argv++;
		argc--;
	}
	while ((c = cli_getopt(&args, argc, argv, progs ? ":hrBdqR" : ":hrq", longopts)) != -1) {
		if (c == 'r')
			readonly = true;
		else if (c == 'q')
			quiet = true; /* no progress line, no summary */
		/* -B: always in the foreground here; -d, -R: the totals are printed anyway */
	}
	if (optind >= argc) {
		free(args.devices);
		return cli_usage_error(cmd, "missing IMAGE");
	}
	if (argc - optind > 1) {
		free(args.devices);
		return cli_usage_error(cmd, "too many arguments");
	}
	const char *image = argv[optind];

	clock_gettime(CLOCK_MONOTONIC, &t0);
	memset(&info, 0, sizeof(info));
	if (cli_is_mount_path(image, &args)) {
		/* a path inside a live `butter mount`: the daemon scrubs (and logs each error) */
		struct butter_ioc_fs_info fi;

		free(args.devices);
		if (ctl_fs_info(image, &fi) < 0)
			return CLI_EXIT_ERROR;
		memcpy(info.fsid, fi.fsid, 16);
		cli_progress_begin(&progress, "scrub", fi.bytes_used, quiet);
		if (ctl_scrub(image, readonly, &st, &progress) < 0)
			return CLI_EXIT_ERROR;
	} else {
		unsigned flags = readonly ? BUTTER_SCRUB_READONLY : 0;
		uint64_t cursor = 0;

		ret = readonly ? cli_open(&args, image, &fs)
			       : copyin_open_rw(image, args.devices, args.ndevices, &fs);
		free(args.devices);
		if (ret < 0)
			return CLI_EXIT_ERROR;
		ret = butter_get_info(fs, &info);
		/* in 64 MiB steps, for the progress line */
		memset(&st, 0, sizeof(st));
		cli_progress_begin(&progress, "scrub", ret == 0 ? info.bytes_used : 0, quiet);
		do {
			ret = ret < 0 ? ret : butter_scrub_range(fs, flags, &cursor, 64ULL << 20, &st);
			cli_progress_update(&progress, st.tree_bytes + st.data_bytes);
		} while (ret == 1);
		if (ret == 0)
			ret = butter_scrub_supers(fs, flags, &st);
		cli_progress_end(&progress);
		if (ret < 0) {
			cli_error("%s: scrub stopped: %s", image, strerror(-ret));
			butter_close(fs);
			return CLI_EXIT_ERROR;
		}
		butter_close(fs);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (progs && !quiet)
		print_progs_summary(info.fsid, time(NULL) - (t1.tv_sec - t0.tv_sec),
				    (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9,
				    &st);
	else if (!progs)
		print_stats(image, &st, readonly);
	if (st.read_errors + st.csum_errors + st.verify_errors + st.super_errors +
	    st.parity_errors > st.corrected)
		status = CLI_EXIT_ERRORS_LEFT;
	else
		status = CLI_EXIT_OK;
	return cli_finish_stdout(status);
}
