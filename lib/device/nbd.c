/*
 * nbd.c — the device backend for network block devices: an NBD export named
 * by a URI (nbd://host[:port]/export, nbds://, nbd+unix:///export?socket=PATH,
 * nbd+vsock://), spoken to through libnbd, the NBD project's client library.
 * No kernel nbd module and no root are needed.
 *
 * Contract (device.h) and how it is kept here:
 *  - read/write: a request is cut into pieces of at most piece_bytes (the
 *    server's maximum block size, at most 4 MiB) and up to MAX_IN_FLIGHT
 *    pieces are on the wire at once (libnbd's asynchronous calls), so one
 *    large transfer keeps the link busy. A range not aligned to the
 *    server's minimum block size is read (and written back) whole blocks at
 *    a time.
 *  - flush: NBD_CMD_FLUSH when the server offers it. A server that offers
 *    no flush has no volatile cache to flush (the protocol's meaning), so
 *    a completed write is durable and flush does nothing; a server that
 *    offers FUA and no flush gets every write with FUA.
 *  - Concurrency: libnbd handles are not shared between callers here. A
 *    server that advertises multi-conn (a flush on one connection covers
 *    writes completed on all) gets up to MAX_CONNS connections, one per
 *    concurrent caller; otherwise one connection, and callers take turns.
 *  - Failure: a server error answers that request with its errno (the
 *    connection stays up: nbdkit's error filter, a bad sector). A request
 *    not answered within the timeout (BUTTER_NBD_TIMEOUT seconds in the
 *    environment, default 30), a lost connection or a protocol error make
 *    the device dead: its connections are closed, the message names the
 *    URI, and every later request fails at once with -EIO — never a hang.
 *    Above it, a failed write aborts the transaction and the filesystem
 *    turns read-only; reads of mirrored or parity data go on from the
 *    other devices, as for a failed disk.
 *  - Claims: an NBD export cannot be locked the way image files are
 *    (claim.c); two writers on one export are the administrator's to avoid,
 *    as with the kernel's nbd devices.
 *
 * Built only with libnbd (meson finds it); without it blockdev_open_nbd()
 * says so and returns -EPROTONOSUPPORT.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"

static const char *const uri_schemes[] = {
	"nbd://", "nbds://", "nbd+unix://", "nbds+unix://", "nbd+vsock://", "nbds+vsock://",
};

bool blockdev_name_is_nbd(const char *name)
{
	for (size_t i = 0; i < sizeof(uri_schemes) / sizeof(uri_schemes[0]); i++)
		if (strncmp(name, uri_schemes[i], strlen(uri_schemes[i])) == 0)
			return true;
	return false;
}

#ifndef HAVE_LIBNBD

int blockdev_open_nbd(const char *uri, unsigned flags, uint64_t min_size,
		      const struct blog *log, struct blockdev **out)
{
	(void)flags;
	(void)min_size;
	(void)out;
	blog_err(log, "%s: this butter was built without libnbd: NBD devices are not supported",
		 uri);
	return -EPROTONOSUPPORT;
}

#else

#include <libnbd.h>
#include <pthread.h>
#include <time.h>

#define MAX_CONNS 4
#define MAX_IN_FLIGHT 16
#define MAX_PIECE (4u << 20)
#define DEFAULT_TIMEOUT_MS 30000

struct nbd_conn {
	struct nbd_handle *h; /* NULL once closed (the device is dead) */
	bool busy;            /* a caller holds it */
};

struct nbd_priv {
	pthread_mutex_t lock; /* guards conns[].busy, nconns, dead */
	pthread_cond_t free_conn;
	struct nbd_conn conns[MAX_CONNS];
	int nconns;
	int max_conns;        /* 1 unless the server offers multi-conn */
	bool dead;
	bool can_flush, can_fua;
	uint32_t min_block;   /* every request is a multiple of it, aligned to it */
	uint32_t piece_bytes; /* largest request */
	int timeout_ms;
	char *uri;            /* the device name, for messages */
	struct blog log;      /* a copy: the opener's may not outlive the device */
};

static int timeout_from_env(void)
{
	const char *s = getenv("BUTTER_NBD_TIMEOUT");
	char *end;
	double v;

	if (!s || !*s)
		return DEFAULT_TIMEOUT_MS;
	v = strtod(s, &end);
	if (*end || !(v > 0) || v > 86400)
		return DEFAULT_TIMEOUT_MS;
	return (int)(v * 1000);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* libnbd's errno for the last failed call, never 0. */
static int nbd_err(void)
{
	int e = nbd_get_errno();

	return e > 0 ? e : EIO;
}

/*
 * Drive @h until @cookies[0..n) have all completed or @deadline passes.
 * 0 if every command succeeded; a server's error as -errno (the first);
 * -ETIMEDOUT; -ENOTCONN when the connection died.
 */
static int wait_commands(struct nbd_handle *h, int64_t *cookies, int n, int64_t deadline,
			 int *err_out)
{
	int pending = n, first_err = 0;

	while (pending > 0) {
		for (int i = 0; i < n; i++) {
			int r;

			if (cookies[i] < 0)
				continue;
			r = nbd_aio_command_completed(h, (uint64_t)cookies[i]);
			if (r == 0)
				continue;
			if (r < 0 && !first_err)
				first_err = nbd_err();
			cookies[i] = -1;
			pending--;
		}
		if (pending == 0)
			break;
		if (nbd_aio_is_dead(h) || nbd_aio_is_closed(h))
			return -ENOTCONN;
		int64_t left = deadline - now_ms();
		if (left <= 0)
			return -ETIMEDOUT;
		if (nbd_poll(h, (int)(left > 1000 ? 1000 : left)) < 0) {
			if (nbd_aio_is_dead(h) || nbd_aio_is_closed(h))
				return -ENOTCONN;
			*err_out = nbd_err();
			return -EPROTO;
		}
	}
	if (first_err && (nbd_aio_is_dead(h) || nbd_aio_is_closed(h)))
		return -ENOTCONN;
	return first_err ? -first_err : 0;
}

/* Take a connection (opening another one where multi-conn allows), or -EIO when dead. */
static int conn_get(struct nbd_priv *np, struct nbd_conn **out);
static void conn_put(struct nbd_priv *np, struct nbd_conn *c);

/* Close every connection and fail what follows (the caller holds no lock). */
static void mark_dead(struct nbd_priv *np, struct nbd_conn *c, const char *why)
{
	pthread_mutex_lock(&np->lock);
	if (!np->dead)
		blog_err(&np->log, "%s: %s; the device is gone until it is opened again", np->uri,
			 why);
	np->dead = true;
	if (c && c->h) {
		nbd_close(c->h); /* ours alone: the caller holds it */
		c->h = NULL;
	}
	pthread_cond_broadcast(&np->free_conn);
	pthread_mutex_unlock(&np->lock);
}

enum io_kind { IO_READ, IO_WRITE };

/*
 * Transfer [offset, offset + len), aligned to min_block, on one connection:
 * pieces of piece_bytes, up to MAX_IN_FLIGHT at once.
 */
static int transfer_aligned(struct nbd_priv *np, enum io_kind kind, void *rbuf,
			    const void *wbuf, size_t len, uint64_t offset)
{
	int64_t cookies[MAX_IN_FLIGHT];
	struct nbd_conn *c;
	size_t done = 0;
	int ret, err = 0;
	uint32_t wflags = np->can_fua && !np->can_flush ? LIBNBD_CMD_FLAG_FUA : 0;

	ret = conn_get(np, &c);
	if (ret)
		return ret;
	while (done < len && ret == 0) {
		int64_t deadline = now_ms() + np->timeout_ms;
		int n = 0;

		while (n < MAX_IN_FLIGHT && done < len) {
			size_t piece = len - done < np->piece_bytes ? len - done : np->piece_bytes;
			int64_t cookie;

			if (kind == IO_READ)
				cookie = nbd_aio_pread(c->h, (char *)rbuf + done, piece, offset + done,
						       NBD_NULL_COMPLETION, 0);
			else
				cookie = nbd_aio_pwrite(c->h, (const char *)wbuf + done, piece,
							offset + done, NBD_NULL_COMPLETION, wflags);
			if (cookie < 0) {
				err = nbd_err();
				ret = nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h) ? -ENOTCONN
										      : -err;
				break;
			}
			cookies[n++] = cookie;
			done += piece;
		}
		if (n) {
			int r = wait_commands(c->h, cookies, n, deadline, &err);

			if (ret == 0 || r == -ENOTCONN || r == -ETIMEDOUT || r == -EPROTO)
				ret = r;
		}
	}
	if (ret == -ENOTCONN || ret == -ETIMEDOUT || ret == -EPROTO) {
		char why[160];

		if (ret == -ETIMEDOUT)
			snprintf(why, sizeof(why), "no answer to a %s within %d s",
				 kind == IO_READ ? "read" : "write", np->timeout_ms / 1000);
		else if (ret == -EPROTO)
			snprintf(why, sizeof(why), "the connection failed: %s",
				 nbd_get_error() ? nbd_get_error() : strerror(err ? err : EIO));
		else
			snprintf(why, sizeof(why), "the server closed the connection");
		mark_dead(np, c, why);
		ret = -EIO;
	}
	conn_put(np, c);
	return ret;
}

/* Grow [offset, offset + len) to whole min_block blocks. */
static void align_range(const struct nbd_priv *np, uint64_t offset, size_t len, uint64_t *a_off,
			size_t *a_len)
{
	uint64_t b = np->min_block, start = offset / b * b;
	uint64_t end = (offset + len + b - 1) / b * b;

	*a_off = start;
	*a_len = (size_t)(end - start);
}

static int nbd_dev_read(struct blockdev *dev, void *buf, size_t len, uint64_t offset)
{
	struct nbd_priv *np = dev->priv;
	uint64_t a_off;
	size_t a_len;
	char *bounce;
	int ret;

	align_range(np, offset, len, &a_off, &a_len);
	if (a_off == offset && a_len == len)
		return transfer_aligned(np, IO_READ, buf, NULL, len, offset);
	bounce = malloc(a_len);
	if (!bounce)
		return -ENOMEM;
	ret = transfer_aligned(np, IO_READ, bounce, NULL, a_len, a_off);
	if (ret == 0)
		memcpy(buf, bounce + (offset - a_off), len);
	free(bounce);
	return ret;
}

static int nbd_dev_write(struct blockdev *dev, const void *buf, size_t len, uint64_t offset)
{
	struct nbd_priv *np = dev->priv;
	uint64_t a_off;
	size_t a_len;
	char *bounce;
	int ret;

	align_range(np, offset, len, &a_off, &a_len);
	if (a_off == offset && a_len == len)
		return transfer_aligned(np, IO_WRITE, NULL, buf, len, offset);
	/*
	 * Read-modify-write of the blocks at the edges. Concurrent writers of
	 * one block would race here; butter never writes the same sector from
	 * two threads at once, and servers with a minimum block above 512
	 * bytes are rare.
	 */
	bounce = malloc(a_len);
	if (!bounce)
		return -ENOMEM;
	ret = transfer_aligned(np, IO_READ, bounce, NULL, a_len, a_off);
	if (ret == 0) {
		memcpy(bounce + (offset - a_off), buf, len);
		ret = transfer_aligned(np, IO_WRITE, NULL, bounce, a_len, a_off);
	}
	free(bounce);
	return ret;
}

static int nbd_dev_flush(struct blockdev *dev)
{
	struct nbd_priv *np = dev->priv;
	struct nbd_conn *c;
	int64_t cookie;
	int ret, err = 0;

	if (!np->can_flush)
		return np->dead ? -EIO : 0;
	ret = conn_get(np, &c);
	if (ret)
		return ret;
	cookie = nbd_aio_flush(c->h, NBD_NULL_COMPLETION, 0);
	if (cookie < 0)
		ret = nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h) ? -ENOTCONN : -nbd_err();
	else
		ret = wait_commands(c->h, &cookie, 1, now_ms() + np->timeout_ms, &err);
	if (ret == -ENOTCONN || ret == -ETIMEDOUT || ret == -EPROTO) {
		mark_dead(np, c, ret == -ETIMEDOUT ? "no answer to a flush in time"
						   : "the connection failed during a flush");
		ret = -EIO;
	}
	conn_put(np, c);
	return ret;
}

/*
 * Open one connection to @uri and wait (bounded) until it is ready. On
 * success *out is a handle in the ready state.
 */
static int connect_one(const char *uri, int timeout_ms, const struct blog *log,
		       struct nbd_handle **out)
{
	struct nbd_handle *h = nbd_create();
	int64_t deadline = now_ms() + timeout_ms;
	int ret = 0;

	if (!h)
		return -ENOMEM;
	/* the buffers are ours to fill; no need to zero them first */
	nbd_set_pread_initialize(h, false);
	/*
	 * The URI is the user's own (a command line, a mount option), so its
	 * tls-certificates= and tls-psk-file= may name local files, read with
	 * the caller's rights.
	 */
	nbd_set_uri_allow_local_file(h, true);
	if (nbd_aio_connect_uri(h, uri) < 0) {
		ret = -nbd_err();
		blog_err(log, "%s: %s", uri, nbd_get_error() ? nbd_get_error() : strerror(-ret));
		nbd_close(h);
		return ret;
	}
	while (nbd_aio_is_connecting(h)) {
		int64_t left = deadline - now_ms();

		if (left <= 0) {
			blog_err(log, "%s: no answer from the server within %d s", uri,
				 timeout_ms / 1000);
			nbd_close(h);
			return -ETIMEDOUT;
		}
		if (nbd_poll(h, (int)(left > 1000 ? 1000 : left)) < 0)
			break;
	}
	if (!nbd_aio_is_ready(h)) {
		ret = nbd_get_errno() > 0 ? -nbd_get_errno() : -ECONNREFUSED;
		blog_err(log, "%s: cannot connect: %s", uri,
			 nbd_get_error() ? nbd_get_error() : strerror(-ret));
		nbd_close(h);
		return ret;
	}
	*out = h;
	return 0;
}

/*
 * Say goodbye (NBD_CMD_DISC; nothing is pending: contract 3, no flush) and
 * close, waiting at most a second for the server to see it: a stopped
 * server must not hold up a close.
 */
static void disconnect(struct nbd_handle *h)
{
	int64_t deadline = now_ms() + 1000;

	if (nbd_aio_is_ready(h) && nbd_aio_disconnect(h, 0) == 0) {
		while (!nbd_aio_is_closed(h) && !nbd_aio_is_dead(h)) {
			int64_t left = deadline - now_ms();

			if (left <= 0 || nbd_poll(h, (int)left) < 0)
				break;
		}
	}
	nbd_close(h);
}

static int conn_get(struct nbd_priv *np, struct nbd_conn **out)
{
	pthread_mutex_lock(&np->lock);
	for (;;) {
		int i;

		if (np->dead) {
			pthread_mutex_unlock(&np->lock);
			return -EIO;
		}
		for (i = 0; i < np->nconns; i++) {
			if (!np->conns[i].busy && np->conns[i].h) {
				np->conns[i].busy = true;
				*out = &np->conns[i];
				pthread_mutex_unlock(&np->lock);
				return 0;
			}
		}
		if (np->nconns < np->max_conns) {
			struct nbd_conn *c = &np->conns[np->nconns++];
			struct nbd_handle *h;
			int ret;

			c->busy = true;
			pthread_mutex_unlock(&np->lock);
			ret = connect_one(np->uri, np->timeout_ms, &np->log, &h);
			pthread_mutex_lock(&np->lock);
			if (ret) {
				/* stay with the connections we have (c is the last slot) */
				c->busy = false;
				np->nconns--;
				np->max_conns = np->nconns;
				pthread_cond_broadcast(&np->free_conn);
				continue;
			}
			c->h = h;
			*out = c;
			pthread_mutex_unlock(&np->lock);
			return 0;
		}
		pthread_cond_wait(&np->free_conn, &np->lock);
	}
}

static void conn_put(struct nbd_priv *np, struct nbd_conn *c)
{
	pthread_mutex_lock(&np->lock);
	c->busy = false;
	pthread_cond_signal(&np->free_conn);
	pthread_mutex_unlock(&np->lock);
}

static void nbd_dev_close(struct blockdev *dev)
{
	struct nbd_priv *np = dev->priv;

	for (int i = 0; i < np->nconns; i++)
		if (np->conns[i].h)
			disconnect(np->conns[i].h);
	pthread_cond_destroy(&np->free_conn);
	pthread_mutex_destroy(&np->lock);
	free(np->uri);
	free(np);
	free(dev->name);
	free(dev);
}

static const struct blockdev_ops nbd_ops = {
	.read = nbd_dev_read,
	.write = nbd_dev_write,
	.flush = nbd_dev_flush,
	.close = nbd_dev_close,
};

int blockdev_open_nbd(const char *uri, unsigned flags, uint64_t min_size,
		      const struct blog *log, struct blockdev **out)
{
	int readonly = !!(flags & BLOCKDEV_OPEN_RDONLY);
	int timeout_ms = timeout_from_env();
	struct nbd_handle *h;
	struct nbd_priv *np;
	struct blockdev *dev;
	int64_t size, bs;
	int ret;

	ret = connect_one(uri, timeout_ms, log, &h);
	if (ret)
		return ret;
	size = nbd_get_size(h);
	if (size < 0) {
		ret = -nbd_err();
		blog_err(log, "%s: the server gave no size: %s", uri, strerror(-ret));
		goto fail;
	}
	if (!readonly && nbd_is_read_only(h) == 1) {
		blog_err(log, "%s: the server exports it read-only", uri);
		ret = -EROFS;
		goto fail;
	}
	if (min_size && (uint64_t)size < min_size) {
		blog_err(log, "%s: the export is %lld bytes, smaller than the %llu asked for", uri,
			 (long long)size, (unsigned long long)min_size);
		ret = -ENOSPC;
		goto fail;
	}
	np = calloc(1, sizeof(*np));
	dev = calloc(1, sizeof(*dev));
	if (!np || !dev || !(np->uri = strdup(uri)) || !(dev->name = strdup(uri))) {
		if (np)
			free(np->uri);
		free(np);
		free(dev);
		ret = -ENOMEM;
		goto fail;
	}
	bs = nbd_get_block_size(h, LIBNBD_SIZE_MINIMUM);
	np->min_block = bs > 0 && bs <= 65536 ? (uint32_t)bs : 1;
	bs = nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);
	np->piece_bytes = bs > 0 && bs < MAX_PIECE ? (uint32_t)bs : MAX_PIECE;
	if (np->piece_bytes < np->min_block)
		np->piece_bytes = np->min_block;
	np->piece_bytes -= np->piece_bytes % np->min_block;
	np->can_flush = nbd_can_flush(h) == 1;
	np->can_fua = nbd_can_fua(h) == 1;
	np->max_conns = nbd_can_multi_conn(h) == 1 ? MAX_CONNS : 1;
	np->timeout_ms = timeout_ms;
	np->log = *log;
	np->conns[0].h = h;
	np->nconns = 1;
	pthread_mutex_init(&np->lock, NULL);
	pthread_cond_init(&np->free_conn, NULL);
	dev->ops = &nbd_ops;
	dev->size = (uint64_t)size;
	dev->readonly = readonly;
	dev->priv = np;
	*out = dev;
	return 0;
fail:
	disconnect(h);
	return ret;
}

#endif
