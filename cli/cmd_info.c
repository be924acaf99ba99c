/*
 * cmd_info.c — `butter info`: print what the library reports about a
 * filesystem: identity, sizes, geometry, features by name, checksum, the
 * devices (present or MISSING) and the chunk kinds with their profiles.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Block group type bits, as `btrfs filesystem df` names them (on-disk values). */
#define BG_DATA 0x1ull
#define BG_SYSTEM 0x2ull
#define BG_METADATA 0x4ull
#define BG_GLOBAL_RSV (1ull << 49)

const char *cli_space_type(uint64_t flags)
{
	if (flags & BG_GLOBAL_RSV)
		return "GlobalReserve";
	switch (flags & (BG_DATA | BG_SYSTEM | BG_METADATA)) {
	case BG_DATA:
		return "Data";
	case BG_SYSTEM:
		return "System";
	case BG_METADATA:
		return "Metadata";
	case BG_DATA | BG_METADATA:
		return "Data+Metadata";
	default:
		return "Unknown";
	}
}

const char *cli_profile_text(char buf[16], uint64_t flags)
{
	const char *profile = butter_profile_name(flags);
	size_t i;

	/* btrfs-progs' spelling: "single", else upper case ("DUP", "RAID1C3") */
	if (!profile)
		profile = "unknown";
	for (i = 0; profile[i] && i + 1 < 16; i++)
		buf[i] = strcmp(profile, "single") ? (char)toupper((unsigned char)profile[i]) : profile[i];
	buf[i] = '\0';
	return buf;
}

void cli_print_space(const char *indent, uint64_t flags, uint64_t total, uint64_t used,
		     const struct cli_units *u, int *count)
{
	char a[32], b[32], spelled[16];

	cli_profile_text(spelled, flags);
	if (count && cli_json) { /* progs' "filesystem-df" items; cli_json_begin() came first */
		cli_json_item_begin((*count)++ == 0);
		cli_json_member("bg-type", cli_space_type(flags), false);
		cli_json_member("bg-profile", spelled, false);
		cli_json_member_u64("total", total, false);
		cli_json_member_u64("used", used, true);
		cli_json_item_end();
		return;
	}
	printf("%s%s, %s: total=%s, used=%s\n", indent, cli_space_type(flags), spelled,
	       cli_size_units(a, sizeof(a), total, u), cli_size_units(b, sizeof(b), used, u));
}

static int devid_cmp(const void *a, const void *b)
{
	const struct butter_device_info *x = a, *y = b;

	return (x->devid > y->devid) - (x->devid < y->devid);
}

static void print_features(const char *kind_name, int kind, uint64_t flags)
{
	printf("  %-10s", kind_name);
	if (!flags)
		printf(" -");
	for (int bit = 0; bit < 64; bit++) {
		if (!(flags & (1ull << bit)))
			continue;
		const char *name = butter_feature_name(kind, bit);
		if (name)
			printf(" %s", name);
		else
			printf(" unknown(bit %d)", bit);
	}
	printf("\n");
}

static void json_features(const char *key, int kind, uint64_t flags)
{
	char unknown[32];

	cli_jw_open(key, '[');
	for (int bit = 0; bit < 64; bit++) {
		const char *name = butter_feature_name(kind, bit);

		if (!(flags & (1ull << bit)))
			continue;
		if (!name) {
			snprintf(unknown, sizeof(unknown), "unknown(bit %d)", bit);
			name = unknown;
		}
		cli_jw_str(NULL, name);
	}
	cli_jw_close();
}

/* --format json: one "filesystem-info" object (layout in README). */
static void print_json(const struct butter_info *info, const struct butter_device_info *devs,
		       size_t ndevs, const struct butter_space_info *spaces, size_t nspaces)
{
	char u[37], spelled[16];

	cli_jw_open(NULL, '{');
	cli_jw_open("filesystem-info", '{');
	cli_jw_str("label", info->label);
	cli_jw_str("uuid", cli_uuid(u, info->fsid));
	cli_jw_str("metadata_uuid", cli_uuid(u, memcmp(info->metadata_uuid, (uint8_t[16]){ 0 }, 16)
							   ? info->metadata_uuid : info->fsid));
	cli_jw_u64("generation", info->generation);
	cli_jw_u64("total_bytes", info->total_bytes);
	cli_jw_u64("bytes_used", info->bytes_used);
	cli_jw_u64("sectorsize", info->sectorsize);
	cli_jw_u64("nodesize", info->nodesize);
	cli_jw_str("csum", info->csum_name ? info->csum_name : "unknown");
	cli_jw_u64("default_subvol", info->default_subvol);
	cli_jw_open("features", '{');
	json_features("compat", 0, info->compat_flags);
	json_features("compat_ro", 1, info->compat_ro_flags);
	json_features("incompat", 2, info->incompat_flags);
	cli_jw_close();
	cli_jw_u64("num_devices", info->num_devices);
	cli_jw_open("devices", '[');
	for (size_t i = 0; i < ndevs; i++) {
		cli_jw_open(NULL, '{');
		cli_jw_u64("devid", devs[i].devid);
		cli_jw_u64("size", devs[i].total_bytes);
		cli_jw_u64("used", devs[i].bytes_used);
		cli_jw_str("path", devs[i].path ? devs[i].path : "MISSING");
		cli_jw_close();
	}
	cli_jw_close();
	cli_jw_open("space", '[');
	for (size_t i = 0; i < nspaces; i++) {
		cli_jw_open(NULL, '{');
		cli_jw_str("bg-type", cli_space_type(spaces[i].flags));
		cli_jw_str("bg-profile", cli_profile_text(spelled, spaces[i].flags));
		cli_jw_u64("total", spaces[i].total);
		cli_jw_u64("used", spaces[i].used);
		cli_jw_close();
	}
	cli_jw_close();
	cli_jw_close();
	cli_jw_close();
}

int cmd_info(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "raw", no_argument, NULL, CLI_OPT_FIRST_FREE },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	bool raw = false;
	int c;

	while ((c = cli_getopt(&args, argc, argv, ":h", longopts)) != -1) {
		if (c == CLI_OPT_FIRST_FREE)
			raw = true;
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
	struct butter_info info;
	char a[64], b[64], u[37];
	int ret = butter_get_info(fs, &info);
	if (ret < 0) {
		cli_error("%s: %s", image, strerror(-ret));
		status = CLI_EXIT_ERROR;
		goto out;
	}

	/* what there is to say, gathered first: then text or JSON */
	struct butter_device_info *devs = NULL;
	struct butter_space_info *spaces = NULL;
	size_t ndevs = 0, nspaces = 0;
	for (;; ndevs++) {
		struct butter_device_info dev, *v = NULL;
		ret = butter_get_device(fs, ndevs, &dev);
		if (ret == -ENOENT)
			break;
		if (ret == 0) {
			v = realloc(devs, (ndevs + 1) * sizeof(*v));
			if (!v)
				ret = -ENOMEM;
		}
		if (ret < 0) {
			cli_error("%s: reading device list: %s", image, strerror(-ret));
			status = CLI_EXIT_ERROR;
			break;
		}
		devs = v;
		devs[ndevs] = dev;
	}
	qsort(devs, ndevs, sizeof(*devs), devid_cmp);
	for (;; nspaces++) {
		struct butter_space_info sp, *v = NULL;
		ret = butter_get_space(fs, nspaces, &sp);
		if (ret == -ENOENT)
			break;
		if (ret == 0) {
			v = realloc(spaces, (nspaces + 1) * sizeof(*v));
			if (!v)
				ret = -ENOMEM;
		}
		if (ret < 0) {
			cli_error("%s: reading chunk profiles: %s", image, strerror(-ret));
			status = CLI_EXIT_ERROR;
			break;
		}
		spaces = v;
		spaces[nspaces] = sp;
	}
	if (status != CLI_EXIT_OK) {
		/* said above */
	} else if (cli_json) {
		print_json(&info, devs, ndevs, spaces, nspaces);
	} else {
		printf("Label:           %s\n", info.label[0] ? info.label : "(none)");
		printf("UUID:            %s\n", cli_uuid(u, info.fsid));
		if (memcmp(info.metadata_uuid, info.fsid, 16) != 0 &&
		    memcmp(info.metadata_uuid, (uint8_t[16]){ 0 }, 16) != 0)
			printf("Metadata UUID:   %s\n", cli_uuid(u, info.metadata_uuid));
		printf("Generation:      %" PRIu64 "\n", info.generation);
		printf("Total bytes:     %s\n", cli_size(a, sizeof(a), info.total_bytes, raw));
		printf("Bytes used:      %s\n", cli_size(a, sizeof(a), info.bytes_used, raw));
		printf("Sector size:     %" PRIu32 "\n", info.sectorsize);
		printf("Node size:       %" PRIu32 "\n", info.nodesize);
		printf("Checksum:        %s\n", info.csum_name ? info.csum_name : "unknown");
		printf("Default subvol:  %" PRIu64 "\n", info.default_subvol);
		printf("Features:\n");
		print_features("compat:", 0, info.compat_flags);
		print_features("compat_ro:", 1, info.compat_ro_flags);
		print_features("incompat:", 2, info.incompat_flags);
		printf("Devices:         %" PRIu64 "\n", info.num_devices);
		for (size_t i = 0; i < ndevs; i++)
			printf("  devid %4" PRIu64 " size %s used %s path %s\n", devs[i].devid,
			       cli_size(a, sizeof(a), devs[i].total_bytes, raw),
			       cli_size(b, sizeof(b), devs[i].bytes_used, raw),
			       devs[i].path ? devs[i].path : "MISSING");
		printf("Space:\n");
		for (size_t i = 0; i < nspaces; i++)
			cli_print_space("  ", spaces[i].flags, spaces[i].total, spaces[i].used,
					&(struct cli_units){ raw ? -1 : 0, false }, NULL);
	}
	free(devs);
	free(spaces);

out:
	butter_close(fs);
	free(args.devices);
	return cli_finish_stdout(status);
}
