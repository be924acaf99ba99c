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
 *  4. end_service (optional) tells whoever waits to open the same device
 *     that this holder has started closing (file.c, claim.c); wrappers
 *     pass it to the device they wrap.
 */
#ifndef BUTTER_DEVICE_DEVICE_H
#define BUTTER_DEVICE_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"

struct blockdev;
struct recorder_log;

struct blockdev_ops {
	int (*read)(struct blockdev *dev, void *buf, size_t len, uint64_t offset);
	int (*write)(struct blockdev *dev, const void *buf, size_t len, uint64_t offset);
	int (*flush)(struct blockdev *dev);
	void (*close)(struct blockdev *dev);
	void (*end_service)(struct blockdev *dev);
	/*
	 * Optional: write bytes that need not stay in any cache (large data
	 * written back from memory), past the page cache where the backend can
	 * (file.c: O_DIRECT for aligned buffers), so a later flush has them
	 * written already. Without it, write.
	 */
	int (*write_through)(struct blockdev *dev, const void *buf, size_t len, uint64_t offset);
	/*
	 * Optional: nonzero once the device is gone for the rest of this open
	 * (nbd.c: its server timed out or closed the connection); every
	 * request fails at once then, and the layers above treat it as a
	 * missing device instead of reporting each failed read. Wrappers pass
	 * it on.
	 */
	int (*gone)(struct blockdev *dev);
};

struct blockdev {
	const struct blockdev_ops *ops;
	uint64_t size;  /* bytes */
	char *name;     /* for messages: the path, or "memory" */
	int readonly;
	void *priv;     /* backend state */
	/*
	 * The record log this device's writes go to, or NULL: set on the top
	 * of each stack blockdev_stack_test() builds with a log, and on the
	 * devices blockdev_record_new() wraps. Borrowed: the recorder in the
	 * stack holds the reference for as long as the device is open.
	 */
	struct recorder_log *record;
};

int blockdev_read(struct blockdev *dev, void *buf, size_t len, uint64_t offset);
int blockdev_write(struct blockdev *dev, const void *buf, size_t len, uint64_t offset);
/* blockdev_write() through ops->write_through when the backend has it. */
int blockdev_write_through(struct blockdev *dev, const void *buf, size_t len, uint64_t offset);
int blockdev_flush(struct blockdev *dev);
void blockdev_close(struct blockdev *dev);

/* ops->gone(), 0 without it. */
int blockdev_gone(struct blockdev *dev);

/* Tell waiting openers that the holder of @dev has started closing (contract 4). */
void blockdev_end_service(struct blockdev *dev);

/* blockdev_open_file() flags */
#define BLOCKDEV_OPEN_RDONLY 0x1u    /* never written; claimed shared */
#define BLOCKDEV_OPEN_NO_WRITER 0x2u /* with RDONLY: refuse while a read-write holder has it */
#define BLOCKDEV_OPEN_PROBE 0x4u     /* with RDONLY: only to look (a size): no claim taken */

/*
 * Open a regular file or block device and claim it (protocol in claim.c):
 * read-write exclusively (waiting up to 60 s for a holder that is closing),
 * read-only shared when no writer holds it. -EBUSY when it is in use (the
 * holder is named in the log), else -errno from open(2)/fstat(2).
 */
int blockdev_open_file(const char *path, unsigned flags, const struct blog *log,
		       struct blockdev **out);

/*
 * As blockdev_open_file() read-write, creating @path if it is missing; a
 * regular file smaller than @size bytes is grown to @size once claimed.
 */
int blockdev_create_file(const char *path, uint64_t size, const struct blog *log,
			 struct blockdev **out);

/*
 * The device named @name: an NBD URI (blockdev_name_is_nbd) through
 * blockdev_open_nbd(), anything else through blockdev_open_file(). The
 * front ends pass device names here and nowhere else.
 */
int blockdev_open(const char *name, unsigned flags, const struct blog *log,
		  struct blockdev **out);

/*
 * As blockdev_open() read-write for a new filesystem of @size bytes: an
 * image file is created or grown (blockdev_create_file); an NBD export must
 * be at least @size bytes already.
 */
int blockdev_create(const char *name, uint64_t size, const struct blog *log,
		    struct blockdev **out);

/* The size of the device @name (not claimed, not written); -errno, logged for NBD names. */
int blockdev_probe_size(const char *name, const struct blog *log, uint64_t *size);

/*
 * nbd.c: whether @err (negative) is how blockdev_open_nbd() refuses to open
 * an export, having logged why naming its URI (so a front end need not name
 * a device for it).
 */
bool blockdev_nbd_open_error(int err);

/* nbd.c: true when @name is an NBD URI (nbd://, nbds://, nbd+unix://, ...). */
bool blockdev_name_is_nbd(const char *name);

/*
 * Connect to the NBD export @uri (nbd.c; the URI forms of libnbd), bounded
 * by BUTTER_NBD_TIMEOUT seconds. -EROFS when a read-write open meets a
 * read-only export, -ENOSPC when it is smaller than @min_size (0: any),
 * -EPROTONOSUPPORT in a build without libnbd, else -errno of the
 * connection; each failure is logged naming @uri.
 */
int blockdev_open_nbd(const char *uri, unsigned flags, uint64_t min_size,
		      const struct blog *log, struct blockdev **out);

/*
 * A device over @size bytes of memory. With @copy the bytes at @data are
 * copied (and @data may be NULL for zeroes); otherwise the device borrows
 * @data, which must outlive it.
 */
int blockdev_open_memory(void *data, uint64_t size, int copy, struct blockdev **out);

/*
 * A writable device over the borrowed @base (@size bytes, which must outlive
 * it and never change): writes go to private copies of the pages they touch;
 * @base is never written. What was written is lost at close.
 */
int blockdev_open_memory_cow(const void *base, uint64_t size, struct blockdev **out);

/* ---- test backends (recorder.c, fault.c) --------------------------------- */

/* struct recorder_log: a write/flush log shared by the recorder devices of one filesystem. */

/* Create (or truncate) the log file @path. The caller holds one reference. */
int recorder_log_open(const char *path, struct recorder_log **out);
void recorder_log_put(struct recorder_log *log);

/*
 * Wrap @inner (owned by the new device from now on, on success) so that
 * every completed write and flush is appended to @log as device @devidx.
 * The new device takes its own reference on @log.
 */
int blockdev_open_recorder(struct blockdev *inner, struct recorder_log *log, uint32_t devidx,
			   struct blockdev **out);

/*
 * Wrap @inner (owned by the new device on success) in the fault injector
 * configured by @spec (language in fault.c), keeping the rules for device
 * index @devidx. -EINVAL on a bad spec.
 */
int blockdev_open_fault(struct blockdev *inner, const char *spec, int devidx,
			struct blockdev **out);

/* 0 if @spec parses, -EINVAL if not. */
int blockdev_fault_spec_valid(const char *spec);

/*
 * Stack the test backends over the opened devices @bdevs[0..n): each device
 * i becomes fault(recorder(bdevs[i])) — the recorder logs what reached the
 * real device, the fault injector sits above it — when @record_log and
 * @fault_spec are set (either may be NULL). On failure every device is
 * closed and the array entries are NULL.
 */
int blockdev_stack_test(struct blockdev **bdevs, size_t n, const char *record_log,
			const char *fault_spec);

/*
 * A device opened for a filesystem that is already open (a replace target,
 * a device being added): if @member, any device of that filesystem, is
 * recorded (member->record), stack a recorder over @dev in place — @dev
 * stays the same handle, now logging to the same log as the next device
 * index — so crash replays see its writes too. Only the recorder: a fault
 * spec does not reach such a device. 0 (nothing done when @member is not
 * recorded) or -errno, @dev unchanged then.
 */
int blockdev_record_new(const struct blockdev *member, struct blockdev *dev);

#endif
