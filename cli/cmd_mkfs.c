/*
 * cmd_mkfs.c — `butter mkfs`: make a btrfs filesystem on image files or block
 * devices, optionally filled from a host directory (--rootdir), and print a
 * summary of what was made, as mkfs.btrfs does.
 *
 * Promises:
 *  1. Nothing is written before every argument was checked: options parse,
 *     --rootdir names a directory, every DEV exists (or -b SIZE says how big
 *     to create it). The library then refuses to overwrite a filesystem
 *     without -f.
 *  2. With --rootdir the tree is copied by copyin.c (the code `butter put`
 *     uses) and committed with butter_sync(), whose result is checked; a file
 *     that could not be copied is reported by path and the exit status is 1.
 *  3. The summary is read back from the new filesystem (butter_get_info and
 *     friends on a fresh read-only open), never from the options.
 *  4. A failure names its cause in exactly one line (the library's message
 *     when it gave one, else ours). When making the filesystem (or filling
 *     it, or shrinking it) fails, the image files this run created (-b SIZE
 *     on a path that did not exist) are removed again; a file or device that
 *     existed before is never removed.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <fts.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "copyin.h"

enum {
	OPT_CSUM = CLI_OPT_FIRST_FREE,
	OPT_SUBVOL,
	OPT_COMPRESS,
	OPT_SHRINK,
	OPT_MAX_INLINE,
};

/* Block group type bits (on-disk values), for the summary. */
#define BG_DATA 0x1ull
#define BG_SYSTEM 0x2ull
#define BG_METADATA 0x4ull

static int parse_u32_size(const struct cli_command *cmd, const char *opt, const char *s,
			  uint32_t *out)
{
	uint64_t v;

	if (cli_parse_size(s, &v) < 0 || v > UINT32_MAX) {
		cli_usage_error(cmd, "%s: invalid size '%s'", opt, s);
		return -EINVAL;
	}
	*out = (uint32_t)v;
	return 0;
}

static const char *bg_name(uint64_t flags)
{
	switch (flags & (BG_DATA | BG_SYSTEM | BG_METADATA)) {
	case BG_DATA:
		return "Data:";
	case BG_SYSTEM:
		return "System:";
	case BG_METADATA:
		return "Metadata:";
	default:
		return "Data+Metadata:";
	}
}

static void print_features(const struct butter_info *info)
{
	const uint64_t flags[3] = { info->compat_flags, info->compat_ro_flags,
				    info->incompat_flags };
	const char *sep = "";

	printf("Features:           ");
	for (int kind = 0; kind < 3; kind++) {
		for (int bit = 0; bit < 64; bit++) {
			if (!(flags[kind] & (1ull << bit)))
				continue;
			const char *name = butter_feature_name(kind, bit);
			if (name)
				printf("%s%s", sep, name);
			else
				printf("%sunknown(%d:%d)", sep, kind, bit);
			sep = ", ";
		}
	}
	printf("\n");
}

/* Print what mkfs made, read back from the filesystem (promise 3). */
static int print_summary(const struct cli_command *cmd, const char *const *devs, size_t ndevs,
			 const struct copyin_stats *copied, const char *rootdir)
{
	struct cli_args args = { .cmd = cmd, .devices = (const char **)devs + 1,
				 .ndevices = ndevs - 1 };
	struct butter_info info;
	struct butter_fs *fs;
	char a[64], u[37];
	int ret;

	if (cli_open(&args, devs[0], &fs) < 0)
		return -1;
	ret = butter_get_info(fs, &info);
	if (ret < 0) {
		cli_error("%s: %s", devs[0], strerror(-ret));
		butter_close(fs);
		return -1;
	}
	printf("Label:              %s\n", info.label[0] ? info.label : "(none)");
	printf("UUID:               %s\n", cli_uuid(u, info.fsid));
	printf("Node size:          %" PRIu32 "\n", info.nodesize);
	printf("Sector size:        %" PRIu32 "\n", info.sectorsize);
	printf("Filesystem size:    %s\n", cli_size(a, sizeof(a), info.total_bytes, false));
	printf("Block group profiles:\n");
	for (size_t i = 0;; i++) {
		struct butter_space_info sp;
		ret = butter_get_space(fs, i, &sp);
		if (ret < 0)
			break;
		const char *profile = butter_profile_name(sp.flags);
		printf("  %-17s %-10s %12s\n", bg_name(sp.flags), profile ? profile : "unknown",
		       cli_size(a, sizeof(a), sp.total, false));
	}
	printf("Checksum:           %s\n", info.csum_name ? info.csum_name : "unknown");
	print_features(&info);
	if (rootdir)
		printf("Copied:             %" PRIu64 " entries, %s of data from %s\n", copied->files,
		       cli_size(a, sizeof(a), copied->bytes, false), rootdir);
	printf("Number of devices:  %" PRIu64 "\n", info.num_devices);
	printf("Devices:\n   ID        SIZE  PATH\n");
	for (size_t i = 0;; i++) {
		struct butter_device_info dev;
		if (butter_get_device(fs, i, &dev) < 0)
			break;
		printf("  %3" PRIu64 " %11s  %s\n", dev.devid,
		       cli_size(a, sizeof(a), dev.total_bytes, false), dev.path ? dev.path : "MISSING");
	}
	butter_close(fs);
	return 0;
}

/*
 * The --subvol argument as a path relative to --rootdir: an optional "rw:"
 * prefix (mkfs.btrfs's type), no leading "./" or "/", no trailing "/".
 * NULL for an empty path, "..", or a type butter does not make yet.
 */
static char *subvol_path(const char *arg)
{
	const char *p = arg;
	size_t len;

	if (!strncmp(p, "rw:", 3))
		p += 3;
	else if (strchr(p, ':') && (!strncmp(p, "ro:", 3) || !strncmp(p, "default:", 8) ||
				    !strncmp(p, "default-ro:", 11)))
		return NULL;
	for (;;) {
		if (*p == '/')
			p++;
		else if (p[0] == '.' && p[1] == '/')
			p += 2;
		else
			break;
	}
	len = strlen(p);
	while (len && p[len - 1] == '/')
		len--;
	if (!len || strstr(p, "..") == p)
		return NULL;
	return strndup(p, len);
}

/*
 * --shrink: make every device as small as its allocated chunks allow, then
 * cut the image files to that size. 0 or -1 (reported).
 */
static int shrink_images(const char *const *devs, size_t ndevs)
{
	struct butter_device_info info;
	struct butter_fs *fs;
	uint64_t *sizes = calloc(ndevs, sizeof(*sizes));
	int ret = 0;

	if (!sizes) {
		cli_error("%s", strerror(ENOMEM));
		return -1;
	}
	if (copyin_open_rw(devs[0], devs + 1, ndevs - 1, &fs) < 0) {
		free(sizes);
		return -1;
	}
	for (size_t i = 0; ret == 0 && butter_get_device(fs, i, &info) == 0; i++) {
		uint64_t size = 0;

		ret = butter_device_resize(fs, info.devid, &size);
		if (ret < 0) {
			cli_error("%s: shrinking: %s", info.path ? info.path : devs[0], strerror(-ret));
			break;
		}
		for (size_t d = 0; d < ndevs; d++)
			if (info.path && !strcmp(info.path, devs[d]))
				sizes[d] = size;
	}
	butter_close(fs);
	for (size_t d = 0; ret == 0 && d < ndevs; d++) {
		if (sizes[d] && truncate(devs[d], (off_t)sizes[d]) < 0) {
			cli_error("%s: %s", devs[d], strerror(errno));
			ret = -errno;
		}
	}
	free(sizes);
	return ret < 0 ? -1 : 0;
}

/* Fill the new filesystem from @rootdir (promise 2); 0, 1 (files failed) or -1. */
/* For the progress line: the bytes of the regular files below @rootdir (a walk of stat() only). */
static uint64_t tree_bytes(const char *rootdir)
{
	char *paths[] = { (char *)rootdir, NULL };
	FTS *fts = fts_open(paths, FTS_PHYSICAL | FTS_NOCHDIR, NULL);
	FTSENT *e;
	uint64_t total = 0;

	if (!fts)
		return 0;
	while ((e = fts_read(fts)) != NULL)
		if (e->fts_info == FTS_F && S_ISREG(e->fts_statp->st_mode))
			total += (uint64_t)e->fts_statp->st_size;
	fts_close(fts);
	return total;
}

static int fill(const char *const *devs, size_t ndevs, const char *rootdir,
		const char *const *subvols, size_t nsubvols, const char *compress,
		uint64_t max_inline, bool verbose, bool quiet, struct copyin_stats *stats)
{
	struct cli_progress progress;
	uint64_t (*skip)[2] = calloc(ndevs, sizeof(*skip));
	struct butter_fs *fs;
	butter_ino_t root;
	size_t nskip = 0;
	int ret, status;

	if (!skip) {
		cli_error("%s", strerror(ENOMEM));
		return -1;
	}
	/* an image file inside the tree must not copy itself into itself */
	for (size_t i = 0; i < ndevs; i++) {
		struct stat st;
		if (stat(devs[i], &st) == 0 && S_ISREG(st.st_mode)) {
			skip[nskip][0] = st.st_dev;
			skip[nskip][1] = st.st_ino;
			nskip++;
		}
	}
	struct copyin_opts opts = { .copy_ctime = true, .verbose = verbose,
				    .skip = (const uint64_t (*)[2])skip, .nskip = nskip,
				    .subvols = subvols, .nsubvols = nsubvols };

	if (copyin_open_rw(devs[0], devs + 1, ndevs - 1, &fs) < 0) {
		free(skip);
		return -1;
	}
	if (compress && (ret = butter_set_compression(fs, compress, 0)) < 0) {
		cli_error("--compress %s: %s", compress,
			  ret == -EINVAL ? "unknown algorithm or level (zlib[:1-9], lzo, zstd[:1-15])"
					 : strerror(-ret));
		butter_close(fs);
		free(skip);
		return -1;
	}
	/* the tree is read far more than written: inline what fits, as mkfs.btrfs */
	ret = butter_set_max_inline(fs, max_inline);
	if (ret < 0) {
		cli_error("%s: --max-inline: %s", devs[0], strerror(-ret));
		butter_close(fs);
		free(skip);
		return -1;
	}
	ret = butter_root(fs, 5, &root);
	if (ret < 0) {
		cli_error("%s: top-level directory: %s", devs[0], strerror(-ret));
		status = -1;
	} else {
		/* on a terminal (not -q, not -v): a progress line, after a walk for the total */
		cli_progress_begin(&progress, "copying", 0, quiet || verbose);
		if (progress.on) {
			progress.total = tree_bytes(rootdir);
			opts.progress = &progress;
		}
		status = copyin(fs, rootdir, root, NULL, &opts, stats);
		cli_progress_end(&progress);
	}
	ret = butter_sync(fs);
	if (ret < 0) {
		cli_error("%s: committing: %s", devs[0], strerror(-ret));
		status = -1;
	}
	butter_close(fs);
	free(skip);
	return status;
}

/* What the library said while making the filesystem (promise 4). */
struct mkfs_messages {
	unsigned errors; /* error-level messages printed */
};

/* Print a library message as the library would (butter: MSG) and count errors. */
static void mkfs_log(void *arg, int level, const char *msg)
{
	struct mkfs_messages *said = arg;

	if (level == BUTTER_LOG_ERROR)
		said->errors++;
	cli_error("%s", msg);
}

/*
 * Create the image files of @devs that do not exist yet (-b SIZE), marking
 * them in @created. O_EXCL: a path that appeared meanwhile is not ours.
 * 0, or -1 (reported).
 */
static int create_images(const char *const *devs, size_t ndevs, bool *created)
{
	for (size_t i = 0; i < ndevs; i++) {
		struct stat st;
		int fd;

		if (butter_device_is_nbd(devs[i]) || stat(devs[i], &st) == 0 || errno != ENOENT)
			continue;
		fd = open(devs[i], O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd < 0) {
			if (errno == EEXIST)
				continue;
			cli_error("%s: %s", devs[i], strerror(errno));
			return -1;
		}
		close(fd);
		created[i] = true;
	}
	return 0;
}

/* Remove the image files this run created (promise 4). */
static void remove_created(const char *const *devs, size_t ndevs, const bool *created)
{
	for (size_t i = 0; created && i < ndevs; i++)
		if (created[i] && unlink(devs[i]) < 0 && errno != ENOENT)
			cli_error("%s: removing the image file: %s", devs[i], strerror(errno));
}

int cmd_mkfs(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "label", required_argument, NULL, 'L' },
		{ "data", required_argument, NULL, 'd' },
		{ "metadata", required_argument, NULL, 'm' },
		{ "nodesize", required_argument, NULL, 'n' },
		{ "sectorsize", required_argument, NULL, 's' },
		{ "byte-count", required_argument, NULL, 'b' },
		{ "force", no_argument, NULL, 'f' },
		{ "mixed", no_argument, NULL, 'M' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "nodiscard", no_argument, NULL, 'K' },
		{ "rootdir", required_argument, NULL, 'r' },
		{ "csum", required_argument, NULL, OPT_CSUM },
		{ "checksum", required_argument, NULL, OPT_CSUM },
		{ "subvol", required_argument, NULL, OPT_SUBVOL },
		{ "compress", required_argument, NULL, OPT_COMPRESS },
		{ "shrink", no_argument, NULL, OPT_SHRINK },
		{ "max-inline", required_argument, NULL, OPT_MAX_INLINE },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_mkfs_opts o = { .csum_type = -1 };
	const char *rootdir = NULL;
	bool shrink = false;
	const char *compress = NULL;
	uint64_t max_inline = UINT64_MAX; /* below a sector (the library bounds it) */
	bool max_inline_given = false;
	char **subvols = NULL;
	size_t nsubvols = 0;
	bool quiet = false, verbose = false;
	const char **devs = NULL;
	size_t ndevs = 0;
	bool *created = NULL;     /* devs[i] is an image file this run created */
	bool made = false;        /* the filesystem is complete: keep created files */
	struct mkfs_messages said = { 0 };
	int status = CLI_EXIT_ERROR;
	int c, ret;

	while ((c = cli_getopt(&args, argc, argv, ":hL:d:m:n:s:b:fMqvKr:", longopts)) != -1) {
		switch (c) {
		case 'L':
			o.label = optarg;
			break;
		case 'd':
		case 'm':
			if (butter_profile_parse(optarg, c == 'd' ? &o.data_profile
								  : &o.meta_profile) < 0) {
				status = cli_usage_error(cmd, "unknown profile '%s'", optarg);
				goto out;
			}
			break;
		case 'n':
			if (parse_u32_size(cmd, "-n", optarg, &o.nodesize) < 0) {
				status = CLI_EXIT_USAGE;
				goto out;
			}
			break;
		case 's':
			if (parse_u32_size(cmd, "-s", optarg, &o.sectorsize) < 0) {
				status = CLI_EXIT_USAGE;
				goto out;
			}
			break;
		case 'b':
			if (cli_parse_size(optarg, &o.size) < 0) {
				status = cli_usage_error(cmd, "-b: invalid size '%s'", optarg);
				goto out;
			}
			break;
		case 'f':
			o.force = 1;
			break;
		case 'M':
			o.mixed = 1;
			break;
		case 'q':
			quiet = true;
			break;
		case 'v':
			verbose = true;
			break;
		case 'K':
			break; /* butter never discards */
		case 'r':
			rootdir = optarg;
			break;
		case OPT_CSUM:
			if (butter_csum_parse(optarg, &o.csum_type) < 0) {
				status = cli_usage_error(cmd, "unknown checksum '%s' (crc32c, xxhash, "
							 "sha256, blake2)", optarg);
				goto out;
			}
			break;
		case OPT_SUBVOL: {
			char **n = realloc(subvols, (nsubvols + 1) * sizeof(*n));
			if (!n || !(n[nsubvols] = subvol_path(optarg))) {
				if (n)
					subvols = n;
				status = n ? cli_usage_error(cmd, "--subvol: '%s' is not a "
							 "directory below --rootdir", optarg)
					   : CLI_EXIT_ERROR;
				goto out;
			}
			subvols = n;
			nsubvols++;
			break;
		}
		case OPT_SHRINK:
			shrink = true;
			break;
		case OPT_COMPRESS:
			compress = optarg;
			break;
		case OPT_MAX_INLINE:
			if (cli_parse_size(optarg, &max_inline) < 0) {
				status = cli_usage_error(cmd, "--max-inline: invalid size '%s'", optarg);
				goto out;
			}
			max_inline_given = true;
			break;
		}
	}
	if (optind >= argc && args.ndevices == 0) {
		status = cli_usage_error(cmd, "missing DEV");
		goto out;
	}

	/* DEV operands first, then any --device: one list */
	ndevs = (size_t)(argc - optind) + args.ndevices;
	devs = calloc(ndevs, sizeof(*devs));
	created = calloc(ndevs, sizeof(*created));
	if (!devs || !created) {
		cli_error("%s", strerror(ENOMEM));
		goto out;
	}
	for (int i = optind; i < argc; i++)
		devs[i - optind] = argv[i];
	for (size_t i = 0; i < args.ndevices; i++)
		devs[(size_t)(argc - optind) + i] = args.devices[i];

	/* promise 1: check before writing anything */
	for (size_t i = 0; i < ndevs; i++) {
		struct stat st;
		for (size_t j = 0; j < i; j++) {
			if (strcmp(devs[i], devs[j]) == 0) {
				status = cli_usage_error(cmd, "%s is given twice", devs[i]);
				goto out;
			}
		}
		if (butter_device_is_nbd(devs[i]))
			continue; /* the library connects, and names what fails */
		if (stat(devs[i], &st) < 0) {
			if (errno == ENOENT && o.size) /* the library creates the image file */
				continue;
			cli_error("%s: %s%s", devs[i], strerror(errno),
				  errno == ENOENT ? " (give -b SIZE to create an image file)" : "");
			goto out;
		}
		if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
			cli_error("%s: not a regular file or block device", devs[i]);
			goto out;
		}
	}
	if (rootdir) {
		struct stat st;
		if (stat(rootdir, &st) < 0) {
			cli_error("%s: %s", rootdir, strerror(errno));
			goto out;
		}
		if (!S_ISDIR(st.st_mode)) {
			cli_error("%s: %s", rootdir, strerror(ENOTDIR));
			goto out;
		}
	}
	if (nsubvols && !rootdir) {
		status = cli_usage_error(cmd, "--subvol needs --rootdir");
		goto out;
	}
	if (compress && !rootdir) {
		status = cli_usage_error(cmd, "--compress needs --rootdir");
		goto out;
	}
	if (max_inline_given && !rootdir) {
		status = cli_usage_error(cmd, "--max-inline needs --rootdir");
		goto out;
	}
	if (shrink && !rootdir) {
		status = cli_usage_error(cmd, "--shrink needs --rootdir");
		goto out;
	}
	for (size_t i = 0; shrink && i < ndevs; i++) {
		struct stat st;
		if (butter_device_is_nbd(devs[i]) ||
		    (stat(devs[i], &st) == 0 && !S_ISREG(st.st_mode))) {
			cli_error("%s: --shrink works on image files only", devs[i]);
			goto out;
		}
	}
	for (size_t i = 0; i < nsubvols; i++) {
		struct stat st;
		char *host = malloc(strlen(rootdir) + strlen(subvols[i]) + 2);
		if (!host) {
			cli_error("%s", strerror(ENOMEM));
			goto out;
		}
		sprintf(host, "%s/%s", rootdir, subvols[i]);
		ret = lstat(host, &st) < 0 ? -errno : S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
		if (ret < 0)
			cli_error("--subvol %s: %s: %s", subvols[i], host, strerror(-ret));
		free(host);
		if (ret < 0)
			goto out;
	}

	if (o.size && create_images(devs, ndevs, created) < 0)
		goto out;
	o.devices = devs;
	o.ndevices = ndevs;
	o.log = mkfs_log;
	o.log_arg = &said;
	ret = butter_mkfs(&o);
	if (ret < 0) {
		/* one line: the library's when it named the device and the problem */
		if (!said.errors)
			cli_error("mkfs failed: %s", strerror(-ret));
		goto out;
	}

	struct copyin_stats copied = { 0 };
	status = CLI_EXIT_OK;
	if (rootdir) {
		ret = fill(devs, ndevs, rootdir, (const char *const *)subvols, nsubvols, compress,
			   max_inline, verbose, quiet, &copied);
		if (ret != 0)
			status = CLI_EXIT_ERROR;
		if (ret < 0)
			goto out;
	}
	if (shrink && shrink_images(devs, ndevs) < 0) {
		status = CLI_EXIT_ERROR;
		goto out;
	}
	made = true;
	if (!quiet && print_summary(cmd, devs, ndevs, &copied, rootdir) < 0)
		status = CLI_EXIT_ERROR;

out:
	if (!made)
		remove_created(devs, ndevs, created);
	for (size_t i = 0; i < nsubvols; i++)
		free(subvols[i]);
	free(subvols);
	free(created);
	free(devs);
	free(args.devices);
	return cli_finish_stdout(status);
}
