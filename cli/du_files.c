/*
 * du_files.c — `butter filesystem du` without --compression: what
 * `btrfs filesystem du` prints, in its layout: for every regular file and
 * directory under each PATH (with -s only for each PATH) the bytes of its
 * extents ("Total"), those no other file or snapshot shares ("Exclusive"),
 * and for each PATH the bytes its shared extents cover once, however many
 * files under it share them ("Set shared").
 *
 * The extents and their sharing come from butter_file_extents() on an image
 * and from BUTTER_IOC_FILE_EXTENTS on a live mount (FUSE does not forward
 * FIEMAP, which progs asks), after the mount committed (so that references
 * made since its last commit count); the rules are progs': inline data does not
 * count, a file met again through another hard link is not counted again,
 * directories are walked in readdir order and printed after their contents,
 * a set's shared bytes are the union of the shared extents' ranges.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <butter/control.h>

#include "cli.h"

struct interval {
	uint64_t start, last; /* bytes [start, last] of the filesystem's address space */
};

struct du_walk {
	struct butter_fs *fs;         /* an image; NULL for a mount */
	const struct cli_units *units;
	bool summarize;
	char path[8192];              /* the path printed, as progs builds it */
	size_t pathlen;
	struct { uint64_t a, b; } *seen; /* files counted: (subvolume or device, inode) */
	size_t nseen, seen_cap;
	struct interval *iv;          /* the shared extents of the current PATH */
	size_t niv, iv_cap;
	int err;                      /* the first error met (reported) */
};

/* Record file (@a, @b); 1 if it was new, 0 if met before, -ENOMEM. */
static int mark_seen(struct du_walk *w, uint64_t a, uint64_t b)
{
	for (size_t i = 0; i < w->nseen; i++)
		if (w->seen[i].a == a && w->seen[i].b == b)
			return 0;
	if (w->nseen == w->seen_cap) {
		size_t cap = w->seen_cap ? 2 * w->seen_cap : 256;
		void *p = realloc(w->seen, cap * sizeof(*w->seen));

		if (!p)
			return -ENOMEM;
		w->seen = p;
		w->seen_cap = cap;
	}
	w->seen[w->nseen].a = a;
	w->seen[w->nseen].b = b;
	w->nseen++;
	return 1;
}

static int add_interval(struct du_walk *w, uint64_t start, uint64_t len)
{
	if (w->niv == w->iv_cap) {
		size_t cap = w->iv_cap ? 2 * w->iv_cap : 256;
		void *p = realloc(w->iv, cap * sizeof(*w->iv));

		if (!p)
			return -ENOMEM;
		w->iv = p;
		w->iv_cap = cap;
	}
	w->iv[w->niv].start = start;
	w->iv[w->niv].last = start + len - 1;
	w->niv++;
	return 0;
}

static int interval_cmp(const void *a, const void *b)
{
	const struct interval *x = a, *y = b;

	return x->start < y->start ? -1 : x->start > y->start;
}

/* The bytes the collected intervals cover (overlaps once); empties the set. */
static uint64_t union_bytes(struct du_walk *w)
{
	uint64_t total = 0, start = 0, last = 0;
	bool open = false;

	qsort(w->iv, w->niv, sizeof(*w->iv), interval_cmp);
	for (size_t i = 0; i < w->niv; i++) {
		if (open && w->iv[i].start <= last) {
			if (w->iv[i].last > last)
				last = w->iv[i].last;
			continue;
		}
		if (open)
			total += last - start + 1;
		start = w->iv[i].start;
		last = w->iv[i].last;
		open = true;
	}
	if (open)
		total += last - start + 1;
	w->niv = 0;
	return total;
}

/*
 * Total and shared bytes of one regular file: @ino on an image, @fd on a
 * mount. With @collect, its shared extents join the set.
 */
static int file_space(struct du_walk *w, butter_ino_t ino, int fd, bool collect, uint64_t *total,
		      uint64_t *shared)
{
	struct butter_ioc_file_extents *x = calloc(1, sizeof(*x));
	uint64_t start = 0;
	int ret = 0;

	*total = *shared = 0;
	if (!x)
		return -ENOMEM;
	for (;;) {
		size_t got = 0;

		x->start = start;
		if (w->fs) {
			ret = butter_file_extents(w->fs, ino, start, x->extents, BUTTER_IOC_EXTENTS_MAX,
						  &got);
		} else {
			ret = ioctl(fd, BUTTER_IOC_FILE_EXTENTS, x) < 0 ? -errno : 0;
			got = x->count;
		}
		if (ret || got == 0)
			break;
		for (size_t i = 0; i < got && ret == 0; i++) {
			const struct butter_file_extent *e = &x->extents[i];

			if ((e->flags & BUTTER_EXTENT_INLINE) || e->length == 0)
				continue;
			*total += e->length;
			if (e->flags & BUTTER_EXTENT_SHARED) {
				*shared += e->length;
				if (collect)
					ret = add_interval(w, e->physical, e->length);
			}
		}
		if (ret || (x->extents[got - 1].flags & BUTTER_EXTENT_LAST))
			break;
		start = x->extents[got - 1].logical + x->extents[got - 1].length;
	}
	free(x);
	return ret;
}

/* Append @name to the printed path as progs does (no '/' after one already there). */
static size_t path_push(struct du_walk *w, const char *name)
{
	size_t old = w->pathlen;
	int n;

	if (old == 0 || w->path[old - 1] == '/')
		n = snprintf(w->path + old, sizeof(w->path) - old, "%s", name);
	else
		n = snprintf(w->path + old, sizeof(w->path) - old, "/%s", name);
	if (n < 0 || (size_t)n >= sizeof(w->path) - old) {
		w->path[old] = '\0';
		return (size_t)-1;
	}
	w->pathlen += (size_t)n;
	return old;
}

static void print_line(struct du_walk *w, uint64_t total, uint64_t shared, const char *set)
{
	char a[64], b[64];

	printf("%10s  %10s  %10s  %s\n", cli_size_units(a, sizeof(a), total, w->units),
	       cli_size_units(b, sizeof(b), total - shared, w->units), set, w->path);
}

static void report(struct du_walk *w, int err)
{
	cli_error("%s: %s", w->path, strerror(-err));
	if (!w->err)
		w->err = err;
}

/* A directory entry counted (@err 0: its @t and @s add up) or reported; the path back to its directory. */
static void child_done(struct du_walk *w, int err, uint64_t t, uint64_t s, uint64_t *total,
		       uint64_t *shared, size_t mark)
{
	if (err) {
		report(w, err);
	} else {
		*total += t;
		*shared += s;
	}
	w->pathlen = mark;
	w->path[mark] = '\0';
}

/*
 * The line of a file or directory (each PATH's alone with -s; its set's
 * shared bytes on it, "-" on the others), and its sums for its directory.
 */
static int finish(struct du_walk *w, bool is_dir, bool top, uint64_t total, uint64_t shared,
		  uint64_t *ret_total, uint64_t *ret_shared)
{
	if (!w->summarize || top) {
		char set[64];

		if (top)
			cli_size_units(set, sizeof(set), is_dir ? union_bytes(w) : shared, w->units);
		print_line(w, total, shared, top ? set : "-");
	}
	*ret_total = total;
	*ret_shared = shared;
	return 0;
}

/* ---- an image ---------------------------------------------------------------------- */

struct entry_list {
	struct { char *name; butter_ino_t ino; } *e;
	size_t n, cap;
};

static int take_entry(void *arg, const char *name, size_t namelen, butter_ino_t ino,
		      unsigned type, uint64_t next)
{
	struct entry_list *l = arg;

	(void)next;
	if (type != DT_REG && type != DT_DIR)
		return 0;
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 32;
		void *p = realloc(l->e, cap * sizeof(*l->e));

		if (!p)
			return -ENOMEM;
		l->e = p;
		l->cap = cap;
	}
	l->e[l->n].name = strndup(name, namelen);
	if (!l->e[l->n].name)
		return -ENOMEM;
	l->e[l->n++].ino = ino;
	return 0;
}

static int image_add(struct du_walk *w, butter_ino_t ino, bool top, uint64_t *ret_total,
		     uint64_t *ret_shared)
{
	uint64_t total = 0, shared = 0;
	struct butter_stat st;
	int ret = butter_stat(w->fs, ino, &st);

	*ret_total = *ret_shared = 0;
	if (ret)
		return ret;
	if (!S_ISREG(st.mode) && !S_ISDIR(st.mode))
		return 0;
	if (ino.ino != 2) { /* 2: the directory standing for a subvolume a snapshot lacks */
		ret = mark_seen(w, ino.subvol, ino.ino);
		if (ret <= 0)
			return ret; /* met before through another name (0), or no memory */
		ret = 0;
	}
	if (S_ISREG(st.mode)) {
		ret = file_space(w, ino, -1, true, &total, &shared);
		if (ret)
			return ret;
	} else {
		struct entry_list l = { 0 };

		ret = butter_readdir(w->fs, ino, 0, take_entry, &l);
		for (size_t i = 0; ret == 0 && i < l.n; i++) {
			size_t mark = path_push(w, l.e[i].name);
			uint64_t t, sh;

			if (mark == (size_t)-1) {
				ret = -ENAMETOOLONG;
				break;
			}
			int r = image_add(w, l.e[i].ino, false, &t, &sh);

			child_done(w, r, t, sh, &total, &shared, mark);
		}
		for (size_t i = 0; i < l.n; i++)
			free(l.e[i].name);
		free(l.e);
		if (ret)
			return ret;
	}
	return finish(w, S_ISDIR(st.mode), top, total, shared, ret_total, ret_shared);
}

/* ---- a live mount ------------------------------------------------------------------- */

static int mount_add(struct du_walk *w, int parent_fd, const char *name, bool top,
		     uint64_t *ret_total, uint64_t *ret_shared)
{
	uint64_t total = 0, shared = 0;
	struct stat st;
	int fd, ret = 0;

	*ret_total = *ret_shared = 0;
	if (fstatat(parent_fd, name, &st, 0) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
		return 0;
	ret = mark_seen(w, (uint64_t)st.st_dev, (uint64_t)st.st_ino);
	if (ret <= 0)
		return ret; /* met before through another name (0), or no memory */
	ret = 0;
	fd = openat(parent_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	if (S_ISREG(st.st_mode)) {
		ret = file_space(w, (butter_ino_t){ 0, 0 }, fd, true, &total, &shared);
		close(fd);
		if (ret)
			return ret;
	} else {
		DIR *d = fdopendir(fd);
		struct dirent *e;

		if (!d) {
			ret = -errno;
			close(fd);
			return ret;
		}
		while ((e = readdir(d)) != NULL) {
			size_t mark;
			uint64_t t, sh;

			if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
			    (e->d_type != DT_REG && e->d_type != DT_DIR))
				continue;
			mark = path_push(w, e->d_name);
			if (mark == (size_t)-1) {
				ret = -ENAMETOOLONG;
				break;
			}
			int r = mount_add(w, dirfd(d), e->d_name, false, &t, &sh);

			child_done(w, r, t, sh, &total, &shared, mark);
		}
		closedir(d);
		if (ret)
			return ret;
	}
	return finish(w, S_ISDIR(st.st_mode), top, total, shared, ret_total, ret_shared);
}

int du_files(const struct cli_args *args, char **paths, int npaths, bool summarize,
	     const struct cli_units *units)
{
	struct du_walk w = { .units = units, .summarize = summarize };
	const char *image = NULL;
	int i = 0, ret = 0;

	if (args->ndevices || !cli_is_mount_path(paths[0], args)) {
		struct stat sb;

		/* IMAGE PATH...: the image is a file or block device, not a directory */
		if (stat(paths[0], &sb) == 0 && S_ISDIR(sb.st_mode)) {
			cli_error("%s: a directory: give a path inside a live mount, or an image", paths[0]);
			return CLI_EXIT_ERROR;
		}
		image = paths[0];
		if (cli_open(args, image, &w.fs) < 0)
			return CLI_EXIT_ERROR;
		i = 1;
	}
	if (!image) {
		/* the mount commits first: shared references queued for its commit count then */
		int fd = ctl_open(paths[0], NULL);

		if (fd < 0)
			return CLI_EXIT_ERROR;
		if (syncfs(fd) < 0 || ioctl(fd, BUTTER_IOC_SYNC) < 0) {
			cli_error("%s: the mount did not commit: %s", paths[0], strerror(errno));
			close(fd);
			return CLI_EXIT_ERROR;
		}
		close(fd);
	}
	printf("%10s  %10s  %10s  %s\n", "Total", "Exclusive", "Set shared", "Filename");
	for (int n = image && npaths == 1 ? 2 : npaths; i < n; i++) {
		const char *p = i < npaths ? paths[i] : "/"; /* an image alone: all of it */
		uint64_t t, s;
		int r;

		w.pathlen = 0;
		w.path[0] = '\0';
		w.nseen = 0; /* each PATH counts its files afresh, as progs */
		if (path_push(&w, p) == (size_t)-1) {
			r = -ENAMETOOLONG;
		} else if (w.fs) {
			butter_ino_t ino;

			r = cli_resolve(w.fs, p, true, &ino);
			if (r == 0)
				r = image_add(&w, ino, true, &t, &s);
		} else {
			r = mount_add(&w, AT_FDCWD, p, true, &t, &s);
		}
		w.niv = 0;
		if (r) {
			report(&w, r);
			ret = r;
		}
	}
	if (w.fs)
		butter_close(w.fs);
	free(w.seen);
	free(w.iv);
	if (ret || w.err)
		return cli_finish_stdout(CLI_EXIT_ERROR);
	return cli_finish_stdout(CLI_EXIT_OK);
}
