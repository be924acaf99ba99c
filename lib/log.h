/*
 * log.h — messages from the library to its user, through the callback given
 * at open time (butter_open_opts.log). Every layer holds a pointer to one
 * struct blog; there is no global logger.
 *
 * Corruption is reported through blog_corrupt(), which logs the function and
 * line where it was found plus the caller's detail (block number, item slot)
 * and returns -EUCLEAN, so a check reads: return BLOG_CORRUPT(log, "...", ...);
 */
#ifndef BUTTER_LOG_H
#define BUTTER_LOG_H

#include "butter/butter.h"

struct blog {
	butter_log_fn fn; /* NULL: stderr */
	void *arg;
	int level;        /* highest level delivered */
};

void blog_msg(const struct blog *log, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

int blog_corrupt(const struct blog *log, const char *func, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/*
 * ASSERT(cond): an invariant of the code (not of the image: a corrupt image
 * is -EUCLEAN, never an assertion). Builds without NDEBUG (the default
 * debugoptimized build and the test builds) print where it failed and
 * abort; release builds (meson b_ndebug=if-release) compile it away.
 */
#ifndef NDEBUG
#define ASSERT(cond) ((cond) ? (void)0 : blog_assert_failed(#cond, __FILE__, __LINE__, __func__))
#else
#define ASSERT(cond) ((void)0)
#endif
__attribute__((noreturn)) void blog_assert_failed(const char *cond, const char *file, int line,
						  const char *func);

#define BLOG_CORRUPT(log, ...) blog_corrupt((log), __func__, __LINE__, __VA_ARGS__)
#define blog_err(log, ...) blog_msg((log), BUTTER_LOG_ERROR, __VA_ARGS__)
#define blog_warn(log, ...) blog_msg((log), BUTTER_LOG_WARNING, __VA_ARGS__)
#define blog_info(log, ...) blog_msg((log), BUTTER_LOG_INFO, __VA_ARGS__)
#define blog_debug(log, ...) blog_msg((log), BUTTER_LOG_DEBUG, __VA_ARGS__)

#endif
