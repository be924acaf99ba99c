/*
 * nullfs.c — the floor of a FUSE metadata workload: a libfuse low-level
 * daemon that keeps names and attributes in memory and does no work for
 * them, mounted with the FUSE settings `butter mount` uses (writeback
 * cache, one-day attribute and entry timeouts, no FLUSH handler, the
 * multithreaded loop, default_permissions: the kernel checks permissions
 * and so asks again for a directory's attributes after each change of its
 * entries). bench/io.sh runs its metadata workload on it beside
 * butter: whatever rate this daemon reaches is the most any daemon built on
 * this libfuse and kernel can reach, since it answers each request the
 * kernel sends with no I/O and no tree search. butter/nullfs says how much
 * of the round trip butter's own work adds; nullfs/btrfs is the ceiling of
 * a FUSE filesystem against the kernel's btrfs on this machine.
 *
 * usage: butter-nullfs [-K] [-s | -p US | -u] MOUNTPOINT
 *   -K     do not negotiate FUSE_HANDLE_KILLPRIV_V2 (butter's -o
 *          no_killpriv_v2; by default it does, as butter, and then clears
 *          nothing: the kernel asks for security.capability once per inode)
 *   -s     libfuse's single-threaded loop (default: its multithreaded one)
 *   -p US  fuse/pollloop.c, polling US microseconds after each reply, as
 *          `butter mount` does by default (its spin= option)
 *   -u     FUSE over io_uring (fuse/uring.c), as `butter mount -o uring`;
 *          the kernel must offer it (fuse module parameter enable_uring)
 * Runs in the foreground until unmounted (fusermount3 -u MOUNTPOINT).
 *
 * It is a benchmark fixture, not a filesystem: file contents are not kept
 * (reads return zeros up to the size), inode numbers are never reused,
 * forgotten inodes stay in memory, and a directory's listing is not served.
 *
 * Invariants: every inode and name lives under `lock`; a name table entry
 * (parent, name) points at a live inode; nlink counts the names of an inode
 * (directories: 2 + subdirectories, as most Linux filesystems report).
 */
#define FUSE_USE_VERSION 314 /* as fuse/daemon.h */
#include <errno.h>
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "pollloop.h"
#include "uring.h"
#include "wire.h"

#define CACHE_SECS 86400.0

struct name {
	struct name *next; /* hash chain */
	fuse_ino_t parent, ino;
	char text[];
};

struct nullfs {
	struct wire wire;    /* FIRST member (fuse/wire.h): FUSE_HANDLE_KILLPRIV_V2 as butter */
	pthread_mutex_t lock;
	struct stat *inodes; /* index = inode number; st_ino 0 = never used */
	size_t ninodes, cap;
	struct name **table;
	size_t nbuckets, nnames;
};

static struct nullfs *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static size_t bucket(const struct nullfs *fs, fuse_ino_t parent, const char *text)
{
	uint64_t h = 1469598103934665603ull ^ parent;

	for (; *text; text++)
		h = (h ^ (unsigned char)*text) * 1099511628211ull;
	return h & (fs->nbuckets - 1);
}

static struct name **find_name(struct nullfs *fs, fuse_ino_t parent, const char *text)
{
	struct name **pp = &fs->table[bucket(fs, parent, text)];

	for (; *pp; pp = &(*pp)->next)
		if ((*pp)->parent == parent && strcmp((*pp)->text, text) == 0)
			break;
	return pp;
}

static int grow_table(struct nullfs *fs)
{
	size_t old = fs->nbuckets, i;
	struct name **t = calloc(old * 2, sizeof(*t));

	if (!t)
		return -ENOMEM;
	fs->nbuckets = old * 2;
	for (i = 0; i < old; i++) {
		struct name *n = fs->table[i], *next;

		for (; n; n = next) {
			size_t b = bucket(fs, n->parent, n->text);

			next = n->next;
			n->next = t[b];
			t[b] = n;
		}
	}
	free(fs->table);
	fs->table = t;
	return 0;
}

static int add_name(struct nullfs *fs, fuse_ino_t parent, const char *text, fuse_ino_t ino)
{
	size_t len = strlen(text) + 1;
	struct name *n = malloc(sizeof(*n) + len), **pp;

	if (!n)
		return -ENOMEM;
	if (fs->nnames >= fs->nbuckets && grow_table(fs) < 0) {
		free(n);
		return -ENOMEM;
	}
	n->parent = parent;
	n->ino = ino;
	memcpy(n->text, text, len);
	pp = &fs->table[bucket(fs, parent, text)];
	n->next = *pp;
	*pp = n;
	fs->nnames++;
	return 0;
}

static void now(struct timespec *ts)
{
	clock_gettime(CLOCK_REALTIME, ts);
}

/* A new inode under the lock: its number, or 0 when memory ran out. */
static fuse_ino_t new_inode(struct nullfs *fs, fuse_req_t req, mode_t mode)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct stat *st;

	if (fs->ninodes == fs->cap) {
		size_t cap = fs->cap * 2;
		struct stat *v = realloc(fs->inodes, cap * sizeof(*v));

		if (!v)
			return 0;
		fs->inodes = v;
		fs->cap = cap;
	}
	st = &fs->inodes[fs->ninodes];
	memset(st, 0, sizeof(*st));
	st->st_ino = fs->ninodes;
	st->st_mode = mode;
	st->st_nlink = S_ISDIR(mode) ? 2 : 1;
	st->st_uid = ctx->uid;
	st->st_gid = ctx->gid;
	st->st_blksize = 4096;
	now(&st->st_mtim);
	st->st_atim = st->st_ctim = st->st_mtim;
	return fs->ninodes++;
}

static void reply_entry(fuse_req_t req, const struct stat *st)
{
	struct fuse_entry_param e;

	memset(&e, 0, sizeof(e));
	e.ino = st->st_ino;
	e.generation = 1;
	e.attr = *st;
	e.attr_timeout = CACHE_SECS;
	e.entry_timeout = CACHE_SECS;
	fuse_reply_entry(req, &e);
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata;
	conn->want &= ~(unsigned)(FUSE_CAP_ATOMIC_O_TRUNC | FUSE_CAP_HANDLE_KILLPRIV |
				  FUSE_CAP_AUTO_INVAL_DATA);
	if (conn->capable & FUSE_CAP_WRITEBACK_CACHE)
		conn->want |= FUSE_CAP_WRITEBACK_CACHE;
	conn->time_gran = 1;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *text)
{
	struct nullfs *fs = fs_of(req);
	struct name *n;
	struct stat st;

	pthread_mutex_lock(&fs->lock);
	n = *find_name(fs, parent, text);
	if (n)
		st = fs->inodes[n->ino];
	pthread_mutex_unlock(&fs->lock);
	if (n) {
		reply_entry(req, &st);
	} else {
		struct fuse_entry_param e = { .entry_timeout = CACHE_SECS }; /* cached miss */

		fuse_reply_entry(req, &e);
	}
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct nullfs *fs = fs_of(req);
	struct stat st;

	(void)fi;
	pthread_mutex_lock(&fs->lock);
	st = fs->inodes[ino];
	pthread_mutex_unlock(&fs->lock);
	fuse_reply_attr(req, &st, CACHE_SECS);
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi)
{
	struct nullfs *fs = fs_of(req);
	struct stat *st, out;

	(void)fi;
	pthread_mutex_lock(&fs->lock);
	st = &fs->inodes[ino];
	if (to_set & FUSE_SET_ATTR_MODE)
		st->st_mode = (st->st_mode & S_IFMT) | (attr->st_mode & 07777);
	if (to_set & FUSE_SET_ATTR_UID)
		st->st_uid = attr->st_uid;
	if (to_set & FUSE_SET_ATTR_GID)
		st->st_gid = attr->st_gid;
	if (to_set & FUSE_SET_ATTR_SIZE)
		st->st_size = attr->st_size;
	if (to_set & FUSE_SET_ATTR_ATIME)
		st->st_atim = attr->st_atim;
	if (to_set & FUSE_SET_ATTR_MTIME)
		st->st_mtim = attr->st_mtim;
	if (to_set & FUSE_SET_ATTR_ATIME_NOW)
		now(&st->st_atim);
	if (to_set & FUSE_SET_ATTR_MTIME_NOW)
		now(&st->st_mtim);
	if (to_set & FUSE_SET_ATTR_CTIME)
		st->st_ctim = attr->st_ctim;
	else
		now(&st->st_ctim);
	out = *st;
	pthread_mutex_unlock(&fs->lock);
	fuse_reply_attr(req, &out, CACHE_SECS);
}

/* mkdir and create: a new inode named @text in @parent */
static int make(fuse_req_t req, fuse_ino_t parent, const char *text, mode_t mode, struct stat *out)
{
	struct nullfs *fs = fs_of(req);
	fuse_ino_t ino;
	int ret = 0;

	pthread_mutex_lock(&fs->lock);
	if (*find_name(fs, parent, text)) {
		ret = -EEXIST;
	} else if (!(ino = new_inode(fs, req, mode))) {
		ret = -ENOMEM;
	} else if ((ret = add_name(fs, parent, text, ino)) == 0) {
		if (S_ISDIR(mode))
			fs->inodes[parent].st_nlink++;
		now(&fs->inodes[parent].st_mtim);
		fs->inodes[parent].st_ctim = fs->inodes[parent].st_mtim;
		*out = fs->inodes[ino];
	}
	pthread_mutex_unlock(&fs->lock);
	return ret;
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *text, mode_t mode)
{
	struct stat st;
	int ret = make(req, parent, text, S_IFDIR | (mode & 07777), &st);

	if (ret < 0)
		fuse_reply_err(req, -ret);
	else
		reply_entry(req, &st);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *text, mode_t mode,
		      struct fuse_file_info *fi)
{
	struct fuse_entry_param e;
	int ret = make(req, parent, text, S_IFREG | (mode & 07777), &e.attr);

	if (ret < 0) {
		fuse_reply_err(req, -ret);
		return;
	}
	e.ino = e.attr.st_ino;
	e.generation = 1;
	e.attr_timeout = e.entry_timeout = CACHE_SECS;
	fi->keep_cache = 1;
	fuse_reply_create(req, &e, fi);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	fi->keep_cache = 1;
	fuse_reply_open(req, fi);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct nullfs *fs = fs_of(req);
	static const char zeros[65536];
	off_t end;

	(void)fi;
	pthread_mutex_lock(&fs->lock);
	end = fs->inodes[ino].st_size;
	pthread_mutex_unlock(&fs->lock);
	if (off >= end)
		size = 0;
	else if ((off_t)size > end - off)
		size = end - off;
	fuse_reply_buf(req, zeros, size < sizeof(zeros) ? size : sizeof(zeros));
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct nullfs *fs = fs_of(req);
	struct stat *st;

	(void)buf;
	(void)fi;
	pthread_mutex_lock(&fs->lock);
	st = &fs->inodes[ino];
	if (off + (off_t)size > st->st_size)
		st->st_size = off + size;
	st->st_blocks = (st->st_size + 511) / 512;
	pthread_mutex_unlock(&fs->lock);
	fuse_reply_write(req, size);
}

/* Drop the name (@parent, @text): its inode, or 0 when there is none. */
static fuse_ino_t drop_name(struct nullfs *fs, fuse_ino_t parent, const char *text)
{
	struct name **pp = find_name(fs, parent, text), *n = *pp;
	fuse_ino_t ino;

	if (!n)
		return 0;
	ino = n->ino;
	*pp = n->next;
	free(n);
	fs->nnames--;
	now(&fs->inodes[parent].st_mtim);
	fs->inodes[parent].st_ctim = fs->inodes[parent].st_mtim;
	fs->inodes[ino].st_ctim = fs->inodes[parent].st_mtim;
	return ino;
}

static void remove_name(fuse_req_t req, fuse_ino_t parent, const char *text, int dir)
{
	struct nullfs *fs = fs_of(req);
	fuse_ino_t ino;

	pthread_mutex_lock(&fs->lock);
	ino = drop_name(fs, parent, text);
	if (ino) {
		if (dir) {
			fs->inodes[ino].st_nlink = 0;
			fs->inodes[parent].st_nlink--;
		} else {
			fs->inodes[ino].st_nlink--;
		}
	}
	pthread_mutex_unlock(&fs->lock);
	fuse_reply_err(req, ino ? 0 : ENOENT);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *text)
{
	remove_name(req, parent, text, 0);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *text)
{
	remove_name(req, parent, text, 1);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *text, fuse_ino_t newparent,
		      const char *newtext, unsigned int flags)
{
	struct nullfs *fs = fs_of(req);
	fuse_ino_t ino, old;
	int ret = 0;

	if (flags) { /* the workload does plain renames */
		fuse_reply_err(req, EINVAL);
		return;
	}
	pthread_mutex_lock(&fs->lock);
	ino = drop_name(fs, parent, text);
	if (!ino) {
		ret = ENOENT;
	} else {
		old = drop_name(fs, newparent, newtext);
		if (old)
			fs->inodes[old].st_nlink--;
		if (add_name(fs, newparent, newtext, ino) < 0)
			ret = ENOMEM;
	}
	pthread_mutex_unlock(&fs->lock);
	fuse_reply_err(req, ret);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)ino;
	(void)datasync;
	(void)fi;
	fuse_reply_err(req, 0);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	fuse_reply_open(req, fi);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	(void)ino;
	(void)size;
	(void)off;
	(void)fi;
	fuse_reply_buf(req, NULL, 0); /* listings are not served (see the top) */
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *text, size_t size)
{
	(void)ino;
	(void)text;
	(void)size;
	fuse_reply_err(req, ENODATA);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs sv = { .f_bsize = 4096, .f_frsize = 4096, .f_blocks = 1u << 30,
			      .f_bfree = 1u << 30, .f_bavail = 1u << 30, .f_files = 1u << 30,
			      .f_ffree = 1u << 30, .f_namemax = 255 };

	(void)ino;
	fuse_reply_statfs(req, &sv);
}

static const struct fuse_lowlevel_ops ops = {
	.init = op_init,
	.lookup = op_lookup,
	.getattr = op_getattr,
	.setattr = op_setattr,
	.mkdir = op_mkdir,
	.create = op_create,
	.open = op_open,
	.read = op_read,
	.write = op_write,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.rename = op_rename,
	.fsync = op_fsync,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.fsyncdir = op_fsync,
	.getxattr = op_getxattr,
	.statfs = op_statfs,
};

int main(int argc, char **argv)
{
	/* default_permissions: the kernel checks permissions, as on butter's mount */
	char *fuse_argv[] = { argv[0], "-o", "subtype=nullfs,default_permissions", NULL };
	struct fuse_args args = FUSE_ARGS_INIT(3, fuse_argv);
	struct nullfs fs = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct fuse_session *se;
	int single = 0, uring = 0, ret;
	unsigned spin_us = 0;

	fs.wire.want_killpriv_v2 = true;
	if (argc >= 2 && strcmp(argv[1], "-K") == 0) {
		fs.wire.want_killpriv_v2 = false;
		argv++;
		argc--;
	}
	if (argc == 3 && strcmp(argv[1], "-s") == 0) {
		single = 1;
		argv++;
		argc--;
	} else if (argc == 3 && strcmp(argv[1], "-u") == 0) {
		uring = 1;
		argv++;
		argc--;
	} else if (argc == 4 && strcmp(argv[1], "-p") == 0) {
		spin_us = (unsigned)strtoul(argv[2], NULL, 10);
		argv += 2;
		argc -= 2;
	}
	if (argc != 2) {
		fprintf(stderr, "usage: %s [-K] [-s | -p US | -u] MOUNTPOINT\n", argv[0]);
		return 2;
	}
	fs.cap = 1024;
	fs.ninodes = 2; /* 0 unused, 1 = FUSE_ROOT_ID */
	fs.nbuckets = 1024;
	fs.inodes = calloc(fs.cap, sizeof(*fs.inodes));
	fs.table = calloc(fs.nbuckets, sizeof(*fs.table));
	if (!fs.inodes || !fs.table) {
		fprintf(stderr, "nullfs: out of memory\n");
		return 1;
	}
	fs.inodes[1].st_ino = 1;
	fs.inodes[1].st_mode = S_IFDIR | 0755;
	fs.inodes[1].st_nlink = 2;
	fs.inodes[1].st_blksize = 4096;
	now(&fs.inodes[1].st_mtim);
	fs.inodes[1].st_atim = fs.inodes[1].st_ctim = fs.inodes[1].st_mtim;

	se = fuse_session_new(&args, &ops, sizeof(ops), &fs);
	if (!se || fuse_session_mount(se, argv[1]) != 0 || wire_attach(se, &fs.wire) != 0) {
		fprintf(stderr, "nullfs: cannot mount on %s\n", argv[1]);
		return 1;
	}
	if (uring) {
		struct butter_uring_cfg cfg = { .pin = true }; /* one thread a CPU */

		ret = butter_uring_loop(se, &fs.wire, &cfg);
		if (ret == -ENOTSUP)
			fprintf(stderr, "nullfs: -u: built without liburing\n");
	} else if (single) {
		ret = fuse_session_loop(se);
	} else if (spin_us) {
		ret = butter_poll_loop(se, 0, spin_us);
	} else {
		struct fuse_loop_config *cfg = fuse_loop_cfg_create();

		ret = cfg ? fuse_session_loop_mt(se, cfg) : -1;
		fuse_loop_cfg_destroy(cfg);
	}
	fuse_session_unmount(se);
	fuse_session_destroy(se);
	return ret == 0 ? 0 : 1;
}
