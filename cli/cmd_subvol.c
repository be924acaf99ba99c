/*
 * cmd_subvol.c — `butter subvolume list`: one line per subvolume in the
 * format of `btrfs subvolume list`, with the same optional columns
 * (-c, -q, -R, -u) in the same order, plus -f for a read-only marker.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "copyin.h"

#define ROOT_SUBVOL_RDONLY 0x1ull /* BTRFS_ROOT_SUBVOL_RDONLY */

struct list_opts {
	bool readonly_only, flags, uuid, parent_uuid, received_uuid, cgen;
};

static void print_uuid(const char *label, const uint8_t uuid[16])
{
	static const uint8_t zero[16];
	char u[37];

	printf(" %s %-36s", label, memcmp(uuid, zero, 16) ? cli_uuid(u, uuid) : "-");
}

static int print_subvol(void *arg, const struct butter_subvol_info *si)
{
	const struct list_opts *o = arg;
	bool ro = si->flags & ROOT_SUBVOL_RDONLY;

	if (o->readonly_only && !ro)
		return 0;
	printf("ID %" PRIu64 " gen %" PRIu64, si->id, si->generation);
	if (o->cgen)
		printf(" cgen %" PRIu64, si->otransid);
	printf(" top level %" PRIu64, si->parent_id);
	if (o->parent_uuid)
		print_uuid("parent_uuid", si->parent_uuid);
	if (o->received_uuid)
		print_uuid("received_uuid", si->received_uuid);
	if (o->uuid)
		print_uuid("uuid", si->uuid);
	if (o->flags)
		printf(" flags %s", ro ? "ro" : "-");
	printf(" path %s\n", si->path);
	return 0;
}

int cmd_subvolume_list(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "readonly", no_argument, NULL, 'r' },
		{ "flags", no_argument, NULL, 'f' },
		{ "uuid", no_argument, NULL, 'u' },
		{ "parent-uuid", no_argument, NULL, 'q' },
		{ "received-uuid", no_argument, NULL, 'R' },
		{ "cgen", no_argument, NULL, 'c' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct list_opts o = { 0 };
	int c;

	while ((c = cli_getopt(&args, argc, argv, ":hrfuqRc", longopts)) != -1) {
		switch (c) {
		case 'r': o.readonly_only = true; break;
		case 'f': o.flags = true; break;
		case 'u': o.uuid = true; break;
		case 'q': o.parent_uuid = true; break;
		case 'R': o.received_uuid = true; break;
		case 'c': o.cgen = true; break;
		}
	}
	if (optind >= argc)
		return cli_usage_error(cmd, "missing IMAGE");
	if (argc - optind > 1)
		return cli_usage_error(cmd, "too many arguments");
	const char *image = argv[optind];

	struct butter_fs *fs;
	if (cli_open(&args, image, &fs) < 0) {
		free(args.devices);
		return CLI_EXIT_ERROR;
	}
	int status = CLI_EXIT_OK;
	int ret = butter_subvol_list(fs, print_subvol, &o);
	if (ret < 0) {
		cli_error("%s: listing subvolumes: %s", image, strerror(-ret));
		status = CLI_EXIT_ERROR;
	}
	butter_close(fs);
	free(args.devices);
	return cli_finish_stdout(status);
}

/* butter subvolume create [--device DEV]... IMAGE PATH */
int cmd_subvolume_create(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_fs *fs;
	butter_ino_t dir;
	uint64_t id = 0;
	char *copy, *slash, *name;
	int c, ret, status = CLI_EXIT_ERROR;

	while ((c = cli_getopt(&args, argc, argv, ":h", longopts)) != -1)
		;
	if (argc - optind != 2) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 2 ? "missing IMAGE or PATH"
							    : "too many arguments");
	}
	copy = strdup(argv[optind + 1]);
	if (!copy) {
		free(args.devices);
		cli_error("%s", strerror(ENOMEM));
		return CLI_EXIT_ERROR;
	}
	while (strlen(copy) > 1 && copy[strlen(copy) - 1] == '/')
		copy[strlen(copy) - 1] = '\0';
	slash = strrchr(copy, '/');
	name = slash ? slash + 1 : copy;
	if (!*name || !strcmp(name, ".") || !strcmp(name, "..")) {
		cli_error("%s: not a name for a new subvolume", argv[optind + 1]);
		goto out_free;
	}
	if (copyin_open_rw(argv[optind], args.devices, args.ndevices, &fs) < 0)
		goto out_free;
	if (slash) {
		*slash = '\0';
		ret = butter_resolve(fs, *copy ? copy : "/", &dir);
	} else {
		ret = butter_root(fs, 5, &dir);
	}
	if (ret == 0)
		ret = butter_subvol_create(fs, dir, name, strlen(name), &id);
	if (ret < 0) {
		cli_error("%s: %s", argv[optind + 1], strerror(-ret));
		butter_close(fs);
		goto out_free;
	}
	butter_close(fs);
	printf("Create subvolume '%s' (id %llu)\n", argv[optind + 1], (unsigned long long)id);
	status = CLI_EXIT_OK;
out_free:
	free(copy);
	free(args.devices);
	return status;
}
