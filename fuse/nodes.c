/*
 * nodes.c — the identity of files through the mount: which 64-bit number
 * names each btrfs file, as FUSE node id and as st_ino.
 *
 * btrfs numbers inodes per subvolume (every subvolume's root directory is
 * 256), and the kernel shows each subvolume with its own st_dev. A FUSE mount
 * has one st_dev, so if we passed btrfs inode numbers through, tar, du, cp -a
 * and find would take a file and its copy in a snapshot for hard links. We
 * report st_ino = node id, and node ids are unique per (subvolume, inode):
 *
 *   rule 1  the mounted subvolume's root directory     -> 1 (FUSE_ROOT_ID)
 *   rule 2  subvolume S, inode I, with 256 <= I < 2^44 and S = 5 or
 *           256 <= S < 256 + 2^19 - 1                   -> slot(S) << 44 | I
 *           where slot(5) = 0 and slot(S) = S - 255 for S >= 256
 *   rule 3  anything else: inode numbers or subvolume ids beyond those
 *           ranges, and every placeholder directory     -> 2^63 | n, n = 1, 2,
 *           3... in the order the mount first meets them
 *
 * So in the top-level subvolume st_ino is the btrfs inode number itself, and
 * subvolume 256's inode 257 is 2^44 + 257. Placeholders are the empty
 * directories btrfs shows where a snapshot lacks a subvolume (btrfs inode 2);
 * the library names them all (snapshot, 2), so rule 3 keys them by
 * (snapshot, 2, parent directory, name) and gives each its own number: the
 * kernel must never see one directory under two names.
 *
 * Invariants:
 *  1. The mapping is injective: rule 2 ids are below 2^63 and never 0 or 1
 *     (I >= 256), rule 3 ids have bit 63 set, and rule 1 takes the one pair
 *     whose rule 2 id would otherwise be used (it is never handed out).
 *  2. An id is stable for the life of the mount: rule 2 is a pure function
 *     (the node struct only holds the lookup count and is freed when the
 *     kernel forgets it; the next lookup computes the same id), and rule 3
 *     nodes are pinned (never freed until unmount), so a file keeps its number
 *     however often the kernel evicts and looks it up again. The cost is one
 *     node per rule 3 file met, which real filesystems almost never have.
 *  3. Every node the kernel may name (nlookup > 0) is in by_id; rule 3 nodes
 *     are also in by_key. Rule 2 ids are decoded arithmetically, so reads
 *     never take the lock to resolve an id.
 *
 * Locking: one mutex (t->lock) protects both indexes and every node's fields.
 * Callers may be inside a library section (butter_lock()) when they call in;
 * nothing here calls out.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "nodes.h"

#define FS_TREE_ID 5u             /* the top-level subvolume */
#define FIRST_FREE_ID 256u        /* first subvolume id, and first inode number */
#define PLACEHOLDER_INO 2u        /* btrfs's BTRFS_EMPTY_SUBVOL_DIR_OBJECTID */
#define INO_BITS 44
#define SLOT_LIMIT (1ull << 19)
#define OVERFLOW_BIT (1ull << 63)
#define ROOT_NODEID 1u
#define INITIAL_BUCKETS 1024u

struct node {
	uint64_t nodeid;
	butter_ino_t id;
	uint64_t nlookup;          /* kernel lookups not yet forgotten */
	bool pinned;               /* rules 1 and 3: never freed */
	bool held;                 /* nodes_hold(): one open reference until freed */
	bool seen_open;            /* open_mtime/open_size are set */
	struct timespec open_mtime;
	uint64_t open_size;
	butter_ino_t parent;       /* placeholders only: where the name is */
	char *name;                /* placeholders only */
	size_t namelen;
	struct node *id_next;      /* chain in by_id */
	struct node *key_next;     /* chain in by_key (rule 3 only) */
};

static uint64_t mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

static bool same_ino(butter_ino_t a, butter_ino_t b)
{
	return a.subvol == b.subvol && a.ino == b.ino;
}

/* Rule 2: the packed id of @id, or false if @id is outside its ranges. */
static bool pack(butter_ino_t id, uint64_t *nodeid)
{
	uint64_t slot;

	if (id.ino < FIRST_FREE_ID || id.ino >> INO_BITS)
		return false;
	if (id.subvol == FS_TREE_ID)
		slot = 0;
	else if (id.subvol >= FIRST_FREE_ID && id.subvol - (FIRST_FREE_ID - 1) < SLOT_LIMIT)
		slot = id.subvol - (FIRST_FREE_ID - 1);
	else
		return false;
	*nodeid = slot << INO_BITS | id.ino;
	return true;
}

static bool unpack(uint64_t nodeid, butter_ino_t *id)
{
	uint64_t slot = nodeid >> INO_BITS;

	if (nodeid & OVERFLOW_BIT)
		return false;
	id->ino = nodeid & ((1ull << INO_BITS) - 1);
	id->subvol = slot ? slot + (FIRST_FREE_ID - 1) : FS_TREE_ID;
	return id->ino >= FIRST_FREE_ID;
}

static size_t id_bucket(const struct node_table *t, uint64_t nodeid)
{
	return (size_t)(mix(nodeid) & (t->id_buckets - 1));
}

static uint64_t key_hash(butter_ino_t id, butter_ino_t parent, const char *name, size_t namelen)
{
	uint64_t h = mix(id.subvol) ^ mix(id.ino * 0x9e3779b97f4a7c15ull);

	if (id.ino == PLACEHOLDER_INO) {
		uint64_t f = 0xcbf29ce484222325ull;

		for (size_t i = 0; i < namelen; i++)
			f = (f ^ (unsigned char)name[i]) * 0x100000001b3ull;
		h ^= mix(parent.ino + 31 * parent.subvol) ^ mix(f);
	}
	return h;
}

static size_t key_bucket(const struct node_table *t, uint64_t hash)
{
	return (size_t)(hash & (t->key_buckets - 1));
}

static struct node *find_id(const struct node_table *t, uint64_t nodeid)
{
	struct node *n = t->by_id[id_bucket(t, nodeid)];

	while (n && n->nodeid != nodeid)
		n = n->id_next;
	return n;
}

static bool key_matches(const struct node *n, butter_ino_t id, butter_ino_t parent,
			const char *name, size_t namelen)
{
	if (!same_ino(n->id, id))
		return false;
	if (id.ino != PLACEHOLDER_INO)
		return true;
	return same_ino(n->parent, parent) && n->namelen == namelen &&
	       memcmp(n->name, name, namelen) == 0;
}

static struct node *find_key(const struct node_table *t, butter_ino_t id, butter_ino_t parent,
			     const char *name, size_t namelen)
{
	struct node *n = t->by_key[key_bucket(t, key_hash(id, parent, name, namelen))];

	while (n && !key_matches(n, id, parent, name, namelen))
		n = n->key_next;
	return n;
}

/* Double by_id when it averages two nodes a bucket; a failed grow is harmless. */
static void grow_ids(struct node_table *t)
{
	size_t nb = t->id_buckets * 2;
	struct node **b;

	if (t->count <= t->id_buckets * 2)
		return;
	b = calloc(nb, sizeof(*b));
	if (!b)
		return;
	for (size_t i = 0; i < t->id_buckets; i++) {
		struct node *n = t->by_id[i], *next;

		for (; n; n = next) {
			size_t j = (size_t)(mix(n->nodeid) & (nb - 1));

			next = n->id_next;
			n->id_next = b[j];
			b[j] = n;
		}
	}
	free(t->by_id);
	t->by_id = b;
	t->id_buckets = nb;
}

static void grow_keys(struct node_table *t)
{
	size_t nb = t->key_buckets * 2;
	struct node **b;

	if (t->key_count <= t->key_buckets * 2)
		return;
	b = calloc(nb, sizeof(*b));
	if (!b)
		return;
	for (size_t i = 0; i < t->key_buckets; i++) {
		struct node *n = t->by_key[i], *next;

		for (; n; n = next) {
			size_t j = (size_t)(key_hash(n->id, n->parent, n->name, n->namelen) & (nb - 1));

			next = n->key_next;
			n->key_next = b[j];
			b[j] = n;
		}
	}
	free(t->by_key);
	t->by_key = b;
	t->key_buckets = nb;
}

static void insert_id(struct node_table *t, struct node *n)
{
	size_t i = id_bucket(t, n->nodeid);

	n->id_next = t->by_id[i];
	t->by_id[i] = n;
	t->count++;
	grow_ids(t);
}

static void free_node(struct node *n)
{
	free(n->name);
	free(n);
}

int nodes_init(struct node_table *t, butter_ino_t root)
{
	struct node *r;

	memset(t, 0, sizeof(*t));
	t->root = root;
	t->id_buckets = INITIAL_BUCKETS;
	t->key_buckets = INITIAL_BUCKETS;
	t->by_id = calloc(t->id_buckets, sizeof(*t->by_id));
	t->by_key = calloc(t->key_buckets, sizeof(*t->by_key));
	r = calloc(1, sizeof(*r));
	if (!t->by_id || !t->by_key || !r) {
		free(t->by_id);
		free(t->by_key);
		free(r);
		return -ENOMEM;
	}
	r->nodeid = ROOT_NODEID;
	r->id = root;
	r->pinned = true;
	insert_id(t, r);
	pthread_mutex_init(&t->lock, NULL);
	return 0;
}

void nodes_destroy(struct node_table *t)
{
	if (!t->by_id)
		return;
	for (size_t i = 0; i < t->id_buckets; i++) {
		struct node *n = t->by_id[i], *next;

		for (; n; n = next) {
			next = n->id_next;
			free_node(n);
		}
	}
	free(t->by_id);
	free(t->by_key);
	t->by_id = t->by_key = NULL;
	pthread_mutex_destroy(&t->lock);
}

/* Rule 3: find or make the pinned node of @id. Called with t->lock held. */
static struct node *overflow_node(struct node_table *t, butter_ino_t id, butter_ino_t parent,
				  const char *name, size_t namelen)
{
	struct node *n = find_key(t, id, parent, name, namelen);
	size_t i;

	if (n)
		return n;
	n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	if (id.ino == PLACEHOLDER_INO) {
		n->name = malloc(namelen ? namelen : 1);
		if (!n->name) {
			free(n);
			return NULL;
		}
		memcpy(n->name, name, namelen);
		n->namelen = namelen;
		n->parent = parent;
	}
	n->id = id;
	n->pinned = true;
	n->nodeid = OVERFLOW_BIT | ++t->next_overflow;
	insert_id(t, n);
	i = key_bucket(t, key_hash(id, parent, name, namelen));
	n->key_next = t->by_key[i];
	t->by_key[i] = n;
	t->key_count++;
	grow_keys(t);
	return n;
}

int nodes_get(struct node_table *t, butter_ino_t id, butter_ino_t parent, const char *name,
	      size_t namelen, bool ref, uint64_t *nodeid)
{
	struct node *n;
	uint64_t packed = 0;
	bool rule2 = id.ino != PLACEHOLDER_INO && pack(id, &packed);

	if (same_ino(id, t->root))
		rule2 = false;
	if (rule2 && !ref) {
		*nodeid = packed;
		return 0;
	}
	pthread_mutex_lock(&t->lock);
	if (same_ino(id, t->root)) {
		n = find_id(t, ROOT_NODEID);
	} else if (rule2) {
		n = find_id(t, packed);
		if (!n) {
			n = calloc(1, sizeof(*n));
			if (n) {
				n->nodeid = packed;
				n->id = id;
				insert_id(t, n);
			}
		}
	} else {
		n = overflow_node(t, id, parent, name, namelen);
	}
	if (n && ref)
		n->nlookup++;
	if (n)
		*nodeid = n->nodeid;
	pthread_mutex_unlock(&t->lock);
	return n ? 0 : -ENOMEM;
}

int nodes_resolve(struct node_table *t, uint64_t nodeid, butter_ino_t *out)
{
	struct node *n;

	if (nodeid == ROOT_NODEID) {
		*out = t->root;
		return 0;
	}
	if (!(nodeid & OVERFLOW_BIT))
		return unpack(nodeid, out) ? 0 : -ESTALE;
	pthread_mutex_lock(&t->lock);
	n = find_id(t, nodeid);
	if (n)
		*out = n->id;
	pthread_mutex_unlock(&t->lock);
	return n ? 0 : -ESTALE;
}

int nodes_ref(struct node_table *t, uint64_t nodeid, butter_ino_t *out)
{
	struct node *n;
	butter_ino_t id;
	int ret = nodes_resolve(t, nodeid, &id);

	if (ret)
		return ret;
	pthread_mutex_lock(&t->lock);
	n = find_id(t, nodeid);
	if (!n) {
		/* a rule 2 id whose node the kernel forgot: decoded above */
		n = calloc(1, sizeof(*n));
		if (n) {
			n->nodeid = nodeid;
			n->id = id;
			insert_id(t, n);
		}
	}
	if (n)
		n->nlookup++;
	pthread_mutex_unlock(&t->lock);
	*out = id;
	return n ? 0 : -ENOMEM;
}

bool nodes_holdable(struct node_table *t, butter_ino_t id, uint64_t *nodeid)
{
	struct node *n;
	uint64_t packed = 0;
	bool found;

	/* only rule 2 nodes can be held: rules 1 and 3 are pinned */
	if (id.ino == PLACEHOLDER_INO || same_ino(id, t->root) || !pack(id, &packed))
		return false;
	pthread_mutex_lock(&t->lock);
	n = find_id(t, packed);
	found = n && n->nlookup > 0 && !n->pinned && !n->held;
	pthread_mutex_unlock(&t->lock);
	*nodeid = packed;
	return found;
}

bool nodes_hold(struct node_table *t, uint64_t nodeid)
{
	struct node *n;
	bool marked = false;

	pthread_mutex_lock(&t->lock);
	n = find_id(t, nodeid);
	if (n && n->nlookup > 0 && !n->pinned && !n->held)
		marked = n->held = true;
	pthread_mutex_unlock(&t->lock);
	return marked;
}

bool nodes_forget(struct node_table *t, uint64_t nodeid, uint64_t nlookup)
{
	struct node **p, *n;
	bool held = false;

	pthread_mutex_lock(&t->lock);
	p = &t->by_id[id_bucket(t, nodeid)];
	while (*p && (*p)->nodeid != nodeid)
		p = &(*p)->id_next;
	n = *p;
	if (n) {
		n->nlookup -= nlookup < n->nlookup ? nlookup : n->nlookup;
		if (n->nlookup == 0 && !n->pinned) {
			held = n->held;
			*p = n->id_next;
			t->count--;
			free_node(n);
		}
	}
	pthread_mutex_unlock(&t->lock);
	return held;
}

bool nodes_open_unchanged(struct node_table *t, uint64_t nodeid, const struct timespec *mtime,
			  uint64_t size)
{
	struct node *n;
	bool same = false;

	pthread_mutex_lock(&t->lock);
	n = find_id(t, nodeid);
	if (n) {
		same = n->seen_open && n->open_size == size &&
		       n->open_mtime.tv_sec == mtime->tv_sec && n->open_mtime.tv_nsec == mtime->tv_nsec;
		n->seen_open = true;
		n->open_mtime = *mtime;
		n->open_size = size;
	}
	pthread_mutex_unlock(&t->lock);
	return same;
}
