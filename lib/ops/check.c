/*
 * check.c — butter_check(): a read-only consistency check of the trees and
 * of the extent tree's bookkeeping, in the spirit of `btrfs check
 * --readonly` (which stays the oracle; this one is ours, for machines
 * without btrfs-progs and as a second opinion).
 *
 * What it checks:
 *  1. Every tree (the root and chunk trees, and every tree with a ROOT_ITEM)
 *     reads: each block passes node_validate() (checksum, bytenr, fsid,
 *     level, item layout) and matches its parent's pointer (generation,
 *     level, first key).
 *  2. References: each tree block is reached once per distinct parent node
 *     (or root item) that points at it, and each data extent once per file
 *     extent item that points at it, counting a shared block's pointers once
 *     however many trees share it. Those counts must equal the refs of the
 *     block's or extent's item in the extent tree, every reached block and
 *     extent must have one, and every item must be reached. A file extent
 *     item must name its extent's full length.
 *  3. Block groups: each block group item's "used" equals the bytes of the
 *     extent items inside it.
 *  4. Devices: each present device is at least as large as its dev item's
 *     total_bytes (a truncated image fails here, as in btrfs check).
 * Not checked yet (btrfs check does): inode link counts and directory
 * entries, data checksum coverage, the free space tree, the chunk/device
 * extent correspondence. A tree being dropped (a deleted subvolume the
 * kernel left half freed) is not walked and makes the reference counts
 * unknowable: they are then skipped, and said so (what the other trees
 * reach must still have extent items, and block groups are still checked).
 *
 * Errors are logged through the handle's log, one line each, and counted.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "butter/butter.h"
#include "format/ondisk.h"
#include "ops/ops.h"

#define MAX_REPORTS 50 /* lines per kind of problem; the counts go on */

struct seen {
	u64 bytenr;          /* 0: empty slot */
	u64 len;             /* data: disk_num_bytes the file extent items name */
	u32 refs;
	u8 kind;             /* 1 tree block, 2 data extent */
	u8 has_item;
};

struct checker {
	struct butter_fs *fs;
	struct butter_check_result *res;
	struct seen *v;
	size_t cap, n;
	u64 reports;
	int skip_refs;
};

static void report(struct checker *c, const char *fmt, unsigned long long a,
		   unsigned long long b, unsigned long long d)
{
	c->res->errors++;
	if (c->reports++ < MAX_REPORTS) {
		char msg[256];

		/* every caller passes a literal taking up to three %llu */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
		snprintf(msg, sizeof(msg), fmt, a, b, d);
#pragma GCC diagnostic pop
		blog_err(&c->fs->log, "check: %s", msg);
	}
}

static size_t slot_of(u64 bytenr, size_t cap)
{
	u64 h = bytenr * 0x9E3779B97F4A7C15ull;

	return (size_t)(h >> 17) & (cap - 1);
}

static int grow(struct checker *c)
{
	size_t cap = c->cap ? c->cap * 2 : 4096, i;
	struct seen *v = calloc(cap, sizeof(*v));

	if (!v)
		return -ENOMEM;
	for (i = 0; i < c->cap; i++) {
		size_t j;

		if (!c->v[i].bytenr)
			continue;
		for (j = slot_of(c->v[i].bytenr, cap); v[j].bytenr; j = (j + 1) & (cap - 1))
			;
		v[j] = c->v[i];
	}
	free(c->v);
	c->v = v;
	c->cap = cap;
	return 0;
}

/* The record of @bytenr, made if missing (NULL on ENOMEM). */
static struct seen *get(struct checker *c, u64 bytenr, int make)
{
	size_t j;

	if (c->cap)
		for (j = slot_of(bytenr, c->cap); c->v[j].bytenr; j = (j + 1) & (c->cap - 1))
			if (c->v[j].bytenr == bytenr)
				return &c->v[j];
	if (!make)
		return NULL;
	if ((c->n + 1) * 2 > c->cap && grow(c))
		return NULL;
	for (j = slot_of(bytenr, c->cap); c->v[j].bytenr; j = (j + 1) & (c->cap - 1))
		;
	c->v[j].bytenr = bytenr;
	c->n++;
	return &c->v[j];
}

/* ---- 1 and 2: the walk -------------------------------------------------------- */

static int note_data(struct checker *c, const struct tree_node *leaf)
{
	u32 i;

	for (i = 0; i < leaf->nritems; i++) {
		struct btrfs_key key;
		const struct btrfs_file_extent_item *fe;
		struct seen *s;
		u64 bytenr, len;

		node_key(leaf, i, &key);
		if (key.type != BTRFS_EXTENT_DATA_KEY)
			continue;
		if (leaf_item_size(leaf, i) < sizeof(*fe))
			continue; /* inline */
		fe = (const void *)leaf_item_data(leaf, i);
		if (fe->type != BTRFS_FILE_EXTENT_REG && fe->type != BTRFS_FILE_EXTENT_PREALLOC)
			continue;
		bytenr = btrfs_file_extent_disk_bytenr(fe);
		len = btrfs_file_extent_disk_num_bytes(fe);
		if (!bytenr)
			continue; /* a hole */
		s = get(c, bytenr, 1);
		if (!s)
			return -ENOMEM;
		if (s->kind == 1) {
			report(c, "data extent %llu (inode %llu) is also a tree block", bytenr,
			       key.objectid, 0);
			continue;
		}
		if (s->kind == 2 && s->len != len)
			report(c, "data extent %llu is named with lengths %llu and %llu", bytenr,
			       s->len, len);
		s->kind = 2;
		s->len = len;
		s->refs++;
		c->res->data_refs++;
	}
	return 0;
}

/* Visit @node (reached through one more pointer); walk its children the first time. */
static int visit(struct checker *c, struct tree_node *node, int data_tree)
{
	struct seen *s = get(c, node->bytenr, 1);
	u32 i;
	int ret = 0;

	if (!s)
		return -ENOMEM;
	if (s->kind == 2) {
		report(c, "tree block %llu is also a data extent", node->bytenr, 0, 0);
		return 0;
	}
	s->kind = 1;
	if (s->refs++)
		return 0; /* shared: its own pointers were counted the first time */
	c->res->tree_blocks++;
	if (node->level == 0)
		return data_tree ? note_data(c, node) : 0;
	for (i = 0; i < node->nritems && ret == 0; i++) {
		struct tree_node *child;

		ret = node_read_child(&c->fs->cache, node, i, &child);
		if (ret) {
			report(c, "tree block %llu: child %llu cannot be read", node->bytenr,
			       btrfs_key_ptr_blockptr(node_key_ptr(node, i)), 0);
			ret = 0;
			continue;
		}
		ret = visit(c, child, data_tree);
		node_put(&c->fs->cache, child);
	}
	return ret;
}

static int walk_root(struct checker *c, u64 objectid, u64 bytenr, u64 gen, int level,
		     int data_tree)
{
	struct tree_node *root;
	int ret = node_read(&c->fs->cache, bytenr, gen, level, NULL, &root);

	if (ret) {
		report(c, "tree %llu: its root block %llu cannot be read", objectid, bytenr, 0);
		return 0;
	}
	ret = visit(c, root, data_tree);
	node_put(&c->fs->cache, root);
	c->res->trees++;
	return ret;
}

static int is_data_tree(u64 id)
{
	return id == BTRFS_FS_TREE_OBJECTID || id == BTRFS_DATA_RELOC_TREE_OBJECTID ||
	       id == BTRFS_TREE_RELOC_OBJECTID ||
	       (id >= BTRFS_FIRST_FREE_OBJECTID && id <= BTRFS_LAST_FREE_OBJECTID);
}

static int walk_all(struct checker *c)
{
	struct butter_fs *fs = c->fs;
	const struct btrfs_super_block *sb = &fs->vol.super;
	struct btrfs_key key = { 0, BTRFS_ROOT_ITEM_KEY, 0 };
	struct tree_path path;
	int ret;

	ret = walk_root(c, BTRFS_ROOT_TREE_OBJECTID, btrfs_super_root(sb),
			btrfs_super_generation(sb), sb->root_level, 0);
	if (ret == 0)
		ret = walk_root(c, BTRFS_CHUNK_TREE_OBJECTID, btrfs_super_chunk_root(sb),
				btrfs_super_chunk_root_generation(sb), sb->chunk_root_level, 0);
	tree_path_init(&path);
	if (ret == 0)
		ret = tree_search_forward(&fs->cache, &fs->root_tree, &key, &path);
	while (ret == 0) {
		struct btrfs_root_item ri;
		const u8 *item;
		u32 size;

		path_key(&path, &key);
		item = path_item(&path, &size);
		if (key.type == BTRFS_ROOT_ITEM_KEY && size >= BTRFS_ROOT_ITEM_V1_SIZE) {
			memset(&ri, 0, sizeof(ri));
			memcpy(&ri, item, size < sizeof(ri) ? size : sizeof(ri));
			if (ri.drop_level || get_le64(&ri.drop_progress.objectid)) {
				/* part of it is freed already: its pointers prove nothing */
				blog_warn(&fs->log, "check: tree %llu is being dropped: reference "
					  "counts are not checked", (unsigned long long)key.objectid);
				c->skip_refs = 1;
			} else {
				ret = walk_root(c, key.objectid, btrfs_root_bytenr(&ri),
						btrfs_root_generation(&ri), ri.level,
						is_data_tree(key.objectid));
				if (ret)
					break;
			}
		}
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	return ret < 0 ? ret : 0;
}

/* ---- 2 and 3: the extent tree against the walk ------------------------------------- */

struct bg {
	u64 start, len, used, counted;
};

static int load_block_groups(struct checker *c, struct bg **out, size_t *n)
{
	struct butter_fs *fs = c->fs;
	struct tree_root *root = fs->has_block_group_tree ? &fs->block_group_tree
							   : &fs->extent_tree;
	struct btrfs_key key = { 0, BTRFS_BLOCK_GROUP_ITEM_KEY, 0 };
	struct tree_path path;
	size_t cap = 0;
	int ret;

	*out = NULL;
	*n = 0;
	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, root, &key, &path);
	while (ret == 0) {
		const u8 *item;
		u32 size;

		path_key(&path, &key);
		item = path_item(&path, &size);
		if (key.type == BTRFS_BLOCK_GROUP_ITEM_KEY &&
		    size >= sizeof(struct btrfs_block_group_item)) {
			if (*n == cap) {
				struct bg *v = realloc(*out, (cap ? cap * 2 : 64) * sizeof(*v));

				if (!v) {
					ret = -ENOMEM;
					break;
				}
				*out = v;
				cap = cap ? cap * 2 : 64;
			}
			(*out)[(*n)++] = (struct bg){ key.objectid, key.offset,
						      get_le64(item), 0 };
		}
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	return ret < 0 ? ret : 0;
}

static struct bg *bg_of(struct bg *v, size_t n, u64 bytenr)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (bytenr < v[mid].start)
			hi = mid;
		else if (bytenr - v[mid].start >= v[mid].len)
			lo = mid + 1;
		else
			return &v[mid];
	}
	return NULL;
}

static int compare_extents(struct checker *c)
{
	struct butter_fs *fs = c->fs;
	struct btrfs_key key = { 0, 0, 0 };
	struct tree_path path;
	struct bg *bgs;
	size_t nbgs, i;
	int ret = load_block_groups(c, &bgs, &nbgs);

	if (ret)
		return ret;
	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &fs->extent_tree, &key, &path);
	while (ret == 0) {
		struct btrfs_extent_item ei;
		const u8 *item;
		u32 size;
		u64 len, refs;
		int tree;
		struct seen *s;
		struct bg *bg;

		path_key(&path, &key);
		item = path_item(&path, &size);
		if ((key.type != BTRFS_EXTENT_ITEM_KEY && key.type != BTRFS_METADATA_ITEM_KEY) ||
		    size < sizeof(ei)) {
			ret = tree_next_item(&fs->cache, &path);
			continue;
		}
		memcpy(&ei, item, sizeof(ei));
		refs = btrfs_extent_refs(&ei);
		tree = key.type == BTRFS_METADATA_ITEM_KEY ||
		       (btrfs_extent_flags(&ei) & BTRFS_EXTENT_FLAG_TREE_BLOCK);
		len = key.type == BTRFS_METADATA_ITEM_KEY ? fs->vol.nodesize : key.offset;
		c->res->extent_items++;
		bg = bg_of(bgs, nbgs, key.objectid);
		if (!bg)
			report(c, "extent %llu+%llu lies in no block group", key.objectid, len, 0);
		else
			bg->counted += len;
		s = get(c, key.objectid, 0);
		if (!s || !s->refs) {
			if (!c->skip_refs)
				report(c, "extent %llu has an extent item (refs %llu) but nothing "
				       "points at it", key.objectid, refs, 0);
		} else {
			s->has_item = 1;
			if (tree != (s->kind == 1))
				report(c, "extent %llu: the extent item and the trees disagree on "
				       "whether it is a tree block or data", key.objectid, 0, 0);
			else if (!c->skip_refs && refs != s->refs)
				report(c, "extent %llu: the extent item counts %llu references, the "
				       "trees hold %llu", key.objectid, refs, s->refs);
			if (!tree && s->len != len)
				report(c, "data extent %llu: %llu bytes in the extent tree, %llu in "
				       "the file extent items", key.objectid, len, s->len);
		}
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	if (ret < 0) {
		free(bgs);
		return ret;
	}
	for (i = 0; i < c->cap; i++)
		if (c->v[i].bytenr && c->v[i].refs && !c->v[i].has_item)
			report(c, "extent %llu is used (%llu references) but has no extent item",
			       c->v[i].bytenr, c->v[i].refs, 0);
	for (i = 0; i < nbgs; i++)
		if (bgs[i].used != bgs[i].counted)
			report(c, "block group %llu: used %llu, its extents add up to %llu",
			       bgs[i].start, bgs[i].used, bgs[i].counted);
	c->res->block_groups = nbgs;
	free(bgs);
	return 0;
}

/* What 4 checks: no present device is smaller than its dev item says. */
static void check_device_sizes(struct checker *c)
{
	for (size_t i = 0; i < c->fs->vol.ndevs; i++) {
		const struct btrfs_device *dev = c->fs->vol.devs[i];

		if (dev->bdev && dev->bdev->size < dev->total_bytes)
			report(c, "device %llu is %llu bytes, smaller than its total_bytes %llu",
			       dev->devid, dev->bdev->size, dev->total_bytes);
	}
}

int ops_check(struct butter_fs *fs, struct butter_check_result *res)
{
	struct checker c = { .fs = fs, .res = res };
	int ret;

	memset(res, 0, sizeof(*res));
	check_device_sizes(&c);
	ret = grow(&c);
	if (ret == 0)
		ret = walk_all(&c);
	if (ret == 0)
		ret = compare_extents(&c);
	res->refs_checked = !c.skip_refs;
	free(c.v);
	return ret;
}
