/*
 * fuzz_decompress.c — libFuzzer harness for the compressed extent decoders
 * (zlib, lzo with btrfs's segment framing, zstd).
 *
 * Input layout:
 *   OFFSET  SIZE  FIELD
 *   0       1     type: 1 zlib, 2 lzo, 3 zstd (modulo 4; 0 is an unknown type)
 *   1       1     bit 7: "encode first"; low 3 bits: sectorsize 512 << n
 *   2       2     le16 output length / 2 (0..128 KiB, the largest extent)
 *   4       1     number of byte flips k (encode-first mode only)
 *   5       3k    flips: le16 position, xor byte
 *   ...           the payload
 * Plain mode decodes the payload as a stream. Encode-first mode compresses the
 * payload with data_compress() (checking that it decodes back unchanged),
 * flips the given bytes of the stream, and decodes that: the fuzzer reaches
 * deep into the decoders without having to discover valid streams itself.
 * The output buffer is exactly the length asked for, so ASan sees any
 * overrun.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/compression.h"
#include "fuzz_entry.h"

#define MAX_OUT (128u << 10)

static void check_roundtrip(int type, const uint8_t *in, size_t len, const uint8_t *stream,
			    size_t slen, u32 ss)
{
	uint8_t *back = malloc(len ? len : 1);
	ssize_t n;

	if (!back)
		return;
	n = data_decompress(type, stream, slen, back, len, ss);
	if (n != (ssize_t)len || memcmp(back, in, len) != 0) {
		fprintf(stderr, "fuzz_decompress: type %d: round trip of %zu bytes gave %zd\n", type,
			len, n);
		abort();
	}
	free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int type;
	u32 ss;
	size_t out_len, k, i, plen;
	const uint8_t *flips, *payload;
	uint8_t *out, *stream = NULL;
	ssize_t n;

	if (size < 5)
		return 0;
	type = data[0] % 4;
	ss = 512u << (data[1] & 7);
	out_len = ((size_t)data[2] | (size_t)data[3] << 8) * 2;
	if (out_len > MAX_OUT)
		out_len = MAX_OUT;
	k = data[4];
	if (size - 5 < 3 * k)
		k = (size - 5) / 3;
	flips = data + 5;
	payload = flips + 3 * k;
	plen = size - 5 - 3 * k;

	if (data[1] & 0x80) {
		size_t cap = plen * 2 + 4096;
		ssize_t slen;

		if (type == 0 || plen == 0 || plen > MAX_OUT)
			return 0;
		stream = malloc(cap);
		if (!stream)
			return 0;
		slen = data_compress(type, 0, payload, plen, stream, cap, ss);
		if (slen < 0) {
			free(stream);
			return 0;
		}
		check_roundtrip(type, payload, plen, stream, (size_t)slen, ss);
		for (i = 0; i < k; i++) {
			size_t pos = ((size_t)flips[3 * i] | (size_t)flips[3 * i + 1] << 8) % (size_t)slen;

			stream[pos] ^= flips[3 * i + 2];
		}
		payload = stream;
		plen = (size_t)slen;
	}
	out = malloc(out_len ? out_len : 1);
	if (out) {
		n = data_decompress(type, payload, plen, out, out_len, ss);
		if (n > (ssize_t)out_len) {
			fprintf(stderr, "fuzz_decompress: produced %zd of %zu bytes\n", n, out_len);
			abort();
		}
		free(out);
	}
	free(stream);
	return 0;
}
