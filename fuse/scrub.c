/*
 * scrub.c — the daemon's scrub (BUTTER_IOC_SCRUB): a thread that checks the
 * allocated blocks one library step at a time (butter_scrub_range(), 64 MiB
 * each, the library's lock held for the step only, so every other request is
 * served between steps), then the superblock copies, and that outlives the
 * command that started it. The commands start, resume or cancel it and ask
 * how it goes; each error it finds is logged by the library as found (the
 * daemon's log), its totals are kept here until the next start.
 *
 * Locking: struct scrubber's fields are protected by its mutex, which is
 * never held across a library call. The thread is joined at unmount
 * (scrubber_stop(), after asking it to stop: the scrub ends interrupted).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <butter/control.h>

#include "daemon.h"

#define SCRUB_STEP_BYTES (64ull << 20)

struct scrubber {
	pthread_mutex_t lock;
	pthread_cond_t ended;   /* signalled when a run stops (CANCEL waits for it) */
	pthread_cond_t wake;    /* signalled on a cancel (the limit's sleep ends) */
	pthread_t thread;
	bool joinable;          /* a thread was started and not joined */
	unsigned state;         /* BUTTER_SCRUB_STATE_* */
	bool cancel_req;        /* CANCEL or unmount: stop after this step */
	bool supers_done;       /* the walk of the blocks and the superblocks are done */
	unsigned flags;         /* BUTTER_SCRUB_READONLY as asked */
	int error;
	time_t started, resumed;
	uint64_t seconds_before; /* time spent by the runs before the current one */
	struct timespec run_t0;  /* when the current run began (CLOCK_MONOTONIC) */
	uint64_t cursor;
	uint64_t limit;          /* bytes a second, 0: as fast as it goes */
	uint64_t run_bytes;      /* scrubbed by the current run (for the limit) */
	struct butter_scrub_stats stats;
	struct daemon *d;
};

static uint64_t run_seconds(const struct scrubber *s)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (uint64_t)(now.tv_sec - s->run_t0.tv_sec - (now.tv_nsec < s->run_t0.tv_nsec));
}

static void add_stats(struct butter_scrub_stats *to, const struct butter_scrub_stats *st)
{
	to->tree_bytes += st->tree_bytes;
	to->data_bytes += st->data_bytes;
	to->no_csum_bytes += st->no_csum_bytes;
	to->read_errors += st->read_errors;
	to->csum_errors += st->csum_errors;
	to->verify_errors += st->verify_errors;
	to->super_errors += st->super_errors;
	to->parity_errors += st->parity_errors;
	to->corrected += st->corrected;
	to->uncorrectable += st->uncorrectable;
}

/*
 * With a limit: sleep until the run's bytes are what @limit allows for its
 * time, or a cancel comes. Lock held.
 */
static void wait_for_limit(struct scrubber *s)
{
	struct timespec until = s->run_t0;
	uint64_t ns = s->run_bytes / s->limit * 1000000000ull +
		      s->run_bytes % s->limit * 1000000000ull / s->limit;

	until.tv_sec += (time_t)(ns / 1000000000ull);
	until.tv_nsec += (long)(ns % 1000000000ull);
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	while (!s->cancel_req &&
	       pthread_cond_timedwait(&s->wake, &s->lock, &until) != ETIMEDOUT)
		;
}

static void *scrub_main(void *arg)
{
	struct scrubber *s = arg;
	struct daemon *d = s->d;
	struct butter_scrub_stats total;
	uint64_t cursor, budget;
	unsigned flags;
	bool cancel, supers_done;
	int ret = 0;

	pthread_mutex_lock(&s->lock);
	cursor = s->cursor;
	supers_done = s->supers_done;
	pthread_mutex_unlock(&s->lock);
	for (;;) {
		struct butter_scrub_stats st;

		pthread_mutex_lock(&s->lock);
		cancel = s->cancel_req;
		/* a remount read-only during the scrub: the steps after it only report */
		flags = (s->flags & BUTTER_SCRUB_READONLY) || d->readonly ? BUTTER_SCRUB_READONLY : 0;
		/* with a limit, a step is about a second of it, so the pace is even */
		budget = s->limit && s->limit < SCRUB_STEP_BYTES ? s->limit : SCRUB_STEP_BYTES;
		pthread_mutex_unlock(&s->lock);
		if (cancel || supers_done)
			break;
		memset(&st, 0, sizeof(st));
		if (cursor != UINT64_MAX) {
			ret = butter_scrub_range(d->fs, flags, &cursor, budget, &st);
			if (ret == 0)
				cursor = UINT64_MAX; /* the blocks are done: the supers next */
		} else {
			ret = butter_scrub_supers(d->fs, flags, &st);
			supers_done = ret == 0;
		}
		pthread_mutex_lock(&s->lock);
		add_stats(&s->stats, &st);
		if (ret >= 0)
			s->cursor = cursor;
		s->supers_done = supers_done;
		s->run_bytes += st.tree_bytes + st.data_bytes;
		if (ret >= 0 && s->limit)
			wait_for_limit(s);
		pthread_mutex_unlock(&s->lock);
		if (ret < 0)
			break;
	}
	pthread_mutex_lock(&s->lock);
	s->seconds_before += run_seconds(s);
	s->error = ret < 0 ? ret : 0;
	s->state = ret < 0      ? BUTTER_SCRUB_STATE_INTERRUPTED
		   : supers_done ? BUTTER_SCRUB_STATE_FINISHED
				 : BUTTER_SCRUB_STATE_CANCELED;
	s->cancel_req = false;
	total = s->stats;
	pthread_cond_broadcast(&s->ended);
	pthread_mutex_unlock(&s->lock);
	if (ret < 0)
		daemon_log(d, BUTTER_LOG_ERROR, "scrub stopped: %s", strerror(-ret));
	else
		daemon_log(d, BUTTER_LOG_INFO,
			   "scrub %s: %llu errors, %llu corrected, %llu uncorrectable",
			   supers_done ? "finished" : "cancelled",
			   (unsigned long long)(total.read_errors + total.csum_errors +
						total.verify_errors + total.super_errors +
						total.parity_errors),
			   (unsigned long long)total.corrected,
			   (unsigned long long)total.uncorrectable);
	return NULL;
}

static struct scrubber *scrubber_of(struct daemon *d)
{
	struct scrubber *s;

	pthread_mutex_lock(&d->scrubber_lock);
	if (!d->scrubber) {
		s = calloc(1, sizeof(*s));
		if (s) {
			pthread_mutex_init(&s->lock, NULL);
			pthread_condattr_t monotonic;

			pthread_condattr_init(&monotonic);
			pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
			pthread_cond_init(&s->wake, &monotonic);
			pthread_condattr_destroy(&monotonic);
			pthread_cond_init(&s->ended, NULL);
			s->d = d;
			d->scrubber = s;
		}
	}
	s = d->scrubber;
	pthread_mutex_unlock(&d->scrubber_lock);
	return s;
}

/* The bytes a scrub checks: every allocated byte once (butter_scrub_stats counts so). */
static uint64_t allocated_bytes(struct daemon *d)
{
	struct butter_space_info si;
	uint64_t total = 0;

	for (size_t i = 0; butter_get_space(d->fs, i, &si) == 0; i++)
		total += si.used;
	return total;
}

/* Start the thread: from the beginning, or (@resume) where the last one stopped. Lock held. */
static int start_locked(struct scrubber *s, unsigned flags, bool resume, uint64_t limit)
{
	int ret;

	if (s->joinable) {
		pthread_join(s->thread, NULL); /* the last one has ended */
		s->joinable = false;
	}
	if (resume) {
		s->resumed = time(NULL);
	} else {
		s->flags = flags;
		s->started = time(NULL);
		s->resumed = 0;
		s->seconds_before = 0;
		s->cursor = 0;
		s->supers_done = false;
		memset(&s->stats, 0, sizeof(s->stats));
	}
	s->limit = limit;
	s->run_bytes = 0;
	s->error = 0;
	s->cancel_req = false;
	clock_gettime(CLOCK_MONOTONIC, &s->run_t0);
	s->state = BUTTER_SCRUB_STATE_RUNNING;
	ret = -pthread_create(&s->thread, NULL, scrub_main, s);
	s->joinable = ret == 0;
	if (ret)
		s->state = BUTTER_SCRUB_STATE_INTERRUPTED;
	return ret;
}

int scrubber_ioctl(struct daemon *d, struct butter_ioc_scrub *io)
{
	struct scrubber *s = scrubber_of(d);
	uint64_t total = 0;
	int ret = 0;

	if (!s)
		return -ENOMEM;
	if (io->cmd == BUTTER_SCRUB_CMD_START && (io->flags & ~BUTTER_SCRUB_READONLY))
		return -EINVAL;
	if (io->cmd != BUTTER_SCRUB_CMD_CANCEL)
		total = allocated_bytes(d); /* a library call: before the lock */
	pthread_mutex_lock(&s->lock);
	switch (io->cmd) {
	case BUTTER_SCRUB_CMD_START:
		ret = s->state == BUTTER_SCRUB_STATE_RUNNING ? -EINPROGRESS
							      : start_locked(s, io->flags, false, io->limit);
		break;
	case BUTTER_SCRUB_CMD_RESUME:
		if (s->state == BUTTER_SCRUB_STATE_RUNNING)
			ret = -EINPROGRESS;
		else if (s->state != BUTTER_SCRUB_STATE_CANCELED &&
			 s->state != BUTTER_SCRUB_STATE_INTERRUPTED)
			ret = -ENOENT;
		else
			ret = start_locked(s, s->flags, true, io->limit);
		break;
	case BUTTER_SCRUB_CMD_CANCEL:
		if (s->state != BUTTER_SCRUB_STATE_RUNNING) {
			ret = -ENOTCONN;
			break;
		}
		s->cancel_req = true;
		pthread_cond_broadcast(&s->wake);
		while (s->state == BUTTER_SCRUB_STATE_RUNNING) /* the answer says it has stopped */
			pthread_cond_wait(&s->ended, &s->lock);
		break;
	case BUTTER_SCRUB_CMD_STATUS:
		break;
	default:
		ret = -EINVAL;
	}
	io->flags = s->flags;
	io->state = s->state;
	io->error = s->error;
	io->pid = (uint64_t)getpid();
	io->started = s->started;
	io->resumed = s->resumed;
	io->seconds = s->seconds_before +
		      (s->state == BUTTER_SCRUB_STATE_RUNNING ? run_seconds(s) : 0);
	io->bytes_total = total;
	io->cursor = s->cursor;
	io->limit = s->limit;
	io->stats = s->stats;
	pthread_mutex_unlock(&s->lock);
	return ret;
}

void scrubber_stop(struct daemon *d)
{
	struct scrubber *s;

	pthread_mutex_lock(&d->scrubber_lock);
	s = d->scrubber;
	d->scrubber = NULL;
	pthread_mutex_unlock(&d->scrubber_lock);
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	s->cancel_req = true;
	pthread_cond_broadcast(&s->wake);
	pthread_mutex_unlock(&s->lock);
	if (s->joinable)
		pthread_join(s->thread, NULL);
	pthread_cond_destroy(&s->ended);
	pthread_cond_destroy(&s->wake);
	pthread_mutex_destroy(&s->lock);
	free(s);
}
