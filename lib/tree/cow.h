/*
 * cow.h — changing B-trees copy-on-write inside a transaction.
 *
 * The tree layer knows nodes, keys and items; it does not know how blocks are
 * allocated or how references are counted. Those come from the layer above
 * (the extent layer) through struct tree_block_ops, as DESIGN.md describes.
 *
 * Rules every caller may rely on:
 *  1. A node reachable from a committed root is never written in place: the
 *     first change to it in a transaction copies it to a newly allocated block
 *     (cow), points its parent (or the root) at the copy and frees the old
 *     block through ops->free_block (which pins it until the commit).
 *  2. Every node on a path returned by tree_search_slot(..., cow = 1) is dirty
 *     (belongs to this transaction) and may be modified through the functions
 *     below; nothing else may modify a node.
 *  3. After any change, each internal node's key for a child equals the
 *     child's first key, keys stay strictly increasing, and leaf item data
 *     stays packed and contiguous — exactly what node_validate() checks.
 *  4. Dirty nodes are pinned in the cache (the transaction holds a reference)
 *     until tree_trans_release_dirty() after the commit wrote them.
 */
#ifndef BUTTER_TREE_COW_H
#define BUTTER_TREE_COW_H

#include "tree/tree.h"

struct tree_block_ops {
	/* Allocate a tree block for @root at @level; account its reference. */
	int (*alloc_block)(void *arg, struct tree_root *root, int level, u64 *bytenr);
	/* @root no longer points at @node (it was copied or emptied): drop that reference. */
	int (*free_block)(void *arg, struct tree_root *root, struct tree_node *node);
	/*
	 * @orig is being copied to @cow for @root: adjust the references of
	 * blocks @orig points to when @orig may be shared (snapshots). May be NULL.
	 */
	int (*cow_block)(void *arg, struct tree_root *root, struct tree_node *orig,
			 struct tree_node *cow);
};

struct tree_trans {
	u64 transid;
	struct node_cache *cache;
	const struct tree_block_ops *ops;
	void *ops_arg;
	u8 chunk_tree_uuid[BTRFS_UUID_SIZE];
	struct tree_node *dirty;     /* every node dirtied in this transaction */
	u64 ndirty;
	/*
	 * Set while the transaction takes changes (txn_begin() to the end of its
	 * commit). A change after the commit would stamp nodes with a committed
	 * generation and never be written: tree_search_slot(cow) refuses it.
	 */
	int open;
};

/* Free space in a leaf, in bytes. */
u32 leaf_free_space(const struct node_cache *cache, const struct tree_node *leaf);

/* The largest item payload a leaf can hold. */
static inline u32 tree_max_item_size(const struct node_cache *cache)
{
	return cache->nodesize - (u32)sizeof(struct btrfs_header) - (u32)sizeof(struct btrfs_item);
}

/*
 * Search @root for @key, preparing the path for a change:
 *   @ins_len > 0  the leaf will receive that many more bytes (a new item:
 *                 data size + sizeof(struct btrfs_item); or growth of the
 *                 found item): full nodes and leaves on the way are split;
 *   @ins_len == 0 the found item may be modified in place or removed;
 *   @cow          copy every node on the path into the transaction.
 * Returns 0 (found), 1 (not found: slot is the insert position), negative errno.
 */
int tree_search_slot(struct tree_trans *t, struct tree_root *root, const struct btrfs_key *key,
		     struct tree_path *path, int ins_len, int cow);

/* Insert an item with @size bytes of @data (NULL: zeroes). -EEXIST if the key exists. */
int tree_insert_item(struct tree_trans *t, struct tree_root *root, const struct btrfs_key *key,
		     const void *data, u32 size);

/*
 * Insert an empty item of @size bytes at the position @path was left by a
 * tree_search_slot(ins_len >= size + item header, cow = 1) that returned 1.
 */
int tree_insert_empty_item(struct tree_trans *t, struct tree_root *root, struct tree_path *path,
			   const struct btrfs_key *key, u32 size);

/* Delete @nr items starting at the path's leaf slot (path from a cow search). */
int tree_del_items(struct tree_trans *t, struct tree_root *root, struct tree_path *path, u32 nr);

/* Grow the path's item by @extra zero bytes at its end (path from ins_len = extra search). */
int tree_extend_item(struct tree_trans *t, struct tree_path *path, u32 extra);

/* Shrink the path's item to @new_size bytes, keeping its first bytes. */
int tree_truncate_item(struct tree_trans *t, struct tree_path *path, u32 new_size);

/* Writable pointer to the path's item (the leaf is dirty after a cow search). */
static inline u8 *path_item_mut(const struct tree_path *path, u32 *size)
{
	return (u8 *)path_item(path, size);
}

/* Change the key of the path's item (its order among neighbours must not change). */
void tree_set_item_key(struct tree_path *path, const struct btrfs_key *key);

/* Create an empty tree (one empty leaf) owned by @objectid. */
int tree_create_root(struct tree_trans *t, u64 objectid, struct tree_root *out);

/* Make @root's root node part of this transaction (copying it if it is not yet). */
int tree_cow_root_node(struct tree_trans *t, struct tree_root *root);

/*
 * Start tree @objectid as a copy of @src's root node (a snapshot): a new
 * block owned by @objectid with the same items. The caller accounts the
 * references of the blocks the copy points to. *copy is referenced.
 */
int tree_copy_root(struct tree_trans *t, const struct tree_root *src, u64 objectid,
		   struct tree_root *out, struct tree_node **copy);

/* Make @node dirty in @t (taking the transaction's pin). Used for new blocks. */
void tree_trans_add_dirty(struct tree_trans *t, struct tree_node *node);

/* Drop the transaction's pins after its dirty nodes were written. */
void tree_trans_release_dirty(struct tree_trans *t);

#endif
