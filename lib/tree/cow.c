/*
 * cow.c — copy-on-write changes to B-trees: COW of a path, splitting full
 * leaves and nodes on the way down an insert, inserting, deleting, growing and
 * shrinking items, and keeping parent keys equal to their children's first
 * keys. The rules are in cow.h.
 *
 * Leaf layout (offsets relative to the end of the header, D = nodesize - 101):
 *
 *   [item 0][item 1]...[item n-1] ...free...  [data n-1]...[data 1][data 0]  D
 *
 * item i's data lies at [offset_i, offset_i + size_i) and offset_0 + size_0 =
 * D, offset_i + size_i = offset_{i-1}: data is packed from the end downward in
 * item order. Free space = offset_{n-1} - n * 25 (D when empty).
 *
 * Splits restart the search from the root: each split leaves strictly more
 * room on the path, so the loop ends, and the code stays simple.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tree/cow.h"

#define DATA_SIZE(cache) ((cache)->nodesize - (u32)sizeof(struct btrfs_header))
#define NODE_MAX_PTRS(cache) (DATA_SIZE(cache) / (u32)sizeof(struct btrfs_key_ptr))

static struct btrfs_item *item_mut(struct tree_node *n, u32 slot)
{
	return (struct btrfs_item *)(n->data + sizeof(struct btrfs_header)) + slot;
}

static struct btrfs_key_ptr *ptr_mut(struct tree_node *n, u32 slot)
{
	return (struct btrfs_key_ptr *)(n->data + sizeof(struct btrfs_header)) + slot;
}

static u8 *leaf_data(struct tree_node *n)
{
	return n->data + sizeof(struct btrfs_header);
}

static void set_nritems(struct tree_node *n, u32 nr)
{
	btrfs_set_header_nritems((struct btrfs_header *)n->data, nr);
	n->nritems = nr;
}

u32 leaf_free_space(const struct node_cache *cache, const struct tree_node *leaf)
{
	u32 n = leaf->nritems;

	if (n == 0)
		return DATA_SIZE(cache);
	return btrfs_item_offset(node_item(leaf, n - 1)) - n * (u32)sizeof(struct btrfs_item);
}

/* Where item data ends for items [0, slot): D for slot 0. */
static u32 data_end_before(const struct node_cache *cache, const struct tree_node *leaf, u32 slot)
{
	if (slot == 0)
		return DATA_SIZE(cache);
	return btrfs_item_offset(node_item(leaf, slot - 1));
}

static u32 leaf_data_start(const struct node_cache *cache, const struct tree_node *leaf)
{
	return data_end_before(cache, leaf, leaf->nritems);
}

void tree_trans_add_dirty(struct tree_trans *t, struct tree_node *node)
{
	if (node->dirty)
		return;
	node->dirty = 1;
	node_get(t->cache, node);
	node->dirty_next = t->dirty;
	t->dirty = node;
	t->ndirty++;
}

void tree_trans_release_dirty(struct tree_trans *t)
{
	struct tree_node *n = t->dirty, *next;

	for (; n; n = next) {
		next = n->dirty_next;
		n->dirty = 0;
		n->dirty_next = NULL;
		node_put(t->cache, n);
	}
	t->dirty = NULL;
	t->ndirty = 0;
}

/* A new, empty, dirty node at a freshly allocated block. */
static int new_node(struct tree_trans *t, struct tree_root *root, int level,
		    struct tree_node **out)
{
	struct node_cache *cache = t->cache;
	struct btrfs_header *h;
	struct tree_node *n;
	u64 bytenr;
	int ret;

	ret = t->ops->alloc_block(t->ops_arg, root, level, &bytenr);
	if (ret)
		return ret;
	n = calloc(1, sizeof(*n));
	if (!n || !(n->data = calloc(1, cache->nodesize))) {
		free(n);
		return -ENOMEM;
	}
	h = (struct btrfs_header *)n->data;
	memcpy(h->fsid, cache->vol->meta_fsid, BTRFS_FSID_SIZE);
	memcpy(h->chunk_tree_uuid, t->chunk_tree_uuid, BTRFS_UUID_SIZE);
	btrfs_set_header_bytenr(h, bytenr);
	btrfs_set_header_flags(h, (u64)BTRFS_MIXED_BACKREF_REV << BTRFS_BACKREF_REV_SHIFT);
	btrfs_set_header_generation(h, t->transid);
	btrfs_set_header_owner(h, root->objectid);
	h->level = (u8)level;
	n->bytenr = bytenr;
	n->generation = t->transid;
	n->owner = root->objectid;
	n->level = (u8)level;
	n->refs = 1;
	ret = node_cache_insert(cache, n);
	if (ret) {
		free(n->data);
		free(n);
		return ret;
	}
	tree_trans_add_dirty(t, n);
	*out = n;
	return 0;
}

/*
 * Make @node (at @level of @path, child @pslot of path->nodes[level+1] or
 * the root) writable in this transaction. The path's reference moves to the
 * copy.
 */
static int cow_node(struct tree_trans *t, struct tree_root *root, struct tree_path *path,
		    int level)
{
	struct tree_node *orig = path->nodes[level], *cow;
	struct btrfs_header *h;
	int ret;

	if (orig->dirty)
		return 0;
	ret = new_node(t, root, level, &cow);
	if (ret)
		return ret;
	memcpy(cow->data, orig->data, t->cache->nodesize);
	h = (struct btrfs_header *)cow->data;
	btrfs_set_header_bytenr(h, cow->bytenr);
	btrfs_set_header_generation(h, t->transid);
	btrfs_set_header_owner(h, root->objectid);
	btrfs_set_header_flags(h, (btrfs_header_flags(h) &
				   ~(BTRFS_HEADER_FLAG_WRITTEN | BTRFS_HEADER_FLAG_RELOC)) |
				  ((u64)BTRFS_MIXED_BACKREF_REV << BTRFS_BACKREF_REV_SHIFT));
	cow->nritems = orig->nritems;
	if (t->ops->cow_block) {
		ret = t->ops->cow_block(t->ops_arg, root, orig, cow);
		if (ret)
			goto fail;
	}
	if (level + 1 < BTRFS_MAX_LEVEL && path->nodes[level + 1]) {
		struct btrfs_key_ptr *p = ptr_mut(path->nodes[level + 1], path->slots[level + 1]);

		put_le64(&p->blockptr, cow->bytenr);
		put_le64(&p->generation, t->transid);
	} else {
		root->bytenr = cow->bytenr;
		root->generation = t->transid;
		root->level = (u8)level;
		root->dirty = 1;
	}
	ret = t->ops->free_block(t->ops_arg, root, orig);
	if (ret)
		goto fail;
	node_put(t->cache, orig);
	path->nodes[level] = cow;
	return 0;
fail:
	node_put(t->cache, cow);
	return ret;
}

/* Set the key of @slot in @level's node and fix up ancestors while it is their first. */
static void fixup_low_keys(struct tree_path *path, const struct btrfs_key *key, int level)
{
	struct btrfs_disk_key dk;
	int i;

	btrfs_cpu_to_disk_key(&dk, key);
	for (i = level; i < BTRFS_MAX_LEVEL && path->nodes[i]; i++) {
		u32 slot = path->slots[i];

		memcpy(&ptr_mut(path->nodes[i], slot)->key, &dk, sizeof(dk));
		if (slot != 0)
			break;
	}
}

void tree_set_item_key(struct tree_path *path, const struct btrfs_key *key)
{
	struct btrfs_disk_key dk;

	btrfs_cpu_to_disk_key(&dk, key);
	memcpy(&item_mut(path->nodes[0], path->slots[0])->key, &dk, sizeof(dk));
	if (path->slots[0] == 0)
		fixup_low_keys(path, key, 1);
}

/* Insert a key pointer at @slot of the (dirty) node at @level. */
static void insert_ptr(struct tree_node *node, u32 slot, const struct btrfs_key *key, u64 bytenr,
		       u64 gen)
{
	struct btrfs_key_ptr *p;

	memmove(ptr_mut(node, slot + 1), ptr_mut(node, slot),
		(node->nritems - slot) * sizeof(struct btrfs_key_ptr));
	p = ptr_mut(node, slot);
	btrfs_cpu_to_disk_key(&p->key, key);
	put_le64(&p->blockptr, bytenr);
	put_le64(&p->generation, gen);
	set_nritems(node, node->nritems + 1);
}

/* Put a new root above the current one (which is path->nodes[level]). */
static int insert_new_root(struct tree_trans *t, struct tree_root *root, struct tree_path *path,
			   int level)
{
	struct tree_node *lower = path->nodes[level], *top;
	struct btrfs_key first;
	int ret;

	if (level + 1 >= BTRFS_MAX_LEVEL)
		return -EOVERFLOW;
	ret = new_node(t, root, level + 1, &top);
	if (ret)
		return ret;
	if (lower->nritems)
		node_key(lower, 0, &first);
	else
		memset(&first, 0, sizeof(first));
	insert_ptr(top, 0, &first, lower->bytenr, lower->generation);
	path->nodes[level + 1] = top;
	path->slots[level + 1] = 0;
	root->bytenr = top->bytenr;
	root->level = (u8)(level + 1);
	root->generation = t->transid;
	root->dirty = 1;
	return 0;
}

/* Split the internal node at @level in two; its parent has room. */
static int split_node(struct tree_trans *t, struct tree_root *root, struct tree_path *path,
		      int level)
{
	struct tree_node *node = path->nodes[level], *right;
	u32 mid, n;
	struct btrfs_key key;
	int ret;

	if (!path->nodes[level + 1] || level + 1 >= BTRFS_MAX_LEVEL) {
		ret = insert_new_root(t, root, path, level);
		if (ret)
			return ret;
	}
	ret = new_node(t, root, level, &right);
	if (ret)
		return ret;
	n = node->nritems;
	mid = n / 2;
	memcpy(ptr_mut(right, 0), ptr_mut(node, mid), (n - mid) * sizeof(struct btrfs_key_ptr));
	set_nritems(right, n - mid);
	set_nritems(node, mid);
	node_key(right, 0, &key);
	insert_ptr(path->nodes[level + 1], path->slots[level + 1] + 1, &key, right->bytenr,
		   right->generation);
	node_put(t->cache, right);
	return 0;
}

/* Bytes items [a, b) of @leaf use, headers included. */
static u32 leaf_space_used(const struct tree_node *leaf, u32 a, u32 b)
{
	if (a >= b)
		return 0;
	return btrfs_item_offset(node_item(leaf, a)) + btrfs_item_size(node_item(leaf, a)) -
	       btrfs_item_offset(node_item(leaf, b - 1)) + (b - a) * (u32)sizeof(struct btrfs_item);
}

/* Move items [mid, n) of @leaf into the empty leaf @right. */
static void copy_tail(const struct node_cache *cache, struct tree_node *leaf, u32 mid,
		      struct tree_node *right)
{
	u32 n = leaf->nritems, i, top, bottom, shift;

	if (mid < n) {
		top = btrfs_item_offset(node_item(leaf, mid)) + btrfs_item_size(node_item(leaf, mid));
		bottom = btrfs_item_offset(node_item(leaf, n - 1));
		shift = DATA_SIZE(cache) - top;
		memcpy(leaf_data(right) + bottom + shift, leaf_data(leaf) + bottom, top - bottom);
		memcpy(item_mut(right, 0), item_mut(leaf, mid), (n - mid) * sizeof(struct btrfs_item));
		for (i = 0; i < n - mid; i++) {
			struct btrfs_item *it = item_mut(right, i);

			btrfs_set_item_offset(it, btrfs_item_offset(it) + shift);
		}
	}
	set_nritems(right, n - mid);
	set_nritems(leaf, mid);
}

/* Is the path's leaf the first of the tree (slot 0 at every level above)? */
static int leftmost(const struct tree_path *path)
{
	for (int i = 1; i < BTRFS_MAX_LEVEL && path->nodes[i]; i++)
		if (path->slots[i] != 0)
			return 0;
	return 1;
}

/* An empty leaf right of the path's leaf, first key @key (the caller inserts there next). */
static int new_right_leaf(struct tree_trans *t, struct tree_root *root, struct tree_path *path,
			  const struct btrfs_key *key)
{
	struct tree_node *right;
	int ret = new_node(t, root, 0, &right);

	if (ret)
		return ret;
	insert_ptr(path->nodes[1], path->slots[1] + 1, key, right->bytenr, right->generation);
	node_put(t->cache, right);
	return 0;
}

/*
 * Split the leaf so that the change at its slot (a new item of @need bytes
 * when @new_item, or @need more bytes for the existing item) fits.
 */
static int split_leaf(struct tree_trans *t, struct tree_root *root, struct tree_path *path,
		      const struct btrfs_key *ins_key, u32 need, int new_item)
{
	struct node_cache *cache = t->cache;
	struct tree_node *leaf = path->nodes[0], *right;
	u32 n = leaf->nritems, slot = path->slots[0], cap = DATA_SIZE(cache);
	u32 best = 0, best_diff = UINT32_MAX, mid;
	struct btrfs_key key;
	int ret, found = 0;

	if (!path->nodes[1]) {
		ret = insert_new_root(t, root, path, 0);
		if (ret)
			return ret;
	}
	if (new_item && slot == n && n > 0 && need <= cap) {
		/*
		 * A new item past the end (keys mostly arrive in order: a tree
		 * filled by mkfs --rootdir, a growing file, the extent and csum
		 * trees): it starts a new leaf to the right and this one stays
		 * full. A balanced cut would leave every left half half empty for
		 * good (the kernel avoids that by pushing into siblings first).
		 */
		return new_right_leaf(t, root, path, ins_key);
	}
	for (mid = 1; mid < n; mid++) {
		u32 left = leaf_space_used(leaf, 0, mid), rgt = leaf_space_used(leaf, mid, n);
		int goes_left = new_item ? slot <= mid : slot < mid;
		u32 diff;

		if (goes_left)
			left += need;
		else
			rgt += need;
		if (left > cap || rgt > cap)
			continue;
		diff = left > rgt ? left - rgt : rgt - left;
		if (diff < best_diff) {
			best_diff = diff;
			best = mid;
			found = 1;
		}
	}
	if (!found && n > 1 && need <= cap) {
		/*
		 * No single cut gives room: isolate the target step by step (the
		 * caller searches again and splits again): cut just before it, or
		 * just after it when it is first.
		 */
		if (slot > 0 && slot < n) {
			best = slot;
			found = 1;
		} else if (slot == 0 && !new_item) {
			best = 1;
			found = 1;
		}
	}
	if (!found && new_item && slot == 0 && n > 0 && need <= cap && leftmost(path)) {
		/*
		 * A new first item of the leftmost leaf that fits only alone: a
		 * new empty leaf before this one (the caller searches again and
		 * lands in it); its key is the new first key of every ancestor.
		 */
		ret = new_node(t, root, 0, &right);
		if (ret)
			return ret;
		insert_ptr(path->nodes[1], 0, ins_key, right->bytenr, right->generation);
		fixup_low_keys(path, ins_key, 2);
		node_put(cache, right);
		return 0;
	}
	if (!found) {
		/* only an item alone in a new leaf fits: appending past the end */
		if (!new_item || slot != n || need > cap)
			return -EOVERFLOW;
		return new_right_leaf(t, root, path, ins_key);
	}
	ret = new_node(t, root, 0, &right);
	if (ret)
		return ret;
	copy_tail(cache, leaf, best, right);
	node_key(right, 0, &key);
	insert_ptr(path->nodes[1], path->slots[1] + 1, &key, right->bytenr, right->generation);
	node_put(cache, right);
	return 0;
}

int tree_search_slot(struct tree_trans *t, struct tree_root *root, const struct btrfs_key *key,
		     struct tree_path *path, int ins_len, int cow)
{
	struct node_cache *cache = t ? t->cache : NULL;
	int ret, level, restarts = 0;

	if (!cow)
		return tree_search(cache, root, key, path);
	ASSERT(t->open);
	if (!t->open)
		return -EINVAL;
again:
	if (++restarts > 64)
		return -EUCLEAN;
	tree_path_release(cache, path);
	ret = node_read(cache, root->bytenr, root->generation, root->level, NULL,
			&path->nodes[root->level]);
	if (ret)
		return ret;
	level = root->level;
	ret = cow_node(t, root, path, level);
	if (ret)
		goto fail;
	for (;;) {
		struct tree_node *node = path->nodes[level];
		u32 slot;
		int found = node_bin_search(node, key, &slot) == 0;
		if (level == 0) {
			path->slots[0] = slot;
			if (ins_len > 0 && leaf_free_space(cache, node) < (u32)ins_len) {
				ret = split_leaf(t, root, path, key, (u32)ins_len, !found);
				if (ret)
					goto fail;
				goto again;
			}
			return found ? 0 : 1;
		}
		if (!found && slot > 0)
			slot--;
		path->slots[level] = slot;
		if (ins_len > 0 && node->nritems >= NODE_MAX_PTRS(cache) - 3) {
			ret = split_node(t, root, path, level);
			if (ret)
				goto fail;
			goto again;
		}
		ret = node_read_child(cache, node, slot, &path->nodes[level - 1]);
		if (ret)
			goto fail;
		level--;
		ret = cow_node(t, root, path, level);
		if (ret)
			goto fail;
	}
fail:
	tree_path_release(cache, path);
	return ret;
}

int tree_insert_empty_item(struct tree_trans *t, struct tree_root *root, struct tree_path *path,
			   const struct btrfs_key *key, u32 size)
{
	struct node_cache *cache = t->cache;
	struct tree_node *leaf = path->nodes[0];
	u32 slot = path->slots[0], n = leaf->nritems, end, start, i;
	struct btrfs_item *it;

	(void)root;
	if (leaf_free_space(cache, leaf) < size + sizeof(struct btrfs_item))
		return -EOVERFLOW;
	end = data_end_before(cache, leaf, slot);
	start = leaf_data_start(cache, leaf);
	/* move the data of items [slot, n) down by size, and their headers right */
	memmove(leaf_data(leaf) + start - size, leaf_data(leaf) + start, end - start);
	for (i = slot; i < n; i++) {
		it = item_mut(leaf, i);
		btrfs_set_item_offset(it, btrfs_item_offset(it) - size);
	}
	memmove(item_mut(leaf, slot + 1), item_mut(leaf, slot), (n - slot) * sizeof(*it));
	it = item_mut(leaf, slot);
	btrfs_cpu_to_disk_key(&it->key, key);
	btrfs_set_item_offset(it, end - size);
	btrfs_set_item_size(it, size);
	memset(leaf_data(leaf) + end - size, 0, size);
	set_nritems(leaf, n + 1);
	if (slot == 0)
		fixup_low_keys(path, key, 1);
	return 0;
}

int tree_insert_item(struct tree_trans *t, struct tree_root *root, const struct btrfs_key *key,
		     const void *data, u32 size)
{
	struct tree_path path;
	int ret;

	if (size > tree_max_item_size(t->cache))
		return -EOVERFLOW;
	tree_path_init(&path);
	ret = tree_search_slot(t, root, key, &path, (int)(size + sizeof(struct btrfs_item)), 1);
	if (ret == 0)
		ret = -EEXIST;
	if (ret == 1) {
		ret = tree_insert_empty_item(t, root, &path, key, size);
		if (ret == 0 && data) {
			u32 isz;
			u8 *p = path_item_mut(&path, &isz);

			memcpy(p, data, size);
		}
	}
	tree_path_release(t->cache, &path);
	return ret;
}

/* Remove pointer @slot from the node at @level, freeing nothing. */
static void del_ptr(struct tree_path *path, int level, u32 slot)
{
	struct tree_node *node = path->nodes[level];

	memmove(ptr_mut(node, slot), ptr_mut(node, slot + 1),
		(node->nritems - slot - 1) * sizeof(struct btrfs_key_ptr));
	set_nritems(node, node->nritems - 1);
	if (slot == 0 && node->nritems) {
		struct btrfs_key key;

		node_key(node, 0, &key);
		if (level + 1 < BTRFS_MAX_LEVEL && path->nodes[level + 1])
			fixup_low_keys(path, &key, level + 1);
	}
}

/* Drop @node from @root's tree: its reference goes, and a dirty copy is never written. */
static int drop_node(struct tree_trans *t, struct tree_root *root, struct tree_node *node)
{
	int ret = t->ops->free_block(t->ops_arg, root, node);

	if (ret == 0 && node->dirty)
		node_cache_remove(t->cache, node);
	return ret;
}

/* The leaf at path level 0 became empty and is not the root: unlink it. */
static int remove_empty_leaf(struct tree_trans *t, struct tree_root *root, struct tree_path *path)
{
	int level = 1, i, ret;

	/* find the lowest ancestor that keeps other children */
	while (level < BTRFS_MAX_LEVEL && path->nodes[level] && path->nodes[level]->nritems == 1)
		level++;
	if (level == BTRFS_MAX_LEVEL || !path->nodes[level]) {
		/* every ancestor had this one child: the empty leaf becomes the root */
		struct tree_node *leaf = path->nodes[0];

		for (i = 1; i < BTRFS_MAX_LEVEL && path->nodes[i]; i++) {
			ret = drop_node(t, root, path->nodes[i]);
			if (ret)
				return ret;
		}
		root->bytenr = leaf->bytenr;
		root->level = 0;
		root->generation = t->transid;
		root->dirty = 1;
		return 0;
	}
	del_ptr(path, level, path->slots[level]);
	for (i = 0; i < level; i++) {
		ret = drop_node(t, root, path->nodes[i]);
		if (ret)
			return ret;
	}
	return 0;
}

int tree_del_items(struct tree_trans *t, struct tree_root *root, struct tree_path *path, u32 nr)
{
	struct node_cache *cache = t->cache;
	struct tree_node *leaf = path->nodes[0];
	u32 slot = path->slots[0], n = leaf->nritems, i, dsize, start, end;

	if (nr == 0 || slot + nr > n)
		return -EINVAL;
	end = data_end_before(cache, leaf, slot);
	dsize = end - btrfs_item_offset(node_item(leaf, slot + nr - 1));
	start = leaf_data_start(cache, leaf);
	if (slot + nr < n) {
		u32 tail_top = btrfs_item_offset(node_item(leaf, slot + nr - 1));

		memmove(leaf_data(leaf) + start + dsize, leaf_data(leaf) + start, tail_top - start);
		for (i = slot + nr; i < n; i++) {
			struct btrfs_item *it = item_mut(leaf, i);

			btrfs_set_item_offset(it, btrfs_item_offset(it) + dsize);
		}
		memmove(item_mut(leaf, slot), item_mut(leaf, slot + nr),
			(n - slot - nr) * sizeof(struct btrfs_item));
	}
	set_nritems(leaf, n - nr);
	if (leaf->nritems == 0) {
		if (path->nodes[1])
			return remove_empty_leaf(t, root, path);
		return 0;
	}
	if (slot == 0 && path->nodes[1]) {
		struct btrfs_key key;

		node_key(leaf, 0, &key);
		fixup_low_keys(path, &key, 1);
	}
	return 0;
}

int tree_extend_item(struct tree_trans *t, struct tree_path *path, u32 extra)
{
	struct node_cache *cache = t->cache;
	struct tree_node *leaf = path->nodes[0];
	u32 slot = path->slots[0], n = leaf->nritems, i, start, old_end;
	struct btrfs_item *it = item_mut(leaf, slot);

	if (leaf_free_space(cache, leaf) < extra)
		return -EOVERFLOW;
	start = leaf_data_start(cache, leaf);
	old_end = btrfs_item_offset(it) + btrfs_item_size(it);
	/* move the data of items [slot, n) down by extra; the item keeps its bytes first */
	memmove(leaf_data(leaf) + start - extra, leaf_data(leaf) + start, old_end - start);
	for (i = slot; i < n; i++) {
		struct btrfs_item *x = item_mut(leaf, i);

		btrfs_set_item_offset(x, btrfs_item_offset(x) - extra);
	}
	btrfs_set_item_size(it, btrfs_item_size(it) + extra);
	memset(leaf_data(leaf) + old_end - extra, 0, extra);
	return 0;
}

int tree_truncate_item(struct tree_trans *t, struct tree_path *path, u32 new_size)
{
	struct node_cache *cache = t->cache;
	struct tree_node *leaf = path->nodes[0];
	u32 slot = path->slots[0], n = leaf->nritems, i, start, keep_end, diff;
	struct btrfs_item *it = item_mut(leaf, slot);

	if (new_size >= btrfs_item_size(it))
		return new_size == btrfs_item_size(it) ? 0 : -EINVAL;
	diff = btrfs_item_size(it) - new_size;
	start = leaf_data_start(cache, leaf);
	keep_end = btrfs_item_offset(it) + new_size;
	memmove(leaf_data(leaf) + start + diff, leaf_data(leaf) + start, keep_end - start);
	for (i = slot; i < n; i++) {
		struct btrfs_item *x = item_mut(leaf, i);

		btrfs_set_item_offset(x, btrfs_item_offset(x) + diff);
	}
	btrfs_set_item_size(it, new_size);
	return 0;
}

int tree_create_root(struct tree_trans *t, u64 objectid, struct tree_root *out)
{
	struct tree_node *leaf;
	int ret;

	memset(out, 0, sizeof(*out));
	out->objectid = objectid;
	ret = new_node(t, out, 0, &leaf);
	if (ret)
		return ret;
	out->bytenr = leaf->bytenr;
	out->level = 0;
	out->generation = t->transid;
	out->dirty = 1;
	node_put(t->cache, leaf);
	return 0;
}

int tree_copy_root(struct tree_trans *t, const struct tree_root *src, u64 objectid,
		   struct tree_root *out, struct tree_node **copy)
{
	struct tree_node *orig, *n;
	struct btrfs_header *h;
	int ret;

	ret = node_read(t->cache, src->bytenr, src->generation, src->level, NULL, &orig);
	if (ret)
		return ret;
	memset(out, 0, sizeof(*out));
	out->objectid = objectid;
	ret = new_node(t, out, src->level, &n);
	if (ret) {
		node_put(t->cache, orig);
		return ret;
	}
	memcpy(n->data, orig->data, t->cache->nodesize);
	h = (struct btrfs_header *)n->data;
	btrfs_set_header_bytenr(h, n->bytenr);
	btrfs_set_header_generation(h, t->transid);
	btrfs_set_header_owner(h, objectid);
	btrfs_set_header_flags(h, (btrfs_header_flags(h) &
				   ~(BTRFS_HEADER_FLAG_WRITTEN | BTRFS_HEADER_FLAG_RELOC)) |
				  ((u64)BTRFS_MIXED_BACKREF_REV << BTRFS_BACKREF_REV_SHIFT));
	n->nritems = orig->nritems;
	node_put(t->cache, orig);
	out->bytenr = n->bytenr;
	out->level = src->level;
	out->generation = t->transid;
	out->dirty = 1;
	*copy = n;
	return 0;
}

int tree_cow_root_node(struct tree_trans *t, struct tree_root *root)
{
	struct tree_path path;
	int ret;

	ASSERT(t->open);
	if (!t->open)
		return -EINVAL;
	tree_path_init(&path);
	ret = node_read(t->cache, root->bytenr, root->generation, root->level, NULL,
			&path.nodes[root->level]);
	if (ret == 0)
		ret = cow_node(t, root, &path, root->level);
	tree_path_release(t->cache, &path);
	return ret;
}
