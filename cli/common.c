/*
 * common.c — what every command of `butter` shares: option parsing for
 * --device and --help, usage and error messages, opening the image, size and
 * uuid formatting, path resolution that follows a final symlink, the
 * split of a subvolume path into its parent and its name, and, for the
 * commands that walk host trees (extract, put, mkfs --rootdir), opening host
 * directories without following symlinks and growing buffers.
 *
 * Promises: usage errors exit 2 with the usage on stderr; --help prints on
 * stdout and exits 0; every error message starts with "butter: " and names
 * the file it is about.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <linux/fs.h>

#include "cli.h"

int cli_log_level;
unsigned cli_open_flags;

struct butter_test_devices cli_test_devices;
bool cli_json;

/* A JSON string: quotes, backslash escapes, control bytes as \u00XX. */
static void json_string(const char *v)
{
	putchar('"');
	for (; *v; v++) {
		unsigned char ch = (unsigned char)*v;

		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

/* progs' layout: a header object, then one named list of objects, two-space indents. */
void cli_json_begin(const char *list_name)
{
	printf("{\n  \"__header\": {\n    \"version\": \"1\"\n  },\n  ");
	json_string(list_name);
	printf(": [\n");
}

void cli_json_item_begin(bool first)
{
	printf(first ? "    {\n" : ",\n    {\n");
}

void cli_json_member(const char *key, const char *value, bool last)
{
	printf("      ");
	json_string(key);
	printf(": ");
	json_string(value);
	printf(last ? "\n" : ",\n");
}

void cli_json_member_u64(const char *key, uint64_t value, bool last)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%" PRIu64, value);
	cli_json_member(key, buf, last); /* progs quotes numbers too */
}

void cli_json_item_end(void)
{
	printf("    }");
}

void cli_json_end(bool any)
{
	printf(any ? "\n  ]\n}\n" : "  ]\n}\n");
}

/*
 * The nested writer (butter's own layouts): a stack of open objects and
 * lists, each knowing whether it has a member yet (for the commas).
 */
#define JW_DEPTH 8
static struct {
	int depth;
	bool any[JW_DEPTH];
	char kind[JW_DEPTH];
} jw;

static void jw_member_start(const char *key)
{
	if (jw.depth > 0) {
		printf(jw.any[jw.depth - 1] ? ",\n" : "\n");
		jw.any[jw.depth - 1] = true;
	}
	printf("%*s", 2 * jw.depth, "");
	if (key && jw.depth > 0 && jw.kind[jw.depth - 1] == '{') {
		json_string(key);
		printf(": ");
	}
}

void cli_jw_open(const char *key, char kind)
{
	jw_member_start(key);
	putchar(kind);
	if (jw.depth < JW_DEPTH) {
		jw.any[jw.depth] = false;
		jw.kind[jw.depth] = kind;
	}
	jw.depth++;
	if (jw.depth == 1) { /* the document: progs' header first */
		printf("\n  \"__header\": {\n    \"version\": \"1\"\n  }");
		jw.any[0] = true;
	}
}

void cli_jw_close(void)
{
	char kind = jw.depth > 0 && jw.depth <= JW_DEPTH ? jw.kind[jw.depth - 1] : '{';
	bool any = jw.depth > 0 && jw.depth <= JW_DEPTH && jw.any[jw.depth - 1];

	jw.depth--;
	if (any)
		printf("\n%*s", 2 * jw.depth, "");
	putchar(kind == '[' ? ']' : '}');
	if (jw.depth == 0)
		putchar('\n');
}

void cli_jw_str(const char *key, const char *value)
{
	jw_member_start(key);
	json_string(value ? value : "");
}

void cli_jw_u64(const char *key, uint64_t value)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%" PRIu64, value);
	cli_jw_str(key, buf); /* quoted, as progs writes numbers */
}

int cli_json_unsupported(void)
{
	cli_error("output format json is unsupported for this command");
	return CLI_EXIT_ERROR;
}

void cli_print_usage(const struct cli_command *cmd, FILE *out)
{
	fprintf(out, "usage: butter %s %s\n\n%s\n", cmd->name, cmd->synopsis, cmd->usage);
	if (strstr(cmd->synopsis, "--device")) /* only where it applies */
		fprintf(out, "  --device DEV   another member of a multi-device filesystem (repeatable)\n");
	fprintf(out, "  -h, --help     show this help\n");
}

int cli_usage_error(const struct cli_command *cmd, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "butter %s: ", cmd->name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\n", stderr);
	cli_print_usage(cmd, stderr);
	return CLI_EXIT_USAGE;
}

void cli_error(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fputs("butter: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\n", stderr);
}

int cli_getopt(struct cli_args *args, int argc, char **argv, const char *shortopts,
	       const struct option *longopts)
{
	for (;;) {
		opterr = 0;
		int c = getopt_long(argc, argv, shortopts, longopts, NULL);
		switch (c) {
		case CLI_OPT_DEVICE: {
			const char **d = realloc(args->devices, (args->ndevices + 1) * sizeof(*d));
			if (!d) {
				cli_error("out of memory");
				exit(CLI_EXIT_ERROR);
			}
			d[args->ndevices++] = optarg;
			args->devices = d;
			continue;
		}
		case CLI_OPT_HELP:
			cli_print_usage(args->cmd, stdout);
			exit(cli_finish_stdout(CLI_EXIT_OK));
		case '?':
			if (optopt && optopt < 0x100)
				exit(cli_usage_error(args->cmd, "unknown option '-%c'", optopt));
			exit(cli_usage_error(args->cmd, "unknown option '%s'", argv[optind - 1]));
		case ':':
			if (optopt && optopt < 0x100)
				exit(cli_usage_error(args->cmd, "option '-%c' needs an argument",
						     optopt));
			exit(cli_usage_error(args->cmd, "option '%s' needs an argument",
					     argv[optind - 1]));
		default:
			return c;
		}
	}
}

const char *cli_open_error(int err)
{
	switch (err) {
	case EINVAL:
		return "not a btrfs filesystem";
	case ENXIO:
		return "devices are missing (give the other members with --device)";
	case EUCLEAN:
		return "filesystem is corrupt";
	case EOPNOTSUPP:
		return "uses a feature butter does not support";
	case EBUSY:
		return "in use (see above)";
	case EFBIG:
		return "a device is smaller than the filesystem on it (see above)";
	default:
		return strerror(err);
	}
}

const char *cli_nbd_open_error(const char *image, const char *const *devices, size_t ndevices,
			       int err)
{
	bool nbd = butter_device_is_nbd(image);

	for (size_t i = 0; i < ndevices && !nbd; i++)
		nbd = butter_device_is_nbd(devices[i]);
	if (!nbd || !butter_nbd_open_error(-err))
		return NULL;
	return err == EROFS ? "a device cannot be written (see above)"
			    : "a device could not be opened (see above)";
}

int cli_devices_exist(const char *image, const char *const *devices, size_t ndevices)
{
	struct stat st;

	/* Name the missing file ourselves: the library's -ENOENT does not say which. */
	for (size_t i = 0; i <= ndevices; i++) {
		const char *name = i == 0 ? image : devices[i - 1];

		if (!butter_device_is_nbd(name) && stat(name, &st) < 0) {
			int err = errno;
			cli_error("%s: %s", name, strerror(err));
			return -err;
		}
	}
	return 0;
}

int cli_open(const struct cli_args *args, const char *image, struct butter_fs **fs)
{
	int ret = cli_devices_exist(image, args->devices, args->ndevices);

	if (ret < 0)
		return ret;

	struct butter_open_opts opts = {
		.devices = args->devices,
		.ndevices = args->ndevices,
		.flags = BUTTER_OPEN_RDONLY | BUTTER_OPEN_DEGRADED | args->open_flags,
	};
	ret = butter_open_testing(image, &opts, &cli_test_devices, fs);
	if (ret < 0) {
		const char *why = cli_nbd_open_error(image, args->devices, args->ndevices, -ret);

		cli_error("%s: %s", image, why ? why : cli_open_error(-ret));
	}
	return ret;
}

uint64_t cli_device_size(const char *path)
{
	uint64_t size = 0;

	return butter_device_size(path, &size) == 0 ? size : 0;
}

bool cli_is_mount_path(const char *path, const struct cli_args *args)
{
	struct stat st;

	return args->ndevices == 0 && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int cli_finish_stdout(int status)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		int err = errno;
		fprintf(stderr, "butter: standard output: %s\n", strerror(err ? err : EIO));
		return CLI_EXIT_ERROR;
	}
	return status;
}

const char *cli_size(char *buf, size_t bufsize, uint64_t bytes, bool raw)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };

	if (raw) {
		snprintf(buf, bufsize, "%llu", (unsigned long long)bytes);
		return buf;
	}
	double v = (double)bytes;
	size_t u = 0;
	while (v >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024.0;
		u++;
	}
	snprintf(buf, bufsize, "%.2f%s", v, units[u]);
	return buf;
}

int cli_units_option(struct cli_units *u, int c)
{
	switch (c) {
	case 'b': case CLI_OPT_RAW: u->fixed = -1; return 1;
	case CLI_OPT_HUMAN: u->fixed = 0; u->si = false; return 1;
	case 'H': u->fixed = 0; u->si = true; return 1;
	case 'k': case CLI_OPT_KBYTES: u->fixed = 1; return 1;
	case 'm': case CLI_OPT_MBYTES: u->fixed = 2; return 1;
	case 'g': case CLI_OPT_GBYTES: u->fixed = 3; return 1;
	case 't': case CLI_OPT_TBYTES: u->fixed = 4; return 1;
	case CLI_OPT_IEC: u->si = false; return 1;
	case CLI_OPT_SI: u->si = true; return 1;
	}
	return 0;
}

void cli_units_fix_h(int argc, char **argv)
{
	static char human[] = "--human-readable";

	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		if (!strcmp(argv[i], "-h"))
			argv[i] = human;
}

const char *cli_size_units(char *buf, size_t bufsize, uint64_t bytes, const struct cli_units *u)
{
	static const char *const iec[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	static const char *const si[] = { "B", "kB", "MB", "GB", "TB", "PB", "EB" };
	const char *const *names = u && u->si ? si : iec;
	uint64_t mult = u && u->si ? 1000 : 1024, divisor = 1, last = bytes, left = bytes;
	float fraction;
	int n = 0;

	if (u && u->fixed < 0) {
		snprintf(buf, bufsize, "%llu", (unsigned long long)bytes);
		return buf;
	}
	/*
	 * The arithmetic of btrfs-progs, so that the last digit agrees: a fixed
	 * unit divides the whole size once; human mode divides in integers until
	 * below the base and the last step in single-precision float.
	 */
	if (u && u->fixed > 0) {
		for (; n < u->fixed; n++)
			divisor *= mult;
	} else {
		while (left >= mult && n + 1 < 7) {
			last = left;
			left /= mult;
			n++;
		}
		divisor = n ? mult : 1;
	}
	fraction = (float)last / (float)divisor;
	snprintf(buf, bufsize, "%.2f%s", (double)fraction, names[n]);
	return buf;
}

const char *cli_uuid(char buf[37], const uint8_t uuid[16])
{
	static const char hex[] = "0123456789abcdef";
	char *p = buf;

	for (int i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*p++ = '-';
		*p++ = hex[uuid[i] >> 4];
		*p++ = hex[uuid[i] & 15];
	}
	*p = '\0';
	return buf;
}

int cli_readlink(struct butter_fs *fs, butter_ino_t ino, uint64_t size_hint, char **out)
{
	size_t size = size_hint < 4096 ? 4096 : size_hint + 1;

	for (;;) {
		if (size > (1u << 20))
			return -ENAMETOOLONG;
		char *buf = malloc(size);
		if (!buf)
			return -ENOMEM;
		ssize_t n = butter_readlink(fs, ino, buf, size);
		if (n < 0) {
			free(buf);
			return (int)n;
		}
		if ((size_t)n < size) {
			buf[n] = '\0';
			*out = buf;
			return 0;
		}
		free(buf);
		size = (size_t)n + 1;
	}
}

int cli_resolve(struct butter_fs *fs, const char *path, bool follow, butter_ino_t *out)
{
	char *cur = strdup(path);
	int ret;

	if (!cur)
		return -ENOMEM;
	for (int hops = 0;; hops++) {
		struct butter_stat st;
		char *target = NULL;

		ret = butter_resolve(fs, cur, out);
		if (ret < 0 || !follow)
			break;
		ret = butter_stat(fs, *out, &st);
		if (ret < 0 || !S_ISLNK(st.mode))
			break;
		if (hops == 40) {
			ret = -ELOOP;
			break;
		}
		ret = cli_readlink(fs, *out, st.size, &target);
		if (ret < 0)
			break;

		/* A relative target is relative to the directory holding the link. */
		size_t len = strlen(cur);
		while (len > 1 && cur[len - 1] == '/')
			len--;
		while (len > 0 && cur[len - 1] != '/')
			len--;
		if (target[0] == '/')
			len = 0;
		char *next = malloc(len + strlen(target) + 1);
		if (!next) {
			free(target);
			ret = -ENOMEM;
			break;
		}
		memcpy(next, cur, len);
		strcpy(next + len, target);
		free(target);
		free(cur);
		cur = next;
	}
	free(cur);
	return ret;
}

int cli_split_subvol_path(const char *path, char **copy, const char **name, char **slash)
{
	char *c = strdup(path);

	*copy = c;
	*slash = NULL;
	if (!c) {
		cli_error("%s", strerror(ENOMEM));
		return -1;
	}
	while (strlen(c) > 1 && c[strlen(c) - 1] == '/')
		c[strlen(c) - 1] = '\0';
	*slash = strrchr(c, '/');
	*name = *slash ? *slash + 1 : c;
	if (!**name || !strcmp(*name, ".") || !strcmp(*name, "..")) {
		cli_error("%s: not a subvolume name", path);
		return -1;
	}
	return 0;
}

int cli_grow(char **buf, size_t *cap, size_t need)
{
	if (need <= *cap)
		return 0;
	char *p = realloc(*buf, need);
	if (!p)
		return -ENOMEM;
	*buf = p;
	*cap = need;
	return 0;
}

int cli_openat(int dirfd, const char *name, int flags, bool noatime)
{
	int fd;

	flags |= O_RDONLY | O_NOFOLLOW | O_CLOEXEC;
	if (!noatime)
		return openat(dirfd, name, flags);
	fd = openat(dirfd, name, flags | O_NOATIME);
	if (fd < 0 && errno == EPERM) /* O_NOATIME needs ownership or CAP_FOWNER */
		fd = openat(dirfd, name, flags);
	return fd;
}

int cli_open_dir_path(int top_fd, const char *rel, size_t len, bool noatime)
{
	int fd = dup(top_fd);

	if (fd < 0)
		return -errno;
	for (size_t i = 0; i < len;) {
		while (i < len && rel[i] == '/')
			i++;
		size_t j = i;
		while (j < len && rel[j] != '/')
			j++;
		if (j == i)
			break;
		char comp[NAME_MAX + 1];
		if (j - i > NAME_MAX) {
			close(fd);
			return -ENAMETOOLONG;
		}
		memcpy(comp, rel + i, j - i);
		comp[j - i] = '\0';
		int next = cli_openat(fd, comp, O_DIRECTORY, noatime);
		int err = errno;
		close(fd);
		if (next < 0)
			return -err;
		fd = next;
		i = j;
	}
	return fd;
}

/*
 * Parse a size: digits with an optional K, M, G, T, P or E suffix (powers of
 * 1024, either case, "KiB" and "KB" spellings too). 0 or -EINVAL/-ERANGE.
 */
int cli_parse_size(const char *s, uint64_t *out)
{
	static const char units[] = "kmgtpe";
	char *end;

	if (!isdigit((unsigned char)s[0]))
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno)
		return -ERANGE;
	unsigned shift = 0;
	if (*end) {
		const char *u = strchr(units, tolower((unsigned char)*end));
		if (!u)
			return -EINVAL;
		shift = 10 * (unsigned)(u - units + 1);
		end++;
		if (strcasecmp(end, "ib") == 0 || strcasecmp(end, "b") == 0)
			end += strlen(end);
		if (*end)
			return -EINVAL;
	}
	if (shift && v > (UINT64_MAX >> shift))
		return -ERANGE;
	*out = (uint64_t)v << shift;
	return 0;
}
