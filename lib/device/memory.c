/*
 * memory.c — a device backend over a buffer in memory, for unit tests and
 * fuzzing (a mutated image never touches the disk).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"

struct memory_priv {
	unsigned char *data;
	int owned;
};

static int memory_read(struct blockdev *dev, void *buf, size_t len, uint64_t offset)
{
	struct memory_priv *mp = dev->priv;

	memcpy(buf, mp->data + offset, len);
	return 0;
}

static int memory_write(struct blockdev *dev, const void *buf, size_t len, uint64_t offset)
{
	struct memory_priv *mp = dev->priv;

	memcpy(mp->data + offset, buf, len);
	return 0;
}

static int memory_flush(struct blockdev *dev)
{
	(void)dev;
	return 0;
}

static void memory_close(struct blockdev *dev)
{
	struct memory_priv *mp = dev->priv;

	if (mp->owned)
		free(mp->data);
	free(mp);
	free(dev->name);
	free(dev);
}

static const struct blockdev_ops memory_ops = {
	.read = memory_read,
	.write = memory_write,
	.flush = memory_flush,
	.close = memory_close,
};

int blockdev_open_memory(void *data, uint64_t size, int copy, struct blockdev **out)
{
	struct blockdev *dev = calloc(1, sizeof(*dev));
	struct memory_priv *mp = calloc(1, sizeof(*mp));

	if (!dev || !mp || !(dev->name = strdup("memory")))
		goto nomem;
	if (copy) {
		mp->data = calloc(1, size ? size : 1);
		if (!mp->data)
			goto nomem;
		if (data)
			memcpy(mp->data, data, size);
		mp->owned = 1;
	} else {
		mp->data = data;
	}
	dev->ops = &memory_ops;
	dev->size = size;
	dev->priv = mp;
	*out = dev;
	return 0;
nomem:
	if (dev)
		free(dev->name);
	free(dev);
	free(mp);
	return -ENOMEM;
}
