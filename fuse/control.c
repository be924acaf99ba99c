/*
 * control.c — the daemon's side of <butter/control.h>: ioctls on files and
 * directories of the mount that manage subvolumes and the filesystem.
 *
 * Every request has the fixed size its command encodes (the kernel copies
 * exactly that much in and out); a request of another size, or an unknown
 * command, is ENOTTY, as for any file that does not know an ioctl. Changes
 * (create, snapshot, delete, sync, label) need a read-write mount; the
 * library serialises each call itself (its lock, butter.h). After a name
 * appears or disappears in a directory the kernel's cached entry for it is
 * dropped (notify_inval_entry, which drops the directory's attributes too:
 * mtime, size, nlink), so the mount shows the change at once.
 *
 * chattr(1) and lsattr(1) reach here too: the kernel's FUSE turns
 * FS_IOC_GETFLAGS/SETFLAGS and FS_IOC_FSGETXATTR/FSSETXATTR into ioctls of
 * the daemon (fuse_fileattr_get/set), after checking who may change which
 * flag itself (owner; CAP_LINUX_IMMUTABLE for +i and +a). They are answered
 * from butter_get_fileattr()/butter_set_fileattr() with btrfs's meaning; the
 * xflags of FSGETXATTR are the five btrfs shows there, and an xflag, extent
 * size or project id beyond them is EOPNOTSUPP, as on btrfs.
 */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <linux/fs.h>

#include <butter/control.h>

#include "daemon.h"

/* The xflags btrfs shows and takes through FS_IOC_FSGETXATTR/FSSETXATTR, and their flags. */
static const struct {
	uint32_t xflag, fl;
} xflag_map[] = {
	{ FS_XFLAG_IMMUTABLE, BUTTER_FL_IMMUTABLE },
	{ FS_XFLAG_APPEND, BUTTER_FL_APPEND },
	{ FS_XFLAG_SYNC, BUTTER_FL_SYNC },
	{ FS_XFLAG_NOATIME, BUTTER_FL_NOATIME },
	{ FS_XFLAG_NODUMP, BUTTER_FL_NODUMP },
};
#define NXFLAGS (sizeof(xflag_map) / sizeof(xflag_map[0]))

/*
 * FS_IOC_GETFLAGS, _SETFLAGS, _FSGETXATTR, _FSSETXATTR on @id (the kernel
 * sends the flags as 4 bytes; a long's 8 are taken too). Fills @out (*@outlen
 * bytes) for the GETs. 0 or a negative errno; -ENOTTY for a size not theirs.
 */
static int fileattr_ioctl(struct daemon *d, butter_ino_t id, unsigned cmd, const void *in,
			  size_t in_size, size_t out_size, void *out, size_t *outlen)
{
	struct fsxattr fx;
	uint32_t fl = 0, old;
	size_t i;
	int ret;

	*outlen = 0;
	switch (cmd) {
	case FS_IOC_GETFLAGS:
		if (out_size != 4 && out_size != 8)
			return -ENOTTY;
		ret = butter_get_fileattr(d->fs, id, &fl);
		if (ret == 0) {
			uint64_t wide = fl;

			if (out_size == 8)
				memcpy(out, &wide, 8);
			else
				memcpy(out, &fl, 4);
			*outlen = out_size;
		}
		return ret;
	case FS_IOC_SETFLAGS:
		if (in_size != 4 && in_size != 8)
			return -ENOTTY;
		memcpy(&fl, in, 4); /* little-endian: a long's low half comes first */
		return d->readonly ? -EROFS : butter_set_fileattr(d->fs, id, fl);
	case FS_IOC_FSGETXATTR:
		if (out_size != sizeof(fx))
			return -ENOTTY;
		ret = butter_get_fileattr(d->fs, id, &fl);
		if (ret)
			return ret;
		memset(&fx, 0, sizeof(fx));
		for (i = 0; i < NXFLAGS; i++)
			if (fl & xflag_map[i].fl)
				fx.fsx_xflags |= xflag_map[i].xflag;
		memcpy(out, &fx, sizeof(fx));
		*outlen = sizeof(fx);
		return 0;
	case FS_IOC_FSSETXATTR:
		if (in_size != sizeof(fx))
			return -ENOTTY;
		memcpy(&fx, in, sizeof(fx));
		{
			uint32_t known = 0;

			for (i = 0; i < NXFLAGS; i++)
				known |= xflag_map[i].xflag;
			if ((fx.fsx_xflags & ~known) || fx.fsx_extsize || fx.fsx_projid ||
			    fx.fsx_cowextsize)
				return -EOPNOTSUPP;
		}
		ret = butter_get_fileattr(d->fs, id, &old);
		if (ret)
			return ret;
		/* the flags xflags cannot say (compression, nocow) stay as they are */
		fl = old;
		for (i = 0; i < NXFLAGS; i++)
			fl = (fx.fsx_xflags & xflag_map[i].xflag) ? fl | xflag_map[i].fl
								  : fl & ~xflag_map[i].fl;
		fl &= ~BUTTER_FL_VERITY;
		return d->readonly ? -EROFS : butter_set_fileattr(d->fs, id, fl);
	}
	return -ENOTTY;
}

static bool is_fileattr_cmd(unsigned cmd)
{
	return cmd == FS_IOC_GETFLAGS || cmd == FS_IOC_SETFLAGS || cmd == FS_IOC_FSGETXATTR ||
	       cmd == FS_IOC_FSSETXATTR;
}

/* Copy @src into the fixed buffer @dst of @cap bytes, NUL-terminated; -ENAMETOOLONG if cut. */
static int copy_str(char *dst, size_t cap, const char *src)
{
	size_t n = strlen(src);

	if (n >= cap)
		return -ENAMETOOLONG;
	memcpy(dst, src, n + 1);
	return 0;
}

/* The request's name field: NUL-terminated, a single component. */
static int check_req_name(const struct butter_ioc_subvol *s, size_t *len)
{
	*len = strnlen(s->name, sizeof(s->name));
	if (*len == sizeof(s->name))
		return -ENAMETOOLONG;
	if (*len == 0 || memchr(s->name, '/', *len) || !strcmp(s->name, ".") ||
	    !strcmp(s->name, ".."))
		return -EINVAL;
	return 0;
}

struct next_ctx {
	uint64_t start;
	struct butter_ioc_subvol_next *out;
	int found, err;
};

static int take_first(void *arg, const struct butter_subvol_info *info)
{
	struct next_ctx *c = arg;

	if (info->id < c->start)
		return 0;
	c->out->id = info->id;
	c->out->parent = info->parent_id;
	c->out->generation = info->generation;
	c->out->otransid = info->otransid;
	c->out->flags = info->flags;
	memcpy(c->out->uuid, info->uuid, 16);
	memcpy(c->out->parent_uuid, info->parent_uuid, 16);
	memcpy(c->out->received_uuid, info->received_uuid, 16);
	c->err = copy_str(c->out->path, sizeof(c->out->path), info->path);
	c->found = 1;
	return 1; /* stop */
}

static int do_subvol_change(struct daemon *d, unsigned cmd, fuse_ino_t dirnode,
			    struct butter_ioc_subvol *s)
{
	butter_ino_t dir;
	size_t len;
	int ret = check_req_name(s, &len);

	if (ret == 0 && d->readonly)
		ret = -EROFS;
	if (ret == 0)
		ret = nodes_resolve(&d->nodes, dirnode, &dir);
	if (ret)
		return ret;
	daemon_note_change(d);
	if (cmd == (unsigned)BUTTER_IOC_SUBVOL_CREATE)
		ret = butter_subvol_create(d->fs, dir, s->name, len, &s->id);
	else if (cmd == (unsigned)BUTTER_IOC_SNAPSHOT)
		ret = butter_snapshot(d->fs, s->src_subvol, dir, s->name, len, (unsigned)s->flags,
				      &s->id);
	else
		ret = butter_subvol_delete(d->fs, dir, s->name, len);
	return ret;
}

/* BUTTER_IOC_FSYNC: the files as (subvolume, inode) pairs, logged in one go. */
static int do_fsync_many(struct daemon *d, const struct butter_ioc_fsync *f)
{
	butter_ino_t inos[BUTTER_IOC_FSYNC_MAX];
	uint32_t i;
	int ret;

	if (f->count == 0 || f->count > BUTTER_IOC_FSYNC_MAX || (f->flags & ~BUTTER_FSYNC_DATA))
		return -EINVAL;
	if (d->readonly)
		return 0;
	for (i = 0; i < f->count; i++) {
		inos[i].subvol = f->inos[i].subvol;
		inos[i].ino = f->inos[i].ino;
	}
	ret = butter_fsync_many(d->fs, inos, f->count, !!(f->flags & BUTTER_FSYNC_DATA));
	return ret;
}

/* BUTTER_IOC_DEV_STATS: one device's counters; a reset is committed at once. */
static int do_dev_stats(struct daemon *d, struct butter_ioc_dev_stats *s)
{
	struct butter_device_stats st;
	unsigned flags = (unsigned)s->flags;
	int k, ret;

	if (s->flags & ~(uint64_t)BUTTER_DEV_STATS_RESET)
		return -EINVAL;
	if ((flags & BUTTER_DEV_STATS_RESET) && d->readonly)
		return -EROFS;
	/* one section: the reset and its commit together, and st.path is the handle's */
	ret = butter_lock(d->fs, !!(flags & BUTTER_DEV_STATS_RESET));
	if (ret)
		return ret;
	ret = butter_device_stats(d->fs, (size_t)s->idx, flags, &st);
	if (ret == 0 && (flags & BUTTER_DEV_STATS_RESET))
		ret = butter_sync(d->fs);
	if (ret == 0)
		ret = copy_str(s->path, sizeof(s->path), st.path ? st.path : "");
	butter_unlock(d->fs);
	if (ret)
		return ret;
	s->devid = st.devid;
	s->nr_items = BUTTER_DEV_STAT_NR;
	for (k = 0; k < BUTTER_DEV_STAT_NR; k++)
		s->values[k] = st.values[k];
	return 0;
}

void butter_fuse_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg,
		       struct fuse_file_info *fi, unsigned flags, const void *in_buf,
		       size_t in_bufsz, size_t out_bufsz)
{
	struct daemon *d = fuse_req_userdata(req);
	union {
		struct butter_ioc_info info;
		struct butter_ioc_subvol subvol;
		struct butter_ioc_subvol_next next;
		struct butter_ioc_fs_info fs;
		struct butter_ioc_space space;
		struct butter_ioc_label label;
		struct butter_ioc_scrub scrub;
		struct butter_ioc_fsync fsync;
		struct butter_ioc_daemon_info daemon;
		struct butter_ioc_remount remount;
		struct butter_ioc_dev_stats dev_stats;
		struct butter_ioc_balance balance;
		struct butter_ioc_device device;
		struct butter_ioc_defrag defrag;
		struct butter_ioc_layout layout;
		struct butter_ioc_subvol_get sget;
		struct butter_ioc_subvol_set sset;
		struct butter_ioc_file_extents extents;
		struct butter_ioc_receive receive;
	} u;
	size_t size = _IOC_SIZE(cmd), out = 0;
	int ret = 0, inval = 0;

	(void)arg;
	(void)fi;
	if (flags & FUSE_IOCTL_COMPAT) {
		fuse_reply_err(req, ENOTTY);
		return;
	}
	if (btrfs_ioctl_answer(req, ino, cmd, in_buf, in_bufsz, out_bufsz))
		return;
	if (is_fileattr_cmd(cmd)) {
		unsigned char buf[sizeof(struct fsxattr) + 8];
		butter_ino_t id;

		ret = nodes_resolve(&d->nodes, ino, &id);
		if (ret == 0)
			ret = fileattr_ioctl(d, id, cmd, in_buf, in_bufsz, out_bufsz, buf, &out);
		if (ret < 0) {
			fuse_reply_err(req, -ret);
			return;
		}
		fuse_reply_ioctl(req, 0, out ? buf : NULL, out);
		if (cmd == FS_IOC_SETFLAGS || cmd == FS_IOC_FSSETXATTR)
			fuse_lowlevel_notify_inval_inode(d->se, ino, -1, 0); /* the new ctime */
		return;
	}
	if (_IOC_TYPE(cmd) != BUTTER_IOC_MAGIC || size > sizeof(u) ||
	    ((_IOC_DIR(cmd) & _IOC_WRITE) && in_bufsz != size) ||
	    ((_IOC_DIR(cmd) & _IOC_READ) && out_bufsz != size)) {
		fuse_reply_err(req, ENOTTY);
		return;
	}
	memset(&u, 0, sizeof(u));
	if (in_bufsz)
		memcpy(&u, in_buf, in_bufsz);
	switch (cmd) {
	case BUTTER_IOC_INFO: {
		butter_ino_t id;

		ret = nodes_resolve(&d->nodes, ino, &id);
		u.info.version = BUTTER_IOC_VERSION;
		u.info.subvol = id.subvol;
		u.info.ino = id.ino;
		out = sizeof(u.info);
		break;
	}
	case BUTTER_IOC_SUBVOL_CREATE:
	case BUTTER_IOC_SNAPSHOT:
	case BUTTER_IOC_SUBVOL_DELETE:
		ret = do_subvol_change(d, cmd, ino, &u.subvol);
		out = cmd == (unsigned)BUTTER_IOC_SUBVOL_DELETE ? 0 : sizeof(u.subvol);
		inval = ret == 0;
		break;
	case BUTTER_IOC_SUBVOL_NEXT: {
		struct butter_ioc_subvol_next *n = &u.next;
		struct next_ctx c = { n->id, n, 0, 0 };

		ret = butter_subvol_list(d->fs, take_first, &c);
		if (ret >= 0)
			ret = c.err ? c.err : c.found ? 0 : -ENOENT;
		out = sizeof(*n);
		break;
	}
	case BUTTER_IOC_SUBVOL_GET:
	case BUTTER_IOC_SUBVOL_SET: {
		uint64_t id = cmd == (unsigned)BUTTER_IOC_SUBVOL_GET ? u.sget.id : u.sset.id;
		struct butter_info bi;
		butter_ino_t at;

		if (id == 0) { /* the subvolume holding the fd */
			ret = nodes_resolve(&d->nodes, ino, &at);
			id = at.subvol;
		}
		if (ret == 0 && cmd == (unsigned)BUTTER_IOC_SUBVOL_GET) {
			ret = butter_subvol_get(d->fs, id, &u.sget.info);
			if (ret == 0)
				ret = butter_get_info(d->fs, &bi);
			if (ret == 0)
				u.sget.default_id = bi.default_subvol;
			out = sizeof(u.sget);
		} else if (ret == 0) {
			ret = d->readonly ? -EROFS
			      : u.sset.what == BUTTER_SUBVOL_SET_DEFAULT ? butter_subvol_set_default(d->fs, id)
			      : u.sset.what == BUTTER_SUBVOL_SET_READONLY && u.sset.value <= 1
				      ? butter_subvol_set_readonly(d->fs, id, (int)u.sset.value)
				      : -EINVAL;
		}
		break;
	}
	case BUTTER_IOC_SYNC:
		ret = d->readonly ? 0 : butter_sync(d->fs);
		if (ret)
			daemon_commit_failed(d, ret);
		break;
	case BUTTER_IOC_REMOUNT:
		if (u.remount.flags & ~BUTTER_REMOUNT_RDONLY)
			ret = -EINVAL;
		else
			ret = daemon_remount(d, u.remount.flags & BUTTER_REMOUNT_RDONLY);
		break;
	case BUTTER_IOC_DAEMON_INFO: {
		struct butter_info bi;
		struct stat ns;

		ret = butter_get_info(d->fs, &bi);
		u.daemon.version = BUTTER_IOC_VERSION;
		u.daemon.flags = (d->readonly ? BUTTER_DAEMON_READONLY : 0) |
				 (atomic_load(&d->commit_failed) ? BUTTER_DAEMON_FAILED : 0);
		u.daemon.pid = (uint64_t)getpid();
		u.daemon.pidns = stat("/proc/self/ns/pid", &ns) == 0 ? (uint64_t)ns.st_ino : 0;
		u.daemon.generation = ret == 0 ? bi.generation : 0;
		out = sizeof(u.daemon);
		break;
	}
	case BUTTER_IOC_FS_INFO: {
		struct butter_info bi;

		ret = butter_get_info(d->fs, &bi);
		if (ret == 0) {
			ret = copy_str(u.fs.label, sizeof(u.fs.label), bi.label);
			memcpy(u.fs.fsid, bi.fsid, 16);
			u.fs.generation = bi.generation;
			u.fs.total_bytes = bi.total_bytes;
			u.fs.bytes_used = bi.bytes_used;
			u.fs.num_devices = bi.num_devices;
			u.fs.nodesize = bi.nodesize;
			u.fs.sectorsize = bi.sectorsize;
			u.fs.csum_type = bi.csum_type;
		}
		out = sizeof(u.fs);
		break;
	}
	case BUTTER_IOC_SPACE: {
		struct butter_space_info si;

		ret = butter_get_space(d->fs, (size_t)u.space.idx, &si);
		u.space.flags = si.flags;
		u.space.total = si.total;
		u.space.used = si.used;
		out = sizeof(u.space);
		break;
	}
	case BUTTER_IOC_SCRUB:
		ret = scrubber_ioctl(d, &u.scrub);
		out = sizeof(u.scrub);
		break;
	case BUTTER_IOC_SET_LABEL:
		if (strnlen(u.label.label, sizeof(u.label.label)) == sizeof(u.label.label)) {
			ret = -EINVAL;
			break;
		}
		ret = d->readonly ? -EROFS : butter_set_label(d->fs, u.label.label);
		break;
	case BUTTER_IOC_FSYNC:
		ret = do_fsync_many(d, &u.fsync);
		break;
	case BUTTER_IOC_DEV_STATS:
		ret = do_dev_stats(d, &u.dev_stats);
		out = sizeof(u.dev_stats);
		break;
	case BUTTER_IOC_BALANCE:
		ret = balancer_ioctl(d, &u.balance);
		out = sizeof(u.balance);
		break;
	case BUTTER_IOC_DEVICE:
		ret = balancer_device_ioctl(d, &u.device);
		break;
	case BUTTER_IOC_DEFRAG: {
		butter_ino_t id;

		ret = d->readonly ? -EROFS : nodes_resolve(&d->nodes, ino, &id);
		memset(&u.defrag.stats, 0, sizeof(u.defrag.stats));
		if (ret == 0)
			ret = butter_defrag(d->fs, id, &u.defrag.args, &u.defrag.stats);
		out = sizeof(u.defrag);
		break;
	}
	case BUTTER_IOC_LAYOUT:
		if (u.layout.count < 1 || u.layout.count > BUTTER_IOC_LAYOUT_MAX ||
		    (u.layout.flags & ~BUTTER_LAYOUT_CONTINUE))
			ret = -EINVAL;
		else
			ret = d->readonly ? -EROFS
					  : butter_layout(d->fs, u.layout.ranges, u.layout.count,
							  u.layout.flags, &u.layout.stats);
		out = sizeof(u.layout);
		break;
	case BUTTER_IOC_RECEIVE:
		ret = receiving_ioctl(d, req, ino, &u.receive);
		out = sizeof(u.receive);
		break;
	case BUTTER_IOC_FILE_EXTENTS: {
		butter_ino_t id;
		size_t got = 0;

		ret = nodes_resolve(&d->nodes, ino, &id);
		if (ret == 0)
			ret = butter_file_extents(d->fs, id, u.extents.start, u.extents.extents,
						  BUTTER_IOC_EXTENTS_MAX, &got);
		u.extents.count = (uint32_t)got;
		out = sizeof(u.extents);
		break;
	}
	default:
		fuse_reply_err(req, ENOTTY);
		return;
	}
	if (ret < 0) {
		fuse_reply_err(req, -ret);
		return;
	}
	fuse_reply_ioctl(req, 0, out ? &u : NULL, out);
	if (inval) /* also drops the directory's attributes; see options.c */
		fuse_lowlevel_notify_inval_entry(d->se, ino, u.subvol.name, strlen(u.subvol.name));
}
