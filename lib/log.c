/*
 * log.c — formatting and delivery of library messages (see log.h).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"

static void deliver(const struct blog *log, int level, const char *msg)
{
	if (log && log->fn)
		log->fn(log->arg, level, msg);
	else
		fprintf(stderr, "butter: %s\n", msg);
}

void blog_msg(const struct blog *log, int level, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;

	if (level > (log ? log->level : BUTTER_LOG_WARNING))
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	deliver(log, level, buf);
}

int blog_corrupt(const struct blog *log, const char *func, int line, const char *fmt, ...)
{
	char detail[768], buf[1024];
	va_list ap;

	if (log && BUTTER_LOG_ERROR > log->level)
		return -EUCLEAN;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	snprintf(buf, sizeof(buf), "corruption: %s (found in %s:%d)", detail, func, line);
	deliver(log, BUTTER_LOG_ERROR, buf);
	return -EUCLEAN;
}

void blog_assert_failed(const char *cond, const char *file, int line, const char *func)
{
	fprintf(stderr, "butter: assertion \"%s\" failed in %s() at %s:%d\n", cond, func, file,
		line);
	abort();
}
