/*
 * tree.h — B-tree nodes (extent buffers), the bounded node cache, and
 * searching/iterating a tree with a path.
 *
 * Invariants of a node handed out by node_read():
 *  1. Its checksum matched, its header names the bytenr it was read from, the
 *     filesystem's metadata fsid, and the level/generation the parent expected.
 *  2. nritems fits the node; for a leaf every item's data lies inside the node
 *     after the item headers, and item keys are strictly increasing; for an
 *     internal node the key pointers are strictly increasing.
 *  So accessors below may index items 0..nritems-1 without further checks; item
 *  payloads still need their size checked against the struct read from them.
 *
 * A clean node is immutable while cached. A dirty node (one the running
 * transaction made or copied, cow.h) is edited in place by the write path,
 * which runs under the library's exclusive lock, and stays pinned until the
 * commit wrote it. Nodes are reference counted: node_read() takes a
 * reference, node_put() drops it. The cache evicts unreferenced nodes in LRU
 * order once its byte bound is passed. All cache operations take cache->lock.
 */
#ifndef BUTTER_TREE_TREE_H
#define BUTTER_TREE_TREE_H

#include <pthread.h>

#include "format/ondisk.h"
#include "volumes/volumes.h"

struct tree_node {
	u64 bytenr;
	u64 generation;
	u64 owner;
	u32 nritems;
	u8 level;
	int dirty;                      /* modified in the running transaction; pinned */
	int removed;                    /* unhashed: freed when the last reference goes */
	struct tree_node *dirty_next;   /* the transaction's dirty list */
	int refs;                       /* protected by cache->lock */
	struct tree_node *hash_next;    /* protected by cache->lock */
	struct tree_node *lru_prev, *lru_next; /* protected by cache->lock */
	u8 *data;                       /* nodesize bytes; immutable unless dirty */
};

struct node_cache {
	struct btrfs_volumes *vol;
	const struct blog *log;
	u32 nodesize;
	pthread_mutex_t lock;
	struct tree_node **hash;        /* protected by lock */
	size_t hash_size;               /* a power of two */
	struct tree_node lru;           /* sentinel; most recent at lru.lru_next */
	u64 bytes, limit;               /* protected by lock */
	u64 hits, misses;               /* protected by lock */
};

/* Where a tree's root lives. */
struct tree_root {
	u64 objectid;
	u64 bytenr;
	u64 generation; /* 0: do not check */
	u8 level;
	/* write side */
	int dirty;           /* root moved in the running transaction: update its root item */
	u64 last_snapshot;   /* blocks at or below this generation may be shared */
	u64 bytes_used;      /* tree blocks * nodesize, kept in its root item */
	int touched;         /* a subvolume's inodes changed: its root item's ctransid and
				ctime follow at commit (the kernel's btrfs_update_root_times) */
};

int node_cache_init(struct node_cache *cache, struct btrfs_volumes *vol, u64 limit_bytes);
void node_cache_destroy(struct node_cache *cache);

/*
 * Read the tree block at @bytenr, trying every copy until one passes
 * validation. @gen (0 = any) and @level (-1 = any) are what the parent pointer
 * promised; @first_key (NULL = unchecked) is the parent's key for it.
 * Returns 0 with *out referenced, -EIO when no copy is good (each bad copy
 * was logged), -ENOMEM.
 */
int node_read(struct node_cache *cache, u64 bytenr, u64 gen, int level,
	      const struct btrfs_key *first_key, struct tree_node **out);
void node_put(struct node_cache *cache, struct tree_node *node);

/*
 * Add a freshly made node (refs 1, not yet on disk) to the cache so searches
 * find it; -EEXIST if a node with that bytenr is cached and still referenced.
 */
int node_cache_insert(struct node_cache *cache, struct tree_node *node);

/* Forget a cached node that is being freed (it must hold no references but the caller's). */
void node_cache_remove(struct node_cache *cache, struct tree_node *node);
void node_get(struct node_cache *cache, struct tree_node *node);

/* The reason node_validate() gives for a block older than its parent expects (a stale copy). */
extern const char node_stale_generation[];

/*
 * Validate a raw block as node_read() does (used by node_read and tests).
 * Returns 0 or -EUCLEAN with @why set to a static reason.
 */
int node_validate(const struct node_cache *cache, const u8 *data, u64 bytenr, u64 gen,
		  int level, const struct btrfs_key *first_key, const char **why);

/* ---- accessors for validated nodes ---- */

static inline const struct btrfs_header *node_header(const struct tree_node *n)
{
	return (const struct btrfs_header *)n->data;
}

static inline const struct btrfs_item *node_item(const struct tree_node *n, u32 slot)
{
	return (const struct btrfs_item *)(n->data + sizeof(struct btrfs_header)) + slot;
}

static inline const struct btrfs_key_ptr *node_key_ptr(const struct tree_node *n, u32 slot)
{
	return (const struct btrfs_key_ptr *)(n->data + sizeof(struct btrfs_header)) + slot;
}

static inline void node_key(const struct tree_node *n, u32 slot, struct btrfs_key *key)
{
	if (n->level == 0)
		btrfs_disk_to_cpu_key(key, &node_item(n, slot)->key);
	else
		btrfs_disk_to_cpu_key(key, &node_key_ptr(n, slot)->key);
}

static inline const u8 *leaf_item_data(const struct tree_node *n, u32 slot)
{
	return n->data + sizeof(struct btrfs_header) + btrfs_item_offset(node_item(n, slot));
}

static inline u32 leaf_item_size(const struct tree_node *n, u32 slot)
{
	return btrfs_item_size(node_item(n, slot));
}

/*
 * Binary search @node for @key: returns 0 and the slot if found, 1 and the
 * first slot with a greater key if not.
 */
int node_bin_search(const struct tree_node *node, const struct btrfs_key *key, u32 *slot);

/* Read child @slot of internal node @parent, checked against its pointer. */
int node_read_child(struct node_cache *cache, const struct tree_node *parent, u32 slot,
		    struct tree_node **out);

/* ---- paths and search ---- */

struct tree_path {
	struct tree_node *nodes[BTRFS_MAX_LEVEL];
	u32 slots[BTRFS_MAX_LEVEL];
};

void tree_path_init(struct tree_path *path);
void tree_path_release(struct node_cache *cache, struct tree_path *path);

/*
 * Search @root for @key. Returns 0 with the path at the item if found, 1 if
 * not (the leaf slot is where the key would be inserted: possibly nritems),
 * or a negative errno. The path must be released by the caller either way.
 */
int tree_search(struct node_cache *cache, const struct tree_root *root,
		const struct btrfs_key *key, struct tree_path *path);

/*
 * Position the path at the first item >= @key. Returns 0 if there is one,
 * 1 if the tree has no item >= @key, negative errno on error.
 */
int tree_search_forward(struct node_cache *cache, const struct tree_root *root,
			const struct btrfs_key *key, struct tree_path *path);

/*
 * Position the path at the last item <= @key. Returns 0 if there is one,
 * 1 if every item is > @key, negative errno on error.
 */
int tree_search_backward(struct node_cache *cache, const struct tree_root *root,
			 const struct btrfs_key *key, struct tree_path *path);

/* Advance to the next item: 0 ok, 1 at the end of the tree, negative errno. */
int tree_next_item(struct node_cache *cache, struct tree_path *path);

/* Step back to the previous item: 0 ok, 1 at the start, negative errno. */
int tree_prev_item(struct node_cache *cache, struct tree_path *path);

/* The leaf item the path points at. */
static inline struct tree_node *path_leaf(const struct tree_path *path)
{
	return path->nodes[0];
}

static inline void path_key(const struct tree_path *path, struct btrfs_key *key)
{
	node_key(path->nodes[0], path->slots[0], key);
}

static inline const u8 *path_item(const struct tree_path *path, u32 *size)
{
	*size = leaf_item_size(path->nodes[0], path->slots[0]);
	return leaf_item_data(path->nodes[0], path->slots[0]);
}

/*
 * The key of the last item <= @key (@backward) or the first item >= @key:
 * 0 with *found, 1 if there is none, negative errno.
 */
int tree_find_key(struct node_cache *cache, const struct tree_root *root,
		  const struct btrfs_key *key, int backward, struct btrfs_key *found);

/*
 * Look up exactly @key and copy up to @cap bytes of its item into @buf.
 * Returns the item's full size (>= 0), -ENOENT if absent, negative errno.
 */
int tree_lookup_item(struct node_cache *cache, const struct tree_root *root,
		     const struct btrfs_key *key, void *buf, u32 cap);

#endif
