/*
 * clone.c — reflink: make a range of one file share the data extents of a
 * range of another (or of the same) file, as FICLONE/FICLONERANGE do on btrfs.
 *
 * What a clone of [src_off, src_off + len) to dst_off leaves on disk:
 *   - dst's range [dst_off, dst_off + alen), alen = len rounded up to a
 *     sector, loses its old extents (references dropped) and gets a copy of
 *     every EXTENT_DATA item of the source range, trimmed at the range's
 *     edges: offset += what is cut from the head, num_bytes shortened. Each
 *     copied item with a disk extent adds one EXTENT_DATA_REF
 *     (root = dst's subvolume, objectid = dst's inode, offset = key offset -
 *     extent offset) to that extent; the data is never copied. Compressed
 *     extents are shared whole (the item keeps pointing at the whole
 *     compressed extent; offset/num_bytes select the part), prealloc stays
 *     prealloc, explicit hole items are copied only without NO_HOLES.
 *   - an inline extent (only ever at offset 0, only cloned whole) becomes an
 *     inline extent of dst when dst_off is 0 and dst has no other data there
 *     (dst's first item, if any, is inline and dst is no longer than it);
 *     otherwise its bytes are written into dst as ordinary data, as the
 *     kernel copies them into the page cache.
 *   - dst's i_size grows to dst_off + len when that is larger; nbytes follows
 *     rule 1 of fallocate.c; dst's mtime and ctime change.
 *
 * Arguments are checked as the kernel's remap checks do (same order, same
 * errno): regular files only (-EISDIR, -EINVAL); offsets aligned to the
 * sector size; len 0 means "to the end of src"; the source range must lie in
 * src (a range past its end is -EINVAL, never shortened); len must be
 * sector-aligned unless it reaches src's end, and such an unaligned tail may
 * only land at or past dst's end; overlapping ranges of one file are
 * -EINVAL; src and dst must agree on NODATASUM; a read-only subvolume as dst
 * is -EROFS. Any two subvolumes of the filesystem may share extents.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/data.h"

/* One source item, copied out of its leaf. */
struct src_item {
	struct btrfs_key key;
	u8 *data;
	u32 size;
	u8 type;
	u64 end;         /* key.offset + num_bytes (ram_bytes for inline) */
};

/*
 * Copy the EXTENT_DATA item of @ino that covers @pos, or the first one after
 * it, into @it. Returns 0, 1 if there is none, negative errno.
 */
static int next_src_item(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 pos,
			 struct src_item *it)
{
	struct btrfs_key key = { ino, BTRFS_EXTENT_DATA_KEY, pos };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_backward(&fs->cache, &sv->root, &key, &path);
	if (ret == 1) {
		key.offset = 0;
		ret = tree_search_forward(&fs->cache, &sv->root, &key, &path);
	}
	while (ret == 0) {
		const struct btrfs_file_extent_item *fi;
		const u8 *p;
		u32 size;

		path_key(&path, &key);
		if (key.objectid > ino || (key.objectid == ino && key.type > BTRFS_EXTENT_DATA_KEY)) {
			ret = 1;
			break;
		}
		if (key.objectid < ino || key.type < BTRFS_EXTENT_DATA_KEY) {
			ret = tree_next_item(&fs->cache, &path);
			continue;
		}
		p = path_item(&path, &size);
		fi = (const void *)p;
		if (size < BTRFS_FILE_EXTENT_INLINE_DATA_START ||
		    (fi->type != BTRFS_FILE_EXTENT_INLINE && size < sizeof(*fi)) ||
		    fi->type > BTRFS_FILE_EXTENT_PREALLOC) {
			ret = BLOG_CORRUPT(&fs->log, "inode %llu: bad file extent at %llu",
					   (unsigned long long)ino, (unsigned long long)key.offset);
			break;
		}
		it->type = fi->type;
		it->end = key.offset + (fi->type == BTRFS_FILE_EXTENT_INLINE
						? btrfs_file_extent_ram_bytes(fi)
						: btrfs_file_extent_num_bytes(fi));
		if (it->end <= pos) {
			ret = tree_next_item(&fs->cache, &path);
			continue;
		}
		it->key = key;
		it->size = size;
		it->data = malloc(size);
		if (!it->data) {
			ret = -ENOMEM;
			break;
		}
		memcpy(it->data, p, size);
		break;
	}
	tree_path_release(&fs->cache, &path);
	return ret;
}

/* The dst inode update at the end of a clone. */
struct clone_update {
	u64 size;    /* new i_size when larger than the current one */
	s64 nbytes;
};

static void apply_clone(struct btrfs_inode_item *ii, void *arg)
{
	struct clone_update *u = arg;

	if (u->size > btrfs_inode_size(ii))
		btrfs_set_inode_size(ii, u->size);
	btrfs_set_inode_nbytes(ii, (u64)((s64)btrfs_inode_nbytes(ii) + u->nbytes));
	fs_now_ts(&ii->mtime);
	ii->ctime = ii->mtime;
}

/* One clone call's state. */
struct clone {
	struct butter_fs *fs;
	struct subvol *src_sv, *dst_sv;
	butter_ino_t src, dst;
	int no_holes;
	int changed;
	struct clone_update u;
};

/* Insert a copy of @it's item at dst offset @dst_pos, with @offset/@num_bytes. */
static int insert_copy(struct clone *c, const struct src_item *it, u64 dst_pos, u64 offset,
		       u64 num_bytes)
{
	struct fs_write_state *w = c->fs->w;
	struct btrfs_file_extent_item fi;
	struct btrfs_key key = { c->dst.ino, BTRFS_EXTENT_DATA_KEY, dst_pos };
	u64 disk;
	int ret;

	memcpy(&fi, it->data, sizeof(fi));
	disk = btrfs_file_extent_disk_bytenr(&fi);
	if (!disk && c->no_holes)
		return 0;
	btrfs_set_file_extent_offset(&fi, offset);
	btrfs_set_file_extent_num_bytes(&fi, num_bytes);
	ret = tree_insert_item(&w->txn.tt, &c->dst_sv->root, &key, &fi, sizeof(fi));
	if (ret == 0 && disk) {
		ret = data_queue_data_ref(w, disk, btrfs_file_extent_disk_num_bytes(&fi), c->dst_sv->id,
					  c->dst.ino, dst_pos - offset, 1);
		c->u.nbytes += (s64)num_bytes;
	}
	return ret;
}

/*
 * Is dst ready to take src's inline extent as its own at offset 0? Yes when
 * dst has no extents and is not longer than the inline data, or when its
 * first extent is an inline one at 0 and dst is not longer than the data.
 */
static int inline_fits(struct clone *c, u64 datal, int *fits)
{
	struct btrfs_inode_item ii;
	struct src_item first;
	int ret;

	*fits = 0;
	ret = inode_read(c->fs, c->dst, &ii);
	if (ret)
		return ret;
	memset(&first, 0, sizeof(first));
	ret = next_src_item(c->fs, c->dst_sv, c->dst.ino, 0, &first);
	if (ret < 0)
		return ret;
	if (btrfs_inode_size(&ii) <= datal)
		*fits = ret == 1 || (first.key.offset == 0 && first.type == BTRFS_FILE_EXTENT_INLINE);
	free(first.data);
	return 0;
}

/* Clone src's inline extent @it to dst offset @dst_pos. */
static int clone_inline(struct clone *c, const struct src_item *it, u64 dst_pos)
{
	const struct btrfs_file_extent_item *fi = (const void *)it->data;
	u64 datal = btrfs_file_extent_ram_bytes(fi);
	u32 ss = c->fs->vol.sectorsize;
	struct tree_trans *t = &c->fs->w->txn.tt;
	struct btrfs_inode_item ii;
	int ret, fits = 0, changed = 0;
	ssize_t n;
	u8 *buf;

	if (it->key.offset != 0 || datal > ss)
		return BLOG_CORRUPT(&c->fs->log, "inode %llu: inline extent at %llu of %llu bytes",
				    (unsigned long long)c->src.ino, (unsigned long long)it->key.offset,
				    (unsigned long long)datal);
	if (dst_pos == 0) {
		ret = inline_fits(c, datal, &fits);
		if (ret)
			return ret;
	}
	if (fits) {
		struct btrfs_key key = { c->dst.ino, BTRFS_EXTENT_DATA_KEY, 0 };

		c->changed = 1;
		ret = data_drop_extents(c->fs, c->dst_sv, c->dst.ino, 0, (datal + ss - 1) / ss * ss);
		if (ret == 0)
			ret = tree_insert_item(t, &c->dst_sv->root, &key, it->data, it->size);
		c->u.nbytes += (s64)datal;
		return ret;
	}
	/*
	 * The bytes go in as data, as the kernel copies them into a page: the
	 * rest of that sector reads as zeros afterwards (up to dst's end).
	 */
	ret = inode_read(c->fs, c->dst, &ii);
	if (ret)
		return ret;
	buf = calloc(1, ss);
	if (!buf)
		return -ENOMEM;
	n = data_read(c->fs, c->src, buf, datal, 0);
	if (n >= 0) {
		u64 dsize = btrfs_inode_size(&ii), wlen = (u64)n;

		if (dsize > dst_pos && dsize - dst_pos > wlen)
			wlen = dsize - dst_pos < ss ? dsize - dst_pos : ss;
		n = wlen ? data_write_locked(c->fs, c->dst, buf, wlen, dst_pos, &changed) : 0;
	}
	c->changed |= changed;
	free(buf);
	return n < 0 ? (int)n : 0;
}

/*
 * Clone [src_off, src_off + alen) (alen sector-aligned) to dst_off. @olen is
 * the length asked for (alen or less at src's end): dst grows to dst_off +
 * olen at most.
 */
static int do_clone(struct clone *c, u64 src_off, u64 olen, u64 alen, u64 dst_off)
{
	u32 ss = c->fs->vol.sectorsize;
	u64 pos = src_off, last_dest_end = dst_off, src_end = src_off + alen;
	int ret = 0;

	while (ret == 0) {
		struct src_item it;
		u64 dst_pos, offset = 0, num;

		memset(&it, 0, sizeof(it));
		ret = next_src_item(c->fs, c->src_sv, c->src.ino, pos, &it);
		if (ret == 1) {
			ret = 0;
			break;
		}
		if (ret)
			break;
		if (it.key.offset >= src_end) {
			free(it.data);
			break;
		}
		pos = it.end;
		dst_pos = it.key.offset >= src_off ? it.key.offset - src_off + dst_off : dst_off;
		if (it.type == BTRFS_FILE_EXTENT_INLINE) {
			/*
			 * A gap before it cannot be: it starts at 0. What follows
			 * starts a sector on, also if writing it into this same
			 * file turned it into a regular extent.
			 */
			pos = (it.end + ss - 1) / ss * ss;
			ret = clone_inline(c, &it, dst_pos);
			num = it.end - it.key.offset;
		} else {
			const struct btrfs_file_extent_item *fi = (const void *)it.data;
			u64 start = it.key.offset, end = it.end;

			offset = btrfs_file_extent_offset(fi);
			if (end > src_end)
				end = src_end;
			if (start < src_off) {
				offset += src_off - start;
				start = src_off;
			}
			num = end - start;
			/* the gap before it (a hole) and the range it takes lose dst's extents */
			c->changed = 1;
			ret = data_drop_extents(c->fs, c->dst_sv, c->dst.ino, last_dest_end,
						dst_pos + num);
			if (ret == 0)
				ret = insert_copy(c, &it, dst_pos, offset, num);
		}
		free(it.data);
		if (ret)
			break;
		last_dest_end = (dst_pos + num + ss - 1) / ss * ss;
		if (dst_pos + num >= dst_off + alen)
			break;
	}
	if (ret == 0 && last_dest_end < dst_off + alen) {
		/* src ends in a hole: so does dst's range */
		c->changed = 1;
		ret = data_drop_extents(c->fs, c->dst_sv, c->dst.ino, last_dest_end, dst_off + alen);
	}
	c->u.size = dst_off + olen;
	if (ret == 0 && !c->no_holes) {
		c->changed = 1;
		ret = data_fill_holes(c->fs, c->dst_sv, c->dst.ino, dst_off, dst_off + alen);
	}
	return ret;
}

/* The remap checks (see the top of the file). *olen gets the length to clone, 0: nothing. */
static int check_clone(struct butter_fs *fs, const struct btrfs_inode_item *si,
		       const struct btrfs_inode_item *di, const struct subvol *dst_sv, int same,
		       u64 src_off, u64 dst_off, u64 len, u64 *olen, u64 *alen)
{
	u64 ss = fs->vol.sectorsize, ssize = btrfs_inode_size(si), count, bcount;

	*olen = *alen = 0;
	if (src_off > MAX_FILE_BYTES || dst_off > MAX_FILE_BYTES || len > MAX_FILE_BYTES ||
	    src_off + len > MAX_FILE_BYTES || dst_off + len > MAX_FILE_BYTES)
		return -EINVAL;
	if (S_ISDIR(btrfs_inode_mode(si)) || S_ISDIR(btrfs_inode_mode(di)))
		return -EISDIR;
	if (!S_ISREG(btrfs_inode_mode(si)) || !S_ISREG(btrfs_inode_mode(di)))
		return -EINVAL;
	if (dst_sv->flags & BTRFS_ROOT_SUBVOL_RDONLY)
		return -EROFS;
	if ((btrfs_inode_flags(si) ^ btrfs_inode_flags(di)) & BTRFS_INODE_NODATASUM_FLAG)
		return -EINVAL;
	if (inode_may_change(di, INODE_FIXED))
		return -EPERM; /* chattr +i or +a on the destination */
	if (len == 0) {
		if (src_off == ssize)
			return 0;
		if (src_off > ssize)
			return -EINVAL;
		len = ssize - src_off;
	}
	if (src_off % ss || dst_off % ss)
		return -EINVAL;
	if (src_off >= ssize)
		return -EINVAL;
	count = len < ssize - src_off ? len : ssize - src_off;
	if (src_off + count == ssize) {
		bcount = (ssize + ss - 1) / ss * ss - src_off;
	} else {
		count = count / ss * ss;
		bcount = count;
	}
	if (same && dst_off + bcount > src_off && dst_off < src_off + bcount)
		return -EINVAL;
	if (count != len)
		return -EINVAL;
	/* an unaligned tail (src's last sector) may not land inside dst */
	if (count % ss && dst_off + count < btrfs_inode_size(di))
		return -EINVAL;
	*olen = count;
	*alen = bcount;
	return 0;
}

int data_clone_range(struct butter_fs *fs, butter_ino_t src, uint64_t src_off, butter_ino_t dst,
		     uint64_t dst_off, uint64_t len)
{
	struct btrfs_inode_item si, di;
	struct fs_write_state *w;
	struct clone c;
	u64 olen, alen;
	int ret, err = 0;

	/* both files' buffered data first (delalloc.c): clones copy extents */
	ret = data_flush_ino(fs, src);
	if (ret == 0)
		ret = data_flush_ino(fs, dst);
	if (ret == 0)
		ret = fs_begin_change_rsv(fs, &w, 2ULL * fs->vol.sectorsize, 0);
	if (ret)
		return ret;
	memset(&c, 0, sizeof(c));
	c.fs = fs;
	c.src = src;
	c.dst = dst;
	c.no_holes = !!(btrfs_super_incompat_flags(&fs->vol.super) &
			BTRFS_FEATURE_INCOMPAT_NO_HOLES);
	ret = inode_read(fs, src, &si);
	if (ret == 0)
		ret = inode_read(fs, dst, &di);
	if (ret == 0 && !(c.src_sv = fs_subvol_mut(fs, src.subvol, &err)))
		ret = err;
	if (ret == 0 && !(c.dst_sv = fs_subvol_mut(fs, dst.subvol, &err)))
		ret = err;
	if (ret == 0)
		ret = check_clone(fs, &si, &di, c.dst_sv, src.subvol == dst.subvol && src.ino == dst.ino,
				  src_off, dst_off, len, &olen, &alen);
	if (ret || olen == 0)
		return fs_end_change(w, ret, 0);
	if (dst_off > btrfs_inode_size(&di)) {
		/* growing dst to the range: hole items without NO_HOLES (rule 2 of fallocate.c) */
		u64 from = (btrfs_inode_size(&di) + fs->vol.sectorsize - 1) / fs->vol.sectorsize *
			   fs->vol.sectorsize;

		if (from < dst_off && !c.no_holes) {
			c.changed = 1;
			ret = data_fill_holes(fs, c.dst_sv, dst.ino, from, dst_off);
		}
	}
	if (ret == 0)
		ret = do_clone(&c, src_off, olen, alen, dst_off);
	if (ret == 0) {
		c.changed = 1;
		ret = inode_modify(fs, c.dst_sv, dst.ino, apply_clone, &c.u);
	}
	return fs_end_change(w, ret, c.changed);
}
