/*
 * chunk.c — allocating chunks: choosing devices and physical ranges for a
 * profile, recording the chunk map and block group, and the tree items that
 * describe them (chunk item, dev extents, dev items; the sys_chunk_array for
 * system chunks).
 *
 * Stripe counts per profile (n = devices with room):
 *   single 1, dup 2 on one device, raid1 2, raid1c3 3, raid1c4 4,
 *   raid0 n >= 2, raid10 the largest even n >= 4 (sub_stripes 2),
 *   raid5 n >= 2 (n - 1 data stripes), raid6 n >= 3 (n - 2 data stripes).
 * Physical space below 1 MiB is never used (superblock and boot area).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "extent/extent.h"

#define RESERVED_BYTES (1ULL << 20)

static struct dev_space *devspace(struct extent_state *es, u64 devid)
{
	size_t i;

	for (i = 0; i < es->ndevspace; i++)
		if (es->devspace[i].devid == devid)
			return &es->devspace[i];
	return NULL;
}

/* Is device @devid present (and so usable for new chunks)? */
static int dev_present(const struct extent_state *es, u64 devid)
{
	for (size_t i = 0; i < es->vol->ndevs; i++)
		if (es->vol->devs[i]->devid == devid)
			return es->vol->devs[i]->bdev != NULL;
	return 0;
}

u64 chunk_usable_bytes(const struct extent_state *es, u64 devid)
{
	const u64 grid = 1ULL << 20; /* stripes start and end on it (chunk_create) */
	u64 sum = 0;

	if (!dev_present(es, devid))
		return 0;

	for (size_t i = 0; i < es->ndevspace; i++) {
		const struct range_set *free = &es->devspace[i].free;

		if (es->devspace[i].devid != devid)
			continue;
		for (size_t j = 0; j < free->n; j++) {
			u64 start = (free->r[j].start + grid - 1) / grid * grid;
			u64 end = free->r[j].end / grid * grid;

			if (end > start)
				sum += end - start;
		}
	}
	return sum;
}

int chunk_init_devspace(struct extent_state *es, int load)
{
	struct btrfs_volumes *vol = es->vol;
	size_t i;
	int ret;

	es->devspace = calloc(vol->ndevs ? vol->ndevs : 1, sizeof(*es->devspace));
	if (!es->devspace)
		return -ENOMEM;
	es->ndevspace = vol->ndevs;
	for (i = 0; i < vol->ndevs; i++) {
		struct dev_space *ds = &es->devspace[i];

		ds->devid = vol->devs[i]->devid;
		range_set_init(&ds->free);
		if (vol->devs[i]->total_bytes > RESERVED_BYTES) {
			ret = range_add(&ds->free, RESERVED_BYTES, vol->devs[i]->total_bytes);
			if (ret)
				return ret;
		}
	}
	if (load) {
		struct btrfs_key key = { 0, BTRFS_DEV_EXTENT_KEY, 0 };
		struct tree_path path;

		tree_path_init(&path);
		ret = tree_search_forward(es->cache, es->dev_root, &key, &path);
		while (ret == 0) {
			const u8 *item;
			u32 size;

			path_key(&path, &key);
			if (key.type == BTRFS_DEV_EXTENT_KEY) {
				struct dev_space *ds = devspace(es, key.objectid);

				item = path_item(&path, &size);
				if (size < sizeof(struct btrfs_dev_extent)) {
					ret = BLOG_CORRUPT(es->log, "dev extent %llu: short",
							   (unsigned long long)key.offset);
					break;
				}
				if (ds)
					ret = range_remove(&ds->free, key.offset,
							   key.offset + btrfs_dev_extent_length(
									       (const void *)item));
				if (ret)
					break;
			}
			ret = tree_next_item(es->cache, &path);
		}
		tree_path_release(es->cache, &path);
		if (ret < 0)
			return ret;
	}
	return 0;
}

struct candidate {
	struct btrfs_device *dev;
	u64 largest;
};

static u64 largest_free(const struct dev_space *ds)
{
	u64 best = 0;
	size_t i;

	for (i = 0; i < ds->free.n; i++)
		if (ds->free.r[i].end - ds->free.r[i].start > best)
			best = ds->free.r[i].end - ds->free.r[i].start;
	return best;
}

static int cmp_candidate(const void *pa, const void *pb)
{
	const struct candidate *a = pa, *b = pb;

	if (a->largest != b->largest)
		return a->largest > b->largest ? -1 : 1;
	return a->dev->devid < b->dev->devid ? -1 : 1;
}

int chunk_create(struct extent_state *es, u64 type, u64 stripe_size, u64 *logical)
{
	struct btrfs_volumes *vol = es->vol;
	u64 profile = type & BTRFS_BLOCK_GROUP_PROFILE_MASK;
	u32 nstripes, sub = 1, data_stripes, i, k;
	struct candidate *cands;
	size_t ncands = 0, j;
	struct btrfs_chunk *chunk;
	u64 length, start = RESERVED_BYTES;
	int ret;

	stripe_size = stripe_size / (1ULL << 20) * (1ULL << 20);
	if (stripe_size == 0)
		return -EINVAL;
	if (es->mixed && (type & (BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA)))
		type |= BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA;
	cands = calloc(vol->ndevs ? vol->ndevs : 1, sizeof(*cands));
	if (!cands)
		return -ENOMEM;
	for (j = 0; j < vol->ndevs; j++) {
		struct dev_space *ds = devspace(es, vol->devs[j]->devid);

		if (!vol->devs[j]->bdev || !ds || ds->no_alloc)
			continue;
		cands[ncands].dev = vol->devs[j];
		cands[ncands].largest = largest_free(ds);
		ncands++;
	}
	qsort(cands, ncands, sizeof(*cands), cmp_candidate);
	if (profile & BTRFS_BLOCK_GROUP_DUP)
		nstripes = 2;
	else if (profile & BTRFS_BLOCK_GROUP_RAID1)
		nstripes = 2;
	else if (profile & BTRFS_BLOCK_GROUP_RAID1C3)
		nstripes = 3;
	else if (profile & BTRFS_BLOCK_GROUP_RAID1C4)
		nstripes = 4;
	else if (profile & BTRFS_BLOCK_GROUP_RAID0)
		nstripes = (u32)ncands;
	else if (profile & BTRFS_BLOCK_GROUP_RAID10) {
		nstripes = (u32)ncands & ~1u;
		sub = 2;
	} else if (profile & BTRFS_BLOCK_GROUP_RAID56_MASK)
		nstripes = (u32)ncands; /* every device with room, as the kernel */
	else
		nstripes = 1;
	if (vol->allow_degraded && ncands < vol->ndevs &&
	    ((profile & BTRFS_BLOCK_GROUP_RAID0 && nstripes < 2) ||
	     (profile & BTRFS_BLOCK_GROUP_RAID10 && nstripes < 4) ||
	     (profile & BTRFS_BLOCK_GROUP_RAID5 && nstripes < 2) ||
	     (profile & BTRFS_BLOCK_GROUP_RAID6 && nstripes < 3) ||
	     (!(profile & BTRFS_BLOCK_GROUP_DUP) && nstripes > ncands))) {
		/*
		 * Degraded: the profile needs devices that are missing. As the
		 * kernel, new chunks take what the present devices can hold:
		 * mirrored on two or more, else single data and dup tree blocks.
		 * A balance with convert brings the profile back once the
		 * missing device is replaced or removed.
		 */
		u64 was = profile;

		profile = ncands >= 2 ? BTRFS_BLOCK_GROUP_RAID1
			  : (type & BTRFS_BLOCK_GROUP_DATA) ? 0 : BTRFS_BLOCK_GROUP_DUP;
		type = (type & ~BTRFS_BLOCK_GROUP_PROFILE_MASK) | profile;
		nstripes = ncands >= 2 || (profile & BTRFS_BLOCK_GROUP_DUP) ? 2 : 1;
		sub = 1;
		blog_warn(es->log, "degraded: a new %s chunk is %s instead of %s (%zu device%s "
				   "present)",
			  type & BTRFS_BLOCK_GROUP_DATA ? "data" : type & BTRFS_BLOCK_GROUP_SYSTEM
			  ? "system" : "metadata", butter_profile_name(profile),
			  butter_profile_name(was), ncands, ncands == 1 ? "" : "s");
	}
	if ((profile & BTRFS_BLOCK_GROUP_RAID0 && nstripes < 2) ||
	    (profile & BTRFS_BLOCK_GROUP_RAID10 && nstripes < 4) ||
	    (profile & BTRFS_BLOCK_GROUP_RAID5 && nstripes < 2) ||
	    (profile & BTRFS_BLOCK_GROUP_RAID6 && nstripes < 3) ||
	    (!(profile & BTRFS_BLOCK_GROUP_DUP) && nstripes > ncands) || ncands == 0) {
		free(cands);
		return -ENOSPC;
	}
	data_stripes = profile & BTRFS_BLOCK_GROUP_RAID0	? nstripes
		       : profile & BTRFS_BLOCK_GROUP_RAID10 ? nstripes / 2
		       : profile & BTRFS_BLOCK_GROUP_RAID5  ? nstripes - 1
		       : profile & BTRFS_BLOCK_GROUP_RAID6  ? nstripes - 2
							    : 1;
	/* shrink the stripe to what the chosen devices can hold */
	for (i = 0; i < (profile & BTRFS_BLOCK_GROUP_DUP ? 1 : nstripes); i++) {
		u64 cap = cands[i].largest;

		if (profile & BTRFS_BLOCK_GROUP_DUP)
			cap /= 2;
		cap = cap / (1ULL << 20) * (1ULL << 20);
		if (cap < stripe_size)
			stripe_size = cap;
	}
	if (stripe_size < (1ULL << 20)) {
		free(cands);
		return -ENOSPC;
	}
	length = stripe_size * data_stripes;
	chunk = calloc(1, btrfs_chunk_item_size(nstripes));
	if (!chunk) {
		free(cands);
		return -ENOMEM;
	}
	for (i = 0; i < nstripes; i++) {
		struct btrfs_device *dev = cands[profile & BTRFS_BLOCK_GROUP_DUP ? 0 : i].dev;
		struct dev_space *ds = devspace(es, dev->devid);
		struct btrfs_stripe *s = btrfs_chunk_stripe(chunk, i);
		u64 phys;

		ret = range_find(&ds->free, stripe_size, 1ULL << 20, 0, &phys);
		if (ret == 0)
			ret = range_remove(&ds->free, phys, phys + stripe_size);
		if (ret) {
			/* give back what this chunk took */
			for (k = 0; k < i; k++) {
				const struct btrfs_stripe *o = btrfs_chunk_stripe(chunk, k);
				struct dev_space *ods = devspace(es, btrfs_stripe_devid(o));

				range_add(&ods->free, btrfs_stripe_offset(o),
					  btrfs_stripe_offset(o) + stripe_size);
			}
			free(chunk);
			free(cands);
			return ret;
		}
		btrfs_set_stripe_devid(s, dev->devid);
		btrfs_set_stripe_offset(s, phys);
		memcpy(s->dev_uuid, dev->uuid, BTRFS_UUID_SIZE);
	}
	if (vol->nchunks) {
		const struct chunk_map *last = vol->chunks[vol->nchunks - 1];

		start = last->logical + last->length;
	}
	if (start < es->logical_floor)
		start = es->logical_floor;
	start = (start + (1ULL << 20) - 1) / (1ULL << 20) * (1ULL << 20);
	btrfs_set_chunk_length(chunk, length);
	btrfs_set_chunk_owner(chunk, BTRFS_EXTENT_TREE_OBJECTID);
	btrfs_set_chunk_stripe_len(chunk, BTRFS_STRIPE_LEN);
	btrfs_set_chunk_type(chunk, type);
	put_le32(&chunk->io_align, BTRFS_STRIPE_LEN);
	put_le32(&chunk->io_width, BTRFS_STRIPE_LEN);
	put_le32(&chunk->sector_size, vol->sectorsize);
	btrfs_set_chunk_num_stripes(chunk, (u16)nstripes);
	btrfs_set_chunk_sub_stripes(chunk, (u16)sub);
	ret = volumes_add_chunk(vol, start, chunk, (u32)btrfs_chunk_item_size(nstripes));
	free(chunk);
	free(cands);
	if (ret)
		return ret;
	{
		struct block_group *bg;
		const struct chunk_map *map = volumes_find_chunk(vol, start);

		for (i = 0; i < map->num_stripes; i++)
			map->stripes[i].dev->bytes_used += stripe_size;
		ret = extent_add_block_group(es, start, length, type, 0, 1, &bg);
		if (ret)
			return ret;
		ret = range_add(&bg->free, start, start + length);
		if (ret == 0)
			ret = extent_exclude_super_stripes(es, bg);
		if (ret)
			return ret;
		extent_note_unusable(bg);
	}
	*logical = start;
	return 0;
}

static int update_dev_item(struct extent_state *es, struct tree_trans *t,
			   const struct btrfs_device *dev)
{
	struct btrfs_key key = { BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, dev->devid };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(t, es->chunk_root, &key, &path, 0, 1);
	if (ret == 0) {
		u32 size;
		struct btrfs_dev_item *di = (void *)path_item_mut(&path, &size);

		if (size >= sizeof(*di)) {
			btrfs_set_dev_item_bytes_used(di, dev->bytes_used);
			btrfs_set_dev_item_total_bytes(di, dev->total_bytes);
		}
	} else if (ret == 1) {
		ret = BLOG_CORRUPT(es->log, "device %llu has no dev item",
				   (unsigned long long)dev->devid);
	}
	tree_path_release(es->cache, &path);
	return ret;
}

int chunk_insert_items(struct extent_state *es, struct tree_trans *t, u64 logical)
{
	struct btrfs_volumes *vol = es->vol;
	const struct chunk_map *map = volumes_find_chunk(vol, logical);
	struct btrfs_super_block *sb = &vol->super;
	struct btrfs_chunk *chunk;
	struct btrfs_key key;
	u32 size, i;
	u64 stripe_size;
	int ret;

	if (!map || map->logical != logical)
		return -ENOENT;
	size = (u32)btrfs_chunk_item_size(map->num_stripes);
	chunk = calloc(1, size);
	if (!chunk)
		return -ENOMEM;
	stripe_size = chunk_stripe_size(map);
	btrfs_set_chunk_length(chunk, map->length);
	btrfs_set_chunk_owner(chunk, BTRFS_EXTENT_TREE_OBJECTID);
	btrfs_set_chunk_stripe_len(chunk, map->stripe_len);
	btrfs_set_chunk_type(chunk, map->type);
	put_le32(&chunk->io_align, (u32)map->stripe_len);
	put_le32(&chunk->io_width, (u32)map->stripe_len);
	put_le32(&chunk->sector_size, vol->sectorsize);
	btrfs_set_chunk_num_stripes(chunk, (u16)map->num_stripes);
	btrfs_set_chunk_sub_stripes(chunk, (u16)map->sub_stripes);
	for (i = 0; i < map->num_stripes; i++) {
		struct btrfs_stripe *s = btrfs_chunk_stripe(chunk, i);

		btrfs_set_stripe_devid(s, map->stripes[i].devid);
		btrfs_set_stripe_offset(s, map->stripes[i].physical);
		memcpy(s->dev_uuid, map->stripes[i].dev->uuid, BTRFS_UUID_SIZE);
	}
	key.objectid = BTRFS_FIRST_CHUNK_TREE_OBJECTID;
	key.type = BTRFS_CHUNK_ITEM_KEY;
	key.offset = logical;
	ret = tree_insert_item(t, es->chunk_root, &key, chunk, size);
	if (ret == 0 && (map->type & BTRFS_BLOCK_GROUP_SYSTEM)) {
		u32 cur = btrfs_super_sys_array_size(sb);
		struct btrfs_disk_key dk;

		if (cur + sizeof(dk) + size > BTRFS_SYSTEM_CHUNK_ARRAY_SIZE) {
			ret = -EFBIG;
		} else {
			btrfs_cpu_to_disk_key(&dk, &key);
			memcpy(sb->sys_chunk_array + cur, &dk, sizeof(dk));
			memcpy(sb->sys_chunk_array + cur + sizeof(dk), chunk, size);
			put_le32(&sb->sys_chunk_array_size, cur + (u32)sizeof(dk) + size);
		}
	}
	free(chunk);
	for (i = 0; i < map->num_stripes && ret == 0; i++) {
		struct btrfs_dev_extent de;

		memset(&de, 0, sizeof(de));
		put_le64(&de.chunk_tree, BTRFS_CHUNK_TREE_OBJECTID);
		put_le64(&de.chunk_objectid, BTRFS_FIRST_CHUNK_TREE_OBJECTID);
		put_le64(&de.chunk_offset, logical);
		put_le64(&de.length, stripe_size);
		memcpy(de.chunk_tree_uuid, vol->chunk_tree_uuid, BTRFS_UUID_SIZE);
		key.objectid = map->stripes[i].devid;
		key.type = BTRFS_DEV_EXTENT_KEY;
		key.offset = map->stripes[i].physical;
		ret = tree_insert_item(t, es->dev_root, &key, &de, sizeof(de));
	}
	for (i = 0; i < map->num_stripes && ret == 0; i++)
		ret = update_dev_item(es, t, map->stripes[i].dev);
	return ret;
}

int chunk_resize_device(struct extent_state *es, struct tree_trans *t, u64 devid, u64 *size)
{
	struct btrfs_volumes *vol = es->vol;
	struct dev_space *ds = devspace(es, devid);
	struct btrfs_device *dev = NULL;
	u64 want = *size, last_end = RESERVED_BYTES, old;
	size_t i;
	int ret;

	for (i = 0; i < vol->ndevs; i++)
		if (vol->devs[i]->devid == devid)
			dev = vol->devs[i];
	if (!dev || !ds || !dev->bdev)
		return -ENODEV;
	old = dev->total_bytes;
	/* the end of the last chunk stripe on the device */
	for (i = 0; i < vol->nchunks; i++) {
		const struct chunk_map *map = vol->chunks[i];
		u32 s;

		for (s = 0; s < map->num_stripes; s++) {
			u64 end = map->stripes[s].physical + chunk_stripe_size(map);

			if (map->stripes[s].devid == devid && end > last_end)
				last_end = end;
		}
	}
	if (want == 0)
		want = last_end;
	want &= ~((u64)vol->sectorsize - 1);
	if (want < last_end) {
		blog_err(es->log, "device %llu: chunks are still allocated up to %llu",
			 (unsigned long long)devid, (unsigned long long)last_end);
		return -ENOSPC;
	}
	if (want > dev->bdev->size) {
		blog_err(es->log, "device %llu (%s) has only %llu bytes",
			 (unsigned long long)devid, dev->path ? dev->path : "?",
			 (unsigned long long)dev->bdev->size);
		return -EFBIG;
	}
	if (want == old) {
		*size = old;
		return 0;
	}
	ret = want < old ? range_remove(&ds->free, want, old > want ? old : want)
			 : range_add(&ds->free, old > RESERVED_BYTES ? old : RESERVED_BYTES, want);
	if (ret)
		return ret;
	dev->total_bytes = want;
	ds->limit = 0;
	btrfs_set_super_total_bytes(&vol->super, btrfs_super_total_bytes(&vol->super) - old + want);
	ret = update_dev_item(es, t, dev);
	if (ret == 0)
		*size = want;
	return ret;
}

int chunk_add_device(struct extent_state *es, struct tree_trans *t, const struct btrfs_device *dev)
{
	struct btrfs_volumes *vol = es->vol;
	struct btrfs_key key = { BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, dev->devid };
	struct btrfs_dev_item di;
	struct dev_space *v, *ds;
	int ret;

	if (devspace(es, dev->devid) || dev->total_bytes <= RESERVED_BYTES)
		return -EINVAL;
	v = realloc(es->devspace, (es->ndevspace + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	es->devspace = v;
	ds = &es->devspace[es->ndevspace];
	ds->devid = dev->devid;
	range_set_init(&ds->free);
	ret = range_add(&ds->free, RESERVED_BYTES, dev->total_bytes);
	if (ret)
		return ret;
	es->ndevspace++;
	memset(&di, 0, sizeof(di));
	btrfs_set_dev_item_devid(&di, dev->devid);
	btrfs_set_dev_item_total_bytes(&di, dev->total_bytes);
	btrfs_set_dev_item_bytes_used(&di, 0);
	put_le32(&di.io_align, vol->sectorsize);
	put_le32(&di.io_width, vol->sectorsize);
	put_le32(&di.sector_size, vol->sectorsize);
	memcpy(di.uuid, dev->uuid, BTRFS_UUID_SIZE);
	memcpy(di.fsid, vol->meta_fsid, BTRFS_FSID_SIZE);
	ret = tree_insert_item(t, es->chunk_root, &key, &di, sizeof(di));
	if (ret)
		return ret;
	btrfs_set_super_num_devices(&vol->super, btrfs_super_num_devices(&vol->super) + 1);
	btrfs_set_super_total_bytes(&vol->super,
				    btrfs_super_total_bytes(&vol->super) + dev->total_bytes);
	return 0;
}

u64 chunk_max_size(const struct extent_state *es, u64 want)
{
	u64 cap = btrfs_super_total_bytes(&es->vol->super) / 10 & ~((1ULL << 20) - 1);

	if (cap < (16ULL << 20))
		cap = 16ULL << 20;
	if (es->chunk_cap && cap > es->chunk_cap)
		cap = es->chunk_cap;
	return want < cap ? want : cap;
}

/* Delete the item at exactly @key of @root; -EUCLEAN if it is not there. */
static int delete_exact(struct extent_state *es, struct tree_trans *t, struct tree_root *root,
			const struct btrfs_key *key, const char *what)
{
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(t, root, key, &path, 0, 1);
	if (ret == 0)
		ret = tree_del_items(t, root, &path, 1);
	else if (ret == 1)
		ret = BLOG_CORRUPT(es->log, "%s (%llu, %u, %llu) is missing", what,
				   (unsigned long long)key->objectid, key->type,
				   (unsigned long long)key->offset);
	tree_path_release(es->cache, &path);
	return ret;
}

/* Drop the sys_chunk_array entry of chunk @logical from the superblock. */
static int drop_sys_array_entry(struct extent_state *es, u64 logical)
{
	struct btrfs_super_block *sb = &es->vol->super;
	u32 size = btrfs_super_sys_array_size(sb), pos = 0;

	while (pos + sizeof(struct btrfs_disk_key) + sizeof(struct btrfs_chunk) <= size) {
		struct btrfs_disk_key dk;
		struct btrfs_key key;
		const struct btrfs_chunk *c;
		u32 len;

		memcpy(&dk, sb->sys_chunk_array + pos, sizeof(dk));
		btrfs_disk_to_cpu_key(&key, &dk);
		c = (const void *)(sb->sys_chunk_array + pos + sizeof(dk));
		len = (u32)sizeof(dk) + (u32)btrfs_chunk_item_size(btrfs_chunk_num_stripes(c));
		if (pos + len > size)
			break;
		if (key.offset == logical) {
			memmove(sb->sys_chunk_array + pos, sb->sys_chunk_array + pos + len,
				size - pos - len);
			memset(sb->sys_chunk_array + size - len, 0, len);
			put_le32(&sb->sys_chunk_array_size, size - len);
			return 0;
		}
		pos += len;
	}
	return BLOG_CORRUPT(es->log, "system chunk %llu is not in the superblock's array",
			    (unsigned long long)logical);
}

int chunk_remove(struct extent_state *es, struct tree_trans *t, u64 logical,
		 struct chunk_freed **freed, size_t *nfreed)
{
	struct btrfs_volumes *vol = es->vol;
	const struct chunk_map *map = volumes_find_chunk(vol, logical);
	struct block_group *bg = extent_find_bg(es, logical);
	struct btrfs_key key;
	u64 stripe_size, type, length;
	u32 i;
	size_t k;
	int ret;

	if (!map || map->logical != logical || !bg || bg->start != logical)
		return -ENOENT;
	if (bg->used)
		return BLOG_CORRUPT(es->log, "block group %llu still holds %llu bytes",
				    (unsigned long long)logical, (unsigned long long)bg->used);
	type = map->type;
	length = map->length;
	stripe_size = chunk_stripe_size(map);

	/* the block group: item, free space tree entries, the in-memory group */
	key.objectid = logical;
	key.type = BTRFS_BLOCK_GROUP_ITEM_KEY;
	key.offset = length;
	ret = bg->is_new ? 0 : delete_exact(es, t, es->bg_root, &key, "block group item");
	if (ret == 0)
		ret = extent_fst_drop_group(es, t, logical, length);
	if (ret)
		return ret;
	for (k = 0; k < es->nbgs; k++)
		if (es->bgs[k] == bg)
			break;
	memmove(&es->bgs[k], &es->bgs[k + 1], (es->nbgs - k - 1) * sizeof(es->bgs[0]));
	es->nbgs--;
	range_set_free(&bg->free);
	free(bg);

	/* dev extents and the devices' bytes used */
	for (i = 0; i < map->num_stripes; i++) {
		struct chunk_freed *f;

		key.objectid = map->stripes[i].devid;
		key.type = BTRFS_DEV_EXTENT_KEY;
		key.offset = map->stripes[i].physical;
		ret = delete_exact(es, t, es->dev_root, &key, "dev extent");
		if (ret)
			return ret;
		f = realloc(*freed, (*nfreed + 1) * sizeof(*f));
		if (!f)
			return -ENOMEM;
		*freed = f;
		f[*nfreed].devid = map->stripes[i].devid;
		f[*nfreed].physical = map->stripes[i].physical;
		f[*nfreed].length = stripe_size;
		(*nfreed)++;
		if (map->stripes[i].dev) {
			struct btrfs_device *dev = map->stripes[i].dev;

			dev->bytes_used -= dev->bytes_used >= stripe_size ? stripe_size : dev->bytes_used;
		}
	}
	for (i = 0; i < map->num_stripes; i++) {
		u32 j;

		for (j = 0; j < i; j++)
			if (map->stripes[j].devid == map->stripes[i].devid)
				break;
		if (j == i && map->stripes[i].dev) {
			ret = update_dev_item(es, t, map->stripes[i].dev);
			if (ret)
				return ret;
		}
	}

	/* the chunk item, the superblock's copy of a system chunk, the map */
	key.objectid = BTRFS_FIRST_CHUNK_TREE_OBJECTID;
	key.type = BTRFS_CHUNK_ITEM_KEY;
	key.offset = logical;
	ret = delete_exact(es, t, es->chunk_root, &key, "chunk item");
	if (ret == 0 && (type & BTRFS_BLOCK_GROUP_SYSTEM))
		ret = drop_sys_array_entry(es, logical);
	if (ret)
		return ret;
	if (es->logical_floor < logical + length)
		es->logical_floor = logical + length;
	return volumes_remove_chunk(vol, logical);
}

int chunk_release_devspace(struct extent_state *es, const struct chunk_freed *freed, size_t n)
{
	size_t i;
	int ret;

	for (i = 0; i < n; i++) {
		struct dev_space *ds = devspace(es, freed[i].devid);

		u64 end = freed[i].physical + freed[i].length;

		if (!ds)
			continue; /* the device itself went away */
		if (ds->limit && end > ds->limit)
			end = ds->limit; /* a shrink keeps what lies past its new end out */
		if (end <= freed[i].physical)
			continue;
		ret = range_add(&ds->free, freed[i].physical, end);
		if (ret)
			return ret;
	}
	return 0;
}

int chunk_remove_device(struct extent_state *es, struct tree_trans *t, u64 devid)
{
	struct btrfs_volumes *vol = es->vol;
	struct btrfs_key key = { BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, devid };
	struct btrfs_device *dev = NULL;
	struct tree_path path;
	size_t i;
	int ret;

	for (i = 0; i < vol->ndevs; i++)
		if (vol->devs[i]->devid == devid)
			dev = vol->devs[i];
	if (!dev)
		return -ENODEV;
	for (i = 0; i < vol->nchunks; i++)
		for (u32 s = 0; s < vol->chunks[i]->num_stripes; s++)
			if (vol->chunks[i]->stripes[s].devid == devid)
				return BLOG_CORRUPT(es->log, "device %llu still holds chunk %llu",
						    (unsigned long long)devid,
						    (unsigned long long)vol->chunks[i]->logical);
	ret = delete_exact(es, t, es->chunk_root, &key, "dev item");
	if (ret)
		return ret;
	/* its statistics item, if it has one */
	key.objectid = BTRFS_DEV_STATS_OBJECTID;
	key.type = BTRFS_PERSISTENT_ITEM_KEY;
	key.offset = devid;
	tree_path_init(&path);
	ret = tree_search_slot(t, es->dev_root, &key, &path, 0, 1);
	if (ret == 0)
		ret = tree_del_items(t, es->dev_root, &path, 1);
	tree_path_release(es->cache, &path);
	if (ret < 0)
		return ret;
	for (i = 0; i < es->ndevspace; i++) {
		if (es->devspace[i].devid != devid)
			continue;
		range_set_free(&es->devspace[i].free);
		memmove(&es->devspace[i], &es->devspace[i + 1],
			(es->ndevspace - i - 1) * sizeof(es->devspace[0]));
		es->ndevspace--;
		break;
	}
	btrfs_set_super_num_devices(&vol->super, btrfs_super_num_devices(&vol->super) - 1);
	btrfs_set_super_total_bytes(&vol->super,
				    btrfs_super_total_bytes(&vol->super) - dev->total_bytes);
	return 0;
}
