/*
 * uring.h — FUSE over io_uring (Linux 6.14+): requests and replies through
 * ring entries instead of read(2) and writev(2) on /dev/fuse (uring.c says
 * why and how). Used by `butter mount -o uring` and bench/nullfs.c -u.
 */
#ifndef BUTTER_FUSE_URING_H
#define BUTTER_FUSE_URING_H

#include <stdbool.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "pollloop.h"
#include "wire.h"

/* FUSE_OVER_IO_URING, bit 41 of the INIT flags: bit 9 of flags2 */
#define URING_FUSE_INIT_FLAGS2 (1u << 9)

/* Was this binary built with liburing (else butter_uring_loop() says -ENOTSUP)? */
bool butter_uring_built(void);

struct butter_uring_cfg {
	unsigned threads;            /* ring threads (one entry each) in all, spread over the
				      * queues (one a possible CPU); 0: one a queue */
	unsigned min_per_queue;      /* but at least this many a queue (0: 1) */
	bool pin;                    /* run a queue's threads on its CPU only */
	unsigned dev_workers;        /* threads reading /dev/fuse (pollloop.c); 0: its default */
	unsigned spin_us;            /* their polling, while the ring does not carry requests */
	butter_raw_request_fn raw;   /* sees each request first (may be NULL), as pollloop.c's */
	void *raw_arg;
};

/*
 * Serve @se, whose custom I/O is wire.c's (@w, wire_attach()), through
 * pollloop.c's loop on /dev/fuse and, once the kernel has taken
 * FUSE_OVER_IO_URING in the INIT reply, through the ring as well. When the
 * kernel does not offer it, a warning goes to fuse_log() and /dev/fuse
 * serves alone. Returns when the session ends: 0 or -errno.
 */
int butter_uring_loop(struct fuse_session *se, struct wire *w, const struct butter_uring_cfg *cfg);

/* wire.c's side: a reply written through the session (@iov[0] the out header):
 * taken into its ring entry (bytes "written"), or -ENOENT when no ring
 * entry waits for it (write it to /dev/fuse). */
ssize_t uring_take_reply(struct uring *u, const struct iovec *iov, int count);

/* wire.c's side: the INIT reply has been written; the kernel @offered the
 * ring and the reply @taken it. Starts the ring's threads. */
void uring_init_answered(struct uring *u, bool offered, bool taken);

#endif
