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
 * How: /dev/fuse is made non-blocking; a worker that answered a request
 * becomes the leader if there is none (an atomic flag) and keeps reading
 * for US microseconds after each request it answers, answering what comes
 * itself. The other workers must not wait on /dev/fuse meanwhile: a request
 * the leader takes would still wake one of them (on the CPU the caller just
 * left), to find nothing — on a 2-CPU VM that halved the rate of renames
 * (10,000/s with 8 workers, 21,600/s with one). So while there is a leader,
 * idle workers wait on a bench (a condition variable); one of them, the
 * standby, looks every STANDBY_NS whether the leader has been inside one
 * request for more than STALL_NS (cold metadata, a commit's lock), and then
 * goes back to waiting on /dev/fuse, in its own epoll set with
 * EPOLLEXCLUSIVE, so requests that come meanwhile are served. Before a
 * request that may take long (may_take_long: data, fsync, ioctl, locks) the
 * leader steps down and calls one worker back from the bench; so does a
 * leader whose time ran out (it then waits on /dev/fuse itself). A woken
 * worker that finds nothing while a leader exists goes to the bench; one
 * still inside epoll_wait when a worker takes the lead is sent there by an
 * eventfd (kick_watchers: inside epoll_wait it would be woken by each
 * request and never come back to user space to see the leader). The
 * standby's period is long (10 ms): each of its wake-ups costs the mount's
 * round trips (1 ms: renames at 12,700/s instead of 30,300/s). Requests go
 * through libfuse's fuse_session_receive_buf() and
 * fuse_session_process_buf(), as in its own loops. The session ends when
 * the kernel says ENODEV (unmounted) or fuse_session_exit() is called
 * (signals): waits time out every 250 ms to notice the latter. A raw
 * handler (butter_poll_loop_raw) sees each request first and may answer it
 * itself: the daemon serves FUSE_TMPFILE that way (tmpfile.c), which libfuse
 * 3.14 does not pass on.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "pollloop.h"

#define DEFAULT_WORKERS 8
#define WAIT_MS 250
#define STANDBY_NS 10000000L  /* how often the standby looks at a leader */
#define STALL_NS 1000000L     /* a leader this long in one request is stalled */
#define SMALL_WRITE 65536     /* bytes: a WRITE up to this size is not a long request */

struct pollloop {
	struct fuse_session *se;
	int fd;
	long spin_ns;
	atomic_int polling;      /* 1 while there is a leader (polls, or answers a request) */
	atomic_long busy_since;  /* when the leader began its current request; 0: not in one */
	pthread_mutex_t bench_lock;
	pthread_cond_t bench;    /* idle workers while there is a leader */
	bool standby_taken;      /* a benched worker is the standby (bench_lock) */
	atomic_int error;        /* the first receive error, as -errno */
	int kick_fd;             /* eventfd in every worker's epoll set: a new leader sends
				    the workers still waiting on /dev/fuse to the bench */
	atomic_int watching;     /* workers in epoll_wait */
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

/* Add @ns nanoseconds to the CLOCK_MONOTONIC time @ts. */
static void add_ns(struct timespec *ts, long ns)
{
	ts->tv_nsec += ns;
	while (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/*
 * Wait on the bench until this worker should watch /dev/fuse again: the
 * leader is gone (leave_lead wakes everyone), or it is stalled in a request
 * (the standby looks every STANDBY_NS; leaving, it hands the watch to
 * another benched worker, which looks again a STANDBY_NS later, so workers
 * come back one a millisecond while the leader stays stuck); or the session
 * ends (the others look every WAIT_MS).
 */
static void bench_wait(struct pollloop *p)
{
	bool standby = false;

	pthread_mutex_lock(&p->bench_lock);
	while (!fuse_session_exited(p->se) && atomic_load(&p->polling)) {
		struct timespec ts;
		long busy;

		if (!standby && !p->standby_taken)
			standby = p->standby_taken = true;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		add_ns(&ts, standby ? STANDBY_NS : WAIT_MS * 1000000L);
		(void)pthread_cond_timedwait(&p->bench, &p->bench_lock, &ts);
		busy = atomic_load(&p->busy_since);
		if (standby && busy && now_ns() - busy > STALL_NS)
			break; /* the leader is stuck in a request: serve the others */
	}
	if (standby) {
		p->standby_taken = false;
		pthread_cond_signal(&p->bench); /* another takes the watch */
	}
	pthread_mutex_unlock(&p->bench_lock);
}

/*
 * The leader steps down: one benched worker comes back to watch /dev/fuse
 * beside it (the leader watches too once it is idle), so a request that
 * comes while the leader is busy with another is served.
 */
static void leave_lead(struct pollloop *p)
{
	atomic_store(&p->polling, 0);
	pthread_mutex_lock(&p->bench_lock);
	pthread_cond_signal(&p->bench);
	pthread_mutex_unlock(&p->bench_lock);
}

/*
 * Requests that may take long (they wait for the disk, a lock, or move
 * much data): the leader steps down before it serves one, so that others
 * are not left waiting for it. What is not listed costs microseconds
 * unless it finds cold metadata or a commit in the way (the standby's
 * case): so do a WRITE of up to SMALL_WRITE bytes (it lands in memory) and
 * RELEASE (long only for the last handle of an unlinked file). Each step
 * down costs two wake-ups of another worker (called back, then sent to the
 * bench again): creating small files went 7,000/s -> 11,000/s without them.
 */
static bool may_take_long(const struct fuse_buf *buf, size_t len)
{
	struct fuse_in_header in;

	if ((buf->flags & FUSE_BUF_IS_FD) || len < sizeof(in))
		return true;
	memcpy(&in, buf->mem, sizeof(in));
	switch (in.opcode) {
	case FUSE_WRITE: {
		/* a small write lands in memory, as a metadata change does */
		struct fuse_write_in w;

		if (len < sizeof(in) + sizeof(w))
			return true;
		memcpy(&w, (const char *)buf->mem + sizeof(in), sizeof(w));
		return w.size > SMALL_WRITE;
	}
	case FUSE_READ: case FUSE_FSYNC: case FUSE_FSYNCDIR: case FUSE_FLUSH:
	case FUSE_IOCTL: case FUSE_SETLK: case FUSE_SETLKW:
	case FUSE_FALLOCATE: case FUSE_COPY_FILE_RANGE: case FUSE_READDIR: case FUSE_READDIRPLUS:
	case FUSE_DESTROY: case FUSE_SYNCFS:
		return true;
	default:
		return false;
	}
}

/*
 * A worker that became the leader sends the ones still waiting on /dev/fuse
 * to the bench. They are there after a leader left (its time ran out, or a
 * long request): each request the new leader takes still wakes one of them
 * inside epoll_wait, which finds it taken and sleeps again without coming
 * back to user space, so it would never see that there is a leader; on a
 * 2-CPU VM that wake-up lands on the caller's CPU and makes its own wake-up
 * one from idle (renames 9,000/s instead of 14,000+). The eventfd is in
 * every worker's epoll set edge-triggered and never read: each write is one
 * event for each set, the counter cannot fill in any real lifetime.
 */
static void kick_watchers(struct pollloop *p)
{
	uint64_t one = 1;

	if (write(p->kick_fd, &one, sizeof(one)) < 0) {
		/* EAGAIN only at a full counter: the watchers find the bench at WAIT_MS */
	}
}

static void *worker(void *arg)
{
	struct pollloop *p = arg;
	struct fuse_buf buf;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE };
	struct epoll_event kick = { .events = EPOLLIN | EPOLLET };
	int ep = epoll_create1(EPOLL_CLOEXEC);
	long until = 0;
	int mine = 0;          /* this worker is the leader (holds p->polling) */
	bool benched = false;  /* back from the bench: watch, do not sit down again */

	memset(&buf, 0, sizeof(buf));
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, p->fd, &ev) < 0 ||
	    epoll_ctl(ep, EPOLL_CTL_ADD, p->kick_fd, &kick) < 0) {
		atomic_store(&p->error, -errno);
		fuse_session_exit(p->se);
		if (ep >= 0)
			close(ep);
		return NULL;
	}
	while (!fuse_session_exited(p->se)) {
		int res = fuse_session_receive_buf(p->se, &buf);

		if (res > 0) {
			benched = false;
			if (mine && may_take_long(&buf, (size_t)res)) {
				leave_lead(p);
				mine = 0;
			}
			if (mine)
				atomic_store(&p->busy_since, now_ns());
			if (!p->raw || (buf.flags & FUSE_BUF_IS_FD) ||
			    !p->raw(p->raw_arg, buf.mem, (size_t)res))
				fuse_session_process_buf(p->se, &buf);
			if (mine)
				atomic_store(&p->busy_since, 0);
			if (mine && p->quiet && atomic_load(p->quiet)) {
				leave_lead(p); /* the ring serves now: nobody polls */
				mine = 0;
			}
			/* answered: lead (poll for the next one), unless another worker does */
			if (!mine && p->spin_ns && !(p->quiet && atomic_load(p->quiet)) &&
			    !atomic_exchange(&p->polling, 1)) {
				mine = 1;
				if (atomic_load(&p->watching))
					kick_watchers(p);
			}
			if (mine)
				until = now_ns() + p->spin_ns;
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
			leave_lead(p);
			mine = 0;
		} else if (!benched && atomic_load(&p->polling)) {
			/* a leader reads /dev/fuse: wait where its requests do not wake us */
			bench_wait(p);
			benched = true;
			continue;
		}
		benched = false;
		atomic_fetch_add(&p->watching, 1);
		res = epoll_wait(ep, &ev, 1, WAIT_MS);
		atomic_fetch_sub(&p->watching, 1);
		if (res < 0 && errno != EINTR) {
			atomic_store(&p->error, -errno);
			fuse_session_exit(p->se);
			break;
		}
	}
	if (mine)
		leave_lead(p);
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
			      .raw = raw, .raw_arg = raw_arg, .quiet = quiet, .kick_fd = -1 };
	pthread_condattr_t ca;
	pthread_t *t;
	unsigned i, started = 0;
	int flags = fcntl(p.fd, F_GETFL);

	if (!workers)
		workers = DEFAULT_WORKERS;
	if (flags < 0 || fcntl(p.fd, F_SETFL, flags | O_NONBLOCK) < 0)
		return -errno;
	p.kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (p.kick_fd < 0)
		return -errno;
	t = calloc(workers, sizeof(*t));
	if (!t) {
		close(p.kick_fd);
		return -ENOMEM;
	}
	pthread_mutex_init(&p.bench_lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* bench_wait's deadlines */
	pthread_cond_init(&p.bench, &ca);
	pthread_condattr_destroy(&ca);
	for (i = 0; i < workers; i++) {
		if (pthread_create(&t[i], NULL, worker, &p) != 0)
			break;
		started++;
	}
	if (!started) {
		free(t);
		close(p.kick_fd);
		pthread_cond_destroy(&p.bench);
		pthread_mutex_destroy(&p.bench_lock);
		return -EAGAIN;
	}
	for (i = 0; i < started; i++)
		pthread_join(t[i], NULL);
	free(t);
	close(p.kick_fd);
	pthread_cond_destroy(&p.bench);
	pthread_mutex_destroy(&p.bench_lock);
	fuse_session_reset(se);
	return atomic_load(&p.error);
}
