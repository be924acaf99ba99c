/*
 * device.c — the generic half of the device layer: range checks and dispatch
 * to a backend's operations table. Backends live in their own files
 * (file.c, nbd.c, memory.c, recorder.c, fault.c); blockdev_open() picks
 * file or NBD by the name. blockdev_stack_test() puts the
 * test backends over opened devices and marks the top of each stack with
 * its record log, so that a device opened later for the same filesystem
 * can join it (blockdev_record_new() in recorder.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/fs.h>

#include "device/device.h"

static int range_ok(const struct blockdev *dev, size_t len, uint64_t offset)
{
	return offset <= dev->size && len <= dev->size - offset;
}

/* Read @len bytes at @offset; -EIO if the range passes the end. */
int blockdev_read(struct blockdev *dev, void *buf, size_t len, uint64_t offset)
{
	if (!range_ok(dev, len, offset))
		return -EIO;
	return dev->ops->read(dev, buf, len, offset);
}

/* Write @len bytes at @offset; -EROFS on a read-only device. */
int blockdev_write(struct blockdev *dev, const void *buf, size_t len, uint64_t offset)
{
	if (dev->readonly)
		return -EROFS;
	if (!range_ok(dev, len, offset))
		return -EIO;
	return dev->ops->write(dev, buf, len, offset);
}

int blockdev_write_through(struct blockdev *dev, const void *buf, size_t len, uint64_t offset)
{
	if (dev->readonly)
		return -EROFS;
	if (!range_ok(dev, len, offset))
		return -EIO;
	return dev->ops->write_through ? dev->ops->write_through(dev, buf, len, offset)
				       : dev->ops->write(dev, buf, len, offset);
}

int blockdev_flush(struct blockdev *dev)
{
	if (dev->readonly)
		return 0;
	return dev->ops->flush(dev);
}

int blockdev_open(const char *name, unsigned flags, const struct blog *log,
		  struct blockdev **out)
{
	if (blockdev_name_is_nbd(name))
		return blockdev_open_nbd(name, flags, 0, log, out);
	return blockdev_open_file(name, flags, log, out);
}

int blockdev_create(const char *name, uint64_t size, const struct blog *log,
		    struct blockdev **out)
{
	if (blockdev_name_is_nbd(name))
		return blockdev_open_nbd(name, 0, size, log, out);
	return blockdev_create_file(name, size, log, out);
}

int blockdev_probe_size(const char *name, const struct blog *log, uint64_t *size)
{
	struct blockdev *dev;
	struct stat st;
	int fd, ret = 0;

	if (blockdev_name_is_nbd(name)) {
		ret = blockdev_open_nbd(name, BLOCKDEV_OPEN_RDONLY | BLOCKDEV_OPEN_PROBE, 0, log,
					&dev);
		if (ret == 0) {
			*size = dev->size;
			blockdev_close(dev);
		}
		return ret;
	}
	if (stat(name, &st) < 0)
		return -errno;
	if (!S_ISBLK(st.st_mode)) {
		*size = (uint64_t)st.st_size;
		return 0;
	}
	fd = open(name, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ioctl(fd, BLKGETSIZE64, size) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

int blockdev_gone(struct blockdev *dev)
{
	return dev && dev->ops->gone ? dev->ops->gone(dev) : 0;
}

void blockdev_end_service(struct blockdev *dev)
{
	if (dev && dev->ops->end_service)
		dev->ops->end_service(dev);
}

void blockdev_close(struct blockdev *dev)
{
	if (dev)
		dev->ops->close(dev);
}

int blockdev_stack_test(struct blockdev **bdevs, size_t n, const char *record_log,
			const char *fault_spec)
{
	struct recorder_log *log = NULL;
	struct blockdev *wrapped;
	size_t i;
	int ret = 0;

	if (fault_spec)
		ret = blockdev_fault_spec_valid(fault_spec);
	if (ret == 0 && record_log)
		ret = recorder_log_open(record_log, &log);
	for (i = 0; i < n && ret == 0; i++) {
		if (log) {
			ret = blockdev_open_recorder(bdevs[i], log, (uint32_t)i, &wrapped);
			if (ret)
				break;
			bdevs[i] = wrapped;
		}
		if (fault_spec) {
			ret = blockdev_open_fault(bdevs[i], fault_spec, (int)i, &wrapped);
			if (ret)
				break;
			bdevs[i] = wrapped;
		}
		bdevs[i]->record = log; /* blockdev_record_new() finds the log here */
	}
	recorder_log_put(log);
	if (ret) {
		for (i = 0; i < n; i++) {
			blockdev_close(bdevs[i]);
			bdevs[i] = NULL;
		}
	}
	return ret;
}
