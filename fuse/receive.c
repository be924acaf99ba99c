/*
 * receive.c — the daemon's receive (BUTTER_IOC_RECEIVE): `butter receive
 * DIR-IN-MOUNT` hands the daemon the read end of a pipe it writes the send
 * stream into; a thread of the daemon runs butter_receive() into DIR reading
 * that pipe, so no request worker waits for the sender (the library lets
 * its lock go while it reads: the mount serves everything else meanwhile).
 *
 * The pipe: the caller names its fd number; the daemon opens
 * /proc/PID/fd/N of the calling process (the pid FUSE gives with the
 * request) and accepts only a pipe, so it reads nothing the caller could
 * not. At the end (the pipe's end, an error, or unmount) the thread closes
 * it, and the names the receive added to DIR are dropped from the kernel's
 * cache, which may hold them as missing.
 *
 * Locking: struct receiving's fields are protected by its mutex, never held
 * across a library call or a read. One receive at a time.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <butter/control.h>

#include "daemon.h"

struct receiving {
	pthread_mutex_t lock;
	pthread_t thread;
	bool joinable;           /* a thread was started and not joined */
	uint64_t id;             /* of the running or last receive; 0: none yet */
	unsigned state;          /* BUTTER_RECEIVE_STATE_* */
	int error;
	uint64_t bytes;
	struct butter_receive_result result;
	int fd;                  /* the caller's pipe, while running */
	int wake[2];             /* a pipe: unmount wakes a read waiting for the sender */
	fuse_ino_t dir_node;     /* DIR, its node id (the caller holds it open) */
	butter_ino_t dir;
	uint64_t dir_end;        /* DIR's end of entries before: new names come after it */
	unsigned flags;          /* butter_receive_flags()'s */
	struct daemon *d;
};

/* The library's read: from the pipe, unless unmount comes first. */
static ssize_t read_pipe(void *arg, void *buf, size_t len)
{
	struct receiving *r = arg;
	struct pollfd p[2] = { { .fd = r->fd, .events = POLLIN }, { .fd = r->wake[0], .events = POLLIN } };
	ssize_t n;

	for (;;) {
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (p[1].revents)
			return -ECANCELED; /* the mount is going away */
		n = read(r->fd, buf, len);
		if (n >= 0)
			break;
		if (errno != EINTR && errno != EAGAIN)
			return -errno;
	}
	pthread_mutex_lock(&r->lock);
	r->bytes += (uint64_t)n;
	pthread_mutex_unlock(&r->lock);
	return n;
}

struct new_names {
	char **names;
	size_t n, cap;
	int error;
};

static int collect_name(void *arg, const char *name, size_t namelen, butter_ino_t ino,
			unsigned dtype, uint64_t next_pos)
{
	struct new_names *nn = arg;
	char **grown;

	(void)ino;
	(void)dtype;
	(void)next_pos;
	if (nn->n == nn->cap) {
		nn->cap = nn->cap ? 2 * nn->cap : 8;
		grown = realloc(nn->names, nn->cap * sizeof(*grown));
		if (!grown)
			return nn->error = -ENOMEM;
		nn->names = grown;
	}
	nn->names[nn->n] = strndup(name, namelen);
	if (!nn->names[nn->n])
		return nn->error = -ENOMEM;
	nn->n++;
	return 0;
}

/* Drop the names added to DIR since the start from the kernel's cache (and DIR's attributes). */
static void forget_new_names(struct receiving *r)
{
	struct new_names nn = { 0 };
	uint64_t end;

	if (butter_readdir_end(r->d->fs, r->dir, &end) == 0)
		butter_readdir_until(r->d->fs, r->dir, r->dir_end, end, collect_name, &nn);
	for (size_t i = 0; i < nn.n; i++) {
		fuse_lowlevel_notify_inval_entry(r->d->se, r->dir_node, nn.names[i],
						 strlen(nn.names[i]));
		free(nn.names[i]);
	}
	free(nn.names);
	fuse_lowlevel_notify_inval_inode(r->d->se, r->dir_node, -1, 0);
}

static void *receive_main(void *arg)
{
	struct receiving *r = arg;
	struct butter_receive_result result = { 0, 0 };
	int ret;

	ret = butter_receive_flags(r->d->fs, r->dir, r->flags, read_pipe, r, &result);
	close(r->fd); /* the sender's writes fail now, if it still writes */
	forget_new_names(r);
	if (ret < 0)
		daemon_log(r->d, BUTTER_LOG_ERROR, "receive stopped: %s", strerror(-ret));
	else
		daemon_log(r->d, BUTTER_LOG_INFO, "received %llu subvolume(s)",
			   (unsigned long long)result.subvolumes);
	pthread_mutex_lock(&r->lock);
	r->fd = -1;
	r->error = ret < 0 ? ret : 0;
	r->result = result;
	r->state = BUTTER_RECEIVE_STATE_DONE;
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

static struct receiving *receiving_of(struct daemon *d)
{
	struct receiving *r;

	pthread_mutex_lock(&d->receiving_lock);
	if (!d->receiving) {
		r = calloc(1, sizeof(*r));
		if (r && pipe2(r->wake, O_CLOEXEC) != 0) {
			free(r);
			r = NULL;
		}
		if (r) {
			pthread_mutex_init(&r->lock, NULL);
			r->fd = -1;
			r->d = d;
			d->receiving = r;
		}
	}
	r = d->receiving;
	pthread_mutex_unlock(&d->receiving_lock);
	return r;
}

/* The caller's pipe, opened through /proc: fd, or -errno. */
static int open_callers_pipe(pid_t pid, int fd)
{
	char path[64];
	struct stat st;
	int opened;

	if (pid <= 0 || fd < 0)
		return -EBADF; /* a caller outside the daemon's pid namespace has no pid here */
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
	opened = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (opened < 0)
		return errno == ENOENT ? -EBADF : -errno;
	if (fstat(opened, &st) != 0 || !S_ISFIFO(st.st_mode)) {
		close(opened);
		return -EBADF;
	}
	return opened;
}

static int start(struct receiving *r, fuse_req_t req, fuse_ino_t ino, int caller_fd,
		 unsigned flags)
{
	struct daemon *d = r->d;
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	butter_ino_t dir;
	uint64_t end;
	int fd, ret;

	if (flags & ~BUTTER_RECEIVE_END_STOPS)
		return -EINVAL;
	if (ctx->uid != 0)
		return -EPERM;
	if (d->readonly)
		return -EROFS;
	ret = nodes_resolve(&d->nodes, ino, &dir);
	if (ret == 0)
		ret = butter_readdir_end(d->fs, dir, &end); /* also: -ENOTDIR */
	if (ret)
		return ret;
	fd = open_callers_pipe(ctx->pid, caller_fd);
	if (fd < 0)
		return fd;
	pthread_mutex_lock(&r->lock);
	if (r->state == BUTTER_RECEIVE_STATE_RUNNING) {
		pthread_mutex_unlock(&r->lock);
		close(fd);
		return -EINPROGRESS;
	}
	if (r->joinable) {
		pthread_join(r->thread, NULL); /* the last one has ended */
		r->joinable = false;
	}
	r->id++;
	r->state = BUTTER_RECEIVE_STATE_RUNNING;
	r->error = 0;
	r->bytes = 0;
	memset(&r->result, 0, sizeof(r->result));
	r->fd = fd;
	r->dir_node = ino;
	r->dir = dir;
	r->dir_end = end;
	r->flags = flags;
	ret = -pthread_create(&r->thread, NULL, receive_main, r);
	r->joinable = ret == 0;
	if (ret) {
		r->state = BUTTER_RECEIVE_STATE_DONE;
		r->error = ret;
		r->fd = -1;
		close(fd);
	}
	pthread_mutex_unlock(&r->lock);
	return ret;
}

int receiving_ioctl(struct daemon *d, fuse_req_t req, fuse_ino_t ino, struct butter_ioc_receive *io)
{
	struct receiving *r = receiving_of(d);
	int ret = 0;

	if (!r)
		return -ENOMEM;
	if (io->cmd == BUTTER_RECEIVE_CMD_START)
		ret = start(r, req, ino, io->fd, io->flags);
	else if (io->cmd != BUTTER_RECEIVE_CMD_STATUS)
		return -EINVAL;
	if (ret)
		return ret;
	pthread_mutex_lock(&r->lock);
	if (io->cmd == BUTTER_RECEIVE_CMD_START)
		io->id = r->id;
	else if (io->id != r->id || r->id == 0)
		ret = -ESRCH;
	io->state = r->state;
	io->error = r->error;
	io->bytes = r->bytes;
	io->subvolumes = r->result.subvolumes;
	io->last_subvol = r->result.last_subvol;
	pthread_mutex_unlock(&r->lock);
	return ret;
}

void receiving_stop(struct daemon *d)
{
	struct receiving *r;
	char one = 1;

	pthread_mutex_lock(&d->receiving_lock);
	r = d->receiving;
	d->receiving = NULL;
	pthread_mutex_unlock(&d->receiving_lock);
	if (!r)
		return;
	if (write(r->wake[1], &one, 1) < 0) {
		/* a pipe with room for a byte: cannot fail */
	}
	if (r->joinable)
		pthread_join(r->thread, NULL);
	close(r->wake[0]);
	close(r->wake[1]);
	pthread_mutex_destroy(&r->lock);
	free(r);
}
