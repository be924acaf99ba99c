/*
 * search.c — butter_tree_search(): the items of any tree in a key range, as
 * the kernel's BTRFS_IOC_TREE_SEARCH (v1) hands them to tools such as
 * python3-btrfs, so that the mount can answer that ioctl (fuse/btrfs_ioctl.c)
 * and a library user can read what the kernel's users read.
 *
 * The walk is the kernel's: from the minimum key, one leaf at a time, every
 * item of the leaf at or after the position whose whole key lies in
 * [min, max] is copied; then the search starts again at the key after the
 * last one looked at. Leaves outside [min_transid, max_transid] are passed
 * over whole (the kernel skips older subtrees from their parent pointers;
 * the items returned are the same). The caller holds the handle's lock
 * shared, so the trees do not move under the walk.
 */
#include <errno.h>
#include <string.h>

#include "fs/change.h"
#include "ops/ops.h"

/* The live root of tree @id into *out; -ENOENT when the filesystem has no such tree. */
static int search_root(struct butter_fs *fs, u64 id, struct tree_root *out)
{
	struct fs_write_state *w = fs->w;
	const struct tree_root *tr = NULL;
	struct subvol *sv;
	int err = 0;

	switch (id) {
	case BTRFS_ROOT_TREE_OBJECTID:
		tr = &fs->root_tree;
		break;
	case BTRFS_EXTENT_TREE_OBJECTID:
		tr = &fs->extent_tree;
		break;
	case BTRFS_CHUNK_TREE_OBJECTID:
		tr = &fs->chunk_tree;
		break;
	case BTRFS_CSUM_TREE_OBJECTID:
		tr = fs->has_csum_tree ? &fs->csum_tree : NULL;
		break;
	case BTRFS_BLOCK_GROUP_TREE_OBJECTID:
		tr = fs->has_block_group_tree ? &fs->block_group_tree : NULL;
		break;
	case BTRFS_DEV_TREE_OBJECTID:
	case BTRFS_QUOTA_TREE_OBJECTID:
	case BTRFS_UUID_TREE_OBJECTID:
	case BTRFS_FREE_SPACE_TREE_OBJECTID:
		if (w) {
			if (id == BTRFS_DEV_TREE_OBJECTID)
				tr = &w->dev_tree;
			else if (id == BTRFS_FREE_SPACE_TREE_OBJECTID)
				tr = w->es.fst_root;
			else if (id == BTRFS_UUID_TREE_OBJECTID)
				tr = w->uuid_tree.objectid ? &w->uuid_tree : NULL;
			else
				tr = w->quota_tree.objectid ? &w->quota_tree : NULL;
			break;
		}
		/* read-only: the tree as its root item has it, which nothing changes */
		err = fs_load_root(fs, id, out);
		return err == -ENOENT || err == 1 ? -ENOENT : err;
	default:
		sv = fs_subvol_cached(fs, id, &err);
		if (!sv)
			return err;
		tr = &sv->root;
		break;
	}
	if (!tr)
		return -ENOENT;
	*out = *tr;
	return 0;
}

static int key_in_range(const struct btrfs_key *k, const struct btrfs_key *min,
			const struct btrfs_key *max)
{
	return btrfs_comp_keys(k, min) >= 0 && btrfs_comp_keys(k, max) <= 0;
}

/* The key just after @k in key order; 0, or 1 when @k is the very last key. */
static int key_next(struct btrfs_key *k)
{
	if (k->offset != (u64)-1) {
		k->offset++;
		return 0;
	}
	k->offset = 0;
	if (k->type != 0xff) {
		k->type++;
		return 0;
	}
	k->type = 0;
	if (k->objectid != (u64)-1) {
		k->objectid++;
		return 0;
	}
	return 1;
}

int ops_tree_search(struct butter_fs *fs, const struct butter_search_key *sk, uint32_t nr_items,
		    void *buf, size_t bufsize, uint32_t *nr_found)
{
	struct btrfs_key min, max, pos;
	struct tree_root root;
	struct tree_path path;
	uint8_t *out = buf;
	size_t used = 0;
	uint32_t found = 0;
	int ret, done = 0;

	*nr_found = 0;
	if (sk->min_type > 0xff || sk->max_type > 0xff)
		return -EINVAL;
	ret = search_root(fs, sk->tree_id, &root);
	if (ret)
		return ret;
	min = (struct btrfs_key){ sk->min_objectid, (u8)sk->min_type, sk->min_offset };
	max = (struct btrfs_key){ sk->max_objectid, (u8)sk->max_type, sk->max_offset };
	pos = min;
	tree_path_init(&path);
	while (!done && btrfs_comp_keys(&pos, &max) <= 0) {
		struct tree_node *leaf;
		struct btrfs_key k = pos;
		u32 slot;

		ret = tree_search_forward(&fs->cache, &root, &pos, &path);
		if (ret)
			break; /* 1: no item at or after pos */
		leaf = path_leaf(&path);
		if (leaf->generation < sk->min_transid || leaf->generation > sk->max_transid) {
			/* the whole leaf is outside the generations asked for */
			node_key(leaf, leaf->nritems - 1, &k);
			goto advance;
		}
		for (slot = path.slots[0]; slot < leaf->nritems; slot++) {
			struct butter_search_header h;
			u32 len = leaf_item_size(leaf, slot);

			node_key(leaf, slot, &k);
			if (!key_in_range(&k, &min, &max))
				continue;
			if (sizeof(h) + len > bufsize) {
				if (found) {
					done = 1;
					break;
				}
				len = 0; /* alone and too large: its header, no bytes */
				done = 1;
			} else if (used + sizeof(h) + len > bufsize) {
				done = 1;
				break;
			}
			h = (struct butter_search_header){ leaf->generation, k.objectid, k.offset,
							   k.type, len };
			memcpy(out + used, &h, sizeof(h));
			memcpy(out + used + sizeof(h), leaf_item_data(leaf, slot), len);
			used += sizeof(h) + len;
			if (++found >= nr_items || done) {
				done = 1;
				break;
			}
		}
advance:
		tree_path_release(&fs->cache, &path);
		if (!done && (btrfs_comp_keys(&k, &max) >= 0 || key_next(&k)))
			done = 1;
		pos = k;
	}
	tree_path_release(&fs->cache, &path);
	*nr_found = found;
	return ret < 0 ? ret : 0;
}
