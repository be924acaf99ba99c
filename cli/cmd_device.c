/*
 * cmd_device.c — `butter device add`: make another device (image file or
 * block device) a member of an image's filesystem (butter_device_add()).
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
