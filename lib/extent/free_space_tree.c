/*
 * free_space_tree.c — writing the free space tree at commit.
 *
 * For each block group whose free space changed, its entries are brought to
 *   (start, FREE_SPACE_INFO, length)   {extent_count, flags = 0}
 *   (s, FREE_SPACE_EXTENT, len)        for each free range
 * by changing only what differs from the entries on disk (an item whose
 * range only moved gets its new key in place). Free here means free in the
 * state being committed: the allocator's free space plus what this
 * transaction pinned. Only the extent form is written (never bitmaps; a group
 * in bitmap form is rewritten whole); both are valid on disk.
 *
 * Why not rewrite each group whole: the rewrite itself allocates tree blocks
 * in the groups it describes, which dirties them again; on a fragmented group
 * the commit loop then never reaches its fixpoint.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "extent/extent.h"

/* Delete all items with objectid in [start, end). */
static int delete_range(struct extent_state *es, struct tree_trans *t, struct tree_root *root,
			u64 start, u64 end)
{
	for (;;) {
		struct btrfs_key key = { start, 0, 0 };
		struct tree_path path;
		u32 slot, nr = 0;
		int ret;

		tree_path_init(&path);
		ret = tree_search_slot(t, root, &key, &path, 0, 1);
		if (ret < 0)
			return ret;
		slot = path.slots[0];
		if (slot >= path.nodes[0]->nritems) {
			/* the next item may sit in the next leaf: look without cow first */
			struct btrfs_key next;

			tree_path_release(es->cache, &path);
			ret = tree_search_forward(es->cache, root, &key, &path);
			if (ret) {
				tree_path_release(es->cache, &path);
				return ret < 0 ? ret : 0;
			}
			path_key(&path, &next);
			tree_path_release(es->cache, &path);
			if (next.objectid >= end)
				return 0;
			ret = tree_search_slot(t, root, &next, &path, 0, 1);
			if (ret) {
				tree_path_release(es->cache, &path);
				return ret < 0 ? ret : -EUCLEAN;
			}
			slot = path.slots[0];
		}
		while (slot + nr < path.nodes[0]->nritems) {
			node_key(path.nodes[0], slot + nr, &key);
			if (key.objectid >= end)
				break;
			nr++;
		}
		if (nr == 0) {
			tree_path_release(es->cache, &path);
			return 0;
		}
		path.slots[0] = slot;
		ret = tree_del_items(t, root, &path, nr);
		tree_path_release(es->cache, &path);
		if (ret)
			return ret;
	}
}

/*
 * Read the entries of the group at [start, end): its info item (-ENOENT if
 * none) and its extents into @have. *bitmaps is set when any bitmap item or
 * the bitmap flag is found (those groups are rewritten whole).
 */
static int read_group(struct extent_state *es, u64 start, u64 end, struct range_set *have,
		      int *bitmaps, int *has_info)
{
	struct btrfs_key key = { start, 0, 0 };
	struct tree_path path;
	int ret;

	*bitmaps = 0;
	*has_info = 0;
	tree_path_init(&path);
	ret = tree_search_forward(es->cache, es->fst_root, &key, &path);
	while (ret == 0) {
		path_key(&path, &key);
		if (key.objectid >= end)
			break;
		if (key.type == BTRFS_FREE_SPACE_INFO_KEY) {
			u32 size;
			const u8 *p = path_item(&path, &size);

			*has_info = 1;
			if (size >= sizeof(struct btrfs_free_space_info) &&
			    (get_le32(&((const struct btrfs_free_space_info *)p)->flags) &
			     BTRFS_FREE_SPACE_USING_BITMAPS))
				*bitmaps = 1;
		} else if (key.type == BTRFS_FREE_SPACE_BITMAP_KEY) {
			*bitmaps = 1;
		} else if (key.type == BTRFS_FREE_SPACE_EXTENT_KEY) {
			ret = range_add(have, key.objectid, key.objectid + key.offset);
			if (ret)
				break;
		}
		ret = tree_next_item(es->cache, &path);
	}
	tree_path_release(es->cache, &path);
	return ret < 0 ? ret : 0;
}

/* The item at exactly @key: give it @new_key, or overwrite it with @data, or (neither) delete it. */
static int change_item(struct extent_state *es, struct tree_trans *t, const struct btrfs_key *key,
		       const struct btrfs_key *new_key, const void *data, u32 size)
{
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(t, es->fst_root, key, &path, 0, 1);
	if (ret == 1)
		ret = BLOG_CORRUPT(es->log, "free space tree: item (%llu %u %llu) vanished",
				   (unsigned long long)key->objectid, key->type,
				   (unsigned long long)key->offset);
	if (ret == 0) {
		if (new_key) {
			tree_set_item_key(&path, new_key);
		} else if (data) {
			u32 have;
			u8 *p = path_item_mut(&path, &have);

			memcpy(p, data, have < size ? have : size);
		} else {
			ret = tree_del_items(t, es->fst_root, &path, 1);
		}
	}
	tree_path_release(es->cache, &path);
	return ret;
}

static int extent_key(const struct range *r, struct btrfs_key *key)
{
	key->objectid = r->start;
	key->type = BTRFS_FREE_SPACE_EXTENT_KEY;
	key->offset = r->end - r->start;
	return 0;
}

/*
 * Bring the group's extent items from @have to @want, changing as few items
 * as possible: a range that only moved its edges keeps its item (new key in
 * place), so the common case allocates no tree block and the commit loop
 * reaches its fixpoint.
 */
static int update_extents(struct extent_state *es, struct tree_trans *t,
			  const struct range_set *have, const struct range_set *want)
{
	size_t i = 0, j = 0;
	struct btrfs_key a, b;
	int ret = 0;

	while (ret == 0 && (i < have->n || j < want->n)) {
		const struct range *h = i < have->n ? &have->r[i] : NULL;
		const struct range *w = j < want->n ? &want->r[j] : NULL;

		if (h && w && h->start == w->start && h->end == w->end) {
			i++;
			j++;
			continue;
		}
		if (h && w && h->start < w->end && w->start < h->end &&
		    (i + 1 >= have->n || have->r[i + 1].start >= w->end) &&
		    (j + 1 >= want->n || want->r[j + 1].start >= h->end)) {
			/* one range for one range, overlapping: order among neighbours holds */
			extent_key(h, &a);
			extent_key(w, &b);
			ret = change_item(es, t, &a, &b, NULL, 0);
			i++;
			j++;
		} else if (h && (!w || h->start < w->start)) {
			extent_key(h, &a);
			ret = change_item(es, t, &a, NULL, NULL, 0);
			i++;
		} else {
			extent_key(w, &b);
			ret = tree_insert_item(t, es->fst_root, &b, NULL, 0);
			j++;
		}
	}
	return ret;
}

static int write_group(struct extent_state *es, struct tree_trans *t, struct block_group *bg)
{
	u64 end = bg->start + bg->length;
	struct range_set want, have;
	struct btrfs_free_space_info info;
	struct btrfs_key key;
	int ret, bitmaps, has_info;
	size_t i;

	range_set_init(&want);
	range_set_init(&have);
	for (i = 0; i < bg->free.n; i++) {
		ret = range_add(&want, bg->free.r[i].start, bg->free.r[i].end);
		if (ret)
			goto out;
	}
	for (i = 0; i < es->pinned.n; i++) {
		u64 s = es->pinned.r[i].start, e = es->pinned.r[i].end;

		if (e <= bg->start || s >= end)
			continue;
		ret = range_add(&want, s < bg->start ? bg->start : s, e > end ? end : e);
		if (ret)
			goto out;
	}
	ret = read_group(es, bg->start, end, &have, &bitmaps, &has_info);
	if (ret)
		goto out;
	if (bitmaps) {
		/* a kernel-written group in bitmap form: rewrite it as extents */
		ret = delete_range(es, t, es->fst_root, bg->start, end);
		range_set_free(&have);
		range_set_init(&have);
		has_info = 0;
		if (ret)
			goto out;
	}
	put_le32(&info.extent_count, (u32)want.n);
	put_le32(&info.flags, 0);
	key.objectid = bg->start;
	key.type = BTRFS_FREE_SPACE_INFO_KEY;
	key.offset = bg->length;
	if (has_info)
		ret = change_item(es, t, &key, NULL, &info, sizeof(info));
	else
		ret = tree_insert_item(t, es->fst_root, &key, &info, sizeof(info));
	if (ret == 0)
		ret = update_extents(es, t, &have, &want);
out:
	range_set_free(&want);
	range_set_free(&have);
	return ret;
}

int extent_fst_drop_group(struct extent_state *es, struct tree_trans *t, u64 start, u64 len)
{
	if (!es->fst_root)
		return 0;
	return delete_range(es, t, es->fst_root, start, start + len);
}

int extent_write_free_space_tree(struct extent_state *es, struct tree_trans *t)
{
	size_t i;
	int ret;

	if (!es->fst_root)
		return 0;
	for (i = 0; i < es->nbgs; i++) {
		struct block_group *bg = es->bgs[i];

		if (!bg->fst_dirty)
			continue;
		bg->fst_dirty = 0;
		ret = write_group(es, t, bg);
		if (ret)
			return ret;
	}
	return 0;
}
