/*
 * fuzz_receive.c — libFuzzer harness for the send stream parser and the
 * receive path (lib/ops/receive.c): a mutated stream is received into a
 * seed image opened copy-on-write in memory, then committed.
 *
 * Input layout: byte 0 picks the stream version (1 + bit 0) and the seed
 * image (the other bits); the rest is the stream after its 17-byte header
 * (the harness writes the header). Before the stream is received, the
 * harness walks its commands and rewrites each crc32c, so mutations get
 * past the checksum gate into the attribute and command handling (the
 * checksum check itself is covered by test_send.py). Hand-written inputs:
 * tests/fuzz/corpus-receive/ (made from `butter send` streams).
 * $BUTTER_FUZZ_VERBOSE=1 shows the library's messages.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <butter/butter.h>
#include <butter/testing.h>

#include "format/checksum.h"
#include "format/ondisk.h"
#include "fuzz_image.h"
#include "fuzz_entry.h"

#ifndef BUTTER_FUZZ_SEEDS_DIR
#define BUTTER_FUZZ_SEEDS_DIR "tests/fuzz/seeds"
#endif

static size_t nseeds;
static int verbose;

static void quiet(void *arg, int level, const char *msg)
{
	(void)arg;
	(void)level;
	(void)msg;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *v = getenv("BUTTER_FUZZ_VERBOSE");

	(void)argc;
	(void)argv;
	verbose = v && *v && *v != '0';
	nseeds = fuzz_seeds_load(fuzz_seeds_dir(BUTTER_FUZZ_SEEDS_DIR));
	if (nseeds == 0) {
		fprintf(stderr, "fuzz_receive: no seed images\n");
		exit(1);
	}
	return 0;
}

struct reader {
	const uint8_t *p;
	size_t left;
};

static ssize_t give(void *arg, void *buf, size_t len)
{
	struct reader *r = arg;

	if (len > r->left)
		len = r->left;
	memcpy(buf, r->p, len);
	r->p += len;
	r->left -= len;
	return (ssize_t)len;
}

/* Rewrite the crc of every command whose length fits what is left. */
static void fix_crcs(uint8_t *s, size_t size)
{
	size_t at = 0;

	while (size - at >= 10) {
		uint32_t len = get_le32(s + at);

		if (len > size - at - 10)
			break;
		memset(s + at + 6, 0, 4);
		put_le32(s + at + 6, btrfs_crc32c_raw(0, s + at, 10 + (size_t)len));
		at += 10 + (size_t)len;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct butter_open_opts opts = { .log = verbose ? NULL : quiet };
	struct butter_fs *fs;
	struct fuzz_seed *seed;
	struct reader r;
	butter_ino_t root;
	uint8_t *stream;

	if (size < 1)
		return 0;
	seed = fuzz_seed_get((size_t)(data[0] >> 1) % nseeds);
	stream = malloc(17 + size - 1);
	if (!stream)
		return 0;
	memcpy(stream, "btrfs-stream", 13);
	put_le32(stream + 13, 1u + (data[0] & 1u));
	memcpy(stream + 17, data + 1, size - 1);
	fix_crcs(stream + 17, size - 1);
	if (butter_open_memory_cow(seed->pristine, seed->size, &opts, &fs) == 0) {
		if (butter_root(fs, 5, &root) == 0) {
			r = (struct reader){ stream, 17 + size - 1 };
			(void)butter_receive(fs, root, give, &r, NULL);
			(void)butter_sync(fs);
		}
		butter_close(fs);
	}
	free(stream);
	return 0;
}
