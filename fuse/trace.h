/*
 * trace.h — the access trace of `butter mount -o trace=FILE` (trace.c says
 * what is recorded and in which format).
 */
#ifndef BUTTER_FUSE_TRACE_H
#define BUTTER_FUSE_TRACE_H

#include <stdint.h>

#include <butter/butter.h>

struct daemon;

/*
 * Create (truncate) @path and start recording into it, paths counted from
 * @root (the mount's root directory). Refuses a @path inside the mountpoint.
 * 0, or -errno after a message.
 */
int trace_open(struct daemon *d, const char *path, butter_ino_t root);
/* A read of @len bytes at @off of @ino was answered: record what is new. */
void trace_read(struct daemon *d, butter_ino_t ino, uint64_t off, uint64_t len);
/* Write out what is buffered and stop (at unmount). */
void trace_close(struct daemon *d);

#endif
