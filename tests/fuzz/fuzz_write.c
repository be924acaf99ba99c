/*
 * fuzz_write.c — libFuzzer harness: open + a fixed sequence of writes and
 * commits on a mutated image (fuzz_writes.c), over a copy-on-write memory
 * device, so the seed's bytes stay as fuzz_image_restore() expects them.
 *
 * Inputs are the same edit lists over the same seed images as
 * fuzz_open_walk (fuzz_image.h), so the two harnesses can share corpora.
 * $BUTTER_FUZZ_VERBOSE=1 prints each call and the library's messages.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_image.h"
#include "fuzz_writes.h"

#ifndef BUTTER_FUZZ_SEEDS_DIR
#define BUTTER_FUZZ_SEEDS_DIR "tests/fuzz/seeds"
#endif

static int verbose;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *dir = fuzz_seeds_dir(BUTTER_FUZZ_SEEDS_DIR);
	const char *v = getenv("BUTTER_FUZZ_VERBOSE");

	(void)argc;
	(void)argv;
	verbose = v && *v && *v != '0';
	if (fuzz_seeds_load(dir) == 0) {
		fprintf(stderr, "fuzz_write: no seed images in %s\n", dir);
		exit(1);
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_seed *seed = fuzz_image_apply(data, size);

	if (!seed)
		return 0;
	if (verbose)
		printf("seed %s (%zu tree blocks), mode %#x\n", seed->name, seed->nblocks, data[0] & 3);
	fuzz_write_image(seed->work, seed->size, verbose);
	fuzz_image_restore(seed);
	return 0;
}
