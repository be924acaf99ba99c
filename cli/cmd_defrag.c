/*
 * cmd_defrag.c — `butter filesystem defragment`: move each file's data so it
 * lies in one run, keeping what snapshots and reflinks share
 * (butter_defrag()).
 *
 * Two forms, as the first argument decides:
 *   PATH...            files (with -r: directories, recursively) inside a
 *                      live butter mount; each file goes to the daemon as
 *                      BUTTER_IOC_DEFRAG on its own fd
 *   IMAGE [PATH...]    the image offline (PATH inside it; default "/", which
 *                      needs -r as any directory does)
 * Recursion stays inside the subvolume it starts in, as btrfs-progs' stays
 * on one mount. A directory named without -r is reported and skipped.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <butter/control.h>

#include "cli.h"
#include "copyin.h"

struct defrag_run {
	struct butter_defrag_args args;
	struct butter_defrag_stats total;
	bool recursive, verbose;
	int errors;
	/* offline */
	struct butter_fs *fs;
};

static void report_file(struct defrag_run *r, const char *path, const struct butter_defrag_stats *s)
{
	if (!r->verbose)
		return;
	if (s->files_moved)
		printf("%s: %" PRIu64 " bytes rewritten, %" PRIu64 " extents moved (%" PRIu64
		       " bytes), runs %" PRIu64 " -> %" PRIu64 "\n",
		       path, s->bytes_rewritten, s->extents_moved, s->bytes_moved, s->runs_before,
		       s->runs_after);
	else
		printf("%s: already in %" PRIu64 " run%s, left alone\n", path, s->runs_before,
		       s->runs_before == 1 ? "" : "s");
}

static void add_stats(struct butter_defrag_stats *t, const struct butter_defrag_stats *s)
{
	t->files += s->files;
	t->files_moved += s->files_moved;
	t->extents_moved += s->extents_moved;
	t->bytes_moved += s->bytes_moved;
	t->extents_rewritten += s->extents_rewritten;
	t->bytes_rewritten += s->bytes_rewritten;
	t->runs_before += s->runs_before;
	t->runs_after += s->runs_after;
}

/* ---- on a mount ---- */

static struct defrag_run *mount_run; /* nftw passes no argument; one run at a time */

static int mount_file(const char *path)
{
	struct butter_ioc_defrag req;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);

	if (fd < 0) {
		cli_error("%s: %s", path, strerror(errno));
		mount_run->errors++;
		return 0;
	}
	memset(&req, 0, sizeof(req));
	req.args = mount_run->args;
	if (ioctl(fd, BUTTER_IOC_DEFRAG, &req) < 0) {
		cli_error("%s: %s", path,
			  errno == ENOTTY ? "not inside a butter mount" : strerror(errno));
		mount_run->errors++;
	} else {
		report_file(mount_run, path, &req.stats);
		add_stats(&mount_run->total, &req.stats);
	}
	close(fd);
	return 0;
}

static int mount_visit(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)ftw;
	if (type == FTW_F && S_ISREG(st->st_mode))
		return mount_file(path);
	if (type == FTW_DNR || type == FTW_NS) {
		cli_error("%s: cannot be read", path);
		mount_run->errors++;
	}
	return 0;
}

static void run_on_mount(struct defrag_run *r, char **paths, int n)
{
	int i;

	mount_run = r;
	for (i = 0; i < n; i++) {
		struct stat st;

		if (lstat(paths[i], &st) < 0) {
			cli_error("%s: %s", paths[i], strerror(errno));
			r->errors++;
		} else if (S_ISDIR(st.st_mode)) {
			if (!r->recursive)
				fprintf(stderr, "butter: %s: a directory (give -r for the files in it)\n",
					paths[i]);
			else if (nftw(paths[i], mount_visit, 64, FTW_PHYS | FTW_MOUNT) < 0)
				cli_error("%s: %s", paths[i], strerror(errno)), r->errors++;
		} else if (S_ISREG(st.st_mode)) {
			mount_file(paths[i]);
		}
	}
	mount_run = NULL;
}

/* ---- offline ---- */

struct child {
	char *name;
	butter_ino_t ino;
	unsigned dtype;
};

struct child_list {
	struct child *c;
	size_t n, cap;
	int err;
};

static int take_child(void *arg, const char *name, size_t namelen, butter_ino_t ino, unsigned dtype,
		      uint64_t next_pos)
{
	struct child_list *l = arg;

	(void)next_pos;
	if (dtype != DT_DIR && dtype != DT_REG)
		return 0;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 32;
		struct child *c = realloc(l->c, cap * sizeof(*c));

		if (!c) {
			l->err = -ENOMEM;
			return 1;
		}
		l->c = c;
		l->cap = cap;
	}
	l->c[l->n].name = strndup(name, namelen);
	if (!l->c[l->n].name) {
		l->err = -ENOMEM;
		return 1;
	}
	l->c[l->n].ino = ino;
	l->c[l->n].dtype = dtype;
	l->n++;
	return 0;
}

static void image_file(struct defrag_run *r, const char *path, butter_ino_t ino)
{
	struct butter_defrag_stats s;
	int ret;

	memset(&s, 0, sizeof(s));
	ret = butter_defrag(r->fs, ino, &r->args, &s);
	if (ret < 0) {
		cli_error("%s: %s", path, strerror(-ret));
		r->errors++;
		return;
	}
	report_file(r, path, &s);
	add_stats(&r->total, &s);
}

static void image_dir(struct defrag_run *r, const char *path, butter_ino_t dir)
{
	struct child_list l = { 0 };
	size_t i;
	int ret;

	ret = butter_readdir(r->fs, dir, 0, take_child, &l);
	if (ret >= 0 && l.err)
		ret = l.err;
	if (ret < 0) {
		cli_error("%s: %s", path, strerror(-ret));
		r->errors++;
	}
	for (i = 0; i < l.n; i++) {
		char *sub = NULL;

		if (ret >= 0 && asprintf(&sub, "%s%s%s", path, path[strlen(path) - 1] == '/' ? "" : "/",
					 l.c[i].name) >= 0) {
			if (l.c[i].dtype == DT_REG)
				image_file(r, sub, l.c[i].ino);
			else if (l.c[i].ino.subvol == dir.subvol) /* stay in the subvolume */
				image_dir(r, sub, l.c[i].ino);
		}
		free(sub);
		free(l.c[i].name);
	}
	free(l.c);
}

static void run_on_image(struct defrag_run *r, char **paths, int n)
{
	char *root = "/";
	int i;

	if (n == 0) {
		paths = &root;
		n = 1;
	}
	for (i = 0; i < n; i++) {
		struct butter_stat st;
		butter_ino_t ino;
		int ret = cli_resolve(r->fs, paths[i], false, &ino);

		if (ret == 0)
			ret = butter_stat(r->fs, ino, &st);
		if (ret < 0) {
			cli_error("%s: %s", paths[i], strerror(-ret));
			r->errors++;
		} else if (S_ISDIR(st.mode)) {
			if (!r->recursive)
				fprintf(stderr, "butter: %s: a directory (give -r for the files in it)\n",
					paths[i]);
			else
				image_dir(r, paths[i], ino);
		} else if (S_ISREG(st.mode)) {
			image_file(r, paths[i], ino);
		}
	}
}

int cmd_defrag(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct defrag_run r;
	struct stat st;
	const char *algo = NULL, *level = NULL;
	int c, status;
	bool on_mount;

	memset(&r, 0, sizeof(r));
	while ((c = cli_getopt(&args, argc, argv, ":hrvt:s:l:c::L:f", longopts)) != -1) {
		uint64_t v;

		switch (c) {
		case 'r':
			r.recursive = true;
			break;
		case 'v':
			r.verbose = true;
			break;
		case 'f':
			break; /* btrfs-progs' flush: every defragment here commits */
		case 't':
		case 's':
		case 'l':
			if (cli_parse_size(optarg, &v) < 0) {
				free(args.devices);
				return cli_usage_error(cmd, "-%c: not a size: %s", c, optarg);
			}
			if (c == 't')
				r.args.target = v;
			else if (c == 's')
				r.args.start = v;
			else
				r.args.len = v;
			break;
		case 'c':
			algo = optarg ? optarg : "zlib"; /* btrfs-progs' default */
			break;
		case 'L':
			level = optarg;
			break;
		default:
			break;
		}
	}
	if (optind >= argc) {
		free(args.devices);
		return cli_usage_error(cmd, "missing PATH or IMAGE");
	}
	if (level && !algo) {
		free(args.devices);
		return cli_usage_error(cmd, "-L needs -c");
	}
	if (algo) {
		int n = level ? snprintf(r.args.compress, sizeof(r.args.compress), "%s:%s", algo, level)
			      : snprintf(r.args.compress, sizeof(r.args.compress), "%s", algo);

		if (n < 0 || (size_t)n >= sizeof(r.args.compress) ||
		    (strcmp(algo, "zlib") && strcmp(algo, "lzo") && strcmp(algo, "zstd"))) {
			free(args.devices);
			return cli_usage_error(cmd, "-c: zlib, lzo or zstd (with -L a level), not %s",
					       r.args.compress);
		}
	}
	/* a path inside a butter mount answers BUTTER_IOC_INFO; an image does not */
	on_mount = false;
	if (args.ndevices == 0 && lstat(argv[optind], &st) == 0 &&
	    (S_ISDIR(st.st_mode) || S_ISREG(st.st_mode))) {
		int fd = open(argv[optind], O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
		struct butter_ioc_info info;

		on_mount = fd >= 0 && ioctl(fd, BUTTER_IOC_INFO, &info) == 0;
		if (fd >= 0)
			close(fd);
		if (!on_mount && S_ISDIR(st.st_mode)) {
			free(args.devices);
			cli_error("%s: a directory that is not inside a butter mount", argv[optind]);
			return CLI_EXIT_ERROR;
		}
	}
	if (on_mount) {
		run_on_mount(&r, argv + optind, argc - optind);
	} else {
		if (copyin_open_rw(argv[optind], args.devices, args.ndevices, &r.fs) < 0) {
			free(args.devices);
			return CLI_EXIT_ERROR;
		}
		run_on_image(&r, argv + optind + 1, argc - optind - 1);
		{
			int ret = butter_sync(r.fs);

			if (ret < 0) {
				cli_error("%s: %s", argv[optind], strerror(-ret));
				r.errors++;
			}
		}
		butter_close(r.fs);
	}
	free(args.devices);
	printf("%" PRIu64 " file%s, %" PRIu64 " defragmented: %" PRIu64 " bytes rewritten, %" PRIu64
	       " extents moved (%" PRIu64 " bytes); runs %" PRIu64 " -> %" PRIu64 "\n",
	       r.total.files, r.total.files == 1 ? "" : "s", r.total.files_moved,
	       r.total.bytes_rewritten, r.total.extents_moved, r.total.bytes_moved,
	       r.total.runs_before, r.total.runs_after);
	status = r.errors ? CLI_EXIT_ERROR : CLI_EXIT_OK;
	return cli_finish_stdout(status);
}
