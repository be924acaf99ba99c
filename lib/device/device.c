/*
 * device.c — the generic half of the device layer: range checks and dispatch
 * to a backend's operations table. Backends live in their own files
 * (file.c, memory.c, and later the recorder and fault injector).
 */
#include <errno.h>
#include <stdlib.h>

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

int blockdev_flush(struct blockdev *dev)
{
	if (dev->readonly)
		return 0;
	return dev->ops->flush(dev);
}

void blockdev_close(struct blockdev *dev)
{
	if (dev)
		dev->ops->close(dev);
}
