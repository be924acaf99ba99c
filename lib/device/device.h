/*
 * device.h — a block device is an operations table. Every byte butter reads
 * from or writes to storage passes through one of these, so tests can swap in
 * a memory image, a recorder (crash tests) or a fault injector.
 *
 * Contract of every backend:
 *  1. read/write transfer exactly @len bytes at @offset or fail with a
 *     negative errno; a range beyond the end of the device is -EIO.
 *  2. flush returns only when every write that completed before it is durable.
 *  3. close frees the handle; it does not flush.
 */
#ifndef BUTTER_DEVICE_DEVICE_H
#define BUTTER_DEVICE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

struct blockdev;

struct blockdev_ops {
	int (*read)(struct blockdev *dev, void *buf, size_t len, uint64_t offset);
	int (*write)(struct blockdev *dev, const void *buf, size_t len, uint64_t offset);
	int (*flush)(struct blockdev *dev);
	void (*close)(struct blockdev *dev);
};

struct blockdev {
	const struct blockdev_ops *ops;
	uint64_t size;  /* bytes */
	char *name;     /* for messages: the path, or "memory" */
	int readonly;
	void *priv;     /* backend state */
};

int blockdev_read(struct blockdev *dev, void *buf, size_t len, uint64_t offset);
int blockdev_write(struct blockdev *dev, const void *buf, size_t len, uint64_t offset);
int blockdev_flush(struct blockdev *dev);
void blockdev_close(struct blockdev *dev);

/* Open a regular file or block device. -errno from open(2)/fstat(2). */
int blockdev_open_file(const char *path, int readonly, struct blockdev **out);

/* Create @path if missing and grow a regular file to at least @size bytes. */
int blockdev_prepare_file(const char *path, uint64_t size);

/*
 * A device over @size bytes of memory. With @copy the bytes at @data are
 * copied (and @data may be NULL for zeroes); otherwise the device borrows
 * @data, which must outlive it.
 */
int blockdev_open_memory(void *data, uint64_t size, int copy, struct blockdev **out);

#endif
