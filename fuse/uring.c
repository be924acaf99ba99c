/*
 * uring.c — FUSE over io_uring: the kernel (6.14+, fuse module parameter
 * enable_uring=Y) hands requests to ring entries the daemon registered with
 * IORING_OP_URING_CMD on /dev/fuse, and takes each reply back in the command
 * that fetches the entry's next request (COMMIT_AND_FETCH): one system call a
 * request instead of a read(2) and a writev(2). libfuse 3.14 knows nothing of
 * it, so this file speaks the protocol and feeds libfuse as its own loops do.
 *
 * Why: a request is queued on the ring queue of the CPU the caller runs on,
 * and each queue's entries are served by threads bound to that CPU, so the
 * caller's wake-up of a daemon thread and the daemon's wake-up of the caller
 * both stay on one CPU: no inter-processor interrupt, no idle CPU to wake,
 * which on a virtual machine are exits to the hypervisor (pollloop.c).
 *
 * The protocol (the kernel's include/uapi/linux/fuse.h, fs/fuse/dev_uring.c):
 *   - a ring entry is a header buffer (struct uring_req_header below) and a
 *     payload buffer of at least the kernel's largest payload (max_write, or
 *     max_pages pages: from the INIT reply), registered for queue QID (the
 *     CPU) by FUSE_IO_URING_CMD_REGISTER with an iovec pair; the io_uring
 *     must have 128-byte SQEs, whose command area holds struct
 *     uring_cmd_req. Registration is refused (EAGAIN) before INIT is
 *     answered; requests go to /dev/fuse until every queue has an entry.
 *   - a request completes the entry's command: fuse_in_header in the
 *     header's in_out, the request's first argument in op_in, the rest in
 *     the payload, its size and the commit id in ent_in_out;
 *   - the reply: fuse_out_header in in_out, the reply's arguments in the
 *     payload, their size in ent_in_out.payload_sz; COMMIT_AND_FETCH with the
 *     commit id hands it over and waits for the next request.
 *   FORGET, INTERRUPT and notifications still pass through /dev/fuse.
 *
 * How, with libfuse 3.14 (which parses and runs a request from a buffer laid
 * out as /dev/fuse delivers it, and writes replies through wire.c):
 *   - pollloop.c keeps serving /dev/fuse (INIT, everything until the ring is
 *     ready, then FORGET and INTERRUPT), its workers no longer polling once
 *     the ring runs;
 *   - the INIT reply takes FUSE_OVER_IO_URING when the kernel offers it
 *     (wire.c), and once it is written each queue gets its threads, each
 *     with its own io_uring and one ring entry, bound to the queue's CPU;
 *   - a thread serving a request lays fuse_in_header and op_in out just in
 *     front of the payload (the entry's buffer has room there), so the
 *     request is one contiguous buffer, and runs it with
 *     fuse_session_process_buf() on itself;
 *   - wire.c's writev hands every reply with a unique to
 *     uring_take_reply(): when a ring entry serves that unique (the calling
 *     thread's own, or another's: fsync.c answers a group of requests from
 *     one thread) the reply is copied into that entry; otherwise it goes to
 *     /dev/fuse. The serving thread, once libfuse returns and the reply is
 *     in (it waits when another thread still has to answer), commits.
 *
 * Each io_uring has one submitter, its thread (SINGLE_ISSUER, DEFER_TASKRUN:
 * the kernel's work for a request runs when that thread waits for it).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uring.h"

#ifndef BUTTER_HAVE_LIBURING

bool butter_uring_built(void)
{
	return false;
}

int butter_uring_loop(struct fuse_session *se, struct wire *w, const struct butter_uring_cfg *cfg)
{
	(void)se;
	(void)w;
	(void)cfg;
	return -ENOTSUP;
}

ssize_t uring_take_reply(struct uring *u, const struct iovec *iov, int count)
{
	(void)u;
	(void)iov;
	(void)count;
	return -ENOENT;
}

void uring_init_answered(struct uring *u, bool offered, bool taken)
{
	(void)u;
	(void)offered;
	(void)taken;
}

#else /* BUTTER_HAVE_LIBURING */

#include <liburing.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

/*
 * The kernel's uapi for FUSE over io_uring (protocol 7.42; not in this
 * system's <linux/fuse.h>): the layout is the ABI, the names are ours.
 */
#define URING_IN_OUT_SIZE 128 /* FUSE_URING_IN_OUT_HEADER_SZ */
#define URING_OP_IN_SIZE 128  /* FUSE_URING_OP_IN_OUT_SZ */

struct uring_ent_in_out {   /* struct fuse_uring_ent_in_out */
	uint64_t flags;
	uint64_t commit_id;     /* names the request in its COMMIT_AND_FETCH */
	uint32_t payload_sz;    /* bytes in the payload: the request's, then the reply's */
	uint32_t padding;
	uint64_t reserved;
};

struct uring_req_header {   /* struct fuse_uring_req_header */
	char in_out[URING_IN_OUT_SIZE];  /* fuse_in_header, then fuse_out_header */
	char op_in[URING_OP_IN_SIZE];    /* the request's first argument */
	struct uring_ent_in_out ent_in_out;
};

enum {                      /* enum fuse_uring_cmd */
	URING_CMD_REGISTER = 1,
	URING_CMD_COMMIT_AND_FETCH = 2,
};

struct uring_cmd_req {      /* struct fuse_uring_cmd_req, in the SQE's command area */
	uint64_t flags;
	uint64_t commit_id;
	uint16_t qid;
	uint8_t padding[6];
};

_Static_assert(sizeof(struct uring_req_header) == 288, "fuse_uring_req_header");
_Static_assert(sizeof(struct uring_cmd_req) == 24, "fuse_uring_cmd_req");

#define HEADROOM 4096             /* in front of the payload: fuse_in_header and op_in */
#define WAIT_NS 250000000L        /* waits end this often to notice the session's end */
#define RING_DEPTH 4              /* SQEs of a thread's io_uring (one in flight) */

/* One thread of a queue: its io_uring and its ring entry. */
struct ring_thread {
	struct uring *u;
	unsigned qid;
	pthread_t tid;
	bool created;
	struct io_uring ring;
	bool ring_ok;
	struct uring_req_header *hdr;  /* a page */
	char *area;                    /* HEADROOM bytes, then the payload */
	char *payload;
	size_t area_size;
	struct iovec iov[2];           /* what REGISTER hands the kernel */
	uint64_t commit_id;
	_Atomic uint64_t unique;       /* the request being served; 0: none */
	atomic_bool replied;           /* its reply is in the entry */
	pthread_mutex_t lock;          /* a reply from another thread: replied, cond */
	pthread_cond_t cond;
};

struct uring {
	struct fuse_session *se;
	struct wire *w;
	int fd;
	struct butter_uring_cfg cfg;
	unsigned nqueues, nthreads;
	size_t payload_size;
	struct ring_thread *t;         /* queue q's threads: t[q * per_queue ...] */
	pthread_mutex_t lock;          /* the creation of the threads */
	atomic_bool active;            /* ring threads exist: replies may be theirs */
	atomic_bool quiet;             /* /dev/fuse workers do not poll */
	atomic_bool stop;              /* the session loop has ended */
	atomic_int error;              /* the first fatal error, -errno */
};

/* The ring entry this thread serves (libfuse replies from it, mostly). */
static _Thread_local struct ring_thread *serving;

bool butter_uring_built(void)
{
	return true;
}

/* The kernel makes one queue per possible CPU: their number (the highest + 1). */
static unsigned possible_cpus(void)
{
	FILE *f = fopen("/sys/devices/system/cpu/possible", "re");
	unsigned n = 0, a, b;
	int c;

	if (f) {
		while (fscanf(f, "%u", &a) == 1) {
			b = a;
			c = fgetc(f);
			if (c == '-') {
				if (fscanf(f, "%u", &b) != 1)
					break;
				c = fgetc(f);
			}
			if (b + 1 > n)
				n = b + 1;
			if (c != ',')
				break;
		}
		fclose(f);
	}
	if (!n) {
		int k = get_nprocs_conf();

		n = k > 0 ? (unsigned)k : 1;
	}
	return n;
}

static bool stopping(struct uring *u)
{
	return atomic_load(&u->stop) || fuse_session_exited(u->se);
}

static void fatal(struct uring *u, int err, const char *what, unsigned qid)
{
	int none = 0;

	if (atomic_compare_exchange_strong(&u->error, &none, err))
		fuse_log(FUSE_LOG_ERR, "FUSE over io_uring: queue %u: %s: %s\n", qid, what,
			 strerror(-err));
	fuse_session_exit(u->se);
}

/* Put the reply (@out, then @iov[1..@count)) in @t's entry. */
static void fill_reply(struct ring_thread *t, struct fuse_out_header out, const struct iovec *iov,
		       int count)
{
	size_t len = 0;
	uint32_t payload;

	for (int i = 1; i < count; i++)
		len += iov[i].iov_len;
	if (len > t->u->payload_size) {
		fuse_log(FUSE_LOG_ERR, "FUSE over io_uring: a reply of %zu bytes, more than %zu\n",
			 len, t->u->payload_size);
		out.error = -EIO;
		len = 0;
	} else {
		char *p = t->payload;

		for (int i = 1; i < count; i++) {
			if (iov[i].iov_len)
				memcpy(p, iov[i].iov_base, iov[i].iov_len);
			p += iov[i].iov_len;
		}
	}
	out.len = (uint32_t)(sizeof(out) + len);
	payload = (uint32_t)len;
	memcpy(t->hdr->in_out, &out, sizeof(out));
	memcpy(&t->hdr->ent_in_out.payload_sz, &payload, sizeof(payload));
}

ssize_t uring_take_reply(struct uring *u, const struct iovec *iov, int count)
{
	struct ring_thread *t = serving;
	struct fuse_out_header out;
	ssize_t len = 0;

	if (!atomic_load_explicit(&u->active, memory_order_acquire) || count < 1 ||
	    iov[0].iov_len != sizeof(out))
		return -ENOENT;
	memcpy(&out, iov[0].iov_base, sizeof(out));
	if (out.unique == 0)
		return -ENOENT; /* a notification */
	for (int i = 0; i < count; i++)
		len += (ssize_t)iov[i].iov_len;
	if (t && atomic_load_explicit(&t->unique, memory_order_relaxed) == out.unique) {
		fill_reply(t, out, iov, count);
		atomic_store_explicit(&t->replied, true, memory_order_relaxed);
		return len;
	}
	/* another thread's entry (fsync.c answers a group), or /dev/fuse's request */
	for (unsigned i = 0; i < u->nthreads; i++) {
		t = &u->t[i];
		if (atomic_load(&t->unique) != out.unique)
			continue;
		pthread_mutex_lock(&t->lock);
		if (atomic_load(&t->unique) == out.unique && !atomic_load(&t->replied)) {
			fill_reply(t, out, iov, count);
			atomic_store(&t->replied, true);
			pthread_cond_signal(&t->cond);
			pthread_mutex_unlock(&t->lock);
			return len;
		}
		pthread_mutex_unlock(&t->lock);
	}
	return -ENOENT;
}

/* Wait until another thread has answered @t's request (or the session ends). */
static void wait_reply(struct ring_thread *t)
{
	pthread_mutex_lock(&t->lock);
	while (!atomic_load(&t->replied) && !stopping(t->u)) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += WAIT_NS;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&t->cond, &t->lock, &ts);
	}
	pthread_mutex_unlock(&t->lock);
}

/* An error reply for the request @unique in @t's entry. */
static void error_reply(struct ring_thread *t, uint64_t unique, int err)
{
	struct fuse_out_header out = { .error = err, .unique = unique };
	struct iovec iov = { .iov_base = &out, .iov_len = sizeof(out) };

	fill_reply(t, out, &iov, 1);
}

/* Serve the request the kernel put in @t's entry; its reply is there after. */
static void serve(struct ring_thread *t)
{
	struct uring *u = t->u;
	struct fuse_in_header in;
	struct uring_ent_in_out eio;
	size_t oplen;
	char *start;

	memcpy(&in, t->hdr->in_out, sizeof(in));
	memcpy(&eio, &t->hdr->ent_in_out, sizeof(eio));
	t->commit_id = eio.commit_id;
	/* in.len counts the request as /dev/fuse would deliver it */
	if (in.len < sizeof(in) + (size_t)eio.payload_sz || eio.payload_sz > u->payload_size ||
	    (oplen = in.len - sizeof(in) - eio.payload_sz) > URING_OP_IN_SIZE) {
		fuse_log(FUSE_LOG_ERR, "FUSE over io_uring: request %llu of %u bytes, %u in the payload\n",
			 (unsigned long long)in.unique, in.len, eio.payload_sz);
		error_reply(t, in.unique, -EIO);
		return;
	}
	start = t->payload - oplen - sizeof(in);
	memcpy(start, &in, sizeof(in));
	memcpy(start + sizeof(in), t->hdr->op_in, oplen);

	atomic_store(&t->replied, false);
	atomic_store(&t->unique, in.unique);
	serving = t;
	wire_note_request(u->w, start, in.len);
	if (!u->cfg.raw || !u->cfg.raw(u->cfg.raw_arg, start, in.len)) {
		struct fuse_buf buf = { .size = in.len, .mem = start };

		fuse_session_process_buf(u->se, &buf);
	}
	serving = NULL;
	if (!atomic_load(&t->replied))
		wait_reply(t);
	pthread_mutex_lock(&t->lock); /* a late replier of another thread is done */
	atomic_store(&t->unique, 0);
	pthread_mutex_unlock(&t->lock);
	if (!atomic_load(&t->replied))
		error_reply(t, in.unique, -EINTR); /* the session ended first */
}

static void *map(size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

/* @t's buffers and io_uring; 0 or -errno. */
static int setup(struct ring_thread *t)
{
	struct uring *u = t->u;
	struct io_uring_params p;
	int ret;

	t->area_size = HEADROOM + u->payload_size;
	t->hdr = map(4096);
	t->area = map(t->area_size);
	if (!t->hdr || !t->area)
		return -ENOMEM;
	t->payload = t->area + HEADROOM;
	t->iov[0].iov_base = t->hdr;
	t->iov[0].iov_len = sizeof(*t->hdr);
	t->iov[1].iov_base = t->payload;
	t->iov[1].iov_len = u->payload_size;

	memset(&p, 0, sizeof(p));
	p.flags = IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
	ret = io_uring_queue_init_params(RING_DEPTH, &t->ring, &p);
	if (ret == -EINVAL) { /* before Linux 6.1 (no DEFER_TASKRUN): no FUSE ring either */
		memset(&p, 0, sizeof(p));
		p.flags = IORING_SETUP_SQE128;
		ret = io_uring_queue_init_params(RING_DEPTH, &t->ring, &p);
	}
	if (ret < 0)
		return ret;
	t->ring_ok = true;
	ret = io_uring_register_files(&t->ring, &u->fd, 1);
	if (ret < 0)
		return ret;
	(void)io_uring_register_ring_fd(&t->ring); /* fewer fd lookups; optional */
	return 0;
}

/* Queue the command @cmd of @t's entry (REGISTER, or COMMIT_AND_FETCH of its reply). */
static int prepare(struct ring_thread *t, unsigned cmd)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&t->ring);
	struct uring_cmd_req req;

	if (!sqe)
		return -EBUSY;
	memset(sqe, 0, 128); /* SQE128 */
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = 0; /* the registered /dev/fuse */
	sqe->flags = IOSQE_FIXED_FILE;
	sqe->cmd_op = cmd;
	if (cmd == URING_CMD_REGISTER) {
		sqe->addr = (uint64_t)(uintptr_t)t->iov;
		sqe->len = 2;
	}
	memset(&req, 0, sizeof(req));
	req.qid = (uint16_t)t->qid;
	req.commit_id = cmd == URING_CMD_COMMIT_AND_FETCH ? t->commit_id : 0;
	memcpy(sqe->cmd, &req, sizeof(req));
	return 0;
}

static void pin(unsigned cpu)
{
	cpu_set_t set;

	if (cpu >= CPU_SETSIZE)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	(void)sched_setaffinity(0, sizeof(set), &set); /* an offline CPU: run anywhere */
}

static void *ring_main(void *arg)
{
	struct ring_thread *t = arg;
	struct uring *u = t->u;
	unsigned cmd = URING_CMD_REGISTER;
	char name[16];
	int ret;

	snprintf(name, sizeof(name), "butter-ring%u", t->qid % 10000);
	pthread_setname_np(pthread_self(), name); /* tests find the ring's threads by it */
	if (u->cfg.pin)
		pin(t->qid);
	ret = setup(t);
	if (ret < 0) {
		fuse_log(FUSE_LOG_WARNING,
			 "FUSE over io_uring: queue %u: %s; requests stay on /dev/fuse\n", t->qid,
			 strerror(-ret));
		atomic_store(&u->quiet, false);
		return NULL;
	}
	while (!stopping(u)) {
		struct io_uring_cqe *cqe;
		int res;

		ret = prepare(t, cmd);
		if (ret < 0) {
			fatal(u, ret, "no SQE", t->qid);
			break;
		}
		/*
		 * Submit and wait in one system call. liburing may return the
		 * number submitted without a completion: wait again then.
		 */
		cqe = NULL;
		for (;;) {
			struct __kernel_timespec ts = { .tv_sec = 0, .tv_nsec = WAIT_NS };

			ret = io_uring_submit_and_wait_timeout(&t->ring, &cqe, 1, &ts, NULL);
			if (cqe || (ret < 0 && ret != -ETIME && ret != -EINTR) || stopping(u))
				break;
		}
		if (!cqe) {
			if (ret < 0 && ret != -ETIME && ret != -EINTR)
				fatal(u, ret, "io_uring_enter", t->qid);
			break;
		}
		res = cqe->res;
		io_uring_cqe_seen(&t->ring, cqe);
		if (res == -EAGAIN && cmd == URING_CMD_REGISTER) {
			usleep(1000); /* INIT not taken in yet */
			continue;
		}
		if (res < 0) {
			if (res == -ENOTCONN || res == -ECONNABORTED || res == -ECANCELED)
				break; /* the connection ended (unmounted) */
			if (cmd == URING_CMD_REGISTER) {
				fuse_log(FUSE_LOG_WARNING,
					 "FUSE over io_uring: queue %u: register: %s; requests stay on /dev/fuse\n",
					 t->qid, strerror(-res));
				atomic_store(&u->quiet, false);
				break;
			}
			fatal(u, res, "commit and fetch", t->qid);
			break;
		}
		serve(t);
		cmd = URING_CMD_COMMIT_AND_FETCH;
	}
	/* its submitter closes it: the kernel cancels the entry's command */
	io_uring_queue_exit(&t->ring);
	t->ring_ok = false;
	return NULL;
}

void uring_init_answered(struct uring *u, bool offered, bool taken)
{
	if (!taken) {
		if (offered)
			fuse_log(FUSE_LOG_WARNING, "FUSE over io_uring: the INIT reply could not take it; "
				 "serving through /dev/fuse\n");
		else
			fuse_log(FUSE_LOG_WARNING,
				 "FUSE over io_uring: the kernel does not offer it (Linux 6.14+ with "
				 "/sys/module/fuse/parameters/enable_uring Y); serving through /dev/fuse\n");
		return;
	}
	u->payload_size = u->w->max_payload;
	pthread_mutex_lock(&u->lock);
	atomic_store(&u->quiet, true);
	atomic_store_explicit(&u->active, true, memory_order_release);
	for (unsigned i = 0; i < u->nthreads; i++) {
		struct ring_thread *t = &u->t[i];

		if (pthread_create(&t->tid, NULL, ring_main, t) != 0) {
			fuse_log(FUSE_LOG_WARNING, "FUSE over io_uring: cannot start thread %u\n", i);
			atomic_store(&u->quiet, false);
			continue;
		}
		t->created = true;
	}
	pthread_mutex_unlock(&u->lock);
}

int butter_uring_loop(struct fuse_session *se, struct wire *w, const struct butter_uring_cfg *cfg)
{
	struct uring *u = calloc(1, sizeof(*u));
	unsigned per_queue;
	int ret;

	if (!u)
		return -ENOMEM;
	u->se = se;
	u->w = w;
	u->fd = fuse_session_fd(se);
	u->cfg = *cfg;
	u->nqueues = possible_cpus();
	per_queue = (cfg->threads + u->nqueues - 1) / u->nqueues;
	if (per_queue < cfg->min_per_queue)
		per_queue = cfg->min_per_queue;
	if (!per_queue)
		per_queue = 1;
	u->nthreads = u->nqueues * per_queue;
	u->t = calloc(u->nthreads, sizeof(*u->t));
	if (!u->t) {
		free(u);
		return -ENOMEM;
	}
	pthread_mutex_init(&u->lock, NULL);
	for (unsigned i = 0; i < u->nthreads; i++) {
		struct ring_thread *t = &u->t[i];

		t->u = u;
		t->qid = i / per_queue;
		pthread_mutex_init(&t->lock, NULL);
		pthread_cond_init(&t->cond, NULL);
	}
	w->ring = u;

	ret = butter_poll_loop_quiet(se, cfg->dev_workers, cfg->spin_us, cfg->raw, cfg->raw_arg,
				     &u->quiet);

	atomic_store(&u->stop, true);
	pthread_mutex_lock(&u->lock);
	for (unsigned i = 0; i < u->nthreads; i++)
		if (u->t[i].created)
			pthread_join(u->t[i].tid, NULL);
	pthread_mutex_unlock(&u->lock);
	w->ring = NULL;
	for (unsigned i = 0; i < u->nthreads; i++) {
		struct ring_thread *t = &u->t[i];

		if (t->ring_ok)
			io_uring_queue_exit(&t->ring); /* its setup failed half way */
		if (t->hdr)
			munmap(t->hdr, 4096);
		if (t->area)
			munmap(t->area, t->area_size);
		pthread_mutex_destroy(&t->lock);
		pthread_cond_destroy(&t->cond);
	}
	if (ret == 0)
		ret = atomic_load(&u->error);
	pthread_mutex_destroy(&u->lock);
	free(u->t);
	free(u);
	return ret;
}

#endif /* BUTTER_HAVE_LIBURING */
