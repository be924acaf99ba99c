/*
 * test_compression.c — lib/data/compression.c: btrfs zlib, lzo and zstd
 * extent payloads.
 *
 * What is checked:
 *  - round trips of every type over zeros, text and random data at sizes
 *    around a sector and up to 128 KiB, at several sectorsizes;
 *  - -E2BIG for incompressible input and for a too small output buffer, and
 *    the output capacity is never overrun;
 *  - decoding stops at out_len, and a stream shorter than out_len returns its
 *    own length;
 *  - streams made by the libraries themselves (not by our encoder), including
 *    forms only the kernel produces: zlib without adler32, zstd frames without
 *    a content size, trailing sector padding;
 *  - truncation at every length, byte flips at every position, random
 *    garbage and absurd lzo lengths: -EUCLEAN or a sane count, never a stray
 *    access (every buffer handed to the library is malloc'd at its exact size
 *    so ASan sees one byte too far);
 *  - three extents written by the Linux kernel (data/kernel_*.h) decode to
 *    the pattern they were made from, and our lzo encoder reproduces the
 *    kernel's lzo extent byte for byte, sector padding included.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <lzo/lzo1x.h>
#include <zlib.h>
#include <zstd.h>

#include "check.h"
#include "data/compression.h"

#include "data/kernel_lzo_pad79.h"
#include "data/kernel_zlib_inline.h"
#include "data/kernel_zstd_40000.h"

#define SZ 4096u
#define MAX_LEN (128u * 1024)
#define LZO_WORST(n) ((n) + (n) / 16 + 64 + 3)

static const int types[] = { BTRFS_COMPRESS_ZLIB, BTRFS_COMPRESS_LZO, BTRFS_COMPRESS_ZSTD };
#define NTYPES (sizeof(types) / sizeof(types[0]))

/* ---- data --------------------------------------------------------------- */

/*
 * Words picked by xorshift32 from @seed: text that compresses 3-6x. The
 * kernel vectors in data/ were made from this exact function.
 */
static void test_pattern(u8 *buf, size_t len, u32 seed)
{
	static const char *const words[] = { "butter ", "btrfs ", "extent ", "sector ",
					     "lzo ", "zstd ", "zlib ", "tree\n" };
	u32 x = seed;
	size_t i = 0;

	while (i < len) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		for (const char *w = words[x & 7]; *w && i < len; w++)
			buf[i++] = (u8)*w;
	}
}

static u64 next_rand(u64 *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545F4914F6CDD1DULL;
}

static void random_bytes(u8 *buf, size_t len, u64 seed)
{
	u64 s = seed | 1;

	for (size_t i = 0; i < len; i++)
		buf[i] = (u8)(next_rand(&s) >> 56);
}

enum kind { ZEROS, TEXT, RANDOM };

static u8 *make_input(enum kind kind, size_t len)
{
	u8 *p = malloc(len ? len : 1);

	if (kind == ZEROS)
		memset(p, 0, len);
	else if (kind == TEXT)
		test_pattern(p, len, 12345);
	else
		random_bytes(p, len, 777 + len);
	return p;
}

/* ---- exact-size wrappers: ASan catches any access past the lengths ------ */

static ssize_t decode(int type, const u8 *in, size_t in_len, u8 *out, size_t out_len, u32 ss)
{
	u8 *inc = malloc(in_len ? in_len : 1), *outc = malloc(out_len ? out_len : 1);
	ssize_t r;

	if (in_len)
		memcpy(inc, in, in_len);
	r = data_decompress(type, inc, in_len, outc, out_len, ss);
	if (r > 0 && out)
		memcpy(out, outc, (size_t)r <= out_len ? (size_t)r : out_len);
	free(inc);
	free(outc);
	return r;
}

static ssize_t encode(int type, int level, const u8 *in, size_t in_len, u8 *out, size_t out_cap,
		      u32 ss)
{
	u8 *inc = calloc(1, in_len ? in_len : 1), *outc = malloc(out_cap ? out_cap : 1);
	ssize_t r;

	if (in_len)
		memcpy(inc, in, in_len);
	r = data_compress(type, level, inc, in_len, outc, out_cap, ss);
	if (r > 0 && out)
		memcpy(out, outc, (size_t)r <= out_cap ? (size_t)r : out_cap);
	free(inc);
	free(outc);
	return r;
}

/* A compressed copy of @len bytes of TEXT, in a malloc'd buffer. */
static u8 *compressed_text(int type, size_t len, u32 ss, size_t *clen, u8 **plain)
{
	u8 *in = make_input(TEXT, len), *out = malloc(len);
	ssize_t r = encode(type, 0, in, len, out, len, ss);

	CHECK(r > 0);
	*clen = r > 0 ? (size_t)r : 0;
	*plain = in;
	return out;
}

/* Frame @n lzo1x_1 segments by hand, one per sector of @in (for streams our encoder refuses). */
static size_t lzo_frame(const u8 *in, size_t len, u8 *out, u32 ss, size_t seg_in)
{
	void *wrk = malloc(LZO1X_1_MEM_COMPRESS);
	size_t pos = 4;

	CHECK(lzo_init() == LZO_E_OK);
	for (size_t off = 0; off < len; off += seg_in) {
		size_t chunk = len - off < seg_in ? len - off : seg_in;
		lzo_uint clen = 0;

		CHECK(lzo1x_1_compress(in + off, chunk, out + pos + 4, &clen, wrk) == LZO_E_OK);
		put_le32(out + pos, (u32)clen);
		pos += 4 + clen;
		if (ss - pos % ss < 4) {
			memset(out + pos, 0, ss - pos % ss);
			pos += ss - pos % ss;
		}
	}
	put_le32(out, (u32)pos);
	free(wrk);
	return pos;
}

/* ---- round trips -------------------------------------------------------- */

static void check_round_trip(int type, enum kind kind, size_t len, u32 ss)
{
	size_t cap = len + 8192;
	u8 *in = make_input(kind, len), *c = malloc(cap), *back = malloc(len + 2 * ss);
	ssize_t r = encode(type, 0, in, len, c, cap, ss), d;

	if (len <= 1 || kind == RANDOM) {
		if (r != -E2BIG)
			fprintf(stderr, "type %d kind %d len %zu: %zd\n", type, kind, len, r);
		CHECK(r == -E2BIG);
		goto out;
	}
	if (r <= 0 || (size_t)r >= len) {
		fprintf(stderr, "type %d kind %d len %zu ss %u: compress %zd\n", type, kind, len, ss, r);
		CHECK(0);
		goto out;
	}

	d = decode(type, c, (size_t)r, back, len, ss);
	CHECK(d == (ssize_t)len);
	CHECK_MEM(back, in, len);

	/* The extent is whole sectors on disk and its ram_bytes rounds up: same result. */
	{
		size_t disk = ((size_t)r + ss - 1) / ss * ss, ram = (len + ss - 1) / ss * ss + ss;
		u8 *padded = calloc(1, disk);

		memcpy(padded, c, (size_t)r);
		memset(back, 0xa5, len + 2 * ss);
		d = decode(type, padded, disk, back, ram, ss);
		CHECK(d == (ssize_t)len);
		CHECK_MEM(back, in, len);
		free(padded);
	}
	if (type == BTRFS_COMPRESS_LZO)
		CHECK(get_le32(c) == (u32)r);
out:
	free(in);
	free(c);
	free(back);
}

static void test_round_trip(void)
{
	static const size_t sizes[] = { 1, 100, 4095, 4096, 4097, 8191, 12290, 65536, MAX_LEN };
	static const enum kind kinds[] = { ZEROS, TEXT, RANDOM };

	for (size_t t = 0; t < NTYPES; t++)
		for (size_t k = 0; k < 3; k++)
			for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
				if (sizes[s] == 100 && kinds[k] != RANDOM)
					continue; /* 100 bytes may or may not shrink */
				check_round_trip(types[t], kinds[k], sizes[s], SZ);
			}
}

static void test_round_trip_sectorsizes(void)
{
	static const u32 sss[] = { 512, 8192, 16384, 65536 };

	for (size_t i = 0; i < sizeof(sss) / sizeof(sss[0]); i++) {
		check_round_trip(BTRFS_COMPRESS_LZO, TEXT, MAX_LEN, sss[i]);
		check_round_trip(BTRFS_COMPRESS_LZO, TEXT, sss[i] + 1, sss[i]);
		check_round_trip(BTRFS_COMPRESS_LZO, ZEROS, 3 * sss[i] - 1, sss[i]);
	}
}

static void test_levels(void)
{
	static const struct { int type, level, ok; } cases[] = {
		{ BTRFS_COMPRESS_ZLIB, 1, 1 },  { BTRFS_COMPRESS_ZLIB, 9, 1 },
		{ BTRFS_COMPRESS_ZLIB, 10, 0 }, { BTRFS_COMPRESS_ZLIB, -1, 0 },
		{ BTRFS_COMPRESS_ZSTD, 1, 1 },  { BTRFS_COMPRESS_ZSTD, 15, 1 },
		{ BTRFS_COMPRESS_ZSTD, -5, 1 }, { BTRFS_COMPRESS_ZSTD, 16, 0 },
		{ BTRFS_COMPRESS_ZSTD, -16, 0 }, { BTRFS_COMPRESS_LZO, 1, 1 },
		{ BTRFS_COMPRESS_LZO, 2, 0 },
	};
	size_t len = 20000;
	u8 *in = make_input(TEXT, len), *c = malloc(len), *back = malloc(len);

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ssize_t r = encode(cases[i].type, cases[i].level, in, len, c, len, SZ);

		if (!cases[i].ok) {
			CHECK(r == -EINVAL);
			continue;
		}
		CHECK(r > 0);
		if (r > 0) {
			CHECK(decode(cases[i].type, c, (size_t)r, back, len, SZ) == (ssize_t)len);
			CHECK_MEM(back, in, len);
		}
	}
	free(in);
	free(c);
	free(back);
}

/* ---- -E2BIG and the output capacity ------------------------------------- */

static void test_e2big(void)
{
	u8 *rnd = make_input(RANDOM, MAX_LEN), *text = make_input(TEXT, 50000);
	u8 *c = malloc(MAX_LEN * 2);

	for (size_t t = 0; t < NTYPES; t++) {
		int type = types[t];
		ssize_t full;

		CHECK(encode(type, 0, rnd, SZ, NULL, 2 * SZ, SZ) == -E2BIG);
		CHECK(encode(type, 0, rnd, MAX_LEN, NULL, 2 * MAX_LEN, SZ) == -E2BIG);
		CHECK(encode(type, 0, text, 0, NULL, 100, SZ) == -E2BIG);

		full = encode(type, 0, text, 50000, c, 50000, SZ);
		CHECK(full > 0 && full < 50000);
		if (full <= 0)
			continue;
		/* Exactly enough room works; one byte less, or none, is -E2BIG. */
		CHECK(encode(type, 0, text, 50000, NULL, (size_t)full, SZ) == full);
		CHECK(encode(type, 0, text, 50000, NULL, (size_t)full - 1, SZ) == -E2BIG);
		CHECK(encode(type, 0, text, 50000, NULL, 16, SZ) == -E2BIG);
		CHECK(encode(type, 0, text, 50000, NULL, 3, SZ) == -E2BIG);
		CHECK(encode(type, 0, text, 50000, NULL, 0, SZ) == -E2BIG);
	}
	free(rnd);
	free(text);
	free(c);
}

/*
 * Inputs from fully random to mostly zeros pass through the point where the
 * compressed size equals the input size: never may a result reach it.
 */
static void test_e2big_boundary(void)
{
	size_t n = 4096;
	u8 *in = malloc(n);

	for (size_t t = 0; t < NTYPES; t++) {
		int fit = 0, big = 0;

		for (size_t k = n - 300; k <= n; k++) {
			ssize_t r;

			random_bytes(in, k, 99);
			memset(in + k, 0, n - k);
			r = encode(types[t], 0, in, n, NULL, n + 512, SZ);
			CHECK(r == -E2BIG || (r > 0 && (size_t)r < n));
			fit += r > 0 && (size_t)r >= n - 8;
			big += r == -E2BIG;
		}
		/* The sweep crossed the boundary; zlib's size moves a byte at a time. */
		CHECK(big > 0);
		if (types[t] == BTRFS_COMPRESS_ZLIB)
			CHECK(fit > 0);
	}
	free(in);
}

/* ---- out_len limits decoding -------------------------------------------- */

static void test_out_len_limit(void)
{
	static const size_t lims[] = { 1, 100, 4095, 4096, 4097, 65539, MAX_LEN - 1, MAX_LEN };

	for (size_t t = 0; t < NTYPES; t++) {
		size_t clen;
		u8 *plain, *c = compressed_text(types[t], MAX_LEN, SZ, &clen, &plain);
		u8 *back = malloc(MAX_LEN);

		for (size_t i = 0; i < sizeof(lims) / sizeof(lims[0]); i++) {
			ssize_t d = decode(types[t], c, clen, back, lims[i], SZ);

			CHECK(d == (ssize_t)lims[i]);
			CHECK_MEM(back, plain, lims[i]);
		}
		CHECK(decode(types[t], c, clen, back, 0, SZ) == 0);
		free(c);
		free(plain);
		free(back);
	}
}

/* ---- streams made by the libraries directly ----------------------------- */

static void test_library_streams(void)
{
	static const size_t lens[] = { 1, 7, 100, 4096, 9000 };
	u8 *text = make_input(TEXT, 9000), *c = malloc(20000), *back = malloc(9100);

	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		size_t n = lens[i];
		uLongf zlen = 20000;
		size_t r;

		/* zlib: a standard stream, then trailing garbage, then no adler32. */
		CHECK(compress2(c, &zlen, text, n, 6) == Z_OK);
		CHECK(decode(BTRFS_COMPRESS_ZLIB, c, zlen, back, n + 50, SZ) == (ssize_t)n);
		CHECK_MEM(back, text, n);
		memset(c + zlen, 0x5a, 64);
		CHECK(decode(BTRFS_COMPRESS_ZLIB, c, zlen + 64, back, n + 50, SZ) == (ssize_t)n);
		CHECK(decode(BTRFS_COMPRESS_ZLIB, c, zlen - 4, back, n + 50, SZ) == (ssize_t)n);
		CHECK_MEM(back, text, n);

		/* zstd: with content size, without it, and with sector padding after. */
		r = ZSTD_compress(c, 20000, text, n, 3);
		CHECK(!ZSTD_isError(r));
		memset(c + r, 0, 100);
		CHECK(decode(BTRFS_COMPRESS_ZSTD, c, r + 100, back, n + 50, SZ) == (ssize_t)n);
		CHECK_MEM(back, text, n);
		{
			ZSTD_CCtx *cctx = ZSTD_createCCtx();

			ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
			r = ZSTD_compress2(cctx, c, 20000, text, n);
			CHECK(!ZSTD_isError(r));
			CHECK(ZSTD_getFrameContentSize(c, r) == ZSTD_CONTENTSIZE_UNKNOWN);
			CHECK(decode(BTRFS_COMPRESS_ZSTD, c, r, back, n + 50, SZ) == (ssize_t)n);
			CHECK_MEM(back, text, n);
			ZSTD_freeCCtx(cctx);
		}

		/* lzo: framed by hand, as the kernel does for an inline extent. */
		r = lzo_frame(text, n, c, SZ, SZ);
		CHECK(decode(BTRFS_COMPRESS_LZO, c, r, back, n + 50, SZ) == (ssize_t)n);
		CHECK_MEM(back, text, n);
	}
	free(text);
	free(c);
	free(back);
}

/* ---- corrupt input ------------------------------------------------------ */

/* What corrupt input may give: -EUCLEAN, or some count within out_len. */
static int sane(ssize_t d, size_t out_len)
{
	return d == -EUCLEAN || (d >= 0 && (size_t)d <= out_len);
}

static void test_truncation(void)
{
	for (size_t t = 0; t < NTYPES; t++) {
		int type = types[t];
		size_t clen, len = 10000, big = 3 * SZ; /* big: ram_bytes rounded up */
		u8 *plain, *c = compressed_text(type, len, SZ, &clen, &plain);
		u8 *back = malloc(big);

		for (size_t n = 0; n < clen; n++) {
			ssize_t exact = decode(type, c, n, back, len, SZ);
			ssize_t roomy = decode(type, c, n, back, big, SZ);

			/* Truncated: corrupt, or (zlib: only the unchecked adler32 lost) complete. */
			CHECK(exact == -EUCLEAN || (type == BTRFS_COMPRESS_ZLIB && exact == (ssize_t)len));
			if (type == BTRFS_COMPRESS_ZLIB && n >= clen - 4) {
				CHECK(roomy == (ssize_t)len);
				CHECK_MEM(back, plain, len);
			} else {
				CHECK(roomy == -EUCLEAN);
			}
		}
		free(c);
		free(plain);
		free(back);
	}
}

static void test_byte_flips(void)
{
	static const u8 masks[] = { 0x01, 0x80, 0xff };

	for (size_t t = 0; t < NTYPES; t++) {
		int type = types[t];
		size_t clen, len = 10000, detected = 0, tried = 0;
		u8 *plain, *c = compressed_text(type, len, SZ, &clen, &plain);
		u8 *bad = malloc(clen), *back = malloc(len);

		for (size_t i = 0; i < clen; i++)
			for (size_t m = 0; m < sizeof(masks); m++) {
				ssize_t d;

				memcpy(bad, c, clen);
				bad[i] ^= masks[m];
				d = decode(type, bad, clen, back, len, SZ);
				CHECK(sane(d, len));
				detected += d == -EUCLEAN;
				tried++;
			}
		/* Not every flip is detectable (a literal byte), but most are. */
		CHECK(detected * 4 > tried);
		free(c);
		free(plain);
		free(bad);
		free(back);
	}
}

static void test_garbage(void)
{
	u64 s = 42;
	u8 *c = malloc(MAX_LEN), *back = malloc(MAX_LEN);

	for (size_t t = 0; t < NTYPES; t++) {
		int type = types[t];
		size_t clen;
		u8 *plain, *good = compressed_text(type, 60000, SZ, &clen, &plain);

		for (int iter = 0; iter < 3000; iter++) {
			size_t n = clen, out_len = 1 + next_rand(&s) % MAX_LEN;
			int flips = 1 + (int)(next_rand(&s) % 8);
			ssize_t d;

			memcpy(c, good, clen);
			if (iter % 3 == 0) {
				n = 1 + next_rand(&s) % 9000;
				random_bytes(c, n, next_rand(&s));
				if (type == BTRFS_COMPRESS_LZO && n >= 4) /* get past the total check */
					put_le32(c, (u32)(4 + next_rand(&s) % n));
			} else {
				for (int f = 0; f < flips; f++)
					c[next_rand(&s) % clen] ^= (u8)(1 + next_rand(&s) % 255);
			}
			d = decode(type, c, n, back, out_len, SZ);
			CHECK(sane(d, out_len));
		}
		free(good);
		free(plain);
	}
	free(c);
	free(back);
}

static void test_lzo_framing_errors(void)
{
	const int L = BTRFS_COMPRESS_LZO;
	size_t clen, len = 20000;
	u8 *plain, *good = compressed_text(L, len, SZ, &clen, &plain);
	u8 *c = malloc(len), *back = malloc(len);
	u32 seg1 = get_le32(good + 4);
	static const u32 bad_seg[] = { 0, 1, 0xffffffffu, 0x80000000u, LZO_WORST(SZ) + 1 };

	CHECK(clen > SZ); /* so the stream has a sector boundary to cross */
	for (size_t n = 0; n < 4; n++)
		CHECK(decode(L, good, n, back, len, SZ) == -EUCLEAN);

	/* The total, against what is there. */
	static const u32 bad_total[] = { 0, 1, 3, 0xffffffffu };
	for (size_t i = 0; i < sizeof(bad_total) / sizeof(bad_total[0]); i++) {
		memcpy(c, good, clen);
		put_le32(c, bad_total[i]);
		CHECK(decode(L, c, clen, back, len, SZ) == -EUCLEAN);
	}
	memcpy(c, good, clen);
	put_le32(c, (u32)clen + 1);
	CHECK(decode(L, c, clen, back, len, SZ) == -EUCLEAN);
	put_le32(c, 4); /* no segments at all: an empty stream */
	CHECK(decode(L, c, clen, back, len, SZ) == 0);
	put_le32(c, 6); /* room for less than a segment header */
	CHECK(decode(L, c, clen, back, len, SZ) == -EUCLEAN);

	/* The first segment's length. */
	for (size_t i = 0; i < sizeof(bad_seg) / sizeof(bad_seg[0]); i++) {
		memcpy(c, good, clen);
		put_le32(c + 4, bad_seg[i]);
		CHECK(decode(L, c, clen, back, len, SZ) == -EUCLEAN);
	}
	memcpy(c, good, clen);
	put_le32(c + 4, seg1 - 1);
	CHECK(decode(L, c, clen, back, len, SZ) == -EUCLEAN);
	put_le32(c + 4, seg1 + 1);
	CHECK(decode(L, c, clen, back, len, SZ) == -EUCLEAN);
	put_le32(c + 4, (u32)clen); /* runs past the total */
	CHECK(decode(L, c, clen, back, len, SZ) == -EUCLEAN);

	/* A total that cuts into a segment, even with the bytes present after it. */
	memcpy(c, good, clen);
	put_le32(c, 8 + seg1 - 1);
	CHECK(decode(L, c, clen, back, len, SZ) == -EUCLEAN);
	put_le32(c, 8 + seg1);
	CHECK(decode(L, c, clen, back, len, SZ) == (ssize_t)(len < SZ ? len : SZ));
	CHECK_MEM(back, plain, SZ);

	/* A segment that expands to more than a sector. */
	{
		size_t n = lzo_frame(plain, 2 * SZ, c, SZ, 2 * SZ);

		CHECK(decode(L, c, n, back, 3 * SZ, SZ) == -EUCLEAN);
		/* ... is fine at a sectorsize it fits in. */
		CHECK(decode(L, c, n, back, 3 * SZ, 2 * SZ) == (ssize_t)(2 * SZ));
	}

	/* Sectorsize must be a power of two in [512, 64K], for lzo only. */
	CHECK(decode(L, good, clen, back, len, 0) == -EINVAL);
	CHECK(decode(L, good, clen, back, len, 1000) == -EINVAL);
	CHECK(decode(L, good, clen, back, len, 4095) == -EINVAL);
	CHECK(decode(L, good, clen, back, len, 128 * 1024) == -EINVAL);
	CHECK(encode(L, 0, plain, len, NULL, len, 0) == -EINVAL);
	CHECK(encode(L, 0, plain, len, NULL, len, 3000) == -EINVAL);
	free(good);
	free(plain);
	free(c);
	free(back);
}

static void test_zlib_headers(void)
{
	const int Z = BTRFS_COMPRESS_ZLIB;
	size_t clen, len = 10000;
	u8 *plain, *good = compressed_text(Z, len, SZ, &clen, &plain);
	u8 *c = malloc(clen + 16), *back = malloc(len);

	/* The kernel checks no adler32; neither do we. */
	memcpy(c, good, clen);
	c[clen - 1] ^= 0xff;
	CHECK(decode(Z, c, clen, back, len + 1, SZ) == (ssize_t)len);
	CHECK_MEM(back, plain, len);

	/* Window of 2^16 (CINFO 8) with a valid check value: out of range. */
	memcpy(c, good, clen);
	c[0] = 0x88;
	c[1] = (u8)(31 - ((0x88 << 8) % 31));
	CHECK(((c[0] << 8) | c[1]) % 31 == 0);
	CHECK(decode(Z, c, clen, back, len, SZ) == -EUCLEAN);

	/* A preset dictionary is never used by btrfs. */
	memcpy(c, good, clen);
	c[1] |= 0x20;
	c[1] = (u8)((c[1] & 0xe0) | (31 - (((c[0] << 8) | (c[1] & 0xe0)) % 31)) % 31);
	CHECK(((c[0] << 8) | c[1]) % 31 == 0 && (c[1] & 0x20));
	CHECK(decode(Z, c, clen, back, len, SZ) == -EUCLEAN);

	/* Raw deflate without the header is not a btrfs zlib stream. */
	CHECK(decode(Z, good + 2, clen - 2, back, len, SZ) == -EUCLEAN);
	free(good);
	free(plain);
	free(c);
	free(back);
}

static void test_zstd_frames(void)
{
	const int S = BTRFS_COMPRESS_ZSTD;
	size_t big = 1024 * 1024, r, clen;
	u8 *in = make_input(TEXT, big), *c = malloc(big), *back = malloc(big);
	ZSTD_CCtx *cctx = ZSTD_createCCtx();
	ssize_t e;

	/* Our frames keep the window within the kernel's 128 KiB even for big input. */
	e = encode(S, 0, in, big, c, big, SZ);
	CHECK(e > 0);
	if (e > 0) {
		CHECK(decode(S, c, (size_t)e, back, big, SZ) == (ssize_t)big);
		CHECK_MEM(back, in, big);
		/* Reading part of it needs a window buffer: the kernel's case. */
		CHECK(decode(S, c, (size_t)e, back, SZ, SZ) == (ssize_t)SZ);
		CHECK(decode(S, c, (size_t)e, back, big - 1, SZ) == (ssize_t)big - 1);
	}
	e = encode(S, 0, in, MAX_LEN + 1, c, big, SZ);
	CHECK(e > 0);
	if (e > 0)
		CHECK(decode(S, c, (size_t)e, back, big, SZ) == (ssize_t)MAX_LEN + 1);

	/*
	 * A frame that needs a 1 MiB window is refused, as the kernel does,
	 * unless it fits the output whole: then zstd needs no window buffer.
	 */
	ZSTD_CCtx_setParameter(cctx, ZSTD_c_windowLog, 20);
	r = ZSTD_compress2(cctx, c, big, in, big);
	CHECK(!ZSTD_isError(r));
	CHECK(decode(S, c, r, back, 10, SZ) == -EUCLEAN);
	CHECK(decode(S, c, r, back, big - 1, SZ) == -EUCLEAN);
	e = decode(S, c, r, back, big, SZ);
	CHECK(e == -EUCLEAN || e == (ssize_t)big);
	ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
	r = ZSTD_compress2(cctx, c, big, in, big);
	CHECK(!ZSTD_isError(r));
	CHECK(decode(S, c, r, back, big, SZ) == -EUCLEAN);

	/* Only the first frame counts: what follows is padding to the decoder. */
	clen = ZSTD_compress(c, big, in, 5000, 3);
	CHECK(!ZSTD_isError(clen));
	r = ZSTD_compress(c + clen, big - clen, in + 5000, 5000, 3);
	CHECK(!ZSTD_isError(r));
	CHECK(decode(S, c, clen + r, back, 20000, SZ) == 5000);
	CHECK_MEM(back, in, 5000);

	ZSTD_freeCCtx(cctx);
	free(in);
	free(c);
	free(back);
}

static void test_invalid_type(void)
{
	static const int bad[] = { BTRFS_COMPRESS_NONE, BTRFS_NR_COMPRESS_TYPES, -1, 99 };
	u8 buf[64] = { 0 };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CHECK(data_decompress(bad[i], buf, sizeof(buf), buf, sizeof(buf), SZ) == -EINVAL);
		CHECK(data_compress(bad[i], 0, buf, sizeof(buf), buf, sizeof(buf), SZ) == -EINVAL);
	}
	/* zlib and zstd do not care about the sectorsize. */
	{
		size_t clen;
		u8 *plain, *c = compressed_text(BTRFS_COMPRESS_ZSTD, 5000, SZ, &clen, &plain);

		CHECK(decode(BTRFS_COMPRESS_ZSTD, c, clen, buf, sizeof(buf), 0) == (ssize_t)sizeof(buf));
		free(c);
		free(plain);
	}
}

/*
 * Walk the segments of an lzo payload by the kernel's rule and check the
 * framing itself: every header inside one sector, padding only where fewer
 * than 4 bytes remain and then all zeros, the walk ending exactly at total.
 * Counts where segments ended: 1-3 bytes before a boundary (padded),
 * exactly 4 before (header right there), exactly on it.
 */
static void walk_lzo(const u8 *c, size_t clen, u32 ss, int *padded, int *four, int *on)
{
	size_t total = get_le32(c), pos = 4;

	CHECK(total == clen);
	while (pos < total) {
		size_t left;

		CHECK(pos / ss == (pos + 3) / ss);
		pos += 4 + get_le32(c + pos);
		CHECK(pos <= total);
		if (pos > total)
			return;
		left = ss - pos % ss;
		*four += left == 4;
		*on += left == ss;
		if (left < 4) {
			(*padded)++;
			for (size_t i = 0; i < left; i++)
				CHECK(pos + i < total && c[pos + i] == 0);
			pos += left;
		}
	}
	CHECK(pos == total);
}

static void test_lzo_framing(void)
{
	size_t len = 18000;
	u8 *in = malloc(len), *c = malloc(len), *ref = malloc(2 * len), *back = malloc(len);
	int padded = 0, four = 0, on = 0;

	for (u32 seed = 1; seed <= 1200; seed++) {
		ssize_t r;
		size_t n;

		test_pattern(in, len, seed);
		r = encode(BTRFS_COMPRESS_LZO, 0, in, len, c, len, SZ);
		CHECK(r > 0);
		if (r <= 0)
			continue;
		walk_lzo(c, (size_t)r, SZ, &padded, &four, &on);

		/* The test's own framing of the same LZO1X-1 segments is the same bytes. */
		n = lzo_frame(in, len, ref, SZ, SZ);
		CHECK(n == (size_t)r && memcmp(ref, c, n) == 0);
		CHECK(decode(BTRFS_COMPRESS_LZO, ref, n, back, len, SZ) == (ssize_t)len);
		CHECK_MEM(back, in, len);
	}
	/* Seeds 79, 260 and 35 give one of each; the kernel agrees on all three. */
	CHECK(padded > 0 && four > 0 && on > 0);
	free(in);
	free(c);
	free(ref);
	free(back);
}

/* ---- kernel-written extents --------------------------------------------- */

static void check_kernel_vector(int type, const u8 *blob, size_t blob_len, size_t disk,
				size_t ram, size_t len, u32 seed)
{
	u8 *expect = malloc(ram), *back = malloc(ram), *padded = calloc(1, disk);

	test_pattern(expect, len, seed);
	memset(expect + len, 0, ram - len);

	/* As stored, and as read from disk: padded with zeros to whole sectors. */
	CHECK(decode(type, blob, blob_len, back, ram, SZ) == (ssize_t)len);
	CHECK_MEM(back, expect, len);
	memcpy(padded, blob, blob_len);
	CHECK(decode(type, padded, disk, back, ram, SZ) == (ssize_t)len);
	CHECK_MEM(back, expect, len);

	/* One page of it, as a read of the first block would ask. */
	CHECK(decode(type, padded, disk, back, SZ, SZ) == (ssize_t)(len < SZ ? len : SZ));
	CHECK_MEM(back, expect, len < SZ ? len : SZ);

	/* Every truncation of a kernel stream is refused or complete. */
	for (size_t n = 0; n < blob_len; n++) {
		ssize_t d = decode(type, blob, n, back, ram, SZ);

		CHECK(d == -EUCLEAN || (type == BTRFS_COMPRESS_ZLIB && d == (ssize_t)len));
	}
	free(expect);
	free(back);
	free(padded);
}

static void test_kernel_vectors(void)
{
	check_kernel_vector(BTRFS_COMPRESS_LZO, kernel_lzo_pad79, sizeof(kernel_lzo_pad79), 8192,
			    20480, 18000, 79);
	check_kernel_vector(BTRFS_COMPRESS_ZSTD, kernel_zstd_40000, sizeof(kernel_zstd_40000), 8192,
			    40960, 40000, 5);
	check_kernel_vector(BTRFS_COMPRESS_ZLIB, kernel_zlib_inline, sizeof(kernel_zlib_inline),
			    sizeof(kernel_zlib_inline), 2000, 2000, 3);

	/* The vector really has the padding case: segment 3 ends 3 bytes before 4096. */
	{
		size_t pos = 4;

		for (int seg = 0; seg < 3; seg++)
			pos += 4 + get_le32(kernel_lzo_pad79 + pos);
		CHECK(pos == SZ - 3);
		CHECK(kernel_lzo_pad79[SZ - 3] == 0 && kernel_lzo_pad79[SZ - 2] == 0 &&
		      kernel_lzo_pad79[SZ - 1] == 0);
	}

	/* Our lzo encoder writes the kernel's bytes, padding and total included. */
	{
		u8 *in = malloc(18000), *c = malloc(18000);
		ssize_t r;

		test_pattern(in, 18000, 79);
		r = encode(BTRFS_COMPRESS_LZO, 0, in, 18000, c, 18000, SZ);
		CHECK(r == (ssize_t)sizeof(kernel_lzo_pad79));
		if (r == (ssize_t)sizeof(kernel_lzo_pad79))
			CHECK_MEM(c, kernel_lzo_pad79, sizeof(kernel_lzo_pad79));
		free(in);
		free(c);
	}
}

int main(void)
{
	RUN(test_round_trip);
	RUN(test_round_trip_sectorsizes);
	RUN(test_levels);
	RUN(test_e2big);
	RUN(test_e2big_boundary);
	RUN(test_out_len_limit);
	RUN(test_library_streams);
	RUN(test_truncation);
	RUN(test_byte_flips);
	RUN(test_garbage);
	RUN(test_lzo_framing);
	RUN(test_lzo_framing_errors);
	RUN(test_zlib_headers);
	RUN(test_zstd_frames);
	RUN(test_invalid_type);
	RUN(test_kernel_vectors);
	return check_summary();
}
