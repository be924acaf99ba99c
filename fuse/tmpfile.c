/*
 * tmpfile.c — open(2) with O_TMPFILE through the mount: the FUSE_TMPFILE
 * request (protocol 7.37), which libfuse 3.14 does not pass on (it answers
 * ENOSYS, and the kernel then refuses every O_TMPFILE open with
 * EOPNOTSUPP).
 *
 * butter's own request loops (pollloop.c, and uring.c for requests of its
 * ring) hand every request read into memory to butter_fuse_raw_request()
 * first. For FUSE_TMPFILE this parses the request (fuse_in_header,
 * fuse_create_in, the name "/" the kernel sends), creates the nameless file
 * (ops.c, butter_fuse_tmpfile: an orphan counted open once,
 * lib/namespace/orphan.c) and writes the reply itself through wire.c (a
 * request of the ring is answered in its entry), laid out as the reply to
 * FUSE_CREATE: fuse_out_header, fuse_entry_out, fuse_open_out. Every other
 * request goes on to libfuse. A linkat() of the file later arrives as an
 * ordinary FUSE_LINK and gives it its name. libfuse's own loops (-o spin=0,
 * -s) never come here: O_TMPFILE stays EOPNOTSUPP there.
 */
#include <errno.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
#include <linux/fuse.h>

#include "daemon.h"

static void to_fuse_attr(const struct stat *st, struct fuse_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->ino = st->st_ino;
	a->size = (uint64_t)st->st_size;
	a->blocks = (uint64_t)st->st_blocks;
	a->atime = (uint64_t)st->st_atim.tv_sec;
	a->mtime = (uint64_t)st->st_mtim.tv_sec;
	a->ctime = (uint64_t)st->st_ctim.tv_sec;
	a->atimensec = (uint32_t)st->st_atim.tv_nsec;
	a->mtimensec = (uint32_t)st->st_mtim.tv_nsec;
	a->ctimensec = (uint32_t)st->st_ctim.tv_nsec;
	a->mode = st->st_mode;
	a->nlink = (uint32_t)st->st_nlink;
	a->uid = st->st_uid;
	a->gid = st->st_gid;
	a->rdev = (uint32_t)st->st_rdev;
	a->blksize = (uint32_t)st->st_blksize;
}

/* Seconds and nanoseconds of a timeout in seconds, as libfuse splits them. */
static void split_timeout(double t, uint64_t *sec, uint32_t *nsec)
{
	if (t <= 0) {
		*sec = 0;
		*nsec = 0;
		return;
	}
	*sec = (uint64_t)t;
	*nsec = (uint32_t)((t - (double)*sec) * 1.0e9);
}

/* Write a reply of @n parts (after the header) for request @unique; 0 or -errno. */
static int reply(struct daemon *d, uint64_t unique, int error, struct iovec *iov, int n)
{
	struct fuse_out_header out = { .error = error, .unique = unique };
	size_t len = sizeof(out);
	ssize_t w;

	iov[0].iov_base = &out;
	iov[0].iov_len = sizeof(out);
	for (int i = 1; i < n; i++)
		len += iov[i].iov_len;
	out.len = (uint32_t)len;
	w = wire_send(&d->wire, fuse_session_fd(d->se), iov, n); /* a ring's request: its entry */
	return w == (ssize_t)len ? 0 : w < 0 ? -errno : -EIO;
}

bool butter_fuse_raw_request(void *daemon, const void *req, size_t len)
{
	struct daemon *d = daemon;
	const struct fuse_in_header *in = req;
	const struct fuse_create_in *arg;
	struct fuse_entry_param e;
	struct fuse_entry_out eo;
	struct fuse_open_out oo;
	struct iovec iov[3];
	int ret;

	if (len < sizeof(*in) || in->opcode != FUSE_TMPFILE)
		return false;
	if (len < sizeof(*in) + sizeof(*arg)) {
		reply(d, in->unique, -EINVAL, iov, 1);
		return true;
	}
	arg = (const void *)(in + 1);
	ret = butter_fuse_tmpfile(d, in->nodeid, arg->mode, in->uid, in->gid, arg->umask, &e);
	if (ret) {
		reply(d, in->unique, ret, iov, 1);
		return true;
	}
	memset(&eo, 0, sizeof(eo));
	eo.nodeid = e.ino;
	eo.generation = e.generation;
	split_timeout(e.entry_timeout, &eo.entry_valid, &eo.entry_valid_nsec);
	split_timeout(e.attr_timeout, &eo.attr_valid, &eo.attr_valid_nsec);
	to_fuse_attr(&e.attr, &eo.attr);
	memset(&oo, 0, sizeof(oo)); /* fh 0, as every open of the mount */
	iov[1].iov_base = &eo;
	iov[1].iov_len = sizeof(eo);
	iov[2].iov_base = &oo;
	iov[2].iov_len = sizeof(oo);
	if (reply(d, in->unique, 0, iov, 3) != 0)
		butter_fuse_tmpfile_unref(d, e.ino);
	return true;
}
