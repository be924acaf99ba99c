/*
 * device.c — the generic half of the device layer: range checks and dispatch
 * to a backend's operations table. Backends live in their own files
 * (file.c, memory.c, recorder.c, fault.c). blockdev_stack_test() puts the
 * test backends over opened devices and marks the top of each stack with
 * its record log, so that a device opened later for the same filesystem
 * can join it (blockdev_record_new() in recorder.c).
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
