/*
 * test_chunkmap.c — the chunk map (lib/volumes/volumes.c): logical → physical
 * for every profile, copy counts, rejection of bad chunk items, and reads
 * through memory devices including RAID5/6 rebuilds.
 *
 * The expected layout is computed here from the published btrfs rules, not
 * from the library:
 *   single, dup, raid1, raid1c3, raid1c4  every stripe holds the whole chunk;
 *                                         mirror m is stripe m-1.
 *   raid0    stripe units (stripe_len = 64 KiB) are dealt to the stripes in
 *            turn: unit u goes to stripe u % n, at that stripe's next free
 *            unit.
 *   raid10   n / sub_stripes groups of sub_stripes (2) mirrors; unit u goes to
 *            group u % groups, every mirror of the group at its next unit;
 *            mirror m is the m-th member of the group.
 *   raid5/6  rows of ndata = n - nparity units; data unit d of row r lives on
 *            stripe (r + d) % n, P on (r + ndata) % n, Q on
 *            (r + ndata + 1) % n, all at unit r of their stripe.
 * The layout is simulated unit by unit (a cursor per stripe), so the test
 * does not share the library's division arithmetic.
 *
 * Parity for the end-to-end part is computed here too: P is the XOR of the
 * data units of a row, Q = sum g^d·Dd in GF(2^8) (poly 0x11d, g = 2) with a
 * bitwise multiply.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "device/device.h"
#include "format/ondisk.h"
#include "volumes/volumes.h"

#define SLEN BTRFS_STRIPE_LEN
#define SECTOR 4096ULL
#define MAX_STRIPES 8
#define MIB (1024ULL * 1024)

static const struct blog quiet = { NULL, NULL, BUTTER_LOG_ERROR };

/* ---- building chunk items ---------------------------------------------- */

struct chunk_item {
	union {
		struct btrfs_chunk c;
		u8 raw[sizeof(struct btrfs_chunk) + (MAX_STRIPES - 1) * sizeof(struct btrfs_stripe)];
	} u;
	u32 size;
};

static struct btrfs_stripe *item_stripe(struct chunk_item *ci, u32 i)
{
	return (struct btrfs_stripe *)(ci->u.raw + offsetof(struct btrfs_chunk, stripe) +
				       i * sizeof(struct btrfs_stripe));
}

/* Fill @ci as a chunk of @n stripes; stripe i on devid devids[i] at phys[i]. */
static void chunk_build(struct chunk_item *ci, u64 length, u64 type, u32 n, u32 sub,
			u64 stripe_len, const u64 *devids, const u64 *phys)
{
	memset(ci, 0, sizeof(*ci));
	btrfs_set_chunk_length(&ci->u.c, length);
	btrfs_set_chunk_owner(&ci->u.c, BTRFS_EXTENT_TREE_OBJECTID);
	btrfs_set_chunk_stripe_len(&ci->u.c, stripe_len);
	btrfs_set_chunk_type(&ci->u.c, type);
	btrfs_set_chunk_sector_size(&ci->u.c, 4096);
	btrfs_set_chunk_num_stripes(&ci->u.c, (u16)n);
	btrfs_set_chunk_sub_stripes(&ci->u.c, (u16)sub);
	for (u32 i = 0; i < n && i < MAX_STRIPES; i++) {
		struct btrfs_stripe *s = item_stripe(ci, i);

		btrfs_set_stripe_devid(s, devids[i]);
		btrfs_set_stripe_offset(s, phys[i]);
		memset(s->dev_uuid, (int)devids[i], BTRFS_UUID_SIZE);
	}
	ci->size = n ? (u32)btrfs_chunk_item_size(n) : (u32)sizeof(struct btrfs_chunk);
}

static void vol_init(struct btrfs_volumes *vol, const struct blog *log)
{
	memset(vol, 0, sizeof(*vol));
	vol->log = log;
	vol->sectorsize = 4096;
	vol->nodesize = 16384;
	vol->csum_type = BTRFS_CSUM_TYPE_CRC32;
	vol->csum_size = 4;
}

/* ---- the reference layout ---------------------------------------------- */

enum kind { K_MIRROR, K_RAID0, K_RAID10, K_RAID5, K_RAID6 };

struct profile {
	const char *name;
	u64 type;
	u32 n, sub;
	u32 rows;       /* striped: stripe units per stripe; mirror: length in 64K units */
	int copies;     /* what volumes_num_copies must say */
};

static enum kind kind_of(u64 type)
{
	if (type & BTRFS_BLOCK_GROUP_RAID0)
		return K_RAID0;
	if (type & BTRFS_BLOCK_GROUP_RAID10)
		return K_RAID10;
	if (type & BTRFS_BLOCK_GROUP_RAID5)
		return K_RAID5;
	if (type & BTRFS_BLOCK_GROUP_RAID6)
		return K_RAID6;
	return K_MIRROR;
}

/* Data units per row of the striped profiles. */
static u32 data_width(const struct profile *p)
{
	switch (kind_of(p->type)) {
	case K_RAID0:
		return p->n;
	case K_RAID10:
		return p->n / p->sub;
	case K_RAID5:
		return p->n - 1;
	case K_RAID6:
		return p->n - 2;
	default:
		return 1;
	}
}

static u64 profile_length(const struct profile *p)
{
	return (u64)p->rows * data_width(p) * SLEN;
}

/* Where unit @u lives for each mirror: a stripe index and a unit offset in it. */
struct unit_place {
	u32 stripe[MAX_STRIPES];
	u64 off[MAX_STRIPES];
	int nmirrors;
};

/* Simulate the layout of a striped profile; returns a table of nunits places. */
static struct unit_place *simulate(const struct profile *p, u32 *nunits)
{
	u32 width = data_width(p), total = p->rows * width;
	struct unit_place *t = calloc(total ? total : 1, sizeof(*t));
	u64 cursor[MAX_STRIPES] = { 0 };

	if (!t)
		return NULL;
	for (u32 u = 0; u < total; u++) {
		switch (kind_of(p->type)) {
		case K_RAID0: {
			u32 s = u % p->n;

			t[u].stripe[0] = s;
			t[u].off[0] = cursor[s];
			t[u].nmirrors = 1;
			cursor[s] += SLEN;
			break;
		}
		case K_RAID10: {
			u32 g = u % width;

			t[u].nmirrors = (int)p->sub;
			for (u32 m = 0; m < p->sub; m++) {
				u32 s = g * p->sub + m;

				t[u].stripe[m] = s;
				t[u].off[m] = cursor[s];
				cursor[s] += SLEN;
			}
			break;
		}
		case K_RAID5:
		case K_RAID6: {
			u32 r = u / width, d = u % width;

			t[u].stripe[0] = (r + d) % p->n;
			t[u].off[0] = (u64)r * SLEN;
			t[u].nmirrors = 1;
			break;
		}
		default:
			break;
		}
	}
	*nunits = total;
	return t;
}

/* Physical start of stripe @i of profile case @ci (distinct, sector aligned, not 64K). */
static u64 case_phys(u32 ci, u32 i)
{
	return (u64)(i + 1) * 0x10000000ULL + (u64)ci * 0x1000000ULL + 3 * SECTOR;
}

static const struct profile profiles[] = {
	{ "single", BTRFS_BLOCK_GROUP_DATA, 1, 0, 37, 1 },
	{ "dup", BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_DUP, 2, 0, 16, 2 },
	{ "raid1", BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID1, 2, 0, 16, 2 },
	{ "raid1c3", BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID1C3, 3, 0, 16, 3 },
	{ "raid1c4", BTRFS_BLOCK_GROUP_SYSTEM | BTRFS_BLOCK_GROUP_RAID1C4, 4, 0, 16, 4 },
	{ "raid0x1", BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID0, 1, 0, 7, 1 },
	{ "raid0x2", BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID0, 2, 0, 7, 1 },
	{ "raid0x3", BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID0, 3, 0, 7, 1 },
	{ "raid0x5", BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_RAID0, 5, 0, 9, 1 },
	{ "raid10x2", BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID10, 2, 2, 7, 2 },
	{ "raid10x4", BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID10, 4, 2, 7, 2 },
	{ "raid10x6", BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID10, 6, 2, 8, 2 },
	{ "raid10x8", BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_RAID10, 8, 2, 5, 2 },
	{ "raid5x2", BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID5, 2, 0, 7, 2 },
	{ "raid5x3", BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID5, 3, 0, 7, 2 },
	{ "raid5x4", BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID5, 4, 0, 9, 2 },
	{ "raid5x6", BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_RAID5, 6, 0, 13, 2 },
	{ "raid6x3", BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID6, 3, 0, 7, 3 },
	{ "raid6x4", BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID6, 4, 0, 9, 4 },
	{ "raid6x5", BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID6, 5, 0, 11, 5 },
	{ "raid6x7", BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_RAID6, 7, 0, 15, 7 },
};

#define NPROFILES (sizeof(profiles) / sizeof(profiles[0]))

/* Offsets into a stripe unit to probe: both edges and the inside. */
static const u64 unit_probes[] = { 0, 1, SECTOR - 1, SECTOR, SLEN / 2 + 7, SLEN - SECTOR,
				   SLEN - 1 };

/* Logical start of profile case @ci in the shared volume (gaps in between). */
static u64 case_logical(u32 ci)
{
	return 0x40000000ULL + (u64)ci * 0x4000000ULL;
}

static void add_profile(struct btrfs_volumes *vol, u32 ci)
{
	const struct profile *p = &profiles[ci];
	u64 devids[MAX_STRIPES], phys[MAX_STRIPES];
	struct chunk_item item;

	for (u32 i = 0; i < p->n; i++) {
		/* dup keeps both copies on one device */
		devids[i] = kind_of(p->type) == K_MIRROR && (p->type & BTRFS_BLOCK_GROUP_DUP) ? 1
											       : i + 1;
		phys[i] = case_phys(ci, i);
	}
	chunk_build(&item, profile_length(p), p->type, p->n, p->sub, SLEN, devids, phys);
	if (volumes_add_chunk(vol, case_logical(ci), &item.u.c, item.size) != 0) {
		fprintf(stderr, "add_profile %s failed\n", p->name);
		CHECK(0);
	}
}

static void check_mirror_profile(const struct chunk_map *map, u32 ci)
{
	const struct profile *p = &profiles[ci];
	u64 len = profile_length(p);
	const u64 probes[] = { 0, 1, SECTOR - 1, SECTOR, SLEN - 1, SLEN, SLEN + 5, len / 2,
			       len - SECTOR, len - 1 };

	for (size_t k = 0; k < sizeof(probes) / sizeof(probes[0]); k++) {
		for (int m = 1; m <= (int)p->n; m++) {
			u32 idx = 99;
			u64 phys = 0, cont = 0;
			int ret = chunk_map_position(map, probes[k], m, &idx, &phys, &cont);

			CHECK_EQ_U64(ret, 0);
			CHECK_EQ_U64(idx, (u32)(m - 1));
			CHECK_EQ_U64(phys, case_phys(ci, (u32)(m - 1)) + probes[k]);
			CHECK_EQ_U64(cont, len - probes[k]);
		}
		{
			u32 idx;
			u64 phys, cont;

			CHECK(chunk_map_position(map, probes[k], (int)p->n + 1, &idx, &phys, &cont) ==
			      -EINVAL);
		}
	}
}

static void check_striped_profile(const struct chunk_map *map, u32 ci)
{
	const struct profile *p = &profiles[ci];
	u32 nunits = 0, bad = 0;
	struct unit_place *t = simulate(p, &nunits);

	CHECK(t != NULL);
	if (!t)
		return;
	CHECK_EQ_U64((u64)nunits * SLEN, map->length);
	for (u32 u = 0; u < nunits; u++) {
		for (size_t k = 0; k < sizeof(unit_probes) / sizeof(unit_probes[0]); k++) {
			u64 off = (u64)u * SLEN + unit_probes[k];

			for (int m = 1; m <= t[u].nmirrors; m++) {
				u32 idx = 99;
				u64 phys = 0, cont = 0;
				int ret = chunk_map_position(map, off, m, &idx, &phys, &cont);
				u32 s = t[u].stripe[m - 1];

				if (ret != 0 || idx != s ||
				    phys != case_phys(ci, s) + t[u].off[m - 1] + unit_probes[k] ||
				    cont != SLEN - unit_probes[k]) {
					if (bad++ < 5)
						fprintf(stderr,
							"%s: off %llu mirror %d: ret %d stripe %u "
							"(want %u) phys %llu (want %llu) cont %llu\n",
							p->name, (unsigned long long)off, m, ret, idx,
							s,
							(unsigned long long)phys,
							(unsigned long long)(case_phys(ci, s) +
									     t[u].off[m - 1] +
									     unit_probes[k]),
							(unsigned long long)cont);
				}
			}
			{
				/* one past the copies, and raid5/6 parity is not a mirror */
				u32 idx;
				u64 phys, cont;
				int ret = chunk_map_position(map, off, t[u].nmirrors + 1, &idx, &phys,
							     &cont);

				if (ret != -EINVAL && bad++ < 5)
					fprintf(stderr, "%s: mirror %d accepted (%d)\n", p->name,
						t[u].nmirrors + 1, ret);
			}
		}
	}
	CHECK_EQ_U64(bad, 0);
	free(t);
}

/* Every profile's positions, copy counts and the out-of-range cases. */
static void test_positions(void)
{
	struct btrfs_volumes vol;

	vol_init(&vol, &quiet);
	/* add in a scrambled order: the map must keep chunks sorted */
	for (u32 k = 0; k < NPROFILES; k++)
		add_profile(&vol, (k * 8) % NPROFILES); /* 8 is prime to 21 */
	CHECK_EQ_U64(vol.nchunks, NPROFILES);
	for (size_t i = 1; i < vol.nchunks; i++)
		CHECK(vol.chunks[i - 1]->logical < vol.chunks[i]->logical);

	for (u32 ci = 0; ci < NPROFILES; ci++) {
		const struct profile *p = &profiles[ci];
		u64 start = case_logical(ci), len = profile_length(p);
		const struct chunk_map *map = volumes_find_chunk(&vol, start);

		CHECK(map != NULL);
		if (!map)
			continue;
		CHECK_EQ_U64(map->logical, start);
		CHECK_EQ_U64(map->length, len);
		CHECK_EQ_U64(map->num_stripes, p->n);
		CHECK(volumes_find_chunk(&vol, start + len - 1) == map);
		CHECK(volumes_find_chunk(&vol, start + len / 3) == map);
		CHECK(volumes_find_chunk(&vol, start + len) == NULL);
		CHECK(volumes_find_chunk(&vol, start - 1) == NULL);
		CHECK_EQ_U64(volumes_num_copies(&vol, start), p->copies);
		CHECK_EQ_U64(volumes_num_copies(&vol, start + len - 1), p->copies);
		CHECK_EQ_U64(chunk_data_stripes(map),
			     kind_of(p->type) == K_RAID5 ? p->n - 1
			     : kind_of(p->type) == K_RAID6 ? p->n - 2 : 1);
		for (u32 i = 0; i < p->n; i++) {
			CHECK_EQ_U64(map->stripes[i].physical, case_phys(ci, i));
			CHECK(map->stripes[i].dev != NULL);
			if (map->stripes[i].dev)
				CHECK_EQ_U64(map->stripes[i].dev->devid, map->stripes[i].devid);
		}

		if (kind_of(p->type) == K_MIRROR)
			check_mirror_profile(map, ci);
		else
			check_striped_profile(map, ci);

		{
			u32 idx;
			u64 phys, cont;

			CHECK(chunk_map_position(map, len, 1, &idx, &phys, &cont) == -EINVAL);
			CHECK(chunk_map_position(map, 0, 0, &idx, &phys, &cont) == -EINVAL);
			CHECK(chunk_map_position(map, 0, -1, &idx, &phys, &cont) == -EINVAL);
		}
	}
	CHECK(volumes_find_chunk(&vol, 0) == NULL);
	CHECK(volumes_find_chunk(&vol, UINT64_MAX) == NULL);
	/* devices named by the chunks were created, sorted by devid */
	CHECK_EQ_U64(vol.ndevs, MAX_STRIPES);
	for (size_t i = 0; i < vol.ndevs; i++) {
		CHECK_EQ_U64(vol.devs[i]->devid, i + 1);
		CHECK(vol.devs[i]->bdev == NULL);
	}
	volumes_close(&vol);
}

/* A few positions written out by hand from the rules, as a second opinion. */
static void test_positions_by_hand(void)
{
	struct btrfs_volumes vol;
	struct chunk_item item;
	const u64 devids[4] = { 1, 2, 3, 4 };
	const u64 phys[4] = { 1 * MIB, 2 * MIB, 3 * MIB, 4 * MIB };
	const struct chunk_map *map;
	u32 idx;
	u64 p, c;

	vol_init(&vol, &quiet);

	/* raid0 over 3: offset 200K is unit 3 (stripe 0, its 2nd unit), 8K in */
	chunk_build(&item, 12 * SLEN, BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID0, 3, 0, SLEN,
		    devids, phys);
	CHECK_EQ_U64(volumes_add_chunk(&vol, 1ULL << 30, &item.u.c, item.size), 0);
	map = volumes_find_chunk(&vol, 1ULL << 30);
	CHECK(map != NULL);
	if (map) {
		CHECK_EQ_U64(chunk_map_position(map, 200 * 1024, 1, &idx, &p, &c), 0);
		CHECK_EQ_U64(idx, 0);
		CHECK_EQ_U64(p, 1 * MIB + 64 * 1024 + 8 * 1024);
		CHECK_EQ_U64(c, 56 * 1024);
		/* unit 5: stripe 2, its 2nd unit */
		CHECK_EQ_U64(chunk_map_position(map, 5 * SLEN, 1, &idx, &p, &c), 0);
		CHECK_EQ_U64(idx, 2);
		CHECK_EQ_U64(p, 3 * MIB + SLEN);
	}

	/* raid10 over 4: unit 3 → group 1 (stripes 2, 3), its 2nd unit */
	chunk_build(&item, 8 * SLEN, BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID10, 4, 2, SLEN,
		    devids, phys);
	CHECK_EQ_U64(volumes_add_chunk(&vol, 2ULL << 30, &item.u.c, item.size), 0);
	map = volumes_find_chunk(&vol, 2ULL << 30);
	CHECK(map != NULL);
	if (map) {
		CHECK_EQ_U64(chunk_map_position(map, 3 * SLEN + 100, 1, &idx, &p, &c), 0);
		CHECK_EQ_U64(idx, 2);
		CHECK_EQ_U64(p, 3 * MIB + SLEN + 100);
		CHECK_EQ_U64(chunk_map_position(map, 3 * SLEN + 100, 2, &idx, &p, &c), 0);
		CHECK_EQ_U64(idx, 3);
		CHECK_EQ_U64(p, 4 * MIB + SLEN + 100);
		CHECK_EQ_U64(c, SLEN - 100);
	}

	/* raid5 over 4 (3 data): row 1 = units 3,4,5 on stripes 1,2,3; P on 0 */
	chunk_build(&item, 9 * SLEN, BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID5, 4, 0, SLEN,
		    devids, phys);
	CHECK_EQ_U64(volumes_add_chunk(&vol, 3ULL << 30, &item.u.c, item.size), 0);
	map = volumes_find_chunk(&vol, 3ULL << 30);
	CHECK(map != NULL);
	if (map) {
		CHECK_EQ_U64(chunk_map_position(map, 3 * SLEN, 1, &idx, &p, &c), 0);
		CHECK_EQ_U64(idx, 1);
		CHECK_EQ_U64(p, 2 * MIB + SLEN);
		CHECK_EQ_U64(chunk_map_position(map, 5 * SLEN + 4096, 1, &idx, &p, &c), 0);
		CHECK_EQ_U64(idx, 3);
		CHECK_EQ_U64(p, 4 * MIB + SLEN + 4096);
		/* row 2, data 1 → stripe (2 + 1) % 4 = 3 */
		CHECK_EQ_U64(chunk_map_position(map, 7 * SLEN, 1, &idx, &p, &c), 0);
		CHECK_EQ_U64(idx, 3);
		CHECK_EQ_U64(p, 4 * MIB + 2 * SLEN);
		/* row 2, data 2 → stripe 0 */
		CHECK_EQ_U64(chunk_map_position(map, 8 * SLEN + 1, 1, &idx, &p, &c), 0);
		CHECK_EQ_U64(idx, 0);
		CHECK_EQ_U64(p, 1 * MIB + 2 * SLEN + 1);
		CHECK_EQ_U64(volumes_num_copies(&vol, (3ULL << 30) + 5), 2);
	}

	/* raid6 over 4 (2 data): row 3, data 1 → stripe (3 + 1) % 4 = 0 */
	chunk_build(&item, 8 * SLEN, BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID6, 4, 0, SLEN,
		    devids, phys);
	CHECK_EQ_U64(volumes_add_chunk(&vol, 4ULL << 30, &item.u.c, item.size), 0);
	map = volumes_find_chunk(&vol, 4ULL << 30);
	CHECK(map != NULL);
	if (map) {
		CHECK_EQ_U64(chunk_map_position(map, 7 * SLEN + SLEN - 1, 1, &idx, &p, &c), 0);
		CHECK_EQ_U64(idx, 0);
		CHECK_EQ_U64(p, 1 * MIB + 3 * SLEN + SLEN - 1);
		CHECK_EQ_U64(c, 1);
		CHECK_EQ_U64(volumes_num_copies(&vol, 4ULL << 30), 4);
	}
	volumes_close(&vol);
}

/* ---- rejection of bad chunk items -------------------------------------- */

struct capture {
	int errors;
	int corrupt;
};

static void capture_fn(void *arg, int level, const char *msg)
{
	struct capture *cap = arg;

	if (level == BUTTER_LOG_ERROR)
		cap->errors++;
	if (strstr(msg, "corrupt"))
		cap->corrupt++;
}

/* Expect volumes_add_chunk to refuse @item at @logical with -EUCLEAN, and say so. */
static void expect_reject(struct btrfs_volumes *vol, struct capture *cap, const char *what,
			  u64 logical, const struct chunk_item *item, u32 size)
{
	size_t before = vol->nchunks;
	int corrupt_before = cap->corrupt;
	int ret = volumes_add_chunk(vol, logical, &item->u.c, size);

	if (ret != -EUCLEAN) {
		fprintf(stderr, "reject %s: got %d, want -EUCLEAN\n", what, ret);
		CHECK(0);
	}
	if (cap->corrupt != corrupt_before + 1) {
		fprintf(stderr, "reject %s: no corruption message\n", what);
		CHECK(0);
	}
	CHECK_EQ_U64(vol->nchunks, before);
}

static void test_reject(void)
{
	struct capture cap = { 0, 0 };
	struct blog log = { capture_fn, &cap, BUTTER_LOG_ERROR };
	struct btrfs_volumes vol;
	struct chunk_item item;
	const u64 devids[MAX_STRIPES] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	const u64 phys[MAX_STRIPES] = { MIB, MIB, MIB, MIB, MIB, MIB, MIB, MIB };
	const u64 data = BTRFS_BLOCK_GROUP_DATA;
	const u64 L = 1ULL << 30;

	vol_init(&vol, &log);

	/* stripe counts against the item size */
	chunk_build(&item, MIB, data, 0, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "zero stripes", L, &item, sizeof(struct btrfs_chunk));
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID1, 2, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "2 stripes in a 1-stripe item", L, &item,
		      (u32)btrfs_chunk_item_size(1));
	expect_reject(&vol, &cap, "2 stripes in a 3-stripe item", L, &item,
		      (u32)btrfs_chunk_item_size(3));
	chunk_build(&item, MIB, data, 1, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "1 stripe in a 2-stripe item", L, &item,
		      (u32)btrfs_chunk_item_size(2));
	expect_reject(&vol, &cap, "item shorter than a chunk", L, &item, 40);
	expect_reject(&vol, &cap, "item of 0 bytes", L, &item, 0);
	expect_reject(&vol, &cap, "item one byte short", L, &item, sizeof(struct btrfs_chunk) - 1);
	expect_reject(&vol, &cap, "item one byte long", L, &item, sizeof(struct btrfs_chunk) + 1);

	/* stripe_len */
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID0, 2, 0, 0x18000, devids, phys);
	expect_reject(&vol, &cap, "stripe_len 96K", L, &item, item.size);
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID0, 2, 0, 0, devids, phys);
	expect_reject(&vol, &cap, "stripe_len 0", L, &item, item.size);
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID0, 2, 0, SLEN + SECTOR, devids, phys);
	expect_reject(&vol, &cap, "stripe_len 68K", L, &item, item.size);
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID0, 2, 0, 2048, devids, phys);
	expect_reject(&vol, &cap, "stripe_len below the sector size", L, &item, item.size);
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID0, 2, 0, 3, devids, phys);
	expect_reject(&vol, &cap, "stripe_len 3", L, &item, item.size);

	/* stripe counts against the profile */
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID10, 3, 2, SLEN, devids, phys);
	expect_reject(&vol, &cap, "raid10 with 3 stripes", L, &item, item.size);
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID10, 5, 2, SLEN, devids, phys);
	expect_reject(&vol, &cap, "raid10 with 5 stripes", L, &item, item.size);
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID10, 4, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "raid10 with sub_stripes 0", L, &item, item.size);
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID10, 4, 1, SLEN, devids, phys);
	expect_reject(&vol, &cap, "raid10 with sub_stripes 1", L, &item, item.size);
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID1, 1, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "raid1 with 1 stripe", L, &item, item.size);
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID1C3, 2, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "raid1c3 with 2 stripes", L, &item, item.size);
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID1C4, 3, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "raid1c4 with 3 stripes", L, &item, item.size);
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID5, 1, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "raid5 with 1 stripe", L, &item, item.size);
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID6, 2, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "raid6 with 2 stripes", L, &item, item.size);
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_DUP, 1, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "dup with 1 stripe", L, &item, item.size);
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_DUP, 3, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "dup with 3 stripes", L, &item, item.size);
	chunk_build(&item, MIB, data, 2, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "single with 2 stripes", L, &item, item.size);

	/* type and length */
	chunk_build(&item, MIB, data | BTRFS_BLOCK_GROUP_RAID0 | BTRFS_BLOCK_GROUP_RAID1, 2, 0, SLEN,
		    devids, phys);
	expect_reject(&vol, &cap, "two profiles", L, &item, item.size);
	chunk_build(&item, MIB, BTRFS_BLOCK_GROUP_RAID1, 2, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "no data/metadata/system bit", L, &item, item.size);
	chunk_build(&item, 0, data, 1, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "length 0", L, &item, item.size);
	chunk_build(&item, MIB + 512, data, 1, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "unaligned length", L, &item, item.size);
	chunk_build(&item, MIB, data, 1, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "unaligned logical", L + 512, &item, item.size);
	expect_reject(&vol, &cap, "logical + length wraps", UINT64_MAX - MIB / 2 - 4095, &item,
		      item.size);
	CHECK_EQ_U64(vol.nchunks, 0);

	/* overlaps: one chunk at [L, L + 1M) */
	chunk_build(&item, MIB, data, 1, 0, SLEN, devids, phys);
	CHECK_EQ_U64(volumes_add_chunk(&vol, L, &item.u.c, item.size), 0);
	CHECK_EQ_U64(vol.nchunks, 1);
	/* the same chunk again (sys_chunk_array and chunk tree both name it) is fine */
	CHECK_EQ_U64(volumes_add_chunk(&vol, L, &item.u.c, item.size), 0);
	CHECK_EQ_U64(vol.nchunks, 1);
	expect_reject(&vol, &cap, "starts inside", L + SLEN, &item, item.size);
	expect_reject(&vol, &cap, "starts at the last sector", L + MIB - SECTOR, &item, item.size);
	expect_reject(&vol, &cap, "ends inside", L - MIB + SECTOR, &item, item.size);
	chunk_build(&item, 4 * MIB, data, 1, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "covers it", L - MIB, &item, item.size);
	expect_reject(&vol, &cap, "same start, longer", L, &item, item.size);
	chunk_build(&item, MIB / 2, data, 1, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "same start, shorter", L, &item, item.size);
	expect_reject(&vol, &cap, "inside", L + MIB / 4, &item, item.size);
	/* neighbours that touch but do not overlap are fine */
	chunk_build(&item, MIB, data, 1, 0, SLEN, devids, phys);
	CHECK_EQ_U64(volumes_add_chunk(&vol, L + MIB, &item.u.c, item.size), 0);
	CHECK_EQ_U64(volumes_add_chunk(&vol, L - MIB, &item.u.c, item.size), 0);
	CHECK_EQ_U64(vol.nchunks, 3);
	chunk_build(&item, 2 * SECTOR, data, 1, 0, SLEN, devids, phys);
	expect_reject(&vol, &cap, "across the joint", L + MIB - SECTOR, &item, item.size);
	CHECK_EQ_U64(vol.nchunks, 3);
	CHECK(volumes_find_chunk(&vol, L - 1)->logical == L - MIB);
	CHECK(volumes_find_chunk(&vol, L)->logical == L);
	CHECK(volumes_find_chunk(&vol, L + MIB)->logical == L + MIB);
	CHECK(volumes_find_chunk(&vol, L + 2 * MIB) == NULL);
	CHECK(volumes_find_chunk(&vol, L - MIB - 1) == NULL);

	volumes_close(&vol);
}

/* ---- end to end over memory devices ------------------------------------ */

static u8 gf_mul(u8 a, u8 b)
{
	unsigned acc = 0, x = a;

	for (; b; b >>= 1) {
		if (b & 1)
			acc ^= x;
		x <<= 1;
		if (x & 0x100)
			x ^= 0x11d;
	}
	return (u8)acc;
}

static u8 gf_pow2(unsigned e)
{
	u8 v = 1;

	while (e--)
		v = gf_mul(v, 2);
	return v;
}

static u64 rng_state = 0x9e3779b97f4a7c15ULL;

static u64 rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static void fill_random(u8 *buf, size_t len)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (u8)(rng() >> 32);
}

#define NDEVS 4
#define DEV_SIZE (8 * MIB)
#define ROWS 6

/* One chunk of the end-to-end volume. */
struct e2e_chunk {
	const char *name;
	u64 logical;
	u64 type;
	u32 n, sub;
	u64 devid[MAX_STRIPES];
	u64 phys[MAX_STRIPES];
	u8 *data;               /* the logical contents */
	u64 length;
};

struct e2e {
	struct btrfs_volumes vol;
	u8 *mem[NDEVS + 1];             /* by devid */
	struct blockdev *bdev[NDEVS + 1];
	struct btrfs_device *dev[NDEVS + 1];
	struct e2e_chunk chunks[4];
	int nchunks;
};

static void dev_write(struct e2e *e, u64 devid, u64 phys, const u8 *buf, size_t len)
{
	CHECK(phys + len <= DEV_SIZE);
	if (phys + len <= DEV_SIZE)
		memcpy(e->mem[devid] + phys, buf, len);
}

/* Write chunk @c's data (and parity) onto the devices by the reference layout. */
static void e2e_lay_out(struct e2e *e, struct e2e_chunk *c)
{
	enum kind kind = kind_of(c->type);

	if (kind == K_MIRROR) {
		for (u32 i = 0; i < c->n; i++)
			dev_write(e, c->devid[i], c->phys[i], c->data, c->length);
		return;
	}
	if (kind == K_RAID10) {
		u32 groups = c->n / c->sub;
		u64 cursor[MAX_STRIPES] = { 0 };

		for (u64 u = 0; u < c->length / SLEN; u++) {
			u32 g = (u32)(u % groups);

			for (u32 m = 0; m < c->sub; m++) {
				u32 s = g * c->sub + m;

				dev_write(e, c->devid[s], c->phys[s] + cursor[s], c->data + u * SLEN,
					  SLEN);
				cursor[s] += SLEN;
			}
		}
		return;
	}
	/* raid5/6 */
	{
		u32 np = kind == K_RAID6 ? 2 : 1, ndata = c->n - np;
		u8 *p = malloc(SLEN), *q = malloc(SLEN);

		CHECK(p && q);
		for (u64 r = 0; p && q && r < c->length / SLEN / ndata; r++) {
			memset(p, 0, SLEN);
			memset(q, 0, SLEN);
			for (u32 d = 0; d < ndata; d++) {
				const u8 *src = c->data + (r * ndata + d) * SLEN;
				u32 s = (u32)((r + d) % c->n);
				u8 coef = gf_pow2(d);

				dev_write(e, c->devid[s], c->phys[s] + r * SLEN, src, SLEN);
				for (u64 k = 0; k < SLEN; k++) {
					p[k] ^= src[k];
					q[k] ^= gf_mul(coef, src[k]);
				}
			}
			{
				u32 ps = (u32)((r + ndata) % c->n);

				dev_write(e, c->devid[ps], c->phys[ps] + r * SLEN, p, SLEN);
			}
			if (np == 2) {
				u32 qs = (u32)((r + ndata + 1) % c->n);

				dev_write(e, c->devid[qs], c->phys[qs] + r * SLEN, q, SLEN);
			}
		}
		free(p);
		free(q);
	}
}

static int e2e_setup(struct e2e *e)
{
	static const struct {
		const char *name;
		u64 logical, type;
		u32 n, sub;
		u64 devid[4];
		u64 phys[4];
		u32 data_width;
	} spec[] = {
		{ "raid5", 0x4000000, BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID5, 4, 0,
		  { 2, 4, 1, 3 }, { 1 * MIB, 2 * MIB, 3 * MIB / 2, 1 * MIB }, 3 },
		{ "raid6", 0x8000000, BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_RAID6, 4, 0,
		  { 1, 2, 3, 4 }, { 4 * MIB, 9 * MIB / 2, 5 * MIB, 6 * MIB }, 2 },
		{ "raid10", 0xc000000, BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID10, 4, 2,
		  { 3, 1, 4, 2 }, { 7 * MIB, 7 * MIB, 7 * MIB, 7 * MIB }, 2 },
		{ "raid1c3", 0x10000000, BTRFS_BLOCK_GROUP_SYSTEM | BTRFS_BLOCK_GROUP_RAID1C3, 3, 0,
		  { 3, 1, 4 }, { 15 * MIB / 2, 15 * MIB / 2, 15 * MIB / 2 }, 1 },
	};
	struct btrfs_device **devs;

	memset(e, 0, sizeof(*e));
	vol_init(&e->vol, &quiet);

	/* the device records, sorted by devid, as volumes_open would leave them */
	devs = calloc(NDEVS, sizeof(*devs));
	if (!devs)
		return -ENOMEM;
	e->vol.devs = devs;
	for (u64 id = 1; id <= NDEVS; id++) {
		struct btrfs_device *d = calloc(1, sizeof(*d));

		e->mem[id] = malloc(DEV_SIZE);
		if (!d || !e->mem[id])
			return -ENOMEM;
		fill_random(e->mem[id], DEV_SIZE);
		if (blockdev_open_memory(e->mem[id], DEV_SIZE, 0, &e->bdev[id]))
			return -ENOMEM;
		d->devid = id;
		memset(d->uuid, (int)id, BTRFS_UUID_SIZE);
		d->total_bytes = DEV_SIZE;
		d->bdev = e->bdev[id];
		devs[id - 1] = d;
		e->dev[id] = d;
		e->vol.ndevs++;
	}

	for (size_t k = 0; k < sizeof(spec) / sizeof(spec[0]); k++) {
		struct e2e_chunk *c = &e->chunks[e->nchunks++];
		struct chunk_item item;

		c->name = spec[k].name;
		c->logical = spec[k].logical;
		c->type = spec[k].type;
		c->n = spec[k].n;
		c->sub = spec[k].sub;
		memcpy(c->devid, spec[k].devid, sizeof(spec[k].devid));
		memcpy(c->phys, spec[k].phys, sizeof(spec[k].phys));
		c->length = (u64)ROWS * spec[k].data_width * SLEN;
		c->data = malloc(c->length);
		if (!c->data)
			return -ENOMEM;
		fill_random(c->data, c->length);
		e2e_lay_out(e, c);
		chunk_build(&item, c->length, c->type, c->n, c->sub, SLEN, c->devid, c->phys);
		if (volumes_add_chunk(&e->vol, c->logical, &item.u.c, item.size))
			return -EUCLEAN;
	}
	/* the chunks found the devices we made rather than creating new ones */
	CHECK_EQ_U64(e->vol.ndevs, NDEVS);
	return 0;
}

static void e2e_teardown(struct e2e *e)
{
	for (u64 id = 1; id <= NDEVS; id++)
		if (e->dev[id])
			e->dev[id]->bdev = e->bdev[id]; /* closed by volumes_close */
	volumes_close(&e->vol);
	for (u64 id = 1; id <= NDEVS; id++)
		free(e->mem[id]);
	for (int k = 0; k < e->nchunks; k++)
		free(e->chunks[k].data);
}

/* e2e_setup(), a failed check and e2e_teardown() if it fails: nonzero then. */
static int e2e_start(struct e2e *e)
{
	if (e2e_setup(e) == 0)
		return 0;
	CHECK(0);
	e2e_teardown(e);
	return 1;
}

/* Read [off, off + len) of chunk @c as @mirror and compare. Returns the read's result. */
static int read_cmp(struct e2e *e, const struct e2e_chunk *c, u64 off, size_t len, int mirror,
		    int *same)
{
	u8 *buf = malloc(len);
	int ret;

	if (!buf)
		return -ENOMEM;
	memset(buf, 0xcc, len);
	ret = volumes_read(&e->vol, c->logical + off, buf, len, mirror);
	*same = off + len <= c->length && memcmp(buf, c->data + off, len) == 0;
	free(buf);
	return ret;
}

/* Healthy devices: every copy of every chunk reads back the data. */
static void test_e2e_healthy(void)
{
	struct e2e e;

	if (e2e_start(&e))
		return;
	for (int k = 0; k < e.nchunks; k++) {
		const struct e2e_chunk *c = &e.chunks[k];
		int copies = volumes_num_copies(&e.vol, c->logical);
		int same = 0;

		for (int m = 1; m <= copies; m++) {
			CHECK_EQ_U64(read_cmp(&e, c, 0, c->length, m, &same), 0);
			if (!same)
				fprintf(stderr, "%s mirror %d: whole chunk differs\n", c->name, m);
			CHECK(same);
		}
		CHECK(read_cmp(&e, c, 0, SECTOR, copies + 1, &same) != 0);
		/* ranges that start and end anywhere, crossing stripe and row edges */
		for (int i = 0; i < 60; i++) {
			u64 off = rng() % c->length;
			size_t len = (size_t)(1 + rng() % (3 * SLEN));
			int m = 1 + (int)(rng() % (u64)copies);

			if (len > c->length - off)
				len = (size_t)(c->length - off);
			CHECK_EQ_U64(read_cmp(&e, c, off, len, m, &same), 0);
			if (!same)
				fprintf(stderr, "%s mirror %d: [%llu, +%zu) differs\n", c->name, m,
					(unsigned long long)off, len);
			CHECK(same);
		}
		/* edges of the chunk */
		CHECK_EQ_U64(read_cmp(&e, c, c->length - 1, 1, 1, &same), 0);
		CHECK(same);
		CHECK_EQ_U64(read_cmp(&e, c, SLEN - 1, 2, 1, &same), 0);
		CHECK(same);
		CHECK(read_cmp(&e, c, c->length - SECTOR, 2 * SECTOR, 1, &same) < 0);
	}
	{
		u8 b[16];

		CHECK(volumes_read(&e.vol, 0x1000, b, sizeof(b), 1) == -ENOENT);
		CHECK(volumes_read(&e.vol, 0x4000000 + (ROWS * 3 * SLEN), b, sizeof(b), 1) ==
		      -ENOENT);
	}
	e2e_teardown(&e);
}

enum dev_state { ST_OK, ST_MISSING, ST_ZEROED };

enum outcome { OUT_GOOD, OUT_EIO, OUT_ANY_DATA };

/*
 * What reading data block @t of a RAID5/6 row as @mirror gives, when the
 * row's blocks (0..ndata-1 data, ndata P, ndata+1 Q) are in @state. Copy 1
 * reads the block; copy 2 rebuilds it from the other data and P (Q too if one
 * more block is unreadable); copy 3 (RAID6) also treats P as bad; copy 4 + i
 * also treats the i-th other data block as bad. Unreadable blocks join the
 * bad set; more bad blocks than parity blocks is EIO. The result is good when
 * no zeroed block is among the blocks the rebuild uses.
 */
static enum outcome raid56_expect(u32 ndata, u32 np, u32 t, int mirror, const int *state)
{
	u32 nblocks = ndata + np, nbad = 0;
	int bad[MAX_STRIPES] = { 0 }, zeroed_used = 0;

	if (mirror == 1)
		return state[t] == ST_MISSING ? OUT_EIO
		       : state[t] == ST_ZEROED ? OUT_ANY_DATA : OUT_GOOD;
	if (mirror > (np == 2 ? (int)nblocks : 2))
		return OUT_EIO;
	bad[t] = 1;
	if (mirror == 3)
		bad[ndata] = 1;
	if (mirror >= 4) {
		u32 other = (u32)(mirror - 4);

		if (other >= t)
			other++;
		if (other >= ndata)
			return OUT_EIO;
		bad[other] = 1;
	}
	for (u32 k = 0; k < nblocks; k++) {
		if (state[k] == ST_MISSING)
			bad[k] = 1;
		nbad += (u32)bad[k];
	}
	if (nbad > np)
		return OUT_EIO;
	for (u32 k = 0; k < nblocks; k++) {
		/* one bad block is rebuilt from the data and P alone */
		int used = !bad[k] && !(nbad == 1 && k == ndata + 1);

		if (used && state[k] == ST_ZEROED)
			zeroed_used = 1;
	}
	return zeroed_used ? OUT_ANY_DATA : OUT_GOOD;
}

/* The expected outcome of one sector of chunk @c as @mirror, devices in @dstate. */
static enum outcome sector_expect(const struct e2e_chunk *c, u64 off, int mirror,
				  const int *dstate)
{
	enum kind kind = kind_of(c->type);
	u64 unit = off / SLEN;

	if (kind == K_MIRROR) {
		if (mirror > (int)c->n)
			return OUT_EIO;
		return dstate[c->devid[mirror - 1]] == ST_MISSING ? OUT_EIO
		       : dstate[c->devid[mirror - 1]] == ST_ZEROED ? OUT_ANY_DATA : OUT_GOOD;
	}
	if (kind == K_RAID10) {
		u32 s = (u32)(unit % (c->n / c->sub)) * c->sub + (u32)(mirror - 1);

		if (mirror > (int)c->sub)
			return OUT_EIO;
		return dstate[c->devid[s]] == ST_MISSING ? OUT_EIO
		       : dstate[c->devid[s]] == ST_ZEROED ? OUT_ANY_DATA : OUT_GOOD;
	}
	{
		u32 np = kind == K_RAID6 ? 2 : 1, ndata = c->n - np;
		u64 r = unit / ndata;
		u32 t = (u32)(unit % ndata);
		int state[MAX_STRIPES];

		for (u32 k = 0; k < c->n; k++)
			state[k] = dstate[c->devid[(r + k) % c->n]];
		return raid56_expect(ndata, np, t, mirror, state);
	}
}

/* Apply @dstate to the devices: missing → bdev NULL, zeroed → all bytes 0. */
static void apply_state(struct e2e *e, const int *dstate, u8 **saved)
{
	for (u64 id = 1; id <= NDEVS; id++) {
		e->dev[id]->bdev = dstate[id] == ST_MISSING ? NULL : e->bdev[id];
		if (dstate[id] == ST_ZEROED) {
			saved[id] = malloc(DEV_SIZE);
			if (saved[id])
				memcpy(saved[id], e->mem[id], DEV_SIZE);
			memset(e->mem[id], 0, DEV_SIZE);
		}
	}
}

static void restore_state(struct e2e *e, u8 **saved)
{
	for (u64 id = 1; id <= NDEVS; id++) {
		e->dev[id]->bdev = e->bdev[id];
		if (saved[id]) {
			memcpy(e->mem[id], saved[id], DEV_SIZE);
			free(saved[id]);
			saved[id] = NULL;
		}
	}
}

/*
 * Read every sector of every chunk with every copy and compare with the
 * model; also check that some copy of each sector is good whenever the
 * profile can tolerate the damage. Returns the number of mismatches.
 */
static int sweep(struct e2e *e, const int *dstate, const char *label)
{
	int mismatches = 0;
	u8 buf[SECTOR];

	for (int k = 0; k < e->nchunks; k++) {
		const struct e2e_chunk *c = &e->chunks[k];
		int copies = volumes_num_copies(&e->vol, c->logical);

		for (u64 off = 0; off < c->length; off += SECTOR) {
			int any_good = 0, any_expected_good = 0;

			for (int m = 1; m <= copies + 1; m++) {
				enum outcome want = sector_expect(c, off, m, dstate);
				int ret, good;

				memset(buf, 0xcc, sizeof(buf));
				ret = volumes_read(&e->vol, c->logical + off, buf, SECTOR, m);
				good = ret == 0 && memcmp(buf, c->data + off, SECTOR) == 0;
				any_good |= good;
				any_expected_good |= want == OUT_GOOD;
				if ((want == OUT_GOOD && !good) || (want == OUT_EIO && ret != -EIO) ||
				    (want == OUT_ANY_DATA && ret != 0)) {
					if (mismatches++ < 8)
						fprintf(stderr,
							"%s: %s off %llu mirror %d: ret %d good %d, "
							"want %s\n",
							label, c->name, (unsigned long long)off, m, ret,
							good,
							want == OUT_GOOD  ? "good data"
							: want == OUT_EIO ? "-EIO"
									  : "some data");
				}
			}
			if (any_good != any_expected_good && mismatches++ < 8)
				fprintf(stderr, "%s: %s off %llu: some copy good %d, want %d\n", label,
					c->name, (unsigned long long)off, any_good,
					any_expected_good);
		}
	}
	return mismatches;
}

/* True if chunk @c must stay fully readable with the devices in @dstate. */
static int chunk_survives(const struct e2e_chunk *c, const int *dstate)
{
	u32 lost = 0;

	for (u32 i = 0; i < c->n; i++)
		lost += dstate[c->devid[i]] != ST_OK;
	switch (kind_of(c->type)) {
	case K_RAID5:
		return lost <= 1;
	case K_RAID6:
		return lost <= 2;
	case K_RAID10:
		for (u32 g = 0; g < c->n; g += c->sub) {
			u32 ok = 0;

			for (u32 m = 0; m < c->sub; m++)
				ok += dstate[c->devid[g + m]] == ST_OK;
			if (!ok)
				return 0;
		}
		return 1;
	default:
		return lost < c->n;
	}
}

/* Every sector stays readable through some copy when the profile allows it. */
static int check_survival(struct e2e *e, const int *dstate, const char *label)
{
	int failures = 0;
	u8 buf[SECTOR];

	for (int k = 0; k < e->nchunks; k++) {
		const struct e2e_chunk *c = &e->chunks[k];
		int copies = volumes_num_copies(&e->vol, c->logical);

		if (!chunk_survives(c, dstate))
			continue;
		for (u64 off = 0; off < c->length; off += SECTOR) {
			int ok = 0;

			for (int m = 1; m <= copies && !ok; m++)
				ok = volumes_read(&e->vol, c->logical + off, buf, SECTOR, m) == 0 &&
				     memcmp(buf, c->data + off, SECTOR) == 0;
			if (!ok && failures++ < 4)
				fprintf(stderr, "%s: %s off %llu: no copy is good\n", label, c->name,
					(unsigned long long)off);
		}
	}
	return failures;
}

static void run_state(struct e2e *e, const int *dstate)
{
	u8 *saved[NDEVS + 1] = { NULL };
	char label[64];
	int n = 0;

	for (u64 id = 1; id <= NDEVS; id++)
		n += snprintf(label + n, sizeof(label) - (size_t)n, "%c",
			      dstate[id] == ST_OK ? '.' : dstate[id] == ST_MISSING ? 'M' : 'Z');
	apply_state(e, dstate, saved);
	CHECK_EQ_U64(sweep(e, dstate, label), 0);
	CHECK_EQ_U64(check_survival(e, dstate, label), 0);
	restore_state(e, saved);
}

/* One device missing or zeroed, each in turn. */
static void test_e2e_one_bad(void)
{
	struct e2e e;

	if (e2e_start(&e))
		return;
	for (int how = ST_MISSING; how <= ST_ZEROED; how++)
		for (int x = 1; x <= NDEVS; x++) {
			int dstate[NDEVS + 1] = { ST_OK };

			dstate[x] = how;
			run_state(&e, dstate);
		}
	/* and back to healthy: nothing stuck */
	{
		int dstate[NDEVS + 1] = { ST_OK };

		run_state(&e, dstate);
	}
	e2e_teardown(&e);
}

/* Two devices gone (RAID6 survives it), or one gone and one zeroed. */
static void test_e2e_two_bad(void)
{
	struct e2e e;

	if (e2e_start(&e))
		return;
	for (int x = 1; x <= NDEVS; x++)
		for (int y = 1; y <= NDEVS; y++) {
			int dstate[NDEVS + 1] = { ST_OK };

			if (x == y)
				continue;
			if (x < y) {
				dstate[x] = ST_MISSING;
				dstate[y] = ST_MISSING;
				run_state(&e, dstate);
			}
			dstate[x] = ST_MISSING;
			dstate[y] = ST_ZEROED;
			run_state(&e, dstate);
		}
	e2e_teardown(&e);
}

/* A whole-chunk read of a RAID6 missing one device rebuilds every piece as copy 2. */
static void test_e2e_degraded_bulk(void)
{
	struct e2e e;
	const struct e2e_chunk *c;
	int same = 0;

	if (e2e_start(&e))
		return;
	c = &e.chunks[1]; /* raid6 */
	e.dev[3]->bdev = NULL;
	/* copy 1 fails where a piece is on device 3; copy 2 rebuilds every piece */
	CHECK(read_cmp(&e, c, 0, c->length, 1, &same) == -EIO);
	CHECK_EQ_U64(read_cmp(&e, c, 0, c->length, 2, &same), 0);
	CHECK(same);
	/*
	 * Copy 3, or copy 2 with a second device gone, would count three bad
	 * blocks for a piece whose own stripe is present: a caller reads such a
	 * range copy by copy per piece, which the sector sweeps cover.
	 */
	e2e_teardown(&e);
}

/*
 * volumes_locate() names where each stored copy's bytes are (they are read
 * back there); a read error counts on the device that failed, a corruption
 * on the device of the copy named, a RAID5/6 rebuild on none.
 */
static void test_e2e_locate_and_stats(void)
{
	struct e2e e;
	struct btrfs_device *dev;
	struct blockdev *mem = NULL, *faulty = NULL;
	u64 phys;
	int rebuilt, same = 0;

	if (e2e_start(&e))
		return;
	for (int k = 0; k < e.nchunks; k++) {
		const struct e2e_chunk *c = &e.chunks[k];
		int copies = volumes_num_copies(&e.vol, c->logical);
		int raid56 = (c->type & BTRFS_BLOCK_GROUP_RAID56_MASK) != 0;

		for (u64 off = 0; off + SECTOR <= c->length; off += 5 * SLEN + 3 * SECTOR) {
			for (int m = 1; m <= copies; m++) {
				u8 buf[SECTOR];

				CHECK_EQ_U64(volumes_locate(&e.vol, c->logical + off, m, &dev, &phys,
							    &rebuilt), 0);
				CHECK(rebuilt == (raid56 && m > 1));
				CHECK(dev != NULL);
				if (!dev)
					continue;
				CHECK_EQ_U64(blockdev_read(dev->bdev, buf, SECTOR, phys), 0);
				CHECK_MEM(buf, c->data + off, SECTOR);
			}
		}
		CHECK(volumes_locate(&e.vol, c->logical, copies + 1, &dev, &phys, &rebuilt) == -EIO);
	}
	CHECK(volumes_locate(&e.vol, 4096, 1, &dev, &phys, &rebuilt) == -ENOENT);
	CHECK(!volumes_stats_dirty(&e.vol));

	/* devid 3 (copy 1 of the raid1c3 chunk) fails every read */
	CHECK_EQ_U64(blockdev_open_memory(e.mem[3], DEV_SIZE, 1, &mem), 0);
	CHECK_EQ_U64(blockdev_open_fault(mem, "read-eio", 0, &faulty), 0);
	if (faulty) {
		const struct e2e_chunk *c = &e.chunks[3];

		e.dev[3]->bdev = faulty;
		CHECK(read_cmp(&e, c, 0, SECTOR, 1, &same) == -EIO);
		CHECK(!volumes_copy_missing(&e.vol, c->logical, 1));
		CHECK_EQ_U64(e.dev[3]->stats[BTRFS_DEV_STAT_READ_ERRS], 1);
		CHECK(volumes_stats_dirty(&e.vol));
		CHECK_EQ_U64(read_cmp(&e, c, 0, SECTOR, 2, &same), 0);
		CHECK(same);
		/* a checksum mismatch of copy 2 counts on devid 1, where copy 2 is */
		volumes_count_error(&e.vol, c->logical, 2, BTRFS_DEV_STAT_CORRUPTION_ERRS);
		CHECK_EQ_U64(e.dev[1]->stats[BTRFS_DEV_STAT_CORRUPTION_ERRS], 1);
		/* a rebuild from parity is no one device's copy */
		volumes_count_error(&e.vol, e.chunks[0].logical, 2, BTRFS_DEV_STAT_CORRUPTION_ERRS);
		for (u64 id = 1; id <= NDEVS; id++)
			CHECK_EQ_U64(e.dev[id]->stats[BTRFS_DEV_STAT_CORRUPTION_ERRS], id == 1);
		e.dev[3]->bdev = e.bdev[3];
		blockdev_close(faulty);
	} else if (mem) {
		blockdev_close(mem);
	}
	e2e_teardown(&e);
}

int main(void)
{
	RUN(test_positions);
	RUN(test_positions_by_hand);
	RUN(test_reject);
	RUN(test_e2e_healthy);
	RUN(test_e2e_one_bad);
	RUN(test_e2e_two_bad);
	RUN(test_e2e_degraded_bulk);
	RUN(test_e2e_locate_and_stats);
	return check_summary();
}
