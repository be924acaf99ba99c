/*
 * replay.c — replaying the tree log at read-write open: what a kernel
 * fsync() wrote after the last commit becomes part of the subvolumes, in one
 * transaction that also clears the superblock's log root.
 *
 * The log (its layout as the Linux kernel writes it):
 *   super.log_root              the log root tree (owner TREE_LOG)
 *     (TREE_LOG, ROOT_ITEM, id) root item of the log tree of subvolume id
 *   a log tree holds copies of subvolume items of the fsynced inodes:
 *     INODE_ITEM, INODE_REF, INODE_EXTREF, XATTR_ITEM, EXTENT_DATA,
 *     DIR_INDEX (the names a logged directory holds),
 *     DIR_LOG_INDEX (dir, start) {end}: the log is authoritative for the
 *                                 directory's indexes in [start, end]
 *     (EXTENT_CSUM, EXTENT_CSUM, logical): checksums of logged data
 *   Log tree blocks and data extents written since the commit have no extent
 *   items: the committed free space still counts them as free.
 *
 * The replay (the kernel's algorithm, fs/btrfs/tree-log.c, rewritten):
 *   0. check every log item before changing anything; tlog_refuse what is not
 *      understood (see tlog_refuse() calls: old log formats, verity, subvolume
 *      links); take log tree blocks and logged data extents out of free
 *      space (log blocks are pinned: free again after the commit);
 *   an inode logged with no links is skipped with all its items (its names
 *   go through its directory's logged deletions);
 *   per subvolume log tree, three passes in key order:
 *   1. inode items: delete xattrs the log lacks; for a directory, delete its
 *      entries in the logged index ranges the log lacks; copy the inode item
 *      (one logged with generation 0 only says "exists": the subvolume's is
 *      kept, a regular file taking the logged size); drop a regular file's
 *      extents past its size;
 *   2. DIR_INDEX entries: make the name point where the log says (dropping
 *      conflicting entries), unless the inode's own ref in the log adds it
 *      later or the inode does not exist;
 *   3. xattrs copied; inode refs: conflicting names dropped, missing names
 *      added, the ref item copied; file extents: the range dropped, the item
 *      copied, a reference taken (the extent item made when it has none),
 *      checksums copied from the log;
 *   4. link counts recounted from the refs of every inode involved (none
 *      left: the inode is deleted, a directory's entries first); directory
 *      sizes and file nbytes recounted; logged inodes get back their logged
 *      times (the helpers used on the way stamp "now");
 *   5. logged data extents nothing references return to free space; the
 *      superblock's log root is cleared; commit.
 *
 * Invariants:
 *  1. Nothing on disk changes until the commit: any error aborts the
 *     transaction, the open fails and the log stays for the kernel (or a
 *     read-only open).
 *  2. No allocation happens before step 0 finished (log blocks and logged
 *     data stay untouched while they are read).
 *  3. Every name added or removed is accounted in all three places
 *     (DIR_ITEM, DIR_INDEX, INODE_REF/EXTREF); counts and sizes are derived
 *     from the items at the end, never adjusted on the way.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/checksum.h"
#include "treelog/replay.h"

/* Times of a replayed inode as the log (or the subvolume) had them. */
struct inode_times {
	u64 ino;
	struct btrfs_timespec atime, ctime, mtime, otime;
};

struct replay {
	struct butter_fs *fs;
	struct fs_write_state *w;
	struct tree_trans *t;
	struct subvol *sv;           /* subvolume being replayed into */
	struct tree_root log;        /* its log tree */
	struct u64_list fixup;       /* link counts to recount */
	struct u64_list dirs;        /* directory sizes to recount */
	struct u64_list files;       /* nbytes to recount */
	struct inode_times *times;   /* logged inodes */
	size_t ntimes, times_cap;
	int no_holes;
	u64 items;                   /* log items replayed, for the message */
};

int tlog_refuse(struct butter_fs *fs, const char *why, const struct btrfs_key *key)
{
	if (key)
		blog_err(&fs->log, "cannot replay the tree log (item %llu %u %llu): %s; "
				   "open read-only, or mount with the kernel to replay it",
			 (unsigned long long)key->objectid, key->type,
			 (unsigned long long)key->offset, why);
	else
		blog_err(&fs->log, "cannot replay the tree log: %s; open read-only, or mount "
				   "with the kernel to replay it", why);
	return -EOPNOTSUPP;
}

int tlog_u64_push(struct u64_list *l, u64 v)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		u64 *n = realloc(l->v, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		l->v = n;
		l->cap = cap;
	}
	l->v[l->n++] = v;
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	u64 x = *(const u64 *)a, y = *(const u64 *)b;

	return x < y ? -1 : x > y;
}

static void u64_unique(struct u64_list *l)
{
	size_t i, j = 0;

	if (l->n > 1)
		qsort(l->v, l->n, sizeof(u64), cmp_u64);
	for (i = 0; i < l->n; i++)
		if (j == 0 || l->v[j - 1] != l->v[i])
			l->v[j++] = l->v[i];
	l->n = j;
}

/*
 * Copy the items of @root keyed (@objectid, @type, offset in [@from, @to])
 * into @out (appended, in key order).
 */
static int collect(struct node_cache *cache, const struct tree_root *root, u64 objectid, u8 type,
		   u64 from, u64 to, struct item_list *out)
{
	struct btrfs_key key = { objectid, type, from };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(cache, root, &key, &path);
	while (ret == 0) {
		const u8 *p;
		u32 size;

		path_key(&path, &key);
		if (key.objectid != objectid || key.type != type || key.offset > to)
			break;
		p = path_item(&path, &size);
		ret = item_list_push(out, &key, p, size);
		if (ret == 0)
			ret = tree_next_item(cache, &path);
	}
	tree_path_release(cache, &path);
	return ret < 0 ? ret : 0;
}

/* ---- changing subvolume items ---- */

/* Cut [off, off + len) out of the item at @key (deleting it when nothing is left). */
static int cut_item(struct replay *r, const struct btrfs_key *key, u32 off, u32 len)
{
	struct tree_path path;
	u32 size;
	u8 *p;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(r->t, &r->sv->root, key, &path, 0, 1);
	if (ret == 0) {
		p = path_item_mut(&path, &size);
		if (off + len > size) {
			ret = -EUCLEAN;
		} else if (len == size) {
			ret = tree_del_items(r->t, &r->sv->root, &path, 1);
		} else {
			memmove(p + off, p + off + len, size - off - len);
			ret = tree_truncate_item(r->t, &path, size - len);
		}
	} else if (ret == 1) {
		ret = -EUCLEAN;
	}
	tree_path_release(&r->fs->cache, &path);
	return ret;
}

/* Make the item at @key exactly @data (replacing or inserting it). */
static int put_item(struct replay *r, const struct btrfs_key *key, const void *data, u32 size)
{
	struct tree_path path;
	u32 old;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(r->t, &r->sv->root, key, &path, 0, 1);
	if (ret == 0) {
		path_item(&path, &old);
		if (old == size) {
			memcpy(path_item_mut(&path, &old), data, size);
			tree_path_release(&r->fs->cache, &path);
			return 0;
		}
		ret = tree_del_items(r->t, &r->sv->root, &path, 1);
	} else if (ret == 1) {
		ret = 0;
	}
	tree_path_release(&r->fs->cache, &path);
	if (ret == 0)
		ret = tree_insert_item(r->t, &r->sv->root, key, data, size);
	return ret;
}

/* Copy the item at @key of tree @root (up to @cap bytes) into a new buffer. */
static int read_item(struct replay *r, const struct tree_root *root, const struct btrfs_key *key,
		     u8 **out, u32 *size)
{
	int ret = tree_lookup_item(&r->fs->cache, root, key, NULL, 0);
	u8 *buf;

	if (ret < 0)
		return ret;
	buf = malloc(ret ? (size_t)ret : 1);
	if (!buf)
		return -ENOMEM;
	*size = (u32)ret;
	ret = tree_lookup_item(&r->fs->cache, root, key, buf, *size);
	if (ret < 0) {
		free(buf);
		return ret;
	}
	*out = buf;
	return 0;
}

static int inode_exists(struct replay *r, u64 ino, struct btrfs_inode_item *ii)
{
	struct btrfs_key key = { ino, BTRFS_INODE_ITEM_KEY, 0 };
	struct btrfs_inode_item tmp;
	int ret = tree_lookup_item(&r->fs->cache, &r->sv->root, &key, ii ? ii : &tmp, sizeof(tmp));

	if (ret == -ENOENT)
		return 0;
	if (ret < 0)
		return ret;
	if ((u32)ret < sizeof(tmp))
		return BLOG_CORRUPT(&r->fs->log, "inode %llu: short item", (unsigned long long)ino);
	return 1;
}

/*
 * Remove the name @name of inode @ino in directory @dir from all three
 * places it lives: the inode's ref (or extref), the DIR_INDEX (@index if
 * known, else the one the ref names or a scan finds) and the DIR_ITEM. Parts
 * already gone are skipped. The directory size and the inode's link count
 * are recounted at the end.
 */
static int unlink_name(struct replay *r, u64 dir, u64 ino, const char *name, u32 len, u64 index)
{
	struct node_cache *cache = &r->fs->cache;
	struct btrfs_key key = { ino, BTRFS_INODE_REF_KEY, dir };
	struct btrfs_key loc;
	struct inode_ref_name rn;
	int have_index = index != (u64)-1;
	u8 *data = NULL;
	u32 size;
	long pos;
	int ret;

	/* the inode's side */
	ret = read_item(r, &r->sv->root, &key, &data, &size);
	if (ret == -ENOENT) {
		key.type = BTRFS_INODE_EXTREF_KEY;
		key.offset = btrfs_extref_hash(dir, name, len);
		ret = read_item(r, &r->sv->root, &key, &data, &size);
	}
	if (ret == 0) {
		pos = inode_find_ref_entry(key.type, key.offset, data, size, dir, name, len, &rn);
		if (pos == -EUCLEAN)
			ret = BLOG_CORRUPT(&r->fs->log, "inode %llu: malformed ref item",
					   (unsigned long long)ino);
		if (pos >= 0) {
			if (!have_index) {
				index = rn.index;
				have_index = 1;
			}
			ret = cut_item(r, &key, (u32)pos, inode_ref_entry_len(key.type, data + pos,
									 size - (u32)pos));
		}
	} else if (ret == -ENOENT) {
		ret = 0;
	}
	free(data);
	data = NULL;
	if (ret)
		return ret;

	/* the directory's index */
	if (!have_index) {
		struct item_list idx = { 0 };
		size_t i;

		ret = collect(cache, &r->sv->root, dir, BTRFS_DIR_INDEX_KEY, 0, (u64)-1, &idx);
		for (i = 0; ret == 0 && i < idx.n; i++) {
			if (inode_find_dir_entry(idx.v[i].data, idx.v[i].size, name, len, &loc) == 0 &&
			    loc.objectid == ino) {
				index = idx.v[i].key.offset;
				have_index = 1;
				break;
			}
		}
		item_list_free(&idx);
		if (ret)
			return ret;
	}
	if (have_index) {
		key.objectid = dir;
		key.type = BTRFS_DIR_INDEX_KEY;
		key.offset = index;
		ret = read_item(r, &r->sv->root, &key, &data, &size);
		if (ret == 0 && inode_find_dir_entry(data, size, name, len, &loc) == 0 && loc.objectid == ino)
			ret = cut_item(r, &key, 0, size);
		else if (ret == -ENOENT)
			ret = 0;
		free(data);
		data = NULL;
		if (ret)
			return ret;
	}

	/* the directory's name item */
	key.objectid = dir;
	key.type = BTRFS_DIR_ITEM_KEY;
	key.offset = btrfs_name_hash(name, len);
	ret = read_item(r, &r->sv->root, &key, &data, &size);
	if (ret == 0) {
		pos = inode_find_dir_entry(data, size, name, len, &loc);
		if (pos == -EUCLEAN)
			ret = BLOG_CORRUPT(&r->fs->log, "dir %llu: malformed dir item",
					   (unsigned long long)dir);
		else if (pos >= 0 && loc.objectid == ino)
			ret = cut_item(r, &key, (u32)pos, inode_dir_entry_len(data + pos, size - (u32)pos));
	} else if (ret == -ENOENT) {
		ret = 0;
	}
	free(data);
	if (ret == 0)
		ret = tlog_u64_push(&r->dirs, dir);
	if (ret == 0)
		ret = tlog_u64_push(&r->fixup, ino);
	return ret;
}

/* Drop the subvolume's directory entry @di (found in @dir at @index, or -1). */
static int drop_dir_entry(struct replay *r, u64 dir, const u8 *entry, u64 index)
{
	const struct btrfs_dir_item *di = (const void *)entry;
	struct btrfs_key loc;

	btrfs_disk_to_cpu_key(&loc, &di->location);
	if (loc.type != BTRFS_INODE_ITEM_KEY)
		return tlog_refuse(r->fs, "a subvolume's name in a directory would have to go", &loc);
	return unlink_name(r, dir, loc.objectid, (const char *)(di + 1), btrfs_dir_name_len(di),
			   index);
}

/* Insert the directory side of a name: DIR_ITEM and DIR_INDEX entries. */
static int add_dir_entries(struct replay *r, u64 dir, const char *name, u32 len,
			   const struct btrfs_key *location, u8 ft, u64 index)
{
	struct btrfs_key key = { dir, BTRFS_DIR_INDEX_KEY, index };
	int ret = inode_insert_dir_entries(r->t, &r->sv->root, dir, name, len, location, ft, index);

	if (ret == -EEXIST)
		return tlog_refuse(r->fs, "a directory index is taken by another name", &key);
	if (ret == 0)
		ret = tlog_u64_push(&r->dirs, dir);
	return ret;
}

/* ---- step 1: inode items ---- */

/* Delete the xattrs of @ino the log does not have. */
static int replay_xattr_deletes(struct replay *r, u64 ino)
{
	struct item_list mine = { 0 };
	size_t i;
	int ret;

	ret = collect(&r->fs->cache, &r->sv->root, ino, BTRFS_XATTR_ITEM_KEY, 0, (u64)-1, &mine);
	for (i = 0; ret == 0 && i < mine.n; i++) {
		struct item_copy *c = &mine.v[i];
		u8 *logged = NULL;
		u32 lsize = 0, pos = 0, cut = 0;

		ret = read_item(r, &r->log, &c->key, &logged, &lsize);
		if (ret == -ENOENT)
			ret = 0;
		/* walk back to front so earlier offsets stay valid while cutting */
		while (ret == 0 && pos < c->size) {
			u32 l = inode_dir_entry_len(c->data + pos, c->size - pos);
			const struct btrfs_dir_item *di = (const void *)(c->data + pos);

			if (!l) {
				ret = BLOG_CORRUPT(&r->fs->log, "inode %llu: malformed xattr item",
						   (unsigned long long)ino);
				break;
			}
			if (!logged || inode_find_dir_entry(logged, lsize, (const char *)(di + 1),
							    btrfs_dir_name_len(di), NULL) < 0) {
				ret = cut_item(r, &c->key, pos - cut, l);
				cut += l;
			}
			pos += l;
		}
		free(logged);
	}
	item_list_free(&mine);
	return ret;
}

/* Delete the entries of directory @dir in the index ranges the log covers but lacks. */
static int replay_dir_deletes(struct replay *r, u64 dir)
{
	struct item_list ranges = { 0 };
	size_t i, j;
	int ret;

	ret = collect(&r->fs->cache, &r->log, dir, BTRFS_DIR_LOG_INDEX_KEY, 0, (u64)-1, &ranges);
	for (i = 0; ret == 0 && i < ranges.n; i++) {
		struct item_list mine = { 0 };
		u64 start = ranges.v[i].key.offset, end;

		if (ranges.v[i].size < 8) {
			ret = BLOG_CORRUPT(&r->fs->log, "dir %llu: short dir log item",
					   (unsigned long long)dir);
			break;
		}
		end = get_le64(ranges.v[i].data);
		ret = collect(&r->fs->cache, &r->sv->root, dir, BTRFS_DIR_INDEX_KEY, start, end,
			      &mine);
		for (j = 0; ret == 0 && j < mine.n; j++) {
			struct item_copy *c = &mine.v[j];
			const struct btrfs_dir_item *di = (const void *)c->data;
			u8 *logged = NULL;
			u32 lsize;

			if (!inode_dir_entry_len(c->data, c->size)) {
				ret = BLOG_CORRUPT(&r->fs->log, "dir %llu: malformed index item",
						   (unsigned long long)dir);
				break;
			}
			ret = read_item(r, &r->log, &c->key, &logged, &lsize);
			if (ret == 0 && inode_find_dir_entry(logged, lsize, (const char *)(di + 1),
							     btrfs_dir_name_len(di), NULL) >= 0) {
				free(logged);
				continue;
			}
			free(logged);
			if (ret && ret != -ENOENT)
				break;
			ret = drop_dir_entry(r, dir, c->data, c->key.offset);
		}
		item_list_free(&mine);
	}
	item_list_free(&ranges);
	return ret;
}

static int save_times(struct replay *r, u64 ino, const struct btrfs_inode_item *ii)
{
	struct inode_times *t;

	if (r->ntimes == r->times_cap) {
		size_t cap = r->times_cap ? r->times_cap * 2 : 32;
		struct inode_times *n = realloc(r->times, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		r->times = n;
		r->times_cap = cap;
	}
	t = &r->times[r->ntimes++];
	t->ino = ino;
	t->atime = ii->atime;
	t->ctime = ii->ctime;
	t->mtime = ii->mtime;
	t->otime = ii->otime;
	return 0;
}

static int replay_inode(struct replay *r, const struct item_copy *c)
{
	struct btrfs_inode_item logged, cur, next;
	u64 ino = c->key.objectid;
	u32 mode;
	int ret, exists;

	memcpy(&logged, c->data, sizeof(logged));
	mode = btrfs_inode_mode(&logged);
	ret = replay_xattr_deletes(r, ino);
	if (ret == 0 && S_ISDIR(mode))
		ret = replay_dir_deletes(r, ino);
	if (ret)
		return ret;
	exists = inode_exists(r, ino, &cur);
	if (exists < 0)
		return exists;
	if (exists && btrfs_inode_generation(&logged) == 0) {
		/* logged only to say it exists: keep ours, a regular file takes the size */
		next = cur;
		if (S_ISREG(mode) && S_ISREG(btrfs_inode_mode(&cur)) && btrfs_inode_size(&logged))
			btrfs_set_inode_size(&next, btrfs_inode_size(&logged));
	} else {
		next = logged;
		if (btrfs_inode_generation(&next) == 0)
			btrfs_set_inode_generation(&next, r->t->transid);
	}
	ret = put_item(r, &c->key, &next, sizeof(next));
	if (ret == 0)
		ret = txn_track_root(&r->w->txn, &r->sv->root);
	if (ret == 0 && S_ISREG(btrfs_inode_mode(&next))) {
		u32 ss = r->fs->vol.sectorsize;
		u64 from = (btrfs_inode_size(&next) + ss - 1) / ss * ss;

		/* extents past the size go now: prealloc ones in the log come back after */
		ret = data_drop_extents(r->fs, r->sv, ino, from, (u64)-1);
	}
	if (ret == 0)
		ret = save_times(r, ino, &next);
	if (ret == 0)
		ret = tlog_u64_push(&r->fixup, ino);
	if (ret == 0 && S_ISDIR(btrfs_inode_mode(&next)))
		ret = tlog_u64_push(&r->dirs, ino);
	if (ret == 0 && !S_ISDIR(btrfs_inode_mode(&next)))
		ret = tlog_u64_push(&r->files, ino);
	return ret;
}

/* ---- step 2: directory index entries ---- */

/* Does the log hold a ref of @ino naming @name in @dir? */
static int backref_in_log(struct replay *r, u64 ino, u64 dir, const char *name, u32 len)
{
	struct btrfs_key key = { ino, BTRFS_INODE_REF_KEY, dir };
	u8 *data = NULL;
	u32 size;
	long pos;
	int ret;

	ret = read_item(r, &r->log, &key, &data, &size);
	if (ret == -ENOENT) {
		key.type = BTRFS_INODE_EXTREF_KEY;
		key.offset = btrfs_extref_hash(dir, name, len);
		ret = read_item(r, &r->log, &key, &data, &size);
	}
	if (ret == -ENOENT)
		return 0;
	if (ret)
		return ret;
	pos = inode_find_ref_entry(key.type, key.offset, data, size, dir, name, len, NULL);
	free(data);
	if (pos == -EUCLEAN)
		return BLOG_CORRUPT(&r->fs->log, "log: inode %llu: malformed ref item",
				    (unsigned long long)ino);
	return pos >= 0;
}

/*
 * Find @name in the subvolume's dir item (DIR_ITEM) or index item
 * (DIR_INDEX) at @key: *@ok when it points at @loc with type @type. When
 * the inode exists (@exists), a stale entry of that name there is dropped,
 * and an index item holding another name is refused. 0 or -errno.
 */
static int check_dir_entry(struct replay *r, const struct btrfs_key *key, const char *name,
			   u32 len, const struct btrfs_key *loc, u8 type, int exists, int *ok)
{
	int is_index = key->type == BTRFS_DIR_INDEX_KEY;
	u64 dir = key->objectid;
	struct btrfs_key found;
	u8 *data = NULL;
	u32 size;
	long pos;
	int ret;

	ret = read_item(r, &r->sv->root, key, &data, &size);
	if (ret == 0) {
		pos = inode_find_dir_entry(data, size, name, len, &found);
		if (pos == -EUCLEAN) {
			ret = BLOG_CORRUPT(&r->fs->log, "dir %llu: malformed %s item",
					   (unsigned long long)dir, is_index ? "index" : "dir");
		} else if (pos >= 0) {
			const struct btrfs_dir_item *di = (const void *)(data + pos);

			if (!btrfs_comp_keys(&found, loc) && di->type == type)
				*ok = 1;
			else if (exists)
				ret = is_index ? drop_dir_entry(r, dir, data, key->offset)
					       : drop_dir_entry(r, dir, data + pos, (u64)-1);
		} else if (exists && is_index) {
			ret = tlog_refuse(r->fs, "a directory index is taken by another name", key);
		}
	} else if (ret == -ENOENT) {
		ret = 0;
	}
	free(data);
	return ret;
}

/* Make index @index of @dir hold the logged entry @entry (a DIR_INDEX item). */
static int replay_dir_index(struct replay *r, const struct item_copy *c)
{
	const struct btrfs_dir_item *ldi = (const void *)c->data;
	const char *name = (const char *)(ldi + 1);
	u32 len = btrfs_dir_name_len(ldi);
	u64 dir = c->key.objectid, index = c->key.offset;
	struct btrfs_key loc, key;
	int exists, ret, name_ok = 0, index_ok = 0;

	btrfs_disk_to_cpu_key(&loc, &ldi->location);
	ret = inode_exists(r, dir, NULL);
	if (ret <= 0)
		return ret < 0 ? ret : tlog_refuse(r->fs, "a logged name's directory does not exist",
					     &c->key);
	exists = loc.type == BTRFS_INODE_ITEM_KEY ? inode_exists(r, loc.objectid, NULL) : 0;
	if (exists < 0)
		return exists;

	key.objectid = dir;
	key.type = BTRFS_DIR_ITEM_KEY;
	key.offset = btrfs_name_hash(name, len);
	ret = check_dir_entry(r, &key, name, len, &loc, ldi->type, exists, &name_ok);
	if (ret)
		return ret;
	key.type = BTRFS_DIR_INDEX_KEY;
	key.offset = index;
	ret = check_dir_entry(r, &key, name, len, &loc, ldi->type, exists, &index_ok);
	if (ret || (name_ok && index_ok))
		return ret;
	if (!exists)
		return 0; /* fsync of a directory does not bring its new inodes along */
	ret = backref_in_log(r, loc.objectid, dir, name, len);
	if (ret)
		return ret < 0 ? ret : 0; /* the inode's ref replay adds the name */
	if (name_ok || index_ok)
		return tlog_refuse(r->fs, "a name is half present in its directory", &c->key);
	{
		/* a name of an inode whose own refs were not logged: all three places */
		u8 ref[sizeof(struct btrfs_inode_ref) + BTRFS_NAME_LEN];
		struct btrfs_key rkey = { loc.objectid, BTRFS_INODE_REF_KEY, dir };
		u8 *have = NULL;
		u32 hsize;

		if (len > BTRFS_NAME_LEN)
			return -EUCLEAN;
		ret = read_item(r, &r->sv->root, &rkey, &have, &hsize);
		if (ret == 0 && inode_find_ref_entry(rkey.type, dir, have, hsize, dir, name, len, NULL) >= 0)
			ret = tlog_refuse(r->fs, "an inode ref exists without its entries", &c->key);
		else if (ret == -ENOENT || ret == 0)
			ret = 0;
		free(have);
		if (ret)
			return ret;
		btrfs_set_inode_ref_index((struct btrfs_inode_ref *)ref, index);
		btrfs_set_inode_ref_name_len((struct btrfs_inode_ref *)ref, (u16)len);
		memcpy(ref + sizeof(struct btrfs_inode_ref), name, len);
		ret = fs_insert_or_extend(r->t, &r->sv->root, &rkey, ref,
					  (u32)(sizeof(struct btrfs_inode_ref) + len));
		if (ret == 0)
			ret = add_dir_entries(r, dir, name, len, &loc, ldi->type, index);
		if (ret == 0)
			ret = tlog_u64_push(&r->fixup, loc.objectid);
	}
	return ret;
}

/* ---- step 3: refs, xattrs, extents ---- */

/* Is (@dir, @index, @name) already a name of @ino in both directory items? */
static int inode_in_dir(struct replay *r, u64 dir, u64 ino, u64 index, const char *name, u32 len)
{
	struct btrfs_key key = { dir, BTRFS_DIR_INDEX_KEY, index }, loc;
	u8 *data = NULL;
	u32 size;
	int ret, match = 0;

	ret = read_item(r, &r->sv->root, &key, &data, &size);
	if (ret == 0 && inode_find_dir_entry(data, size, name, len, &loc) >= 0 &&
	    loc.type == BTRFS_INODE_ITEM_KEY && loc.objectid == ino)
		match = 1;
	free(data);
	data = NULL;
	if (ret && ret != -ENOENT)
		return ret;
	if (!match)
		return 0;
	key.type = BTRFS_DIR_ITEM_KEY;
	key.offset = btrfs_name_hash(name, len);
	ret = read_item(r, &r->sv->root, &key, &data, &size);
	match = ret == 0 && inode_find_dir_entry(data, size, name, len, &loc) >= 0 &&
		loc.type == BTRFS_INODE_ITEM_KEY && loc.objectid == ino;
	free(data);
	if (ret && ret != -ENOENT)
		return ret;
	return match;
}

/*
 * Drop the names of @ino in @parent that the subvolume has in ref items of
 * type @type but the log does not (conflicts with the names being logged).
 */
static int drop_unlogged_refs(struct replay *r, u64 ino, u64 parent, u8 type)
{
	struct item_list mine = { 0 };
	size_t i;
	int ret, again = 1;

	u64 last_total = (u64)-1;

	while (again) {
		u64 total = 0;

		again = 0;
		if (type == BTRFS_INODE_REF_KEY)
			ret = collect(&r->fs->cache, &r->sv->root, ino, type, parent, parent, &mine);
		else
			ret = collect(&r->fs->cache, &r->sv->root, ino, type, 0, (u64)-1, &mine);
		for (i = 0; i < mine.n; i++)
			total += mine.v[i].size;
		if (ret == 0 && total >= last_total)
			ret = BLOG_CORRUPT(&r->fs->log, "inode %llu: a ref would not go",
					   (unsigned long long)ino);
		last_total = total;
		for (i = 0; ret == 0 && i < mine.n && !again; i++) {
			struct item_copy *c = &mine.v[i];
			u32 pos = 0;

			while (pos < c->size) {
				u32 l = inode_ref_entry_len(type, c->data + pos, c->size - pos);
				struct inode_ref_name rn;

				if (!l) {
					ret = BLOG_CORRUPT(&r->fs->log, "inode %llu: malformed ref",
							   (unsigned long long)ino);
					break;
				}
				inode_ref_decode(type, c->key.offset, c->data + pos, &rn);
				pos += l;
				if (rn.parent != parent)
					continue;
				ret = backref_in_log(r, ino, parent, rn.name, rn.len);
				if (ret < 0)
					break;
				if (ret == 0) {
					char name[BTRFS_NAME_LEN];
					u32 len = rn.len < sizeof(name) ? rn.len : (u32)sizeof(name);

					memcpy(name, rn.name, len);
					ret = unlink_name(r, parent, ino, name, len, rn.index);
					again = 1; /* the items changed: look again */
					break;
				}
				ret = 0;
			}
		}
		item_list_free(&mine);
		if (ret)
			return ret;
	}
	return 0;
}

/* Drop the subvolume's entry of @dir at @key matching @name, whatever it names. */
static int drop_named_entry(struct replay *r, const struct btrfs_key *key, const char *name,
			    u32 len)
{
	u8 *data = NULL;
	u32 size;
	long pos;
	int ret = read_item(r, &r->sv->root, key, &data, &size);

	if (ret == -ENOENT)
		return 0;
	if (ret)
		return ret;
	pos = inode_find_dir_entry(data, size, name, len, NULL);
	if (pos >= 0)
		ret = drop_dir_entry(r, key->objectid, data + pos,
				     key->type == BTRFS_DIR_INDEX_KEY ? key->offset : (u64)-1);
	free(data);
	return ret;
}

static int replay_inode_ref(struct replay *r, const struct item_copy *c)
{
	u64 ino = c->key.objectid;
	struct btrfs_inode_item ii;
	u32 pos = 0;
	int ret;

	if (c->key.type == BTRFS_INODE_REF_KEY && c->key.offset == ino)
		return 0; /* the root directory's ".." */
	ret = inode_exists(r, ino, &ii);
	if (ret <= 0)
		return ret < 0 ? ret : tlog_refuse(r->fs, "a logged ref's inode does not exist", &c->key);
	/*
	 * A name in a directory that does not exist (it was not logged) cannot
	 * be made: the kernel skips the whole item then, and so do we. An
	 * extref item naming several directories of which a later one is
	 * missing is replayed half by the kernel: refused.
	 */
	while (pos < c->size) {
		u32 l = inode_ref_entry_len(c->key.type, c->data + pos, c->size - pos);
		struct inode_ref_name rn;

		if (!l)
			return BLOG_CORRUPT(&r->fs->log, "log: inode %llu: malformed ref",
					    (unsigned long long)ino);
		inode_ref_decode(c->key.type, c->key.offset, c->data + pos, &rn);
		ret = inode_exists(r, rn.parent, NULL);
		if (ret < 0)
			return ret;
		if (ret == 0 && pos == 0)
			return 0;
		if (ret == 0)
			return tlog_refuse(r->fs, "an extref names a directory that does not exist",
					   &c->key);
		pos += l;
	}
	pos = 0;
	while (pos < c->size) {
		u32 l = inode_ref_entry_len(c->key.type, c->data + pos, c->size - pos);
		struct btrfs_key key, loc = { ino, BTRFS_INODE_ITEM_KEY, 0 };
		struct inode_ref_name rn;

		if (!l)
			return BLOG_CORRUPT(&r->fs->log, "log: inode %llu: malformed ref",
					    (unsigned long long)ino);
		inode_ref_decode(c->key.type, c->key.offset, c->data + pos, &rn);
		pos += l;
		ret = inode_in_dir(r, rn.parent, ino, rn.index, rn.name, rn.len);
		if (ret < 0)
			return ret;
		if (ret)
			continue;
		/* names of this inode in that directory the log does not have */
		ret = drop_unlogged_refs(r, ino, rn.parent, BTRFS_INODE_REF_KEY);
		if (ret == 0)
			ret = drop_unlogged_refs(r, ino, rn.parent, BTRFS_INODE_EXTREF_KEY);
		/* whatever else holds this index or this name in the directory */
		key.objectid = rn.parent;
		key.type = BTRFS_DIR_INDEX_KEY;
		key.offset = rn.index;
		if (ret == 0) {
			u8 *data = NULL;
			u32 size;

			ret = read_item(r, &r->sv->root, &key, &data, &size);
			if (ret == 0 && inode_find_dir_entry(data, size, rn.name, rn.len, NULL) == 0)
				ret = drop_dir_entry(r, rn.parent, data, rn.index);
			else if (ret == 0)
				ret = tlog_refuse(r->fs, "a directory index is taken by another name", &key);
			else if (ret == -ENOENT)
				ret = 0;
			free(data);
		}
		key.type = BTRFS_DIR_ITEM_KEY;
		key.offset = btrfs_name_hash(rn.name, rn.len);
		if (ret == 0)
			ret = drop_named_entry(r, &key, rn.name, rn.len);
		/* our own name with another index goes too */
		if (ret == 0)
			ret = unlink_name(r, rn.parent, ino, rn.name, rn.len, (u64)-1);
		if (ret == 0)
			ret = add_dir_entries(r, rn.parent, rn.name, rn.len, &loc,
					      inode_mode_to_ft(btrfs_inode_mode(&ii)), rn.index);
		if (ret)
			return ret;
	}
	/* names in the subvolume's item at this key that the log's item lacks */
	{
		u8 *data = NULL;
		u32 size, p = 0;

		ret = read_item(r, &r->sv->root, &c->key, &data, &size);
		if (ret == -ENOENT) {
			ret = 0;
			size = 0;
		}
		while (ret == 0 && p < size) {
			u32 l = inode_ref_entry_len(c->key.type, data + p, size - p);
			struct inode_ref_name rn;

			if (!l) {
				ret = -EUCLEAN;
				break;
			}
			inode_ref_decode(c->key.type, c->key.offset, data + p, &rn);
			p += l;
			if (inode_find_ref_entry(c->key.type, c->key.offset, c->data, c->size, rn.parent,
						 rn.name, rn.len, NULL) < 0) {
				char name[BTRFS_NAME_LEN];
				u32 len = rn.len < sizeof(name) ? rn.len : (u32)sizeof(name);

				u32 before = size;

				memcpy(name, rn.name, len);
				ret = unlink_name(r, rn.parent, ino, name, len, rn.index);
				free(data);
				data = NULL;
				p = 0;
				if (ret == 0)
					ret = read_item(r, &r->sv->root, &c->key, &data, &size);
				if (ret == -ENOENT) {
					ret = 0;
					size = 0;
				}
				if (ret == 0 && size >= before)
					ret = BLOG_CORRUPT(&r->fs->log, "inode %llu: a ref would not go",
							   (unsigned long long)ino);
			}
		}
		free(data);
		if (ret)
			return ret;
	}
	ret = put_item(r, &c->key, c->data, c->size);
	if (ret == 0)
		ret = tlog_u64_push(&r->fixup, ino);
	return ret;
}

/* Copy the logged checksums of [start, end) into the csum tree. */
static int copy_csums(struct replay *r, u64 start, u64 end)
{
	struct node_cache *cache = &r->fs->cache;
	u32 ss = r->fs->vol.sectorsize, cs = r->fs->vol.csum_size;
	struct btrfs_key key = { BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, start };
	struct item_list sums = { 0 };
	struct tree_path path;
	size_t i;
	int ret;

	/* the last item starting at or before @start, then every one after it below @end */
	tree_path_init(&path);
	ret = tree_search_backward(cache, &r->log, &key, &path);
	if (ret == 0) {
		path_key(&path, &key);
		if (key.objectid != BTRFS_EXTENT_CSUM_OBJECTID || key.type != BTRFS_EXTENT_CSUM_KEY)
			key.offset = start;
	} else {
		key.offset = start;
	}
	tree_path_release(cache, &path);
	if (ret < 0)
		return ret;
	ret = collect(cache, &r->log, BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY,
		      key.offset, end - 1, &sums);
	for (i = 0; ret == 0 && i < sums.n; i++) {
		u64 s = sums.v[i].key.offset, e = s + (u64)(sums.v[i].size / cs) * ss;
		u64 a = s > start ? s : start, b = e < end ? e : end;

		if (a >= b)
			continue;
		if ((a - s) % ss || (b - a) % ss) {
			ret = BLOG_CORRUPT(&r->fs->log, "log: csum item %llu unaligned",
					   (unsigned long long)s);
			break;
		}
		ret = extent_delete_csums(&r->w->es, r->t, a, b - a);
		if (ret == 0)
			ret = extent_insert_csums(&r->w->es, r->t, a, b - a,
						  sums.v[i].data + (a - s) / ss * cs);
	}
	item_list_free(&sums);
	return ret;
}

static int replay_extent(struct replay *r, const struct item_copy *c)
{
	const struct btrfs_file_extent_item *fi = (const void *)c->data;
	u32 ss = r->fs->vol.sectorsize;
	u64 ino = c->key.objectid, start = c->key.offset, end;
	int ret;

	ret = inode_exists(r, ino, NULL);
	if (ret <= 0)
		return ret < 0 ? ret : tlog_refuse(r->fs, "a logged extent's inode does not exist",
					     &c->key);
	if (fi->type == BTRFS_FILE_EXTENT_INLINE) {
		end = (start + btrfs_file_extent_ram_bytes(fi) + ss - 1) / ss * ss;
	} else {
		u8 *have = NULL;
		u32 hsize;

		end = start + btrfs_file_extent_num_bytes(fi);
		/* the very same item already there: nothing to do */
		ret = read_item(r, &r->sv->root, &c->key, &have, &hsize);
		if (ret == 0 && hsize == c->size && !memcmp(have, c->data, hsize)) {
			free(have);
			return 0;
		}
		free(have);
		if (ret && ret != -ENOENT)
			return ret;
	}
	ret = data_drop_extents(r->fs, r->sv, ino, start, end);
	if (ret == -EOPNOTSUPP)
		return tlog_refuse(r->fs, "a logged extent overlaps the middle of an inline extent",
				   &c->key);
	if (ret)
		return ret;
	ret = tlog_u64_push(&r->files, ino);
	if (ret)
		return ret;
	if (fi->type == BTRFS_FILE_EXTENT_INLINE)
		return put_item(r, &c->key, c->data, c->size);
	if (!btrfs_file_extent_disk_bytenr(fi) && r->no_holes)
		return 0;
	ret = tree_insert_item(r->t, &r->sv->root, &c->key, c->data, c->size);
	if (ret || !btrfs_file_extent_disk_bytenr(fi))
		return ret;
	{
		u64 disk = btrfs_file_extent_disk_bytenr(fi);
		u64 disk_len = btrfs_file_extent_disk_num_bytes(fi);
		u64 offset = btrfs_file_extent_offset(fi);

		ret = data_queue_data_ref(r->w, disk, disk_len, r->sv->id, ino, start - offset, 1);
		if (ret)
			return ret;
		if (fi->type != BTRFS_FILE_EXTENT_REG)
			return 0;
		if (fi->compression)
			return copy_csums(r, disk, disk + disk_len);
		return copy_csums(r, disk + offset, disk + offset + btrfs_file_extent_num_bytes(fi));
	}
}

/* ---- step 4: counts and sizes ---- */

static int count_links(struct replay *r, u64 ino, u32 *nlink)
{
	struct item_list refs = { 0 };
	size_t i;
	int ret, t;

	*nlink = 0;
	for (t = 0; t < 2; t++) {
		u8 type = t ? BTRFS_INODE_EXTREF_KEY : BTRFS_INODE_REF_KEY;

		ret = collect(&r->fs->cache, &r->sv->root, ino, type, 0, (u64)-1, &refs);
		for (i = 0; ret == 0 && i < refs.n; i++) {
			u32 pos = 0;

			while (pos < refs.v[i].size) {
				u32 l = inode_ref_entry_len(type, refs.v[i].data + pos, refs.v[i].size - pos);

				if (!l) {
					ret = BLOG_CORRUPT(&r->fs->log, "inode %llu: malformed ref",
							   (unsigned long long)ino);
					break;
				}
				pos += l;
				(*nlink)++;
			}
		}
		item_list_free(&refs);
		if (ret)
			return ret;
	}
	return 0;
}

struct inode_fix {
	int set_nlink, set_size, set_nbytes, set_times;
	u32 nlink;
	u64 size, nbytes;
	const struct inode_times *times;
};

static void apply_fix(struct btrfs_inode_item *ii, void *arg)
{
	const struct inode_fix *f = arg;

	if (f->set_nlink)
		btrfs_set_inode_nlink(ii, f->nlink);
	if (f->set_size)
		btrfs_set_inode_size(ii, f->size);
	if (f->set_nbytes)
		btrfs_set_inode_nbytes(ii, f->nbytes);
	if (f->set_times) {
		ii->atime = f->times->atime;
		ii->ctime = f->times->ctime;
		ii->mtime = f->times->mtime;
		ii->otime = f->times->otime;
	}
}

/* Remove every name directory @dir holds (it has no name itself any more). */
static int empty_dir(struct replay *r, u64 dir)
{
	struct item_list idx = { 0 };
	size_t i;
	int ret;

	ret = collect(&r->fs->cache, &r->sv->root, dir, BTRFS_DIR_INDEX_KEY, 0, (u64)-1, &idx);
	for (i = 0; ret == 0 && i < idx.n; i++)
		if (inode_dir_entry_len(idx.v[i].data, idx.v[i].size))
			ret = drop_dir_entry(r, dir, idx.v[i].data, idx.v[i].key.offset);
	item_list_free(&idx);
	if (ret)
		return ret;
	/* names without an index (should not exist) */
	ret = collect(&r->fs->cache, &r->sv->root, dir, BTRFS_DIR_ITEM_KEY, 0, (u64)-1, &idx);
	for (i = 0; ret == 0 && i < idx.n; i++)
		if (inode_dir_entry_len(idx.v[i].data, idx.v[i].size))
			ret = drop_dir_entry(r, dir, idx.v[i].data, (u64)-1);
	item_list_free(&idx);
	return ret;
}

/* Set each inode's link count from its refs; delete those left without a name. */
static int fix_link_counts(struct replay *r)
{
	size_t done = 0;
	int ret = 0;

	while (ret == 0 && done < r->fixup.n) {
		u64 ino = r->fixup.v[done++];
		struct btrfs_inode_item ii;
		struct inode_fix f = { 0 };
		u32 nlink;

		ret = inode_exists(r, ino, &ii);
		if (ret <= 0)
			continue;
		ret = count_links(r, ino, &nlink);
		if (ret)
			break;
		if (nlink) {
			if (nlink != btrfs_inode_nlink(&ii)) {
				f.set_nlink = 1;
				f.nlink = nlink;
				ret = inode_modify(r->fs, r->sv, ino, apply_fix, &f);
			}
			continue;
		}
		if (ino == r->sv->dirid)
			continue; /* the subvolume root has no name of its own here */
		if (S_ISDIR(btrfs_inode_mode(&ii)))
			ret = empty_dir(r, ino); /* its children join the queue */
		if (ret == 0)
			ret = ns_delete_inode(r->fs, r->sv, ino);
	}
	return ret;
}

static int sum_dir_names(struct replay *r, u64 dir, u64 *size)
{
	struct item_list items = { 0 };
	size_t i;
	int ret, t;

	*size = 0;
	for (t = 0; t < 2; t++) {
		ret = collect(&r->fs->cache, &r->sv->root, dir,
			      t ? BTRFS_DIR_INDEX_KEY : BTRFS_DIR_ITEM_KEY, 0, (u64)-1, &items);
		for (i = 0; ret == 0 && i < items.n; i++) {
			u32 pos = 0;

			while (pos < items.v[i].size) {
				u32 l = inode_dir_entry_len(items.v[i].data + pos, items.v[i].size - pos);

				if (!l) {
					ret = -EUCLEAN;
					break;
				}
				*size += btrfs_dir_name_len((const void *)(items.v[i].data + pos));
				pos += l;
			}
		}
		item_list_free(&items);
		if (ret)
			return ret;
	}
	return 0;
}

static int sum_extents(struct replay *r, u64 ino, u64 *nbytes)
{
	struct item_list items = { 0 };
	size_t i;
	int ret;

	*nbytes = 0;
	ret = collect(&r->fs->cache, &r->sv->root, ino, BTRFS_EXTENT_DATA_KEY, 0, (u64)-1, &items);
	for (i = 0; ret == 0 && i < items.n; i++) {
		const struct btrfs_file_extent_item *fi = (const void *)items.v[i].data;

		if (items.v[i].size < BTRFS_FILE_EXTENT_INLINE_DATA_START) {
			ret = -EUCLEAN;
		} else if (fi->type == BTRFS_FILE_EXTENT_INLINE) {
			*nbytes += btrfs_file_extent_ram_bytes(fi);
		} else if (items.v[i].size < sizeof(*fi)) {
			ret = -EUCLEAN;
		} else if (btrfs_file_extent_disk_bytenr(fi)) {
			*nbytes += btrfs_file_extent_num_bytes(fi);
		}
	}
	item_list_free(&items);
	return ret;
}

static int finish_subvol(struct replay *r)
{
	size_t i;
	int ret;

	ret = fix_link_counts(r);
	u64_unique(&r->dirs);
	u64_unique(&r->files);
	for (i = 0; ret == 0 && i < r->dirs.n; i++) {
		struct inode_fix f = { 0 };

		ret = inode_exists(r, r->dirs.v[i], NULL);
		if (ret <= 0)
			continue;
		f.set_size = 1;
		ret = sum_dir_names(r, r->dirs.v[i], &f.size);
		if (ret == 0)
			ret = inode_modify(r->fs, r->sv, r->dirs.v[i], apply_fix, &f);
	}
	for (i = 0; ret == 0 && i < r->files.n; i++) {
		struct inode_fix f = { 0 };

		ret = inode_exists(r, r->files.v[i], NULL);
		if (ret <= 0)
			continue;
		f.set_nbytes = 1;
		ret = sum_extents(r, r->files.v[i], &f.nbytes);
		if (ret == 0)
			ret = inode_modify(r->fs, r->sv, r->files.v[i], apply_fix, &f);
	}
	for (i = 0; ret == 0 && i < r->ntimes; i++) {
		struct inode_fix f = { 0 };

		ret = inode_exists(r, r->times[i].ino, NULL);
		if (ret <= 0)
			continue;
		f.set_times = 1;
		f.times = &r->times[i];
		ret = inode_modify(r->fs, r->sv, r->times[i].ino, apply_fix, &f);
	}
	r->sv->next_ino = 0; /* replayed inodes may be past what was computed */
	return ret;
}

/* ---- the passes over one log tree ---- */

enum pass { PASS_INODES, PASS_DIR_INDEX, PASS_ALL };

static int replay_pass(struct replay *r, enum pass pass)
{
	struct node_cache *cache = &r->fs->cache;
	struct btrfs_key key = { 0, 0, 0 };
	struct tree_path path;
	int ret, ignore = 0;

	tree_path_init(&path);
	ret = tree_search_forward(cache, &r->log, &key, &path);
	while (ret == 0) {
		struct item_copy c;
		const u8 *p;

		path_key(&path, &c.key);
		p = path_item(&path, &c.size);
		c.data = malloc(c.size ? c.size : 1);
		if (!c.data) {
			ret = -ENOMEM;
			break;
		}
		memcpy(c.data, p, c.size);
		ret = 0;
		/*
		 * An inode logged without links (unlinked while open, then
		 * fsynced; or an O_TMPFILE) is skipped with all its items: its
		 * names go through the directories' logged deletions.
		 */
		if (c.key.type == BTRFS_INODE_ITEM_KEY)
			ignore = btrfs_inode_nlink((const struct btrfs_inode_item *)c.data) == 0;
		if (ignore && c.key.objectid != BTRFS_EXTENT_CSUM_OBJECTID)
			c.key.type = 0; /* nothing below matches */
		switch (c.key.type) {
		case BTRFS_INODE_ITEM_KEY:
			if (pass == PASS_INODES)
				ret = replay_inode(r, &c);
			break;
		case BTRFS_DIR_INDEX_KEY:
			if (pass == PASS_DIR_INDEX)
				ret = replay_dir_index(r, &c);
			break;
		case BTRFS_XATTR_ITEM_KEY:
			if (pass == PASS_ALL)
				ret = put_item(r, &c.key, c.data, c.size);
			break;
		case BTRFS_INODE_REF_KEY:
		case BTRFS_INODE_EXTREF_KEY:
			if (pass == PASS_ALL)
				ret = replay_inode_ref(r, &c);
			break;
		case BTRFS_EXTENT_DATA_KEY:
			if (pass == PASS_ALL)
				ret = replay_extent(r, &c);
			break;
		default:
			break;
		}
		free(c.data);
		if (ret)
			break;
		if (pass == PASS_ALL)
			r->items++;
		ret = tree_next_item(cache, &path);
	}
	tree_path_release(cache, &path);
	return ret < 0 ? ret : 0;
}

static void replay_reset(struct replay *r)
{
	free(r->fixup.v);
	free(r->dirs.v);
	free(r->files.v);
	free(r->times);
	memset(&r->fixup, 0, sizeof(r->fixup));
	memset(&r->dirs, 0, sizeof(r->dirs));
	memset(&r->files, 0, sizeof(r->files));
	r->times = NULL;
	r->ntimes = r->times_cap = 0;
}

/* Replay the log tree of one subvolume into it (steps 1-4). */
static int replay_subvol(struct replay *r, const struct log_tree *lt)
{
	struct btrfs_root_item ri;
	int ret, err = 0;

	ret = fs_read_root_item(r->fs, lt->subvol, &ri, NULL);
	if (ret == -ENOENT || (ret == 0 && btrfs_root_refs(&ri) == 0)) {
		blog_warn(&r->fs->log, "tree log of deleted subvolume %llu skipped",
			  (unsigned long long)lt->subvol);
		return 0;
	}
	if (ret)
		return ret;
	r->sv = fs_subvol_mut(r->fs, lt->subvol, &err);
	if (!r->sv)
		return err == -EROFS ? tlog_refuse(r->fs, "a read-only subvolume has a log", NULL) : err;
	r->log = lt->root;
	ret = txn_track_root(&r->w->txn, &r->sv->root);
	if (ret == 0)
		ret = replay_pass(r, PASS_INODES);
	if (ret == 0)
		ret = replay_pass(r, PASS_DIR_INDEX);
	if (ret == 0)
		ret = replay_pass(r, PASS_ALL);
	if (ret == 0)
		ret = finish_subvol(r);
	replay_reset(r);
	return ret;
}

int tlog_replay(struct butter_fs *fs)
{
	struct btrfs_super_block *sb = &fs->vol.super;
	struct tree_root lrt = { 0 };
	struct excluded ex;
	struct replay r;
	struct log_tree *logs = NULL;
	struct fs_write_state *w;
	size_t i, nlogs = 0;
	int ret;

	if (!fs->w || !btrfs_super_log_root(sb))
		return 0;
	memset(&r, 0, sizeof(r));
	memset(&ex, 0, sizeof(ex));
	lrt.objectid = BTRFS_TREE_LOG_OBJECTID;
	lrt.bytenr = btrfs_super_log_root(sb);
	lrt.level = sb->log_root_level;
	if (btrfs_super_incompat_flags(sb) & BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS)
		return tlog_refuse(fs, "mixed block groups", NULL);

	/* step 0: every log block and logged extent, before anything is allocated */
	ret = tlog_walk_tree(fs, &ex, &lrt, 0);
	if (ret == 0)
		ret = tlog_read_log_roots(fs, &lrt, &logs, &nlogs);
	for (i = 0; ret == 0 && i < nlogs; i++) {
		ex.cur_inode = (u64)-1;
		ret = tlog_walk_tree(fs, &ex, &logs[i].root, 1);
	}
	if (ret)
		goto out;

	ret = fs_begin_change(fs, &w);
	if (ret)
		goto out;
	r.fs = fs;
	r.w = w;
	r.t = &w->txn.tt;
	r.no_holes = !!(btrfs_super_incompat_flags(sb) & BTRFS_FEATURE_INCOMPAT_NO_HOLES);
	for (i = 0; ret == 0 && i < nlogs; i++)
		ret = replay_subvol(&r, &logs[i]);
	if (ret == 0)
		ret = tlog_release_unused(fs, &ex);
	if (ret == 0) {
		/* the log is part of the subvolumes now: the same commit forgets it */
		btrfs_set_super_log_root(sb, 0);
		sb->log_root_level = 0;
		w->txn.super_dirty = 1;
		ret = txn_commit(&w->txn);
	}
	ret = fs_end_change(w, ret, 1);
	if (ret == 0)
		blog_info(&fs->log, "replayed the tree log: %llu items in %zu subvolume log(s)",
			  (unsigned long long)r.items, nlogs);
out:
	replay_reset(&r);
	free(logs);
	free(ex.disk.v);
	free(ex.len.v);
	return ret;
}
