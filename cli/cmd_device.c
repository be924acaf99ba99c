/*
 * cmd_device.c — whole-filesystem maintenance commands: `butter device add`
 * makes another device (image file or block device) a member of an image's
 * filesystem (butter_device_add()); `butter device stats` prints (and with
 * -z resets) each device's error counters as `btrfs device stats` does, for
 * an image or a live mount (BUTTER_IOC_DEV_STATS); `butter check` runs
 * butter_check() on an image opened read-only and exits 1 when it found a
 * problem.
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

#define CLI_EXIT_STATS_NONZERO 64

int cmd_device_add(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "force", no_argument, NULL, 'f' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_fs *fs;
	unsigned flags = 0;
	uint64_t devid = 0;
	int c, ret;

	while ((c = cli_getopt(&args, argc, argv, ":hf", longopts)) != -1) {
		if (c == 'f')
			flags |= BUTTER_DEVICE_ADD_FORCE;
	}
	if (argc - optind != 2) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 2 ? "missing IMAGE or NEWDEV"
							     : "too many arguments");
	}
	const char *image = argv[optind], *newdev = argv[optind + 1];

	cli_open_flags |= BUTTER_OPEN_DEGRADED; /* a new disk for a failed one */
	ret = copyin_open_rw(image, args.devices, args.ndevices, &fs);
	free(args.devices);
	if (ret < 0)
		return CLI_EXIT_ERROR;
	ret = butter_device_add(fs, newdev, flags, &devid);
	if (ret < 0) {
		cli_error("%s: adding %s: %s", image, newdev, strerror(-ret));
		butter_close(fs);
		return CLI_EXIT_ERROR;
	}
	butter_close(fs);
	printf("added %s as device %" PRIu64 "\n", newdev, devid);
	return cli_finish_stdout(CLI_EXIT_OK);
}

/* The counters' names, as btrfs-progs prints them (BUTTER_DEV_STAT_* order). */
static const char *const stat_names[BUTTER_DEV_STAT_NR] = {
	"write_io_errs", "read_io_errs", "flush_io_errs", "corruption_errs", "generation_errs",
};

/*
 * Print one device's counters (the @idx-th device: with cli_json a JSON item
 * of progs' "device-stats" list); returns 1 if one is not zero.
 */
static int print_dev_stats(size_t idx, const char *path, uint64_t devid, const uint64_t *values)
{
	char name[64];
	int k, nonzero = 0;

	if (!path || !path[0]) {
		snprintf(name, sizeof(name), "devid:%" PRIu64, devid);
		path = name;
	}
	if (cli_json) {
		if (idx == 0)
			cli_json_begin("device-stats");
		cli_json_item_begin(idx == 0);
		cli_json_member("device", path, false);
		cli_json_member_u64("devid", devid, false);
	}
	for (k = 0; k < BUTTER_DEV_STAT_NR; k++) {
		if (cli_json)
			cli_json_member_u64(stat_names[k], values[k], k + 1 == BUTTER_DEV_STAT_NR);
		else
			printf("[%s].%-16s %" PRIu64 "\n", path, stat_names[k], values[k]);
		nonzero |= values[k] != 0;
	}
	if (cli_json)
		cli_json_item_end();
	return nonzero;
}

/* Device stats of the live mount holding @path; exit status, or -1 after an error. */
static int ctl_dev_stats(const char *path, bool reset, int *nonzero)
{
	struct butter_ioc_dev_stats s;
	uint64_t idx;
	int fd = ctl_open(path, NULL);

	if (fd < 0)
		return -1;
	for (idx = 0;; idx++) {
		memset(&s, 0, sizeof(s));
		s.idx = idx;
		s.flags = reset ? BUTTER_DEV_STATS_RESET : 0;
		if (ioctl(fd, BUTTER_IOC_DEV_STATS, &s) < 0) {
			if (errno == ENOENT && idx > 0)
				break;
			cli_error("%s: device stats: %s", path, strerror(errno));
			close(fd);
			return -1;
		}
		*nonzero |= print_dev_stats((size_t)idx, s.path, s.devid, s.values);
	}
	if (cli_json)
		cli_json_end(idx > 0);
	close(fd);
	return 0;
}

int cmd_device_stats(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "reset", no_argument, NULL, 'z' },
		{ "check", no_argument, NULL, 'c' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_device_stats st;
	struct butter_fs *fs;
	bool reset = false, check = false;
	int c, ret, nonzero = 0;
	size_t idx;

	while ((c = cli_getopt(&args, argc, argv, ":hzc", longopts)) != -1) {
		if (c == 'z')
			reset = true;
		else if (c == 'c')
			check = true;
	}
	if (argc - optind != 1) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 1 ? "missing IMAGE or PATH"
							     : "too many arguments");
	}
	const char *image = argv[optind];

	if (cli_is_mount_path(image, &args)) {
		free(args.devices);
		if (ctl_dev_stats(image, reset, &nonzero) < 0)
			return CLI_EXIT_ERROR;
		goto status;
	}
	ret = reset ? copyin_open_rw(image, args.devices, args.ndevices, &fs)
		    : cli_open(&args, image, &fs);
	free(args.devices);
	if (ret < 0)
		return CLI_EXIT_ERROR;
	for (idx = 0; (ret = butter_device_stats(fs, idx, reset ? BUTTER_DEV_STATS_RESET : 0,
						  &st)) == 0;
	     idx++)
		nonzero |= print_dev_stats(idx, st.path, st.devid, st.values);
	if (cli_json && ret == -ENOENT)
		cli_json_end(idx > 0);
	if (ret == -ENOENT)
		ret = reset ? butter_sync(fs) : 0;
	butter_close(fs);
	if (ret < 0) {
		cli_error("%s: device stats: %s", image, strerror(-ret));
		return CLI_EXIT_ERROR;
	}
status:
	/* as btrfs-progs: --check gives 64 when a counter is not zero */
	return cli_finish_stdout(check && nonzero ? CLI_EXIT_STATS_NONZERO : CLI_EXIT_OK);
}

/*
 * `butter check`: butter_check() on an image opened read-only; refused while
 * another program has it open read-write (its trees change under the check),
 * unless --force.
 */
int cmd_check(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "force", no_argument, NULL, 'f' },
		{ "readonly", no_argument, NULL, CLI_OPT_FIRST_FREE }, /* progs': always so here */
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd, .open_flags = BUTTER_OPEN_NO_WRITER };
	struct butter_check_result res;
	struct butter_fs *fs;
	int c, ret;

	while ((c = cli_getopt(&args, argc, argv, ":hf", longopts)) != -1) {
		if (c == 'f')
			args.open_flags &= ~BUTTER_OPEN_NO_WRITER;
	}
	if (argc - optind != 1) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 1 ? "missing IMAGE" : "too many arguments");
	}
	const char *image = argv[optind];

	ret = cli_open(&args, image, &fs);
	free(args.devices);
	if (ret == -EBUSY)
		cli_error("%s: open read-write elsewhere; check it once that is closed, or "
			  "--force to check it as it is now", image);
	if (ret < 0)
		return CLI_EXIT_ERROR;
	ret = butter_check(fs, &res);
	butter_close(fs);
	if (ret < 0) {
		cli_error("%s: the check could not run: %s", image, strerror(-ret));
		return CLI_EXIT_ERROR;
	}
	printf("checked %s: %" PRIu64 " trees, %" PRIu64 " tree blocks, %" PRIu64
	       " data references, %" PRIu64 " extent items, %" PRIu64 " block groups%s\n",
	       image, res.trees, res.tree_blocks, res.data_refs, res.extent_items, res.block_groups,
	       res.refs_checked ? "" : " (reference counts not checked: a tree is being dropped)");
	printf("%" PRIu64 " error(s) found\n", res.errors);
	return cli_finish_stdout(res.errors ? CLI_EXIT_ERROR : CLI_EXIT_OK);
}
