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
 *  - Sequential reads are read ahead in windows of 2 MiB (ra_fill; a
 *    reader that would wait for another's fill fills the next window on a
 *    spare connection meanwhile), kept coherent with this device's own
 *    writes; another writer of the same export is not seen (there must be
 *    none, see Claims).
 *  - write_through (large written-back data): a write, then a flush sent
 *    without waiting, so the server's disk keeps up before the next fsync.
 *  - flush: NBD_CMD_FLUSH when the server offers it. A server that offers
 *    no flush has no volatile cache to flush (the protocol's meaning), so
 *    a completed write is durable and flush does nothing; a server that
 *    offers FUA and no flush gets every write with FUA.
 *  - Concurrency: libnbd handles are not shared between callers here. A
 *    server that advertises multi-conn (a flush on one connection covers
 *    writes completed on all) gets up to MAX_CONNS connections, one per
 *    concurrent caller; otherwise one connection, and callers take turns.
 *  - Failure: a server error answers that request with its errno (the
 *    connection stays up: nbdkit's error filter, a bad sector). Requests
 *    with no answer for the timeout (BUTTER_NBD_TIMEOUT seconds in the
 *    environment, default 30; counted from the last answer, so a slow link
 *    is not a dead one), a lost connection or a protocol error make
 *    the device dead: its connections are closed, the message names the
 *    URI, and every later request fails at once with -EIO — never a hang.
 *    Above it, a failed write aborts the transaction and the filesystem
 *    turns read-only; reads of mirrored or parity data go on from the
 *    other devices, as for a failed disk.
 *  - Claims: the export itself cannot be locked, so claim.c's protocol runs
 *    on a lock file named after the URI (nbd_claim): on one machine a second
 *    writer is refused, naming the holder, a second `butter mount` binds to
 *    the first (fuse/bind.c). Writers on other machines, or the same export
 *    under another spelling, are the administrator's to avoid, as with the
 *    kernel's nbd devices.
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

bool blockdev_nbd_open_error(int err)
{
	switch (-err) {
	case ECONNREFUSED: /* connect_one(): the connection, as libnbd reports it */
	case ECONNRESET:
	case ENOTCONN:
	case ETIMEDOUT:
	case EHOSTUNREACH:
	case ENETUNREACH:
	case ENOENT:       /* a Unix socket that is not there */
	case EPROTO:
	case EPROTONOSUPPORT: /* no libnbd in this build */
	case EROFS:        /* a read-only export opened read-write */
		return true;
	default:
		return false;
	}
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

#include <fcntl.h>
#include <libnbd.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "device/claim.h"

#define MAX_CONNS 4
#define MAX_IN_FLIGHT 16
#define MAX_PIECE (4u << 20)
#define DEFAULT_TIMEOUT_MS 30000

#define RA_SLOTS 4
#define RA_WINDOW (2u << 20)
#define RA_PIECE (256u << 10)

/* A read-ahead window (see ra_fill): @buf holds [offset, offset + len) while valid. */
struct ra_window {
	uint64_t offset;
	size_t len;
	char *buf;          /* RA_WINDOW bytes, allocated at the first fill, kept */
	uint64_t last_use;  /* ra_tick at the last hit: the least recent is refilled */
	bool valid;
	bool busy;          /* a fill is under way (buf is the filler's) */
};

struct nbd_priv;

struct nbd_conn {
	struct nbd_priv *np;  /* its device */
	struct nbd_handle *h; /* NULL once closed (the device is dead) */
	bool busy;            /* a caller holds it */
	bool bg_flush;        /* a background flush is in flight (nbd_dev_write_through) */
};

struct nbd_priv {
	pthread_mutex_t lock; /* guards conns[] (h of an idle one, busy), max_conns, dead */
	pthread_cond_t free_conn;
	pthread_cond_t ra_done;  /* a read-ahead fill ended */
	pthread_rwlock_t rmw_lock; /* writes shared, a read-modify-write alone */
	struct nbd_conn conns[MAX_CONNS];
	int max_conns;        /* 1 unless the server offers multi-conn */
	bool dead;
	bool can_flush, can_fua;
	uint32_t min_block;   /* every request is a multiple of it, aligned to it */
	uint32_t piece_bytes; /* largest request */
	int timeout_ms;
	/* read-ahead, under lock (see ra_fill) */
	struct ra_window ra[RA_SLOTS];
	uint64_t ra_tick, ra_gen, last_read_end;
	int lock_fd;          /* the claim's lock file (see nbd_claim), -1: unclaimed */
	int bg_flush_err;     /* errno of a failed background flush, for the next flush (atomic) */
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
	return v < 0.1 ? 100 : (int)(v * 1000);
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
 * Drive @h until @cookies[0..n) have all completed, or @timeout_ms pass
 * without any of them completing.
 * 0 if every command succeeded; a server's error as -errno (the first);
 * -ETIMEDOUT; -ENOTCONN when the connection died.
 */
static int wait_commands(struct nbd_handle *h, int64_t *cookies, int n, int timeout_ms,
			 int *err_out)
{
	int pending = n, first_err = 0;
	int64_t deadline = now_ms() + timeout_ms;

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
			/* a slow link is not a dead one: the time counts from the last answer */
			deadline = now_ms() + timeout_ms;
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
 * pieces of @piece_bytes (a multiple of min_block), up to MAX_IN_FLIGHT at
 * once.
 */
static int transfer_aligned(struct nbd_priv *np, enum io_kind kind, void *rbuf,
			    const void *wbuf, size_t len, uint64_t offset, uint32_t piece_bytes)
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
		int n = 0;

		while (n < MAX_IN_FLIGHT && done < len) {
			size_t piece = len - done < piece_bytes ? len - done : piece_bytes;
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
			int r = wait_commands(c->h, cookies, n, np->timeout_ms, &err);

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

/*
 * Read-ahead. Each request costs a round trip, and a sequential reader
 * above (the FUSE mount reads 256 KiB at a time, from two threads) would
 * pay one per piece, where a local file has the kernel's read-ahead. So a
 * read that continues the previous one, or the end of a window, fills a
 * window of RA_WINDOW bytes from its start (RA_PIECE pieces in flight at
 * once) and later reads inside a window are copied from it. Coherence: a
 * write drops every window it overlaps when it completes and bumps
 * ra_gen; a fill that began before some write completed is not kept
 * (the data it read may predate it), though its caller's own bytes are
 * returned as an unbuffered read's would be.
 */
static bool ra_hit(struct nbd_priv *np, void *buf, size_t len, uint64_t offset)
{
	for (int i = 0; i < RA_SLOTS; i++) {
		struct ra_window *w = &np->ra[i];

		if (w->valid && offset >= w->offset && offset + len <= w->offset + w->len) {
			memcpy(buf, w->buf + (offset - w->offset), len);
			w->last_use = ++np->ra_tick;
			return true;
		}
	}
	return false;
}

/*
 * Whether a fill under way will hold [offset, offset + len): the end of its
 * window (the caller waits for it rather than read), else 0.
 */
static uint64_t ra_pending(const struct nbd_priv *np, size_t len, uint64_t offset)
{
	for (int i = 0; i < RA_SLOTS; i++) {
		const struct ra_window *w = &np->ra[i];

		if (w->busy && offset >= w->offset && offset + len <= w->offset + w->len)
			return w->offset + w->len;
	}
	return 0;
}

/* Whether @offset lies in a window, filled or being filled. */
static bool ra_covered(const struct nbd_priv *np, uint64_t offset)
{
	for (int i = 0; i < RA_SLOTS; i++) {
		const struct ra_window *w = &np->ra[i];

		if ((w->valid || w->busy) && offset >= w->offset && offset < w->offset + w->len)
			return true;
	}
	return false;
}

/* Whether a read at @offset continues what was read last, or a window. */
static bool ra_sequential(const struct nbd_priv *np, uint64_t offset)
{
	if (offset == np->last_read_end)
		return true;
	for (int i = 0; i < RA_SLOTS; i++)
		if (np->ra[i].valid && np->ra[i].offset + np->ra[i].len == offset)
			return true;
	return false;
}

/*
 * Fill a window from @offset (aligned) and copy its first @len bytes to
 * @buf (none when @buf is NULL: a window filled ahead): 0, 1 when no
 * window was free or the size does not fit (the caller reads directly),
 * or -errno.
 */
static int ra_fill(struct nbd_priv *np, struct blockdev *dev, void *buf, size_t len,
		   uint64_t offset)
{
	struct ra_window *w = NULL;
	uint64_t gen, wlen;
	int ret;

	if (offset + len > dev->size)
		return 1;
	wlen = dev->size - offset < RA_WINDOW ? dev->size - offset : RA_WINDOW;
	wlen -= wlen % np->min_block;
	if (wlen < len)
		return 1;
	pthread_mutex_lock(&np->lock);
	for (int i = 0; i < RA_SLOTS; i++) {
		struct ra_window *c = &np->ra[i];

		if (!c->busy && (!w || !c->valid || (w->valid && c->last_use < w->last_use)))
			w = c;
	}
	if (w) {
		w->busy = true;
		w->valid = false;
		w->offset = offset; /* what it will hold: readers of it wait (ra_pending) */
		w->len = (size_t)wlen;
	}
	gen = np->ra_gen;
	pthread_mutex_unlock(&np->lock);
	if (!w)
		return 1;
	if (!w->buf && !(w->buf = malloc(RA_WINDOW))) {
		ret = 1;
	} else {
		uint32_t piece = RA_PIECE < np->piece_bytes ? RA_PIECE : np->piece_bytes;

		piece -= piece % np->min_block;
		ret = transfer_aligned(np, IO_READ, w->buf, NULL, (size_t)wlen, offset,
				       piece ? piece : np->min_block);
		if (ret == 0 && buf)
			memcpy(buf, w->buf, len);
	}
	pthread_mutex_lock(&np->lock);
	w->busy = false;
	if (ret == 0 && gen == np->ra_gen) {
		w->valid = true;
		w->last_use = ++np->ra_tick;
	}
	pthread_cond_broadcast(&np->ra_done);
	pthread_mutex_unlock(&np->lock);
	return ret;
}

static int nbd_dev_gone(struct blockdev *dev);

static int nbd_dev_read(struct blockdev *dev, void *buf, size_t len, uint64_t offset)
{
	struct nbd_priv *np = dev->priv;
	uint64_t a_off;
	size_t a_len;
	char *bounce;
	bool seq;
	int ret;

	pthread_mutex_lock(&np->lock);
	for (uint64_t next; (next = ra_pending(np, len, offset)) != 0;) {
		/*
		 * Another reader is filling the window this read needs. With a
		 * second connection to spare, fill the window after it meanwhile
		 * (the sequential reader gets there next) instead of idling: the
		 * two transfers overlap, and no thread of our own is needed.
		 */
		if (next < dev->size && np->max_conns > 1 && !ra_covered(np, next)) {
			pthread_mutex_unlock(&np->lock);
			(void)ra_fill(np, dev, NULL, 0, next); /* its reader will see a failure */
			pthread_mutex_lock(&np->lock);
			continue;
		}
		pthread_cond_wait(&np->ra_done, &np->lock);
	}
	if (ra_hit(np, buf, len, offset)) {
		np->last_read_end = offset + len;
		pthread_mutex_unlock(&np->lock);
		return 0;
	}
	seq = ra_sequential(np, offset);
	np->last_read_end = offset + len;
	pthread_mutex_unlock(&np->lock);

	align_range(np, offset, len, &a_off, &a_len);
	if (seq && a_off == offset && len < RA_WINDOW / 2) {
		ret = ra_fill(np, dev, buf, len, offset);
		/* an error elsewhere in the window is not this read's: read just this */
		if (ret == 0 || (ret < 0 && nbd_dev_gone(dev)))
			return ret;
	}
	if (a_off == offset && a_len == len)
		return transfer_aligned(np, IO_READ, buf, NULL, len, offset, np->piece_bytes);
	bounce = malloc(a_len);
	if (!bounce)
		return -ENOMEM;
	ret = transfer_aligned(np, IO_READ, bounce, NULL, a_len, a_off, np->piece_bytes);
	if (ret == 0)
		memcpy(buf, bounce + (offset - a_off), len);
	free(bounce);
	return ret;
}

/* After a write of [offset, offset + len) completed (or failed): no window keeps older bytes. */
static void ra_forget(struct nbd_priv *np, size_t len, uint64_t offset)
{
	pthread_mutex_lock(&np->lock);
	np->ra_gen++;
	for (int i = 0; i < RA_SLOTS; i++) {
		struct ra_window *w = &np->ra[i];

		if (w->valid && offset < w->offset + w->len && w->offset < offset + len)
			w->valid = false;
	}
	pthread_mutex_unlock(&np->lock);
}

static int write_range(struct blockdev *dev, const void *buf, size_t len, uint64_t offset)
{
	struct nbd_priv *np = dev->priv;
	uint64_t a_off;
	size_t a_len;
	char *bounce;
	int ret;

	align_range(np, offset, len, &a_off, &a_len);
	if (a_off == offset && a_len == len) {
		pthread_rwlock_rdlock(&np->rmw_lock);
		ret = transfer_aligned(np, IO_WRITE, NULL, buf, len, offset, np->piece_bytes);
		pthread_rwlock_unlock(&np->rmw_lock);
		return ret;
	}
	/*
	 * Read-modify-write of the blocks at the edges, alone: another write
	 * of other sectors of the same block meanwhile would be undone by our
	 * write-back of what we read (rare: only servers whose minimum block
	 * is larger than the sector see unaligned writes).
	 */
	bounce = malloc(a_len);
	if (!bounce)
		return -ENOMEM;
	pthread_rwlock_wrlock(&np->rmw_lock);
	ret = transfer_aligned(np, IO_READ, bounce, NULL, a_len, a_off, np->piece_bytes);
	if (ret == 0) {
		memcpy(bounce + (offset - a_off), buf, len);
		ret = transfer_aligned(np, IO_WRITE, NULL, bounce, a_len, a_off, np->piece_bytes);
	}
	pthread_rwlock_unlock(&np->rmw_lock);
	free(bounce);
	return ret;
}

static int nbd_dev_write(struct blockdev *dev, const void *buf, size_t len, uint64_t offset)
{
	int ret = write_range(dev, buf, len, offset);

	ra_forget(dev->priv, len, offset);
	return ret;
}

/*
 * The reply to a background flush. A failure is kept for the next flush
 * to report: the server's own next flush may well succeed (Linux tells a
 * write-back error to fdatasync once), and the writes before it would be
 * taken as durable when they are not.
 */
static int bg_flush_done(void *arg, int *error)
{
	struct nbd_conn *c = arg;

	if (*error)
		__atomic_store_n(&c->np->bg_flush_err, *error, __ATOMIC_RELEASE);
	c->bg_flush = false; /* the holder of c drives its replies: no race */
	return 1;            /* retire the command */
}

/*
 * Large data written back from memory (device.h): written as any write,
 * then a flush is sent without waiting for it, so the server moves those
 * bytes to its disk while the next ones arrive instead of all at the next
 * fsync's flush (file.c does the same with a helper thread's fdatasync).
 * At most one such flush per connection is in flight.
 */
static int nbd_dev_write_through(struct blockdev *dev, const void *buf, size_t len,
				 uint64_t offset)
{
	struct nbd_priv *np = dev->priv;
	struct nbd_conn *c;
	int ret = nbd_dev_write(dev, buf, len, offset);

	if (ret || !np->can_flush || conn_get(np, &c))
		return ret;
	if (!c->bg_flush) {
		nbd_completion_callback done = { .callback = bg_flush_done, .user_data = c };

		c->bg_flush = nbd_aio_flush(c->h, done, 0) >= 0;
	}
	conn_put(np, c);
	return 0;
}

static int nbd_dev_gone(struct blockdev *dev);

static int nbd_dev_flush(struct blockdev *dev)
{
	struct nbd_priv *np = dev->priv;
	struct nbd_conn *c;
	int64_t cookie;
	int ret, err = 0;

	int bg_err = __atomic_exchange_n(&np->bg_flush_err, 0, __ATOMIC_ACQ_REL);

	if (bg_err) {
		blog_err(&np->log, "%s: an earlier flush failed: %s", np->uri, strerror(bg_err));
		return -EIO;
	}
	if (!np->can_flush)
		return nbd_dev_gone(dev) ? -EIO : 0;
	ret = conn_get(np, &c);
	if (ret)
		return ret;
	cookie = nbd_aio_flush(c->h, NBD_NULL_COMPLETION, 0);
	if (cookie < 0)
		ret = nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h) ? -ENOTCONN : -nbd_err();
	else
		ret = wait_commands(c->h, &cookie, 1, np->timeout_ms, &err);
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

	if ((nbd_aio_is_ready(h) || nbd_aio_is_processing(h)) && nbd_aio_disconnect(h, 0) == 0) {
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
		struct nbd_conn *spare = NULL;
		int i, used = 0;

		if (np->dead) {
			pthread_mutex_unlock(&np->lock);
			return -EIO;
		}
		for (i = 0; i < MAX_CONNS; i++) {
			struct nbd_conn *c = &np->conns[i];

			if (c->h && !c->busy) {
				c->busy = true;
				*out = c;
				pthread_mutex_unlock(&np->lock);
				return 0;
			}
			if (c->h || c->busy)
				used++; /* open, or being opened */
			else if (!spare)
				spare = c;
		}
		if (used < np->max_conns && spare) {
			struct nbd_handle *h;
			int ret;

			spare->busy = true;
			pthread_mutex_unlock(&np->lock);
			ret = connect_one(np->uri, np->timeout_ms, &np->log, &h);
			pthread_mutex_lock(&np->lock);
			if (ret) {
				/* stay with the connections there are */
				spare->busy = false;
				np->max_conns = used > 0 ? used : 1;
				pthread_cond_broadcast(&np->free_conn);
				continue;
			}
			spare->h = h;
			*out = spare;
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

	for (int i = 0; i < MAX_CONNS; i++)
		if (np->conns[i].h)
			disconnect(np->conns[i].h);
	for (int i = 0; i < RA_SLOTS; i++)
		free(np->ra[i].buf);
	pthread_cond_destroy(&np->free_conn);
	pthread_cond_destroy(&np->ra_done);
	pthread_rwlock_destroy(&np->rmw_lock);
	pthread_mutex_destroy(&np->lock);
	if (np->lock_fd >= 0)
		close(np->lock_fd); /* the claim goes with it */
	free(np->uri);
	free(np);
	free(dev->name);
	free(dev);
}

static void nbd_dev_end_service(struct blockdev *dev)
{
	struct nbd_priv *np = dev->priv;

	if (np->lock_fd >= 0)
		claim_end_service(np->lock_fd);
}

static int nbd_dev_gone(struct blockdev *dev)
{
	struct nbd_priv *np = dev->priv;
	int dead;

	pthread_mutex_lock(&np->lock);
	dead = np->dead;
	pthread_mutex_unlock(&np->lock);
	return dead;
}

static const struct blockdev_ops nbd_ops = {
	.read = nbd_dev_read,
	.write = nbd_dev_write,
	.flush = nbd_dev_flush,
	.close = nbd_dev_close,
	.end_service = nbd_dev_end_service,
	.gone = nbd_dev_gone,
	.write_through = nbd_dev_write_through,
};

/*
 * Claim @uri on this machine (claim.c's protocol) through a lock file named
 * after it: /run/lock/butter-nbd-HASH.lock (/tmp without /run/lock), mode
 * 0666 so every user's opens meet there. The URI as typed is what is
 * compared: two spellings of one export are two claims. *lock_fd is -1
 * when no lock file can be had (opened unclaimed, as claim.c's rule 3).
 * 0 or -EBUSY (logged).
 */
static int nbd_claim(const char *uri, unsigned flags, const struct blog *log, int *lock_fd)
{
	const char *dir = access("/run/lock", W_OK | X_OK) == 0 ? "/run/lock" : "/tmp";
	uint64_t hash = 0xcbf29ce484222325ull; /* FNV-1a */
	char path[96];
	struct stat st;
	int fd, ret;

	*lock_fd = -1;
	for (const char *c = uri; *c; c++)
		hash = (hash ^ (unsigned char)*c) * 0x100000001b3ull;
	snprintf(path, sizeof(path), "%s/butter-nbd-%016llx.lock", dir, (unsigned long long)hash);
	/* an existing file first: O_CREAT on another user's file in a sticky dir may be refused */
	fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0 && errno == ENOENT) {
		fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
		if (fd >= 0)
			(void)fchmod(fd, 0666); /* past the umask */
		else if (errno == EEXIST)
			fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	}
	if (fd < 0)
		return 0;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return 0;
	}
	ret = claim_take(fd, path, uri, &st, flags, log);
	if (ret) {
		close(fd);
		return ret;
	}
	*lock_fd = fd;
	return 0;
}

int blockdev_open_nbd(const char *uri, unsigned flags, uint64_t min_size,
		      const struct blog *log, struct blockdev **out)
{
	int readonly = !!(flags & BLOCKDEV_OPEN_RDONLY);
	int timeout_ms = timeout_from_env();
	struct nbd_handle *h;
	struct nbd_priv *np;
	struct blockdev *dev;
	int64_t size, bs;
	int lock_fd, ret;

	lock_fd = -1;
	ret = flags & BLOCKDEV_OPEN_PROBE ? 0 : nbd_claim(uri, flags, log, &lock_fd);
	if (ret)
		return ret;
	ret = connect_one(uri, timeout_ms, log, &h);
	if (ret) {
		if (lock_fd >= 0)
			close(lock_fd);
		return ret;
	}
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
	np->lock_fd = lock_fd;
	np->log = *log;
	for (int i = 0; i < MAX_CONNS; i++)
		np->conns[i].np = np;
	np->conns[0].h = h;
	pthread_mutex_init(&np->lock, NULL);
	pthread_cond_init(&np->free_conn, NULL);
	pthread_cond_init(&np->ra_done, NULL);
	pthread_rwlock_init(&np->rmw_lock, NULL);
	dev->ops = &nbd_ops;
	dev->size = (uint64_t)size;
	dev->readonly = readonly;
	dev->priv = np;
	*out = dev;
	return 0;
fail:
	disconnect(h);
	if (lock_fd >= 0)
		close(lock_fd);
	return ret;
}

#endif
