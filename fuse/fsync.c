/*
 * fsync.c — fsync and fsyncdir requests of the mount, grouped: requests that
 * arrive while a tree log sync runs are made durable together by the next
 * one (butter_fsync_many(): one flush sequence), the group commit every
 * journaling filesystem does.
 *
 * Protocol (each request is one entry; the queue has its own mutex, taken
 * before the library's lock is asked for and never while waiting for it):
 *   1. the request's thread appends its entry to the queue;
 *   2. it holds the library's lock exclusive (butter_lock(): a section, so
 *      the requests that queue meanwhile wait for this batch to end);
 *   3. it takes every entry queued by then (its own, unless an earlier
 *      thread's batch took it), makes them durable in one call and replies
 *      to each; then it ends the section.
 * A thread whose entry was taken by another batch finds the queue empty (or
 * holding later requests, which it serves) and returns: its request was
 * answered, and the fuse_req_t is not touched again after step 1.
 */
#include <errno.h>
#include <stdlib.h>

#include "daemon.h"

struct fsync_entry {
	fuse_req_t req;
	fuse_ino_t ino;
	int datasync;
	struct fsync_entry *next;
};

void fsync_queue_init(struct fsync_queue *q)
{
	pthread_mutex_init(&q->lock, NULL);
	q->head = NULL;
	q->tail = &q->head;
}

void fsync_queue_destroy(struct fsync_queue *q)
{
	pthread_mutex_destroy(&q->lock);
}

static struct fsync_entry *take_all(struct fsync_queue *q)
{
	struct fsync_entry *all;

	pthread_mutex_lock(&q->lock);
	all = q->head;
	q->head = NULL;
	q->tail = &q->head;
	pthread_mutex_unlock(&q->lock);
	return all;
}

/* Make the batch @all durable and answer each request (inside an exclusive section). */
static void serve(struct daemon *d, struct fsync_entry *all)
{
	butter_ino_t *inos;
	struct fsync_entry *e, *next;
	size_t n = 0, i = 0;
	int ret = 0, datasync = 1, commit = 0;

	for (e = all; e; e = e->next)
		n++;
	inos = calloc(n, sizeof(*inos));
	for (e = all; e && inos; e = e->next) {
		/* a node the table no longer knows: commit, as fsync did before the log */
		if (nodes_resolve(&d->nodes, e->ino, &inos[i]) != 0)
			commit = 1;
		else
			i++;
		datasync &= e->datasync;
	}
	if (!inos || commit)
		ret = butter_sync(d->fs);
	else
		ret = butter_fsync_many(d->fs, inos, i, datasync);
	free(inos);
	if (ret == -ENOSYS)
		ret = -EOPNOTSUPP;
	for (e = all; e; e = next) {
		next = e->next;
		fuse_reply_err(e->req, ret < 0 ? -ret : 0);
		free(e);
	}
}

void butter_fuse_fsync(fuse_req_t req, fuse_ino_t ino, int datasync)
{
	struct daemon *d = fuse_req_userdata(req);
	struct fsync_queue *q = &d->fsyncq;
	struct fsync_entry *e, *all;

	if (d->readonly) {
		fuse_reply_err(req, 0);
		return;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	e->req = req;
	e->ino = ino;
	e->datasync = datasync;
	pthread_mutex_lock(&q->lock);
	*q->tail = e;
	q->tail = &e->next;
	pthread_mutex_unlock(&q->lock);

	daemon_note_change(d);
	/* if the section cannot begin (a dead handle), each call says why itself */
	int locked = butter_lock(d->fs, 1);

	all = take_all(q);
	if (all)
		serve(d, all);
	if (locked == 0)
		butter_unlock(d->fs);
}
