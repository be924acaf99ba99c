/*
 * fuzz_walk.h — open an image from memory and exercise every read-side call
 * of the public API on everything reachable, within fixed budgets; and the
 * API-contract check the harness bodies share (FUZZ_CONTRACT).
 */
#ifndef BUTTER_FUZZ_WALK_H
#define BUTTER_FUZZ_WALK_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "butter/butter.h"

/*
 * Abort, naming harness @who and where, when @cond does not hold: a result
 * the public API rules out (fuzz_walk.c, fuzz_writes.c).
 */
#define FUZZ_CONTRACT(who, cond)                                                      \
	do {                                                                          \
		if (!(cond)) {                                                        \
			fprintf(stderr, "%s: API contract broken: %s (%s:%d)\n", (who), \
				#cond, __FILE__, __LINE__);                           \
			abort();                                                      \
		}                                                                     \
	} while (0)

/*
 * Open @size bytes at @image with butter_open_memory() and walk it: info,
 * devices, space, every directory of every subvolume (readdir, lookup of each
 * name, stat, xattrs, read of every file, seek, readlink), path resolution,
 * subvolume list. Library messages go to stderr when @verbose, else nowhere;
 * @verbose also prints what the walk saw. Returns the number of calls that
 * failed (errors are expected on damaged images; only crashes, hangs, leaks
 * and impossible results matter, and the latter abort()).
 */
int fuzz_walk_image(const void *image, size_t size, int verbose);

/*
 * Also hand every library message to @fn (NULL: stop). For the replay tool,
 * which checks a finding's expected messages.
 */
void fuzz_walk_set_log(void (*fn)(void *arg, int level, const char *msg), void *arg);

/*
 * The log callback the walk opens with (to stderr when @verbose, and to the
 * function given to fuzz_walk_set_log()), for the other harnesses.
 */
butter_log_fn fuzz_walk_log_fn(int verbose);

#endif
