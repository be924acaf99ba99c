/*
 * open_memory.c — opening a filesystem image that lives in memory, for
 * fuzzing and tests: a memory device borrowed over the caller's bytes, then
 * the same open sequence as butter_open() (fs_open_bdevs in fs.c).
 *
 * Promise: the caller's bytes are never written (the device is read-only) and
 * never read outside [image, image + size): every read goes through the device
 * layer's range check.
 */
#include <errno.h>

#include "fs/fs.h"

int butter_open_memory(const void *image, size_t size, const struct butter_open_opts *opts,
		       struct butter_fs **out)
{
	struct butter_open_opts ro = { 0 };
	struct blockdev *bdev;
	int ret;

	if (opts)
		ro = *opts;
	if (ro.ndevices || !image)
		return -EINVAL;
	ro.flags |= BUTTER_OPEN_RDONLY; /* the bytes are borrowed: never set up writing */
	/* borrowed, not copied: the device only reads, and the cast drops const for its ops table */
	ret = blockdev_open_memory((void *)image, size, 0, &bdev);
	if (ret)
		return ret;
	bdev->readonly = 1;
	return fs_open_bdevs("memory", &bdev, 1, &ro, out);
}
