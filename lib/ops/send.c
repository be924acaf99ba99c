/*
 * send.c — butter_send(): a read-only subvolume as a btrfs send stream
 * (version 1), the format `btrfs receive` reads. A full send (no parent):
 * every inode of the subvolume is created, filled and given its attributes.
 * Built only on the public API (<butter/butter.h>); nothing here reads trees.
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

#define STREAM_VERSION 1
#define CMD_MAX (64u * 1024)      /* v1: no command is larger */
#define DATA_MAX (48u * 1024)     /* data per WRITE */
#define CMD_HEADER 10u            /* le32 len, le16 cmd, le32 crc */

enum send_cmd {
	C_SUBVOL = 1, C_MKFILE = 3, C_MKDIR = 4, C_MKNOD = 5, C_MKFIFO = 6, C_MKSOCK = 7,
	C_SYMLINK = 8, C_LINK = 10, C_SET_XATTR = 13, C_WRITE = 15, C_TRUNCATE = 17,
	C_CHMOD = 18, C_CHOWN = 19, C_UTIMES = 20, C_END = 21,
};

enum send_attr {
	A_UUID = 1, A_CTRANSID = 2, A_INO = 3, A_SIZE = 4, A_MODE = 5, A_UID = 6, A_GID = 7,
	A_RDEV = 8, A_CTIME = 9, A_MTIME = 10, A_ATIME = 11, A_XATTR_NAME = 13,
	A_XATTR_DATA = 14, A_PATH = 15, A_PATH_LINK = 17, A_FILE_OFFSET = 18, A_DATA = 19,
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

		ret = butter_seek(s->fs, ino, pos, SEEK_DATA, &data);
		if (ret == -ENXIO)
			break;
		if (ret)
			return ret;
		ret = butter_seek(s->fs, ino, data, SEEK_HOLE, &hole);
		if (ret)
			return ret;
		for (pos = data; pos < hole;) {
			size_t want = hole - pos > DATA_MAX ? DATA_MAX : (size_t)(hole - pos);
			ssize_t n = butter_read(s->fs, ino, s->data, want, pos);

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
	ssize_t n = butter_listxattr(s->fs, ino, NULL, 0);
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
	n = butter_listxattr(s->fs, ino, s->xnames, s->xnames_cap);
	if (n < 0)
		return (int)n;
	for (at = 0; at < (size_t)n; at += strlen(s->xnames + at) + 1) {
		const char *name = s->xnames + at;
		ssize_t v = butter_getxattr(s->fs, ino, name, s->xvalue, XATTR_VALUE_MAX);

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

/* xattrs, owner, mode, times: what every inode gets once it exists and is full. */
static int send_attributes(struct sender *s, butter_ino_t ino, const struct butter_stat *st)
{
	int ret = send_xattrs(s, ino);

	if (ret)
		return ret;
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
		ssize_t n = butter_readlink(s->fs, ino, (char *)s->data, DATA_MAX);

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
	ret = butter_stat(s->fs, ino, &st);
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
	int ret = butter_readdir(s->fs, dir, 0, visit, &w);

	if (w.err)
		return w.err;
	return ret < 0 ? ret : 0;
}

int butter_send(struct butter_fs *fs, uint64_t subvol, butter_send_write_fn write, void *arg)
{
	struct butter_subvol_info *info = malloc(sizeof(*info));
	struct sender *s = calloc(1, sizeof(*s));
	struct butter_stat st;
	butter_ino_t root;
	const char *name;
	u8 header[17];
	size_t i;
	int ret;

	if (!info || !s) {
		ret = -ENOMEM;
		goto out;
	}
	ret = butter_subvol_get(fs, subvol, info);
	if (ret)
		goto out;
	if (subvol == BTRFS_FS_TREE_OBJECTID || !(info->flags & BTRFS_ROOT_SUBVOL_RDONLY)) {
		ret = -EPERM; /* as btrfs send: only a read-only snapshot is stable */
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
	begin(s, C_SUBVOL);
	attr_str(s, A_PATH, name);
	attr(s, A_UUID, info->uuid, 16);
	attr_u64(s, A_CTRANSID, info->ctransid);
	ret = finish(s);
	if (ret == 0)
		ret = butter_root(fs, subvol, &root);
	if (ret == 0)
		ret = butter_stat(fs, root, &st);
	if (ret == 0)
		ret = send_dir(s, root);
	if (ret == 0)
		ret = send_attributes(s, root, &st); /* the subvolume's own directory: path "" */
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
	return ret;
}
