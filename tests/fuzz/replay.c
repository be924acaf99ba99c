/*
 * replay.c — run fuzz inputs without libFuzzer: the regression test for saved
 * findings, and a tool to look at one input.
 *
 *   fuzz_replay [-v] [--write] [--dump-image OUT | --seed-info] PATH...
 *
 * PATH is an input file, or a directory searched (it and its subdirectories,
 * one level deep) for finding folders. A finding folder (tests/images/NNN-what/)
 * holds:
 *   fuzz-input   the minimized input (fuzz_image.h: an edit list over a seed)
 *   seed         "NAME sha256:HEX": the seed image the input edits; the run
 *                fails if the loaded seed at that index is not this image
 *                (a regenerated seed would silently change what the input means)
 *   expect       optional: lines that must each occur in some library message
 *                during the walk (the verdict: which check catches the damage)
 *   README       what was found and where it was fixed
 *   harness      optional: "write" runs the write-path sequence
 *                (fuzz_writes.c, harness fuzz_write) instead of the walk
 * -v prints the walk and every library message; --write runs the write
 * sequence on inputs given as files; --dump-image writes the
 * edited image of the (one) input to OUT, e.g. for `butter` or `btrfs check`;
 * --seed-info prints which seed an input edits, as a "seed" file records it.
 *
 * Exit status 0 when every input ran and met its expectations; a crash,
 * sanitizer report or broken API contract ends the process non-zero.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_image.h"
#include "fuzz_walk.h"
#include "fuzz_writes.h"

#ifndef BUTTER_FUZZ_SEEDS_DIR
#define BUTTER_FUZZ_SEEDS_DIR "tests/fuzz/seeds"
#endif

static const char *dump_path;
static int seed_info;
static int verbose;
static int ran;
static int write_files; /* --write: inputs given as files run the write sequence */

/* Library messages of the current input, for "expect". */
static char *messages;
static size_t messages_len, messages_cap;

static void collect_message(void *arg, int level, const char *msg)
{
	size_t len = strlen(msg);

	(void)arg;
	(void)level;
	if (messages_len + len + 2 > messages_cap) {
		size_t cap = (messages_len + len + 2) * 2;
		char *m = realloc(messages, cap);

		if (!m)
			return;
		messages = m;
		messages_cap = cap;
	}
	memcpy(messages + messages_len, msg, len);
	messages_len += len;
	messages[messages_len++] = '\n';
	messages[messages_len] = '\0';
}

static char *read_all(const char *path, size_t *size)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long len;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)len + 1)) && fread(buf, 1, (size_t)len, f) == (size_t)len) {
		buf[len] = '\0';
		*size = (size_t)len;
	} else {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	return buf;
}

static int dump(const uint8_t *data, size_t size)
{
	struct fuzz_seed *seed = fuzz_image_apply(data, size);
	FILE *f;
	int ok;

	if (!seed)
		return -1;
	f = fopen(dump_path, "wb");
	ok = f && fwrite(seed->work, 1, seed->size, f) == seed->size;
	if (f && fclose(f) != 0)
		ok = 0;
	fuzz_image_restore(seed);
	return ok ? 0 : -1;
}

/* Check that the input's seed index names the seed recorded in @seed_file. */
static int check_seed(const uint8_t *data, size_t size, const char *seed_file)
{
	char want_name[64], want_hex[65], hex[65];
	size_t len, idx;
	char *text = read_all(seed_file, &len);
	struct fuzz_seed *seed;
	int ok;

	if (!text)
		return 0; /* no record: nothing to check */
	ok = sscanf(text, "%63s sha256:%64s", want_name, want_hex) == 2;
	free(text);
	if (!ok || size == 0) {
		fprintf(stderr, "fuzz_replay: %s: expected \"NAME sha256:HEX\"\n", seed_file);
		return -1;
	}
	idx = (size_t)(data[0] >> 2) % fuzz_seed_count();
	seed = fuzz_seed_get(idx);
	if (strcmp(seed->name, want_name) != 0 || fuzz_seed_digest(idx, hex) != 0 ||
	    strcmp(hex, want_hex) != 0) {
		fprintf(stderr,
			"fuzz_replay: %s: the input edits seed %s (sha256 %.16s...), but seed %zu "
			"is now %s: the seeds changed; re-derive this finding\n",
			seed_file, want_name, want_hex, idx, seed->name);
		return -1;
	}
	return 0;
}

/* Every non-empty line of @expect_file must occur in the collected messages. */
static int check_expect(const char *expect_file, const char *input)
{
	size_t len;
	char *text = read_all(expect_file, &len), *line, *save = NULL;
	int ret = 0;

	if (!text)
		return 0;
	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (!*line)
			continue;
		if (!messages || !strstr(messages, line)) {
			fprintf(stderr, "fuzz_replay: %s: expected a message containing \"%s\"\n", input,
				line);
			ret = -1;
		}
	}
	free(text);
	return ret;
}

static int run_input(const char *path, const char *seed_file, const char *expect_file,
		     int write_harness)
{
	size_t size;
	uint8_t *data = (uint8_t *)read_all(path, &size);
	struct fuzz_seed *seed;
	int ret = 0;

	if (!data) {
		fprintf(stderr, "fuzz_replay: cannot read %s\n", path);
		return -1;
	}
	printf("== %s (%zu bytes)\n", path, size);
	fflush(stdout);
	if (seed_file && check_seed(data, size, seed_file) != 0) {
		free(data);
		return -1;
	}
	if (seed_info) {
		char hex[65];
		size_t idx = size ? (size_t)(data[0] >> 2) % fuzz_seed_count() : 0;

		if (size == 0 || fuzz_seed_digest(idx, hex) != 0)
			ret = -1;
		else
			printf("seed-index %zu\n%s sha256:%s\n", idx, fuzz_seed_get(idx)->name, hex);
	} else if (dump_path) {
		if (dump(data, size) != 0) {
			fprintf(stderr, "fuzz_replay: cannot write %s\n", dump_path);
			ret = -1;
		}
	} else if ((seed = fuzz_image_apply(data, size))) {
		messages_len = 0;
		if (messages)
			messages[0] = '\0';
		if (verbose)
			printf("seed %s (%zu tree blocks), mode %#x\n", seed->name, seed->nblocks,
			       data[0] & 3);
		if (write_harness)
			fuzz_write_image(seed->work, seed->size, verbose);
		else
			fuzz_walk_image(seed->work, seed->size, verbose);
		fuzz_image_restore(seed);
		if (expect_file)
			ret = check_expect(expect_file, path);
	}
	ran++;
	free(data);
	return ret;
}

/* A finding folder: fuzz-input plus optional seed and expect files. */
static int run_case(const char *dir)
{
	char input[4096], seed[4096], expect[4096], harness[4096], *which;
	size_t len;
	int write_harness;

	snprintf(input, sizeof(input), "%s/fuzz-input", dir);
	snprintf(seed, sizeof(seed), "%s/seed", dir);
	snprintf(expect, sizeof(expect), "%s/expect", dir);
	snprintf(harness, sizeof(harness), "%s/harness", dir);
	which = read_all(harness, &len);
	write_harness = which && strncmp(which, "write", 5) == 0;
	free(which);
	return run_input(input, seed, expect, write_harness);
}

static int run_dir(const char *dir, int depth)
{
	struct dirent **names;
	char path[4096];
	struct stat st;
	int n, i, ret = 0;

	snprintf(path, sizeof(path), "%s/fuzz-input", dir);
	if (stat(path, &st) == 0)
		return run_case(dir);
	n = scandir(dir, &names, NULL, alphasort);
	if (n < 0) {
		fprintf(stderr, "fuzz_replay: cannot list %s\n", dir);
		return -1;
	}
	for (i = 0; i < n; i++) {
		if (names[i]->d_name[0] != '.' && depth < 1) {
			snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name);
			if (stat(path, &st) == 0 && S_ISDIR(st.st_mode) && run_dir(path, depth + 1))
				ret = -1;
		}
		free(names[i]);
	}
	free(names);
	return ret;
}

static int usage(void)
{
	fprintf(stderr, "usage: fuzz_replay [-v] [--write] [--dump-image OUT | --seed-info] "
			"PATH...\n");
	return 2;
}

int main(int argc, char **argv)
{
	const char *dir = fuzz_seeds_dir(BUTTER_FUZZ_SEEDS_DIR);
	int i, ret = 0;
	struct stat st;

	for (i = 1; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "-v") == 0)
			verbose = 1;
		else if (strcmp(argv[i], "--write") == 0)
			write_files = 1;
		else if (strcmp(argv[i], "--dump-image") == 0 && i + 1 < argc)
			dump_path = argv[++i];
		else if (strcmp(argv[i], "--seed-info") == 0)
			seed_info = 1;
		else
			return usage();
	}
	if (i == argc)
		return usage();
	if (fuzz_seeds_load(dir) == 0) {
		fprintf(stderr, "fuzz_replay: no seed images in %s\n", dir);
		return 1;
	}
	fuzz_walk_set_log(collect_message, NULL);
	for (; i < argc; i++) {
		if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode))
			ret |= run_dir(argv[i], 0) != 0;
		else
			ret |= run_input(argv[i], NULL, NULL, write_files) != 0;
	}
	free(messages);
	printf("fuzz_replay: %d input(s) ran%s\n", ran, ret ? ", some FAILED" : "");
	return ret;
}
