/*
 * write.c — changing file data: writing (copy-on-write: new extents for
 * every write, old ones trimmed, split or dropped), truncating, and the
 * extent-dropping primitive they share.
 *
 * Compression (the handle's setting, see butter_set_compression()): data goes
 * in pieces of up to 128 KiB of file bytes; a piece that compresses by at
 * least one sector becomes one compressed extent (disk_num_bytes = the
 * compressed size rounded up to sectors, ram_bytes = num_bytes = the piece,
 * checksums over the compressed sectors); otherwise it is stored plainly, and
 * without compress-force the rest of that write is too. Inline extents stay
 * uncompressed. Inodes flagged NODATASUM, NODATACOW or NOCOMPRESS are not
 * compressed (NOCOMPRESS yields to force); COMPRESS asks for zlib when the
 * handle has no setting.
 *
 * Dropping [start, end) from a file's EXTENT_DATA items (ks..ke is an item):
 *   inside the range     delete the item, drop its data reference
 *   overlapping the head truncate num_bytes (the reference is unchanged)
 *   overlapping the tail re-key at end, offset += end - ks (reference
 *                        unchanged: key.offset - offset stays the same)
 *   around the range     both, as two items: one more reference
 * Inline extents (only ever at offset 0) are rewritten whole by the callers.
 * nbytes counts num_bytes of regular/prealloc extents and inline lengths.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/checksum.h"
#include "data/data.h"

/* End of the file's extents (0 if none) and whether the last one is inline. */
static int data_end(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 *end, int *is_inline)
{
	struct btrfs_key key = { ino, BTRFS_EXTENT_DATA_KEY, (u64)-1 };
	struct tree_path path;
	int ret;

	*end = 0;
	*is_inline = 0;
	tree_path_init(&path);
	ret = tree_search_backward(&fs->cache, &sv->root, &key, &path);
	if (ret == 0) {
		path_key(&path, &key);
		if (key.objectid == ino && key.type == BTRFS_EXTENT_DATA_KEY) {
			u32 size;
			const struct btrfs_file_extent_item *fi = (const void *)path_item(&path, &size);

			if (size < BTRFS_FILE_EXTENT_INLINE_DATA_START) {
				ret = -EUCLEAN;
			} else if (fi->type == BTRFS_FILE_EXTENT_INLINE) {
				*is_inline = 1;
				*end = key.offset + btrfs_file_extent_ram_bytes(fi);
			} else if (size >= sizeof(*fi)) {
				*end = key.offset + btrfs_file_extent_num_bytes(fi);
			} else {
				ret = -EUCLEAN;
			}
		}
	}
	tree_path_release(&fs->cache, &path);
	return ret < 0 ? ret : 0;
}

/* Allocate a data extent of up to @want bytes (at least one sector). */
int data_alloc(struct butter_fs *fs, u64 want, u64 *logical, u64 *got)
{
	struct fs_write_state *w = fs->w;
	u32 ss = fs->vol.sectorsize;
	u64 len = want;
	int ret, tried_chunk = 0;

	/*
	 * The whole piece; when no free space holds it, a new data chunk is
	 * tried once (so written-back data lands in one extent, as the kernel
	 * allocates a chunk before it splits an extent); then pieces down to
	 * one sector, so a write the reservation accepted finds room in
	 * fragmented free space instead of failing half way.
	 */
	for (;;) {
		ret = extent_alloc(&w->es, BTRFS_BLOCK_GROUP_DATA, len, logical);
		if (ret == 0) {
			*got = len;
			return 0;
		}
		if (ret != -ENOSPC)
			return ret;
		if (tried_chunk && len > ss) {
			len = len / 2 / ss * ss;
			if (len < ss)
				len = ss;
			continue;
		}
		if (tried_chunk)
			return -ENOSPC;
		tried_chunk = 1;
		{
			u64 chunk;

			ret = chunk_create(&w->es, BTRFS_BLOCK_GROUP_DATA | w->data_profile,
					   chunk_max_size(&w->es, 1ULL << 30), &chunk);
			if (ret == -ENOSPC)
				continue; /* no device space: smaller pieces, then */
			if (ret)
				return ret;
			ret = chunk_insert_items(&w->es, &w->txn.tt, chunk);
			if (ret)
				return ret;
			len = want;
		}
	}
}

struct size_update {
	u64 size;       /* new i_size if larger (or exact when @set) */
	s64 nbytes;     /* added to nbytes */
	int set;
};

static void update_size(struct btrfs_inode_item *ii, void *arg)
{
	struct size_update *u = arg;

	if (u->set || u->size > btrfs_inode_size(ii))
		btrfs_set_inode_size(ii, u->size);
	btrfs_set_inode_nbytes(ii, (u64)((s64)btrfs_inode_nbytes(ii) + u->nbytes));
	fs_now_ts(&ii->mtime);
	ii->ctime = ii->mtime;
}

int data_queue_data_ref(struct fs_write_state *w, u64 bytenr, u64 num_bytes, u64 root, u64 ino,
			u64 offset, int delta)
{
	struct delayed_ref ref;

	memset(&ref, 0, sizeof(ref));
	ref.bytenr = bytenr;
	ref.num_bytes = num_bytes;
	ref.root = root;
	ref.owner = ino;
	ref.offset = offset;
	ref.is_data = 1;
	ref.delta = delta;
	ref.generation = w->txn.tt.transid;
	return extent_queue_ref(&w->es, &ref);
}

/*
 * Try to store [data, data + len) (len <= COMPRESSED_EXTENT_MAX, whole
 * sectors) compressed: 0 and the disk extent in *logical / *disk_len with
 * its csums inserted, 1 when it does not compress by at least a sector (or
 * finds no room in one piece): store it plainly. Negative errno on errors.
 */
static int write_compressed(struct butter_fs *fs, int type, int level, const u8 *data, u64 len,
			    u64 *logical, u64 *disk_len)
{
	struct fs_write_state *w = fs->w;
	u32 ss = fs->vol.sectorsize, cs = fs->vol.csum_size;
	u8 *buf, *csums = NULL;
	ssize_t clen;
	u64 i, dlen;
	int ret;

	if (len <= ss)
		return 1;
	buf = calloc(1, len);
	if (!buf)
		return -ENOMEM;
	clen = data_compress(type, level, data, len, buf, len - ss, ss);
	if (clen == -E2BIG || clen == 0) {
		free(buf);
		return 1;
	}
	if (clen < 0) {
		free(buf);
		return (int)clen;
	}
	dlen = ((u64)clen + ss - 1) / ss * ss;
	ret = extent_alloc(&w->es, BTRFS_BLOCK_GROUP_DATA, dlen, logical);
	if (ret == -ENOSPC) {
		free(buf);
		return 1;
	}
	if (ret == 0)
		ret = volumes_write(&fs->vol, *logical, buf, dlen);
	if (ret == 0 && !(csums = malloc(dlen / ss * cs)))
		ret = -ENOMEM;
	for (i = 0; ret == 0 && i < dlen / ss; i++) {
		u8 c[BTRFS_CSUM_SIZE];

		btrfs_csum_compute(fs->vol.csum_type, buf + i * ss, ss, c);
		memcpy(csums + i * cs, c, cs);
	}
	if (ret == 0)
		ret = extent_insert_csums(&w->es, &w->txn.tt, *logical, dlen, csums);
	if (ret == 0 && (type == BTRFS_COMPRESS_LZO || type == BTRFS_COMPRESS_ZSTD)) {
		struct btrfs_super_block *sb = &fs->vol.super;

		btrfs_set_super_incompat_flags(sb, btrfs_super_incompat_flags(sb) |
						   (type == BTRFS_COMPRESS_LZO
							    ? BTRFS_FEATURE_INCOMPAT_COMPRESS_LZO
							    : BTRFS_FEATURE_INCOMPAT_COMPRESS_ZSTD));
	}
	free(csums);
	free(buf);
	*disk_len = dlen;
	return ret;
}

/*
 * Write @len bytes (a multiple of the sector size) at the sector-aligned
 * file offset @off as new extents, compressed per the handle's setting and
 * the inode's flags (@iflags). The range holds no extents (dropped).
 * Adds to nbytes; the caller sets i_size.
 */
static int write_extents(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 iflags,
			 const u8 *data, u64 len, u64 off)
{
	struct fs_write_state *w = fs->w;
	u32 ss = fs->vol.sectorsize, cs = fs->vol.csum_size;
	int nodatasum = !!(iflags & BTRFS_INODE_NODATASUM_FLAG);
	int compress = w->compress_type;
	u8 *csums = NULL;
	u64 done = 0;
	int ret = 0;

	if (iflags & (BTRFS_INODE_NODATASUM_FLAG | BTRFS_INODE_NODATACOW_FLAG) ||
	    ((iflags & BTRFS_INODE_NOCOMPRESS_FLAG) && !w->compress_force))
		compress = BTRFS_COMPRESS_NONE;
	else if (!compress && (iflags & BTRFS_INODE_COMPRESS_FLAG))
		compress = BTRFS_COMPRESS_ZLIB;
	while (done < len && ret == 0) {
		u64 want = len - done, logical = 0, got = 0, disk_len = 0, i;
		struct btrfs_file_extent_item fi;
		struct btrfs_key key = { ino, BTRFS_EXTENT_DATA_KEY, off + done };
		struct size_update u = { 0, 0, 0 };
		int ctype = BTRFS_COMPRESS_NONE;

		if (compress) {
			if (want > COMPRESSED_EXTENT_MAX)
				want = COMPRESSED_EXTENT_MAX;
			ret = write_compressed(fs, compress, w->compress_level, data + done, want,
					       &logical, &disk_len);
			if (ret < 0)
				break;
			if (ret == 0) {
				ctype = compress;
				got = want;
			} else if (!w->compress_force) {
				compress = BTRFS_COMPRESS_NONE; /* it does not compress: stop trying */
				want = len - done;
			}
			ret = 0;
		}
		if (ctype == BTRFS_COMPRESS_NONE) {
			if (want > MAX_EXTENT_SIZE)
				want = MAX_EXTENT_SIZE;
			ret = data_alloc(fs, want, &logical, &got);
			if (ret)
				break;
			disk_len = got;
			ret = volumes_write(&fs->vol, logical, data + done, got);
			if (ret)
				break;
		}
		if (ctype == BTRFS_COMPRESS_NONE && !nodatasum) {
			free(csums);
			csums = malloc(got / ss * cs);
			if (!csums) {
				ret = -ENOMEM;
				break;
			}
			for (i = 0; i < got / ss; i++) {
				u8 c[BTRFS_CSUM_SIZE];

				btrfs_csum_compute(fs->vol.csum_type, data + done + i * ss, ss, c);
				memcpy(csums + i * cs, c, cs);
			}
			ret = extent_insert_csums(&w->es, &w->txn.tt, logical, got, csums);
			if (ret)
				break;
		}
		memset(&fi, 0, sizeof(fi));
		btrfs_set_file_extent_generation(&fi, w->txn.tt.transid);
		btrfs_set_file_extent_ram_bytes(&fi, got);
		fi.type = BTRFS_FILE_EXTENT_REG;
		fi.compression = (u8)ctype;
		btrfs_set_file_extent_disk_bytenr(&fi, logical);
		btrfs_set_file_extent_disk_num_bytes(&fi, disk_len);
		btrfs_set_file_extent_num_bytes(&fi, got);
		ret = tree_insert_item(&w->txn.tt, &sv->root, &key, &fi, sizeof(fi));
		if (ret == 0)
			ret = data_queue_data_ref(w, logical, disk_len, sv->id, ino, off + done, 1);
		u.nbytes = (s64)got;
		if (ret == 0)
			ret = inode_modify(fs, sv, ino, update_size, &u);
		done += got;
	}
	free(csums);
	return ret;
}

int data_drop_extents(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 start, u64 end)
{
	struct fs_write_state *w = fs->w;
	struct tree_trans *t = &w->txn.tt;
	s64 nbytes_delta = 0;
	int ret = 0;

	while (start < end) {
		struct btrfs_key key = { ino, BTRFS_EXTENT_DATA_KEY, start };
		struct tree_path path;
		struct btrfs_file_extent_item *fi;
		u64 ks, ke, disk, offset, num;
		u32 size;
		int type;

		/* the item covering @start, or the first one after it */
		tree_path_init(&path);
		ret = tree_search_backward(&fs->cache, &sv->root, &key, &path);
		if (ret == 0) {
			path_key(&path, &key);
			if (key.objectid != ino || key.type != BTRFS_EXTENT_DATA_KEY)
				ret = 1;
		}
		if (ret == 0) {
			const struct btrfs_file_extent_item *rfi = (const void *)path_item(&path, &size);
			u64 e = rfi->type == BTRFS_FILE_EXTENT_INLINE
					? key.offset + btrfs_file_extent_ram_bytes(rfi)
					: key.offset + btrfs_file_extent_num_bytes(rfi);

			if (e <= start)
				ret = 1; /* ends before: look at the next one */
		}
		if (ret == 1) {
			ret = tree_next_item(&fs->cache, &path);
			if (ret == 0 && path.nodes[0]->nritems == 0)
				ret = 1;
			if (ret == 0) {
				path_key(&path, &key);
				if (key.objectid != ino || key.type != BTRFS_EXTENT_DATA_KEY ||
				    key.offset >= end)
					ret = 1;
			}
		}
		tree_path_release(&fs->cache, &path);
		if (ret == 1) {
			ret = 0;
			break;
		}
		if (ret < 0)
			break;
		/* re-find it for changing */
		ret = tree_search_slot(t, &sv->root, &key, &path, (int)(sizeof(*fi) + sizeof(struct btrfs_item)), 1);
		if (ret != 0) {
			tree_path_release(&fs->cache, &path);
			ret = ret < 0 ? ret : -EUCLEAN;
			break;
		}
		fi = (void *)path_item_mut(&path, &size);
		type = fi->type;
		ks = key.offset;
		if (type == BTRFS_FILE_EXTENT_INLINE) {
			ke = ks + btrfs_file_extent_ram_bytes(fi);
			if (ke < ks || btrfs_file_extent_ram_bytes(fi) > fs->vol.sectorsize) {
				tree_path_release(&fs->cache, &path);
				ret = BLOG_CORRUPT(&fs->log, "inode %llu: inline extent of %llu bytes",
						   (unsigned long long)ino,
						   (unsigned long long)btrfs_file_extent_ram_bytes(fi));
				break;
			}
			if (ks < start) {
				/* a head of inline data stays: the callers rewrite inline files whole */
				tree_path_release(&fs->cache, &path);
				ret = -EOPNOTSUPP;
				break;
			}
			nbytes_delta -= (s64)btrfs_file_extent_ram_bytes(fi);
			ret = tree_del_items(t, &sv->root, &path, 1);
			tree_path_release(&fs->cache, &path);
			if (ret)
				break;
			start = ke;
			continue;
		}
		if (size < sizeof(*fi)) {
			tree_path_release(&fs->cache, &path);
			ret = -EUCLEAN;
			break;
		}
		disk = btrfs_file_extent_disk_bytenr(fi);
		offset = btrfs_file_extent_offset(fi);
		num = btrfs_file_extent_num_bytes(fi);
		/* the sector holding the last byte (2^63 - 1) ends at 2^63: the kernel writes it */
		if (num == 0 || num > MAX_FILE_BYTES || ks > MAX_FILE_BYTES + 1 - num ||
		    offset > MAX_FILE_BYTES) {
			tree_path_release(&fs->cache, &path);
			ret = BLOG_CORRUPT(&fs->log, "inode %llu: file extent at %llu: %llu bytes "
						     "at offset %llu",
					   (unsigned long long)ino, (unsigned long long)ks,
					   (unsigned long long)num, (unsigned long long)offset);
			break;
		}
		ke = ks + num;
		if (ks >= start && ke <= end) {
			/* wholly inside: delete */
			u64 disk_len = btrfs_file_extent_disk_num_bytes(fi);

			ret = tree_del_items(t, &sv->root, &path, 1);
			tree_path_release(&fs->cache, &path);
			if (ret == 0 && disk)
				ret = data_queue_data_ref(w, disk, disk_len, sv->id, ino, ks - offset, -1);
			if (ret)
				break;
			if (disk || type == BTRFS_FILE_EXTENT_PREALLOC)
				nbytes_delta -= (s64)num;
			start = ke;
			continue;
		}
		if (ks < start && ke > end) {
			/* around the range: keep [ks, start) here and insert [end, ke) */
			struct btrfs_file_extent_item tail = *fi;
			struct btrfs_key tkey = { ino, BTRFS_EXTENT_DATA_KEY, end };

			btrfs_set_file_extent_num_bytes(fi, start - ks);
			btrfs_set_file_extent_offset(&tail, offset + (end - ks));
			btrfs_set_file_extent_num_bytes(&tail, ke - end);
			tree_path_release(&fs->cache, &path);
			ret = tree_insert_item(t, &sv->root, &tkey, &tail, sizeof(tail));
			if (ret == 0 && disk)
				ret = data_queue_data_ref(w, disk, btrfs_file_extent_disk_num_bytes(&tail), sv->id,
						     ino, end - (offset + (end - ks)), 1);
			if (disk || type == BTRFS_FILE_EXTENT_PREALLOC)
				nbytes_delta -= (s64)(end - start);
			break;
		}
		if (ks < start) {
			/* overlaps our head: trim its end */
			btrfs_set_file_extent_num_bytes(fi, start - ks);
			tree_path_release(&fs->cache, &path);
			if (disk || type == BTRFS_FILE_EXTENT_PREALLOC)
				nbytes_delta -= (s64)(ke - start);
			start = ke;
			continue;
		}
		/* overlaps our tail: start it at end */
		{
			struct btrfs_key nkey = { ino, BTRFS_EXTENT_DATA_KEY, end };

			btrfs_set_file_extent_offset(fi, offset + (end - ks));
			btrfs_set_file_extent_num_bytes(fi, ke - end);
			tree_set_item_key(&path, &nkey);
			tree_path_release(&fs->cache, &path);
			if (disk || type == BTRFS_FILE_EXTENT_PREALLOC)
				nbytes_delta -= (s64)(end - ks);
			break;
		}
	}
	if (ret == 0 && nbytes_delta) {
		struct size_update u = { 0, nbytes_delta, 0 };

		ret = inode_modify(fs, sv, ino, update_size, &u);
	}
	return ret;
}

/* Read up to @len bytes of @ino at @off through the read path (zeros past EOF). */
static int read_existing(struct butter_fs *fs, butter_ino_t ino, u8 *buf, u64 len, u64 off)
{
	ssize_t n = data_read(fs, ino, buf, len, off);

	if (n < 0)
		return (int)n;
	memset(buf + n, 0, len - (u64)n);
	return 0;
}

ssize_t data_write_locked(struct butter_fs *fs, butter_ino_t ino, const void *buf, size_t len,
			  u64 off, int *changed)
{
	int ret;

	*changed = 0;
	if (data_buffered(fs, ino)) {
		/* what butter_write() buffered for the inode goes first */
		*changed = 1;
		ret = data_flush_ino_locked(fs, ino);
		if (ret)
			return ret;
	}
	return data_write_direct_locked(fs, ino, buf, len, off, changed);
}

ssize_t data_write_direct_locked(struct butter_fs *fs, butter_ino_t ino, const void *buf,
				 size_t len, u64 off, int *changed)
{
	u32 ss = fs->vol.sectorsize, max_inline = fs->w->max_inline;
	struct btrfs_inode_item ii;
	struct subvol *sv = NULL;
	u64 end, isize, astart, aend;
	u8 *tmp = NULL;
	int ret, is_inline, err = 0;
	u64 iflags;

	if (len == 0)
		return 0;
	ret = inode_read(fs, ino, &ii);
	if (ret == 0 && !S_ISREG(btrfs_inode_mode(&ii)))
		ret = S_ISDIR(btrfs_inode_mode(&ii)) ? -EISDIR : -EINVAL;
	if (ret == 0 && !(sv = fs_subvol_mut(fs, ino.subvol, &err)))
		ret = err;
	if (ret == 0)
		ret = data_end(fs, sv, ino.ino, &end, &is_inline);
	if (ret)
		return ret;
	isize = btrfs_inode_size(&ii);
	iflags = btrfs_inode_flags(&ii);
	if (is_inline) {
		u64 newsize = isize > off + len ? isize : off + len;

		if (newsize > max_inline) {
			/* the file outgrows inline: its bytes move to a regular first sector */
			tmp = calloc(1, ss);
			if (!tmp)
				return -ENOMEM;
			ret = read_existing(fs, ino, tmp, isize < ss ? isize : ss, 0);
			if (ret) {
				free(tmp);
				return ret;
			}
			*changed = 1;
			ret = data_drop_extents(fs, sv, ino.ino, 0, (u64)-1);
			if (ret == 0)
				ret = write_extents(fs, sv, ino.ino, iflags, tmp, ss, 0);
			free(tmp);
			tmp = NULL;
			if (ret)
				return ret;
			is_inline = 0;
			end = ss;
		}
	}
	if (is_inline || (off == 0 && isize <= len && len <= max_inline && end == 0)) {
		/* small files are rewritten whole: inline while they stay small */
		u64 newsize = isize > off + len ? isize : off + len;

		tmp = calloc(1, newsize + ss);
		if (!tmp)
			return -ENOMEM;
		ret = read_existing(fs, ino, tmp, isize, 0);
		if (ret) {
			free(tmp);
			return ret;
		}
		memcpy(tmp + off, buf, len);
		*changed = 1;
		ret = data_drop_extents(fs, sv, ino.ino, 0, (u64)-1);
		if (ret == 0 && newsize <= max_inline) {
			struct size_update u = { newsize, (s64)newsize, 1 };

			ret = data_insert_inline(fs, sv, ino.ino, tmp, (u32)newsize);
			if (ret == 0)
				ret = inode_modify(fs, sv, ino.ino, update_size, &u);
		} else if (ret == 0) {
			struct size_update u = { newsize, 0, 1 };

			ret = write_extents(fs, sv, ino.ino, iflags, tmp,
					    (newsize + ss - 1) / ss * ss, 0);
			if (ret == 0)
				ret = inode_modify(fs, sv, ino.ino, update_size, &u);
		}
		free(tmp);
		return ret < 0 ? ret : (ssize_t)len;
	}
	/*
	 * Whole sectors: read the partial edge sectors, drop the range, write
	 * anew (the caller's bytes as they are when they are whole sectors).
	 */
	astart = off / ss * ss;
	aend = (off + len + ss - 1) / ss * ss;
	ret = 0;
	if (astart < off || aend > off + len) {
		tmp = malloc(aend - astart);
		if (!tmp)
			return -ENOMEM;
		if (astart < off)
			ret = read_existing(fs, ino, tmp, ss, astart);
		if (ret == 0 && aend > off + len && aend - ss >= astart)
			ret = read_existing(fs, ino, tmp + (aend - ss - astart), ss, aend - ss);
		if (ret) {
			free(tmp);
			return ret;
		}
		memcpy(tmp + (off - astart), buf, len);
	}
	*changed = 1;
	ret = data_drop_extents(fs, sv, ino.ino, astart, aend);
	if (ret == 0)
		ret = write_extents(fs, sv, ino.ino, iflags, tmp ? tmp : buf, aend - astart, astart);
	if (ret == 0 && astart > isize) /* without NO_HOLES the gap gets a hole item */
		ret = data_fill_holes(fs, sv, ino.ino, isize / ss * ss, astart);
	if (ret == 0) {
		struct size_update u = { off + len, 0, 0 };

		ret = inode_modify(fs, sv, ino.ino, update_size, &u);
	}
	free(tmp);
	return ret < 0 ? ret : (ssize_t)len;
}

ssize_t data_write(struct butter_fs *fs, butter_ino_t ino, const void *buf, size_t len,
		   uint64_t off)
{
	u32 ss = fs->vol.sectorsize;
	struct fs_write_state *w;
	ssize_t n;
	int ret, changed;

	if (len == 0)
		return 0;
	if (off + len < off || off + len > MAX_FILE_BYTES)
		return -EFBIG; /* the kernel's largest file (MAX_LFS_FILESIZE) */
	ret = fs_begin_change_rsv(fs, &w, (off % ss + len + 2ULL * ss) / ss * ss, 0);
	if (ret)
		return ret;
	n = data_write_locked(fs, ino, buf, len, off, &changed);
	ret = fs_end_change(w, n < 0 ? (int)n : 0, changed);
	return ret < 0 ? ret : n;
}

int data_truncate(struct butter_fs *fs, struct subvol *sv, butter_ino_t ino, u64 size)
{
	u32 ss = fs->vol.sectorsize;
	struct btrfs_inode_item ii;
	u64 end;
	int ret, is_inline;
	u8 *head = NULL;

	if (size == 0)
		data_discard_ino(fs, ino.subvol, ino.ino); /* nothing buffered survives */
	else if ((ret = data_flush_ino_locked(fs, ino)) != 0)
		return ret;
	ret = inode_read(fs, ino, &ii);
	if (ret == 0)
		ret = data_end(fs, sv, ino.ino, &end, &is_inline);
	if (ret == 0 && is_inline && end > ss)
		ret = BLOG_CORRUPT(&fs->log, "inode %llu: inline extent of %llu bytes",
				   (unsigned long long)ino.ino, (unsigned long long)end);
	if (ret)
		return ret;
	if (size >= btrfs_inode_size(&ii)) {
		struct size_update u = { size, 0, 1 };

		/* without NO_HOLES the grown part gets a hole item */
		ret = data_fill_holes(fs, sv, ino.ino, btrfs_inode_size(&ii) / ss * ss,
				      (size + ss - 1) / ss * ss);
		return ret ? ret : inode_modify(fs, sv, ino.ino, update_size, &u);
	}
	if (is_inline || size % ss) {
		/* keep the bytes of the last partial sector (or of the inline file) */
		u64 from = is_inline ? 0 : size / ss * ss;
		/* an inline file keeps at most its inline data; past it is a hole */
		u64 take = is_inline && size > end ? end : size - from;
		u64 data;

		if (!is_inline) {
			/*
			 * No data in the last partial sector (a hole, or prealloc): it
			 * stays a hole, no zeroes are written (nor a hole item with
			 * NO_HOLES).
			 */
			ret = data_seek(fs, ino, from, 3 /* SEEK_DATA */, &data);
			if (ret == -ENXIO || (ret == 0 && data >= size)) {
				ret = data_drop_extents(fs, sv, ino.ino, from, (u64)-1);
				if (ret == 0)
					ret = data_fill_holes(fs, sv, ino.ino, from, from + ss);
				goto set_size;
			}
			if (ret)
				return ret;
		}
		head = calloc(1, ss + take);
		if (!head)
			return -ENOMEM;
		ret = read_existing(fs, ino, head, take, from);
		if (ret == 0)
			ret = data_drop_extents(fs, sv, ino.ino, from, (u64)-1);
		if (ret == 0 && size > from) {
			if (is_inline) {
				/*
				 * The inline extent keeps what it held below @size; a file
				 * grown by truncate has only zeroes past it, so the extent
				 * never grows here (it stays within the inline limit).
				 */
				u64 keep = size < end ? size : end;
				struct size_update u = { 0, (s64)keep, 0 };

				ret = keep ? data_insert_inline(fs, sv, ino.ino, head, (u32)keep) : 0;
				if (ret == 0)
					ret = inode_modify(fs, sv, ino.ino, update_size, &u);
			} else {
				ret = write_extents(fs, sv, ino.ino, btrfs_inode_flags(&ii), head, ss,
						    from);
			}
		}
		free(head);
	} else {
		ret = data_drop_extents(fs, sv, ino.ino, size, (u64)-1);
	}
set_size:
	if (ret == 0) {
		struct size_update u = { size, 0, 1 };

		ret = inode_modify(fs, sv, ino.ino, update_size, &u);
	}
	return ret;
}
/* Insert an inline extent holding @len bytes at file offset 0. */
int data_insert_inline(struct butter_fs *fs, struct subvol *sv, u64 ino, const void *data,
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
