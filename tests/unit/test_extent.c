/*
 * test_extent.c — the extent layer (lib/extent/): reference counting in the
 * extent tree, the allocator, pinning, and the free space tree, driven
 * directly through extent.h and transaction.h.
 *
 * Fixture: butter_mkfs makes a 128 MiB single-device image once (a temporary
 * file read into memory, then removed). Every test opens it afresh with
 * butter_open_memory_cow(RDONLY) — so the fs layer sets up no write side of
 * its own — and builds the write side itself from the handle's fields
 * (struct butter_fs in fs/fs.h: volumes, node cache, tree roots): an
 * extent_state loaded from the trees, and a txn_ctx tracking the extent,
 * dev, csum and free space trees. Writes land in the memory device's private
 * pages; the image itself is never changed.
 *
 * What is checked is read back from the trees with a parser written here
 * from the on-disk format (not with delayed_ref.c's):
 *  - references: a data extent and a tree block collect references over
 *    several commits until they no longer fit inline; the extent item's refs
 *    equal the sum of inline and keyed reference counts, every reference is
 *    present exactly once with its count, inline references are sorted as
 *    the format orders them and fill the item up to the kernel's limit (a
 *    sixteenth of a leaf) before any keyed item appears, keyed data refs sit
 *    at their hash; dropping references removes exactly them, and the last
 *    one removes the extent item, its keyed items and its bytes from the
 *    block group's used;
 *  - the allocator: allocations are aligned, inside a group of their type,
 *    never overlap each other, committed extents or super stripes, and use
 *    up exactly the free bytes before -ENOSPC;
 *  - pinning: space freed in a transaction (also allocated and freed in the
 *    same one) is not handed out before the commit, and is after it;
 *  - the free space tree: after each commit, per block group, its info item
 *    counts its entries, the free ranges (extents or bitmaps) lie inside the
 *    group, do not meet any extent item, and free + used + super stripes is
 *    the whole group; it equals the allocator's view, and a fresh load of the
 *    trees gives the same free space.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "butter/butter.h"
#include "check.h"
#include "extent/extent.h"
#include "format/checksum.h"
#include "fs/fs.h"
#include "trans/transaction.h"

#define MIB (1024ULL * 1024)
#define IMAGE_SIZE (128 * MIB)
#define SECTOR 4096ULL
#define FAKE_PARENT (1ULL << 40) /* bytenrs of parents that exist only as references */

static u8 *image;
static size_t image_size;

/* ---- log capture -------------------------------------------------------- */

static int log_errors;

static void log_fn(void *arg, int level, const char *msg)
{
	(void)arg;
	if (level <= BUTTER_LOG_ERROR) {
		log_errors++;
		fprintf(stderr, "butter: %s\n", msg);
	}
}

/* ---- the image ----------------------------------------------------------- */

static int make_image(void)
{
	const char *tmp = getenv("TMPDIR");
	char path[4096];
	const char *devs[1];
	struct butter_mkfs_opts o;
	ssize_t got;
	size_t done = 0;
	int fd, ret;

	snprintf(path, sizeof(path), "%s/butter-test-extent-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	fd = mkstemp(path);
	if (fd < 0)
		return -errno;
	close(fd);
	memset(&o, 0, sizeof(o));
	devs[0] = path;
	o.devices = devs;
	o.ndevices = 1;
	o.size = IMAGE_SIZE;
	o.csum_type = -1;
	o.force = 1;
	o.log = log_fn;
	ret = butter_mkfs(&o);
	if (ret == 0) {
		image = malloc(IMAGE_SIZE);
		fd = open(path, O_RDONLY);
		ret = image && fd >= 0 ? 0 : -EIO;
		while (ret == 0 && done < IMAGE_SIZE) {
			got = read(fd, image + done, IMAGE_SIZE - done);
			if (got <= 0)
				ret = -EIO;
			else
				done += (size_t)got;
		}
		if (fd >= 0)
			close(fd);
		image_size = done;
	}
	unlink(path);
	return ret;
}

/* ---- the fixture: a write side built by hand ------------------------------ */

struct fx {
	struct butter_fs *fs;
	struct extent_state es;
	struct txn_ctx txn;
	struct tree_root dev_tree, fst;
};

static int fx_open(struct fx *f)
{
	struct butter_open_opts o;
	struct btrfs_root_item item;
	struct tree_node *chunk_root;
	struct butter_fs *fs;
	int ret;

	memset(f, 0, sizeof(*f));
	memset(&o, 0, sizeof(o));
	o.flags = BUTTER_OPEN_RDONLY;
	o.log = log_fn;
	ret = butter_open_memory_cow(image, image_size, &o, &f->fs);
	if (ret)
		return ret;
	fs = f->fs;
	extent_state_init(&f->es, &fs->vol, &fs->cache);
	ret = node_read(&fs->cache, fs->chunk_tree.bytenr, fs->chunk_tree.generation,
			fs->chunk_tree.level, NULL, &chunk_root);
	if (ret)
		return ret;
	memcpy(fs->vol.chunk_tree_uuid, node_header(chunk_root)->chunk_tree_uuid, BTRFS_UUID_SIZE);
	node_put(&fs->cache, chunk_root);
	if (fs_read_root_item(fs, BTRFS_EXTENT_TREE_OBJECTID, &item, NULL) == 0)
		fs->extent_tree.bytes_used = btrfs_root_bytes_used(&item);
	if (fs_read_root_item(fs, BTRFS_CSUM_TREE_OBJECTID, &item, NULL) == 0)
		fs->csum_tree.bytes_used = btrfs_root_bytes_used(&item);
	ret = fs_load_root(fs, BTRFS_DEV_TREE_OBJECTID, &f->dev_tree);
	if (ret == 0)
		ret = fs_load_root(fs, BTRFS_FREE_SPACE_TREE_OBJECTID, &f->fst);
	if (ret)
		return ret;
	f->es.extent_root = &fs->extent_tree;
	f->es.bg_root = &fs->extent_tree;
	f->es.csum_root = &fs->csum_tree;
	f->es.chunk_root = &fs->chunk_tree;
	f->es.dev_root = &f->dev_tree;
	f->es.fst_root = &f->fst;
	ret = chunk_init_devspace(&f->es, 1);
	if (ret == 0)
		ret = extent_load(&f->es);
	if (ret)
		return ret;
	f->txn.vol = &fs->vol;
	f->txn.cache = &fs->cache;
	f->txn.es = &f->es;
	f->txn.log = &fs->log;
	f->txn.root_tree = &fs->root_tree;
	f->txn.chunk_tree = &fs->chunk_tree;
	ret = txn_track_root(&f->txn, &fs->extent_tree);
	if (ret == 0)
		ret = txn_track_root(&f->txn, &f->dev_tree);
	if (ret == 0)
		ret = txn_track_root(&f->txn, &fs->csum_tree);
	if (ret == 0)
		ret = txn_track_root(&f->txn, &f->fst);
	return ret;
}

static void fx_close(struct fx *f)
{
	txn_ctx_destroy(&f->txn);
	extent_state_destroy(&f->es);
	butter_close(f->fs);
}

static struct block_group *first_bg(struct fx *f, u64 type)
{
	for (size_t i = 0; i < f->es.nbgs; i++)
		if (f->es.bgs[i]->flags & type)
			return f->es.bgs[i];
	return NULL;
}

static int queue_data_ref(struct fx *f, u64 bytenr, u64 len, u64 root, u64 ino, u64 offset,
			  u64 parent, int delta)
{
	struct delayed_ref r;

	memset(&r, 0, sizeof(r));
	r.bytenr = bytenr;
	r.num_bytes = len;
	r.root = parent ? 0 : root;
	r.parent = parent;
	r.owner = ino;
	r.offset = offset;
	r.is_data = 1;
	r.delta = delta;
	r.generation = f->es.transid;
	return extent_queue_ref(&f->es, &r);
}

static int queue_tree_ref(struct fx *f, u64 bytenr, u64 root, u64 parent, int delta,
			  u64 set_flags)
{
	struct delayed_ref r;

	memset(&r, 0, sizeof(r));
	r.bytenr = bytenr;
	r.num_bytes = f->fs->vol.nodesize;
	r.root = parent ? 0 : root;
	r.parent = parent;
	r.owner = 0; /* level */
	r.delta = delta;
	r.set_flags = set_flags;
	r.generation = f->es.transid;
	return extent_queue_ref(&f->es, &r);
}

/* ---- reading an extent back (own parser of the on-disk format) ------------ */

#define MAX_REFS 512

struct ref {
	u8 type;
	u64 root_or_parent, owner, offset;
	u32 count;
	int keyed;
	u64 key_offset; /* keyed only */
};

struct ext_view {
	int found, malformed;
	struct btrfs_key key;
	u64 refs, generation, flags;
	u32 item_size;
	size_t n, ninline;
	struct ref r[MAX_REFS];
};

/* The kernel's hash of an EXTENT_DATA_REF (crc32c of root; of owner, offset). */
static u64 data_ref_hash(u64 root, u64 owner, u64 offset)
{
	u8 b[8];
	u32 high, low;

	put_le64(b, root);
	high = btrfs_crc32c_raw(~0u, b, 8);
	put_le64(b, owner);
	low = btrfs_crc32c_raw(~0u, b, 8);
	put_le64(b, offset);
	low = btrfs_crc32c_raw(low, b, 8);
	return ((u64)high << 31) ^ (u64)low;
}

static u32 max_inline_item(const struct fx *f)
{
	return (f->fs->vol.nodesize - (u32)sizeof(struct btrfs_header)) / 16 -
	       (u32)sizeof(struct btrfs_item);
}

static void view_push(struct ext_view *v, const struct ref *r)
{
	if (v->n < MAX_REFS)
		v->r[v->n++] = *r;
	else
		v->malformed = 1;
}

static void parse_inline(struct ext_view *v, const u8 *p, u32 size)
{
	u32 pos = (u32)sizeof(struct btrfs_extent_item);

	if (size < pos) {
		v->malformed = 1;
		return;
	}
	v->refs = get_le64(p);
	v->generation = get_le64(p + 8);
	v->flags = get_le64(p + 16);
	if ((v->flags & BTRFS_EXTENT_FLAG_TREE_BLOCK) && v->key.type == BTRFS_EXTENT_ITEM_KEY)
		pos += (u32)sizeof(struct btrfs_tree_block_info);
	while (pos < size) {
		struct ref r;

		memset(&r, 0, sizeof(r));
		r.type = p[pos];
		if (r.type == BTRFS_TREE_BLOCK_REF_KEY || r.type == BTRFS_SHARED_BLOCK_REF_KEY) {
			if (size - pos < 9)
				break;
			r.root_or_parent = get_le64(p + pos + 1);
			r.count = 1;
			pos += 9;
		} else if (r.type == BTRFS_EXTENT_DATA_REF_KEY) {
			if (size - pos < 29)
				break;
			r.root_or_parent = get_le64(p + pos + 1);
			r.owner = get_le64(p + pos + 9);
			r.offset = get_le64(p + pos + 17);
			r.count = get_le32(p + pos + 25);
			pos += 29;
		} else if (r.type == BTRFS_SHARED_DATA_REF_KEY) {
			if (size - pos < 13)
				break;
			r.root_or_parent = get_le64(p + pos + 1);
			r.count = get_le32(p + pos + 9);
			pos += 13;
		} else {
			break;
		}
		view_push(v, &r);
		v->ninline++;
	}
	if (pos != size)
		v->malformed = 1;
}

/* Everything the extent tree holds under objectid @bytenr. */
static int view_extent(struct fx *f, u64 bytenr, struct ext_view *v)
{
	struct btrfs_key key = { bytenr, 0, 0 };
	struct tree_path path;
	int ret;

	memset(v, 0, sizeof(*v));
	tree_path_init(&path);
	ret = tree_search_forward(&f->fs->cache, &f->fs->extent_tree, &key, &path);
	while (ret == 0) {
		const u8 *p;
		u32 size;
		struct ref r;

		path_key(&path, &key);
		if (key.objectid != bytenr)
			break;
		p = path_item(&path, &size);
		memset(&r, 0, sizeof(r));
		r.keyed = 1;
		r.type = key.type;
		r.key_offset = key.offset;
		if (key.type == BTRFS_EXTENT_ITEM_KEY || key.type == BTRFS_METADATA_ITEM_KEY) {
			if (v->found)
				v->malformed = 1;
			v->found = 1;
			v->key = key;
			v->item_size = size;
			parse_inline(v, p, size);
		} else if (key.type == BTRFS_TREE_BLOCK_REF_KEY ||
			   key.type == BTRFS_SHARED_BLOCK_REF_KEY) {
			r.root_or_parent = key.offset;
			r.count = 1;
			if (size != 0)
				v->malformed = 1;
			view_push(v, &r);
		} else if (key.type == BTRFS_EXTENT_DATA_REF_KEY) {
			if (size != sizeof(struct btrfs_extent_data_ref)) {
				v->malformed = 1;
			} else {
				r.root_or_parent = get_le64(p);
				r.owner = get_le64(p + 8);
				r.offset = get_le64(p + 16);
				r.count = get_le32(p + 24);
				view_push(v, &r);
			}
		} else if (key.type == BTRFS_SHARED_DATA_REF_KEY) {
			r.root_or_parent = key.offset;
			if (size != 4)
				v->malformed = 1;
			else
				r.count = get_le32(p);
			view_push(v, &r);
		}
		ret = tree_next_item(&f->fs->cache, &path);
	}
	tree_path_release(&f->fs->cache, &path);
	return ret < 0 ? ret : 0;
}

static const struct ref *view_find(const struct ext_view *v, u8 type, u64 root_or_parent,
				   u64 owner, u64 offset, int *times)
{
	const struct ref *hit = NULL;

	*times = 0;
	for (size_t i = 0; i < v->n; i++) {
		const struct ref *r = &v->r[i];

		if (r->type != type || r->root_or_parent != root_or_parent)
			continue;
		if (type == BTRFS_EXTENT_DATA_REF_KEY && (r->owner != owner || r->offset != offset))
			continue;
		hit = r;
		(*times)++;
	}
	return hit;
}

static u64 sort_value(const struct ref *r)
{
	return r->type == BTRFS_EXTENT_DATA_REF_KEY
		       ? data_ref_hash(r->root_or_parent, r->owner, r->offset)
		       : r->root_or_parent;
}

/*
 * Properties every extent must have: refs = sum of counts; inline refs
 * ordered by type ascending, then by their sort value descending; the
 * item within the inline limit; keyed data refs at their hash. While
 * references were only added (@new_ref_size: the inline size of the kind
 * added, else 0), the item is full before any keyed reference exists.
 */
static void check_view_shape(struct fx *f, const struct ext_view *v, u32 new_ref_size)
{
	u64 sum = 0;
	size_t keyed = 0;

	CHECK(v->found);
	CHECK(!v->malformed);
	for (size_t i = 0; i < v->n; i++) {
		sum += v->r[i].count;
		if (v->r[i].keyed) {
			keyed++;
			if (v->r[i].type == BTRFS_EXTENT_DATA_REF_KEY)
				CHECK_EQ_U64(v->r[i].key_offset, sort_value(&v->r[i]));
		} else {
			CHECK(v->r[i].count > 0);
		}
	}
	CHECK_EQ_U64(v->refs, sum);
	for (size_t i = 1; i < v->ninline; i++) {
		const struct ref *a = &v->r[i - 1], *b = &v->r[i];

		CHECK(a->type < b->type || (a->type == b->type && sort_value(a) > sort_value(b)));
	}
	CHECK(v->item_size <= max_inline_item(f));
	if (keyed && new_ref_size)
		CHECK(v->item_size + new_ref_size > max_inline_item(f));
}

/* The block group item of the group at @start, read from the tree: used bytes. */
static u64 bg_item_used(struct fx *f, u64 start)
{
	struct btrfs_key key = { start, BTRFS_BLOCK_GROUP_ITEM_KEY, 0 };
	struct tree_path path;
	u64 used = UINT64_MAX;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(&f->fs->cache, f->es.bg_root, &key, &path);
	if (ret == 0) {
		const u8 *p;
		u32 size;

		path_key(&path, &key);
		p = path_item(&path, &size);
		if (key.objectid == start && key.type == BTRFS_BLOCK_GROUP_ITEM_KEY && size >= 24)
			used = get_le64(p);
	}
	tree_path_release(&f->fs->cache, &path);
	return used;
}

/* ---- references ------------------------------------------------------------ */

#define NDATA_ROUNDS 5
#define DATA_REFS_PER_ROUND 12
#define DATA_LEN (64 * 1024ULL)

struct want_data_ref {
	u64 ino;
	u32 count;
};

static void check_data_refs(struct fx *f, u64 bytenr, const struct want_data_ref *w, size_t n,
			    int growing)
{
	struct ext_view *v = calloc(1, sizeof(*v));
	u64 total = 0;
	int times;

	if (!v) {
		CHECK(v);
		return;
	}
	CHECK(view_extent(f, bytenr, v) == 0);
	check_view_shape(f, v, growing ? 29 : 0);
	CHECK_EQ_U64(v->key.type, BTRFS_EXTENT_ITEM_KEY);
	CHECK_EQ_U64(v->key.offset, DATA_LEN);
	CHECK(v->flags & BTRFS_EXTENT_FLAG_DATA);
	for (size_t i = 0; i < n; i++) {
		const struct ref *r;

		if (!w[i].count)
			continue;
		total += w[i].count;
		r = view_find(v, BTRFS_EXTENT_DATA_REF_KEY, BTRFS_FS_TREE_OBJECTID, w[i].ino, 0,
			      &times);
		CHECK_EQ_U64(times, 1);
		if (r)
			CHECK_EQ_U64(r->count, w[i].count);
	}
	CHECK_EQ_U64(v->refs, total);
	free(v);
}

static void test_data_refs(void)
{
	struct want_data_ref want[1 + NDATA_ROUNDS * DATA_REFS_PER_ROUND];
	size_t nwant = 0, keyed_seen = 0;
	struct block_group *bg;
	struct ext_view *v;
	struct fx f;
	u64 x, used0;
	int times;

	log_errors = 0;
	if (fx_open(&f) != 0) {
		CHECK(!"fixture");
		return;
	}
	v = calloc(1, sizeof(*v));
	bg = first_bg(&f, BTRFS_BLOCK_GROUP_DATA);
	CHECK(v && bg);
	if (!v || !bg)
		goto out;
	used0 = bg_item_used(&f, bg->start);
	CHECK(used0 != UINT64_MAX);

	/* rounds of new references: the extent item fills, then keyed items follow */
	CHECK(txn_begin(&f.txn) == 0);
	CHECK(extent_alloc(&f.es, BTRFS_BLOCK_GROUP_DATA, DATA_LEN, &x) == 0);
	for (int round = 0; round < NDATA_ROUNDS; round++) {
		u64 gen;

		CHECK(txn_begin(&f.txn) == 0);
		gen = f.es.transid;
		if (round == 0) {
			/* one reference held twice: count 2 */
			CHECK(queue_data_ref(&f, x, DATA_LEN, 5, 256, 0, 0, 1) == 0);
			CHECK(queue_data_ref(&f, x, DATA_LEN, 5, 256, 0, 0, 1) == 0);
			want[nwant].ino = 256;
			want[nwant++].count = 2;
		}
		for (int i = 0; i < DATA_REFS_PER_ROUND; i++) {
			want[nwant].ino = 1000 + nwant;
			want[nwant].count = 1;
			CHECK(queue_data_ref(&f, x, DATA_LEN, 5, want[nwant].ino, 0, 0, 1) == 0);
			nwant++;
		}
		CHECK(txn_commit(&f.txn) == 0);
		check_data_refs(&f, x, want, nwant, 1);
		CHECK(view_extent(&f, x, v) == 0);
		if (round == 0)
			CHECK_EQ_U64(v->generation, gen);
		keyed_seen = v->n - v->ninline;
		CHECK_EQ_U64(bg_item_used(&f, bg->start), used0 + DATA_LEN);
	}
	/* 61 references of 29 bytes cannot all sit in a 992-byte item */
	CHECK(keyed_seen > 0);
	CHECK(v->ninline > 1);

	/* drop: one of the double reference, three inline ones and three keyed ones */
	CHECK(txn_begin(&f.txn) == 0);
	CHECK(queue_data_ref(&f, x, DATA_LEN, 5, 256, 0, 0, -1) == 0);
	want[0].count = 1;
	{
		size_t inl = 0, key = 0;

		for (size_t i = 0; i < v->n; i++) {
			const struct ref *r = &v->r[i];
			size_t k;

			if (r->owner == 256 || (r->keyed ? key : inl) >= 3)
				continue;
			for (k = 0; k < nwant && want[k].ino != r->owner; k++)
				;
			if (k == nwant)
				continue;
			CHECK(queue_data_ref(&f, x, DATA_LEN, 5, r->owner, 0, 0, -1) == 0);
			want[k].count = 0;
			if (r->keyed)
				key++;
			else
				inl++;
		}
		CHECK_EQ_U64(inl, 3);
		CHECK_EQ_U64(key, 3);
	}
	CHECK(txn_commit(&f.txn) == 0);
	check_data_refs(&f, x, want, nwant, 0);
	CHECK(view_extent(&f, x, v) == 0);
	for (size_t k = 0; k < nwant; k++)
		if (!want[k].count)
			CHECK(!view_find(v, BTRFS_EXTENT_DATA_REF_KEY, 5, want[k].ino, 0, &times));

	/* drop the rest: the extent item, its keyed items and its bytes go */
	CHECK(txn_begin(&f.txn) == 0);
	for (size_t k = 0; k < nwant; k++)
		if (want[k].count)
			CHECK(queue_data_ref(&f, x, DATA_LEN, 5, want[k].ino, 0, 0,
					     -(int)want[k].count) == 0);
	CHECK(txn_commit(&f.txn) == 0);
	CHECK(view_extent(&f, x, v) == 0);
	CHECK(!v->found);
	CHECK_EQ_U64(v->n, 0);
	CHECK_EQ_U64(bg_item_used(&f, bg->start), used0);
	CHECK(range_contains(&bg->free, x, x + DATA_LEN));
	CHECK_EQ_U64(log_errors, 0);
out:
	free(v);
	fx_close(&f);
}

#define NTREE_REFS 130
#define NSHARED_REFS 3

static void test_tree_block_refs(void)
{
	struct block_group *bg;
	struct ext_view *v;
	struct fx f;
	u64 b, refs, flags, gen, used0;
	int times;

	log_errors = 0;
	if (fx_open(&f) != 0) {
		CHECK(!"fixture");
		return;
	}
	v = calloc(1, sizeof(*v));
	bg = first_bg(&f, BTRFS_BLOCK_GROUP_METADATA);
	CHECK(v && bg);
	if (!v || !bg)
		goto out;
	CHECK(txn_begin(&f.txn) == 0);
	gen = f.es.transid;
	CHECK(extent_alloc(&f.es, BTRFS_BLOCK_GROUP_METADATA, f.fs->vol.nodesize, &b) == 0);
	CHECK(extent_find_bg(&f.es, b) == bg);
	for (u64 i = 0; i < NTREE_REFS; i++)
		CHECK(queue_tree_ref(&f, b, 256 + i, 0, 1, 0) == 0);
	for (u64 i = 0; i < NSHARED_REFS; i++)
		CHECK(queue_tree_ref(&f, b, 0, FAKE_PARENT + i * f.fs->vol.nodesize, 1, 0) == 0);
	/* what is queued already counts for a lookup */
	CHECK(extent_lookup_info(&f.es, b, &refs, &flags) == 0);
	CHECK_EQ_U64(refs, NTREE_REFS + NSHARED_REFS);
	used0 = bg_item_used(&f, bg->start);
	CHECK(txn_commit(&f.txn) == 0);

	CHECK(view_extent(&f, b, v) == 0);
	check_view_shape(&f, v, 9);
	CHECK_EQ_U64(v->key.type, BTRFS_METADATA_ITEM_KEY); /* skinny: offset is the level */
	CHECK_EQ_U64(v->key.offset, 0);
	CHECK(v->flags & BTRFS_EXTENT_FLAG_TREE_BLOCK);
	CHECK(!(v->flags & BTRFS_BLOCK_FLAG_FULL_BACKREF));
	CHECK_EQ_U64(v->generation, gen);
	CHECK_EQ_U64(v->refs, NTREE_REFS + NSHARED_REFS);
	CHECK(v->n > v->ninline); /* 133 refs of 9 bytes do not fit in 992 bytes */
	for (u64 i = 0; i < NTREE_REFS; i++) {
		view_find(v, BTRFS_TREE_BLOCK_REF_KEY, 256 + i, 0, 0, &times);
		CHECK_EQ_U64(times, 1);
	}
	for (u64 i = 0; i < NSHARED_REFS; i++) {
		view_find(v, BTRFS_SHARED_BLOCK_REF_KEY, FAKE_PARENT + i * f.fs->vol.nodesize, 0,
			  0, &times);
		CHECK_EQ_U64(times, 1);
	}
	CHECK_EQ_U64(bg_item_used(&f, bg->start), used0 + f.fs->vol.nodesize);

	/* flags only (delta 0), and dropping every other reference */
	CHECK(txn_begin(&f.txn) == 0);
	CHECK(queue_tree_ref(&f, b, 256, 0, 0, BTRFS_BLOCK_FLAG_FULL_BACKREF) == 0);
	for (u64 i = 0; i < NTREE_REFS; i += 2)
		CHECK(queue_tree_ref(&f, b, 256 + i, 0, -1, 0) == 0);
	CHECK(queue_tree_ref(&f, b, 0, FAKE_PARENT, -1, 0) == 0);
	CHECK(extent_lookup_info(&f.es, b, &refs, &flags) == 0);
	CHECK_EQ_U64(refs, NTREE_REFS / 2 + NSHARED_REFS - 1);
	CHECK(flags & BTRFS_BLOCK_FLAG_FULL_BACKREF);
	CHECK(txn_commit(&f.txn) == 0);
	CHECK(view_extent(&f, b, v) == 0);
	check_view_shape(&f, v, 0);
	CHECK(v->flags & BTRFS_BLOCK_FLAG_FULL_BACKREF);
	CHECK_EQ_U64(v->refs, NTREE_REFS / 2 + NSHARED_REFS - 1);
	for (u64 i = 0; i < NTREE_REFS; i++) {
		view_find(v, BTRFS_TREE_BLOCK_REF_KEY, 256 + i, 0, 0, &times);
		CHECK_EQ_U64(times, i % 2 ? 1 : 0);
	}
	view_find(v, BTRFS_SHARED_BLOCK_REF_KEY, FAKE_PARENT, 0, 0, &times);
	CHECK_EQ_U64(times, 0);

	/* the rest: the block is unreferenced and freed */
	CHECK(txn_begin(&f.txn) == 0);
	for (u64 i = 1; i < NTREE_REFS; i += 2)
		CHECK(queue_tree_ref(&f, b, 256 + i, 0, -1, 0) == 0);
	for (u64 i = 1; i < NSHARED_REFS; i++)
		CHECK(queue_tree_ref(&f, b, 0, FAKE_PARENT + i * f.fs->vol.nodesize, -1, 0) == 0);
	CHECK(txn_commit(&f.txn) == 0);
	CHECK(view_extent(&f, b, v) == 0);
	CHECK(!v->found);
	CHECK_EQ_U64(v->n, 0);
	CHECK_EQ_U64(bg_item_used(&f, bg->start), used0);
	CHECK(range_contains(&bg->free, b, b + f.fs->vol.nodesize));
	CHECK_EQ_U64(log_errors, 0);
out:
	free(v);
	fx_close(&f);
}

/* ---- what is taken: committed extents and super stripes -------------------- */

struct extents {
	struct range *r;
	size_t n, cap;
};

static void extents_add(struct extents *e, u64 start, u64 end)
{
	if (e->n == e->cap) {
		size_t cap = e->cap ? e->cap * 2 : 256;
		struct range *r = realloc(e->r, cap * sizeof(*r));

		if (!r)
			abort();
		e->r = r;
		e->cap = cap;
	}
	e->r[e->n].start = start;
	e->r[e->n++].end = end;
}

static int cmp_range(const void *pa, const void *pb)
{
	const struct range *a = pa, *b = pb;

	return a->start < b->start ? -1 : a->start > b->start;
}

/* Every EXTENT_ITEM / METADATA_ITEM of the extent tree, sorted. */
static void committed_extents(struct fx *f, struct extents *e)
{
	struct btrfs_key key = { 0, 0, 0 };
	struct tree_path path;
	int ret;

	memset(e, 0, sizeof(*e));
	tree_path_init(&path);
	ret = tree_search_forward(&f->fs->cache, &f->fs->extent_tree, &key, &path);
	while (ret == 0) {
		path_key(&path, &key);
		if (key.type == BTRFS_EXTENT_ITEM_KEY)
			extents_add(e, key.objectid, key.objectid + key.offset);
		else if (key.type == BTRFS_METADATA_ITEM_KEY)
			extents_add(e, key.objectid, key.objectid + f->fs->vol.nodesize);
		ret = tree_next_item(&f->fs->cache, &path);
	}
	tree_path_release(&f->fs->cache, &path);
	CHECK(ret == 1);
	if (e->n)
		qsort(e->r, e->n, sizeof(*e->r), cmp_range);
}

/*
 * Super stripes of the group at @start: for a profile whose every stripe
 * holds the whole chunk (single, dup, raid1*: the fixture's), the 64 KiB
 * stripe unit around each superblock copy that falls inside a stripe.
 */
static void super_stripes(struct fx *f, u64 start, struct extents *e)
{
	const struct chunk_map *map = volumes_find_chunk(&f->fs->vol, start);

	memset(e, 0, sizeof(*e));
	CHECK(map != NULL);
	if (!map)
		return;
	CHECK(!(map->type & (BTRFS_BLOCK_GROUP_RAID0 | BTRFS_BLOCK_GROUP_RAID10 |
			     BTRFS_BLOCK_GROUP_RAID56_MASK)));
	for (int m = 0; m < BTRFS_SUPER_MIRROR_MAX; m++) {
		u64 phys = m == 0 ? 64 * 1024ULL : (16 * 1024ULL) << (12 * m);

		for (u32 i = 0; i < map->num_stripes; i++) {
			u64 off;

			if (phys < map->stripes[i].physical ||
			    phys - map->stripes[i].physical >= map->length)
				continue;
			off = (phys - map->stripes[i].physical) & ~(BTRFS_STRIPE_LEN - 1);
			extents_add(e, map->logical + off,
				    map->logical + off + BTRFS_STRIPE_LEN > map->logical + map->length
					    ? map->logical + map->length
					    : map->logical + off + BTRFS_STRIPE_LEN);
		}
	}
	if (e->n)
		qsort(e->r, e->n, sizeof(*e->r), cmp_range);
}

static int cmp_range_u64(const void *pa, const void *pb)
{
	u64 a = *(const u64 *)pa, b = *(const u64 *)pb;

	return a < b ? -1 : a > b;
}

static int meets(const struct extents *e, u64 start, u64 end)
{
	for (size_t i = 0; i < e->n; i++)
		if (e->r[i].start < end && start < e->r[i].end)
			return 1;
	return 0;
}

static u64 extents_bytes_in(const struct extents *e, u64 start, u64 end)
{
	u64 sum = 0;

	for (size_t i = 0; i < e->n; i++) {
		u64 s = e->r[i].start > start ? e->r[i].start : start;
		u64 t = e->r[i].end < end ? e->r[i].end : end;

		if (s < t)
			sum += t - s;
	}
	return sum;
}

/* ---- the allocator ----------------------------------------------------------- */

static u64 lcg(u64 *state)
{
	*state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
	return *state >> 33;
}

/*
 * Allocate @type until -ENOSPC (random sizes, then single units); check
 * alignment, placement and overlap; return the allocations in @out.
 */
static void alloc_until_full(struct fx *f, u64 type, u64 unit, struct extents *out, u64 seed)
{
	struct extents committed;
	u64 logical, free_before = 0, total = 0;
	int ret = 0;

	memset(out, 0, sizeof(*out));
	committed_extents(f, &committed);
	for (size_t i = 0; i < f->es.nbgs; i++)
		if (f->es.bgs[i]->flags & type)
			free_before += f->es.bgs[i]->free.total;
	/* more than was free would be handed out twice: stop there */
	for (int misses = 0; misses < 4 && total <= free_before;) {
		u64 len = unit * (1 + lcg(&seed) % 32);

		ret = extent_alloc(&f->es, type, len, &logical);
		if (ret == -ENOSPC) {
			misses++;
			continue;
		}
		CHECK(ret == 0);
		if (ret)
			break;
		extents_add(out, logical, logical + len);
		total += len;
	}
	while (total <= free_before && (ret = extent_alloc(&f->es, type, unit, &logical)) == 0) {
		extents_add(out, logical, logical + unit);
		total += unit;
	}
	CHECK(total <= free_before);
	CHECK_EQ_U64(ret, -ENOSPC);
	CHECK(out->n > 0);

	if (out->n)
		qsort(out->r, out->n, sizeof(*out->r), cmp_range);
	{
		u64 sum = 0;

		for (size_t i = 0; i < out->n; i++) {
			const struct range *r = &out->r[i];
			struct block_group *bg = extent_find_bg(&f->es, r->start);
			struct extents ss;

			sum += r->end - r->start;
			CHECK_EQ_U64(r->start % unit, 0);
			CHECK(bg && (bg->flags & type));
			if (!bg)
				continue;
			CHECK(r->end <= bg->start + bg->length);
			if (i > 0)
				CHECK(out->r[i - 1].end <= r->start);
			CHECK(!meets(&committed, r->start, r->end));
			super_stripes(f, bg->start, &ss);
			CHECK(!meets(&ss, r->start, r->end));
			free(ss.r);
		}
		/* everything that was free went out, and nothing more */
		CHECK_EQ_U64(sum, free_before);
	}
	/* and the groups of that type are now full by their committed usage */
	for (size_t i = 0; i < f->es.nbgs; i++) {
		struct block_group *bg = f->es.bgs[i];
		struct extents ss;

		if (!(bg->flags & type))
			continue;
		super_stripes(f, bg->start, &ss);
		CHECK_EQ_U64(bg->free.total, 0);
		CHECK_EQ_U64(extents_bytes_in(out, bg->start, bg->start + bg->length) +
				     bg_item_used(f, bg->start) +
				     extents_bytes_in(&ss, bg->start, bg->start + bg->length),
			     bg->length);
		free(ss.r);
	}
	free(committed.r);
}

static void test_alloc_full(void)
{
	struct extents data, meta;
	struct fx f;

	log_errors = 0;
	if (fx_open(&f) != 0) {
		CHECK(!"fixture");
		return;
	}
	CHECK(txn_begin(&f.txn) == 0);
	alloc_until_full(&f, BTRFS_BLOCK_GROUP_DATA, f.fs->vol.sectorsize, &data, 1);
	/* another type is not affected by a full one */
	alloc_until_full(&f, BTRFS_BLOCK_GROUP_METADATA, f.fs->vol.nodesize, &meta, 2);
	for (size_t i = 0; i < meta.n; i++)
		CHECK(!meets(&data, meta.r[i].start, meta.r[i].end));
	free(data.r);
	free(meta.r);
	CHECK_EQ_U64(log_errors, 0);
	fx_close(&f); /* never committed */
}

/* ---- pinning: freed space waits for the commit -------------------------------- */

#define NPIN 8
#define DATA_GROUP_MAX (64 * 1024 * 1024) /* more than the fixture's data group */

static void test_pinned_until_commit(void)
{
	u64 x[NPIN], y, old_extent_root;
	struct block_group *bg, *mbg;
	struct extents after;
	struct fx f;

	log_errors = 0;
	if (fx_open(&f) != 0) {
		CHECK(!"fixture");
		return;
	}
	bg = first_bg(&f, BTRFS_BLOCK_GROUP_DATA);
	CHECK(bg != NULL);
	if (!bg)
		goto out;
	CHECK(txn_begin(&f.txn) == 0);
	for (int i = 0; i < NPIN; i++) {
		CHECK(extent_alloc(&f.es, BTRFS_BLOCK_GROUP_DATA, DATA_LEN, &x[i]) == 0);
		CHECK(queue_data_ref(&f, x[i], DATA_LEN, 5, 300 + (u64)i, 0, 0, 1) == 0);
	}
	CHECK(txn_commit(&f.txn) == 0);

	/* free three extents, and one allocated and freed in this transaction */
	CHECK(txn_begin(&f.txn) == 0);
	old_extent_root = f.fs->extent_tree.bytenr;
	for (int i = 0; i < NPIN; i += 3)
		CHECK(queue_data_ref(&f, x[i], DATA_LEN, 5, 300 + (u64)i, 0, 0, -1) == 0);
	CHECK(extent_alloc(&f.es, BTRFS_BLOCK_GROUP_DATA, DATA_LEN, &y) == 0);
	CHECK(queue_data_ref(&f, y, DATA_LEN, 5, 400, 0, 0, 1) == 0);
	CHECK(queue_data_ref(&f, y, DATA_LEN, 5, 400, 0, 0, -1) == 0);
	/* run the queue now, as the commit's first step would: the frees happen */
	CHECK(extent_run_delayed_refs(&f.es, &f.txn.tt) == 0);
	/* the extent tree was copied: its old root block is freed too */
	CHECK(f.fs->extent_tree.bytenr != old_extent_root);
	mbg = extent_find_bg(&f.es, old_extent_root);
	CHECK(mbg != NULL);
	if (mbg)
		CHECK(!range_contains(&mbg->free, old_extent_root,
				      old_extent_root + f.fs->vol.nodesize));
	CHECK(range_contains(&f.es.pinned, old_extent_root, old_extent_root + f.fs->vol.nodesize));
	for (int i = 0; i < NPIN; i += 3)
		CHECK(range_contains(&f.es.pinned, x[i], x[i] + DATA_LEN));
	CHECK(range_contains(&f.es.pinned, y, y + DATA_LEN));
	/* all data space goes out, and none of it is what was freed */
	{
		struct extents got;
		u64 logical;

		memset(&got, 0, sizeof(got));
		for (int i = 0; i < DATA_GROUP_MAX / (int)SECTOR &&
				extent_alloc(&f.es, BTRFS_BLOCK_GROUP_DATA, SECTOR, &logical) == 0;
		     i++)
			extents_add(&got, logical, logical + SECTOR);
		CHECK(extent_alloc(&f.es, BTRFS_BLOCK_GROUP_DATA, SECTOR, &logical) == -ENOSPC);
		for (int i = 0; i < NPIN; i += 3)
			CHECK(!meets(&got, x[i], x[i] + DATA_LEN));
		CHECK(!meets(&got, y, y + DATA_LEN));
		free(got.r);
	}
	CHECK(txn_commit(&f.txn) == 0);

	/* after the commit exactly the freed space comes back, and nothing else */
	CHECK_EQ_U64(f.es.pinned.total, 0);
	if (mbg)
		CHECK(range_contains(&mbg->free, old_extent_root,
				     old_extent_root + f.fs->vol.nodesize));
	memset(&after, 0, sizeof(after));
	CHECK(txn_begin(&f.txn) == 0);
	{
		u64 logical;

		for (int i = 0; i < 2 * NPIN &&
				extent_alloc(&f.es, BTRFS_BLOCK_GROUP_DATA, DATA_LEN, &logical) == 0;
		     i++)
			extents_add(&after, logical, logical + DATA_LEN);
	}
	if (after.n)
		qsort(after.r, after.n, sizeof(*after.r), cmp_range);
	{
		u64 want[NPIN + 1];
		size_t n = 0;

		for (int i = 0; i < NPIN; i += 3)
			want[n++] = x[i];
		want[n++] = y;
		qsort(want, n, sizeof(want[0]), cmp_range_u64);
		CHECK_EQ_U64(after.n, n);
		for (size_t i = 0; i < n && i < after.n; i++)
			CHECK_EQ_U64(after.r[i].start, want[i]);
	}
	free(after.r);
	CHECK_EQ_U64(log_errors, 0);
out:
	fx_close(&f);
}

/* ---- the free space tree ------------------------------------------------------ */

/* Free ranges of the group [start, start+len) as the free space tree lists them. */
static void fst_group(struct fx *f, u64 start, u64 len, struct extents *free_r, size_t *nitems)
{
	struct btrfs_key key = { start, 0, 0 };
	struct tree_path path;
	u32 ss = f->fs->vol.sectorsize;
	int ret, have_info = 0, bitmaps = 0;
	u32 extent_count = 0, nextent = 0, nbitmap = 0;

	memset(free_r, 0, sizeof(*free_r));
	*nitems = 0;
	tree_path_init(&path);
	ret = tree_search_forward(&f->fs->cache, &f->fst, &key, &path);
	while (ret == 0) {
		const u8 *p;
		u32 size;

		path_key(&path, &key);
		if (key.objectid >= start + len)
			break;
		p = path_item(&path, &size);
		(*nitems)++;
		if (key.type == BTRFS_FREE_SPACE_INFO_KEY) {
			CHECK(!have_info);
			CHECK_EQ_U64(key.objectid, start);
			CHECK_EQ_U64(key.offset, len);
			CHECK_EQ_U64(size, sizeof(struct btrfs_free_space_info));
			have_info = 1;
			if (size >= 8) {
				extent_count = get_le32(p);
				bitmaps = !!(get_le32(p + 4) & BTRFS_FREE_SPACE_USING_BITMAPS);
			}
		} else if (key.type == BTRFS_FREE_SPACE_EXTENT_KEY) {
			CHECK(key.offset > 0);
			CHECK(key.objectid + key.offset <= start + len);
			CHECK_EQ_U64(size, 0);
			if (free_r->n)
				/* sorted, disjoint, and merged: never two touching */
				CHECK(free_r->r[free_r->n - 1].end < key.objectid);
			extents_add(free_r, key.objectid, key.objectid + key.offset);
			nextent++;
		} else if (key.type == BTRFS_FREE_SPACE_BITMAP_KEY) {
			CHECK(key.objectid + key.offset <= start + len);
			CHECK((u64)size * 8 * ss >= key.offset);
			for (u64 bit = 0; bit * ss < key.offset && bit / 8 < size; bit++) {
				u64 s = key.objectid + bit * ss;

				if (!(p[bit / 8] & (1u << (bit % 8))))
					continue;
				if (free_r->n && free_r->r[free_r->n - 1].end == s)
					free_r->r[free_r->n - 1].end = s + ss;
				else
					extents_add(free_r, s, s + ss);
			}
			nbitmap++;
		} else {
			CHECK(!"unknown free space tree item");
		}
		ret = tree_next_item(&f->fs->cache, &path);
	}
	tree_path_release(&f->fs->cache, &path);
	CHECK(ret >= 0);
	CHECK(have_info);
	if (bitmaps) {
		CHECK_EQ_U64(nextent, 0);
		CHECK_EQ_U64(extent_count, free_r->n);
	} else {
		CHECK_EQ_U64(nbitmap, 0);
		CHECK_EQ_U64(extent_count, nextent);
	}
}

static size_t fst_count_items(struct fx *f)
{
	struct btrfs_key key = { 0, 0, 0 };
	struct tree_path path;
	size_t n = 0;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(&f->fs->cache, &f->fst, &key, &path);
	while (ret == 0) {
		n++;
		ret = tree_next_item(&f->fs->cache, &path);
	}
	tree_path_release(&f->fs->cache, &path);
	CHECK(ret == 1);
	return n;
}

static int same_ranges(const struct extents *a, const struct range_set *b)
{
	if (a->n != b->n)
		return 0;
	for (size_t i = 0; i < a->n; i++)
		if (a->r[i].start != b->r[i].start || a->r[i].end != b->r[i].end)
			return 0;
	return 1;
}

/* After a commit: the free space tree against the extent tree and the allocator. */
static void check_free_space_tree(struct fx *f)
{
	struct extents committed;
	struct extent_state fresh;
	size_t items = 0;

	CHECK(!f->txn.running);
	CHECK_EQ_U64(f->es.pinned.total, 0);
	committed_extents(f, &committed);
	for (size_t i = 0; i < f->es.nbgs; i++) {
		struct block_group *bg = f->es.bgs[i];
		u64 end = bg->start + bg->length, used = bg_item_used(f, bg->start);
		struct extents free_r, ss;
		size_t n;

		fst_group(f, bg->start, bg->length, &free_r, &n);
		items += n;
		super_stripes(f, bg->start, &ss);
		CHECK_EQ_U64(used, bg->used);
		/* the group's used bytes are its extent items */
		CHECK_EQ_U64(extents_bytes_in(&committed, bg->start, end), used);
		/* free meets no extent and no super stripe, and with them makes the group */
		for (size_t k = 0; k < free_r.n; k++) {
			CHECK(!meets(&committed, free_r.r[k].start, free_r.r[k].end));
			CHECK(!meets(&ss, free_r.r[k].start, free_r.r[k].end));
		}
		CHECK_EQ_U64(extents_bytes_in(&free_r, bg->start, end) + used +
				     extents_bytes_in(&ss, bg->start, end),
			     bg->length);
		/* the allocator sees the same free space */
		CHECK(same_ranges(&free_r, &bg->free));
		free(free_r.r);
		free(ss.r);
	}
	/* no entry outside every group */
	CHECK_EQ_U64(fst_count_items(f), items);
	free(committed.r);

	/* what a fresh open would load is what the allocator has */
	extent_state_init(&fresh, &f->fs->vol, &f->fs->cache);
	fresh.extent_root = f->es.extent_root;
	fresh.bg_root = f->es.bg_root;
	fresh.fst_root = f->es.fst_root;
	CHECK(extent_load(&fresh) == 0);
	CHECK_EQ_U64(fresh.nbgs, f->es.nbgs);
	for (size_t i = 0; i < fresh.nbgs && i < f->es.nbgs; i++) {
		const struct range_set *a = &fresh.bgs[i]->free, *b = &f->es.bgs[i]->free;
		int same = a->n == b->n;

		for (size_t k = 0; same && k < a->n; k++)
			same = a->r[k].start == b->r[k].start && a->r[k].end == b->r[k].end;
		CHECK(same);
		CHECK_EQ_U64(fresh.bgs[i]->used, f->es.bgs[i]->used);
	}
	extent_state_destroy(&fresh);
}

#define FST_ROUNDS 4
#define FST_PER_ROUND 40

static void test_free_space_tree(void)
{
	struct live {
		u64 bytenr, len, ino;
	} live[FST_ROUNDS * FST_PER_ROUND];
	size_t nlive = 0;
	u64 seed = 7, ino = 500;
	struct fx f;

	log_errors = 0;
	if (fx_open(&f) != 0) {
		CHECK(!"fixture");
		return;
	}
	check_free_space_tree(&f); /* as mkfs left it */
	for (int round = 0; round < FST_ROUNDS; round++) {
		size_t keep = 0;

		CHECK(txn_begin(&f.txn) == 0);
		/* drop every other live extent: holes in the middle of the group */
		for (size_t i = 0; i < nlive; i++) {
			if (i % 2 == 0) {
				CHECK(queue_data_ref(&f, live[i].bytenr, live[i].len, 5, live[i].ino,
						     0, 0, -1) == 0);
			} else {
				live[keep++] = live[i];
			}
		}
		nlive = keep;
		for (int i = 0; i < FST_PER_ROUND; i++) {
			u64 len = SECTOR * (1 + lcg(&seed) % 24), x;

			CHECK(extent_alloc(&f.es, BTRFS_BLOCK_GROUP_DATA, len, &x) == 0);
			CHECK(queue_data_ref(&f, x, len, 5, ino, 0, 0, 1) == 0);
			live[nlive].bytenr = x;
			live[nlive].len = len;
			live[nlive++].ino = ino++;
		}
		CHECK(txn_commit(&f.txn) == 0);
		check_free_space_tree(&f);
		if (round > 0) {
			struct block_group *bg = first_bg(&f, BTRFS_BLOCK_GROUP_DATA);

			CHECK(bg && bg->free.n > FST_PER_ROUND / 4); /* fragmented */
		}
	}
	/* everything goes: the data group is one free extent again */
	CHECK(txn_begin(&f.txn) == 0);
	for (size_t i = 0; i < nlive; i++)
		CHECK(queue_data_ref(&f, live[i].bytenr, live[i].len, 5, live[i].ino, 0, 0, -1) == 0);
	CHECK(txn_commit(&f.txn) == 0);
	check_free_space_tree(&f);
	{
		struct block_group *bg = first_bg(&f, BTRFS_BLOCK_GROUP_DATA);

		CHECK(bg && bg->used == 0 && bg->free.n == 1);
	}
	CHECK_EQ_U64(log_errors, 0);
	fx_close(&f);
}

int main(void)
{
	int ret = make_image();

	if (ret) {
		fprintf(stderr, "cannot make the test image: %s\n", strerror(-ret));
		return 1;
	}
	RUN(test_data_refs);
	RUN(test_tree_block_refs);
	RUN(test_alloc_full);
	RUN(test_pinned_until_commit);
	RUN(test_free_space_tree);
	free(image);
	return check_summary();
}
