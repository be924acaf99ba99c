/*
 * spacemap.c — what lies where on one device, in cells of equal size: the
 * chunks' stripes (allocated bytes and the type of the block group), the
 * bytes holding extents (every copy, RAID5/6 parity included), and the bytes
 * holding some files' data (marks). `butter heatmap` draws it.
 *
 * Sources: the chunk maps (allocation), the extent tree's EXTENT_ITEM and
 * METADATA_ITEM keys (use: as the running transaction sees them on a
 * writable handle), the files' EXTENT_DATA items (marks, ops_file_pieces()).
 * A logical range is placed on the device through chunk_map_position() for
 * each copy; on RAID5/6 the row's parity stripes count with each data piece.
 */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "ops/ops.h"

enum { FIELD_USED, FIELD_MARKED };

struct space_map {
	struct butter_fs *fs;
	u64 devid, cell_bytes;
	struct butter_space_cell *cells;
	size_t ncells;
};

/* Add the device bytes [physical, physical + len) to @field of the cells they cover. */
static void add_physical(struct space_map *m, u64 physical, u64 len, int field)
{
	while (len) {
		u64 cell = physical / m->cell_bytes;
		u64 in = (cell + 1) * m->cell_bytes - physical;
		struct butter_space_cell *c;

		if (cell >= m->ncells)
			return;
		if (in > len)
			in = len;
		c = &m->cells[cell];
		if (field == FIELD_USED)
			c->used += in;
		else
			c->marked += in;
		physical += in;
		len -= in;
	}
}

/* The device bytes of the RAID5/6 parity of the row holding chunk offset @offset. */
static void add_parity(struct space_map *m, const struct chunk_map *map, u64 offset, u64 len,
		       int field)
{
	u32 n = map->num_stripes, ndata = chunk_data_stripes(map), np = n - ndata;
	u64 stripe_nr = offset / map->stripe_len, row = stripe_nr / ndata;

	for (u32 p = 0; p < np; p++) {
		u32 idx = (u32)((row + ndata + p) % n);
		const struct map_stripe *s = &map->stripes[idx];

		if (s->dev && s->dev->devid == m->devid)
			add_physical(m, s->physical + row * map->stripe_len + offset % map->stripe_len,
				     len, field);
	}
}

/* Place logical [logical, logical + len) (inside one chunk or not) on the device. */
static int add_logical(struct space_map *m, u64 logical, u64 len, int field)
{
	while (len) {
		const struct chunk_map *map = volumes_find_chunk(&m->fs->vol, logical);
		u64 in_chunk, offset;

		if (!map)
			return BLOG_CORRUPT(&m->fs->log, "extent at %llu: no chunk maps it",
					    (unsigned long long)logical);
		offset = logical - map->logical;
		in_chunk = map->length - offset < len ? map->length - offset : len;
		for (int mirror = 1;; mirror++) {
			u64 o = offset, left = in_chunk;

			while (left) {
				u32 idx;
				u64 physical, contiguous;

				if (chunk_map_position(map, o, mirror, &idx, &physical, &contiguous))
					break;
				if (contiguous > left)
					contiguous = left;
				if (map->stripes[idx].dev && map->stripes[idx].dev->devid == m->devid)
					add_physical(m, physical, contiguous, field);
				if (mirror == 1 && (map->type & BTRFS_BLOCK_GROUP_RAID56_MASK))
					add_parity(m, map, o, contiguous, field);
				o += contiguous;
				left -= contiguous;
			}
			if (left == in_chunk) /* no such copy */
				break;
		}
		logical += in_chunk;
		len -= in_chunk;
	}
	return 0;
}

/* Allocation: each stripe of each chunk on the device. */
static void add_chunks(struct space_map *m)
{
	const struct btrfs_volumes *vol = &m->fs->vol;

	for (size_t i = 0; i < vol->nchunks; i++) {
		const struct chunk_map *map = vol->chunks[i];
		u64 size = chunk_stripe_size(map);

		for (u32 s = 0; s < map->num_stripes; s++) {
			u64 physical = map->stripes[s].physical, len = size;

			if (!map->stripes[s].dev || map->stripes[s].dev->devid != m->devid)
				continue;
			while (len) {
				u64 cell = physical / m->cell_bytes;
				u64 in = (cell + 1) * m->cell_bytes - physical;

				if (cell >= m->ncells)
					break;
				if (in > len)
					in = len;
				m->cells[cell].allocated += in;
				m->cells[cell].flags = map->type;
				physical += in;
				len -= in;
			}
		}
	}
}

/* Use: every extent and tree block the extent tree lists. */
static int add_extents(struct space_map *m)
{
	struct butter_fs *fs = m->fs;
	struct btrfs_key key = { 0, 0, 0 };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &fs->extent_tree, &key, &path);
	while (ret == 0) {
		path_key(&path, &key);
		if (key.type == BTRFS_EXTENT_ITEM_KEY)
			ret = add_logical(m, key.objectid, key.offset, FIELD_USED);
		else if (key.type == BTRFS_METADATA_ITEM_KEY)
			ret = add_logical(m, key.objectid, fs->vol.nodesize, FIELD_USED);
		if (ret == 0)
			ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	return ret < 0 ? ret : 0;
}

static int mark_piece(void *arg, u64 logical, u64 len)
{
	return add_logical(arg, logical, len, FIELD_MARKED);
}

int ops_space_map(struct butter_fs *fs, uint64_t devid, uint64_t cell_bytes,
		  const struct butter_layout_range *marks, size_t nmarks,
		  struct butter_space_cell *cells, size_t ncells)
{
	struct space_map m = { fs, devid, cell_bytes, cells, ncells };
	size_t i;
	int ret, found = 0;

	if (!cell_bytes || (!cells && ncells))
		return -EINVAL;
	for (i = 0; i < fs->vol.ndevs; i++)
		found |= fs->vol.devs[i]->devid == devid;
	if (!found)
		return -ENODEV;
	memset(cells, 0, ncells * sizeof(*cells));
	add_chunks(&m);
	ret = add_extents(&m);
	for (i = 0; i < nmarks && ret == 0; i++) {
		struct btrfs_inode_item inode;

		ret = inode_read(fs, marks[i].ino, &inode);
		if (ret == -ENOENT) {
			ret = 0; /* gone: nothing to mark */
			continue;
		}
		if (ret == 0 && S_ISREG(btrfs_inode_mode(&inode)))
			ret = ops_file_pieces(fs, marks[i].ino, marks[i].off, marks[i].len,
					      mark_piece, &m);
	}
	return ret;
}
