/*
 * repair.c — the device-level half of scrub: write one copy of a range
 * without touching the others, and check (and rewrite) the parity of a
 * RAID5/6 stripe row against its data.
 *
 * Deciding which copy is good is the caller's work (lib/ops/scrub.c checks
 * tree block headers and data checksums); these functions only move bytes.
 * A repair writes the content the range is supposed to hold at the place it
 * is supposed to be, so it is safe at any moment a commit is not writing
 * the same range: nothing else changes meaning.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "volumes/raid56.h"
#include "volumes/volumes.h"

static u32 nparity(const struct chunk_map *map)
{
	if (map->type & BTRFS_BLOCK_GROUP_RAID6)
		return 2;
	return (map->type & BTRFS_BLOCK_GROUP_RAID5) ? 1 : 0;
}

static int stripe_io(const struct map_stripe *s, void *buf, size_t len, u64 physical, int write)
{
	if (!s->dev || !s->dev->bdev)
		return -EIO;
	if (write)
		return volumes_dev_write(s->dev, buf, len, physical); /* its errno, as is */
	if (blockdev_read(s->dev->bdev, buf, len, physical)) {
		volumes_dev_stat_inc(s->dev, BTRFS_DEV_STAT_READ_ERRS);
		return -EIO;
	}
	return 0;
}

int volumes_write_copy(struct btrfs_volumes *vol, u64 logical, const void *buf, size_t len,
		       int mirror)
{
	const struct chunk_map *map = volumes_find_chunk(vol, logical);
	const unsigned char *p = buf;
	u64 offset;

	if (!map)
		return -ENOENT;
	offset = logical - map->logical;
	if (len > map->length - offset)
		return -ENOENT;
	if (map->type & BTRFS_BLOCK_GROUP_RAID56_MASK)
		mirror = 1; /* the data stripe: the one stored copy */
	while (len) {
		u32 idx;
		u64 physical, contiguous;
		size_t piece;
		int ret = chunk_map_position(map, offset, mirror, &idx, &physical, &contiguous);

		if (ret)
			return -EIO;
		piece = contiguous < len ? (size_t)contiguous : len;
		ret = stripe_io(&map->stripes[idx], (void *)p, piece, physical, 1);
		if (ret) {
			const struct btrfs_device *dev = map->stripes[idx].dev;

			if (dev && dev->bdev)
				blog_err(vol->log, "write error: logical %llu copy %d on %s (devid %llu) "
						   "physical %llu: %s",
					 (unsigned long long)(map->logical + offset), mirror,
					 dev->path ? dev->path : "?", (unsigned long long)dev->devid,
					 (unsigned long long)physical, strerror(-ret));
			return ret;
		}
		p += piece;
		len -= piece;
		offset += piece;
	}
	return 0;
}

int volumes_raid56_row(const struct btrfs_volumes *vol, u64 logical, u64 *row_logical,
		       u64 *row_len)
{
	const struct chunk_map *map = volumes_find_chunk(vol, logical);
	u64 bytes;

	if (!map || !(map->type & BTRFS_BLOCK_GROUP_RAID56_MASK))
		return -EINVAL;
	bytes = map->stripe_len * chunk_data_stripes(map);
	*row_logical = map->logical + (logical - map->logical) / bytes * bytes;
	*row_len = bytes;
	return 0;
}

int volumes_raid56_check_parity(struct btrfs_volumes *vol, u64 row_logical, int repair,
				struct raid56_parity_check *res)
{
	const struct chunk_map *map = volumes_find_chunk(vol, row_logical);
	u32 n, np, ndata, k;
	u64 sl, row;
	unsigned char **blocks = NULL, *mem = NULL;
	int ret = 0;

	memset(res, 0, sizeof(*res));
	if (!map || !(map->type & BTRFS_BLOCK_GROUP_RAID56_MASK))
		return -EINVAL;
	n = map->num_stripes;
	np = nparity(map);
	ndata = n - np;
	sl = map->stripe_len;
	if ((row_logical - map->logical) % (sl * ndata))
		return -EINVAL;
	row = (row_logical - map->logical) / (sl * ndata);
	/* blocks 0..n-1 as on disk; n..n+np-1 the parity computed from the data */
	blocks = calloc(n + np, sizeof(*blocks));
	mem = malloc((size_t)(n + np) * sl);
	if (!blocks || !mem) {
		ret = -ENOMEM;
		goto out;
	}
	for (k = 0; k < n + np; k++)
		blocks[k] = mem + (size_t)k * sl;
	for (k = 0; k < n; k++) {
		const struct map_stripe *s = &map->stripes[(row + k) % n];

		ret = stripe_io(s, blocks[k], (size_t)sl, s->physical + row * sl, 0);
		if (ret) {
			res->unreadable_dev = s->dev;
			res->unreadable_physical = s->physical + row * sl;
			goto out;
		}
	}
	{
		unsigned char *v[8], **cols = v;

		if (ndata + np > 8 && !(cols = calloc(ndata + np, sizeof(*cols)))) {
			ret = -ENOMEM;
			goto out;
		}
		for (k = 0; k < ndata; k++)
			cols[k] = blocks[k];
		for (k = 0; k < np; k++)
			cols[ndata + k] = blocks[n + k];
		ret = raid56_gen_parity((int)ndata, (int)np, cols, (size_t)sl);
		if (cols != v)
			free(cols);
		if (ret)
			goto out;
	}
	for (k = 0; k < np; k++) {
		u32 at = ndata + k;
		const struct map_stripe *s = &map->stripes[(row + at) % n];

		if (memcmp(blocks[at], blocks[n + k], (size_t)sl) == 0)
			continue;
		res->dev[res->mismatch] = s->dev;
		res->physical[res->mismatch] = s->physical + row * sl;
		res->mismatch++;
		if (repair) {
			ret = stripe_io(s, blocks[n + k], (size_t)sl, s->physical + row * sl, 1);
			if (ret)
				goto out;
		}
	}
out:
	free(mem);
	free(blocks);
	return ret;
}
