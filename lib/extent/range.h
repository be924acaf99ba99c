/*
 * range.h — a set of disjoint byte ranges [start, end), kept sorted and
 * merged. Used for free space per block group and for pinned extents.
 */
#ifndef BUTTER_EXTENT_RANGE_H
#define BUTTER_EXTENT_RANGE_H

#include "format/ondisk.h"

struct range {
	u64 start, end;
};

struct range_set {
	struct range *r;
	size_t n, cap;
	u64 total;      /* sum of lengths */
};

void range_set_init(struct range_set *s);
void range_set_free(struct range_set *s);
/* Add [start, end); overlapping or adjacent ranges merge. */
int range_add(struct range_set *s, u64 start, u64 end);
/* Remove [start, end) (parts not present are ignored). */
int range_remove(struct range_set *s, u64 start, u64 end);
/* Is all of [start, end) in the set? */
int range_contains(const struct range_set *s, u64 start, u64 end);
/*
 * Find the first range piece of @len bytes aligned to @align at or after
 * @hint (wrapping to the start). Returns 0 with *start, or -ENOSPC.
 */
int range_find(const struct range_set *s, u64 len, u64 align, u64 hint, u64 *start);

#endif
