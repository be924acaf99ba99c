/*
 * raid56.c — RAID5/RAID6 parity of one stripe row: generate P (and Q), and
 * rebuild up to nparity lost blocks of the row from the others.
 *
 * Owns: the arithmetic only. No I/O, no allocation, no global state; the
 * callers (the chunk map's read/write paths, scrub) hand in a row of equally
 * long buffers. The byte work is done by ISA-L; the only field arithmetic
 * here is on coefficients, through ISA-L's gf_mul()/gf_inv().
 *
 * The code is the Linux raid6 one that btrfs writes on disk:
 *
 *     P = D0 ^ D1 ^ ... ^ Dn-1
 *     Q = g^0·D0 ^ g^1·D1 ^ ... ^ g^(n-1)·Dn-1     GF(2^8), g = 2, poly 0x11d
 *
 * ISA-L's pq_gen() evaluates Q by Horner's rule from the highest data index
 * down (q = Dn-1; q = 2·q ^ Dj for j = n-2 .. 0), which is this same sum, and
 * its field is GF(2^8) mod 0x11d. tests/unit/test_raid56.c checks pq_gen(),
 * gf_mul() and gf_inv() against a bitwise reference to keep that true.
 *
 * Promises:
 *  1. raid56_gen_parity() writes blocks[ndata] (and blocks[ndata + 1]) and
 *     nothing else; raid56_recover() writes only the failed blocks and reads
 *     only the surviving ones. Buffers must not overlap.
 *  2. Any len and any buffer alignment work, with the same result bytes.
 *     ISA-L's xor_gen()/pq_gen() are used where their documented limits hold
 *     (at least two sources, every pointer 32-byte aligned, len a multiple of
 *     32 for pq_gen, at most FAST_MAX_VECTS vectors); otherwise, and for every
 *     reconstruction that needs multiplications, combine() runs ISA-L's
 *     ec_encode_data_update(), which takes any length and alignment.
 *     ISA-L takes int lengths: rows longer than CHUNK_MAX go in pieces.
 *  3. A RAID6 row has at most RAID6_MAX_DATA data blocks: g has order 255, so
 *     beyond that two data blocks share a Q coefficient and a pair of them
 *     could not be rebuilt.
 *  4. Bad arguments, or more failed blocks than nparity, return -EINVAL and
 *     leave every block untouched.
 *
 * Rebuilding: every lost block is a GF(2^8) linear combination of the
 * survivors, and combine() evaluates such combinations (one pass per
 * survivor, both outputs at once). P = ndata and Q = ndata + 1 are indexes.
 *
 *   lost        rebuilt as
 *   Dx or P     XOR of the other data blocks and P
 *   Q           sum g^i·Di
 *   P + Q       raid56_gen_parity()
 *   Dx + Q      Dx from P as above, then Q
 *   Dx + P      Dx = g^-x·(Q ^ sum_{i≠x} g^i·Di), then P
 *   Dx + Dy     with Pxy = P ^ sum_{i≠x,y} Di = Dx ^ Dy and
 *   (x < y)         Qxy = Q ^ sum_{i≠x,y} g^i·Di = g^x·Dx ^ g^y·Dy:
 *                   Dx = A·Pxy ^ B·Qxy,  Dy = Pxy ^ Dx, where
 *                   A = g^(y-x) / (g^(y-x) ^ 1),  B = g^-x / (g^(y-x) ^ 1)
 *               so the coefficient of Di in Dx is A ^ B·g^i, of P is A, of
 *               Q is B; in Dy they are 1^A ^ B·g^i, 1^A and B.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <isa-l/erasure_code.h>
#include <isa-l/raid.h>

#include "volumes/raid56.h"

#define RAID6_MAX_DATA 255
#define FAST_MAX_VECTS 64             /* pointer arrays for xor_gen/pq_gen live on the stack */
#define FAST_ALIGN 32
#define CHUNK_MAX ((size_t)1 << 30)   /* fits an int, keeps 32-byte alignment */

/*
 * One linear combination job: out[r] = sum over blocks j not in {skip_a,
 * skip_b} of c(r, j)·blocks[j], for r < nout. The coefficient of data block i
 * is d0[r] ^ dg[r]·g^i; of P it is p[r]; of Q, q[r].
 */
struct recipe {
	int nout;                  /* 1 or 2 */
	int skip_a, skip_b;        /* lost blocks (never read), -1 for none */
	unsigned char p[2], q[2];
	unsigned char d0[2], dg[2];
};

static bool aligned(const void *ptr)
{
	return ((uintptr_t)ptr & (FAST_ALIGN - 1)) == 0;
}

/* Return g^e in GF(2^8), for 0 <= e. */
static unsigned char gf_pow2(int e)
{
	unsigned char v = 1;

	while (e-- > 0)
		v = gf_mul(v, 2);
	return v;
}

/* Evaluate @r over a row of @nblocks blocks into @out (see struct recipe). */
static void combine(const struct recipe *r, int ndata, int nblocks, unsigned char **blocks,
		    unsigned char **out, size_t len)
{
	unsigned char tbls[2 * 32];
	unsigned char c[2];
	unsigned char gi = 1;   /* g^j while j < ndata */

	for (int k = 0; k < r->nout; k++)
		memset(out[k], 0, len);

	for (int j = 0; j < nblocks; j++) {
		for (int k = 0; k < r->nout; k++) {
			if (j < ndata)
				c[k] = r->d0[k] ^ gf_mul(r->dg[k], gi);
			else
				c[k] = j == ndata ? r->p[k] : r->q[k];
		}
		if (j < ndata)
			gi = gf_mul(gi, 2);
		if (j == r->skip_a || j == r->skip_b)
			continue;
		if (c[0] == 0 && (r->nout == 1 || c[1] == 0))
			continue;

		ec_init_tables(1, r->nout, c, tbls);
		for (size_t off = 0; off < len; off += CHUNK_MAX) {
			size_t n = len - off < CHUNK_MAX ? len - off : CHUNK_MAX;
			unsigned char *dst[2] = { out[0] + off, r->nout > 1 ? out[1] + off : NULL };

			ec_encode_data_update((int)n, 1, r->nout, 0, tbls, blocks[j] + off, dst);
		}
	}
}

/*
 * Set @dst to the XOR of blocks[0..nsrc-1] other than @skip with xor_gen().
 * Returns false, having written nothing or something to be overwritten, when
 * ISA-L's limits do not hold; the caller then takes the general path.
 */
static bool xor_fast(unsigned char *dst, unsigned char **blocks, int nsrc, int skip, size_t len)
{
	unsigned char *base[FAST_MAX_VECTS];
	void *vec[FAST_MAX_VECTS];
	int n = 0;

	if (nsrc > FAST_MAX_VECTS || !aligned(dst))
		return false;
	for (int j = 0; j < nsrc; j++) {
		if (j == skip)
			continue;
		if (!aligned(blocks[j]))
			return false;
		base[n++] = blocks[j];
	}
	if (n < 2)
		return false;
	base[n] = dst;

	for (size_t off = 0; off < len; off += CHUNK_MAX) {
		size_t chunk = len - off < CHUNK_MAX ? len - off : CHUNK_MAX;

		for (int k = 0; k <= n; k++)
			vec[k] = base[k] + off;
		if (xor_gen(n + 1, (int)chunk, vec) != 0)
			return false;
	}
	return true;
}

/* Compute P and Q with pq_gen(); false when ISA-L's limits do not hold. */
static bool pq_fast(int ndata, unsigned char **blocks, size_t len)
{
	void *vec[FAST_MAX_VECTS];

	if (ndata < 2 || ndata + 2 > FAST_MAX_VECTS || len % FAST_ALIGN != 0)
		return false;
	for (int j = 0; j < ndata + 2; j++)
		if (!aligned(blocks[j]))
			return false;

	for (size_t off = 0; off < len; off += CHUNK_MAX) {
		size_t chunk = len - off < CHUNK_MAX ? len - off : CHUNK_MAX;

		for (int j = 0; j < ndata + 2; j++)
			vec[j] = blocks[j] + off;
		if (pq_gen(ndata + 2, (int)chunk, vec) != 0)
			return false;
	}
	return true;
}

/* Rebuild data block or P at @f as the XOR of the other data blocks and P. */
static void rebuild_by_xor(int ndata, int nparity, unsigned char **blocks, size_t len, int f)
{
	struct recipe r = {
		.nout = 1, .skip_a = f, .skip_b = -1,
		.p = { 1 }, .q = { 0 }, .d0 = { 1 }, .dg = { 0 },
	};

	if (!xor_fast(blocks[f], blocks, ndata + 1, f, len))
		combine(&r, ndata, ndata + nparity, blocks, &blocks[f], len);
}

/* Rebuild Q (RAID6) from the data blocks. */
static void rebuild_q(int ndata, unsigned char **blocks, size_t len)
{
	struct recipe r = {
		.nout = 1, .skip_a = ndata, .skip_b = ndata + 1,
		.p = { 0 }, .q = { 0 }, .d0 = { 0 }, .dg = { 1 },
	};

	combine(&r, ndata, ndata + 2, blocks, &blocks[ndata + 1], len);
}

/* Check the shape of a row; 0 or -EINVAL. */
static int check_row(int ndata, int nparity, unsigned char **blocks)
{
	if (nparity != 1 && nparity != 2)
		return -EINVAL;
	if (ndata < 1 || (nparity == 2 && ndata > RAID6_MAX_DATA))
		return -EINVAL;
	if (!blocks)
		return -EINVAL;
	for (int j = 0; j < ndata + nparity; j++)
		if (!blocks[j])
			return -EINVAL;
	return 0;
}

static void gen_parity(int ndata, int nparity, unsigned char **blocks, size_t len)
{
	if (nparity == 1) {
		rebuild_by_xor(ndata, 1, blocks, len, ndata);
		return;
	}
	if (!pq_fast(ndata, blocks, len)) {
		struct recipe r = {
			.nout = 2, .skip_a = ndata, .skip_b = ndata + 1,
			.p = { 0, 0 }, .q = { 0, 0 }, .d0 = { 1, 0 }, .dg = { 0, 1 },
		};

		combine(&r, ndata, ndata + 2, blocks, &blocks[ndata], len);
	}
}

/*
 * Compute the parity of a row: P into blocks[ndata], and Q into
 * blocks[ndata + 1] when nparity is 2. Returns 0, or -EINVAL for a bad row
 * (nparity not 1 or 2, ndata < 1, ndata > 255 with Q, a NULL block).
 */
int raid56_gen_parity(int ndata, int nparity, unsigned char **blocks, size_t len)
{
	int ret = check_row(ndata, nparity, blocks);

	if (ret)
		return ret;
	if (len)
		gen_parity(ndata, nparity, blocks, len);
	return 0;
}

/*
 * Rebuild the failed blocks @fail_a and @fail_b (either may be -1; the same
 * index twice counts once) of a row in place from the others. Returns 0,
 * also when nothing failed, or -EINVAL for a bad row, an index out of range,
 * or more failures than nparity.
 */
int raid56_recover(int ndata, int nparity, unsigned char **blocks, size_t len, int fail_a,
		   int fail_b)
{
	int ret = check_row(ndata, nparity, blocks);
	int nblocks = ndata + nparity;
	int p = ndata, q = ndata + 1;
	int x, y;

	if (ret)
		return ret;
	if (fail_a < -1 || fail_a >= nblocks || fail_b < -1 || fail_b >= nblocks)
		return -EINVAL;
	if (fail_a == fail_b)
		fail_b = -1;
	x = fail_a < fail_b ? fail_a : fail_b;
	y = fail_a < fail_b ? fail_b : fail_a;
	if (x >= 0 && nparity < 2)
		return -EINVAL;
	if (y < 0 || len == 0)
		return 0;

	if (x < 0) {
		if (y == q)
			rebuild_q(ndata, blocks, len);
		else
			rebuild_by_xor(ndata, nparity, blocks, len, y);
		return 0;
	}

	if (x == p) {                   /* P and Q */
		gen_parity(ndata, nparity, blocks, len);
	} else if (y == q) {            /* Dx and Q */
		rebuild_by_xor(ndata, nparity, blocks, len, x);
		rebuild_q(ndata, blocks, len);
	} else if (y == p) {            /* Dx and P */
		unsigned char ginv = gf_inv(gf_pow2(x));
		struct recipe r = {
			.nout = 1, .skip_a = x, .skip_b = p,
			.p = { 0 }, .q = { ginv }, .d0 = { 0 }, .dg = { ginv },
		};

		combine(&r, ndata, nblocks, blocks, &blocks[x], len);
		rebuild_by_xor(ndata, nparity, blocks, len, p);
	} else {                        /* Dx and Dy */
		unsigned char gyx = gf_pow2(y - x);
		unsigned char den = gf_inv(gyx ^ 1);
		unsigned char a = gf_mul(gyx, den);
		unsigned char b = gf_mul(gf_inv(gf_pow2(x)), den);
		unsigned char *out[2] = { blocks[x], blocks[y] };
		struct recipe r = {
			.nout = 2, .skip_a = x, .skip_b = y,
			.p = { a, 1 ^ a }, .q = { b, b }, .d0 = { a, 1 ^ a }, .dg = { b, b },
		};

		combine(&r, ndata, nblocks, blocks, out, len);
	}
	return 0;
}
