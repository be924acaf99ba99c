/*
 * test_raid56.c — RAID5/6 parity and reconstruction (lib/volumes/raid56.c)
 * against a slow reference written here from the definition:
 *
 *     P = XOR of Di,  Q = XOR of g^i·Di,  GF(2^8) with g = 2, poly 0x11d
 *
 * with a bitwise shift-and-add multiply. The reference itself is pinned to
 * facts of the Linux raid6 field (2 has order 255; 2·0x8e = 1). ISA-L's own
 * pq_gen(), gf_mul() and gf_inv() are checked against it too, since
 * raid56.c relies on them sharing that convention.
 *
 * Rows are tested with ndata 1..6, lengths from 32 to 65536 (multiples of 32
 * and not), 32-byte aligned and misaligned, so both the xor_gen/pq_gen fast
 * path and the general path run; every single block and (RAID6) every pair
 * is destroyed and rebuilt.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include <isa-l/erasure_code.h>
#include <isa-l/raid.h>

#include "check.h"
#include "volumes/raid56.h"

#define MAX_BLOCKS 8     /* ndata 6 + P + Q */

static const size_t lengths[] = { 4096, 65536, 512, 32, 100, 4097, 1 };

/* Multiply in GF(2^8) mod x^8+x^4+x^3+x^2+1, one bit of @b at a time. */
static unsigned char ref_mul(unsigned char a, unsigned char b)
{
	unsigned int acc = 0, sh = a;

	while (b) {
		if (b & 1)
			acc ^= sh;
		b >>= 1;
		sh <<= 1;
		if (sh & 0x100)
			sh ^= 0x11d;
	}
	return (unsigned char)acc;
}

static unsigned char ref_pow2(int e)
{
	unsigned char v = 1;

	while (e-- > 0)
		v = ref_mul(v, 2);
	return v;
}

static void ref_pq(int ndata, unsigned char **d, size_t len, unsigned char *p, unsigned char *q)
{
	for (size_t k = 0; k < len; k++) {
		unsigned char pv = 0, qv = 0;

		for (int i = 0; i < ndata; i++) {
			pv ^= d[i][k];
			qv ^= ref_mul(ref_pow2(i), d[i][k]);
		}
		p[k] = pv;
		q[k] = qv;
	}
}

static uint64_t next_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void fill_random(unsigned char *buf, size_t len, uint64_t *seed)
{
	for (size_t k = 0; k < len; k++)
		buf[k] = (unsigned char)(next_rand(seed) >> 24);
}

/*
 * A row of nblocks buffers: good[] holds the true contents, work[] is what
 * the code under test gets. @shift offsets every pointer from 64-byte
 * alignment (0: aligned).
 */
struct row {
	int nblocks;
	size_t len;
	unsigned char *mem[2][MAX_BLOCKS];
	unsigned char *good[MAX_BLOCKS];
	unsigned char *work[MAX_BLOCKS];
};

static int row_alloc(struct row *r, int nblocks, size_t len, size_t shift)
{
	size_t sz = (len + shift + 63) / 64 * 64;

	memset(r, 0, sizeof(*r));
	r->nblocks = nblocks;
	r->len = len;
	for (int j = 0; j < nblocks; j++) {
		r->mem[0][j] = aligned_alloc(64, sz);
		r->mem[1][j] = aligned_alloc(64, sz);
		if (!r->mem[0][j] || !r->mem[1][j])
			return -ENOMEM;
		r->good[j] = r->mem[0][j] + shift;
		r->work[j] = r->mem[1][j] + shift;
	}
	return 0;
}

static void row_free(struct row *r)
{
	for (int j = 0; j < MAX_BLOCKS; j++) {
		free(r->mem[0][j]);
		free(r->mem[1][j]);
	}
}

static void row_reset(struct row *r)
{
	for (int j = 0; j < r->nblocks; j++)
		memcpy(r->work[j], r->good[j], r->len);
}

static int row_matches(const struct row *r)
{
	for (int j = 0; j < r->nblocks; j++)
		if (memcmp(r->work[j], r->good[j], r->len) != 0)
			return 0;
	return 1;
}

static void garble(unsigned char *buf, size_t len, uint64_t *seed)
{
	fill_random(buf, len, seed);
	buf[0] ^= 0xff;       /* surely different from what was there */
}

static void test_reference_field(void)
{
	CHECK_EQ_U64(ref_mul(2, 0x80), 0x1d);
	CHECK_EQ_U64(ref_mul(2, 0x8e), 1);
	CHECK_EQ_U64(ref_pow2(8), 0x1d);
	CHECK_EQ_U64(ref_pow2(255), 1);
	for (int e = 1; e < 255; e++)
		if (ref_pow2(e) == 1)
			CHECK(!"2 must have order 255");
	CHECK_EQ_U64(ref_mul(0x57, 0x13), ref_mul(0x13, 0x57));
}

static void test_isal_field_matches(void)
{
	int bad_mul = 0, bad_inv = 0;

	for (int a = 0; a < 256; a++) {
		for (int b = 0; b < 256; b++)
			bad_mul += gf_mul((unsigned char)a, (unsigned char)b) !=
				   ref_mul((unsigned char)a, (unsigned char)b);
		if (a && ref_mul((unsigned char)a, gf_inv((unsigned char)a)) != 1)
			bad_inv++;
	}
	CHECK_EQ_U64(bad_mul, 0);
	CHECK_EQ_U64(bad_inv, 0);
}

/* ISA-L's pq_gen computes Linux raid6's Q (coefficient g^i on data index i). */
static void test_isal_pq_gen_convention(void)
{
	uint64_t seed = 0x1234567;
	const size_t len = 256;

	for (int ndata = 2; ndata <= 6; ndata++) {
		unsigned char *b[MAX_BLOCKS];
		unsigned char *rp = malloc(len), *rq = malloc(len);
		int ok = rp && rq;

		for (int j = 0; j < ndata + 2; j++) {
			b[j] = aligned_alloc(64, len);
			ok = ok && b[j];
		}
		CHECK(ok);
		if (ok) {
			for (int j = 0; j < ndata; j++)
				fill_random(b[j], len, &seed);
			CHECK_EQ_U64(pq_gen(ndata + 2, (int)len, (void **)b), 0);
			ref_pq(ndata, b, len, rp, rq);
			CHECK_MEM(b[ndata], rp, len);
			CHECK_MEM(b[ndata + 1], rq, len);
		}
		for (int j = 0; j < ndata + 2; j++)
			free(b[j]);
		free(rp);
		free(rq);
	}
}

/* For one row shape: parity against the reference, then every rebuild. */
static void check_shape(int ndata, int nparity, size_t len, size_t shift, uint64_t *seed)
{
	int nblocks = ndata + nparity;
	unsigned char *rq = malloc(len);
	struct row r;
	int bad = 0;

	memset(&r, 0, sizeof(r));
	if (!rq || row_alloc(&r, nblocks, len, shift)) {
		CHECK(!"out of memory");
		row_free(&r);
		free(rq);
		return;
	}

	for (int j = 0; j < ndata; j++)
		fill_random(r.good[j], len, seed);
	ref_pq(ndata, r.good, len, r.good[ndata], nparity == 2 ? r.good[ndata + 1] : rq);

	row_reset(&r);
	garble(r.work[ndata], len, seed);
	if (nparity == 2)
		garble(r.work[ndata + 1], len, seed);
	CHECK_EQ_U64(raid56_gen_parity(ndata, nparity, r.work, len), 0);
	if (!row_matches(&r)) {
		fprintf(stderr, "gen_parity ndata %d nparity %d len %zu shift %zu\n", ndata,
			nparity, len, shift);
		bad++;
	}

	for (int a = 0; a < nblocks; a++) {
		for (int b = nparity == 2 ? a : -1; b < nblocks; b++) {
			int fb = b == a ? -1 : b;

			row_reset(&r);
			garble(r.work[a], len, seed);
			if (fb >= 0)
				garble(r.work[fb], len, seed);
			if (raid56_recover(ndata, nparity, r.work, len, a, fb) != 0 ||
			    !row_matches(&r)) {
				fprintf(stderr,
					"recover ndata %d nparity %d len %zu shift %zu lost %d,%d\n",
					ndata, nparity, len, shift, a, fb);
				bad++;
			}
			if (nparity == 1)
				break;
		}
	}
	CHECK_EQ_U64(bad, 0);
	row_free(&r);
	free(rq);
}

static void test_raid5_rows(void)
{
	uint64_t seed = 0xfeedface;

	for (int ndata = 1; ndata <= 6; ndata++)
		for (size_t l = 0; l < sizeof(lengths) / sizeof(lengths[0]); l++)
			for (size_t shift = 0; shift <= 1; shift++)
				check_shape(ndata, 1, lengths[l], shift, &seed);
}

static void test_raid6_rows(void)
{
	uint64_t seed = 0xdeadbeef;

	for (int ndata = 1; ndata <= 6; ndata++)
		for (size_t l = 0; l < sizeof(lengths) / sizeof(lengths[0]); l++)
			for (size_t shift = 0; shift <= 1; shift++)
				check_shape(ndata, 2, lengths[l], shift, &seed);
}

/* A wide RAID6 row: indexes far apart give coefficients far from 1. */
static void test_raid6_wide_row(void)
{
	enum { NDATA = 40, LEN = 96 };
	uint64_t seed = 0xabcdef;
	unsigned char *b[NDATA + 2], *good[NDATA + 2], *rp, *rq;
	int bad = 0;

	for (int j = 0; j < NDATA + 2; j++) {
		b[j] = aligned_alloc(64, (LEN + 63) / 64 * 64);
		good[j] = malloc(LEN);
		if (!b[j] || !good[j]) {
			CHECK(!"out of memory");
			return;
		}
	}
	for (int j = 0; j < NDATA; j++)
		fill_random(b[j], LEN, &seed);
	CHECK_EQ_U64(raid56_gen_parity(NDATA, 2, b, LEN), 0);
	rp = malloc(LEN);
	rq = malloc(LEN);
	if (rp && rq) {
		ref_pq(NDATA, b, LEN, rp, rq);
		CHECK_MEM(b[NDATA], rp, LEN);
		CHECK_MEM(b[NDATA + 1], rq, LEN);
	}
	for (int j = 0; j < NDATA + 2; j++)
		memcpy(good[j], b[j], LEN);

	for (int x = 0; x < NDATA + 2; x += 3) {
		for (int y = x + 1; y < NDATA + 2; y += 5) {
			garble(b[x], LEN, &seed);
			garble(b[y], LEN, &seed);
			if (raid56_recover(NDATA, 2, b, LEN, y, x) != 0)
				bad++;
			for (int j = 0; j < NDATA + 2; j++)
				bad += memcmp(b[j], good[j], LEN) != 0;
		}
	}
	CHECK_EQ_U64(bad, 0);
	for (int j = 0; j < NDATA + 2; j++) {
		free(b[j]);
		free(good[j]);
	}
	free(rp);
	free(rq);
}

static void test_bad_arguments(void)
{
	enum { LEN = 64 };
	unsigned char mem[5][LEN], copy[5][LEN];
	unsigned char *b[5] = { mem[0], mem[1], mem[2], mem[3], mem[4] };
	uint64_t seed = 42;

	for (int j = 0; j < 5; j++)
		fill_random(mem[j], LEN, &seed);
	memcpy(copy, mem, sizeof(mem));

	/* more failures than parity */
	CHECK_EQ_U64(raid56_recover(3, 1, b, LEN, 0, 1), -EINVAL);
	CHECK_EQ_U64(raid56_recover(3, 1, b, LEN, 3, 0), -EINVAL);
	/* indexes out of range */
	CHECK_EQ_U64(raid56_recover(3, 1, b, LEN, 4, -1), -EINVAL);
	CHECK_EQ_U64(raid56_recover(3, 2, b, LEN, 5, -1), -EINVAL);
	CHECK_EQ_U64(raid56_recover(3, 2, b, LEN, 0, -2), -EINVAL);
	/* bad rows */
	CHECK_EQ_U64(raid56_recover(3, 3, b, LEN, 0, -1), -EINVAL);
	CHECK_EQ_U64(raid56_recover(3, 0, b, LEN, 0, -1), -EINVAL);
	CHECK_EQ_U64(raid56_recover(0, 2, b, LEN, 0, -1), -EINVAL);
	CHECK_EQ_U64(raid56_recover(3, 2, NULL, LEN, 0, -1), -EINVAL);
	CHECK_EQ_U64(raid56_gen_parity(3, 3, b, LEN), -EINVAL);
	CHECK_EQ_U64(raid56_gen_parity(0, 1, b, LEN), -EINVAL);
	CHECK_EQ_U64(raid56_gen_parity(3, 2, NULL, LEN), -EINVAL);
	CHECK_EQ_U64(raid56_gen_parity(256, 2, b, LEN), -EINVAL);
	b[2] = NULL;
	CHECK_EQ_U64(raid56_gen_parity(3, 2, b, LEN), -EINVAL);
	CHECK_EQ_U64(raid56_recover(3, 2, b, LEN, 0, -1), -EINVAL);
	b[2] = mem[2];
	CHECK(memcmp(copy, mem, sizeof(mem)) == 0);

	/* nothing failed, or nothing to do: success, nothing written */
	CHECK_EQ_U64(raid56_recover(3, 2, b, LEN, -1, -1), 0);
	CHECK_EQ_U64(raid56_recover(3, 2, b, 0, 0, 1), 0);
	CHECK_EQ_U64(raid56_gen_parity(3, 2, b, 0), 0);
	CHECK(memcmp(copy, mem, sizeof(mem)) == 0);
}

/* The same index twice is one failure, which RAID5 can rebuild. */
static void test_same_index_twice(void)
{
	enum { LEN = 128 };
	unsigned char mem[4][LEN], good[LEN];
	unsigned char *b[4] = { mem[0], mem[1], mem[2], mem[3] };
	uint64_t seed = 7;

	for (int j = 0; j < 3; j++)
		fill_random(mem[j], LEN, &seed);
	CHECK_EQ_U64(raid56_gen_parity(3, 1, b, LEN), 0);
	memcpy(good, mem[1], LEN);
	memset(mem[1], 0, LEN);
	CHECK_EQ_U64(raid56_recover(3, 1, b, LEN, 1, 1), 0);
	CHECK_MEM(mem[1], good, LEN);
	memset(mem[1], 0, LEN);
	CHECK_EQ_U64(raid56_recover(3, 1, b, LEN, -1, 1), 0);
	CHECK_MEM(mem[1], good, LEN);
}

int main(void)
{
	RUN(test_reference_field);
	RUN(test_isal_field_matches);
	RUN(test_isal_pq_gen_convention);
	RUN(test_raid5_rows);
	RUN(test_raid6_rows);
	RUN(test_raid6_wide_row);
	RUN(test_bad_arguments);
	RUN(test_same_index_twice);
	return check_summary();
}
