/*
 * test_api_lock.c — the handle's lock as butter.h states it (lib/api/api.c):
 * sections nest and release the lock when the one that took it ends; a
 * change or an exclusive section under a shared hold is -EDEADLK and changes
 * nothing; calls inside a section do not take the lock again; a section
 * keeps other threads' calls out (exclusive) or other threads' changes out
 * (shared) until it ends; butter_unlock() without a section is harmless;
 * callers enter in the order they came, so neither two threads that hold
 * the lock exclusive in turn starve a reader, nor two that hold it shared
 * in turn starve a change.
 * On a 256 MiB image made by butter_mkfs() in $TMPDIR.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "butter/butter.h"
#include "check.h"

static struct butter_fs *fs;
static butter_ino_t root;

struct other {
	int change;        /* 0: a stat, 1: a create */
	const char *name;
	atomic_int done;
	int ret;
};

static void *other_main(void *arg)
{
	struct other *o = arg;

	if (o->change) {
		struct butter_new_inode a = { .mode = S_IFREG | 0644 };
		butter_ino_t ino;

		o->ret = butter_create(fs, root, o->name, strlen(o->name), &a, &ino);
	} else {
		struct butter_stat st;

		o->ret = butter_stat(fs, root, &st);
	}
	atomic_store(&o->done, 1);
	return NULL;
}

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/*
 * Start a thread making one call while this thread holds a section; @blocked:
 * whether the call must wait for the section's end. Ends the section itself.
 */
static void other_while_held(int change, const char *name, int blocked)
{
	struct other o = { change, name, 0, -1 };
	pthread_t t;

	CHECK(pthread_create(&t, NULL, other_main, &o) == 0);
	sleep_ms(200);
	CHECK(atomic_load(&o.done) == !blocked);
	butter_unlock(fs);
	pthread_join(t, NULL);
	CHECK(o.ret == 0);
}

static int exists(const char *name)
{
	butter_ino_t ino;

	return butter_lookup(fs, root, name, strlen(name), &ino) == 0;
}

static void test_nested_shared(void)
{
	struct butter_new_inode a = { .mode = S_IFREG | 0644 };
	struct butter_stat st;
	butter_ino_t ino;

	CHECK(butter_lock(fs, 0) == 0);
	CHECK(butter_lock(fs, 0) == 0);          /* nests */
	CHECK(butter_stat(fs, root, &st) == 0);  /* a read inside */
	CHECK(butter_lock(fs, 1) == -EDEADLK);   /* exclusive under shared */
	CHECK(butter_create(fs, root, "no", 2, &a, &ino) == -EDEADLK);
	butter_unlock(fs);                       /* the inner one: still held */
	CHECK(butter_create(fs, root, "no", 2, &a, &ino) == -EDEADLK);
	/* another thread's read runs beside a shared section, its change waits */
	{
		struct other o = { 0, NULL, 0, -1 };
		pthread_t t;

		CHECK(pthread_create(&t, NULL, other_main, &o) == 0);
		pthread_join(t, NULL);
		CHECK(o.ret == 0);
	}
	other_while_held(1, "after-shared", 1);  /* ends the outer section */
	CHECK(!exists("no"));
	CHECK(exists("after-shared"));
}

static void test_exclusive_section(void)
{
	struct butter_new_inode a = { .mode = S_IFREG | 0644 };
	butter_ino_t ino;

	CHECK(butter_lock(fs, 1) == 0);
	CHECK(butter_create(fs, root, "in-section", 10, &a, &ino) == 0);
	CHECK(butter_lock(fs, 0) == 0);          /* shared inside exclusive */
	CHECK(exists("in-section"));
	butter_unlock(fs);
	CHECK(butter_sync(fs) == 0);
	other_while_held(0, NULL, 1);            /* even a read waits for an exclusive section */
}

static void test_unlock_without_section(void)
{
	butter_unlock(fs);                       /* nothing open: nothing happens */
	CHECK(butter_lock(fs, 1) == 0);          /* and the lock is free */
	other_while_held(0, NULL, 1);
	CHECK(butter_sync(fs) == 0);
}

/* A thread that holds a section of one mode again and again, 20 ms each, until told to stop. */
struct holder {
	int exclusive;
	atomic_int stop;
	int rounds;
};

static void *holder_main(void *arg)
{
	struct holder *h = arg;

	while (!atomic_load(&h->stop)) {
		if (butter_lock(fs, h->exclusive) != 0)
			break;
		sleep_ms(20);
		butter_unlock(fs);
		h->rounds++;
	}
	return NULL;
}

/*
 * Two holders of @exclusive mode overlap without a gap (one always waits
 * while the other holds); a call of the other kind must still get in within
 * a few of their turns. The holders stop after 5 s in any case: a call still
 * waiting then was starved.
 */
static void starve_check(int exclusive)
{
	struct holder h[2] = { { exclusive, 0, 0 }, { exclusive, 0, 0 } };
	struct other o = { !exclusive, exclusive ? NULL : "after-readers", 0, -1 };
	pthread_t ht[2], t;
	int waited = 0;

	CHECK(pthread_create(&ht[0], NULL, holder_main, &h[0]) == 0);
	CHECK(pthread_create(&ht[1], NULL, holder_main, &h[1]) == 0);
	sleep_ms(100);
	CHECK(pthread_create(&t, NULL, other_main, &o) == 0);
	while (!atomic_load(&o.done) && waited < 5000) {
		sleep_ms(10);
		waited += 10;
	}
	CHECK(atomic_load(&o.done) == 1); /* got in while the holders still took turns */
	atomic_store(&h[0].stop, 1);
	atomic_store(&h[1].stop, 1);
	pthread_join(ht[0], NULL);
	pthread_join(ht[1], NULL);
	pthread_join(t, NULL);
	CHECK(o.ret == 0);
	CHECK(h[0].rounds > 0 && h[1].rounds > 0);
}

static void test_turn_order(void)
{
	starve_check(1); /* a read among changes */
	starve_check(0); /* a change among reads */
	CHECK(exists("after-readers"));
}

int main(void)
{
	const char *tmp = getenv("TMPDIR");
	char dir[4096], img[4200];
	const char *devs[1] = { img };
	struct butter_mkfs_opts mo;
	int ret;

	snprintf(dir, sizeof(dir), "%s/butter-test-lock-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(img, sizeof(img), "%s/fs.img", dir);
	memset(&mo, 0, sizeof(mo));
	mo.devices = devs;
	mo.ndevices = 1;
	mo.size = 256ULL << 20;
	mo.csum_type = -1;
	ret = butter_mkfs(&mo);
	if (ret == 0)
		ret = butter_open(img, NULL, &fs);
	if (ret == 0)
		ret = butter_resolve(fs, "/", &root);
	if (ret) {
		fprintf(stderr, "setup: %s\n", strerror(-ret));
		return 1;
	}
	RUN(test_nested_shared);
	RUN(test_exclusive_section);
	RUN(test_unlock_without_section);
	RUN(test_turn_order);
	butter_close(fs);
	unlink(img);
	rmdir(dir);
	return check_summary();
}
