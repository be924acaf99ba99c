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
 * walk and the library's messages (for replaying one input). The libFuzzer
 * entry points are fuzz_harness.c's.
 */
#include "fuzz_harness.h"
#include "fuzz_walk.h"

const char fuzz_harness_name[] = "fuzz_open_walk";

int fuzz_harness_run(const void *image, size_t size, int verbose)
{
	return fuzz_walk_image(image, size, verbose);
}
