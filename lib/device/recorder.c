/*
 * recorder.c — a device backend that wraps another one and logs, in order,
 * every write that reached it (offset, length and the bytes) and every flush
 * that completed, so a crash tool can later replay any prefix of the
 * workload onto a copy of the starting image (tests/tools/crashreplay.c).
 *
 * Several devices of one filesystem share one log (struct recorder_log,
 * reference counted: each recorder device holds a reference); records name
 * their device by its index in the open order (0 = the first device).
 *
 * Devices the library opens later for the same filesystem (a replace
 * target, a device being added: lib/ops/device.c) join the log through
 * blockdev_record_new(), which finds it from any member (blockdev.record)
 * and stacks a recorder over the new device in place, as the next index.
 * Its DEVICE record then comes in the middle of the log, before its first
 * write; a replay starts such a device from its content at that point
 * (zeroes for a new image file: tests/tools/crashreplay.c).
 *
 * Log format (all integers little-endian):
 *
 *   file header, 16 bytes
 *   OFFSET  SIZE  FIELD
 *   0       8     magic "BTRREC01"
 *   8       4     version: 1
 *   12      4     reserved, 0
 *
 *   then records back to back, each a 24-byte header and a payload
 *   OFFSET  SIZE  FIELD
 *   0       1     type: 1 DEVICE, 2 WRITE, 3 FLUSH
 *   1       3     reserved, 0
 *   4       4     dev: the device's index
 *   8       8     DEVICE: the device's size in bytes; WRITE: the byte offset;
 *                 FLUSH: 0
 *   16      8     payload length: DEVICE: its name (no NUL); WRITE: the data
 *                 written; FLUSH: 0
 *   24      ...   payload
 *
 * Promises:
 *  1. A record is appended only after the wrapped device completed the
 *     operation: the log holds exactly what reached the device, in the order
 *     it did. A DEVICE record precedes any other record of that device, and
 *     DEVICE records come in index order (0, 1, 2, ...), each index once.
 *  2. Records go to the file with write(2), unbuffered, one record per call
 *     sequence under the log's mutex: the file's size when an operation
 *     returns is the log position after it (a workload takes positions with
 *     stat(2) after butter_sync() returns; the crash tool compares them with
 *     record ends).
 *  3. A failure to append to the log fails the operation (-EIO or the
 *     write(2) error): an incomplete log would make replays lie.
 *  4. The devices of one filesystem share the log, so it is one order over
 *     all of them, and that order never contradicts what happened: a record
 *     is appended before its operation returns, so whatever was issued after
 *     an operation returned (on any device, from any thread) is logged after
 *     it. Only operations in flight at the same time may be logged in either
 *     order, and the device could have completed those in either order too.
 *     A prefix of the log is therefore a state all the devices could have
 *     been in together at one instant (tests/tools/crashreplay.c cuts there).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/device.h"

#define REC_MAGIC "BTRREC01"
#define REC_VERSION 1u
#define REC_DEVICE 1u
#define REC_WRITE 2u
#define REC_FLUSH 3u
#define REC_HEADER 24u

struct recorder_log {
	pthread_mutex_t lock; /* serialises appends */
	int fd;
	unsigned refs;        /* the opener's plus one per recorder device; protected by lock */
	uint32_t ndevs;       /* indices 0..ndevs-1 have their DEVICE record; protected by lock */
};

struct recorder_priv {
	struct blockdev *inner;
	struct recorder_log *log;
	uint32_t devidx;
};

static void put_le32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void put_le64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Append one record; the caller holds log->lock. */
static int append_locked(struct recorder_log *log, unsigned type, uint32_t dev, uint64_t value,
			 const void *payload, uint64_t len)
{
	unsigned char h[REC_HEADER];
	int ret;

	memset(h, 0, sizeof(h));
	h[0] = (unsigned char)type;
	put_le32(h + 4, dev);
	put_le64(h + 8, value);
	put_le64(h + 16, len);
	ret = write_all(log->fd, h, sizeof(h));
	if (ret == 0 && len)
		ret = write_all(log->fd, payload, (size_t)len);
	return ret;
}

static int append(struct recorder_log *log, unsigned type, uint32_t dev, uint64_t value,
		  const void *payload, uint64_t len)
{
	int ret;

	pthread_mutex_lock(&log->lock);
	ret = append_locked(log, type, dev, value, payload, len);
	pthread_mutex_unlock(&log->lock);
	return ret;
}

/* Create (truncate) the log file @path and write its header. */
int recorder_log_open(const char *path, struct recorder_log **out)
{
	unsigned char h[16];
	struct recorder_log *log;
	int ret;

	log = calloc(1, sizeof(*log));
	if (!log)
		return -ENOMEM;
	log->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (log->fd < 0) {
		ret = -errno;
		free(log);
		return ret;
	}
	memset(h, 0, sizeof(h));
	memcpy(h, REC_MAGIC, 8);
	put_le32(h + 8, REC_VERSION);
	ret = write_all(log->fd, h, sizeof(h));
	if (ret) {
		close(log->fd);
		free(log);
		return ret;
	}
	pthread_mutex_init(&log->lock, NULL);
	log->refs = 1;
	*out = log;
	return 0;
}

/* Drop a reference; the last one closes the file. */
void recorder_log_put(struct recorder_log *log)
{
	unsigned left;

	if (!log)
		return;
	pthread_mutex_lock(&log->lock);
	left = --log->refs;
	pthread_mutex_unlock(&log->lock);
	if (left)
		return;
	close(log->fd);
	pthread_mutex_destroy(&log->lock);
	free(log);
}

static int rec_read(struct blockdev *dev, void *buf, size_t len, uint64_t offset)
{
	struct recorder_priv *rp = dev->priv;

	return blockdev_read(rp->inner, buf, len, offset);
}

static int rec_write(struct blockdev *dev, const void *buf, size_t len, uint64_t offset)
{
	struct recorder_priv *rp = dev->priv;
	int ret = blockdev_write(rp->inner, buf, len, offset);

	if (ret)
		return ret;
	return append(rp->log, REC_WRITE, rp->devidx, offset, buf, len);
}

static int rec_flush(struct blockdev *dev)
{
	struct recorder_priv *rp = dev->priv;
	int ret = blockdev_flush(rp->inner);

	if (ret)
		return ret;
	return append(rp->log, REC_FLUSH, rp->devidx, 0, NULL, 0);
}

static void rec_close(struct blockdev *dev)
{
	struct recorder_priv *rp = dev->priv;

	blockdev_close(rp->inner);
	recorder_log_put(rp->log);
	free(rp);
	free(dev->name);
	free(dev);
}

static void rec_end_service(struct blockdev *dev)
{
	struct recorder_priv *rp = dev->priv;

	blockdev_end_service(rp->inner);
}

static int rec_gone(struct blockdev *dev)
{
	struct recorder_priv *rp = dev->priv;

	return blockdev_gone(rp->inner);
}

static const struct blockdev_ops recorder_ops = {
	.read = rec_read,
	.write = rec_write,
	.flush = rec_flush,
	.close = rec_close,
	.end_service = rec_end_service,
	.gone = rec_gone,
};

/*
 * Append @inner's DEVICE record as index @devidx (-1: the next one) and take
 * a reference on @log; the index goes to *idx.
 */
static int join_log(struct recorder_log *log, const struct blockdev *inner, int64_t devidx,
		    uint32_t *idx)
{
	int ret;

	/* one critical section: the index chosen is the one its record names */
	pthread_mutex_lock(&log->lock);
	*idx = devidx < 0 ? log->ndevs : (uint32_t)devidx;
	ret = append_locked(log, REC_DEVICE, *idx, inner->size, inner->name, strlen(inner->name));
	if (ret == 0) {
		log->refs++;
		if (*idx >= log->ndevs)
			log->ndevs = *idx + 1;
	}
	pthread_mutex_unlock(&log->lock);
	return ret;
}

int blockdev_open_recorder(struct blockdev *inner, struct recorder_log *log, uint32_t devidx,
			   struct blockdev **out)
{
	struct blockdev *dev = calloc(1, sizeof(*dev));
	struct recorder_priv *rp = calloc(1, sizeof(*rp));
	int ret;

	if (!dev || !rp || !(dev->name = strdup(inner->name))) {
		free(dev);
		free(rp);
		return -ENOMEM;
	}
	ret = join_log(log, inner, devidx, &rp->devidx);
	if (ret) {
		free(dev->name);
		free(dev);
		free(rp);
		return ret;
	}
	rp->inner = inner;
	rp->log = log;
	dev->ops = &recorder_ops;
	dev->size = inner->size;
	dev->readonly = inner->readonly;
	dev->priv = rp;
	dev->record = log;
	*out = dev;
	return 0;
}

int blockdev_record_new(const struct blockdev *member, struct blockdev *dev)
{
	struct recorder_log *log = member ? member->record : NULL;
	struct blockdev *inner;
	struct recorder_priv *rp;
	char *name;
	int ret;

	if (!log)
		return 0;
	inner = malloc(sizeof(*inner));
	rp = calloc(1, sizeof(*rp));
	name = strdup(dev->name);
	if (!inner || !rp || !name) {
		free(inner);
		free(rp);
		free(name);
		return -ENOMEM;
	}
	/* what @dev was moves to @inner; @dev becomes the recorder over it */
	*inner = *dev;
	ret = join_log(log, inner, -1, &rp->devidx);
	if (ret) {
		free(inner);
		free(rp);
		free(name);
		return ret;
	}
	rp->inner = inner;
	rp->log = log;
	dev->ops = &recorder_ops;
	dev->name = name;
	dev->priv = rp;
	dev->record = log;
	return 0;
}
