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
 * FUSE over io_uring (uring.c) also goes through here: with its loop
 * running (w->ring), the INIT reply takes FUSE_OVER_IO_URING (flags2, with
 * FUSE_INIT_EXT) when the kernel offers it, and records the largest payload
 * the kernel will send or take (ring buffers must hold it); once that reply
 * is written uring.c starts its threads; and every reply with a unique is
 * offered to uring.c first, which keeps those of requests that came through
 * a ring entry. Requests of the ring are not read here: uring.c notes them
 * (wire_note_request()) in the thread that runs them.
 *
 * Every loop reads a request and runs it in the same thread, so a
 * thread-local note is the request's own. Nothing else in a request or a
 * reply is changed; replies not to INIT are written as they come.
 */
#include <errno.h>
#include <linux/fuse.h>
#include <stddef.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "uring.h"
#include "wire.h"

/* The request this thread is serving: what libfuse dropped from it. */
static _Thread_local bool note_kill_suidgid;

bool wire_kill_suidgid(void)
{
	return note_kill_suidgid;
}

/* The offered flags of FUSE_INIT (@arg: its argument, @arglen bytes). */
static void note_init(struct wire *w, uint64_t unique, const char *arg, size_t arglen)
{
	struct fuse_init_in init;

	if (arglen < offsetof(struct fuse_init_in, flags2))
		return;
	memset(&init, 0, sizeof(init));
	memcpy(&init, arg, arglen < sizeof(init) ? arglen : sizeof(init));
	w->init_unique = unique;
	w->init_flags = init.flags;
	w->init_flags2 = (init.flags & FUSE_INIT_EXT) ? init.flags2 : 0;
}

void wire_note_request(struct wire *w, const void *buf, size_t n)
{
	struct fuse_in_header in;

	note_kill_suidgid = false;
	if (n < sizeof(in))
		return;
	memcpy(&in, buf, sizeof(in));
	const char *arg = (const char *)buf + sizeof(in);
	size_t arglen = n - sizeof(in);

	switch (in.opcode) {
	case FUSE_INIT:
		note_init(w, in.unique, arg, arglen);
		break;
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
}

static ssize_t wire_read(int fd, void *buf, size_t len, void *userdata)
{
	struct wire *w = userdata; /* the userdata's first member (wire.h) */
	ssize_t n = read(fd, buf, len);

	if (n < 0)
		note_kill_suidgid = false;
	else
		wire_note_request(w, buf, (size_t)n);
	return n;
}

/* The kernel's largest payload of a request or reply, from the INIT reply @init. */
static uint32_t max_payload(const struct fuse_init_out *init, size_t len)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t pages = 32; /* the kernel's default without FUSE_MAX_PAGES */
	uint64_t max = 8192; /* FUSE_MIN_READ_BUFFER */

	if (page <= 0)
		page = 4096;
	if (len >= offsetof(struct fuse_init_out, max_pages) + sizeof(init->max_pages) &&
	    (init->flags & FUSE_MAX_PAGES))
		pages = init->max_pages ? init->max_pages : 1;
	if (len >= offsetof(struct fuse_init_out, max_write) + sizeof(init->max_write) &&
	    init->max_write > max)
		max = init->max_write;
	if (pages * (uint64_t)page > max)
		max = pages * (uint64_t)page;
	return (uint32_t)max;
}

/*
 * The INIT reply (@init, @len bytes): add what the kernel offered and the
 * daemon wants. Returns true when it takes FUSE_OVER_IO_URING.
 */
static bool patch_init(struct wire *w, struct fuse_init_out *init, size_t len)
{
	if (w->want_killpriv_v2 && (w->init_flags & FUSE_HANDLE_KILLPRIV_V2) &&
	    !(init->flags & FUSE_HANDLE_KILLPRIV)) {
		init->flags |= FUSE_HANDLE_KILLPRIV_V2;
		w->killpriv_v2 = true;
	}
	w->max_payload = max_payload(init, len);
	if (w->ring && (w->init_flags & FUSE_INIT_EXT) &&
	    (w->init_flags2 & URING_FUSE_INIT_FLAGS2) &&
	    len >= offsetof(struct fuse_init_out, flags2) + sizeof(init->flags2)) {
		init->flags |= FUSE_INIT_EXT; /* libfuse sets it too when offered */
		init->flags2 |= URING_FUSE_INIT_FLAGS2;
		return true;
	}
	return false;
}

static ssize_t wire_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	struct wire *w = userdata; /* the userdata's first member (wire.h) */
	struct fuse_out_header out;
	bool init = false, uring = false;
	ssize_t n;

	if (count < 1 || iov[0].iov_len != sizeof(out))
		return writev(fd, iov, count);
	memcpy(&out, iov[0].iov_base, sizeof(out));
	if (w->ring && out.unique) {
		/* a reply to a request of the ring goes back through it */
		n = uring_take_reply(w->ring, iov, count);
		if (n != -ENOENT) {
			if (n >= 0)
				return n;
			errno = (int)-n;
			return -1;
		}
	}
	/*
	 * libfuse writes a reply as the header in iov[0] and the argument in
	 * iov[1] (send_reply_ok: fuse_send_reply_iov_nofree).
	 */
	if (count >= 2 && w->init_unique && out.unique == w->init_unique && out.error == 0 &&
	    iov[1].iov_len >= offsetof(struct fuse_init_out, flags) + sizeof(uint32_t)) {
		w->init_unique = 0;
		init = true;
		uring = patch_init(w, iov[1].iov_base, iov[1].iov_len);
	}
	n = writev(fd, iov, count);
	if (init && w->ring) {
		/* the kernel has taken the reply: the ring may be registered now */
		w->uring = uring && n >= 0;
		uring_init_answered(w->ring, w->init_flags2 & URING_FUSE_INIT_FLAGS2, w->uring);
	}
	return n;
}

ssize_t wire_send(struct wire *w, int fd, struct iovec *iov, int count)
{
	return wire_writev(fd, iov, count, w);
}

int wire_attach(struct fuse_session *se, struct wire *w)
{
	static const struct fuse_custom_io io = {
		.read = wire_read,
		.writev = wire_writev,
	};

	w->killpriv_v2 = false;
	w->init_unique = 0;
	w->init_flags = w->init_flags2 = 0;
	w->uring = false;
	w->max_payload = 0;
	return fuse_session_custom_io(se, &io, fuse_session_fd(se));
}
