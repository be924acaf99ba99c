/*
 * cmd_extract.c — `butter extract`: copy a tree out of an image into a host
 * directory, keeping everything a file carries.
 *
 * Promises:
 *  1. One bad file never stops the extraction: every failure is reported as
 *     "butter: PATH: problem" and the command exits 1 at the end. With
 *     several jobs (-j), messages about different files may come in another
 *     order than the walk's (each file's own messages keep their order).
 *  2. Unreadable data is skipped sector by sector: a chunk that reads -EIO is
 *     read again one sector at a time, only the sectors without a good copy
 *     are left as holes, and each run of them is reported as
 *     "unreadable bytes START-END" (END inclusive).
 *  3. Holes stay holes: only the ranges butter_seek() calls data are written,
 *     then the file is given its size.
 *  4. Depth costs heap, not stack, and not file descriptors: directories are
 *     walked with an explicit stack of frames; only the current directory is
 *     open, and going up reopens ".." and checks it is the directory we came
 *     from (else it is reopened from DEST, one component at a time). Files
 *     waiting for a copier hold one descriptor each, at most QUEUE of them,
 *     plus one per copier at work.
 *  5. A directory's attributes are set when the walk leaves it, after its
 *     last entry was created, so its mtime and mode are the image's. The
 *     copiers never touch a directory (they write through the descriptor the
 *     walk created the file with), so they need not have finished by then.
 *  6. Attribute order for every file: data, owner, xattrs (a chown drops
 *     security.capability), mode (a chown drops setuid/setgid), times.
 *  7. Within the extraction, (subvolume, inode) identifies a file: the second
 *     and later names of an inode with nlink > 1 become hard links to the
 *     first name extracted. Snapshots are other subvolumes, so their files are
 *     separate copies. A directory that is its own ancestor (a loop in a
 *     corrupt image) is reported and not entered, so the walk always ends.
 *  8. Names are used only as single path components (openat and friends on
 *     the current directory), and a name holding '/' or being "." or ".." is
 *     refused, so nothing is ever written outside DEST.
 *
 * Threads (-j N, N > 1): the walk runs on the calling thread alone, in the
 * same order whatever N is: it reads directories, creates every name
 * (directories, symlinks, specials, hard links, and each regular file,
 * opened O_CREAT|O_EXCL) and records first names of hard-linked inodes, so
 * the first name extracted is the walk's first, as with -j 1. A regular file
 * with data is then queued with its open descriptor; N copier threads take
 * files off the queue and do the rest (data, attributes, close), each with
 * its own buffers. The library's reads run in parallel (butter.h: read calls
 * on a handle may come from any thread). Messages and the progress line go
 * out under one lock; the counts are atomic. -j 1 copies on the walking
 * thread, as before there were copiers.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define CHUNK (1u << 20)     /* read size for file data */
#define BATCH 1024           /* directory entries fetched per butter_readdir() call */
#define BATCH_FULL 2         /* collect() stops butter_readdir() with this (not 1: see refill()) */
#define PROGRESS_NS 250000000 /* progress line refresh */
#define QUEUE 64             /* files (open descriptors) waiting for a copier */
#define WAKE_BATCH 16        /* queued files that wake an idle copier... */
#define WAKE_BYTES (256u << 10) /* ...or one file this large */
#define MAX_JOBS 64          /* -j bound */
#define DEFAULT_JOBS_MAX 8   /* the default -j: the online CPUs, at most this */

/* A set of (subvolume, inode) → host path relative to DEST (NULL in the directory set). */
struct inomap_slot {
	uint64_t subvol, ino; /* ino 0: empty slot (btrfs inode numbers start at 256) */
	char *rel;
};

struct inomap {
	struct inomap_slot *v;
	size_t cap, n; /* cap is a power of two */
};

struct dir_entry {
	size_t name_off, namelen;
	butter_ino_t ino;
};

/* One directory being walked; frames form the explicit stack. */
struct frame {
	butter_ino_t dir;
	struct butter_stat st; /* applied when the walk leaves the directory */
	size_t pathlen;        /* length of the walk's path naming this directory */
	dev_t hdev;            /* host identity of the directory created for it */
	ino_t hino;
	uint64_t pos;          /* butter_readdir() position of the next batch */
	bool eof;
	struct dir_entry *ents;
	size_t nents, next, ents_cap;
	char *names;
	size_t names_len, names_cap;
};

struct extract;

/*
 * What one thread works with: the entry at hand (its path, for messages) and
 * its own buffers. The walk has one; each copier has one.
 */
struct ctx {
	struct extract *x;
	char *path;           /* image path of the entry at hand ("" is "/") */
	size_t pathlen, pathcap;
	size_t rel_off;       /* path + rel_off: the same entry relative to DEST */
	char *buf;            /* CHUNK bytes of file data */
	char *xnames, *xval;
	size_t xnames_cap, xval_cap;
	/* unreadable run of the file being copied, [bad_start, bad_end) */
	uint64_t bad_start, bad_end;
	uint64_t wend;        /* end of the furthest byte written to the file being copied */
};

/* A regular file the walk created, for a copier to fill. */
struct job {
	int fd;
	butter_ino_t ino;
	struct butter_stat st;
	char *path;           /* its image path (malloc'd) */
	size_t pathlen, rel_off;
};

struct extract {
	struct butter_fs *fs;
	const char *dest;     /* DEST as given, for messages about host files */
	int dest_fd;
	uint32_t sectorsize;
	struct inomap links;  /* first name of each inode with nlink > 1 (the walk's) */
	struct inomap ancestors; /* the directories of the frames on the stack */
	struct frame *frames;
	size_t nframes, frames_cap;
	bool verbose, progress;
	/* messages, the progress line and what they note, under msg_lock */
	pthread_mutex_t msg_lock;
	bool failed, progress_shown, chown_warned;
	struct timespec last_progress;
	_Atomic uint64_t nfiles, nbytes;
	/* the copiers (none with -j 1) and their queue, under q_lock */
	unsigned ncopiers;
	pthread_t *threads;
	struct ctx *copiers;
	pthread_mutex_t q_lock;
	pthread_cond_t q_more, q_room;
	struct job q[QUEUE];
	size_t q_head, q_len;
	unsigned idle, room_waiters;
	bool q_stop;
};

/* ---- messages ----------------------------------------------------------- */

/*
 * Start a message: take msg_lock, and hold stderr so that the library's log
 * lines (one fprintf each) from other threads cannot land inside one of ours
 * (cli_error() writes a line in three pieces); clear the progress line.
 */
static void msg_begin(struct extract *x)
{
	pthread_mutex_lock(&x->msg_lock);
	flockfile(stderr);
	if (x->progress_shown) {
		fputs("\r\033[K", stderr);
		x->progress_shown = false;
	}
}

static void msg_end(struct extract *x)
{
	funlockfile(stderr);
	pthread_mutex_unlock(&x->msg_lock);
}

static const char *shown_path(struct ctx *c)
{
	return c->pathlen ? c->path : "/";
}

/* Report a problem reading the image entry at hand. */
static void read_error(struct ctx *c, const char *what, int err)
{
	struct extract *x = c->x;

	msg_begin(x);
	if (what)
		cli_error("%s: %s: %s", shown_path(c), what, strerror(err));
	else
		cli_error("%s: %s", shown_path(c), strerror(err));
	x->failed = true;
	msg_end(x);
}

/* Report a problem writing the host file of the entry at hand. */
static void host_error(struct ctx *c, const char *what, int err)
{
	struct extract *x = c->x;
	const char *rel = c->pathlen > c->rel_off ? c->path + c->rel_off : "";

	msg_begin(x);
	cli_error("%s%s%s: %s: %s", x->dest, *rel ? "/" : "", rel, what, strerror(err));
	x->failed = true;
	msg_end(x);
}

static void progress(struct extract *x, bool force)
{
	struct timespec now;
	char sz[32];

	if (!x->progress)
		return;
	clock_gettime(CLOCK_MONOTONIC, &now);
	pthread_mutex_lock(&x->msg_lock);
	int64_t ns = (int64_t)(now.tv_sec - x->last_progress.tv_sec) * 1000000000 +
		     (now.tv_nsec - x->last_progress.tv_nsec);
	if (force || ns >= PROGRESS_NS) {
		x->last_progress = now;
		fprintf(stderr, "\r\033[K%" PRIu64 " files, %s", atomic_load(&x->nfiles),
			cli_size(sz, sizeof(sz), atomic_load(&x->nbytes), false));
		x->progress_shown = true;
	}
	pthread_mutex_unlock(&x->msg_lock);
}

/* ---- the inode map ------------------------------------------------------ */

static size_t inomap_hash(uint64_t subvol, uint64_t ino)
{
	uint64_t h = (ino ^ (subvol * 0x9e3779b97f4a7c15ull)) * 0xff51afd7ed558ccdull;
	return (size_t)(h ^ (h >> 32));
}

static struct inomap_slot *inomap_find(struct inomap *m, butter_ino_t k)
{
	if (!m->cap)
		return NULL;
	for (size_t i = inomap_hash(k.subvol, k.ino) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
		struct inomap_slot *s = &m->v[i];
		if (!s->ino)
			return NULL;
		if (s->ino == k.ino && s->subvol == k.subvol)
			return s;
	}
}

/* Add @k (absent) with @rel (owned by the map from now on); 0 or -ENOMEM. */
static int inomap_add(struct inomap *m, butter_ino_t k, char *rel)
{
	if ((m->n + 1) * 4 > m->cap * 3) {
		size_t cap = m->cap ? m->cap * 2 : 1024;
		struct inomap_slot *v = calloc(cap, sizeof(*v));
		if (!v)
			return -ENOMEM;
		for (size_t j = 0; j < m->cap; j++) {
			struct inomap_slot *s = &m->v[j];
			if (!s->ino)
				continue;
			size_t i = inomap_hash(s->subvol, s->ino) & (cap - 1);
			while (v[i].ino)
				i = (i + 1) & (cap - 1);
			v[i] = *s;
		}
		free(m->v);
		m->v = v;
		m->cap = cap;
	}
	size_t i = inomap_hash(k.subvol, k.ino) & (m->cap - 1);
	while (m->v[i].ino)
		i = (i + 1) & (m->cap - 1);
	m->v[i] = (struct inomap_slot){ k.subvol, k.ino, rel };
	m->n++;
	return 0;
}

/* Remove @s, shifting back the entries probing past it. */
static void inomap_del(struct inomap *m, struct inomap_slot *s)
{
	if (!s)
		return;
	size_t mask = m->cap - 1, i = (size_t)(s - m->v);

	free(s->rel);
	for (size_t j = (i + 1) & mask; m->v[j].ino; j = (j + 1) & mask) {
		size_t h = inomap_hash(m->v[j].subvol, m->v[j].ino) & mask;
		/* v[j] may fill the hole at i unless its home lies cyclically in (i, j]. */
		bool stays = i < j ? (h > i && h <= j) : (h > i || h <= j);
		if (!stays) {
			m->v[i] = m->v[j];
			i = j;
		}
	}
	m->v[i] = (struct inomap_slot){ 0 };
	m->n--;
}

static void inomap_free(struct inomap *m)
{
	for (size_t i = 0; i < m->cap; i++)
		free(m->v[i].rel);
	free(m->v);
}

/* ---- paths -------------------------------------------------------------- */

/* Set the path at hand to the directory's path @len plus "/" @name. */
static int path_push(struct ctx *c, size_t len, const char *name, size_t namelen)
{
	size_t need = len + 1 + namelen + 1;

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
	c->path[len] = '/';
	memcpy(c->path + len + 1, name, namelen);
	c->pathlen = len + 1 + namelen;
	c->path[c->pathlen] = '\0';
	return 0;
}

static void path_cut(struct ctx *c, size_t len)
{
	c->pathlen = len;
	c->path[len] = '\0';
}

/* Open the directory @rel (relative to DEST, @len bytes, may be empty); fd or -errno. */
static int open_rel_dir(struct extract *x, const char *rel, size_t len)
{
	return cli_open_dir_path(x->dest_fd, rel, len, false);
}

/* Create a hard link @name in @dirfd to @rel (relative to DEST); 0 or -errno. */
static int link_rel(struct extract *x, const char *rel, int dirfd, const char *name)
{
	size_t len = strlen(rel);

	if (len < PATH_MAX)
		return linkat(x->dest_fd, rel, dirfd, name, 0) < 0 ? -errno : 0;

	/* Too long for one system call: open its directory step by step. */
	const char *slash = strrchr(rel, '/');
	int pfd = open_rel_dir(x, rel, slash ? (size_t)(slash - rel) : 0);
	if (pfd < 0)
		return pfd;
	int ret = linkat(pfd, slash ? slash + 1 : rel, dirfd, name, 0) < 0 ? -errno : 0;
	close(pfd);
	return ret;
}

/* ---- attributes --------------------------------------------------------- */

/* List the xattr names of @ino into c->xnames; their length, or -errno. */
static ssize_t list_xattrs(struct ctx *c, butter_ino_t ino)
{
	struct butter_fs *fs = c->x->fs;
	ssize_t n;

	/* One call when the names fit the buffer of earlier files. */
	if (c->xnames_cap > 1) {
		n = butter_listxattr(fs, ino, c->xnames, c->xnames_cap - 1);
		if (n != -ERANGE)
			return n;
	}
	for (;;) {
		n = butter_listxattr(fs, ino, NULL, 0);
		if (n <= 0)
			return n;
		if (cli_grow(&c->xnames, &c->xnames_cap, (size_t)n + 1) < 0)
			return -ENOMEM;
		n = butter_listxattr(fs, ino, c->xnames, c->xnames_cap - 1);
		if (n != -ERANGE)
			return n;
	}
}

/* Read the value of xattr @k of @ino into c->xval; its length, or -errno. */
static ssize_t get_xattr(struct ctx *c, butter_ino_t ino, const char *k)
{
	struct butter_fs *fs = c->x->fs;
	ssize_t v;

	if (c->xval_cap > 0) {
		v = butter_getxattr(fs, ino, k, c->xval, c->xval_cap);
		if (v != -ERANGE)
			return v;
	}
	for (;;) {
		v = butter_getxattr(fs, ino, k, NULL, 0);
		if (v < 0)
			return v;
		if (cli_grow(&c->xval, &c->xval_cap, (size_t)v + 1) < 0)
			return -ENOMEM;
		v = butter_getxattr(fs, ino, k, c->xval, c->xval_cap);
		if (v != -ERANGE)
			return v;
	}
}

/* Copy every xattr of @ino to the host file: @fd if >= 0, else @dirfd/@name. */
static void copy_xattrs(struct ctx *c, butter_ino_t ino, int fd, int dirfd, const char *name)
{
	char proc[64 + NAME_MAX];
	ssize_t n = list_xattrs(c, ino);

	if (n < 0) {
		read_error(c, "listing xattrs", (int)-n);
		return;
	}
	if (n == 0)
		return; /* no xattrs (and xnames may still be NULL) */
	c->xnames[n] = '\0'; /* the walk below stops even if the last name is not ended */
	if (fd < 0)
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d/%s", dirfd, name);

	for (const char *k = c->xnames; k < c->xnames + n; k += strlen(k) + 1) {
		ssize_t v = get_xattr(c, ino, k);
		char what[64 + XATTR_NAME_MAX];
		if (v < 0) {
			snprintf(what, sizeof(what), "reading xattr %s", k);
			read_error(c, what, (int)-v);
			continue;
		}
		int ret = fd >= 0 ? fsetxattr(fd, k, c->xval, (size_t)v, 0)
				  : lsetxattr(proc, k, c->xval, (size_t)v, 0);
		/* btrfs.* names are btrfs properties (e.g. btrfs.compression), kept only
		 * where the host is btrfs: elsewhere they are not an error */
		if (ret < 0 && !strncmp(k, "btrfs.", 6) && (errno == EOPNOTSUPP || errno == EINVAL))
			continue;
		if (ret < 0) {
			snprintf(what, sizeof(what), "setting xattr %s", k);
			host_error(c, what, errno);
		}
	}
}

/*
 * Give the host file the owner, xattrs, mode and times of @st, in that order
 * (promise 6): through @fd if >= 0, else by @name in @dirfd.
 */
static void set_attrs(struct ctx *c, const struct butter_stat *st, butter_ino_t ino, int fd,
		      int dirfd, const char *name)
{
	struct extract *x = c->x;
	int ret = fd >= 0 ? fchown(fd, st->uid, st->gid)
			  : fchownat(dirfd, name, st->uid, st->gid, AT_SYMLINK_NOFOLLOW);
	if (ret < 0) {
		if (errno == EPERM && geteuid() != 0) {
			pthread_mutex_lock(&x->msg_lock);
			bool first = !x->chown_warned;
			x->chown_warned = true;
			pthread_mutex_unlock(&x->msg_lock);
			if (first) {
				msg_begin(x);
				cli_error("%s: not root: files keep your own uid and gid", x->dest);
				msg_end(x);
			}
		} else {
			host_error(c, "setting owner", errno);
		}
	}

	copy_xattrs(c, ino, fd, dirfd, name);

	if (!S_ISLNK(st->mode)) {
		mode_t mode = st->mode & 07777;
		ret = fd >= 0 ? fchmod(fd, mode) : fchmodat(dirfd, name, mode, 0);
		if (ret < 0)
			host_error(c, "setting mode", errno);
	}

	struct timespec ts[2] = { st->atime, st->mtime };
	ret = fd >= 0 ? futimens(fd, ts) : utimensat(dirfd, name, ts, AT_SYMLINK_NOFOLLOW);
	if (ret < 0)
		host_error(c, "setting times", errno);
}

/* ---- file data ---------------------------------------------------------- */

static void flush_bad(struct ctx *c)
{
	if (c->bad_end > c->bad_start) {
		char what[96];
		snprintf(what, sizeof(what), "unreadable bytes %" PRIu64 "-%" PRIu64, c->bad_start,
			 c->bad_end - 1);
		read_error(c, what, EIO);
	}
	c->bad_start = c->bad_end = 0;
}

static void note_bad(struct ctx *c, uint64_t start, uint64_t end)
{
	if (c->bad_end > c->bad_start && c->bad_end == start) {
		c->bad_end = end;
		return;
	}
	flush_bad(c);
	c->bad_start = start;
	c->bad_end = end;
}

static bool all_zero(const char *p, size_t n)
{
	return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/* Write @n bytes of c->buf at @off; 0 or -1 (reported). */
static int put(struct ctx *c, int fd, size_t n, uint64_t off, bool skip_zero)
{
	const char *p = c->buf;

	if (skip_zero && all_zero(p, n))
		return 0;
	while (n) {
		ssize_t w = pwrite(fd, p, n, (off_t)off);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			host_error(c, "writing", errno);
			return -1;
		}
		p += w;
		n -= (size_t)w;
		off += (uint64_t)w;
		if (off > c->wend)
			c->wend = off;
		atomic_fetch_add_explicit(&c->x->nbytes, (uint64_t)w, memory_order_relaxed);
	}
	return 0;
}

/*
 * Deal with what a read of @want bytes at @pos into c->buf gave (@r, not
 * -EIO): write the bytes read. Returns 1 at end of file (a short read), 0 to
 * go on, -1 to give up on this file.
 */
static int write_read(struct ctx *c, int fd, ssize_t r, size_t want, uint64_t pos, bool skip_zero)
{
	if (r < 0) {
		read_error(c, NULL, (int)-r);
		return -1;
	}
	if (r > 0)
		flush_bad(c);
	if (put(c, fd, (size_t)r, pos, skip_zero) < 0)
		return -1;
	return (size_t)r < want ? 1 : 0;
}

/*
 * Read [@start, @end) again sector by sector after a chunk failed with -EIO,
 * writing what reads and noting what does not. Returns 1 at end of file, 0 to
 * go on, -1 to give up on this file.
 */
static int copy_sectors(struct ctx *c, int fd, butter_ino_t ino, uint64_t start, uint64_t end,
			bool skip_zero)
{
	uint64_t ss = c->x->sectorsize;

	for (uint64_t pos = start; pos < end;) {
		uint64_t next = (pos / ss + 1) * ss;
		if (next > end)
			next = end;
		ssize_t r = butter_read(c->x->fs, ino, c->buf, (size_t)(next - pos), pos);
		if (r == -EIO) {
			note_bad(c, pos, next);
		} else {
			int ret = write_read(c, fd, r, (size_t)(next - pos), pos, skip_zero);
			if (ret)
				return ret;
		}
		pos = next;
	}
	return 0;
}

/* Copy [@start, @end) of @ino; returns as copy_sectors() does. */
static int copy_range(struct ctx *c, int fd, butter_ino_t ino, uint64_t start, uint64_t end,
		      bool skip_zero)
{
	for (uint64_t pos = start; pos < end;) {
		size_t n = end - pos < CHUNK ? (size_t)(end - pos) : CHUNK;
		ssize_t r = butter_read(c->x->fs, ino, c->buf, n, pos);
		int ret = r == -EIO ? copy_sectors(c, fd, ino, pos, pos + n, skip_zero)
				    : write_read(c, fd, r, n, pos, skip_zero);
		if (ret)
			return ret;
		pos += n;
		progress(c->x, false);
	}
	return 0;
}

/*
 * Copy the data of @ino (size @size) into @fd, a new empty file, holes as
 * holes (promise 3).
 */
static void copy_data(struct ctx *c, int fd, butter_ino_t ino, uint64_t size)
{
	struct butter_fs *fs = c->x->fs;
	uint64_t off = 0;

	c->bad_start = c->bad_end = 0;
	c->wend = 0;
	while (off < size) {
		uint64_t data, hole;
		int ret = butter_seek(fs, ino, off, SEEK_DATA, &data);
		if (ret == -ENXIO)
			break;
		if (ret < 0) {
			/* No map of the holes: read everything, write what is not zero. */
			read_error(c, "finding data ranges", -ret);
			copy_range(c, fd, ino, off, size, true);
			break;
		}
		if (data >= size)
			break;
		if (data < off)
			data = off;
		ret = butter_seek(fs, ino, data, SEEK_HOLE, &hole);
		if (ret < 0 || hole > size)
			hole = size;
		if (hole <= data)
			hole = size - data > CHUNK ? data + CHUNK : size;
		if (copy_range(c, fd, ino, data, hole, false))
			break;
		off = hole;
	}
	flush_bad(c);
	/* The file was empty: its size is the end of the last write unless a hole ends it. */
	if (c->wend != size && ftruncate(fd, (off_t)size) < 0)
		host_error(c, "setting size", errno);
}

/*
 * Fill the new file @fd for @ino and give it its attributes; closes @fd.
 * The library calls go in one shared section (nothing here waits for another
 * thread): one take of the handle's lock instead of one per call.
 */
static void fill_regular(struct ctx *c, int fd, butter_ino_t ino, const struct butter_stat *st)
{
	bool section = butter_lock(c->x->fs, 0) == 0;

	copy_data(c, fd, ino, st->size);
	set_attrs(c, st, ino, fd, -1, NULL);
	if (section)
		butter_unlock(c->x->fs);
	if (close(fd) < 0)
		host_error(c, "closing", errno);
}

/* ---- the copiers -------------------------------------------------------- */

static void *copier_main(void *arg)
{
	struct ctx *c = arg;
	struct extract *x = c->x;

	pthread_mutex_lock(&x->q_lock);
	for (;;) {
		while (!x->q_len && !x->q_stop) {
			x->idle++;
			pthread_cond_wait(&x->q_more, &x->q_lock);
			x->idle--;
		}
		if (!x->q_len)
			break; /* stopping, and nothing is left */
		struct job j = x->q[x->q_head];
		x->q_head = (x->q_head + 1) % QUEUE;
		x->q_len--;
		if (x->room_waiters && x->q_len <= QUEUE - WAKE_BATCH)
			pthread_cond_signal(&x->q_room);
		pthread_mutex_unlock(&x->q_lock);

		c->path = j.path;
		c->pathlen = j.pathlen;
		c->rel_off = j.rel_off;
		fill_regular(c, j.fd, j.ino, &j.st);
		free(j.path);
		c->path = NULL;
		c->pathlen = 0;

		pthread_mutex_lock(&x->q_lock);
	}
	pthread_mutex_unlock(&x->q_lock);
	return NULL;
}

static void free_ctx(struct ctx *c)
{
	free(c->buf);
	free(c->xnames);
	free(c->xval);
}

/*
 * Start up to @n copiers. Fewer (even none: the walk then copies itself) if
 * threads or memory run out; that changes only the speed.
 */
static void start_copiers(struct extract *x, unsigned n)
{
	if (n < 2)
		return;
	x->threads = calloc(n, sizeof(*x->threads));
	x->copiers = calloc(n, sizeof(*x->copiers));
	if (!x->threads || !x->copiers)
		return;
	for (unsigned i = 0; i < n; i++) {
		struct ctx *c = &x->copiers[x->ncopiers];
		*c = (struct ctx){ .x = x, .buf = malloc(CHUNK) };
		if (!c->buf)
			break;
		if (pthread_create(&x->threads[x->ncopiers], NULL, copier_main, c) != 0) {
			free(c->buf);
			break;
		}
		x->ncopiers++;
	}
}

/* Let the copiers finish the queue, and wait for them. */
static void stop_copiers(struct extract *x)
{
	pthread_mutex_lock(&x->q_lock);
	x->q_stop = true;
	pthread_cond_broadcast(&x->q_more);
	pthread_mutex_unlock(&x->q_lock);
	for (unsigned i = 0; i < x->ncopiers; i++) {
		pthread_join(x->threads[i], NULL);
		free_ctx(&x->copiers[i]);
	}
	x->ncopiers = 0;
	free(x->threads);
	free(x->copiers);
	x->threads = NULL;
	x->copiers = NULL;
}

/*
 * Hand the new file @fd (the entry at hand of the walk's @c) to a copier,
 * waiting for room in the queue; -ENOMEM leaves it to the caller.
 */
static int queue_regular(struct ctx *c, int fd, butter_ino_t ino, const struct butter_stat *st)
{
	struct extract *x = c->x;
	char *path = malloc(c->pathlen + 1);

	if (!path)
		return -ENOMEM;
	memcpy(path, c->path, c->pathlen + 1);
	pthread_mutex_lock(&x->q_lock);
	while (x->q_len == QUEUE) {
		if (x->idle)
			pthread_cond_broadcast(&x->q_more);
		x->room_waiters++;
		pthread_cond_wait(&x->q_room, &x->q_lock);
		x->room_waiters--;
	}
	x->q[(x->q_head + x->q_len) % QUEUE] = (struct job){
		.fd = fd, .ino = ino, .st = *st, .path = path, .pathlen = c->pathlen,
		.rel_off = c->rel_off,
	};
	x->q_len++;
	/*
	 * Small files wake a copier in batches: one wake-up (two context
	 * switches) per file would cost about as much as copying it.
	 */
	if (x->idle && (x->q_len >= WAKE_BATCH || st->size >= WAKE_BYTES))
		pthread_cond_signal(&x->q_more);
	pthread_mutex_unlock(&x->q_lock);
	return 0;
}

/* Wake idle copiers for whatever is queued: the walk may block for a while. */
static void wake_copiers(struct extract *x)
{
	if (!x->ncopiers)
		return;
	pthread_mutex_lock(&x->q_lock);
	if (x->idle && x->q_len)
		pthread_cond_broadcast(&x->q_more);
	pthread_mutex_unlock(&x->q_lock);
}

/* ---- one entry ---------------------------------------------------------- */

/* After -EEXIST on creating @name: remove what is there so we can try again. */
static bool replace(int dirfd, const char *name)
{
	return unlinkat(dirfd, name, 0) == 0 || errno == ENOENT;
}

static void extract_regular(struct ctx *c, int dirfd, const char *name, butter_ino_t ino,
			    const struct butter_stat *st, bool *made)
{
	int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
	int fd = openat(dirfd, name, flags, 0600);

	if (fd < 0 && errno == EEXIST && replace(dirfd, name))
		fd = openat(dirfd, name, flags, 0600);
	if (fd < 0) {
		host_error(c, "creating", errno);
		return;
	}
	*made = true;
	/* A file without data costs a copier more to take than to finish here. */
	if (c->x->ncopiers && st->size > 0 && queue_regular(c, fd, ino, st) == 0)
		return;
	fill_regular(c, fd, ino, st);
}

static void extract_symlink(struct ctx *c, int dirfd, const char *name, butter_ino_t ino,
			    const struct butter_stat *st, bool *made)
{
	char *target;
	int ret = cli_readlink(c->x->fs, ino, st->size, &target);

	if (ret < 0) {
		read_error(c, "reading symlink", -ret);
		return;
	}
	ret = symlinkat(target, dirfd, name);
	if (ret < 0 && errno == EEXIST && replace(dirfd, name))
		ret = symlinkat(target, dirfd, name);
	free(target);
	if (ret < 0) {
		host_error(c, "creating symlink", errno);
		return;
	}
	*made = true;
	set_attrs(c, st, ino, -1, dirfd, name);
}

static void extract_special(struct ctx *c, int dirfd, const char *name, butter_ino_t ino,
			    const struct butter_stat *st, bool *made)
{
	mode_t mode = (st->mode & S_IFMT) | 0600;
	dev_t rdev = S_ISCHR(st->mode) || S_ISBLK(st->mode) ? (dev_t)st->rdev : 0;
	int ret = mknodat(dirfd, name, mode, rdev);

	if (ret < 0 && errno == EEXIST && replace(dirfd, name))
		ret = mknodat(dirfd, name, mode, rdev);
	if (ret < 0) {
		host_error(c, "creating", errno);
		return;
	}
	*made = true;
	set_attrs(c, st, ino, -1, dirfd, name);
}

/*
 * Extract the non-directory @ino as @name in @dirfd (the path at hand names
 * it). The walk's thread only: it owns the hard-link map.
 */
static void extract_leaf(struct ctx *c, int dirfd, const char *name, butter_ino_t ino,
			 const struct butter_stat *st)
{
	struct extract *x = c->x;
	bool linked = st->nlink > 1;
	bool made = false;

	if (linked) {
		struct inomap_slot *s = inomap_find(&x->links, ino);
		if (s) {
			/* The first name exists: a copier may still be filling it, through
			 * its own descriptor of the same inode. */
			int ret = link_rel(x, s->rel, dirfd, name);
			if (ret == -EEXIST && replace(dirfd, name))
				ret = link_rel(x, s->rel, dirfd, name);
			if (ret < 0)
				host_error(c, "creating hard link", -ret);
			return;
		}
	}

	switch (st->mode & S_IFMT) {
	case S_IFREG:
		extract_regular(c, dirfd, name, ino, st, &made);
		break;
	case S_IFLNK:
		extract_symlink(c, dirfd, name, ino, st, &made);
		break;
	case S_IFCHR:
	case S_IFBLK:
	case S_IFIFO:
	case S_IFSOCK:
		extract_special(c, dirfd, name, ino, st, &made);
		break;
	default:
		read_error(c, "unknown file type", EUCLEAN);
		break;
	}

	if (made && linked) {
		char *rel = strdup(c->path + c->rel_off);
		if (!rel || inomap_add(&x->links, ino, rel) < 0) {
			free(rel);
			read_error(c, "remembering hard link", ENOMEM);
		}
	}
}

/* ---- the walk ----------------------------------------------------------- */

static int collect(void *arg, const char *name, size_t namelen, butter_ino_t ino, unsigned dtype,
		   uint64_t next_pos)
{
	struct frame *f = arg;

	(void)dtype;
	if (f->nents == f->ents_cap) {
		size_t cap = f->ents_cap ? f->ents_cap * 2 : 16;
		struct dir_entry *v = realloc(f->ents, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		f->ents = v;
		f->ents_cap = cap;
	}
	if (f->names_len + namelen + 1 > f->names_cap) {
		size_t cap = f->names_cap ? f->names_cap : 256;
		while (cap < f->names_len + namelen + 1)
			cap *= 2;
		char *p = realloc(f->names, cap);
		if (!p)
			return -ENOMEM;
		f->names = p;
		f->names_cap = cap;
	}
	memcpy(f->names + f->names_len, name, namelen);
	f->names[f->names_len + namelen] = '\0';
	f->ents[f->nents++] = (struct dir_entry){ f->names_len, namelen, ino };
	f->names_len += namelen + 1;
	f->pos = next_pos;
	return f->nents >= BATCH ? BATCH_FULL : 0;
}

/* Fetch the next batch of entries of the top frame. */
static void refill(struct ctx *c, struct frame *f)
{
	uint64_t pos = f->pos;

	wake_copiers(c->x);
	f->nents = f->next = f->names_len = 0;
	int ret = butter_readdir(c->x->fs, f->dir, f->pos, collect, f);
	/*
	 * A full batch means there may be more, even if the stop value did not
	 * come back (a library folding it into 0 must not cut directories short).
	 */
	if (ret == 0 && f->nents >= BATCH)
		ret = BATCH_FULL;
	if (ret == BATCH_FULL && f->pos == pos)
		ret = -EUCLEAN; /* no progress: never loop on it */
	if (ret != BATCH_FULL)
		f->eof = true;
	if (ret < 0) {
		path_cut(c, f->pathlen);
		read_error(c, "reading directory", -ret);
	}
}

static int push_frame(struct ctx *c, butter_ino_t dir, const struct butter_stat *st, int fd)
{
	struct extract *x = c->x;
	struct stat hs;

	if (fstat(fd, &hs) < 0)
		return -errno;
	if (x->nframes == x->frames_cap) {
		size_t cap = x->frames_cap ? x->frames_cap * 2 : 64;
		struct frame *v = realloc(x->frames, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		x->frames = v;
		x->frames_cap = cap;
	}
	int ret = inomap_add(&x->ancestors, dir, NULL);
	if (ret < 0)
		return ret;
	x->frames[x->nframes++] = (struct frame){
		.dir = dir, .st = *st, .pathlen = c->pathlen, .hdev = hs.st_dev, .hino = hs.st_ino,
	};
	return 0;
}

/* Leave the top frame: reopen the parent, set the directory's attributes. Returns the parent fd. */
static int pop_frame(struct ctx *c, int fd)
{
	struct extract *x = c->x;
	struct frame *f = &x->frames[x->nframes - 1];
	int parent = -1;

	if (x->nframes > 1) {
		struct frame *p = f - 1;
		struct stat hs;
		parent = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (parent >= 0 && (fstat(parent, &hs) < 0 || hs.st_dev != p->hdev ||
				    hs.st_ino != p->hino)) {
			close(parent);
			parent = -1;
		}
		if (parent < 0) {
			size_t off = p->pathlen > c->rel_off ? c->rel_off : p->pathlen;
			parent = open_rel_dir(x, c->path + off, p->pathlen - off);
		}
	}

	path_cut(c, f->pathlen);
	set_attrs(c, &f->st, f->dir, fd, -1, NULL);
	close(fd);
	free(f->ents);
	free(f->names);
	inomap_del(&x->ancestors, inomap_find(&x->ancestors, f->dir));
	x->nframes--;
	if (x->nframes && parent < 0) {
		path_cut(c, f[-1].pathlen);
		host_error(c, "reopening directory", -parent);
	}
	return parent;
}

/* Is @name usable as one path component? (promise 8) */
static bool sane_name(const char *name, size_t namelen)
{
	if (namelen == 0 || namelen > NAME_MAX || memchr(name, '/', namelen) ||
	    strlen(name) != namelen)
		return false;
	return !(name[0] == '.' && (namelen == 1 || (namelen == 2 && name[1] == '.')));
}

/* Create (or reuse) directory @name in @dirfd and open it; fd or -1 (reported). */
static int make_dir(struct ctx *c, int dirfd, const char *name)
{
	int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

	if (mkdirat(dirfd, name, 0700) < 0 && errno != EEXIST) {
		host_error(c, "creating directory", errno);
		return -1;
	}
	int fd = openat(dirfd, name, flags);
	if (fd < 0 && (errno == ENOTDIR || errno == ELOOP) && replace(dirfd, name)) {
		if (mkdirat(dirfd, name, 0700) == 0)
			fd = openat(dirfd, name, flags);
	}
	if (fd < 0)
		host_error(c, "opening directory", errno);
	return fd;
}

/* Extract the directory @root (stat @st) into DEST, which @fd is open on. */
static void extract_tree(struct ctx *c, butter_ino_t root, const struct butter_stat *st, int fd)
{
	struct extract *x = c->x;
	int ret = push_frame(c, root, st, fd);

	if (ret < 0) {
		host_error(c, "starting", -ret);
		close(fd);
		return;
	}

	while (x->nframes) {
		struct frame *f = &x->frames[x->nframes - 1];
		if (f->next == f->nents) {
			if (!f->eof) {
				refill(c, f);
				continue;
			}
			fd = pop_frame(c, fd);
			if (fd < 0) {
				/* Cannot get back up: the rest is out of reach. */
				while (x->nframes) {
					f = &x->frames[--x->nframes];
					free(f->ents);
					free(f->names);
				}
			}
			continue;
		}

		struct dir_entry *e = &f->ents[f->next++];
		const char *name = f->names + e->name_off;
		butter_ino_t ino = e->ino;
		struct butter_stat cst;

		if (path_push(c, f->pathlen, name, e->namelen) < 0) {
			read_error(c, NULL, ENOMEM);
			continue;
		}
		if (!sane_name(name, e->namelen)) {
			read_error(c, "refusing this name", EUCLEAN);
			continue;
		}
		ret = butter_stat(x->fs, ino, &cst);
		if (ret < 0) {
			read_error(c, NULL, -ret);
			continue;
		}
		atomic_fetch_add_explicit(&x->nfiles, 1, memory_order_relaxed);
		if (x->verbose)
			printf("%s\n", c->path);
		progress(x, false);

		if (!S_ISDIR(cst.mode)) {
			extract_leaf(c, fd, name, ino, &cst);
			continue;
		}
		if (inomap_find(&x->ancestors, ino)) {
			read_error(c, "directory loop", EUCLEAN);
			continue;
		}
		int child = make_dir(c, fd, name);
		if (child < 0)
			continue;
		ret = push_frame(c, ino, &cst, child);
		if (ret < 0) {
			read_error(c, NULL, -ret);
			close(child);
			continue;
		}
		close(fd);
		fd = child;
	}
}

/* ---- the command -------------------------------------------------------- */

/* mkdir -p @path (mode 0755 for what it creates); 0 or -errno. */
static int mkdir_p(const char *path)
{
	char *p = strdup(path);
	int ret = 0;

	if (!p)
		return -ENOMEM;
	for (char *s = p + 1;; s++) {
		if (*s != '/' && *s != '\0')
			continue;
		char c = *s;
		*s = '\0';
		if (mkdir(p, 0755) < 0 && errno != EEXIST) {
			ret = -errno;
			break;
		}
		*s = c;
		if (!c)
			break;
	}
	free(p);
	return ret;
}

/* Copy @src without trailing slashes, with a leading slash, into a new string. */
static char *normalize_src(const char *src)
{
	size_t len = strlen(src);
	while (len > 0 && src[len - 1] == '/')
		len--;
	char *p = malloc(len + 2);
	if (!p)
		return NULL;
	size_t lead = src[0] == '/' ? 0 : 1;
	p[0] = '/';
	memcpy(p + lead, src, len);
	p[len + lead] = '\0';
	if (strcmp(p, "/") == 0)
		p[0] = '\0';
	return p;
}

/* The default -j: one copier per online CPU, at most DEFAULT_JOBS_MAX. */
static unsigned default_jobs(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	if (n < 1)
		return 1;
	return n > DEFAULT_JOBS_MAX ? DEFAULT_JOBS_MAX : (unsigned)n;
}

int cmd_extract(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "verbose", no_argument, NULL, 'v' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "jobs", required_argument, NULL, 'j' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct extract x = { .dest_fd = -1 };
	struct ctx main_ctx = { .x = &x };
	struct ctx *c = &main_ctx;
	unsigned jobs = default_jobs();
	bool quiet = false;
	int opt;

	while ((opt = cli_getopt(&args, argc, argv, ":hvqj:", longopts)) != -1) {
		if (opt == 'v') {
			x.verbose = true;
		} else if (opt == 'q') {
			quiet = true;
		} else if (opt == 'j') {
			char *end;
			errno = 0;
			unsigned long v = strtoul(optarg, &end, 10);
			if (errno || end == optarg || *end || v < 1 || v > MAX_JOBS) {
				free(args.devices);
				return cli_usage_error(cmd, "-j wants a number of jobs from 1 to %d: %s",
						       MAX_JOBS, optarg);
			}
			jobs = (unsigned)v;
		}
	}
	int nargs = argc - optind;
	const char *why = nargs < 1 ? "missing IMAGE"
			: nargs < 2 ? "missing DEST"
			: nargs > 3 ? "too many arguments"
			: !*argv[argc - 1] ? "DEST is empty"
			: NULL;
	if (why) {
		free(args.devices);
		return cli_usage_error(cmd, "%s", why);
	}
	const char *image = argv[optind];
	const char *src = nargs == 3 ? argv[optind + 1] : "/";
	x.dest = argv[argc - 1];
	x.progress = !quiet && !x.verbose && isatty(STDERR_FILENO);

	if (cli_open(&args, image, &x.fs) < 0) {
		free(args.devices);
		return CLI_EXIT_ERROR;
	}
	pthread_mutex_init(&x.msg_lock, NULL);
	pthread_mutex_init(&x.q_lock, NULL);
	pthread_cond_init(&x.q_more, NULL);
	pthread_cond_init(&x.q_room, NULL);

	struct butter_info info;
	butter_ino_t root;
	struct butter_stat st;
	int ret = butter_get_info(x.fs, &info);
	x.sectorsize = ret == 0 && info.sectorsize ? info.sectorsize : 4096;
	c->buf = malloc(CHUNK);
	c->path = normalize_src(src);
	if (!c->buf || !c->path) {
		cli_error("%s", strerror(ENOMEM));
		x.failed = true;
		goto out;
	}
	c->pathlen = strlen(c->path);
	c->pathcap = c->pathlen + 1;

	ret = cli_resolve(x.fs, src, false, &root);
	if (ret == 0)
		ret = butter_stat(x.fs, root, &st);
	if (ret < 0) {
		cli_error("%s: %s", src, strerror(-ret));
		x.failed = true;
		goto out;
	}

	ret = mkdir_p(x.dest);
	if (ret == 0) {
		x.dest_fd = open(x.dest, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (x.dest_fd < 0)
			ret = -errno;
	}
	if (ret < 0) {
		cli_error("%s: %s", x.dest, strerror(-ret));
		x.failed = true;
		goto out;
	}

	clock_gettime(CLOCK_MONOTONIC, &x.last_progress);
	if (S_ISDIR(st.mode)) {
		/* SRC becomes DEST: entries below are DEST-relative after SRC's path. */
		c->rel_off = c->pathlen + 1;
		int fd = dup(x.dest_fd);
		if (fd < 0) {
			cli_error("%s: %s", x.dest, strerror(errno));
			x.failed = true;
			goto out;
		}
		start_copiers(&x, jobs);
		extract_tree(c, root, &st, fd);
		stop_copiers(&x);
	} else {
		/* A single non-directory: DEST/NAME. */
		c->rel_off = (size_t)(strrchr(c->path, '/') - c->path) + 1;
		atomic_fetch_add_explicit(&x.nfiles, 1, memory_order_relaxed);
		if (x.verbose)
			printf("%s\n", c->path);
		extract_leaf(c, x.dest_fd, c->path + c->rel_off, root, &st);
	}
	if (x.progress) {
		progress(&x, true);
		fputc('\n', stderr);
	}

out:
	if (x.dest_fd >= 0)
		close(x.dest_fd);
	inomap_free(&x.links);
	inomap_free(&x.ancestors);
	free(x.frames);
	free(c->path);
	free_ctx(c);
	butter_close(x.fs);
	free(args.devices);
	pthread_cond_destroy(&x.q_room);
	pthread_cond_destroy(&x.q_more);
	pthread_mutex_destroy(&x.q_lock);
	pthread_mutex_destroy(&x.msg_lock);
	return cli_finish_stdout(x.failed ? CLI_EXIT_ERROR : CLI_EXIT_OK);
}
