/*
 * cmd_edit.c — changing an unmounted image: `butter put` (copy host files
 * in), `butter mkdir`, `butter ln` (symlinks and hard links), `butter rm`.
 *
 * Promises:
 *  1. Nothing is ever replaced: a name that exists is an error. Every check
 *     (the parent is a directory, the name is free, the host file exists)
 *     runs before the first change, so a refused command leaves the image
 *     exactly as it was (no transaction is started, nothing is written).
 *  2. Image paths are taken from the top-level subvolume's root, absolute or
 *     not; symlinks in the parent part are followed inside the image.
 *  3. Changes are committed with butter_sync() and its result is checked
 *     before the command says it succeeded.
 *  4. New directories and symlinks made by mkdir and ln belong to the
 *     caller's effective uid and gid; mkdir's mode is 0777 minus the umask
 *     unless -m says otherwise. put copies owners and modes from the host,
 *     as `cp -a` does (see copyin.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "copyin.h"

/*
 * Check that exactly @n operands, named @names (for "missing NAME"), follow
 * the options. Returns 0, or prints the usage error, frees the --device list
 * and returns -1.
 */
static int want_operands(struct cli_args *args, int argc, int n, const char *const *names)
{
	int nargs = argc - optind;

	if (nargs == n)
		return 0;
	free(args->devices);
	if (nargs > n)
		cli_usage_error(args->cmd, "too many arguments");
	else
		cli_usage_error(args->cmd, "missing %s", names[nargs]);
	return -1;
}

/* An image path cut into the directory that holds it and its last name. */
struct dest {
	char *parent;      /* "/" when the name is at the top */
	char *name;        /* points into the same allocation as parent */
	butter_ino_t dir;  /* the resolved parent directory */
};

static void dest_free(struct dest *d)
{
	free(d->parent);
}

static bool is_dot_or_dotdot(const char *name)
{
	return name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
}

/*
 * Cut @path into parent and name, with @fallback (if not NULL) as the name
 * when @path ends in "/" (put: DEST/ means DEST/NAME). Reports and returns
 * -errno on a path that names no new entry.
 */
static int dest_split(const char *path, const char *fallback, struct dest *d)
{
	size_t len = strlen(path);
	bool dir_only = len > 0 && path[len - 1] == '/';

	while (len > 0 && path[len - 1] == '/')
		len--;
	if (dir_only && fallback) {
		/* parent = the whole path, name = fallback */
		size_t flen = strlen(fallback);
		d->parent = malloc(len + 1 + flen + 1 + 1);
		if (!d->parent)
			goto nomem;
		if (len == 0) {
			strcpy(d->parent, "/");
		} else {
			memcpy(d->parent, path, len);
			d->parent[len] = '\0';
		}
		d->name = d->parent + strlen(d->parent) + 1;
		strcpy(d->name, fallback);
	} else {
		if (len == 0) {
			cli_error("%s: is the top-level directory", *path ? path : "\"\"");
			return -EEXIST;
		}
		d->parent = malloc(len + 3);
		if (!d->parent)
			goto nomem;
		size_t slash = len;
		while (slash > 0 && path[slash - 1] != '/')
			slash--;
		/* parent: path[0, slash) without trailing slashes, or "/" */
		size_t plen = slash;
		while (plen > 0 && path[plen - 1] == '/')
			plen--;
		if (plen == 0) {
			strcpy(d->parent, "/");
			plen = 1;
		} else {
			memcpy(d->parent, path, plen);
			d->parent[plen] = '\0';
		}
		d->name = d->parent + plen + 1;
		memcpy(d->name, path + slash, len - slash);
		d->name[len - slash] = '\0';
	}
	if (is_dot_or_dotdot(d->name)) {
		cli_error("%s: cannot create an entry named '%s'", path, d->name);
		free(d->parent);
		d->parent = NULL;
		return -EINVAL;
	}
	return 0;
nomem:
	cli_error("%s", strerror(ENOMEM));
	return -ENOMEM;
}

/* Resolve the parent of @d and check the name is free (promise 1). Reports errors. */
static int dest_check(struct butter_fs *fs, const char *shown, struct dest *d)
{
	struct butter_stat st;
	butter_ino_t existing;
	int ret = cli_resolve(fs, d->parent, true, &d->dir);

	if (ret == 0)
		ret = butter_stat(fs, d->dir, &st);
	if (ret == 0 && !S_ISDIR(st.mode))
		ret = -ENOTDIR;
	if (ret < 0) {
		cli_error("%s: %s", d->parent, strerror(-ret));
		return ret;
	}
	ret = butter_lookup(fs, d->dir, d->name, strlen(d->name), &existing);
	if (ret == 0) {
		cli_error("%s: %s", shown, strerror(EEXIST));
		return -EEXIST;
	}
	if (ret != -ENOENT) {
		cli_error("%s: %s", shown, strerror(-ret));
		return ret;
	}
	return 0;
}

/* Commit and close (promise 3); returns @status, or CLI_EXIT_ERROR if the commit failed. */
static int finish(struct butter_fs *fs, const char *image, int status)
{
	int ret = butter_sync(fs);

	if (ret < 0) {
		cli_error("%s: committing: %s", image, strerror(-ret));
		status = CLI_EXIT_ERROR;
	}
	butter_close(fs);
	return status;
}

/* ---- put ---------------------------------------------------------------- */

/* The last component of host path @src, or NULL if it has none ("/", ".", ".."). */
static char *host_basename(const char *src)
{
	size_t len = strlen(src);

	while (len > 0 && src[len - 1] == '/')
		len--;
	size_t start = len;
	while (start > 0 && src[start - 1] != '/')
		start--;
	char *name = strndup(src + start, len - start);
	if (name && (!*name || is_dot_or_dotdot(name))) {
		free(name);
		return NULL;
	}
	return name;
}

int cmd_put(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "verbose", no_argument, NULL, 'v' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct copyin_opts opts = { 0 };
	struct copyin_stats stats = { 0 };
	struct dest d = { 0 };
	struct butter_fs *fs = NULL;
	uint64_t (*skip)[2] = NULL;
	char *base = NULL;
	int status = CLI_EXIT_ERROR;
	int c;

	while ((c = cli_getopt(&args, argc, argv, ":hv", longopts)) != -1) {
		if (c == 'v')
			opts.verbose = true;
	}
	static const char *const operands[] = { "IMAGE", "HOSTPATH", "DEST" };
	if (want_operands(&args, argc, 3, operands))
		return CLI_EXIT_USAGE;
	const char *image = argv[optind], *src = argv[optind + 1], *dest = argv[optind + 2];

	struct stat st;
	if (lstat(src, &st) < 0) {
		cli_error("%s: %s", src, strerror(errno));
		goto out;
	}
	base = host_basename(src);
	size_t dlen = strlen(dest);
	if (dlen && dest[dlen - 1] == '/' && !base) {
		cli_error("%s: has no name to use under %s: give DEST a name", src, dest);
		goto out;
	}
	if (dest_split(dest, base, &d) < 0)
		goto out;
	if (copyin_open_rw(image, args.devices, args.ndevices, &fs) < 0)
		goto out;
	if (dest_check(fs, dest, &d) < 0) {
		butter_close(fs); /* nothing was changed: nothing to commit */
		goto out;
	}
	/* the image files never copy themselves into themselves */
	skip = calloc(1 + args.ndevices, sizeof(*skip));
	if (!skip) {
		cli_error("%s", strerror(ENOMEM));
		butter_close(fs);
		goto out;
	}
	for (size_t i = 0; i <= args.ndevices; i++) {
		const char *path = i == 0 ? image : args.devices[i - 1];
		if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			skip[opts.nskip][0] = st.st_dev;
			skip[opts.nskip][1] = st.st_ino;
			opts.nskip++;
		}
	}
	opts.skip = (const uint64_t (*)[2])skip;
	int ret = copyin(fs, src, d.dir, d.name, &opts, &stats);
	status = finish(fs, image, ret == 0 ? CLI_EXIT_OK : CLI_EXIT_ERROR);

out:
	dest_free(&d);
	free(skip);
	free(base);
	free(args.devices);
	return cli_finish_stdout(status);
}

/* ---- mkdir -------------------------------------------------------------- */

static int parse_mode(const char *s, uint32_t *mode)
{
	char *end;
	unsigned long v = strtoul(s, &end, 8);

	if (!*s || *end || v > 07777)
		return -EINVAL;
	*mode = (uint32_t)v;
	return 0;
}

static uint32_t umask_now(void)
{
	mode_t m = umask(0);

	umask(m);
	return (uint32_t)m;
}

int cmd_mkdir(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "parents", no_argument, NULL, 'p' },
		{ "mode", required_argument, NULL, 'm' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	uint32_t mode = 0777 & ~umask_now();
	bool parents = false;
	int c;

	while ((c = cli_getopt(&args, argc, argv, ":hpm:", longopts)) != -1) {
		if (c == 'p') {
			parents = true;
		} else if (c == 'm' && parse_mode(optarg, &mode) < 0) {
			free(args.devices);
			return cli_usage_error(cmd, "invalid mode '%s' (octal, at most 7777)", optarg);
		}
	}
	static const char *const operands[] = { "IMAGE", "PATH" };
	if (want_operands(&args, argc, 2, operands))
		return CLI_EXIT_USAGE;
	const char *image = argv[optind], *path = argv[optind + 1];
	/* -p makes the missing parents writable and searchable by their owner, as mkdir -p */
	uint32_t parent_mode = (0777 & ~umask_now()) | 0300;
	struct butter_fs *fs;
	int status = CLI_EXIT_ERROR;
	bool made = false;

	char *copy = strdup(path), *prefix = malloc(strlen(path) + 2);
	if (!copy || !prefix) {
		cli_error("%s", strerror(ENOMEM));
		goto out_free;
	}
	if (copyin_open_rw(image, args.devices, args.ndevices, &fs) < 0)
		goto out_free;

	butter_ino_t cur;
	int ret = butter_root(fs, 5, &cur);
	if (ret < 0) {
		cli_error("%s: top-level directory: %s", image, strerror(-ret));
		goto out;
	}
	/* the offset of the last component that is a name (not "." and not empty) */
	char *last = NULL;
	for (char *s = strtok(copy, "/"); s; s = strtok(NULL, "/"))
		if (strcmp(s, ".") != 0)
			last = s;
	size_t last_off = last ? (size_t)(last - copy) : 0;
	if (!last || strcmp(last, "..") == 0) {
		/* the top-level directory or one that exists by definition */
		if (parents)
			status = CLI_EXIT_OK;
		else
			cli_error("%s: %s", path, strerror(EEXIST));
		goto out;
	}
	strcpy(copy, path); /* tokenized again: the same components at the same offsets */
	strcpy(prefix, "");
	size_t plen = 0;
	for (char *s = strtok(copy, "/"); s; s = strtok(NULL, "/")) {
		bool is_last = (size_t)(s - copy) == last_off;
		butter_ino_t next;
		struct butter_stat st;

		if (strcmp(s, ".") == 0)
			continue;
		plen += (size_t)sprintf(prefix + plen, "/%s", s);
		ret = cli_resolve(fs, prefix, true, &next);
		if (ret == 0) {
			ret = butter_stat(fs, next, &st);
			if (ret == 0 && is_last && !parents)
				ret = -EEXIST;
			else if (ret == 0 && !S_ISDIR(st.mode))
				ret = is_last ? -EEXIST : -ENOTDIR;
		} else if (ret == -ENOENT && (is_last || parents)) {
			struct butter_new_inode a = {
				.mode = S_IFDIR | (is_last ? mode : parent_mode),
				.uid = geteuid(),
				.gid = getegid(),
			};
			ret = butter_create(fs, cur, s, strlen(s), &a, &next);
			made = made || ret == 0;
		}
		if (ret < 0) {
			cli_error("%s: %s", prefix, strerror(-ret));
			goto out;
		}
		cur = next;
	}
	status = CLI_EXIT_OK;
out:
	if (made)
		status = finish(fs, image, status);
	else
		butter_close(fs); /* nothing changed: nothing to commit */
out_free:
	free(copy);
	free(prefix);
	free(args.devices);
	return cli_finish_stdout(status);
}

/* ---- ln ----------------------------------------------------------------- */

int cmd_ln(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "symbolic", no_argument, NULL, 's' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	bool symbolic = false;
	struct dest d = { 0 };
	struct butter_fs *fs;
	int status = CLI_EXIT_ERROR;
	int c, ret;

	while ((c = cli_getopt(&args, argc, argv, ":hs", longopts)) != -1) {
		if (c == 's')
			symbolic = true;
	}
	static const char *const operands[] = { "TARGET", "IMAGE", "PATH" };
	if (want_operands(&args, argc, 3, operands))
		return CLI_EXIT_USAGE;
	const char *target = argv[optind], *image = argv[optind + 1], *path = argv[optind + 2];
	if (!*target) {
		free(args.devices);
		return cli_usage_error(cmd, "TARGET is empty");
	}
	if (dest_split(path, NULL, &d) < 0)
		goto out_free;
	if (copyin_open_rw(image, args.devices, args.ndevices, &fs) < 0)
		goto out_free;
	if (dest_check(fs, path, &d) < 0) {
		butter_close(fs);
		goto out_free;
	}
	if (symbolic) {
		ret = butter_symlink(fs, d.dir, d.name, strlen(d.name), target, geteuid(), getegid(),
				     NULL);
	} else {
		/* a hard link: TARGET is an existing non-directory of the image */
		butter_ino_t ino;
		struct butter_stat st;
		ret = cli_resolve(fs, target, false, &ino);
		if (ret == 0)
			ret = butter_stat(fs, ino, &st);
		if (ret == 0 && S_ISDIR(st.mode))
			ret = -EPERM;
		if (ret < 0) {
			cli_error("%s: %s", target,
				  ret == -EPERM ? "is a directory (hard links to directories are "
						  "not allowed)" : strerror(-ret));
			butter_close(fs);
			goto out_free;
		}
		ret = butter_link(fs, ino, d.dir, d.name, strlen(d.name));
	}
	if (ret < 0) {
		cli_error("%s: %s", path, strerror(-ret));
		status = finish(fs, image, CLI_EXIT_ERROR);
		goto out_free;
	}
	status = finish(fs, image, CLI_EXIT_OK);
out_free:
	dest_free(&d);
	free(args.devices);
	return cli_finish_stdout(status);
}

/* ---- rm ----------------------------------------------------------------- */

struct rm_walk {
	struct butter_fs *fs;
	char **names;
	size_t n, cap;
	int err;
};

static int collect_name(void *arg, const char *name, size_t namelen, butter_ino_t ino,
			unsigned dtype, uint64_t next)
{
	struct rm_walk *w = arg;

	(void)ino;
	(void)dtype;
	(void)next;
	if ((namelen == 1 && name[0] == '.') || (namelen == 2 && !memcmp(name, "..", 2)))
		return 0;
	if (w->n == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 64;
		char **n = realloc(w->names, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		w->names = n;
		w->cap = cap;
	}
	w->names[w->n] = strndup(name, namelen);
	if (!w->names[w->n])
		return -ENOMEM;
	w->n++;
	return 0;
}

/*
 * Remove @name from @dir; with @recursive, a directory's contents first.
 * @shown is the path for messages. Subvolumes are refused (subvolume delete).
 */
static int rm_entry(struct butter_fs *fs, butter_ino_t dir, const char *name, const char *shown,
		    bool recursive)
{
	struct butter_stat st;
	butter_ino_t ino;
	int ret = butter_lookup(fs, dir, name, strlen(name), &ino);

	if (ret == 0)
		ret = butter_stat(fs, ino, &st);
	if (ret < 0) {
		cli_error("%s: %s", shown, strerror(-ret));
		return ret;
	}
	if (ino.subvol != dir.subvol) {
		cli_error("%s: is a subvolume (use butter subvolume delete)", shown);
		return -EPERM;
	}
	if (!S_ISDIR(st.mode)) {
		ret = butter_unlink(fs, dir, name, strlen(name));
	} else if (!recursive) {
		cli_error("%s: is a directory (use -r)", shown);
		return -EISDIR;
	} else {
		struct rm_walk w = { fs, NULL, 0, 0, 0 };
		size_t i;

		ret = butter_readdir(fs, ino, 0, collect_name, &w);
		for (i = 0; i < w.n && ret >= 0; i++) {
			char *sub = malloc(strlen(shown) + strlen(w.names[i]) + 2);

			if (!sub) {
				ret = -ENOMEM;
				break;
			}
			sprintf(sub, "%s/%s", shown, w.names[i]);
			ret = rm_entry(fs, ino, w.names[i], sub, true);
			free(sub);
			if (ret < 0)
				ret = -ECANCELED; /* reported already */
		}
		for (i = 0; i < w.n; i++)
			free(w.names[i]);
		free(w.names);
		if (ret >= 0)
			ret = butter_rmdir(fs, dir, name, strlen(name));
	}
	if (ret < 0 && ret != -ECANCELED)
		cli_error("%s: %s", shown, strerror(-ret));
	return ret < 0 ? ret : 0;
}

int cmd_rm(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "recursive", no_argument, NULL, 'r' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	bool recursive = false;
	struct butter_fs *fs;
	int status = CLI_EXIT_OK;
	int c, i;

	while ((c = cli_getopt(&args, argc, argv, ":hrR", longopts)) != -1) {
		if (c == 'r' || c == 'R')
			recursive = true;
	}
	if (argc - optind < 2) {
		free(args.devices);
		return cli_usage_error(cmd, "missing %s", argc - optind < 1 ? "IMAGE" : "PATH");
	}
	const char *image = argv[optind];
	if (copyin_open_rw(image, args.devices, args.ndevices, &fs) < 0) {
		free(args.devices);
		return CLI_EXIT_ERROR;
	}
	for (i = optind + 1; i < argc; i++) {
		struct dest d = { 0 };

		if (dest_split(argv[i], NULL, &d) < 0 ||
		    cli_resolve(fs, d.parent, true, &d.dir) < 0 ||
		    rm_entry(fs, d.dir, d.name, argv[i], recursive) < 0)
			status = CLI_EXIT_ERROR;
		dest_free(&d);
	}
	status = finish(fs, image, status);
	free(args.devices);
	return cli_finish_stdout(status);
}
