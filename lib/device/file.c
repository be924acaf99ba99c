/*
 * file.c — the device backend for regular files and block devices, over
 * pread/pwrite/fdatasync. The only place butter issues raw I/O system calls
 * against storage.
 *
 * Every open claims the file (claim.c: OFD locks on bytes 0 and 1, shared
 * read-only, exclusive read-write, with a bounded wait for a holder that is
 * closing). A read-write open of a block device also holds it with O_EXCL
 * (a second descriptor, so the wait above runs first); a read-write open of
 * an image file is refused while a loop device over it is mounted.
 *
 * Data written through (O_DIRECT) into an image file is on the disk when the
 * write returns, but the host filesystem's record of the blocks it allocated
 * for it is not: the next fdatasync commits that (a journal commit of the
 * host's ext4, about 0.1 s after a few hundred MiB). So that an fsync of
 * something else does not wait for it, a write through a regular file also
 * wakes a helper thread of the device that runs fdatasync then (at most one
 * pending; joined at close). It only ever makes more durable sooner.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/fs.h>

#include "device/claim.h"
#include "device/device.h"

struct file_priv {
	int fd;      /* I/O, and the claim's locks */
	int excl_fd; /* a read-write block device held with O_EXCL; -1 otherwise */
	int direct_fd; /* O_DIRECT, opened at the first write through; -1: not yet; -2: not possible */
	bool regular;  /* a regular file (not a block device) */
	/* the background fdatasync after writes through (see the top); lock guards the flags */
	pthread_mutex_t lock;
	pthread_cond_t wake;
	pthread_t syncer;
	bool syncer_running, sync_pending, stopping;
};

#define DIRECT_ALIGN 4096u

/*
 * Read into @rbuf (pread) or, with @rbuf NULL, write @wbuf (pwrite): all
 * @len bytes at @offset, going on after short transfers and EINTR. A
 * transfer of nothing (the end of a file) is -EIO.
 */
static int file_io(int fd, void *rbuf, const void *wbuf, size_t len, uint64_t offset)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = rbuf ? pread(fd, (char *)rbuf + done, len - done, (off_t)(offset + done))
				 : pwrite(fd, (const char *)wbuf + done, len - done,
					  (off_t)(offset + done));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		done += (size_t)n;
	}
	return 0;
}

static int file_read(struct blockdev *dev, void *buf, size_t len, uint64_t offset)
{
	struct file_priv *fp = dev->priv;

	return file_io(fp->fd, buf, NULL, len, offset);
}

static int file_write(struct blockdev *dev, const void *buf, size_t len, uint64_t offset)
{
	struct file_priv *fp = dev->priv;

	return file_io(fp->fd, NULL, buf, len, offset);
}

static void *syncer_main(void *arg)
{
	struct file_priv *fp = arg;

	pthread_mutex_lock(&fp->lock);
	for (;;) {
		while (!fp->sync_pending && !fp->stopping)
			pthread_cond_wait(&fp->wake, &fp->lock);
		if (!fp->sync_pending)
			break;
		fp->sync_pending = false;
		pthread_mutex_unlock(&fp->lock);
		(void)fdatasync(fp->fd); /* an error shows again at the next flush */
		pthread_mutex_lock(&fp->lock);
	}
	pthread_mutex_unlock(&fp->lock);
	return NULL;
}

/* Ask for a background fdatasync of a regular file written through. */
static void kick_syncer(struct file_priv *fp)
{
	if (!fp->regular)
		return;
	pthread_mutex_lock(&fp->lock);
	if (!fp->syncer_running && !fp->stopping)
		fp->syncer_running = pthread_create(&fp->syncer, NULL, syncer_main, fp) == 0;
	fp->sync_pending = fp->syncer_running;
	pthread_cond_signal(&fp->wake);
	pthread_mutex_unlock(&fp->lock);
}

/*
 * Past the page cache (O_DIRECT, a second descriptor of the same file) when
 * buffer, length and offset are DIRECT_ALIGN-aligned and the file allows
 * it; otherwise as file_write. The kernel writes back and drops cached
 * pages of the range, so reads through the first descriptor stay coherent.
 */
static int file_write_through(struct blockdev *dev, const void *buf, size_t len, uint64_t offset)
{
	struct file_priv *fp = dev->priv;
	int ret;

	if (((uintptr_t)buf | len | offset) % DIRECT_ALIGN || fp->direct_fd == -2)
		return file_io(fp->fd, NULL, buf, len, offset);
	if (fp->direct_fd == -1) {
		char self[64];

		/* the same file whatever its path is now */
		snprintf(self, sizeof(self), "/proc/self/fd/%d", fp->fd);
		fp->direct_fd = open(self, O_WRONLY | O_DIRECT | O_CLOEXEC);
		if (fp->direct_fd < 0) {
			fp->direct_fd = -2;
			return file_io(fp->fd, NULL, buf, len, offset);
		}
	}
	ret = file_io(fp->direct_fd, NULL, buf, len, offset);
	if (ret == -EINVAL) {
		/* the filesystem under the file takes no direct I/O after all */
		close(fp->direct_fd);
		fp->direct_fd = -2;
		ret = file_io(fp->fd, NULL, buf, len, offset);
	} else if (ret == 0) {
		kick_syncer(fp);
	}
	return ret;
}

static int file_flush(struct blockdev *dev)
{
	struct file_priv *fp = dev->priv;

	if (fdatasync(fp->fd) < 0)
		return -errno;
	return 0;
}

static void file_close(struct blockdev *dev)
{
	struct file_priv *fp = dev->priv;

	pthread_mutex_lock(&fp->lock);
	fp->stopping = true;
	fp->sync_pending = false;
	pthread_cond_signal(&fp->wake);
	pthread_mutex_unlock(&fp->lock);
	if (fp->syncer_running)
		pthread_join(fp->syncer, NULL);
	pthread_cond_destroy(&fp->wake);
	pthread_mutex_destroy(&fp->lock);
	if (fp->excl_fd >= 0)
		close(fp->excl_fd);
	if (fp->direct_fd >= 0)
		close(fp->direct_fd);
	close(fp->fd);
	free(fp);
	free(dev->name);
	free(dev);
}

static void file_end_service(struct blockdev *dev)
{
	struct file_priv *fp = dev->priv;

	claim_end_service(fp->fd);
}

static const struct blockdev_ops file_ops = {
	.read = file_read,
	.write = file_write,
	.flush = file_flush,
	.close = file_close,
	.end_service = file_end_service,
	.write_through = file_write_through,
};

/* O_EXCL on a read-write block device: 0 with the descriptor in *excl_fd, or -EBUSY (logged). */
static int hold_block_device(const char *path, const struct stat *st, const struct blog *log,
			     int *excl_fd)
{
	char who[PATH_MAX + 128];

	*excl_fd = open(path, O_RDWR | O_EXCL | O_CLOEXEC);
	if (*excl_fd >= 0)
		return 0;
	if (errno != EBUSY)
		return -errno;
	claim_describe_holder(path, st, who, sizeof(who));
	blog_err(log, "%s: in use: %s", path, who[0] ? who : "held exclusively (mounted?)");
	return -EBUSY;
}

/*
 * Open @path (created with @create; a regular file smaller than @grow_to is
 * grown once claimed), claim it, and size it: fstat, or BLKGETSIZE64 for
 * block devices.
 */
static int open_file(const char *path, unsigned flags, int create, uint64_t grow_to,
		     const struct blog *log, struct blockdev **out)
{
	int readonly = !!(flags & BLOCKDEV_OPEN_RDONLY);
	struct file_priv *fp;
	struct blockdev *dev;
	int fd, excl_fd = -1, ret;
	struct stat st;
	uint64_t size;

	fd = open(path, (readonly ? O_RDONLY : O_RDWR) | (create ? O_CREAT : 0) | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		ret = -errno;
		goto fail_fd;
	}
	if (!S_ISBLK(st.st_mode) && !S_ISREG(st.st_mode)) {
		ret = S_ISDIR(st.st_mode) ? -EISDIR : -ENODEV;
		goto fail_fd;
	}
	ret = claim_take(fd, path, NULL, &st, flags, log);
	if (ret == 0 && !readonly && S_ISBLK(st.st_mode))
		ret = hold_block_device(path, &st, log, &excl_fd);
	if (ret == 0 && !readonly && S_ISREG(st.st_mode))
		ret = claim_check_loops(path, &st, log);
	if (ret == 0 && fstat(fd, &st) < 0) /* the size may have changed while we waited */
		ret = -errno;
	if (ret)
		goto fail_fd;
	if (S_ISBLK(st.st_mode)) {
		int ro = 0;

		if (ioctl(fd, BLKGETSIZE64, &size) < 0) {
			ret = -errno;
			goto fail_fd;
		}
		/* a read-only block device (losetup -r, a write-protected disk) opens O_RDWR */
		if (!readonly && ioctl(fd, BLKROGET, &ro) == 0 && ro) {
			blog_err(log, "%s: the block device is read-only", path);
			ret = -EROFS;
			goto fail_fd;
		}
	} else {
		size = (uint64_t)st.st_size;
		if (grow_to > size) {
			if (ftruncate(fd, (off_t)grow_to) < 0) {
				ret = -errno;
				goto fail_fd;
			}
			size = grow_to;
		}
	}
	dev = calloc(1, sizeof(*dev));
	fp = calloc(1, sizeof(*fp));
	if (!dev || !fp || !(dev->name = strdup(path))) {
		free(dev);
		free(fp);
		ret = -ENOMEM;
		goto fail_fd;
	}
	fp->fd = fd;
	fp->excl_fd = excl_fd;
	fp->direct_fd = -1;
	fp->regular = S_ISREG(st.st_mode);
	pthread_mutex_init(&fp->lock, NULL);
	pthread_cond_init(&fp->wake, NULL);
	dev->ops = &file_ops;
	dev->size = size;
	dev->readonly = readonly;
	dev->priv = fp;
	*out = dev;
	return 0;
fail_fd:
	if (excl_fd >= 0)
		close(excl_fd);
	close(fd);
	return ret;
}

int blockdev_open_file(const char *path, unsigned flags, const struct blog *log,
		       struct blockdev **out)
{
	return open_file(path, flags, 0, 0, log, out);
}

int blockdev_create_file(const char *path, uint64_t size, const struct blog *log,
			 struct blockdev **out)
{
	return open_file(path, 0, 1, size, log, out);
}
