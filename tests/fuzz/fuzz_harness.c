/*
 * fuzz_harness.c — LLVMFuzzerInitialize and LLVMFuzzerTestOneInput for the
 * harnesses over seed images; see fuzz_harness.h for what they promise.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_harness.h"
#include "fuzz_image.h"
#include "fuzz_entry.h"

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
		fprintf(stderr, "%s: no seed images in %s\n", fuzz_harness_name, dir);
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
	fuzz_harness_run(seed->work, seed->size, verbose);
	fuzz_image_restore(seed);
	return 0;
}
