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

#endif
