/*
 * csum.c — data checksums in the csum tree.
 *
 * Items are keyed (EXTENT_CSUM_OBJECTID, EXTENT_CSUM, logical) and hold the
 * checksums of consecutive sectors from that logical address. Items never
 * overlap. Inserts write items of at most max_csums() sectors; deleting a
 * range trims, splits or removes the items it touches.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "extent/extent.h"

static u32 max_csums(const struct extent_state *es)
{
	u32 leaf_data = es->cache->nodesize - (u32)sizeof(struct btrfs_header);

	return (leaf_data - 2 * (u32)sizeof(struct btrfs_item)) / es->vol->csum_size - 1;
}

int extent_insert_csums(struct extent_state *es, struct tree_trans *t, u64 logical, u64 len,
			const u8 *csums)
{
	u32 ss = es->vol->sectorsize, cs = es->vol->csum_size, per = max_csums(es);
	u64 nsectors = len / ss, done = 0;
	int ret;

	while (done < nsectors) {
		u64 n = nsectors - done < per ? nsectors - done : per;
		struct btrfs_key key = { BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY,
					 logical + done * ss };

		ret = tree_insert_item(t, es->csum_root, &key, csums + done * cs, (u32)(n * cs));
		if (ret)
			return ret;
		done += n;
	}
	return 0;
}

int extent_delete_csums(struct extent_state *es, struct tree_trans *t, u64 logical, u64 len)
{
	u32 ss = es->vol->sectorsize, cs = es->vol->csum_size;
	u64 end = logical + len;

	for (;;) {
		struct btrfs_key key = { BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, end - 1 };
		struct tree_path path;
		u64 istart, iend;
		u32 size;
		int ret;

		/* the last item starting before @end */
		tree_path_init(&path);
		ret = tree_search_backward(es->cache, es->csum_root, &key, &path);
		if (ret) {
			tree_path_release(es->cache, &path);
			return ret < 0 ? ret : 0;
		}
		path_key(&path, &key);
		path_item(&path, &size);
		tree_path_release(es->cache, &path);
		if (key.objectid != BTRFS_EXTENT_CSUM_OBJECTID || key.type != BTRFS_EXTENT_CSUM_KEY)
			return 0;
		istart = key.offset;
		iend = istart + (u64)(size / cs) * ss;
		if (iend <= logical)
			return 0;
		ret = tree_search_slot(t, es->csum_root, &key, &path, 0, 1);
		if (ret) {
			tree_path_release(es->cache, &path);
			return ret < 0 ? ret : -EUCLEAN;
		}
		if (istart >= logical && iend <= end) {
			ret = tree_del_items(t, es->csum_root, &path, 1);
		} else if (istart < logical && iend > end) {
			/* keep the head here and re-insert the tail */
			u8 *tail;
			u32 tail_len = (u32)((iend - end) / ss * cs);
			u8 *p = path_item_mut(&path, &size);

			tail = malloc(tail_len);
			if (!tail) {
				tree_path_release(es->cache, &path);
				return -ENOMEM;
			}
			memcpy(tail, p + (end - istart) / ss * cs, tail_len);
			ret = tree_truncate_item(t, &path, (u32)((logical - istart) / ss * cs));
			tree_path_release(es->cache, &path);
			if (ret == 0) {
				struct btrfs_key tkey = { BTRFS_EXTENT_CSUM_OBJECTID,
							  BTRFS_EXTENT_CSUM_KEY, end };

				ret = tree_insert_item(t, es->csum_root, &tkey, tail, tail_len);
			}
			free(tail);
			if (ret)
				return ret;
			continue;
		} else if (istart < logical) {
			/* overlaps our start: keep its head */
			ret = tree_truncate_item(t, &path, (u32)((logical - istart) / ss * cs));
		} else {
			/* overlaps our end: drop its head by moving the key forward */
			u8 *p = path_item_mut(&path, &size);
			u32 drop = (u32)((end - istart) / ss * cs);
			struct btrfs_key nkey = key;

			memmove(p, p + drop, size - drop);
			ret = tree_truncate_item(t, &path, size - drop);
			nkey.offset = end;
			if (ret == 0)
				tree_set_item_key(&path, &nkey);
		}
		tree_path_release(es->cache, &path);
		if (ret)
			return ret;
		if (istart <= logical)
			return 0;
	}
}
