/*
 * read.c — file data: the extent map of an inode (EXTENT_DATA items), data
 * reads verified against the csum tree, decompression, holes, SEEK_DATA/HOLE.
 *
 * An inode's data is the ordered run of its EXTENT_DATA items, keyed by file
 * offset. Each covers [key.offset, end):
 *   inline     end = key.offset + ram_bytes; bytes in the item (maybe compressed)
 *   regular    end = key.offset + num_bytes; disk_bytenr 0 is an explicit hole;
 *              otherwise file byte key.offset + x is byte offset + x of the
 *              (decompressed) extent at disk_bytenr
 *   prealloc   reads as zeros
 * Gaps between items are holes (the no-holes feature writes no hole items).
 * Bytes past i_size are never returned.
 *
 * Promises:
 *  1. No byte reaches the caller unless its sector's checksum matched (or the
 *     inode is NODATASUM); a bad sector is read from every other copy before
 *     the read fails with -EIO.
 *  2. Compressed extents are verified on their on-disk (compressed) bytes,
 *     then decompressed; a stream that does not decompress is -EIO.
 *  3. Each bad copy met (checksum mismatch or read error) is logged once,
 *     naming the device, devid, logical and physical address, the copy, and
 *     the subvolume, inode, a path and the file offset it belongs to; a
 *     mismatch counts as a corruption error of that device (a read error is
 *     counted where it happens, lib/volumes).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/checksum.h"
#include "data/data.h"

#define MAX_COMPRESSED_EXTENT (128u * 1024)
#define READ_CHUNK (1u << 20)

/*
 * Look up the data checksums of @nsectors sectors from @logical into
 * @csums (csum_size each); @have[i] says whether sector i has one.
 */
int data_lookup_csums(struct butter_fs *fs, u64 logical, u32 nsectors, u8 *csums, u8 *have)
{
	const u32 ss = fs->vol.sectorsize, cs = fs->vol.csum_size;
	struct btrfs_key key = { BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, logical };
	u64 end = logical + (u64)nsectors * ss;
	struct tree_path path;
	int ret;

	memset(have, 0, nsectors);
	if (!fs->has_csum_tree)
		return 0;
	tree_path_init(&path);
	ret = tree_search_backward(&fs->cache, &fs->csum_tree, &key, &path);
	if (ret == 1) {
		/* nothing at or before @logical: start at the first item */
		ret = tree_search_forward(&fs->cache, &fs->csum_tree, &key, &path);
	}
	while (ret == 0) {
		const u8 *item;
		u32 size;
		u64 start, item_end, pos;

		path_key(&path, &key);
		if (key.objectid == BTRFS_EXTENT_CSUM_OBJECTID && key.type == BTRFS_EXTENT_CSUM_KEY) {
			if (key.offset >= end)
				break;
			item = path_item(&path, &size);
			start = key.offset;
			item_end = start + (u64)(size / cs) * ss;
			if (start % ss) {
				ret = BLOG_CORRUPT(&fs->log, "csum item at %llu: unaligned",
						   (unsigned long long)start);
				break;
			}
			for (pos = start > logical ? start : logical; pos < item_end && pos < end;
			     pos += ss) {
				u32 i = (u32)((pos - logical) / ss);

				memcpy(csums + (size_t)i * cs, item + (pos - start) / ss * cs, cs);
				have[i] = 1;
			}
		} else if (key.objectid > BTRFS_EXTENT_CSUM_OBJECTID ||
			   (key.objectid == BTRFS_EXTENT_CSUM_OBJECTID &&
			    key.type > BTRFS_EXTENT_CSUM_KEY)) {
			break;
		}
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	return ret < 0 ? ret : 0;
}

static int sector_ok(struct butter_fs *fs, const u8 *data, const u8 *expect)
{
	u8 csum[BTRFS_CSUM_SIZE];

	btrfs_csum_compute(fs->vol.csum_type, data, fs->vol.sectorsize, csum);
	return memcmp(csum, expect, fs->vol.csum_size) == 0;
}

/*
 * Log one bad copy of the sector at @pos (inside a read that starts at
 * @logical): "data WHAT: logical L copy M on DEV (devid D) physical P,
 * subvolume S inode I path \"P\" file offset O".
 */
static void report_bad_copy(struct butter_fs *fs, const char *what, u64 logical, u64 pos,
			    int mirror, const struct data_owner *who, int level)
{
	char where[256], file[1400];

	volumes_describe(&fs->vol, pos, mirror, where, sizeof(where));
	if (who && who->compressed)
		inode_describe_file_pos(fs, who->subvol, who->ino, who->file_offset, file,
					sizeof(file));
	else if (who)
		inode_describe_file_pos(fs, who->subvol, who->ino, who->file_offset + (pos - logical),
					file, sizeof(file));
	blog_msg(&fs->log, level, "data %s: %s%s%s%s", what, where, who ? ", " : "",
		 who ? file : "", who && who->compressed ? " (compressed extent)" : "");
}

int data_read_logical(struct butter_fs *fs, u64 logical, u64 len, u8 *buf, int nodatasum,
		      const struct data_owner *who)
{
	const u32 ss = fs->vol.sectorsize, cs = fs->vol.csum_size;
	u32 nsectors = (u32)(len / ss), i;
	u8 *csums = NULL, *have = NULL;
	int ret, first_ok, copies;

	if (len == 0)
		return 0;
	if (logical % ss || len % ss)
		return -EINVAL;
	first_ok = volumes_read(&fs->vol, logical, buf, len, 1) == 0;
	if (nodatasum && first_ok)
		return 0;
	if (!nodatasum) {
		csums = malloc((size_t)nsectors * cs);
		have = malloc(nsectors);
		if (!csums || !have) {
			ret = -ENOMEM;
			goto out;
		}
		ret = data_lookup_csums(fs, logical, nsectors, csums, have);
		if (ret)
			goto out;
	}
	copies = volumes_num_copies(&fs->vol, logical);
	ret = 0;
	for (i = 0; i < nsectors; i++) {
		u64 pos = logical + (u64)i * ss;
		u8 *sector = buf + (size_t)i * ss;
		int mirror;

		if (!nodatasum && !have[i]) {
			report_bad_copy(fs, "without a recorded checksum", logical, pos, 1, who,
					BUTTER_LOG_ERROR);
			ret = -EIO;
			goto out;
		}
		if (first_ok && (nodatasum || sector_ok(fs, sector, csums + (size_t)i * cs)))
			continue;
		if (first_ok) {
			volumes_count_error(&fs->vol, pos, 1, BTRFS_DEV_STAT_CORRUPTION_ERRS);
			report_bad_copy(fs, "checksum mismatch", logical, pos, 1, who,
					BUTTER_LOG_WARNING);
		}
		/* after a failed bulk read, copy 1 of this sector may still be fine */
		for (mirror = first_ok ? 2 : 1; mirror <= copies; mirror++) {
			if (volumes_read(&fs->vol, pos, sector, ss, mirror) != 0) {
				if (!volumes_copy_missing(&fs->vol, pos, mirror))
					report_bad_copy(fs, "read error", logical, pos, mirror, who,
							BUTTER_LOG_WARNING);
				continue;
			}
			if (nodatasum || sector_ok(fs, sector, csums + (size_t)i * cs))
				break;
			volumes_count_error(&fs->vol, pos, mirror, BTRFS_DEV_STAT_CORRUPTION_ERRS);
			report_bad_copy(fs, "checksum mismatch", logical, pos, mirror, who,
					BUTTER_LOG_WARNING);
		}
		if (mirror > copies) {
			char file[1400] = "";

			if (who)
				inode_describe_file_pos(fs, who->subvol, who->ino,
							who->compressed ? who->file_offset
								     : who->file_offset + (pos - logical),
							file, sizeof(file));
			blog_err(&fs->log, "data at logical %llu: no good copy among %d%s%s",
				 (unsigned long long)pos, copies, who ? ", " : "", file);
			ret = -EIO;
			goto out;
		}
	}
out:
	free(csums);
	free(have);
	return ret;
}

/* One EXTENT_DATA item, decoded. */
struct file_extent {
	u64 start, end;          /* file range covered */
	u8 type;                 /* BTRFS_FILE_EXTENT_* */
	u8 compression;
	u64 disk_bytenr, disk_num_bytes, offset, ram_bytes;
	const u8 *inline_data;   /* points into the leaf (valid while the path is held) */
	u32 inline_len;
};

static int decode_extent(struct butter_fs *fs, butter_ino_t ino, const struct btrfs_key *key,
			 const u8 *item, u32 size, struct file_extent *fe)
{
	const struct btrfs_file_extent_item *fi = (const struct btrfs_file_extent_item *)item;

	if (size < BTRFS_FILE_EXTENT_INLINE_DATA_START)
		goto bad;
	memset(fe, 0, sizeof(*fe));
	fe->type = fi->type;
	fe->compression = fi->compression;
	fe->ram_bytes = btrfs_file_extent_ram_bytes(fi);
	fe->start = key->offset;
	if (fi->encryption || btrfs_file_extent_other_encoding(fi) ||
	    fe->compression >= BTRFS_NR_COMPRESS_TYPES) {
		blog_err(&fs->log, "subvolume %llu inode %llu offset %llu: unsupported encoding",
			 (unsigned long long)ino.subvol, (unsigned long long)ino.ino,
			 (unsigned long long)key->offset);
		return -EIO;
	}
	if (fe->type == BTRFS_FILE_EXTENT_INLINE) {
		fe->inline_data = item + BTRFS_FILE_EXTENT_INLINE_DATA_START;
		fe->inline_len = size - (u32)BTRFS_FILE_EXTENT_INLINE_DATA_START;
		if (fe->ram_bytes > BTRFS_MAX_SECTORSIZE ||
		    (fe->compression == BTRFS_COMPRESS_NONE && fe->ram_bytes != fe->inline_len &&
		     fe->ram_bytes > fe->inline_len))
			goto bad;
		fe->end = fe->start + fe->ram_bytes;
		return 0;
	}
	if (fe->type != BTRFS_FILE_EXTENT_REG && fe->type != BTRFS_FILE_EXTENT_PREALLOC)
		goto bad;
	if (size < sizeof(*fi))
		goto bad;
	fe->disk_bytenr = btrfs_file_extent_disk_bytenr(fi);
	fe->disk_num_bytes = btrfs_file_extent_disk_num_bytes(fi);
	fe->offset = btrfs_file_extent_offset(fi);
	fe->end = fe->start + btrfs_file_extent_num_bytes(fi);
	if (fe->end < fe->start)
		goto bad;
	if (fe->disk_bytenr) {
		u32 ss = fs->vol.sectorsize;

		if (fe->disk_bytenr % ss || fe->disk_num_bytes % ss || fe->disk_num_bytes == 0)
			goto bad;
		/* [offset, offset + num_bytes) must lie in the extent; written so nothing wraps */
		if (fe->compression) {
			if (fe->disk_num_bytes > MAX_COMPRESSED_EXTENT ||
			    fe->ram_bytes > MAX_COMPRESSED_EXTENT || fe->offset > fe->ram_bytes ||
			    fe->end - fe->start > fe->ram_bytes - fe->offset)
				goto bad;
		} else if (fe->offset > fe->disk_num_bytes ||
			   fe->end - fe->start > fe->disk_num_bytes - fe->offset) {
			goto bad;
		}
	}
	return 0;
bad:
	return BLOG_CORRUPT(&fs->log, "subvolume %llu inode %llu: bad file extent at offset %llu",
			    (unsigned long long)ino.subvol, (unsigned long long)ino.ino,
			    (unsigned long long)key->offset);
}

/*
 * Copy file bytes [pos, pos+len) that lie inside extent @fe into @out.
 */
static int read_from_extent(struct butter_fs *fs, butter_ino_t ino, const struct file_extent *fe,
			    u64 pos, size_t len, u8 *out, int nodatasum)
{
	struct data_owner who = { ino.subvol, ino.ino, 0, 0 };
	const u32 ss = fs->vol.sectorsize;
	u64 in_extent = pos - fe->start;
	u8 *tmp = NULL, *plain = NULL;
	int ret = 0;

	if (fe->type == BTRFS_FILE_EXTENT_INLINE) {
		if (fe->compression == BTRFS_COMPRESS_NONE) {
			size_t have = in_extent < fe->inline_len ? fe->inline_len - in_extent : 0;

			if (have > len)
				have = len;
			memcpy(out, fe->inline_data + in_extent, have);
			memset(out + have, 0, len - have);
			return 0;
		}
		plain = calloc(1, fe->ram_bytes ? fe->ram_bytes : 1);
		if (!plain)
			return -ENOMEM;
		if (data_decompress(fe->compression, fe->inline_data, fe->inline_len, plain,
				    fe->ram_bytes, ss) < 0) {
			char file[1400];

			blog_err(&fs->log, "inline extent: compressed data is corrupt: %s",
				 inode_describe_file_pos(fs, ino.subvol, ino.ino, fe->start, file,
							 sizeof(file)));
			ret = -EIO;
		} else {
			memcpy(out, plain + in_extent, len);
		}
		free(plain);
		return ret;
	}
	if (fe->type == BTRFS_FILE_EXTENT_PREALLOC || fe->disk_bytenr == 0) {
		memset(out, 0, len);
		return 0;
	}
	if (fe->compression == BTRFS_COMPRESS_NONE) {
		u64 disk = fe->disk_bytenr + fe->offset + in_extent;
		u64 astart = disk - disk % ss;
		u64 aend = (disk + len + ss - 1) / ss * ss;

		tmp = malloc(aend - astart);
		if (!tmp)
			return -ENOMEM;
		who.file_offset = pos - (disk - astart); /* the file byte at astart */
		ret = data_read_logical(fs, astart, aend - astart, tmp, nodatasum, &who);
		if (ret == 0)
			memcpy(out, tmp + (disk - astart), len);
		free(tmp);
		return ret;
	}
	tmp = malloc(fe->disk_num_bytes);
	plain = calloc(1, fe->ram_bytes);
	if (!tmp || !plain) {
		ret = -ENOMEM;
		goto out;
	}
	who.file_offset = fe->start;
	who.compressed = 1;
	ret = data_read_logical(fs, fe->disk_bytenr, fe->disk_num_bytes, tmp, nodatasum, &who);
	if (ret)
		goto out;
	if (data_decompress(fe->compression, tmp, fe->disk_num_bytes, plain, fe->ram_bytes, ss) <
	    0) {
		char file[1400];

		blog_err(&fs->log, "extent at logical %llu: compressed data is corrupt: %s",
			 (unsigned long long)fe->disk_bytenr,
			 inode_describe_file_pos(fs, ino.subvol, ino.ino, fe->start, file,
						 sizeof(file)));
		ret = -EIO;
		goto out;
	}
	memcpy(out, plain + fe->offset + in_extent, len);
out:
	free(tmp);
	free(plain);
	return ret;
}

/*
 * Position @path at the extent item covering @pos or the first after it.
 * Returns 0 when positioned on an item of this inode, 1 when there is none.
 */
static int seek_extent(struct butter_fs *fs, const struct subvol *sv, u64 ino, u64 pos,
		       struct tree_path *path)
{
	struct btrfs_key key = { ino, BTRFS_EXTENT_DATA_KEY, pos };
	int ret = tree_search_backward(&fs->cache, &sv->root, &key, path);

	if (ret < 0)
		return ret;
	if (ret == 0) {
		path_key(path, &key);
		if (key.objectid == ino && key.type == BTRFS_EXTENT_DATA_KEY)
			return 0;
		ret = tree_next_item(&fs->cache, path);
	} else {
		key.objectid = ino;
		key.type = BTRFS_EXTENT_DATA_KEY;
		key.offset = 0;
		ret = tree_search_forward(&fs->cache, &sv->root, &key, path);
	}
	if (ret)
		return ret;
	path_key(path, &key);
	return key.objectid == ino && key.type == BTRFS_EXTENT_DATA_KEY ? 0 : 1;
}

static int read_range(struct butter_fs *fs, butter_ino_t ino, const struct subvol *sv, u8 *buf,
		      u64 off, u64 end, int nodatasum)
{
	struct tree_path path;
	u64 pos = off;
	int ret;

	tree_path_init(&path);
	ret = seek_extent(fs, sv, ino.ino, off, &path);
	while (ret == 0 && pos < end) {
		struct btrfs_key key;
		struct file_extent fe;
		const u8 *item;
		u32 size;
		u64 stop;

		path_key(&path, &key);
		if (key.objectid != ino.ino || key.type != BTRFS_EXTENT_DATA_KEY || key.offset >= end)
			break;
		item = path_item(&path, &size);
		ret = decode_extent(fs, ino, &key, item, size, &fe);
		if (ret)
			break;
		if (fe.start > pos) {
			memset(buf + (pos - off), 0, fe.start - pos);
			pos = fe.start;
		}
		if (fe.end > pos) {
			stop = fe.end < end ? fe.end : end;
			ret = read_from_extent(fs, ino, &fe, pos, stop - pos, buf + (pos - off), nodatasum);
			if (ret)
				break;
			pos = stop;
		}
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	if (ret < 0)
		return ret;
	if (pos < end)
		memset(buf + (pos - off), 0, end - pos);
	return 0;
}

ssize_t data_read(struct butter_fs *fs, butter_ino_t ino, void *buf, size_t len, uint64_t off)
{
	struct btrfs_inode_item inode;
	struct subvol sv;
	u64 size, stored, end;
	int ret = 0;

	ret = inode_read(fs, ino, &inode);
	if (ret)
		return ret;
	if (S_ISDIR(btrfs_inode_mode(&inode)))
		return -EISDIR;
	ret = fs_get_subvol(fs, ino.subvol, &sv);
	if (ret)
		return ret;
	stored = btrfs_inode_size(&inode);
	/* bytes buffered by delayed allocation (delalloc.c) count as written */
	size = data_buffered_size(fs, ino, stored);
	if (off >= size || len == 0)
		return 0;
	end = size - off < len ? size : off + len;
	if (off < stored)
		ret = read_range(fs, ino, &sv, buf, off, end < stored ? end : stored,
				 !!(btrfs_inode_flags(&inode) & BTRFS_INODE_NODATASUM_FLAG));
	if (ret)
		return ret;
	if (end > stored)
		memset((u8 *)buf + (off > stored ? 0 : stored - off), 0,
		       end - (off > stored ? off : stored));
	data_buffer_overlay(fs, ino, buf, end - off, off);
	return (ssize_t)(end - off);
}

ssize_t data_readlink(struct butter_fs *fs, butter_ino_t ino, char *buf, size_t size)
{
	struct btrfs_inode_item inode;
	struct subvol sv;
	u64 len;
	char *tmp;
	int ret;

	ret = inode_read(fs, ino, &inode);
	if (ret)
		return ret;
	if (!S_ISLNK(btrfs_inode_mode(&inode)))
		return -EINVAL;
	len = btrfs_inode_size(&inode);
	if (len > 4095)
		return BLOG_CORRUPT(&fs->log, "symlink %llu: target of %llu bytes",
				    (unsigned long long)ino.ino, (unsigned long long)len);
	ret = fs_get_subvol(fs, ino.subvol, &sv);
	if (ret)
		return ret;
	tmp = malloc(len + 1);
	if (!tmp)
		return -ENOMEM;
	ret = read_range(fs, ino, &sv, (u8 *)tmp, 0, len, 1);
	if (ret == 0 && size) {
		size_t n = len < size ? len : size;

		memcpy(buf, tmp, n);
		if (n < size)
			buf[n] = '\0';
	}
	free(tmp);
	return ret ? ret : (ssize_t)len;
}

int data_seek(struct butter_fs *fs, butter_ino_t ino, uint64_t off, int whence, uint64_t *result)
{
	struct btrfs_inode_item inode;
	struct tree_path path;
	struct subvol sv;
	u64 size, pos = off;
	int ret;

	if (whence != 3 && whence != 4)
		return -EINVAL;
	ret = inode_read(fs, ino, &inode);
	if (ret)
		return ret;
	size = btrfs_inode_size(&inode);
	if (off >= size)
		return -ENXIO;
	ret = fs_get_subvol(fs, ino.subvol, &sv);
	if (ret)
		return ret;
	tree_path_init(&path);
	ret = seek_extent(fs, &sv, ino.ino, off, &path);
	while (ret == 0) {
		struct btrfs_key key;
		struct file_extent fe;
		const u8 *item;
		u32 isize;
		int is_data;

		path_key(&path, &key);
		if (key.objectid != ino.ino || key.type != BTRFS_EXTENT_DATA_KEY || key.offset >= size)
			break;
		item = path_item(&path, &isize);
		ret = decode_extent(fs, ino, &key, item, isize, &fe);
		if (ret)
			break;
		is_data = fe.type == BTRFS_FILE_EXTENT_INLINE ||
			  (fe.type == BTRFS_FILE_EXTENT_REG && fe.disk_bytenr != 0);
		if (fe.end > pos) {
			if (fe.start > pos && whence == 4) {
				/* a gap before this extent is a hole */
				*result = pos;
				tree_path_release(&fs->cache, &path);
				return 0;
			}
			if (is_data && whence == 3) {
				*result = fe.start > pos ? fe.start : pos;
				tree_path_release(&fs->cache, &path);
				return 0;
			}
			if (!is_data && whence == 4) {
				*result = fe.start > pos ? fe.start : pos;
				tree_path_release(&fs->cache, &path);
				return 0;
			}
			pos = fe.end;
		}
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	if (ret < 0)
		return ret;
	if (whence == 3)
		return -ENXIO;
	*result = pos < size ? pos : size;
	return 0;
}

int data_read_stored(struct butter_fs *fs, u64 logical, u64 len, u8 *buf, u8 *csums, u8 *have)
{
	u32 ss = fs->vol.sectorsize, n = (u32)(len / ss), a, b;
	int ret = data_lookup_csums(fs, logical, n, csums, have);

	/* runs of sectors with and without checksums: verified reads and raw ones */
	for (a = 0; ret == 0 && a < n; a = b) {
		for (b = a + 1; b < n && have[b] == have[a]; b++)
			;
		ret = data_read_logical(fs, logical + (u64)a * ss, (u64)(b - a) * ss,
					buf + (size_t)a * ss, !have[a], NULL);
	}
	return ret;
}
