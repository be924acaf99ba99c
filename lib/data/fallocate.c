/*
 * fallocate.c — fallocate(2) on a regular file: preallocating space
 * (PREALLOC extents), punching holes and zeroing ranges, as btrfs does it.
 *
 * The modes (Linux FALLOC_FL_* values) and what each leaves on disk:
 *   0 / KEEP_SIZE       every hole in the sector-aligned cover of the range
 *                       gets PREALLOC file extents (a new data extent each, an
 *                       EXTENT_DATA_REF, no checksums); written or already
 *                       preallocated parts stay. i_size grows to the range's
 *                       end unless KEEP_SIZE.
 *   PUNCH_HOLE|KEEP_SIZE the whole sectors inside the range lose their extents
 *                       (references dropped); the partial sectors at its edges
 *                       that hold data are zeroed by rewriting them. i_size
 *                       stays.
 *   ZERO_RANGE [|KEEP]  the whole sectors become one PREALLOC run (what was
 *                       there is dropped, except prealloc already in place);
 *                       partial edge sectors holding data are zeroed by
 *                       rewriting, edge sectors that are holes join the run.
 * Anything else is -EOPNOTSUPP. Prealloc reads as zeros (read.c); writing
 * into it is an ordinary copy-on-write write (write.c): the written part
 * becomes a regular extent, the rest stays prealloc.
 *
 * Rules kept (what btrfs check and the kernel expect):
 *  1. nbytes counts num_bytes of every extent with a disk extent (prealloc
 *     included) and the length of inline extents; holes count nothing.
 *  2. Without the NO_HOLES feature every byte of the file up to the rounded-up
 *     i_size is covered by an EXTENT_DATA item: gaps left by punching or by
 *     growing the file get explicit hole items (disk_bytenr 0).
 *  3. Bytes of the last sector past i_size are zero on disk (every writer
 *     keeps them so), so growing a file never needs to zero them.
 *  4. A preallocated inode carries BTRFS_INODE_PREALLOC, as the kernel sets it.
 * Times: mtime and ctime change on every call that gets past the checks,
 * except a punch of a range that is a hole already (the kernel's shortcut).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/data.h"

#define FL_KEEP_SIZE 0x01
#define FL_PUNCH_HOLE 0x02
#define FL_COLLAPSE_RANGE 0x08
#define FL_ZERO_RANGE 0x10
#define FL_INSERT_RANGE 0x20
#define FL_UNSHARE_RANGE 0x40
#define FL_WRITE_ZEROES 0x80
#define FL_MODE_MASK (FL_PUNCH_HOLE | FL_COLLAPSE_RANGE | FL_ZERO_RANGE | FL_INSERT_RANGE | \
		      FL_UNSHARE_RANGE | FL_WRITE_ZEROES)

/* What covers a file range: one EXTENT_DATA item, or a gap between items. */
enum seg_kind {
	SEG_HOLE,     /* a gap, or an explicit hole item (has_item) */
	SEG_PREALLOC,
	SEG_DATA,     /* a regular extent with bytes, or the inline extent */
};

struct seg {
	u64 start, end;
	enum seg_kind kind;
	int has_item;
	int is_inline;
};

/*
 * Find what covers file offset @pos of @ino: the item around it, or the gap
 * up to the next item (to the end of the offset space if none follows).
 * An inline extent covers [0, its length rounded up to a sector).
 */
static int find_seg(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 pos, struct seg *seg)
{
	struct btrfs_key key = { ino, BTRFS_EXTENT_DATA_KEY, pos };
	u32 ss = fs->vol.sectorsize;
	struct tree_path path;
	int ret;

	memset(seg, 0, sizeof(*seg));
	seg->start = pos;
	seg->end = (u64)-1;
	seg->kind = SEG_HOLE;
	tree_path_init(&path);
	ret = tree_search_backward(&fs->cache, &sv->root, &key, &path);
	if (ret == 1) {
		key.objectid = ino;
		key.type = BTRFS_EXTENT_DATA_KEY;
		key.offset = 0;
		ret = tree_search_forward(&fs->cache, &sv->root, &key, &path);
		if (ret == 0)
			ret = 2; /* positioned on the first item at or after (ino, EXTENT_DATA, 0) */
	}
	while (ret == 0 || ret == 2) {
		const struct btrfs_file_extent_item *fi;
		u64 end;
		u32 size;

		path_key(&path, &key);
		if (key.objectid != ino || key.type != BTRFS_EXTENT_DATA_KEY) {
			if (ret == 2 || key.objectid > ino ||
			    (key.objectid == ino && key.type > BTRFS_EXTENT_DATA_KEY))
				break;
			ret = tree_next_item(&fs->cache, &path);
			if (ret == 0)
				ret = 2;
			continue;
		}
		fi = (const void *)path_item(&path, &size);
		if (size < BTRFS_FILE_EXTENT_INLINE_DATA_START ||
		    (fi->type != BTRFS_FILE_EXTENT_INLINE && size < sizeof(*fi))) {
			ret = BLOG_CORRUPT(&fs->log, "inode %llu: short file extent at %llu",
					   (unsigned long long)ino, (unsigned long long)key.offset);
			break;
		}
		if (fi->type == BTRFS_FILE_EXTENT_INLINE)
			end = key.offset + (btrfs_file_extent_ram_bytes(fi) + ss - 1) / ss * ss;
		else
			end = key.offset + btrfs_file_extent_num_bytes(fi);
		if (key.offset > pos) {
			seg->end = key.offset; /* a gap up to this item */
			break;
		}
		if (end > pos) {
			seg->start = key.offset;
			seg->end = end;
			seg->has_item = 1;
			if (fi->type == BTRFS_FILE_EXTENT_INLINE) {
				seg->kind = SEG_DATA;
				seg->is_inline = 1;
			} else if (fi->type == BTRFS_FILE_EXTENT_PREALLOC) {
				seg->kind = SEG_PREALLOC;
			} else {
				seg->kind = btrfs_file_extent_disk_bytenr(fi) ? SEG_DATA : SEG_HOLE;
			}
			break;
		}
		ret = tree_next_item(&fs->cache, &path); /* it ends at or before @pos */
		if (ret == 0)
			ret = 2;
	}
	tree_path_release(&fs->cache, &path);
	return ret < 0 ? ret : 0;
}

/* Insert an explicit hole item for [start, end) of @ino. */
static int insert_hole_item(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 start, u64 end)
{
	struct btrfs_file_extent_item fi;
	struct btrfs_key key = { ino, BTRFS_EXTENT_DATA_KEY, start };

	memset(&fi, 0, sizeof(fi));
	btrfs_set_file_extent_generation(&fi, fs->w->txn.tt.transid);
	btrfs_set_file_extent_ram_bytes(&fi, end - start);
	btrfs_set_file_extent_num_bytes(&fi, end - start);
	fi.type = BTRFS_FILE_EXTENT_REG;
	return tree_insert_item(&fs->w->txn.tt, &sv->root, &key, &fi, sizeof(fi));
}

int data_fill_holes(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 start, u64 end)
{
	struct seg seg;
	int ret = 0;

	if (btrfs_super_incompat_flags(&fs->vol.super) & BTRFS_FEATURE_INCOMPAT_NO_HOLES)
		return 0;
	while (start < end && ret == 0) {
		ret = find_seg(fs, sv, ino, start, &seg);
		if (ret)
			break;
		if (seg.end > end)
			seg.end = end;
		if (seg.kind == SEG_HOLE && !seg.has_item)
			ret = insert_hole_item(fs, sv, ino, start, seg.end);
		start = seg.end;
	}
	return ret;
}

/*
 * Give [start, end) of @ino (sector-aligned, holding no extents) PREALLOC
 * extents: new data extents without data or checksums. Adds to *nbytes.
 */
static int prealloc_range(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 start, u64 end,
			  s64 *nbytes)
{
	struct fs_write_state *w = fs->w;
	int ret = 0;

	while (start < end && ret == 0) {
		struct btrfs_file_extent_item fi;
		struct btrfs_key key = { ino, BTRFS_EXTENT_DATA_KEY, start };
		u64 want = end - start, logical, got;

		if (want > MAX_EXTENT_SIZE)
			want = MAX_EXTENT_SIZE;
		ret = data_alloc(fs, want, &logical, &got);
		if (ret)
			break;
		memset(&fi, 0, sizeof(fi));
		btrfs_set_file_extent_generation(&fi, w->txn.tt.transid);
		btrfs_set_file_extent_ram_bytes(&fi, got);
		fi.type = BTRFS_FILE_EXTENT_PREALLOC;
		btrfs_set_file_extent_disk_bytenr(&fi, logical);
		btrfs_set_file_extent_disk_num_bytes(&fi, got);
		btrfs_set_file_extent_num_bytes(&fi, got);
		ret = tree_insert_item(&w->txn.tt, &sv->root, &key, &fi, sizeof(fi));
		if (ret == 0)
			ret = data_queue_data_ref(w, logical, got, sv->id, ino, start, 1);
		*nbytes += (s64)got;
		start += got;
	}
	return ret;
}

/* The final inode update of a fallocate call. */
struct falloc_update {
	u64 size;        /* new i_size when larger than the current one */
	s64 nbytes;      /* added to nbytes */
	int prealloc;    /* set BTRFS_INODE_PREALLOC */
};

static void apply_falloc(struct btrfs_inode_item *ii, void *arg)
{
	struct falloc_update *u = arg;

	if (u->size > btrfs_inode_size(ii))
		btrfs_set_inode_size(ii, u->size);
	btrfs_set_inode_nbytes(ii, (u64)((s64)btrfs_inode_nbytes(ii) + u->nbytes));
	if (u->prealloc)
		btrfs_set_inode_flags(ii, btrfs_inode_flags(ii) | BTRFS_INODE_PREALLOC_FLAG);
	fs_now_ts(&ii->mtime);
	ii->ctime = ii->mtime;
}

/* One falloc call's state: the inode and what has been changed so far. */
struct falloc {
	struct butter_fs *fs;
	struct subvol *sv;
	butter_ino_t ino;
	u64 isize;        /* i_size when the call started */
	u32 ss;
	int changed;      /* trees touched: a failure from here on aborts */
	struct falloc_update u;
};

static u64 round_down_ss(const struct falloc *f, u64 x)
{
	return x / f->ss * f->ss;
}

static u64 round_up_ss(const struct falloc *f, u64 x)
{
	return (x + f->ss - 1) / f->ss * f->ss;
}

/*
 * Zero [start, end) inside one sector by rewriting it, if the sector holds
 * data; bytes past i_size are zero already (rule 3) and stay untouched.
 */
static int zero_partial(struct falloc *f, u64 start, u64 end)
{
	struct seg seg;
	u8 *zeros;
	int ret, changed = 0;
	ssize_t n;

	if (end > f->isize)
		end = f->isize;
	if (start >= end)
		return 0;
	ret = find_seg(f->fs, f->sv, f->ino.ino, round_down_ss(f, start), &seg);
	if (ret || seg.kind != SEG_DATA)
		return ret;
	zeros = calloc(1, end - start);
	if (!zeros)
		return -ENOMEM;
	n = data_write_locked(f->fs, f->ino, zeros, end - start, start, &changed);
	free(zeros);
	f->changed |= changed;
	return n < 0 ? (int)n : 0;
}

/* Make [start, end) (sector-aligned) one run of new PREALLOC extents. */
static int replace_with_prealloc(struct falloc *f, u64 start, u64 end)
{
	int ret;

	if (start >= end)
		return 0;
	f->changed = 1;
	ret = data_drop_extents(f->fs, f->sv, f->ino.ino, start, end);
	if (ret == 0)
		ret = prealloc_range(f->fs, f->sv, f->ino.ino, start, end, &f->u.nbytes);
	f->u.prealloc = 1;
	return ret;
}

/* Growing a file to a range that starts past its end: hole items (rule 2). */
static int expand_to(struct falloc *f, u64 start)
{
	u64 from = round_up_ss(f, f->isize);

	if (start <= from ||
	    (btrfs_super_incompat_flags(&f->fs->vol.super) & BTRFS_FEATURE_INCOMPAT_NO_HOLES))
		return 0;
	f->changed = 1;
	return data_fill_holes(f->fs, f->sv, f->ino.ino, from, start);
}

/* Mode 0 and KEEP_SIZE: prealloc for the holes of the range. */
static int do_allocate(struct falloc *f, u64 off, u64 len)
{
	u64 pos = round_down_ss(f, off), end = round_up_ss(f, off + len);
	u64 (*ranges)[2] = NULL;
	size_t n = 0, cap = 0, i;
	int ret;

	ret = expand_to(f, pos);
	/* first find the ranges to fill (the tree changes as they are filled) */
	while (ret == 0 && pos < end) {
		struct seg seg;
		u64 stop;

		ret = find_seg(f->fs, f->sv, f->ino.ino, pos, &seg);
		if (ret)
			break;
		stop = seg.end < end ? seg.end : end;
		/* holes, and (as the kernel does) anything but prealloc at or past i_size */
		if (seg.kind == SEG_HOLE ||
		    (pos >= f->isize && seg.kind == SEG_DATA && !seg.is_inline)) {
			if (n && ranges[n - 1][1] == pos) {
				ranges[n - 1][1] = stop;
			} else {
				if (n == cap) {
					size_t ncap = cap ? cap * 2 : 16;
					u64 (*r)[2] = realloc(ranges, ncap * sizeof(*r));

					if (!r) {
						ret = -ENOMEM;
						break;
					}
					ranges = r;
					cap = ncap;
				}
				ranges[n][0] = pos;
				ranges[n][1] = stop;
				n++;
			}
		}
		pos = stop;
	}
	for (i = 0; i < n && ret == 0; i++)
		ret = replace_with_prealloc(f, ranges[i][0], ranges[i][1]);
	free(ranges);
	return ret;
}

static int do_punch(struct falloc *f, u64 off, u64 len)
{
	u64 end = off + len, first = round_up_ss(f, off), last = round_down_ss(f, end);
	u64 pos = off, ino_size = round_up_ss(f, f->isize);
	int ret = 0, any = 0;

	/* a range that is all hole already changes nothing, not even times */
	while (pos < end && !any) {
		struct seg seg;

		ret = find_seg(f->fs, f->sv, f->ino.ino, pos, &seg);
		if (ret)
			return ret;
		any = seg.kind != SEG_HOLE;
		pos = seg.end;
	}
	if (!any)
		return 1;
	if (round_down_ss(f, off) == round_down_ss(f, end - 1) && len < f->ss)
		return zero_partial(f, off, end);
	if (off < first)
		ret = zero_partial(f, off, first);
	if (ret == 0 && end > last && last >= first)
		ret = zero_partial(f, last, end);
	if (ret == 0 && first < last) {
		f->changed = 1;
		ret = data_drop_extents(f->fs, f->sv, f->ino.ino, first, last);
		if (ret == 0 && first < ino_size)
			ret = data_fill_holes(f->fs, f->sv, f->ino.ino, first,
					      last < ino_size ? last : ino_size);
	}
	return ret;
}

static int do_zero_range(struct falloc *f, u64 off, u64 len)
{
	u64 end = off + len, astart, aend;
	struct seg seg;
	int ret;

	ret = expand_to(f, round_down_ss(f, off));
	if (ret == 0)
		ret = find_seg(f->fs, f->sv, f->ino.ino, round_down_ss(f, off), &seg);
	if (ret)
		return ret;
	if (seg.kind == SEG_PREALLOC) {
		/* prealloc already in place at the start: work on what follows it */
		if (seg.end >= end)
			return 0;
		off = seg.end;
	}
	if (round_down_ss(f, off) == round_down_ss(f, end - 1)) {
		/* within one sector */
		ret = find_seg(f->fs, f->sv, f->ino.ino, round_down_ss(f, off), &seg);
		if (ret || seg.kind == SEG_PREALLOC)
			return ret;
		if (end - off < f->ss && seg.kind != SEG_HOLE)
			return zero_partial(f, off, end);
		return replace_with_prealloc(f, round_down_ss(f, off), round_down_ss(f, off) + f->ss);
	}
	astart = round_up_ss(f, off);
	aend = round_down_ss(f, end);
	if (off % f->ss) {
		ret = find_seg(f->fs, f->sv, f->ino.ino, round_down_ss(f, off), &seg);
		if (ret == 0 && seg.kind == SEG_HOLE)
			astart = round_down_ss(f, off);
		else if (ret == 0 && seg.kind == SEG_DATA)
			ret = zero_partial(f, off, astart);
	}
	if (ret == 0 && end % f->ss) {
		ret = find_seg(f->fs, f->sv, f->ino.ino, aend, &seg);
		if (ret == 0 && seg.kind == SEG_HOLE)
			aend = round_up_ss(f, end);
		else if (ret == 0 && seg.kind == SEG_DATA)
			ret = zero_partial(f, aend, end);
	}
	if (ret == 0)
		ret = replace_with_prealloc(f, astart, aend);
	return ret;
}

/* The checks of vfs_fallocate() and btrfs_fallocate(), in their order. */
static int check_mode(int mode, u64 off, u64 len)
{
	if (len == 0 || off > MAX_FILE_BYTES || len > MAX_FILE_BYTES)
		return -EINVAL;
	if (mode & ~(FL_MODE_MASK | FL_KEEP_SIZE))
		return -EOPNOTSUPP;
	switch (mode & FL_MODE_MASK) {
	case 0:
	case FL_UNSHARE_RANGE:
	case FL_ZERO_RANGE:
		break;
	case FL_PUNCH_HOLE:
		if (!(mode & FL_KEEP_SIZE))
			return -EOPNOTSUPP;
		break;
	case FL_COLLAPSE_RANGE:
	case FL_INSERT_RANGE:
	case FL_WRITE_ZEROES:
		if (mode & FL_KEEP_SIZE)
			return -EOPNOTSUPP;
		break;
	default:
		return -EOPNOTSUPP;
	}
	return 0;
}

int data_fallocate(struct butter_fs *fs, butter_ino_t ino, int mode, uint64_t off, uint64_t len)
{
	struct btrfs_inode_item ii;
	struct fs_write_state *w;
	struct falloc f;
	u64 reserve;
	u32 type;
	int ret, err = 0;

	ret = check_mode(mode, off, len);
	if (ret == 0)
		ret = data_flush_ino(fs, ino); /* buffered data first (delalloc.c) */
	if (ret)
		return ret;
	if (!fs->w)
		return -EROFS;
	ret = inode_read(fs, ino, &ii);
	if (ret == 0) /* chattr +a allows what only allocates; +i nothing */
		ret = inode_may_change(&ii, (mode & ~FL_KEEP_SIZE) ? INODE_FIXED
								 : BTRFS_INODE_IMMUTABLE_FLAG);
	if (ret)
		return ret;
	type = btrfs_inode_mode(&ii) & S_IFMT;
	if (type == S_IFIFO)
		return -ESPIPE;
	if (type == S_IFDIR)
		return -EISDIR;
	if (type != S_IFREG)
		return -ENODEV;
	if (off + len > MAX_FILE_BYTES)
		return -EFBIG;
	if (mode & ~(FL_KEEP_SIZE | FL_PUNCH_HOLE | FL_ZERO_RANGE))
		return -EOPNOTSUPP;

	memset(&f, 0, sizeof(f));
	f.fs = fs;
	f.ino = ino;
	f.ss = fs->vol.sectorsize;
	/* as the kernel, space for the whole aligned range, and two edge sectors */
	reserve = (mode & FL_PUNCH_HOLE)
			  ? 2ULL * f.ss
			  : round_up_ss(&f, off + len) - round_down_ss(&f, off) + 2ULL * f.ss;
	ret = fs_begin_change_rsv(fs, &w, reserve, !!(mode & FL_PUNCH_HOLE));
	if (ret)
		return ret;
	ret = inode_read(fs, ino, &ii);
	if (ret == 0 && !(f.sv = fs_subvol_mut(fs, ino.subvol, &err)))
		ret = err;
	if (ret == 0 && (f.sv->flags & BTRFS_ROOT_SUBVOL_RDONLY))
		ret = -EROFS;
	if (ret)
		return fs_end_change(w, ret, 0);
	f.isize = btrfs_inode_size(&ii);
	f.u.size = f.isize;
	if (!(mode & FL_KEEP_SIZE) && off + len > f.isize)
		f.u.size = off + len;

	if (mode & FL_PUNCH_HOLE)
		ret = do_punch(&f, off, len);
	else if (mode & FL_ZERO_RANGE)
		ret = do_zero_range(&f, off, len);
	else
		ret = do_allocate(&f, off, len);
	if (ret == 1) /* nothing to do */
		return fs_end_change(w, 0, 0);
	if (ret == 0) {
		f.changed = 1;
		ret = inode_modify(fs, f.sv, ino.ino, apply_falloc, &f.u);
	}
	return fs_end_change(w, ret, f.changed);
}
