/*
 * test_fuse_nodes.c — the FUSE daemon's node ids (fuse/nodes.c): the mapping
 * from (subvolume, inode) to node id / st_ino is injective, stable across
 * forget and lookup again, puts the mount's root at 1, gives each placeholder
 * directory its own id, and resolves every id it hands out.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "nodes.h"

static butter_ino_t I(uint64_t subvol, uint64_t ino)
{
	butter_ino_t x = { subvol, ino };
	return x;
}

static uint64_t get(struct node_table *t, butter_ino_t id, butter_ino_t parent, const char *name,
		    bool ref)
{
	uint64_t nodeid = 0;

	CHECK(nodes_get(t, id, parent, name, strlen(name), ref, &nodeid) == 0);
	return nodeid;
}

static void test_rules(void)
{
	struct node_table t;
	butter_ino_t out, none = I(0, 0);

	CHECK(nodes_init(&t, I(5, 256)) == 0);
	/* rule 1: the mounted root; rule 2: top level keeps btrfs's numbers */
	CHECK_EQ_U64(get(&t, I(5, 256), none, "", true), 1);
	CHECK_EQ_U64(get(&t, I(5, 257), none, "", true), 257);
	CHECK_EQ_U64(get(&t, I(256, 257), none, "", false), (1ull << 44) + 257);
	CHECK_EQ_U64(get(&t, I(257, 256), none, "", false), (2ull << 44) + 256);
	/* rule 3: out of range, and placeholders */
	uint64_t big = get(&t, I(5, 1ull << 44), none, "", true);
	uint64_t p1 = get(&t, I(300, 2), I(300, 256), "a", true);
	uint64_t p2 = get(&t, I(300, 2), I(300, 256), "b", true);
	uint64_t p3 = get(&t, I(300, 2), I(300, 257), "a", false);
	CHECK(big >> 63 && p1 >> 63 && p2 >> 63 && p3 >> 63);
	CHECK(p1 != p2 && p1 != p3 && p2 != p3 && big != p1);
	CHECK_EQ_U64(get(&t, I(300, 2), I(300, 256), "a", false), p1);
	CHECK(nodes_resolve(&t, p2, &out) == 0 && out.subvol == 300 && out.ino == 2);
	CHECK(nodes_resolve(&t, big, &out) == 0 && out.ino == 1ull << 44);
	CHECK(nodes_resolve(&t, 1, &out) == 0 && out.subvol == 5 && out.ino == 256);
	CHECK(nodes_resolve(&t, (3ull << 44) + 300, &out) == 0 && out.subvol == 258 &&
	      out.ino == 300);
	/* ids no rule makes */
	CHECK(nodes_resolve(&t, 0, &out) == -ESTALE);
	CHECK(nodes_resolve(&t, 2, &out) == -ESTALE);
	CHECK(nodes_resolve(&t, (1ull << 63) | 12345, &out) == -ESTALE);
	nodes_destroy(&t);
}

static void test_root_of_a_subvolume_mount(void)
{
	struct node_table t;
	butter_ino_t out, none = I(0, 0);

	CHECK(nodes_init(&t, I(260, 256)) == 0);
	CHECK_EQ_U64(get(&t, I(260, 256), none, "", true), 1);
	CHECK_EQ_U64(get(&t, I(5, 256), none, "", false), 256);
	CHECK_EQ_U64(get(&t, I(260, 257), none, "", false), (5ull << 44) + 257);
	CHECK(nodes_resolve(&t, 1, &out) == 0 && out.subvol == 260 && out.ino == 256);
	nodes_destroy(&t);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Many inodes in many subvolumes: distinct ids, same id after forget, all resolvable. */
static void test_injective_and_stable(void)
{
	enum { NSV = 40, NINO = 500 };
	struct node_table t;
	butter_ino_t none = I(0, 0), out;
	uint64_t *ids = malloc(sizeof(*ids) * NSV * NINO);
	int bad = 0;

	CHECK(ids && nodes_init(&t, I(5, 256)) == 0);
	for (int s = 0; s < NSV; s++) {
		uint64_t sv = s == 0 ? 5 : 255 + (uint64_t)s * 1000;
		if (s == NSV - 1)
			sv = 1ull << 40; /* beyond rule 2 */
		for (int i = 0; i < NINO; i++)
			ids[s * NINO + i] = get(&t, I(sv, 256 + (uint64_t)i * 7919), none, "", true);
	}
	uint64_t *sorted = malloc(sizeof(*ids) * NSV * NINO);

	CHECK(sorted != NULL);
	memcpy(sorted, ids, sizeof(*ids) * NSV * NINO);
	qsort(sorted, NSV * NINO, sizeof(*sorted), cmp_u64);
	for (int a = 1; a < NSV * NINO; a++)
		bad |= sorted[a - 1] == sorted[a];
	free(sorted);
	CHECK(!bad);
	for (int s = 0; s < NSV; s++) {
		uint64_t sv = s == 0 ? 5 : 255 + (uint64_t)s * 1000;
		if (s == NSV - 1)
			sv = 1ull << 40;
		for (int i = 0; i < NINO; i++) {
			uint64_t id = ids[s * NINO + i];

			bad |= nodes_resolve(&t, id, &out) != 0 || out.subvol != sv ||
			       out.ino != 256 + (uint64_t)i * 7919;
			nodes_forget(&t, id, 1);
			bad |= get(&t, I(sv, 256 + (uint64_t)i * 7919), none, "", true) != id;
		}
	}
	CHECK(!bad);
	nodes_destroy(&t);
	free(ids);
}

static void test_lookup_counts(void)
{
	struct node_table t;
	butter_ino_t none = I(0, 0);
	struct timespec m1 = { 10, 1 }, m2 = { 10, 2 };

	CHECK(nodes_init(&t, I(5, 256)) == 0);
	uint64_t id = get(&t, I(5, 300), none, "", true);
	get(&t, I(5, 300), none, "", true);
	CHECK(!nodes_open_unchanged(&t, id, &m1, 100));  /* first open */
	CHECK(nodes_open_unchanged(&t, id, &m1, 100));
	CHECK(!nodes_open_unchanged(&t, id, &m2, 100));  /* mtime moved */
	CHECK(!nodes_open_unchanged(&t, id, &m2, 101));  /* size moved */
	nodes_forget(&t, id, 1);
	CHECK(nodes_open_unchanged(&t, id, &m2, 101));   /* one lookup left: still known */
	nodes_forget(&t, id, 1);
	CHECK(!nodes_open_unchanged(&t, id, &m2, 101));  /* forgotten: the node is gone */
	nodes_forget(&t, id, 5);                          /* forgetting too much is harmless */
	nodes_destroy(&t);
}

int main(void)
{
	RUN(test_rules);
	RUN(test_root_of_a_subvolume_mount);
	RUN(test_injective_and_stable);
	RUN(test_lookup_counts);
	return check_summary();
}
