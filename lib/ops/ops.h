/*
 * ops.h — the operations on a whole filesystem, above every other layer:
 * opening and closing (open.c, with the recovery of a read-write open),
 * scrub, device add and statistics, resize, mkfs, send, receive and check.
 * Not a public header.
 */
#ifndef BUTTER_OPS_OPS_H
#define BUTTER_OPS_OPS_H

#include "treelog/treelog.h"

/*
 * Open the filesystem on the already opened devices @bdevs[0..n): all of
 * butter_open() after opening the files (fs_open_bdevs(), then for a
 * read-write open the write side and the recovery steps). Ownership of every
 * device passes to the handle, also on failure. Errors as butter_open().
 */
int ops_open_bdevs(const char *path, struct blockdev **bdevs, size_t n,
		   const struct butter_open_opts *opts, struct butter_fs **out);

#endif
