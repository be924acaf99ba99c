/*
 * copyin.c — copy a host file or tree into an image, keeping everything a
 * file carries: data with its holes, every file type, xattrs and POSIX ACLs,
 * owners, modes, times to the nanosecond, hard links. `butter mkfs --rootdir`
 * and `butter put` are both this walk.
 *
 * Promises:
 *  1. One bad file never stops the copy: every failure is reported as
 *     "butter: HOSTPATH: problem" and the result says something failed. The
 *     exception is an image that takes no more changes (a change failed
 *     half-way and the library turned the handle read-only, or the image is
 *     full): the copy stops at once instead of reporting every later file.
 *  2. Holes stay holes: only the ranges lseek(SEEK_DATA/SEEK_HOLE) calls data
 *     are written. butter_write() takes sector-aligned offsets, so each range
 *     is widened to whole sectors (the widening reads the zeros of the hole).
 *     A file with a hole is given its size before any data, so a short first
 *     range never becomes an inline extent of a larger file.
 *  3. Depth costs heap, not file descriptors: directories are walked with an
 *     explicit stack of frames; only the current host directory is open, and
 *     going up reopens ".." and checks it is the directory we came from (else
 *     it is reopened from the top of the walk, one component at a time).
 *  4. A directory's entries are copied in bytewise name order, so one tree
 *     gives one image layout (inode numbers, directory indexes) whatever
 *     order the host's readdir returns.
 *  5. Attribute order for every file: create (type, mode, owner, rdev), data,
 *     xattrs, times. The library changes mtime as data and names arrive, so
 *     times come last; a directory's times are set when the walk leaves it,
 *     after its last entry was added.
 *  6. Non-directories with st_nlink > 1 are remembered by (st_dev, st_ino,
 *     image subvolume): their later names in the same subvolume become
 *     butter_link()s to the copy made there. Links cannot cross subvolumes
 *     (mkfs --subvol), so each subvolume gets one copy of such a file, and
 *     the names inside a subvolume stay one inode.
 *  7. Host names are only used as single components (openat and friends on
 *     the current directory), so paths of any length can be copied.
 *  8. Reading ahead changes nothing but timing. A helper thread walks the
 *     same tree in the same order at most AHEAD_ENTRIES entries in front of
 *     the copy, stats each entry and asks the kernel to start reading the
 *     first AHEAD_FILE_BYTES of each regular file (posix_fadvise WILLNEED),
 *     so the copy's cold reads overlap instead of queueing one by one; the
 *     copy itself asks for its next chunk of a large file before writing the
 *     current one. The helper only warms the host's caches: it never touches
 *     the image, reports nothing and gives up silently; the copy uses
 *     nothing it saw and waits for it only to join it at the end. It holds
 *     three host fds at most and moves no atime (it reads no file data, and
 *     lists a directory only if it can open it O_NOATIME), so the copy
 *     still finds every time as it was.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "cli.h"
#include "copyin.h"

#define CHUNK (8u << 20) /* read and write size for file data */
#define AHEAD_ENTRIES 64u            /* how far the read-ahead helper may run in front */
#define AHEAD_FILE_BYTES (1u << 20)  /* what it asks the kernel to read of each file */

/*
 * Map of host (st_dev, st_ino) and image subvolume → the image inode made for
 * it in that subvolume (to.subvol is the key's subvolume: at most one slot per
 * host file and subvolume).
 */
struct link_slot {
	uint64_t dev, ino;
	butter_ino_t to;
	bool used;
};

struct link_map {
	struct link_slot *v;
	size_t cap, n; /* cap is a power of two */
};

/* One host directory being walked; frames form the explicit stack. */
struct frame {
	butter_ino_t dir;  /* its copy in the image */
	struct stat st;    /* the host directory; times applied when the walk leaves it */
	size_t pathlen;    /* length of copy.path naming it */
	char *names;       /* its entries, NUL-terminated one after another */
	size_t *offs;      /* sorted offsets of the entries in names */
	size_t n, next;
};

/*
 * The read-ahead helper (promise 8). The copy posts one credit per entry it
 * takes (ahead_step), so the helper, which takes one per entry it visits,
 * stays at most AHEAD_ENTRIES in front; when it has fallen behind (taken is
 * past its own count) it only follows the walk, without asking for data.
 */
struct ahead {
	pthread_t thread;
	bool running;
	sem_t credits;
	atomic_size_t taken;     /* entries the copy has taken so far */
	atomic_bool stop;        /* the copy is over: the helper must quit */
	int fd;                  /* the top directory, the helper's own fd */
	const struct copyin_opts *o;
};

struct copy {
	struct butter_fs *fs;
	const struct copyin_opts *o;
	struct copyin_stats *stats;
	uint64_t ss;         /* sector size of the image */
	char *buf;           /* CHUNK bytes of file data */
	char *path;          /* host path of the entry at hand */
	size_t pathlen, pathcap;
	size_t top_len;      /* length of path naming the top of the walk */
	int top_fd;          /* the top directory of the walk, for reopening; -1 if none */
	struct link_map links;
	struct frame *frames;
	size_t nframes, frames_cap;
	char *xnames, *xval;
	size_t xnames_cap, xval_cap;
	bool failed;
	bool stop;           /* the image takes no more changes (promise 1) */
	struct ahead ahead;
};

/* ---- messages ----------------------------------------------------------- */

/* Report a problem with the host file at hand (reading it). */
static void host_error(struct copy *c, const char *what, int err)
{
	cli_error("%s: %s: %s", c->path, what, strerror(err));
	c->failed = true;
}

/* Explain the library errors whose strerror() text would mislead here. */
static const char *image_errstr(int err)
{
	switch (err) {
	case EOPNOTSUPP:
		return "not supported by butter yet";
	case EROFS:
		return "Read-only file system (a read-only snapshot, or the image took an "
		       "error earlier)";
	case ENOSPC:
		return "no space left in the image";
	case EUCLEAN:
		return "the image is corrupt";
	default:
		return strerror(err);
	}
}

/* Report a library error about the entry at hand; stop on the ones that end all changes. */
static void image_error(struct copy *c, const char *what, int ret)
{
	int err = -ret;

	cli_error("%s: %s: %s", c->path, what, image_errstr(err));
	c->failed = true;
	if (err == EROFS || err == ENOSPC || err == EIO || err == EUCLEAN || err == ENOMEM) {
		if (!c->stop)
			cli_error("stopping the copy: the image cannot take more changes");
		c->stop = true;
	}
}

/* ---- the link map ------------------------------------------------------- */

static size_t link_hash(uint64_t dev, uint64_t ino, uint64_t subvol)
{
	uint64_t h = (ino ^ (dev * 0x9e3779b97f4a7c15ull) ^ (subvol * 0xc2b2ae3d27d4eb4full)) *
		     0xff51afd7ed558ccdull;
	return (size_t)(h ^ (h >> 32));
}

/* The inode host file @st became in subvolume @subvol, or NULL if none yet. */
static butter_ino_t *link_find(struct link_map *m, const struct stat *st, uint64_t subvol)
{
	if (!m->cap)
		return NULL;
	for (size_t i = link_hash(st->st_dev, st->st_ino, subvol) & (m->cap - 1);;
	     i = (i + 1) & (m->cap - 1)) {
		struct link_slot *s = &m->v[i];
		if (!s->used)
			return NULL;
		if (s->dev == st->st_dev && s->ino == st->st_ino && s->to.subvol == subvol)
			return &s->to;
	}
}

/* Remember that host file @st became @to in to.subvol (absent so far); 0 or -ENOMEM. */
static int link_add(struct link_map *m, const struct stat *st, butter_ino_t to)
{
	if ((m->n + 1) * 4 > m->cap * 3) {
		size_t cap = m->cap ? m->cap * 2 : 256;
		struct link_slot *v = calloc(cap, sizeof(*v));
		if (!v)
			return -ENOMEM;
		for (size_t j = 0; j < m->cap; j++) {
			if (!m->v[j].used)
				continue;
			size_t i = link_hash(m->v[j].dev, m->v[j].ino, m->v[j].to.subvol) & (cap - 1);
			while (v[i].used)
				i = (i + 1) & (cap - 1);
			v[i] = m->v[j];
		}
		free(m->v);
		m->v = v;
		m->cap = cap;
	}
	size_t i = link_hash(st->st_dev, st->st_ino, to.subvol) & (m->cap - 1);
	while (m->v[i].used)
		i = (i + 1) & (m->cap - 1);
	m->v[i] = (struct link_slot){ st->st_dev, st->st_ino, to, true };
	m->n++;
	return 0;
}

/* ---- paths -------------------------------------------------------------- */

/* Make the path at hand the directory's path (@len bytes) plus "/" @name. */
static int path_push(struct copy *c, size_t len, const char *name)
{
	size_t namelen = strlen(name);
	bool slash = len > 0 && c->path[len - 1] != '/';
	size_t need = len + slash + namelen + 1;

	if (need > c->pathcap) {
		size_t cap = c->pathcap ? c->pathcap : 256;
		while (cap < need)
			cap *= 2;
		char *p = realloc(c->path, cap);
		if (!p)
			return -ENOMEM;
		c->path = p;
		c->pathcap = cap;
	}
	if (slash)
		c->path[len++] = '/';
	memcpy(c->path + len, name, namelen + 1);
	c->pathlen = len + namelen;
	return 0;
}

static void path_cut(struct copy *c, size_t len)
{
	c->pathlen = len;
	c->path[len] = '\0';
}

/* Open a directory or regular file without following a symlink or touching its atime. */
static int open_noatime(int dirfd, const char *name, int flags)
{
	return cli_openat(dirfd, name, flags, true);
}

/*
 * Open the host directory the path at hand names, going down from the top of
 * the walk one component at a time. Returns an fd or -errno.
 */
static int reopen_from_top(struct copy *c)
{
	return cli_open_dir_path(c->top_fd, c->path + c->top_len, c->pathlen - c->top_len, true);
}

/* ---- attributes --------------------------------------------------------- */

/* List the xattr names of the host file: @fd if >= 0, else @proc (a path, not followed). */
static ssize_t host_listxattr(struct copy *c, int fd, const char *proc)
{
	for (;;) {
		ssize_t n = fd >= 0 ? flistxattr(fd, NULL, 0) : llistxattr(proc, NULL, 0);
		if (n < 0)
			return (errno == ENOTSUP || errno == ENODATA) ? 0 : -errno;
		if (n == 0)
			return 0;
		if (cli_grow(&c->xnames, &c->xnames_cap, (size_t)n + 1) < 0)
			return -ENOMEM;
		n = fd >= 0 ? flistxattr(fd, c->xnames, c->xnames_cap - 1)
			    : llistxattr(proc, c->xnames, c->xnames_cap - 1);
		if (n >= 0) {
			c->xnames[n] = '\0';
			return n;
		}
		if (errno != ERANGE)
			return -errno;
	}
}

static ssize_t host_getxattr(struct copy *c, int fd, const char *proc, const char *name)
{
	for (;;) {
		ssize_t n = fd >= 0 ? fgetxattr(fd, name, NULL, 0) : lgetxattr(proc, name, NULL, 0);
		if (n < 0)
			return -errno;
		if (cli_grow(&c->xval, &c->xval_cap, (size_t)n + 1) < 0)
			return -ENOMEM;
		n = fd >= 0 ? fgetxattr(fd, name, c->xval, c->xval_cap)
			    : lgetxattr(proc, name, c->xval, c->xval_cap);
		if (n >= 0)
			return n;
		if (errno != ERANGE)
			return -errno;
	}
}

/* Copy every xattr of the host file (@fd if >= 0, else @name in @dirfd) to @ino. */
static void copy_xattrs(struct copy *c, butter_ino_t ino, int fd, int dirfd, const char *name)
{
	char proc[64 + NAME_MAX];

	if (fd < 0)
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d/%s", dirfd, name);
	ssize_t n = host_listxattr(c, fd, proc);
	if (n < 0)
		host_error(c, "listing xattrs", (int)-n);
	if (n <= 0)
		return;
	for (const char *k = c->xnames; k < c->xnames + n && !c->stop; k += strlen(k) + 1) {
		char what[64 + XATTR_NAME_MAX];
		ssize_t v = host_getxattr(c, fd, proc, k);
		if (v == -ENODATA)
			continue; /* removed since it was listed */
		if (v < 0) {
			snprintf(what, sizeof(what), "reading xattr %s", k);
			host_error(c, what, (int)-v);
			continue;
		}
		int ret = butter_setxattr(c->fs, ino, k, c->xval, (size_t)v);
		if (ret < 0) {
			snprintf(what, sizeof(what), "setting xattr %s", k);
			image_error(c, what, ret);
		}
	}
}

/* Give @ino the times of @st (and its ctime when asked: mkfs --rootdir). */
static void set_times(struct copy *c, butter_ino_t ino, const struct stat *st)
{
	struct butter_stat bs = { .atime = st->st_atim, .mtime = st->st_mtim, .ctime = st->st_ctim };
	unsigned mask = BUTTER_SET_ATIME | BUTTER_SET_MTIME;

	if (c->o->copy_ctime)
		mask |= BUTTER_SET_CTIME;
	int ret = butter_setattr(c->fs, ino, &bs, mask);
	if (ret < 0)
		image_error(c, "setting times", ret);
}

static struct butter_new_inode new_inode(const struct stat *st)
{
	bool dev = S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode);

	return (struct butter_new_inode){
		.mode = st->st_mode & (S_IFMT | 07777),
		.uid = st->st_uid,
		.gid = st->st_gid,
		.rdev = dev ? (uint64_t)st->st_rdev : 0,
	};
}

/* ---- file data ---------------------------------------------------------- */

/* Read @n bytes at @off (fewer only at end of file); returns the count or -errno. */
static ssize_t read_full(int fd, char *buf, size_t n, uint64_t off)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = pread(fd, buf + got, n - got, (off_t)(off + got));
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

/*
 * Copy [@start, @end) of the host file to @ino. Returns 1 when the host file
 * ended early, 0 when done, -1 on a reported error.
 */
static int copy_range(struct copy *c, int fd, butter_ino_t ino, uint64_t start, uint64_t end)
{
	for (uint64_t pos = start; pos < end;) {
		size_t n = end - pos < CHUNK ? (size_t)(end - pos) : CHUNK;
		ssize_t r = read_full(fd, c->buf, n, pos);
		if (r < 0) {
			host_error(c, "reading", (int)-r);
			return -1;
		}
		if ((size_t)r == n && end - pos > n) {
			/* let the next chunk come in while this one is written (promise 8) */
			uint64_t next = end - pos - n < CHUNK ? end - pos - n : CHUNK;
			posix_fadvise(fd, (off_t)(pos + n), (off_t)next, POSIX_FADV_WILLNEED);
		}
		if (r > 0) {
			ssize_t w = butter_write(c->fs, ino, c->buf, (size_t)r, pos);
			if (w < 0) {
				image_error(c, "writing", (int)w);
				return -1;
			}
			c->stats->bytes += (uint64_t)r;
			if (c->o->progress)
				cli_progress_update(c->o->progress, c->stats->bytes);
		}
		if ((size_t)r < n)
			return 1;
		pos += n;
	}
	return 0;
}

/* Give @ino the size @size (a hole up to it). */
static int set_size(struct copy *c, butter_ino_t ino, uint64_t size)
{
	struct butter_stat bs = { .size = size };
	int ret = butter_setattr(c->fs, ino, &bs, BUTTER_SET_SIZE);

	if (ret < 0)
		image_error(c, "setting size", ret);
	return ret;
}

/* Copy the data of the host file @fd (size @size) to @ino, holes as holes (promise 2). */
static void copy_data(struct copy *c, int fd, butter_ino_t ino, uint64_t size)
{
	uint64_t off = 0, done = 0; /* done: the image holds data up to here */
	bool sized = false;

	while (off < size && !c->stop) {
		off_t d = lseek(fd, (off_t)off, SEEK_DATA), h;
		if (d < 0 && errno == ENXIO)
			break;
		if (d < 0) {
			d = (off_t)off; /* no map of the holes: all data */
			h = (off_t)size;
		} else {
			h = lseek(fd, d, SEEK_HOLE);
			if (h <= d || (uint64_t)h > size)
				h = (off_t)size;
		}
		if ((uint64_t)d >= size)
			break;
		if (!sized && (d > 0 || (uint64_t)h < size)) {
			if (set_size(c, ino, size) < 0)
				return;
			sized = true;
		}
		uint64_t a = (uint64_t)d / c->ss * c->ss;
		uint64_t b = ((uint64_t)h + c->ss - 1) / c->ss * c->ss;
		if (a < done)
			a = done;
		if (b > size)
			b = size;
		if (a < b) {
			int ret = copy_range(c, fd, ino, a, b);
			if (ret < 0)
				return;
			if (ret > 0) /* the host file shrank while we read it */
				break;
		}
		done = off = b;
	}
	if (!sized && done < size && !c->stop)
		set_size(c, ino, size);
}

/* ---- one entry ---------------------------------------------------------- */

static bool skipped_by(const struct copyin_opts *o, const struct stat *st)
{
	for (size_t i = 0; i < o->nskip; i++)
		if (o->skip[i][0] == (uint64_t)st->st_dev && o->skip[i][1] == (uint64_t)st->st_ino)
			return true;
	return false;
}

static bool skipped(struct copy *c, const struct stat *st)
{
	return skipped_by(c->o, st);
}

static bool copy_regular(struct copy *c, int dirfd, const char *hname, butter_ino_t dir,
			 const char *name, const struct stat *st, butter_ino_t *ino)
{
	int fd = open_noatime(dirfd, hname, O_NONBLOCK);
	struct stat now;

	if (fd < 0) {
		host_error(c, "opening", errno);
		return false;
	}
	if (fstat(fd, &now) < 0 || now.st_ino != st->st_ino || now.st_dev != st->st_dev ||
	    !S_ISREG(now.st_mode)) {
		host_error(c, "opening", ESTALE); /* replaced since the walk saw it */
		close(fd);
		return false;
	}
	struct butter_new_inode a = new_inode(st);
	int ret = butter_create(c->fs, dir, name, strlen(name), &a, ino);
	if (ret < 0) {
		image_error(c, "creating", ret);
		close(fd);
		return false;
	}
	copy_data(c, fd, *ino, (uint64_t)st->st_size);
	if (!c->stop)
		copy_xattrs(c, *ino, fd, -1, NULL);
	close(fd);
	return true;
}

static bool copy_symlink(struct copy *c, int dirfd, const char *hname, butter_ino_t dir,
			 const char *name, const struct stat *st, butter_ino_t *ino)
{
	size_t size = st->st_size > 0 ? (size_t)st->st_size + 1 : 256;
	char *target = NULL;
	ssize_t n;

	for (;;) {
		char *p = realloc(target, size);
		if (!p) {
			free(target);
			host_error(c, "reading symlink", ENOMEM);
			return false;
		}
		target = p;
		n = readlinkat(dirfd, hname, target, size);
		if (n < 0 || (size_t)n < size)
			break;
		size *= 2;
	}
	if (n < 0) {
		host_error(c, "reading symlink", errno);
		free(target);
		return false;
	}
	target[n] = '\0';
	int ret = butter_symlink(c->fs, dir, name, strlen(name), target, st->st_uid, st->st_gid, ino);
	free(target);
	if (ret < 0) {
		image_error(c, "creating symlink", ret);
		return false;
	}
	copy_xattrs(c, *ino, -1, dirfd, hname);
	return true;
}

static bool copy_special(struct copy *c, int dirfd, const char *hname, butter_ino_t dir,
			 const char *name, const struct stat *st, butter_ino_t *ino)
{
	struct butter_new_inode a = new_inode(st);
	int ret = butter_create(c->fs, dir, name, strlen(name), &a, ino);

	if (ret < 0) {
		image_error(c, "creating", ret);
		return false;
	}
	copy_xattrs(c, *ino, -1, dirfd, hname);
	return true;
}

/*
 * Copy the non-directory @hname of host directory @dirfd (stat @st) into
 * image directory @dir as @name.
 */
static void copy_leaf(struct copy *c, int dirfd, const char *hname, butter_ino_t dir,
		      const char *name, const struct stat *st)
{
	bool linked = st->st_nlink > 1;
	butter_ino_t ino;
	bool made;

	if (linked) {
		/* links cannot cross subvolumes: the first name in dir's subvolume is copied */
		butter_ino_t *first = link_find(&c->links, st, dir.subvol);
		if (first) {
			int ret = butter_link(c->fs, *first, dir, name, strlen(name));
			if (ret < 0) {
				image_error(c, "creating hard link", ret);
			} else if (c->o->copy_ctime) {
				/* the new link moved ctime to now */
				struct butter_stat bs = { .ctime = st->st_ctim };
				ret = butter_setattr(c->fs, *first, &bs, BUTTER_SET_CTIME);
				if (ret < 0)
					image_error(c, "setting times", ret);
			}
			return;
		}
	}

	switch (st->st_mode & S_IFMT) {
	case S_IFREG:
		made = copy_regular(c, dirfd, hname, dir, name, st, &ino);
		break;
	case S_IFLNK:
		made = copy_symlink(c, dirfd, hname, dir, name, st, &ino);
		break;
	case S_IFCHR:
	case S_IFBLK:
	case S_IFIFO:
	case S_IFSOCK:
		made = copy_special(c, dirfd, hname, dir, name, st, &ino);
		break;
	default:
		host_error(c, "copying", EINVAL);
		return;
	}
	if (!made)
		return;
	if (!c->stop)
		set_times(c, ino, st);
	if (linked && link_add(&c->links, st, ino) < 0)
		host_error(c, "remembering hard link", ENOMEM);
}

/* ---- the walk ----------------------------------------------------------- */

static int name_cmp(const void *a, const void *b, void *names)
{
	return strcmp((const char *)names + *(const size_t *)a,
		      (const char *)names + *(const size_t *)b);
}

/*
 * Read the entry names of the directory @fd into @f, sorted (promise 4),
 * without moving its atime where we may (O_NOATIME); with @strict, only so.
 */
static int read_names(int fd, struct frame *f, bool strict)
{
	int dfd = strict ? openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOATIME)
			 : open_noatime(fd, ".", O_DIRECTORY);
	size_t len = 0, cap = 0, ocap = 0;
	struct dirent *de;
	DIR *d;

	if (dfd < 0)
		return -errno;
	d = fdopendir(dfd);
	if (!d) {
		int err = errno;
		close(dfd);
		return -err;
	}
	for (;;) {
		errno = 0;
		de = readdir(d);
		if (!de)
			break;
		const char *n = de->d_name;
		if (n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0')))
			continue;
		size_t nl = strlen(n) + 1;
		if (cli_grow(&f->names, &cap, len + nl + (cap ? 0 : 4096)) < 0)
			goto nomem;
		if (f->n == ocap) {
			size_t c2 = ocap ? ocap * 2 : 64;
			size_t *v = realloc(f->offs, c2 * sizeof(*v));
			if (!v)
				goto nomem;
			f->offs = v;
			ocap = c2;
		}
		memcpy(f->names + len, n, nl);
		f->offs[f->n++] = len;
		len += nl;
	}
	int err = errno;
	closedir(d);
	if (err)
		return -err;
	if (f->n)
		qsort_r(f->offs, f->n, sizeof(*f->offs), name_cmp, f->names);
	return 0;
nomem:
	closedir(d);
	return -ENOMEM;
}

static void free_frame(struct frame *f)
{
	free(f->names);
	free(f->offs);
}

/* Push the host directory @fd (stat @st), copied to @dir, onto the stack. */
static int push_frame(struct copy *c, int fd, butter_ino_t dir, const struct stat *st)
{
	if (c->nframes == c->frames_cap) {
		size_t cap = c->frames_cap ? c->frames_cap * 2 : 32;
		struct frame *v = realloc(c->frames, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		c->frames = v;
		c->frames_cap = cap;
	}
	struct frame f = { .dir = dir, .st = *st, .pathlen = c->pathlen };
	int ret = read_names(fd, &f, false);
	if (ret < 0) {
		free_frame(&f);
		return ret;
	}
	c->frames[c->nframes++] = f;
	return 0;
}

/* Leave the top frame: set the directory's times, return an fd on the parent (or -1). */
static int pop_frame(struct copy *c, int fd)
{
	struct frame *f = &c->frames[c->nframes - 1];
	int parent = -1;

	path_cut(c, f->pathlen);
	if (!c->stop)
		set_times(c, f->dir, &f->st);
	if (c->nframes > 1) {
		const struct stat *pst = &f[-1].st;
		struct stat hs;
		parent = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (parent >= 0 && (fstat(parent, &hs) < 0 || hs.st_dev != pst->st_dev ||
				    hs.st_ino != pst->st_ino)) {
			close(parent);
			parent = -1;
		}
		if (parent < 0) {
			path_cut(c, f[-1].pathlen);
			parent = reopen_from_top(c);
			if (parent < 0) {
				host_error(c, "reopening directory", -parent);
				parent = -1;
			}
		}
	}
	close(fd);
	free_frame(f);
	c->nframes--;
	return parent;
}

/* Is the directory at hand (c->path) one that opts->subvols makes a subvolume? */
static bool is_subvol_dir(const struct copy *c)
{
	const char *rel = c->path + c->top_len;

	while (*rel == '/')
		rel++;
	for (size_t i = 0; i < c->o->nsubvols; i++)
		if (!strcmp(rel, c->o->subvols[i]))
			return true;
	return false;
}

/* ---- reading ahead (promise 8) ----------------------------------------- */

/* Take one credit: wait until the copy is close enough behind. False: quit. */
static bool ahead_wait(struct ahead *a)
{
	while (sem_wait(&a->credits) < 0 && errno == EINTR)
		;
	return !atomic_load(&a->stop);
}

/* Ask the kernel to start reading the regular file @name of @dirfd. */
static void ahead_file(struct ahead *a, int dirfd, const char *name, const struct stat *st)
{
	if (st->st_size == 0 || skipped_by(a->o, st))
		return;
	int fd = open_noatime(dirfd, name, O_NONBLOCK);
	if (fd < 0)
		return;
	off_t len = st->st_size < AHEAD_FILE_BYTES ? st->st_size : AHEAD_FILE_BYTES;
	posix_fadvise(fd, 0, len, POSIX_FADV_WILLNEED);
	close(fd);
}

/* Push a frame with the sorted names of directory @fd (stat @st); false if it failed. */
static bool ahead_push(struct frame **frames, size_t *n, size_t *cap, int fd,
		       const struct stat *st)
{
	if (*n == *cap) {
		size_t ncap = *cap ? *cap * 2 : 32;
		struct frame *v = realloc(*frames, ncap * sizeof(*v));
		if (!v)
			return false;
		*frames = v;
		*cap = ncap;
	}
	struct frame f = { .st = *st };
	if (read_names(fd, &f, true) < 0) {
		free_frame(&f);
		return false;
	}
	(*frames)[(*n)++] = f;
	return true;
}

/*
 * The helper thread: walk the tree as walk() does (sorted names, depth
 * first, going up through ".." checked against the directory we came from),
 * one credit per entry, and stop at the first thing that goes wrong.
 */
static void *ahead_main(void *arg)
{
	struct ahead *a = arg;
	struct frame *frames = NULL;
	size_t nframes = 0, cap = 0, count = 0;
	int fd = a->fd;
	struct stat st;

	if (fstat(fd, &st) < 0 || !ahead_push(&frames, &nframes, &cap, fd, &st))
		goto out;
	while (nframes) {
		struct frame *f = &frames[nframes - 1];
		if (f->next == f->n) {
			free_frame(f);
			if (--nframes == 0)
				break;
			int parent = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			close(fd);
			fd = parent;
			if (fd < 0 || fstat(fd, &st) < 0 || st.st_dev != f[-1].st.st_dev ||
			    st.st_ino != f[-1].st.st_ino)
				break; /* moved away: leave the rest to the copy */
			continue;
		}
		const char *name = f->names + f->offs[f->next++];
		if (!ahead_wait(a))
			break;
		count++;
		if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		if (S_ISREG(st.st_mode) && count > atomic_load(&a->taken)) {
			ahead_file(a, fd, name, &st);
		} else if (S_ISDIR(st.st_mode)) {
			int child = open_noatime(fd, name, O_DIRECTORY);
			if (child < 0)
				continue;
			if (!ahead_push(&frames, &nframes, &cap, child, &st)) {
				close(child);
				continue;
			}
			close(fd);
			fd = child;
		}
	}
out:
	if (fd >= 0)
		close(fd);
	while (nframes)
		free_frame(&frames[--nframes]);
	free(frames);
	return NULL;
}

/* Start the helper on the directory @fd (not taken over); without it the copy is only slower. */
static void ahead_start(struct copy *c, int fd)
{
	struct ahead *a = &c->ahead;

	a->o = c->o;
	atomic_init(&a->taken, 0);
	atomic_init(&a->stop, false);
	a->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (a->fd < 0)
		return;
	if (sem_init(&a->credits, 0, AHEAD_ENTRIES) < 0) {
		close(a->fd);
		return;
	}
	if (pthread_create(&a->thread, NULL, ahead_main, a) != 0) {
		sem_destroy(&a->credits);
		close(a->fd);
		return;
	}
	a->running = true;
}

/* The copy takes its next entry: let the helper go one further. */
static void ahead_step(struct copy *c)
{
	struct ahead *a = &c->ahead;

	if (!a->running)
		return;
	atomic_fetch_add(&a->taken, 1);
	sem_post(&a->credits);
}

static void ahead_stop(struct copy *c)
{
	struct ahead *a = &c->ahead;

	if (!a->running)
		return;
	atomic_store(&a->stop, true);
	sem_post(&a->credits);
	pthread_join(a->thread, NULL);
	sem_destroy(&a->credits);
	a->running = false;
}

/* Copy host directory @hname of @dirfd into image directory @dir as @name; fd of it or -1. */
static int enter_dir(struct copy *c, int dirfd, const char *hname, butter_ino_t dir,
		     const char *name, const struct stat *st)
{
	int fd = open_noatime(dirfd, hname, O_DIRECTORY);
	struct stat now;
	butter_ino_t ino;

	if (fd < 0) {
		host_error(c, "opening directory", errno);
		return -1;
	}
	if (fstat(fd, &now) < 0 || now.st_ino != st->st_ino || now.st_dev != st->st_dev) {
		host_error(c, "opening directory", ESTALE);
		close(fd);
		return -1;
	}
	struct butter_new_inode a = new_inode(st);
	int ret;
	if (is_subvol_dir(c)) {
		uint64_t id;
		ret = butter_subvol_create(c->fs, dir, name, strlen(name), &id);
		ino.subvol = id;
		ino.ino = BUTTER_SUBVOL_ROOT_INO;
		if (ret == 0) {
			struct butter_stat bs = { .mode = st->st_mode & 07777, .uid = st->st_uid,
						  .gid = st->st_gid };
			ret = butter_setattr(c->fs, ino, &bs,
					     BUTTER_SET_MODE | BUTTER_SET_UID | BUTTER_SET_GID);
		}
	} else {
		ret = butter_create(c->fs, dir, name, strlen(name), &a, &ino);
	}
	if (ret < 0) {
		image_error(c, "creating directory", ret);
		close(fd);
		return -1;
	}
	copy_xattrs(c, ino, fd, -1, NULL);
	ret = push_frame(c, fd, ino, st);
	if (ret < 0) {
		host_error(c, "reading directory", -ret);
		if (!c->stop)
			set_times(c, ino, st);
		close(fd);
		return -1;
	}
	return fd;
}

/* Walk the frames until the stack is empty; @fd is the top frame's directory. */
static void walk(struct copy *c, int fd)
{
	while (c->nframes) {
		struct frame *f = &c->frames[c->nframes - 1];
		if (f->next == f->n || c->stop) {
			fd = pop_frame(c, fd);
			if (fd < 0 && c->nframes) {
				/* Cannot get back up: the rest is out of reach. */
				while (c->nframes) {
					f = &c->frames[--c->nframes];
					free_frame(f);
				}
			}
			continue;
		}

		const char *name = f->names + f->offs[f->next++];
		struct stat st;
		ahead_step(c);
		if (path_push(c, f->pathlen, name) < 0) {
			host_error(c, "copying", ENOMEM);
			continue;
		}
		if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			host_error(c, "reading attributes", errno);
			continue;
		}
		if (S_ISREG(st.st_mode) && skipped(c, &st)) {
			cli_error("%s: skipped: it is the image being written", c->path);
			continue;
		}
		c->stats->files++;
		if (c->o->verbose)
			printf("%s\n", c->path);
		if (!S_ISDIR(st.st_mode)) {
			copy_leaf(c, fd, name, f->dir, name, &st);
			continue;
		}
		int child = enter_dir(c, fd, name, f->dir, name, &st);
		if (child >= 0) {
			close(fd);
			fd = child;
		}
	}
	if (fd >= 0)
		close(fd);
}

/* ---- the entry point ---------------------------------------------------- */

/* Copy @src's own attributes onto the existing image directory @dir (mkfs --rootdir). */
static void adopt_dir(struct copy *c, int fd, butter_ino_t dir, const struct stat *st)
{
	struct butter_stat bs = { .mode = st->st_mode & 07777, .uid = st->st_uid, .gid = st->st_gid };
	int ret = butter_setattr(c->fs, dir, &bs, BUTTER_SET_MODE | BUTTER_SET_UID | BUTTER_SET_GID);

	if (ret < 0)
		image_error(c, "setting mode and owner", ret);
	if (!c->stop)
		copy_xattrs(c, dir, fd, -1, NULL);
}

int copyin(struct butter_fs *fs, const char *src, butter_ino_t dir, const char *name,
	   const struct copyin_opts *opts, struct copyin_stats *stats)
{
	struct copy c = { .fs = fs, .o = opts, .stats = stats, .top_fd = -1 };
	struct butter_info info;
	struct stat st;
	int ret = 0;

	c.ss = butter_get_info(fs, &info) == 0 && info.sectorsize ? info.sectorsize : 4096;
	c.buf = malloc(CHUNK);
	if (!c.buf || path_push(&c, 0, src) < 0) {
		cli_error("%s", strerror(ENOMEM));
		ret = -ENOMEM;
		goto out;
	}
	/* trailing slashes only say "a directory": drop them from what we print and split */
	while (c.pathlen > 1 && c.path[c.pathlen - 1] == '/')
		path_cut(&c, c.pathlen - 1);
	c.top_len = c.pathlen;

	/* the top of mkfs --rootdir may be a symlink to the directory; put copies symlinks */
	if (fstatat(AT_FDCWD, c.path, &st, name ? AT_SYMLINK_NOFOLLOW : 0) < 0) {
		ret = -errno;
		host_error(&c, "reading attributes", -ret);
		goto out;
	}
	if (!S_ISDIR(st.st_mode)) {
		if (!name) {
			ret = -ENOTDIR;
			host_error(&c, "copying its contents", ENOTDIR);
			goto out;
		}
		/* a single non-directory: open its directory, copy it by its last name */
		char *slash = strrchr(c.path, '/');
		const char *base = slash ? slash + 1 : c.path;
		int dfd;
		if (slash) {
			char *dname = strndup(c.path, slash == c.path ? 1 : (size_t)(slash - c.path));
			dfd = dname ? open(dname, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
			if (!dname)
				errno = ENOMEM;
			free(dname);
		} else {
			dfd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		}
		if (dfd < 0) {
			ret = -errno;
			host_error(&c, "opening its directory", -ret);
			goto out;
		}
		if (S_ISREG(st.st_mode) && skipped(&c, &st)) {
			cli_error("%s: skipped: it is the image being written", c.path);
		} else {
			stats->files++;
			if (opts->verbose)
				printf("%s\n", c.path);
			copy_leaf(&c, dfd, base, dir, name, &st);
		}
		close(dfd);
		goto out;
	}

	c.top_fd = open_noatime(AT_FDCWD, c.path, O_DIRECTORY);
	if (c.top_fd < 0 && errno == ELOOP && !name) /* the symlink of the comment above */
		c.top_fd = open(c.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (c.top_fd < 0) {
		ret = -errno;
		host_error(&c, "opening directory", -ret);
		goto out;
	}
	int fd;
	if (name) {
		stats->files++;
		if (opts->verbose)
			printf("%s\n", c.path);
		fd = enter_dir(&c, c.top_fd, ".", dir, name, &st);
	} else {
		fd = dup(c.top_fd);
		if (fd < 0) {
			ret = -errno;
			host_error(&c, "opening directory", -ret);
			goto out;
		}
		adopt_dir(&c, fd, dir, &st);
		ret = push_frame(&c, fd, dir, &st);
		if (ret < 0) {
			host_error(&c, "reading directory", -ret);
			close(fd);
			fd = -1;
		}
	}
	if (fd >= 0) {
		ahead_start(&c, fd);
		walk(&c, fd);
		ahead_stop(&c);
	}
	ret = 0;

out:
	if (c.top_fd >= 0)
		close(c.top_fd);
	free(c.links.v);
	free(c.frames);
	free(c.path);
	free(c.buf);
	free(c.xnames);
	free(c.xval);
	if (ret < 0)
		return ret;
	return c.failed ? 1 : 0;
}

/* ---- opening for writing ------------------------------------------------ */

/* cli_open_error(), with what only a read-write open can say. */
static const char *open_errstr(int err)
{
	switch (err) {
	case EOPNOTSUPP:
		return "butter cannot write this filesystem yet (see the message above)";
	case EROFS:
		return "cannot be written: a device is read-only or missing (see above)";
	default:
		return cli_open_error(err);
	}
}

int copyin_open_rw(const char *image, const char *const *devices, size_t ndevices,
		   struct butter_fs **fs)
{
	int ret = cli_devices_exist(image, devices, ndevices);

	if (ret < 0)
		return ret;
	struct butter_open_opts opts = { .devices = devices, .ndevices = ndevices,
					 .flags = cli_open_flags, .log_level = cli_log_level };
	ret = butter_open_testing(image, &opts, &cli_test_devices, fs);
	if (ret < 0) {
		const char *why = cli_nbd_open_error(image, devices, ndevices, -ret);

		cli_error("%s: %s", image, why ? why : open_errstr(-ret));
	}
	return ret;
}
