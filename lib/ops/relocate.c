/*
 * relocate.c — emptying one block group: every data extent and tree block in
 * it moves to other groups, every tree that points at it follows, and then
 * the chunk goes away. Balance, device remove and shrinking build on it
 * (balance.c).
 *
 * The rule it keeps: nothing shared becomes unshared. A block or extent that
 * several trees reach (snapshots, reflinks) is copied once, and every pointer
 * to it, in every tree, is changed to the copy.
 *
 * How: substitution, not the kernel's relocation trees. To move a tree block
 * X of a subvolume tree, X is copied to X' elsewhere, *unchanged but for its
 * bytenr*: same generation, owner and flags. Then every pointer to X is
 * found through X's back references — a keyed TREE_BLOCK_REF(root R) is the
 * slot reached by searching R for X's first key one level up (or R's root
 * item when X is R's root); a SHARED_BLOCK_REF(parent P) is a slot of P —
 * and changed to X'. A parent P that is not yet part of this transaction is
 * substituted the same way first (P', pointing where P pointed), so the
 * change climbs to the roots, one copy per block for all its owners. Moving a
 * data extent D is the same one level down: D's bytes and checksums are
 * copied to D', and every leaf holding a file extent item that names D (found
 * through D's EXTENT_DATA_REF / SHARED_DATA_REF back references) is
 * substituted with D' in those items.
 *
 * References follow per pointer, through the delayed-ref queue: a pointer in
 * a FULL_BACKREF block is a shared reference naming that block, any other is
 * a keyed one of the block's owner (lib/extent/backref.c). When a pointer
 * moves from X to X' (or a block holding pointers moves from P to P'), the
 * old reference is dropped and the same kind of reference to the new place
 * added; once every pointer has moved, X (D) has no reference left and is
 * freed, pinned until the commit like any freed extent.
 *
 * Why keep generations: a block's generation is what its parent pointer,
 * the root item, scrub (against the extent item) and the sharing test
 * (generation <= the root's last_snapshot) read. A moved block keeps all
 * four true without touching last_snapshot, and incremental send and
 * find-new see no change where the content did not change. So copies made
 * here keep their generation; a root item names its root node's generation
 * (lib/trans/transaction.c), and a later change copies the block on write as
 * any committed block.
 *
 * Trees that are never shared (root, extent, chunk, dev, csum, free space,
 * uuid, quota, the data relocation tree) have one pointer per block, so a
 * copy-on-write search for the block's first key moves it, with the ordinary
 * reference changes.
 *
 * Crash safety: relocation runs in its own transactions (committed before it
 * starts), writes only into space free in the committed state, and the old
 * copies stay until a commit no longer points at them, so a power cut at any
 * write leaves the previous or the next commit. The chunk is removed in a
 * transaction of its own once its group holds nothing, and its device space
 * becomes allocatable only after that commit.
 *
 * Within the relocation transaction nothing else changes subvolume trees (the
 * caller holds the library's lock exclusively), so a dirty node of a
 * subvolume tree is always one of the copies made here.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

#define RELOC_MAX_PASSES 16
#define RELOC_BATCH_BYTES (256ULL << 20)  /* data moved per transaction */
#define RELOC_COPY_PIECE (4ULL << 20)

/* ---- a map from bytenr to an index ---- */

struct u64map {
	u64 *keys;
	size_t *vals;
	size_t cap, n;
};

static size_t map_slot(u64 key, size_t cap)
{
	return (size_t)((key >> 12) * 0x9E3779B97F4A7C15ULL) & (cap - 1);
}

static int map_put(struct u64map *m, u64 key, size_t val)
{
	size_t i;

	if ((m->n + 1) * 2 > m->cap) {
		size_t cap = m->cap ? m->cap * 2 : 256, j;
		u64 *keys = calloc(cap, sizeof(*keys));
		size_t *vals = calloc(cap, sizeof(*vals));

		if (!keys || !vals) {
			free(keys);
			free(vals);
			return -ENOMEM;
		}
		for (j = 0; j < m->cap; j++) {
			if (!m->keys[j])
				continue;
			for (i = map_slot(m->keys[j], cap); keys[i]; i = (i + 1) & (cap - 1))
				;
			keys[i] = m->keys[j];
			vals[i] = m->vals[j];
		}
		free(m->keys);
		free(m->vals);
		m->keys = keys;
		m->vals = vals;
		m->cap = cap;
	}
	for (i = map_slot(key, m->cap); m->keys[i]; i = (i + 1) & (m->cap - 1)) {
		if (m->keys[i] == key) {
			m->vals[i] = val;
			return 0;
		}
	}
	m->keys[i] = key;
	m->vals[i] = val;
	m->n++;
	return 0;
}

static int map_get(const struct u64map *m, u64 key, size_t *val)
{
	size_t i;

	if (!m->cap)
		return 0;
	for (i = map_slot(key, m->cap); m->keys[i]; i = (i + 1) & (m->cap - 1)) {
		if (m->keys[i] == key) {
			*val = m->vals[i];
			return 1;
		}
	}
	return 0;
}

static void map_free(struct u64map *m)
{
	free(m->keys);
	free(m->vals);
	memset(m, 0, sizeof(*m));
}

/* ---- the state of one relocation transaction ---- */

struct moved_block {
	u64 old, new;
	struct tree_node *node;  /* the copy; the map holds a reference */
	int full;                /* FULL_BACKREF: its pointers hold shared references */
};

struct moved_data {
	u64 old, new, len, generation;
	u64 old_len, trim;       /* moving chosen extents: the copy is [trim, trim + len) of old */
	u8 *csums, *have;        /* the checksums copied, inserted in the tree phase */
};

struct leaf_ref {
	u64 bytenr;              /* the leaf as found (maybe already a copy) */
	u64 root;                /* a never-shared tree: where to search; 0 otherwise */
	struct btrfs_key key;    /* for such a tree: a key in the leaf */
};

struct reloc {
	struct butter_fs *fs;
	struct fs_write_state *w;
	struct extent_state *es;
	struct tree_trans *t;
	struct block_group *bg;
	u64 start, end, type;

	struct moved_block *blocks;
	size_t nblocks;
	struct u64map by_old, by_new;   /* tree blocks: old bytenr / copy bytenr -> index */

	struct moved_data *data;
	size_t ndata;
	struct u64map data_by_old;

	struct leaf_ref *leaves;
	size_t nleaves;

	struct tree_root data_reloc;    /* the data relocation tree, when loaded */
	int data_reloc_loaded;

	struct butter_balance_stats *st;

	/*
	 * Moving chosen extents (ops_move_data_locked()) instead of emptying a
	 * group: bg is NULL and data copies go, in the order they are made, to
	 * [dest_cur, dest_end), a region taken out of free space; dest_left is
	 * what remains to copy, which sizes the next region.
	 */
	unsigned move_flags;
	u64 dest_cur, dest_end, dest_left;
	u64 dest_hint;           /* where the previous copy ended (0: none yet) */
};

static void reloc_reset(struct reloc *rc)
{
	size_t i;

	for (i = 0; i < rc->nblocks; i++)
		node_put(&rc->fs->cache, rc->blocks[i].node);
	free(rc->blocks);
	rc->blocks = NULL;
	rc->nblocks = 0;
	map_free(&rc->by_old);
	map_free(&rc->by_new);
	for (i = 0; i < rc->ndata; i++) {
		free(rc->data[i].csums);
		free(rc->data[i].have);
	}
	free(rc->data);
	rc->data = NULL;
	rc->ndata = 0;
	map_free(&rc->data_by_old);
	free(rc->leaves);
	rc->leaves = NULL;
	rc->nleaves = 0;
	if (rc->data_reloc_loaded) {
		txn_ctx_forget_root(&rc->w->txn, &rc->data_reloc);
		rc->data_reloc_loaded = 0;
	}
}

/* ---- trees by owner ---- */

/*
 * The tree @id as the write side holds it, tracked so that its root item
 * follows a moved root. *shareable tells whether its blocks may be shared.
 */
static int tree_of(struct reloc *rc, u64 id, struct tree_root **out, int *shareable)
{
	struct butter_fs *fs = rc->fs;
	struct fs_write_state *w = rc->w;
	struct tree_root *tr = NULL;
	int ret = 0;

	*shareable = 0;
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
	case BTRFS_DEV_TREE_OBJECTID:
		tr = &w->dev_tree;
		break;
	case BTRFS_CSUM_TREE_OBJECTID:
		tr = &fs->csum_tree;
		break;
	case BTRFS_FREE_SPACE_TREE_OBJECTID:
		tr = w->es.fst_root;
		break;
	case BTRFS_UUID_TREE_OBJECTID:
		tr = w->uuid_tree.objectid ? &w->uuid_tree : NULL;
		break;
	case BTRFS_QUOTA_TREE_OBJECTID:
		tr = w->quota_tree.objectid ? &w->quota_tree : NULL;
		break;
	case BTRFS_DATA_RELOC_TREE_OBJECTID:
		if (!rc->data_reloc_loaded) {
			ret = fs_load_root(fs, id, &rc->data_reloc);
			if (ret)
				break;
			rc->data_reloc_loaded = 1;
		}
		tr = &rc->data_reloc;
		break;
	default:
		if (extent_tree_shareable(id) && id != BTRFS_TREE_RELOC_OBJECTID) {
			struct subvol *sv = fs_subvol_cached(fs, id, &ret);

			if (sv) {
				tr = &sv->root;
				*shareable = 1;
			}
		}
		break;
	}
	if (!tr) {
		blog_err(&fs->log, "relocation: tree %lld is not one butter can move blocks of",
			 (long long)id);
		return ret ? ret : -EOPNOTSUPP;
	}
	if (tr != &fs->root_tree && tr != &fs->chunk_tree) {
		ret = txn_track_root(&w->txn, tr);
		if (ret)
			return ret;
	}
	*out = tr;
	return 0;
}

/* ---- room for the copies ---- */

/* The profile new chunks of @type get: forced by a conversion, else as the group moved. */
static u64 profile_for(struct reloc *rc, u64 type)
{
	u64 forced = extent_forced_profile(rc->es, type);
	size_t i;

	if (forced)
		return forced & BTRFS_BLOCK_GROUP_PROFILE_MASK;
	if (type == BTRFS_BLOCK_GROUP_DATA && (!rc->bg || !(rc->bg->flags & BTRFS_BLOCK_GROUP_DATA)))
		return rc->w->data_profile;
	if (rc->bg && (rc->bg->flags & type))
		return rc->bg->flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
	for (i = 0; i < rc->es->nbgs; i++)
		if ((rc->es->bgs[i]->flags & type) && extent_bg_allocatable(rc->es->bgs[i]))
			return rc->es->bgs[i]->flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
	return 0;
}

/*
 * The size to ask of a chunk that receives about @need bytes of @type: no
 * more than that (rounded up to 16 MiB) and no more than a chunk of its kind
 * would be. Right-sized chunks keep a balance compact and let a shrink fit
 * what it moves into the space that stays.
 */
static u64 chunk_size_for(const struct reloc *rc, u64 type, u64 need)
{
	u64 most = chunk_max_size(rc->es, type == BTRFS_BLOCK_GROUP_DATA     ? (1ULL << 30)
					  : type == BTRFS_BLOCK_GROUP_SYSTEM ? (32ULL << 20)
									     : (256ULL << 20));
	u64 want = (need + (16ULL << 20) - 1) / (16ULL << 20) * (16ULL << 20);

	if (want < (16ULL << 20))
		want = 16ULL << 20;
	return want < most ? want : most;
}

/*
 * Allocate @len bytes of @type outside the group being emptied, adding a
 * chunk when no group has room.
 */
static int reloc_alloc(struct reloc *rc, u64 type, u64 len, u64 *logical)
{
	u64 want, chunk, flags, least;
	int ret = extent_alloc(rc->es, type, len, logical), tries;

	if (ret != -ENOSPC)
		return ret;
	flags = type | profile_for(rc, type);
	if (rc->es->mixed && type != BTRFS_BLOCK_GROUP_SYSTEM)
		flags |= BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA;
	/*
	 * A chunk of what the group still holds, and at least @len and a MiB;
	 * when a superblock copy's stripe cuts it so that @len finds no piece,
	 * the next try is twice as big.
	 */
	least = len + (1ULL << 20);
	want = chunk_size_for(rc, type, rc->bg && rc->bg->used > least ? rc->bg->used : least);
	if (want < least)
		want = least;
	for (tries = 0; tries < 3 && ret == -ENOSPC; tries++, want *= 2) {
		u64 size = want;

		for (;;) {
			ret = chunk_create(rc->es, flags, size, &chunk);
			if (ret != -ENOSPC || size <= len || size <= (1ULL << 20))
				break;
			size /= 2;
			if (size < len)
				size = len;
		}
		if (ret == 0)
			ret = chunk_insert_items(rc->es, rc->t, chunk);
		if (ret == 0)
			ret = extent_alloc(rc->es, type, len, logical);
		else
			break;
	}
	if (ret == -ENOSPC)
		blog_err(&rc->fs->log, "relocation: no room for %llu bytes of %s outside block group "
				       "%llu, and no new %s chunk fits",
			 (unsigned long long)len,
			 type == BTRFS_BLOCK_GROUP_DATA ? "data"
			 : type == BTRFS_BLOCK_GROUP_SYSTEM ? "system" : "metadata",
			 (unsigned long long)rc->start, butter_profile_name(flags));
	return ret;
}

/*
 * Make sure the kinds the group serves have room elsewhere before it is
 * emptied: copy-on-write of the trees the move touches allocates tree
 * blocks through the ordinary allocator, which skips the group being
 * emptied (and, converting, groups of other profiles).
 */
static int ensure_room(struct reloc *rc)
{
	/* tree blocks first: every later step copies some on write */
	static const u64 kinds[3] = { BTRFS_BLOCK_GROUP_SYSTEM, BTRFS_BLOCK_GROUP_METADATA,
				      BTRFS_BLOCK_GROUP_DATA };
	static const char *names[3] = { "system", "metadata", "data" };
	u64 made[3];
	int k, nmade = 0, ret = 0;

	/*
	 * Make every chunk first, insert their items after: inserting touches
	 * the chunk tree (system) and the dev tree (metadata), which may need
	 * the very groups being made (a conversion allows no other profile).
	 */
	for (k = 0; k < 3 && ret == 0; k++) {
		u64 type = kinds[k], forced = extent_forced_profile(rc->es, type), free = 0, need;
		u64 chunk, want, flags;
		size_t i;

		if (!(rc->bg->flags & type) && !(type != BTRFS_BLOCK_GROUP_DATA && forced))
			continue;
		if (rc->es->mixed && type == BTRFS_BLOCK_GROUP_DATA && nmade &&
		    !(rc->bg->flags & BTRFS_BLOCK_GROUP_SYSTEM))
			continue; /* the mixed chunk made for metadata serves data too */
		for (i = 0; i < rc->es->nbgs; i++) {
			const struct block_group *bg = rc->es->bgs[i];

			if (!(bg->flags & type) || !extent_bg_allocatable(bg))
				continue;
			if (forced && (bg->flags & BTRFS_BLOCK_GROUP_PROFILE_MASK) !=
					      (forced & BTRFS_BLOCK_GROUP_PROFILE_MASK))
				continue;
			free += bg->free.total;
		}
		/* the group's content, and for tree blocks room for the trees' own churn */
		need = (rc->bg->flags & type) ? rc->bg->used : 0;
		if (type != BTRFS_BLOCK_GROUP_DATA)
			need += need + (type == BTRFS_BLOCK_GROUP_SYSTEM ? (1ULL << 20) : (4ULL << 20));
		if (free >= need)
			continue;
		want = chunk_size_for(rc, type, need - free);
		flags = type | profile_for(rc, type);
		if (rc->es->mixed && type != BTRFS_BLOCK_GROUP_SYSTEM)
			flags |= BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA;
		for (;;) {
			/* smaller and smaller, down to what is needed (whole MiB) */
			u64 least = (need - free + (1ULL << 20) - 1) & ~((1ULL << 20) - 1);

			ret = chunk_create(rc->es, flags, want, &chunk);
			if (ret != -ENOSPC || want <= least)
				break;
			want = want / 2 > least ? want / 2 : least;
		}
		if (ret == -ENOSPC)
			blog_err(&rc->fs->log, "relocation: block group %llu holds %llu bytes; the other "
					       "%s groups have %llu free and no new %s chunk fits",
				 (unsigned long long)rc->start, (unsigned long long)rc->bg->used,
				 names[k], (unsigned long long)free, butter_profile_name(flags));
		if (ret == 0)
			made[nmade++] = chunk;
	}
	for (k = 0; k < nmade; k++) {
		int r = chunk_insert_items(rc->es, rc->t, made[k]);

		if (r)
			return r == -ENOSPC ? -EFBIG : r; /* items half made: not a clean refusal */
	}
	return ret;
}

/* ---- tree blocks ---- */

static int queue_block_ref(struct reloc *rc, u64 bytenr, const struct tree_node *node,
			   u64 generation, u64 flags, u64 root, u64 parent, int delta)
{
	struct delayed_ref ref;

	memset(&ref, 0, sizeof(ref));
	ref.bytenr = bytenr;
	ref.num_bytes = rc->es->vol->nodesize;
	ref.root = parent ? 0 : root;
	ref.parent = parent;
	ref.owner = node->level;
	ref.delta = delta;
	ref.generation = generation;
	if (delta > 0)
		ref.set_flags = flags & BTRFS_BLOCK_FLAG_FULL_BACKREF;
	if (node->nritems)
		node_key(node, 0, &ref.first_key);
	return extent_queue_ref(rc->es, &ref);
}

/* The slot of @parent whose pointer is @bytenr, or -1. */
static int slot_of(const struct tree_node *parent, u64 bytenr)
{
	u32 i;

	for (i = 0; i < parent->nritems; i++)
		if (get_le64(&node_key_ptr(parent, i)->blockptr) == bytenr)
			return (int)i;
	return -1;
}

/*
 * The node at @level + 1 of tree @tr on the way to @key (referenced), the
 * node that points at a block of @level whose first key is @key.
 */
static int find_parent(struct reloc *rc, const struct tree_root *tr, int level,
		       const struct btrfs_key *key, struct tree_node **out)
{
	struct node_cache *cache = &rc->fs->cache;
	struct tree_node *node, *child;
	int ret;

	if (tr->level <= level)
		return -ENOENT;
	ret = node_read(cache, tr->bytenr, tr->generation, tr->level, NULL, &node);
	if (ret)
		return ret;
	while (node->level > level + 1) {
		u32 slot;

		if (node_bin_search(node, key, &slot) != 0 && slot > 0)
			slot--;
		ret = node_read_child(cache, node, slot, &child);
		node_put(cache, node);
		if (ret)
			return ret;
		node = child;
	}
	*out = node;
	return 0;
}

static int substitute(struct reloc *rc, u64 bytenr, int level, struct tree_node **out);

/*
 * A version of @node (a block of a shared tree, referenced by the caller)
 * that this transaction may change: itself when it is one of the copies,
 * else its substitute. Consumes the caller's reference; *out is referenced.
 */
static int writable(struct reloc *rc, struct tree_node *node, struct tree_node **out)
{
	int ret;

	if (node->dirty) {
		*out = node;
		return 0;
	}
	ret = substitute(rc, node->bytenr, node->level, out);
	node_put(&rc->fs->cache, node);
	return ret;
}

/* Is the copy @node (by its bytenr) a FULL_BACKREF block? */
static int copy_is_full(struct reloc *rc, const struct tree_node *node, int *full)
{
	size_t idx;
	u64 refs, flags;
	int ret;

	if (map_get(&rc->by_new, node->bytenr, &idx)) {
		*full = rc->blocks[idx].full;
		return 0;
	}
	ret = extent_lookup_info(rc->es, node->bytenr, &refs, &flags);
	if (ret)
		return ret;
	*full = !!(flags & BTRFS_BLOCK_FLAG_FULL_BACKREF);
	return 0;
}

/* Point slot @slot of the writable @parent at @to instead of @from, with the references. */
static int repoint(struct reloc *rc, struct tree_node *parent, int slot, u64 from, u64 to,
		   const struct tree_node *child, u64 generation, u64 flags)
{
	int full, ret;

	ret = copy_is_full(rc, parent, &full);
	if (ret)
		return ret;
	put_le64(&((struct btrfs_key_ptr *)(parent->data + sizeof(struct btrfs_header)) + slot)
			  ->blockptr,
		 to);
	ret = queue_block_ref(rc, from, child, generation, flags, parent->owner,
			      full ? parent->bytenr : 0, -1);
	if (ret == 0)
		ret = queue_block_ref(rc, to, child, generation, flags, parent->owner,
				      full ? parent->bytenr : 0, 1);
	return ret;
}

/*
 * Copy tree block @bytenr of a shared tree elsewhere and point everything that
 * pointed at it to the copy (see the top of this file). *out is the copy,
 * referenced.
 */
static int substitute(struct reloc *rc, u64 bytenr, int level, struct tree_node **out)
{
	struct butter_fs *fs = rc->fs;
	struct node_cache *cache = &fs->cache;
	struct tree_node *old = NULL, *copy = NULL;
	struct extent_refs refs;
	struct moved_block *mb;
	struct btrfs_header *h;
	struct btrfs_key first;
	u64 new_bytenr, type;
	size_t idx, i;
	int ret;

	if (map_get(&rc->by_old, bytenr, &idx)) {
		*out = rc->blocks[idx].node;
		node_get(cache, *out);
		return 0;
	}
	ret = node_read(cache, bytenr, 0, level, NULL, &old);
	if (ret)
		return ret;
	if (old->dirty) {
		*out = old;
		return 0;
	}
	ret = extent_get_refs(rc->es, bytenr, &refs);
	if (ret == 1)
		ret = BLOG_CORRUPT(&fs->log, "tree block %llu has no extent item",
				   (unsigned long long)bytenr);
	if (ret) {
		node_put(cache, old);
		return ret;
	}
	type = old->owner == BTRFS_CHUNK_TREE_OBJECTID ? BTRFS_BLOCK_GROUP_SYSTEM
						       : BTRFS_BLOCK_GROUP_METADATA;
	ret = reloc_alloc(rc, type, cache->nodesize, &new_bytenr);
	if (ret)
		goto out;
	copy = calloc(1, sizeof(*copy));
	if (!copy || !(copy->data = malloc(cache->nodesize))) {
		free(copy);
		copy = NULL;
		ret = -ENOMEM;
		goto out;
	}
	memcpy(copy->data, old->data, cache->nodesize);
	h = (struct btrfs_header *)copy->data;
	btrfs_set_header_bytenr(h, new_bytenr);
	btrfs_set_header_flags(h, btrfs_header_flags(h) & ~BTRFS_HEADER_FLAG_WRITTEN);
	copy->bytenr = new_bytenr;
	copy->generation = old->generation;
	copy->owner = old->owner;
	copy->nritems = old->nritems;
	copy->level = old->level;
	copy->refs = 1;
	ret = node_cache_insert(cache, copy);
	if (ret) {
		free(copy->data);
		free(copy);
		copy = NULL;
		goto out;
	}
	tree_trans_add_dirty(rc->t, copy);
	mb = realloc(rc->blocks, (rc->nblocks + 1) * sizeof(*mb));
	if (!mb) {
		node_put(cache, copy);
		copy = NULL;
		ret = -ENOMEM;
		goto out;
	}
	rc->blocks = mb;
	mb = &rc->blocks[rc->nblocks];
	mb->old = bytenr;
	mb->new = new_bytenr;
	mb->node = copy; /* the map keeps the reference the cache insert gave */
	mb->full = !!(refs.flags & BTRFS_BLOCK_FLAG_FULL_BACKREF);
	ret = map_put(&rc->by_old, bytenr, rc->nblocks);
	if (ret == 0)
		ret = map_put(&rc->by_new, new_bytenr, rc->nblocks);
	rc->nblocks++;
	if (ret)
		goto out;
	if (rc->st)
		rc->st->tree_blocks++;

	/* the pointers the block holds: shared references name their holder */
	if (mb->full) {
		ret = extent_node_refs(rc->es, old, 0, 1, -1);
		if (ret == 0)
			ret = extent_node_refs(rc->es, copy, 0, 1, 1);
		if (ret)
			goto out;
	}

	/* every pointer to the block */
	if (old->nritems)
		node_key(old, 0, &first);
	else
		memset(&first, 0, sizeof(first));
	for (i = 0; i < refs.n && ret == 0; i++) {
		const struct extent_ref *r = &refs.r[i];
		struct tree_node *parent = NULL, *pw = NULL;
		int slot;

		if (r->type == BTRFS_TREE_BLOCK_REF_KEY) {
			struct tree_root *tr;
			int shareable;

			ret = tree_of(rc, r->root_or_parent, &tr, &shareable);
			if (ret)
				break;
			if (tr->bytenr == bytenr) {
				tr->bytenr = new_bytenr;
				tr->dirty = 1; /* generation and level stay */
				ret = queue_block_ref(rc, bytenr, old, refs.generation, refs.flags,
						      r->root_or_parent, 0, -1);
				if (ret == 0)
					ret = queue_block_ref(rc, new_bytenr, old, refs.generation,
							      refs.flags, r->root_or_parent, 0, 1);
				continue;
			}
			ret = find_parent(rc, tr, old->level, &first, &parent);
			if (ret == -ENOENT || (ret == 0 && slot_of(parent, bytenr) < 0)) {
				if (ret == 0)
					node_put(cache, parent);
				ret = BLOG_CORRUPT(&fs->log, "tree block %llu: tree %lld holds no "
							     "pointer to it at its key",
						   (unsigned long long)bytenr,
						   (long long)r->root_or_parent);
				break;
			}
		} else if (r->type == BTRFS_SHARED_BLOCK_REF_KEY) {
			if (map_get(&rc->by_old, r->root_or_parent, &idx)) {
				parent = rc->blocks[idx].node;
				node_get(cache, parent);
			} else {
				ret = node_read(cache, r->root_or_parent, 0, old->level + 1, NULL,
						&parent);
			}
		} else {
			ret = BLOG_CORRUPT(&fs->log, "tree block %llu: reference of type %u",
					   (unsigned long long)bytenr, r->type);
		}
		if (ret)
			break;
		ret = writable(rc, parent, &pw);
		if (ret)
			break;
		slot = slot_of(pw, bytenr);
		if (slot < 0)
			ret = BLOG_CORRUPT(&fs->log, "tree block %llu: its parent %llu holds no "
						     "pointer to it",
					   (unsigned long long)bytenr, (unsigned long long)pw->bytenr);
		else
			ret = repoint(rc, pw, slot, bytenr, new_bytenr, old, refs.generation,
				      refs.flags);
		node_put(cache, pw);
	}
out:
	extent_refs_free(&refs);
	node_put(cache, old);
	if (ret == 0) {
		node_get(cache, copy);
		*out = copy;
	}
	return ret;
}

/* Move tree block @bytenr (of @level) out of the group. */
static int move_tree_block(struct reloc *rc, u64 bytenr, int level)
{
	struct node_cache *cache = &rc->fs->cache;
	struct tree_node *node, *copy;
	struct tree_root *tr;
	struct tree_path path;
	struct btrfs_key key;
	size_t idx;
	u64 owner;
	int shareable, ret;

	if (map_get(&rc->by_old, bytenr, &idx))
		return 0;
	ret = node_read(cache, bytenr, 0, level, NULL, &node);
	if (ret)
		return ret;
	owner = node->owner;
	if (node->nritems)
		node_key(node, 0, &key);
	else
		memset(&key, 0, sizeof(key));
	node_put(cache, node);
	if (extent_tree_shareable(owner)) {
		/* its references say who points at it (the owner may be long gone) */
		ret = substitute(rc, bytenr, level, &copy);
		if (ret == 0)
			node_put(cache, copy);
		return ret;
	}
	ret = tree_of(rc, owner, &tr, &shareable);
	if (ret)
		return ret;
	if (rc->st)
		rc->st->tree_blocks++;
	if (tr->bytenr == bytenr)
		return tree_cow_root_node(rc->t, tr);
	/* a copy-on-write search for its first key moves it with its path */
	tree_path_init(&path);
	ret = tree_search_slot(rc->t, tr, &key, &path, 0, 1);
	tree_path_release(cache, &path);
	return ret < 0 ? ret : 0;
}

/* ---- where moved data goes when no group is emptied ---- */

/* Take [start, start + len) of @bg's free space for the destination. */
static int dest_claim(struct reloc *rc, struct block_group *bg, u64 start, u64 len)
{
	if (range_remove(&bg->free, start, start + len))
		return -ENOMEM;
	bg->fst_dirty = 1;
	rc->dest_cur = start;
	rc->dest_end = start + len;
	return 0;
}

/* A new data chunk of about @want bytes, its region claimed whole. 0, -ENOSPC or -errno. */
static int dest_new_chunk(struct reloc *rc, u64 want, u64 least)
{
	u64 ss = rc->fs->vol.sectorsize, size, chunk, start;
	struct block_group *bg;
	int ret;

	size = (want + (1ULL << 20) - 1) & ~((1ULL << 20) - 1);
	if (size < (16ULL << 20))
		size = 16ULL << 20;
	for (;;) {
		ret = chunk_create(rc->es, BTRFS_BLOCK_GROUP_DATA | profile_for(rc, BTRFS_BLOCK_GROUP_DATA),
				   size, &chunk);
		if (ret != -ENOSPC || size <= least || size <= (16ULL << 20))
			break;
		size = size / 2 > least ? size / 2 : least;
	}
	if (ret)
		return ret;
	ret = chunk_insert_items(rc->es, rc->t, chunk);
	if (ret)
		return ret;
	bg = extent_find_bg(rc->es, chunk);
	if (!bg)
		return -EUCLEAN;
	/* the longest piece a superblock copy leaves, up to @want */
	for (size = want; size >= least; size = size / 2 > least ? (size / 2 + ss - 1) / ss * ss : least) {
		if (range_find(&bg->free, size, ss, bg->start, &start) == 0)
			return dest_claim(rc, bg, start, size);
		if (size == least)
			break;
	}
	return -ENOSPC;
}

/*
 * Reserve the next destination region: room for @len bytes at least, and for
 * all that is left to copy (dest_left, up to 1 GiB) if it can be had in one
 * piece. OPS_MOVE_FRESH asks for a new chunk first (a region of the address
 * space that held nothing, which on a device with free space is also a fresh
 * physical region); otherwise a free range of existing groups comes first.
 */
static int dest_reserve(struct reloc *rc, u64 len)
{
	u64 ss = rc->fs->vol.sectorsize, want = rc->dest_left > len ? rc->dest_left : len;
	struct block_group *best = NULL;
	u64 best_start = 0, best_len = 0, start;
	size_t i, k;
	int ret, tried_chunk = 0;

	if (want > (1ULL << 30))
		want = len > (1ULL << 30) ? len : (1ULL << 30);
	/* go on right after the previous copy when the space there is free */
	if (rc->dest_hint) {
		struct block_group *bg = extent_find_bg(rc->es, rc->dest_hint);

		for (k = 0; bg && extent_bg_allocatable(bg) && (bg->flags & BTRFS_BLOCK_GROUP_DATA) &&
			    k < bg->free.n; k++) {
			const struct range *r = &bg->free.r[k];

			if (r->start <= rc->dest_hint && rc->dest_hint < r->end) {
				if (r->end - rc->dest_hint >= len)
					return dest_claim(rc, bg, rc->dest_hint,
							  r->end - rc->dest_hint < want ? r->end - rc->dest_hint
											 : want);
				break;
			}
		}
	}
	if (rc->move_flags & OPS_MOVE_FRESH) {
		tried_chunk = 1;
		ret = dest_new_chunk(rc, want, len);
		if (ret != -ENOSPC)
			return ret;
	}
	for (i = 0; i < rc->es->nbgs; i++) {
		struct block_group *bg = rc->es->bgs[i];

		if (!(bg->flags & BTRFS_BLOCK_GROUP_DATA) || !extent_bg_allocatable(bg) ||
		    bg->free.total < len)
			continue;
		if (bg->free.total >= want && range_find(&bg->free, want, ss, bg->start, &start) == 0)
			return dest_claim(rc, bg, start, want);
		for (k = 0; k < bg->free.n; k++) {
			u64 a = (bg->free.r[k].start + ss - 1) / ss * ss, b = bg->free.r[k].end;

			if (b > a && b - a >= len && b - a > best_len) {
				best = bg;
				best_start = a;
				best_len = (b - a) / ss * ss;
			}
		}
	}
	if (!tried_chunk) {
		ret = dest_new_chunk(rc, want, len);
		if (ret != -ENOSPC)
			return ret;
	}
	if (best)
		return dest_claim(rc, best, best_start, best_len < want ? best_len : want);
	blog_err(&rc->fs->log, "no free data space of %llu bytes to move an extent to",
		 (unsigned long long)len);
	return -ENOSPC;
}

/* Give the unfilled end of the destination region back to free space. */
static void dest_release(struct reloc *rc)
{
	struct block_group *bg;

	if (rc->dest_cur < rc->dest_end) {
		bg = extent_find_bg(rc->es, rc->dest_cur);
		if (bg) {
			range_add(&bg->free, rc->dest_cur, rc->dest_end);
			bg->fst_dirty = 1;
		}
	}
	rc->dest_cur = rc->dest_end = 0;
}

/* The place of the next copy of @len bytes: right after the previous one when it fits. */
static int dest_take(struct reloc *rc, u64 len, u64 *logical)
{
	int ret;

	if (rc->dest_end - rc->dest_cur < len) {
		dest_release(rc);
		ret = dest_reserve(rc, len);
		if (ret)
			return ret;
	}
	*logical = rc->dest_cur;
	rc->dest_cur += len;
	rc->dest_hint = rc->dest_cur;
	rc->dest_left = rc->dest_left > len ? rc->dest_left - len : 0;
	return 0;
}

/* ---- data extents ---- */

static int add_leaf(struct reloc *rc, u64 bytenr, u64 root, const struct btrfs_key *key)
{
	struct leaf_ref *l = realloc(rc->leaves, (rc->nleaves + 1) * sizeof(*l));

	if (!l)
		return -ENOMEM;
	rc->leaves = l;
	l[rc->nleaves].bytenr = bytenr;
	l[rc->nleaves].root = root;
	if (key)
		l[rc->nleaves].key = *key;
	else
		memset(&l[rc->nleaves].key, 0, sizeof(*key));
	rc->nleaves++;
	return 0;
}

/*
 * Call @fn for every file extent item that names data extent @refs, found
 * through its references: a SHARED_DATA_REF names the leaf (its items are
 * scanned), an EXTENT_DATA_REF is searched for in its tree at the inode and
 * offset. @root is the tree to search again for a never-shared tree, else 0.
 */
typedef int (*item_fn)(struct reloc *rc, const struct tree_node *leaf, const struct btrfs_key *key,
		       const struct btrfs_file_extent_item *fi, u64 root, void *arg);

static int names_extent(const struct btrfs_file_extent_item *fi, u32 size, u64 bytenr)
{
	return size >= sizeof(*fi) && fi->type != BTRFS_FILE_EXTENT_INLINE &&
	       btrfs_file_extent_disk_bytenr(fi) == bytenr;
}

static int for_each_item(struct reloc *rc, const struct extent_refs *refs, item_fn fn, void *arg)
{
	struct node_cache *cache = &rc->fs->cache;
	size_t i;
	int ret = 0;

	for (i = 0; i < refs->n && ret == 0; i++) {
		const struct extent_ref *r = &refs->r[i];
		struct btrfs_key key = { r->owner, BTRFS_EXTENT_DATA_KEY, r->offset };
		struct tree_root *tr;
		struct tree_path path;
		u32 found = 0;
		int shareable;

		if (r->type == BTRFS_SHARED_DATA_REF_KEY) {
			struct tree_node *leaf;
			u32 slot;

			ret = node_read(cache, r->root_or_parent, 0, 0, NULL, &leaf);
			for (slot = 0; ret == 0 && slot < leaf->nritems; slot++) {
				node_key(leaf, slot, &key);
				if (key.type == BTRFS_EXTENT_DATA_KEY &&
				    names_extent((const void *)leaf_item_data(leaf, slot),
						 leaf_item_size(leaf, slot), refs->bytenr))
					ret = fn(rc, leaf, &key, (const void *)leaf_item_data(leaf, slot),
						 0, arg);
			}
			if (leaf)
				node_put(cache, leaf);
			continue;
		}
		if (r->type != BTRFS_EXTENT_DATA_REF_KEY) {
			ret = BLOG_CORRUPT(&rc->fs->log, "data extent %llu: reference of type %u",
					   (unsigned long long)refs->bytenr, r->type);
			break;
		}
		ret = tree_of(rc, r->root_or_parent, &tr, &shareable);
		if (ret)
			break;
		tree_path_init(&path);
		ret = tree_search_forward(cache, tr, &key, &path);
		while (ret == 0 && found < r->count) {
			const struct btrfs_file_extent_item *fi;
			struct btrfs_key k;
			u32 size;

			path_key(&path, &k);
			if (k.objectid != r->owner || k.type != BTRFS_EXTENT_DATA_KEY)
				break;
			fi = (const void *)path_item(&path, &size);
			if (names_extent(fi, size, refs->bytenr) &&
			    k.offset - btrfs_file_extent_offset(fi) == r->offset) {
				struct tree_node *leaf = path_leaf(&path);

				if (leaf->owner == r->root_or_parent)
					found++;
				ret = fn(rc, leaf, &k, fi, shareable ? 0 : r->root_or_parent, arg);
				if (ret)
					break;
			}
			ret = tree_next_item(cache, &path);
		}
		tree_path_release(cache, &path);
		if (ret == 1)
			ret = 0;
	}
	return ret;
}

static int take_leaf(struct reloc *rc, const struct tree_node *leaf, const struct btrfs_key *key,
		     const struct btrfs_file_extent_item *fi, u64 root, void *arg)
{
	(void)fi;
	(void)arg;
	return add_leaf(rc, leaf->bytenr, root, key);
}

/* Find the leaves whose file extent items name data extent @refs (one entry per item). */
static int collect_leaves(struct reloc *rc, const struct extent_refs *refs)
{
	return for_each_item(rc, refs, take_leaf, NULL);
}

struct span {
	u64 lo, hi;
	int whole;
};

static int widen_span(struct reloc *rc, const struct tree_node *leaf, const struct btrfs_key *key,
		      const struct btrfs_file_extent_item *fi, u64 root, void *arg)
{
	struct span *sp = arg;
	u64 start = btrfs_file_extent_offset(fi), end = start + btrfs_file_extent_num_bytes(fi);

	(void)rc;
	(void)leaf;
	(void)key;
	(void)root;
	if (fi->compression || fi->encryption || fi->other_encoding)
		sp->whole = 1;
	if (start < sp->lo)
		sp->lo = start;
	if (end > sp->hi)
		sp->hi = end;
	return 0;
}

/*
 * The part of data extent @refs that any file extent item uses: [*lo, *hi)
 * of it, over every item for_each_item() finds. *whole is set when the
 * extent must move whole: a compressed (or encoded) item, no item, or a part
 * not on sector bounds.
 */
static int used_span(struct reloc *rc, const struct extent_refs *refs, u64 *lo, u64 *hi,
		     int *whole)
{
	struct span sp = { refs->num_bytes, 0, 0 };
	u32 ss = rc->fs->vol.sectorsize;
	int ret = for_each_item(rc, refs, widen_span, &sp);

	*lo = sp.lo;
	*hi = sp.hi;
	*whole = sp.whole || sp.lo >= sp.hi || sp.hi > refs->num_bytes || sp.lo % ss || sp.hi % ss;
	return ret;
}

/* Copy the bytes and checksums of data extent @refs to a new place (no tree changes). */
static int copy_data_extent(struct reloc *rc, const struct extent_refs *refs)
{
	struct butter_fs *fs = rc->fs;
	struct moved_data *md;
	u32 ss = fs->vol.sectorsize, cs = fs->vol.csum_size;
	u64 len = refs->num_bytes, nsect, off, new_logical, trim = 0;
	u8 *buf = NULL;
	int ret;

	if (len % ss)
		return BLOG_CORRUPT(&fs->log, "data extent %llu: length %llu is not whole sectors",
				    (unsigned long long)refs->bytenr, (unsigned long long)len);
	if (!rc->bg) {
		/* moving chosen extents: bytes no item uses are left behind */
		u64 lo, hi;
		int whole;

		ret = used_span(rc, refs, &lo, &hi, &whole);
		if (ret)
			return ret;
		if (!whole) {
			trim = lo;
			len = hi - lo;
		}
	}
	nsect = len / ss;
	md = realloc(rc->data, (rc->ndata + 1) * sizeof(*md));
	if (!md)
		return -ENOMEM;
	rc->data = md;
	md = &rc->data[rc->ndata];
	memset(md, 0, sizeof(*md));
	md->csums = malloc(nsect * cs);
	md->have = malloc(nsect);
	buf = malloc(len < RELOC_COPY_PIECE ? len : RELOC_COPY_PIECE);
	if (!md->csums || !md->have || !buf) {
		ret = -ENOMEM;
		goto fail;
	}
	ret = rc->bg ? reloc_alloc(rc, BTRFS_BLOCK_GROUP_DATA, len, &new_logical)
		     : dest_take(rc, len, &new_logical);
	if (ret)
		goto fail;
	for (off = 0; off < len; off += RELOC_COPY_PIECE) {
		u64 piece = len - off < RELOC_COPY_PIECE ? len - off : RELOC_COPY_PIECE;
		u32 first = (u32)(off / ss);

		ret = data_read_stored(fs, refs->bytenr + trim + off, piece, buf,
				       md->csums + (size_t)first * cs, md->have + first);
		if (ret == 0)
			ret = volumes_write(&fs->vol, new_logical + off, buf, piece);
		if (ret) {
			blog_err(&fs->log, "relocation: copying data extent %llu (%llu bytes) to %llu: %s",
				 (unsigned long long)refs->bytenr, (unsigned long long)len,
				 (unsigned long long)new_logical, strerror(-ret));
			range_add(&extent_find_bg(rc->es, new_logical)->free, new_logical,
				  new_logical + len);
			goto fail;
		}
	}
	free(buf);
	md->old = refs->bytenr;
	md->new = new_logical;
	md->len = len;
	md->old_len = refs->num_bytes;
	md->trim = trim;
	md->generation = refs->generation;
	ret = map_put(&rc->data_by_old, md->old, rc->ndata);
	rc->ndata++;
	if (rc->st) {
		rc->st->data_extents++;
		rc->st->bytes += len;
	}
	return ret;
fail:
	free(buf);
	free(md->csums);
	free(md->have);
	return ret;
}

/* Point the file extent items of the writable @leaf at the moved data, with the references. */
static int repoint_leaf(struct reloc *rc, struct tree_node *leaf, int full)
{
	u32 slot;
	int ret;

	for (slot = 0; slot < leaf->nritems; slot++) {
		struct btrfs_file_extent_item *fi;
		struct delayed_ref ref;
		struct moved_data *md;
		struct btrfs_key key;
		size_t idx;

		node_key(leaf, slot, &key);
		if (key.type != BTRFS_EXTENT_DATA_KEY ||
		    leaf_item_size(leaf, slot) < sizeof(struct btrfs_file_extent_item))
			continue;
		fi = (void *)leaf_item_data(leaf, slot);
		if (fi->type == BTRFS_FILE_EXTENT_INLINE ||
		    !map_get(&rc->data_by_old, btrfs_file_extent_disk_bytenr(fi), &idx))
			continue;
		md = &rc->data[idx];
		if (btrfs_file_extent_disk_num_bytes(fi) != md->old_len ||
		    ((md->trim || md->len != md->old_len) &&
		     (btrfs_file_extent_offset(fi) < md->trim ||
		      btrfs_file_extent_offset(fi) - md->trim + btrfs_file_extent_num_bytes(fi) >
			      md->len)))
			return BLOG_CORRUPT(&rc->fs->log, "leaf %llu slot %u: data extent %llu is "
							  "%llu bytes, not %llu, or the item reaches "
							  "past the part moved",
					    (unsigned long long)leaf->bytenr, slot,
					    (unsigned long long)md->old,
					    (unsigned long long)btrfs_file_extent_disk_num_bytes(fi),
					    (unsigned long long)md->old_len);
		memset(&ref, 0, sizeof(ref));
		ref.is_data = 1;
		ref.generation = md->generation;
		if (full) {
			ref.parent = leaf->bytenr;
		} else {
			ref.root = leaf->owner;
			ref.owner = key.objectid;
			ref.offset = key.offset - btrfs_file_extent_offset(fi);
		}
		ref.bytenr = md->old;
		ref.num_bytes = md->old_len;
		ref.delta = -1;
		ret = extent_queue_ref(rc->es, &ref);
		if (ret)
			return ret;
		put_le64(&fi->disk_bytenr, md->new);
		if (md->trim || md->len != md->old_len) {
			/* the copy holds only the part used: offsets count from its start */
			put_le64(&fi->disk_num_bytes, md->len);
			put_le64(&fi->offset, btrfs_file_extent_offset(fi) - md->trim);
			put_le64(&fi->ram_bytes, md->len);
			if (!full)
				ref.offset = key.offset - btrfs_file_extent_offset(fi);
		}
		ref.num_bytes = md->len;
		ref.bytenr = md->new;
		ref.delta = 1;
		ret = extent_queue_ref(rc->es, &ref);
		if (ret)
			return ret;
	}
	return 0;
}

static int rewrite_leaf(struct reloc *rc, const struct leaf_ref *l)
{
	struct node_cache *cache = &rc->fs->cache;
	struct tree_node *leaf, *lw;
	size_t idx;
	int full, ret;

	if (l->root) {
		/* a tree never shared: edit the leaf through a copy-on-write search */
		struct tree_root *tr;
		struct tree_path path;
		int shareable;

		ret = tree_of(rc, l->root, &tr, &shareable);
		if (ret)
			return ret;
		tree_path_init(&path);
		ret = tree_search_slot(rc->t, tr, &l->key, &path, 0, 1);
		if (ret == 0)
			ret = repoint_leaf(rc, path.nodes[0], 0);
		else if (ret == 1)
			ret = 0; /* gone already: edited through another of its items */
		tree_path_release(cache, &path);
		return ret;
	}
	if (map_get(&rc->by_old, l->bytenr, &idx)) {
		leaf = rc->blocks[idx].node;
		node_get(cache, leaf);
	} else {
		ret = node_read(cache, l->bytenr, 0, 0, NULL, &leaf);
		if (ret)
			return ret;
	}
	ret = writable(rc, leaf, &lw);
	if (ret)
		return ret;
	ret = copy_is_full(rc, lw, &full);
	if (ret == 0)
		ret = repoint_leaf(rc, lw, full);
	node_put(cache, lw);
	return ret;
}

static int cmp_leaf(const void *pa, const void *pb)
{
	const struct leaf_ref *a = pa, *b = pb;

	if (a->bytenr != b->bytenr)
		return a->bytenr < b->bytenr ? -1 : 1;
	return 0;
}

/* ---- one group ---- */

/*
 * The tree half of moving the data copied so far: insert the copies'
 * checksums, then point every collected leaf's file extent items at them.
 */
static int apply_data_moves(struct reloc *rc)
{
	size_t i, j;
	int ret = 0;

	for (i = 0; i < rc->ndata && ret == 0; i++) {
		struct moved_data *md = &rc->data[i];
		u32 ss = rc->fs->vol.sectorsize, cs = rc->fs->vol.csum_size, a, b;
		u32 nsect = (u32)(md->len / ss);

		for (a = 0; a < nsect && ret == 0; a = b) {
			for (b = a + 1; b < nsect && md->have[b] == md->have[a]; b++)
				;
			if (md->have[a])
				ret = extent_insert_csums(rc->es, rc->t, md->new + (u64)a * ss,
							  (u64)(b - a) * ss, md->csums + (size_t)a * cs);
		}
	}
	if (ret == 0 && rc->nleaves) {
		qsort(rc->leaves, rc->nleaves, sizeof(rc->leaves[0]), cmp_leaf);
		for (i = 0; i < rc->nleaves && ret == 0; i = j) {
			for (j = i + 1; j < rc->nleaves && rc->leaves[j].bytenr == rc->leaves[i].bytenr;
			     j++)
				;
			ret = rewrite_leaf(rc, &rc->leaves[i]);
		}
	}
	return ret;
}


/*
 * One pass: move what the group holds (data up to RELOC_BATCH_BYTES) in the
 * running transaction. *left: extents seen. *changed_trees: a failure from
 * here on must abort the transaction.
 */
static int reloc_pass(struct reloc *rc, size_t *left, int *changed_trees)
{
	struct extent_span *found;
	u64 batch = 0;
	size_t n, i;
	int ret;

	/* the extents the group holds now (the committed extent tree) */
	ret = extent_list_range(rc->es, rc->start, rc->end, &found, &n);
	if (ret)
		return ret;
	*left = n;
	/* data: copy bytes first (nothing in the trees changes yet) */
	for (i = 0; i < n && batch < RELOC_BATCH_BYTES; i++) {
		struct extent_refs refs;

		if (found[i].level >= 0)
			continue;
		ret = extent_get_refs(rc->es, found[i].bytenr, &refs);
		if (ret == 1)
			continue;
		if (ret == 0) {
			ret = copy_data_extent(rc, &refs);
			if (ret == 0)
				ret = collect_leaves(rc, &refs);
			batch += refs.num_bytes;
			extent_refs_free(&refs);
		}
		if (ret)
			goto undo;
	}
	*changed_trees = 1;
	ret = apply_data_moves(rc);
	/* tree blocks, highest levels first (their children's parents move once) */
	for (int level = BTRFS_MAX_LEVEL - 1; level >= 0 && ret == 0; level--)
		for (i = 0; i < n && ret == 0; i++)
			if (found[i].level == level)
				ret = move_tree_block(rc, found[i].bytenr, level);
	free(found);
	return ret;
undo:
	/* give back the space of the copies made so far: nothing points at them */
	for (i = 0; i < rc->ndata; i++) {
		struct block_group *bg = extent_find_bg(rc->es, rc->data[i].new);

		if (bg)
			range_add(&bg->free, rc->data[i].new, rc->data[i].new + rc->data[i].len);
	}
	free(found);
	return ret;
}

/* Is there a relocation tree left by an interrupted kernel balance? */
static int has_reloc_trees(struct butter_fs *fs)
{
	struct btrfs_key key = { BTRFS_TREE_RELOC_OBJECTID, BTRFS_ROOT_ITEM_KEY, 0 };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &fs->root_tree, &key, &path);
	if (ret == 0) {
		path_key(&path, &key);
		ret = key.objectid == BTRFS_TREE_RELOC_OBJECTID;
	} else if (ret == 1) {
		ret = 0;
	}
	tree_path_release(&fs->cache, &path);
	return ret;
}

int ops_relocate_group_locked(struct butter_fs *fs, struct fs_write_state *w, u64 start,
			      struct butter_balance_stats *st)
{
	struct reloc rc;
	struct chunk_freed *freed = NULL;
	size_t nfreed = 0, left = 0;
	int ret, pass, changed = 0;

	memset(&rc, 0, sizeof(rc));
	rc.fs = fs;
	rc.w = w;
	rc.es = &w->es;
	rc.t = &w->txn.tt;
	rc.st = st;
	rc.bg = extent_find_bg(&w->es, start);
	if (!rc.bg || rc.bg->start != start)
		return -ENOENT;
	ret = has_reloc_trees(fs);
	if (ret) {
		if (ret > 0) {
			/* the others are dropped at a read-write open (subvol_drop_reloc_trees()) */
			blog_err(&fs->log, "a balance interrupted in the kernel left relocation trees "
					   "merged in part; mount with the kernel once to finish it");
			ret = -EOPNOTSUPP;
		}
		return ret;
	}
	/* start from a committed state: no log, nothing half done */
	ret = txn_commit(&w->txn);
	if (ret)
		return ret;
	rc.start = rc.bg->start;
	rc.end = rc.bg->start + rc.bg->length;
	rc.type = rc.bg->flags;
	rc.bg->ro = 1;
	ret = txn_begin(&w->txn);
	if (ret == 0)
		ret = ensure_room(&rc);
	if (ret == 0)
		ret = txn_commit(&w->txn);
	else if (ret == -ENOSPC && w->txn.aborted)
		return ret;
	if (ret == -ENOSPC) {
		/* nothing half made: keep the chunks that were, refuse the move */
		rc.bg->ro = 0;
		return txn_commit(&w->txn) ?: -ENOSPC;
	}
	if (ret) {
		rc.bg->ro = 0;
		txn_abort(&w->txn, ret, "making room to relocate a block group");
		return ret;
	}
	for (pass = 0; pass < RELOC_MAX_PASSES; pass++) {
		changed = 0;
		ret = txn_begin(&w->txn);
		if (ret)
			break;
		ret = reloc_pass(&rc, &left, &changed);
		if (ret == 0 && left == 0) {
			reloc_reset(&rc);
			break;
		}
		if (ret == 0)
			ret = txn_commit(&w->txn);
		reloc_reset(&rc);
		if (ret)
			break;
	}
	if (ret == 0 && left) {
		blog_err(&fs->log, "block group %llu still holds %zu extents after %d passes",
			 (unsigned long long)start, left, RELOC_MAX_PASSES);
		ret = -EUCLEAN;
		changed = 0;
	}
	if (ret) {
		rc.bg->ro = 0;
		if (changed)
			txn_abort(&w->txn, ret, "relocating a block group");
		return ret;
	}
	/* the group is empty in the committed state: remove the chunk */
	ret = chunk_remove(&w->es, &w->txn.tt, start, &freed, &nfreed);
	if (ret == 0)
		ret = txn_commit(&w->txn);
	if (ret == 0)
		ret = chunk_release_devspace(&w->es, freed, nfreed);
	free(freed);
	if (ret) {
		txn_abort(&w->txn, ret, "removing a relocated chunk");
		return ret;
	}
	if (st)
		st->groups++;
	return 0;
}

/* ---- moving chosen data extents (defrag, layout) ---- */

int ops_move_data_locked(struct butter_fs *fs, struct fs_write_state *w,
			 const struct ops_move_item *items, size_t n, unsigned flags,
			 struct ops_move_stats *st)
{
	struct butter_balance_stats bst;
	struct reloc rc;
	size_t i = 0, k;
	int ret, changed = 0;

	memset(&bst, 0, sizeof(bst));
	memset(&rc, 0, sizeof(rc));
	rc.fs = fs;
	rc.w = w;
	rc.es = &w->es;
	rc.t = &w->txn.tt;
	rc.st = &bst;
	rc.move_flags = flags;
	ret = has_reloc_trees(fs);
	if (ret)
		return ret > 0 ? -EOPNOTSUPP : ret;
	/* the substitution rule: no subvolume tree block is dirty when a batch starts */
	ret = txn_commit(&w->txn);
	if (ret)
		return ret;
	if (st)
		rc.dest_hint = st->hint;
	while (i < n && ret == 0) {
		u64 batch = 0;

		changed = 0;
		ret = txn_begin(&w->txn);
		if (ret)
			break;
		for (; i < n && batch < RELOC_BATCH_BYTES && ret == 0; i++) {
			struct extent_refs refs;
			size_t dummy;

			if (map_get(&rc.data_by_old, items[i].bytenr, &dummy))
				continue; /* named twice in this batch */
			ret = extent_get_refs(rc.es, items[i].bytenr, &refs);
			if (ret == 1) {
				ret = 0; /* gone (freed since it was listed) */
				continue;
			}
			if (ret)
				break;
			if (refs.is_data) {
				if (rc.dest_cur == rc.dest_end)
					for (k = i, rc.dest_left = 0; k < n && rc.dest_left < (1ULL << 30); k++)
						rc.dest_left += items[k].len;
				ret = copy_data_extent(&rc, &refs);
				if (ret == 0)
					ret = collect_leaves(&rc, &refs);
				batch += refs.num_bytes;
			}
			extent_refs_free(&refs);
		}
		/* space reserved and not filled is free again before the commit records free space */
		dest_release(&rc);
		if (ret == 0) {
			changed = 1;
			ret = apply_data_moves(&rc);
		}
		if (ret == 0)
			ret = txn_commit(&w->txn);
		if (ret && !changed) {
			/* nothing points at the copies made so far: give their space back */
			for (k = 0; k < rc.ndata; k++) {
				struct block_group *bg = extent_find_bg(rc.es, rc.data[k].new);

				if (bg)
					range_add(&bg->free, rc.data[k].new, rc.data[k].new + rc.data[k].len);
			}
		}
		reloc_reset(&rc);
	}
	if (st) {
		st->hint = rc.dest_hint;
		st->extents += bst.data_extents;
		st->bytes += bst.bytes;
		st->tree_blocks += bst.tree_blocks;
	}
	if (ret && changed)
		txn_abort(&w->txn, ret, "moving data extents");
	return ret;
}
