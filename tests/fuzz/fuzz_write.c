/*
 * fuzz_write.c — libFuzzer harness: open + a fixed sequence of writes and
 * commits on a mutated image (fuzz_writes.c), over a copy-on-write memory
 * device, so the seed's bytes stay as fuzz_image_restore() expects them.
 *
 * Inputs are the same edit lists over the same seed images as
 * fuzz_open_walk (fuzz_image.h), so the two harnesses can share corpora.
 * $BUTTER_FUZZ_VERBOSE=1 prints each call and the library's messages. The
 * libFuzzer entry points are fuzz_harness.c's.
 */
#include "fuzz_harness.h"
#include "fuzz_writes.h"

const char fuzz_harness_name[] = "fuzz_write";

int fuzz_harness_run(const void *image, size_t size, int verbose)
{
	return fuzz_write_image(image, size, verbose);
}
