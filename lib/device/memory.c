/*
 * memory.c — device backends over bytes in memory, for unit tests and
 * fuzzing (a mutated image never touches the disk):
 *  - plain: reads and writes go to one buffer (owned or borrowed);
 *  - copy-on-write: reads come from a borrowed base image until a page is
 *    written; the first write to a page copies it into a private page table.
 *    The base is never written, so a fuzz harness can run a write workload
 *    over an image without copying it whole for every input.
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

/* ---- copy-on-write over a borrowed base --------------------------------- */

#define COW_PAGE 4096u

struct cow_priv {
	const unsigned char *base;
	unsigned char **pages; /* one per COW_PAGE of the device; NULL: still the base's */
	size_t npages;
};

static int cow_read(struct blockdev *dev, void *buf, size_t len, uint64_t offset)
{
	struct cow_priv *cp = dev->priv;
	unsigned char *out = buf;

	while (len) {
		size_t idx = (size_t)(offset / COW_PAGE), in = (size_t)(offset % COW_PAGE);
		size_t n = COW_PAGE - in < len ? COW_PAGE - in : len;

		memcpy(out, cp->pages[idx] ? cp->pages[idx] + in : cp->base + offset, n);
		out += n;
		offset += n;
		len -= n;
	}
	return 0;
}

static int cow_write(struct blockdev *dev, const void *buf, size_t len, uint64_t offset)
{
	struct cow_priv *cp = dev->priv;
	const unsigned char *in_buf = buf;

	while (len) {
		size_t idx = (size_t)(offset / COW_PAGE), in = (size_t)(offset % COW_PAGE);
		size_t n = COW_PAGE - in < len ? COW_PAGE - in : len;

		if (!cp->pages[idx]) {
			uint64_t start = (uint64_t)idx * COW_PAGE;
			size_t have = COW_PAGE;

			if (dev->size - start < COW_PAGE)
				have = (size_t)(dev->size - start);

			cp->pages[idx] = calloc(1, COW_PAGE);
			if (!cp->pages[idx])
				return -ENOMEM;
			memcpy(cp->pages[idx], cp->base + start, have);
		}
		memcpy(cp->pages[idx] + in, in_buf, n);
		in_buf += n;
		offset += n;
		len -= n;
	}
	return 0;
}

static void cow_close(struct blockdev *dev)
{
	struct cow_priv *cp = dev->priv;
	size_t i;

	for (i = 0; i < cp->npages; i++)
		free(cp->pages[i]);
	free(cp->pages);
	free(cp);
	free(dev->name);
	free(dev);
}

static const struct blockdev_ops cow_ops = {
	.read = cow_read,
	.write = cow_write,
	.flush = memory_flush,
	.close = cow_close,
};

int blockdev_open_memory_cow(const void *base, uint64_t size, struct blockdev **out)
{
	struct blockdev *dev = calloc(1, sizeof(*dev));
	struct cow_priv *cp = calloc(1, sizeof(*cp));

	if (size / COW_PAGE >= SIZE_MAX / sizeof(*cp->pages))
		goto nomem;
	if (!dev || !cp || !(dev->name = strdup("memory")))
		goto nomem;
	cp->base = base;
	cp->npages = (size_t)((size + COW_PAGE - 1) / COW_PAGE);
	cp->pages = calloc(cp->npages ? cp->npages : 1, sizeof(*cp->pages));
	if (!cp->pages)
		goto nomem;
	dev->ops = &cow_ops;
	dev->size = size;
	dev->priv = cp;
	*out = dev;
	return 0;
nomem:
	if (dev)
		free(dev->name);
	free(dev);
	if (cp)
		free(cp->pages);
	free(cp);
	return -ENOMEM;
}
