/*
 * layout.c — where a file's data lies: defragment one file, or lay out the
 * files of an access trace one after another (butter_defrag(),
 * butter_layout()).
 *
 * Both come down to one step: choose data extents, in the order they should
 * lie, and move them with ops_move_data_locked() (relocate.c), which copies
 * each right after the previous one and points every file extent item that
 * names it — in this file, in snapshots, in reflinked files — at the copy.
 * So sharing is kept (the kernel's defrag rewrites the data and breaks it),
 * checksums and compression are carried over as stored, and the old place is
 * freed at the commit. Only the part of an extent that some file extent
 * item uses is copied (the pieces that appends left behind when they
 * rewrote a partial last page stay behind and are freed); a compressed
 * extent moves whole. A file whose runs moving cannot join is left alone.
 *
 * What counts is the order of the pieces a reader meets: a *run* is a stretch
 * of consecutive pieces each starting where the previous one ended in the
 * logical address space (within a chunk that is also the device order for
 * single, dup and mirrored profiles); the *seek distance* adds up the gaps
 * between runs. A file is left alone when its pieces form one run, or when
 * no run is shorter than the target size (btrfs-progs' -t).
 *
 * Both hold the library's write lock for their whole work and commit (the
 * move commits each 256 MiB); a power cut leaves the previous or the next
 * commit with the same file contents.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/data.h"
#include "inode/inode.h"
#include "ops/ops.h"

#define DEFRAG_DEFAULT_TARGET (32ULL << 20)

/* One piece of a file as a reader meets it. */
struct piece {
	u64 file_off, len;      /* file bytes */
	u64 logical, disk_len;  /* where the bytes start on disk, and how many are read there */
	u64 bytenr, extent_len; /* the extent it lies in */
	int prealloc;
};

struct piece_list {
	struct piece *p;
	size_t n, cap;
};

static int piece_add(struct piece_list *l, const struct piece *p)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		struct piece *np = realloc(l->p, cap * sizeof(*np));

		if (!np)
			return -ENOMEM;
		l->p = np;
		l->cap = cap;
	}
	l->p[l->n++] = *p;
	return 0;
}

/*
 * Append the data pieces of file @ino in [off, off + len) (len 0: to the
 * end) to @l, in file order. Holes and inline extents have no place and are
 * skipped.
 */
static int collect_pieces(struct butter_fs *fs, butter_ino_t ino, u64 off, u64 len,
			  struct piece_list *l)
{
	struct btrfs_key key = { ino.ino, BTRFS_EXTENT_DATA_KEY, 0 };
	u64 end = len && off + len > off ? off + len : UINT64_MAX;
	struct tree_path path;
	struct subvol *sv;
	int ret;

	sv = fs_subvol_cached(fs, ino.subvol, &ret);
	if (!sv)
		return ret;
	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &sv->root, &key, &path);
	while (ret == 0) {
		const struct btrfs_file_extent_item *fi;
		struct piece p;
		u32 size;

		path_key(&path, &key);
		if (key.objectid != ino.ino || key.type != BTRFS_EXTENT_DATA_KEY || key.offset >= end)
			break;
		fi = (const void *)path_item(&path, &size);
		if (size < sizeof(*fi) || fi->type == BTRFS_FILE_EXTENT_INLINE ||
		    !btrfs_file_extent_disk_bytenr(fi))
			goto next;
		memset(&p, 0, sizeof(p));
		p.file_off = key.offset;
		p.len = btrfs_file_extent_num_bytes(fi);
		if (p.file_off + p.len <= off)
			goto next;
		p.bytenr = btrfs_file_extent_disk_bytenr(fi);
		p.extent_len = btrfs_file_extent_disk_num_bytes(fi);
		p.prealloc = fi->type == BTRFS_FILE_EXTENT_PREALLOC;
		if (fi->compression) {
			/* a compressed extent is read whole */
			p.logical = p.bytenr;
			p.disk_len = p.extent_len;
		} else {
			p.logical = p.bytenr + btrfs_file_extent_offset(fi);
			p.disk_len = p.len;
		}
		ret = piece_add(l, &p);
		if (ret)
			break;
next:
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	return ret < 0 ? ret : 0;
}

int ops_file_pieces(struct butter_fs *fs, butter_ino_t ino, u64 off, u64 len,
		    int (*fn)(void *arg, u64 logical, u64 len), void *arg)
{
	struct piece_list l = { 0 };
	int ret = collect_pieces(fs, ino, off, len, &l);

	for (size_t i = 0; ret == 0 && i < l.n; i++)
		ret = fn(arg, l.p[i].logical, l.p[i].disk_len);
	free(l.p);
	return ret;
}

/* Runs, the shortest run and the seek distance of @l's pieces, read in order. */
static void measure(const struct piece_list *l, u64 *runs, u64 *shortest, u64 *seek)
{
	u64 r = 0, cur = 0, least = UINT64_MAX, dist = 0, prev_end = 0;
	size_t i;

	for (i = 0; i < l->n; i++) {
		const struct piece *p = &l->p[i];

		if (i == 0 || p->logical != prev_end) {
			if (i) {
				dist += p->logical > prev_end ? p->logical - prev_end
							       : prev_end - p->logical;
				if (cur < least)
					least = cur;
			}
			r++;
			cur = 0;
		}
		cur += p->disk_len;
		prev_end = p->logical + p->disk_len;
	}
	if (l->n && cur < least)
		least = cur;
	if (runs)
		*runs = r;
	if (shortest)
		*shortest = l->n ? least : 0;
	if (seek)
		*seek = dist;
}

static int cmp_u64(const void *a, const void *b)
{
	u64 x = *(const u64 *)a, y = *(const u64 *)b;

	return x < y ? -1 : x > y;
}

/*
 * The fewest runs moving can leave @l in. Moving trims each extent to the
 * part its items use (relocate.c), and lays the extents out in order of
 * first use; so a piece still starts a run only when it goes back to an
 * extent placed earlier (other than right on from the previous piece in
 * the same extent), or follows a compressed extent it does not start (read
 * whole, a compressed extent is its own stretch), or is preallocated (not
 * moved).
 */
static u64 best_runs(const struct piece_list *l)
{
	u64 *seen = malloc((l->n ? l->n : 1) * sizeof(*seen)), r = 0;
	size_t i, nseen = 0;

	if (!seen)
		return 0; /* no estimate: try the move */
	for (i = 0; i < l->n; i++) {
		const struct piece *p = &l->p[i], *q = i ? &l->p[i - 1] : NULL;
		int earlier = !!bsearch(&p->bytenr, seen, nseen, sizeof(*seen), cmp_u64);

		if (!q || p->prealloc || q->prealloc)
			r++;
		else if (q->bytenr == p->bytenr)
			r += p->logical != q->logical + q->disk_len;
		else
			r += earlier;
		if (!earlier) {
			seen[nseen++] = p->bytenr;
			qsort(seen, nseen, sizeof(*seen), cmp_u64);
		}
	}
	free(seen);
	return r;
}

/* The extents of @l's pieces in order of first use, each once; prealloc ones are not moved. */
static int move_items(const struct piece_list *l, struct ops_move_item **out, size_t *nout)
{
	struct ops_move_item *items = malloc((l->n ? l->n : 1) * sizeof(*items));
	u64 *seen = malloc((l->n ? l->n : 1) * sizeof(*seen));
	size_t i, n = 0, nseen = 0;

	if (!items || !seen) {
		free(items);
		free(seen);
		return -ENOMEM;
	}
	for (i = 0; i < l->n; i++) {
		const struct piece *p = &l->p[i];

		/* nseen stays sorted: a binary search tells whether it came before */
		if (p->prealloc ||
		    bsearch(&p->bytenr, seen, nseen, sizeof(*seen), cmp_u64))
			continue;
		seen[nseen++] = p->bytenr;
		qsort(seen, nseen, sizeof(*seen), cmp_u64); /* nearly sorted: cheap */
		items[n].bytenr = p->bytenr;
		items[n].len = p->extent_len;
		n++;
	}
	free(seen);
	*out = items;
	*nout = n;
	return 0;
}

/*
 * Is the extent of @p this piece's alone: one reference, from this file's
 * one item, made after the subvolume's last snapshot (so no snapshot's
 * shared leaf can hold it either)? Such data can be rewritten through the
 * file, as the kernel's defragment does; anything else is moved.
 */
static int exclusive(struct fs_write_state *w, butter_ino_t ino,
		     const struct subvol *sv, const struct piece *p)
{
	struct extent_refs refs;
	int ret = extent_get_refs(&w->es, p->bytenr, &refs);

	if (ret)
		return ret < 0 ? ret : 0;
	ret = refs.refs == 1 && refs.n == 1 && refs.r[0].type == BTRFS_EXTENT_DATA_REF_KEY &&
	      refs.r[0].root_or_parent == ino.subvol && refs.r[0].owner == ino.ino &&
	      refs.r[0].count == 1 && refs.generation > sv->root.last_snapshot;
	extent_refs_free(&refs);
	return ret;
}

struct saved_times {
	struct btrfs_timespec mtime, ctime;
};

static void restore_times(struct btrfs_inode_item *ii, void *arg)
{
	const struct saved_times *t = arg;

	ii->mtime = t->mtime;
	ii->ctime = t->ctime;
}

#define DEFRAG_REWRITE_PIECE (16ULL << 20)

/*
 * Where @len bytes of new data can lie in one piece: *hint when the space
 * there is free, else the first free range that long, else a new data chunk
 * (made now). Leaves *hint alone when none can be had (the write then takes
 * what the allocator finds).
 */
static int find_room(struct butter_fs *fs, u64 len, u64 *hint)
{
	struct fs_write_state *w;
	u64 ss = fs->vol.sectorsize, start, chunk;
	size_t i;
	int ret = fs_begin_change(fs, &w), made = 0;

	if (ret)
		return ret;
	len = (len + ss - 1) / ss * ss;
	if (len > (1ULL << 30))
		len = 1ULL << 30;
	for (i = 0; i < w->es.nbgs; i++) {
		struct block_group *bg = w->es.bgs[i];

		if (!(bg->flags & BTRFS_BLOCK_GROUP_DATA) || !extent_bg_allocatable(bg))
			continue;
		if (*hint && bg->start <= *hint && *hint < bg->start + bg->length &&
		    range_contains(&bg->free, *hint, *hint + len))
			return fs_end_change(w, 0, 0);
	}
	for (i = 0; i < w->es.nbgs; i++) {
		struct block_group *bg = w->es.bgs[i];

		if ((bg->flags & BTRFS_BLOCK_GROUP_DATA) && extent_bg_allocatable(bg) &&
		    bg->free.total >= len && range_find(&bg->free, len, ss, bg->start, &start) == 0) {
			*hint = start;
			return fs_end_change(w, 0, 0);
		}
	}
	ret = chunk_create(&w->es, BTRFS_BLOCK_GROUP_DATA | w->data_profile,
			   chunk_max_size(&w->es, len > (1ULL << 30) ? len : (1ULL << 30)), &chunk);
	if (ret == 0) {
		made = 1;
		ret = chunk_insert_items(&w->es, &w->txn.tt, chunk);
	}
	if (ret == 0)
		*hint = chunk;
	else if (ret == -ENOSPC && !made)
		ret = 0;
	return fs_end_change(w, ret, made);
}

/*
 * Rewrite file bytes [start, end) through the file (read, then written
 * anew: new extents, as large as the free space allows, with the handle's
 * compression), keeping the file's times. The allocator starts at *hint;
 * *hint gets where the new data ends.
 */
static int rewrite_range(struct butter_fs *fs, butter_ino_t ino, u64 start, u64 end, u64 *hint)
{
	struct fs_write_state *w = fs->w;
	struct btrfs_inode_item ii;
	struct saved_times t;
	struct subvol *sv;
	u8 *buf = malloc(DEFRAG_REWRITE_PIECE);
	u64 off;
	int ret;

	if (!buf)
		return -ENOMEM;
	ret = inode_read(fs, ino, &ii);
	t.mtime = ii.mtime;
	t.ctime = ii.ctime;
	if (ret == 0)
		ret = find_room(fs, end - start, hint);
	for (off = start; ret == 0 && off < end; off += DEFRAG_REWRITE_PIECE) {
		size_t len = end - off < DEFRAG_REWRITE_PIECE ? (size_t)(end - off) : DEFRAG_REWRITE_PIECE;
		ssize_t n = data_read(fs, ino, buf, len, off);

		if (n < 0) {
			ret = (int)n;
			break;
		}
		if (n == 0)
			break;
		if (*hint)
			w->es.hint_data = *hint;
		n = data_write(fs, ino, buf, (size_t)n, off);
		if (n < 0)
			ret = (int)n;
		else
			*hint = w->es.hint_data;
	}
	free(buf);
	if (ret == 0) {
		struct fs_write_state *cw;

		ret = fs_begin_change(fs, &cw);
		if (ret)
			return ret;
		sv = fs_subvol_mut(fs, ino.subvol, &ret);
		if (sv)
			ret = inode_modify(fs, sv, ino.ino, restore_times, &t);
		ret = fs_end_change(cw, ret, 1);
	}
	return ret;
}

/* Move the extents of pieces [a, b) of @l after *hint; *hint gets where they end. */
static int move_range(struct butter_fs *fs, const struct piece_list *l, size_t a, size_t b,
		      u64 *hint, struct butter_defrag_stats *st)
{
	struct piece_list part = { l->p + a, b - a, b - a };
	struct ops_move_item *items = NULL;
	struct ops_move_stats mst;
	struct fs_write_state *w;
	size_t n;
	int ret = move_items(&part, &items, &n);

	if (ret)
		return ret;
	ret = fs_begin_change(fs, &w);
	if (ret) {
		free(items);
		return ret;
	}
	memset(&mst, 0, sizeof(mst));
	mst.hint = *hint;
	ret = ops_move_data_locked(fs, w, items, n, 0, &mst);
	free(items);
	if (ret == 0) {
		*hint = mst.hint;
		st->extents_moved += mst.extents;
		st->bytes_moved += mst.bytes;
	}
	/* the move aborts its own transaction on a failure in the trees */
	return fs_end_change(w, ret, 0);
}

int ops_defrag(struct butter_fs *fs, butter_ino_t ino, const struct butter_defrag_args *args,
	       struct butter_defrag_stats *st)
{
	struct butter_defrag_args none;
	struct butter_defrag_stats local;
	struct piece_list l = { 0 };
	struct btrfs_inode_item inode;
	struct fs_write_state *w;
	struct subvol *sv;
	u8 *rewrite = NULL;
	u64 runs, shortest, target, hint = 0;
	int ret, recompress, fragmented, old_type = 0, old_level = 0, old_force = 0;
	size_t i, j;

	if (!fs->w)
		return -EROFS;
	ret = data_flush_ino(fs, ino); /* buffered data first: it has no extents yet */
	if (ret)
		return ret;
	if (!args) {
		memset(&none, 0, sizeof(none));
		args = &none;
	}
	if (!st) {
		memset(&local, 0, sizeof(local));
		st = &local;
	}
	if (memchr(args->compress, 0, sizeof(args->compress)) == NULL)
		return -EINVAL;
	recompress = args->compress[0] != 0;
	target = args->target ? args->target : DEFRAG_DEFAULT_TARGET;
	ret = inode_read(fs, ino, &inode);
	if (ret)
		return ret;
	if (!S_ISREG(btrfs_inode_mode(&inode)))
		return S_ISDIR(btrfs_inode_mode(&inode)) ? -EISDIR : -EINVAL;
	sv = fs_subvol_cached(fs, ino.subvol, &ret);
	if (!sv)
		return ret;
	if (sv->flags & BTRFS_ROOT_SUBVOL_RDONLY)
		recompress = 0; /* a read-only snapshot's files are moved, never rewritten */
	ret = collect_pieces(fs, ino, args->start, args->len, &l);
	if (ret)
		goto out;
	measure(&l, &runs, &shortest, NULL);
	st->files++;
	st->runs_before += runs;
	/* nothing to gain: one run, long runs, or runs that moving cannot join */
	fragmented = runs > 1 && shortest < target && best_runs(&l) < runs;
	if (!recompress && !fragmented) {
		st->runs_after += runs;
		goto out;
	}
	/* which pieces are rewritten through the file, which moved for all their owners */
	rewrite = calloc(l.n ? l.n : 1, 1);
	if (!rewrite) {
		ret = -ENOMEM;
		goto out;
	}
	w = fs->w;
	for (i = 0; i < l.n; i++) {
		const struct piece *p = &l.p[i];

		if (p->prealloc || (btrfs_inode_flags(&inode) & BTRFS_INODE_NODATACOW_FLAG) ||
		    (sv->flags & BTRFS_ROOT_SUBVOL_RDONLY) ||
		    (p->disk_len != p->len && !recompress)) /* compressed: moved unless asked */
			continue;
		ret = exclusive(w, ino, sv, p);
		if (ret < 0)
			goto out;
		rewrite[i] = (u8)ret;
		ret = 0;
	}
	if (recompress) {
		old_type = w->compress_type;
		old_level = w->compress_level;
		old_force = w->compress_force;
		ret = fs_set_compression(fs, args->compress, 1);
		if (ret)
			goto out;
	}
	/* in file order: runs of pieces of one kind (rewritten ones also without a gap) */
	for (i = 0; i < l.n && ret == 0; i = j) {
		for (j = i + 1; j < l.n && rewrite[j] == rewrite[i] &&
				(!rewrite[i] || l.p[j].file_off == l.p[j - 1].file_off + l.p[j - 1].len);
		     j++)
			;
		if (rewrite[i]) {
			u64 a = l.p[i].file_off > args->start ? l.p[i].file_off : args->start;
			u64 b = l.p[j - 1].file_off + l.p[j - 1].len;

			if (args->len && b > args->start + args->len)
				b = args->start + args->len;
			ret = rewrite_range(fs, ino, a, b, &hint);
			if (ret == 0) {
				st->bytes_rewritten += b - a;
				for (size_t k = i; k < j; k++)
					st->extents_rewritten++;
			}
		} else if (fragmented) {
			ret = move_range(fs, &l, i, j, &hint, st);
		}
	}
	if (recompress) {
		w->compress_type = old_type;
		w->compress_level = old_level;
		w->compress_force = old_force;
	}
	if (ret)
		goto out;
	l.n = 0;
	ret = collect_pieces(fs, ino, args->start, args->len, &l);
	if (ret)
		goto out;
	measure(&l, &runs, NULL, NULL);
	st->files_moved++;
	st->runs_after += runs;
out:
	free(rewrite);
	free(l.p);
	return ret;
}

int ops_layout(struct butter_fs *fs, const struct butter_layout_range *ranges, size_t nranges,
	       unsigned flags, struct butter_layout_stats *st)
{
	struct piece_list l = { 0 };
	struct ops_move_item *items = NULL;
	struct ops_move_stats mst;
	struct fs_write_state *w;
	struct butter_layout_stats local;
	size_t i, n = 0;
	u64 files = 0, runs, seek, prev_end;
	int ret;

	if (!fs->w)
		return -EROFS;
	if (!st) {
		memset(&local, 0, sizeof(local));
		st = &local;
	}
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = data_flush_all_locked(fs); /* buffered data has no place yet: give it one first */
	if (ret)
		return fs_end_change(w, ret, 1);
	for (i = 0; i < nranges && ret == 0; i++) {
		const struct butter_layout_range *r = &ranges[i];
		struct btrfs_inode_item inode;

		if (i == 0 || r->ino.subvol != ranges[i - 1].ino.subvol ||
		    r->ino.ino != ranges[i - 1].ino.ino)
			files++;
		ret = inode_read(fs, r->ino, &inode);
		if (ret == -ENOENT) {
			/* gone since it was traced: nothing to place */
			st->missing++;
			ret = 0;
			continue;
		}
		if (ret == 0 && !S_ISREG(btrfs_inode_mode(&inode)))
			continue;
		if (ret == 0)
			ret = collect_pieces(fs, r->ino, r->off, r->len, &l);
	}
	if (ret)
		goto out;
	st->files += files;
	measure(&l, &runs, NULL, &seek);
	st->runs_before += runs;
	st->seek_before += seek;
	if (runs <= best_runs(&l) && (!(flags & BUTTER_LAYOUT_CONTINUE) || !st->hint ||
				      !l.n || l.p[0].logical == st->hint)) {
		/* laid out already (and, going on, right where the last piece ended) */
		st->runs_after += runs;
		st->seek_after += seek;
		if (l.n)
			st->hint = l.p[l.n - 1].logical + l.p[l.n - 1].disk_len;
		goto out;
	}
	ret = move_items(&l, &items, &n);
	if (ret)
		goto out;
	memset(&mst, 0, sizeof(mst));
	mst.hint = st->hint;
	ret = ops_move_data_locked(fs, w, items, n,
				   (flags & BUTTER_LAYOUT_CONTINUE) && st->hint ? 0 : OPS_MOVE_FRESH,
				   &mst);
	if (ret)
		goto out;
	prev_end = (flags & BUTTER_LAYOUT_CONTINUE) ? st->hint : 0;
	st->hint = mst.hint;
	st->extents_moved += mst.extents;
	st->bytes_moved += mst.bytes;
	l.n = 0;
	for (i = 0; i < nranges && ret == 0; i++) {
		ret = collect_pieces(fs, ranges[i].ino, ranges[i].off, ranges[i].len, &l);
		if (ret == -ENOENT)
			ret = 0;
	}
	if (ret == 0) {
		measure(&l, &runs, NULL, &seek);
		/* going on from the previous piece of the trace: its last run continues */
		if (runs && prev_end && l.p[0].logical == prev_end)
			runs--;
		st->runs_after += runs;
		st->seek_after += seek;
	}
out:
	free(items);
	free(l.p);
	return fs_end_change(w, ret, 0);
}
