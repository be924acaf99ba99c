/*
 * check.h — the unit tests' tiny harness. Each test file defines test
 * functions, lists them in main() with RUN(), and ends with
 * return check_summary(); which prints "N passed, N failed" and returns the
 * exit status. CHECK() records a failure with file:line and continues.
 */
#ifndef BUTTER_TESTS_CHECK_H
#define BUTTER_TESTS_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_failed_now;
static int check_passed, check_failed;

#define CHECK(cond)                                                                 \
	do {                                                                            \
		if (!(cond)) {                                                              \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
			check_failed_now = 1;                                                   \
		}                                                                           \
	} while (0)

#define CHECK_EQ_U64(a, b)                                                             \
	do {                                                                               \
		unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b); \
		if (a_ != b_) {                                                                \
			fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%llu != %llu)\n",        \
				__FILE__, __LINE__, #a, #b, a_, b_);                             \
			check_failed_now = 1;                                                  \
		}                                                                              \
	} while (0)

#define CHECK_MEM(a, b, n) CHECK(memcmp((a), (b), (n)) == 0)

#define RUN(fn)                                                   \
	do {                                                          \
		check_failed_now = 0;                                     \
		fn();                                                     \
		if (check_failed_now) {                                   \
			check_failed++;                                       \
			fprintf(stderr, "FAIL %s\n", #fn);                    \
		} else {                                                  \
			check_passed++;                                       \
		}                                                         \
	} while (0)

static inline int check_summary(void)
{
	printf("%d passed, %d failed\n", check_passed, check_failed);
	return check_failed ? 1 : 0;
}

#endif
