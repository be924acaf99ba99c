/*
 * block_group.c — block groups, their free space in memory, the allocator,
 * pinning, super-stripe exclusion, the tree-block hooks the tree layer calls,
 * and writing block group items at commit.
 *
 * Free space of a group = its range minus extents minus super stripes minus
 * what was allocated in the running transaction. Freed extents go to
 * es->pinned and return to their group's free space only after the commit
 * (extent_unpin), so a crash before the commit finds the old trees intact.
 *
 * Super stripes follow the kernel's rule (btrfs_rmap_block): for each
 * superblock copy, every chunk stripe holding that physical byte excludes
 * the logical range [logical, logical + io_stripe) where io_stripe is 64 KiB
 * (times the data stripes for RAID5/6), clipped to the group.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "extent/extent.h"

int extent_state_init(struct extent_state *es, struct btrfs_volumes *vol, struct node_cache *cache)
{
	memset(es, 0, sizeof(*es));
	es->vol = vol;
	es->cache = cache;
	es->log = vol->log;
	es->skinny = !!(btrfs_super_incompat_flags(&vol->super) &
			BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA);
	es->mixed = !!(btrfs_super_incompat_flags(&vol->super) &
		       BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS);
	range_set_init(&es->pinned);
	range_set_init(&es->fresh_rows);
	return 0;
}

void extent_state_destroy(struct extent_state *es)
{
	size_t i;

	for (i = 0; i < es->nbgs; i++) {
		range_set_free(&es->bgs[i]->free);
		free(es->bgs[i]);
	}
	free(es->bgs);
	for (i = 0; i < es->ndevspace; i++)
		range_set_free(&es->devspace[i].free);
	free(es->devspace);
	range_set_free(&es->pinned);
	range_set_free(&es->fresh_rows);
	free(es->refs);
	free(es->pend);
	memset(es, 0, sizeof(*es));
}

struct block_group *extent_find_bg(const struct extent_state *es, u64 logical)
{
	size_t lo = 0, hi = es->nbgs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		struct block_group *bg = es->bgs[mid];

		if (logical < bg->start)
			hi = mid;
		else if (logical - bg->start >= bg->length)
			lo = mid + 1;
		else
			return bg;
	}
	return NULL;
}

int extent_add_block_group(struct extent_state *es, u64 start, u64 length, u64 flags, u64 used,
			   int is_new, struct block_group **out)
{
	struct block_group *bg, **bgs;
	size_t pos;

	if (extent_find_bg(es, start) || (length && extent_find_bg(es, start + length - 1)))
		return BLOG_CORRUPT(es->log, "block group at %llu overlaps another",
				    (unsigned long long)start);
	bg = calloc(1, sizeof(*bg));
	if (!bg)
		return -ENOMEM;
	bgs = realloc(es->bgs, (es->nbgs + 1) * sizeof(*bgs));
	if (!bgs) {
		free(bg);
		return -ENOMEM;
	}
	es->bgs = bgs;
	bg->start = start;
	bg->length = length;
	bg->flags = flags;
	bg->used = used;
	bg->is_new = is_new;
	bg->item_dirty = is_new;
	bg->fst_dirty = is_new;
	range_set_init(&bg->free);
	for (pos = es->nbgs; pos > 0 && es->bgs[pos - 1]->start > start; pos--)
		es->bgs[pos] = es->bgs[pos - 1];
	es->bgs[pos] = bg;
	es->nbgs++;
	if (out)
		*out = bg;
	return 0;
}

int extent_exclude_super_stripes(struct extent_state *es, struct block_group *bg)
{
	const struct chunk_map *map = volumes_find_chunk(es->vol, bg->start);
	int mirror;
	u32 i;

	if (!map)
		return BLOG_CORRUPT(es->log, "block group %llu has no chunk",
				    (unsigned long long)bg->start);
	for (mirror = 0; mirror < BTRFS_SUPER_MIRROR_MAX; mirror++) {
		u64 physical = btrfs_sb_offset(mirror);
		u64 io_stripe = BTRFS_STRIPE_LEN, ssize = chunk_stripe_size(map);

		if (map->type & BTRFS_BLOCK_GROUP_RAID56_MASK)
			io_stripe = BTRFS_STRIPE_LEN * chunk_data_stripes(map);
		for (i = 0; i < map->num_stripes; i++) {
			u64 stripe_nr, offset, logical, len;
			int ret;

			if (physical < map->stripes[i].physical ||
			    physical - map->stripes[i].physical >= ssize)
				continue;
			stripe_nr = (physical - map->stripes[i].physical) / BTRFS_STRIPE_LEN;
			offset = (physical - map->stripes[i].physical) % BTRFS_STRIPE_LEN;
			if (map->type & (BTRFS_BLOCK_GROUP_RAID0 | BTRFS_BLOCK_GROUP_RAID10)) {
				stripe_nr = stripe_nr * map->num_stripes + i;
				stripe_nr /= map->sub_stripes ? map->sub_stripes : 1;
			}
			logical = bg->start + stripe_nr * io_stripe + offset;
			if (logical >= bg->start + bg->length)
				continue;
			len = io_stripe;
			if (len > bg->start + bg->length - logical)
				len = bg->start + bg->length - logical;
			ret = range_remove(&bg->free, logical, logical + len);
			if (ret)
				return ret;
		}
	}
	return 0;
}

/* Read all block group items into es->bgs (free space still empty). */
static int load_block_group_items(struct extent_state *es)
{
	struct btrfs_key key = { 0, BTRFS_BLOCK_GROUP_ITEM_KEY, 0 };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(es->cache, es->bg_root, &key, &path);
	while (ret == 0) {
		const struct btrfs_block_group_item *bgi;
		const u8 *item;
		u32 size;

		path_key(&path, &key);
		if (key.type == BTRFS_BLOCK_GROUP_ITEM_KEY) {
			item = path_item(&path, &size);
			if (size < sizeof(*bgi)) {
				ret = BLOG_CORRUPT(es->log, "block group %llu: short item",
						   (unsigned long long)key.objectid);
				break;
			}
			bgi = (const void *)item;
			if (!volumes_find_chunk(es->vol, key.objectid)) {
				ret = BLOG_CORRUPT(es->log, "block group %llu: no chunk",
						   (unsigned long long)key.objectid);
				break;
			}
			ret = extent_add_block_group(es, key.objectid, key.offset,
						     btrfs_block_group_flags(bgi),
						     btrfs_block_group_used(bgi), 0, NULL);
			if (ret)
				break;
		}
		ret = tree_next_item(es->cache, &path);
	}
	tree_path_release(es->cache, &path);
	return ret < 0 ? ret : 0;
}

/* Free space of every group from the free space tree. */
static int load_from_fst(struct extent_state *es)
{
	struct btrfs_key key = { 0, 0, 0 };
	struct tree_path path;
	u32 ss = es->vol->sectorsize;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(es->cache, es->fst_root, &key, &path);
	while (ret == 0) {
		struct block_group *bg;
		const u8 *item;
		u32 size, bit;

		path_key(&path, &key);
		bg = extent_find_bg(es, key.objectid);
		if (bg && key.type == BTRFS_FREE_SPACE_EXTENT_KEY) {
			ret = range_add(&bg->free, key.objectid, key.objectid + key.offset);
		} else if (bg && key.type == BTRFS_FREE_SPACE_BITMAP_KEY) {
			item = path_item(&path, &size);
			if ((u64)size * 8 * ss < key.offset) {
				ret = BLOG_CORRUPT(es->log, "free space bitmap at %llu: short",
						   (unsigned long long)key.objectid);
				break;
			}
			for (bit = 0; (u64)bit * ss < key.offset && ret == 0; bit++)
				if (item[bit / 8] & (1u << (bit % 8)))
					ret = range_add(&bg->free, key.objectid + (u64)bit * ss,
							key.objectid + (u64)(bit + 1) * ss);
		}
		if (ret)
			break;
		ret = tree_next_item(es->cache, &path);
	}
	tree_path_release(es->cache, &path);
	return ret < 0 ? ret : 0;
}

/* Free space of every group from the extent tree (no free space tree). */
static int load_from_extent_tree(struct extent_state *es)
{
	struct btrfs_key key = { 0, 0, 0 };
	struct tree_path path;
	size_t i;
	int ret;

	for (i = 0; i < es->nbgs; i++) {
		ret = range_add(&es->bgs[i]->free, es->bgs[i]->start,
				es->bgs[i]->start + es->bgs[i]->length);
		if (ret)
			return ret;
	}
	tree_path_init(&path);
	ret = tree_search_forward(es->cache, es->extent_root, &key, &path);
	while (ret == 0) {
		struct block_group *bg;
		u64 len = 0;

		path_key(&path, &key);
		if (key.type == BTRFS_EXTENT_ITEM_KEY)
			len = key.offset;
		else if (key.type == BTRFS_METADATA_ITEM_KEY)
			len = es->vol->nodesize;
		if (len && (bg = extent_find_bg(es, key.objectid)) != NULL)
			ret = range_remove(&bg->free, key.objectid, key.objectid + len);
		if (ret)
			break;
		ret = tree_next_item(es->cache, &path);
	}
	tree_path_release(es->cache, &path);
	if (ret < 0)
		return ret;
	for (i = 0; i < es->nbgs; i++) {
		ret = extent_exclude_super_stripes(es, es->bgs[i]);
		if (ret)
			return ret;
	}
	return 0;
}

void extent_note_unusable(struct block_group *bg)
{
	u64 taken = bg->length - (bg->free.total < bg->length ? bg->free.total : bg->length);

	bg->unusable = taken > bg->used ? taken - bg->used : 0;
}

u64 extent_bg_taken(const struct block_group *bg)
{
	u64 not_free = bg->length - (bg->free.total < bg->length ? bg->free.total : bg->length);

	return not_free > bg->unusable ? not_free - bg->unusable : 0;
}

static void note_all_unusable(struct extent_state *es)
{
	for (size_t i = 0; i < es->nbgs; i++)
		extent_note_unusable(es->bgs[i]);
}

int extent_load(struct extent_state *es)
{
	int ret = load_block_group_items(es);

	if (ret)
		return ret;
	ret = es->fst_root ? load_from_fst(es) : load_from_extent_tree(es);
	if (ret == 0)
		note_all_unusable(es);
	return ret;
}

u64 extent_forced_profile(const struct extent_state *es, u64 type)
{
	if (type & BTRFS_BLOCK_GROUP_SYSTEM)
		return es->force_profile_sys;
	if (type & BTRFS_BLOCK_GROUP_METADATA)
		return es->force_profile_meta;
	return es->force_profile_data;
}

/* The data bytes of one full stripe of @bg if it is RAID5/6, else 0 (cached in the group). */
static u64 row_bytes(struct extent_state *es, struct block_group *bg)
{
	const struct chunk_map *map;

	if (!(bg->flags & (BTRFS_BLOCK_GROUP_RAID5 | BTRFS_BLOCK_GROUP_RAID6)))
		return 0;
	if (!bg->row_bytes && (map = volumes_find_chunk(es->vol, bg->start)) != NULL)
		bg->row_bytes = (u64)chunk_data_stripes(map) * map->stripe_len;
	return bg->row_bytes;
}

/*
 * May new bytes go into the row of @bg starting at @row? Only if nothing
 * durable lies in it: the whole row is free, or this transaction opened it.
 * (Writing into a row recomputes its parity: a crash between the data and
 * the parity writes would leave durable data in the row unrecoverable once
 * a device is missing, the RAID5/6 write hole.)
 */
static int row_writable(const struct extent_state *es, const struct block_group *bg, u64 row,
			u64 rbytes)
{
	u64 end = row + rbytes < bg->start + bg->length ? row + rbytes : bg->start + bg->length;

	return range_contains(&es->fresh_rows, row, end) || range_contains(&bg->free, row, end);
}

/*
 * Find @len free bytes in RAID5/6 group @bg at or after @from whose first
 * and last rows are writable (the rows between are wholly inside the free
 * range, so free). 0 and *start, or -ENOSPC.
 */
static int find_in_rows(const struct extent_state *es, const struct block_group *bg, u64 rbytes,
			u64 len, u64 align, u64 from, u64 *start)
{
	u64 bg_end = bg->start + bg->length;

	while (from < bg_end) {
		u64 s, first, last;

		if (range_find(&bg->free, len, align, from, &s) != 0 || s < from)
			return -ENOSPC; /* none left past @from (range_find wraps around) */
		first = bg->start + (s - bg->start) / rbytes * rbytes;
		last = bg->start + (s + len - 1 - bg->start) / rbytes * rbytes;
		if (!row_writable(es, bg, first, rbytes)) {
			from = first + rbytes;
			continue;
		}
		if (last != first && !row_writable(es, bg, last, rbytes)) {
			from = last + rbytes;
			continue;
		}
		*start = s;
		return 0;
	}
	return -ENOSPC;
}

int extent_alloc(struct extent_state *es, u64 type, u64 len, u64 *logical)
{
	u64 *hint = type == BTRFS_BLOCK_GROUP_DATA	 ? &es->hint_data
		    : type == BTRFS_BLOCK_GROUP_SYSTEM ? &es->hint_sys
						       : &es->hint_meta;
	u64 align = type == BTRFS_BLOCK_GROUP_DATA ? es->vol->sectorsize : es->vol->nodesize;
	size_t i, n = es->nbgs, first = 0;
	u64 forced = extent_forced_profile(es, type);
	int pass;

	/* start at the group holding the hint */
	for (i = 0; i < n; i++)
		if (es->bgs[i]->start + es->bgs[i]->length > *hint) {
			first = i;
			break;
		}
	/*
	 * Pass 0 keeps RAID5/6 writes out of rows holding durable data (see
	 * row_writable()); when no group has such room, pass 1 takes any free
	 * space, as the kernel does, rather than fail a change the space
	 * reservation accepted.
	 */
	for (pass = 0; pass < 2; pass++)
	for (i = 0; i < n; i++) {
		struct block_group *bg = es->bgs[(first + i) % n];
		u64 start, rbytes, from;

		if (!(bg->flags & type) || !extent_bg_allocatable(bg))
			continue;
		if (forced && (bg->flags & BTRFS_BLOCK_GROUP_PROFILE_MASK) !=
				      (forced & BTRFS_BLOCK_GROUP_PROFILE_MASK))
			continue;
		if (bg->free.total < len)
			continue;
		rbytes = row_bytes(es, bg);
		from = i == 0 ? *hint : bg->start;
		if (pass == 1 && !rbytes)
			continue; /* pass 0 looked at it the same way */
		if (rbytes && pass == 0) {
			if (find_in_rows(es, bg, rbytes, len, align, from, &start) != 0 &&
			    (from == bg->start ||
			     find_in_rows(es, bg, rbytes, len, align, bg->start, &start) != 0))
				continue;
		} else if (range_find(&bg->free, len, align, from, &start) != 0) {
			continue;
		}
		if (range_remove(&bg->free, start, start + len))
			return -ENOMEM;
		if (rbytes) {
			u64 row0 = bg->start + (start - bg->start) / rbytes * rbytes;
			u64 row1 = bg->start + (start + len - 1 - bg->start) / rbytes * rbytes + rbytes;

			if (range_add(&es->fresh_rows, row0, row1))
				return -ENOMEM;
		}
		bg->fst_dirty = 1;
		*hint = start + len;
		*logical = start;
		return 0;
	}
	return -ENOSPC;
}

int extent_pin(struct extent_state *es, u64 bytenr, u64 len)
{
	struct block_group *bg = extent_find_bg(es, bytenr);

	if (bg)
		bg->fst_dirty = 1;
	return range_add(&es->pinned, bytenr, bytenr + len);
}

int extent_unpin(struct extent_state *es)
{
	size_t i;
	int ret = 0;

	for (i = 0; i < es->pinned.n && ret == 0; i++) {
		u64 start = es->pinned.r[i].start, end = es->pinned.r[i].end;

		while (start < end && ret == 0) {
			struct block_group *bg = extent_find_bg(es, start);
			u64 stop;

			if (!bg)
				break;
			stop = bg->start + bg->length < end ? bg->start + bg->length : end;
			ret = range_add(&bg->free, start, stop);
			start = stop;
		}
	}
	range_set_free(&es->pinned);
	range_set_init(&es->pinned);
	extent_seal_rows(es);
	if (ret == 0)
		note_all_unusable(es);
	return ret;
}

void extent_seal_rows(struct extent_state *es)
{
	range_set_free(&es->fresh_rows);
	range_set_init(&es->fresh_rows);
}

u64 extent_bytes_used(const struct extent_state *es)
{
	u64 sum = 0;
	size_t i;

	for (i = 0; i < es->nbgs; i++)
		sum += es->bgs[i]->used;
	return sum;
}

int extent_write_block_groups(struct extent_state *es, struct tree_trans *t)
{
	size_t i;
	int ret;

	for (i = 0; i < es->nbgs; i++) {
		struct block_group *bg = es->bgs[i];
		struct btrfs_block_group_item item;
		struct btrfs_key key = { bg->start, BTRFS_BLOCK_GROUP_ITEM_KEY, bg->length };
		struct tree_path path;

		if (!bg->item_dirty)
			continue;
		bg->item_dirty = 0;
		btrfs_set_block_group_used(&item, bg->used);
		btrfs_set_block_group_chunk_objectid(&item, BTRFS_FIRST_CHUNK_TREE_OBJECTID);
		btrfs_set_block_group_flags(&item, bg->flags);
		tree_path_init(&path);
		ret = tree_search_slot(t, es->bg_root, &key, &path, 0, 1);
		if (ret == 0) {
			u32 size;
			u8 *p = path_item_mut(&path, &size);

			memcpy(p, &item, size < sizeof(item) ? size : sizeof(item));
			ret = 0;
		}
		tree_path_release(es->cache, &path);
		if (ret == 1) {
			ret = tree_insert_item(t, es->bg_root, &key, &item, sizeof(item));
			bg->is_new = 0;
		}
		if (ret)
			return ret;
	}
	return 0;
}

/* ---- tree block hooks ---- */

static int hook_alloc_block(void *arg, struct tree_root *root, int level, u64 *bytenr)
{
	struct extent_state *es = arg;
	struct delayed_ref ref;
	u64 type = root->objectid == BTRFS_CHUNK_TREE_OBJECTID ? BTRFS_BLOCK_GROUP_SYSTEM
								: BTRFS_BLOCK_GROUP_METADATA;
	int ret = extent_alloc(es, type, es->vol->nodesize, bytenr);

	if (ret)
		return ret;
	root->bytes_used += es->vol->nodesize;
	memset(&ref, 0, sizeof(ref));
	ref.bytenr = *bytenr;
	ref.num_bytes = es->vol->nodesize;
	ref.root = root->objectid;
	ref.owner = (u64)level;
	ref.delta = 1;
	ref.generation = es->transid;
	return extent_queue_ref(es, &ref);
}

static int hook_free_block(void *arg, struct tree_root *root, struct tree_node *node)
{
	struct extent_state *es = arg;
	struct delayed_ref ref;

	if (root->bytes_used >= es->vol->nodesize)
		root->bytes_used -= es->vol->nodesize;
	memset(&ref, 0, sizeof(ref));
	ref.bytenr = node->bytenr;
	ref.num_bytes = es->vol->nodesize;
	ref.root = root->objectid;
	ref.owner = node->level;
	ref.delta = -1;
	if (node->nritems)
		node_key(node, 0, &ref.first_key);
	return extent_queue_ref(es, &ref);
}

static int hook_cow_block(void *arg, struct tree_root *root, struct tree_node *orig,
			  struct tree_node *cow)
{
	return extent_cow_refs(arg, root, orig, cow);
}

const struct tree_block_ops extent_tree_block_ops = {
	.alloc_block = hook_alloc_block,
	.free_block = hook_free_block,
	.cow_block = hook_cow_block,
};
