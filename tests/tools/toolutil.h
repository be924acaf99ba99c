/*
 * toolutil.h — what the test programs driving the library share: the parent
 * lookup of a path in an image, and the seeded bytes the tests expect
 * (xorshift64 from seed * 2654435761 + 1; test_falloc_clone.py prng_bytes()).
 */
#ifndef BUTTER_TESTS_TOOLUTIL_H
#define BUTTER_TESTS_TOOLUTIL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "butter/butter.h"

/* The directory holding @path (from the top level) in *dir, its last name in *name. */
static inline int tool_parent_of(struct butter_fs *fs, const char *path, butter_ino_t *dir,
				 const char **name)
{
	char tmp[4096];
	const char *slash = strrchr(path, '/');

	if (!slash) {
		*name = path;
		return butter_root(fs, 5, dir);
	}
	snprintf(tmp, sizeof(tmp), "%.*s", (int)(slash - path), path);
	*name = slash + 1;
	return butter_resolve(fs, tmp, dir);
}

/* @len seeded bytes into @buf. */
static inline void tool_fill(unsigned char *buf, uint64_t len, uint64_t seed)
{
	uint64_t x = seed * 2654435761u + 1, i;

	for (i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (unsigned char)x;
	}
}

#endif
