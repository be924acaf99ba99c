/*
 * cmd_device.c — whole-filesystem maintenance commands: `butter device add`
 * makes another device (image file or block device) a member of an image's
 * filesystem (butter_device_add()); `butter check` runs butter_check() on an
 * image opened read-only and exits 1 when it found a problem.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "copyin.h"

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
