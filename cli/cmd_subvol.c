/*
 * cmd_subvol.c — `butter subvolume list|create|snapshot|delete` on an image
 * file, or (without IMAGE) on paths inside a live `butter mount` (control.c);
 * `subvolume show|get-default|set-default` on an image, printing what
 * btrfs-progs prints.
 * list prints one line per subvolume in the format of `btrfs subvolume
 * list`, with the same optional columns (-c, -q, -R, -u) in the same order,
 * plus -f for a read-only marker.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <butter/control.h>

#include "cli.h"
#include "copyin.h"

#define ROOT_SUBVOL_RDONLY 0x1ull /* BTRFS_ROOT_SUBVOL_RDONLY */

struct list_opts {
	bool readonly_only, flags, uuid, parent_uuid, received_uuid, cgen, parent, snapshots, table;
	bool all; /* -a: a nested subvolume's path from "<FS_TREE>/", as progs */
	int count; /* --format json: items printed so far */
};

static const uint8_t zero_uuid[16];

/* A uuid column: "-" for none, padded to a uuid's width, as progs. */
static const char *uuid_text(char u[37], const uint8_t uuid[16])
{
	return memcmp(uuid, zero_uuid, 16) ? cli_uuid(u, uuid) : "-                                   ";
}

/* The table header (-t): each present column's name, then a line of dashes. */
static void print_table_header(const struct list_opts *o)
{
	const char *cols[10];
	int n = 0;

	cols[n++] = "ID";
	cols[n++] = "gen";
	if (o->cgen || o->snapshots)
		cols[n++] = "cgen";
	if (o->parent)
		cols[n++] = "parent";
	cols[n++] = "top level";
	if (o->snapshots)
		cols[n++] = "otime";
	if (o->parent_uuid)
		cols[n++] = "parent_uuid";
	if (o->received_uuid)
		cols[n++] = "received_uuid";
	if (o->uuid)
		cols[n++] = "uuid";
	cols[n++] = "path";
	for (int i = 0; i < n; i++)
		printf("%s\t", cols[i]);
	printf("\n");
	for (int i = 0; i < n; i++) {
		for (size_t k = 0; k < strlen(cols[i]); k++)
			putchar('-');
		putchar('\t');
	}
	printf("\n");
}

/*
 * One subvolume as `btrfs subvolume list` prints it: its columns in progs'
 * order (ID, gen, cgen, parent, top level, otime, parent_uuid,
 * received_uuid, uuid, path), as "name value" pairs or (-t) a table row.
 */
static int print_subvol(void *arg, const struct butter_subvol_info *si)
{
	struct list_opts *o = arg;
	bool ro = si->flags & ROOT_SUBVOL_RDONLY, t = o->table;
	char u[37], when[32] = "-";
	struct tm tm;
	time_t sec = si->otime.tv_sec;

	if (o->readonly_only && !ro)
		return 0;
	if (o->snapshots && !memcmp(si->parent_uuid, zero_uuid, 16))
		return 0;
	if (sec && localtime_r(&sec, &tm))
		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
	if (cli_json) {
		/* every column, whatever the options; README, "JSON" */
		char p[37], r[37];
		const char *path = si->path;
		char *full = NULL;

		if (o->all && si->parent_id != 5 && asprintf(&full, "<FS_TREE>/%s", si->path) >= 0)
			path = full;
		cli_json_item_begin(o->count++ == 0);
		cli_json_member_u64("ID", si->id, false);
		cli_json_member_u64("gen", si->generation, false);
		cli_json_member_u64("cgen", si->otransid, false);
		cli_json_member_u64("parent", si->parent_id, false);
		cli_json_member_u64("top level", si->parent_id, false);
		cli_json_member("otime", when, false);
		cli_json_member("parent_uuid", memcmp(si->parent_uuid, zero_uuid, 16)
						       ? cli_uuid(p, si->parent_uuid) : "-", false);
		cli_json_member("received_uuid", memcmp(si->received_uuid, zero_uuid, 16)
							 ? cli_uuid(r, si->received_uuid) : "-", false);
		cli_json_member("uuid", memcmp(si->uuid, zero_uuid, 16) ? cli_uuid(u, si->uuid) : "-",
				false);
		cli_json_member("flags", ro ? "ro" : "-", false);
		cli_json_member("path", path, true);
		cli_json_item_end();
		free(full);
		return 0;
	}
	printf(t ? "%" PRIu64 "\t%" PRIu64 "\t" : "ID %" PRIu64 " gen %" PRIu64, si->id,
	       si->generation);
	if (o->cgen || o->snapshots)
		printf(t ? "%" PRIu64 "\t" : " cgen %" PRIu64, si->otransid);
	if (o->parent)
		printf(t ? "%" PRIu64 "\t" : " parent %" PRIu64, si->parent_id);
	printf(t ? "%" PRIu64 "\t\t" : " top level %" PRIu64, si->parent_id);
	if (o->snapshots)
		printf(t ? "%s\t" : " otime %s", when);
	if (o->parent_uuid)
		printf(t ? "%s\t" : " parent_uuid %s", uuid_text(u, si->parent_uuid));
	if (o->received_uuid)
		printf(t ? "%s\t" : " received_uuid %s", uuid_text(u, si->received_uuid));
	if (o->uuid)
		printf(t ? "%s\t" : " uuid %s", uuid_text(u, si->uuid));
	if (o->flags && !t)
		printf(" flags %s", ro ? "ro" : "-");
	printf(t ? "%s%s\n" : " path %s%s\n", o->all && si->parent_id != 5 ? "<FS_TREE>/" : "",
	       si->path);
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

	while ((c = cli_getopt(&args, argc, argv, ":hrfuqRcpastgo", longopts)) != -1) {
		switch (c) {
		case 'r': o.readonly_only = true; break;
		case 'f': o.flags = true; break;
		case 'u': o.uuid = true; break;
		case 'q': o.parent_uuid = true; break;
		case 'R': o.received_uuid = true; break;
		case 'c': o.cgen = true; break;
		case 'p': o.parent = true; break;
		case 's': o.snapshots = true; break;
		case 't': o.table = true; break;
		case 'a': o.all = true; break;
		/* -o: paths are from the top level already; -g: gen is always shown */
		case 'o': case 'g': break;
		}
	}
	if (optind >= argc)
		return cli_usage_error(cmd, "missing IMAGE");
	if (argc - optind > 1)
		return cli_usage_error(cmd, "too many arguments");
	const char *image = argv[optind];

	if (cli_json)
		o.table = false;
	if (cli_is_mount_path(image, &args)) {
		free(args.devices);
		if (o.table)
			print_table_header(&o);
		if (cli_json)
			cli_json_begin("subvolume-list");
		int st = ctl_subvol_list(image, print_subvol, &o);

		if (cli_json && st == CLI_EXIT_OK)
			cli_json_end(o.count > 0);
		return st;
	}

	struct butter_fs *fs;
	if (cli_open(&args, image, &fs) < 0) {
		free(args.devices);
		return CLI_EXIT_ERROR;
	}
	int status = CLI_EXIT_OK;
	if (o.table)
		print_table_header(&o);
	if (cli_json)
		cli_json_begin("subvolume-list");
	int ret = butter_subvol_list(fs, print_subvol, &o);
	if (ret < 0) {
		cli_error("%s: listing subvolumes: %s", image, strerror(-ret));
		status = CLI_EXIT_ERROR;
	} else if (cli_json) {
		cli_json_end(o.count > 0);
	}
	butter_close(fs);
	free(args.devices);
	return cli_finish_stdout(status);
}

/*
 * Split @path (inside the image) into its parent directory, resolved, and
 * its last component (pointing into @copy, which the caller frees).
 * Returns 0, or prints the problem and returns -1.
 */
static int resolve_parent(struct butter_fs *fs, const char *path, char **copy, butter_ino_t *dir,
			  const char **name)
{
	char *slash, *c;
	int ret;

	if (cli_split_subvol_path(path, copy, name, &slash))
		return -1;
	c = *copy;
	if (slash) {
		*slash = '\0';
		ret = butter_resolve(fs, *c ? c : "/", dir);
	} else {
		ret = butter_root(fs, 5, dir);
	}
	if (ret < 0) {
		cli_error("%s: %s", path, strerror(-ret));
		return -1;
	}
	return 0;
}

/* The common part of create, snapshot and delete: IMAGE and PATH(s) after the options. */
static int subvol_edit(const struct cli_command *cmd, int argc, char **argv, int readonly)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "readonly", no_argument, NULL, 'r' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	int is_snapshot = !strcmp(cmd->name, "subvolume snapshot");
	int is_delete = !strcmp(cmd->name, "subvolume delete");
	int npaths = is_snapshot ? 2 : 1, c, ret, status = CLI_EXIT_ERROR;
	const char *target = NULL, *name = NULL;
	struct butter_fs *fs = NULL;
	char *copy = NULL;
	butter_ino_t dir, src;
	uint64_t id = 0;

	while ((c = cli_getopt(&args, argc, argv, is_snapshot ? ":hr" : ":h", longopts)) != -1)
		if (c == 'r')
			readonly = 1;
	if (argc - optind == npaths && args.ndevices == 0) {
		/* no IMAGE: paths inside a live `butter mount` */
		free(args.devices);
		return ctl_subvol(is_delete ? "delete" : "create", is_snapshot ? argv[optind] : NULL,
				  argv[optind + npaths - 1], readonly);
	}
	if (argc - optind != 1 + npaths) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < npaths ? "missing arguments"
								   : "too many arguments");
	}
	target = argv[optind + npaths];
	if (copyin_open_rw(argv[optind], args.devices, args.ndevices, &fs) < 0)
		goto out;
	if (resolve_parent(fs, target, &copy, &dir, &name) < 0)
		goto out;
	if (is_snapshot) {
		ret = butter_resolve(fs, argv[optind + 1], &src);
		if (ret == 0 && src.ino != BUTTER_SUBVOL_ROOT_INO)
			ret = -EINVAL;
		if (ret < 0) {
			cli_error("%s: %s", argv[optind + 1],
				  ret == -EINVAL ? "not a subvolume" : strerror(-ret));
			goto out;
		}
		ret = butter_snapshot(fs, src.subvol, dir, name, strlen(name),
				      readonly ? BUTTER_SNAPSHOT_RDONLY : 0, &id);
	} else if (is_delete) {
		ret = butter_subvol_delete(fs, dir, name, strlen(name));
	} else {
		ret = butter_subvol_create(fs, dir, name, strlen(name), &id);
	}
	if (ret < 0) {
		cli_error("%s: %s", target,
			  ret == -EINVAL && is_delete ? "not a subvolume" : strerror(-ret));
		goto out;
	}
	if (is_snapshot)
		printf("Create %ssnapshot of '%s' in '%s' (id %llu)\n", readonly ? "a readonly " : "",
		       argv[optind + 1], target, (unsigned long long)id);
	else if (is_delete)
		printf("Delete subvolume '%s'\n", target);
	else
		printf("Create subvolume '%s' (id %llu)\n", target, (unsigned long long)id);
	status = CLI_EXIT_OK;
out:
	if (fs)
		butter_close(fs);
	free(copy);
	free(args.devices);
	return status;
}

/* butter subvolume create [--device DEV]... IMAGE PATH */
int cmd_subvolume_create(const struct cli_command *cmd, int argc, char **argv)
{
	return subvol_edit(cmd, argc, argv, 0);
}

/* butter subvolume snapshot [-r] [--device DEV]... IMAGE SOURCE PATH */
int cmd_subvolume_snapshot(const struct cli_command *cmd, int argc, char **argv)
{
	return subvol_edit(cmd, argc, argv, 0);
}

/* butter subvolume delete [--device DEV]... IMAGE PATH */
int cmd_subvolume_delete(const struct cli_command *cmd, int argc, char **argv)
{
	return subvol_edit(cmd, argc, argv, 0);
}

/* butter filesystem df|show|sync|label IMAGE|PATH [LABEL] */
int cmd_filesystem(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		CLI_UNITS_LONGOPTS,
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	const char *what = cmd->name + strlen("filesystem "), *target, *label = NULL;
	struct cli_units units = { 0, false };
	bool df = !strcmp(what, "df"), show = !strcmp(what, "show"); /* the commands with units */
	struct butter_info bi;
	struct butter_fs *fs;
	int c, ret, status = CLI_EXIT_OK;
	int nmax = !strcmp(what, "label") ? 2 : 1;

	if (df) /* as in btrfs-progs' df, -h is human-readable there */
		cli_units_fix_h(argc, argv);
	/* df takes progs' short unit options too; show only the long ones (as progs) */
	while ((c = cli_getopt(&args, argc, argv, df ? ":h" CLI_UNITS_SHORTOPTS : ":h", longopts)) != -1)
		if (!(df || show) || !cli_units_option(&units, c))
			return cli_usage_error(cmd, "unknown option");
	if (argc - optind < 1 || argc - optind > nmax) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 1 ? "missing IMAGE or PATH"
							      : "too many arguments");
	}
	target = argv[optind];
	if (argc - optind == 2)
		label = argv[optind + 1];
	if (cli_is_mount_path(target, &args)) {
		free(args.devices);
		return ctl_filesystem(what, target, label, &units);
	}
	if (!strcmp(what, "sync")) {
		free(args.devices);
		return CLI_EXIT_OK; /* an image is consistent whenever no one has it open */
	}
	if (label) {
		if (copyin_open_rw(target, args.devices, args.ndevices, &fs) < 0) {
			free(args.devices);
			return CLI_EXIT_ERROR;
		}
		ret = butter_set_label(fs, label);
		if (ret < 0) {
			cli_error("%s: setting the label: %s", target, strerror(-ret));
			status = CLI_EXIT_ERROR;
		}
		butter_close(fs);
		free(args.devices);
		return status;
	}
	if (cli_open(&args, target, &fs) < 0) {
		free(args.devices);
		return CLI_EXIT_ERROR;
	}
	ret = butter_get_info(fs, &bi);
	if (ret == 0 && !strcmp(what, "label")) {
		printf("%s\n", bi.label);
	} else if (ret == 0 && !strcmp(what, "show")) {
		/* as `btrfs filesystem show IMAGE` prints it */
		char u[37], a[32], b2[32], *real;
		bool missing = false;

		if (bi.label[0])
			printf("Label: '%s'  uuid: %s\n", bi.label, cli_uuid(u, bi.fsid));
		else
			printf("Label: none  uuid: %s\n", cli_uuid(u, bi.fsid));
		printf("\tTotal devices %" PRIu64 " FS bytes used %s\n", bi.num_devices,
		       cli_size_units(a, sizeof(a), bi.bytes_used, &units));
		for (size_t i = 0;; i++) {
			struct butter_device_info di;

			if (butter_get_device(fs, i, &di) < 0)
				break;
			if (!di.path) {
				missing = true;
				continue;
			}
			real = realpath(di.path, NULL);
			printf("\tdevid %4" PRIu64 " size %s used %s path %s\n", di.devid,
			       cli_size_units(a, sizeof(a), di.total_bytes, &units),
			       cli_size_units(b2, sizeof(b2), di.bytes_used, &units), real ? real : di.path);
			free(real);
		}
		if (missing)
			printf("\t*** Some devices missing\n");
		printf("\n");
	} else if (ret == 0) {
		int count = 0;

		if (cli_json)
			cli_json_begin("filesystem-df");
		for (size_t i = 0;; i++) {
			struct butter_space_info sp;

			ret = butter_get_space(fs, i, &sp);
			if (ret < 0)
				break;
			cli_print_space("", sp.flags, sp.total, sp.used, &units, &count);
		}
		if (cli_json)
			cli_json_end(count > 0);
		if (ret == -ENOENT)
			ret = 0;
	}
	if (ret < 0) {
		cli_error("%s: %s", target, strerror(-ret));
		status = CLI_EXIT_ERROR;
	}
	butter_close(fs);
	free(args.devices);
	return cli_finish_stdout(status);
}

/* ---- show, get-default, set-default ---- */

/* A root item time as btrfs-progs prints it: local time with its offset, "-" for none. */
static void print_time(const char *label, const struct timespec *t)
{
	char buf[64];
	struct tm tm;
	time_t sec = t->tv_sec;

	if (sec == 0 || !localtime_r(&sec, &tm) || !strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S %z", &tm))
		strcpy(buf, "-");
	printf("\t%s%s\n", label, buf);
}

static void print_uuid_line(const char *label, const uint8_t uuid[16])
{
	static const uint8_t zero[16];
	char u[37];

	printf("\t%s%s\n", label, memcmp(uuid, zero, 16) ? cli_uuid(u, uuid) : "-");
}

struct snapshots_of {
	const uint8_t *uuid;
};

static int print_if_snapshot(void *arg, const struct butter_subvol_info *si)
{
	const struct snapshots_of *s = arg;

	if (!memcmp(si->parent_uuid, s->uuid, 16))
		printf("\t\t\t\t%s\n", si->path);
	return 0;
}

/* The id of the subvolume whose root directory is @path in @fs, into *@id; -1 after a message. */
static int subvol_root_id(struct butter_fs *fs, const char *path, uint64_t *id)
{
	butter_ino_t ino;
	int ret = butter_resolve(fs, path, &ino);

	if (ret == 0 && ino.ino != BUTTER_SUBVOL_ROOT_INO)
		ret = -EINVAL;
	if (ret < 0) {
		cli_error("%s: %s", path, ret == -EINVAL ? "not a subvolume" : strerror(-ret));
		return -1;
	}
	*id = ino.subvol;
	return 0;
}

/*
 * `butter subvolume show [-r ID] IMAGE [PATH]`: what `btrfs subvolume show`
 * prints of the subvolume whose root is PATH (or of id ID), in its layout.
 */
/* What `btrfs subvolume show` prints of @si, up to the "Snapshot(s):" line. */
static void print_show(const struct butter_subvol_info *si)
{
	if (si->id == 5) {
		printf("/\n\tName: \t\t\t<FS_TREE>\n");
	} else {
		const char *slash = strrchr(si->path, '/');

		printf("%s\n\tName: \t\t\t%s\n", si->path, slash ? slash + 1 : si->path);
	}
	print_uuid_line("UUID: \t\t\t", si->uuid);
	print_uuid_line("Parent UUID: \t\t", si->parent_uuid);
	print_uuid_line("Received UUID: \t\t", si->received_uuid);
	print_time("Creation time: \t\t", &si->otime);
	printf("\tSubvolume ID: \t\t%" PRIu64 "\n", si->id);
	printf("\tGeneration: \t\t%" PRIu64 "\n", si->generation);
	printf("\tGen at creation: \t%" PRIu64 "\n", si->otransid);
	printf("\tParent ID: \t\t%" PRIu64 "\n", si->parent_id);
	printf("\tTop level ID: \t\t%" PRIu64 "\n", si->parent_id);
	printf("\tFlags: \t\t\t%s\n", (si->flags & ROOT_SUBVOL_RDONLY) ? "readonly" : "-");
	printf("\tSend transid: \t\t%" PRIu64 "\n", si->stransid);
	/* btrfs-progs prints the creation time here (its stime string is never shown): so do we */
	print_time("Send time: \t\t", &si->otime);
	printf("\tReceive transid: \t%" PRIu64 "\n", si->rtransid);
	print_time("Receive time: \t\t", &si->rtime);
	printf("\tSnapshot(s):\n");
}

/*
 * A subvolume of the live mount holding @path (@id 0: the one @path is the
 * root of, else -EINVAL "not a subvolume"), with the default's id. 0, or -1
 * after a message.
 */
static int ctl_subvol_get(const char *path, uint64_t id, struct butter_ioc_subvol_get *g)
{
	struct butter_ioc_info info;
	int fd = ctl_open(path, &info), ret = 0;

	if (fd < 0)
		return -1;
	if (id == 0 && info.ino != BUTTER_SUBVOL_ROOT_INO) {
		cli_error("%s: not a subvolume", path);
		close(fd);
		return -1;
	}
	memset(g, 0, sizeof(*g));
	g->id = id;
	if (ioctl(fd, BUTTER_IOC_SUBVOL_GET, g) < 0) {
		cli_error("%s: subvolume %" PRIu64 ": %s", path, id, strerror(errno));
		ret = -1;
	}
	close(fd);
	return ret;
}

/*
 * `butter subvolume show [-r ID] IMAGE [PATH]`, or `show [-r ID] PATH` on a
 * live mount: what `btrfs subvolume show` prints of the subvolume whose root
 * is PATH (or of id ID), in its layout.
 */
int cmd_subvolume_show(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "rootid", required_argument, NULL, 'r' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_subvol_info si;
	struct snapshots_of snaps;
	struct butter_fs *fs = NULL;
	uint64_t id = 0;
	int c, ret, status = CLI_EXIT_ERROR;
	const char *image, *path;
	struct stat st;
	char *end;

	while ((c = cli_getopt(&args, argc, argv, ":hr:", longopts)) != -1) {
		if (c == 'r') {
			errno = 0;
			id = strtoull(optarg, &end, 10);
			if (errno || *end || !*optarg || id == 0) {
				free(args.devices);
				return cli_usage_error(cmd, "-r takes a subvolume id");
			}
		}
	}
	if (argc - optind == 1 && stat(argv[optind], &st) == 0 && S_ISDIR(st.st_mode) &&
	    args.ndevices == 0) {
		/* a path inside a live `butter mount` */
		struct butter_ioc_subvol_get *g = malloc(sizeof(*g));

		free(args.devices);
		if (!g || ctl_subvol_get(argv[optind], id, g) < 0) {
			free(g);
			return CLI_EXIT_ERROR;
		}
		print_show(&g->info);
		snaps.uuid = g->info.uuid;
		status = ctl_subvol_list(argv[optind], print_if_snapshot, &snaps);
		free(g);
		return status;
	}
	if (argc - optind != (id ? 1 : 2)) {
		free(args.devices);
		return cli_usage_error(cmd, id ? "IMAGE only, with -r" : "IMAGE and PATH needed");
	}
	image = argv[optind];
	path = id ? NULL : argv[optind + 1];
	if (cli_open(&args, image, &fs) < 0)
		goto out;
	if (path && subvol_root_id(fs, path, &id) < 0)
		goto out;
	ret = butter_subvol_get(fs, id, &si);
	if (ret < 0) {
		cli_error("subvolume %" PRIu64 ": %s", id, strerror(-ret));
		goto out;
	}
	print_show(&si);
	snaps.uuid = si.uuid;
	ret = butter_subvol_list(fs, print_if_snapshot, &snaps);
	if (ret < 0) {
		cli_error("%s: listing subvolumes: %s", image, strerror(-ret));
		goto out;
	}
	status = CLI_EXIT_OK;
out:
	if (fs)
		butter_close(fs);
	free(args.devices);
	return status == CLI_EXIT_OK ? cli_finish_stdout(status) : status;
}

/* `butter subvolume get-default IMAGE`: as `btrfs subvolume get-default` prints it. */
int cmd_subvolume_get_default(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_subvol_info si;
	struct butter_info info;
	struct butter_fs *fs = NULL;
	int ret, status = CLI_EXIT_ERROR;

	while (cli_getopt(&args, argc, argv, ":h", longopts) != -1)
		;
	if (argc - optind != 1) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 1 ? "missing IMAGE" : "too many arguments");
	}
	if (cli_is_mount_path(argv[optind], &args)) {
		/* a path inside a live `butter mount`: ask for the default's id, then for it */
		struct butter_ioc_subvol_get *g = malloc(sizeof(*g));

		free(args.devices);
		ret = g ? ctl_subvol_get(argv[optind], 5, g) : -1;
		if (ret == 0 && g->default_id != 5)
			ret = ctl_subvol_get(argv[optind], g->default_id, g);
		if (ret == 0 && g->info.id == 5)
			printf("ID 5 (FS_TREE)\n");
		else if (ret == 0)
			printf("ID %" PRIu64 " gen %" PRIu64 " top level %" PRIu64 " path %s\n",
			       g->info.id, g->info.generation, g->info.parent_id, g->info.path);
		free(g);
		return ret == 0 ? cli_finish_stdout(CLI_EXIT_OK) : CLI_EXIT_ERROR;
	}
	if (cli_open(&args, argv[optind], &fs) < 0)
		goto out;
	ret = butter_get_info(fs, &info);
	if (ret == 0 && info.default_subvol != 5)
		ret = butter_subvol_get(fs, info.default_subvol, &si);
	if (ret < 0) {
		cli_error("%s: %s", argv[optind], strerror(-ret));
		goto out;
	}
	if (info.default_subvol == 5)
		printf("ID 5 (FS_TREE)\n");
	else
		printf("ID %" PRIu64 " gen %" PRIu64 " top level %" PRIu64 " path %s\n", si.id,
		       si.generation, si.parent_id, si.path);
	status = CLI_EXIT_OK;
out:
	if (fs)
		butter_close(fs);
	free(args.devices);
	return status == CLI_EXIT_OK ? cli_finish_stdout(status) : status;
}

/* `butter subvolume set-default IMAGE ID|PATH`: the subvolume a mount shows without subvol=. */
int cmd_subvolume_set_default(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_fs *fs = NULL;
	const char *what, *last;
	struct stat st;
	uint64_t id;
	char *end;
	int ret, status = CLI_EXIT_ERROR;

	while (cli_getopt(&args, argc, argv, ":h", longopts) != -1)
		;
	last = argc > optind ? argv[argc - 1] : "";
	/* the mount forms: one directory, or an id (not an image file's name) and a directory */
	if ((argc - optind == 1 ||
	     (argc - optind == 2 && argv[optind][strspn(argv[optind], "0123456789")] == '\0' &&
	      stat(argv[optind], &st) != 0)) &&
	    cli_is_mount_path(last, &args)) {
		/* on a live mount, as btrfs-progs: `set-default ID PATH` or `set-default SUBVOL-PATH` */
		struct butter_ioc_subvol_set set = { .what = BUTTER_SUBVOL_SET_DEFAULT };
		struct butter_ioc_info info;
		int fd;

		free(args.devices);
		if (argc - optind == 2) {
			errno = 0;
			set.id = strtoull(argv[optind], &end, 10);
			if (errno || *end || !*argv[optind])
				return cli_usage_error(cmd, "set-default ID PATH: ID is a number");
			if (set.id == 0)
				set.id = 5;
		}
		if ((fd = ctl_open(last, &info)) < 0)
			return CLI_EXIT_ERROR;
		if (argc - optind == 1 && info.ino != BUTTER_SUBVOL_ROOT_INO) {
			cli_error("%s: not a subvolume", last);
			close(fd);
			return CLI_EXIT_ERROR;
		}
		ret = ioctl(fd, BUTTER_IOC_SUBVOL_SET, &set) < 0 ? -errno : 0;
		close(fd);
		if (ret < 0)
			cli_error("%s: subvolume %s: %s", last, argc - optind == 2 ? argv[optind] : last,
				  ret == -ENOENT ? "no such subvolume" : strerror(-ret));
		return ret < 0 ? CLI_EXIT_ERROR : CLI_EXIT_OK;
	}
	if (argc - optind != 2) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 2 ? "IMAGE and ID or PATH needed"
							      : "too many arguments");
	}
	what = argv[optind + 1];
	if (copyin_open_rw(argv[optind], args.devices, args.ndevices, &fs) < 0)
		goto out;
	errno = 0;
	id = strtoull(what, &end, 10);
	/* not a number: the path of a subvolume inside the image */
	if ((errno || *end || !*what) && subvol_root_id(fs, what, &id) < 0)
		goto out;
	ret = butter_subvol_set_default(fs, id);
	if (ret < 0) {
		cli_error("%s: subvolume %s: %s", argv[optind], what,
			  ret == -ENOENT ? "no such subvolume" : strerror(-ret));
		goto out;
	}
	status = CLI_EXIT_OK;
out:
	if (fs)
		butter_close(fs); /* the change committed itself */
	free(args.devices);
	return status;
}
