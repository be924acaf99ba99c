/*
 * compression.c — the three btrfs compressed extent encodings (zlib, lzo,
 * zstd): decoding what the kernel wrote and encoding what the kernel reads.
 *
 * Owns: the byte layout of one compressed extent payload, regular or inline
 * (an inline extent holds the whole stream in the item, read the same way).
 * It does no I/O and knows nothing of extents or checksums; the caller hands
 * in the stream and logs corruption with the extent's address.
 *
 * Stream layouts (as written by Linux fs/btrfs/{zlib,lzo,zstd}.c):
 *
 *   zlib  RFC 1950 stream. The kernel decodes a valid 2-byte header with no
 *         preset dictionary by inflating the deflate data raw, so the trailing
 *         adler32 is never checked and may be absent; we do the same. Bytes
 *         after the end of the deflate stream (sector padding) are ignored.
 *
 *   zstd  one zstd frame, window at most 2^17: the kernel's decoder refuses
 *         bigger windows, and so do we, which also bounds our memory (zstd
 *         itself makes one exception: a frame whose whole content fits in
 *         @out is decoded straight into it, with no window buffer). The frame
 *         may or may not record the content size. Bytes after the frame end
 *         (sector padding) are ignored.
 *
 *   lzo   btrfs's own framing around LZO1X, positions counted from the start
 *         of the payload, S = sectorsize:
 *
 *           OFFSET  SIZE  FIELD
 *           0          4  le32 total: length of the payload including these 4
 *                         bytes and any padding (<= the extent's disk bytes)
 *           4          4  le32 seg_len of segment 1 (<= S + S/16 + 67)
 *           8    seg_len  LZO1X data expanding to at most S bytes
 *           ...           then segment 2's header, and so on, until total.
 *
 *         A segment header never straddles a sector boundary: when fewer than
 *         4 bytes remain in the current sector after a segment's data, they
 *         are zero padding and the next header starts at the next multiple of
 *         S. Each segment is the compression of one sector of input (the last
 *         may be shorter); decoding concatenates the expansions.
 *
 * Promises:
 *  1. Every length read from the stream is checked against the bytes the
 *     caller passed before it is used; a truncated, overlong or malformed
 *     stream returns -EUCLEAN. No read outside [in, in + in_len), no write
 *     outside [out, out + out_len), whatever the input.
 *  2. Decoding stops as soon as @out_len bytes are produced; the rest of the
 *     stream is not looked at. A stream that ends properly before filling
 *     @out_len returns the shorter count (the caller zero-fills, as the kernel
 *     does). A stream that runs out of input before its end and before filling
 *     @out_len is corrupt (-EUCLEAN); the kernel is laxer for zstd there
 *     (it zero-fills), but never writes such a stream.
 *  3. Encoding produces a stream the kernel decodes to the input exactly, in
 *     the kernel's framing: zlib window 15 (default level 3), zstd window
 *     <= 2^17 with content size (default level 3), lzo one LZO1X-1 segment per
 *     sector of input with the padding rule above. The bytes need not equal
 *     the kernel's own output (the kernel zlib-flushes every page, for one).
 *  4. Memory is bounded and freed before return: zlib's own state, a zstd
 *     context with a window of at most 128 KiB (plus, to encode, a scratch of
 *     ZSTD_compressBound(in_len)), one sector of scratch and LZO1X-1's work
 *     memory. No global or static mutable state.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <lzo/lzo1x.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "data/data.h"

#define ZLIB_DEFAULT_LEVEL 3
#define ZLIB_MIN_LEVEL 1
#define ZLIB_MAX_LEVEL 9

#define ZSTD_DEFAULT_LEVEL 3
#define ZSTD_MIN_LEVEL (-15)
#define ZSTD_MAX_LEVEL 15
#define ZSTD_BTRFS_MAX_WINDOWLOG 17

#define LZO_LEN 4
/* The most LZO1X can expand n bytes of incompressible input. */
#define LZO_WORST(n) ((size_t)(n) + (size_t)(n) / 16 + 64 + 3)

#define MIN_SECTORSIZE 512
#define MAX_SECTORSIZE 65536

static size_t min_size(size_t a, size_t b)
{
	return a < b ? a : b;
}

static int sectorsize_ok(u32 sectorsize)
{
	return sectorsize >= MIN_SECTORSIZE && sectorsize <= MAX_SECTORSIZE &&
	       (sectorsize & (sectorsize - 1)) == 0;
}

/* ---- zlib --------------------------------------------------------------- */

/*
 * Feed zlib the next piece of a buffer whose length may exceed uInt.
 * *given counts the bytes handed over so far.
 */
static void zlib_refill(const u8 *base, size_t len, size_t *given, Bytef **next, uInt *avail)
{
	size_t chunk;

	if (*avail != 0 || *given == len)
		return;
	chunk = min_size(len - *given, UINT_MAX);
	*next = (Bytef *)(base + *given);
	*avail = (uInt)chunk;
	*given += chunk;
}

/* Whether two bytes form an RFC 1950 header for deflate without a dictionary. */
static int zlib_plain_header(u8 cmf, u8 flg)
{
	return (cmf & 0x0f) == Z_DEFLATED && !(flg & 0x20) && ((cmf << 8) | flg) % 31 == 0;
}

/*
 * Inflate a btrfs zlib stream into @out. Returns the bytes produced or
 * -EUCLEAN / -ENOMEM.
 */
static ssize_t zlib_decode(const u8 *in, size_t in_len, u8 *out, size_t out_len)
{
	z_stream strm;
	size_t in_given = 0, out_given = 0, produced;
	int wbits = MAX_WBITS;
	ssize_t ret;
	int zret;

	if (in_len > 2 && zlib_plain_header(in[0], in[1])) {
		wbits = -((in[0] >> 4) + 8);
		in_given = 2;
	}

	memset(&strm, 0, sizeof(strm));
	zret = inflateInit2(&strm, wbits);
	if (zret == Z_MEM_ERROR)
		return -ENOMEM;
	if (zret != Z_OK)
		return -EUCLEAN; /* window size in the header out of range */

	for (;;) {
		zlib_refill(in, in_len, &in_given, &strm.next_in, &strm.avail_in);
		zlib_refill(out, out_len, &out_given, &strm.next_out, &strm.avail_out);

		zret = inflate(&strm, Z_NO_FLUSH);
		produced = out_given - strm.avail_out;
		if (zret == Z_STREAM_END || produced == out_len) {
			ret = (ssize_t)produced;
			break;
		}
		if (zret == Z_MEM_ERROR) {
			ret = -ENOMEM;
			break;
		}
		if (zret != Z_OK && zret != Z_BUF_ERROR) {
			ret = -EUCLEAN; /* Z_DATA_ERROR, Z_NEED_DICT */
			break;
		}
		if (strm.avail_in == 0 && in_given == in_len) {
			ret = -EUCLEAN; /* input ended inside the stream */
			break;
		}
	}
	inflateEnd(&strm);
	return ret;
}

/*
 * Deflate @in into @out, giving up once the output would exceed @limit bytes.
 * Returns the compressed size, -E2BIG, -ENOMEM or -EIO. A stream that ends
 * exactly at @limit gets Z_STREAM_END; a full buffer without it means more
 * output (at least the adler32) is still to come.
 */
static ssize_t zlib_encode(int level, const u8 *in, size_t in_len, u8 *out, size_t limit)
{
	z_stream strm;
	size_t in_given = 0, out_given = 0;
	ssize_t ret;
	int zret;

	memset(&strm, 0, sizeof(strm));
	zret = deflateInit(&strm, level);
	if (zret == Z_MEM_ERROR)
		return -ENOMEM;
	if (zret != Z_OK)
		return -EIO;

	for (;;) {
		zlib_refill(in, in_len, &in_given, &strm.next_in, &strm.avail_in);
		zlib_refill(out, limit, &out_given, &strm.next_out, &strm.avail_out);

		zret = deflate(&strm, in_given == in_len ? Z_FINISH : Z_NO_FLUSH);
		if (zret == Z_STREAM_END) {
			ret = (ssize_t)(out_given - strm.avail_out);
			break;
		}
		if (zret != Z_OK && zret != Z_BUF_ERROR) {
			ret = -EIO;
			break;
		}
		if (strm.avail_out == 0 && out_given == limit) {
			ret = -E2BIG;
			break;
		}
	}
	deflateEnd(&strm);
	return ret;
}

/* ---- zstd --------------------------------------------------------------- */

static ssize_t zstd_errno(size_t code, ssize_t otherwise)
{
	switch (ZSTD_getErrorCode(code)) {
	case ZSTD_error_memory_allocation:
		return -ENOMEM;
	case ZSTD_error_dstSize_tooSmall:
		return -E2BIG;
	default:
		return otherwise;
	}
}

/*
 * Decode the zstd frame at @in into @out. Returns the bytes produced or
 * -EUCLEAN / -ENOMEM.
 */
static ssize_t zstd_decode(const u8 *in, size_t in_len, u8 *out, size_t out_len)
{
	ZSTD_inBuffer ib = { in, in_len, 0 };
	ZSTD_outBuffer ob = { out, out_len, 0 };
	ZSTD_DCtx *dctx;
	ssize_t ret;
	size_t r;

	dctx = ZSTD_createDCtx();
	if (!dctx)
		return -ENOMEM;
	r = ZSTD_DCtx_setParameter(dctx, ZSTD_d_windowLogMax, ZSTD_BTRFS_MAX_WINDOWLOG);
	if (ZSTD_isError(r)) {
		ret = -EIO;
		goto out;
	}

	for (;;) {
		size_t in_before = ib.pos, out_before = ob.pos;

		r = ZSTD_decompressStream(dctx, &ob, &ib);
		if (ZSTD_isError(r)) {
			ret = ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation ? -ENOMEM : -EUCLEAN;
			break;
		}
		if (r == 0 || ob.pos == ob.size) {
			ret = (ssize_t)ob.pos; /* frame end, or all the caller wants */
			break;
		}
		if (ib.pos == in_before && ob.pos == out_before) {
			ret = -EUCLEAN; /* input ended inside the frame */
			break;
		}
	}
out:
	ZSTD_freeDCtx(dctx);
	return ret;
}

/*
 * Compress @in as one zstd frame into @out, at most @limit bytes. Returns
 * the compressed size, -E2BIG, -ENOMEM or -EIO.
 *
 * zstd may fail for want of working room in a destination smaller than
 * ZSTD_compressBound() even when the result would fit, so such a destination
 * is filled through a scratch buffer of the bound's size.
 */
static ssize_t zstd_encode(int level, const u8 *in, size_t in_len, u8 *out, size_t limit)
{
	size_t bound = ZSTD_compressBound(in_len), r;
	u8 *dst = out, *scratch = NULL;
	ZSTD_CCtx *cctx;
	ssize_t ret;

	if (limit < bound) {
		scratch = malloc(bound);
		if (!scratch)
			return -ENOMEM;
		dst = scratch;
	}
	cctx = ZSTD_createCCtx();
	if (!cctx) {
		free(scratch);
		return -ENOMEM;
	}
	r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
	if (!ZSTD_isError(r))
		r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_windowLog, ZSTD_BTRFS_MAX_WINDOWLOG);
	if (!ZSTD_isError(r))
		r = ZSTD_compress2(cctx, dst, scratch ? bound : limit, in, in_len);
	if (ZSTD_isError(r)) {
		ret = zstd_errno(r, -EIO);
	} else if (r > limit) {
		ret = -E2BIG;
	} else {
		if (scratch)
			memcpy(out, scratch, r);
		ret = (ssize_t)r;
	}
	ZSTD_freeCCtx(cctx);
	free(scratch);
	return ret;
}

/* ---- lzo ---------------------------------------------------------------- */

/* Position of the next segment header after a segment ending at @pos. */
static size_t lzo_next_header(size_t pos, u32 sectorsize)
{
	size_t left = sectorsize - pos % sectorsize;

	return left < LZO_LEN ? pos + left : pos;
}

/*
 * Decode a btrfs lzo payload into @out. Returns the bytes produced or
 * -EUCLEAN / -ENOMEM.
 */
static ssize_t lzo_decode(const u8 *in, size_t in_len, u8 *out, size_t out_len, u32 sectorsize)
{
	u8 *scratch = NULL;
	size_t total, pos, produced = 0;
	ssize_t ret;

	if (in_len < LZO_LEN)
		return -EUCLEAN;
	total = get_le32(in);
	if (total < LZO_LEN || total > in_len)
		return -EUCLEAN;

	pos = LZO_LEN;
	while (pos < total && produced < out_len) {
		size_t room = out_len - produced, seg_len;
		lzo_uint got = sectorsize;
		u8 *dst;

		if (total - pos < LZO_LEN) {
			ret = -EUCLEAN;
			goto out;
		}
		seg_len = get_le32(in + pos);
		pos += LZO_LEN;
		if (seg_len > LZO_WORST(sectorsize) || seg_len > total - pos) {
			ret = -EUCLEAN;
			goto out;
		}

		/* A last, partial sector of output is expanded aside and trimmed. */
		if (room >= sectorsize) {
			dst = out + produced;
		} else {
			if (!scratch) {
				scratch = malloc(sectorsize);
				if (!scratch) {
					ret = -ENOMEM;
					goto out;
				}
			}
			dst = scratch;
		}
		if (lzo1x_decompress_safe(in + pos, seg_len, dst, &got, NULL) != LZO_E_OK ||
		    got > sectorsize) {
			ret = -EUCLEAN;
			goto out;
		}
		if (dst == scratch)
			memcpy(out + produced, scratch, min_size(got, room));
		produced += min_size(got, room);
		pos = lzo_next_header(pos + seg_len, sectorsize);
	}
	ret = (ssize_t)produced;
out:
	free(scratch);
	return ret;
}

/*
 * Compress @in into the btrfs lzo framing in @out, at most @limit bytes.
 * Returns the payload size, -E2BIG, -ENOMEM or -EIO.
 */
static ssize_t lzo_encode(const u8 *in, size_t in_len, u8 *out, size_t limit, u32 sectorsize)
{
	u8 *seg = NULL, *wrkmem = NULL;
	size_t off, pos = LZO_LEN;
	ssize_t ret;

	if (limit > UINT32_MAX)
		limit = UINT32_MAX; /* the total must fit its le32 */
	if (limit < LZO_LEN)
		return -E2BIG;

	seg = malloc(LZO_WORST(sectorsize));
	wrkmem = malloc(LZO1X_1_MEM_COMPRESS);
	if (!seg || !wrkmem) {
		ret = -ENOMEM;
		goto out;
	}

	for (off = 0; off < in_len;) {
		size_t chunk = min_size(sectorsize, in_len - off), next;
		lzo_uint seg_len = 0;

		if (lzo1x_1_compress(in + off, chunk, seg, &seg_len, wrkmem) != LZO_E_OK) {
			ret = -EIO;
			goto out;
		}
		if (limit - pos < LZO_LEN || limit - pos - LZO_LEN < seg_len) {
			ret = -E2BIG;
			goto out;
		}
		put_le32(out + pos, (u32)seg_len);
		memcpy(out + pos + LZO_LEN, seg, seg_len);
		pos += LZO_LEN + seg_len;

		next = lzo_next_header(pos, sectorsize);
		if (next - pos > limit - pos) {
			ret = -E2BIG;
			goto out;
		}
		memset(out + pos, 0, next - pos);
		pos = next;
		off += chunk;
	}
	put_le32(out, (u32)pos);
	ret = (ssize_t)pos;
out:
	free(seg);
	free(wrkmem);
	return ret;
}

/* ---- entry points ------------------------------------------------------- */

/*
 * Decompress one btrfs compressed extent payload. See compression.h for the
 * contract; returns the bytes produced (possibly fewer than @out_len),
 * -EUCLEAN for a corrupt stream, -EINVAL for an unknown type or (lzo) a
 * sectorsize that is not a power of two in [512, 64K], -ENOMEM.
 */
ssize_t data_decompress(int type, const void *in, size_t in_len, void *out, size_t out_len,
			u32 sectorsize)
{
	switch (type) {
	case BTRFS_COMPRESS_ZLIB:
		if (out_len == 0)
			return 0;
		return zlib_decode(in, in_len, out, out_len);
	case BTRFS_COMPRESS_ZSTD:
		if (out_len == 0)
			return 0;
		return zstd_decode(in, in_len, out, out_len);
	case BTRFS_COMPRESS_LZO:
		if (!sectorsize_ok(sectorsize))
			return -EINVAL;
		if (out_len == 0)
			return 0;
		if (lzo_init() != LZO_E_OK)
			return -EIO;
		return lzo_decode(in, in_len, out, out_len, sectorsize);
	default:
		return -EINVAL;
	}
}

/*
 * Compress @in_len bytes into one btrfs compressed extent payload. Returns
 * its size, which is always below @in_len and at most @out_cap; -E2BIG when
 * it would not be (the caller stores the data plain); -EINVAL for an unknown
 * type, a level out of range (zlib 1..9, zstd -15..15, lzo 1; 0 is the
 * default) or (lzo) a bad sectorsize; -ENOMEM; -EIO if a library fails.
 */
ssize_t data_compress(int type, int level, const void *in, size_t in_len, void *out,
		      size_t out_cap, u32 sectorsize)
{
	size_t limit;

	switch (type) {
	case BTRFS_COMPRESS_ZLIB:
		if (level == 0)
			level = ZLIB_DEFAULT_LEVEL;
		if (level < ZLIB_MIN_LEVEL || level > ZLIB_MAX_LEVEL)
			return -EINVAL;
		break;
	case BTRFS_COMPRESS_ZSTD:
		if (level == 0)
			level = ZSTD_DEFAULT_LEVEL;
		if (level < ZSTD_MIN_LEVEL || level > ZSTD_MAX_LEVEL)
			return -EINVAL;
		break;
	case BTRFS_COMPRESS_LZO:
		if (level != 0 && level != 1)
			return -EINVAL;
		if (!sectorsize_ok(sectorsize))
			return -EINVAL;
		if (lzo_init() != LZO_E_OK)
			return -EIO;
		break;
	default:
		return -EINVAL;
	}

	limit = in_len ? min_size(out_cap, in_len - 1) : 0;
	if (limit == 0)
		return -E2BIG;

	switch (type) {
	case BTRFS_COMPRESS_ZLIB:
		return zlib_encode(level, in, in_len, out, limit);
	case BTRFS_COMPRESS_ZSTD:
		return zstd_encode(level, in, in_len, out, limit);
	default:
		return lzo_encode(in, in_len, out, limit, sectorsize);
	}
}
