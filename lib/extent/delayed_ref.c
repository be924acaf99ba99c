/*
 * delayed_ref.c — reference changes queued during a transaction and applied
 * to the extent tree at commit.
 *
 * Extent items (skinny metadata shown; non-skinny tree blocks use
 * (bytenr, EXTENT_ITEM, nodesize) + struct btrfs_tree_block_info):
 *   tree block  (bytenr, METADATA_ITEM, level)    extent_item{refs, gen, TREE_BLOCK}
 *   data        (bytenr, EXTENT_ITEM, num_bytes)  extent_item{refs, gen, DATA}
 * followed by inline refs, sorted by type ascending and, within a type, by
 * root/parent/hash descending (the order the kernel searches them in):
 *   TREE_BLOCK_REF   u8 type, le64 root
 *   EXTENT_DATA_REF  u8 type, struct btrfs_extent_data_ref {root, objectid, offset, count}
 *   SHARED_BLOCK_REF u8 type, le64 parent
 *   SHARED_DATA_REF  u8 type, le64 parent, le32 count
 * References may also live in keyed items (bytenr, *_REF, root|hash|parent);
 * those are updated in place when found. A new reference goes inline while
 * the extent item stays within a sixteenth of a leaf (the kernel's limit),
 * else into a keyed item of its own (EXTENT_DATA_REF at its hash, or the
 * next free offset after it when hashes collide).
 *
 * Running the queue: sort by bytenr, merge changes to the same reference,
 * then per extent: create, update or delete its item. An extent whose last
 * reference goes is pinned (freed after the commit) and its block group's
 * used bytes drop; a new one adds to them.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "extent/extent.h"
#include "format/checksum.h"


static size_t pend_slot(u64 bytenr, size_t cap)
{
	return (size_t)((bytenr >> 12) * 0x9E3779B97F4A7C15ULL) & (cap - 1);
}

/* Record a queued tree block change in the pending table. */
static int pend_add(struct extent_state *es, const struct delayed_ref *ref)
{
	struct pending_meta *p;
	size_t i;

	if ((es->npend + 1) * 2 > es->pend_cap) {
		size_t cap = es->pend_cap ? es->pend_cap * 2 : 1024, j;
		struct pending_meta *n = calloc(cap, sizeof(*n));

		if (!n)
			return -ENOMEM;
		for (j = 0; j < es->pend_cap; j++) {
			if (!es->pend[j].bytenr)
				continue;
			for (i = pend_slot(es->pend[j].bytenr, cap); n[i].bytenr; i = (i + 1) & (cap - 1))
				;
			n[i] = es->pend[j];
		}
		free(es->pend);
		es->pend = n;
		es->pend_cap = cap;
	}
	for (i = pend_slot(ref->bytenr, es->pend_cap);; i = (i + 1) & (es->pend_cap - 1)) {
		p = &es->pend[i];
		if (p->bytenr == ref->bytenr)
			break;
		if (!p->bytenr) {
			p->bytenr = ref->bytenr;
			es->npend++;
			break;
		}
	}
	p->delta += ref->delta;
	p->set_flags |= ref->set_flags;
	return 0;
}

static const struct pending_meta *pend_find(const struct extent_state *es, u64 bytenr)
{
	size_t i;

	if (!es->npend)
		return NULL;
	for (i = pend_slot(bytenr, es->pend_cap); es->pend[i].bytenr;
	     i = (i + 1) & (es->pend_cap - 1))
		if (es->pend[i].bytenr == bytenr)
			return &es->pend[i];
	return NULL;
}

int extent_queue_ref(struct extent_state *es, const struct delayed_ref *ref)
{
	if (!ref->is_data) {
		int ret = pend_add(es, ref);

		if (ret)
			return ret;
	}
	if (es->nrefs == es->refs_cap) {
		size_t cap = es->refs_cap ? es->refs_cap * 2 : 256;
		struct delayed_ref *r = realloc(es->refs, cap * sizeof(*r));

		if (!r)
			return -ENOMEM;
		es->refs = r;
		es->refs_cap = cap;
	}
	es->refs[es->nrefs++] = *ref;
	return 0;
}

u64 extent_data_ref_hash(u64 root, u64 owner, u64 offset)
{
	u32 high = ~(u32)0, low = ~(u32)0;
	le64 v;

	put_le64(&v, root);
	high = btrfs_crc32c_raw(high, &v, sizeof(v));
	put_le64(&v, owner);
	low = btrfs_crc32c_raw(low, &v, sizeof(v));
	put_le64(&v, offset);
	low = btrfs_crc32c_raw(low, &v, sizeof(v));
	return ((u64)high << 31) ^ (u64)low;
}

/* One reference of an extent, decoded. */
struct ref_entry {
	u8 type;       /* *_REF_KEY */
	u64 root_or_parent;
	u64 owner, offset; /* EXTENT_DATA_REF */
	u32 count;
	u64 order;     /* sort value within the type (descending) */
};

static u64 ref_order(const struct ref_entry *r)
{
	if (r->type == BTRFS_EXTENT_DATA_REF_KEY)
		return extent_data_ref_hash(r->root_or_parent, r->owner, r->offset);
	return r->root_or_parent;
}

static int same_ref(const struct ref_entry *a, const struct ref_entry *b)
{
	return a->type == b->type && a->root_or_parent == b->root_or_parent &&
	       (a->type != BTRFS_EXTENT_DATA_REF_KEY || (a->owner == b->owner && a->offset == b->offset));
}

static int cmp_ref(const void *pa, const void *pb)
{
	const struct ref_entry *a = pa, *b = pb;

	if (a->type != b->type)
		return a->type < b->type ? -1 : 1;
	if (a->order != b->order)
		return a->order > b->order ? -1 : 1;
	return 0;
}

static void ref_from_delayed(const struct delayed_ref *d, struct ref_entry *r)
{
	memset(r, 0, sizeof(*r));
	if (d->is_data) {
		r->type = d->parent ? BTRFS_SHARED_DATA_REF_KEY : BTRFS_EXTENT_DATA_REF_KEY;
		r->owner = d->owner;
		r->offset = d->offset;
	} else {
		r->type = d->parent ? BTRFS_SHARED_BLOCK_REF_KEY : BTRFS_TREE_BLOCK_REF_KEY;
	}
	r->root_or_parent = d->parent ? d->parent : d->root;
	r->order = ref_order(r);
}

static int cmp_delayed(const void *pa, const void *pb)
{
	const struct delayed_ref *a = pa, *b = pb;

	if (a->bytenr != b->bytenr)
		return a->bytenr < b->bytenr ? -1 : 1;
	return 0;
}

/* Decoded extent item: header fields and its inline references. */
struct extent_rec {
	struct btrfs_key key;
	u64 refs, generation, flags;
	struct btrfs_key first_key; /* non-skinny tree block info */
	u8 level;
	struct ref_entry *inl;
	size_t ninl, cap;
};

static int rec_push(struct extent_rec *rec, const struct ref_entry *r)
{
	if (rec->ninl == rec->cap) {
		size_t cap = rec->cap ? rec->cap * 2 : 8;
		struct ref_entry *n = realloc(rec->inl, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		rec->inl = n;
		rec->cap = cap;
	}
	rec->inl[rec->ninl++] = *r;
	return 0;
}

static int parse_extent_item(struct extent_state *es, const struct btrfs_key *key, const u8 *p,
			     u32 size, struct extent_rec *rec)
{
	const struct btrfs_extent_item *ei = (const void *)p;
	u32 pos = sizeof(*ei);

	if (size < sizeof(*ei))
		goto bad;
	rec->key = *key;
	rec->refs = btrfs_extent_refs(ei);
	if (rec->refs > (u64)INT32_MAX * 4)
		goto bad; /* no extent has that many references: a corrupt count */
	rec->generation = btrfs_extent_generation(ei);
	rec->flags = btrfs_extent_flags(ei);
	if ((rec->flags & BTRFS_EXTENT_FLAG_TREE_BLOCK) && key->type == BTRFS_EXTENT_ITEM_KEY) {
		const struct btrfs_tree_block_info *info = (const void *)(p + pos);

		if (size - pos < sizeof(*info))
			goto bad;
		btrfs_disk_to_cpu_key(&rec->first_key, &info->key);
		rec->level = info->level;
		pos += sizeof(*info);
	}
	while (pos < size) {
		struct ref_entry r;
		u8 type = p[pos];

		memset(&r, 0, sizeof(r));
		r.type = type;
		if (type == BTRFS_TREE_BLOCK_REF_KEY || type == BTRFS_SHARED_BLOCK_REF_KEY) {
			if (size - pos < 9)
				goto bad;
			r.root_or_parent = get_le64(p + pos + 1);
			r.count = 1;
			pos += 9;
		} else if (type == BTRFS_EXTENT_DATA_REF_KEY) {
			const struct btrfs_extent_data_ref *dr = (const void *)(p + pos + 1);

			if (size - pos < 1 + sizeof(*dr))
				goto bad;
			r.root_or_parent = get_le64(&dr->root);
			r.owner = get_le64(&dr->objectid);
			r.offset = get_le64(&dr->offset);
			r.count = get_le32(&dr->count);
			pos += 1 + sizeof(*dr);
		} else if (type == BTRFS_SHARED_DATA_REF_KEY) {
			if (size - pos < 13)
				goto bad;
			r.root_or_parent = get_le64(p + pos + 1);
			r.count = get_le32(p + pos + 9);
			pos += 13;
		} else {
			goto bad;
		}
		r.order = ref_order(&r);
		if (rec_push(rec, &r))
			return -ENOMEM;
	}
	return 0;
bad:
	return BLOG_CORRUPT(es->log, "extent item %llu: malformed (size %u)",
			    (unsigned long long)key->objectid, size);
}

/* Serialize @rec into @buf; returns its size. */
static u32 build_extent_item(const struct extent_rec *rec, u8 *buf)
{
	struct btrfs_extent_item *ei = (void *)buf;
	u32 pos = sizeof(*ei);
	size_t i;

	btrfs_set_extent_refs(ei, rec->refs);
	btrfs_set_extent_generation(ei, rec->generation);
	btrfs_set_extent_flags(ei, rec->flags);
	if ((rec->flags & BTRFS_EXTENT_FLAG_TREE_BLOCK) && rec->key.type == BTRFS_EXTENT_ITEM_KEY) {
		struct btrfs_tree_block_info *info = (void *)(buf + pos);

		btrfs_cpu_to_disk_key(&info->key, &rec->first_key);
		info->level = rec->level;
		pos += sizeof(*info);
	}
	for (i = 0; i < rec->ninl; i++) {
		const struct ref_entry *r = &rec->inl[i];

		buf[pos] = r->type;
		if (r->type == BTRFS_EXTENT_DATA_REF_KEY) {
			struct btrfs_extent_data_ref *dr = (void *)(buf + pos + 1);

			put_le64(&dr->root, r->root_or_parent);
			put_le64(&dr->objectid, r->owner);
			put_le64(&dr->offset, r->offset);
			put_le32(&dr->count, r->count);
			pos += 1 + sizeof(*dr);
		} else if (r->type == BTRFS_SHARED_DATA_REF_KEY) {
			put_le64(buf + pos + 1, r->root_or_parent);
			put_le32(buf + pos + 9, r->count);
			pos += 13;
		} else {
			put_le64(buf + pos + 1, r->root_or_parent);
			pos += 9;
		}
	}
	return pos;
}

/* Key of the keyed item that would hold reference @r of @bytenr. */
static void keyed_ref_key(u64 bytenr, const struct ref_entry *r, struct btrfs_key *key)
{
	key->objectid = bytenr;
	key->type = r->type;
	key->offset = r->type == BTRFS_EXTENT_DATA_REF_KEY ? ref_order(r) : r->root_or_parent;
}

/* Bytes one reference takes inline in an extent item. */
static u32 inline_ref_size(const struct ref_entry *r)
{
	if (r->type == BTRFS_EXTENT_DATA_REF_KEY)
		return 1 + (u32)sizeof(struct btrfs_extent_data_ref);
	if (r->type == BTRFS_SHARED_DATA_REF_KEY)
		return 1 + 8 + 4;
	return 1 + 8;
}

/*
 * The largest extent item that takes more inline references (the kernel's
 * limit: a sixteenth of a leaf); beyond it new references go in keyed items.
 */
static u32 max_extent_item_size(const struct extent_state *es)
{
	return (es->vol->nodesize - (u32)sizeof(struct btrfs_header)) / 16 -
	       (u32)sizeof(struct btrfs_item);
}

static u32 extent_item_size(const struct extent_rec *rec)
{
	u32 size = (u32)sizeof(struct btrfs_extent_item);
	size_t i;

	if ((rec->flags & BTRFS_EXTENT_FLAG_TREE_BLOCK) && rec->key.type == BTRFS_EXTENT_ITEM_KEY)
		size += (u32)sizeof(struct btrfs_tree_block_info);
	for (i = 0; i < rec->ninl; i++)
		size += inline_ref_size(&rec->inl[i]);
	return size;
}

/* Does the keyed EXTENT_DATA_REF payload @p (@size bytes) name reference @r? */
static int data_ref_matches(const u8 *p, u32 size, const struct ref_entry *r)
{
	const struct btrfs_extent_data_ref *dr = (const void *)p;

	return size >= sizeof(*dr) && get_le64(&dr->root) == r->root_or_parent &&
	       get_le64(&dr->objectid) == r->owner && get_le64(&dr->offset) == r->offset;
}

#define DATA_REF_PROBES 64 /* hash collisions tolerated for one (bytenr, hash) */

/*
 * Apply @delta to a reference held in a keyed item. Returns 1 if no such
 * keyed reference exists, 0 when applied. EXTENT_DATA_REF items sit at their
 * hash, or (collisions) at the next free offsets after it.
 */
static int apply_keyed_ref(struct extent_state *es, struct tree_trans *t, u64 bytenr,
			   const struct ref_entry *r, int delta)
{
	struct btrfs_key key;
	struct tree_path path;
	int ret, probe;

	keyed_ref_key(bytenr, r, &key);
	for (probe = 0; probe < DATA_REF_PROBES; probe++, key.offset++) {
		u32 size, count = 1;
		u8 *p;

		tree_path_init(&path);
		ret = tree_search_slot(t, es->extent_root, &key, &path, 0, 1);
		if (ret != 0)
			break;
		p = path_item_mut(&path, &size);
		if (r->type == BTRFS_EXTENT_DATA_REF_KEY) {
			if (!data_ref_matches(p, size, r)) {
				tree_path_release(es->cache, &path);
				continue; /* a hash collision: not this reference */
			}
			count = get_le32(&((struct btrfs_extent_data_ref *)p)->count);
		} else if (r->type == BTRFS_SHARED_DATA_REF_KEY) {
			if (size < 4) {
				ret = BLOG_CORRUPT(es->log, "shared data ref of %llu: short",
						   (unsigned long long)bytenr);
				goto out;
			}
			count = get_le32(p);
		}
		if ((s64)count + delta < 0) {
			ret = BLOG_CORRUPT(es->log, "extent %llu: keyed ref count below zero",
					   (unsigned long long)bytenr);
			goto out;
		}
		count = (u32)((s64)count + delta);
		if (count == 0) {
			ret = tree_del_items(t, es->extent_root, &path, 1);
		} else {
			if (r->type == BTRFS_EXTENT_DATA_REF_KEY)
				put_le32(&((struct btrfs_extent_data_ref *)p)->count, count);
			else if (r->type == BTRFS_SHARED_DATA_REF_KEY)
				put_le32(p, count);
			else
				ret = BLOG_CORRUPT(es->log, "extent %llu: tree ref count above one",
						   (unsigned long long)bytenr);
		}
		goto out;
	}
	if (probe == DATA_REF_PROBES)
		ret = 1;
out:
	tree_path_release(es->cache, &path);
	return ret;
}

/* Put reference @r (count @count) of @bytenr in a keyed item of its own. */
static int insert_keyed_ref(struct extent_state *es, struct tree_trans *t, u64 bytenr,
			    const struct ref_entry *r, u32 count)
{
	struct btrfs_extent_data_ref dr;
	struct btrfs_key key;
	le32 c;
	int probe, ret;

	keyed_ref_key(bytenr, r, &key);
	if (r->type == BTRFS_TREE_BLOCK_REF_KEY || r->type == BTRFS_SHARED_BLOCK_REF_KEY)
		return tree_insert_item(t, es->extent_root, &key, NULL, 0);
	if (r->type == BTRFS_SHARED_DATA_REF_KEY) {
		put_le32(&c, count);
		return tree_insert_item(t, es->extent_root, &key, &c, sizeof(c));
	}
	put_le64(&dr.root, r->root_or_parent);
	put_le64(&dr.objectid, r->owner);
	put_le64(&dr.offset, r->offset);
	put_le32(&dr.count, count);
	for (probe = 0; probe < DATA_REF_PROBES; probe++, key.offset++) {
		ret = tree_insert_item(t, es->extent_root, &key, &dr, sizeof(dr));
		if (ret != -EEXIST)
			return ret;
	}
	return BLOG_CORRUPT(es->log, "extent %llu: %d data refs collide on one hash",
			    (unsigned long long)bytenr, DATA_REF_PROBES);
}

/* Find the extent item of @bytenr: 0 and the decoded record, 1 if none. */
static int lookup_extent(struct extent_state *es, u64 bytenr, struct extent_rec *rec)
{
	struct btrfs_key key = { bytenr, BTRFS_EXTENT_ITEM_KEY, 0 };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(es->cache, es->extent_root, &key, &path);
	if (ret == 0) {
		const u8 *p;
		u32 size;

		path_key(&path, &key);
		if (key.objectid == bytenr &&
		    (key.type == BTRFS_EXTENT_ITEM_KEY || key.type == BTRFS_METADATA_ITEM_KEY)) {
			p = path_item(&path, &size);
			ret = parse_extent_item(es, &key, p, size, rec);
		} else {
			ret = 1;
		}
	}
	tree_path_release(es->cache, &path);
	return ret;
}

static int replace_extent_item(struct extent_state *es, struct tree_trans *t,
			       const struct extent_rec *rec, int exists)
{
	u8 *buf;
	u32 size;
	struct tree_path path;
	int ret;

	buf = malloc(sizeof(struct btrfs_extent_item) + sizeof(struct btrfs_tree_block_info) +
		     rec->ninl * (1 + sizeof(struct btrfs_extent_data_ref)));
	if (!buf)
		return -ENOMEM;
	size = build_extent_item(rec, buf);
	if (exists) {
		tree_path_init(&path);
		ret = tree_search_slot(t, es->extent_root, &rec->key, &path, 0, 1);
		if (ret == 0) {
			u32 old;

			path_item(&path, &old);
			if (old == size) {
				memcpy(path_item_mut(&path, &old), buf, size);
				tree_path_release(es->cache, &path);
				free(buf);
				return 0;
			}
			ret = tree_del_items(t, es->extent_root, &path, 1);
		} else if (ret == 1) {
			ret = BLOG_CORRUPT(es->log, "extent item %llu vanished",
					   (unsigned long long)rec->key.objectid);
		}
		tree_path_release(es->cache, &path);
		if (ret) {
			free(buf);
			return ret;
		}
	}
	ret = tree_insert_item(t, es->extent_root, &rec->key, buf, size);
	free(buf);
	return ret;
}

static int delete_extent_item(struct extent_state *es, struct tree_trans *t,
			      const struct btrfs_key *key)
{
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(t, es->extent_root, key, &path, 0, 1);
	if (ret == 0)
		ret = tree_del_items(t, es->extent_root, &path, 1);
	else if (ret == 1)
		ret = BLOG_CORRUPT(es->log, "extent item %llu vanished",
				   (unsigned long long)key->objectid);
	tree_path_release(es->cache, &path);
	return ret;
}

static int push_ref(struct extent_refs *out, const struct ref_entry *r)
{
	struct extent_ref *n = realloc(out->r, (out->n + 1) * sizeof(*n));

	if (!n)
		return -ENOMEM;
	out->r = n;
	n[out->n].type = r->type;
	n[out->n].root_or_parent = r->root_or_parent;
	n[out->n].owner = r->owner;
	n[out->n].offset = r->offset;
	n[out->n].count = r->count;
	out->n++;
	return 0;
}

/* Decode the keyed reference item at @key (@p, @size bytes) into @r; 1 if it is no reference. */
static int keyed_ref_decode(struct extent_state *es, const struct btrfs_key *key, const u8 *p,
			    u32 size, struct ref_entry *r)
{
	memset(r, 0, sizeof(*r));
	r->type = key->type;
	r->count = 1;
	switch (key->type) {
	case BTRFS_TREE_BLOCK_REF_KEY:
	case BTRFS_SHARED_BLOCK_REF_KEY:
		r->root_or_parent = key->offset;
		return 0;
	case BTRFS_SHARED_DATA_REF_KEY:
		if (size < 4)
			break;
		r->root_or_parent = key->offset;
		r->count = get_le32(p);
		return 0;
	case BTRFS_EXTENT_DATA_REF_KEY: {
		const struct btrfs_extent_data_ref *dr = (const void *)p;

		if (size < sizeof(*dr))
			break;
		r->root_or_parent = get_le64(&dr->root);
		r->owner = get_le64(&dr->objectid);
		r->offset = get_le64(&dr->offset);
		r->count = get_le32(&dr->count);
		return 0;
	}
	default:
		return 1;
	}
	return BLOG_CORRUPT(es->log, "extent %llu: short keyed reference (type %u)",
			    (unsigned long long)key->objectid, key->type);
}

int extent_get_refs(struct extent_state *es, u64 bytenr, struct extent_refs *out)
{
	struct btrfs_key key = { bytenr, BTRFS_EXTENT_ITEM_KEY, 0 };
	struct extent_rec rec;
	struct tree_path path;
	size_t i;
	int ret;

	memset(out, 0, sizeof(*out));
	memset(&rec, 0, sizeof(rec));
	tree_path_init(&path);
	ret = tree_search_forward(es->cache, es->extent_root, &key, &path);
	if (ret == 0) {
		path_key(&path, &key);
		if (key.objectid != bytenr ||
		    (key.type != BTRFS_EXTENT_ITEM_KEY && key.type != BTRFS_METADATA_ITEM_KEY)) {
			ret = 1;
		} else {
			u32 size;
			const u8 *p = path_item(&path, &size);

			ret = parse_extent_item(es, &key, p, size, &rec);
		}
	}
	if (ret)
		goto out;
	out->bytenr = bytenr;
	out->refs = rec.refs;
	out->generation = rec.generation;
	out->flags = rec.flags;
	out->is_data = !!(rec.flags & BTRFS_EXTENT_FLAG_DATA);
	if (key.type == BTRFS_METADATA_ITEM_KEY) {
		out->num_bytes = es->vol->nodesize;
		out->level = (int)key.offset;
	} else {
		out->num_bytes = key.offset;
		out->level = rec.level;
		out->first_key = rec.first_key;
	}
	for (i = 0; i < rec.ninl && ret == 0; i++)
		ret = push_ref(out, &rec.inl[i]);
	/* keyed references follow the extent item under the same objectid */
	while (ret == 0) {
		struct ref_entry r;
		const u8 *p;
		u32 size;

		ret = tree_next_item(es->cache, &path);
		if (ret)
			break;
		path_key(&path, &key);
		if (key.objectid != bytenr)
			break;
		p = path_item(&path, &size);
		ret = keyed_ref_decode(es, &key, p, size, &r);
		if (ret == 1) {
			ret = 0;
			continue;
		}
		if (ret == 0)
			ret = push_ref(out, &r);
	}
	if (ret == 1)
		ret = 0;
out:
	tree_path_release(es->cache, &path);
	free(rec.inl);
	if (ret)
		extent_refs_free(out);
	return ret;
}

int extent_list_range(struct extent_state *es, u64 start, u64 end, struct extent_span **out,
		      size_t *n)
{
	struct btrfs_key key = { start, 0, 0 };
	struct tree_path path;
	size_t cap = 0;
	int ret;

	*out = NULL;
	*n = 0;
	tree_path_init(&path);
	ret = tree_search_forward(es->cache, es->extent_root, &key, &path);
	while (ret == 0) {
		struct extent_span sp;

		path_key(&path, &key);
		if (key.objectid >= end)
			break;
		sp.bytenr = key.objectid;
		if (key.type == BTRFS_METADATA_ITEM_KEY) {
			sp.num_bytes = es->vol->nodesize;
			sp.level = (int)key.offset;
		} else if (key.type == BTRFS_EXTENT_ITEM_KEY) {
			u32 size;
			const struct btrfs_extent_item *ei = (const void *)path_item(&path, &size);
			const struct btrfs_tree_block_info *info = (const void *)(ei + 1);

			sp.num_bytes = key.offset;
			if (size >= sizeof(*ei) && (btrfs_extent_flags(ei) & BTRFS_EXTENT_FLAG_DATA))
				sp.level = -1;
			else if (size >= sizeof(*ei) + sizeof(*info))
				sp.level = info->level;
			else {
				ret = BLOG_CORRUPT(es->log, "extent item %llu: short",
						   (unsigned long long)key.objectid);
				break;
			}
		} else {
			ret = tree_next_item(es->cache, &path);
			continue;
		}
		if (*n == cap) {
			struct extent_span *grown = realloc(*out, (cap ? cap * 2 : 64) * sizeof(*grown));

			if (!grown) {
				ret = -ENOMEM;
				break;
			}
			*out = grown;
			cap = cap ? cap * 2 : 64;
		}
		(*out)[(*n)++] = sp;
		ret = tree_next_item(es->cache, &path);
	}
	tree_path_release(es->cache, &path);
	if (ret < 0) {
		free(*out);
		*out = NULL;
		*n = 0;
		return ret;
	}
	return 0;
}

void extent_refs_free(struct extent_refs *refs)
{
	free(refs->r);
	refs->r = NULL;
	refs->n = 0;
}

/* Apply the merged changes @refs[0..n) (all for one bytenr). */
static int run_one_extent(struct extent_state *es, struct tree_trans *t, struct delayed_ref *refs,
			  size_t n)
{
	struct extent_rec rec;
	struct ref_entry r;
	struct block_group *bg;
	u64 bytenr = refs[0].bytenr, num_bytes = refs[0].num_bytes;
	int is_data = refs[0].is_data, ret, exists, any_add = 0;
	u64 set_flags = 0;
	s64 net = 0;
	size_t i, j;

	memset(&rec, 0, sizeof(rec));
	ret = lookup_extent(es, bytenr, &rec);
	if (ret < 0)
		goto out;
	exists = ret == 0;
	for (i = 0; i < n; i++) {
		net += refs[i].delta;
		any_add |= refs[i].delta > 0;
		set_flags |= refs[i].set_flags;
	}
	if (!exists) {
		if (net < 0) {
			ret = BLOG_CORRUPT(es->log, "dropping a reference to %llu, which has no extent item",
					   (unsigned long long)bytenr);
			goto out;
		}
		if (net == 0) {
			/* allocated and freed within this transaction */
			ret = any_add ? extent_pin(es, bytenr, num_bytes) : 0;
			if (ret == 0 && any_add && is_data)
				ret = extent_delete_csums(es, t, bytenr, num_bytes);
			goto out;
		}
		if (is_data) {
			rec.key.objectid = bytenr;
			rec.key.type = BTRFS_EXTENT_ITEM_KEY;
			rec.key.offset = num_bytes;
			rec.flags = BTRFS_EXTENT_FLAG_DATA;
		} else if (es->skinny) {
			rec.key.objectid = bytenr;
			rec.key.type = BTRFS_METADATA_ITEM_KEY;
			rec.key.offset = refs[0].owner;
			rec.flags = BTRFS_EXTENT_FLAG_TREE_BLOCK;
		} else {
			rec.key.objectid = bytenr;
			rec.key.type = BTRFS_EXTENT_ITEM_KEY;
			rec.key.offset = num_bytes;
			rec.flags = BTRFS_EXTENT_FLAG_TREE_BLOCK;
			rec.first_key = refs[0].first_key;
			rec.level = (u8)refs[0].owner;
		}
		rec.generation = refs[0].generation ? refs[0].generation : es->transid;
	}
	/* merge changes per reference and apply them */
	for (i = 0; i < n; i++) {
		int delta = 0;

		if (refs[i].delta == 0)
			continue;
		ref_from_delayed(&refs[i], &r);
		for (j = i; j < n; j++) {
			struct ref_entry o;

			ref_from_delayed(&refs[j], &o);
			if (refs[j].delta && same_ref(&r, &o)) {
				delta += refs[j].delta;
				if (j != i)
					refs[j].delta = 0;
			}
		}
		if (delta == 0)
			continue;
		for (j = 0; j < rec.ninl; j++)
			if (same_ref(&rec.inl[j], &r))
				break;
		if (j < rec.ninl) {
			s64 c = (s64)rec.inl[j].count + delta;

			if (c < 0 || (!is_data && c > 1)) {
				ret = BLOG_CORRUPT(es->log, "extent %llu: reference count %lld",
						   (unsigned long long)bytenr, (long long)c);
				goto out;
			}
			if (c == 0) {
				memmove(&rec.inl[j], &rec.inl[j + 1], (rec.ninl - j - 1) * sizeof(r));
				rec.ninl--;
			} else {
				rec.inl[j].count = (u32)c;
			}
		} else if (delta < 0) {
			ret = apply_keyed_ref(es, t, bytenr, &r, delta);
			if (ret == 1)
				ret = BLOG_CORRUPT(es->log, "extent %llu: dropping a reference it lacks",
						   (unsigned long long)bytenr);
			if (ret)
				goto out;
		} else {
			ret = exists ? apply_keyed_ref(es, t, bytenr, &r, delta) : 1;
			if (ret < 0)
				goto out;
			if (ret == 1) {
				if (!is_data && delta != 1) {
					ret = BLOG_CORRUPT(es->log, "extent %llu: tree ref added twice",
							   (unsigned long long)bytenr);
					goto out;
				}
				r.count = (u32)delta;
				if (extent_item_size(&rec) + inline_ref_size(&r) <=
				    max_extent_item_size(es))
					ret = rec_push(&rec, &r);
				else
					ret = insert_keyed_ref(es, t, bytenr, &r, r.count);
				if (ret)
					goto out;
			}
		}
		if ((s64)rec.refs + delta < 0) {
			ret = BLOG_CORRUPT(es->log, "extent %llu: refs below zero",
					   (unsigned long long)bytenr);
			goto out;
		}
		rec.refs = (u64)((s64)rec.refs + delta);
	}
	if (set_flags && !exists && !any_add) {
		ret = BLOG_CORRUPT(es->log, "setting flags on %llu, which has no extent item",
				   (unsigned long long)bytenr);
		goto out;
	}
	rec.flags |= set_flags;
	if (rec.ninl > 1)
		qsort(rec.inl, rec.ninl, sizeof(rec.inl[0]), cmp_ref);
	bg = extent_find_bg(es, bytenr);
	if (rec.refs == 0) {
		if (exists) {
			ret = delete_extent_item(es, t, &rec.key);
			if (ret)
				goto out;
			if (bg) {
				bg->used -= bg->used >= num_bytes ? num_bytes : bg->used;
				bg->item_dirty = 1;
				bg->fst_dirty = 1;
			}
			if (is_data) {
				ret = extent_delete_csums(es, t, bytenr, num_bytes);
				if (ret)
					goto out;
			}
		}
		ret = extent_pin(es, bytenr, num_bytes);
		goto out;
	}
	ret = replace_extent_item(es, t, &rec, exists);
	if (ret == 0 && !exists && bg) {
		bg->used += num_bytes;
		bg->item_dirty = 1;
	}
out:
	free(rec.inl);
	return ret;
}

int extent_run_delayed_refs(struct extent_state *es, struct tree_trans *t)
{
	struct delayed_ref *refs;
	size_t n, i, j;
	int ret = 0;

	while (es->nrefs) {
		/* take the queue: running it may queue more (extent tree COW) */
		refs = es->refs;
		n = es->nrefs;
		es->refs = NULL;
		es->nrefs = es->refs_cap = 0;
		/* what was pending is about to be in the extent tree */
		if (es->npend)
			memset(es->pend, 0, es->pend_cap * sizeof(*es->pend));
		es->npend = 0;
		qsort(refs, n, sizeof(*refs), cmp_delayed);
		for (i = 0; i < n && ret == 0; i = j) {
			for (j = i + 1; j < n && refs[j].bytenr == refs[i].bytenr; j++)
				;
			ret = run_one_extent(es, t, refs + i, j - i);
		}
		free(refs);
		if (ret)
			return ret;
	}
	return 0;
}

int extent_commit_pending(const struct extent_state *es)
{
	size_t i;

	if (es->nrefs)
		return 1;
	for (i = 0; i < es->nbgs; i++)
		if (es->bgs[i]->item_dirty || (es->fst_root && es->bgs[i]->fst_dirty))
			return 1;
	return 0;
}

int extent_lookup_info(struct extent_state *es, u64 bytenr, u64 *refs, u64 *flags)
{
	const struct pending_meta *p = pend_find(es, bytenr);
	struct extent_rec rec;
	s64 total;
	int ret;

	memset(&rec, 0, sizeof(rec));
	ret = lookup_extent(es, bytenr, &rec);
	free(rec.inl);
	if (ret < 0)
		return ret;
	total = ret == 0 ? (s64)rec.refs : 0;
	*flags = ret == 0 ? rec.flags : 0;
	if (p) {
		total += p->delta;
		*flags |= p->set_flags;
	}
	if (total <= 0)
		return BLOG_CORRUPT(es->log, "tree block %llu: no extent item or no references",
				    (unsigned long long)bytenr);
	*refs = (u64)total;
	return 0;
}
