/*
 * free_space_tree.c — writing the free space tree at commit.
 *
 * For each block group whose free space changed, its entries are rewritten
 * whole: every item with objectid inside the group is deleted, then
 *   (start, FREE_SPACE_INFO, length)   {extent_count, flags = 0}
 *   (s, FREE_SPACE_EXTENT, len)        for each free range
 * are inserted. Free here means free in the state being committed: the
 * allocator's free space plus what this transaction pinned. Only the extent
 * form is written (never bitmaps); both are valid on disk.
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

static int write_group(struct extent_state *es, struct tree_trans *t, struct block_group *bg)
{
	u64 end = bg->start + bg->length;
	struct range_set fs;
	struct btrfs_free_space_info info;
	struct btrfs_key key;
	size_t i;
	int ret;

	range_set_init(&fs);
	for (i = 0; i < bg->free.n; i++) {
		ret = range_add(&fs, bg->free.r[i].start, bg->free.r[i].end);
		if (ret)
			goto out;
	}
	for (i = 0; i < es->pinned.n; i++) {
		u64 s = es->pinned.r[i].start, e = es->pinned.r[i].end;

		if (e <= bg->start || s >= end)
			continue;
		ret = range_add(&fs, s < bg->start ? bg->start : s, e > end ? end : e);
		if (ret)
			goto out;
	}
	ret = delete_range(es, t, es->fst_root, bg->start, end);
	if (ret)
		goto out;
	put_le32(&info.extent_count, (u32)fs.n);
	put_le32(&info.flags, 0);
	key.objectid = bg->start;
	key.type = BTRFS_FREE_SPACE_INFO_KEY;
	key.offset = bg->length;
	ret = tree_insert_item(t, es->fst_root, &key, &info, sizeof(info));
	for (i = 0; i < fs.n && ret == 0; i++) {
		key.objectid = fs.r[i].start;
		key.type = BTRFS_FREE_SPACE_EXTENT_KEY;
		key.offset = fs.r[i].end - fs.r[i].start;
		ret = tree_insert_item(t, es->fst_root, &key, NULL, 0);
	}
out:
	range_set_free(&fs);
	return ret;
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
