/*
 * fuzz_harness.h — the libFuzzer entry points the seed-image harnesses share
 * (fuzz_harness.c): at start-up load the seed images (fuzz_image.h) from
 * $BUTTER_FUZZ_SEEDS, else BUTTER_FUZZ_SEEDS_DIR, and stop when there are
 * none; for each input apply its edits to its seed, run the harness on the
 * edited image, and restore the seed. $BUTTER_FUZZ_VERBOSE=1 prints the seed
 * and what the harness does.
 *
 * A harness is one file that defines the two names below and is linked with
 * fuzz_harness.c and fuzz_image.c.
 */
#ifndef BUTTER_FUZZ_HARNESS_H
#define BUTTER_FUZZ_HARNESS_H

#include <stddef.h>

/* The harness's name, for its messages ("fuzz_write"). */
extern const char fuzz_harness_name[];

/* Run the harness on one edited image of @size bytes; the return value is not used. */
int fuzz_harness_run(const void *image, size_t size, int verbose);

#endif
