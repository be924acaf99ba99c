/*
 * test_checksum.c — unit tests for lib/format/checksum.c.
 *
 * Oracles, none of them the library under test:
 *  - published test vectors (CRC-32C check value, XXH64, FIPS 180-2 SHA-256,
 *    BLAKE2b-256), and long-input digests computed once with Python's hashlib;
 *  - a bitwise CRC-32C written here from the polynomial (reflected 0x82F63B78),
 *    compared with the library over random buffers, seeds and alignments;
 *  - name hashes read from DIR_ITEM key offsets that mkfs.btrfs (btrfs-progs
 *    6.2, --rootdir) wrote into a real image.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "format/checksum.h"
#include "check.h"

/* ---- helpers ------------------------------------------------------------ */

/* Bitwise reflected CRC-32C with no pre/post inversion, like the kernel's crc32c(). */
static u32 ref_crc32c(u32 crc, const void *data, size_t len)
{
	const u8 *p = data;

	while (len--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
	}
	return crc;
}

/* Deterministic xorshift64 so failures reproduce. */
static u64 rng_next(u64 *s)
{
	u64 x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	*s = x;
	return x;
}

static void fill_random(u8 *buf, size_t len, u64 *s)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (u8)(rng_next(s) >> 24);
}

/* Decode a hex string into @out; returns the number of bytes. */
static size_t unhex(const char *hex, u8 *out)
{
	size_t n = 0;

	for (; hex[0] && hex[1]; hex += 2) {
		char byte[3] = { hex[0], hex[1], 0 };
		out[n++] = (u8)strtoul(byte, NULL, 16);
	}
	return n;
}

/* Check that the digest of @msg under @type is @hex, then zeros to 32 bytes. */
static void check_digest(u16 type, const void *msg, size_t len, const char *hex)
{
	u8 want[BTRFS_CSUM_SIZE] = { 0 };
	u8 got[BTRFS_CSUM_SIZE];
	size_t n = unhex(hex, want);

	CHECK_EQ_U64(n, btrfs_csum_size(type));
	memset(got, 0xAA, sizeof(got));
	CHECK_EQ_U64(btrfs_csum_compute(type, msg, len, got), 0);
	CHECK_MEM(got, want, BTRFS_CSUM_SIZE);
}

/* The 100003-byte pattern whose sha256 and blake2b were computed with hashlib. */
static u8 *long_pattern(size_t *len)
{
	size_t n = 100003;
	u8 *buf = malloc(n);

	for (size_t i = 0; buf && i < n; i++)
		buf[i] = (u8)(((i * 31 + 7) & 0xff) ^ ((i >> 8) & 0xff));
	*len = n;
	return buf;
}

static const char digits[] = "123456789";
static const char abc[] = "abc";

/* ---- tests -------------------------------------------------------------- */

/* Runs first: the first sodium users race through pthread_once. */
static void *blake2_thread(void *arg)
{
	u8 *out = arg;

	if (btrfs_csum_compute(BTRFS_CSUM_TYPE_BLAKE2, abc, 3, out))
		memset(out, 0, BTRFS_CSUM_SIZE);
	return NULL;
}

static void test_first_use_from_threads(void)
{
	enum { N = 8 };
	pthread_t t[N];
	u8 out[N][BTRFS_CSUM_SIZE];
	u8 want[BTRFS_CSUM_SIZE] = { 0 };
	int started[N];

	unhex("bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319", want);
	for (int i = 0; i < N; i++)
		started[i] = pthread_create(&t[i], NULL, blake2_thread, out[i]) == 0;
	for (int i = 0; i < N; i++) {
		CHECK(started[i]);
		if (!started[i])
			continue;
		pthread_join(t[i], NULL);
		CHECK_MEM(out[i], want, BTRFS_CSUM_SIZE);
	}
}

static void test_sizes_and_names(void)
{
	CHECK_EQ_U64(btrfs_csum_size(BTRFS_CSUM_TYPE_CRC32), 4);
	CHECK_EQ_U64(btrfs_csum_size(BTRFS_CSUM_TYPE_XXHASH), 8);
	CHECK_EQ_U64(btrfs_csum_size(BTRFS_CSUM_TYPE_SHA256), 32);
	CHECK_EQ_U64(btrfs_csum_size(BTRFS_CSUM_TYPE_BLAKE2), 32);
	CHECK(btrfs_csum_name(BTRFS_CSUM_TYPE_CRC32) &&
	      strcmp(btrfs_csum_name(BTRFS_CSUM_TYPE_CRC32), "crc32c") == 0);
	CHECK(btrfs_csum_name(BTRFS_CSUM_TYPE_XXHASH) &&
	      strcmp(btrfs_csum_name(BTRFS_CSUM_TYPE_XXHASH), "xxhash64") == 0);
	CHECK(btrfs_csum_name(BTRFS_CSUM_TYPE_SHA256) &&
	      strcmp(btrfs_csum_name(BTRFS_CSUM_TYPE_SHA256), "sha256") == 0);
	CHECK(btrfs_csum_name(BTRFS_CSUM_TYPE_BLAKE2) &&
	      strcmp(btrfs_csum_name(BTRFS_CSUM_TYPE_BLAKE2), "blake2b") == 0);

	const u16 unknown[] = { 4, 5, 255, 256, 0x8000, 0xffff };
	for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
		CHECK_EQ_U64(btrfs_csum_size(unknown[i]), 0);
		CHECK(btrfs_csum_name(unknown[i]) == NULL);
	}
}

static void test_unknown_type_is_einval(void)
{
	const u16 unknown[] = { 4, 7, 0xffff };
	u8 out[BTRFS_CSUM_SIZE];
	u8 zero[BTRFS_CSUM_SIZE] = { 0 };

	for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
		memset(out, 0xAA, sizeof(out));
		CHECK_EQ_U64(btrfs_csum_compute(unknown[i], abc, 3, out), -EINVAL);
		CHECK_MEM(out, zero, BTRFS_CSUM_SIZE);
	}
}

static void test_crc32c_vectors(void)
{
	/* CRC-32C check value 0xE3069283, stored little-endian. */
	check_digest(BTRFS_CSUM_TYPE_CRC32, digits, 9, "839206e3");
	check_digest(BTRFS_CSUM_TYPE_CRC32, "", 0, "00000000");
	/* The raw update is the same CRC without the inversions. */
	CHECK_EQ_U64(btrfs_crc32c_raw(~0u, digits, 9), 0x1CF96D7Cu);
	CHECK_EQ_U64(btrfs_crc32c_raw(0x12345678u, digits, 0), 0x12345678u);
	CHECK_EQ_U64(btrfs_crc32c_raw(0x12345678u, NULL, 0), 0x12345678u);
	/* And the bitwise reference agrees with the published check value. */
	CHECK_EQ_U64(~ref_crc32c(~0u, digits, 9), 0xE3069283u);
}

static void test_crc32c_against_reference(void)
{
	enum { MAXLEN = 70000 };
	u8 *buf = malloc(MAXLEN + 16);
	u64 s = 0x9E3779B97F4A7C15ull;

	CHECK(buf != NULL);
	if (!buf)
		return;
	fill_random(buf, MAXLEN + 16, &s);

	for (int iter = 0; iter < 2000; iter++) {
		size_t off = rng_next(&s) % 16;
		size_t len;

		if (iter < 600)
			len = (size_t)iter;          /* every small length, all tails */
		else if (iter < 1990)
			len = rng_next(&s) % 5000;
		else
			len = MAXLEN - (rng_next(&s) % 8);
		u32 seed = (u32)rng_next(&s);
		if (iter % 3 == 0)
			seed = ~0u;
		u32 want = ref_crc32c(seed, buf + off, len);
		u32 got = btrfs_crc32c_raw(seed, buf + off, len);
		if (got != want) {
			fprintf(stderr, "crc32c mismatch: iter %d off %zu len %zu seed %08x: %08x != %08x\n",
				iter, off, len, seed, got, want);
			CHECK(got == want);
			break;
		}
		/* Chaining two updates equals one update over the whole range. */
		size_t cut = len ? rng_next(&s) % len : 0;
		u32 chained = btrfs_crc32c_raw(btrfs_crc32c_raw(seed, buf + off, cut),
					       buf + off + cut, len - cut);
		CHECK_EQ_U64(chained, want);

		/* The stored crc32c checksum is ~raw(~0), little-endian. */
		u8 out[BTRFS_CSUM_SIZE];
		CHECK_EQ_U64(btrfs_csum_compute(BTRFS_CSUM_TYPE_CRC32, buf + off, len, out), 0);
		CHECK_EQ_U64(get_le32(out), ~ref_crc32c(~0u, buf + off, len));
	}
	free(buf);
}

/*
 * A buffer longer than INT_MAX: ISA-L takes an int length, so the library must
 * split it. Compare with a chain of updates cut at boundaries of our choosing.
 */
static void test_crc32c_longer_than_int(void)
{
	const size_t len = ((size_t)1 << 31) + 4099;
	u8 *buf = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (buf == MAP_FAILED) {
		fprintf(stderr, "SKIP test_crc32c_longer_than_int: cannot map %zu bytes\n", len);
		return;
	}
	/* Mostly zero pages; a few marks so a dropped or repeated chunk shows. */
	const size_t marks[] = { 0, 1, ((size_t)1 << 30) - 1, (size_t)1 << 30,
				 ((size_t)1 << 31) - 1, (size_t)1 << 31, len - 1 };
	for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++)
		buf[marks[i]] = (u8)(0x5A + i);

	u32 whole = btrfs_crc32c_raw(0x0BADCAFEu, buf, len);
	const size_t step = 700000001; /* < INT_MAX, not a power of two */
	u32 chained = 0x0BADCAFEu;
	for (size_t at = 0; at < len; at += step)
		chained = btrfs_crc32c_raw(chained, buf + at, len - at < step ? len - at : step);
	CHECK_EQ_U64(whole, chained);

	/* The last byte matters: change it and the CRC must change. */
	buf[len - 1] ^= 1;
	CHECK(btrfs_crc32c_raw(0x0BADCAFEu, buf, len) != whole);
	munmap(buf, len);
}

static void test_xxhash_vectors(void)
{
	/* XXH64(seed 0): "" = 0xEF46DB3751D8E999, "abc" = 0x44BC2CF5AD770999; stored LE. */
	check_digest(BTRFS_CSUM_TYPE_XXHASH, "", 0, "99e9d85137db46ef");
	check_digest(BTRFS_CSUM_TYPE_XXHASH, abc, 3, "990977adf52cbc44");

	u8 out[BTRFS_CSUM_SIZE];
	CHECK_EQ_U64(btrfs_csum_compute(BTRFS_CSUM_TYPE_XXHASH, abc, 3, out), 0);
	CHECK_EQ_U64(get_le64(out), 0x44BC2CF5AD770999ull);
}

static void test_sha256_vectors(void)
{
	check_digest(BTRFS_CSUM_TYPE_SHA256, "", 0,
		     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	check_digest(BTRFS_CSUM_TYPE_SHA256, abc, 3,
		     "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	check_digest(BTRFS_CSUM_TYPE_SHA256, two_blocks, strlen(two_blocks),
		     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");

	size_t n;
	u8 *p = long_pattern(&n);
	CHECK(p != NULL);
	if (p)
		check_digest(BTRFS_CSUM_TYPE_SHA256, p, n,
			     "9acc7dcb14970d0e293551e23dd238fe7117a702ba747b7fcf68290d674fe7b4");
	free(p);
}

static void test_blake2_vectors(void)
{
	check_digest(BTRFS_CSUM_TYPE_BLAKE2, "", 0,
		     "0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8");
	check_digest(BTRFS_CSUM_TYPE_BLAKE2, abc, 3,
		     "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319");

	size_t n;
	u8 *p = long_pattern(&n);
	CHECK(p != NULL);
	if (p)
		check_digest(BTRFS_CSUM_TYPE_BLAKE2, p, n,
			     "d071d38a5653a429c786313f7ecc2d3f2d61be021bfd5c408917f4ec1ecd5a6d");
	free(p);
}

/* Every type: digest bytes first, zeros after, whatever @out held before. */
static void test_zero_padding_and_null_empty(void)
{
	for (u16 type = 0; type < 4; type++) {
		int size = btrfs_csum_size(type);
		u8 dirty[BTRFS_CSUM_SIZE], clean[BTRFS_CSUM_SIZE], empty[BTRFS_CSUM_SIZE];

		memset(dirty, 0xFF, sizeof(dirty));
		memset(clean, 0x00, sizeof(clean));
		CHECK_EQ_U64(btrfs_csum_compute(type, digits, 9, dirty), 0);
		CHECK_EQ_U64(btrfs_csum_compute(type, digits, 9, clean), 0);
		CHECK_MEM(dirty, clean, BTRFS_CSUM_SIZE);
		for (int i = size; i < BTRFS_CSUM_SIZE; i++)
			CHECK_EQ_U64(dirty[i], 0);
		/* The digest itself is not left as the fill pattern. */
		int all_ff = 1;
		for (int i = 0; i < size; i++)
			all_ff &= dirty[i] == 0xFF;
		CHECK(!all_ff);

		/* NULL with length 0 is the empty message. */
		memset(empty, 0x11, sizeof(empty));
		CHECK_EQ_U64(btrfs_csum_compute(type, NULL, 0, empty), 0);
		CHECK_EQ_U64(btrfs_csum_compute(type, "", 0, clean), 0);
		CHECK_MEM(empty, clean, BTRFS_CSUM_SIZE);

		/* One flipped bit changes the digest. */
		char flipped[9];
		memcpy(flipped, digits, 9);
		flipped[4] ^= 0x10;
		CHECK_EQ_U64(btrfs_csum_compute(type, flipped, 9, clean), 0);
		CHECK(memcmp(clean, dirty, BTRFS_CSUM_SIZE) != 0);
	}
}

/* DIR_ITEM key offsets written by mkfs.btrfs 6.2 --rootdir into a real image. */
static void test_name_hash_matches_mkfs(void)
{
	static const struct {
		const char *name;
		u64 hash;
	} cases[] = {
		{ "default", 2378154706u },         /* root tree, ROOT_TREE_DIR */
		{ "hello.txt", 1096805209u },
		{ "lost+found_not", 1116075268u },
		{ "Z\xc3\xbcrich", 1667906511u },   /* UTF-8 "Zürich" */
		{ "subdir", 2797133009u },
		{ "link", 2885771098u },
		{ "a", 3427024844u },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		size_t len = strlen(cases[i].name);
		u64 got = btrfs_name_hash(cases[i].name, len);
		if (got != cases[i].hash)
			fprintf(stderr, "name_hash(\"%s\") = %llu\n", cases[i].name,
				(unsigned long long)got);
		CHECK_EQ_U64(got, cases[i].hash);
		CHECK_EQ_U64(got, ref_crc32c(~1u, cases[i].name, len));
	}
}

static void test_extref_hash(void)
{
	/* The kernel passes the parent objectid as a u32 seed: high bits drop. */
	const u64 parents[] = { 256, 257, 0x100000100ull, 0xFFFFFFFFFFFFFF00ull, 0 };
	const char *name = "hardlink-name";
	size_t len = strlen(name);

	for (size_t i = 0; i < sizeof(parents) / sizeof(parents[0]); i++) {
		u64 got = btrfs_extref_hash(parents[i], name, len);
		CHECK_EQ_U64(got, ref_crc32c((u32)parents[i], name, len));
		CHECK(got <= 0xFFFFFFFFull);
	}
	CHECK_EQ_U64(btrfs_extref_hash(0x100000100ull, name, len),
		     btrfs_extref_hash(0x100ull, name, len));
	CHECK(btrfs_extref_hash(256, name, len) != btrfs_extref_hash(257, name, len));
}

int main(void)
{
	RUN(test_first_use_from_threads);
	RUN(test_sizes_and_names);
	RUN(test_unknown_type_is_einval);
	RUN(test_crc32c_vectors);
	RUN(test_crc32c_against_reference);
	RUN(test_crc32c_longer_than_int);
	RUN(test_xxhash_vectors);
	RUN(test_sha256_vectors);
	RUN(test_blake2_vectors);
	RUN(test_zero_padding_and_null_empty);
	RUN(test_name_hash_matches_mkfs);
	RUN(test_extref_hash);
	return check_summary();
}
