/*
 * fs.c — the handle: reading a filesystem's structure at open (this file
 * does the read-only part of every open; lib/ops/open.c adds the write side
 * and recovery), freeing the handle, and what the filesystem says about
 * itself (info, devices, space, device statistics).
 *
 * Open sequence (each step needs the one before):
 *   1. open every device; read and validate superblocks; pick the newest
 *      (volumes_open), refuse unknown incompat features by name;
 *   2. load the sys_chunk_array, then the chunk tree (chunks + device items),
 *      then check missing devices against each chunk's tolerance;
 *   3. read the root tree; locate the extent, csum and block group trees and
 *      the default subvolume.
 * Any failure releases everything acquired so far and returns the error.
 *
 * Step 1 claims every device (lib/device/claim.c): a read-write open holds
 * each exclusively until butter_close(), a read-only one shares it. After
 * step 2 every present device must be as large as its dev item says: a
 * smaller (truncated) one is refused read-write and warned about read-only.
 *
 * fs_destroy() closes the devices (and so drops the claims) and frees the
 * handle; the write side must be gone by then (lib/ops/open.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/checksum.h"
#include "fs/change.h"

#define DEFAULT_CACHE_BYTES (32ULL << 20)

static int load_chunk_tree(struct butter_fs *fs)
{
	struct tree_path path;
	struct btrfs_key key = { 0, 0, 0 };
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &fs->chunk_tree, &key, &path);
	while (ret == 0) {
		const u8 *item;
		u32 size;

		path_key(&path, &key);
		item = path_item(&path, &size);
		if (key.type == BTRFS_DEV_ITEM_KEY && key.objectid == BTRFS_DEV_ITEMS_OBJECTID) {
			if (size < sizeof(struct btrfs_dev_item)) {
				ret = BLOG_CORRUPT(&fs->log, "chunk tree: short dev item for devid %llu",
						   (unsigned long long)key.offset);
				break;
			}
			ret = volumes_add_dev_item(&fs->vol, (const struct btrfs_dev_item *)item);
		} else if (key.type == BTRFS_CHUNK_ITEM_KEY) {
			ret = volumes_add_chunk(&fs->vol, key.offset, (const struct btrfs_chunk *)item,
						size);
		}
		if (ret)
			break;
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	return ret < 0 ? ret : 0;
}

int fs_read_root_item(struct butter_fs *fs, u64 objectid, struct btrfs_root_item *item,
		      struct btrfs_key *found_key)
{
	struct btrfs_key key = { objectid, BTRFS_ROOT_ITEM_KEY, 0 };
	struct tree_path path;
	const u8 *data;
	u32 size;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &fs->root_tree, &key, &path);
	if (ret == 0) {
		path_key(&path, &key);
		if (key.objectid != objectid || key.type != BTRFS_ROOT_ITEM_KEY) {
			ret = -ENOENT;
		} else {
			data = path_item(&path, &size);
			if (size < BTRFS_ROOT_ITEM_V1_SIZE) {
				ret = BLOG_CORRUPT(&fs->log, "root item %llu: size %u too small",
						   (unsigned long long)objectid, size);
			} else {
				memset(item, 0, sizeof(*item));
				memcpy(item, data, size < sizeof(*item) ? size : sizeof(*item));
				if (size < sizeof(*item))
					btrfs_set_root_generation_v2(item, 0);
				if (found_key)
					*found_key = key;
			}
		}
	} else if (ret == 1) {
		ret = -ENOENT;
	}
	tree_path_release(&fs->cache, &path);
	return ret;
}

int fs_next_subvol_root_item(struct butter_fs *fs, struct btrfs_key *key, struct tree_path *path)
{
	int ret = tree_search_forward(&fs->cache, &fs->root_tree, key, path);

	while (ret == 0) {
		path_key(path, key);
		if (key->objectid > BTRFS_LAST_FREE_OBJECTID)
			return 1;
		if (key->type == BTRFS_ROOT_ITEM_KEY &&
		    (key->objectid == BTRFS_FS_TREE_OBJECTID ||
		     key->objectid >= BTRFS_FIRST_FREE_OBJECTID))
			return 0;
		ret = tree_next_item(&fs->cache, path);
	}
	return ret;
}

int fs_load_root(struct butter_fs *fs, u64 objectid, struct tree_root *root)
{
	struct btrfs_root_item item;
	int ret = fs_read_root_item(fs, objectid, &item, NULL);

	if (ret)
		return ret;
	if (item.level >= BTRFS_MAX_LEVEL)
		return BLOG_CORRUPT(&fs->log, "root item %llu: level %u",
				    (unsigned long long)objectid, item.level);
	memset(root, 0, sizeof(*root));
	root->objectid = objectid;
	root->bytenr = btrfs_root_bytenr(&item);
	root->generation = btrfs_root_generation(&item);
	root->level = item.level;
	root->bytes_used = btrfs_root_bytes_used(&item);
	return 0;
}

/* The default subvolume: the "default" entry of the root tree directory. */
static int load_default_subvol(struct butter_fs *fs)
{
	static const char name[] = "default";
	struct btrfs_key key = { BTRFS_ROOT_TREE_DIR_OBJECTID, BTRFS_DIR_ITEM_KEY,
				 btrfs_name_hash(name, sizeof(name) - 1) };
	u8 buf[256];
	int ret;

	fs->default_subvol = BTRFS_FS_TREE_OBJECTID;
	ret = tree_lookup_item(&fs->cache, &fs->root_tree, &key, buf, sizeof(buf));
	if (ret == -ENOENT)
		return 0;
	if (ret < 0)
		return ret;
	if ((size_t)ret < sizeof(struct btrfs_dir_item) || (size_t)ret > sizeof(buf))
		return 0;
	{
		const struct btrfs_dir_item *di = (const struct btrfs_dir_item *)buf;
		struct btrfs_key loc;

		btrfs_disk_to_cpu_key(&loc, &di->location);
		if (loc.objectid)
			fs->default_subvol = loc.objectid;
	}
	return 0;
}

/*
 * Compare every present device's size with the total_bytes of its dev item:
 * a device that is smaller (a truncated image) is refused with @writable
 * (-EFBIG) and warned about otherwise, as the kernel and btrfs check do.
 */
static int check_device_sizes(struct butter_fs *fs, int writable)
{
	for (size_t i = 0; i < fs->vol.ndevs; i++) {
		const struct btrfs_device *dev = fs->vol.devs[i];

		if (!dev->bdev || dev->bdev->size >= dev->total_bytes)
			continue;
		if (writable) {
			blog_err(&fs->log,
				 "%s: device %llu is %llu bytes, smaller than the %llu bytes the "
				 "filesystem records for it (truncated?); refusing to write",
				 dev->path, (unsigned long long)dev->devid,
				 (unsigned long long)dev->bdev->size,
				 (unsigned long long)dev->total_bytes);
			return -EFBIG;
		}
		blog_warn(&fs->log,
			  "%s: device %llu is %llu bytes, smaller than the %llu bytes the "
			  "filesystem records for it (truncated?); what lay beyond its end is "
			  "unreadable",
			  dev->path, (unsigned long long)dev->devid,
			  (unsigned long long)dev->bdev->size, (unsigned long long)dev->total_bytes);
	}
	return 0;
}

void fs_load_dev_stats(struct butter_fs *fs)
{
	struct btrfs_root_item item;
	struct tree_root dev_tree = { 0 };
	size_t i;
	int k, ret;

	ret = fs_read_root_item(fs, BTRFS_DEV_TREE_OBJECTID, &item, NULL);
	if (ret) {
		if (ret != -ENOENT)
			blog_warn(&fs->log, "device statistics not loaded: %s", strerror(-ret));
		return;
	}
	dev_tree.objectid = BTRFS_DEV_TREE_OBJECTID;
	dev_tree.bytenr = btrfs_root_bytenr(&item);
	dev_tree.generation = btrfs_root_generation(&item);
	dev_tree.level = item.level;
	for (i = 0; i < fs->vol.ndevs; i++) {
		struct btrfs_device *dev = fs->vol.devs[i];
		struct btrfs_key key = { BTRFS_DEV_STATS_OBJECTID, BTRFS_PERSISTENT_ITEM_KEY,
					 dev->devid };
		le64 values[BTRFS_DEV_STAT_VALUES_MAX];

		ret = tree_lookup_item(&fs->cache, &dev_tree, &key, values, sizeof(values));
		if (ret == -ENOENT)
			continue;
		if (ret < 0) {
			blog_warn(&fs->log, "device statistics of devid %llu not loaded: %s",
				  (unsigned long long)dev->devid, strerror(-ret));
			continue;
		}
		/* an older, shorter item holds the first counters only */
		for (k = 0; k < BTRFS_DEV_STAT_VALUES_MAX && (size_t)(k + 1) * 8 <= (size_t)ret; k++)
			__atomic_fetch_add(&dev->stats[k], get_le64(&values[k]), __ATOMIC_RELAXED);
	}
}

/* The lock of the public calls: in turn order, so neither readers nor changes starve. */
static int init_api_lock(struct butter_fs *fs)
{
	int ret;

	fs->api_lock = malloc(sizeof(*fs->api_lock));
	if (!fs->api_lock)
		return -ENOMEM;
	ret = turn_lock_init(fs->api_lock);
	if (ret == 0) {
		ret = -pthread_key_create(&fs->api_held, NULL);
		if (ret)
			turn_lock_destroy(fs->api_lock);
	}
	if (ret) {
		free(fs->api_lock);
		fs->api_lock = NULL;
	}
	return ret;
}

static void destroy_api_lock(struct butter_fs *fs)
{
	pthread_key_delete(fs->api_held);
	turn_lock_destroy(fs->api_lock);
	free(fs->api_lock);
	fs->api_lock = NULL;
}

/*
 * Read the filesystem on @bdevs into @fs, whose log, flags and locks are set
 * up: the open sequence at the top of this file. On failure everything it
 * acquired is released again, the devices included.
 */
static int load(struct butter_fs *fs, const char *path, struct blockdev **bdevs, size_t n,
		const struct butter_open_opts *opts)
{
	int ret;

	fs->open_flags = opts->flags;
	pthread_mutex_init(&fs->subvol_lock, NULL);
	ret = volumes_open(&fs->vol, bdevs, n, &fs->log, !!(opts->flags & BUTTER_OPEN_DEGRADED));
	if (ret)
		goto fail_early;
	ret = node_cache_init(&fs->cache, &fs->vol,
			      opts->cache_bytes ? opts->cache_bytes : DEFAULT_CACHE_BYTES);
	if (ret)
		goto fail_vol;

	fs->chunk_tree.objectid = BTRFS_CHUNK_TREE_OBJECTID;
	fs->chunk_tree.bytenr = btrfs_super_chunk_root(&fs->vol.super);
	fs->chunk_tree.generation = btrfs_super_chunk_root_generation(&fs->vol.super);
	fs->chunk_tree.level = fs->vol.super.chunk_root_level;
	ret = load_chunk_tree(fs);
	if (ret) {
		blog_err(&fs->log, "%s: cannot read the chunk tree", path);
		goto fail_cache;
	}
	volumes_drop_unlisted(&fs->vol);
	ret = volumes_check_devices(&fs->vol);
	if (ret)
		goto fail_cache;
	ret = check_device_sizes(fs, !(opts->flags & BUTTER_OPEN_RDONLY));
	if (ret)
		goto fail_cache;

	fs->root_tree.objectid = BTRFS_ROOT_TREE_OBJECTID;
	fs->root_tree.bytenr = btrfs_super_root(&fs->vol.super);
	fs->root_tree.generation = btrfs_super_generation(&fs->vol.super);
	fs->root_tree.level = fs->vol.super.root_level;
	ret = fs_load_root(fs, BTRFS_EXTENT_TREE_OBJECTID, &fs->extent_tree);
	if (ret) {
		blog_err(&fs->log, "%s: cannot find the extent tree", path);
		goto fail_cache;
	}
	ret = fs_load_root(fs, BTRFS_CSUM_TREE_OBJECTID, &fs->csum_tree);
	if (ret == 0)
		fs->has_csum_tree = 1;
	else if (ret != -ENOENT)
		goto fail_cache;
	if (btrfs_super_compat_ro_flags(&fs->vol.super) & BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE) {
		ret = fs_load_root(fs, BTRFS_BLOCK_GROUP_TREE_OBJECTID, &fs->block_group_tree);
		if (ret)
			goto fail_cache;
		fs->has_block_group_tree = 1;
	}
	ret = load_default_subvol(fs);
	if (ret)
		goto fail_cache;
	fs_load_dev_stats(fs);
	if (btrfs_super_log_root(&fs->vol.super) && (opts->flags & BUTTER_OPEN_RDONLY))
		blog_warn(&fs->log,
			  "%s: the filesystem has a tree log (it was not unmounted cleanly); "
			  "changes fsynced since the last commit are not shown",
			  path);
	return 0;

fail_cache:
	node_cache_destroy(&fs->cache);
fail_vol:
	volumes_close(&fs->vol);
fail_early:
	pthread_mutex_destroy(&fs->subvol_lock);
	for (size_t i = 0; i < fs->nsubvols; i++)
		free(fs->subvols[i]);
	free(fs->subvols);
	fs->subvols = NULL;
	fs->nsubvols = 0;
	return ret;
}

/* Undo load(): close the devices, free the cache and the subvolume records. */
static void unload(struct butter_fs *fs)
{
	node_cache_destroy(&fs->cache);
	volumes_close(&fs->vol);
	pthread_mutex_destroy(&fs->subvol_lock);
	for (size_t i = 0; i < fs->nsubvols; i++)
		free(fs->subvols[i]);
	free(fs->subvols);
}

int fs_open_bdevs(const char *path, struct blockdev **bdevs, size_t n,
		  const struct butter_open_opts *opts, struct butter_fs **out)
{
	struct butter_fs *fs;
	size_t i;
	int ret;

	fs = calloc(1, sizeof(*fs));
	if (!fs) {
		for (i = 0; i < n; i++)
			blockdev_close(bdevs[i]);
		return -ENOMEM;
	}
	fs->log.fn = opts->log;
	fs->log.arg = opts->log_arg;
	fs->log.level = opts->log_level ? opts->log_level : BUTTER_LOG_WARNING;
	ret = init_api_lock(fs);
	if (ret) {
		for (i = 0; i < n; i++)
			blockdev_close(bdevs[i]);
		free(fs);
		return ret;
	}
	ret = load(fs, path, bdevs, n, opts);
	if (ret) {
		destroy_api_lock(fs);
		free(fs);
		return ret;
	}
	*out = fs;
	return 0;
}

void fs_unload(struct butter_fs *fs)
{
	struct butter_fs keep = *fs;

	ASSERT(!fs->w);
	if (!fs->dead)
		unload(fs);
	memset(fs, 0, sizeof(*fs));
	/* what outlives a reload: the log, the lock (callers wait on it), what reopens it */
	fs->log = keep.log;
	fs->api_lock = keep.api_lock;
	fs->api_held = keep.api_held;
	fs->reopen = keep.reopen;
	fs->last_subvol_id = keep.last_subvol_id;
	fs->dead = 1;
}

int fs_reload(struct butter_fs *fs, const char *path, struct blockdev **bdevs, size_t n,
	      const struct butter_open_opts *opts)
{
	int ret;

	ASSERT(fs->dead);
	ret = load(fs, path, bdevs, n, opts);
	if (ret == 0)
		fs->dead = 0;
	return ret;
}

void fs_destroy(struct butter_fs *fs)
{
	ASSERT(!fs->w); /* the write side went first (fs_teardown_write()) */
	if (!fs->dead)
		unload(fs);
	destroy_api_lock(fs);
	if (fs->reopen.paths) {
		for (size_t i = 0; i < fs->reopen.npaths; i++)
			free(fs->reopen.paths[i]);
		free(fs->reopen.paths);
	}
	free(fs);
}

int fs_get_info(struct butter_fs *fs, struct butter_info *info)
{
	const struct btrfs_super_block *sb = &fs->vol.super;

	memset(info, 0, sizeof(*info));
	memcpy(info->label, sb->label, BTRFS_LABEL_SIZE);
	info->label[BTRFS_LABEL_SIZE] = '\0';
	memcpy(info->fsid, sb->fsid, 16);
	memcpy(info->metadata_uuid, fs->vol.meta_fsid, 16);
	info->generation = btrfs_super_generation(sb);
	info->total_bytes = btrfs_super_total_bytes(sb);
	info->bytes_used = btrfs_super_bytes_used(sb);
	info->num_devices = btrfs_super_num_devices(sb);
	info->sectorsize = fs->vol.sectorsize;
	info->nodesize = fs->vol.nodesize;
	info->csum_type = fs->vol.csum_type;
	info->csum_name = btrfs_csum_name(fs->vol.csum_type);
	info->compat_flags = btrfs_super_compat_flags(sb);
	info->compat_ro_flags = btrfs_super_compat_ro_flags(sb);
	info->incompat_flags = btrfs_super_incompat_flags(sb);
	info->default_subvol = fs->default_subvol;
	return 0;
}

int fs_get_device(struct butter_fs *fs, size_t idx, struct butter_device_info *out)
{
	const struct btrfs_device *dev;

	if (idx >= fs->vol.ndevs)
		return -ENOENT;
	dev = fs->vol.devs[idx];
	memset(out, 0, sizeof(*out));
	out->devid = dev->devid;
	out->total_bytes = dev->total_bytes;
	out->bytes_used = dev->bytes_used;
	memcpy(out->uuid, dev->uuid, 16);
	out->path = dev->bdev ? dev->path : NULL;
	return 0;
}

/* Sum the block group items' used bytes into @space (matched by flags). */
static int add_block_group_usage(struct butter_fs *fs, struct butter_space_info *spaces,
				 size_t nspaces)
{
	const struct tree_root *root =
		fs->has_block_group_tree ? &fs->block_group_tree : &fs->extent_tree;
	struct btrfs_key key = { 0, BTRFS_BLOCK_GROUP_ITEM_KEY, 0 };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, root, &key, &path);
	while (ret == 0) {
		const u8 *item;
		u32 size;
		size_t i;

		path_key(&path, &key);
		item = path_item(&path, &size);
		if (key.type == BTRFS_BLOCK_GROUP_ITEM_KEY &&
		    size >= sizeof(struct btrfs_block_group_item)) {
			const struct btrfs_block_group_item *bg = (const void *)item;

			for (i = 0; i < nspaces; i++)
				if (spaces[i].flags == btrfs_block_group_flags(bg))
					spaces[i].used += btrfs_block_group_used(bg);
		}
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	return ret < 0 ? ret : 0;
}

int fs_get_space(struct butter_fs *fs, size_t idx, struct butter_space_info *out)
{
	struct butter_space_info spaces[64];
	size_t n = 0, i, j;
	int ret;

	for (i = 0; i < fs->vol.nchunks; i++) {
		const struct chunk_map *m = fs->vol.chunks[i];

		for (j = 0; j < n && spaces[j].flags != m->type; j++)
			;
		if (j == n) {
			if (n == 64)
				continue;
			spaces[n].flags = m->type;
			spaces[n].total = spaces[n].used = 0;
			n++;
		}
		spaces[j].total += m->length;
	}
	if (idx >= n)
		return -ENOENT;
	ret = add_block_group_usage(fs, spaces, n);
	if (ret)
		return ret;
	*out = spaces[idx];
	return 0;
}

/*
 * In a read-write handle, the data bytes its block groups hold now,
 * committed or not (extent_bg_taken), so data written since the last commit
 * counts at once, as it does on the kernel's btrfs; and the device bytes new
 * chunks can still use (chunk_usable_bytes).
 */
/* The first MiB of every device holds no chunk (the kernel's rule too). */
#define DEVICE_RESERVED_BYTES (1ULL << 20)

static void space_now(struct butter_fs *fs, u64 *data_taken, u64 *unallocated)
{
	struct extent_state *es = &fs->w->es;

	*data_taken = *unallocated = 0;
	pthread_mutex_lock(&fs->w->lock);
	for (size_t i = 0; i < es->nbgs; i++)
		if (es->bgs[i]->flags & BTRFS_BLOCK_GROUP_DATA)
			*data_taken += extent_bg_taken(es->bgs[i]);
	for (size_t i = 0; i < fs->vol.ndevs; i++)
		*unallocated += chunk_usable_bytes(es, fs->vol.devs[i]->devid);
	pthread_mutex_unlock(&fs->w->lock);
}

int fs_statfs(struct butter_fs *fs, struct butter_statfs *out)
{
	u64 data_total = 0, data_used = 0, unalloc = 0, factor = 1;
	struct butter_space_info sp;
	size_t i;
	int ret;

	memset(out, 0, sizeof(*out));
	for (i = 0; (ret = fs_get_space(fs, i, &sp)) == 0; i++) {
		if (!(sp.flags & BTRFS_BLOCK_GROUP_DATA))
			continue;
		data_total += sp.total;
		data_used += sp.used;
		if (sp.flags & (BTRFS_BLOCK_GROUP_RAID1 | BTRFS_BLOCK_GROUP_DUP |
				BTRFS_BLOCK_GROUP_RAID10))
			factor = 2;
		else if (sp.flags & BTRFS_BLOCK_GROUP_RAID1C3)
			factor = 3;
		else if (sp.flags & BTRFS_BLOCK_GROUP_RAID1C4)
			factor = 4;
	}
	if (ret != -ENOENT)
		return ret;
	for (i = 0; !fs->w && i < fs->vol.ndevs; i++) {
		const struct btrfs_device *d = fs->vol.devs[i];

		if (d->total_bytes > d->bytes_used + DEVICE_RESERVED_BYTES)
			unalloc += d->total_bytes - d->bytes_used - DEVICE_RESERVED_BYTES;
	}
	if (fs->w) {
		/* a writable handle: what its running transaction allocated counts too */
		u64 bg_used;

		fs_live_data_usage(fs, &data_total, &bg_used);
		space_now(fs, &data_used, &unalloc);
		data_used += fs->w->delalloc_bytes; /* buffered data has room promised */
	}
	out->bsize = fs->vol.sectorsize;
	out->blocks = (data_total + unalloc / factor) / out->bsize;
	out->bfree = (data_total - (data_used < data_total ? data_used : data_total) +
		      unalloc / factor) / out->bsize;
	out->bavail = out->bfree;
	out->files = (u64)1 << 48;
	out->ffree = out->files;
	out->namemax = BTRFS_NAME_LEN;
	return 0;
}
