/*
 * wire.h — what passes on /dev/fuse that libfuse 3.14 does not show a daemon
 * (wire.c says why and how). Used by `butter mount` and by bench/nullfs.c.
 */
#ifndef BUTTER_FUSE_WIRE_H
#define BUTTER_FUSE_WIRE_H

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 314 /* as fuse/daemon.h */
#endif
#include <fuse_lowlevel.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

struct uring;

/*
 * The state of one session's wire. It must be the FIRST member of the
 * userdata the session was made with (fuse_session_new): libfuse hands the
 * custom I/O functions that pointer and nothing else.
 */
struct wire {
	bool want_killpriv_v2;   /* offer FUSE_HANDLE_KILLPRIV_V2 (set before wire_attach) */
	bool killpriv_v2;        /* the kernel took it: the daemon clears setuid/setgid */
	uint64_t init_unique;    /* FUSE_INIT's unique until its reply is written; 0: none */
	uint32_t init_flags;     /* the flags the kernel offered in FUSE_INIT */
	uint32_t init_flags2;    /* and its flags2 (with FUSE_INIT_EXT; else 0) */
	/*
	 * FUSE over io_uring (uring.c): its loop sets @ring before the first
	 * request is read; the INIT reply then takes FUSE_OVER_IO_URING when
	 * the kernel offers it (@uring), and wire.c hands uring.c the replies
	 * to requests that came through the ring.
	 */
	struct uring *ring;
	bool uring;              /* the INIT reply took FUSE_OVER_IO_URING */
	uint32_t max_payload;    /* the kernel's largest request or reply payload (INIT reply) */
};

/*
 * Put wire.c's reader and writer between libfuse and /dev/fuse, after
 * fuse_session_mount(). @w is the first member of @se's userdata.
 * 0 or -errno.
 */
int wire_attach(struct fuse_session *se, struct wire *w);

/*
 * Does the request the calling thread serves carry FUSE_WRITE_KILL_SUIDGID
 * (WRITE) or FATTR_KILL_SUIDGID (SETATTR)? Valid inside the operation
 * libfuse runs for it.
 */
bool wire_kill_suidgid(void);

/*
 * Note what libfuse drops from the request @req (@len bytes, laid out as
 * /dev/fuse delivers it) in the calling thread, which then runs it: for
 * requests not read through wire.c (uring.c's ring).
 */
void wire_note_request(struct wire *w, const void *req, size_t len);

/*
 * Write a reply (or a notification) as libfuse writes one: @iov[0] is the
 * fuse_out_header. For a daemon's own replies (tmpfile.c), so a request that
 * came through the ring is answered there. Bytes written or -1 and errno.
 */
ssize_t wire_send(struct wire *w, int fd, struct iovec *iov, int count);

#endif
