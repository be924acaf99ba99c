/*
 * options.c — parsing `butter mount [-f] [-d] [-s] [-o OPTIONS] DEV... MOUNTPOINT`.
 *
 * -o options are rows of one table (mount_options below): the btrfs names
 * where btrfs has them, then the FUSE performance knobs. An option that is
 * not in the table goes to libfuse untouched, which accepts the kernel's and
 * FUSE's mount options and refuses what nobody knows ("fuse: unknown
 * option"). Rows marked `pass` are read here and passed on too (ro, rw and
 * the atime options matter to the kernel as well). The last of repeated
 * options wins, except device=, which adds a device each time.
 *
 * Permissions are checked by default, as on the kernel's btrfs: daemon.c
 * hands libfuse default_permissions (the kernel checks mode bits, and ACLs
 * through FUSE_CAP_POSIX_ACL, ops.c op_init) unless no_permission_checks is
 * given. default_permissions itself is accepted and changes nothing (it
 * undoes an earlier no_permission_checks). allow_other never turns checks
 * off: without them any user could read and overwrite any file.
 *
 * Why the kernel may trust names and attributes for a day (attr_timeout and
 * entry_timeout default to DEFAULT_CACHE_SECS; lookups of missing names are
 * cached as long, ops.c):
 *  1. The daemon is the only writer of the image while it is mounted, and
 *     every change to a name or an attribute arrives as a request of this
 *     mount, that is through the kernel's VFS, which updates or drops its
 *     own dentries and attributes as it makes the change (create, unlink,
 *     rename, link, setattr, write, fallocate, copy_file_range, xattrs).
 *  2. The few changes the daemon makes on its own say so to the kernel:
 *     the control ioctls drop the entry they add or remove, and with it
 *     the attributes of its directory (control.c). Other work of the
 *     daemon (commits, freeing orphans) changes nothing a stat or lookup
 *     shows: st_blocks counts a file's data as it is written, compressed
 *     or not.
 *  3. So a timeout only bounds how long the kernel may believe something
 *     that cannot become false; a short one only adds round trips (a stat
 *     or a path walk after it goes to the daemon). One day, not forever,
 *     leaves a bound should a change ever bypass (1) and (2). Give
 *     attr_timeout=1,entry_timeout=1 (the former defaults) to debug one.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mount.h"
#include "options.h"
#include "uring.h"

enum opt_kind {
	OPT_TRUE,    /* bool field := true */
	OPT_FALSE,   /* bool field := false */
	OPT_ON,      /* int field := 1 */
	OPT_OFF,     /* int field := 0 */
	OPT_UINT,    /* unsigned field := NAME=N */
	OPT_U64,     /* uint64_t field := NAME=N */
	OPT_SIZE,    /* uint64_t field := NAME=N[KMG] (bytes, binary units) */
	OPT_SECONDS, /* double field := NAME=S (decimal seconds, >= 0) */
	OPT_STRING,  /* const char * field := NAME=VALUE */
	OPT_DEVICE,  /* append to devices */
	OPT_COMPRESS /* compress[=ALGO], compress-force[=ALGO] */
};

struct opt_def {
	const char *name;    /* ends in '=' when the option takes a value */
	enum opt_kind kind;
	size_t off;          /* the field in struct mount_opts */
	bool pass;           /* also hand it to libfuse */
};

#define F(field) offsetof(struct mount_opts, field)
#define DEFAULT_CACHE_SECS 86400.0 /* attr_timeout and entry_timeout (see above) */
#define DEFAULT_SPIN_US 50         /* spin=: pollloop.c says why and what it costs */

static const struct opt_def mount_options[] = {
	{ "ro", OPT_TRUE, F(readonly), true },
	{ "rw", OPT_FALSE, F(readonly), true },
	{ "remount", OPT_TRUE, F(remount), false },
	{ "subvol=", OPT_STRING, F(subvol), false },
	{ "subvolid=", OPT_U64, F(subvolid), false },
	{ "device=", OPT_DEVICE, 0, false },
	{ "commit=", OPT_UINT, F(commit_secs), false },
	{ "write_buffer=", OPT_SIZE, F(write_buffer), false },
	{ "max_inline=", OPT_SIZE, F(max_inline), false },
	{ "degraded", OPT_TRUE, F(degraded), false },
	{ "skip_balance", OPT_TRUE, F(skip_balance), false },
	{ "compress", OPT_COMPRESS, 0, false },
	{ "compress=", OPT_COMPRESS, 0, false },
	{ "compress-force", OPT_COMPRESS, 0, false },
	{ "compress-force=", OPT_COMPRESS, 0, false },
	{ "noatime", OPT_TRUE, F(noatime), true },
	{ "atime", OPT_FALSE, F(noatime), true },
	{ "strictatime", OPT_TRUE, F(strictatime), false },
	{ "relatime", OPT_FALSE, F(strictatime), false },
	{ "nodiratime", OPT_TRUE, F(nodiratime), false },
	{ "diratime", OPT_FALSE, F(nodiratime), false },
	{ "default_permissions", OPT_FALSE, F(no_permission_checks), false },
	{ "no_permission_checks", OPT_TRUE, F(no_permission_checks), false },
	{ "writeback_cache", OPT_ON, F(writeback_cache), false },
	{ "no_writeback_cache", OPT_OFF, F(writeback_cache), false },
	{ "killpriv_v2", OPT_TRUE, F(killpriv_v2), false },
	{ "no_killpriv_v2", OPT_FALSE, F(killpriv_v2), false },
	{ "keep_cache", OPT_TRUE, F(keep_cache), false },
	{ "no_keep_cache", OPT_FALSE, F(keep_cache), false },
	{ "max_write=", OPT_UINT, F(max_write), false },
	{ "max_readahead=", OPT_UINT, F(max_readahead), false },
	{ "attr_timeout=", OPT_SECONDS, F(attr_timeout), false },
	{ "entry_timeout=", OPT_SECONDS, F(entry_timeout), false },
	{ "max_threads=", OPT_UINT, F(max_threads), false },
	{ "spin=", OPT_UINT, F(spin_us), false },
	{ "uring", OPT_TRUE, F(uring), false },
	{ "no_uring", OPT_FALSE, F(uring), false },
	{ "log=", OPT_STRING, F(log_file), false },
	{ "trace=", OPT_STRING, F(trace), false },
};

#define NOPTIONS (sizeof(mount_options) / sizeof(mount_options[0]))

static int usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, "butter mount: ");
	/* every caller passes a literal taking one %s */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
	fprintf(stderr, fmt, arg);
#pragma GCC diagnostic pop
	fprintf(stderr, "\n");
	butter_mount_print_usage(stderr);
	return -1;
}

/* Keep @s until mount_opts_free(); returns @s, or NULL (and frees it) on ENOMEM. */
static char *own(struct mount_opts *o, char *s)
{
	char **n;

	if (!s)
		return NULL;
	n = realloc(o->owned, (o->nowned + 1) * sizeof(*n));
	if (!n) {
		free(s);
		return NULL;
	}
	o->owned = n;
	o->owned[o->nowned++] = s;
	return s;
}

/* An absolute path for @path if it exists, else @path itself (opening it reports why). */
static const char *absolute(struct mount_opts *o, const char *path)
{
	char *abs = realpath(path, NULL);

	if (!abs)
		return path;
	return own(o, abs) ? abs : path;
}

static int add_device(struct mount_opts *o, const char *path)
{
	const char **d = realloc(o->devices, (o->ndevices + 1) * sizeof(*d));

	if (!d)
		return -ENOMEM;
	o->devices = d;
	o->devices[o->ndevices++] = absolute(o, path);
	return 0;
}

static int add_fuse_opt(struct mount_opts *o, const char *opt)
{
	size_t old = o->fuse_opts ? strlen(o->fuse_opts) : 0;
	char *s = realloc(o->fuse_opts, old + strlen(opt) + 2);

	if (!s)
		return -ENOMEM;
	if (old)
		s[old++] = ',';
	strcpy(s + old, opt);
	o->fuse_opts = s;
	return 0;
}

static bool parse_u64(const char *s, uint64_t *out)
{
	char *end;

	if (*s < '0' || *s > '9')
		return false;
	errno = 0;
	*out = strtoull(s, &end, 0);
	return errno == 0 && *end == '\0';
}

/* Apply one -o option (@opt is NUL-terminated, without commas). */
static int apply_option(struct mount_opts *o, const char *opt)
{
	for (size_t i = 0; i < NOPTIONS; i++) {
		const struct opt_def *d = &mount_options[i];
		size_t n = strlen(d->name);
		bool valued = d->name[n - 1] == '=';
		const char *val = opt + n;
		char *field = (char *)o + d->off;
		uint64_t u;

		if (valued ? strncmp(opt, d->name, n) != 0 : strcmp(opt, d->name) != 0)
			continue;
		switch (d->kind) {
		case OPT_TRUE:
		case OPT_FALSE:
			*(bool *)field = d->kind == OPT_TRUE;
			break;
		case OPT_ON:
		case OPT_OFF:
			*(int *)field = d->kind == OPT_ON;
			break;
		case OPT_UINT:
			if (!parse_u64(val, &u) || u > UINT_MAX)
				return usage_error("bad number in -o %s", opt);
			*(unsigned *)field = (unsigned)u;
			break;
		case OPT_U64:
			if (!parse_u64(val, &u))
				return usage_error("bad number in -o %s", opt);
			*(uint64_t *)field = u;
			break;
		case OPT_SIZE: {
			char *end;
			unsigned shift = 0;

			errno = 0;
			u = strtoull(val, &end, 10);
			if (*end == 'k' || *end == 'K')
				shift = 10;
			else if (*end == 'm' || *end == 'M')
				shift = 20;
			else if (*end == 'g' || *end == 'G')
				shift = 30;
			if (shift)
				end++;
			if (*val < '0' || *val > '9' || errno || *end != '\0' ||
			    u > (UINT64_MAX >> shift))
				return usage_error("bad size in -o %s (BYTES, or a number with K, M or G)",
						   opt);
			*(uint64_t *)field = u << shift;
			break;
		}
		case OPT_SECONDS: {
			char *end;
			double v = strtod(val, &end);

			if (*val == '\0' || *end != '\0' || !(v >= 0))
				return usage_error("bad number of seconds in -o %s", opt);
			*(double *)field = v;
			break;
		}
		case OPT_STRING:
			if (*val == '\0')
				return usage_error("-o %s needs a value", opt);
			*(const char **)field = val;
			break;
		case OPT_DEVICE:
			if (*val == '\0')
				return usage_error("-o %s needs a device", opt);
			if (add_device(o, val))
				return usage_error("%s: out of memory", opt);
			break;
		case OPT_COMPRESS:
			o->compress = opt;
			break;
		}
		if (d->pass && add_fuse_opt(o, opt))
			return usage_error("%s: out of memory", opt);
		return 0;
	}
	if (add_fuse_opt(o, opt))
		return usage_error("%s: out of memory", opt);
	return 0;
}

/* Split one -o argument at commas and apply each option. */
static int apply_option_list(struct mount_opts *o, const char *list)
{
	char *copy = own(o, strdup(list));
	char *save = NULL;

	if (!copy)
		return usage_error("%s: out of memory", list);
	for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
		if (apply_option(o, tok))
			return -1;
	return 0;
}

enum { OPT_LONG_DEVICE = 0x100 };

int mount_opts_parse(struct mount_opts *o, int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "device", required_argument, NULL, OPT_LONG_DEVICE },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char **extra = NULL;
	size_t nextra = 0;
	int c, ret = 0;

	memset(o, 0, sizeof(*o));
	o->commit_secs = MOUNT_DEFAULT_COMMIT;
	o->write_buffer = UINT64_MAX; /* the daemon's default (daemon.c) */
	o->max_inline = UINT64_MAX;   /* the library's default */
	o->writeback_cache = -1;
	o->killpriv_v2 = true;
	o->keep_cache = true;
	o->max_write = MOUNT_DEFAULT_MAX_WRITE;
	o->attr_timeout = DEFAULT_CACHE_SECS;
	o->spin_us = DEFAULT_SPIN_US;
	o->entry_timeout = DEFAULT_CACHE_SECS;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+:fdso:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'f':
			o->foreground = true;
			break;
		case 'd':
			o->debug = o->foreground = true;
			break;
		case 's':
			o->single_thread = true;
			break;
		case 'o':
			if (apply_option_list(o, optarg))
				goto fail;
			break;
		case OPT_LONG_DEVICE: {
			const char **e = realloc(extra, (nextra + 1) * sizeof(*e));

			if (!e) {
				usage_error("%s: out of memory", optarg);
				goto fail;
			}
			extra = e;
			extra[nextra++] = optarg;
			break;
		}
		case 'h':
			butter_mount_print_usage(stdout);
			free(extra);
			mount_opts_free(o);
			return 1;
		case ':':
			usage_error("option '%s' needs an argument", argv[optind - 1]);
			goto fail;
		default:
			usage_error("unknown option '%s'", argv[optind - 1]);
			goto fail;
		}
	}
	if (argc - optind < 2) {
		usage_error("%s", argc - optind < 1 ? "missing DEV and MOUNTPOINT" : "missing MOUNTPOINT");
		goto fail;
	}

	/* DEV... first, then the device= and --device members, in the order given */
	{
		const char **opt_devices = o->devices;
		size_t nopt = o->ndevices;

		o->devices = NULL;
		o->ndevices = 0;
		for (int i = optind; i < argc - 1 && ret == 0; i++)
			ret = add_device(o, argv[i]);
		for (size_t i = 0; i < nopt && ret == 0; i++)
			ret = add_device(o, opt_devices[i]);
		for (size_t i = 0; i < nextra && ret == 0; i++)
			ret = add_device(o, extra[i]);
		free(opt_devices);
	}
	free(extra);
	extra = NULL;
	if (ret) {
		usage_error("%s", "out of memory");
		goto fail;
	}
	o->mountpoint = absolute(o, argv[argc - 1]);
	if (o->commit_secs == 0)
		o->commit_secs = MOUNT_DEFAULT_COMMIT; /* as btrfs: commit=0 is the default */
	if (o->max_write < 4096) {
		usage_error("%s", "max_write must be at least 4096");
		goto fail;
	}
	if (o->uring && !butter_uring_built()) {
		usage_error("%s", "-o uring: this butter was built without liburing "
			    "(FUSE over io_uring needs it: install liburing-dev and build again)");
		goto fail;
	}
	if (o->uring && o->single_thread) {
		usage_error("%s", "-o uring serves requests on a thread per CPU: not with -s");
		goto fail;
	}
	return 0;
fail:
	free(extra);
	mount_opts_free(o);
	return -1;
}

void mount_opts_free(struct mount_opts *o)
{
	for (size_t i = 0; i < o->nowned; i++)
		free(o->owned[i]);
	free(o->owned);
	free(o->devices);
	free(o->fuse_opts);
	memset(o, 0, sizeof(*o));
}
