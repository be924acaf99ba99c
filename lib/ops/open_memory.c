/*
 * open_memory.c — opening a filesystem image that lives in memory, for
 * fuzzing and tests: a memory device over the caller's bytes, then the same
 * open sequence as butter_open() (fs_open_bdevs in fs.c).
 *
 * Promises:
 *  1. The caller's bytes are never written: butter_open_memory() opens them
 *     read-only; butter_open_memory_cow() sends writes to private page
 *     copies (blockdev_open_memory_cow).
 *  2. They are never read outside [image, image + size): every read goes
 *     through the device layer's range check.
 *  3. It is never opened again in place (no paths to reopen).
 */
#include <errno.h>

#include "ops/ops.h"

static int open_memory(const void *image, size_t size, const struct butter_open_opts *opts,
		       int cow, struct butter_fs **out)
{
	struct butter_open_opts o = { 0 };
	struct blockdev *bdev;
	int ret;

	if (opts)
		o = *opts;
	if (o.ndevices || !image)
		return -EINVAL;
	if (cow) {
		ret = blockdev_open_memory_cow(image, size, &bdev);
	} else {
		o.flags |= BUTTER_OPEN_RDONLY; /* the bytes are borrowed: never set up writing */
		/* borrowed, not copied: the device only reads; the cast drops const for its ops */
		ret = blockdev_open_memory((void *)image, size, 0, &bdev);
		if (ret == 0)
			bdev->readonly = 1;
	}
	if (ret)
		return ret;
	return ops_open_bdevs("memory", &bdev, 1, &o, out);
}

int butter_open_memory(const void *image, size_t size, const struct butter_open_opts *opts,
		       struct butter_fs **out)
{
	return open_memory(image, size, opts, 0, out);
}

int butter_open_memory_cow(const void *image, size_t size, const struct butter_open_opts *opts,
			   struct butter_fs **out)
{
	return open_memory(image, size, opts, 1, out);
}
