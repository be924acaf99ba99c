/*
 * treelist.h — a filesystem tree as a sorted list of text lines, made either
 * through libbutter or through POSIX calls on a mounted tree, so the two can
 * be compared line for line (crash tests: what a replayed image holds against
 * what the workload had committed; the kernel's view against both).
 *
 * One line per entry below the root (the root itself is "."), fields
 * separated by one tab:
 *
 *   PATH TYPE MODE UID GID NLINK SIZE DATA XATTRS
 *
 *   PATH    relative to the root, '/'-separated; \, tab and newline escaped
 *           as \\, \t, \n
 *   TYPE    f d l c b p s
 *   MODE    permission bits, octal
 *   SIZE    st_size (directories too: btrfs counts their name bytes)
 *   DATA    f: XXH3-128 of the content, hex (fast: replays hash gigabytes; the
 *           inputs are not adversarial); l: the target (escaped as PATH);
 *           c/b: major:minor; others: -
 *   XATTRS  XXH3-128 of the sorted "name=value\n" list, hex; - if none
 *
 * Times are left out: the kernel's atime handling and relatime would make
 * them differ for reasons that have nothing to do with the image.
 */
#ifndef BUTTER_TESTS_TREELIST_H
#define BUTTER_TESTS_TREELIST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "butter/butter.h"

struct treelist {
	char **lines; /* sorted after treelist_sort() */
	size_t n, cap;
	uint64_t file_bytes; /* sum of regular file sizes */
};

void treelist_free(struct treelist *t);

/* Walk the top-level subvolume of @fs. Returns 0 or the first error (negative errno). */
int treelist_butter(struct butter_fs *fs, struct treelist *out);

/* Walk the mounted tree at @root (not crossing into other filesystems' mounts). */
int treelist_posix(const char *root, struct treelist *out);

/* Sort the lines (both walkers call it before returning). */
void treelist_sort(struct treelist *t);

/* Append a copy of @line (without its newline). */
int treelist_add(struct treelist *t, const char *line);

/*
 * Compare two sorted lists; 0 if equal. Otherwise print up to @max
 * differences to stderr, each prefixed with @what, and return 1.
 */
int treelist_diff(const struct treelist *want, const struct treelist *got, const char *what,
		  int max);

/* Write every line followed by '\n'. */
int treelist_write(const struct treelist *t, FILE *f);

#endif
