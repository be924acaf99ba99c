/*
 * node.c — reading tree blocks: every copy tried until one validates, and a
 * cache of validated nodes bounded in bytes (LRU over unreferenced nodes).
 *
 * What validation proves is listed in tree.h. It is the one gate between the
 * disk and every item parser, so it checks all bounds an accessor relies on.
 * A node that fails on one copy but passes on another is served from the good
 * copy and the bad one is reported (repair belongs to the write path/scrub).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/checksum.h"
#include "tree/tree.h"

#define MIN_HASH_SIZE 4096

const char node_stale_generation[] = "generation differs from what the parent expects (stale copy)";

int node_cache_init(struct node_cache *cache, struct btrfs_volumes *vol, u64 limit_bytes)
{
	memset(cache, 0, sizeof(*cache));
	cache->vol = vol;
	cache->log = vol->log;
	cache->nodesize = vol->nodesize;
	cache->limit = limit_bytes;
	/* a bucket per node the bound holds, a power of two (hash_of() masks) */
	cache->hash_size = MIN_HASH_SIZE;
	while (vol->nodesize && cache->hash_size < limit_bytes / vol->nodesize &&
	       cache->hash_size < ((size_t)1 << 24))
		cache->hash_size <<= 1;
	cache->hash = calloc(cache->hash_size, sizeof(*cache->hash));
	if (!cache->hash)
		return -ENOMEM;
	cache->lru.lru_next = cache->lru.lru_prev = &cache->lru;
	pthread_mutex_init(&cache->lock, NULL);
	return 0;
}

static void free_node(struct tree_node *n)
{
	free(n->data);
	free(n);
}

void node_cache_destroy(struct node_cache *cache)
{
	size_t i;

	if (!cache->hash)
		return;
	for (i = 0; i < cache->hash_size; i++) {
		struct tree_node *n = cache->hash[i], *next;

		for (; n; n = next) {
			next = n->hash_next;
			free_node(n);
		}
	}
	free(cache->hash);
	cache->hash = NULL;
	pthread_mutex_destroy(&cache->lock);
}

static size_t hash_of(const struct node_cache *cache, u64 bytenr)
{
	/* a mask, not a division: this runs for every node of every search */
	return (size_t)((bytenr >> 12) * 0x9E3779B97F4A7C15ULL >> 20) & (cache->hash_size - 1);
}

static void lru_unlink(struct tree_node *n)
{
	n->lru_prev->lru_next = n->lru_next;
	n->lru_next->lru_prev = n->lru_prev;
	n->lru_next = n->lru_prev = NULL;
}

static void lru_push(struct node_cache *cache, struct tree_node *n)
{
	n->lru_next = cache->lru.lru_next;
	n->lru_prev = &cache->lru;
	cache->lru.lru_next->lru_prev = n;
	cache->lru.lru_next = n;
}

/* Drop least recently used unreferenced nodes until under the bound. Lock held. */
static void evict(struct node_cache *cache)
{
	while (cache->bytes > cache->limit && cache->lru.lru_prev != &cache->lru) {
		struct tree_node *victim = cache->lru.lru_prev, **pp;

		lru_unlink(victim);
		for (pp = &cache->hash[hash_of(cache, victim->bytenr)]; *pp; pp = &(*pp)->hash_next) {
			if (*pp == victim) {
				*pp = victim->hash_next;
				break;
			}
		}
		cache->bytes -= cache->nodesize;
		free_node(victim);
	}
}

void node_get(struct node_cache *cache, struct tree_node *node)
{
	pthread_mutex_lock(&cache->lock);
	if (node->refs++ == 0)
		lru_unlink(node);
	pthread_mutex_unlock(&cache->lock);
}

void node_put(struct node_cache *cache, struct tree_node *node)
{
	if (!node)
		return;
	pthread_mutex_lock(&cache->lock);
	if (--node->refs == 0) {
		if (node->removed) {
			pthread_mutex_unlock(&cache->lock);
			free_node(node);
			return;
		}
		lru_push(cache, node);
		evict(cache);
	}
	pthread_mutex_unlock(&cache->lock);
}

int node_validate(const struct node_cache *cache, const u8 *data, u64 bytenr, u64 gen,
		  int level, const struct btrfs_key *first_key, const char **why)
{
	const struct btrfs_header *h = (const struct btrfs_header *)data;
	const struct btrfs_volumes *vol = cache->vol;
	u32 nodesize = cache->nodesize, nritems, i;
	u32 data_size = nodesize - (u32)sizeof(struct btrfs_header);
	u8 csum[BTRFS_CSUM_SIZE];
	struct btrfs_key prev, key;

	btrfs_csum_compute(vol->csum_type, data + BTRFS_CSUM_SIZE, nodesize - BTRFS_CSUM_SIZE,
			   csum);
	if (memcmp(csum, h->csum, vol->csum_size) != 0)
		return *why = "checksum mismatch", -EUCLEAN;
	if (btrfs_header_bytenr(h) != bytenr)
		return *why = "header bytenr does not match its address", -EUCLEAN;
	if (memcmp(h->fsid, vol->meta_fsid, BTRFS_FSID_SIZE) != 0)
		return *why = "fsid does not match the filesystem", -EUCLEAN;
	if (h->level >= BTRFS_MAX_LEVEL)
		return *why = "level out of range", -EUCLEAN;
	if (level >= 0 && h->level != level)
		return *why = "level differs from what the parent expects", -EUCLEAN;
	if (gen && btrfs_header_generation(h) != gen)
		return *why = node_stale_generation, -EUCLEAN;
	nritems = btrfs_header_nritems(h);
	if (h->level == 0) {
		u32 data_end = data_size;

		if (nritems > data_size / sizeof(struct btrfs_item))
			return *why = "too many items for a leaf", -EUCLEAN;
		if (nritems == 0 && first_key)
			return *why = "empty leaf below a node (only a root leaf may be empty)", -EUCLEAN;
		for (i = 0; i < nritems; i++) {
			const struct btrfs_item *item =
				(const struct btrfs_item *)(data + sizeof(*h)) + i;
			u32 off = btrfs_item_offset(item), size = btrfs_item_size(item);

			/* item data is packed from the end of the leaf backwards */
			if (off > data_size || size > data_size - off || off + size != data_end)
				return *why = "item data outside the leaf or not contiguous", -EUCLEAN;
			data_end = off;
			btrfs_disk_to_cpu_key(&key, &item->key);
			if (i && btrfs_comp_keys(&prev, &key) >= 0)
				return *why = "leaf keys out of order", -EUCLEAN;
			prev = key;
		}
		if ((u64)nritems * sizeof(struct btrfs_item) > data_end)
			return *why = "item headers overlap item data", -EUCLEAN;
	} else {
		if (nritems == 0)
			return *why = "empty internal node", -EUCLEAN;
		if (nritems > data_size / sizeof(struct btrfs_key_ptr))
			return *why = "too many pointers for a node", -EUCLEAN;
		for (i = 0; i < nritems; i++) {
			const struct btrfs_key_ptr *ptr =
				(const struct btrfs_key_ptr *)(data + sizeof(*h)) + i;

			btrfs_disk_to_cpu_key(&key, &ptr->key);
			if (i && btrfs_comp_keys(&prev, &key) >= 0)
				return *why = "node keys out of order", -EUCLEAN;
			if (btrfs_key_ptr_blockptr(ptr) % vol->sectorsize)
				return *why = "unaligned child pointer", -EUCLEAN;
			prev = key;
		}
	}
	if (first_key && nritems) {
		const struct btrfs_disk_key *dk =
			h->level == 0 ? &((const struct btrfs_item *)(data + sizeof(*h)))->key
				      : &((const struct btrfs_key_ptr *)(data + sizeof(*h)))->key;

		btrfs_disk_to_cpu_key(&key, dk);
		if (btrfs_comp_keys(&key, first_key) != 0)
			return *why = "first key differs from the parent's pointer", -EUCLEAN;
	}
	return 0;
}

static struct tree_node *cache_lookup(struct node_cache *cache, u64 bytenr)
{
	struct tree_node *n;

	for (n = cache->hash[hash_of(cache, bytenr)]; n; n = n->hash_next)
		if (n->bytenr == bytenr)
			return n;
	return NULL;
}

/* Check a cached node against what this parent expects. */
static int cached_matches(const struct tree_node *n, u64 gen, int level,
			  const struct btrfs_key *first_key)
{
	struct btrfs_key key;

	if (gen && n->generation != gen)
		return 0;
	if (level >= 0 && n->level != level)
		return 0;
	if (first_key && n->nritems == 0 && !n->dirty)
		return 0; /* on disk an empty leaf is only valid as a root; a split may make one briefly */
	if (first_key && n->nritems) {
		node_key(n, 0, &key);
		if (btrfs_comp_keys(&key, first_key) != 0)
			return 0;
	}
	return 1;
}

int node_read(struct node_cache *cache, u64 bytenr, u64 gen, int level,
	      const struct btrfs_key *first_key, struct tree_node **out)
{
	struct tree_node *n, *other;
	const char *why = NULL;
	int mirror, copies, ret = -EIO;
	u8 *data;

	pthread_mutex_lock(&cache->lock);
	n = cache_lookup(cache, bytenr);
	if (n && cached_matches(n, gen, level, first_key)) {
		if (n->refs++ == 0)
			lru_unlink(n);
		cache->hits++;
		pthread_mutex_unlock(&cache->lock);
		*out = n;
		return 0;
	}
	cache->misses++;
	pthread_mutex_unlock(&cache->lock);
	if (n) {
		blog_err(cache->log, "tree block %llu: cached copy does not match its parent",
			 (unsigned long long)bytenr);
		return -EIO;
	}

	data = malloc(cache->nodesize);
	if (!data)
		return -ENOMEM;
	copies = volumes_num_copies(cache->vol, bytenr);
	for (mirror = 1; mirror <= copies; mirror++) {
		char where[256];

		ret = volumes_read(cache->vol, bytenr, data, cache->nodesize, mirror);
		if (ret == -ENOENT) {
			blog_err(cache->log, "tree block %llu: no chunk maps this address",
				 (unsigned long long)bytenr);
			break;
		}
		if (ret) {
			if (!volumes_copy_missing(cache->vol, bytenr, mirror))
				blog_warn(cache->log, "tree block %s: read error",
					  volumes_describe(cache->vol, bytenr, mirror, where,
							   sizeof(where)));
			continue;
		}
		ret = node_validate(cache, data, bytenr, gen, level, first_key, &why);
		if (ret == 0)
			break;
		volumes_count_error(cache->vol, bytenr, mirror,
				    why == node_stale_generation ? BTRFS_DEV_STAT_GENERATION_ERRS
								 : BTRFS_DEV_STAT_CORRUPTION_ERRS);
		blog_warn(cache->log, "tree block %s: %s",
			  volumes_describe(cache->vol, bytenr, mirror, where, sizeof(where)), why);
	}
	if (ret) {
		free(data);
		blog_err(cache->log, "tree block %llu: no good copy among %d", (unsigned long long)bytenr,
			 copies);
		return -EIO;
	}
	n = calloc(1, sizeof(*n));
	if (!n) {
		free(data);
		return -ENOMEM;
	}
	n->bytenr = bytenr;
	n->data = data;
	n->generation = btrfs_header_generation(node_header(n));
	n->owner = btrfs_header_owner(node_header(n));
	n->nritems = btrfs_header_nritems(node_header(n));
	n->level = node_header(n)->level;
	n->refs = 1;

	pthread_mutex_lock(&cache->lock);
	other = cache_lookup(cache, bytenr);
	if (other) {
		/* another reader inserted it meanwhile: use theirs */
		if (other->refs++ == 0)
			lru_unlink(other);
		pthread_mutex_unlock(&cache->lock);
		free_node(n);
		*out = other;
		return 0;
	}
	n->hash_next = cache->hash[hash_of(cache, bytenr)];
	cache->hash[hash_of(cache, bytenr)] = n;
	cache->bytes += cache->nodesize;
	evict(cache);
	pthread_mutex_unlock(&cache->lock);
	*out = n;
	return 0;
}

/* Unhash @n. Lock held. */
static void unhash(struct node_cache *cache, struct tree_node *n)
{
	struct tree_node **pp;

	for (pp = &cache->hash[hash_of(cache, n->bytenr)]; *pp; pp = &(*pp)->hash_next) {
		if (*pp == n) {
			*pp = n->hash_next;
			break;
		}
	}
	n->hash_next = NULL;
}

int node_cache_insert(struct node_cache *cache, struct tree_node *node)
{
	struct tree_node *old;

	pthread_mutex_lock(&cache->lock);
	old = cache_lookup(cache, node->bytenr);
	if (old) {
		if (old->refs) {
			pthread_mutex_unlock(&cache->lock);
			return -EEXIST;
		}
		/* a stale copy of a block that was freed and is now reused */
		lru_unlink(old);
		unhash(cache, old);
		cache->bytes -= cache->nodesize;
		free_node(old);
	}
	node->hash_next = cache->hash[hash_of(cache, node->bytenr)];
	cache->hash[hash_of(cache, node->bytenr)] = node;
	cache->bytes += cache->nodesize;
	pthread_mutex_unlock(&cache->lock);
	return 0;
}

void node_cache_remove(struct node_cache *cache, struct tree_node *node)
{
	pthread_mutex_lock(&cache->lock);
	if (cache_lookup(cache, node->bytenr) == node) {
		unhash(cache, node);
		cache->bytes -= cache->nodesize;
	}
	node->removed = 1;
	pthread_mutex_unlock(&cache->lock);
}
