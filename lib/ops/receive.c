/*
 * receive.c — butter_receive(): apply a btrfs send stream (what `btrfs send`
 * or butter_send() writes) to a filesystem, as `btrfs receive` does: each
 * subvolume of the stream is made in the destination directory, built by
 * the stream's commands, then marked with the sender's uuid and transid and
 * made read-only. Built on the bodies of public calls (ns_create(),
 * data_write(), subvol_snapshot(), ...), never on butter_*(): those take the
 * library's lock, which the caller already holds.
 *
 * The stream (format facts from the kernel's fs/btrfs/send.h; see send.c):
 *   "btrfs-stream\0", le32 version (1 or 2), then commands: le32 length,
 *   le16 command, le32 crc32c (seed 0, crc field zeroed), attributes
 *   (le16 type, le16 length, value). In version 2 a DATA attribute has no
 *   length: it runs to the end of its command. After END another stream
 *   (header and commands) may follow.
 *
 * Trust: the stream is input from anywhere. Every length is checked against
 * what was read, every crc is checked, an attribute a command needs and
 * does not have is an error, paths are relative to the subvolume being built
 * and may not hold "." or ".." components or empty ones, and a command this
 * code does not know stops the receive. Errors: -EBADMSG for a malformed
 * stream (logged: which command, what), -EOPNOTSUPP for a command not
 * handled yet (version 2's fallocate, fileattr, encoded write, verity), and
 * the library's errors for the changes themselves. What was applied before
 * an error stays; the subvolume being built is then left writable and
 * without a received uuid, as btrfs receive leaves it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <uuid/uuid.h>

#include "butter/butter.h"
#include "format/checksum.h"
#include "format/ondisk.h"
#include "ops/ops.h"

#define CMD_HEADER 10u
#define CMD_MAX_V1 (64u * 1024)
#define CMD_MAX_V2 (16u << 20) /* v2 data commands carry up to 128 KiB plus headers */
#define NATTRS 32
#define XATTR_NAME_CAP 256 /* XATTR_NAME_MAX + 1 */

enum {
	C_SUBVOL = 1, C_SNAPSHOT, C_MKFILE, C_MKDIR, C_MKNOD, C_MKFIFO, C_MKSOCK, C_SYMLINK,
	C_RENAME, C_LINK, C_UNLINK, C_RMDIR, C_SET_XATTR, C_REMOVE_XATTR, C_WRITE, C_CLONE,
	C_TRUNCATE, C_CHMOD, C_CHOWN, C_UTIMES, C_END, C_UPDATE_EXTENT, C_MAX_KNOWN = 26,
};

enum {
	A_UUID = 1, A_CTRANSID, A_INO, A_SIZE, A_MODE, A_UID, A_GID, A_RDEV, A_CTIME, A_MTIME,
	A_ATIME, A_OTIME, A_XATTR_NAME, A_XATTR_DATA, A_PATH, A_PATH_TO, A_PATH_LINK,
	A_FILE_OFFSET, A_DATA, A_CLONE_UUID, A_CLONE_CTRANSID, A_CLONE_PATH, A_CLONE_OFFSET,
	A_CLONE_LEN,
};

static const char *const cmd_names[] = {
	[C_SUBVOL] = "subvol", [C_SNAPSHOT] = "snapshot", [C_MKFILE] = "mkfile",
	[C_MKDIR] = "mkdir", [C_MKNOD] = "mknod", [C_MKFIFO] = "mkfifo", [C_MKSOCK] = "mksock",
	[C_SYMLINK] = "symlink", [C_RENAME] = "rename", [C_LINK] = "link", [C_UNLINK] = "unlink",
	[C_RMDIR] = "rmdir", [C_SET_XATTR] = "set_xattr", [C_REMOVE_XATTR] = "remove_xattr",
	[C_WRITE] = "write", [C_CLONE] = "clone", [C_TRUNCATE] = "truncate", [C_CHMOD] = "chmod",
	[C_CHOWN] = "chown", [C_UTIMES] = "utimes", [C_END] = "end",
	[C_UPDATE_EXTENT] = "update_extent", [23] = "fallocate", [24] = "fileattr",
	[25] = "encoded_write", [26] = "enable_verity",
};

struct attr {
	const u8 *v;
	u32 len;
	int present;
};

struct receiver {
	struct butter_fs *fs;
	const struct blog *log;          /* the handle's */
	butter_receive_read_fn read;
	void *arg;
	butter_ino_t dest;
	u32 version;
	u8 *buf;                         /* one command */
	size_t cap;
	unsigned cmd;
	struct attr a[NATTRS];
	/* the subvolume being built */
	int active;
	u64 subvol;
	butter_ino_t root;
	u8 uuid[16];
	u64 ctransid;
	char *scratch;                   /* paths as C strings */
	u64 received;                    /* subvolumes finished */
	u64 last_subvol;
};

/* ---- reading the stream --------------------------------------------------- */

/* Read exactly @len bytes: 1 read, 0 at a clean end before any byte, -EBADMSG if cut. */
static int read_full(struct receiver *r, void *buf, size_t len)
{
	u8 *p = buf;
	size_t got = 0;

	while (got < len) {
		ssize_t n = r->read(r->arg, p + got, len - got);

		if (n < 0)
			return (int)n;
		if (n == 0)
			return got == 0 ? 0 : -EBADMSG;
		got += (size_t)n;
	}
	return 1;
}

static int bad(struct receiver *r, const char *what)
{
	const char *name = r->cmd < sizeof(cmd_names) / sizeof(cmd_names[0]) &&
			   cmd_names[r->cmd] ? cmd_names[r->cmd] : "?";

	blog_err(r->log, "send stream: command %u (%s): %s", r->cmd, name, what);
	return -EBADMSG;
}

static int read_header(struct receiver *r, int first)
{
	u8 h[17];
	int ret = read_full(r, h, sizeof(h));

	if (ret <= 0)
		return ret == 0 && first ? bad(r, "empty stream") : ret;
	if (memcmp(h, "btrfs-stream", 13) != 0) {
		blog_err(r->log, "send stream: no btrfs-stream header");
		return -EBADMSG;
	}
	r->version = get_le32(h + 13);
	if (r->version < 1 || r->version > 2) {
		blog_err(r->log, "send stream: version %u (versions 1 and 2 are known)",
			 r->version);
		return -EOPNOTSUPP;
	}
	return 1;
}

/* Read the next command into r->cmd and r->a; 0 at the end of the input. */
static int read_command(struct receiver *r)
{
	u8 h[CMD_HEADER];
	u32 len, crc, at;
	size_t max = r->version >= 2 ? CMD_MAX_V2 : CMD_MAX_V1;
	int ret = read_full(r, h, sizeof(h));

	if (ret <= 0)
		return ret;
	len = get_le32(h);
	r->cmd = get_le16(h + 4);
	crc = get_le32(h + 6);
	if (len > max - CMD_HEADER)
		return bad(r, "longer than a command may be");
	if (CMD_HEADER + (size_t)len > r->cap) {
		u8 *p = realloc(r->buf, CMD_HEADER + (size_t)len);

		if (!p)
			return -ENOMEM;
		r->buf = p;
		r->cap = CMD_HEADER + (size_t)len;
	}
	memcpy(r->buf, h, CMD_HEADER);
	memset(r->buf + 6, 0, 4);
	ret = len ? read_full(r, r->buf + CMD_HEADER, len) : 1;
	if (ret == 0)
		ret = -EBADMSG;
	if (ret < 0)
		return ret == -EBADMSG ? bad(r, "the stream ends inside it") : ret;
	if (btrfs_crc32c_raw(0, r->buf, CMD_HEADER + (size_t)len) != crc)
		return bad(r, "checksum mismatch");
	memset(r->a, 0, sizeof(r->a));
	for (at = 0; at < len;) {
		const u8 *p = r->buf + CMD_HEADER + at;
		u16 type, alen;

		if (len - at < 2)
			return bad(r, "an attribute header is cut");
		type = get_le16(p);
		if (r->version >= 2 && type == A_DATA) {
			/* v2: no length; the rest of the command */
			r->a[type] = (struct attr){ p + 2, len - at - 2, 1 };
			at = len;
			continue;
		}
		if (len - at < 4)
			return bad(r, "an attribute header is cut");
		alen = get_le16(p + 2);
		if (alen > len - at - 4)
			return bad(r, "an attribute runs past the command");
		if (type == 0 || type >= NATTRS)
			return bad(r, "unknown attribute");
		if (r->a[type].present)
			return bad(r, "an attribute appears twice");
		r->a[type] = (struct attr){ p + 4, alen, 1 };
		at += 4u + alen;
	}
	return 1;
}

/* ---- attributes ------------------------------------------------------------- */

static int get_u64(struct receiver *r, int type, u64 *out)
{
	if (!r->a[type].present || r->a[type].len != 8)
		return bad(r, "a number attribute is missing or not 8 bytes");
	*out = get_le64(r->a[type].v);
	return 0;
}

static int get_uuid(struct receiver *r, int type, u8 out[16])
{
	if (!r->a[type].present || r->a[type].len != 16)
		return bad(r, "a uuid attribute is missing or not 16 bytes");
	memcpy(out, r->a[type].v, 16);
	return 0;
}

static int get_time(struct receiver *r, int type, struct timespec *ts)
{
	if (!r->a[type].present || r->a[type].len != 12)
		return bad(r, "a time attribute is missing or not 12 bytes");
	ts->tv_sec = (time_t)get_le64(r->a[type].v);
	ts->tv_nsec = (long)get_le32(r->a[type].v + 8);
	if (ts->tv_nsec >= 1000000000L)
		return bad(r, "nanoseconds out of range");
	return 0;
}

/* A string attribute as a NUL-terminated copy in @out (@cap bytes). */
static int get_str(struct receiver *r, int type, char *out, size_t cap)
{
	const struct attr *a = &r->a[type];

	if (!a->present)
		return bad(r, "a string attribute is missing");
	if (a->len >= cap || memchr(a->v, '\0', a->len))
		return bad(r, "a string attribute is too long or holds a NUL");
	memcpy(out, a->v, a->len);
	out[a->len] = '\0';
	return 0;
}

/* ---- paths ------------------------------------------------------------------ */

#define PATH_CAP 65536

/*
 * Resolve @path (relative to the subvolume being built) to its inode; with
 * @parent, resolve all but the last component into *dir and point *name at
 * the last one (inside @path).
 */
static int walk(struct receiver *r, char *path, int parent, butter_ino_t *dir,
		const char **name)
{
	butter_ino_t at = r->root;
	char *p = path, *slash;
	int ret;

	if (!r->active)
		return bad(r, "no subvolume is being received");
	if (*p == '\0' && !parent) {
		*dir = at; /* "": the subvolume's own directory */
		return 0;
	}
	for (;;) {
		size_t len;

		slash = strchr(p, '/');
		len = slash ? (size_t)(slash - p) : strlen(p);
		if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && !memcmp(p, "..", 2)))
			return bad(r, "a path with an empty, \".\" or \"..\" component");
		if (!slash && parent) {
			*dir = at;
			*name = p;
			return 0;
		}
		ret = inode_lookup(r->fs, at, p, len, &at);
		if (ret)
			return ret;
		if (at.subvol != r->subvol)
			return bad(r, "a path leads into another subvolume");
		if (!slash)
			break;
		p = slash + 1;
	}
	*dir = at;
	return 0;
}

static int path_of(struct receiver *r, int type, char *buf, butter_ino_t *ino)
{
	int ret = get_str(r, type, buf, PATH_CAP);

	return ret ? ret : walk(r, buf, 0, ino, NULL);
}

static int parent_of(struct receiver *r, int type, char *buf, butter_ino_t *dir,
		     const char **name)
{
	int ret = get_str(r, type, buf, PATH_CAP);

	return ret ? ret : walk(r, buf, 1, dir, name);
}

/* ---- subvolumes --------------------------------------------------------------- */

struct uuid_match {
	const u8 *uuid;
	u64 found;
};

static int match_uuid(void *arg, const struct butter_subvol_info *info)
{
	struct uuid_match *m = arg;

	if (!memcmp(info->received_uuid, m->uuid, 16) || !memcmp(info->uuid, m->uuid, 16)) {
		m->found = info->id;
		return 1;
	}
	return 0;
}

/* The subvolume received from (or being) @uuid: the clone source of snapshots and clones. */
static int find_by_uuid(struct receiver *r, const u8 *uuid, u64 *id)
{
	struct uuid_match m = { uuid, 0 };
	int ret;

	if (r->active && !memcmp(uuid, r->uuid, 16)) {
		*id = r->subvol;
		return 0;
	}
	ret = subvol_list(r->fs, match_uuid, &m);
	if (ret < 0)
		return ret;
	if (!m.found) {
		blog_err(r->log, "send stream: command %s: no subvolume here was received from "
			 "the uuid it names (send its parent first)", cmd_names[r->cmd]);
		return -ENOENT;
	}
	*id = m.found;
	return 0;
}

static int finish_subvol(struct receiver *r)
{
	int ret;

	if (!r->active)
		return 0;
	ret = subvol_set_received(r->fs, r->subvol, r->uuid, r->ctransid,
				  BUTTER_RECEIVED_RDONLY);
	if (ret)
		return ret;
	r->active = 0;
	r->received++;
	r->last_subvol = r->subvol;
	return 0;
}

static int start_subvol(struct receiver *r, int snapshot)
{
	char *name = r->scratch;
	u64 id, from = 0;
	u8 clone_uuid[16];
	int ret;

	ret = finish_subvol(r);
	if (ret == 0)
		ret = get_str(r, A_PATH, name, PATH_CAP);
	if (ret == 0)
		ret = get_uuid(r, A_UUID, r->uuid);
	if (ret == 0)
		ret = get_u64(r, A_CTRANSID, &r->ctransid);
	if (ret)
		return ret;
	if (!*name || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
		return bad(r, "the subvolume name is not one path component");
	if (snapshot) {
		ret = get_uuid(r, A_CLONE_UUID, clone_uuid);
		if (ret == 0)
			ret = find_by_uuid(r, clone_uuid, &from);
		if (ret == 0)
			ret = subvol_snapshot(r->fs, from, r->dest, name, strlen(name), 0, &id);
	} else {
		ret = subvol_create(r->fs, r->dest, name, strlen(name), &id);
	}
	if (ret)
		return ret;
	r->subvol = id;
	r->active = 1;
	return inode_root(r->fs, id, &r->root);
}

/* ---- the commands ------------------------------------------------------------- */

static int do_create(struct receiver *r)
{
	char *path = r->scratch, target[4097];
	struct butter_new_inode ni = { 0 };
	butter_ino_t dir, out;
	const char *name;
	u64 mode = 0, rdev = 0;
	int ret = parent_of(r, A_PATH, path, &dir, &name);

	if (ret)
		return ret;
	switch (r->cmd) {
	case C_MKFILE:
		ni.mode = S_IFREG | 0600;
		break;
	case C_MKDIR:
		ni.mode = S_IFDIR | 0700;
		break;
	case C_MKFIFO:
		ni.mode = S_IFIFO | 0600;
		break;
	case C_MKSOCK:
		ni.mode = S_IFSOCK | 0600;
		break;
	case C_MKNOD:
		ret = get_u64(r, A_MODE, &mode);
		if (ret == 0)
			ret = get_u64(r, A_RDEV, &rdev);
		if (ret)
			return ret;
		if (!S_ISCHR(mode) && !S_ISBLK(mode) && !S_ISFIFO(mode) && !S_ISSOCK(mode))
			return bad(r, "mknod of a type that is no device, fifo or socket");
		ni.mode = (u32)(mode & S_IFMT) | 0600;
		ni.rdev = rdev;
		break;
	case C_SYMLINK:
		ret = get_str(r, A_PATH_LINK, target, sizeof(target));
		return ret ? ret : ns_symlink(r->fs, dir, name, strlen(name), target, 0, 0, &out);
	}
	return ns_create(r->fs, dir, name, strlen(name), &ni, &out);
}

static int do_rename_or_link(struct receiver *r)
{
	char *from = r->scratch, *to = r->scratch + PATH_CAP;
	butter_ino_t fdir, tdir, ino;
	const char *fname, *tname;
	int ret;

	if (r->cmd == C_RENAME) {
		ret = parent_of(r, A_PATH, from, &fdir, &fname);
		if (ret == 0)
			ret = parent_of(r, A_PATH_TO, to, &tdir, &tname);
		return ret ? ret : ns_rename(r->fs, fdir, fname, strlen(fname), tdir, tname,
					     strlen(tname), 0);
	}
	ret = parent_of(r, A_PATH, to, &tdir, &tname);
	if (ret == 0)
		ret = path_of(r, A_PATH_LINK, from, &ino);
	return ret ? ret : ns_link(r->fs, ino, tdir, tname, strlen(tname));
}

static int do_remove(struct receiver *r)
{
	butter_ino_t dir;
	const char *name;
	int ret = parent_of(r, A_PATH, r->scratch, &dir, &name);

	if (ret)
		return ret;
	if (r->cmd == C_RMDIR)
		return ns_rmdir(r->fs, dir, name, strlen(name));
	return ns_unlink(r->fs, dir, name, strlen(name));
}

static int do_xattr(struct receiver *r)
{
	char name[XATTR_NAME_CAP];
	butter_ino_t ino;
	int ret = path_of(r, A_PATH, r->scratch, &ino);

	if (ret == 0)
		ret = get_str(r, A_XATTR_NAME, name, sizeof(name));
	if (ret)
		return ret;
	if (r->cmd == C_REMOVE_XATTR)
		return ns_removexattr(r->fs, ino, name);
	if (!r->a[A_XATTR_DATA].present)
		return bad(r, "set_xattr without data");
	return ns_setxattr(r->fs, ino, name, r->a[A_XATTR_DATA].v, r->a[A_XATTR_DATA].len);
}

static int do_write(struct receiver *r)
{
	butter_ino_t ino;
	u64 off;
	const struct attr *d = &r->a[A_DATA];
	ssize_t n;
	int ret = path_of(r, A_PATH, r->scratch, &ino);

	if (ret == 0)
		ret = get_u64(r, A_FILE_OFFSET, &off);
	if (ret)
		return ret;
	if (!d->present)
		return bad(r, "write without data");
	if (d->len == 0)
		return 0;
	n = data_write(r->fs, ino, d->v, d->len, off);
	if (n < 0)
		return (int)n;
	return (size_t)n == d->len ? 0 : -EIO;
}

/* A clone: reflinked where the library can, else copied. */
static int do_clone(struct receiver *r)
{
	char *path = r->scratch, *cpath = r->scratch + PATH_CAP;
	butter_ino_t dst, src, saved_root = r->root;
	u64 off, len, coff, src_id, saved_subvol = r->subvol;
	u8 uuid[16];
	int ret = path_of(r, A_PATH, path, &dst);

	if (ret == 0)
		ret = get_u64(r, A_FILE_OFFSET, &off);
	if (ret == 0)
		ret = get_u64(r, A_CLONE_LEN, &len);
	if (ret == 0)
		ret = get_u64(r, A_CLONE_OFFSET, &coff);
	if (ret == 0)
		ret = get_uuid(r, A_CLONE_UUID, uuid);
	if (ret == 0)
		ret = find_by_uuid(r, uuid, &src_id);
	if (ret == 0)
		ret = inode_root(r->fs, src_id, &r->root);
	if (ret == 0) {
		r->subvol = src_id; /* the clone path is in the source subvolume */
		ret = path_of(r, A_CLONE_PATH, cpath, &src);
		r->subvol = saved_subvol;
		r->root = saved_root;
	}
	if (ret || len == 0)
		return ret;
	ret = data_clone_range(r->fs, src, coff, dst, off, len);
	if (ret != -EINVAL)
		return ret;
	/* unaligned (or otherwise refused): copy the bytes */
	while (len) {
		u8 chunk[16384];
		size_t want = len > sizeof(chunk) ? sizeof(chunk) : (size_t)len;
		ssize_t n = data_read(r->fs, src, chunk, want, coff);

		if (n < 0)
			return (int)n;
		if (n == 0)
			return bad(r, "clone source range past the end of its file");
		if (data_write(r->fs, dst, chunk, (size_t)n, off) != n)
			return -EIO;
		len -= (u64)n;
		off += (u64)n;
		coff += (u64)n;
	}
	return 0;
}

static int do_setattr(struct receiver *r)
{
	struct butter_stat st;
	butter_ino_t ino;
	unsigned mask = 0;
	u64 v;
	int ret = path_of(r, A_PATH, r->scratch, &ino);

	if (ret)
		return ret;
	memset(&st, 0, sizeof(st));
	switch (r->cmd) {
	case C_TRUNCATE:
		ret = get_u64(r, A_SIZE, &st.size);
		mask = BUTTER_SET_SIZE;
		break;
	case C_CHMOD:
		ret = get_u64(r, A_MODE, &v);
		st.mode = (u32)(v & 07777);
		mask = BUTTER_SET_MODE;
		break;
	case C_CHOWN:
		ret = get_u64(r, A_UID, &v);
		st.uid = (u32)v;
		if (ret == 0)
			ret = get_u64(r, A_GID, &v);
		st.gid = (u32)v;
		mask = BUTTER_SET_UID | BUTTER_SET_GID;
		break;
	case C_UTIMES:
		/* as btrfs receive (utimensat): atime and mtime; ctime becomes now */
		ret = get_time(r, A_ATIME, &st.atime);
		if (ret == 0)
			ret = get_time(r, A_MTIME, &st.mtime);
		mask = BUTTER_SET_ATIME | BUTTER_SET_MTIME;
		break;
	}
	return ret ? ret : ns_setattr(r->fs, ino, &st, mask, NULL);
}

static int apply(struct receiver *r)
{
	switch (r->cmd) {
	case C_SUBVOL:
		return start_subvol(r, 0);
	case C_SNAPSHOT:
		return start_subvol(r, 1);
	case C_MKFILE:
	case C_MKDIR:
	case C_MKNOD:
	case C_MKFIFO:
	case C_MKSOCK:
	case C_SYMLINK:
		return do_create(r);
	case C_RENAME:
	case C_LINK:
		return do_rename_or_link(r);
	case C_UNLINK:
	case C_RMDIR:
		return do_remove(r);
	case C_SET_XATTR:
	case C_REMOVE_XATTR:
		return do_xattr(r);
	case C_WRITE:
		return do_write(r);
	case C_CLONE:
		return do_clone(r);
	case C_TRUNCATE:
	case C_CHMOD:
	case C_CHOWN:
	case C_UTIMES:
		return do_setattr(r);
	case C_UPDATE_EXTENT:
		return 0; /* a stream made without data (send --no-data) */
	}
	if (r->cmd > C_UPDATE_EXTENT && r->cmd <= C_MAX_KNOWN) {
		blog_err(r->log, "send stream: command %s (version 2) is not supported yet",
			 cmd_names[r->cmd]);
		return -EOPNOTSUPP;
	}
	return bad(r, "unknown command");
}

int ops_receive(struct butter_fs *fs, butter_ino_t dest, unsigned flags,
		butter_receive_read_fn read, void *arg, struct butter_receive_result *result)
{
	struct receiver *r = calloc(1, sizeof(*r));
	int ret, first = 1, ended;

	if (!r)
		return -ENOMEM;
	r->fs = fs;
	r->log = &fs->log;
	r->read = read;
	r->arg = arg;
	r->dest = dest;
	r->scratch = malloc(2 * PATH_CAP);
	if (!r->scratch) {
		ret = -ENOMEM;
		goto out;
	}
	/* streams follow each other: header, commands up to END, header, ... */
	while ((ret = read_header(r, first)) == 1) {
		first = 0;
		while ((ret = read_command(r)) == 1) {
			if (r->cmd == C_END)
				break;
			ret = apply(r);
			if (ret) {
				if (ret != -EBADMSG && ret != -EOPNOTSUPP)
					blog_err(r->log, "send stream: command %s: %s",
						 r->cmd < sizeof(cmd_names) / sizeof(cmd_names[0]) &&
							 cmd_names[r->cmd] ? cmd_names[r->cmd] : "?",
						 strerror(-ret));
				goto out;
			}
		}
		if (ret < 0)
			goto out;
		ended = ret == 1; /* at END, not at the input's end */
		ret = finish_subvol(r); /* END, or the input ended without one */
		if (ret)
			goto out;
		if (ended && (flags & BUTTER_RECEIVE_END_STOPS))
			break; /* -e: what follows the first END is not ours to read */
	}
out:
	if (ret == 0 && result) {
		result->subvolumes = r->received;
		result->last_subvol = r->last_subvol;
	}
	free(r->scratch);
	free(r->buf);
	free(r);
	return ret;
}

/* ---- the stream as text (`btrfs receive --dump`) ------------------------------ */

/*
 * btrfs-progs' escaping of names in a dump: C escapes for the control
 * characters that have one, a backslash before a space or a backslash,
 * three octal digits for any other byte that is not printable ASCII.
 * Returns how many columns it printed (for the path column's width).
 */
static size_t dump_escape(FILE *out, const u8 *s, size_t len)
{
	static const char named[] = "\a\b\033\f\n\r\t\v";
	static const char letter[] = "abefnrtv";
	size_t cols = 0;

	for (size_t i = 0; i < len; i++) {
		const char *k = s[i] ? memchr(named, s[i], sizeof(named) - 1) : NULL;

		if (k) {
			fprintf(out, "\\%c", letter[k - named]);
			cols += 2;
		} else if (s[i] == ' ' || s[i] == '\\') {
			fprintf(out, "\\%c", s[i]);
			cols += 2;
		} else if (s[i] < 0x20 || s[i] >= 0x7f) {
			fprintf(out, "\\%o%o%o", s[i] >> 6, (s[i] >> 3) & 7, s[i] & 7);
			cols += 4;
		} else {
			fputc(s[i], out);
			cols++;
		}
	}
	return cols;
}

static size_t dump_escape_str(FILE *out, const char *s)
{
	return dump_escape(out, (const u8 *)s, strlen(s));
}

/* "@a/@b", each without one trailing slash, as progs joins dump paths. */
static char *dump_join(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	char *out = malloc(la + lb + 2);

	if (!out)
		return NULL;
	if (la && a[la - 1] == '/')
		la--;
	if (lb && b[lb - 1] == '/')
		lb--;
	memcpy(out, a, la);
	out[la] = '/';
	memcpy(out + la + 1, b, lb);
	out[la + 1 + lb] = '\0';
	return out;
}

/* The head of a line: the command's name in 16 columns, the path, and padding to 32 when more follows. */
static void dump_head(FILE *out, const char *title, const char *path, int more)
{
	size_t cols;

	fprintf(out, "%-16s", title);
	cols = dump_escape_str(out, path);
	if (!more)
		return;
	do
		fputc(' ', out);
	while (++cols < 32);
}

static int dump_time(struct receiver *r, int type, char *buf, size_t cap)
{
	struct timespec ts;
	struct tm tm;
	int ret = get_time(r, type, &ts);

	if (ret)
		return ret;
	if (!localtime_r(&ts.tv_sec, &tm) || !strftime(buf, cap, "%Y-%m-%dT%H:%M:%S%z", &tm))
		return bad(r, "a time that has no local form");
	return 0;
}

/* One command as its line in @out; @subvol_path is "./NAME" of the subvolume the stream builds. */
static int dump_command(struct receiver *r, FILE *out, char **subvol_path, char *path, char *other)
{
	char uuid[37], t1[64], t2[64], t3[64];
	char *full = NULL, *full2 = NULL;
	u64 a = 0, b = 0, c = 0;
	u8 u[16] = { 0 }, u2[16] = { 0 };
	int ret = 0;

	if (r->cmd == C_END)
		return 0;
	if (r->cmd != C_UPDATE_EXTENT && (r->cmd == 0 || r->cmd > C_END))
		return r->cmd <= C_MAX_KNOWN ? (blog_err(r->log, "send stream: command %s (version 2) "
							   "is not supported yet", cmd_names[r->cmd]),
						  -EOPNOTSUPP)
					     : bad(r, "unknown command");
	ret = get_str(r, A_PATH, path, PATH_CAP);
	if (ret)
		return ret;
	if (r->cmd == C_SUBVOL || r->cmd == C_SNAPSHOT) {
		char *sp = dump_join(".", path);

		if (!sp)
			return -ENOMEM;
		free(*subvol_path);
		*subvol_path = sp;
		ret = get_uuid(r, A_UUID, u) ? -EBADMSG : get_u64(r, A_CTRANSID, &a);
		if (ret == 0 && r->cmd == C_SNAPSHOT)
			ret = get_uuid(r, A_CLONE_UUID, u2) ? -EBADMSG : get_u64(r, A_CLONE_CTRANSID, &b);
		if (ret)
			return ret;
		dump_head(out, cmd_names[r->cmd], sp, 1);
		uuid_unparse_lower(u, uuid);
		fprintf(out, "uuid=%s transid=%llu", uuid, (unsigned long long)a);
		if (r->cmd == C_SNAPSHOT) {
			uuid_unparse_lower(u2, uuid);
			fprintf(out, " parent_uuid=%s parent_transid=%llu", uuid, (unsigned long long)b);
		}
		return 0;
	}
	full = dump_join(*subvol_path ? *subvol_path : ".", path);
	if (!full)
		return -ENOMEM;
	switch (r->cmd) {
	case C_MKFILE:
	case C_MKDIR:
	case C_MKFIFO:
	case C_MKSOCK:
	case C_UNLINK:
	case C_RMDIR:
		dump_head(out, cmd_names[r->cmd], full, 0);
		break;
	case C_MKNOD:
		if (!(ret = get_u64(r, A_MODE, &a)) && !(ret = get_u64(r, A_RDEV, &b))) {
			dump_head(out, "mknod", full, 1);
			fprintf(out, "mode=%llo dev=0x%llx", (unsigned long long)a, (unsigned long long)b);
		}
		break;
	case C_SYMLINK:
	case C_LINK:
		if (!(ret = get_str(r, A_PATH_LINK, other, PATH_CAP))) {
			dump_head(out, cmd_names[r->cmd], full, 1);
			fputs("dest=", out);
			dump_escape_str(out, other);
		}
		break;
	case C_RENAME:
		if (!(ret = get_str(r, A_PATH_TO, other, PATH_CAP))) {
			full2 = dump_join(*subvol_path ? *subvol_path : ".", other);
			if (!full2) {
				ret = -ENOMEM;
				break;
			}
			dump_head(out, "rename", full, 1);
			fputs("dest=", out);
			dump_escape_str(out, full2);
		}
		break;
	case C_WRITE:
		if (!(ret = get_u64(r, A_FILE_OFFSET, &a))) {
			if (!r->a[A_DATA].present) {
				ret = bad(r, "no data");
				break;
			}
			dump_head(out, "write", full, 1);
			fprintf(out, "offset=%llu len=%u", (unsigned long long)a, r->a[A_DATA].len);
		}
		break;
	case C_CLONE:
		if (!(ret = get_u64(r, A_FILE_OFFSET, &a)) && !(ret = get_u64(r, A_CLONE_LEN, &b)) &&
		    !(ret = get_u64(r, A_CLONE_OFFSET, &c)) &&
		    !(ret = get_str(r, A_CLONE_PATH, other, PATH_CAP))) {
			full2 = dump_join(*subvol_path ? *subvol_path : ".", other);
			if (!full2) {
				ret = -ENOMEM;
				break;
			}
			dump_head(out, "clone", full, 1);
			fprintf(out, "offset=%llu len=%llu from=", (unsigned long long)a,
				(unsigned long long)b);
			dump_escape_str(out, full2);
			fprintf(out, " clone_offset=%llu", (unsigned long long)c);
		}
		break;
	case C_SET_XATTR:
	case C_REMOVE_XATTR:
		if ((ret = get_str(r, A_XATTR_NAME, other, XATTR_NAME_CAP)))
			break;
		if (r->cmd == C_SET_XATTR && !r->a[A_XATTR_DATA].present) {
			ret = bad(r, "no xattr data");
			break;
		}
		dump_head(out, cmd_names[r->cmd], full, 1);
		fputs("name=", out);
		dump_escape_str(out, other);
		if (r->cmd == C_SET_XATTR) {
			const struct attr *v = &r->a[A_XATTR_DATA];

			fputc(' ', out);
			dump_escape(out, v->v, v->len);
			fprintf(out, " len=%u", v->len);
		}
		break;
	case C_TRUNCATE:
		if (!(ret = get_u64(r, A_SIZE, &a))) {
			dump_head(out, "truncate", full, 1);
			fprintf(out, "size=%llu", (unsigned long long)a);
		}
		break;
	case C_CHMOD:
		if (!(ret = get_u64(r, A_MODE, &a))) {
			dump_head(out, "chmod", full, 1);
			fprintf(out, "mode=%llo", (unsigned long long)a);
		}
		break;
	case C_CHOWN:
		if (!(ret = get_u64(r, A_UID, &a)) && !(ret = get_u64(r, A_GID, &b))) {
			dump_head(out, "chown", full, 1);
			fprintf(out, "gid=%llu uid=%llu", (unsigned long long)b, (unsigned long long)a);
		}
		break;
	case C_UTIMES:
		if (!(ret = dump_time(r, A_ATIME, t1, sizeof(t1))) &&
		    !(ret = dump_time(r, A_MTIME, t2, sizeof(t2))) &&
		    !(ret = dump_time(r, A_CTIME, t3, sizeof(t3)))) {
			dump_head(out, "utimes", full, 1);
			fprintf(out, "atime=%s mtime=%s ctime=%s", t1, t2, t3);
		}
		break;
	case C_UPDATE_EXTENT:
		if (!(ret = get_u64(r, A_FILE_OFFSET, &a)) && !(ret = get_u64(r, A_SIZE, &b))) {
			dump_head(out, "update_extent", full, 1);
			fprintf(out, "offset=%llu len=%llu", (unsigned long long)a, (unsigned long long)b);
		}
		break;
	default:
		ret = bad(r, "unknown command");
	}
	free(full);
	free(full2);
	return ret;
}

int ops_receive_dump(butter_receive_read_fn read, void *arg, butter_dump_line_fn line,
		     void *line_arg, const struct blog *log)
{
	struct receiver *r = calloc(1, sizeof(*r));
	char *path = malloc(PATH_CAP), *other = malloc(PATH_CAP), *subvol_path = NULL;
	int ret, first = 1;

	if (!r || !path || !other) {
		ret = -ENOMEM;
		goto out;
	}
	r->log = log;
	r->read = read;
	r->arg = arg;
	while ((ret = read_header(r, first)) == 1) {
		first = 0;
		while ((ret = read_command(r)) == 1 && r->cmd != C_END) {
			char *text = NULL;
			size_t len = 0;
			FILE *out = open_memstream(&text, &len);

			if (!out) {
				ret = -ENOMEM;
				break;
			}
			ret = dump_command(r, out, &subvol_path, path, other);
			if (fclose(out) != 0 && ret == 0)
				ret = -ENOMEM;
			if (ret == 0 && len)
				line(line_arg, text);
			free(text);
			if (ret)
				break;
		}
		if (ret < 0)
			break;
	}
out:
	free(subvol_path);
	free(path);
	free(other);
	if (r)
		free(r->buf);
	free(r);
	return ret;
}
