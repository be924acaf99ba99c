/*
 * compression.h — btrfs compressed extent formats: zlib, lzo, zstd.
 *
 * On disk a compressed extent (regular or inline) holds one compressed stream
 * whose expansion is the extent's ram_bytes:
 *   zlib  one zlib stream (RFC 1950 header + deflate)
 *   zstd  one zstd frame (content size may be absent)
 *   lzo   btrfs framing: le32 total length (including itself), then segments,
 *         each le32 segment length + LZO1X data expanding to at most one
 *         sector; a segment header never straddles a sector boundary (if fewer
 *         than 4 bytes remain in the sector, skip to the next sector).
 */
#ifndef BUTTER_DATA_COMPRESSION_H
#define BUTTER_DATA_COMPRESSION_H

#include <sys/types.h>
#include "format/ondisk.h"

/*
 * Decompress @in_len bytes of @type (BTRFS_COMPRESS_*) at @in into @out,
 * producing at most @out_len bytes. @sectorsize matters only for lzo.
 * Returns the number of bytes produced (a stream shorter than @out_len is
 * fine: the caller zero-fills), -EUCLEAN if the stream is corrupt, -EINVAL
 * for an unknown type, -ENOMEM.
 */
ssize_t data_decompress(int type, const void *in, size_t in_len, void *out, size_t out_len,
			u32 sectorsize);

/*
 * Compress @in_len bytes at @in with @type at @level (0 = default) into @out
 * (capacity @out_cap). Returns the compressed size, or -E2BIG if the result
 * would not be smaller than the input or not fit in @out_cap (store it
 * uncompressed), -EINVAL, -ENOMEM.
 */
ssize_t data_compress(int type, int level, const void *in, size_t in_len, void *out,
		      size_t out_cap, u32 sectorsize);

#endif
