/*
 * ctree.c — searching and walking a B-tree through a path.
 *
 * A path holds one referenced node per level from the root down to the leaf,
 * and the slot taken at each level. Descent only ever goes from level L to a
 * child that validates as level L-1 with the generation and first key the
 * parent's pointer names, and whose last key stays below the next key on the
 * path (check_subtree_end), so a damaged tree cannot send a search in a loop
 * or past keys it skipped: every walk is bounded by the tree height and the
 * item count.
 *
 * Return convention: 0 found/positioned, 1 not found / end of tree, negative
 * errno on failure (-EIO: no good copy of some block on the way).
 */
#include <errno.h>
#include <string.h>

#include "tree/tree.h"

void tree_path_init(struct tree_path *path)
{
	memset(path, 0, sizeof(*path));
}

/* Runs after every search: no call for the empty levels above the root. */
void tree_path_release(struct node_cache *cache, struct tree_path *path)
{
	for (int i = 0; i < BTRFS_MAX_LEVEL; i++) {
		if (path->nodes[i]) {
			node_put(cache, path->nodes[i]);
			path->nodes[i] = NULL;
		}
		path->slots[i] = 0;
	}
}

/* Binary search one node (see tree.h for the return values). */
int node_bin_search(const struct tree_node *node, const struct btrfs_key *key, u32 *slot)
{
	u32 lo = 0, hi = node->nritems;
	struct btrfs_key k;

	while (lo < hi) {
		u32 mid = lo + (hi - lo) / 2;
		int cmp;

		node_key(node, mid, &k);
		cmp = btrfs_comp_keys(&k, key);
		if (cmp < 0)
			lo = mid + 1;
		else if (cmp > 0)
			hi = mid;
		else {
			*slot = mid;
			return 0;
		}
	}
	*slot = lo;
	return 1;
}

/* Read a child through its parent's pointer, checking level, generation, first key. */
int node_read_child(struct node_cache *cache, const struct tree_node *parent, u32 slot,
		      struct tree_node **out)
{
	const struct btrfs_key_ptr *ptr = node_key_ptr(parent, slot);
	struct btrfs_key first;

	btrfs_disk_to_cpu_key(&first, &ptr->key);
	return node_read(cache, btrfs_key_ptr_blockptr(ptr), btrfs_key_ptr_generation(ptr),
			 parent->level - 1, &first, out);
}

/*
 * The key that every key below path->nodes[@level - 1] must stay under: the
 * key of the next pointer at the lowest level above that has one. 0 when the
 * subtree is the last at every level (no bound), 1 with *bound set.
 */
static int upper_bound(const struct tree_path *path, int level, struct btrfs_key *bound)
{
	for (; level < BTRFS_MAX_LEVEL && path->nodes[level]; level++) {
		const struct tree_node *node = path->nodes[level];

		if (path->slots[level] + 1 < node->nritems) {
			node_key(node, path->slots[level] + 1, bound);
			return 1;
		}
	}
	return 0;
}

/*
 * A child's first key is checked against its pointer when it is read; its last
 * key must also stay below the key of the pointer after it (or the one after
 * an ancestor). Otherwise a damaged parent names a subtree that reaches into
 * its neighbour's keys: a search that lands behind the overlap would skip the
 * keys in between without ever crossing the leaf boundary that check_leaf_order
 * catches, so the damage must be seen on every way down, not only on one.
 */
static int check_subtree_end(struct node_cache *cache, const struct tree_path *path, int level,
			     const struct tree_node *child)
{
	struct btrfs_key bound, last;

	if (!child->nritems || !upper_bound(path, level, &bound))
		return 0;
	node_key(child, child->nritems - 1, &last);
	if (btrfs_comp_keys(&last, &bound) < 0)
		return 0;
	return BLOG_CORRUPT(cache->log,
			    "tree block %llu: keys overlap the next subtree of its parent (cross-linked subtree)",
			    (unsigned long long)child->bytenr);
}

/* Read the child at path->slots[@level] of path->nodes[@level], checked against both its bounds. */
static int read_path_child(struct node_cache *cache, const struct tree_path *path, int level,
			   struct tree_node **out)
{
	int ret = node_read_child(cache, path->nodes[level], path->slots[level], out);

	if (ret == 0) {
		ret = check_subtree_end(cache, path, level, *out);
		if (ret)
			node_put(cache, *out);
	}
	return ret;
}

int tree_search(struct node_cache *cache, const struct tree_root *root,
		const struct btrfs_key *key, struct tree_path *path)
{
	struct tree_node *node;
	int ret, level;

	tree_path_release(cache, path);
	ret = node_read(cache, root->bytenr, root->generation, root->level, NULL, &node);
	if (ret)
		return ret;
	for (;;) {
		u32 slot;

		level = node->level;
		path->nodes[level] = node;
		ret = node_bin_search(node, key, &slot);
		if (level == 0) {
			path->slots[0] = slot;
			return ret;
		}
		/* in an internal node, follow the pointer whose key is <= @key */
		if (ret && slot > 0)
			slot--;
		path->slots[level] = slot;
		ret = read_path_child(cache, path, level, &node);
		if (ret) {
			tree_path_release(cache, path);
			return ret;
		}
	}
}

/*
 * Read down from the child at path->slots[@level] of path->nodes[@level] to
 * a leaf, entering each node at its first slot (or its last with @last),
 * replacing the path's nodes below @level. 0 or a negative errno.
 */
static int descend(struct node_cache *cache, struct tree_path *path, int level, int last)
{
	while (level > 0) {
		struct tree_node *child;
		int ret = read_path_child(cache, path, level, &child);

		if (ret)
			return ret;
		level--;
		node_put(cache, path->nodes[level]);
		path->nodes[level] = child;
		path->slots[level] = last && child->nritems ? child->nritems - 1 : 0;
	}
	return 0;
}

/*
 * Move to the first item of the next leaf. Returns 0, 1 at the end of the
 * tree, or a negative errno.
 */
static int next_leaf(struct node_cache *cache, struct tree_path *path)
{
	int level;

	for (level = 1; level < BTRFS_MAX_LEVEL; level++) {
		struct tree_node *node = path->nodes[level];

		if (!node)
			return 1;
		if (path->slots[level] + 1 < node->nritems)
			break;
	}
	if (level == BTRFS_MAX_LEVEL)
		return 1;
	path->slots[level]++;
	return descend(cache, path, level, 0);
}

/* Move to the last item of the previous leaf; 0, 1 at the start, negative errno. */
static int prev_leaf(struct node_cache *cache, struct tree_path *path)
{
	int level;

	for (level = 1; level < BTRFS_MAX_LEVEL; level++) {
		if (!path->nodes[level])
			return 1;
		if (path->slots[level] > 0)
			break;
	}
	if (level == BTRFS_MAX_LEVEL)
		return 1;
	path->slots[level]--;
	return descend(cache, path, level, 1);
}

/*
 * A damaged parent can name a subtree that overlaps one already walked (its
 * first key matches the pointer, so node_read accepts it): then iteration
 * would go back and visit leaves again, as often as the overlaps multiply.
 * Requiring every leaf to start after the previous one ends (and no empty
 * leaf below a node, see node_validate) keeps a walk to one visit per leaf.
 */
static int check_leaf_order(struct node_cache *cache, const struct btrfs_key *before,
			    const struct btrfs_key *after, u64 bytenr)
{
	if (btrfs_comp_keys(before, after) < 0)
		return 0;
	return BLOG_CORRUPT(cache->log,
			    "tree block %llu: keys overlap the neighbouring leaf (cross-linked subtree)",
			    (unsigned long long)bytenr);
}

int tree_next_item(struct node_cache *cache, struct tree_path *path)
{
	struct tree_node *leaf = path->nodes[0];
	struct btrfs_key last = { 0, 0, 0 }, first = { 0, 0, 0 };
	int ret, have_last = 0;

	if (leaf && path->slots[0] + 1 < leaf->nritems) {
		path->slots[0]++;
		return 0;
	}
	if (leaf && leaf->nritems) {
		node_key(leaf, leaf->nritems - 1, &last);
		have_last = 1;
	}
	/* skip empty leaves (only a root leaf may be empty, but do not trust it) */
	do {
		ret = next_leaf(cache, path);
	} while (ret == 0 && path->nodes[0]->nritems == 0);
	if (ret == 0 && have_last) {
		node_key(path->nodes[0], 0, &first);
		ret = check_leaf_order(cache, &last, &first, path->nodes[0]->bytenr);
	}
	return ret;
}

int tree_prev_item(struct node_cache *cache, struct tree_path *path)
{
	struct tree_node *leaf = path->nodes[0];
	struct btrfs_key last = { 0, 0, 0 }, first = { 0, 0, 0 };
	int ret, have_first = 0;

	if (leaf && path->slots[0] > 0) {
		path->slots[0]--;
		return 0;
	}
	if (leaf && leaf->nritems) {
		node_key(leaf, 0, &first);
		have_first = 1;
	}
	do {
		ret = prev_leaf(cache, path);
	} while (ret == 0 && path->nodes[0]->nritems == 0);
	if (ret == 0 && have_first) {
		node_key(path->nodes[0], path->nodes[0]->nritems - 1, &last);
		ret = check_leaf_order(cache, &last, &first, path->nodes[0]->bytenr);
	}
	return ret;
}

int tree_search_forward(struct node_cache *cache, const struct tree_root *root,
			const struct btrfs_key *key, struct tree_path *path)
{
	int ret = tree_search(cache, root, key, path);

	if (ret <= 0)
		return ret;
	if (path->slots[0] < path->nodes[0]->nritems)
		return 0;
	return tree_next_item(cache, path);
}

int tree_search_backward(struct node_cache *cache, const struct tree_root *root,
			 const struct btrfs_key *key, struct tree_path *path)
{
	int ret = tree_search(cache, root, key, path);

	if (ret <= 0)
		return ret;
	return tree_prev_item(cache, path);
}

int tree_lookup_item(struct node_cache *cache, const struct tree_root *root,
		     const struct btrfs_key *key, void *buf, u32 cap)
{
	struct tree_path path;
	const u8 *data;
	u32 size;
	int ret;

	tree_path_init(&path);
	ret = tree_search(cache, root, key, &path);
	if (ret == 0) {
		data = path_item(&path, &size);
		if (cap)
			memcpy(buf, data, size < cap ? size : cap);
		ret = (int)size;
	} else if (ret == 1) {
		ret = -ENOENT;
	}
	tree_path_release(cache, &path);
	return ret;
}

int tree_find_key(struct node_cache *cache, const struct tree_root *root,
		  const struct btrfs_key *key, int backward, struct btrfs_key *found)
{
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = backward ? tree_search_backward(cache, root, key, &path)
		       : tree_search_forward(cache, root, key, &path);
	if (ret == 0)
		path_key(&path, found);
	tree_path_release(cache, &path);
	return ret;
}
