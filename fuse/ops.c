/*
 * ops.c — the FUSE request handlers: one function per operation, each
 * translating its request into calls of <butter/butter.h> and ending in
 * exactly one fuse_reply_*().
 *
 * Rules every handler follows:
 *  1. Node ids come in and go out through nodes.c; st_ino is always the node
 *     id (nodes.c says why and how it is made).
 *  2. The library serialises its calls itself (its lock, butter.h); a
 *     handler whose calls must see one state (check, then change) runs
 *     them in a section (section_read(), section_change(): butter_lock()).
 *     Every change is noted for the commit thread (daemon_note_change()).
 *     Replies are sent after a section ends.
 *  3. Errors are the library's negative errno, replied as fuse_reply_err(req,
 *     -ret) through reply_err(), which changes one value: ENOSYS. To the
 *     kernel ENOSYS means "this daemon lacks the operation" and it stops
 *     asking for the rest of the mount; a library function that is not there
 *     yet is "not supported" (EOPNOTSUPP) instead.
 *  4. A reply that hands the kernel a node (lookup, create, mkdir, mknod,
 *     symlink, link, readdirplus entries) counts one lookup of it; if the
 *     reply fails (the request was interrupted), the count is dropped again.
 *  5. The kernel enforces read-only mounts (-o ro) and permissions (mode
 *     bits and ACLs, unless no_permission_checks); the library refuses changes on a
 *     read-only handle too (-EROFS).
 *  6. Every file or directory handle the kernel holds (open, create,
 *     opendir) is one butter_open_ref() of its inode, dropped by release or
 *     releasedir (or at once if the reply fails): so a file unlinked while
 *     open lives on as an orphan until its last release (lib/namespace/orphan.c).
 *     A release that frees an orphan is a change (noted for the commit
 *     thread); the library takes its lock exclusive only then.
 *  7. Attributes and names, present or missing, are given to the kernel
 *     with the mount's timeouts (a day by default: options.c says why that
 *     is safe); a lookup of a missing name replies a negative entry (node id
 *     0) so the kernel caches the miss as long.
 *  8. The kernel also reaches a file it has looked up and not forgotten
 *     after its last name went, without any handle: with the writeback
 *     cache it writes back the times of an unlinked inode (a SETATTR after
 *     the UNLINK, before the FORGET). So unlink and rename over a non-dir
 *     the kernel knows take one butter_open_ref() for its node first
 *     (nodes_hold), dropped when the kernel forgets the node: the file lives
 *     on as an orphan until then, as a kernel inode does until evicted.
 *
 * Readdir offsets: 0 is the start, 1 follows ".", 2 follows "..", and any
 * larger offset is the library's resume position (DIR_INDEX + 1, always >= 3
 * since btrfs indexes start at 2).
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "trace.h"

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

#define NAME_MAX_BTRFS 255
#define SYMLINK_MAX 4096
#define FIRST_DIR_OFFSET 3

static struct daemon *D(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/*
 * Sections (rule 2): several library calls that must see one state. If a
 * section cannot begin (a handle that died at a failed remount), every call
 * in it fails with the library's error by itself, and the end is harmless.
 */
static void section_read(struct daemon *d)
{
	(void)butter_lock(d->fs, 0);
}

/* A section that changes the filesystem, which the commit thread then writes out. */
static void section_change(struct daemon *d)
{
	daemon_note_change(d);
	(void)butter_lock(d->fs, 1);
}

static void section_end(struct daemon *d)
{
	butter_unlock(d->fs);
}

static void reply_err(fuse_req_t req, int ret)
{
	if (ret == -ENOSYS)
		ret = -EOPNOTSUPP;
	fuse_reply_err(req, ret < 0 ? -ret : 0);
}

static int check_name(const char *name, size_t *len)
{
	*len = strlen(name);
	return *len > NAME_MAX_BTRFS ? -ENAMETOOLONG : 0;
}

static void fill_attr(const struct daemon *d, const struct butter_stat *bs, uint64_t nodeid,
		      struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = nodeid;
	st->st_mode = bs->mode;
	st->st_nlink = bs->nlink;
	st->st_uid = bs->uid;
	st->st_gid = bs->gid;
	st->st_rdev = (dev_t)bs->rdev;
	st->st_size = (off_t)bs->size;
	st->st_blocks = (blkcnt_t)bs->blocks;
	st->st_blksize = (blksize_t)d->blksize;
	st->st_atim = bs->atime;
	st->st_mtim = bs->mtime;
	st->st_ctim = bs->ctime;
}

/* Reply the attributes @bs of node @nodeid, or the error @ret when it is not 0. */
static void reply_attr(fuse_req_t req, const struct daemon *d, int ret,
		       const struct butter_stat *bs, uint64_t nodeid)
{
	struct stat st;

	if (ret) {
		reply_err(req, ret);
		return;
	}
	fill_attr(d, bs, nodeid, &st);
	fuse_reply_attr(req, &st, d->opts->attr_timeout);
}

/*
 * Fill @e for the file @id, named @name in @parent, and count one kernel
 * lookup of its node. Called inside a section.
 */
static int make_entry(struct daemon *d, butter_ino_t parent, const char *name, size_t len,
		      butter_ino_t id, struct fuse_entry_param *e)
{
	struct butter_stat bs;
	uint64_t nodeid;
	int ret;

	memset(e, 0, sizeof(*e));
	ret = butter_stat(d->fs, id, &bs);
	if (ret)
		return ret;
	ret = nodes_get(&d->nodes, id, parent, name, len, true, &nodeid);
	if (ret)
		return ret;
	e->ino = nodeid;
	e->generation = bs.generation;
	fill_attr(d, &bs, nodeid, &e->attr);
	e->attr_timeout = d->opts->attr_timeout;
	e->entry_timeout = d->opts->entry_timeout;
	return 0;
}

static void release_handle(struct daemon *d, fuse_ino_t ino);

/* Drop @nlookup lookups of @ino, and the reference rule 8 held for it with the last one. */
static void forget_node(struct daemon *d, fuse_ino_t ino, uint64_t nlookup)
{
	if (nodes_forget(&d->nodes, ino, nlookup))
		release_handle(d, ino);
}

/* Reply @e (or the error @ret); undo the lookup count if the kernel never got it. */
static void reply_entry(struct daemon *d, fuse_req_t req, int ret, const struct fuse_entry_param *e)
{
	if (ret) {
		reply_err(req, ret);
		return;
	}
	if (fuse_reply_entry(req, e) != 0)
		forget_node(d, e->ino, 1);
}

/* ---- access times ------------------------------------------------------------ */

/*
 * fi->fh of an open directory points at its dir_handle. readdir lists no
 * entry at or past @end, the position after the last entry when the listing
 * began: renaming entries while listing them gives them new positions past
 * it, and the listing still ends, as on the kernel's btrfs. A listing begins
 * at opendir and again at each read from offset 0 (rewinddir(3)), which
 * takes the end anew, so entries made since are listed, as btrfs does since
 * 6.5. @noatime: opened with O_NOATIME (readdir gets no open flags). The
 * daemon keeps every handle in a list (dirs_lock), so those the kernel never
 * releases (a daemon stopped by a signal gets no releasedir) are freed at
 * exit.
 */
struct dir_handle {
	_Atomic uint64_t end;
	bool noatime;
	struct dir_handle *prev, *next; /* the daemon's list */
};

static struct dir_handle *dir_handle_new(struct daemon *d, uint64_t end, bool noatime)
{
	struct dir_handle *h = calloc(1, sizeof(*h));

	if (!h)
		return NULL;
	atomic_store(&h->end, end);
	h->noatime = noatime;
	pthread_mutex_lock(&d->dirs_lock);
	h->next = d->dirs;
	if (d->dirs)
		d->dirs->prev = h;
	d->dirs = h;
	pthread_mutex_unlock(&d->dirs_lock);
	return h;
}

static void dir_handle_free(struct daemon *d, struct dir_handle *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&d->dirs_lock);
	if (h->prev)
		h->prev->next = h->next;
	else
		d->dirs = h->next;
	if (h->next)
		h->next->prev = h->prev;
	pthread_mutex_unlock(&d->dirs_lock);
	free(h);
}

void butter_fuse_dirs_free(struct daemon *d)
{
	while (d->dirs)
		dir_handle_free(d, d->dirs);
}

static unsigned atime_policy(const struct mount_opts *o)
{
	unsigned p = o->noatime ? BUTTER_ATIME_NEVER :
		     o->strictatime ? BUTTER_ATIME_STRICT : BUTTER_ATIME_RELATIME;

	return o->nodiratime ? p | BUTTER_ATIME_NODIR : p;
}

/*
 * The kernel leaves atimes of FUSE files to the daemon (it marks them
 * S_NOATIME): after a read of @id (node @ino), before its reply, set its
 * atime if @due (butter_atime_due() under the shared lock said so), and drop
 * the kernel's cached attributes of it, a change the kernel did not make
 * itself: a stat after the read returned sees the new atime.
 * Reads through a descriptor opened with O_NOATIME set nothing. Reads the
 * kernel serves from its page cache reach no one: an open for reading that
 * keeps the cache (set_keep_cache) counts as a read for that reason; a
 * read of pages cached by writes through the same descriptor is missed
 * (README, limitations).
 */
static void touch_atime(struct daemon *d, fuse_ino_t ino, butter_ino_t id, int due)
{
	int ret;

	if (due <= 0)
		return;
	daemon_note_change(d);
	ret = butter_touch_atime(d->fs, id, atime_policy(d->opts));
	if (ret > 0)
		fuse_lowlevel_notify_inval_inode(d->se, ino, -1, 0);
}

/* ---- init ------------------------------------------------------------------ */

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	struct daemon *d = userdata;
	const struct mount_opts *o = d->opts;

	/* O_TRUNC comes as a separate setattr; the kernel clears setuid bits on writes */
	conn->want &= ~(unsigned)(FUSE_CAP_ATOMIC_O_TRUNC | FUSE_CAP_HANDLE_KILLPRIV);
	/*
	 * No file changes behind the kernel's back (options.c), so its cached
	 * pages need no check of the attributes at every read.
	 */
	conn->want &= ~(unsigned)FUSE_CAP_AUTO_INVAL_DATA;
	if (!d->readonly && o->writeback_cache != 0) {
		if (conn->capable & FUSE_CAP_WRITEBACK_CACHE) {
			conn->want |= FUSE_CAP_WRITEBACK_CACHE;
			d->writeback = true;
		}
		else if (o->writeback_cache == 1)
			daemon_log(d, BUTTER_LOG_WARNING, "the kernel offers no writeback cache");
	}
	/*
	 * POSIX ACLs with permission checks (default_permissions, on unless
	 * no_permission_checks, options.c): the kernel then checks access by
	 * the ACLs it reads from us, and leaves to us what btrfs does itself: a
	 * new inode inherits its directory's default ACL (or takes the umask,
	 * which FUSE_CAP_DONT_MASK passes on), a new access ACL sets the mode
	 * and a chmod updates the ACL (the library does both). With
	 * no_permission_checks the kernel checks nothing, and ACLs are plain
	 * xattrs.
	 */
	if (!o->no_permission_checks && (conn->capable & FUSE_CAP_POSIX_ACL) &&
	    (conn->capable & FUSE_CAP_DONT_MASK)) {
		conn->want |= FUSE_CAP_POSIX_ACL | FUSE_CAP_DONT_MASK;
		d->posix_acl = true;
	}
	if (conn->capable & FUSE_CAP_CACHE_SYMLINKS)
		conn->want |= FUSE_CAP_CACHE_SYMLINKS;
	/* control ioctls (control.c) work on directories too */
	if (conn->capable & FUSE_CAP_IOCTL_DIR)
		conn->want |= FUSE_CAP_IOCTL_DIR;
	/* file handles: lookups of "." and ".." by node id (lookup_self) */
	if (conn->capable & FUSE_CAP_EXPORT_SUPPORT)
		conn->want |= FUSE_CAP_EXPORT_SUPPORT;
	conn->max_write = o->max_write;
	if (o->max_readahead)
		conn->max_readahead = o->max_readahead;
	conn->time_gran = 1;
}

/* ---- names and attributes ---------------------------------------------------- */

/*
 * The kernel's export support (file handles, NFS) names a file by its node
 * id and generation alone: when the inode has left its cache it looks up "."
 * in the node itself (and ".." for a directory's parent, which the library
 * answers like any name). Node ids are a pure function of (subvolume, inode)
 * (nodes.c, rule 2), so this works for any file that still exists, also after
 * a remount; a file that is gone answers ENOENT, which the kernel turns into
 * ESTALE, as it does when the generation differs.
 */
static void lookup_self(struct daemon *d, fuse_req_t req, fuse_ino_t ino)
{
	struct fuse_entry_param e;
	struct butter_stat bs;
	butter_ino_t id;
	int ret = nodes_ref(&d->nodes, ino, &id);

	if (ret) {
		reply_err(req, ret);
		return;
	}
	ret = butter_stat(d->fs, id, &bs);
	memset(&e, 0, sizeof(e));
	if (ret == 0) {
		e.ino = ino;
		e.generation = bs.generation;
		fill_attr(d, &bs, ino, &e.attr);
		e.attr_timeout = d->opts->attr_timeout;
		e.entry_timeout = d->opts->entry_timeout;
	}
	if (ret || fuse_reply_entry(req, &e) != 0) {
		forget_node(d, ino, 1);
		if (ret)
			reply_err(req, ret == -ESTALE ? -ENOENT : ret);
	}
}

static void lookup_name(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct daemon *d = D(req);
	struct fuse_entry_param e;
	butter_ino_t dir, id;
	size_t len;
	int ret = check_name(name, &len);

	if (ret == 0)
		ret = nodes_resolve(&d->nodes, parent, &dir);
	if (ret == 0) {
		section_read(d);
		ret = butter_lookup(d->fs, dir, name, len, &id);
		if (ret == 0)
			ret = make_entry(d, dir, name, len, id, &e);
		section_end(d);
	}
	if (ret == -ENOENT && d->opts->entry_timeout > 0) {
		/* a missing name, cached as a negative entry (rule 7) */
		memset(&e, 0, sizeof(e));
		e.entry_timeout = d->opts->entry_timeout;
		fuse_reply_entry(req, &e);
		return;
	}
	reply_entry(d, req, ret, &e);
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	if (strcmp(name, ".") == 0)
		lookup_self(D(req), req, parent);
	else
		lookup_name(req, parent, name);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	forget_node(D(req), ino, nlookup);
	fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	struct daemon *d = D(req);

	for (size_t i = 0; i < count; i++)
		forget_node(d, forgets[i].ino, forgets[i].nlookup);
	fuse_reply_none(req);
}

/* ---- ENOSPC under the writeback cache ------------------------------------------ */

/*
 * With the writeback cache the kernel takes write(2) into its page cache
 * without asking the daemon; when the data comes back as a WRITE that finds
 * no space, the error reaches only fsync and close, and a writer that never
 * gets there (dd from /dev/zero) writes on forever into pages the kernel
 * then drops. btrfs refuses the write(2) itself. So: a written-back WRITE
 * that fails with ENOSPC marks its node (d->full) and drops the kernel's
 * attributes of it; the kernel's next write(2) on it (any read or seek that
 * needs the size, too) asks for them first, through GETATTR with the file
 * handle, and that GETATTR answers ENOSPC, which write(2) returns, for as
 * long as the free space stays below what it was then plus FULL_MARGIN.
 * stat(2) and everything else that asks without a file handle are answered
 * as ever.
 */
#define FULL_MARGIN (1ull << 20)

static uint64_t avail_bytes(struct daemon *d)
{
	struct butter_statfs sf;

	return butter_statfs(d->fs, &sf) == 0 ? sf.bavail * sf.bsize : 0;
}

static void full_mark(struct daemon *d, fuse_ino_t ino)
{
	uint64_t avail = avail_bytes(d);
	size_t slot = 0;

	pthread_mutex_lock(&d->full_lock);
	for (size_t i = 0; i < FULL_NODES; i++) {
		if (d->full[i].ino == ino || !d->full[i].ino) {
			slot = i;
			break;
		}
		if (d->full[i].when < d->full[slot].when)
			slot = i; /* the oldest goes if the table is full */
	}
	d->full[slot].ino = ino;
	d->full[slot].avail = avail;
	d->full[slot].when = ++d->full_clock;
	pthread_mutex_unlock(&d->full_lock);
}

/* Is @ino marked full, with no space freed since? (A node with space again is unmarked.) */
static bool full_still(struct daemon *d, fuse_ino_t ino)
{
	uint64_t avail_then = 0;
	bool marked = false;

	pthread_mutex_lock(&d->full_lock);
	for (size_t i = 0; i < FULL_NODES; i++)
		if (d->full[i].ino == ino) {
			marked = true;
			avail_then = d->full[i].avail;
		}
	pthread_mutex_unlock(&d->full_lock);
	if (!marked)
		return false;
	if (avail_bytes(d) < avail_then + FULL_MARGIN)
		return true;
	pthread_mutex_lock(&d->full_lock);
	for (size_t i = 0; i < FULL_NODES; i++)
		if (d->full[i].ino == ino)
			d->full[i].ino = 0;
	pthread_mutex_unlock(&d->full_lock);
	return false;
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct daemon *d = D(req);
	struct butter_stat bs;
	butter_ino_t id;
	int ret = nodes_resolve(&d->nodes, ino, &id);

	if (ret == 0 && fi && full_still(d, ino)) {
		/* asked through a file handle: a write(2) wants the size (see above) */
		reply_err(req, -ENOSPC);
		return;
	}
	if (ret == 0) {
		ret = butter_stat(d->fs, id, &bs);
	}
	reply_attr(req, d, ret, &bs, ino);
}

/* The kernel's inode clock, as the library's (fs_now_ts() in lib/fs/change.c says why). */
static void now(struct timespec *ts)
{
	clock_gettime(CLOCK_REALTIME_COARSE, ts);
}

enum kill_reason { KILL_MODIFY, KILL_CHOWN, KILL_ACL }; /* kill_privs() says what each means */
static int kill_privs(struct daemon *d, fuse_req_t req, butter_ino_t id, enum kill_reason why,
		      int fsetid);

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi)
{
	struct daemon *d = D(req);
	struct butter_stat bs = { 0 }, after;
	unsigned mask = 0;
	butter_ino_t id;
	int ret = nodes_resolve(&d->nodes, ino, &id);

	(void)fi;
	if (to_set & FUSE_SET_ATTR_MODE) {
		mask |= BUTTER_SET_MODE;
		bs.mode = attr->st_mode;
	}
	if (to_set & FUSE_SET_ATTR_UID) {
		mask |= BUTTER_SET_UID;
		bs.uid = attr->st_uid;
	}
	if (to_set & FUSE_SET_ATTR_GID) {
		mask |= BUTTER_SET_GID;
		bs.gid = attr->st_gid;
	}
	if (to_set & FUSE_SET_ATTR_SIZE) {
		mask |= BUTTER_SET_SIZE;
		bs.size = (uint64_t)attr->st_size;
	}
	if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW)) {
		mask |= BUTTER_SET_ATIME;
		if (to_set & FUSE_SET_ATTR_ATIME_NOW)
			now(&bs.atime);
		else
			bs.atime = attr->st_atim;
	}
	if (to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW)) {
		mask |= BUTTER_SET_MTIME;
		if (to_set & FUSE_SET_ATTR_MTIME_NOW)
			now(&bs.mtime);
		else
			bs.mtime = attr->st_mtim;
	}
	if (to_set & FUSE_SET_ATTR_CTIME) {
		mask |= BUTTER_SET_CTIME;
		bs.ctime = attr->st_ctim;
	}
	/*
	 * utimes(f, NULL): no time given, only "now" (an append-only file
	 * allows it). The atime says so; the mtime too, but with the writeback
	 * cache the kernel sends its own mtime as a given one.
	 */
	if ((to_set & FUSE_SET_ATTR_ATIME_NOW) &&
	    (!(to_set & FUSE_SET_ATTR_MTIME) || (to_set & FUSE_SET_ATTR_MTIME_NOW) || d->writeback))
		mask |= BUTTER_SET_TIMES_NOW;
	if (ret == 0) {
		bool killed = false;

		section_change(d);
		/*
		 * With the writeback cache the kernel owns a regular file's mtime
		 * and ctime and sends them whenever they change (also for a
		 * truncate that changes the size); times it does not send stay.
		 */
		if (mask && d->writeback)
			mask |= BUTTER_SET_KEEP_FILE_TIMES;
		/*
		 * No field at all is chown(f, -1, -1): the kernel's notify_change
		 * asked for the ctime only (ATTR_CTIME, which FUSE sends solely with
		 * the writeback cache, for regular files). An empty mask sets the
		 * ctime to now, as local filesystems do.
		 */
		ret = butter_setattr_stat(d->fs, id, &bs, mask, &after);
		/*
		 * FUSE_HANDLE_KILLPRIV_V2 (wire.c): the kernel sent no mode for
		 * what its VFS would clear. A kill flag comes with a truncate by a
		 * caller without CAP_FSETID and with every chown; no field at all
		 * is chown(f, -1, -1), or the kernel's own "remove privileges"
		 * before a write or fallocate by such a caller.
		 */
		if (ret == 0 && d->wire.killpriv_v2) {
			bool chown = to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID);

			if (wire_kill_suidgid() && !chown)
				ret = kill_privs(d, req, id, KILL_MODIFY, 0);
			else if (chown || !(to_set & ~FUSE_SET_ATTR_CTIME))
				ret = kill_privs(d, req, id, KILL_CHOWN, -1);
			killed = ret > 0;
			if (ret > 0)
				ret = 0;
		}
		if (ret == 0 && killed)
			ret = butter_stat(d->fs, id, &after);
		section_end(d);
	}
	reply_attr(req, d, ret, &after, ino);
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct daemon *d = D(req);
	char buf[SYMLINK_MAX + 1];
	butter_ino_t id;
	ssize_t n = nodes_resolve(&d->nodes, ino, &id);

	if (n == 0) {
		n = butter_readlink(d->fs, id, buf, sizeof(buf));
	}
	if (n >= (ssize_t)sizeof(buf))
		n = -ENAMETOOLONG;
	if (n < 0) {
		reply_err(req, (int)n);
		return;
	}
	buf[n] = '\0';
	fuse_reply_readlink(req, buf);
}

/* ---- making names ------------------------------------------------------------ */

/*
 * Create @name in @parent: a symlink to @target if it is not NULL, else an
 * inode of @mode (type and permissions) and @rdev, owned by the caller.
 * As the kernel does for local filesystems (inode_init_owner), a directory
 * with the setgid bit passes its group on, and its setgid bit to new
 * directories.
 */
static int make_node(struct daemon *d, fuse_req_t req, fuse_ino_t parent, const char *name,
		     uint32_t mode, uint64_t rdev, const char *target, bool open,
		     struct fuse_entry_param *e)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct butter_new_inode attr = {
		.mode = mode, .uid = ctx->uid, .gid = ctx->gid, .rdev = rdev,
		/* with POSIX ACLs the kernel leaves the umask and inheritance to us */
		.umask = ctx->umask, .flags = d->posix_acl ? BUTTER_NEW_INHERIT_ACL : 0,
	};
	struct butter_stat pst;
	butter_ino_t dir, id;
	size_t len;
	int ret = check_name(name, &len);

	if (ret == 0)
		ret = nodes_resolve(&d->nodes, parent, &dir);
	if (ret)
		return ret;
	section_change(d);
	ret = butter_stat(d->fs, dir, &pst);
	if (ret == 0 && (pst.mode & S_ISGID)) {
		attr.gid = pst.gid;
		if (S_ISDIR(mode))
			attr.mode |= S_ISGID;
	}
	if (ret == 0 && target)
		ret = butter_symlink(d->fs, dir, name, len, target, attr.uid, attr.gid, &id);
	else if (ret == 0)
		ret = butter_create(d->fs, dir, name, len, &attr, &id);
	if (ret == 0)
		ret = make_entry(d, dir, name, len, id, e);
	if (ret == 0 && open) {
		ret = butter_open_ref(d->fs, id);
		if (ret) /* a new file, held by nobody: its first lookup goes */
			(void)nodes_forget(&d->nodes, e->ino, 1);
	}
	section_end(d);
	return ret;
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	struct fuse_entry_param e;
	int ret = make_node(D(req), req, parent, name, mode, rdev, NULL, false, &e);

	reply_entry(D(req), req, ret, &e);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct fuse_entry_param e;
	int ret = make_node(D(req), req, parent, name, S_IFDIR | (mode & 07777), 0, NULL, false,
			    &e);

	reply_entry(D(req), req, ret, &e);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;
	int ret = make_node(D(req), req, parent, name, S_IFLNK | 0777, 0, link, false, &e);

	reply_entry(D(req), req, ret, &e);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	struct daemon *d = D(req);
	struct fuse_entry_param e;
	butter_ino_t id, dir;
	size_t len;
	int ret = check_name(newname, &len);

	if (ret == 0)
		ret = nodes_resolve(&d->nodes, ino, &id);
	if (ret == 0)
		ret = nodes_resolve(&d->nodes, newparent, &dir);
	if (ret == 0) {
		section_change(d);
		ret = butter_link(d->fs, id, dir, newname, len);
		if (ret == 0)
			ret = make_entry(d, dir, newname, len, id, &e);
		section_end(d);
	}
	reply_entry(d, req, ret, &e);
}

/* ---- removing and moving names ------------------------------------------------- */

/*
 * Rule 8: before @name in @dir goes, if it names a non-directory the kernel
 * has looked up, keep the file open until the kernel forgets it. Inside the
 * change section. Nothing to undo if the removal then fails (the file
 * stays linked; the forget drops the reference).
 */
static void hold_victim(struct daemon *d, butter_ino_t dir, const char *name, size_t len)
{
	butter_ino_t id;
	uint64_t nodeid;
	unsigned type;

	if (butter_lookup_type(d->fs, dir, name, len, &id, &type) != 0 || type == DT_DIR)
		return;
	if (!nodes_holdable(&d->nodes, id, &nodeid))
		return;
	if (butter_open_ref(d->fs, id) != 0)
		return;
	if (!nodes_hold(&d->nodes, nodeid))
		butter_release(d->fs, id, BUTTER_RELEASE_NOFREE); /* still linked: changes nothing */
}

static void remove_name(fuse_req_t req, fuse_ino_t parent, const char *name, bool dir)
{
	struct daemon *d = D(req);
	butter_ino_t p;
	size_t len;
	int ret = check_name(name, &len);

	if (ret == 0)
		ret = nodes_resolve(&d->nodes, parent, &p);
	if (ret == 0) {
		section_change(d);
		if (!dir)
			hold_victim(d, p, name, len);
		ret = dir ? butter_rmdir(d->fs, p, name, len) : butter_unlink(d->fs, p, name, len);
		section_end(d);
	}
	reply_err(req, ret);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_name(req, parent, name, false);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_name(req, parent, name, true);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		      const char *newname, unsigned int flags)
{
	struct daemon *d = D(req);
	butter_ino_t from, to;
	unsigned bflags = 0;
	size_t len, newlen;
	int ret = check_name(name, &len);

	if (ret == 0)
		ret = check_name(newname, &newlen);
	if (flags & RENAME_NOREPLACE)
		bflags |= BUTTER_RENAME_NOREPLACE;
	if (flags & RENAME_EXCHANGE)
		bflags |= BUTTER_RENAME_EXCHANGE;
	if (flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE))
		ret = -EINVAL; /* RENAME_WHITEOUT: overlayfs upper layers only */
	if (ret == 0)
		ret = nodes_resolve(&d->nodes, parent, &from);
	if (ret == 0)
		ret = nodes_resolve(&d->nodes, newparent, &to);
	if (ret == 0) {
		section_change(d);
		if (!(bflags & (BUTTER_RENAME_EXCHANGE | BUTTER_RENAME_NOREPLACE)))
			hold_victim(d, to, newname, newlen);
		ret = butter_rename(d->fs, from, name, len, to, newname, newlen, bflags);
		section_end(d);
	}
	reply_err(req, ret);
}

/* ---- files ----------------------------------------------------------------------- */

/* Let the kernel keep its page cache if the file is as it was at the previous open. */
static void set_keep_cache(struct daemon *d, fuse_ino_t ino, const struct butter_stat *bs,
			   struct fuse_file_info *fi)
{
	bool same = nodes_open_unchanged(&d->nodes, ino, &bs->mtime, bs->size);

	fi->keep_cache = d->opts->keep_cache && same;
}

/*
 * Drop the handle count of node @ino (rule 6); the library takes its lock
 * shared, exclusive when this frees an orphan, which is a change. Handles
 * opened while the mount was read-only from its start were never counted (a
 * read-only handle counts nothing): after a remount read-write their
 * releases find no count, which is not an error.
 */
static void release_handle(struct daemon *d, fuse_ino_t ino)
{
	butter_ino_t id;
	int ret = nodes_resolve(&d->nodes, ino, &id);

	if (ret == 0)
		ret = butter_release(d->fs, id, BUTTER_RELEASE_NOFREE);
	if (ret == 1) {
		daemon_note_change(d); /* the last open of an orphan: freeing it is a change */
		ret = butter_release(d->fs, id, 0);
	}
	if (ret == -EINVAL && d->reopened)
		ret = 0;
	if (ret < 0)
		daemon_log(d, BUTTER_LOG_WARNING, "release of node %llu: %s",
			   (unsigned long long)ino, strerror(-ret));
}

int butter_fuse_tmpfile(struct daemon *d, uint64_t parent, uint32_t mode, uint32_t uid,
			uint32_t gid, uint32_t umask, struct fuse_entry_param *e)
{
	struct butter_new_inode attr = {
		.mode = S_IFREG | (mode & 07777), .uid = uid, .gid = gid, .umask = umask,
		.flags = d->posix_acl ? BUTTER_NEW_INHERIT_ACL : 0,
	};
	struct butter_stat pst;
	butter_ino_t dir, id;
	int ret = nodes_resolve(&d->nodes, parent, &dir);

	if (ret)
		return ret;
	if (d->readonly)
		return -EROFS;
	section_change(d);
	ret = butter_stat(d->fs, dir, &pst);
	if (ret == 0 && (pst.mode & S_ISGID))
		attr.gid = pst.gid; /* as make_node */
	if (ret == 0)
		ret = butter_create_tmpfile(d->fs, dir, &attr, &id);
	if (ret == 0) {
		/* invariant 6: the kernel's handle is the open the library counted */
		ret = make_entry(d, dir, "", 0, id, e);
		if (ret)
			butter_release(d->fs, id, 0);
	}
	section_end(d);
	return ret;
}

void butter_fuse_tmpfile_unref(struct daemon *d, uint64_t nodeid)
{
	release_handle(d, nodeid);
	forget_node(d, nodeid, 1);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi)
{
	struct daemon *d = D(req);
	struct fuse_entry_param e;
	struct butter_stat bs = { 0 };
	int ret = make_node(d, req, parent, name, S_IFREG | (mode & 07777), 0, NULL, true, &e);

	if (ret) {
		reply_err(req, ret);
		return;
	}
	bs.mtime = e.attr.st_mtim;
	bs.size = (uint64_t)e.attr.st_size;
	set_keep_cache(d, e.ino, &bs, fi);
	fi->fh = 0;
	if (fuse_reply_create(req, &e, fi) != 0) {
		release_handle(d, e.ino);
		forget_node(d, e.ino, 1);
	}
}

/*
 * chattr's flags at open, as the kernel's may_open(): an immutable file
 * opens for reading only; an append-only one for writing only with O_APPEND
 * and never with O_TRUNC. (The kernel does not know the flags of a FUSE
 * inode, so the daemon says it.)
 */
static int open_allowed(uint64_t inode_flags, int flags)
{
	if ((flags & O_ACCMODE) == O_RDONLY && !(flags & O_TRUNC))
		return 0;
	if ((inode_flags & BUTTER_INODE_IMMUTABLE) && (flags & O_ACCMODE) != O_RDONLY)
		return -EPERM;
	if ((inode_flags & BUTTER_INODE_APPEND) &&
	    (((flags & O_ACCMODE) != O_RDONLY && !(flags & O_APPEND)) || (flags & O_TRUNC)))
		return -EPERM;
	return 0;
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct daemon *d = D(req);
	struct butter_stat bs;
	butter_ino_t id;
	int ret = nodes_resolve(&d->nodes, ino, &id), due = 0;
	bool reads = (fi->flags & O_ACCMODE) != O_WRONLY && !(fi->flags & O_NOATIME);

	if (ret == 0) {
		section_read(d);
		ret = butter_stat(d->fs, id, &bs);
		if (ret == 0 && S_ISDIR(bs.mode))
			ret = -EISDIR;
		if (ret == 0 && (d->readonly || atomic_load(&d->commit_failed)) &&
		    (fi->flags & O_ACCMODE) != O_RDONLY)
			ret = -EROFS;
		if (ret == 0)
			ret = open_allowed(bs.flags, fi->flags); /* the flags butter_stat() just read */
		if (ret == 0)
			ret = butter_open_ref(d->fs, id);
		if (ret == 0 && reads)
			due = butter_atime_due(d->fs, id, atime_policy(d->opts));
		section_end(d);
	}
	if (ret) {
		reply_err(req, ret);
		return;
	}
	set_keep_cache(d, ino, &bs, fi);
	/* the kernel may serve this open's reads from the pages it kept: count the read now */
	if (fi->keep_cache)
		touch_atime(d, ino, id, due);
	fi->fh = 0;
	if (fuse_reply_open(req, fi) != 0)
		release_handle(d, ino);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct daemon *d = D(req);
	butter_ino_t id;
	ssize_t n = nodes_resolve(&d->nodes, ino, &id);
	char *buf = NULL;
	int due = 0;

	if (n == 0 && off < 0)
		n = -EINVAL;
	if (n == 0 && size) {
		buf = malloc(size);
		if (!buf)
			n = -ENOMEM;
	}
	if (n == 0) {
		section_read(d);
		if (size)
			n = butter_read(d->fs, id, buf, size, (uint64_t)off);
		if (n >= 0 && !(fi->flags & O_NOATIME))
			due = butter_atime_due(d->fs, id, atime_policy(d->opts));
		section_end(d);
		if (n > 0 && d->tracer)
			trace_read(d, id, (uint64_t)off, (uint64_t)n);
	}
	touch_atime(d, ino, id, due);
	if (n < 0)
		reply_err(req, (int)n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
}

/*
 * An O_DIRECT write bypasses the kernel's page cache, but pages of the range
 * read (buffered, through another descriptor) while the write was in flight
 * stay cached with the old bytes: the kernel invalidates the range before an
 * asynchronous direct write is sent, not after it completes. Drop them here,
 * before the reply, so no read that follows the completion sees them. The
 * drop waits for reads of those pages, which other workers serve: with one
 * request thread (-s) it would wait for itself, so there it is skipped.
 */
static void drop_cached_pages(struct daemon *d, fuse_ino_t ino, off_t off, size_t len)
{
	if (d->opts->single_thread)
		return;
	fuse_lowlevel_notify_inval_inode(d->se, ino, off, (off_t)len);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct daemon *d = D(req);
	butter_ino_t id;
	ssize_t n = nodes_resolve(&d->nodes, ino, &id);
	bool killed = false;

	if (n == 0 && off < 0)
		n = -EINVAL;
	if (n == 0) {
		struct butter_stat times;

		section_change(d);
		if (d->writeback)
			n = butter_stat(d->fs, id, &times);
		if (n == 0)
			n = butter_write(d->fs, id, buf, size, (uint64_t)off);
		if (n >= 0 && d->writeback) {
			/*
			 * With the writeback cache the kernel owns mtime and ctime: it
			 * sends its own in a setattr after the writes, but a worker may
			 * serve that setattr before a write still in flight. A write must
			 * not move the times, or the last request served would win.
			 */
			int ret = butter_setattr(d->fs, id, &times,
						 BUTTER_SET_MTIME | BUTTER_SET_CTIME);

			if (ret)
				n = ret;
		}
		/* FUSE_HANDLE_KILLPRIV_V2 (wire.c): a caller without CAP_FSETID wrote */
		if (n > 0 && d->wire.killpriv_v2 && wire_kill_suidgid()) {
			int ret = kill_privs(d, req, id, KILL_MODIFY, 0);

			if (ret < 0)
				n = ret;
			killed = ret > 0;
		}
		section_end(d);
	}
	atomic_fetch_add(&d->writes_served, 1);
	if (n > 0 && !fi->writepage && (fi->flags & O_DIRECT))
		drop_cached_pages(d, ino, off, (size_t)n);
	if (n < 0)
		reply_err(req, (int)n);
	else
		fuse_reply_write(req, (size_t)n);
	if (killed) /* the mode changed behind the kernel's back */
		fuse_lowlevel_notify_inval_inode(d->se, ino, -1, 0);
	if (n == -ENOSPC && d->writeback) {
		/* the writer's next write(2) asks for the attributes, and hears ENOSPC */
		full_mark(d, ino);
		fuse_lowlevel_notify_inval_inode(d->se, ino, -1, 0);
	}
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)fi;
	release_handle(D(req), ino);
	fuse_reply_err(req, 0);
}

/* fsync and fsyncdir: the tree log, requests grouped (fsync.c). */
static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)fi;
	butter_fuse_fsync(req, ino, datasync);
}

static void op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
		     struct fuse_file_info *fi)
{
	struct daemon *d = D(req);
	uint64_t result = 0;
	butter_ino_t id;
	int ret = nodes_resolve(&d->nodes, ino, &id);

	(void)fi;
	if (ret == 0 && whence != SEEK_DATA && whence != SEEK_HOLE)
		ret = -EINVAL;
	/* as btrfs: data before the start is none at all, a hole search starts at 0 */
	if (ret == 0 && off < 0 && whence == SEEK_DATA)
		ret = -ENXIO;
	if (off < 0)
		off = 0;
	/*
	 * With the writeback cache, data written but not yet written back lives
	 * only in the kernel's page cache, and the kernel sends LSEEK without
	 * writing it back first: an answer from the trees alone would miss it
	 * (ENXIO for SEEK_DATA in a file that has data). Asking the kernel to
	 * invalidate the file makes it write every dirty page to us first (other
	 * workers serve those writes: no lock is held here). With one request
	 * thread that would wait for itself, so -s answers from the trees.
	 */
	if (ret == 0 && d->writeback && !d->opts->single_thread)
		fuse_lowlevel_notify_inval_inode(d->se, ino, 0, 0);
	if (ret == 0) {
		ret = butter_seek(d->fs, id, (uint64_t)off, whence, &result);
	}
	if (ret)
		reply_err(req, ret);
	else
		fuse_reply_lseek(req, (off_t)result);
}

/*
 * fallocate(2): the kernel has checked the mode against what FUSE passes on
 * (KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE) and flushed its cached pages of a range
 * to be punched or zeroed.
 */

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
			 struct fuse_file_info *fi)
{
	struct daemon *d = D(req);
	butter_ino_t id;
	int ret = nodes_resolve(&d->nodes, ino, &id);

	(void)fi;
	if (ret == 0 && (offset < 0 || length <= 0))
		ret = -EINVAL;
	if (ret == 0) {
		section_change(d);
		ret = butter_fallocate(d->fs, id, mode, (uint64_t)offset, (uint64_t)length);
		if (ret == 0)
			ret = kill_privs(d, req, id, KILL_MODIFY, -1);
		section_end(d);
	}
	reply_err(req, ret > 0 ? 0 : ret);
	if (ret > 0) /* the mode changed behind the kernel's back */
		fuse_lowlevel_notify_inval_inode(d->se, ino, -1, 0);
}

/* The reply of FUSE_COPY_FILE_RANGE holds a 32-bit count. */
#define COPY_MAX (0xffffffffULL & ~0xffffULL)
/* A copy that cannot share extents moves at most this much per request (a short count). */
#define COPY_BY_HAND_MAX (8ULL << 20)
#define COPY_CHUNK (1u << 20)

/* Copy by reading and writing; returns the bytes copied, or a negative errno if none. */
static ssize_t copy_by_hand(struct daemon *d, butter_ino_t src, uint64_t off_in, butter_ino_t dst,
			    uint64_t off_out, uint64_t len)
{
	uint64_t done = 0;
	ssize_t n = 0;
	char *buf;

	if (len > COPY_BY_HAND_MAX)
		len = COPY_BY_HAND_MAX;
	buf = malloc(len < COPY_CHUNK ? len : COPY_CHUNK);
	if (!buf)
		return -ENOMEM;
	while (done < len) {
		size_t want = len - done < COPY_CHUNK ? (size_t)(len - done) : COPY_CHUNK;

		n = butter_read(d->fs, src, buf, want, off_in + done);
		if (n <= 0)
			break;
		n = butter_write(d->fs, dst, buf, (size_t)n, off_out + done);
		if (n <= 0)
			break;
		done += (uint64_t)n;
	}
	free(buf);
	return done ? (ssize_t)done : n;
}

/*
 * copy_file_range(2): share the extents (a reflink, as btrfs does for this
 * call) when the ranges allow a clone — sector-aligned offsets, a length
 * that is aligned or ends at the source's end without landing inside the
 * destination — and copy the bytes otherwise. The kernel has already refused
 * overlapping ranges of one file and flushed its cached pages of both ranges.
 */
static void op_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in,
			       struct fuse_file_info *fi_in, fuse_ino_t ino_out, off_t off_out,
			       struct fuse_file_info *fi_out, size_t len, int flags)
{
	struct daemon *d = D(req);
	struct butter_stat sst, dst_st;
	butter_ino_t src, dst;
	uint64_t n = 0, ss = d->blksize;
	ssize_t copied = 0;
	int killed = 0, ret = nodes_resolve(&d->nodes, ino_in, &src);

	(void)fi_in;
	(void)fi_out;
	if (ret == 0)
		ret = nodes_resolve(&d->nodes, ino_out, &dst);
	if (ret == 0 && (flags || off_in < 0 || off_out < 0))
		ret = -EINVAL;
	if (ret) {
		reply_err(req, ret);
		return;
	}
	section_change(d);
	ret = butter_stat(d->fs, src, &sst);
	if (ret == 0)
		ret = butter_stat(d->fs, dst, &dst_st);
	if (ret == 0 && (uint64_t)off_in < sst.size) {
		n = sst.size - (uint64_t)off_in;
		if (n > len)
			n = len;
		if (n > COPY_MAX)
			n = COPY_MAX;
	}
	if (ret == 0 && n && (uint64_t)off_in % ss == 0 && (uint64_t)off_out % ss == 0 &&
	    (n % ss == 0 || ((uint64_t)off_in + n == sst.size &&
			     (uint64_t)off_out + n >= dst_st.size))) {
		ret = butter_clone_range(d->fs, src, (uint64_t)off_in, dst, (uint64_t)off_out, n);
		if (ret == 0)
			copied = (ssize_t)n;
		else if (ret == -EINVAL)
			ret = 0; /* e.g. one file NODATASUM, the other not: copy the bytes */
	}
	if (ret == 0 && n && !copied) {
		copied = copy_by_hand(d, src, (uint64_t)off_in, dst, (uint64_t)off_out, n);
		if (copied < 0)
			ret = (int)copied;
	}
	/* the destination changed: its setuid/setgid go as after a write */
	if (ret == 0 && copied > 0) {
		killed = kill_privs(d, req, dst, KILL_MODIFY, -1);
		if (killed < 0)
			ret = killed;
	}
	section_end(d);
	if (ret)
		reply_err(req, ret);
	else
		fuse_reply_write(req, (size_t)copied);
	if (ret == 0 && killed > 0) /* the mode changed behind the kernel's back */
		fuse_lowlevel_notify_inval_inode(d->se, ino_out, -1, 0);
}

/* ---- directories ----------------------------------------------------------------- */

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct daemon *d = D(req);
	struct butter_stat bs;
	struct dir_handle *h = NULL;
	uint64_t end = 0;
	butter_ino_t id;
	int ret = nodes_resolve(&d->nodes, ino, &id);

	if (ret == 0) {
		section_read(d);
		ret = butter_stat(d->fs, id, &bs);
		if (ret == 0 && !S_ISDIR(bs.mode))
			ret = -ENOTDIR;
		if (ret == 0)
			ret = butter_readdir_end(d->fs, id, &end);
		if (ret == 0)
			ret = butter_open_ref(d->fs, id);
		section_end(d);
	}
	if (ret == 0) {
		h = dir_handle_new(d, end, (fi->flags & O_NOATIME) != 0);
		if (!h) {
			release_handle(d, ino);
			ret = -ENOMEM;
		}
	}
	if (ret) {
		reply_err(req, ret);
		return;
	}
	fi->fh = (uint64_t)(uintptr_t)h;
	if (fuse_reply_open(req, fi) != 0) {
		dir_handle_free(d, h);
		release_handle(d, ino);
	}
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	dir_handle_free(D(req), (struct dir_handle *)(uintptr_t)fi->fh);
	release_handle(D(req), ino);
	fuse_reply_err(req, 0);
}

struct dir_fill {
	struct daemon *d;
	fuse_req_t req;
	butter_ino_t dir;
	bool plus;
	char *buf;
	size_t size, used;
	uint64_t *refs;    /* readdirplus: nodes whose lookup this reply counts */
	size_t nrefs;
};

/* Add "." and ".." (no lookup counted: the kernel links neither). */
static bool add_dot(struct dir_fill *f, const char *name, fuse_ino_t dirnode, off_t next)
{
	size_t room = f->size - f->used, n;

	if (f->plus) {
		struct fuse_entry_param e;

		memset(&e, 0, sizeof(e));
		e.attr.st_ino = dirnode;
		e.attr.st_mode = S_IFDIR;
		n = fuse_add_direntry_plus(f->req, f->buf + f->used, room, name, &e, next);
	} else {
		struct stat st;

		memset(&st, 0, sizeof(st));
		st.st_ino = dirnode;
		st.st_mode = S_IFDIR;
		n = fuse_add_direntry(f->req, f->buf + f->used, room, name, &st, next);
	}
	if (n > room)
		return false;
	f->used += n;
	return true;
}

static int fill_one(void *arg, const char *name, size_t namelen, butter_ino_t ino, unsigned dtype,
		    uint64_t next_pos)
{
	struct dir_fill *f = arg;
	struct daemon *d = f->d;
	char cname[NAME_MAX_BTRFS + 1];
	size_t room = f->size - f->used;
	off_t next = (off_t)(next_pos < FIRST_DIR_OFFSET ? FIRST_DIR_OFFSET : next_pos);
	uint64_t nodeid;
	int ret;

	if (namelen > NAME_MAX_BTRFS)
		return -EUCLEAN; /* the library checks names; never reached */
	memcpy(cname, name, namelen);
	cname[namelen] = '\0';

	if (!f->plus) {
		struct stat st;
		size_t n;

		ret = nodes_get(&d->nodes, ino, f->dir, name, namelen, false, &nodeid);
		if (ret)
			return ret;
		memset(&st, 0, sizeof(st));
		st.st_ino = nodeid;
		st.st_mode = dtype << 12;
		n = fuse_add_direntry(f->req, f->buf + f->used, room, cname, &st, next);
		if (n > room)
			return 1;
		f->used += n;
		return 0;
	}

	struct fuse_entry_param e;

	if (fuse_add_direntry_plus(f->req, NULL, 0, cname, NULL, next) > room)
		return 1;
	uint64_t *refs = realloc(f->refs, (f->nrefs + 1) * sizeof(*refs));

	if (!refs)
		return -ENOMEM;
	f->refs = refs;
	ret = make_entry(d, f->dir, name, namelen, ino, &e);
	if (ret == 0) {
		f->refs[f->nrefs++] = e.ino;
	} else {
		/* no attributes: the entry is listed, and a lookup of it reports the error */
		ret = nodes_get(&d->nodes, ino, f->dir, name, namelen, false, &nodeid);
		if (ret)
			return ret;
		memset(&e, 0, sizeof(e));
		e.attr.st_ino = nodeid;
		e.attr.st_mode = dtype << 12;
	}
	f->used += fuse_add_direntry_plus(f->req, f->buf + f->used, room, cname, &e, next);
	return 0;
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus,
		       struct fuse_file_info *fi)
{
	struct dir_handle *h = (struct dir_handle *)(uintptr_t)fi->fh;
	bool noatime = h->noatime;
	uint64_t end = atomic_load(&h->end);
	struct daemon *d = D(req);
	struct dir_fill f = { .d = d, .req = req, .plus = plus, .size = size };
	int ret = nodes_resolve(&d->nodes, ino, &f.dir), due = 0;

	if (ret == 0 && off < 0)
		ret = -EINVAL;
	if (ret == 0) {
		f.buf = malloc(size ? size : 1);
		if (!f.buf)
			ret = -ENOMEM;
	}
	if (ret) {
		reply_err(req, ret);
		return;
	}
	section_read(d);
	if (off == 0) { /* a listing begins (opendir, rewinddir): up to the end now */
		ret = butter_readdir_end(d->fs, f.dir, &end);
		if (ret == 0)
			atomic_store(&h->end, end);
	}
	if (ret == 0 && off == 0 && !add_dot(&f, ".", ino, 1))
		goto full;
	if (ret == 0 && off <= 1 && !add_dot(&f, "..", ino, 2))
		goto full;
	if (ret == 0)
		ret = butter_readdir_until(d->fs, f.dir, off < FIRST_DIR_OFFSET ? 0 : (uint64_t)off,
					   end, fill_one, &f);
full:
	if (ret >= 0 && !noatime)
		due = butter_atime_due(d->fs, f.dir, atime_policy(d->opts));
	section_end(d);
	touch_atime(d, ino, f.dir, due);
	if (ret < 0 && f.used == 0) {
		reply_err(req, ret);
	} else if (fuse_reply_buf(req, f.buf, f.used) != 0) {
		for (size_t i = 0; i < f.nrefs; i++)
			forget_node(d, f.refs[i], 1);
	}
	free(f.refs);
	free(f.buf);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, false, fi);
}

static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			   struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, true, fi);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	op_fsync(req, ino, datasync, fi);
}

/* ---- the filesystem ----------------------------------------------------------------- */

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct daemon *d = D(req);
	struct butter_statfs bs;
	struct statvfs sv;
	int ret;

	(void)ino;
	ret = butter_statfs(d->fs, &bs);
	if (ret) {
		reply_err(req, ret);
		return;
	}
	memset(&sv, 0, sizeof(sv));
	sv.f_bsize = bs.bsize;
	sv.f_frsize = bs.bsize;
	sv.f_blocks = bs.blocks;
	sv.f_bfree = bs.bfree;
	sv.f_bavail = bs.bavail;
	sv.f_files = bs.files;
	sv.f_ffree = bs.ffree;
	sv.f_favail = bs.ffree;
	sv.f_namemax = bs.namemax;
	fuse_reply_statfs(req, &sv);
}

/* ---- extended attributes ------------------------------------------------------------- */

/*
 * getxattr (@name) or listxattr (@name NULL): with @size 0 reply the size
 * the value or list needs, else the bytes (ERANGE when they do not fit).
 */
static void xattr_read(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct daemon *d = D(req);
	butter_ino_t id;
	char *buf = NULL;
	ssize_t n = nodes_resolve(&d->nodes, ino, &id);

	if (n == 0 && size) {
		buf = malloc(size);
		if (!buf)
			n = -ENOMEM;
	}
	if (n == 0) {
		n = name ? butter_getxattr(d->fs, id, name, buf, size)
			 : butter_listxattr(d->fs, id, buf, size);
	}
	if (n < 0)
		reply_err(req, (int)n);
	else if (size == 0)
		fuse_reply_xattr(req, (size_t)n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	xattr_read(req, ino, name, size);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	xattr_read(req, ino, NULL, size);
}

/*
 * XATTR_CREATE and XATTR_REPLACE are checked here, under the exclusive lock,
 * since butter_setxattr() always sets.
 */
/* Is the caller of @req in group @gid (its primary or a supplementary group)? */
static bool caller_in_group(fuse_req_t req, gid_t gid)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	gid_t groups[256];
	int n;

	if (ctx->gid == gid)
		return true;
	n = fuse_req_getgroups(req, 256, groups);
	for (int i = 0; i < n && i < 256; i++)
		if (groups[i] == gid)
			return true;
	return false;
}

/*
 * Does the caller of @req hold CAP_FSETID? Read from /proc: when it cannot
 * be read the answer is no, and the bits go (the safe side).
 */
static bool caller_has_fsetid(fuse_req_t req)
{
	char path[64], line[256];
	bool yes = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)fuse_req_ctx(req)->pid);
	f = fopen(path, "re");
	if (!f)
		return false;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long caps;

		if (sscanf(line, "CapEff: %llx", &caps) == 1) {
			yes = caps & (1ull << 4); /* CAP_FSETID */
			break;
		}
	}
	fclose(f);
	return yes;
}

/*
 * Clear setuid/setgid of @id where the kernel's VFS would for the caller of
 * @req (setattr_should_drop_suidgid, chown_common, posix_acl_update_mode):
 *
 *   KILL_MODIFY  a write, truncate, fallocate or copy into the file: setuid,
 *                and setgid when group-exec is set or the caller is not in
 *                the file's group; nothing when the caller holds CAP_FSETID
 *                (@fsetid: 1 holds, 0 lacks — the kernel said so by a kill
 *                flag — or -1 unknown, then /proc says);
 *   KILL_CHOWN   a change of owner or group: setuid always; setgid when
 *                group-exec is set or the caller is neither in the (old)
 *                group nor holds CAP_FSETID;
 *   KILL_ACL     an access ACL set the mode: setgid when the caller is
 *                neither in the group nor holds CAP_FSETID.
 *
 * Without FUSE_HANDLE_KILLPRIV_V2 the kernel clears what it can see itself
 * (a mode it sends in a setattr before the change) and keeps setgid without
 * group-exec, which btrfs drops for an outsider (generic/683-685): this
 * function then finds at most that bit to clear. With it (wire.c) the kernel
 * leaves all of it to us. Directories keep their bits. Called inside a
 * change section. 1 when bits went (the kernel's cached mode is stale: the
 * caller invalidates it after replying), 0, or -errno.
 */
static int kill_privs(struct daemon *d, fuse_req_t req, butter_ino_t id, enum kill_reason why,
		      int fsetid)
{
	struct butter_stat bs;
	uint32_t kill = 0;
	int ret = butter_stat(d->fs, id, &bs);

	if (ret || !(bs.mode & (S_ISUID | S_ISGID)) || (why != KILL_ACL && S_ISDIR(bs.mode)))
		return ret;
	if (why == KILL_MODIFY && fsetid < 0)
		fsetid = caller_has_fsetid(req);
	if (why == KILL_MODIFY && fsetid)
		return 0;
	if ((bs.mode & S_ISUID) && why != KILL_ACL)
		kill |= S_ISUID;
	if (bs.mode & S_ISGID) {
		if (why != KILL_ACL && (bs.mode & S_IXGRP))
			kill |= S_ISGID;
		else if (!caller_in_group(req, bs.gid) &&
			 (why == KILL_MODIFY ? true : !caller_has_fsetid(req)))
			kill |= S_ISGID;
	}
	if (!kill)
		return 0;
	bs.mode &= ~kill;
	ret = butter_setattr(d->fs, id, &bs, BUTTER_SET_MODE);
	return ret ? ret : 1;
}

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			size_t size, int flags)
{
	struct daemon *d = D(req);
	butter_ino_t id;
	int ret = nodes_resolve(&d->nodes, ino, &id);

	if (ret == 0 && (flags & ~(XATTR_CREATE | XATTR_REPLACE)))
		ret = -EINVAL;
	if (ret == 0) {
		section_change(d);
		if (flags) {
			ssize_t have = butter_getxattr(d->fs, id, name, NULL, 0);

			if (have >= 0 && (flags & XATTR_CREATE))
				ret = -EEXIST;
			else if (have == -ENODATA && (flags & XATTR_REPLACE))
				ret = -ENODATA;
			else if (have < 0 && have != -ENODATA)
				ret = (int)have;
		}
		if (ret == 0)
			ret = butter_setxattr(d->fs, id, name, value, size);
		if (ret == 0 && d->posix_acl && strcmp(name, "system.posix_acl_access") == 0)
			ret = kill_privs(d, req, id, KILL_ACL, -1);
		if (ret > 0)
			ret = 0;
		section_end(d);
	}
	if (ret == -E2BIG)
		ret = -ENOSPC; /* too big for a leaf: what the kernel's btrfs answers */
	reply_err(req, ret);
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct daemon *d = D(req);
	butter_ino_t id;
	int ret = nodes_resolve(&d->nodes, ino, &id);

	if (ret == 0) {
		daemon_note_change(d);
		ret = butter_removexattr(d->fs, id, name);
	}
	reply_err(req, ret);
}

const struct fuse_lowlevel_ops butter_fuse_ops = {
	.init = op_init,
	.lookup = op_lookup,
	.forget = op_forget,
	.forget_multi = op_forget_multi,
	.getattr = op_getattr,
	.setattr = op_setattr,
	.readlink = op_readlink,
	.mknod = op_mknod,
	.mkdir = op_mkdir,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.symlink = op_symlink,
	.rename = op_rename,
	.link = op_link,
	.open = op_open,
	.read = op_read,
	.write = op_write,
	/*
	 * No .flush: data reaches the library at each write (the kernel writes
	 * back its cached pages at close before it would send FLUSH), so a close
	 * has nothing to push. libfuse answers ENOSYS, and the kernel stops
	 * sending FLUSH: one round trip less per close.
	 */
	.release = op_release,
	.fsync = op_fsync,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.readdirplus = op_readdirplus,
	.releasedir = op_releasedir,
	.fsyncdir = op_fsyncdir,
	.statfs = op_statfs,
	.setxattr = op_setxattr,
	.getxattr = op_getxattr,
	.listxattr = op_listxattr,
	.removexattr = op_removexattr,
	.create = op_create,
	.lseek = op_lseek,
	.ioctl = butter_fuse_ioctl,
	.fallocate = op_fallocate,
	.copy_file_range = op_copy_file_range,
};
