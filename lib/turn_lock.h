/*
 * turn_lock.h — a reader-writer lock that serves its callers in the order
 * they came (a ticket each): the lock of the public calls (lib/api/api.c).
 *
 * Why not pthread_rwlock_t: glibc's rwlock prefers either readers (a stream
 * of reads starves a change) or writers (a reader waits while any writer
 * waits, so two threads that change things in turn, such as a replace's
 * steps and a writing application, keep a `replace status` or an `ls`
 * waiting until both stop). In turn order neither starves: a caller waits
 * only for those that came before it. Readers in a row hold it together.
 *
 * Invariants (under mutex): writer implies readers == 0; head <= next;
 * a caller with ticket t enters only when t == head, and entering moves
 * head on, so callers enter in ticket order.
 */
#ifndef BUTTER_TURN_LOCK_H
#define BUTTER_TURN_LOCK_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct turn_lock {
	pthread_mutex_t mutex;
	pthread_cond_t turn;   /* broadcast when head, readers or writer change and someone waits */
	uint64_t next;         /* the ticket the next caller takes */
	uint64_t head;         /* the ticket that may enter next */
	unsigned readers;      /* holding it shared */
	unsigned waiting;      /* sleeping on turn */
	bool writer;           /* held exclusive */
};

int turn_lock_init(struct turn_lock *l);
void turn_lock_destroy(struct turn_lock *l);
void turn_lock_shared(struct turn_lock *l);
void turn_lock_exclusive(struct turn_lock *l);
void turn_unlock_shared(struct turn_lock *l);
void turn_unlock_exclusive(struct turn_lock *l);

#endif
