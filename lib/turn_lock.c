/*
 * turn_lock.c — the turn-order reader-writer lock (turn_lock.h has why).
 * One mutex and one condition variable: a caller takes a ticket and sleeps
 * until its ticket is at the head and what holds the lock lets it in. Every
 * change that can let the head in wakes all sleepers (there are few: the
 * daemon's request threads and its helpers); the head's own entry wakes the
 * rest, so a row of readers enters together.
 */
#include <errno.h>

#include "turn_lock.h"

int turn_lock_init(struct turn_lock *l)
{
	int ret = pthread_mutex_init(&l->mutex, NULL);

	if (ret)
		return -ret;
	ret = pthread_cond_init(&l->turn, NULL);
	if (ret) {
		pthread_mutex_destroy(&l->mutex);
		return -ret;
	}
	l->next = l->head = 0;
	l->readers = l->waiting = 0;
	l->writer = false;
	return 0;
}

void turn_lock_destroy(struct turn_lock *l)
{
	pthread_cond_destroy(&l->turn);
	pthread_mutex_destroy(&l->mutex);
}

static void wait_turn(struct turn_lock *l)
{
	l->waiting++;
	pthread_cond_wait(&l->turn, &l->mutex);
	l->waiting--;
}

void turn_lock_shared(struct turn_lock *l)
{
	uint64_t ticket;

	pthread_mutex_lock(&l->mutex);
	ticket = l->next++;
	while (ticket != l->head || l->writer)
		wait_turn(l);
	l->readers++;
	l->head++;
	if (l->waiting) /* the next in line may be a reader too */
		pthread_cond_broadcast(&l->turn);
	pthread_mutex_unlock(&l->mutex);
}

void turn_lock_exclusive(struct turn_lock *l)
{
	uint64_t ticket;

	pthread_mutex_lock(&l->mutex);
	ticket = l->next++;
	while (ticket != l->head || l->writer || l->readers)
		wait_turn(l);
	l->writer = true;
	l->head++; /* the next in line waits for the unlock: nothing to wake */
	pthread_mutex_unlock(&l->mutex);
}

void turn_unlock_shared(struct turn_lock *l)
{
	pthread_mutex_lock(&l->mutex);
	l->readers--;
	if (l->readers == 0 && l->waiting)
		pthread_cond_broadcast(&l->turn);
	pthread_mutex_unlock(&l->mutex);
}

void turn_unlock_exclusive(struct turn_lock *l)
{
	pthread_mutex_lock(&l->mutex);
	l->writer = false;
	if (l->waiting)
		pthread_cond_broadcast(&l->turn);
	pthread_mutex_unlock(&l->mutex);
}
