/*
 * checksum.c — the four btrfs checksum algorithms, computed by libraries.
 *
 * Owns: the mapping from a superblock csum_type to its digest size, its name
 * and the library call that computes it, and the raw CRC-32C behind the name
 * hashes. No I/O, no allocation.
 *
 * Promises:
 *  1. btrfs_crc32c_raw(seed, p, n) equals the Linux kernel's crc32c(seed, p, n):
 *     a reflected CRC-32C (polynomial 0x82F63B78) update with no inversion on
 *     entry or exit. ISA-L's crc32_iscsi() is exactly that update (it neither
 *     inverts its init value nor its result), so it is called as is.
 *  2. The crc32c checksum is the standard CRC-32C, ~raw(~0, data), stored as
 *     4 little-endian bytes; xxhash is XXH64 with seed 0 stored as 8
 *     little-endian bytes; sha256 and blake2 (BLAKE2b, 32-byte digest, no key)
 *     are stored as the 32 digest bytes.
 *  3. btrfs_csum_compute() always writes all BTRFS_CSUM_SIZE bytes of @out:
 *     the digest first, then zeros. On error @out is left all zero.
 *  4. Thread-safe: the only shared state is libsodium's one-time
 *     initialisation, run once under pthread_once; its result never changes.
 */
#include <errno.h>
#include <pthread.h>

#include <isa-l/crc.h>
#include <sodium.h>
#include <xxhash.h>

#include "format/checksum.h"

struct csum_desc {
	const char *name;
	int size;
};

static const struct csum_desc csum_table[] = {
	[BTRFS_CSUM_TYPE_CRC32] = { "crc32c", 4 },
	[BTRFS_CSUM_TYPE_XXHASH] = { "xxhash64", 8 },
	[BTRFS_CSUM_TYPE_SHA256] = { "sha256", 32 },
	[BTRFS_CSUM_TYPE_BLAKE2] = { "blake2b", 32 },
};

#define CSUM_TYPE_COUNT (sizeof(csum_table) / sizeof(csum_table[0]))

_Static_assert(CSUM_TYPE_COUNT == 4, "one entry per btrfs checksum type");
_Static_assert(crypto_hash_sha256_BYTES == BTRFS_CSUM_SIZE, "sha256 fills the csum field");

/* Set once by sodium_setup() under sodium_once; read-only afterwards. */
static pthread_once_t sodium_once = PTHREAD_ONCE_INIT;
static int sodium_status;

static void sodium_setup(void)
{
	/* 0: initialised now, 1: already initialised by someone else, -1: failed. */
	sodium_status = sodium_init() < 0 ? -EIO : 0;
}

/* Make libsodium usable. Returns 0, or -EIO if it could not initialise. */
static int sodium_ready(void)
{
	pthread_once(&sodium_once, sodium_setup);
	return sodium_status;
}

static const struct csum_desc *csum_lookup(u16 csum_type)
{
	if (csum_type >= CSUM_TYPE_COUNT)
		return NULL;
	return &csum_table[csum_type];
}

int btrfs_csum_size(u16 csum_type)
{
	const struct csum_desc *d = csum_lookup(csum_type);

	return d ? d->size : 0;
}

const char *btrfs_csum_name(u16 csum_type)
{
	const struct csum_desc *d = csum_lookup(csum_type);

	return d ? d->name : NULL;
}

/*
 * Update a raw CRC-32C. ISA-L takes an int length and a non-const buffer it
 * only reads, so feed it in chunks that fit an int.
 */
u32 btrfs_crc32c_raw(u32 seed, const void *data, size_t len)
{
	const size_t chunk_max = (size_t)1 << 30;
	unsigned char *p = (unsigned char *)data;
	u32 crc = seed;

	while (len) {
		size_t n = len < chunk_max ? len : chunk_max;

		crc = crc32_iscsi(p, (int)n, crc);
		p += n;
		len -= n;
	}
	return crc;
}

/*
 * Compute the @csum_type checksum of @data into @out, zero padded.
 * Returns 0; -EINVAL for an unknown type; -EIO if libsodium cannot be
 * initialised (sha256 and blake2 only).
 */
int btrfs_csum_compute(u16 csum_type, const void *data, size_t len, u8 out[BTRFS_CSUM_SIZE])
{
	int ret;

	memset(out, 0, BTRFS_CSUM_SIZE);

	switch (csum_type) {
	case BTRFS_CSUM_TYPE_CRC32:
		put_le32(out, ~btrfs_crc32c_raw(~(u32)0, data, len));
		return 0;
	case BTRFS_CSUM_TYPE_XXHASH:
		put_le64(out, (u64)XXH64(data, len, 0));
		return 0;
	case BTRFS_CSUM_TYPE_SHA256:
		ret = sodium_ready();
		if (ret)
			return ret;
		crypto_hash_sha256(out, data, len);
		return 0;
	case BTRFS_CSUM_TYPE_BLAKE2:
		ret = sodium_ready();
		if (ret)
			return ret;
		if (crypto_generichash(out, BTRFS_CSUM_SIZE, data, len, NULL, 0)) {
			memset(out, 0, BTRFS_CSUM_SIZE);
			return -EIO;
		}
		return 0;
	default:
		return -EINVAL;
	}
}
