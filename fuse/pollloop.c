/*
 * pollloop.c — the request loop of `butter mount -o spin=US`: worker threads
 * that, after answering a request, keep reading /dev/fuse without sleeping
 * for up to US microseconds before they wait again.
 *
 * Why: on a virtual machine, waking a thread whose CPU went idle costs an
 * exit to the hypervisor, and a FUSE round trip has two such wake-ups. A
 * daemon that is already running when the next request comes saves the one
 * on its side: measured on a 2-CPU VM, a do-nothing daemon answered 14,500
 * stats/s with a sleeping single-thread loop, 31,000 with libfuse's
 * multithreaded loop, and 55,000 when it polled for 50 us after each reply
 * (bench/RESULTS.md). The cost is CPU: at most one thread polls at a time,
 * and only within US microseconds of the last request, so an idle mount
 * costs nothing.
 *
 * How: /dev/fuse is made non-blocking; each of N workers (max_threads, 8 by
 * default) waits in its own epoll set with EPOLLEXCLUSIVE, so a request wakes
 * one sleeping worker, not all of them; a read that finds nothing says EAGAIN.
 * The worker that answered a request becomes the poller if no one else is
 * (an atomic flag), otherwise it goes back to epoll. Requests go through
 * libfuse's fuse_session_receive_buf() and fuse_session_process_buf(), as in
 * its own loops. The session ends when the kernel says ENODEV (unmounted) or
 * fuse_session_exit() is called (signals): waits time out every 250 ms to
 * notice the latter. A raw handler (butter_poll_loop_raw) sees each request
 * first and may answer it itself: the daemon serves FUSE_TMPFILE that way
 * (tmpfile.c), which libfuse 3.14 does not pass on.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "pollloop.h"

#define DEFAULT_WORKERS 8
#define WAIT_MS 250

struct pollloop {
	struct fuse_session *se;
	int fd;
	long spin_ns;
	atomic_int polling;      /* 1 while a worker polls without sleeping */
	atomic_int error;        /* the first receive error, as -errno */
	butter_raw_request_fn raw;  /* sees requests first (may be NULL) */
	void *raw_arg;
	const atomic_bool *quiet;   /* while true, no worker polls (may be NULL) */
};

static long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void *worker(void *arg)
{
	struct pollloop *p = arg;
	struct fuse_buf buf;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE };
	int ep = epoll_create1(EPOLL_CLOEXEC);
	long until = 0;
	int mine = 0; /* this worker holds p->polling */

	memset(&buf, 0, sizeof(buf));
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, p->fd, &ev) < 0) {
		atomic_store(&p->error, -errno);
		fuse_session_exit(p->se);
		if (ep >= 0)
			close(ep);
		return NULL;
	}
	while (!fuse_session_exited(p->se)) {
		int res = fuse_session_receive_buf(p->se, &buf);

		if (res > 0) {
			if (mine) {
				atomic_store(&p->polling, 0);
				mine = 0;
			}
			if (!p->raw || (buf.flags & FUSE_BUF_IS_FD) ||
			    !p->raw(p->raw_arg, buf.mem, (size_t)res))
				fuse_session_process_buf(p->se, &buf);
			/* answered: poll for the next one, unless another worker does */
			if (p->spin_ns && !(p->quiet && atomic_load(p->quiet)) &&
			    !atomic_exchange(&p->polling, 1)) {
				mine = 1;
				until = now_ns() + p->spin_ns;
			}
			continue;
		}
		if (res == 0)
			break; /* the session ended (unmounted) */
		if (res != -EAGAIN && res != -EINTR) {
			atomic_store(&p->error, res);
			fuse_session_exit(p->se);
			break;
		}
		if (mine && now_ns() < until)
			continue;
		if (mine) {
			atomic_store(&p->polling, 0);
			mine = 0;
		}
		if (epoll_wait(ep, &ev, 1, WAIT_MS) < 0 && errno != EINTR) {
			atomic_store(&p->error, -errno);
			fuse_session_exit(p->se);
			break;
		}
	}
	if (mine)
		atomic_store(&p->polling, 0);
	free(buf.mem);
	close(ep);
	return NULL;
}

int butter_poll_loop(struct fuse_session *se, unsigned workers, unsigned spin_us)
{
	return butter_poll_loop_raw(se, workers, spin_us, NULL, NULL);
}

int butter_poll_loop_raw(struct fuse_session *se, unsigned workers, unsigned spin_us,
			 butter_raw_request_fn raw, void *raw_arg)
{
	return butter_poll_loop_quiet(se, workers, spin_us, raw, raw_arg, NULL);
}

int butter_poll_loop_quiet(struct fuse_session *se, unsigned workers, unsigned spin_us,
			   butter_raw_request_fn raw, void *raw_arg, const atomic_bool *quiet)
{
	struct pollloop p = { .se = se, .fd = fuse_session_fd(se), .spin_ns = (long)spin_us * 1000,
			      .raw = raw, .raw_arg = raw_arg, .quiet = quiet };
	pthread_t *t;
	unsigned i, started = 0;
	int flags = fcntl(p.fd, F_GETFL);

	if (!workers)
		workers = DEFAULT_WORKERS;
	if (flags < 0 || fcntl(p.fd, F_SETFL, flags | O_NONBLOCK) < 0)
		return -errno;
	t = calloc(workers, sizeof(*t));
	if (!t)
		return -ENOMEM;
	for (i = 0; i < workers; i++) {
		if (pthread_create(&t[i], NULL, worker, &p) != 0)
			break;
		started++;
	}
	if (!started) {
		free(t);
		return -EAGAIN;
	}
	for (i = 0; i < started; i++)
		pthread_join(t[i], NULL);
	free(t);
	fuse_session_reset(se);
	return atomic_load(&p.error);
}
