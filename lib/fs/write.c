/*
 * write.c — changing files: the write side of a handle (extent state and
 * transaction set up at open), creating inodes and names, hard links,
 * symlinks, appending file data, xattrs, attributes, and commits.
 *
 * Every change runs in two phases:
 *   1. checks that change nothing (the name is free, the inode is a dir...):
 *      failures return an error and leave the transaction untouched;
 *   2. tree changes: a failure here leaves a half-made change in the running
 *      transaction, so the transaction is aborted on the spot and the handle
 *      turns read-only; the last committed state on disk stays intact.
 *
 * What a name costs (btrfs's rules, checked by btrfs check):
 *   INODE_REF (ino, INODE_REF, parent)  {index, name_len, name} (one per link
 *                                        in that parent, packed in one item)
 *   DIR_ITEM  (parent, DIR_ITEM, hash)  {location, transid, 0, name_len, type, name}
 *   DIR_INDEX (parent, DIR_INDEX, index) same payload, one entry
 *   the parent's i_size grows by 2 * name_len.
 * Directory indexes start at 2; directories have nlink 1.
 *
 * Locking: one mutex (w->lock) serialises all changes; the read side does
 * not take it (a read racing a change of the same file may see either).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <uuid/uuid.h>

#include "format/checksum.h"
#include "fs/fs.h"
#include "fs/write.h"


static int load_root(struct butter_fs *fs, u64 objectid, struct tree_root *root)
{
	struct btrfs_root_item item;
	int ret = fs_read_root_item(fs, objectid, &item, NULL);

	if (ret)
		return ret;
	memset(root, 0, sizeof(*root));
	root->objectid = objectid;
	root->bytenr = btrfs_root_bytenr(&item);
	root->generation = btrfs_root_generation(&item);
	root->level = item.level;
	root->bytes_used = btrfs_root_bytes_used(&item);
	return 0;
}

void fs_teardown_write(struct butter_fs *fs)
{
	struct fs_write_state *w = fs->w;

	if (!w)
		return;
	if (w->open_files)
		fs_orphan_free_open(fs);
	if ((w->txn.running || volumes_stats_dirty(&fs->vol)) && !w->txn.aborted) {
		int ret = txn_commit(&w->txn);

		if (ret)
			blog_err(&fs->log, "final commit failed: %s", strerror(-ret));
	}
	fs_tree_log_destroy(w);
	txn_ctx_destroy(&w->txn);
	extent_state_destroy(&w->es);
	fs_open_files_destroy(w);
	pthread_mutex_destroy(&w->lock);
	free(w);
	fs->w = NULL;
}

int fs_setup_write(struct butter_fs *fs)
{
	struct btrfs_super_block *sb = &fs->vol.super;
	u64 compat_ro = btrfs_super_compat_ro_flags(sb);
	struct fs_write_state *w;
	struct tree_node *chunk_root;
	size_t i;
	int ret;

	if (compat_ro & ~(BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE |
			  BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID)) {
		blog_err(&fs->log, "compat_ro features %#llx cannot be written yet: open read-only",
			 (unsigned long long)compat_ro);
		return -EOPNOTSUPP;
	}
	if ((compat_ro & BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE) &&
	    !(compat_ro & BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID)) {
		blog_err(&fs->log, "the free space tree is marked invalid: open read-only");
		return -EOPNOTSUPP;
	}
	for (i = 0; i < fs->vol.ndevs; i++) {
		if (!fs->vol.devs[i]->bdev) {
			blog_err(&fs->log, "a device is missing: open read-only to read degraded");
			return -EROFS;
		}
	}
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	pthread_mutex_init(&w->lock, NULL);
	extent_state_init(&w->es, &fs->vol, &fs->cache);
	ret = node_read(&fs->cache, fs->chunk_tree.bytenr, fs->chunk_tree.generation,
			fs->chunk_tree.level, NULL, &chunk_root);
	if (ret)
		goto fail;
	memcpy(fs->vol.chunk_tree_uuid, node_header(chunk_root)->chunk_tree_uuid, BTRFS_UUID_SIZE);
	node_put(&fs->cache, chunk_root);
	ret = load_root(fs, BTRFS_DEV_TREE_OBJECTID, &w->dev_tree);
	if (ret)
		goto fail;
	if (!fs->has_csum_tree) {
		blog_err(&fs->log, "no csum tree: open read-only");
		ret = -EOPNOTSUPP;
		goto fail;
	}
	fs->extent_tree.bytes_used = 0;
	{
		struct btrfs_root_item item;

		if (fs_read_root_item(fs, BTRFS_EXTENT_TREE_OBJECTID, &item, NULL) == 0)
			fs->extent_tree.bytes_used = btrfs_root_bytes_used(&item);
		if (fs_read_root_item(fs, BTRFS_CSUM_TREE_OBJECTID, &item, NULL) == 0)
			fs->csum_tree.bytes_used = btrfs_root_bytes_used(&item);
	}
	w->es.extent_root = &fs->extent_tree;
	w->es.bg_root = &fs->extent_tree;
	w->es.csum_root = &fs->csum_tree;
	w->es.chunk_root = &fs->chunk_tree;
	w->es.dev_root = &w->dev_tree;
	if (compat_ro & BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE) {
		ret = load_root(fs, BTRFS_FREE_SPACE_TREE_OBJECTID, &w->fst);
		if (ret)
			goto fail;
		w->es.fst_root = &w->fst;
	} else {
		/* a v1 space cache, if any, goes stale: make every kernel ignore it */
		put_le64(&sb->cache_generation, (u64)-1);
	}
	if (load_root(fs, BTRFS_UUID_TREE_OBJECTID, &w->uuid_tree) != 0)
		memset(&w->uuid_tree, 0, sizeof(w->uuid_tree));
	ret = chunk_init_devspace(&w->es, 1);
	if (ret)
		goto fail;
	ret = extent_load(&w->es);
	if (ret)
		goto fail;
	for (i = 0; i < w->es.nbgs; i++) {
		if (w->es.bgs[i]->flags & BTRFS_BLOCK_GROUP_DATA) {
			w->data_profile = w->es.bgs[i]->flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
			break;
		}
	}
	w->txn.vol = &fs->vol;
	w->txn.cache = &fs->cache;
	w->txn.es = &w->es;
	w->txn.log = &fs->log;
	w->txn.root_tree = &fs->root_tree;
	w->txn.chunk_tree = &fs->chunk_tree;
	ret = txn_track_root(&w->txn, &fs->extent_tree);
	if (ret == 0)
		ret = txn_track_root(&w->txn, &w->dev_tree);
	if (ret == 0)
		ret = txn_track_root(&w->txn, &fs->csum_tree);
	if (ret == 0 && w->es.fst_root)
		ret = txn_track_root(&w->txn, &w->fst);
	if (ret == 0)
		ret = fs_open_files_init(w);
	if (ret)
		goto fail;
	fs->w = w;
	ret = fs_qgroup_setup(fs);
	if (ret) {
		fs->w = NULL;
		goto fail;
	}
	return 0;
fail:
	txn_ctx_destroy(&w->txn);
	extent_state_destroy(&w->es);
	fs_open_files_destroy(w);
	pthread_mutex_destroy(&w->lock);
	free(w);
	return ret;
}

/* Start a change: take the lock and make sure a transaction runs. */
/*
 * Bytes free in block groups that serve @type (mixed groups serve data and
 * metadata alike), and the profile bits they use.
 */
static u64 group_free(const struct extent_state *es, u64 type, u64 *profile)
{
	u64 sum = 0;
	size_t i;

	for (i = 0; i < es->nbgs; i++) {
		if (!(es->bgs[i]->flags & type))
			continue;
		sum += es->bgs[i]->free.total;
		if (profile)
			*profile = es->bgs[i]->flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
	}
	return sum;
}

/* Unallocated device bytes usable by a profile (divided by its copies). */
static u64 unallocated(const struct extent_state *es, u64 profile)
{
	u64 raw = 0, copies = 1;
	size_t i;

	for (i = 0; i < es->ndevspace; i++)
		raw += chunk_usable_bytes(es, es->devspace[i].devid);
	if (profile & (BTRFS_BLOCK_GROUP_DUP | BTRFS_BLOCK_GROUP_RAID1 | BTRFS_BLOCK_GROUP_RAID10))
		copies = 2;
	else if (profile & BTRFS_BLOCK_GROUP_RAID1C3)
		copies = 3;
	else if (profile & BTRFS_BLOCK_GROUP_RAID1C4)
		copies = 4;
	return raw / copies;
}

/*
 * Make sure a change can finish once it starts: metadata room (a new
 * metadata chunk when the groups run low) and @data_bytes of data space.
 * Deletions may use the last reserve (they give space back). -ENOSPC
 * before anything changed, never half way through a change.
 */
/*
 * reserve_space() for mixed block groups: data and tree blocks share the
 * groups, so the room a change may need (@data_bytes, then @floor for tree
 * blocks) must be free in them before it starts: mixed chunks are added while
 * less than that plus @low is free and device space is left. A data chunk
 * made later by fs_alloc_data() only adds room.
 */
static int reserve_mixed(struct fs_write_state *w, u64 data_bytes, u64 floor, u64 low)
{
	u64 profile = w->data_profile, free = group_free(&w->es, BTRFS_BLOCK_GROUP_METADATA, &profile);
	u64 need = data_bytes + floor;
	int ret;

	while (free < need + low && free >= META_RESERVE / 4) {
		u64 chunk, size = chunk_max_size(&w->es, 256ULL << 20);

		/* down to 1 MiB: the last of a small device is worth a chunk */
		while (size >= (1ULL << 20) && unallocated(&w->es, profile) < size)
			size /= 2;
		if (size < (1ULL << 20))
			break;
		ret = chunk_create(&w->es, BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA | profile,
				   size, &chunk);
		if (ret == 0)
			ret = chunk_insert_items(&w->es, &w->txn.tt, chunk);
		if (ret == -ENOSPC)
			break;
		if (ret) {
			txn_abort(&w->txn, ret, "allocating a mixed chunk");
			return ret;
		}
		free = group_free(&w->es, BTRFS_BLOCK_GROUP_METADATA, NULL);
	}
	return free < need ? -ENOSPC : 0;
}

static int reserve_space(struct fs_write_state *w, u64 data_bytes, int deleting)
{
	u64 meta_profile = 0, data_profile = w->data_profile, meta_free, need;
	u64 total = btrfs_super_total_bytes(&w->es.vol->super);
	u64 low = total / 32 < META_LOW_WATER ? total / 32 : META_LOW_WATER;
	u64 floor = deleting ? META_RESERVE / 4 : META_RESERVE;
	int ret;

	if (w->es.mixed)
		return reserve_mixed(w, data_bytes, floor, low);
	meta_free = group_free(&w->es, BTRFS_BLOCK_GROUP_METADATA, &meta_profile);
	if (meta_free < low) {
		u64 chunk, size = chunk_max_size(&w->es, 256ULL << 20);

		while (size >= (16ULL << 20) && unallocated(&w->es, meta_profile) < size)
			size /= 2;
		if (size >= (16ULL << 20) && meta_free >= META_RESERVE / 4) {
			ret = chunk_create(&w->es, BTRFS_BLOCK_GROUP_METADATA | meta_profile, size,
					   &chunk);
			if (ret == 0)
				ret = chunk_insert_items(&w->es, &w->txn.tt, chunk);
			if (ret && ret != -ENOSPC) {
				txn_abort(&w->txn, ret, "allocating a metadata chunk");
				return ret;
			}
			meta_free = group_free(&w->es, BTRFS_BLOCK_GROUP_METADATA, NULL);
		}
	}
	if (meta_free < floor)
		return -ENOSPC;
	if (data_bytes) {
		need = data_bytes;
		if (group_free(&w->es, BTRFS_BLOCK_GROUP_DATA, &data_profile) +
			    unallocated(&w->es, data_profile) <
		    need)
			return -ENOSPC;
	}
	return 0;
}

int begin_change_rsv(struct butter_fs *fs, struct fs_write_state **wp, u64 data_bytes,
		     int deleting)
{
	struct fs_write_state *w = fs->w;
	int ret;

	if (!w)
		return -EROFS;
	pthread_mutex_lock(&w->lock);
	ret = w->readonly ? -EROFS : txn_begin(&w->txn);
	if (ret == 0)
		ret = reserve_space(w, data_bytes, deleting);
	if (ret == -ENOSPC && (w->es.nrefs || w->es.pinned.n)) {
		/*
		 * Space freed in this transaction (queued reference drops, pinned
		 * extents) comes back only after its commit: commit and ask again,
		 * as the kernel does before it answers ENOSPC. The commit holds
		 * the state before this change, after every change before it.
		 */
		if (w->space_commit_fn) {
			pthread_mutex_unlock(&w->lock);
			w->space_commit_fn(w->space_commit_arg);
			pthread_mutex_lock(&w->lock);
		}
		ret = txn_commit(&w->txn);
		if (ret == 0)
			ret = txn_begin(&w->txn);
		if (ret == 0)
			ret = reserve_space(w, data_bytes, deleting);
	}
	if (ret) {
		pthread_mutex_unlock(&w->lock);
		return ret;
	}
	*wp = w;
	return 0;
}

int begin_change(struct butter_fs *fs, struct fs_write_state **wp)
{
	return begin_change_rsv(fs, wp, 0, 0);
}

/* End a change; @failed_in_trees: the error came from phase 2 (abort). */
int end_change(struct fs_write_state *w, int ret, int failed_in_trees)
{
	if (ret < 0 && failed_in_trees)
		txn_abort(&w->txn, ret, "a change");
	else if (ret >= 0 && w->txn.tt.ndirty * w->txn.cache->nodesize > DIRTY_COMMIT_BYTES) {
		int r = txn_commit(&w->txn);

		if (r)
			ret = r;
	}
	pthread_mutex_unlock(&w->lock);
	return ret;
}

int fs_live_data_usage(struct butter_fs *fs, u64 *total, u64 *used)
{
	struct fs_write_state *w = fs->w;
	size_t i;

	if (!w)
		return -ENOENT;
	*total = *used = 0;
	pthread_mutex_lock(&w->lock);
	for (i = 0; i < w->es.nbgs; i++) {
		const struct block_group *bg = w->es.bgs[i];

		if (!(bg->flags & BTRFS_BLOCK_GROUP_DATA))
			continue;
		*total += bg->length;
		*used += bg->length - (bg->free.total < bg->length ? bg->free.total : bg->length);
	}
	pthread_mutex_unlock(&w->lock);
	return 0;
}

int butter_sync(struct butter_fs *fs)
{
	struct fs_write_state *w = fs->w;
	int ret;

	if (!w)
		return 0;
	pthread_mutex_lock(&w->lock);
	ret = txn_commit(&w->txn);
	pthread_mutex_unlock(&w->lock);
	return ret;
}

void butter_set_space_commit_hook(struct butter_fs *fs, void (*fn)(void *arg), void *arg)
{
	if (fs->w) {
		fs->w->space_commit_fn = fn;
		fs->w->space_commit_arg = arg;
	}
}

int butter_set_readonly(struct butter_fs *fs, int readonly)
{
	struct fs_write_state *w = fs->w;
	int ret = 0;

	if (!w)
		return readonly ? 0 : -EROFS;
	pthread_mutex_lock(&w->lock);
	if (readonly && !w->readonly) {
		ret = txn_commit(&w->txn);
		if (ret == 0)
			w->readonly = true;
	} else if (!readonly && w->txn.aborted) {
		ret = -EROFS; /* a failed commit: nothing more is written */
	} else if (!readonly) {
		w->readonly = false;
	}
	pthread_mutex_unlock(&w->lock);
	return ret;
}

/*
 * The time of a change: the coarse real-time clock (the tick, not the
 * nanosecond), the clock the kernel stamps inodes with (current_time()). One
 * clock for every stamp: through the mount the kernel sets mtimes itself
 * (writeback cache), and an atime from a finer clock would be later than an
 * mtime set after it, so relatime would skip the next read's atime.
 */
void now_ts(struct btrfs_timespec *t)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME_COARSE, &ts);
	btrfs_set_timespec_sec(t, (u64)ts.tv_sec);
	btrfs_set_timespec_nsec(t, (u32)ts.tv_nsec);
}

/* Insert @data as a new item, or append it to the existing item with @key. */
int insert_or_extend(struct tree_trans *t, struct tree_root *root,
			    const struct btrfs_key *key, const void *data, u32 size)
{
	struct tree_path path;
	u32 isize;
	u8 *p;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(t, root, key, &path, (int)(size + sizeof(struct btrfs_item)), 1);
	if (ret == 0) {
		path_item(&path, &isize);
		ret = tree_extend_item(t, &path, size);
		if (ret == 0) {
			p = path_item_mut(&path, &isize);
			memcpy(p + isize - size, data, size);
		}
	} else if (ret == 1) {
		ret = tree_insert_empty_item(t, root, &path, key, size);
		if (ret == 0) {
			p = path_item_mut(&path, &isize);
			memcpy(p, data, size);
		}
	}
	tree_path_release(t->cache, &path);
	return ret;
}

/*
 * Apply @fn to the inode item of @ino (COW) and stamp the running transid;
 * @bump_sequence: move the inode's sequence too (every change but an atime).
 */
static int change_inode_item(struct butter_fs *fs, struct subvol *sv, u64 ino,
			     void (*fn)(struct btrfs_inode_item *ii, void *arg), void *arg,
			     int bump_sequence)
{
	struct fs_write_state *w = fs->w;
	struct btrfs_key key = { ino, BTRFS_INODE_ITEM_KEY, 0 };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(&w->txn.tt, &sv->root, &key, &path, 0, 1);
	if (ret == 0) {
		u32 size;
		struct btrfs_inode_item *ii = (void *)path_item_mut(&path, &size);

		if (size < sizeof(*ii)) {
			ret = BLOG_CORRUPT(&fs->log, "inode %llu: item of %u bytes",
					   (unsigned long long)ino, size);
		} else {
			fn(ii, arg);
			btrfs_set_inode_transid(ii, w->txn.tt.transid);
			if (bump_sequence)
				btrfs_set_inode_sequence(ii, btrfs_inode_sequence(ii) + 1);
		}
	} else if (ret == 1) {
		ret = -ENOENT;
	}
	tree_path_release(&fs->cache, &path);
	if (ret == 0)
		ret = txn_track_root(&w->txn, &sv->root);
	return ret;
}

/* Apply @fn to the inode item of @ino (COW). */
int modify_inode(struct butter_fs *fs, struct subvol *sv, u64 ino,
			void (*fn)(struct btrfs_inode_item *ii, void *arg), void *arg)
{
	return change_inode_item(fs, sv, ino, fn, arg, 1);
}

/* The same, leaving the inode's sequence where it is (atime updates). */
int modify_inode_keep_sequence(struct butter_fs *fs, struct subvol *sv, u64 ino,
			       void (*fn)(struct btrfs_inode_item *ii, void *arg), void *arg)
{
	return change_inode_item(fs, sv, ino, fn, arg, 0);
}

int next_ino(struct butter_fs *fs, struct subvol *sv, u64 *out)
{
	if (!sv->next_ino) {
		struct btrfs_key key = { BTRFS_LAST_FREE_OBJECTID, 0xff, (u64)-1 };
		int ret = tree_find_key(&fs->cache, &sv->root, &key, 1, &key);

		if (ret < 0)
			return ret;
		sv->next_ino = BTRFS_FIRST_FREE_OBJECTID + 1;
		if (ret == 0 && key.objectid + 1 > sv->next_ino)
			sv->next_ino = key.objectid + 1;
	}
	if (sv->next_ino > BTRFS_LAST_FREE_OBJECTID)
		return -ENOSPC;
	*out = sv->next_ino++;
	return 0;
}

int next_dir_index(struct butter_fs *fs, struct subvol *sv, u64 dir, u64 *out)
{
	struct btrfs_key key = { dir, BTRFS_DIR_INDEX_KEY, (u64)-1 };
	int ret = tree_find_key(&fs->cache, &sv->root, &key, 1, &key);

	if (ret < 0)
		return ret;
	*out = 2;
	if (ret == 0 && key.objectid == dir && key.type == BTRFS_DIR_INDEX_KEY)
		*out = key.offset + 1;
	return 0;
}

u8 mode_to_ft(u32 mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG: return BTRFS_FT_REG_FILE;
	case S_IFDIR: return BTRFS_FT_DIR;
	case S_IFCHR: return BTRFS_FT_CHRDEV;
	case S_IFBLK: return BTRFS_FT_BLKDEV;
	case S_IFIFO: return BTRFS_FT_FIFO;
	case S_IFSOCK: return BTRFS_FT_SOCK;
	case S_IFLNK: return BTRFS_FT_SYMLINK;
	default: return BTRFS_FT_UNKNOWN;
	}
}

void touch_ctime(struct btrfs_inode_item *ii, void *arg)
{
	(void)arg;
	now_ts(&ii->ctime);
}

void touch_dir(struct btrfs_inode_item *ii, void *arg)
{
	struct dir_update *u = arg;

	btrfs_set_inode_size(ii, (u64)((s64)btrfs_inode_size(ii) + u->size_delta));
	now_ts(&ii->mtime);
	ii->ctime = ii->mtime;
}

/* Phase-1 checks for a new name in @dir; returns the canonical subvolume. */
int check_new_name(struct butter_fs *fs, butter_ino_t dir, const char *name,
			  size_t namelen, struct subvol **svp)
{
	struct btrfs_inode_item ii;
	butter_ino_t existing;
	int ret, err = 0;

	if (namelen == 0 || memchr(name, '/', namelen) || memchr(name, '\0', namelen))
		return -EINVAL;
	if (namelen > BTRFS_NAME_LEN)
		return -ENAMETOOLONG;
	if ((namelen == 1 && name[0] == '.') || (namelen == 2 && !memcmp(name, "..", 2)))
		return -EEXIST;
	if (dir.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID)
		return -EPERM;
	ret = fs_read_inode(fs, dir, &ii);
	if (ret)
		return ret;
	if (!S_ISDIR(btrfs_inode_mode(&ii)))
		return -ENOTDIR;
	if (btrfs_inode_nlink(&ii) == 0)
		return -ENOENT; /* a removed directory still open (orphan.c) */
	ret = butter_lookup(fs, dir, name, namelen, &existing);
	if (ret == 0)
		return -EEXIST;
	if (ret != -ENOENT)
		return ret;
	*svp = fs_subvol_mut(fs, dir.subvol, &err);
	return *svp ? 0 : err;
}

/* Add the name @name in @dir for @ino (phase 2). */
/*
 * The directory side of a name: DIR_ITEM and DIR_INDEX entries for
 * @location in @dir, and the parent's size and times. Returns the index used.
 */
static int add_dir_entries(struct butter_fs *fs, struct subvol *sv, u64 dir, const char *name,
			   size_t namelen, const struct btrfs_key *location, u8 ft, u64 index)
{
	struct fs_write_state *w = fs->w;
	struct tree_trans *t = &w->txn.tt;
	struct dir_update u = { 2 * (s64)namelen };
	u8 buf[sizeof(struct btrfs_dir_item) + BTRFS_NAME_LEN];
	struct btrfs_dir_item *di = (void *)buf;
	struct btrfs_key key;
	int ret;

	memset(buf, 0, sizeof(*di));
	btrfs_cpu_to_disk_key(&di->location, location);
	btrfs_set_dir_transid(di, t->transid);
	btrfs_set_dir_data_len(di, 0);
	btrfs_set_dir_name_len(di, (u16)namelen);
	di->type = ft;
	memcpy(buf + sizeof(*di), name, namelen);
	key.objectid = dir;
	key.type = BTRFS_DIR_ITEM_KEY;
	key.offset = btrfs_name_hash(name, namelen);
	ret = insert_or_extend(t, &sv->root, &key, buf, (u32)(sizeof(*di) + namelen));
	if (ret)
		return ret;
	key.type = BTRFS_DIR_INDEX_KEY;
	key.offset = index;
	ret = tree_insert_item(t, &sv->root, &key, buf, (u32)(sizeof(*di) + namelen));
	if (ret)
		return ret;
	return modify_inode(fs, sv, dir, touch_dir, &u);
}

int add_name(struct butter_fs *fs, struct subvol *sv, u64 dir, const char *name,
	     size_t namelen, u64 ino, u32 mode)
{
	struct fs_write_state *w = fs->w;
	struct tree_trans *t = &w->txn.tt;
	struct btrfs_key key, loc = { ino, BTRFS_INODE_ITEM_KEY, 0 };
	u8 ref[sizeof(struct btrfs_inode_ref) + BTRFS_NAME_LEN];
	u64 index;
	int ret;

	ret = next_dir_index(fs, sv, dir, &index);
	if (ret)
		return ret;
	btrfs_set_inode_ref_index((struct btrfs_inode_ref *)ref, index);
	btrfs_set_inode_ref_name_len((struct btrfs_inode_ref *)ref, (u16)namelen);
	memcpy(ref + sizeof(struct btrfs_inode_ref), name, namelen);
	key.objectid = ino;
	key.type = BTRFS_INODE_REF_KEY;
	key.offset = dir;
	ret = tree_lookup_item(&fs->cache, &sv->root, &key, NULL, 0);
	if (ret >= 0 && (u64)ret + sizeof(struct btrfs_inode_ref) + namelen >
				tree_max_item_size(&fs->cache) / 2 &&
	    (btrfs_super_incompat_flags(&fs->vol.super) & BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF)) {
		/* the ref item of this parent is full: an extended ref holds the name */
		u8 ext[sizeof(struct btrfs_inode_extref) + BTRFS_NAME_LEN];
		struct btrfs_inode_extref *er = (void *)ext;

		btrfs_set_inode_extref_parent(er, dir);
		btrfs_set_inode_extref_index(er, index);
		btrfs_set_inode_extref_name_len(er, (u16)namelen);
		memcpy(ext + sizeof(*er), name, namelen);
		key.type = BTRFS_INODE_EXTREF_KEY;
		key.offset = btrfs_extref_hash(dir, name, namelen);
		ret = insert_or_extend(t, &sv->root, &key, ext, (u32)(sizeof(*er) + namelen));
	} else if (ret >= 0 || ret == -ENOENT) {
		ret = insert_or_extend(t, &sv->root, &key, ref,
				       (u32)(sizeof(struct btrfs_inode_ref) + namelen));
	}
	if (ret)
		return ret;
	return add_dir_entries(fs, sv, dir, name, namelen, &loc, mode_to_ft(mode), index);
}

/*
 * Insert @ii as the inode item of directory @objectid in @root, and the ".."
 * INODE_REF that makes it its own parent (the top directory of a tree).
 */
int fs_insert_top_dir(struct tree_trans *t, struct tree_root *root, u64 objectid,
		      const struct btrfs_inode_item *ii)
{
	struct btrfs_key key = { objectid, BTRFS_INODE_ITEM_KEY, 0 };
	u8 ref[sizeof(struct btrfs_inode_ref) + 2];
	int ret;

	ret = tree_insert_item(t, root, &key, ii, sizeof(*ii));
	if (ret)
		return ret;
	memset(ref, 0, sizeof(ref));
	btrfs_set_inode_ref_name_len((struct btrfs_inode_ref *)ref, 2);
	memcpy(ref + sizeof(struct btrfs_inode_ref), "..", 2);
	key.type = BTRFS_INODE_REF_KEY;
	key.offset = objectid;
	return tree_insert_item(t, root, &key, ref, sizeof(ref));
}

/*
 * The root directory (inode 256, its own parent) of a new subvolume tree,
 * made in @t. @nbytes goes into the inode (mkfs.btrfs uses the node size).
 * Used by subvolume creation and by mkfs.
 */
int fs_make_root_dir(struct tree_trans *t, struct tree_root *root, u64 nbytes)
{
	struct btrfs_inode_item ii;

	memset(&ii, 0, sizeof(ii));
	btrfs_set_inode_generation(&ii, t->transid);
	btrfs_set_inode_transid(&ii, t->transid);
	btrfs_set_inode_nbytes(&ii, nbytes);
	btrfs_set_inode_nlink(&ii, 1);
	btrfs_set_inode_mode(&ii, S_IFDIR | 0755);
	now_ts(&ii.atime);
	ii.ctime = ii.mtime = ii.otime = ii.atime;
	return fs_insert_top_dir(t, root, BTRFS_FIRST_FREE_OBJECTID, &ii);
}

int fs_link_subvol(struct butter_fs *fs, struct subvol *parent, u64 dir, const char *name,
		   size_t namelen, u64 id, u64 index)
{
	struct tree_trans *t = &fs->w->txn.tt;
	u8 ref[sizeof(struct btrfs_root_ref) + BTRFS_NAME_LEN];
	struct btrfs_root_ref *rr = (void *)ref;
	u32 size = (u32)(sizeof(*rr) + namelen);
	struct btrfs_key key = { parent->id, BTRFS_ROOT_REF_KEY, id };
	struct btrfs_key loc = { id, BTRFS_ROOT_ITEM_KEY, (u64)-1 };
	int ret;

	memset(ref, 0, sizeof(ref));
	btrfs_set_root_ref_dirid(rr, dir);
	btrfs_set_root_ref_sequence(rr, index);
	btrfs_set_root_ref_name_len(rr, (u16)namelen);
	memcpy(ref + sizeof(*rr), name, namelen);
	ret = tree_insert_item(t, &fs->root_tree, &key, ref, size);
	if (ret == 0) {
		key.objectid = id;
		key.type = BTRFS_ROOT_BACKREF_KEY;
		key.offset = parent->id;
		ret = tree_insert_item(t, &fs->root_tree, &key, ref, size);
	}
	if (ret == 0)
		ret = add_dir_entries(fs, parent, dir, name, namelen, &loc, BTRFS_FT_DIR, index);
	return ret;
}

/*
 * The next free subvolume id: the largest root item id + 1, at least 256, and
 * above every id this handle handed out before.
 */
int fs_next_subvol_id(struct butter_fs *fs, u64 *id)
{
	struct btrfs_key key = { BTRFS_LAST_FREE_OBJECTID, 0xff, (u64)-1 };
	int ret = tree_find_key(&fs->cache, &fs->root_tree, &key, 1, &key);

	if (ret < 0)
		return ret;
	*id = BTRFS_FIRST_FREE_OBJECTID;
	if (ret == 0 && key.objectid >= BTRFS_FIRST_FREE_OBJECTID)
		*id = key.objectid + 1;
	if (*id <= fs->last_subvol_id)
		*id = fs->last_subvol_id + 1; /* the newest was deleted: not its id again */
	if (*id > BTRFS_LAST_FREE_OBJECTID)
		return -ENOSPC;
	fs->last_subvol_id = *id;
	return 0;
}

/*
 * Phase-1 checks for a new subvolume or snapshot named @name in @dir: the
 * name is free (its subvolume in *@parent); the new tree's id and the
 * directory index of its name.
 */
int check_new_subvol(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		     struct subvol **parent, u64 *id, u64 *index)
{
	int ret = check_new_name(fs, dir, name, namelen, parent);

	if (ret == 0)
		ret = fs_next_subvol_id(fs, id);
	if (ret == 0)
		ret = next_dir_index(fs, *parent, dir.ino, index);
	return ret;
}

/* Add @sv to the handle's subvolume records. */
int fs_add_subvol_record(struct butter_fs *fs, struct subvol *sv)
{
	struct subvol **arr;

	pthread_mutex_lock(&fs->subvol_lock);
	arr = realloc(fs->subvols, (fs->nsubvols + 1) * sizeof(*arr));
	if (arr) {
		fs->subvols = arr;
		fs->subvols[fs->nsubvols++] = sv;
	}
	pthread_mutex_unlock(&fs->subvol_lock);
	return arr ? 0 : -ENOMEM;
}

int butter_subvol_create(struct butter_fs *fs, butter_ino_t dir, const char *name,
			 size_t namelen, uint64_t *out_id)
{
	struct fs_write_state *w;
	struct subvol *parent, *sv;
	struct btrfs_root_item ri;
	struct btrfs_key key;
	u64 id, index;
	int ret;

	ret = begin_change(fs, &w);
	if (ret)
		return ret;
	ret = check_new_subvol(fs, dir, name, namelen, &parent, &id, &index);
	if (ret)
		return end_change(w, ret, 0);
	sv = calloc(1, sizeof(*sv));
	if (!sv)
		return end_change(w, -ENOMEM, 0);
	sv->id = id;
	sv->dirid = BTRFS_FIRST_FREE_OBJECTID;
	ret = tree_create_root(&w->txn.tt, id, &sv->root);
	if (ret == 0)
		ret = fs_make_root_dir(&w->txn.tt, &sv->root, 0);
	if (ret == 0)
		ret = txn_track_root(&w->txn, &sv->root);
	if (ret) {
		free(sv);
		return end_change(w, ret, 1);
	}
	memset(&ri, 0, sizeof(ri));
	btrfs_set_inode_generation(&ri.inode, 1);
	btrfs_set_inode_size(&ri.inode, 3);
	btrfs_set_inode_nlink(&ri.inode, 1);
	btrfs_set_inode_nbytes(&ri.inode, fs->vol.nodesize);
	btrfs_set_inode_mode(&ri.inode, S_IFDIR | 0755);
	btrfs_set_inode_flags(&ri.inode, BTRFS_INODE_ROOT_ITEM_INIT);
	btrfs_set_root_generation(&ri, w->txn.tt.transid);
	btrfs_set_root_generation_v2(&ri, w->txn.tt.transid);
	btrfs_set_root_dirid(&ri, BTRFS_FIRST_FREE_OBJECTID);
	btrfs_set_root_bytenr(&ri, sv->root.bytenr);
	btrfs_set_root_bytes_used(&ri, sv->root.bytes_used);
	btrfs_set_root_refs(&ri, 1);
	ri.level = sv->root.level;
	uuid_generate(ri.uuid);
	put_le64(&ri.ctransid, w->txn.tt.transid);
	put_le64(&ri.otransid, w->txn.tt.transid);
	now_ts(&ri.ctime);
	ri.otime = ri.ctime;
	key.objectid = id;
	key.type = BTRFS_ROOT_ITEM_KEY;
	key.offset = 0;
	ret = tree_insert_item(&w->txn.tt, &fs->root_tree, &key, &ri, sizeof(ri));
	if (ret == 0)
		ret = fs_link_subvol(fs, parent, dir.ino, name, namelen, id, index);
	if (ret == 0)
		ret = fs_uuid_tree_add(fs, ri.uuid, BTRFS_UUID_KEY_SUBVOL, id);
	if (ret == 0)
		ret = fs_qgroup_create(fs, id, 0);
	if (ret == 0)
		ret = fs_add_subvol_record(fs, sv);
	if (ret == 0) {
		if (out_id)
			*out_id = id;
	} else {
		txn_ctx_forget_root(&w->txn, &sv->root);
		free(sv);
	}
	return end_change(w, ret, 1);
}

int create_inode(struct butter_fs *fs, struct subvol *sv, const struct butter_new_inode *a,
			u64 size, u64 *ino)
{
	struct fs_write_state *w = fs->w;
	struct btrfs_inode_item ii;
	struct btrfs_key key;
	int ret;

	ret = next_ino(fs, sv, ino);
	if (ret)
		return ret;
	memset(&ii, 0, sizeof(ii));
	btrfs_set_inode_generation(&ii, w->txn.tt.transid);
	btrfs_set_inode_transid(&ii, w->txn.tt.transid);
	btrfs_set_inode_size(&ii, size);
	if (S_ISLNK(a->mode))
		btrfs_set_inode_nbytes(&ii, size); /* the target is an inline extent */
	btrfs_set_inode_nlink(&ii, 1);
	btrfs_set_inode_uid(&ii, a->uid);
	btrfs_set_inode_gid(&ii, a->gid);
	btrfs_set_inode_mode(&ii, a->mode);
	btrfs_set_inode_rdev(&ii, fs_rdev_to_disk(a->rdev));
	now_ts(&ii.atime);
	ii.ctime = ii.mtime = ii.otime = ii.atime;
	key.objectid = *ino;
	key.type = BTRFS_INODE_ITEM_KEY;
	key.offset = 0;
	ret = tree_insert_item(&w->txn.tt, &sv->root, &key, &ii, sizeof(ii));
	if (ret == 0)
		ret = txn_track_root(&w->txn, &sv->root);
	return ret;
}

/*
 * Create an empty inode (create_inode) and give it the ACLs fs_acl_inherit() chose
 * (@acls: an access and, for a directory, a default ACL, either NULL for none).
 * Frees @acls whatever happens.
 */
static int create_inode_with_acls(struct butter_fs *fs, struct subvol *sv,
				  const struct butter_new_inode *a, struct fs_acl_set *acls,
				  u64 *ino)
{
	int ret = create_inode(fs, sv, a, 0, ino);

	if (ret == 0 && acls->access)
		ret = fs_set_xattr_locked(fs, sv, *ino, "system.posix_acl_access", acls->access,
					  acls->len);
	if (ret == 0 && acls->dflt)
		ret = fs_set_xattr_locked(fs, sv, *ino, "system.posix_acl_default", acls->dflt,
					  acls->len);
	fs_acl_set_free(acls);
	return ret;
}

int butter_create(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		  const struct butter_new_inode *attr, butter_ino_t *out)
{
	struct butter_new_inode a = *attr;
	struct fs_acl_set acls = { NULL, NULL, 0 };
	struct fs_write_state *w;
	struct subvol *sv;
	u64 ino;
	int ret;

	switch (attr->mode & S_IFMT) {
	case S_IFREG: case S_IFDIR: case S_IFCHR: case S_IFBLK: case S_IFIFO: case S_IFSOCK:
		break;
	default:
		return -EINVAL;
	}
	ret = begin_change(fs, &w);
	if (ret)
		return ret;
	ret = check_new_name(fs, dir, name, namelen, &sv);
	if (ret == 0 && (attr->flags & BUTTER_NEW_INHERIT_ACL))
		ret = fs_acl_inherit(fs, dir, &a.mode, attr->umask, &acls);
	if (ret)
		return end_change(w, ret, 0);
	ret = create_inode_with_acls(fs, sv, &a, &acls, &ino);
	if (ret == 0)
		ret = add_name(fs, sv, dir.ino, name, namelen, ino, a.mode);
	if (ret == 0 && out) {
		out->subvol = sv->id;
		out->ino = ino;
	}
	return end_change(w, ret, 1);
}

int butter_create_tmpfile(struct butter_fs *fs, butter_ino_t dir,
			  const struct butter_new_inode *attr, butter_ino_t *out)
{
	struct butter_new_inode a = *attr;
	struct fs_acl_set acls = { NULL, NULL, 0 };
	struct btrfs_inode_item dii;
	struct fs_write_state *w;
	struct subvol *sv = NULL;
	u64 ino;
	int ret, err = 0;

	if ((attr->mode & S_IFMT) != S_IFREG)
		return -EINVAL;
	ret = begin_change(fs, &w);
	if (ret)
		return ret;
	ret = dir.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID ? -EPERM : fs_read_inode(fs, dir, &dii);
	if (ret == 0 && !S_ISDIR(btrfs_inode_mode(&dii)))
		ret = -ENOTDIR;
	if (ret == 0 && btrfs_inode_nlink(&dii) == 0)
		ret = -ENOENT;
	if (ret == 0 && !(sv = fs_subvol_mut(fs, dir.subvol, &err)))
		ret = err;
	if (ret == 0 && (attr->flags & BUTTER_NEW_INHERIT_ACL))
		ret = fs_acl_inherit(fs, dir, &a.mode, attr->umask, &acls);
	if (ret)
		return end_change(w, ret, 0);
	ret = create_inode_with_acls(fs, sv, &a, &acls, &ino);
	if (ret == 0)
		ret = fs_orphan_tmpfile(fs, sv, ino);
	if (ret == 0 && out) {
		out->subvol = sv->id;
		out->ino = ino;
	}
	return end_change(w, ret, 1);
}

/* Insert an inline extent holding @len bytes at file offset 0. */
int insert_inline(struct butter_fs *fs, struct subvol *sv, u64 ino, const void *data,
			 u32 len)
{
	struct fs_write_state *w = fs->w;
	struct btrfs_key key = { ino, BTRFS_EXTENT_DATA_KEY, 0 };
	u32 size = (u32)BTRFS_FILE_EXTENT_INLINE_DATA_START + len;
	u8 *buf = calloc(1, size);
	struct btrfs_file_extent_item *fi = (void *)buf;
	int ret;

	if (!buf)
		return -ENOMEM;
	btrfs_set_file_extent_generation(fi, w->txn.tt.transid);
	btrfs_set_file_extent_ram_bytes(fi, len);
	fi->type = BTRFS_FILE_EXTENT_INLINE;
	memcpy(buf + BTRFS_FILE_EXTENT_INLINE_DATA_START, data, len);
	ret = tree_insert_item(&w->txn.tt, &sv->root, &key, buf, size);
	free(buf);
	return ret;
}

int butter_symlink(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		   const char *target, uint32_t uid, uint32_t gid, butter_ino_t *out)
{
	struct butter_new_inode a = { .mode = S_IFLNK | 0777, .uid = uid, .gid = gid };
	struct fs_write_state *w;
	size_t tlen = strlen(target);
	struct subvol *sv;
	u64 ino;
	int ret;

	if (tlen == 0)
		return -ENOENT;
	if (tlen >= 4096 ||
	    tlen > tree_max_item_size(&fs->cache) - BTRFS_FILE_EXTENT_INLINE_DATA_START)
		return -ENAMETOOLONG; /* as btrfs: the target is one inline extent */
	ret = begin_change(fs, &w);
	if (ret)
		return ret;
	ret = check_new_name(fs, dir, name, namelen, &sv);
	if (ret)
		return end_change(w, ret, 0);
	ret = create_inode(fs, sv, &a, tlen, &ino);
	if (ret == 0)
		ret = insert_inline(fs, sv, ino, target, (u32)tlen);
	if (ret == 0)
		ret = add_name(fs, sv, dir.ino, name, namelen, ino, a.mode);
	if (ret == 0 && out) {
		out->subvol = sv->id;
		out->ino = ino;
	}
	return end_change(w, ret, 1);
}

static void inc_nlink(struct btrfs_inode_item *ii, void *arg)
{
	(void)arg;
	btrfs_set_inode_nlink(ii, btrfs_inode_nlink(ii) + 1);
	now_ts(&ii->ctime);
}

int butter_link(struct butter_fs *fs, butter_ino_t ino, butter_ino_t dir, const char *name,
		size_t namelen)
{
	struct btrfs_inode_item ii;
	struct fs_write_state *w;
	struct subvol *sv;
	int ret;

	if (ino.subvol != dir.subvol)
		return -EXDEV;
	ret = begin_change(fs, &w);
	if (ret)
		return ret;
	ret = fs_read_inode(fs, ino, &ii);
	if (ret == 0 && S_ISDIR(btrfs_inode_mode(&ii)))
		ret = -EPERM;
	if (ret == 0 && btrfs_inode_nlink(&ii) >= 65535)
		ret = -EMLINK;
	/* an open orphan (orphan.c) gets no new name, unless it was made nameless */
	if (ret == 0 && btrfs_inode_nlink(&ii) == 0 && !fs_orphan_linkable(fs, ino))
		ret = -ENOENT;
	if (ret == 0)
		ret = check_new_name(fs, dir, name, namelen, &sv);
	if (ret)
		return end_change(w, ret, 0);
	ret = btrfs_inode_nlink(&ii) == 0 ? fs_orphan_relink(fs, sv, ino.ino) : 0;
	if (ret == 0)
		ret = modify_inode(fs, sv, ino.ino, inc_nlink, NULL);
	if (ret == 0)
		ret = add_name(fs, sv, dir.ino, name, namelen, ino.ino, btrfs_inode_mode(&ii));
	return end_change(w, ret, 1);
}

struct xattr_ctx {
	const char *name;
	size_t len;
	u8 *keep;       /* entries other than @name */
	u32 keep_len;
	int found;
};

static int keep_other(void *arg, const struct btrfs_dir_item *di, const char *name,
		      const u8 *value)
{
	struct xattr_ctx *c = arg;
	u32 total = (u32)sizeof(*di) + btrfs_dir_name_len(di) + btrfs_dir_data_len(di);

	(void)value;
	if (btrfs_dir_name_len(di) == c->len && memcmp(name, c->name, c->len) == 0) {
		c->found = 1;
		return 0;
	}
	memcpy(c->keep + c->keep_len, di, total);
	c->keep_len += total;
	return 0;
}

int fs_set_xattr_locked(struct butter_fs *fs, struct subvol *sv, u64 ino, const char *name,
			const void *value, size_t size)
{
	struct fs_write_state *w = fs->w;
	size_t nlen = strlen(name);
	struct btrfs_key key = { ino, BTRFS_XATTR_ITEM_KEY, btrfs_name_hash(name, nlen) };
	struct btrfs_key zero = { 0, 0, 0 };
	struct xattr_ctx c = { name, nlen, NULL, 0, 0 };
	u32 entry = (u32)(sizeof(struct btrfs_dir_item) + nlen + size);
	struct tree_path path;
	u8 *buf;
	int ret;

	/* take out an existing entry of that name, keeping colliding others */
	tree_path_init(&path);
	ret = tree_search_slot(&w->txn.tt, &sv->root, &key, &path, 0, 1);
	if (ret == 0) {
		u32 isize;
		const u8 *item = path_item(&path, &isize);

		c.keep = malloc(isize);
		if (!c.keep)
			ret = -ENOMEM;
		else
			ret = fs_walk_dir_items(fs, item, isize, keep_other, &c);
		if (ret == 0)
			ret = tree_del_items(&w->txn.tt, &sv->root, &path, 1);
	} else if (ret == 1) {
		ret = 0;
	}
	tree_path_release(&fs->cache, &path);
	if (ret == 0 && c.keep_len) {
		tree_path_init(&path);
		ret = tree_insert_item(&w->txn.tt, &sv->root, &key, c.keep, c.keep_len);
	}
	free(c.keep);
	if (ret || !value)
		return ret;
	buf = calloc(1, entry);
	if (!buf)
		return -ENOMEM;
	{
		struct btrfs_dir_item *di = (void *)buf;

		btrfs_cpu_to_disk_key(&di->location, &zero);
		btrfs_set_dir_transid(di, w->txn.tt.transid);
		btrfs_set_dir_data_len(di, (u16)size);
		btrfs_set_dir_name_len(di, (u16)nlen);
		di->type = BTRFS_FT_XATTR;
		memcpy(buf + sizeof(*di), name, nlen);
		memcpy(buf + sizeof(*di) + nlen, value, size);
		ret = insert_or_extend(&w->txn.tt, &sv->root, &key, buf, entry);
	}
	free(buf);
	return ret;
}

static void set_mode_bits(struct btrfs_inode_item *ii, void *arg)
{
	const u32 *mode = arg;

	btrfs_set_inode_mode(ii, (btrfs_inode_mode(ii) & ~(u32)0777) | (*mode & 0777));
	now_ts(&ii->ctime);
}

int butter_setxattr(struct butter_fs *fs, butter_ino_t ino, const char *name, const void *value,
		    size_t size)
{
	size_t nlen = strlen(name);
	u32 entry = (u32)(sizeof(struct btrfs_dir_item) + nlen + size);
	struct btrfs_inode_item ii;
	struct fs_write_state *w;
	struct subvol *sv;
	int ret, err = 0, equiv = 0, is_access = !strcmp(name, "system.posix_acl_access");
	int remove_only = 0;
	u32 mode = 0;

	if (nlen == 0 || nlen > 255)
		return -ERANGE;
	ret = fs_xattr_name_check(name, nlen);
	if (ret)
		return ret;
	if (entry > tree_max_item_size(&fs->cache))
		return -E2BIG; /* btrfs's limit: the name and value fit one leaf item */
	ret = begin_change(fs, &w);
	if (ret)
		return ret;
	ret = fs_read_inode(fs, ino, &ii);
	if (ret == 0)
		ret = fs_xattr_prop_check(name, nlen, value, size, btrfs_inode_flags(&ii));
	if (ret == 1) {
		remove_only = 1; /* an empty property: removed, as the kernel does */
		ret = 0;
	}
	sv = ret == 0 ? fs_subvol_mut(fs, ino.subvol, &err) : NULL;
	if (ret == 0 && !sv)
		ret = err;
	if (ret == 0 && is_access) {
		/* as btrfs: the mode follows the ACL; an ACL the mode says all of is not kept */
		mode = btrfs_inode_mode(&ii);
		equiv = fs_acl_update_mode(value, size, &mode);
		if (equiv < 0)
			ret = equiv;
	}
	if (ret)
		return end_change(w, ret, 0);
	ret = fs_set_xattr_locked(fs, sv, ino.ino, name, equiv == 1 || remove_only ? NULL : value,
				  size);
	if (ret == 0)
		ret = is_access ? modify_inode(fs, sv, ino.ino, set_mode_bits, &mode)
				: modify_inode(fs, sv, ino.ino, touch_ctime, NULL);
	return end_change(w, ret, 1);
}

struct attr_update {
	const struct butter_stat *st;
	unsigned mask;
};

static void set_ts(struct btrfs_timespec *t, const struct timespec *ts)
{
	btrfs_set_timespec_sec(t, (u64)ts->tv_sec);
	btrfs_set_timespec_nsec(t, (u32)ts->tv_nsec);
}

static void apply_attr(struct btrfs_inode_item *ii, void *arg)
{
	struct attr_update *a = arg;
	const struct butter_stat *st = a->st;

	if (a->mask & BUTTER_SET_MODE)
		btrfs_set_inode_mode(ii, (btrfs_inode_mode(ii) & S_IFMT) | (st->mode & 07777));
	if (a->mask & BUTTER_SET_UID)
		btrfs_set_inode_uid(ii, st->uid);
	if (a->mask & BUTTER_SET_GID)
		btrfs_set_inode_gid(ii, st->gid);
	if (a->mask & BUTTER_SET_SIZE)
		btrfs_set_inode_size(ii, st->size);
	if (a->mask & BUTTER_SET_ATIME)
		set_ts(&ii->atime, &st->atime);
	if (a->mask & BUTTER_SET_MTIME)
		set_ts(&ii->mtime, &st->mtime);
	if (a->mask & BUTTER_SET_CTIME)
		set_ts(&ii->ctime, &st->ctime);
	else
		now_ts(&ii->ctime);
}

/* chmod: an access ACL follows the new mode, as on btrfs (phase 2). */
static int chmod_acl(struct butter_fs *fs, struct subvol *sv, butter_ino_t ino, u32 mode)
{
	static const char name[] = "system.posix_acl_access";
	ssize_t len = butter_getxattr(fs, ino, name, NULL, 0);
	u8 *acl;
	int ret;

	if (len == -ENODATA || len == 0)
		return 0;
	if (len < 0)
		return (int)len;
	acl = malloc((size_t)len);
	if (!acl)
		return -ENOMEM;
	len = butter_getxattr(fs, ino, name, acl, (size_t)len);
	ret = len < 0 ? (int)len : fs_acl_chmod(acl, (size_t)len, mode);
	if (ret == 0)
		ret = fs_set_xattr_locked(fs, sv, ino.ino, name, acl, (size_t)len);
	else if (ret == -EINVAL)
		ret = 0; /* a malformed ACL stays as it is */
	free(acl);
	return ret;
}

int butter_setattr(struct butter_fs *fs, butter_ino_t ino, const struct butter_stat *st,
		   unsigned mask)
{
	struct attr_update a = { st, mask };
	struct btrfs_inode_item ii;
	struct fs_write_state *w;
	struct subvol *sv;
	int ret, err = 0;

	ret = begin_change(fs, &w);
	if (ret)
		return ret;
	ret = fs_read_inode(fs, ino, &ii);
	if (ret == 0 && (mask & BUTTER_SET_SIZE) && !S_ISREG(btrfs_inode_mode(&ii)))
		ret = S_ISDIR(btrfs_inode_mode(&ii)) ? -EISDIR : -EINVAL;
	if (ret == 0 && (mask & BUTTER_SET_SIZE) && st->size > MAX_FILE_BYTES)
		ret = -EFBIG;
	sv = ret == 0 ? fs_subvol_mut(fs, ino.subvol, &err) : NULL;
	if (ret == 0 && !sv)
		ret = err;
	if (ret)
		return end_change(w, ret, 0);
	if (mask & BUTTER_SET_SIZE) {
		ret = fs_truncate(fs, sv, ino, st->size);
		a.mask &= ~BUTTER_SET_SIZE;
	}
	if (ret == 0 && (mask & BUTTER_SET_MODE))
		ret = chmod_acl(fs, sv, ino, st->mode);
	if (ret == 0)
		ret = modify_inode(fs, sv, ino.ino, apply_attr, &a);
	return end_change(w, ret, 1);
}

int butter_set_compression(struct butter_fs *fs, const char *spec, int force)
{
	struct fs_write_state *w = fs->w;
	int type, level = 0, max_level = 0;
	const char *colon = strchr(spec, ':');
	size_t nlen = colon ? (size_t)(colon - spec) : strlen(spec);

	if (!w)
		return -EROFS;
	if ((nlen == 2 && !strncmp(spec, "no", 2)) || (nlen == 4 && !strncmp(spec, "none", 4))) {
		type = BTRFS_COMPRESS_NONE;
	} else if (nlen == 4 && !strncmp(spec, "zlib", 4)) {
		type = BTRFS_COMPRESS_ZLIB;
		max_level = 9;
	} else if (nlen == 3 && !strncmp(spec, "lzo", 3)) {
		type = BTRFS_COMPRESS_LZO;
	} else if (nlen == 4 && !strncmp(spec, "zstd", 4)) {
		type = BTRFS_COMPRESS_ZSTD;
		max_level = 15;
	} else {
		return -EINVAL;
	}
	if (colon) {
		char *end;
		long v = strtol(colon + 1, &end, 10);

		if (!max_level || *end || end == colon + 1 || v < 1 || v > max_level)
			return -EINVAL;
		level = (int)v;
	}
	pthread_mutex_lock(&w->lock);
	w->compress_type = type;
	w->compress_level = level;
	w->compress_force = type != BTRFS_COMPRESS_NONE && force;
	pthread_mutex_unlock(&w->lock);
	return 0;
}

int butter_set_label(struct butter_fs *fs, const char *label)
{
	struct fs_write_state *w;
	size_t len = strlen(label);
	int ret;

	if (len >= BTRFS_LABEL_SIZE)
		return -EINVAL;
	ret = begin_change(fs, &w);
	if (ret)
		return ret;
	memset(fs->vol.super.label, 0, BTRFS_LABEL_SIZE);
	memcpy(fs->vol.super.label, label, len);
	w->txn.super_dirty = 1;
	ret = txn_commit(&w->txn);
	return end_change(w, ret, 0);
}
