/*
 * fuzz_open_walk.c — libFuzzer harness: open + full walk of a mutated image.
 *
 * The input is an edit list over one of the seed images (fuzz_image.h); its
 * first byte also says whether to recompute tree block and superblock
 * checksums after editing, so mutations get past the checksum gate into the
 * item parsers as often as they are stopped by it. The walk (fuzz_walk.c)
 * calls every read-side API on everything reachable, within budgets.
 *
 * Seeds come from $BUTTER_FUZZ_SEEDS, else the source tree's tests/fuzz/seeds
 * (compiled in as BUTTER_FUZZ_SEEDS_DIR). $BUTTER_FUZZ_VERBOSE=1 prints the
 * walk and the library's messages (for replaying one input).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_image.h"
#include "fuzz_walk.h"

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
		fprintf(stderr, "fuzz_open_walk: no seed images in %s\n", dir);
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
	fuzz_walk_image(seed->work, seed->size, verbose);
	fuzz_image_restore(seed);
	return 0;
}
