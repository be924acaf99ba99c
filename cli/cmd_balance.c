/*
 * cmd_balance.c — the commands that move what is on disk, in btrfs-progs'
 * grammar: `butter balance start|status|pause|cancel|resume` (filters and
 * conversion), `butter device remove|delete`, `butter replace start|status|cancel`,
 * `butter filesystem resize`. On an image they open it read-write and call
 * the library (butter_balance(), butter_device_remove(), butter_replace(),
 * butter_device_resize()); balance on a directory inside a live `butter
 * mount` asks the daemon through BUTTER_IOC_BALANCE (control.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/fs.h>

#include <butter/control.h>

#include "cli.h"
#include "copyin.h"

static const struct {
	const char *name;
	uint64_t bits;
} profiles[] = {
	{ "single", BUTTER_PROFILE_SINGLE },
	{ "raid0", 1ULL << 3 },
	{ "raid1", 1ULL << 4 },
	{ "dup", 1ULL << 5 },
	{ "raid10", 1ULL << 6 },
	{ "raid5", 1ULL << 7 },
	{ "raid6", 1ULL << 8 },
	{ "raid1c3", 1ULL << 9 },
	{ "raid1c4", 1ULL << 10 },
};

static int parse_profile(const char *s, size_t len, uint64_t *bits)
{
	for (size_t i = 0; i < sizeof(profiles) / sizeof(profiles[0]); i++) {
		if (strlen(profiles[i].name) == len && strncasecmp(s, profiles[i].name, len) == 0) {
			*bits = profiles[i].bits;
			return 0;
		}
	}
	return -EINVAL;
}

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;

	if (!*s)
		return -EINVAL;
	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno || *end ? -EINVAL : 0;
}

/* "N", "N..", "..M" or "N..M" (sizes allowed with @sizes); open ends stay as given. */
static int parse_range(const char *s, bool sizes, uint64_t *lo, uint64_t *hi)
{
	const char *dots = strstr(s, "..");
	char a[64], b[64];
	int ret = 0;

	if (!dots) {
		ret = sizes ? cli_parse_size(s, lo) : parse_u64(s, lo);
		*hi = *lo;
		return ret;
	}
	if ((size_t)(dots - s) >= sizeof(a) || strlen(dots + 2) >= sizeof(b))
		return -EINVAL;
	memcpy(a, s, (size_t)(dots - s));
	a[dots - s] = '\0';
	strcpy(b, dots + 2);
	if (a[0])
		ret = sizes ? cli_parse_size(a, lo) : parse_u64(a, lo);
	if (ret == 0 && b[0])
		ret = sizes ? cli_parse_size(b, hi) : parse_u64(b, hi);
	return ret;
}

/* Parse "usage=50,convert=raid1,soft,..." into @f; -EINVAL after printing why. */
static int parse_filters(const char *kind, const char *spec, struct butter_balance_filter *f)
{
	char *copy = strdup(spec ? spec : ""), *save = NULL, *tok;
	int ret = 0;

	if (!copy)
		return -ENOMEM;
	for (tok = strtok_r(copy, ",", &save); tok && ret == 0; tok = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(tok, '=');
		const char *val = eq ? eq + 1 : NULL;
		uint64_t lo = 0, hi = UINT64_MAX;

		if (eq)
			*eq = '\0';
		if (strcmp(tok, "soft") == 0 && !val) {
			f->flags |= BUTTER_BALANCE_F_SOFT;
		} else if (!val) {
			ret = -EINVAL;
		} else if (strcmp(tok, "usage") == 0) {
			ret = parse_range(val, false, &lo, &hi);
			if (ret == 0 && !strstr(val, "..")) {
				hi = lo;
				lo = 0;
			}
			if (ret == 0 && hi == UINT64_MAX)
				hi = 101;
			if (ret == 0 && (lo > 100 || (hi > 100 && hi != 101)))
				ret = -EINVAL; /* as the kernel: min included, max excluded */
			f->flags |= BUTTER_BALANCE_F_USAGE;
			f->usage_min = (uint32_t)lo;
			f->usage_max = (uint32_t)hi;
		} else if (strcmp(tok, "devid") == 0) {
			ret = parse_u64(val, &f->devid);
			f->flags |= BUTTER_BALANCE_F_DEVID;
		} else if (strcmp(tok, "drange") == 0) {
			ret = parse_range(val, true, &lo, &hi);
			f->flags |= BUTTER_BALANCE_F_DRANGE;
			f->pstart = lo;
			f->pend = hi;
		} else if (strcmp(tok, "vrange") == 0) {
			ret = parse_range(val, true, &lo, &hi);
			f->flags |= BUTTER_BALANCE_F_VRANGE;
			f->vstart = lo;
			f->vend = hi;
		} else if (strcmp(tok, "limit") == 0) {
			ret = parse_range(val, false, &lo, &hi);
			if (ret == 0 && !strstr(val, ".."))
				lo = 0;
			f->flags |= BUTTER_BALANCE_F_LIMIT;
			f->limit_min = lo > UINT32_MAX ? UINT32_MAX : (uint32_t)lo;
			f->limit_max = hi > UINT32_MAX ? UINT32_MAX : (uint32_t)hi;
		} else if (strcmp(tok, "stripes") == 0) {
			ret = parse_range(val, false, &lo, &hi);
			f->flags |= BUTTER_BALANCE_F_STRIPES;
			f->stripes_min = lo > UINT32_MAX ? UINT32_MAX : (uint32_t)lo;
			f->stripes_max = hi > UINT32_MAX ? UINT32_MAX : (uint32_t)hi;
		} else if (strcmp(tok, "convert") == 0) {
			ret = parse_profile(val, strlen(val), &f->target);
			f->flags |= BUTTER_BALANCE_F_CONVERT;
		} else if (strcmp(tok, "profiles") == 0) {
			const char *p = val;

			f->flags |= BUTTER_BALANCE_F_PROFILES;
			while (ret == 0 && *p) {
				size_t n = strcspn(p, "|");
				uint64_t bits = 0;

				ret = parse_profile(p, n, &bits);
				f->profiles |= bits;
				p += n + (p[n] == '|');
			}
		} else {
			ret = -EINVAL;
		}
		if (ret)
			cli_error("balance: bad %s filter '%s%s%s'", kind, tok, val ? "=" : "",
				  val ? val : "");
	}
	if (ret == 0 && (f->flags & BUTTER_BALANCE_F_DRANGE) && !(f->flags & BUTTER_BALANCE_F_DEVID)) {
		cli_error("balance: the %s filter drange needs devid", kind);
		ret = -EINVAL;
	}
	if (ret == 0 && (f->flags & BUTTER_BALANCE_F_SOFT) && !(f->flags & BUTTER_BALANCE_F_CONVERT)) {
		cli_error("balance: the %s filter soft needs convert", kind);
		ret = -EINVAL;
	}
	free(copy);
	return ret;
}

static void print_stats(const char *what, const struct butter_balance_stats *st)
{
	char size[32];

	if (!strcmp(what, "replace")) {
		printf("%s: %" PRIu64 " chunk%s copied, %s written\n", what, st->groups,
		       st->groups == 1 ? "" : "s", cli_size(size, sizeof(size), st->bytes, false));
		return;
	}
	printf("%s: %" PRIu64 " block group%s moved (%" PRIu64 " data extents, %" PRIu64
	       " tree blocks, %s of data)\n",
	       what, st->groups, st->groups == 1 ? "" : "s", st->data_extents, st->tree_blocks,
	       cli_size(size, sizeof(size), st->bytes, false));
}

/* One BUTTER_IOC_BALANCE command to the mount holding @path: 0 or -errno (-1: not a mount). */
static int ctl_balance(const char *path, uint32_t cmd, const struct butter_balance_args *args,
		       struct butter_ioc_balance *io)
{
	int fd = ctl_open(path, NULL), ret = 0;

	if (fd < 0)
		return -1;
	memset(io, 0, sizeof(*io));
	io->cmd = cmd;
	if (args)
		io->args = *args;
	if (ioctl(fd, BUTTER_IOC_BALANCE, io) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

static const char *balance_errstr(int err)
{
	if (err == -EINPROGRESS)
		return "a balance is running or recorded (paused or interrupted): resume or cancel it "
		       "first";
	if (err == -ENOTCONN)
		return "no balance is running";
	if (err == -ENOENT)
		return "no balance is recorded";
	return strerror(-err);
}

/*
 * Wait for the daemon's job on the mount at @path to end; print what it did.
 * Exit status: 1 when it failed, was paused or cancelled.
 */
static int mount_wait(const char *path, const char *what, struct butter_ioc_balance *io)
{
	struct cli_progress progress;
	int ret;

	/* a progress line on a terminal: groups moved (chunks copied, for a replace) */
	cli_progress_begin(&progress, what, 0, false);
	for (;;) {
		ret = ctl_balance(path, BUTTER_BALANCE_CMD_STATUS, NULL, io);
		if (ret < 0) {
			cli_progress_end(&progress);
			cli_error("%s: %s status: %s", path, what, ret == -1 ? "no mount" : strerror(-ret));
			return CLI_EXIT_ERROR;
		}
		progress.unit = io->job == BUTTER_DEVICE_CMD_REPLACE ? "chunks" : "block groups";
		progress.total = io->stats.groups + io->stats.left;
		cli_progress_update(&progress, io->stats.groups);
		if (!(io->state & BUTTER_BALANCE_STATE_RUNNING))
			break;
		usleep(200 * 1000);
	}
	cli_progress_end(&progress);
	print_stats(path, &io->stats);
	if (io->error) {
		cli_error("%s: %s: %s (the mount's log says more)", path, what, strerror(-io->error));
		return CLI_EXIT_ERROR;
	}
	if (io->state & (BUTTER_BALANCE_STATE_PAUSED | BUTTER_BALANCE_STATE_CANCELED)) {
		cli_error("%s: %s %s by user", path, what,
			  io->state & BUTTER_BALANCE_STATE_PAUSED ? "paused" : "canceled");
		return CLI_EXIT_ERROR;
	}
	return cli_finish_stdout(CLI_EXIT_OK);
}

/*
 * Device work on the mount at @path (BUTTER_IOC_DEVICE), waited for unless
 * @background. Exit status.
 */
static int mount_device(const char *path, const struct butter_ioc_device *dev, const char *what,
			bool background)
{
	struct butter_ioc_balance io;
	int fd = ctl_open(path, NULL), ret = 0;

	if (fd < 0)
		return CLI_EXIT_ERROR;
	if (ioctl(fd, BUTTER_IOC_DEVICE, dev) < 0)
		ret = -errno;
	close(fd);
	if (ret) {
		cli_error("%s: %s: %s", path, what, ret == -EINPROGRESS
				? "a balance or other device work runs on this mount; wait for it"
				: strerror(-ret));
		return CLI_EXIT_ERROR;
	}
	if (background)
		return cli_finish_stdout(CLI_EXIT_OK);
	return mount_wait(path, what, &io);
}

/* The devid on the mount at @path of @spec (a number, missing, or a member's path); 0 if none. */
static uint64_t mount_devid_of(const char *path, const char *spec)
{
	struct butter_ioc_dev_stats s;
	struct stat a, b;
	uint64_t id, found = 0;
	int fd;

	if (parse_u64(spec, &id) == 0)
		return id;
	if (strcmp(spec, "missing") && !butter_device_is_nbd(spec) && stat(spec, &a) < 0)
		return 0;
	fd = ctl_open(path, NULL);
	if (fd < 0)
		return 0;
	for (uint64_t idx = 0;; idx++) {
		memset(&s, 0, sizeof(s));
		s.idx = idx;
		if (ioctl(fd, BUTTER_IOC_DEV_STATS, &s) < 0)
			break;
		if (!strcmp(spec, "missing")) {
			if (!s.path[0])
				found = s.devid;
			continue;
		}
		if (butter_device_is_nbd(spec)) {
			if (!strcmp(s.path, spec))
				found = s.devid;
			continue;
		}
		if (!s.path[0] || stat(s.path, &b) < 0)
			continue;
		if (S_ISBLK(a.st_mode) ? S_ISBLK(b.st_mode) && a.st_rdev == b.st_rdev
				       : a.st_dev == b.st_dev && a.st_ino == b.st_ino)
			found = s.devid;
	}
	close(fd);
	return found;
}

/*
 * Start (or resume) the daemon's balance on the mount at @path; unless
 * @background, wait for it to end and print what it did. Exit status.
 */
static int mount_balance(const char *path, uint32_t cmd, const struct butter_balance_args *args,
			 bool background)
{
	struct butter_ioc_balance io;
	int ret = ctl_balance(path, cmd, args, &io);

	if (ret == -1)
		return CLI_EXIT_ERROR;
	if (ret < 0) {
		cli_error("%s: balance: %s", path, balance_errstr(ret));
		return CLI_EXIT_ERROR;
	}
	if (background) {
		printf("balance %s in the background on %s\n",
		       cmd == BUTTER_BALANCE_CMD_RESUME ? "resumed" : "started", path);
		return cli_finish_stdout(CLI_EXIT_OK);
	}
	return mount_wait(path, "balance", &io);
}

/* Run a balance on an image opened read-write; exit status. */
static int image_balance(const char *image, const struct cli_args *args,
			 const struct butter_balance_args *ba, bool quiet)
{
	struct butter_balance_stats st;
	struct cli_progress progress;
	uint64_t cursor = UINT64_MAX;
	struct butter_fs *fs;
	int ret;

	memset(&st, 0, sizeof(st));
	cli_open_flags |= BUTTER_OPEN_DEGRADED; /* restoring redundancy is what it is for */
	ret = copyin_open_rw(image, args->devices, args->ndevices, &fs);
	if (ret < 0)
		return CLI_EXIT_ERROR;
	/* group by group, for the progress line (butter_balance() is these steps) */
	cli_progress_begin(&progress, "balance", 0, quiet);
	progress.unit = "block groups";
	do {
		ret = butter_balance_step(fs, ba, &cursor, &st);
		progress.total = st.groups + st.left;
		cli_progress_update(&progress, st.groups);
	} while (ret == 0);
	cli_progress_end(&progress);
	if (ret == 1)
		ret = 0;
	if (ret < 0) {
		cli_error("%s: balance: %s", image, balance_errstr(ret));
		butter_close(fs);
		print_stats(image, &st);
		return CLI_EXIT_ERROR;
	}
	ret = butter_sync(fs);
	butter_close(fs);
	print_stats(image, &st);
	if (ret < 0) {
		cli_error("%s: closing: %s", image, strerror(-ret));
		return CLI_EXIT_ERROR;
	}
	return cli_finish_stdout(CLI_EXIT_OK);
}

int cmd_balance_start(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "data", optional_argument, NULL, 'd' },
		{ "metadata", optional_argument, NULL, 'm' },
		{ "system", optional_argument, NULL, 's' },
		{ "force", no_argument, NULL, 'f' },
		{ "full-balance", no_argument, NULL, 'F' },
		{ "background", no_argument, NULL, 'b' },
		{ "bg", no_argument, NULL, 'b' },
		{ "enqueue", no_argument, NULL, 'e' },
		{ "verbose", no_argument, NULL, 'v' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_balance_args ba;
	bool background = false, quiet = false;
	int c, ret;

	memset(&ba, 0, sizeof(ba));
	while ((c = cli_getopt(&args, argc, argv, ":hd::m::s::fvq", longopts)) != -1) {
		switch (c) {
		case 'd':
			ba.flags |= BUTTER_BALANCE_DATA;
			if (parse_filters("data", optarg, &ba.data))
				goto usage;
			break;
		case 'm':
			ba.flags |= BUTTER_BALANCE_METADATA;
			if (parse_filters("metadata", optarg, &ba.meta))
				goto usage;
			break;
		case 's':
			ba.flags |= BUTTER_BALANCE_SYSTEM;
			if (parse_filters("system", optarg, &ba.sys))
				goto usage;
			break;
		case 'f':
			ba.flags |= BUTTER_BALANCE_FORCE;
			break;
		case 'v':
			cli_log_level = BUTTER_LOG_INFO;
			break;
		case 'b':
			background = true;
			break;
		case 'q':
			quiet = true;
			break;
		default:
			break; /* --full-balance, --enqueue: accepted */
		}
	}
	if (argc - optind != 1) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 1 ? "missing IMAGE or PATH"
							     : "too many arguments");
	}
	if ((ba.flags & BUTTER_BALANCE_SYSTEM) && !(ba.flags & BUTTER_BALANCE_FORCE)) {
		free(args.devices);
		cli_error("balance: refusing to work on system chunks explicitly; add --force");
		return CLI_EXIT_USAGE;
	}
	if (!(ba.flags & (BUTTER_BALANCE_DATA | BUTTER_BALANCE_METADATA | BUTTER_BALANCE_SYSTEM)))
		ba.flags |= BUTTER_BALANCE_DATA | BUTTER_BALANCE_METADATA | BUTTER_BALANCE_SYSTEM;
	else if ((ba.flags & BUTTER_BALANCE_METADATA) && !(ba.flags & BUTTER_BALANCE_SYSTEM)) {
		/* as btrfs-progs: system chunks follow the metadata filters */
		ba.flags |= BUTTER_BALANCE_SYSTEM;
		ba.sys = ba.meta;
	}
	const char *image = argv[optind];

	if (cli_is_mount_path(image, &args))
		ret = mount_balance(image, BUTTER_BALANCE_CMD_START, &ba, background);
	else
		ret = image_balance(image, &args, &ba, quiet);
	free(args.devices);
	return ret;
usage:
	free(args.devices);
	return CLI_EXIT_USAGE;
}

static void print_filter(const char *kind, const struct butter_balance_filter *f)
{
	printf("  %s:", kind);
	if (f->flags & BUTTER_BALANCE_F_CONVERT)
		printf(" convert=%s%s", butter_profile_name(f->target & ~BUTTER_PROFILE_SINGLE),
		       f->flags & BUTTER_BALANCE_F_SOFT ? ",soft" : "");
	if (f->flags & BUTTER_BALANCE_F_USAGE)
		printf(" usage=%u..%u", f->usage_min, f->usage_max);
	if (f->flags & BUTTER_BALANCE_F_DEVID)
		printf(" devid=%" PRIu64, f->devid);
	if (f->flags & BUTTER_BALANCE_F_DRANGE)
		printf(" drange=%" PRIu64 "..%" PRIu64, f->pstart, f->pend);
	if (f->flags & BUTTER_BALANCE_F_VRANGE)
		printf(" vrange=%" PRIu64 "..%" PRIu64, f->vstart, f->vend);
	if (f->flags & BUTTER_BALANCE_F_LIMIT)
		printf(" limit=%u..%u", f->limit_min, f->limit_max);
	if (f->flags & BUTTER_BALANCE_F_STRIPES)
		printf(" stripes=%u..%u", f->stripes_min, f->stripes_max);
	if (!f->flags)
		printf(" (no filters)");
	printf("\n");
}

static void print_args(const struct butter_balance_args *a)
{
	if (a->flags & BUTTER_BALANCE_DATA)
		print_filter("data", &a->data);
	if (a->flags & BUTTER_BALANCE_METADATA)
		print_filter("metadata", &a->meta);
	if (a->flags & BUTTER_BALANCE_SYSTEM)
		print_filter("system", &a->sys);
}

/*
 * `butter balance status|pause|cancel|resume IMAGE|PATH` (cmd->name says
 * which). On a mount they ask the daemon; on an image status, cancel and
 * resume work on the balance recorded there (pause needs a running one).
 */
int cmd_balance_ctl(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "background", no_argument, NULL, 'b' },
		{ "bg", no_argument, NULL, 'b' },
		{ "verbose", no_argument, NULL, 'v' },
		{ 0 },
	};
	const char *what = strchr(cmd->name, ' ') + 1;
	struct cli_args args = { .cmd = cmd };
	struct butter_balance_args ba;
	struct butter_ioc_balance io;
	struct butter_fs *fs;
	bool background = false;
	int c, ret;

	while ((c = cli_getopt(&args, argc, argv, ":hbv", longopts)) != -1) {
		if (c == 'b')
			background = true;
		else if (c == 'v')
			cli_log_level = BUTTER_LOG_INFO;
	}
	if (argc - optind != 1) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 1 ? "missing IMAGE or PATH"
							     : "too many arguments");
	}
	const char *path = argv[optind];

	if (cli_is_mount_path(path, &args)) {
		uint32_t c2 = !strcmp(what, "status")	? BUTTER_BALANCE_CMD_STATUS
			      : !strcmp(what, "pause")	? BUTTER_BALANCE_CMD_PAUSE
			      : !strcmp(what, "cancel") ? BUTTER_BALANCE_CMD_CANCEL
							: BUTTER_BALANCE_CMD_RESUME;

		free(args.devices);
		if (c2 == BUTTER_BALANCE_CMD_RESUME)
			return mount_balance(path, c2, NULL, background);
		ret = ctl_balance(path, c2, NULL, &io);
		if (ret == -1)
			return CLI_EXIT_ERROR;
		if (ret < 0) {
			cli_error("%s: balance %s: %s", path, what, balance_errstr(ret));
			return CLI_EXIT_ERROR;
		}
		if (c2 != BUTTER_BALANCE_CMD_STATUS)
			return cli_finish_stdout(CLI_EXIT_OK);
		if ((io.state & BUTTER_BALANCE_STATE_RUNNING) && io.job != 0 &&
		    !(io.state & BUTTER_BALANCE_STATE_RECORDED)) {
			printf("No balance found on '%s' (a device %s runs)\n", path,
			       io.job == BUTTER_DEVICE_CMD_REPLACE ? "replace"
			       : io.job == BUTTER_DEVICE_CMD_REMOVE ? "remove" : "resize");
			return cli_finish_stdout(CLI_EXIT_OK);
		}
		if (!(io.state & (BUTTER_BALANCE_STATE_RUNNING | BUTTER_BALANCE_STATE_RECORDED))) {
			printf("No balance found on '%s'\n", path);
			return cli_finish_stdout(CLI_EXIT_OK);
		}
		printf("Balance on '%s' is %s%s\n", path,
		       io.state & BUTTER_BALANCE_STATE_RUNNING ? "running" : "paused",
		       io.state & BUTTER_BALANCE_STATE_CANCEL_REQ ? ", cancel requested"
		       : io.state & BUTTER_BALANCE_STATE_PAUSE_REQ ? ", pause requested" : "");
		if (io.state & BUTTER_BALANCE_STATE_RUNNING)
			printf("%" PRIu64 " out of about %" PRIu64 " chunks balanced (%" PRIu64
			       " considered), %3.0f%% left\n",
			       io.stats.groups, io.stats.groups + io.stats.left, io.stats.considered,
			       io.stats.groups + io.stats.left
				       ? 100.0 * (double)io.stats.left /
						 (double)(io.stats.groups + io.stats.left)
				       : 0.0);
		print_args(&io.args);
		/* as btrfs-progs: 1 while a balance is running or paused */
		return cli_finish_stdout(1);
	}
	if (!strcmp(what, "pause")) {
		free(args.devices);
		cli_error("%s: no balance runs on an image; pause is for a live mount", path);
		return CLI_EXIT_ERROR;
	}
	if (!strcmp(what, "status"))
		ret = cli_open(&args, path, &fs);
	else
		ret = copyin_open_rw(path, args.devices, args.ndevices, &fs);
	if (ret < 0) {
		free(args.devices);
		return CLI_EXIT_ERROR;
	}
	ret = butter_balance_item(fs, &ba);
	if (!strcmp(what, "status")) {
		butter_close(fs);
		free(args.devices);
		if (ret == -ENOENT) {
			printf("No balance found on '%s'\n", path);
			return cli_finish_stdout(CLI_EXIT_OK);
		}
		if (ret < 0) {
			cli_error("%s: balance status: %s", path, strerror(-ret));
			return CLI_EXIT_ERROR;
		}
		printf("Balance on '%s' is paused (recorded, not running)\n", path);
		print_args(&ba);
		return cli_finish_stdout(1);
	}
	if (!strcmp(what, "cancel")) {
		ret = butter_balance_cancel(fs);
		if (ret == 0)
			ret = butter_sync(fs);
		butter_close(fs);
		free(args.devices);
		if (ret < 0) {
			cli_error("%s: balance cancel: %s", path, balance_errstr(ret));
			return CLI_EXIT_ERROR;
		}
		return cli_finish_stdout(CLI_EXIT_OK);
	}
	butter_close(fs);
	if (ret < 0) {
		free(args.devices);
		cli_error("%s: balance resume: %s", path, balance_errstr(ret));
		return CLI_EXIT_ERROR;
	}
	ba.flags |= BUTTER_BALANCE_RESUME;
	ret = image_balance(path, &args, &ba, false);
	free(args.devices);
	return ret;
}

/* The devid of @spec: a number, or the path of a member device. 0 if none. */
static uint64_t devid_of(struct butter_fs *fs, const char *spec)
{
	struct butter_device_info di;
	struct stat a, b;
	uint64_t id;
	size_t i;

	if (parse_u64(spec, &id) == 0)
		return id;
	if (butter_device_is_nbd(spec)) {
		for (i = 0; butter_get_device(fs, i, &di) == 0; i++)
			if (di.path && !strcmp(di.path, spec))
				return di.devid;
		return 0;
	}
	if (stat(spec, &a) < 0)
		return 0;
	for (i = 0; butter_get_device(fs, i, &di) == 0; i++) {
		if (!di.path || stat(di.path, &b) < 0)
			continue;
		if (S_ISBLK(a.st_mode) ? S_ISBLK(b.st_mode) && a.st_rdev == b.st_rdev
				       : a.st_dev == b.st_dev && a.st_ino == b.st_ino)
			return di.devid;
	}
	return 0;
}

int cmd_device_remove(const struct cli_command *cmd, int argc, char **argv)
{
	struct cli_args args = { .cmd = cmd };
	static const struct option longopts[] = { CLI_COMMON_LONGOPTS, { 0 } };
	struct butter_fs *fs;
	int c, ret, i, status = CLI_EXIT_OK;

	while ((c = cli_getopt(&args, argc, argv, ":h", longopts)) != -1)
		;
	if (argc - optind < 2) {
		free(args.devices);
		return cli_usage_error(cmd, "missing DEVICE or IMAGE");
	}
	const char *image = argv[argc - 1];

	if (cli_is_mount_path(image, &args)) {
		free(args.devices);
		for (i = optind; i < argc - 1; i++) {
			struct butter_ioc_device dev;

			memset(&dev, 0, sizeof(dev));
			dev.cmd = BUTTER_DEVICE_CMD_REMOVE;
			dev.devid = mount_devid_of(image, argv[i]);
			if (!dev.devid) {
				cli_error("%s: %s is not a device of this filesystem", image, argv[i]);
				return CLI_EXIT_ERROR;
			}
			if (mount_device(image, &dev, "device remove", false) != CLI_EXIT_OK)
				return CLI_EXIT_ERROR;
			printf("removed device %" PRIu64 " (%s)\n", dev.devid, argv[i]);
		}
		return cli_finish_stdout(CLI_EXIT_OK);
	}
	cli_open_flags |= BUTTER_OPEN_DEGRADED; /* "missing" is the point of it */
	ret = copyin_open_rw(image, args.devices, args.ndevices, &fs);
	free(args.devices);
	if (ret < 0)
		return CLI_EXIT_ERROR;
	for (i = optind; i < argc - 1; i++) {
		uint64_t devid;

		if (strcmp(argv[i], "missing") == 0) {
			struct butter_device_info di;
			size_t k;

			devid = 0;
			for (k = 0; butter_get_device(fs, k, &di) == 0; k++)
				if (!di.path)
					devid = di.devid;
		} else {
			devid = devid_of(fs, argv[i]);
		}
		if (!devid) {
			cli_error("%s: %s is not a device of this filesystem", image, argv[i]);
			status = CLI_EXIT_ERROR;
			continue;
		}
		ret = butter_device_remove(fs, devid);
		if (ret < 0) {
			cli_error("%s: removing device %" PRIu64 " (%s): %s", image, devid, argv[i],
				  strerror(-ret));
			status = CLI_EXIT_ERROR;
			break;
		}
		printf("removed device %" PRIu64 " (%s)\n", devid, argv[i]);
	}
	ret = butter_sync(fs);
	butter_close(fs);
	if (ret < 0) {
		cli_error("%s: closing: %s", image, strerror(-ret));
		status = CLI_EXIT_ERROR;
	}
	return cli_finish_stdout(status);
}

int cmd_filesystem_resize(const struct cli_command *cmd, int argc, char **argv)
{
	struct cli_args args = { .cmd = cmd };
	static const struct option longopts[] = { CLI_COMMON_LONGOPTS, { 0 } };
	struct butter_device_info di;
	struct butter_fs *fs;
	uint64_t devid = 1, amount = 0, size = 0;
	const char *spec;
	char *colon;
	int c, ret, sign = 0;
	bool max = false;
	size_t i;

	while ((c = cli_getopt(&args, argc, argv, ":hv", longopts)) != -1)
		if (c == 'v')
			cli_log_level = BUTTER_LOG_INFO;
	if (argc - optind != 2) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 2 ? "missing SIZE or IMAGE"
							     : "too many arguments");
	}
	spec = argv[optind];
	const char *image = argv[optind + 1];

	colon = strchr(spec, ':');
	if (colon) {
		char id[32];

		if ((size_t)(colon - spec) >= sizeof(id))
			goto bad;
		memcpy(id, spec, (size_t)(colon - spec));
		id[colon - spec] = '\0';
		if (parse_u64(id, &devid) < 0)
			goto bad;
		spec = colon + 1;
	}
	if (strcmp(spec, "max") == 0) {
		max = true;
	} else {
		if (*spec == '+' || *spec == '-')
			sign = *spec++ == '+' ? 1 : -1;
		if (cli_parse_size(spec, &amount) < 0)
			goto bad;
	}
	if (cli_is_mount_path(image, &args)) {
		struct butter_ioc_device dev;
		struct butter_ioc_fs_info info;
		struct butter_ioc_dev_stats ds;
		int fd = ctl_open(image, NULL);

		free(args.devices);
		if (fd < 0)
			return CLI_EXIT_ERROR;
		memset(&info, 0, sizeof(info));
		memset(&ds, 0, sizeof(ds));
		ret = ioctl(fd, BUTTER_IOC_FS_INFO, &info);
		for (uint64_t idx = 0; ret == 0; idx++) {
			ds.idx = idx;
			ret = ioctl(fd, BUTTER_IOC_DEV_STATS, &ds);
			if (ret == 0 && ds.devid == devid)
				break;
		}
		close(fd);
		if (ret < 0 || !ds.path[0]) {
			cli_error("%s: no device %" PRIu64 " to resize", image, devid);
			return CLI_EXIT_ERROR;
		}
		if (max) {
			size = cli_device_size(ds.path);
		} else if (sign && info.num_devices != 1) {
			cli_error("%s: give an absolute size on a mount of several devices", image);
			return CLI_EXIT_USAGE;
		} else if (sign > 0) {
			size = info.total_bytes + amount;
		} else if (sign < 0) {
			size = amount < info.total_bytes ? info.total_bytes - amount : 0;
		} else {
			size = amount;
		}
		if (!size) {
			cli_error("%s: resize of device %" PRIu64 " to nothing", image, devid);
			return CLI_EXIT_USAGE;
		}
		memset(&dev, 0, sizeof(dev));
		dev.cmd = BUTTER_DEVICE_CMD_RESIZE;
		dev.devid = devid;
		dev.size = size;
		ret = mount_device(image, &dev, "resize", false);
		if (ret == CLI_EXIT_OK)
			printf("resized device %" PRIu64 " to %" PRIu64 " bytes\n", devid, size);
		return ret;
	}
	ret = copyin_open_rw(image, args.devices, args.ndevices, &fs);
	free(args.devices);
	if (ret < 0)
		return CLI_EXIT_ERROR;
	for (i = 0; (ret = butter_get_device(fs, i, &di)) == 0; i++)
		if (di.devid == devid)
			break;
	if (ret < 0 || !di.path) {
		cli_error("%s: no device %" PRIu64 " to resize", image, devid);
		butter_close(fs);
		return CLI_EXIT_ERROR;
	}
	if (max) {
		size = cli_device_size(di.path);
		if (!size) {
			cli_error("%s: cannot tell the size of %s", image, di.path);
			butter_close(fs);
			return CLI_EXIT_ERROR;
		}
	} else if (sign > 0)
		size = di.total_bytes + amount;
	else if (sign < 0)
		size = amount < di.total_bytes ? di.total_bytes - amount : 0;
	else
		size = amount;
	if (size == 0) {
		cli_error("%s: resize of device %" PRIu64 " to nothing", image, devid);
		butter_close(fs);
		return CLI_EXIT_USAGE;
	}
	ret = butter_device_resize(fs, devid, &size);
	if (ret < 0) {
		cli_error("%s: resizing device %" PRIu64 ": %s", image, devid, strerror(-ret));
		butter_close(fs);
		return CLI_EXIT_ERROR;
	}
	ret = butter_sync(fs);
	butter_close(fs);
	if (ret < 0) {
		cli_error("%s: closing: %s", image, strerror(-ret));
		return CLI_EXIT_ERROR;
	}
	printf("resized device %" PRIu64 " to %" PRIu64 " bytes\n", devid, size);
	return cli_finish_stdout(CLI_EXIT_OK);
bad:
	free(args.devices);
	return cli_usage_error(cmd, "bad size '%s'", argv[optind]);
}

int cmd_replace_start(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "force", no_argument, NULL, 'f' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_replace_stats st;
	struct cli_progress progress;
	struct butter_device_info di;
	struct butter_fs *fs;
	unsigned flags = 0;
	uint64_t devid = 0;
	bool foreground = false;
	char size[32];
	int c, ret;

	while ((c = cli_getopt(&args, argc, argv, ":hfrB", longopts)) != -1) {
		if (c == 'f')
			flags |= BUTTER_REPLACE_FORCE;
		else if (c == 'r')
			flags |= BUTTER_REPLACE_AVOID_SRC;
		else if (c == 'B')
			foreground = true;
	}
	if (argc - optind != 3) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 3 ? "missing SRC, TARGET or IMAGE"
							     : "too many arguments");
	}
	const char *src = argv[optind], *target = argv[optind + 1], *image = argv[optind + 2];

	if (cli_is_mount_path(image, &args)) {
		struct butter_ioc_device dev;
		/* the daemon opens it: an absolute path, or the URI as it is */
		char *abs = butter_device_is_nbd(target) ? strdup(target) : realpath(target, NULL);

		free(args.devices);
		memset(&dev, 0, sizeof(dev));
		dev.cmd = BUTTER_DEVICE_CMD_REPLACE;
		dev.flags = flags;
		dev.devid = mount_devid_of(image, src);
		if (!abs || strlen(abs) >= sizeof(dev.path) || !dev.devid) {
			cli_error("%s: %s", image, !abs ? "the new device cannot be found"
					  : !dev.devid ? "the old device is not one of this filesystem"
						       : "the new device's path is too long");
			free(abs);
			return CLI_EXIT_ERROR;
		}
		strcpy(dev.path, abs);
		free(abs);
		ret = mount_device(image, &dev, "replace", !foreground);
		if (ret == CLI_EXIT_OK && foreground)
			printf("replaced device %" PRIu64 " (%s) by %s\n", dev.devid, src, target);
		else if (ret == CLI_EXIT_OK)
			printf("replace of device %" PRIu64 " (%s) by %s started: `butter replace status "
			       "%s` follows it\n", dev.devid, src, target, image);
		return ret;
	}
	cli_open_flags |= BUTTER_OPEN_DEGRADED; /* a failed disk is what it is for */
	ret = copyin_open_rw(image, args.devices, args.ndevices, &fs);
	free(args.devices);
	if (ret < 0)
		return CLI_EXIT_ERROR;
	if (strcmp(src, "missing") == 0) {
		for (size_t k = 0; butter_get_device(fs, k, &di) == 0; k++)
			if (!di.path)
				devid = di.devid;
	} else {
		devid = devid_of(fs, src);
	}
	if (!devid) {
		cli_error("%s: %s is not a device of this filesystem", image, src);
		butter_close(fs);
		return CLI_EXIT_ERROR;
	}
	/* piece by piece, for the progress line (butter_replace() is these steps) */
	memset(&st, 0, sizeof(st));
	cli_progress_begin(&progress, "replace", 0, false);
	progress.unit = "chunks";
	ret = butter_replace_start(fs, devid, target, flags);
	while (ret == 0) {
		ret = butter_replace_step(fs, &st);
		progress.total = st.chunks_total;
		cli_progress_update(&progress, st.chunks_done);
	}
	cli_progress_end(&progress);
	if (ret == 1)
		ret = butter_sync(fs);
	butter_close(fs);
	if (ret < 0) {
		cli_error("%s: replacing device %" PRIu64 " by %s: %s", image, devid, target,
			  strerror(-ret));
		return CLI_EXIT_ERROR;
	}
	printf("replaced device %" PRIu64 " (%s) by %s: %s copied\n", devid, src, target,
	       cli_size(size, sizeof(size), st.bytes_written, false));
	return cli_finish_stdout(CLI_EXIT_OK);
}

/*
 * `butter replace status [-1] PATH` and `butter replace cancel PATH`: the
 * replace a live mount runs (BUTTER_IOC_BALANCE STATUS and CANCEL; the
 * daemon's one job). An image has none running: an offline replace runs to
 * its end inside `replace start`, and nothing of it is recorded on disk.
 */
int cmd_replace_ctl(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ 0 },
	};
	const char *what = strchr(cmd->name, ' ') + 1;
	struct cli_args args = { .cmd = cmd };
	struct butter_ioc_balance io;
	bool once = false, replacing;
	char size[32];
	int c, ret;

	while ((c = cli_getopt(&args, argc, argv, ":h1", longopts)) != -1)
		if (c == '1')
			once = true;
	if (argc - optind != 1) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 1 ? "missing PATH" : "too many arguments");
	}
	const char *path = argv[optind];

	if (!cli_is_mount_path(path, &args)) {
		free(args.devices);
		if (!strcmp(what, "status")) {
			printf("Never started (an offline replace runs to its end in `replace start`)\n");
			return cli_finish_stdout(CLI_EXIT_OK);
		}
		cli_error("%s: no replace runs on an image; cancel is for a live mount", path);
		return CLI_EXIT_ERROR;
	}
	free(args.devices);
	for (;;) {
		ret = ctl_balance(path, BUTTER_BALANCE_CMD_STATUS, NULL, &io);
		if (ret == -1)
			return CLI_EXIT_ERROR;
		if (ret < 0) {
			cli_error("%s: replace %s: %s", path, what, strerror(-ret));
			return CLI_EXIT_ERROR;
		}
		replacing = io.job == BUTTER_DEVICE_CMD_REPLACE;
		if (!strcmp(what, "cancel"))
			break;
		if (!replacing) {
			printf("Never started\n");
			return cli_finish_stdout(CLI_EXIT_OK);
		}
		if (!(io.state & BUTTER_BALANCE_STATE_RUNNING)) {
			printf("%s after copying %" PRIu64 " chunks, %s written%s%s\n",
			       io.error ? "Failed" : io.state & BUTTER_BALANCE_STATE_CANCELED
					 ? "Canceled" : "Finished",
			       io.stats.groups, cli_size(size, sizeof(size), io.stats.bytes, false),
			       io.error ? ": " : "", io.error ? strerror(-io.error) : "");
			return cli_finish_stdout(io.error ? CLI_EXIT_ERROR : CLI_EXIT_OK);
		}
		printf("%.1f%% done (%" PRIu64 " of %" PRIu64 " chunks), %s written\n",
		       io.stats.groups + io.stats.left
			       ? 100.0 * (double)io.stats.groups / (double)(io.stats.groups + io.stats.left)
			       : 0.0,
		       io.stats.groups, io.stats.groups + io.stats.left,
		       cli_size(size, sizeof(size), io.stats.bytes, false));
		if (once)
			return cli_finish_stdout(CLI_EXIT_OK);
		fflush(stdout);
		sleep(1);
	}
	if (!replacing || !(io.state & BUTTER_BALANCE_STATE_RUNNING)) {
		cli_error("%s: no replace is running", path);
		return CLI_EXIT_ERROR;
	}
	ret = ctl_balance(path, BUTTER_BALANCE_CMD_CANCEL, NULL, &io);
	if (ret < 0) {
		cli_error("%s: replace cancel: %s", path, ret == -1 ? "no mount" : strerror(-ret));
		return CLI_EXIT_ERROR;
	}
	do {
		usleep(100 * 1000);
		ret = ctl_balance(path, BUTTER_BALANCE_CMD_STATUS, NULL, &io);
	} while (ret == 0 && (io.state & BUTTER_BALANCE_STATE_RUNNING));
	if (ret == 0 && !(io.state & BUTTER_BALANCE_STATE_CANCELED)) {
		cli_error("%s: the replace %s before the cancel took effect", path,
			  io.error ? "failed" : "finished");
		return CLI_EXIT_ERROR;
	}
	printf("replace canceled after %" PRIu64 " chunks; the old device stays\n", io.stats.groups);
	return cli_finish_stdout(ret ? CLI_EXIT_ERROR : CLI_EXIT_OK);
}
