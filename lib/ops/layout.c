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

int ops_defrag(struct butter_fs *fs, butter_ino_t ino, const struct butter_defrag_args *args,
	       struct butter_defrag_stats *st)
{
	struct butter_defrag_args none;
	struct piece_list l = { 0 };
	struct ops_move_item *items = NULL;
	struct ops_move_stats mst;
	struct btrfs_inode_item inode;
	struct fs_write_state *w;
	u64 runs, shortest, target;
	size_t n = 0;
	int ret;

	if (!fs->w)
		return -EROFS;
	if (!args) {
		memset(&none, 0, sizeof(none));
		args = &none;
	}
	target = args->target ? args->target : DEFRAG_DEFAULT_TARGET;
	ret = inode_read(fs, ino, &inode);
	if (ret)
		return ret;
	if (!S_ISREG(btrfs_inode_mode(&inode)))
		return S_ISDIR(btrfs_inode_mode(&inode)) ? -EISDIR : -EINVAL;
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = collect_pieces(fs, ino, args->start, args->len, &l);
	if (ret)
		goto out;
	measure(&l, &runs, &shortest, NULL);
	if (st) {
		st->files++;
		st->runs_before += runs;
	}
	/* nothing to gain: one run, long runs, or runs that moving whole extents keeps */
	if (runs <= 1 || shortest >= target || best_runs(&l) >= runs) {
		if (st)
			st->runs_after += runs;
		goto out;
	}
	ret = move_items(&l, &items, &n);
	if (ret)
		goto out;
	memset(&mst, 0, sizeof(mst));
	ret = ops_move_data_locked(fs, w, items, n, 0, &mst);
	if (ret)
		goto out;
	l.n = 0;
	ret = collect_pieces(fs, ino, args->start, args->len, &l);
	if (ret)
		goto out;
	measure(&l, &runs, NULL, NULL);
	if (st) {
		st->files_moved++;
		st->extents_moved += mst.extents;
		st->bytes_moved += mst.bytes;
		st->runs_after += runs;
	}
out:
	free(items);
	free(l.p);
	/* the move aborts its own transaction on a failure in the trees */
	return fs_end_change(w, ret, 0);
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
	u64 files = 0, runs, seek;
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
		st->runs_after += runs;
		st->seek_after += seek;
	}
out:
	free(items);
	free(l.p);
	return fs_end_change(w, ret, 0);
}
