/*
 * cmd_scrub.c — `butter scrub`: check every copy of every allocated block of
 * an image and repair what a good copy allows (butter_scrub() does the work;
 * each error is logged on stderr as it is found), then print the totals. On a
 * directory inside a live `butter mount` the daemon scrubs, step by step
 * through BUTTER_IOC_SCRUB (cli/control.c), and logs the errors itself.
 *
 * Exit status: 0 when nothing is wrong any more (no error found, or every
 * one repaired), 3 when errors remain (found with -r, or without a good
 * copy), 1 when the scrub could not run.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
	bool readonly = false;
	int c, ret, status;

	while ((c = cli_getopt(&args, argc, argv, ":hr", longopts)) != -1) {
		if (c == 'r')
			readonly = true;
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
	struct stat sb;

	if (stat(image, &sb) == 0 && S_ISDIR(sb.st_mode) && args.ndevices == 0) {
		/* a path inside a live `butter mount`: the daemon scrubs (and logs each error) */
		free(args.devices);
		if (ctl_scrub(image, readonly, &st) < 0)
			return CLI_EXIT_ERROR;
		print_stats(image, &st, readonly);
		goto status;
	}
	ret = readonly ? cli_open(&args, image, &fs)
		       : copyin_open_rw(image, args.devices, args.ndevices, &fs);
	free(args.devices);
	if (ret < 0)
		return CLI_EXIT_ERROR;
	ret = butter_scrub(fs, readonly ? BUTTER_SCRUB_READONLY : 0, &st);
	if (ret < 0) {
		cli_error("%s: scrub stopped: %s", image, strerror(-ret));
		butter_close(fs);
		return CLI_EXIT_ERROR;
	}
	print_stats(image, &st, readonly);
	butter_close(fs);
status:
	if (st.read_errors + st.csum_errors + st.verify_errors + st.super_errors +
	    st.parity_errors > st.corrected)
		status = CLI_EXIT_ERRORS_LEFT;
	else
		status = CLI_EXIT_OK;
	return cli_finish_stdout(status);
}
