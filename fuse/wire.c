/*
 * wire.c — what passes on /dev/fuse that libfuse 3.14 does not show the
 * daemon, read and written through libfuse's custom I/O hooks
 * (fuse_session_custom_io): every loop (single, libfuse's multithreaded,
 * pollloop.c) reads requests and writes replies through these two functions.
 *
 * Why: the kernel's protocol 7.33+ has FUSE_HANDLE_KILLPRIV_V2: the server
 * clears setuid/setgid where the VFS would (a write, a truncate or a chown by
 * a caller without CAP_FSETID), told so by flags in the request, and the
 * kernel marks its superblock SB_NOSEC. Without it the kernel asks for
 * security.capability (a GETXATTR round trip) at every write(2) to learn
 * whether privileges must go; with it, once per inode until a security xattr
 * or a setuid/setgid mode appears. libfuse 3.14 neither offers the flag in its
 * INIT reply nor passes the kill flags of WRITE and SETATTR on. So:
 *
 *   - reading a request: FUSE_INIT's offered flags are kept (and its unique),
 *     a WRITE's FUSE_WRITE_KILL_SUIDGID and a SETATTR's FATTR_KILL_SUIDGID go
 *     into the reading thread's note (wire_kill_suidgid()), which the
 *     operation libfuse then runs in that same thread reads (ops.c);
 *   - writing the INIT reply: FUSE_HANDLE_KILLPRIV_V2 is added when the
 *     kernel offered it and the daemon wants it (w->want_killpriv_v2; the
 *     daemon's op_init turned version 1 off).
 *
 * Every libfuse loop reads a request and runs it in the same thread, so a
 * thread-local note is the request's own. Nothing else in a request or a
 * reply is changed; replies not to INIT are written as they come.
 */
#include <errno.h>
#include <linux/fuse.h>
#include <stddef.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "wire.h"

/* The request this thread is serving: what libfuse dropped from it. */
static _Thread_local bool note_kill_suidgid;

bool wire_kill_suidgid(void)
{
	return note_kill_suidgid;
}

static ssize_t wire_read(int fd, void *buf, size_t len, void *userdata)
{
	struct wire *w = userdata; /* the userdata's first member (wire.h) */
	ssize_t n = read(fd, buf, len);
	struct fuse_in_header in;

	note_kill_suidgid = false;
	if (n < (ssize_t)sizeof(in))
		return n;
	memcpy(&in, buf, sizeof(in));
	const char *arg = (const char *)buf + sizeof(in);
	size_t arglen = (size_t)n - sizeof(in);

	switch (in.opcode) {
	case FUSE_INIT: {
		struct fuse_init_in init;

		if (arglen < offsetof(struct fuse_init_in, flags2))
			break;
		memset(&init, 0, sizeof(init));
		memcpy(&init, arg, arglen < sizeof(init) ? arglen : sizeof(init));
		w->init_unique = in.unique;
		w->init_flags = init.flags;
		break;
	}
	case FUSE_WRITE: {
		struct fuse_write_in wr;

		if (arglen >= sizeof(wr)) {
			memcpy(&wr, arg, sizeof(wr));
			note_kill_suidgid = (wr.write_flags & FUSE_WRITE_KILL_SUIDGID) != 0;
		}
		break;
	}
	case FUSE_SETATTR: {
		struct fuse_setattr_in s;

		if (arglen >= sizeof(s)) {
			memcpy(&s, arg, sizeof(s));
			note_kill_suidgid = (s.valid & FATTR_KILL_SUIDGID) != 0;
		}
		break;
	}
	default:
		break;
	}
	return n;
}

static ssize_t wire_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	struct wire *w = userdata; /* the userdata's first member (wire.h) */
	struct fuse_out_header out;

	/*
	 * libfuse writes a reply as the header in iov[0] and the argument in
	 * iov[1] (send_reply_ok: fuse_send_reply_iov_nofree).
	 */
	if (count >= 2 && iov[0].iov_len == sizeof(out) && w->init_unique) {
		memcpy(&out, iov[0].iov_base, sizeof(out));
		if (out.unique == w->init_unique && out.error == 0 &&
		    iov[1].iov_len >= offsetof(struct fuse_init_out, flags) + sizeof(uint32_t)) {
			struct fuse_init_out *init = iov[1].iov_base;

			w->init_unique = 0;
			if (w->want_killpriv_v2 && (w->init_flags & FUSE_HANDLE_KILLPRIV_V2) &&
			    !(init->flags & FUSE_HANDLE_KILLPRIV)) {
				init->flags |= FUSE_HANDLE_KILLPRIV_V2;
				w->killpriv_v2 = true;
			}
		}
	}
	return writev(fd, iov, count);
}

int wire_attach(struct fuse_session *se, struct wire *w)
{
	static const struct fuse_custom_io io = {
		.read = wire_read,
		.writev = wire_writev,
	};

	w->killpriv_v2 = false;
	w->init_unique = 0;
	return fuse_session_custom_io(se, &io, fuse_session_fd(se));
}
