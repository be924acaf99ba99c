/*
 * range.c — sorted, merged sets of byte ranges (see range.h). A sorted
 * array: lookups are binary searches; inserts and removals move the tail.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "extent/range.h"

void range_set_init(struct range_set *s)
{
	memset(s, 0, sizeof(*s));
}

void range_set_free(struct range_set *s)
{
	free(s->r);
	memset(s, 0, sizeof(*s));
}

/* Index of the first range with end >= @pos. */
static size_t lower(const struct range_set *s, u64 pos)
{
	size_t lo = 0, hi = s->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (s->r[mid].end < pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int reserve(struct range_set *s, size_t n)
{
	struct range *r;
	size_t cap;

	if (n <= s->cap)
		return 0;
	cap = s->cap ? s->cap * 2 : 16;
	while (cap < n)
		cap *= 2;
	r = realloc(s->r, cap * sizeof(*r));
	if (!r)
		return -ENOMEM;
	s->r = r;
	s->cap = cap;
	return 0;
}

int range_add(struct range_set *s, u64 start, u64 end)
{
	size_t i, j;

	if (start >= end)
		return 0;
	i = lower(s, start);
	/* ranges i..j-1 touch [start, end] and merge into one */
	for (j = i; j < s->n && s->r[j].start <= end; j++) {
		if (s->r[j].start < start)
			start = s->r[j].start;
		if (s->r[j].end > end)
			end = s->r[j].end;
		s->total -= s->r[j].end - s->r[j].start;
	}
	if (j == i) {
		if (reserve(s, s->n + 1))
			return -ENOMEM;
		memmove(&s->r[i + 1], &s->r[i], (s->n - i) * sizeof(s->r[0]));
		s->n++;
	} else if (j > i + 1) {
		memmove(&s->r[i + 1], &s->r[j], (s->n - j) * sizeof(s->r[0]));
		s->n -= j - i - 1;
	}
	s->r[i].start = start;
	s->r[i].end = end;
	s->total += end - start;
	return 0;
}

int range_remove(struct range_set *s, u64 start, u64 end)
{
	size_t i;

	if (start >= end)
		return 0;
	i = lower(s, start + 1);
	while (i < s->n && s->r[i].start < end) {
		struct range *r = &s->r[i];

		if (r->start < start && r->end > end) {
			/* split in two */
			if (reserve(s, s->n + 1))
				return -ENOMEM;
			r = &s->r[i];
			memmove(&s->r[i + 1], &s->r[i], (s->n - i) * sizeof(s->r[0]));
			s->n++;
			s->r[i].end = start;
			s->r[i + 1].start = end;
			s->total -= end - start;
			return 0;
		}
		if (r->start < start) {
			s->total -= r->end - start;
			r->end = start;
			i++;
		} else if (r->end > end) {
			s->total -= end - r->start;
			r->start = end;
			return 0;
		} else {
			s->total -= r->end - r->start;
			memmove(&s->r[i], &s->r[i + 1], (s->n - i - 1) * sizeof(s->r[0]));
			s->n--;
		}
	}
	return 0;
}

int range_contains(const struct range_set *s, u64 start, u64 end)
{
	size_t i = lower(s, start + 1);

	return i < s->n && s->r[i].start <= start && s->r[i].end >= end;
}

static int fit(const struct range *r, u64 len, u64 align, u64 from, u64 *start)
{
	u64 s = r->start > from ? r->start : from;

	s = (s + align - 1) / align * align;
	if (s >= r->end || r->end - s < len)
		return 0;
	*start = s;
	return 1;
}

int range_find(const struct range_set *s, u64 len, u64 align, u64 hint, u64 *start)
{
	size_t i;

	if (!align)
		align = 1;
	for (i = lower(s, hint + 1); i < s->n; i++)
		if (fit(&s->r[i], len, align, hint, start))
			return 0;
	for (i = 0; i < s->n; i++)
		if (fit(&s->r[i], len, align, 0, start))
			return 0;
	return -ENOSPC;
}
