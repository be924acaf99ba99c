/*
 * file.c — the device backend for regular files and block devices, over
 * pread/pwrite/fdatasync. The only place butter issues raw I/O system calls
 * against storage.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/fs.h>

#include "device/device.h"

struct file_priv {
	int fd;
};

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

	close(fp->fd);
	free(fp);
	free(dev->name);
	free(dev);
}

static const struct blockdev_ops file_ops = {
	.read = file_read,
	.write = file_write,
	.flush = file_flush,
	.close = file_close,
};

/* Open @path; its size comes from fstat, or BLKGETSIZE64 for block devices. */
int blockdev_open_file(const char *path, int readonly, struct blockdev **out)
{
	struct blockdev *dev;
	struct file_priv *fp;
	struct stat st;
	uint64_t size;
	int fd, ret;

	fd = open(path, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		ret = -errno;
		goto fail_fd;
	}
	if (S_ISBLK(st.st_mode)) {
		if (ioctl(fd, BLKGETSIZE64, &size) < 0) {
			ret = -errno;
			goto fail_fd;
		}
	} else if (S_ISREG(st.st_mode)) {
		size = (uint64_t)st.st_size;
	} else {
		ret = S_ISDIR(st.st_mode) ? -EISDIR : -ENODEV;
		goto fail_fd;
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
	dev->ops = &file_ops;
	dev->size = size;
	dev->readonly = readonly;
	dev->priv = fp;
	*out = dev;
	return 0;
fail_fd:
	close(fd);
	return ret;
}

/*
 * Make sure @path can hold @size bytes: create the file if it does not exist
 * and grow a regular file that is smaller. Block devices are left alone.
 */
int blockdev_prepare_file(const char *path, uint64_t size)
{
	struct stat st;
	int fd, ret = 0;

	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0)
		ret = -errno;
	else if (S_ISREG(st.st_mode) && size && (uint64_t)st.st_size < size &&
		 ftruncate(fd, (off_t)size) < 0)
		ret = -errno;
	close(fd);
	return ret;
}
