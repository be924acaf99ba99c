/*
 * test_tree.c — tree blocks, the node cache and tree search
 * (lib/tree/node.c, lib/tree/ctree.c) over blocks built here by hand.
 *
 * The fixture is a two-level tree of 200 items: a root node (level 1) with
 * seven key pointers to leaves of 20..40 items each, every block crc32c
 * checksummed, written to both copies of a DUP metadata chunk on one memory
 * device. Leaves are laid out as the format says: item headers from the
 * front after the 101-byte header, item data packed from the end backwards,
 * item offsets relative to the end of the header.
 *
 * Covered:
 *  - node_validate accepts the good blocks and rejects each corruption it is
 *    meant to catch (checksum, bytenr, fsid, level, generation, item count,
 *    item bounds, overlapping items, key order, empty node, first key,
 *    unaligned child pointer);
 *  - tree_search / _forward / _backward for present and absent keys,
 *    next/prev over the whole tree, tree_lookup_item;
 *  - node_read falls back to the second copy when the first is bad and
 *    fails with -EIO when no copy is good or the parent's pointer disagrees;
 *  - a subtree whose last key reaches past its parent's next key fails every
 *    search and walk that enters it (-EUCLEAN);
 *  - the node cache stays within its byte limit once nodes are released, and
 *    counts hits and misses.
 */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

#include "check.h"
#include "device/device.h"
#include "format/checksum.h"
#include "format/ondisk.h"
#include "tree/tree.h"
#include "volumes/volumes.h"

#define MIB (1024ULL * 1024)
#define NODESIZE 4096U
#define DATA_SIZE (NODESIZE - (u32)sizeof(struct btrfs_header))
#define CHUNK_LOGICAL (16 * MIB)
#define CHUNK_LEN (1 * MIB)
#define PHYS0 (1 * MIB)
#define PHYS1 (4 * MIB)
#define DEV_SIZE (8 * MIB)
#define NITEMS 200
#define NLEAVES 7
#define ROOT_GEN 200
#define OWNER BTRFS_FS_TREE_OBJECTID

static const u32 leaf_counts[NLEAVES] = { 30, 25, 40, 35, 30, 20, 20 };
static const u8 test_fsid[BTRFS_FSID_SIZE] = { 0xb7, 0x7e, 0x70, 0x01, 0x02, 0x03, 0x04, 0x05,
					       0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d };

/* ---- log capture -------------------------------------------------------- */

struct capture {
	int errors, warnings;
};

static void capture_fn(void *arg, int level, const char *msg)
{
	struct capture *cap = arg;

	(void)msg;
	if (level == BUTTER_LOG_ERROR)
		cap->errors++;
	else if (level == BUTTER_LOG_WARNING)
		cap->warnings++;
}

/* ---- the items ---------------------------------------------------------- */

static struct btrfs_key key_of(u32 i)
{
	static const u8 types[4] = { BTRFS_INODE_ITEM_KEY, BTRFS_INODE_REF_KEY, BTRFS_DIR_ITEM_KEY,
				     BTRFS_EXTENT_DATA_KEY };
	struct btrfs_key k = { 300 + (u64)(i / 4) * 2, types[i % 4], (u64)(i % 4) * 100 + i };

	return k;
}

static u32 item_size_of(u32 i)
{
	return 8 + i % 23;
}

static void item_fill(u8 *dst, u32 i)
{
	put_le32(dst, i);
	for (u32 j = 4; j < item_size_of(i); j++)
		dst[j] = (u8)(i * 31 + j);
}

static int key_eq(const struct btrfs_key *a, const struct btrfs_key *b)
{
	return btrfs_comp_keys(a, b) == 0;
}

/* First item index of leaf @leaf. */
static u32 leaf_first(u32 leaf)
{
	u32 first = 0;

	for (u32 k = 0; k < leaf; k++)
		first += leaf_counts[k];
	return first;
}

/* ---- building blocks ----------------------------------------------------- */

static void header_init(u8 *buf, u64 bytenr, u64 gen, u32 nritems, u8 level)
{
	struct btrfs_header *h = (struct btrfs_header *)buf;

	memset(buf, 0, NODESIZE);
	memcpy(h->fsid, test_fsid, BTRFS_FSID_SIZE);
	btrfs_set_header_bytenr(h, bytenr);
	btrfs_set_header_flags(h, BTRFS_HEADER_FLAG_WRITTEN |
				       ((u64)BTRFS_MIXED_BACKREF_REV << BTRFS_BACKREF_REV_SHIFT));
	memset(h->chunk_tree_uuid, 0x33, BTRFS_UUID_SIZE);
	btrfs_set_header_generation(h, gen);
	btrfs_set_header_owner(h, OWNER);
	btrfs_set_header_nritems(h, nritems);
	h->level = level;
}

static void block_csum(u8 *buf)
{
	u8 csum[BTRFS_CSUM_SIZE];

	btrfs_csum_compute(BTRFS_CSUM_TYPE_CRC32, buf + BTRFS_CSUM_SIZE,
			   NODESIZE - BTRFS_CSUM_SIZE, csum);
	memcpy(buf, csum, BTRFS_CSUM_SIZE);
}

static struct btrfs_item *leaf_item_at(u8 *buf, u32 slot)
{
	return (struct btrfs_item *)(buf + sizeof(struct btrfs_header)) + slot;
}

static struct btrfs_key_ptr *key_ptr_at(u8 *buf, u32 slot)
{
	return (struct btrfs_key_ptr *)(buf + sizeof(struct btrfs_header)) + slot;
}

/* A leaf holding items first .. first + count - 1. */
static void build_leaf(u8 *buf, u64 bytenr, u64 gen, u32 first, u32 count)
{
	u32 end = DATA_SIZE;

	header_init(buf, bytenr, gen, count, 0);
	for (u32 s = 0; s < count; s++) {
		struct btrfs_item *it = leaf_item_at(buf, s);
		struct btrfs_key k = key_of(first + s);
		u32 size = item_size_of(first + s);

		end -= size;
		btrfs_cpu_to_disk_key(&it->key, &k);
		btrfs_set_item_offset(it, end);
		btrfs_set_item_size(it, size);
		item_fill(buf + sizeof(struct btrfs_header) + end, first + s);
	}
	block_csum(buf);
}

static void set_ptr(u8 *buf, u32 slot, const struct btrfs_key *k, u64 blockptr, u64 gen)
{
	struct btrfs_key_ptr *p = key_ptr_at(buf, slot);

	btrfs_cpu_to_disk_key(&p->key, k);
	btrfs_set_key_ptr_blockptr(p, blockptr);
	btrfs_set_key_ptr_generation(p, gen);
}

/* ---- the fixture -------------------------------------------------------- */

struct fixture {
	struct capture cap;
	struct blog log;
	struct btrfs_volumes vol;
	u8 *mem;
	struct node_cache cache;
	int cache_ready;
	u8 *block[NLEAVES + 1];         /* leaves 0..6, then the root */
	u64 bytenr[NLEAVES + 1];
	u64 gen[NLEAVES + 1];
	struct tree_root root;
};

#define ROOT_IDX NLEAVES

static u64 leaf_bytenr(u32 k)
{
	return CHUNK_LOGICAL + (u64)(k + 3) * NODESIZE;
}

/* Write @buf as tree block @bytenr into the copies in @mask (bit 0: copy 1). */
static void write_block(struct fixture *f, u64 bytenr, const u8 *buf, int mask)
{
	u64 rel = bytenr - CHUNK_LOGICAL;

	if (mask & 1)
		memcpy(f->mem + PHYS0 + rel, buf, NODESIZE);
	if (mask & 2)
		memcpy(f->mem + PHYS1 + rel, buf, NODESIZE);
}

static void rebuild_root(struct fixture *f)
{
	u8 *root = f->block[ROOT_IDX];

	header_init(root, f->bytenr[ROOT_IDX], ROOT_GEN, NLEAVES, 1);
	for (u32 k = 0; k < NLEAVES; k++) {
		struct btrfs_key first = key_of(leaf_first(k));

		set_ptr(root, k, &first, f->bytenr[k], f->gen[k]);
	}
	block_csum(root);
}

static int fixture_setup(struct fixture *f, u64 cache_limit)
{
	struct {
		struct btrfs_chunk c;
		struct btrfs_stripe more;
	} __attribute__((packed)) chunk;
	struct btrfs_device *dev;
	struct blockdev *bdev;

	memset(f, 0, sizeof(*f));
	f->log.fn = capture_fn;
	f->log.arg = &f->cap;
	f->log.level = BUTTER_LOG_DEBUG;
	f->vol.log = &f->log;
	f->vol.sectorsize = 4096;
	f->vol.nodesize = NODESIZE;
	f->vol.csum_type = BTRFS_CSUM_TYPE_CRC32;
	f->vol.csum_size = (u32)btrfs_csum_size(BTRFS_CSUM_TYPE_CRC32);
	memcpy(f->vol.fsid, test_fsid, BTRFS_FSID_SIZE);
	memcpy(f->vol.meta_fsid, test_fsid, BTRFS_FSID_SIZE);

	f->mem = calloc(1, DEV_SIZE);
	dev = calloc(1, sizeof(*dev));
	f->vol.devs = calloc(1, sizeof(*f->vol.devs));
	if (!f->mem || !dev || !f->vol.devs) {
		free(dev);
		return -ENOMEM;
	}
	if (blockdev_open_memory(f->mem, DEV_SIZE, 0, &bdev)) {
		free(dev);
		return -ENOMEM;
	}
	dev->devid = 1;
	dev->bdev = bdev;
	dev->total_bytes = DEV_SIZE;
	f->vol.devs[0] = dev;
	f->vol.ndevs = 1;

	memset(&chunk, 0, sizeof(chunk));
	btrfs_set_chunk_length(&chunk.c, CHUNK_LEN);
	btrfs_set_chunk_owner(&chunk.c, BTRFS_EXTENT_TREE_OBJECTID);
	btrfs_set_chunk_stripe_len(&chunk.c, BTRFS_STRIPE_LEN);
	btrfs_set_chunk_type(&chunk.c, BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_DUP);
	btrfs_set_chunk_sector_size(&chunk.c, 4096);
	btrfs_set_chunk_num_stripes(&chunk.c, 2);
	btrfs_set_stripe_devid(&chunk.c.stripe, 1);
	btrfs_set_stripe_offset(&chunk.c.stripe, PHYS0);
	btrfs_set_stripe_devid(&chunk.more, 1);
	btrfs_set_stripe_offset(&chunk.more, PHYS1);
	if (volumes_add_chunk(&f->vol, CHUNK_LOGICAL, &chunk.c, (u32)btrfs_chunk_item_size(2)))
		return -EUCLEAN;

	for (u32 k = 0; k <= NLEAVES; k++) {
		f->block[k] = malloc(NODESIZE);
		if (!f->block[k])
			return -ENOMEM;
	}
	for (u32 k = 0; k < NLEAVES; k++) {
		f->bytenr[k] = leaf_bytenr(k);
		f->gen[k] = 100 + k;
		build_leaf(f->block[k], f->bytenr[k], f->gen[k], leaf_first(k), leaf_counts[k]);
		write_block(f, f->bytenr[k], f->block[k], 3);
	}
	f->bytenr[ROOT_IDX] = CHUNK_LOGICAL + NODESIZE;
	f->gen[ROOT_IDX] = ROOT_GEN;
	rebuild_root(f);
	write_block(f, f->bytenr[ROOT_IDX], f->block[ROOT_IDX], 3);

	f->root.objectid = OWNER;
	f->root.bytenr = f->bytenr[ROOT_IDX];
	f->root.generation = ROOT_GEN;
	f->root.level = 1;
	if (node_cache_init(&f->cache, &f->vol, cache_limit))
		return -ENOMEM;
	f->cache_ready = 1;
	return 0;
}

static void fixture_teardown(struct fixture *f)
{
	if (f->cache_ready)
		node_cache_destroy(&f->cache);
	volumes_close(&f->vol);
	free(f->mem);
	for (u32 k = 0; k <= NLEAVES; k++)
		free(f->block[k]);
}

/* fixture_setup, or a failed check and the fixture torn down: false. */
static bool fixture_start(struct fixture *f, u64 cache_limit)
{
	if (fixture_setup(f, cache_limit) == 0)
		return true;
	CHECK(0);
	fixture_teardown(f);
	return false;
}

/* Which leaf holds item @i. */
static u32 leaf_of(u32 i)
{
	u32 k = 0;

	while (k + 1 < NLEAVES && leaf_first(k + 1) <= i)
		k++;
	return k;
}

/* Check the path points at item @i and the payload is right. */
static int path_at_item(const struct fixture *f, const struct tree_path *path, u32 i)
{
	struct btrfs_key got, want = key_of(i);
	const u8 *data;
	u32 size;
	u8 expect[64];

	if (!path->nodes[0] || path->slots[0] >= path->nodes[0]->nritems)
		return 0;
	path_key(path, &got);
	if (!key_eq(&got, &want))
		return 0;
	if (path->nodes[0]->bytenr != f->bytenr[leaf_of(i)])
		return 0;
	if (path->slots[0] != i - leaf_first(leaf_of(i)))
		return 0;
	if (!path->nodes[1] || path->nodes[1]->bytenr != f->bytenr[ROOT_IDX] ||
	    path->slots[1] != leaf_of(i))
		return 0;
	data = path_item(path, &size);
	item_fill(expect, i);
	return size == item_size_of(i) && memcmp(data, expect, size) == 0;
}

/* ---- node_validate -------------------------------------------------------- */

static void test_validate_good(void)
{
	struct fixture f;
	const char *why = NULL;

	if (!fixture_start(&f, 64 * NODESIZE))
		return;
	for (u32 k = 0; k < NLEAVES; k++) {
		struct btrfs_key first = key_of(leaf_first(k));

		CHECK_EQ_U64(node_validate(&f.cache, f.block[k], f.bytenr[k], f.gen[k], 0, &first,
					   &why),
			     0);
		/* nothing promised by a parent: generation 0, level -1, no key */
		CHECK_EQ_U64(node_validate(&f.cache, f.block[k], f.bytenr[k], 0, -1, NULL, &why), 0);
	}
	CHECK_EQ_U64(node_validate(&f.cache, f.block[ROOT_IDX], f.bytenr[ROOT_IDX], ROOT_GEN, 1,
				   NULL, &why),
		     0);
	{
		/* an empty leaf is a valid (root) leaf */
		u8 *leaf = malloc(NODESIZE);

		CHECK(leaf != NULL);
		if (leaf) {
			header_init(leaf, CHUNK_LOGICAL, 5, 0, 0);
			block_csum(leaf);
			CHECK_EQ_U64(node_validate(&f.cache, leaf, CHUNK_LOGICAL, 5, 0, NULL, &why), 0);
			/* a leaf filled to the last byte is valid too */
			header_init(leaf, CHUNK_LOGICAL, 5, 2, 0);
			{
				struct btrfs_key k0 = key_of(0), k1 = key_of(1);
				u32 size1 = 100, size0 = DATA_SIZE - 2 * sizeof(struct btrfs_item) - size1;

				btrfs_cpu_to_disk_key(&leaf_item_at(leaf, 0)->key, &k0);
				btrfs_set_item_offset(leaf_item_at(leaf, 0), DATA_SIZE - size0);
				btrfs_set_item_size(leaf_item_at(leaf, 0), size0);
				btrfs_cpu_to_disk_key(&leaf_item_at(leaf, 1)->key, &k1);
				btrfs_set_item_offset(leaf_item_at(leaf, 1), DATA_SIZE - size0 - size1);
				btrfs_set_item_size(leaf_item_at(leaf, 1), size1);
			}
			block_csum(leaf);
			CHECK_EQ_U64(node_validate(&f.cache, leaf, CHUNK_LOGICAL, 5, 0, NULL, &why), 0);
			free(leaf);
		}
	}
	fixture_teardown(&f);
}

/* Case-insensitive: does @why mention any of the |-separated words in @words? */
static int why_mentions(const char *why, const char *words)
{
	char word[64];

	if (!why)
		return 0;
	while (*words) {
		size_t n = strcspn(words, "|");

		if (n >= sizeof(word))
			n = sizeof(word) - 1;
		memcpy(word, words, n);
		word[n] = 0;
		for (const char *p = why; *p; p++) {
			size_t j = 0;

			while (word[j] && p[j] && tolower((unsigned char)p[j]) == word[j])
				j++;
			if (!word[j])
				return 1;
		}
		words += n;
		if (*words == '|')
			words++;
	}
	return 0;
}

static void expect_invalid(struct fixture *f, const char *what, const u8 *buf, u64 bytenr,
			   u64 gen, int level, const struct btrfs_key *first_key, const char *words)
{
	const char *why = NULL;
	int ret = node_validate(&f->cache, buf, bytenr, gen, level, first_key, &why);

	if (ret != -EUCLEAN) {
		fprintf(stderr, "%s: node_validate returned %d, want -EUCLEAN\n", what, ret);
		CHECK(0);
	} else if (!why_mentions(why, words)) {
		fprintf(stderr, "%s: rejected for \"%s\", expected a reason about %s\n", what,
			why ? why : "(null)", words);
		CHECK(0);
	}
}

/* Every corruption node_validate is meant to catch, one at a time. */
static void test_validate_corrupt(void)
{
	struct fixture f;
	u8 *b = malloc(NODESIZE);
	const u32 L = 2;   /* the leaf we damage: items 55..94 */
	struct btrfs_key first;
	u64 at, gen;

	if (!b || fixture_setup(&f, 64 * NODESIZE)) {
		CHECK(0);
		free(b);
		fixture_teardown(&f);
		return;
	}
	at = f.bytenr[L];
	gen = f.gen[L];
	first = key_of(leaf_first(L));
#define FRESH() memcpy(b, f.block[L], NODESIZE)

	/* checksum: any byte covered by it, or the stored digest itself */
	FRESH();
	b[NODESIZE - 1] ^= 0x01;
	expect_invalid(&f, "flipped last data byte", b, at, gen, 0, &first, "checksum|csum");
	FRESH();
	b[sizeof(struct btrfs_header) + 40 * sizeof(struct btrfs_item) + 10] ^= 0x80;
	expect_invalid(&f, "flipped free-space byte", b, at, gen, 0, &first, "checksum|csum");
	FRESH();
	b[BTRFS_CSUM_SIZE] ^= 0x01; /* first fsid byte, no new csum */
	expect_invalid(&f, "flipped fsid without new csum", b, at, gen, 0, &first,
		       "checksum|csum");
	FRESH();
	b[2] ^= 0x40;
	expect_invalid(&f, "flipped csum byte", b, at, gen, 0, &first, "checksum|csum");

	/* header bytenr against the address it was read from */
	FRESH();
	expect_invalid(&f, "read at another address", b, at + NODESIZE, gen, 0, &first, "bytenr");
	btrfs_set_header_bytenr((struct btrfs_header *)b, at - NODESIZE);
	block_csum(b);
	expect_invalid(&f, "header names another bytenr", b, at, gen, 0, &first, "bytenr");

	/* fsid */
	FRESH();
	((struct btrfs_header *)b)->fsid[7] ^= 0xff;
	block_csum(b);
	expect_invalid(&f, "fsid of another filesystem", b, at, gen, 0, &first, "fsid");

	/* level */
	FRESH();
	expect_invalid(&f, "leaf where the parent wants level 1", b, at, gen, 1, &first, "level");
	((struct btrfs_header *)b)->level = BTRFS_MAX_LEVEL;
	block_csum(b);
	expect_invalid(&f, "level 8", b, at, gen, -1, NULL, "level");
	((struct btrfs_header *)b)->level = 0xff;
	block_csum(b);
	expect_invalid(&f, "level 255", b, at, gen, -1, NULL, "level");
	expect_invalid(&f, "root node where a leaf is wanted", f.block[ROOT_IDX],
		       f.bytenr[ROOT_IDX], ROOT_GEN, 0, NULL, "level");

	/* generation */
	FRESH();
	expect_invalid(&f, "newer generation than the parent's", b, at, gen + 1, 0, &first,
		       "generation");
	expect_invalid(&f, "older generation than the parent's", b, at, gen - 1, 0, &first,
		       "generation");

	/* nritems */
	FRESH();
	btrfs_set_header_nritems((struct btrfs_header *)b, DATA_SIZE / sizeof(struct btrfs_item) + 1);
	block_csum(b);
	expect_invalid(&f, "more items than fit a leaf", b, at, gen, 0, &first, "too many|items");
	btrfs_set_header_nritems((struct btrfs_header *)b, 0xffffffffU);
	block_csum(b);
	expect_invalid(&f, "nritems 2^32-1", b, at, gen, 0, &first, "too many|items");
	FRESH();
	btrfs_set_header_nritems((struct btrfs_header *)b, leaf_counts[L] + 1);
	block_csum(b);
	expect_invalid(&f, "one item more than written", b, at, gen, 0, &first,
		       "outside|contiguous|overlap|order");

	/* item bounds */
	FRESH();
	btrfs_set_item_offset(leaf_item_at(b, 0), DATA_SIZE + 1);
	block_csum(b);
	expect_invalid(&f, "item offset past the leaf", b, at, gen, 0, &first, "outside");
	FRESH();
	btrfs_set_item_size(leaf_item_at(b, 0), btrfs_item_size(leaf_item_at(b, 0)) + 1);
	block_csum(b);
	expect_invalid(&f, "item data past the end", b, at, gen, 0, &first, "outside");
	FRESH();
	btrfs_set_item_offset(leaf_item_at(b, 5), 0xfffffff0U);
	block_csum(b);
	expect_invalid(&f, "item offset near 2^32", b, at, gen, 0, &first, "outside");
	FRESH();
	btrfs_set_item_size(leaf_item_at(b, 5), 0xfffffff0U);
	block_csum(b);
	expect_invalid(&f, "item size near 2^32", b, at, gen, 0, &first, "outside");

	/* overlapping items: item 6 reaches one byte into item 5 */
	FRESH();
	btrfs_set_item_offset(leaf_item_at(b, 6), btrfs_item_offset(leaf_item_at(b, 6)) + 1);
	block_csum(b);
	expect_invalid(&f, "items overlapping", b, at, gen, 0, &first, "overlap|contiguous");
	FRESH();
	btrfs_set_item_offset(leaf_item_at(b, 6), btrfs_item_offset(leaf_item_at(b, 5)));
	btrfs_set_item_size(leaf_item_at(b, 6), btrfs_item_size(leaf_item_at(b, 5)));
	block_csum(b);
	expect_invalid(&f, "two items sharing their data", b, at, gen, 0, &first,
		       "overlap|contiguous");

	/* item headers running into the item data */
	{
		struct btrfs_key k0 = key_of(0), k1 = key_of(1);
		u32 size0 = DATA_SIZE - 30;

		header_init(b, at, gen, 2, 0);
		btrfs_cpu_to_disk_key(&leaf_item_at(b, 0)->key, &k0);
		btrfs_set_item_offset(leaf_item_at(b, 0), DATA_SIZE - size0);
		btrfs_set_item_size(leaf_item_at(b, 0), size0);
		btrfs_cpu_to_disk_key(&leaf_item_at(b, 1)->key, &k1);
		btrfs_set_item_offset(leaf_item_at(b, 1), 20);
		btrfs_set_item_size(leaf_item_at(b, 1), 10);
		block_csum(b);
		expect_invalid(&f, "item headers over item data", b, at, gen, 0, NULL, "overlap");
	}

	/* key order in a leaf */
	FRESH();
	{
		struct btrfs_disk_key tmp = leaf_item_at(b, 3)->key;

		leaf_item_at(b, 3)->key = leaf_item_at(b, 4)->key;
		leaf_item_at(b, 4)->key = tmp;
	}
	block_csum(b);
	expect_invalid(&f, "leaf keys swapped", b, at, gen, 0, &first, "order");
	FRESH();
	leaf_item_at(b, 9)->key = leaf_item_at(b, 8)->key;
	block_csum(b);
	expect_invalid(&f, "duplicate leaf key", b, at, gen, 0, &first, "order");
	FRESH();
	leaf_item_at(b, leaf_counts[L] - 1)->key.type = 0;
	put_le64(&leaf_item_at(b, leaf_counts[L] - 1)->key.objectid, 1);
	block_csum(b);
	expect_invalid(&f, "last key smallest", b, at, gen, 0, &first, "order");

	/* first key against the parent's pointer */
	FRESH();
	{
		struct btrfs_key other = key_of(leaf_first(L) + 1);

		expect_invalid(&f, "first key differs from the parent's", b, at, gen, 0, &other,
			       "first key|key differs|parent");
		other = first;
		other.offset++;
		expect_invalid(&f, "first key off by one", b, at, gen, 0, &other,
			       "first key|key differs|parent");
	}

	/* internal nodes */
	memcpy(b, f.block[ROOT_IDX], NODESIZE);
	btrfs_set_header_nritems((struct btrfs_header *)b, 0);
	block_csum(b);
	expect_invalid(&f, "internal node with no pointers", b, f.bytenr[ROOT_IDX], ROOT_GEN, 1,
		       NULL, "empty|no items|0 items");
	btrfs_set_header_nritems((struct btrfs_header *)b,
				 DATA_SIZE / sizeof(struct btrfs_key_ptr) + 1);
	block_csum(b);
	expect_invalid(&f, "more pointers than fit a node", b, f.bytenr[ROOT_IDX], ROOT_GEN, 1,
		       NULL, "too many|pointers");
	memcpy(b, f.block[ROOT_IDX], NODESIZE);
	{
		struct btrfs_disk_key tmp = key_ptr_at(b, 2)->key;

		key_ptr_at(b, 2)->key = key_ptr_at(b, 3)->key;
		key_ptr_at(b, 3)->key = tmp;
	}
	block_csum(b);
	expect_invalid(&f, "node keys swapped", b, f.bytenr[ROOT_IDX], ROOT_GEN, 1, NULL, "order");
	memcpy(b, f.block[ROOT_IDX], NODESIZE);
	key_ptr_at(b, 6)->key = key_ptr_at(b, 5)->key;
	block_csum(b);
	expect_invalid(&f, "duplicate node key", b, f.bytenr[ROOT_IDX], ROOT_GEN, 1, NULL, "order");
	memcpy(b, f.block[ROOT_IDX], NODESIZE);
	btrfs_set_key_ptr_blockptr(key_ptr_at(b, 4), f.bytenr[4] + 512);
	block_csum(b);
	expect_invalid(&f, "unaligned child pointer", b, f.bytenr[ROOT_IDX], ROOT_GEN, 1, NULL,
		       "unaligned|align");
	memcpy(b, f.block[ROOT_IDX], NODESIZE);
	expect_invalid(&f, "node first key differs", b, f.bytenr[ROOT_IDX], ROOT_GEN, 1,
		       &(struct btrfs_key){ 1, 1, 1 }, "first key|key differs|parent");
	expect_invalid(&f, "node generation differs", b, f.bytenr[ROOT_IDX], ROOT_GEN + 1, 1, NULL,
		       "generation");
#undef FRESH
	free(b);
	fixture_teardown(&f);
}

/* ---- search and iteration ------------------------------------------------ */

/* Index of the first item with a key > @k (NITEMS if none). */
static u32 first_after(const struct btrfs_key *k)
{
	u32 i = 0;

	while (i < NITEMS) {
		struct btrfs_key ki = key_of(i);

		if (btrfs_comp_keys(&ki, k) > 0)
			break;
		i++;
	}
	return i;
}

static void test_search_present(void)
{
	struct fixture f;
	struct tree_path path;
	u32 bad = 0;

	if (!fixture_start(&f, 64 * NODESIZE))
		return;
	tree_path_init(&path);
	for (u32 i = 0; i < NITEMS; i++) {
		struct btrfs_key k = key_of(i);
		int ret = tree_search(&f.cache, &f.root, &k, &path);

		if (ret != 0 || !path_at_item(&f, &path, i)) {
			if (bad++ < 5)
				fprintf(stderr, "tree_search item %u: ret %d\n", i, ret);
		}
		ret = tree_search_forward(&f.cache, &f.root, &k, &path);
		if (ret != 0 || !path_at_item(&f, &path, i))
			bad++;
		ret = tree_search_backward(&f.cache, &f.root, &k, &path);
		if (ret != 0 || !path_at_item(&f, &path, i))
			bad++;
	}
	CHECK_EQ_U64(bad, 0);
	tree_path_release(&f.cache, &path);
	/* only blocks of the tree were read: root and leaves, each once */
	CHECK_EQ_U64(f.cache.misses, NLEAVES + 1);
	CHECK(f.cache.hits > 0);
	CHECK_EQ_U64(f.cache.bytes, (NLEAVES + 1) * NODESIZE);
	CHECK_EQ_U64(f.cap.errors, 0);
	fixture_teardown(&f);
}

/* Keys that are not in the tree: before, between (inside a leaf and between leaves), after. */
static void test_search_absent(void)
{
	struct fixture f;
	struct tree_path path;
	struct btrfs_key probes[64];
	u32 nprobes = 0, bad = 0;

	if (!fixture_start(&f, 64 * NODESIZE))
		return;
	probes[nprobes++] = (struct btrfs_key){ 0, 0, 0 };
	probes[nprobes++] = (struct btrfs_key){ 299, 255, UINT64_MAX };
	probes[nprobes++] = (struct btrfs_key){ 300, 0, 0 };
	probes[nprobes++] = (struct btrfs_key){ 300, BTRFS_INODE_ITEM_KEY, 1 };
	probes[nprobes++] = (struct btrfs_key){ 300, 50, 0 };
	probes[nprobes++] = (struct btrfs_key){ 301, 0, 0 };
	probes[nprobes++] = (struct btrfs_key){ UINT64_MAX, 255, UINT64_MAX };
	probes[nprobes++] = (struct btrfs_key){ 1000, 0, 0 };
	for (u32 k = 1; k < NLEAVES; k++) {
		/* just after the last key of leaf k-1, and just before the first of leaf k */
		struct btrfs_key last = key_of(leaf_first(k) - 1), next = key_of(leaf_first(k));

		last.offset++;
		probes[nprobes++] = last;
		next.offset--;
		probes[nprobes++] = next;
	}
	{
		struct btrfs_key end = key_of(NITEMS - 1);

		end.offset++;
		probes[nprobes++] = end;
	}
	tree_path_init(&path);
	for (u32 p = 0; p < nprobes; p++) {
		const struct btrfs_key *k = &probes[p];
		u32 j = first_after(k);
		int ret = tree_search(&f.cache, &f.root, k, &path);

		/* plain search: not found, positioned where the key would go */
		if (ret != 1) {
			bad++;
			fprintf(stderr, "probe %u: tree_search returned %d\n", p, ret);
			continue;
		}
		{
			/* the leaf is the last one whose first key is <= the probe */
			u32 leaf = 0, slot;

			while (leaf + 1 < NLEAVES) {
				struct btrfs_key lf = key_of(leaf_first(leaf + 1));

				if (btrfs_comp_keys(&lf, k) > 0)
					break;
				leaf++;
			}
			slot = j - leaf_first(leaf);
			if (path.nodes[0]->bytenr != f.bytenr[leaf] || path.slots[0] != slot) {
				bad++;
				fprintf(stderr, "probe %u: leaf %llu slot %u, want %llu slot %u\n", p,
					(unsigned long long)path.nodes[0]->bytenr, path.slots[0],
					(unsigned long long)f.bytenr[leaf], slot);
			}
		}

		ret = tree_search_forward(&f.cache, &f.root, k, &path);
		if (j < NITEMS) {
			if (ret != 0 || !path_at_item(&f, &path, j)) {
				bad++;
				fprintf(stderr, "probe %u: forward ret %d, want item %u\n", p, ret, j);
			}
		} else if (ret != 1) {
			bad++;
			fprintf(stderr, "probe %u: forward ret %d, want 1\n", p, ret);
		}

		ret = tree_search_backward(&f.cache, &f.root, k, &path);
		if (j > 0) {
			if (ret != 0 || !path_at_item(&f, &path, j - 1)) {
				bad++;
				fprintf(stderr, "probe %u: backward ret %d, want item %u\n", p, ret,
					j - 1);
			}
		} else if (ret != 1) {
			bad++;
			fprintf(stderr, "probe %u: backward ret %d, want 1\n", p, ret);
		}

		if (tree_lookup_item(&f.cache, &f.root, k, NULL, 0) != -ENOENT)
			bad++;
	}
	CHECK_EQ_U64(bad, 0);
	tree_path_release(&f.cache, &path);
	fixture_teardown(&f);
}

static void test_iterate(void)
{
	struct fixture f;
	struct tree_path path;
	struct btrfs_key k;
	u32 i, bad = 0;
	int ret;

	if (!fixture_start(&f, 64 * NODESIZE))
		return;
	tree_path_init(&path);

	/* forward from the very first key */
	k = (struct btrfs_key){ 0, 0, 0 };
	CHECK_EQ_U64(tree_search_forward(&f.cache, &f.root, &k, &path), 0);
	for (i = 0;; i++) {
		if (!path_at_item(&f, &path, i) && bad++ < 5)
			fprintf(stderr, "forward walk: not at item %u\n", i);
		ret = tree_next_item(&f.cache, &path);
		if (ret != 0)
			break;
	}
	CHECK_EQ_U64(ret, 1);
	CHECK_EQ_U64(i, NITEMS - 1);
	/* at the end it stays at the end */
	CHECK_EQ_U64(tree_next_item(&f.cache, &path), 1);

	/* backward from the very last key */
	k = (struct btrfs_key){ UINT64_MAX, 255, UINT64_MAX };
	CHECK_EQ_U64(tree_search_backward(&f.cache, &f.root, &k, &path), 0);
	for (i = NITEMS - 1;; i--) {
		if (!path_at_item(&f, &path, i) && bad++ < 5)
			fprintf(stderr, "backward walk: not at item %u\n", i);
		ret = tree_prev_item(&f.cache, &path);
		if (ret != 0 || i == 0)
			break;
	}
	CHECK_EQ_U64(ret, 1);
	CHECK_EQ_U64(i, 0);
	CHECK_EQ_U64(tree_prev_item(&f.cache, &path), 1);

	/* back and forth across every leaf boundary */
	for (u32 leaf = 1; leaf < NLEAVES; leaf++) {
		u32 first = leaf_first(leaf);

		k = key_of(first);
		CHECK_EQ_U64(tree_search(&f.cache, &f.root, &k, &path), 0);
		CHECK_EQ_U64(tree_prev_item(&f.cache, &path), 0);
		CHECK(path_at_item(&f, &path, first - 1));
		CHECK_EQ_U64(tree_next_item(&f.cache, &path), 0);
		CHECK(path_at_item(&f, &path, first));
		CHECK_EQ_U64(tree_next_item(&f.cache, &path), 0);
		CHECK(path_at_item(&f, &path, first + 1));
	}
	CHECK_EQ_U64(bad, 0);
	tree_path_release(&f.cache, &path);
	for (u32 l = 0; l < BTRFS_MAX_LEVEL; l++)
		CHECK(path.nodes[l] == NULL);
	fixture_teardown(&f);
}

static void test_lookup_item(void)
{
	struct fixture f;
	u8 buf[64], expect[64];

	if (!fixture_start(&f, 64 * NODESIZE))
		return;
	for (u32 i = 0; i < NITEMS; i += 7) {
		struct btrfs_key k = key_of(i);
		int ret;

		memset(buf, 0xee, sizeof(buf));
		ret = tree_lookup_item(&f.cache, &f.root, &k, buf, sizeof(buf));
		item_fill(expect, i);
		CHECK_EQ_U64(ret, item_size_of(i));
		CHECK_MEM(buf, expect, item_size_of(i));
		CHECK(buf[item_size_of(i)] == 0xee);

		/* a short buffer gets the start of the item and the full size back */
		memset(buf, 0xee, sizeof(buf));
		ret = tree_lookup_item(&f.cache, &f.root, &k, buf, 5);
		CHECK_EQ_U64(ret, item_size_of(i));
		CHECK_MEM(buf, expect, 5);
		CHECK(buf[5] == 0xee);
	}
	{
		struct btrfs_key k = { 301, BTRFS_INODE_ITEM_KEY, 0 };

		CHECK(tree_lookup_item(&f.cache, &f.root, &k, buf, sizeof(buf)) == -ENOENT);
	}
	fixture_teardown(&f);
}

/* A tree that is a single leaf (level 0 root). */
static void test_leaf_root(void)
{
	struct fixture f;
	struct tree_path path;
	struct tree_root r;
	struct btrfs_key k;
	u32 first = leaf_first(3);

	if (!fixture_start(&f, 64 * NODESIZE))
		return;
	r.objectid = OWNER;
	r.bytenr = f.bytenr[3];
	r.generation = f.gen[3];
	r.level = 0;
	tree_path_init(&path);
	k = key_of(first + 4);
	CHECK_EQ_U64(tree_search(&f.cache, &r, &k, &path), 0);
	CHECK(path.nodes[1] == NULL);
	CHECK_EQ_U64(path.slots[0], 4);
	k = key_of(first);
	CHECK_EQ_U64(tree_search(&f.cache, &r, &k, &path), 0);
	CHECK_EQ_U64(tree_prev_item(&f.cache, &path), 1);
	k = key_of(first + leaf_counts[3] - 1);
	CHECK_EQ_U64(tree_search(&f.cache, &r, &k, &path), 0);
	CHECK_EQ_U64(tree_next_item(&f.cache, &path), 1);
	k = key_of(first + leaf_counts[3]);
	CHECK_EQ_U64(tree_search_forward(&f.cache, &r, &k, &path), 1);
	tree_path_release(&f.cache, &path);

	/* an empty root leaf: nothing found, nothing to walk */
	{
		u8 *leaf = f.block[0];
		u64 at = CHUNK_LOGICAL + 20 * NODESIZE;

		header_init(leaf, at, 7, 0, 0);
		block_csum(leaf);
		write_block(&f, at, leaf, 3);
		r.bytenr = at;
		r.generation = 7;
		k = key_of(0);
		CHECK_EQ_U64(tree_search(&f.cache, &r, &k, &path), 1);
		CHECK_EQ_U64(path.slots[0], 0);
		CHECK_EQ_U64(tree_search_forward(&f.cache, &r, &k, &path), 1);
		CHECK_EQ_U64(tree_search_backward(&f.cache, &r, &k, &path), 1);
		tree_path_release(&f.cache, &path);
	}
	fixture_teardown(&f);
}

/* ---- reading damaged trees ----------------------------------------------- */

static void test_read_damaged(void)
{
	struct fixture f;
	struct tree_path path;
	u8 *b = malloc(NODESIZE);
	struct btrfs_key k;

	if (!b || fixture_setup(&f, 64 * NODESIZE)) {
		CHECK(0);
		free(b);
		fixture_teardown(&f);
		return;
	}
	tree_path_init(&path);

	/* copy 1 of leaf 3 is bad: copy 2 serves, and the bad copy is reported */
	memcpy(b, f.block[3], NODESIZE);
	b[700] ^= 0x10;
	write_block(&f, f.bytenr[3], b, 1);
	k = key_of(leaf_first(3) + 2);
	CHECK_EQ_U64(tree_search(&f.cache, &f.root, &k, &path), 0);
	CHECK(path_at_item(&f, &path, leaf_first(3) + 2));
	CHECK(f.cap.warnings > 0);
	CHECK_EQ_U64(f.cap.errors, 0);
	tree_path_release(&f.cache, &path);

	/* both copies of leaf 4 bad: -EIO, and the path holds nothing */
	memcpy(b, f.block[4], NODESIZE);
	b[NODESIZE - 3] ^= 0x01;
	write_block(&f, f.bytenr[4], b, 3);
	k = key_of(leaf_first(4) + 1);
	CHECK(tree_search(&f.cache, &f.root, &k, &path) == -EIO);
	for (u32 l = 0; l < BTRFS_MAX_LEVEL; l++)
		CHECK(path.nodes[l] == NULL);
	CHECK(tree_lookup_item(&f.cache, &f.root, &k, b, 8) == -EIO);
	CHECK(f.cap.errors > 0);
	/* the neighbours are still readable */
	k = key_of(leaf_first(5));
	CHECK_EQ_U64(tree_search(&f.cache, &f.root, &k, &path), 0);
	CHECK(path_at_item(&f, &path, leaf_first(5)));
	/* a walk runs into the bad leaf and stops with the error */
	k = key_of(leaf_first(4) - 1);
	CHECK_EQ_U64(tree_search(&f.cache, &f.root, &k, &path), 0);
	CHECK(tree_next_item(&f.cache, &path) == -EIO);
	tree_path_release(&f.cache, &path);
	k = key_of(leaf_first(5));
	CHECK_EQ_U64(tree_search(&f.cache, &f.root, &k, &path), 0);
	CHECK(tree_prev_item(&f.cache, &path) == -EIO);
	tree_path_release(&f.cache, &path);

	/* the root names the generation or the level wrong */
	{
		struct tree_root r = f.root;

		r.generation = ROOT_GEN + 1;
		k = key_of(0);
		CHECK(tree_search(&f.cache, &r, &k, &path) == -EIO);
		r = f.root;
		r.level = 2;
		CHECK(tree_search(&f.cache, &r, &k, &path) == -EIO);
		tree_path_release(&f.cache, &path);
	}
	fixture_teardown(&f);
	free(b);
}

/* The parent's pointer disagrees with a good child: generation, first key, level. */
static void test_parent_mismatch(void)
{
	struct fixture f;
	struct tree_path path;
	struct btrfs_key k;

	if (!fixture_start(&f, 64 * NODESIZE))
		return;
	tree_path_init(&path);

	/* pointer to leaf 1 promises another generation (a lost write) */
	f.gen[1]++;
	rebuild_root(&f);
	f.gen[1]--;
	/* pointer to leaf 5 names a first key the leaf does not start with */
	{
		struct btrfs_key moved = key_of(leaf_first(5));

		moved.offset++;
		set_ptr(f.block[ROOT_IDX], 5, &moved, f.bytenr[5], f.gen[5]);
	}
	/* pointer to leaf 6 leads to the root itself (a level-1 node where a leaf belongs) */
	{
		struct btrfs_key first6 = key_of(leaf_first(6));

		set_ptr(f.block[ROOT_IDX], 6, &first6, f.bytenr[ROOT_IDX], ROOT_GEN);
	}
	block_csum(f.block[ROOT_IDX]);
	write_block(&f, f.bytenr[ROOT_IDX], f.block[ROOT_IDX], 3);

	k = key_of(leaf_first(1) + 3);
	CHECK(tree_search(&f.cache, &f.root, &k, &path) == -EIO);
	k = key_of(leaf_first(5) + 1);
	CHECK(tree_search(&f.cache, &f.root, &k, &path) == -EIO);
	k = key_of(leaf_first(6) + 1);
	CHECK(tree_search(&f.cache, &f.root, &k, &path) == -EIO);
	/* the leaves the root describes correctly still work */
	k = key_of(leaf_first(2) + 1);
	CHECK_EQ_U64(tree_search(&f.cache, &f.root, &k, &path), 0);
	CHECK(path_at_item(&f, &path, leaf_first(2) + 1));
	k = key_of(0);
	CHECK_EQ_U64(tree_search(&f.cache, &f.root, &k, &path), 0);
	CHECK(path_at_item(&f, &path, 0));
	/* walking from leaf 0 into leaf 1 meets the bad pointer */
	k = key_of(leaf_first(1) - 1);
	CHECK_EQ_U64(tree_search(&f.cache, &f.root, &k, &path), 0);
	CHECK(tree_next_item(&f.cache, &path) == -EIO);
	tree_path_release(&f.cache, &path);
	fixture_teardown(&f);

	/* a cached good leaf is still refused through a pointer that disagrees */
	if (!fixture_start(&f, 64 * NODESIZE))
		return;
	{
		struct tree_node *n = NULL;
		struct btrfs_key first = key_of(leaf_first(2));

		CHECK_EQ_U64(node_read(&f.cache, f.bytenr[2], f.gen[2], 0, &first, &n), 0);
		node_put(&f.cache, n);
		CHECK(node_read(&f.cache, f.bytenr[2], f.gen[2] + 1, 0, &first, &n) == -EIO);
		CHECK(node_read(&f.cache, f.bytenr[2], f.gen[2], 1, &first, &n) == -EIO);
		first.offset++;
		CHECK(node_read(&f.cache, f.bytenr[2], f.gen[2], 0, &first, &n) == -EIO);
		/* and an address no chunk maps */
		CHECK(node_read(&f.cache, 4 * MIB, 0, -1, NULL, &n) < 0);
	}
	fixture_teardown(&f);
}

/*
 * Leaf 3 rewritten to hold its own items and the first five of leaf 4 (checksum
 * good, first key as the root says): alone it validates, but it reaches past
 * the root's next key. A search that lands in it must fail, whichever key it
 * looks for; before the check, one that started past the overlap (in leaf 4)
 * could go on as if nothing were wrong, and one that started in leaf 3 saw the
 * damage only when it crossed into leaf 4.
 */
static void test_subtree_past_next_key(void)
{
	struct fixture f;
	struct tree_path path;
	struct btrfs_key k;

	if (!fixture_start(&f, 64 * NODESIZE))
		return;
	build_leaf(f.block[3], f.bytenr[3], f.gen[3], leaf_first(3), leaf_counts[3] + 5);
	write_block(&f, f.bytenr[3], f.block[3], 3);
	tree_path_init(&path);

	k = key_of(leaf_first(3) + 1);
	CHECK(tree_search(&f.cache, &f.root, &k, &path) == -EUCLEAN);
	CHECK(tree_lookup_item(&f.cache, &f.root, &k, NULL, 0) == -EUCLEAN);
	/* walking forward from leaf 2 into leaf 3 */
	k = key_of(leaf_first(3) - 1);
	CHECK_EQ_U64(tree_search(&f.cache, &f.root, &k, &path), 0);
	CHECK(tree_next_item(&f.cache, &path) == -EUCLEAN);
	/* walking back from leaf 4 into leaf 3 */
	k = key_of(leaf_first(4));
	CHECK_EQ_U64(tree_search(&f.cache, &f.root, &k, &path), 0);
	CHECK(tree_prev_item(&f.cache, &path) == -EUCLEAN);
	/* the other leaves still read */
	k = key_of(leaf_first(4) + 7);
	CHECK_EQ_U64(tree_search(&f.cache, &f.root, &k, &path), 0);
	CHECK(path_at_item(&f, &path, leaf_first(4) + 7));
	CHECK(f.cap.errors > 0);
	tree_path_release(&f.cache, &path);
	fixture_teardown(&f);
}

/* ---- the node cache ------------------------------------------------------ */

static int read_put(struct fixture *f, u32 idx)
{
	struct tree_node *n = NULL;
	int ret = node_read(&f->cache, f->bytenr[idx], f->gen[idx], idx == ROOT_IDX ? 1 : 0,
			    NULL, &n);

	if (ret == 0) {
		if (n->bytenr != f->bytenr[idx] || n->generation != f->gen[idx] ||
		    memcmp(n->data, f->block[idx], NODESIZE) != 0)
			ret = -EINVAL;
		node_put(&f->cache, n);
	}
	return ret;
}

static void test_cache_eviction(void)
{
	struct fixture f;
	const u64 limit = 3 * NODESIZE;
	struct tree_node *held[NLEAVES + 1];
	u64 hits, misses;

	if (!fixture_start(&f, limit))
		return;
	CHECK_EQ_U64(f.cache.hits, 0);
	CHECK_EQ_U64(f.cache.misses, 0);

	/* first read: a miss; again: a hit */
	CHECK_EQ_U64(read_put(&f, 0), 0);
	CHECK_EQ_U64(f.cache.misses, 1);
	CHECK_EQ_U64(f.cache.hits, 0);
	CHECK_EQ_U64(read_put(&f, 0), 0);
	CHECK_EQ_U64(f.cache.misses, 1);
	CHECK_EQ_U64(f.cache.hits, 1);
	CHECK_EQ_U64(f.cache.bytes, NODESIZE);

	/* leaves 1, 2, 3 push leaf 0 (least recently used) out */
	for (u32 k = 1; k <= 3; k++) {
		CHECK_EQ_U64(read_put(&f, k), 0);
		CHECK(f.cache.bytes <= limit);
	}
	CHECK_EQ_U64(f.cache.misses, 4);
	hits = f.cache.hits;
	CHECK_EQ_U64(read_put(&f, 3), 0);   /* most recent: still there */
	CHECK_EQ_U64(read_put(&f, 1), 0);   /* oldest survivor: still there */
	CHECK_EQ_U64(f.cache.hits, hits + 2);
	CHECK_EQ_U64(f.cache.misses, 4);
	CHECK_EQ_U64(read_put(&f, 0), 0);   /* was evicted: read again */
	CHECK_EQ_U64(f.cache.misses, 5);
	CHECK(f.cache.bytes <= limit);
	/* using 1 made 2 the least recent, so reading 0 evicted 2 */
	misses = f.cache.misses;
	CHECK_EQ_U64(read_put(&f, 1), 0);
	CHECK_EQ_U64(read_put(&f, 3), 0);
	CHECK_EQ_U64(f.cache.misses, misses);
	CHECK_EQ_U64(read_put(&f, 2), 0);
	CHECK_EQ_U64(f.cache.misses, misses + 1);

	/* referenced nodes are never evicted, even past the limit */
	for (u32 k = 0; k <= NLEAVES; k++) {
		held[k] = NULL;
		CHECK_EQ_U64(node_read(&f.cache, f.bytenr[k], f.gen[k], k == ROOT_IDX ? 1 : 0, NULL,
				       &held[k]),
			     0);
	}
	CHECK_EQ_U64(f.cache.bytes, (NLEAVES + 1) * NODESIZE);
	for (u32 k = 0; k <= NLEAVES; k++) {
		CHECK(held[k] != NULL);
		if (held[k])
			CHECK_MEM(held[k]->data, f.block[k], NODESIZE);
	}
	/* node_get takes a second reference (no lookup, no hit) that keeps a node alive */
	hits = f.cache.hits;
	node_get(&f.cache, held[5]);
	for (u32 k = 0; k <= NLEAVES; k++) {
		node_put(&f.cache, held[k]);
		if (k < NLEAVES)
			CHECK(f.cache.bytes >= 2 * NODESIZE); /* held[5] and later ones */
	}
	CHECK(f.cache.bytes <= limit);
	CHECK_EQ_U64(held[5]->refs, 1);
	CHECK_MEM(held[5]->data, f.block[5], NODESIZE);
	node_put(&f.cache, held[5]);
	CHECK(f.cache.bytes <= limit);
	CHECK_EQ_U64(f.cache.hits, hits);

	/* a full walk through a cache that holds three nodes */
	{
		struct tree_path path;
		struct btrfs_key k = { 0, 0, 0 };
		u32 count = 0;

		tree_path_init(&path);
		CHECK_EQ_U64(tree_search_forward(&f.cache, &f.root, &k, &path), 0);
		do {
			CHECK(path_at_item(&f, &path, count));
			count++;
		} while (tree_next_item(&f.cache, &path) == 0);
		CHECK_EQ_U64(count, NITEMS);
		tree_path_release(&f.cache, &path);
		CHECK(f.cache.bytes <= limit);
	}
	fixture_teardown(&f);
}

/* With a limit of 0 nothing stays once released. */
static void test_cache_zero_limit(void)
{
	struct fixture f;

	if (!fixture_start(&f, 0))
		return;
	for (u32 round = 0; round < 2; round++)
		for (u32 k = 0; k <= NLEAVES; k++) {
			CHECK_EQ_U64(read_put(&f, k), 0);
			CHECK_EQ_U64(f.cache.bytes, 0);
		}
	CHECK_EQ_U64(f.cache.misses, 2 * (NLEAVES + 1));
	CHECK_EQ_U64(f.cache.hits, 0);
	{
		struct btrfs_key k = key_of(123);
		u8 buf[64];

		CHECK_EQ_U64(tree_lookup_item(&f.cache, &f.root, &k, buf, sizeof(buf)),
			     item_size_of(123));
		CHECK_EQ_U64(f.cache.bytes, 0);
	}
	fixture_teardown(&f);
}

int main(void)
{
	RUN(test_validate_good);
	RUN(test_validate_corrupt);
	RUN(test_search_present);
	RUN(test_search_absent);
	RUN(test_iterate);
	RUN(test_lookup_item);
	RUN(test_leaf_root);
	RUN(test_read_damaged);
	RUN(test_parent_mismatch);
	RUN(test_subtree_past_next_key);
	RUN(test_cache_eviction);
	RUN(test_cache_zero_limit);
	return check_summary();
}
