/*
 * send.c — butter_send(): a read-only subvolume as a btrfs send stream
 * (version 1), the format `btrfs receive` reads. A full send (no parent):
 * every inode of the subvolume is created, filled and given its attributes.
 * Built on the bodies of public calls (data_read(), inode_stat(),
 * ns_readdir(), ...), not on butter_*(): those take the library's lock,
 * which the caller already holds. Nothing here reads trees.
 *
 * The stream (format facts from the kernel's fs/btrfs/send.h):
 *   header   "btrfs-stream\0" then le32 version (1)
 *   command  le32 length of the attributes, le16 command, le32 crc32c (seed 0,
 *            no inversion) of the command with its crc field zeroed, then the
 *            attributes: le16 type, le16 length, value. No command exceeds
 *            64 KiB (v1), so data goes out in WRITE commands of <= 48 KiB.
 *
 * Order of commands (what `btrfs receive` needs, and the order the kernel
 * uses for each inode):
 *   SUBVOL name, uuid, ctransid
 *   a depth-first walk from the root directory: each entry is created at its
 *   path (MKFILE, MKDIR, SYMLINK, MKNOD, MKFIFO, MKSOCK) or, for a further
 *   name of an inode already sent, linked to its first path (LINK); a new
 *   inode then gets its data (WRITE of every data range; holes are skipped
 *   and a TRUNCATE sets the size), its xattrs (SET_XATTR), then CHOWN, CHMOD
 *   (not for symlinks) and UTIMES. A directory gets its attributes after
 *   everything below it exists, so the times it ends with are its own.
 *   END
 * Entries that are roots of other subvolumes are left out, as the kernel's
 * send leaves them out (a nested subvolume is sent on its own).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "format/checksum.h"
#include "format/ondisk.h"
#include "butter/butter.h"
#include "ops/ops.h"

#define STREAM_VERSION 1
#define CMD_MAX (64u * 1024)      /* v1: no command is larger */
#define DATA_MAX (48u * 1024)     /* data per WRITE */
#define CMD_HEADER 10u            /* le32 len, le16 cmd, le32 crc */

enum send_cmd {
	C_SUBVOL = 1, C_SNAPSHOT = 2, C_MKFILE = 3, C_MKDIR = 4, C_MKNOD = 5, C_MKFIFO = 6, C_MKSOCK = 7,
	C_SYMLINK = 8, C_LINK = 10, C_UNLINK = 11, C_RMDIR = 12, C_SET_XATTR = 13,
	C_REMOVE_XATTR = 14, C_WRITE = 15, C_TRUNCATE = 17,
	C_CHMOD = 18, C_CHOWN = 19, C_UTIMES = 20, C_END = 21,
};

enum send_attr {
	A_UUID = 1, A_CTRANSID = 2, A_INO = 3, A_SIZE = 4, A_MODE = 5, A_UID = 6, A_GID = 7,
	A_RDEV = 8, A_CTIME = 9, A_MTIME = 10, A_ATIME = 11, A_XATTR_NAME = 13,
	A_XATTR_DATA = 14, A_PATH = 15, A_PATH_LINK = 17, A_FILE_OFFSET = 18, A_DATA = 19,
	A_CLONE_UUID = 20, A_CLONE_CTRANSID = 21,
};

/* An inode with more names than one, sent at @path first. */
struct linked {
	u64 ino;
	char *path;
};

struct sender {
	struct butter_fs *fs;
	u64 subvol;
	butter_send_write_fn write;
	void *arg;
	u8 buf[CMD_MAX];
	size_t len;                /* bytes of the command being built */
	int overflow;              /* an attribute did not fit: -ENAMETOOLONG */
	char *path;                /* the path being visited, relative to the subvolume */
	size_t path_len, path_cap;
	struct linked *links;      /* sorted by ino */
	size_t nlinks, links_cap;
	u8 *data;                  /* DATA_MAX bytes */
	char *xnames;              /* listxattr buffer */
	size_t xnames_cap;
	u8 *xvalue;                /* getxattr buffer (XATTR_SIZE_MAX) */
};

#define XATTR_VALUE_MAX 65536

static void begin(struct sender *s, enum send_cmd cmd)
{
	memset(s->buf, 0, CMD_HEADER);
	put_le16(s->buf + 4, (u16)cmd);
	s->len = CMD_HEADER;
	s->overflow = 0;
}

static void attr(struct sender *s, enum send_attr type, const void *value, size_t len)
{
	if (s->len + 4 + len > CMD_MAX || len > 0xffff) {
		s->overflow = 1;
		return;
	}
	put_le16(s->buf + s->len, (u16)type);
	put_le16(s->buf + s->len + 2, (u16)len);
	if (len)
		memcpy(s->buf + s->len + 4, value, len);
	s->len += 4 + len;
}

static void attr_u64(struct sender *s, enum send_attr type, u64 v)
{
	u8 le[8];

	put_le64(le, v);
	attr(s, type, le, 8);
}

static void attr_str(struct sender *s, enum send_attr type, const char *str)
{
	attr(s, type, str, strlen(str));
}

static void attr_time(struct sender *s, enum send_attr type, const struct timespec *ts)
{
	u8 le[12];

	put_le64(le, (u64)ts->tv_sec);
	put_le32(le + 8, (u32)ts->tv_nsec);
	attr(s, type, le, 12);
}

static int finish(struct sender *s)
{
	if (s->overflow)
		return -ENAMETOOLONG;
	put_le32(s->buf, (u32)(s->len - CMD_HEADER));
	put_le32(s->buf + 6, btrfs_crc32c_raw(0, s->buf, s->len));
	return s->write(s->arg, s->buf, s->len);
}

/* ---- the path being visited ------------------------------------------------ */

static int path_push(struct sender *s, const char *name, size_t len, size_t *saved)
{
	size_t need = s->path_len + (s->path_len ? 1 : 0) + len + 1;

	if (need > s->path_cap) {
		size_t cap = need * 2;
		char *p = realloc(s->path, cap);

		if (!p)
			return -ENOMEM;
		s->path = p;
		s->path_cap = cap;
	}
	*saved = s->path_len;
	if (s->path_len)
		s->path[s->path_len++] = '/';
	memcpy(s->path + s->path_len, name, len);
	s->path_len += len;
	s->path[s->path_len] = '\0';
	return 0;
}

static void path_pop(struct sender *s, size_t saved)
{
	s->path_len = saved;
	s->path[saved] = '\0';
}

/* ---- hard links ---------------------------------------------------------- */

static struct linked *find_link(struct sender *s, u64 ino, size_t *at)
{
	size_t lo = 0, hi = s->nlinks;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (s->links[mid].ino < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	*at = lo;
	return lo < s->nlinks && s->links[lo].ino == ino ? &s->links[lo] : NULL;
}

static int remember_link(struct sender *s, u64 ino, size_t at)
{
	char *copy = strdup(s->path);

	if (!copy)
		return -ENOMEM;
	if (s->nlinks == s->links_cap) {
		size_t cap = s->links_cap ? s->links_cap * 2 : 64;
		struct linked *v = realloc(s->links, cap * sizeof(*v));

		if (!v) {
			free(copy);
			return -ENOMEM;
		}
		s->links = v;
		s->links_cap = cap;
	}
	memmove(&s->links[at + 1], &s->links[at], (s->nlinks - at) * sizeof(*s->links));
	s->links[at] = (struct linked){ ino, copy };
	s->nlinks++;
	return 0;
}

/* ---- one inode ------------------------------------------------------------- */

static int send_data(struct sender *s, butter_ino_t ino, u64 size)
{
	u64 pos = 0, end = 0;
	int ret;

	while (pos < size) {
		u64 data, hole;

		ret = data_seek(s->fs, ino, pos, SEEK_DATA, &data);
		if (ret == -ENXIO)
			break;
		if (ret)
			return ret;
		ret = data_seek(s->fs, ino, data, SEEK_HOLE, &hole);
		if (ret)
			return ret;
		for (pos = data; pos < hole;) {
			size_t want = hole - pos > DATA_MAX ? DATA_MAX : (size_t)(hole - pos);
			ssize_t n = data_read(s->fs, ino, s->data, want, pos);

			if (n < 0)
				return (int)n;
			if (n == 0)
				break;
			begin(s, C_WRITE);
			attr_str(s, A_PATH, s->path);
			attr_u64(s, A_FILE_OFFSET, pos);
			attr(s, A_DATA, s->data, (size_t)n);
			ret = finish(s);
			if (ret)
				return ret;
			pos += (u64)n;
			end = pos;
		}
		pos = hole;
	}
	if (end < size) {
		begin(s, C_TRUNCATE);
		attr_str(s, A_PATH, s->path);
		attr_u64(s, A_SIZE, size);
		return finish(s);
	}
	return 0;
}

static int send_xattrs(struct sender *s, butter_ino_t ino)
{
	ssize_t n = inode_listxattr(s->fs, ino, NULL, 0);
	size_t at;
	int ret;

	if (n <= 0)
		return (int)n;
	if ((size_t)n > s->xnames_cap) {
		char *p = realloc(s->xnames, (size_t)n);

		if (!p)
			return -ENOMEM;
		s->xnames = p;
		s->xnames_cap = (size_t)n;
	}
	n = inode_listxattr(s->fs, ino, s->xnames, s->xnames_cap);
	if (n < 0)
		return (int)n;
	for (at = 0; at < (size_t)n; at += strlen(s->xnames + at) + 1) {
		const char *name = s->xnames + at;
		ssize_t v = inode_getxattr(s->fs, ino, name, s->xvalue, XATTR_VALUE_MAX);

		if (v < 0)
			return (int)v;
		begin(s, C_SET_XATTR);
		attr_str(s, A_PATH, s->path);
		attr_str(s, A_XATTR_NAME, name);
		attr(s, A_XATTR_DATA, s->xvalue, (size_t)v);
		ret = finish(s);
		if (ret)
			return ret;
	}
	return 0;
}

/* owner, mode, times: last for every inode sent, in this order (chown clears setuid) */
static int send_owner_mode_times(struct sender *s, const struct butter_stat *st)
{
	int ret;

	begin(s, C_CHOWN);
	attr_str(s, A_PATH, s->path);
	attr_u64(s, A_UID, st->uid);
	attr_u64(s, A_GID, st->gid);
	ret = finish(s);
	if (ret == 0 && !S_ISLNK(st->mode)) {
		begin(s, C_CHMOD);
		attr_str(s, A_PATH, s->path);
		attr_u64(s, A_MODE, st->mode & 07777);
		ret = finish(s);
	}
	if (ret)
		return ret;
	begin(s, C_UTIMES);
	attr_str(s, A_PATH, s->path);
	attr_time(s, A_ATIME, &st->atime);
	attr_time(s, A_MTIME, &st->mtime);
	attr_time(s, A_CTIME, &st->ctime);
	return finish(s);
}

/* xattrs, owner, mode, times: what every inode gets once it exists and is full. */
static int send_attributes(struct sender *s, butter_ino_t ino, const struct butter_stat *st)
{
	int ret = send_xattrs(s, ino);

	return ret ? ret : send_owner_mode_times(s, st);
}

static int send_dir(struct sender *s, butter_ino_t dir);

/* Create the inode at the current path and fill it (directories: recursively). */
static int send_new(struct sender *s, butter_ino_t ino, const struct butter_stat *st)
{
	enum send_cmd cmd;
	int ret;

	switch (st->mode & S_IFMT) {
	case S_IFREG:
		cmd = C_MKFILE;
		break;
	case S_IFDIR:
		cmd = C_MKDIR;
		break;
	case S_IFLNK:
		cmd = C_SYMLINK;
		break;
	case S_IFIFO:
		cmd = C_MKFIFO;
		break;
	case S_IFSOCK:
		cmd = C_MKSOCK;
		break;
	case S_IFCHR:
	case S_IFBLK:
		cmd = C_MKNOD;
		break;
	default:
		return -EUCLEAN;
	}
	begin(s, cmd);
	attr_str(s, A_PATH, s->path);
	attr_u64(s, A_INO, ino.ino);
	if (cmd == C_SYMLINK) {
		ssize_t n = data_readlink(s->fs, ino, (char *)s->data, DATA_MAX);

		if (n < 0)
			return (int)n;
		if ((size_t)n >= DATA_MAX)
			return -ENAMETOOLONG;
		attr(s, A_PATH_LINK, s->data, (size_t)n);
	} else if (cmd == C_MKNOD) {
		attr_u64(s, A_MODE, st->mode);
		attr_u64(s, A_RDEV, st->rdev);
	}
	ret = finish(s);
	if (ret)
		return ret;
	if (cmd == C_MKFILE)
		ret = send_data(s, ino, st->size);
	else if (cmd == C_MKDIR)
		ret = send_dir(s, ino);
	return ret ? ret : send_attributes(s, ino, st);
}

struct walk {
	struct sender *s;
	butter_ino_t dir;
	int err;
};

static int visit(void *arg, const char *name, size_t namelen, butter_ino_t ino, unsigned dtype,
		 uint64_t next_pos)
{
	struct walk *w = arg;
	struct sender *s = w->s;
	struct butter_stat st;
	struct linked *first;
	size_t saved, at;
	int ret;

	(void)dtype;
	(void)next_pos;
	if (ino.subvol != s->subvol)
		return 0; /* a nested subvolume: sent on its own */
	ret = inode_stat(s->fs, ino, &st);
	if (ret == 0)
		ret = path_push(s, name, namelen, &saved);
	if (ret) {
		w->err = ret;
		return 1;
	}
	first = !S_ISDIR(st.mode) && st.nlink > 1 ? find_link(s, ino.ino, &at) : NULL;
	if (first) {
		begin(s, C_LINK);
		attr_str(s, A_PATH, s->path);
		attr_str(s, A_PATH_LINK, first->path);
		ret = finish(s);
	} else {
		if (!S_ISDIR(st.mode) && st.nlink > 1)
			ret = remember_link(s, ino.ino, at);
		if (ret == 0)
			ret = send_new(s, ino, &st);
	}
	path_pop(s, saved);
	if (ret) {
		w->err = ret;
		return 1;
	}
	return 0;
}

static int send_dir(struct sender *s, butter_ino_t dir)
{
	struct walk w = { s, dir, 0 };
	int ret = ns_readdir(s->fs, dir, 0, visit, &w);

	if (w.err)
		return w.err;
	return ret < 0 ? ret : 0;
}

/* ---- incremental: the differences from a parent snapshot -------------------- */

/*
 * An incremental stream starts from the receiver's copy of the parent and
 * changes it into the sent subvolume, path by path. Two inodes are the same
 * when their number, generation (creation transid) and type agree; a name
 * whose inode is not the same in both is removed and made anew, so a
 * renamed file or directory is sent again whole (correct, not minimal). Per
 * directory, names that go are removed first (directories depth first),
 * then names that stay are compared and new names are made; an inode
 * already reachable on the receiver (a name that stays, or one made
 * earlier in the stream) gets a LINK instead of a copy. A kept inode whose
 * transid moved is brought up to date: its data where it differs, its
 * xattrs, owner, mode and times.
 */
struct entry {
	char *name;
	butter_ino_t ino;
	struct butter_stat st;
};

struct entries {
	struct entry *v;
	size_t n, cap;
	int err;
	u64 subvol;
	struct butter_fs *fs;
};

static void entries_free(struct entries *e)
{
	size_t i;

	for (i = 0; i < e->n; i++)
		free(e->v[i].name);
	free(e->v);
}

static int collect(void *arg, const char *name, size_t namelen, butter_ino_t ino, unsigned dtype,
		   uint64_t next_pos)
{
	struct entries *e = arg;
	struct entry *x;

	(void)dtype;
	(void)next_pos;
	if (ino.subvol != e->subvol)
		return 0;
	if (e->n == e->cap) {
		size_t cap = e->cap ? e->cap * 2 : 32;
		struct entry *v = realloc(e->v, cap * sizeof(*v));

		if (!v) {
			e->err = -ENOMEM;
			return 1;
		}
		e->v = v;
		e->cap = cap;
	}
	x = &e->v[e->n];
	x->name = strndup(name, namelen);
	x->ino = ino;
	if (!x->name) {
		e->err = -ENOMEM;
		return 1;
	}
	e->err = inode_stat(e->fs, ino, &x->st);
	if (e->err) {
		free(x->name);
		return 1;
	}
	e->n++;
	return 0;
}

static int entry_cmp(const void *a, const void *b)
{
	return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

static int list_dir(struct sender *s, butter_ino_t dir, struct entries *e)
{
	int ret;

	memset(e, 0, sizeof(*e));
	e->subvol = dir.subvol;
	e->fs = s->fs;
	ret = ns_readdir(s->fs, dir, 0, collect, e);
	if (e->err)
		ret = e->err;
	if (ret < 0) {
		entries_free(e);
		return ret;
	}
	if (e->n)
		qsort(e->v, e->n, sizeof(*e->v), entry_cmp);
	return 0;
}

/* Both listings of a directory that stays: the parent's in @p, the child's in @c. */
static int list_pair(struct sender *s, butter_ino_t pdir, butter_ino_t cdir, struct entries *p,
		     struct entries *c)
{
	int ret = list_dir(s, pdir, p);

	if (ret)
		return ret;
	ret = list_dir(s, cdir, c);
	if (ret)
		entries_free(p);
	return ret;
}

static const struct entry *find_entry(const struct entries *e, const char *name)
{
	struct entry key = { .name = (char *)name };

	return e->n ? bsearch(&key, e->v, e->n, sizeof(*e->v), entry_cmp) : NULL;
}

static int same_inode(const struct entry *a, const struct entry *b)
{
	return a->ino.ino == b->ino.ino && a->st.generation == b->st.generation &&
	       (a->st.mode & S_IFMT) == (b->st.mode & S_IFMT);
}

/* Names that stay: remember a path of every kept inode with more names (LINK targets). */
static int note_kept(struct sender *s, butter_ino_t pdir, butter_ino_t cdir)
{
	struct entries p, c;
	size_t i, saved, at;
	int ret = list_pair(s, pdir, cdir, &p, &c);

	if (ret)
		return ret;
	for (i = 0; i < c.n && ret == 0; i++) {
		const struct entry *ce = &c.v[i], *pe = find_entry(&p, ce->name);

		if (!pe || !same_inode(pe, ce))
			continue;
		ret = path_push(s, ce->name, strlen(ce->name), &saved);
		if (ret)
			break;
		if (S_ISDIR(ce->st.mode))
			ret = note_kept(s, pe->ino, ce->ino);
		else if (ce->st.nlink > 1 && !find_link(s, ce->ino.ino, &at))
			ret = remember_link(s, ce->ino.ino, at);
		path_pop(s, saved);
	}
	entries_free(&p);
	entries_free(&c);
	return ret;
}

/* Remove the parent's name at the current path (a directory with all below it). */
static int remove_old(struct sender *s, const struct entry *pe)
{
	if (S_ISDIR(pe->st.mode)) {
		struct entries e;
		size_t i, saved;
		int ret = list_dir(s, pe->ino, &e);

		for (i = 0; ret == 0 && i < e.n; i++) {
			ret = path_push(s, e.v[i].name, strlen(e.v[i].name), &saved);
			if (ret == 0) {
				ret = remove_old(s, &e.v[i]);
				path_pop(s, saved);
			}
		}
		entries_free(&e);
		if (ret)
			return ret;
		begin(s, C_RMDIR);
	} else {
		begin(s, C_UNLINK);
	}
	attr_str(s, A_PATH, s->path);
	return finish(s);
}

static int is_zero(const u8 *p, size_t n)
{
	while (n && !*p) {
		p++;
		n--;
	}
	return n == 0;
}

/* Bring a kept file's data to the child's: WRITE what differs, TRUNCATE to the size. */
static int update_data(struct sender *s, const struct entry *pe, const struct entry *ce)
{
	u64 psize = pe->st.size, csize = ce->st.size, off;
	u8 *old = malloc(DATA_MAX);
	int ret = 0;

	if (!old)
		return -ENOMEM;
	for (off = 0; off < csize && ret == 0; off += DATA_MAX) {
		size_t n = csize - off > DATA_MAX ? DATA_MAX : (size_t)(csize - off);
		ssize_t got = data_read(s->fs, ce->ino, s->data, n, off), pgot = 0;

		if (got < 0) {
			ret = (int)got;
			break;
		}
		if ((size_t)got < n)
			memset(s->data + got, 0, n - (size_t)got);
		if (off < psize) {
			pgot = data_read(s->fs, pe->ino, old, n, off);
			if (pgot < 0) {
				ret = (int)pgot;
				break;
			}
			if ((size_t)pgot < n)
				memset(old + pgot, 0, n - (size_t)pgot);
			if (!memcmp(old, s->data, n) && off + n <= psize)
				continue;
		} else if (is_zero(s->data, n)) {
			continue; /* the TRUNCATE below makes this hole */
		}
		begin(s, C_WRITE);
		attr_str(s, A_PATH, s->path);
		attr_u64(s, A_FILE_OFFSET, off);
		attr(s, A_DATA, s->data, n);
		ret = finish(s);
	}
	free(old);
	if (ret == 0 && csize != psize) {
		begin(s, C_TRUNCATE);
		attr_str(s, A_PATH, s->path);
		attr_u64(s, A_SIZE, csize);
		ret = finish(s);
	}
	return ret;
}

/* A NUL-separated xattr name list of @ino, malloc'd (*len bytes). */
static int xattr_names(struct sender *s, butter_ino_t ino, char **out, size_t *len)
{
	ssize_t n = inode_listxattr(s->fs, ino, NULL, 0);

	*out = NULL;
	*len = 0;
	if (n <= 0)
		return (int)n;
	*out = malloc((size_t)n);
	if (!*out)
		return -ENOMEM;
	n = inode_listxattr(s->fs, ino, *out, (size_t)n);
	if (n < 0) {
		free(*out);
		*out = NULL;
		return (int)n;
	}
	*len = (size_t)n;
	return 0;
}

static int has_name(const char *list, size_t len, const char *name)
{
	size_t at;

	for (at = 0; at < len; at += strlen(list + at) + 1)
		if (!strcmp(list + at, name))
			return 1;
	return 0;
}

/* xattrs of a kept inode: remove those gone, set those new or changed. */
static int update_xattrs(struct sender *s, const struct entry *pe, const struct entry *ce)
{
	char *pl = NULL, *cl = NULL;
	size_t plen, clen, at;
	u8 *old = malloc(XATTR_VALUE_MAX);
	int ret = old ? xattr_names(s, pe->ino, &pl, &plen) : -ENOMEM;

	if (ret == 0)
		ret = xattr_names(s, ce->ino, &cl, &clen);
	for (at = 0; ret == 0 && at < plen; at += strlen(pl + at) + 1) {
		if (has_name(cl, clen, pl + at))
			continue;
		begin(s, C_REMOVE_XATTR);
		attr_str(s, A_PATH, s->path);
		attr_str(s, A_XATTR_NAME, pl + at);
		ret = finish(s);
	}
	for (at = 0; ret == 0 && at < clen; at += strlen(cl + at) + 1) {
		ssize_t v = inode_getxattr(s->fs, ce->ino, cl + at, s->xvalue, XATTR_VALUE_MAX);
		ssize_t ov = has_name(pl, plen, cl + at)
				     ? inode_getxattr(s->fs, pe->ino, cl + at, old, XATTR_VALUE_MAX)
				     : -ENODATA;

		if (v < 0) {
			ret = (int)v;
			break;
		}
		if (ov == v && !memcmp(old, s->xvalue, (size_t)v))
			continue;
		begin(s, C_SET_XATTR);
		attr_str(s, A_PATH, s->path);
		attr_str(s, A_XATTR_NAME, cl + at);
		attr(s, A_XATTR_DATA, s->xvalue, (size_t)v);
		ret = finish(s);
	}
	free(pl);
	free(cl);
	free(old);
	return ret;
}

static int diff_dir(struct sender *s, butter_ino_t pdir, butter_ino_t cdir);

/* A name of the child at the current path, against the parent's entry there (or NULL). */
static int diff_entry(struct sender *s, const struct entry *pe, const struct entry *ce)
{
	struct linked *first;
	size_t at;
	int ret;

	if (pe && same_inode(pe, ce)) {
		if (S_ISDIR(ce->st.mode)) {
			ret = diff_dir(s, pe->ino, ce->ino);
			if (ret == 0 && ce->st.transid != pe->st.transid)
				ret = update_xattrs(s, pe, ce);
			return ret || ce->st.transid == pe->st.transid
				       ? ret : send_owner_mode_times(s, &ce->st);
		}
		if (ce->st.transid == pe->st.transid)
			return 0; /* untouched since the parent */
		if (S_ISLNK(ce->st.mode) || !S_ISREG(ce->st.mode)) {
			ret = 0;
		} else {
			/* with more names, bring it up to date once */
			first = ce->st.nlink > 1 ? find_link(s, ce->ino.ino, &at) : NULL;
			if (first && strcmp(first->path, s->path))
				return 0;
			ret = update_data(s, pe, ce);
		}
		if (ret == 0)
			ret = update_xattrs(s, pe, ce);
		return ret ? ret : send_owner_mode_times(s, &ce->st);
	}
	first = !S_ISDIR(ce->st.mode) && ce->st.nlink > 1 ? find_link(s, ce->ino.ino, &at) : NULL;
	if (first) {
		begin(s, C_LINK);
		attr_str(s, A_PATH, s->path);
		attr_str(s, A_PATH_LINK, first->path);
		return finish(s);
	}
	ret = !S_ISDIR(ce->st.mode) && ce->st.nlink > 1 ? remember_link(s, ce->ino.ino, at) : 0;
	return ret ? ret : send_new(s, ce->ino, &ce->st);
}

static int diff_dir(struct sender *s, butter_ino_t pdir, butter_ino_t cdir)
{
	struct entries p, c;
	size_t i, saved;
	int ret = list_pair(s, pdir, cdir, &p, &c);

	if (ret)
		return ret;
	/* names that go (or whose inode changed) first */
	for (i = 0; i < p.n && ret == 0; i++) {
		const struct entry *ce = find_entry(&c, p.v[i].name);

		if (ce && same_inode(&p.v[i], ce))
			continue;
		ret = path_push(s, p.v[i].name, strlen(p.v[i].name), &saved);
		if (ret == 0) {
			ret = remove_old(s, &p.v[i]);
			path_pop(s, saved);
		}
	}
	for (i = 0; i < c.n && ret == 0; i++) {
		ret = path_push(s, c.v[i].name, strlen(c.v[i].name), &saved);
		if (ret == 0) {
			ret = diff_entry(s, find_entry(&p, c.v[i].name), &c.v[i]);
			path_pop(s, saved);
		}
	}
	entries_free(&p);
	entries_free(&c);
	return ret;
}

static int null_uuid(const u8 *uuid)
{
	static const u8 zero[16];

	return !memcmp(uuid, zero, 16);
}

/* The stream after its header for an incremental send from @pinfo. */
static int send_incremental(struct sender *s, const struct butter_subvol_info *info,
			    const struct butter_subvol_info *pinfo, const char *name)
{
	struct entry pe = { 0 }, ce = { 0 };
	int ret;

	begin(s, C_SNAPSHOT);
	attr_str(s, A_PATH, name);
	attr(s, A_UUID, info->uuid, 16);
	attr_u64(s, A_CTRANSID, info->ctransid);
	/* a parent that was itself received is known to the receiver by its origin */
	attr(s, A_CLONE_UUID, null_uuid(pinfo->received_uuid) ? pinfo->uuid : pinfo->received_uuid,
	     16);
	attr_u64(s, A_CLONE_CTRANSID, pinfo->ctransid);
	ret = finish(s);
	if (ret == 0)
		ret = inode_root(s->fs, pinfo->id, &pe.ino);
	if (ret == 0)
		ret = inode_root(s->fs, info->id, &ce.ino);
	if (ret == 0)
		ret = inode_stat(s->fs, pe.ino, &pe.st);
	if (ret == 0)
		ret = inode_stat(s->fs, ce.ino, &ce.st);
	if (ret == 0)
		ret = note_kept(s, pe.ino, ce.ino);
	if (ret == 0)
		ret = diff_dir(s, pe.ino, ce.ino);
	if (ret == 0 && pe.st.transid != ce.st.transid) {
		ret = update_xattrs(s, &pe, &ce); /* the subvolume's own directory: path "" */
		if (ret == 0)
			ret = send_owner_mode_times(s, &ce.st);
	}
	return ret;
}

int ops_send(struct butter_fs *fs, uint64_t subvol, uint64_t parent, butter_send_write_fn write,
	     void *arg)
{
	struct butter_subvol_info *info = malloc(sizeof(*info));
	struct butter_subvol_info *pinfo = parent ? malloc(sizeof(*pinfo)) : NULL;
	struct sender *s = calloc(1, sizeof(*s));
	struct butter_stat st;
	butter_ino_t root;
	const char *name;
	u8 header[17];
	size_t i;
	int ret;

	if (!info || !s || (parent && !pinfo)) {
		ret = -ENOMEM;
		goto out;
	}
	ret = subvol_get(fs, subvol, info);
	if (ret == 0 && parent)
		ret = subvol_get(fs, parent, pinfo);
	if (ret)
		goto out;
	if (subvol == BTRFS_FS_TREE_OBJECTID || !(info->flags & BTRFS_ROOT_SUBVOL_RDONLY) ||
	    (parent && (parent == BTRFS_FS_TREE_OBJECTID || parent == subvol ||
			!(pinfo->flags & BTRFS_ROOT_SUBVOL_RDONLY)))) {
		ret = -EPERM; /* as btrfs send: only read-only snapshots are stable */
		goto out;
	}
	s->fs = fs;
	s->subvol = subvol;
	s->write = write;
	s->arg = arg;
	s->data = malloc(DATA_MAX);
	s->xvalue = malloc(XATTR_VALUE_MAX);
	s->path = calloc(1, 256);
	s->path_cap = 256;
	if (!s->data || !s->xvalue || !s->path) {
		ret = -ENOMEM;
		goto out;
	}
	memcpy(header, "btrfs-stream", 13);
	put_le32(header + 13, STREAM_VERSION);
	ret = write(arg, header, sizeof(header));
	if (ret)
		goto out;
	name = strrchr(info->path, '/');
	name = name ? name + 1 : info->path;
	if (parent) {
		ret = send_incremental(s, info, pinfo, name);
		goto end;
	}
	begin(s, C_SUBVOL);
	attr_str(s, A_PATH, name);
	attr(s, A_UUID, info->uuid, 16);
	attr_u64(s, A_CTRANSID, info->ctransid);
	ret = finish(s);
	if (ret == 0)
		ret = inode_root(fs, subvol, &root);
	if (ret == 0)
		ret = inode_stat(fs, root, &st);
	if (ret == 0)
		ret = send_dir(s, root);
	if (ret == 0)
		ret = send_attributes(s, root, &st); /* the subvolume's own directory: path "" */
end:
	if (ret == 0) {
		begin(s, C_END);
		ret = finish(s);
	}
out:
	if (s) {
		for (i = 0; i < s->nlinks; i++)
			free(s->links[i].path);
		free(s->links);
		free(s->path);
		free(s->data);
		free(s->xnames);
		free(s->xvalue);
	}
	free(s);
	free(info);
	free(pinfo);
	return ret;
}
