/*
 * volumes.c — the device set and the chunk map (logical → physical).
 *
 * Profiles and how a logical offset inside a chunk maps (stripe_len = 64 KiB):
 *   single, dup, raid1, raid1c3, raid1c4   every stripe holds the whole chunk;
 *                                          mirror m reads stripe m-1.
 *   raid0     stripe_nr = off / stripe_len; stripe = stripe_nr % n;
 *             row = stripe_nr / n.
 *   raid10    groups of sub_stripes mirrors; factor = n / sub_stripes;
 *             stripe = (stripe_nr % factor) * sub_stripes + (mirror - 1).
 *   raid5/6   rows of ndata data stripes + P (+ Q); data stripe d of row r
 *             lives on stripe (r + d) % n, P on (r + ndata) % n, Q on
 *             (r + ndata + 1) % n — the parity rotates by one per row.
 *
 * Copies (mirror numbers) of a RAID5/6 position:
 *   1          read the data stripe directly
 *   2          rebuild it from the other data stripes and P (and Q if one
 *              other stripe is unreadable, RAID6)
 *   3 (RAID6)  rebuild it treating P as bad too (uses Q)
 *   4.. (RAID6) rebuild it treating one other data stripe as bad too, so a
 *              silently corrupt neighbour can be routed around.
 * The caller checks checksums and walks the mirrors until one is good.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/checksum.h"
#include "volumes/raid56.h"
#include "volumes/volumes.h"

static u32 parity_stripes(const struct chunk_map *map)
{
	if (map->type & BTRFS_BLOCK_GROUP_RAID6)
		return 2;
	if (map->type & BTRFS_BLOCK_GROUP_RAID5)
		return 1;
	return 0;
}

u32 chunk_data_stripes(const struct chunk_map *map)
{
	u32 np = parity_stripes(map);

	return np ? map->num_stripes - np : 1;
}

u64 chunk_stripe_size(const struct chunk_map *map)
{
	if (map->type & BTRFS_BLOCK_GROUP_RAID0)
		return map->length / map->num_stripes;
	if (map->type & BTRFS_BLOCK_GROUP_RAID10)
		return map->length * map->sub_stripes / map->num_stripes;
	return map->length / chunk_data_stripes(map);
}

/* How many stripes of a chunk may be missing while every byte stays readable. */
static u32 chunk_tolerance(const struct chunk_map *map)
{
	if (map->type & BTRFS_BLOCK_GROUP_RAID1_MASK)
		return map->num_stripes - 1;
	if (map->type & BTRFS_BLOCK_GROUP_RAID10)
		return map->sub_stripes - 1;
	return parity_stripes(map);
}

int chunk_map_position(const struct chunk_map *map, u64 offset, int mirror, u32 *stripe_index,
		       u64 *physical, u64 *contiguous)
{
	u64 stripe_nr, stripe_off, row;
	u32 idx, n = map->num_stripes;

	if (offset >= map->length || mirror < 1)
		return -EINVAL;
	if (!(map->type & (BTRFS_BLOCK_GROUP_RAID0 | BTRFS_BLOCK_GROUP_RAID10 |
			   BTRFS_BLOCK_GROUP_RAID56_MASK))) {
		if ((u32)mirror > n)
			return -EINVAL;
		*stripe_index = (u32)mirror - 1;
		*physical = map->stripes[mirror - 1].physical + offset;
		*contiguous = map->length - offset;
		return 0;
	}
	stripe_nr = offset / map->stripe_len;
	stripe_off = offset % map->stripe_len;
	if (map->type & BTRFS_BLOCK_GROUP_RAID0) {
		if (mirror != 1)
			return -EINVAL;
		idx = (u32)(stripe_nr % n);
		row = stripe_nr / n;
	} else if (map->type & BTRFS_BLOCK_GROUP_RAID10) {
		u32 factor = n / map->sub_stripes;

		if ((u32)mirror > map->sub_stripes)
			return -EINVAL;
		idx = (u32)(stripe_nr % factor) * map->sub_stripes + (u32)mirror - 1;
		row = stripe_nr / factor;
	} else {
		u32 ndata = chunk_data_stripes(map);

		if (mirror != 1)
			return -EINVAL;
		row = stripe_nr / ndata;
		idx = (u32)((row + stripe_nr % ndata) % n);
	}
	*stripe_index = idx;
	*physical = map->stripes[idx].physical + row * map->stripe_len + stripe_off;
	*contiguous = map->stripe_len - stripe_off;
	return 0;
}

const struct chunk_map *volumes_find_chunk(const struct btrfs_volumes *vol, u64 logical)
{
	size_t lo = 0, hi = vol->nchunks;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct chunk_map *m = vol->chunks[mid];

		if (logical < m->logical)
			hi = mid;
		else if (logical - m->logical >= m->length)
			lo = mid + 1;
		else
			return m;
	}
	return NULL;
}

int volumes_num_copies(const struct btrfs_volumes *vol, u64 logical)
{
	const struct chunk_map *map = volumes_find_chunk(vol, logical);

	if (!map)
		return 1;
	if (map->type & BTRFS_BLOCK_GROUP_RAID5)
		return 2;
	if (map->type & BTRFS_BLOCK_GROUP_RAID6)
		return (int)map->num_stripes;
	if (map->type & BTRFS_BLOCK_GROUP_RAID10)
		return (int)map->sub_stripes;
	if (map->type & BTRFS_BLOCK_GROUP_RAID0)
		return 1;
	return (int)map->num_stripes;
}

static int stripe_read(struct btrfs_volumes *vol, const struct map_stripe *s, void *buf,
		       size_t len, u64 physical)
{
	int ret;

	if (!s->dev || !s->dev->bdev || s->dev->avoid_reads)
		return -EIO;
	ret = blockdev_read(s->dev->bdev, buf, len, physical);
	if (ret) {
		/* the caller names the error once, with what it is reading */
		volumes_dev_stat_inc(s->dev, BTRFS_DEV_STAT_READ_ERRS);
		blog_debug(vol->log, "read error on %s (devid %llu) at physical %llu: %d",
			   s->dev->path ? s->dev->path : "?", (unsigned long long)s->devid,
			   (unsigned long long)physical, ret);
	}
	return ret ? -EIO : 0;
}

void volumes_dev_stat_inc(struct btrfs_device *dev, int which)
{
	if (!dev || which < 0 || which >= BTRFS_DEV_STAT_VALUES_MAX)
		return;
	__atomic_fetch_add(&dev->stats[which], 1, __ATOMIC_RELAXED);
	__atomic_store_n(&dev->stats_dirty, 1, __ATOMIC_RELEASE);
}

void volumes_set_write_through(struct btrfs_volumes *vol, int on)
{
	for (size_t i = 0; i < vol->ndevs; i++)
		vol->devs[i]->write_through = on;
}

int volumes_dev_write(struct btrfs_device *dev, const void *buf, size_t len, u64 physical)
{
	int ret = dev->write_through ? blockdev_write_through(dev->bdev, buf, len, physical)
				     : blockdev_write(dev->bdev, buf, len, physical);

	if (ret) {
		volumes_dev_stat_inc(dev, BTRFS_DEV_STAT_WRITE_ERRS);
		return ret;
	}
	if (dev->replace_target && !dev->replace_error) {
		int err = blockdev_write(dev->replace_target, buf, len, physical);

		if (err)
			dev->replace_error = err;
	}
	return 0;
}

int volumes_stats_dirty(const struct btrfs_volumes *vol)
{
	size_t i;

	for (i = 0; i < vol->ndevs; i++)
		if (__atomic_load_n(&vol->devs[i]->stats_dirty, __ATOMIC_ACQUIRE))
			return 1;
	return 0;
}

int volumes_locate(const struct btrfs_volumes *vol, u64 logical, int mirror,
		   struct btrfs_device **dev, u64 *physical, int *rebuilt)
{
	const struct chunk_map *map = volumes_find_chunk(vol, logical);
	u64 contiguous;
	u32 idx;

	*dev = NULL;
	*physical = 0;
	*rebuilt = 0;
	if (!map)
		return -ENOENT;
	if (mirror < 1 || mirror > volumes_num_copies(vol, logical))
		return -EIO;
	if (map->type & BTRFS_BLOCK_GROUP_RAID56_MASK) {
		*rebuilt = mirror > 1;
		mirror = 1;
	}
	if (chunk_map_position(map, logical - map->logical, mirror, &idx, physical, &contiguous))
		return -EIO;
	*dev = map->stripes[idx].dev;
	return 0;
}

const char *volumes_describe(const struct btrfs_volumes *vol, u64 logical, int mirror,
			     char *buf, size_t size)
{
	struct btrfs_device *dev;
	u64 physical;
	int rebuilt;

	if (volumes_locate(vol, logical, mirror, &dev, &physical, &rebuilt)) {
		snprintf(buf, size, "logical %llu copy %d (not mapped)", (unsigned long long)logical,
			 mirror);
		return buf;
	}
	snprintf(buf, size, "logical %llu copy %d %s%s (devid %llu) physical %llu",
		 (unsigned long long)logical, mirror,
		 rebuilt ? "rebuilt from parity for the data stripe on " : "on ",
		 !dev || !dev->bdev ? "missing device" : dev->path ? dev->path : "?",
		 (unsigned long long)(dev ? dev->devid : 0), (unsigned long long)physical);
	return buf;
}

int volumes_copy_missing(const struct btrfs_volumes *vol, u64 logical, int mirror)
{
	struct btrfs_device *dev;
	u64 physical;
	int rebuilt;

	if (volumes_locate(vol, logical, mirror, &dev, &physical, &rebuilt))
		return 0;
	return !rebuilt && (!dev || !dev->bdev || blockdev_gone(dev->bdev));
}

void volumes_count_error(struct btrfs_volumes *vol, u64 logical, int mirror, int which)
{
	struct btrfs_device *dev;
	u64 physical;
	int rebuilt;

	if (volumes_locate(vol, logical, mirror, &dev, &physical, &rebuilt) == 0 && !rebuilt &&
	    dev && dev->bdev)
		volumes_dev_stat_inc(dev, which);
}

/*
 * Rebuild @len bytes of data stripe @data_idx in row @row, starting
 * @stripe_off into the stripe, as copy @mirror (>= 2) describes.
 */
static int raid56_rebuild(struct btrfs_volumes *vol, const struct chunk_map *map, u64 row,
			  u64 stripe_off, u32 data_idx, int mirror, void *out, size_t len)
{
	u32 n = map->num_stripes, np = parity_stripes(map), ndata = n - np, k;
	unsigned char **blocks;
	unsigned char *mem;
	int fail[2] = { (int)data_idx, -1 }, nfail = 1, ret = -EIO;

	if (mirror == 3 && np == 2)
		fail[nfail++] = (int)ndata; /* P treated as bad */
	else if (mirror >= 4 && np == 2) {
		u32 other = (u32)(mirror - 4);

		if (other >= data_idx)
			other++;
		if (other >= ndata)
			return -EIO;
		fail[nfail++] = (int)other;
	}
	blocks = calloc(n, sizeof(*blocks));
	mem = malloc((size_t)n * len);
	if (!blocks || !mem) {
		ret = -ENOMEM;
		goto out;
	}
	for (k = 0; k < n; k++) {
		u32 idx = (u32)((row + k) % n);
		u64 physical = map->stripes[idx].physical + row * map->stripe_len + stripe_off;

		blocks[k] = mem + (size_t)k * len;
		if ((int)k == fail[0] || (int)k == fail[1])
			continue;
		if (stripe_read(vol, &map->stripes[idx], blocks[k], len, physical)) {
			if (nfail == (int)np)
				goto out;
			fail[nfail++] = (int)k;
		}
	}
	if (np == 1 && nfail > 1)
		goto out;
	ret = raid56_recover((int)ndata, (int)np, blocks, len, fail[0], nfail > 1 ? fail[1] : -1);
	if (ret == 0)
		memcpy(out, blocks[data_idx], len);
	else
		ret = -EIO;
out:
	free(mem);
	free(blocks);
	return ret;
}

int volumes_read(struct btrfs_volumes *vol, u64 logical, void *buf, size_t len, int mirror)
{
	const struct chunk_map *map = volumes_find_chunk(vol, logical);
	unsigned char *p = buf;
	u64 offset;

	if (!map)
		return -ENOENT;
	offset = logical - map->logical;
	if (len > map->length - offset)
		return -ENOENT;
	while (len) {
		u32 idx;
		u64 physical, contiguous;
		size_t piece;
		int ret;

		if ((map->type & BTRFS_BLOCK_GROUP_RAID56_MASK) && mirror > 1) {
			u32 ndata = chunk_data_stripes(map);
			u64 stripe_nr = offset / map->stripe_len;
			u64 stripe_off = offset % map->stripe_len;

			piece = (size_t)(map->stripe_len - stripe_off);
			if (piece > len)
				piece = len;
			if (mirror > volumes_num_copies(vol, logical))
				return -EIO;
			ret = raid56_rebuild(vol, map, stripe_nr / ndata, stripe_off,
					     (u32)(stripe_nr % ndata), mirror, p, piece);
		} else {
			ret = chunk_map_position(map, offset, mirror, &idx, &physical, &contiguous);
			if (ret)
				return -EIO;
			piece = contiguous < len ? (size_t)contiguous : len;
			ret = stripe_read(vol, &map->stripes[idx], p, piece, physical);
		}
		if (ret)
			return ret;
		p += piece;
		len -= piece;
		offset += piece;
	}
	return 0;
}

static struct btrfs_device *find_device(struct btrfs_volumes *vol, u64 devid)
{
	size_t i;

	for (i = 0; i < vol->ndevs; i++)
		if (vol->devs[i]->devid == devid)
			return vol->devs[i];
	return NULL;
}

int volumes_insert_device(struct btrfs_volumes *vol, struct btrfs_device *dev)
{
	struct btrfs_device **devs = realloc(vol->devs, (vol->ndevs + 1) * sizeof(*devs));
	size_t i;

	if (!devs)
		return -ENOMEM;
	vol->devs = devs;
	for (i = vol->ndevs; i > 0 && devs[i - 1]->devid > dev->devid; i--)
		devs[i] = devs[i - 1];
	devs[i] = dev;
	vol->ndevs++;
	return 0;
}

int volumes_add_dev_item(struct btrfs_volumes *vol, const struct btrfs_dev_item *item)
{
	u64 devid = btrfs_dev_item_devid(item);
	struct btrfs_device *dev = find_device(vol, devid);
	int ret;

	if (!dev) {
		dev = calloc(1, sizeof(*dev));
		if (!dev)
			return -ENOMEM;
		dev->devid = devid;
		memcpy(dev->uuid, item->uuid, BTRFS_UUID_SIZE);
		ret = volumes_insert_device(vol, dev);
		if (ret) {
			free(dev);
			return ret;
		}
	} else if (memcmp(dev->uuid, item->uuid, BTRFS_UUID_SIZE) != 0) {
		blog_warn(vol->log, "device %llu (%s): uuid differs from the chunk tree's",
			  (unsigned long long)devid, dev->path ? dev->path : "?");
	}
	dev->total_bytes = btrfs_dev_item_total_bytes(item);
	dev->bytes_used = btrfs_dev_item_bytes_used(item);
	dev->listed = 1;
	return 0;
}

void volumes_drop_unlisted(struct btrfs_volumes *vol)
{
	size_t i = 0;

	while (i < vol->ndevs) {
		struct btrfs_device *dev = vol->devs[i];

		int used = 0;

		for (size_t c = 0; c < vol->nchunks && !used; c++)
			for (u32 k = 0; k < vol->chunks[c]->num_stripes; k++)
				used |= vol->chunks[c]->stripes[k].devid == dev->devid;
		if (dev->listed || used) {
			i++;
			continue;
		}
		blog_warn(vol->log, "%s: devid %llu is no longer a device of this filesystem (removed; "
				    "its old superblock is ignored)", dev->path ? dev->path : "?",
			  (unsigned long long)dev->devid);
		memmove(&vol->devs[i], &vol->devs[i + 1], (vol->ndevs - i - 1) * sizeof(dev));
		vol->ndevs--;
		blockdev_close(dev->bdev);
		free(dev->path);
		free(dev);
	}
}

struct btrfs_device *volumes_detach_device(struct btrfs_volumes *vol, u64 devid)
{
	struct btrfs_device *dev;
	size_t i;

	for (i = 0; i < vol->ndevs; i++) {
		if (vol->devs[i]->devid != devid)
			continue;
		dev = vol->devs[i];
		memmove(&vol->devs[i], &vol->devs[i + 1], (vol->ndevs - i - 1) * sizeof(dev));
		vol->ndevs--;
		return dev;
	}
	return NULL;
}

int volumes_remove_chunk(struct btrfs_volumes *vol, u64 logical)
{
	size_t i;

	for (i = 0; i < vol->nchunks; i++) {
		if (vol->chunks[i]->logical != logical)
			continue;
		free(vol->chunks[i]);
		memmove(&vol->chunks[i], &vol->chunks[i + 1],
			(vol->nchunks - i - 1) * sizeof(vol->chunks[0]));
		vol->nchunks--;
		return 0;
	}
	return -ENOENT;
}

int volumes_add_chunk(struct btrfs_volumes *vol, u64 logical, const struct btrfs_chunk *chunk,
		      u32 item_size)
{
	u32 num_stripes, sub_stripes, i;
	u64 length, stripe_len, type;
	struct chunk_map *map;
	size_t pos;

	if (item_size < sizeof(struct btrfs_chunk))
		return BLOG_CORRUPT(vol->log, "chunk at %llu: item too small (%u)",
				    (unsigned long long)logical, item_size);
	num_stripes = btrfs_chunk_num_stripes(chunk);
	sub_stripes = btrfs_chunk_sub_stripes(chunk);
	length = btrfs_chunk_length(chunk);
	stripe_len = btrfs_chunk_stripe_len(chunk);
	type = btrfs_chunk_type(chunk);
	if (num_stripes == 0 || btrfs_chunk_item_size(num_stripes) != item_size)
		return BLOG_CORRUPT(vol->log, "chunk at %llu: %u stripes in an item of %u bytes",
				    (unsigned long long)logical, num_stripes, item_size);
	if (length == 0 || length % vol->sectorsize || logical % vol->sectorsize ||
	    logical + length < logical)
		return BLOG_CORRUPT(vol->log, "chunk at %llu: bad length %llu",
				    (unsigned long long)logical, (unsigned long long)length);
	if (stripe_len != BTRFS_STRIPE_LEN)
		return BLOG_CORRUPT(vol->log, "chunk at %llu: bad stripe_len %llu",
				    (unsigned long long)logical, (unsigned long long)stripe_len);
	if (__builtin_popcountll(type & BTRFS_BLOCK_GROUP_PROFILE_MASK) > 1 ||
	    !(type & BTRFS_BLOCK_GROUP_TYPE_MASK))
		return BLOG_CORRUPT(vol->log, "chunk at %llu: bad type %#llx",
				    (unsigned long long)logical, (unsigned long long)type);
	/* stripe counts each profile needs */
	if (((type & BTRFS_BLOCK_GROUP_RAID10) &&
	     (sub_stripes < 2 || num_stripes % sub_stripes || num_stripes < sub_stripes)) ||
	    ((type & BTRFS_BLOCK_GROUP_RAID1) && num_stripes < 2) ||
	    ((type & BTRFS_BLOCK_GROUP_RAID1C3) && num_stripes < 3) ||
	    ((type & BTRFS_BLOCK_GROUP_RAID1C4) && num_stripes < 4) ||
	    ((type & BTRFS_BLOCK_GROUP_RAID5) && num_stripes < 2) ||
	    ((type & BTRFS_BLOCK_GROUP_RAID6) && num_stripes < 3) ||
	    ((type & BTRFS_BLOCK_GROUP_DUP) && num_stripes != 2) ||
	    (!(type & BTRFS_BLOCK_GROUP_PROFILE_MASK) && num_stripes != 1))
		return BLOG_CORRUPT(vol->log, "chunk at %llu: %u stripes do not fit type %#llx",
				    (unsigned long long)logical, num_stripes,
				    (unsigned long long)type);
	/* already known (from the sys_chunk_array)? */
	if (volumes_find_chunk(vol, logical)) {
		const struct chunk_map *old = volumes_find_chunk(vol, logical);

		if (old->logical == logical && old->length == length)
			return 0;
		return BLOG_CORRUPT(vol->log, "chunk at %llu overlaps chunk at %llu",
				    (unsigned long long)logical, (unsigned long long)old->logical);
	}
	map = calloc(1, sizeof(*map) + num_stripes * sizeof(map->stripes[0]));
	if (!map)
		return -ENOMEM;
	map->logical = logical;
	map->length = length;
	map->type = type;
	map->stripe_len = stripe_len;
	map->num_stripes = num_stripes;
	map->sub_stripes = sub_stripes;
	for (i = 0; i < num_stripes; i++) {
		const struct btrfs_stripe *s = btrfs_chunk_stripe(chunk, i);
		struct btrfs_device *dev;

		map->stripes[i].devid = btrfs_stripe_devid(s);
		map->stripes[i].physical = btrfs_stripe_offset(s);
		dev = find_device(vol, map->stripes[i].devid);
		if (!dev) {
			/* a device we were not given and the chunk tree has not named yet */
			dev = calloc(1, sizeof(*dev));
			if (dev) {
				dev->devid = map->stripes[i].devid;
				memcpy(dev->uuid, s->dev_uuid, BTRFS_UUID_SIZE);
			}
			if (!dev || volumes_insert_device(vol, dev)) {
				free(dev);
				free(map);
				return -ENOMEM;
			}
		}
		map->stripes[i].dev = dev;
	}
	/* insert sorted, checking overlap with the neighbours */
	for (pos = vol->nchunks; pos > 0 && vol->chunks[pos - 1]->logical > logical; pos--)
		;
	if ((pos > 0 && vol->chunks[pos - 1]->logical + vol->chunks[pos - 1]->length > logical) ||
	    (pos < vol->nchunks && logical + length > vol->chunks[pos]->logical)) {
		free(map);
		return BLOG_CORRUPT(vol->log, "chunk at %llu overlaps a neighbour",
				    (unsigned long long)logical);
	}
	if (vol->nchunks == vol->chunks_cap) {
		size_t cap = vol->chunks_cap ? vol->chunks_cap * 2 : 16;
		struct chunk_map **c = realloc(vol->chunks, cap * sizeof(*c));

		if (!c) {
			free(map);
			return -ENOMEM;
		}
		vol->chunks = c;
		vol->chunks_cap = cap;
	}
	memmove(&vol->chunks[pos + 1], &vol->chunks[pos], (vol->nchunks - pos) * sizeof(map));
	vol->chunks[pos] = map;
	vol->nchunks++;
	return 0;
}

/* Parse the superblock's sys_chunk_array into the chunk map. */
static int load_sys_array(struct btrfs_volumes *vol)
{
	const struct btrfs_super_block *sb = &vol->super;
	u32 size = btrfs_super_sys_array_size(sb), pos = 0;

	while (pos < size) {
		struct btrfs_disk_key dkey;
		struct btrfs_key key;
		const struct btrfs_chunk *chunk;
		u32 num_stripes, item_size;
		int ret;

		if (size - pos < sizeof(dkey) + sizeof(struct btrfs_chunk))
			return BLOG_CORRUPT(vol->log, "sys_chunk_array: truncated entry at %u", pos);
		memcpy(&dkey, sb->sys_chunk_array + pos, sizeof(dkey));
		btrfs_disk_to_cpu_key(&key, &dkey);
		pos += sizeof(dkey);
		if (key.type != BTRFS_CHUNK_ITEM_KEY)
			return BLOG_CORRUPT(vol->log, "sys_chunk_array: key type %u at %u", key.type,
					    pos);
		chunk = (const struct btrfs_chunk *)(sb->sys_chunk_array + pos);
		num_stripes = btrfs_chunk_num_stripes(chunk);
		if (num_stripes == 0)
			return BLOG_CORRUPT(vol->log, "sys_chunk_array: chunk with no stripes");
		item_size = (u32)btrfs_chunk_item_size(num_stripes);
		if (item_size > size - pos)
			return BLOG_CORRUPT(vol->log, "sys_chunk_array: chunk overruns the array");
		if (!(btrfs_chunk_type(chunk) & BTRFS_BLOCK_GROUP_SYSTEM))
			return BLOG_CORRUPT(vol->log, "sys_chunk_array: non-system chunk at %llu",
					    (unsigned long long)key.offset);
		ret = volumes_add_chunk(vol, key.offset, chunk, item_size);
		if (ret)
			return ret;
		pos += item_size;
	}
	return 0;
}

int volumes_open(struct btrfs_volumes *vol, struct blockdev **bdevs, size_t nbdevs,
		 const struct blog *log, int allow_degraded)
{
	struct btrfs_super_block *sbs;
	const char *bad;
	size_t i, best = 0;
	int ret = 0;

	memset(vol, 0, sizeof(*vol));
	vol->log = log;
	vol->allow_degraded = allow_degraded;
	sbs = calloc(nbdevs ? nbdevs : 1, sizeof(*sbs));
	if (!sbs) {
		ret = -ENOMEM;
		goto fail;
	}
	for (i = 0; i < nbdevs; i++) {
		ret = btrfs_read_super(bdevs[i], log, &sbs[i]);
		if (ret) {
			blog_err(log, "%s: no valid btrfs superblock", bdevs[i]->name);
			goto fail;
		}
		if (i && memcmp(sbs[i].fsid, sbs[0].fsid, BTRFS_FSID_SIZE) != 0) {
			blog_err(log, "%s: belongs to another filesystem than %s", bdevs[i]->name,
				 bdevs[0]->name);
			ret = -EINVAL;
			goto fail;
		}
		if (btrfs_super_generation(&sbs[i]) > btrfs_super_generation(&sbs[best]))
			best = i;
	}
	memcpy(&vol->super, &sbs[best], sizeof(vol->super));
	bad = btrfs_unsupported_incompat(btrfs_super_incompat_flags(&vol->super));
	if (bad) {
		blog_err(log, "%s: unsupported incompat feature: %s (flags %#llx)", bdevs[0]->name,
			 bad, (unsigned long long)btrfs_super_incompat_flags(&vol->super));
		ret = -EOPNOTSUPP;
		goto fail;
	}
	vol->sectorsize = btrfs_super_sectorsize(&vol->super);
	vol->nodesize = btrfs_super_nodesize(&vol->super);
	vol->csum_type = btrfs_super_csum_type(&vol->super);
	vol->csum_size = (u32)btrfs_csum_size(vol->csum_type);
	memcpy(vol->fsid, vol->super.fsid, BTRFS_FSID_SIZE);
	if (btrfs_super_incompat_flags(&vol->super) & BTRFS_FEATURE_INCOMPAT_METADATA_UUID)
		memcpy(vol->meta_fsid, vol->super.metadata_uuid, BTRFS_FSID_SIZE);
	else
		memcpy(vol->meta_fsid, vol->super.fsid, BTRFS_FSID_SIZE);

	for (i = 0; i < nbdevs; i++) {
		struct btrfs_device *dev;
		u64 devid = btrfs_dev_item_devid(&sbs[i].dev_item);

		if (find_device(vol, devid)) {
			blog_err(log, "%s: device id %llu given twice", bdevs[i]->name,
				 (unsigned long long)devid);
			ret = -EINVAL;
			goto fail;
		}
		dev = calloc(1, sizeof(*dev));
		if (dev)
			dev->devid = devid;
		if (!dev || !(dev->path = strdup(bdevs[i]->name)) || volumes_insert_device(vol, dev)) {
			if (dev)
				free(dev->path);
			free(dev);
			ret = -ENOMEM;
			goto fail;
		}
		memcpy(dev->uuid, sbs[i].dev_item.uuid, BTRFS_UUID_SIZE);
		dev->total_bytes = btrfs_dev_item_total_bytes(&sbs[i].dev_item);
		dev->bytes_used = btrfs_dev_item_bytes_used(&sbs[i].dev_item);
		dev->generation = btrfs_super_generation(&sbs[i]);
		dev->bdev = bdevs[i];
		bdevs[i] = NULL;
		if (dev->generation != btrfs_super_generation(&vol->super))
			blog_warn(log, "%s: superblock generation %llu is older than %llu",
				  dev->path, (unsigned long long)dev->generation,
				  (unsigned long long)btrfs_super_generation(&vol->super));
	}
	free(sbs);
	sbs = NULL;
	ret = load_sys_array(vol);
	if (ret)
		goto fail;
	return 0;
fail:
	free(sbs);
	for (i = 0; i < nbdevs; i++)
		blockdev_close(bdevs[i]);
	volumes_close(vol);
	return ret;
}

int volumes_check_devices(struct btrfs_volumes *vol)
{
	size_t i, nmissing = 0;
	u32 k;

	for (i = 0; i < vol->ndevs; i++) {
		if (!vol->devs[i]->bdev) {
			nmissing++;
			blog_warn(vol->log, "device %llu is missing",
				  (unsigned long long)vol->devs[i]->devid);
		}
	}
	if (!nmissing)
		return 0;
	if (!vol->allow_degraded) {
		blog_err(vol->log, "%zu device(s) missing; give them with --device, or open degraded",
			 nmissing);
		return -ENXIO;
	}
	for (i = 0; i < vol->nchunks; i++) {
		const struct chunk_map *map = vol->chunks[i];
		u32 missing = 0;

		for (k = 0; k < map->num_stripes; k++)
			if (!map->stripes[k].dev->bdev)
				missing++;
		if (map->type & BTRFS_BLOCK_GROUP_RAID10) {
			/* each group of sub_stripes mirrors needs one present member */
			u32 g, lost_group = 0;

			for (g = 0; g < map->num_stripes; g += map->sub_stripes) {
				u32 present = 0;

				for (k = g; k < g + map->sub_stripes; k++)
					present += map->stripes[k].dev->bdev != NULL;
				lost_group |= present == 0;
			}
			missing = lost_group ? map->num_stripes : 0;
		}
		if (missing > chunk_tolerance(map)) {
			blog_err(vol->log,
				 "chunk at %llu has %u of %u stripes on missing devices; its profile "
				 "cannot rebuild them",
				 (unsigned long long)map->logical, missing, map->num_stripes);
			return -ENXIO;
		}
	}
	return 0;
}

void volumes_close(struct btrfs_volumes *vol)
{
	size_t i;

	for (i = 0; i < vol->ndevs; i++) {
		blockdev_close(vol->devs[i]->bdev);
		free(vol->devs[i]->path);
		free(vol->devs[i]);
	}
	free(vol->devs);
	for (i = 0; i < vol->nchunks; i++)
		free(vol->chunks[i]);
	free(vol->chunks);
	vol->devs = NULL;
	vol->chunks = NULL;
	vol->ndevs = vol->nchunks = vol->chunks_cap = 0;
}

/*
 * Write [offset, offset + len) of RAID5/6 chunk @map, one stripe row at a
 * time: the columns the write touches are read from the row's other data
 * stripes (read-modify-write; a row written whole needs no reads), parity is
 * computed for those columns, and the changed data and the parity go out.
 * Like the kernel without a stripe tree, a crash between the data and the
 * parity writes leaves that row's parity stale (the RAID5/6 write hole).
 */
static int raid56_write(struct btrfs_volumes *vol, const struct chunk_map *map, u64 offset,
			const unsigned char *buf, size_t len)
{
	u32 n = map->num_stripes, np = parity_stripes(map), ndata = n - np, k;
	u64 sl = map->stripe_len, row_bytes = sl * ndata;
	unsigned char **blocks = calloc(n, sizeof(*blocks));
	unsigned char *mem = malloc((size_t)n * sl);
	int ret = 0;

	if (!blocks || !mem) {
		ret = -ENOMEM;
		goto out;
	}
	for (k = 0; k < n; k++)
		blocks[k] = mem + (size_t)k * sl;
	while (len && ret == 0) {
		u64 row = offset / row_bytes, row_start = row * row_bytes;
		u64 a = offset - row_start, b = a + len < row_bytes ? a + len : row_bytes;
		u64 col_lo = sl, col_hi = 0;
		int whole = a == 0 && b == row_bytes;

		/* the columns touched: one stripe alone, or all of them */
		if (a / sl == (b - 1) / sl) {
			col_lo = a % sl;
			col_hi = (b - 1) % sl + 1;
		} else {
			col_lo = 0;
			col_hi = sl;
		}
		for (k = 0; k < ndata && ret == 0; k++) {
			u64 s0 = (u64)k * sl + col_lo, s1 = (u64)k * sl + col_hi;
			int mirror;

			/* columns of this stripe the write does not cover come from disk */
			if (whole || (a <= s0 && b >= s1))
				continue;
			ret = -EIO;
			for (mirror = 1; ret && mirror <= volumes_num_copies(vol, map->logical); mirror++)
				ret = volumes_read(vol, map->logical + row_start + s0,
						   blocks[k] + col_lo, (size_t)(col_hi - col_lo), mirror);
		}
		if (ret)
			break;
		for (k = 0; k < ndata; k++) {
			u64 s0 = (u64)k * sl + col_lo, s1 = (u64)k * sl + col_hi;
			u64 w0 = a > s0 ? a : s0, w1 = b < s1 ? b : s1;

			if (w0 < w1)
				memcpy(blocks[k] + (w0 - (u64)k * sl), buf + (w0 - a), (size_t)(w1 - w0));
		}
		{
			unsigned char *cols[6], **v = cols;

			if (n > 6 && !(v = calloc(n, sizeof(*v)))) {
				ret = -ENOMEM;
				break;
			}
			for (k = 0; k < n; k++)
				v[k] = blocks[k] + col_lo;
			ret = raid56_gen_parity((int)ndata, (int)np, v, (size_t)(col_hi - col_lo));
			if (v != cols)
				free(v);
			if (ret)
				break;
		}
		for (k = 0; k < n && ret == 0; k++) {
			const struct map_stripe *s = &map->stripes[(row + k) % n];
			u64 lo = col_lo, hi = col_hi;

			if (k < ndata) {
				/* data: only what this write changed */
				u64 s0 = (u64)k * sl, w0 = a > s0 + lo ? a : s0 + lo;
				u64 w1 = b < s0 + hi ? b : s0 + hi;

				if (w0 >= w1)
					continue;
				lo = w0 - s0;
				hi = w1 - s0;
			}
			if (!s->dev || !s->dev->bdev) {
				ret = -EIO;
			} else {
				ret = volumes_dev_write(s->dev, blocks[k] + lo, (size_t)(hi - lo),
							s->physical + row * sl + lo);
				if (ret) {
					blog_err(vol->log, "write error: stripe row at logical %llu, "
							   "%s %u on %s (devid %llu) physical %llu: %s",
						 (unsigned long long)(map->logical + row_start),
						 k < ndata ? "data stripe" : "parity stripe", k,
						 s->dev->path ? s->dev->path : "?",
						 (unsigned long long)s->devid,
						 (unsigned long long)(s->physical + row * sl + lo),
						 strerror(-ret));
				}
			}
		}
		buf += b - a;
		len -= (size_t)(b - a);
		offset += b - a;
	}
out:
	free(mem);
	free(blocks);
	return ret;
}

int volumes_write(struct btrfs_volumes *vol, u64 logical, const void *buf, size_t len)
{
	const struct chunk_map *map = volumes_find_chunk(vol, logical);
	int copies, mirror;

	if (!map)
		return -ENOENT;
	if (len > map->length - (logical - map->logical))
		return -ENOENT;
	if (map->type & BTRFS_BLOCK_GROUP_RAID56_MASK)
		return raid56_write(vol, map, logical - map->logical, buf, len);
	copies = volumes_num_copies(vol, logical);
	for (mirror = 1; mirror <= copies; mirror++) {
		int ret = volumes_write_copy(vol, logical, buf, len, mirror);

		if (ret)
			return ret;
	}
	return 0;
}

int volumes_flush(struct btrfs_volumes *vol)
{
	size_t i;
	int ret;

	for (i = 0; i < vol->ndevs; i++) {
		if (!vol->devs[i]->bdev)
			continue;
		/* a replace's other device holds the same writes: durable with them */
		if (vol->devs[i]->replace_target && !vol->devs[i]->replace_error &&
		    blockdev_flush(vol->devs[i]->replace_target))
			vol->devs[i]->replace_error = -EIO;
		ret = blockdev_flush(vol->devs[i]->bdev);
		if (ret) {
			volumes_dev_stat_inc(vol->devs[i], BTRFS_DEV_STAT_FLUSH_ERRS);
			blog_err(vol->log, "flush error on %s (devid %llu): %s",
				 vol->devs[i]->path ? vol->devs[i]->path : "?",
				 (unsigned long long)vol->devs[i]->devid, strerror(-ret));
			return ret;
		}
	}
	return 0;
}

int volumes_write_supers(struct btrfs_volumes *vol)
{
	struct btrfs_super_block *sb = malloc(sizeof(*sb));
	size_t i;
	int mirror, ret = 0, written = 0;

	if (!sb)
		return -ENOMEM;
	for (i = 0; i < vol->ndevs && ret == 0; i++) {
		struct btrfs_device *dev = vol->devs[i];

		if (!dev->bdev)
			continue;
		memcpy(sb, &vol->super, sizeof(*sb));
		btrfs_set_dev_item_devid(&sb->dev_item, dev->devid);
		btrfs_set_dev_item_total_bytes(&sb->dev_item, dev->total_bytes);
		btrfs_set_dev_item_bytes_used(&sb->dev_item, dev->bytes_used);
		memcpy(sb->dev_item.uuid, dev->uuid, BTRFS_UUID_SIZE);
		memcpy(sb->dev_item.fsid, vol->meta_fsid, BTRFS_UUID_SIZE);
		for (mirror = 0; mirror < BTRFS_SUPER_MIRROR_MAX; mirror++) {
			u64 offset = btrfs_sb_offset(mirror);

			/* as the kernel: no copy beyond the part of the device in use */
			if (offset + BTRFS_SUPER_INFO_SIZE > dev->bdev->size ||
			    (mirror > 0 && offset + BTRFS_SUPER_INFO_SIZE > dev->total_bytes))
				break;
			btrfs_set_super_bytenr(sb, offset);
			memset(sb->csum, 0, BTRFS_CSUM_SIZE);
			btrfs_csum_compute(vol->csum_type, (u8 *)sb + BTRFS_CSUM_SIZE,
					   BTRFS_SUPER_INFO_SIZE - BTRFS_CSUM_SIZE, sb->csum);
			ret = blockdev_write(dev->bdev, sb, sizeof(*sb), offset);
			if (ret) {
				volumes_dev_stat_inc(dev, BTRFS_DEV_STAT_WRITE_ERRS);
				blog_err(vol->log, "write error: superblock copy %d on %s (devid %llu) "
						   "physical %llu: %s",
					 mirror, dev->path ? dev->path : "?",
					 (unsigned long long)dev->devid, (unsigned long long)offset,
					 strerror(-ret));
				break;
			}
			written++;
		}
	}
	free(sb);
	if (ret == 0 && written == 0)
		ret = -EIO;
	return ret;
}
