/*
 * pollloop.h — a FUSE request loop that polls briefly after each reply
 * (pollloop.c says why). Used by `butter mount` and by bench/nullfs.c.
 */
#ifndef BUTTER_FUSE_POLLLOOP_H
#define BUTTER_FUSE_POLLLOOP_H

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 314 /* as fuse/daemon.h */
#endif
#include <fuse_lowlevel.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

/*
 * Serve @se with @workers threads (0: 8) that keep reading requests for
 * @spin_us microseconds after each reply. Returns when the session ends:
 * 0, or the first receive error as -errno.
 */
int butter_poll_loop(struct fuse_session *se, unsigned workers, unsigned spin_us);

/*
 * A handler that sees each request read into memory before libfuse does:
 * it returns true when it answered the request itself (for requests libfuse
 * does not pass on), false to leave it to libfuse.
 */
typedef bool (*butter_raw_request_fn)(void *arg, const void *req, size_t len);

/* butter_poll_loop() with @raw (may be NULL) called first for every request. */
int butter_poll_loop_raw(struct fuse_session *se, unsigned workers, unsigned spin_us,
			 butter_raw_request_fn raw, void *raw_arg);

/*
 * butter_poll_loop_raw() whose workers do not poll while *@quiet is true
 * (@quiet may be NULL): uring.c's loop, once the ring carries the requests.
 */
int butter_poll_loop_quiet(struct fuse_session *se, unsigned workers, unsigned spin_us,
			   butter_raw_request_fn raw, void *raw_arg, const atomic_bool *quiet);

#endif
