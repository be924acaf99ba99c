/*
 * backref.c — who references a tree block, once blocks are shared between
 * trees (snapshots), and how a copy-on-write keeps every reference right.
 *
 * The rule btrfs check verifies (and this file maintains): every block B
 * reachable from a root gives each block or data extent it points at one
 * reference of this kind:
 *   - B's extent item has BTRFS_BLOCK_FLAG_FULL_BACKREF: a shared reference
 *     naming B itself (SHARED_BLOCK_REF / SHARED_DATA_REF, parent = B);
 *   - otherwise: a reference keyed by B's owner (TREE_BLOCK_REF owner /
 *     EXTENT_DATA_REF owner, inode, offset), one for all such B of that owner.
 * A block is shared when its extent item counts more than one reference;
 * only trees that can be snapshotted (subvolumes) share blocks, and in them a
 * block can be shared only if it is not a root and is no newer than the
 * tree's last snapshot.
 *
 * Copying a block B of tree T into C (the COW of T's path), by cases:
 *   B shared, owned by T, not FULL_BACKREF: B's pointees get shared refs
 *     naming B and B becomes FULL_BACKREF (other trees keep using B); the
 *     keyed refs of T move to C unchanged.
 *   B shared otherwise: C's pointees get keyed refs for T (B keeps its own).
 *   B not shared, FULL_BACKREF: C's pointees get keyed refs for T and lose
 *     the shared refs naming B (B goes away).
 *   B not shared, plain: T's keyed refs already describe C; B goes away
 *     (if B's owner is another, deleted tree, its keyed refs move to T).
 * Then the caller drops T's reference to B (freeing B when it was the last).
 */
#include <errno.h>
#include <string.h>

#include "extent/extent.h"

int extent_tree_shareable(u64 objectid)
{
	return objectid == BTRFS_FS_TREE_OBJECTID || objectid == BTRFS_TREE_RELOC_OBJECTID ||
	       (objectid >= BTRFS_FIRST_FREE_OBJECTID && objectid <= BTRFS_LAST_FREE_OBJECTID);
}

int extent_node_refs(struct extent_state *es, const struct tree_node *node, u64 root_id, int full,
		     int delta)
{
	struct delayed_ref ref;
	struct btrfs_key key;
	u32 slot;
	int ret;

	for (slot = 0; slot < node->nritems; slot++) {
		memset(&ref, 0, sizeof(ref));
		ref.delta = delta;
		ref.root = full ? 0 : root_id;
		ref.parent = full ? node->bytenr : 0;
		node_key(node, slot, &key);
		if (node->level > 0) {
			const struct btrfs_key_ptr *p = node_key_ptr(node, slot);

			ref.bytenr = get_le64(&p->blockptr);
			ref.num_bytes = es->vol->nodesize;
			ref.owner = (u64)node->level - 1;
			ref.generation = get_le64(&p->generation);
			ref.first_key = key;
		} else {
			const struct btrfs_file_extent_item *fi;

			if (key.type != BTRFS_EXTENT_DATA_KEY)
				continue;
			fi = (const void *)leaf_item_data(node, slot);
			if (leaf_item_size(node, slot) >= BTRFS_FILE_EXTENT_INLINE_DATA_START &&
			    fi->type == BTRFS_FILE_EXTENT_INLINE)
				continue;
			if (leaf_item_size(node, slot) < sizeof(*fi))
				return BLOG_CORRUPT(es->log,
						    "tree block %llu slot %u: short file extent item",
						    (unsigned long long)node->bytenr, slot);
			ref.bytenr = btrfs_file_extent_disk_bytenr(fi);
			if (ref.bytenr == 0)
				continue; /* a hole */
			ref.num_bytes = btrfs_file_extent_disk_num_bytes(fi);
			ref.is_data = 1;
			ref.owner = key.objectid;
			ref.offset = key.offset - btrfs_file_extent_offset(fi);
		}
		ret = extent_queue_ref(es, &ref);
		if (ret)
			return ret;
	}
	return 0;
}

int extent_set_block_flags(struct extent_state *es, const struct tree_node *node, u64 flags)
{
	struct delayed_ref ref;

	memset(&ref, 0, sizeof(ref));
	ref.bytenr = node->bytenr;
	ref.num_bytes = es->vol->nodesize;
	ref.owner = node->level;
	ref.set_flags = flags;
	return extent_queue_ref(es, &ref);
}

/* Is @node of tree @root possibly shared with another tree? */
static int block_can_be_shared(const struct tree_root *root, const struct tree_node *node)
{
	return extent_tree_shareable(root->objectid) && node->bytenr != root->bytenr &&
	       node->generation <= root->last_snapshot;
}

int extent_cow_refs(struct extent_state *es, struct tree_root *root, struct tree_node *orig,
		    struct tree_node *cow)
{
	u64 refs = 1, flags = 0;
	int ret;

	if (!extent_tree_shareable(root->objectid))
		return 0;
	if (block_can_be_shared(root, orig)) {
		ret = extent_lookup_info(es, orig->bytenr, &refs, &flags);
		if (ret)
			return ret;
	}
	if (refs > 1) {
		if (orig->owner == root->objectid && !(flags & BTRFS_BLOCK_FLAG_FULL_BACKREF)) {
			ret = extent_node_refs(es, orig, 0, 1, 1);
			if (ret == 0)
				ret = extent_set_block_flags(es, orig, BTRFS_BLOCK_FLAG_FULL_BACKREF);
			return ret;
		}
		return extent_node_refs(es, cow, root->objectid, 0, 1);
	}
	if (flags & BTRFS_BLOCK_FLAG_FULL_BACKREF) {
		ret = extent_node_refs(es, cow, root->objectid, 0, 1);
		if (ret == 0)
			ret = extent_node_refs(es, orig, 0, 1, -1);
		return ret;
	}
	if (orig->owner != root->objectid) {
		/*
		 * Its pointees carry keyed refs of a tree that no longer points
		 * at it (a deleted owner): move them to this tree.
		 */
		ret = extent_node_refs(es, cow, root->objectid, 0, 1);
		if (ret == 0)
			ret = extent_node_refs(es, orig, orig->owner, 0, -1);
		return ret;
	}
	return 0;
}
