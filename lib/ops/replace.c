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
 * never read. With BUTTER_REPLACE_AVOID_SRC (-r) the old device is read only
 * where no other copy is good (btrfs_device.avoid_reads around each read).
 *
 * In steps, so that a mount serves requests meanwhile: ops_replace_start()
 * opens and wipes the new device and from then on every write to the old
 * device reaches the new one too, at the same place (btrfs_device.
 * replace_target, lib/volumes); each ops_replace_step() commits (so the
 * extent tree lists everything written so far) and copies the used extents
 * of at most STEP_BYTES of the next chunk; the last step swaps. A place the
 * copy has passed therefore stays equal on both devices whatever is written
 * later, and one it has not reached is copied with its newest content.
 * Chunks made after the start hold only what was written since, all of it
 * mirrored: the copy stops at the chunks that existed at the start.
 * ops_replace_cancel() stops mirroring and closes the new device. A failed
 * write to the new device (copy or mirror) stops the replace with a message
 * and changes nothing else.
 *
 * Crash safety: until the swap the new device is a wiped disk that belongs to
 * nothing (no superblock is written to it: a crash leaves the filesystem as
 * it was, with the old device). The swap is one commit: the superblocks of
 * every device, the new one's with the old devid and uuid. After it the old
 * device's superblocks are wiped (ops_retire_device()).
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

/* The running replace of a handle (fs_write_state.replace). */
struct ops_replace_state {
	struct butter_fs *fs;
	struct btrfs_device *src;
	struct blockdev *dst;
	char *target;
	u64 cursor;       /* logical: the copy goes on from here */
	u64 end;          /* chunks at or past it were made after the start */
	u64 bytes_written;
	u64 chunks_done, chunks_total;
	int avoid_src;    /* -r: read the other copies first */
};

/* Logical bytes of a chunk one step copies at most (extents starting in them). */
#define STEP_BYTES (256ULL << 20)

/* Write @len bytes of @buf to the new device at @physical. */
static int put(struct ops_replace_state *r, const void *buf, u64 len, u64 physical)
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

/* The extents starting in [@start, @end), data extents merged where they touch. */
static int used_ranges(struct butter_fs *fs, u64 start, u64 end, struct used_range **out,
		       size_t *n)
{
	struct extent_span *sp;
	size_t nsp, i;
	int ret;

	*out = NULL;
	*n = 0;
	ret = extent_list_range(&fs->w->es, start, end, &sp, &nsp);
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
static int copy_mirrored(struct ops_replace_state *r, const struct chunk_map *map,
			 const struct used_range *u, size_t n)
{
	struct butter_fs *fs = r->fs;
	int copies = (map->type & BTRFS_BLOCK_GROUP_RAID0) ? 1
		     : (map->type & BTRFS_BLOCK_GROUP_RAID10) ? (int)map->sub_stripes
							      : (int)map->num_stripes;
	u8 *buf = malloc(PIECE);
	size_t i;
	int ret = buf ? 0 : -ENOMEM, elsewhere = 0;

	for (u32 k = 0; k < map->num_stripes; k++)
		elsewhere |= map->stripes[k].devid != r->src->devid;

	for (i = 0; i < n && ret == 0; i++) {
		u64 off;

		for (off = 0; off < u[i].len && ret == 0; off += PIECE) {
			u64 len = u[i].len - off < PIECE ? u[i].len - off : PIECE;
			u64 logical = u[i].start + off, done;
			int mirror;

			r->src->avoid_reads = r->avoid_src && elsewhere;
			ret = read_checked(fs, &u[i], logical, len, buf);
			if (ret && r->src->avoid_reads) {
				r->src->avoid_reads = 0; /* no other good copy: the old device's */
				ret = read_checked(fs, &u[i], logical, len, buf);
			}
			r->src->avoid_reads = 0;
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
static int copy_raid56(struct ops_replace_state *r, const struct chunk_map *map, const struct used_range *u,
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
				int avoid;

				ret = -EIO;
				for (avoid = r->avoid_src; ret && avoid >= 0; avoid--) {
					r->src->avoid_reads = avoid;
					for (mirror = 1; ret && mirror <= copies; mirror++)
						ret = volumes_read(&fs->vol, logical + k * sl, blocks[k],
								   sl, mirror);
				}
				r->src->avoid_reads = 0;
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

/* Does chunk @map have a stripe on device @devid? */
static int on_device(const struct chunk_map *map, u64 devid)
{
	for (u32 k = 0; k < map->num_stripes; k++)
		if (map->stripes[k].devid == devid)
			return 1;
	return 0;
}

/* The first chunk at or past @logical, below @end, with a stripe on @devid; NULL if none. */
static const struct chunk_map *next_chunk(const struct btrfs_volumes *vol, u64 logical, u64 end,
					  u64 devid)
{
	const struct chunk_map *best = NULL;

	for (size_t i = 0; i < vol->nchunks; i++) {
		const struct chunk_map *map = vol->chunks[i];

		if (map->logical + map->length <= logical || map->logical >= end ||
		    !on_device(map, devid))
			continue;
		if (!best || map->logical < best->logical)
			best = map;
	}
	return best;
}

static void stats_of(const struct ops_replace_state *r, struct butter_replace_stats *st)
{
	if (!st)
		return;
	memset(st, 0, sizeof(*st));
	st->devid = r->src->devid;
	st->bytes_written = r->bytes_written;
	st->chunks_done = r->chunks_done;
	st->chunks_total = r->chunks_total;
}

/* Stop mirroring, close the new device, forget the replace. */
static void drop_state(struct butter_fs *fs)
{
	struct ops_replace_state *r = fs->w ? fs->w->replace : NULL;

	if (!r)
		return;
	r->src->replace_target = NULL;
	r->src->replace_error = 0;
	if (r->dst)
		blockdev_close(r->dst);
	free(r->target);
	free(r);
	fs->w->replace = NULL;
}

int ops_replace_running(const struct butter_fs *fs, u64 devid)
{
	const struct ops_replace_state *r = fs->w ? fs->w->replace : NULL;

	return r && (devid == 0 || r->src->devid == devid);
}

int ops_replace_start(struct butter_fs *fs, uint64_t srcdevid, const char *target, unsigned flags)
{
	struct btrfs_volumes *vol = &fs->vol;
	struct fs_write_state *w;
	struct ops_replace_state *r;
	size_t i;
	int ret;

	if (flags & ~(BUTTER_REPLACE_FORCE | BUTTER_REPLACE_AVOID_SRC))
		return -EINVAL;
	if (!fs->w)
		return -EROFS;
	if (fs->w->replace) {
		blog_err(&fs->log, "a replace of devid %llu is running already",
			 (unsigned long long)fs->w->replace->src->devid);
		return -EINPROGRESS;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->fs = fs;
	for (i = 0; i < vol->ndevs; i++)
		if (vol->devs[i]->devid == srcdevid)
			r->src = vol->devs[i];
	if (!r->src) {
		free(r);
		return -ENODEV;
	}
	if (ops_is_member(vol, target)) {
		blog_err(&fs->log, "%s: already a device of this filesystem", target);
		free(r);
		return -EEXIST;
	}
	ret = blockdev_open(target, 0, &fs->log, &r->dst);
	if (ret) {
		blog_err(&fs->log, "%s: cannot open: %s", target, strerror(-ret));
		free(r);
		return ret;
	}
	if (r->dst->size < r->src->total_bytes) {
		blog_err(&fs->log, "%s: %llu bytes; the device it replaces uses %llu", target,
			 (unsigned long long)r->dst->size, (unsigned long long)r->src->total_bytes);
		ret = -ENOSPC;
	}
	r->target = ret ? NULL : strdup(target);
	if (ret == 0 && !r->target)
		ret = -ENOMEM;
	if (ret == 0)
		ret = ops_prepare_new_device(fs, r->dst, target, flags & BUTTER_REPLACE_FORCE);
	/* what runs is committed: from here on, the extent tree lists all that is written */
	if (ret == 0)
		ret = fs_begin_change(fs, &w);
	if (ret == 0)
		ret = fs_end_change(w, txn_commit(&w->txn), 0);
	if (ret) {
		blockdev_close(r->dst);
		free(r->target);
		free(r);
		return ret;
	}
	r->cursor = 0;
	r->avoid_src = !!(flags & BUTTER_REPLACE_AVOID_SRC);
	for (i = 0; i < vol->nchunks; i++) {
		const struct chunk_map *map = vol->chunks[i];

		if (map->logical + map->length > r->end)
			r->end = map->logical + map->length;
		r->chunks_total += on_device(map, srcdevid);
	}
	r->src->replace_error = 0;
	r->src->replace_target = r->dst;
	fs->w->replace = r;
	blog_info(&fs->log, "replace: devid %llu (%s) by %s: %llu chunks to copy",
		  (unsigned long long)srcdevid, r->src->path ? r->src->path : "missing", target,
		  (unsigned long long)r->chunks_total);
	return 0;
}

/* The new device takes the old one's place, devid and uuid: one commit. */
static int swap(struct butter_fs *fs, struct ops_replace_state *r, struct btrfs_device **oldp)
{
	struct fs_write_state *w;
	struct btrfs_device *old = calloc(1, sizeof(*old));
	int ret;

	*oldp = NULL;
	if (!old)
		return -ENOMEM;
	ret = fs_begin_change(fs, &w);
	if (ret) {
		free(old);
		return ret;
	}
	/* no write may go to the old device alone from here on */
	ret = txn_commit(&w->txn);
	if (ret == 0)
		ret = r->src->replace_error ? r->src->replace_error : blockdev_flush(r->dst);
	if (ret) {
		free(old);
		return fs_end_change(w, ret, 0);
	}
	old->devid = r->src->devid;
	old->bdev = r->src->bdev;
	old->path = r->src->path;
	/*
	 * The swap commit's writes reach the old device too (mirrored the other
	 * way round now): superblocks go out one device at a time, and a cut
	 * that leaves the old device in place beside a superblock of the new
	 * generation must find the blocks of that generation on it.
	 */
	r->src->replace_target = old->bdev;
	r->src->replace_error = 0;
	r->src->bdev = r->dst;
	r->src->path = r->target;
	ret = ops_reopen_path_swap(fs, old->path, r->target);
	if (ret == 0)
		ret = txn_begin(&w->txn);
	if (ret == 0) {
		w->txn.super_dirty = 1;
		ret = txn_commit(&w->txn);
	}
	if (ret) {
		/* the old device again; the new one is nobody's */
		r->src->bdev = old->bdev;
		r->src->path = old->path;
		r->src->replace_target = r->dst;
		free(old);
		return fs_end_change(w, ret, 1);
	}
	r->src->replace_target = NULL;
	r->src->replace_error = 0;
	r->dst = NULL;
	r->target = NULL;
	/* groups that had their stripe on a missing device are whole again */
	for (size_t i = 0; i < w->es.nbgs; i++) {
		const struct chunk_map *map = volumes_find_chunk(&fs->vol, w->es.bgs[i]->start);
		int whole = 1;

		for (u32 k = 0; map && k < map->num_stripes; k++)
			whole &= map->stripes[k].dev && map->stripes[k].dev->bdev != NULL;
		if (whole)
			w->es.bgs[i]->degraded = 0;
	}
	*oldp = old;
	return fs_end_change(w, 0, 0);
}

int ops_replace_step(struct butter_fs *fs, struct butter_replace_stats *st)
{
	struct ops_replace_state *r = fs->w ? fs->w->replace : NULL;
	const struct chunk_map *map;
	struct fs_write_state *w;
	struct btrfs_device *old;
	int ret;

	if (!r)
		return fs->w ? -ENOENT : -EROFS;
	ret = r->src->replace_error;
	if (ret) {
		blog_err(&fs->log, "replace: writing to %s failed: %s; the replace stops, %s stays in "
				   "place", r->target, strerror(-ret),
			 r->src->path ? r->src->path : "the old device");
		goto fail;
	}
	map = next_chunk(&fs->vol, r->cursor, r->end, r->src->devid);
	if (map) {
		u64 from = r->cursor > map->logical ? r->cursor : map->logical;
		u64 step = STEP_BYTES, to;
		struct used_range *u;
		size_t n;

		if (map->type & BTRFS_BLOCK_GROUP_RAID56_MASK) {
			u64 row = map->stripe_len * chunk_data_stripes(map);

			step = STEP_BYTES / row * row; /* whole rows: from stays row-aligned */
		}
		to = map->logical + map->length - from > step ? from + step
							      : map->logical + map->length;
		/* commit: the extent tree then lists every extent written so far */
		ret = fs_begin_change(fs, &w);
		if (ret == 0)
			ret = fs_end_change(w, txn_commit(&w->txn), 0);
		if (ret == 0)
			ret = used_ranges(fs, from, to, &u, &n);
		if (ret == 0) {
			ret = (map->type & BTRFS_BLOCK_GROUP_RAID56_MASK) ? copy_raid56(r, map, u, n)
									   : copy_mirrored(r, map, u, n);
			free(u);
		}
		if (ret)
			goto fail;
		r->cursor = to;
		if (to == map->logical + map->length)
			r->chunks_done++;
		stats_of(r, st);
		return 0;
	}
	ret = swap(fs, r, &old);
	if (ret)
		goto fail;
	stats_of(r, st);
	blog_info(&fs->log, "replace: devid %llu is now %s (%llu bytes copied)",
		  (unsigned long long)r->src->devid, r->src->path,
		  (unsigned long long)r->bytes_written);
	drop_state(fs);
	ops_retire_device(fs, old);
	return 1;
fail:
	stats_of(r, st);
	drop_state(fs); /* nothing changed: the old device stays */
	return ret;
}

int ops_replace_cancel(struct butter_fs *fs)
{
	if (!ops_replace_running(fs, 0))
		return fs->w ? -ENOENT : -EROFS;
	blog_info(&fs->log, "replace of devid %llu cancelled; it stays in place",
		  (unsigned long long)fs->w->replace->src->devid);
	drop_state(fs);
	return 0;
}

int ops_replace_status(struct butter_fs *fs, struct butter_replace_stats *st)
{
	if (!ops_replace_running(fs, 0))
		return -ENOENT;
	stats_of(fs->w->replace, st);
	return 0;
}

void ops_replace_abandon(struct butter_fs *fs)
{
	if (ops_replace_running(fs, 0)) {
		blog_warn(&fs->log, "replace of devid %llu abandoned at close; it stays in place",
			  (unsigned long long)fs->w->replace->src->devid);
		drop_state(fs);
	}
}

int ops_replace(struct butter_fs *fs, uint64_t srcdevid, const char *target, unsigned flags,
		struct butter_replace_stats *st)
{
	int ret = ops_replace_start(fs, srcdevid, target, flags);

	while (ret == 0)
		ret = ops_replace_step(fs, st);
	return ret < 0 ? ret : 0;
}
