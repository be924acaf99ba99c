/*
 * orphan.c — files that outlive their last name: the open counts a front end
 * reports, ORPHAN_ITEMs, and freeing orphans at the last release, at close
 * and at the next read-write open.
 *
 * POSIX keeps an unlinked file alive while it is open. The library does not
 * see file descriptors, so a front end counts each open with
 * butter_open_ref() and each close with butter_release(). When the last name
 * of an inode goes (unlink, rmdir, rename over it) while it has opens, the
 * inode is kept with nlink 0 and an orphan item records it, exactly as the
 * kernel does:
 *
 *   ORPHAN_ITEM  (BTRFS_ORPHAN_OBJECTID = -5, ORPHAN_ITEM_KEY = 48, ino)
 *                in the subvolume's own tree, no payload
 *
 * States of an inode (per subvolume id and inode number):
 *
 *   named --last name removed, not open--> freed (ns_delete_inode at once)
 *   named --last name removed, open-----> orphan: nlink 0 + ORPHAN_ITEM,
 *                                          data and attributes still usable
 *   orphan --last butter_release()------> freed: every item of the inode,
 *                                          its data references, the orphan item
 *   orphan --butter_close()-------------> freed (nobody can reach it any more)
 *   orphan --crash (committed)----------> on disk: nlink 0 + ORPHAN_ITEM; the
 *                                          next read-write open frees it
 *   (none) --butter_create_tmpfile()----> orphan, open once, linkable
 *   linkable orphan --butter_link()-----> named: nlink 1, orphan item deleted
 *                                          (the kernel's O_TMPFILE + linkat)
 *
 * Cleanup at open (ns_orphan_cleanup), as the kernel's btrfs_orphan_cleanup:
 * for every orphan item of every writable subvolume (the top level and every
 * live, not read-only subvolume), an inode with nlink 0 is freed with its
 * orphan item; an orphan item whose inode is gone or still has names (old
 * kernels wrote them for truncates) is just deleted (also in trees that share
 * blocks with snapshots).
 *
 * Invariants:
 *  1. A table entry exists exactly while its inode has opens (opens > 0) or
 *     is an orphan still to free; `orphan` is set only with an orphan item
 *     in the running transaction or on disk.
 *  2. The table mutex is never held while taking the write lock (w->lock);
 *     unlink takes the table lock inside w->lock, release drops it first.
 *  3. A read-only handle keeps no table: opens are not counted and nothing
 *     can lose its last name.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "namespace/namespace.h"

#define FIRST_BUCKETS 64u

struct open_inode {
	u64 subvol, ino;
	u64 opens;                 /* butter_open_ref() minus butter_release() */
	int orphan;                /* its last name went while open: free at opens == 0 */
	int linkable;              /* made nameless (O_TMPFILE): a link may name it again */
	struct open_inode *next;   /* bucket chain */
};

struct fs_open_files {
	pthread_mutex_t lock;
	struct open_inode **buckets; /* protected by lock */
	size_t nbuckets;             /* a power of two */
	size_t count;                /* protected by lock */
};

static size_t bucket_hash(u64 subvol, u64 ino)
{
	u64 h = (ino * 0x9e3779b97f4a7c15ull) ^ (subvol * 0xbf58476d1ce4e5b9ull);

	return (size_t)(h ^ (h >> 29));
}

static size_t bucket_of(const struct fs_open_files *t, u64 subvol, u64 ino)
{
	return bucket_hash(subvol, ino) & (t->nbuckets - 1);
}

/* The entry of (@subvol, @ino) and the link pointing at it; NULL if none. Table locked. */
static struct open_inode **find_link(struct fs_open_files *t, u64 subvol, u64 ino)
{
	struct open_inode **p = &t->buckets[bucket_of(t, subvol, ino)];

	while (*p && ((*p)->subvol != subvol || (*p)->ino != ino))
		p = &(*p)->next;
	return p;
}

/* Double the buckets when they average two entries; a failed grow is harmless. */
static void grow(struct fs_open_files *t)
{
	size_t nb = t->nbuckets * 2;
	struct open_inode **b;

	if (t->count <= t->nbuckets * 2)
		return;
	b = calloc(nb, sizeof(*b));
	if (!b)
		return;
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct open_inode *e = t->buckets[i], *next;

		for (; e; e = next) {
			size_t j = bucket_hash(e->subvol, e->ino) & (nb - 1);

			next = e->next;
			e->next = b[j];
			b[j] = e;
		}
	}
	free(t->buckets);
	t->buckets = b;
	t->nbuckets = nb;
}

int ns_open_files_init(struct fs_write_state *w)
{
	struct fs_open_files *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	t->nbuckets = FIRST_BUCKETS;
	t->buckets = calloc(t->nbuckets, sizeof(*t->buckets));
	if (!t->buckets) {
		free(t);
		return -ENOMEM;
	}
	pthread_mutex_init(&t->lock, NULL);
	w->open_files = t;
	return 0;
}

void ns_open_files_destroy(struct fs_write_state *w)
{
	struct fs_open_files *t = w->open_files;

	if (!t)
		return;
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct open_inode *e = t->buckets[i], *next;

		for (; e; e = next) {
			next = e->next;
			free(e);
		}
	}
	free(t->buckets);
	pthread_mutex_destroy(&t->lock);
	free(t);
	w->open_files = NULL;
}

int ns_open_ref(struct butter_fs *fs, butter_ino_t ino)
{
	struct fs_open_files *t = fs->w ? fs->w->open_files : NULL;
	struct open_inode **p;
	int ret = 0;

	if (!t)
		return 0;
	pthread_mutex_lock(&t->lock);
	p = find_link(t, ino.subvol, ino.ino);
	if (*p) {
		(*p)->opens++;
	} else {
		struct open_inode *e = calloc(1, sizeof(*e));

		if (e) {
			e->subvol = ino.subvol;
			e->ino = ino.ino;
			e->opens = 1;
			*p = e;
			t->count++;
			grow(t);
		} else {
			ret = -ENOMEM;
		}
	}
	pthread_mutex_unlock(&t->lock);
	return ret;
}

/* Delete the orphan item of @ino in @sv (phase 2); 1 if there is none. */
static int delete_orphan_item(struct butter_fs *fs, struct subvol *sv, u64 ino)
{
	struct btrfs_key key = { BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, ino };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(&fs->w->txn.tt, &sv->root, &key, &path, 0, 1);
	if (ret == 0)
		ret = tree_del_items(&fs->w->txn.tt, &sv->root, &path, 1);
	tree_path_release(&fs->cache, &path);
	if (ret == 0)
		ret = txn_track_root(&fs->w->txn, &sv->root);
	return ret;
}

/* Free orphan @ino of @sv (phase 2): all its items, its data, its orphan item. */
static int free_orphan(struct butter_fs *fs, struct subvol *sv, u64 ino)
{
	int ret = ns_delete_inode(fs, sv, ino);

	if (ret == 0)
		ret = delete_orphan_item(fs, sv, ino);
	return ret == 1 ? 0 : ret;
}

static void unlink_last(struct btrfs_inode_item *ii, void *arg)
{
	(void)arg;
	btrfs_set_inode_nlink(ii, 0);
	fs_now_ts(&ii->ctime);
}

int ns_drop_last_link(struct butter_fs *fs, struct subvol *sv, u64 ino)
{
	struct fs_open_files *t = fs->w->open_files;
	struct btrfs_key key = { BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, ino };
	struct open_inode *e;
	int ret;

	pthread_mutex_lock(&t->lock);
	e = *find_link(t, sv->id, ino);
	if (e)
		e->orphan = 1;
	pthread_mutex_unlock(&t->lock);
	if (!e)
		return ns_delete_inode(fs, sv, ino);
	/*
	 * Phase 2 either way: if this fails the transaction is aborted, and the
	 * flag only makes the last release try (and fail) to free the inode.
	 */
	ret = inode_modify(fs, sv, ino, unlink_last, NULL);
	if (ret == 0)
		ret = tree_insert_item(&fs->w->txn.tt, &sv->root, &key, NULL, 0);
	return ret;
}

int ns_orphan_tmpfile(struct butter_fs *fs, struct subvol *sv, u64 ino)
{
	struct fs_open_files *t = fs->w->open_files;
	struct btrfs_key key = { BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, ino };
	struct open_inode **p, *e = calloc(1, sizeof(*e));
	int ret;

	if (!e)
		return -ENOMEM;
	e->subvol = sv->id;
	e->ino = ino;
	e->opens = 1;
	e->orphan = 1;
	e->linkable = 1;
	pthread_mutex_lock(&t->lock);
	p = find_link(t, sv->id, ino);
	e->next = *p; /* a new inode number: never in the table */
	*p = e;
	t->count++;
	grow(t);
	pthread_mutex_unlock(&t->lock);
	ret = inode_modify(fs, sv, ino, unlink_last, NULL);
	if (ret == 0)
		ret = tree_insert_item(&fs->w->txn.tt, &sv->root, &key, NULL, 0);
	return ret;
}

bool ns_orphan_linkable(struct butter_fs *fs, butter_ino_t ino)
{
	struct fs_open_files *t = fs->w->open_files;
	struct open_inode *e;
	bool yes;

	pthread_mutex_lock(&t->lock);
	e = *find_link(t, ino.subvol, ino.ino);
	yes = e && e->orphan && e->linkable;
	pthread_mutex_unlock(&t->lock);
	return yes;
}

int ns_orphan_relink(struct butter_fs *fs, struct subvol *sv, u64 ino)
{
	struct fs_open_files *t = fs->w->open_files;
	struct open_inode *e;
	int ret = delete_orphan_item(fs, sv, ino);

	if (ret)
		return ret == 1 ? -EUCLEAN : ret;
	pthread_mutex_lock(&t->lock);
	e = *find_link(t, sv->id, ino);
	if (e)
		e->orphan = e->linkable = 0;
	pthread_mutex_unlock(&t->lock);
	return 0;
}

int ns_release(struct butter_fs *fs, butter_ino_t ino, unsigned flags)
{
	struct fs_open_files *t = fs->w ? fs->w->open_files : NULL;
	struct fs_write_state *w;
	struct open_inode **p, *e;
	struct subvol *sv;
	bool last = false;
	int ret, err = 0;

	if (flags & ~BUTTER_RELEASE_NOFREE)
		return -EINVAL;
	if (!t)
		return 0;
	pthread_mutex_lock(&t->lock);
	p = find_link(t, ino.subvol, ino.ino);
	e = *p;
	if (!e || !e->opens) {
		pthread_mutex_unlock(&t->lock);
		return -EINVAL; /* released more often than opened */
	}
	if (e->opens > 1 || !e->orphan) {
		if (--e->opens == 0) {
			*p = e->next;
			t->count--;
			free(e);
		}
		pthread_mutex_unlock(&t->lock);
		return 0;
	}
	pthread_mutex_unlock(&t->lock);
	if (flags & BUTTER_RELEASE_NOFREE)
		return 1;

	/* the last open of an orphan: free it as a change (invariant 2) */
	ret = fs_begin_change_rsv(fs, &w, 0, 1);
	pthread_mutex_lock(&t->lock);
	p = find_link(t, ino.subvol, ino.ino);
	e = *p;
	if (e && e->opens && --e->opens == 0) {
		*p = e->next;
		t->count--;
		free(e);
		last = true;
	} /* else opened again meanwhile: that opener's last release frees it */
	pthread_mutex_unlock(&t->lock);
	if (ret)
		return ret; /* the orphan item stays on disk: the next open frees it */
	if (!last)
		return fs_end_change(w, 0, 0);
	sv = fs_subvol_mut(fs, ino.subvol, &err);
	if (!sv)
		return fs_end_change(w, err, 0);
	return fs_end_change(w, free_orphan(fs, sv, ino.ino), 1);
}

void ns_orphan_free_open(struct butter_fs *fs)
{
	struct fs_write_state *w = fs->w;
	struct fs_open_files *t = w->open_files;

	for (;;) {
		struct open_inode *found = NULL;
		struct fs_write_state *wl;
		struct subvol *sv;
		int ret, err = 0;

		pthread_mutex_lock(&t->lock);
		for (size_t i = 0; i < t->nbuckets && !found; i++) {
			struct open_inode **p = &t->buckets[i];

			while (*p && !(*p)->orphan)
				p = &(*p)->next;
			if (*p) {
				found = *p;
				*p = found->next;
				t->count--;
			}
		}
		pthread_mutex_unlock(&t->lock);
		if (!found)
			return;
		ret = fs_begin_change_rsv(fs, &wl, 0, 1);
		if (ret == 0) {
			sv = fs_subvol_mut(fs, found->subvol, &err);
			ret = sv ? fs_end_change(wl, free_orphan(fs, sv, found->ino), 1)
				 : fs_end_change(wl, err, 0);
		}
		if (ret)
			blog_warn(&fs->log, "subvolume %llu: orphan inode %llu left for the next "
					    "open: %s",
				  (unsigned long long)found->subvol, (unsigned long long)found->ino,
				  strerror(-ret));
		free(found);
	}
}

/* ---- cleanup at open --------------------------------------------------------- */

/* The inode numbers of @sv's orphan items, in *out (malloc'd), *n of them. */
static int list_orphans(struct butter_fs *fs, const struct tree_root *root, u64 **out, size_t *n)
{
	struct btrfs_key key = { BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, 0 };
	struct tree_path path;
	size_t cap = 0;
	int ret;

	*out = NULL;
	*n = 0;
	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, root, &key, &path);
	while (ret == 0) {
		path_key(&path, &key);
		if (key.objectid != BTRFS_ORPHAN_OBJECTID || key.type != BTRFS_ORPHAN_ITEM_KEY)
			break;
		if (*n == cap) {
			u64 *grown = realloc(*out, (cap ? cap * 2 : 16) * sizeof(**out));

			if (!grown) {
				ret = -ENOMEM;
				break;
			}
			*out = grown;
			cap = cap ? cap * 2 : 16;
		}
		(*out)[(*n)++] = key.offset;
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	if (ret < 0) {
		free(*out);
		*out = NULL;
		*n = 0;
		return ret;
	}
	return 0;
}

/* Free or forget one orphan item found at open. 0, or negative errno. */
static int clean_one(struct butter_fs *fs, u64 subvol, u64 ino, size_t *freed, size_t *left)
{
	(void)left; /* nothing is left over since shared blocks can be changed */
	butter_ino_t id = { subvol, ino };
	struct btrfs_inode_item ii;
	struct fs_write_state *w;
	struct subvol *sv;
	int ret, err = 0;

	ret = fs_begin_change_rsv(fs, &w, 0, 1);
	if (ret)
		return ret;
	sv = fs_subvol_mut(fs, subvol, &err);
	if (!sv)
		return fs_end_change(w, err, 0);
	ret = inode_read(fs, id, &ii);
	if (ret == -ENOENT || (ret == 0 && btrfs_inode_nlink(&ii) > 0)) {
		/* nothing to free: the item alone goes */
		ret = delete_orphan_item(fs, sv, ino);
		return fs_end_change(w, ret == 1 ? 0 : ret, 1);
	}
	if (ret)
		return fs_end_change(w, ret, 0);
	(*freed)++;
	return fs_end_change(w, free_orphan(fs, sv, ino), 1);
}

/* Clean subvolume @id's orphans (skipped when read-only or not live). */
static int clean_subvol(struct butter_fs *fs, u64 id, const struct btrfs_root_item *item,
			size_t *freed, size_t *left)
{
	struct subvol sv;
	u64 *inos;
	size_t n;
	int ret;

	if (btrfs_root_refs(item) == 0 || (btrfs_root_flags(item) & BTRFS_ROOT_SUBVOL_RDONLY))
		return 0;
	ret = fs_get_subvol(fs, id, &sv);
	if (ret == 0)
		ret = list_orphans(fs, &sv.root, &inos, &n);
	if (ret)
		return ret;
	for (size_t i = 0; i < n && ret == 0; i++)
		ret = clean_one(fs, id, inos[i], freed, left);
	free(inos);
	return ret;
}

int ns_orphan_cleanup(struct butter_fs *fs)
{
	struct btrfs_key key = { BTRFS_FS_TREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, 0 };
	struct btrfs_root_item item;
	size_t freed = 0, left = 0;
	int ret;

	for (;;) {
		struct tree_path path;
		u64 id;

		/* the next subvolume's ROOT_ITEM at or after @key */
		tree_path_init(&path);
		ret = fs_next_subvol_root_item(fs, &key, &path);
		if (ret == 0) {
			u32 size;
			const u8 *p = path_item(&path, &size);

			memset(&item, 0, sizeof(item));
			memcpy(&item, p, size < sizeof(item) ? size : sizeof(item));
			if (size < offsetof(struct btrfs_root_item, refs) + sizeof(item.refs))
				ret = BLOG_CORRUPT(&fs->log, "root item %llu: %u bytes",
						   (unsigned long long)key.objectid, size);
		}
		tree_path_release(&fs->cache, &path);
		if (ret)
			break;
		id = key.objectid;
		ret = clean_subvol(fs, id, &item, &freed, &left);
		if (ret)
			break;
		key.objectid = id + 1;
		key.type = 0;
		key.offset = 0;
	}
	/*
	 * The data relocation tree's inode of a kernel balance that was cut:
	 * its extents are copies nothing else needs once the relocation trees
	 * are gone (subvol_drop_reloc_trees()), freed like any orphan's.
	 */
	if (ret >= 0 && fs_read_root_item(fs, BTRFS_DATA_RELOC_TREE_OBJECTID, &item, NULL) == 0)
		ret = clean_subvol(fs, BTRFS_DATA_RELOC_TREE_OBJECTID, &item, &freed, &left);
	if (ret < 0) {
		blog_err(&fs->log, "cleaning up orphan inodes: %s", strerror(-ret));
		return ret;
	}
	if (freed || left)
		blog_info(&fs->log, "orphan inodes: %zu freed, %zu left", freed, left);
	return 0;
}
