/*
 * claim.h — the claim a device backend takes on the file it opens, so that
 * two openers never write one filesystem at once (protocol in claim.c).
 * Private to lib/device/.
 */
#ifndef BUTTER_DEVICE_CLAIM_H
#define BUTTER_DEVICE_CLAIM_H

#include <sys/stat.h>

#include "log.h"

/*
 * Claim the file open on @fd (@path, @st from fstat) as BLOCKDEV_OPEN_* @flags
 * say, for the device @name (NULL: @path itself; else an NBD URI whose lock
 * file @path is, named in messages and matched as a butter mount's source): a read-write open takes bytes 0 and 1 exclusively, waiting a bounded
 * time for a holder that is closing; a read-only open takes them shared when
 * it can. Returns 0; -EBUSY when refused (logged, naming the holder when it
 * can be found); -ETIMEDOUT is never returned (a holder still closing after
 * the wait is -EBUSY too).
 */
int claim_take(int fd, const char *path, const char *name, const struct stat *st, unsigned flags,
	       const struct blog *log);

/* Drop the "in service" byte of a claim taken on @fd (the holder starts closing). */
void claim_end_service(int fd);

/*
 * For a regular file opened read-write: refuse (-EBUSY, logged) when a loop
 * device backed by it is mounted or held with O_EXCL by someone.
 */
int claim_check_loops(const char *path, const struct stat *st, const struct blog *log);

/*
 * Describe who holds @st (a file, or a block device by its st_rdev) for a
 * message: "pid N (CMD)" and/or "mounted at DIR", or "" when nothing is found.
 */
void claim_describe_holder(const char *path, const struct stat *st, char *buf, size_t size);

#endif
