/*
 * balance.c — the daemon's balance (BUTTER_IOC_BALANCE) and device work
 * (BUTTER_IOC_DEVICE: remove, resize, replace): a thread that moves one
 * block group per library step (butter_balance_step(), _device_remove_step(),
 * _device_resize_step()), so every other request is served between groups,
 * and that outlives the command that started it; the commands ask for its
 * status, pause or cancel it. A replace goes the same way, one piece per step
 * (butter_replace_step(): writes meanwhile reach both devices); pausing it
 * cancels it, since nothing of it is recorded (the old device stays, and the
 * replace starts again when asked). A mount resumes a balance recorded on
 * disk by itself (unless -o skip_balance), as the kernel does.
 *
 * Locking: struct balancer's fields are protected by its mutex, which is
 * never held across a library call. The thread is joined at unmount
 * (balancer_stop(), after asking it to pause: the record stays, and the next
 * mount resumes it).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <butter/control.h>

#include "daemon.h"

enum job { JOB_BALANCE, JOB_REMOVE, JOB_RESIZE, JOB_REPLACE };

struct balancer {
	pthread_mutex_t lock;
	enum job job;
	uint64_t devid, size;             /* REMOVE, RESIZE, REPLACE */
	unsigned replace_flags;
	char *path;                       /* REPLACE */
	pthread_t thread;
	bool joinable;                    /* a thread was started and not joined */
	bool running;
	bool pause_req, cancel_req;
	unsigned ended;                   /* BUTTER_BALANCE_STATE_PAUSED / _CANCELED of the last */
	int error;                        /* how the last one ended */
	struct butter_balance_args args;
	struct butter_balance_stats stats;
	uint64_t cursor;
	struct daemon *d;
};

static void *balance_main(void *arg)
{
	struct balancer *b = arg;
	struct daemon *d = b->d;
	struct butter_balance_stats st;
	struct butter_balance_args args;
	uint64_t cursor;
	int ret = 0;
	bool pause, cancel;

	if (b->job == JOB_REPLACE)
		ret = butter_replace_start(d->fs, b->devid, b->path, b->replace_flags);

	pthread_mutex_lock(&b->lock);
	args = b->args;
	st = b->stats;
	cursor = b->cursor;
	pthread_mutex_unlock(&b->lock);
	for (;;) {
		pthread_mutex_lock(&b->lock);
		pause = b->pause_req;
		cancel = b->cancel_req;
		b->stats = st;
		pthread_mutex_unlock(&b->lock);
		if (pause || cancel || ret)
			break;
		switch (b->job) {
		case JOB_BALANCE:
			ret = butter_balance_step(d->fs, &args, &cursor, &st);
			break;
		case JOB_REMOVE:
			ret = butter_device_remove_step(d->fs, b->devid, &cursor, &st);
			break;
		case JOB_RESIZE:
			ret = butter_device_resize_step(d->fs, b->devid, b->size, &cursor, &st);
			break;
		case JOB_REPLACE: {
			struct butter_replace_stats rs;

			memset(&rs, 0, sizeof(rs));
			ret = butter_replace_step(d->fs, &rs);
			st.bytes = rs.bytes_written;
			st.groups = rs.chunks_done;
			st.left = rs.chunks_total - rs.chunks_done;
			break;
		}
		}
		if (ret)
			break;
	}
	if ((cancel || pause) && b->job == JOB_REPLACE && butter_replace_cancel(d->fs) == 0) {
		cancel = true; /* nothing of a replace is recorded: stopping it is a cancel */
		pause = false;
	} else if (cancel && b->job != JOB_BALANCE) {
		cancel = false; /* device work: stopping is all a cancel means */
		pause = true;
	}
	if (cancel && b->job == JOB_BALANCE) {
		ret = butter_balance_cancel(d->fs);
		if (ret == -ENOENT)
			ret = 0;
	}
	if (ret < 0)
		daemon_log(d, BUTTER_LOG_ERROR, "balance stopped: %s", strerror(-ret));
	else
		daemon_log(d, BUTTER_LOG_INFO, "%s %s: %llu block groups %s",
			   b->job == JOB_BALANCE   ? "balance"
			   : b->job == JOB_REPLACE ? "replace"
						   : "device work",
			   cancel ? "cancelled" : pause ? "paused" : "finished",
			   (unsigned long long)st.groups, b->job == JOB_REPLACE ? "copied" : "moved");
	pthread_mutex_lock(&b->lock);
	b->stats = st;
	b->running = false;
	b->error = ret < 0 ? ret : 0;
	b->ended = cancel ? BUTTER_BALANCE_STATE_CANCELED : pause ? BUTTER_BALANCE_STATE_PAUSED : 0;
	b->pause_req = b->cancel_req = false;
	pthread_mutex_unlock(&b->lock);
	return NULL;
}

static struct balancer *balancer_of(struct daemon *d)
{
	struct balancer *b;

	pthread_mutex_lock(&d->balancer_lock);
	if (!d->balancer) {
		b = calloc(1, sizeof(*b));
		if (b) {
			pthread_mutex_init(&b->lock, NULL);
			b->d = d;
			d->balancer = b;
		}
	}
	b = d->balancer;
	pthread_mutex_unlock(&d->balancer_lock);
	return b;
}

/*
 * Start the thread on @args (a resume: the recorded balance's), or, @io not
 * NULL, on that device work. Lock not held.
 */
static int start(struct balancer *b, const struct butter_balance_args *args, bool resume,
		 const struct butter_ioc_device *io)
{
	struct butter_balance_args want;
	int ret;

	memset(&want, 0, sizeof(want));
	if (args)
		want = *args;
	if (resume)
		want.flags |= BUTTER_BALANCE_RESUME;
	pthread_mutex_lock(&b->lock);
	if (b->running) {
		pthread_mutex_unlock(&b->lock);
		return -EINPROGRESS;
	}
	free(b->path);
	b->path = NULL;
	b->job = JOB_BALANCE;
	if (io) {
		b->job = io->cmd == BUTTER_DEVICE_CMD_REMOVE   ? JOB_REMOVE
			 : io->cmd == BUTTER_DEVICE_CMD_RESIZE ? JOB_RESIZE
							       : JOB_REPLACE;
		b->devid = io->devid;
		b->size = io->size;
		b->replace_flags = io->flags;
		if (b->job == JOB_REPLACE && !(b->path = strdup(io->path))) {
			pthread_mutex_unlock(&b->lock);
			return -ENOMEM;
		}
	}
	if (b->joinable) {
		pthread_join(b->thread, NULL); /* the last one has ended */
		b->joinable = false;
	}
	b->args = want;
	memset(&b->stats, 0, sizeof(b->stats));
	b->cursor = UINT64_MAX;
	b->error = 0;
	b->ended = 0;
	b->pause_req = b->cancel_req = false;
	b->running = true;
	ret = -pthread_create(&b->thread, NULL, balance_main, b);
	b->joinable = ret == 0;
	if (ret)
		b->running = false;
	pthread_mutex_unlock(&b->lock);
	return ret;
}

int balancer_ioctl(struct daemon *d, struct butter_ioc_balance *io)
{
	struct balancer *b = balancer_of(d);
	struct butter_balance_args recorded;
	int have_record, ret = 0;
	bool busy;

	if (!b)
		return -ENOMEM;
	/*
	 * The record is read only when nothing runs: a running job may hold the
	 * library's lock for long (a replace's copy), and status or cancel must
	 * answer at once. A running balance is recorded by definition.
	 */
	pthread_mutex_lock(&b->lock);
	have_record = b->running && b->job == JOB_BALANCE;
	busy = b->running;
	pthread_mutex_unlock(&b->lock);
	if (!busy)
		have_record = butter_balance_item(d->fs, &recorded) == 0;
	switch (io->cmd) {
	case BUTTER_BALANCE_CMD_START:
		if (d->readonly)
			return -EROFS;
		pthread_mutex_lock(&b->lock);
		ret = b->running ? -EINPROGRESS : 0;
		pthread_mutex_unlock(&b->lock);
		if (ret == 0 && have_record) {
			daemon_log(d, BUTTER_LOG_ERROR, "a balance is recorded (paused or interrupted): "
							 "resume or cancel it first");
			ret = -EINPROGRESS;
		}
		if (ret == 0)
			ret = start(b, &io->args, false, NULL);
		break;
	case BUTTER_BALANCE_CMD_RESUME:
		if (d->readonly)
			return -EROFS;
		ret = have_record ? start(b, &recorded, true, NULL) : -ENOENT;
		break;
	case BUTTER_BALANCE_CMD_PAUSE:
	case BUTTER_BALANCE_CMD_CANCEL:
		pthread_mutex_lock(&b->lock);
		if (b->running) {
			if (io->cmd == BUTTER_BALANCE_CMD_PAUSE)
				b->pause_req = true;
			else
				b->cancel_req = true;
		} else {
			ret = -ENOTCONN;
		}
		pthread_mutex_unlock(&b->lock);
		if (ret == -ENOTCONN && io->cmd == BUTTER_BALANCE_CMD_CANCEL && have_record)
			ret = d->readonly ? -EROFS : butter_balance_cancel(d->fs);
		break;
	case BUTTER_BALANCE_CMD_STATUS:
		break;
	default:
		return -EINVAL;
	}
	pthread_mutex_lock(&b->lock);
	io->state = (b->running ? BUTTER_BALANCE_STATE_RUNNING : 0) |
		    (b->pause_req ? BUTTER_BALANCE_STATE_PAUSE_REQ : 0) |
		    (b->cancel_req ? BUTTER_BALANCE_STATE_CANCEL_REQ : 0) |
		    (have_record ? BUTTER_BALANCE_STATE_RECORDED : 0) | (b->running ? 0 : b->ended);
	io->error = b->running ? 0 : b->error;
	io->job = b->job == JOB_BALANCE ? 0
		  : b->job == JOB_REMOVE ? BUTTER_DEVICE_CMD_REMOVE
		  : b->job == JOB_RESIZE ? BUTTER_DEVICE_CMD_RESIZE
					 : BUTTER_DEVICE_CMD_REPLACE;
	io->stats = b->stats;
	if (io->cmd == BUTTER_BALANCE_CMD_STATUS)
		io->args = b->running || !have_record ? b->args : recorded;
	pthread_mutex_unlock(&b->lock);
	return ret;
}

int balancer_device_ioctl(struct daemon *d, const struct butter_ioc_device *io)
{
	struct balancer *b = balancer_of(d);

	if (!b)
		return -ENOMEM;
	if (d->readonly)
		return -EROFS;
	if (io->cmd < BUTTER_DEVICE_CMD_REMOVE || io->cmd > BUTTER_DEVICE_CMD_REPLACE ||
	    (io->cmd == BUTTER_DEVICE_CMD_REPLACE &&
	     (!io->path[0] || strnlen(io->path, sizeof(io->path)) == sizeof(io->path))))
		return -EINVAL;
	return start(b, NULL, false, io);
}

void balancer_resume_at_mount(struct daemon *d)
{
	struct butter_balance_args recorded;
	struct balancer *b;
	int ret;

	if (d->readonly || butter_balance_item(d->fs, &recorded) != 0)
		return;
	if (d->opts->skip_balance) {
		daemon_log(d, BUTTER_LOG_WARNING, "a balance is recorded; not resumed (skip_balance): "
						  "`butter balance resume` or `cancel` on the mount");
		return;
	}
	b = balancer_of(d);
	ret = b ? start(b, &recorded, true, NULL) : -ENOMEM;
	daemon_log(d, ret ? BUTTER_LOG_ERROR : BUTTER_LOG_INFO, "resuming the recorded balance%s%s",
		   ret ? ": " : "", ret ? strerror(-ret) : "");
}

void balancer_stop(struct daemon *d)
{
	struct balancer *b;

	pthread_mutex_lock(&d->balancer_lock);
	b = d->balancer;
	d->balancer = NULL;
	pthread_mutex_unlock(&d->balancer_lock);
	if (!b)
		return;
	pthread_mutex_lock(&b->lock);
	if (b->running)
		b->pause_req = true; /* the record stays: the next mount goes on */
	pthread_mutex_unlock(&b->lock);
	if (b->joinable)
		pthread_join(b->thread, NULL);
	pthread_mutex_destroy(&b->lock);
	free(b->path);
	free(b);
}
