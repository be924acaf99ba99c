/*
 * change.c — the write side of a handle and the lifecycle of a change: the
 * extent state and transaction set up at a read-write open, space
 * reservation, begin/end of a change, commits (butter_sync), the read-only
 * switch, and the handle-wide settings a change follows (compression, label).
 *
 * Every change runs in two phases:
 *   1. checks that change nothing (the name is free, the inode is a dir...):
 *      failures return an error and leave the transaction untouched;
 *   2. tree changes: a failure here leaves a half-made change in the running
 *      transaction, so the transaction is aborted on the spot and the handle
 *      turns read-only; the last committed state on disk stays intact.
 *
 * Space: fs_begin_change_rsv() makes sure the change will find room before it
 * starts (a chunk is added below META_LOW_WATER free metadata; changes stop
 * at META_RESERVE, deletions may use a quarter of it), committing first to
 * free pinned space when that is what it takes.
 *
 * Locking: one mutex (w->lock) serialises all changes; the read side does
 * not take it (a read racing a change of the same file may see either).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <uuid/uuid.h>

#include "format/checksum.h"
#include "fs/change.h"

/* The largest inline file: below a sector, and its item fits in a leaf. */
static u32 inline_ceiling(const struct butter_fs *fs)
{
	u32 item = tree_max_item_size(&fs->cache) - BTRFS_FILE_EXTENT_INLINE_DATA_START;
	u32 sector = fs->vol.sectorsize - 1;

	return item < sector ? item : sector;
}

/*
 * Commit with every buffered write in it (see fs_write_state.flush_data);
 * lock held. A failed write-back aborts: the trees may hold part of it.
 */
static int commit_everything(struct fs_write_state *w)
{
	int ret = 0;

	if (w->flush_data && w->delalloc_bytes && !w->txn.aborted) {
		ret = txn_begin(&w->txn);
		if (ret == 0)
			ret = w->flush_data(w->flush_data_arg);
		if (ret) {
			txn_abort(&w->txn, ret, "writing back buffered file data");
			return ret;
		}
	}
	return txn_commit(&w->txn);
}

void fs_final_commit(struct butter_fs *fs)
{
	struct fs_write_state *w = fs->w;

	if (!w)
		return;
	if ((w->txn.running || w->delalloc_bytes || volumes_stats_dirty(&fs->vol)) &&
	    !w->txn.aborted) {
		int ret = commit_everything(w);

		if (ret)
			blog_err(&fs->log, "final commit failed: %s", strerror(-ret));
	}
}

void fs_teardown_write(struct butter_fs *fs)
{
	struct fs_write_state *w = fs->w;

	if (!w)
		return;
	txn_ctx_destroy(&w->txn);
	extent_state_destroy(&w->es);
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
		if (fs->vol.devs[i]->bdev)
			continue;
		if (!fs->vol.allow_degraded) {
			blog_err(&fs->log, "a device is missing: open degraded to read or write it");
			return -EROFS;
		}
		blog_warn(&fs->log, "device %llu is missing: writing degraded (new chunks go to the "
				    "present devices; replace or remove the missing one, then balance)",
			  (unsigned long long)fs->vol.devs[i]->devid);
	}
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	pthread_mutex_init(&w->lock, NULL);
	extent_state_init(&w->es, &fs->vol, &fs->cache);
	w->max_inline = MAX_INLINE_DEFAULT < inline_ceiling(fs) ? MAX_INLINE_DEFAULT : inline_ceiling(fs);
	ret = node_read(&fs->cache, fs->chunk_tree.bytenr, fs->chunk_tree.generation,
			fs->chunk_tree.level, NULL, &chunk_root);
	if (ret)
		goto fail;
	memcpy(fs->vol.chunk_tree_uuid, node_header(chunk_root)->chunk_tree_uuid, BTRFS_UUID_SIZE);
	node_put(&fs->cache, chunk_root);
	ret = fs_load_root(fs, BTRFS_DEV_TREE_OBJECTID, &w->dev_tree);
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
		ret = fs_load_root(fs, BTRFS_FREE_SPACE_TREE_OBJECTID, &w->fst);
		if (ret)
			goto fail;
		w->es.fst_root = &w->fst;
	} else {
		/* a v1 space cache, if any, goes stale: make every kernel ignore it */
		put_le64(&sb->cache_generation, (u64)-1);
	}
	if (fs_load_root(fs, BTRFS_UUID_TREE_OBJECTID, &w->uuid_tree) != 0)
		memset(&w->uuid_tree, 0, sizeof(w->uuid_tree));
	ret = chunk_init_devspace(&w->es, 1);
	if (ret)
		goto fail;
	ret = extent_load(&w->es);
	if (ret)
		goto fail;
	/* nothing new goes to a chunk with a stripe on a missing device */
	for (i = 0; i < w->es.nbgs; i++) {
		const struct chunk_map *map = volumes_find_chunk(&fs->vol, w->es.bgs[i]->start);

		for (u32 k = 0; map && k < map->num_stripes; k++)
			if (!map->stripes[k].dev || !map->stripes[k].dev->bdev)
				w->es.bgs[i]->degraded = 1;
	}
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
	if (ret)
		goto fail;
	fs->w = w;
	return 0;
fail:
	txn_ctx_destroy(&w->txn);
	extent_state_destroy(&w->es);
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
		if (profile)
			*profile = es->bgs[i]->flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
		if (extent_bg_allocatable(es->bgs[i]))
			sum += es->bgs[i]->free.total; /* not a group being emptied or degraded */
	}
	return sum;
}

/* Is some group serving @type kept from allocation (degraded, or being emptied)? */
static int some_unallocatable(const struct extent_state *es, u64 type)
{
	for (size_t i = 0; i < es->nbgs; i++)
		if ((es->bgs[i]->flags & type) && !extent_bg_allocatable(es->bgs[i]))
			return 1;
	return 0;
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
 * made later by data_alloc() only adds room.
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
	u64 meta_profile = 0, sys_profile = 0, data_profile = w->data_profile, meta_free, sys_free;
	u64 need, made[2];
	size_t i, nmade = 0;
	u64 total = btrfs_super_total_bytes(&w->es.vol->super);
	u64 low = total / 32 < META_LOW_WATER ? total / 32 : META_LOW_WATER;
	u64 floor = deleting ? META_RESERVE / 4 : META_RESERVE;
	int ret;

	/* room for what delayed allocation holds comes first */
	data_bytes += w->delalloc_bytes;
	if (w->es.mixed)
		return reserve_mixed(w, data_bytes, floor, low);
	meta_free = group_free(&w->es, BTRFS_BLOCK_GROUP_METADATA, &meta_profile);
	sys_free = group_free(&w->es, BTRFS_BLOCK_GROUP_SYSTEM, &sys_profile);
	/*
	 * Groups kept from allocation (degraded, or being emptied) may leave no
	 * room at all: then the chunks are made in any case, system first, and
	 * their items inserted after (inserting needs both kinds of room).
	 */
	if (sys_free < (1ULL << 20) && some_unallocatable(&w->es, BTRFS_BLOCK_GROUP_SYSTEM) &&
	    chunk_create(&w->es, BTRFS_BLOCK_GROUP_SYSTEM | sys_profile,
			 chunk_max_size(&w->es, 32ULL << 20), &made[nmade]) == 0)
		nmade++;
	if (meta_free < low) {
		u64 size = chunk_max_size(&w->es, 256ULL << 20);

		while (size >= (16ULL << 20) && unallocated(&w->es, meta_profile) < size)
			size /= 2;
		if (size >= (16ULL << 20) &&
		    (meta_free >= META_RESERVE / 4 ||
		     some_unallocatable(&w->es, BTRFS_BLOCK_GROUP_METADATA)) &&
		    chunk_create(&w->es, BTRFS_BLOCK_GROUP_METADATA | meta_profile, size,
				 &made[nmade]) == 0)
			nmade++;
	}
	for (ret = 0, i = 0; i < nmade && ret == 0; i++)
		ret = chunk_insert_items(&w->es, &w->txn.tt, made[i]);
	if (ret && ret != -ENOSPC) {
		txn_abort(&w->txn, ret, "allocating a metadata chunk");
		return ret;
	}
	if (nmade)
		meta_free = group_free(&w->es, BTRFS_BLOCK_GROUP_METADATA, NULL);
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

int fs_begin_change_rsv(struct butter_fs *fs, struct fs_write_state **wp, u64 data_bytes,
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

int fs_begin_change(struct butter_fs *fs, struct fs_write_state **wp)
{
	return fs_begin_change_rsv(fs, wp, 0, 0);
}

/* End a change; @failed_in_trees: the error came from phase 2 (abort). */
int fs_end_change_at(struct fs_write_state *w, int ret, int failed_in_trees, const char *func,
		     int line)
{
	if (ret < 0 && failed_in_trees) {
		char where[128];

		snprintf(where, sizeof(where), "%s() line %d (errno %d)", func, line, ret);
		txn_abort(&w->txn, ret, where);
	} else if (ret >= 0 && w->txn.tt.ndirty * w->txn.cache->nodesize > DIRTY_COMMIT_BYTES) {
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

int fs_sync(struct butter_fs *fs)
{
	struct fs_write_state *w = fs->w;
	int ret;

	if (!w)
		return 0;
	pthread_mutex_lock(&w->lock);
	ret = commit_everything(w);
	pthread_mutex_unlock(&w->lock);
	return ret;
}

void fs_set_space_commit_hook(struct butter_fs *fs, void (*fn)(void *arg), void *arg)
{
	if (fs->w) {
		fs->w->space_commit_fn = fn;
		fs->w->space_commit_arg = arg;
	}
}

int fs_set_readonly(struct butter_fs *fs, int readonly)
{
	struct fs_write_state *w = fs->w;
	int ret = 0;

	if (!w)
		return readonly ? 0 : -EROFS;
	pthread_mutex_lock(&w->lock);
	if (readonly && !w->readonly) {
		ret = commit_everything(w);
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
void fs_now_ts(struct btrfs_timespec *t)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME_COARSE, &ts);
	btrfs_set_timespec_sec(t, (u64)ts.tv_sec);
	btrfs_set_timespec_nsec(t, (u32)ts.tv_nsec);
}

/* Insert @data as a new item, or append it to the existing item with @key. */
int fs_insert_or_extend(struct tree_trans *t, struct tree_root *root,
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

int fs_set_compression(struct butter_fs *fs, const char *spec, int force)
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

int fs_set_max_inline(struct butter_fs *fs, u64 bytes)
{
	struct fs_write_state *w = fs->w;
	u32 ceiling = inline_ceiling(fs);

	if (!w)
		return -EROFS;
	pthread_mutex_lock(&w->lock);
	w->max_inline = bytes < ceiling ? (u32)bytes : ceiling;
	pthread_mutex_unlock(&w->lock);
	return (int)w->max_inline;
}

int fs_set_label(struct butter_fs *fs, const char *label)
{
	struct fs_write_state *w;
	size_t len = strlen(label);
	int ret;

	if (len >= BTRFS_LABEL_SIZE)
		return -EINVAL;
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	memset(fs->vol.super.label, 0, BTRFS_LABEL_SIZE);
	memcpy(fs->vol.super.label, label, len);
	w->txn.super_dirty = 1;
	ret = txn_commit(&w->txn);
	return fs_end_change(w, ret, 0);
}
