/*
 * cmd_ls.c — `butter ls` and `butter cat`: look at single directories and
 * files of an image without extracting them.
 *
 * ls prints like `LC_ALL=C ls -1` (names sorted bytewise, one a line) or, with
 * -l, like `ls -l` with numeric owners and long-iso times. cat streams a file
 * to standard output in large reads and stops, naming the path and offset, at
 * the first range the library cannot read.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

struct ls_entry {
	char *name;
	size_t namelen;
	butter_ino_t ino;
	struct butter_stat st;
	char *target; /* symlinks, with -l */
	int err;      /* from butter_stat, with -l */
};

struct ls_list {
	struct ls_entry *v;
	size_t n, cap;
};

static int ls_collect(void *arg, const char *name, size_t namelen, butter_ino_t ino,
		      unsigned dtype, uint64_t next_pos)
{
	struct ls_list *l = arg;

	(void)dtype;
	(void)next_pos;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		struct ls_entry *v = realloc(l->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		l->v = v;
		l->cap = cap;
	}
	struct ls_entry *e = &l->v[l->n];
	memset(e, 0, sizeof(*e));
	e->name = malloc(namelen + 1);
	if (!e->name)
		return -ENOMEM;
	memcpy(e->name, name, namelen);
	e->name[namelen] = '\0';
	e->namelen = namelen;
	e->ino = ino;
	l->n++;
	return 0;
}

static int ls_cmp(const void *a, const void *b)
{
	const struct ls_entry *x = a, *y = b;
	size_t n = x->namelen < y->namelen ? x->namelen : y->namelen;
	int c = memcmp(x->name, y->name, n);

	if (c)
		return c;
	return (x->namelen > y->namelen) - (x->namelen < y->namelen);
}

/* Fill @buf (11 bytes) with the `ls -l` mode string of @mode. */
static void mode_string(char *buf, uint32_t mode)
{
	char t;

	switch (mode & S_IFMT) {
	case S_IFDIR: t = 'd'; break;
	case S_IFLNK: t = 'l'; break;
	case S_IFCHR: t = 'c'; break;
	case S_IFBLK: t = 'b'; break;
	case S_IFIFO: t = 'p'; break;
	case S_IFSOCK: t = 's'; break;
	case S_IFREG: t = '-'; break;
	default: t = '?'; break;
	}
	buf[0] = t;
	buf[1] = mode & S_IRUSR ? 'r' : '-';
	buf[2] = mode & S_IWUSR ? 'w' : '-';
	buf[3] = mode & S_ISUID ? (mode & S_IXUSR ? 's' : 'S') : (mode & S_IXUSR ? 'x' : '-');
	buf[4] = mode & S_IRGRP ? 'r' : '-';
	buf[5] = mode & S_IWGRP ? 'w' : '-';
	buf[6] = mode & S_ISGID ? (mode & S_IXGRP ? 's' : 'S') : (mode & S_IXGRP ? 'x' : '-');
	buf[7] = mode & S_IROTH ? 'r' : '-';
	buf[8] = mode & S_IWOTH ? 'w' : '-';
	buf[9] = mode & S_ISVTX ? (mode & S_IXOTH ? 't' : 'T') : (mode & S_IXOTH ? 'x' : '-');
	buf[10] = '\0';
}

/* The size column: bytes, or "major, minor" for device nodes. */
static void size_string(char *buf, size_t size, const struct butter_stat *st)
{
	if (S_ISCHR(st->mode) || S_ISBLK(st->mode))
		snprintf(buf, size, "%u, %u", major((dev_t)st->rdev), minor((dev_t)st->rdev));
	else
		snprintf(buf, size, "%" PRIu64, st->size);
}

struct ls_widths {
	int nlink, uid, gid, size;
};

static int digits(uint64_t v)
{
	int n = 1;
	while (v >= 10) {
		v /= 10;
		n++;
	}
	return n;
}

static void widen(struct ls_widths *w, const struct butter_stat *st)
{
	char sz[48];
	int n;

	if ((n = digits(st->nlink)) > w->nlink)
		w->nlink = n;
	if ((n = digits(st->uid)) > w->uid)
		w->uid = n;
	if ((n = digits(st->gid)) > w->gid)
		w->gid = n;
	size_string(sz, sizeof(sz), st);
	if ((n = (int)strlen(sz)) > w->size)
		w->size = n;
}

static void print_long(const struct ls_widths *w, const struct butter_stat *st, const char *name,
		       size_t namelen, const char *target)
{
	char mode[11], sz[48], when[64];
	struct tm tm;
	time_t t = st->mtime.tv_sec;

	mode_string(mode, st->mode);
	size_string(sz, sizeof(sz), st);
	if (!localtime_r(&t, &tm) || !strftime(when, sizeof(when), "%Y-%m-%d %H:%M", &tm))
		snprintf(when, sizeof(when), "%lld", (long long)t);
	printf("%s %*" PRIu32 " %*" PRIu32 " %*" PRIu32 " %*s %s ", mode, w->nlink, st->nlink,
	       w->uid, st->uid, w->gid, st->gid, w->size, sz, when);
	fwrite(name, 1, namelen, stdout);
	if (target)
		printf(" -> %s", target);
	putchar('\n');
}

static const char *type_name(uint32_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG: return "file";
	case S_IFDIR: return "directory";
	case S_IFLNK: return "symlink";
	case S_IFCHR: return "char";
	case S_IFBLK: return "block";
	case S_IFIFO: return "fifo";
	case S_IFSOCK: return "socket";
	default: return "unknown";
	}
}

/* One entry of --format json's "directory-listing" (layout in README). */
static void json_entry(const struct butter_stat *st, const char *name, size_t namelen,
		       const char *target)
{
	char buf[48], *copy = strndup(name, namelen);

	cli_jw_open(NULL, '{');
	cli_jw_str("name", copy ? copy : "");
	free(copy);
	cli_jw_str("type", type_name(st->mode));
	snprintf(buf, sizeof(buf), "%o", st->mode & 07777);
	cli_jw_str("mode", buf);
	cli_jw_u64("subvol", st->subvol);
	cli_jw_u64("ino", st->ino);
	cli_jw_u64("nlink", st->nlink);
	cli_jw_u64("uid", st->uid);
	cli_jw_u64("gid", st->gid);
	cli_jw_u64("size", st->size);
	cli_jw_u64("blocks", st->blocks);
	cli_jw_u64("rdev", st->rdev);
	snprintf(buf, sizeof(buf), "%lld.%09ld", (long long)st->mtime.tv_sec, (long)st->mtime.tv_nsec);
	cli_jw_str("mtime", buf);
	if (target)
		cli_jw_str("target", target);
	cli_jw_close();
}

/* List the directory @dir (shown as @path in messages). Returns an exit status. */
static int ls_dir(struct butter_fs *fs, const char *path, butter_ino_t dir, bool lng)
{
	struct ls_list l = { 0 };
	int status = CLI_EXIT_OK;
	int ret = butter_readdir(fs, dir, 0, ls_collect, &l);

	if (ret < 0) {
		cli_error("%s: %s", path, strerror(-ret));
		status = CLI_EXIT_ERROR;
	}
	if (l.n)
		qsort(l.v, l.n, sizeof(*l.v), ls_cmp);

	if (lng || cli_json) {
		struct ls_widths w = { 0 };
		uint64_t blocks = 0;
		for (size_t i = 0; i < l.n; i++) {
			struct ls_entry *e = &l.v[i];
			e->err = butter_stat(fs, e->ino, &e->st);
			if (e->err < 0)
				continue;
			if (S_ISLNK(e->st.mode))
				e->err = cli_readlink(fs, e->ino, e->st.size, &e->target);
			widen(&w, &e->st);
			blocks += e->st.blocks;
		}
		if (cli_json)
			cli_jw_open("directory-listing", '[');
		else
			printf("total %" PRIu64 "\n", (blocks + 1) / 2);
		for (size_t i = 0; i < l.n; i++) {
			struct ls_entry *e = &l.v[i];
			if (e->err < 0) {
				size_t pl = strlen(path);
				cli_error("%s%s%s: %s", path, pl && path[pl - 1] == '/' ? "" : "/",
					  e->name, strerror(-e->err));
				status = CLI_EXIT_ERROR;
				continue;
			}
			if (cli_json)
				json_entry(&e->st, e->name, e->namelen, e->target);
			else
				print_long(&w, &e->st, e->name, e->namelen, e->target);
		}
		if (cli_json)
			cli_jw_close();
	} else {
		for (size_t i = 0; i < l.n; i++) {
			fwrite(l.v[i].name, 1, l.v[i].namelen, stdout);
			putchar('\n');
		}
	}

	for (size_t i = 0; i < l.n; i++) {
		free(l.v[i].name);
		free(l.v[i].target);
	}
	free(l.v);
	return status;
}

int cmd_ls(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "long", no_argument, NULL, 'l' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	bool lng = false;
	int c;

	while ((c = cli_getopt(&args, argc, argv, ":hl", longopts)) != -1) {
		if (c == 'l')
			lng = true;
	}
	if (optind >= argc)
		return cli_usage_error(cmd, "missing IMAGE");
	if (argc - optind > 2)
		return cli_usage_error(cmd, "too many arguments");
	const char *image = argv[optind];
	const char *path = argc - optind == 2 ? argv[optind + 1] : "/";

	struct butter_fs *fs;
	if (cli_open(&args, image, &fs) < 0) {
		free(args.devices);
		return CLI_EXIT_ERROR;
	}

	int status = CLI_EXIT_OK;
	butter_ino_t ino;
	struct butter_stat st;
	int ret = cli_resolve(fs, path, false, &ino);
	if (ret == 0)
		ret = butter_stat(fs, ino, &st);
	if (ret == 0 && S_ISLNK(st.mode) && !lng && !cli_json) {
		/* As ls does for an operand: list the directory a symlink names. */
		butter_ino_t t;
		struct butter_stat tst;
		if (cli_resolve(fs, path, true, &t) == 0 && butter_stat(fs, t, &tst) == 0 &&
		    S_ISDIR(tst.mode)) {
			ino = t;
			st = tst;
		}
	}
	if (cli_json)
		cli_jw_open(NULL, '{');
	if (ret < 0) {
		cli_error("%s: %s", path, strerror(-ret));
		status = CLI_EXIT_ERROR;
	} else if (S_ISDIR(st.mode)) {
		status = ls_dir(fs, path, ino, lng);
	} else if (lng || cli_json) {
		struct ls_widths w = { 0 };
		char *target = NULL;
		if (S_ISLNK(st.mode))
			ret = cli_readlink(fs, ino, st.size, &target);
		if (ret < 0) {
			cli_error("%s: %s", path, strerror(-ret));
			status = CLI_EXIT_ERROR;
		} else {
			widen(&w, &st);
			if (cli_json) {
				cli_jw_open("directory-listing", '[');
				json_entry(&st, path, strlen(path), target);
				cli_jw_close();
			} else {
				print_long(&w, &st, path, strlen(path), target);
			}
		}
		free(target);
	} else {
		printf("%s\n", path);
	}
	if (cli_json) {
		if (status != CLI_EXIT_OK && ret < 0) {
			cli_jw_open("directory-listing", '[');
			cli_jw_close();
		}
		cli_jw_close();
	}

	butter_close(fs);
	free(args.devices);
	return cli_finish_stdout(status);
}

#define CAT_CHUNK (1u << 20)

/* Write all of @buf to @fd; 0 or a negative errno. */
static int write_all(int fd, const char *buf, size_t len)
{
	while (len) {
		ssize_t n = write(fd, buf, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

static uint64_t info_sectorsize(struct butter_fs *fs)
{
	struct butter_info info;

	if (butter_get_info(fs, &info) < 0 || !info.sectorsize)
		return 4096;
	return info.sectorsize;
}

int cmd_cat(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };

	while (cli_getopt(&args, argc, argv, ":h", longopts) != -1)
		;
	if (argc - optind < 2)
		return cli_usage_error(cmd, argc - optind < 1 ? "missing IMAGE" : "missing PATH");
	if (argc - optind > 2)
		return cli_usage_error(cmd, "too many arguments");
	const char *image = argv[optind];
	const char *path = argv[optind + 1];

	struct butter_fs *fs;
	if (cli_open(&args, image, &fs) < 0) {
		free(args.devices);
		return CLI_EXIT_ERROR;
	}

	int status = CLI_EXIT_ERROR;
	butter_ino_t ino;
	struct butter_stat st;
	char *buf = NULL;
	int ret = cli_resolve(fs, path, true, &ino);
	if (ret == 0)
		ret = butter_stat(fs, ino, &st);
	if (ret == 0 && S_ISDIR(st.mode))
		ret = -EISDIR;
	if (ret < 0) {
		cli_error("%s: %s", path, strerror(-ret));
		goto out;
	}
	if (!S_ISREG(st.mode)) {
		cli_error("%s: not a regular file", path);
		goto out;
	}
	buf = malloc(CAT_CHUNK);
	if (!buf) {
		cli_error("%s: %s", path, strerror(ENOMEM));
		goto out;
	}
	for (uint64_t off = 0;;) {
		ssize_t n = butter_read(fs, ino, buf, CAT_CHUNK, off);
		if (n == -EIO) {
			/* Write what reads before the first bad sector, then stop there. */
			uint64_t ss = info_sectorsize(fs), got = 0;
			ssize_t r = 1;
			while (got < CAT_CHUNK) {
				size_t len = (size_t)(ss - (off + got) % ss);
				if (len > CAT_CHUNK - got)
					len = (size_t)(CAT_CHUNK - got);
				r = butter_read(fs, ino, buf + got, len, off + got);
				if (r <= 0)
					break;
				got += (uint64_t)r;
				if ((size_t)r < len) {
					r = 0;
					break;
				}
			}
			ret = write_all(STDOUT_FILENO, buf, (size_t)got);
			if (ret < 0) {
				cli_error("standard output: %s", strerror(-ret));
				goto out;
			}
			off += got;
			if (r == 0)
				break;
			if (r > 0)
				continue;
			n = r;
		}
		if (n < 0) {
			cli_error("%s: unreadable at byte %" PRIu64 ": %s", path, off,
				  strerror((int)-n));
			goto out;
		}
		if (n == 0)
			break;
		ret = write_all(STDOUT_FILENO, buf, (size_t)n);
		if (ret < 0) {
			cli_error("standard output: %s", strerror(-ret));
			goto out;
		}
		off += (uint64_t)n;
	}
	status = CLI_EXIT_OK;
out:
	free(buf);
	butter_close(fs);
	free(args.devices);
	return status;
}
