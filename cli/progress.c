/*
 * progress.c — a progress line for long work on a terminal: what, percent,
 * done of total, rate and time left, redrawn in place (\r) at most four
 * times a second on stderr, and erased at the end (without a total: done
 * and rate; for a count, such as block groups, no rate). Shown only when stderr
 * is a terminal and the command was not told -q: nothing reaches a pipe or
 * a log.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static double seconds_since(const struct timespec *t)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t->tv_sec) + (double)(now.tv_nsec - t->tv_nsec) / 1e9;
}

void cli_progress_begin(struct cli_progress *p, const char *what, uint64_t total, bool quiet)
{
	memset(p, 0, sizeof(*p));
	p->what = what;
	p->total = total;
	p->on = !quiet && isatty(STDERR_FILENO);
	clock_gettime(CLOCK_MONOTONIC, &p->start);
	/* p->last stays 0: the first update draws at once */
}

void cli_progress_update(struct cli_progress *p, uint64_t done)
{
	char a[32], b[32], r[32];
	double elapsed, rate;
	uint64_t total;
	unsigned pct, left;

	p->done = done;
	if (!p->on || seconds_since(&p->last) < 0.25)
		return;
	clock_gettime(CLOCK_MONOTONIC, &p->last);
	elapsed = seconds_since(&p->start);
	rate = elapsed > 0 ? (double)done / elapsed : 0;
	if (p->unit) { /* a count: how many of how many, and the time left */
		total = p->total > done ? p->total : done;
		pct = total ? (unsigned)(100.0 * (double)done / (double)total) : 0;
		left = rate > 0 ? (unsigned)((double)(total - done) / rate) : 0;
		fprintf(stderr, "\r%s: %3u%% %llu of %llu %s, %u:%02u left ", p->what, pct,
			(unsigned long long)done, (unsigned long long)total, p->unit, left / 60,
			left % 60);
		p->drawn = true;
		return;
	}
	if (!p->total) { /* no total known (a stream): how much, how fast */
		fprintf(stderr, "\r%s: %s, %s/s ", p->what, cli_size_units(a, sizeof(a), done, NULL),
			cli_size_units(r, sizeof(r), (uint64_t)rate, NULL));
		p->drawn = true;
		return;
	}
	total = p->total > done ? p->total : done; /* an estimate of the total may fall short */
	pct = total ? (unsigned)(100.0 * (double)done / (double)total) : 0;
	left = rate > 0 ? (unsigned)((double)(total - done) / rate) : 0;
	fprintf(stderr, "\r%s: %3u%% %s of %s, %s/s, %u:%02u left ", p->what, pct,
		cli_size_units(a, sizeof(a), done, NULL), cli_size_units(b, sizeof(b), total, NULL),
		cli_size_units(r, sizeof(r), (uint64_t)rate, NULL), left / 60, left % 60);
	p->drawn = true;
}

void cli_progress_end(struct cli_progress *p)
{
	if (p->on && p->drawn)
		fprintf(stderr, "\r\033[K");
	p->drawn = false;
}
