/*
 * replace.c — replacing a device by another (`btrfs replace start`): only
 * the used parts of the old device are copied, to the same physical places
 * on the new one, which then takes the old one's devid and device uuid. No
 * chunk, dev extent or back reference changes: the filesystem is the same,
 * one disk swapped. This is the seed's case for RAID inside the filesystem:
 * it knows which blocks hold data, so a replace copies those, where MD
 * copies the whole disk.
 *
 * What is copied, per chunk with a stripe on the old device:
 *  - mirrored and striped profiles (single, dup, raid0, raid1*, raid10):
 *    every extent the extent tree lists in the chunk is read through the
 *    checked read paths (tree blocks validated, data checked against its
 *    checksums, a bad or missing copy read from another), and the pieces of
 *    it whose copy lies on the old device are written to the new one;
 *  - raid5/raid6: every stripe row an extent touches is read whole (the data
 *    stripes; the old device's rebuilt from parity when it is missing or
 *    unreadable), its parity computed, and the old device's block of the row
 *    (data, P or Q) written to the new one.
 * Reads go through those checked paths in their mirror order: the old device
 * is read when it holds a copy and is present, and a bad or failing read
 * there falls back to the other copies (or parity); a missing old device is
 * never read.
 *
 * Crash safety: until the swap the new device is a wiped disk that belongs to
 * nothing (a crash leaves the filesystem as it was). The swap is one commit:
 * the superblocks of every device, the new one's with the old devid and uuid.
 * After it the old device's superblocks are wiped (ops_retire_device()). The
 * copy runs under the library's exclusive lock and commits nothing, so no
 * write can reach the old device behind it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "volumes/raid56.h"

struct used_range {
	u64 start, len;
	int is_data;
};

struct replace {
	struct butter_fs *fs;
	struct btrfs_device *src;
	struct blockdev *dst;
	u64 bytes_written;
};

/* Write @len bytes of @buf to the new device at @physical. */
static int put(struct replace *r, const void *buf, u64 len, u64 physical)
{
	int ret = blockdev_write(r->dst, buf, len, physical);

	if (ret) {
		blog_err(&r->fs->log, "replace: writing %llu bytes at physical %llu of the new device "
				      "failed: %s; the replace stops, %s stays in place",
			 (unsigned long long)len, (unsigned long long)physical, strerror(-ret),
			 r->src->path ? r->src->path : "the old device");
		return ret;
	}
	r->bytes_written += len;
	return 0;
}

/* The extents of chunk @map, data extents merged where they touch. */
static int used_ranges(struct butter_fs *fs, const struct chunk_map *map, struct used_range **out,
		       size_t *n)
{
	struct extent_span *sp;
	size_t nsp, i;
	int ret;

	*out = NULL;
	*n = 0;
	ret = extent_list_range(&fs->w->es, map->logical, map->logical + map->length, &sp, &nsp);
	if (ret)
		return ret;
	*out = malloc((nsp ? nsp : 1) * sizeof(**out));
	if (!*out) {
		free(sp);
		return -ENOMEM;
	}
	for (i = 0; i < nsp; i++) {
		struct used_range *last = *n ? &(*out)[*n - 1] : NULL;
		int is_data = sp[i].level < 0;

		if (last && is_data && last->is_data && last->start + last->len == sp[i].bytenr) {
			last->len += sp[i].num_bytes;
			continue;
		}
		(*out)[*n].start = sp[i].bytenr;
		(*out)[*n].len = sp[i].num_bytes;
		(*out)[*n].is_data = is_data;
		(*n)++;
	}
	free(sp);
	return 0;
}

/* Read @len bytes at @logical as the trees describe them: checked, from a good copy. */
static int read_checked(struct butter_fs *fs, const struct used_range *u, u64 logical, u64 len,
			u8 *buf)
{
	u32 ss = fs->vol.sectorsize;

	if (!u->is_data) {
		struct tree_node *node;
		u64 off;
		int ret;

		for (off = 0; off < len; off += fs->vol.nodesize) {
			ret = node_read(&fs->cache, logical + off, 0, -1, NULL, &node);
			if (ret)
				return ret;
			memcpy(buf + off, node->data, fs->vol.nodesize);
			node_put(&fs->cache, node);
		}
		return 0;
	}
	{
		u32 nsect = (u32)(len / ss);
		u8 *csums = malloc((size_t)nsect * fs->vol.csum_size), *have = malloc(nsect);
		int ret = csums && have ? data_read_stored(fs, logical, len, buf, csums, have)
				       : -ENOMEM;

		free(csums);
		free(have);
		return ret;
	}
}

#define PIECE (4ULL << 20)

/* Mirrored and striped profiles: copy the old device's pieces of every extent. */
static int copy_mirrored(struct replace *r, const struct chunk_map *map,
			 const struct used_range *u, size_t n)
{
	struct butter_fs *fs = r->fs;
	int copies = (map->type & BTRFS_BLOCK_GROUP_RAID0) ? 1
		     : (map->type & BTRFS_BLOCK_GROUP_RAID10) ? (int)map->sub_stripes
							      : (int)map->num_stripes;
	u8 *buf = malloc(PIECE);
	size_t i;
	int ret = buf ? 0 : -ENOMEM;

	for (i = 0; i < n && ret == 0; i++) {
		u64 off;

		for (off = 0; off < u[i].len && ret == 0; off += PIECE) {
			u64 len = u[i].len - off < PIECE ? u[i].len - off : PIECE;
			u64 logical = u[i].start + off, done;
			int mirror;

			ret = read_checked(fs, &u[i], logical, len, buf);
			if (ret) {
				blog_err(&fs->log, "replace: logical %llu (%llu bytes) has no good copy: "
						   "%s", (unsigned long long)logical,
					 (unsigned long long)len, strerror(-ret));
				break;
			}
			for (mirror = 1; mirror <= copies && ret == 0; mirror++) {
				for (done = 0; done < len && ret == 0;) {
					u32 idx;
					u64 physical, contiguous;

					ret = chunk_map_position(map, logical + done - map->logical, mirror,
								 &idx, &physical, &contiguous);
					if (ret)
						break;
					if (contiguous > len - done)
						contiguous = len - done;
					if (map->stripes[idx].devid == r->src->devid)
						ret = put(r, buf + done, contiguous, physical);
					done += contiguous;
				}
			}
		}
	}
	free(buf);
	return ret;
}

/* RAID5/6: every row an extent touches, the old device's block of it. */
static int copy_raid56(struct replace *r, const struct chunk_map *map, const struct used_range *u,
		       size_t n)
{
	struct butter_fs *fs = r->fs;
	u32 nst = map->num_stripes, np = (map->type & BTRFS_BLOCK_GROUP_RAID6) ? 2 : 1;
	u32 ndata = nst - np, k;
	u64 sl = map->stripe_len, row_bytes = sl * ndata, last = UINT64_MAX;
	unsigned char *mem = malloc((size_t)nst * sl), *blocks[16];
	size_t i;
	int ret = mem && nst <= 16 ? 0 : -ENOMEM;

	for (k = 0; ret == 0 && k < nst; k++)
		blocks[k] = mem + (size_t)k * sl;
	for (i = 0; i < n && ret == 0; i++) {
		u64 first = (u[i].start - map->logical) / row_bytes;
		u64 end = (u[i].start + u[i].len - 1 - map->logical) / row_bytes, row;

		for (row = first; row <= end && ret == 0; row++) {
			u64 logical = map->logical + row * row_bytes;
			int mirror, copies = volumes_num_copies(&fs->vol, logical);

			if (row == last)
				continue;
			last = row;
			/* each data block alone: a rebuild from parity is one block's */
			for (k = 0, ret = 0; k < ndata && ret == 0; k++) {
				ret = -EIO;
				for (mirror = 1; ret && mirror <= copies; mirror++)
					ret = volumes_read(&fs->vol, logical + k * sl, blocks[k], sl,
							   mirror);
			}
			if (ret) {
				blog_err(&fs->log, "replace: stripe row at logical %llu cannot be read "
						   "or rebuilt", (unsigned long long)logical);
				break;
			}
			ret = raid56_gen_parity((int)ndata, (int)np, blocks, sl);
			for (k = 0; k < nst && ret == 0; k++) {
				const struct map_stripe *s = &map->stripes[(row + k) % nst];

				if (s->devid == r->src->devid)
					ret = put(r, blocks[k], sl, s->physical + row * sl);
			}
		}
	}
	free(mem);
	return ret;
}

int ops_replace(struct butter_fs *fs, uint64_t srcdevid, const char *target, unsigned flags,
		struct butter_replace_stats *st)
{
	struct btrfs_volumes *vol = &fs->vol;
	struct fs_write_state *w;
	struct replace r;
	struct btrfs_device *old = NULL;
	struct blockdev *dst = NULL;
	size_t i;
	int ret;

	memset(&r, 0, sizeof(r));
	if (flags & ~(BUTTER_REPLACE_FORCE | BUTTER_REPLACE_AVOID_SRC))
		return -EINVAL;
	if (!fs->w)
		return -EROFS;
	for (i = 0; i < vol->ndevs; i++)
		if (vol->devs[i]->devid == srcdevid)
			r.src = vol->devs[i];
	if (!r.src)
		return -ENODEV;
	if (ops_is_member(vol, target)) {
		blog_err(&fs->log, "%s: already a device of this filesystem", target);
		return -EEXIST;
	}
	ret = blockdev_open_file(target, 0, &fs->log, &dst);
	if (ret) {
		blog_err(&fs->log, "%s: cannot open: %s", target, strerror(-ret));
		return ret;
	}
	r.fs = fs;
	r.dst = dst;
	if (dst->size < r.src->total_bytes) {
		blog_err(&fs->log, "%s: %llu bytes; the device it replaces uses %llu", target,
			 (unsigned long long)dst->size, (unsigned long long)r.src->total_bytes);
		blockdev_close(dst);
		return -ENOSPC;
	}
	ret = ops_prepare_new_device(fs, dst, target, flags & BUTTER_REPLACE_FORCE);
	if (ret) {
		blockdev_close(dst);
		return ret;
	}
	ret = fs_begin_change(fs, &w);
	if (ret) {
		blockdev_close(dst);
		return ret;
	}
	/* copy what the committed state uses (a commit first: nothing pending) */
	ret = txn_commit(&w->txn);
	for (i = 0; i < vol->nchunks && ret == 0; i++) {
		const struct chunk_map *map = vol->chunks[i];
		struct used_range *u;
		size_t n;
		u32 k;

		for (k = 0; k < map->num_stripes; k++)
			if (map->stripes[k].devid == srcdevid)
				break;
		if (k == map->num_stripes)
			continue;
		ret = used_ranges(fs, map, &u, &n);
		if (ret)
			break;
		ret = (map->type & BTRFS_BLOCK_GROUP_RAID56_MASK) ? copy_raid56(&r, map, u, n)
								   : copy_mirrored(&r, map, u, n);
		free(u);
	}
	if (ret == 0)
		ret = blockdev_flush(dst);
	if (ret) {
		blockdev_close(dst);
		return fs_end_change(w, ret, 0); /* nothing changed: the old device stays */
	}
	/* the swap: the new device takes the old one's place, devid and uuid */
	old = calloc(1, sizeof(*old));
	if (!old) {
		blockdev_close(dst);
		return fs_end_change(w, -ENOMEM, 0);
	}
	old->devid = r.src->devid;
	old->bdev = r.src->bdev;
	old->path = r.src->path;
	r.src->bdev = dst;
	r.src->path = strdup(target);
	ret = r.src->path ? ops_reopen_path_swap(fs, old->path, target) : -ENOMEM;
	if (ret == 0)
		ret = txn_begin(&w->txn);
	if (ret == 0) {
		w->txn.super_dirty = 1;
		ret = txn_commit(&w->txn);
	}
	if (ret) {
		/* the old device again; the new one is nobody's */
		free(r.src->path);
		r.src->bdev = old->bdev;
		r.src->path = old->path;
		free(old);
		blockdev_close(dst);
		return fs_end_change(w, ret, 1);
	}
	/* groups that had their stripe on a missing device are whole again */
	for (i = 0; i < w->es.nbgs; i++) {
		const struct chunk_map *map = volumes_find_chunk(vol, w->es.bgs[i]->start);
		int whole = 1;

		for (u32 k = 0; map && k < map->num_stripes; k++)
			whole &= map->stripes[k].dev && map->stripes[k].dev->bdev != NULL;
		if (whole)
			w->es.bgs[i]->degraded = 0;
	}
	if (st) {
		st->bytes_written = r.bytes_written;
		st->devid = r.src->devid;
	}
	ret = fs_end_change(w, 0, 0);
	ops_retire_device(fs, old);
	return ret;
}
