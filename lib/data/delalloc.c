/*
 * delalloc.c — delayed allocation: file data written through butter_write()
 * waits in memory, one buffer per inode, and gets its extents when it is
 * written back, so that a file written in many requests (or two files
 * written at once) lands in extents as large as the data, and an fsync
 * writes only its own file's data.
 *
 * A buffer holds ranges of bytes of one inode (subvolume, inode number),
 * up to MAX_RANGES (requests served on several threads reach the lock out
 * of order: the gaps fill and the ranges merge); they override what the
 * trees hold there. Only the bytes are held: the inode item keeps its size
 * and extents until the buffer is written back, so every tree (and the tree
 * log) stays a state a crash may find. The write stamps mtime/ctime at once
 * (the write's time), and the write-back keeps them. Written back, each
 * range goes in pieces of up to MAX_EXTENT_SIZE, placed to continue the
 * file's extent before it on disk (hint_after_extent()).
 *
 * Readers see the buffer through data_read() (its bytes over the stored ones,
 * the size as if written) and data_stat() (size and blocks); both run under
 * the shared lock, buffers only change under the exclusive one.
 *
 * Written back (data_flush_*), in the order the buffers were made:
 *   butter_sync(), the final commit, the read-only switch: all of them
 *                            (fs_write_state.flush_data); other commits
 *                            (fsync's fallback, space, dirty trees) leave
 *                            buffers in memory, as the kernel's commits
 *                            leave delalloc: buffers are bytes only, no
 *                            transaction's state;
 *   fsync of an inode        that inode only (tlog_fsync_many);
 *   memory over the bound    the largest until half the bound is left,
 *                            whole MAX_EXTENT_SIZE pieces first;
 *   a write that would make a MAX_RANGES + 1st run (a random writer);
 *   any other change to the inode's data: data_write_locked(), truncate,
 *   fallocate, clone, seek, defragment; snapshots and subvolume deletion
 *   write back all.
 * An inode deleted (ns_delete_inode) drops its buffer unwritten.
 *
 * Space: every change reserves room for the buffered bytes too
 * (w->delalloc_bytes in reserve_space()), so a write the buffer accepted
 * finds its room when it is written back.
 *
 * Invariants: at most one buffer per inode, its ranges sorted, disjoint and
 * not touching; w->delalloc_bytes is the sum of the buffers' lens.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "data/data.h"

/*
 * File bytes [index * BLOCK + lo, index * BLOCK + hi) of one inode; data
 * holds block bytes [base, base + cap), base <= lo <= hi <= base + cap. A
 * full block (cap BLOCK, base 0) comes from an arena, a smaller one from
 * malloc, so a 4 KiB write anywhere in a block costs about 4 KiB.
 */
struct data_block {
	u64 index;
	u32 lo, hi, base, cap;
	u8 *data;
};

/*
 * What one inode has buffered: blocks sorted by index, each with one valid
 * stretch. A run is blocks that continue each other (the next index, this
 * one valid to its end and the next from its start): at most MAX_RANGES runs.
 * Blocks, not one growing buffer: bytes arriving out of order join a run
 * without moving what it holds.
 */
struct data_buffer {
	struct data_buffer *next;    /* hash chain */
	u64 subvol, ino;
	u64 len;                     /* the valid bytes of all blocks */
	u64 seq;                     /* creation order: written back oldest first */
	struct data_block *blocks;
	size_t nblocks, cap;
};

#define BLOCK (256u << 10)
#define ARENA_BLOCKS ((u32)(MAX_EXTENT_SIZE / BLOCK))
#define ARENA ((size_t)ARENA_BLOCKS * BLOCK)

/* ARENA bytes of full blocks; bit i of free: block i is free. */
struct data_arena {
	u8 *base;
	u64 free[ARENA_BLOCKS / 64];
	u32 nfree;
};

struct data_buffers {
	struct data_buffer **buckets;
	size_t nbuckets, count;
	u64 next_seq;
	int flushing;                /* a write-back runs: flush_some() does nothing */
	/*
	 * Where a run is put together for the write path (up to an extent),
	 * kept from one write-back to the next: fresh memory costs a page fault
	 * a page, which is dear on virtual machines.
	 */
	u8 *stage;
	u64 stage_cap;
	/*
	 * Full blocks come from arenas mapped as huge pages where the kernel
	 * gives them: a page fault per 4 KiB of buffered data would cost more
	 * than the write. An arena is one extent's worth, and a block goes to
	 * the slot of its index in the arena of its file window where that is
	 * free (block_get()), so a sequential writer's MAX_EXTENT_SIZE piece
	 * lies in one arena in file order and is written from where it is,
	 * without a copy (write_run()). The arenas go when no block is in use.
	 */
	struct data_arena *arenas;
	size_t narenas;
	size_t blocks_in_use;
};

#define MIN_BUCKETS 256
#define MIN_CAP 4096u
/*
 * Ranges an inode may have: requests served on several threads reach the
 * lock out of order, so a sequential writer leaves a few gaps that the next
 * requests fill; past this many (a random writer) the inode is written back.
 */
#define MAX_RANGES 64

static size_t bucket_of(const struct data_buffers *bs, u64 subvol, u64 ino)
{
	u64 h = (ino * 0x9E3779B97F4A7C15ULL) ^ (subvol * 0xC2B2AE3D27D4EB4FULL);

	return (size_t)(h >> 17) & (bs->nbuckets - 1);
}

static struct data_buffer *find(const struct butter_fs *fs, butter_ino_t ino)
{
	const struct data_buffers *bs = fs->w ? fs->w->buffers : NULL;
	struct data_buffer *b;

	if (!bs || !bs->count)
		return NULL;
	for (b = bs->buckets[bucket_of(bs, ino.subvol, ino.ino)]; b; b = b->next)
		if (b->ino == ino.ino && b->subvol == ino.subvol)
			return b;
	return NULL;
}

static void unlink_buffer(struct fs_write_state *w, struct data_buffer *b)
{
	struct data_buffers *bs = w->buffers;
	struct data_buffer **pp = &bs->buckets[bucket_of(bs, b->subvol, b->ino)];

	while (*pp != b)
		pp = &(*pp)->next;
	*pp = b->next;
	bs->count--;
	w->delalloc_bytes -= b->len;
}

#define STRETCH_MIN (8u << 20) /* contiguous block memory worth writing without a copy */
#define THROUGH_MIN (1u << 20) /* pieces written past the page cache (write_run) */
/*
 * A file holding this much is written back at once in whole extents
 * (flush_pieces), past the page cache: a sequential writer streams to the
 * disk in MAX_EXTENT_SIZE pieces instead of leaving it all to its fsync,
 * and other files' fsyncs find nothing of it to flush.
 */
#define EARLY_BYTES (2 * MAX_EXTENT_SIZE)

/* Take block @i of arena @a. */
static u8 *arena_take(struct data_buffers *bs, struct data_arena *a, u32 i)
{
	a->free[i / 64] &= ~(1ULL << (i % 64));
	a->nfree--;
	bs->blocks_in_use++;
	return a->base + (size_t)i * BLOCK;
}

/* The arena holding @p, or NULL. */
static struct data_arena *arena_of(struct data_buffers *bs, const u8 *p)
{
	for (size_t k = 0; k < bs->narenas; k++)
		if (p >= bs->arenas[k].base && p < bs->arenas[k].base + ARENA)
			return &bs->arenas[k];
	return NULL;
}

/*
 * The arena holding the blocks of @b's file window (MAX_EXTENT_SIZE, the
 * window of block @pos) in their slots, or NULL: any full block of the
 * window placed in its slot names it.
 */
static struct data_arena *window_arena(struct data_buffers *bs, const struct data_buffer *b,
				       size_t pos)
{
	u64 window = b->blocks[pos].index / ARENA_BLOCKS;

	for (int dir = -1; dir <= 1; dir += 2) {
		for (size_t k = pos + dir; k < b->nblocks; k += dir) {
			const struct data_block *x = &b->blocks[k];
			struct data_arena *a;

			if (x->index / ARENA_BLOCKS != window)
				break;
			if (x->cap != BLOCK || !(a = arena_of(bs, x->data)))
				continue;
			if ((size_t)(x->data - a->base) / BLOCK == x->index % ARENA_BLOCKS)
				return a;
		}
	}
	return NULL;
}

/*
 * A full block's memory (BLOCK bytes) for block @pos of @b, from the arenas.
 * Its place: the slot of its index (index % ARENA_BLOCKS), so each
 * MAX_EXTENT_SIZE window of the file can lie in one arena in file order,
 * whatever order its bytes arrive in: in the window's arena if that slot is
 * free, else in a wholly free arena, else in a new one while there are fewer
 * than @max_arenas. Else any free block, else a new arena.
 */
static u8 *block_get(struct data_buffers *bs, const struct data_buffer *b, size_t pos,
			size_t max_arenas)
{
	u32 slot = (u32)(b->blocks[pos].index % ARENA_BLOCKS);
	struct data_arena *a = window_arena(bs, b, pos), *na;

	if (a && (a->free[slot / 64] >> (slot % 64) & 1))
		return arena_take(bs, a, slot);
	for (size_t k = 0; k < bs->narenas; k++)
		if (bs->arenas[k].nfree == ARENA_BLOCKS)
			return arena_take(bs, &bs->arenas[k], slot);
	/*
	 * A new arena rather than free slots of other windows (whose own blocks
	 * may still come), while the arenas stay within what the bound needs.
	 */
	for (size_t k = 0; bs->narenas >= max_arenas && k < bs->narenas; k++) {
		a = &bs->arenas[k];
		for (u32 w = 0; a->nfree && w < ARENA_BLOCKS / 64; w++)
			if (a->free[w])
				return arena_take(bs, a, w * 64 + (u32)__builtin_ctzll(a->free[w]));
	}
	na = realloc(bs->arenas, (bs->narenas + 1) * sizeof(*na));
	if (!na)
		return NULL;
	bs->arenas = na;
	a = &na[bs->narenas];
	/*
	 * Not populated: huge pages (asked for before the first touch) fault
	 * in 2 MiB at a time, and a small writer touches only what it uses.
	 */
	a->base = mmap(NULL, ARENA, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a->base == MAP_FAILED)
		return NULL;
	madvise(a->base, ARENA, MADV_HUGEPAGE);
	memset(a->free, 0xff, sizeof(a->free));
	a->nfree = ARENA_BLOCKS;
	bs->narenas++;
	return arena_take(bs, a, slot);
}

/* Give back a block's memory: a full one to its arena, else to malloc. */
static void block_put(struct data_buffers *bs, struct data_block *blk)
{
	struct data_arena *a;
	u32 i;

	if (blk->cap != BLOCK) {
		free(blk->data);
		return;
	}
	a = arena_of(bs, blk->data);
	i = (u32)((size_t)(blk->data - a->base) / BLOCK);
	a->free[i / 64] |= 1ULL << (i % 64);
	a->nfree++;
	bs->blocks_in_use--;
}

/*
 * The arenas go when no block is in use, at a write-back of everything
 * (butter_sync(): about a second after writes stop, or at the commit
 * interval): between write-backs of a busy writer they are reused, since
 * mapping fresh memory costs more than writing it.
 */
static void release_arenas(struct data_buffers *bs)
{
	if (!bs || bs->blocks_in_use)
		return;
	for (size_t i = 0; i < bs->narenas; i++)
		munmap(bs->arenas[i].base, ARENA);
	free(bs->arenas);
	bs->arenas = NULL;
	bs->narenas = 0;
}

static void free_buffer(struct data_buffers *bs, struct data_buffer *b)
{
	for (size_t i = 0; i < b->nblocks; i++)
		block_put(bs, &b->blocks[i]);
	free(b->blocks);
	free(b);
}

static int grow_table(struct data_buffers *bs)
{
	size_t n = bs->nbuckets ? bs->nbuckets * 2 : MIN_BUCKETS, i;
	struct data_buffer **nb = calloc(n, sizeof(*nb));
	struct data_buffers tmp = *bs;

	if (!nb)
		return -ENOMEM;
	tmp.buckets = nb;
	tmp.nbuckets = n;
	for (i = 0; i < bs->nbuckets; i++) {
		struct data_buffer *b = bs->buckets[i], *next;

		for (; b; b = next) {
			size_t k = bucket_of(&tmp, b->subvol, b->ino);

			next = b->next;
			b->next = nb[k];
			nb[k] = b;
		}
	}
	free(bs->buckets);
	bs->buckets = nb;
	bs->nbuckets = n;
	return 0;
}

/* Does block @i + 1 of @b continue block @i (so one run holds both)? */
static int joins(const struct data_buffer *b, size_t i)
{
	const struct data_block *x = &b->blocks[i], *y = &b->blocks[i + 1];

	return y->index == x->index + 1 && x->hi == BLOCK && y->lo == 0;
}

/* The end of the run starting at block @i (the index past its last block). */
static size_t run_end(const struct data_buffer *b, size_t i)
{
	while (i + 1 < b->nblocks && joins(b, i))
		i++;
	return i + 1;
}

static size_t count_runs(const struct data_buffer *b)
{
	size_t n = 0;

	for (size_t i = 0; i < b->nblocks; i = run_end(b, i))
		n++;
	return n;
}

/* The first block of @b with index >= @index (nblocks if none). */
static size_t block_at(const struct data_buffer *b, u64 index)
{
	size_t lo = 0, hi = b->nblocks;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (b->blocks[mid].index < index)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/*
 * Put @len bytes at @off into @b; *added: how many bytes @b holds more (also
 * when it fails half way). -E2BIG when a block would hold two stretches or
 * @b more than MAX_RANGES runs (a random writer): the caller writes @b back
 * and puts again (what was put already is the same bytes).
 */
static int buffer_put(struct butter_fs *fs, struct data_buffer *b, const u8 *buf, u64 len,
		      u64 off, u64 *added)
{
	struct data_buffers *bs = fs->w->buffers;
	u64 end = off + len;

	*added = 0;
	for (u64 k = off / BLOCK; k * BLOCK < end; k++) {
		u32 a = (u32)((off > k * BLOCK ? off : k * BLOCK) - k * BLOCK);
		u32 z = (u32)((end < (k + 1) * BLOCK ? end : (k + 1) * BLOCK) - k * BLOCK);
		size_t pos = block_at(b, k);
		struct data_block *blk;
		u32 before;

		if (pos == b->nblocks || b->blocks[pos].index != k) {
			if (b->nblocks == b->cap) {
				size_t cap = b->cap ? b->cap * 2 : 8;
				struct data_block *nb = realloc(b->blocks, cap * sizeof(*nb));

				if (!nb)
					return -ENOMEM;
				b->blocks = nb;
				b->cap = cap;
			}
			memmove(&b->blocks[pos + 1], &b->blocks[pos],
				(b->nblocks - pos) * sizeof(*b->blocks));
			memset(&b->blocks[pos], 0, sizeof(*b->blocks));
			b->blocks[pos].index = k;
			b->blocks[pos].lo = a;
			b->blocks[pos].hi = a;
			b->nblocks++;
		}
		blk = &b->blocks[pos];
		/*
		 * Apart from what the block holds (a random writer, or requests
		 * out of order): written back first. Reading the stored bytes in
		 * between would turn holes into data.
		 */
		if (blk->hi > blk->lo && (a > blk->hi || z < blk->lo))
			return -E2BIG;
		if (!blk->data || a < blk->base || z > blk->base + blk->cap) {
			/* more room: what the block will hold, from a MIN_CAP boundary */
			u32 lo = blk->hi > blk->lo && blk->lo < a ? blk->lo : a;
			u32 hi = blk->hi > blk->lo && blk->hi > z ? blk->hi : z;
			u32 base = lo & ~(MIN_CAP - 1), cap = MIN_CAP;
			u8 *data;

			while (cap < hi - base)
				cap *= 2;
			if (cap >= BLOCK / 2) {
				base = 0;
				cap = BLOCK;
				data = block_get(bs, b, pos,
						 (size_t)(fs->w->delalloc_limit / ARENA) + 2);
			} else {
				data = malloc(cap);
			}
			if (!data)
				return -ENOMEM;
			if (blk->hi > blk->lo)
				memcpy(data + (blk->lo - base), blk->data + (blk->lo - blk->base),
				       blk->hi - blk->lo);
			free(blk->data); /* never a full block: that one has room for all */
			blk->data = data;
			blk->base = base;
			blk->cap = cap;
		}
		before = blk->hi - blk->lo;
		memcpy(blk->data + (a - blk->base), buf + (k * BLOCK + a - off), z - a);
		if (blk->hi == blk->lo) {
			blk->lo = a;
			blk->hi = z;
		} else {
			if (a < blk->lo)
				blk->lo = a;
			if (z > blk->hi)
				blk->hi = z;
		}
		*added += (blk->hi - blk->lo) - before;
		b->len += (blk->hi - blk->lo) - before;
	}
	return count_runs(b) > MAX_RANGES ? -E2BIG : 0;
}

static void hint_after_extent(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 off);

/* Copy @b's bytes [from, to) (inside run [i, j)) to @dst. */
static void gather(const struct data_buffer *b, size_t i, size_t j, u64 from, u64 to, u8 *dst)
{
	for (size_t p = i + (size_t)(from / BLOCK - b->blocks[i].index); p < j; p++) {
		const struct data_block *blk = &b->blocks[p];
		u64 s = blk->index * BLOCK + blk->lo, e = blk->index * BLOCK + blk->hi;

		if (s >= to)
			break;
		if (s < from)
			s = from;
		if (e > to)
			e = to;
		if (s < e)
			memcpy(dst + (s - from), blk->data + (s - blk->index * BLOCK - blk->base),
			       e - s);
	}
}

/*
 * Write bytes [from, to) of run [i, j) of @b into the trees, in pieces of up
 * to MAX_EXTENT_SIZE, placed after the file's extent before @from.
 */
static int write_run(struct butter_fs *fs, struct subvol *sv, const struct data_buffer *b,
		     size_t i, size_t j, u64 from, u64 to)
{
	struct data_buffers *bs = fs->w->buffers;
	butter_ino_t ino = { b->subvol, b->ino };
	u64 piece = to - from < MAX_EXTENT_SIZE ? to - from : MAX_EXTENT_SIZE;
	u8 *stage = bs->stage;
	int ret = 0, changed = 0;

	if (piece > bs->stage_cap) {
		free(bs->stage);
		if (posix_memalign((void **)&bs->stage, 4096, piece))
			bs->stage = NULL;
		stage = bs->stage;
		bs->stage_cap = stage ? piece : 0;
		if (!stage)
			return -ENOMEM;
	}
	hint_after_extent(fs, sv, b->ino, from);
	for (u64 at = from, len; at < to && ret == 0; at += len) {
		size_t p = i + (size_t)(at / BLOCK - b->blocks[i].index), q = p + 1;
		const u8 *src;
		ssize_t n;

		len = to - at < MAX_EXTENT_SIZE ? to - at : MAX_EXTENT_SIZE;
		/*
		 * Blocks a sequential writer filled lie one after another in an
		 * arena: a long stretch of them is written from where it is (no
		 * copy); the allocator puts the next stretch right after it.
		 */
		while (q < j && b->blocks[q - 1].cap == BLOCK && b->blocks[q].cap == BLOCK &&
		       b->blocks[q].data == b->blocks[q - 1].data + BLOCK &&
		       (b->blocks[q].index - b->blocks[p].index) * BLOCK < len)
			q++;
		if ((q - p) * BLOCK >= STRETCH_MIN && b->blocks[q - 1].index * BLOCK +
							   b->blocks[q - 1].hi > at) {
			u64 stretch_end = b->blocks[q - 1].index * BLOCK + b->blocks[q - 1].hi;

			if (stretch_end - at < len)
				len = stretch_end - at;
			src = b->blocks[p].data + (at - b->blocks[p].index * BLOCK - b->blocks[p].base);
		} else {
			gather(b, i, j, at, at + len, stage);
			src = stage;
		}
		/* big pieces past the page cache: a later flush (anyone's fsync) has them written */
		volumes_set_write_through(&fs->vol, len >= THROUGH_MIN);
		n = data_write_direct_locked(fs, ino, src, (size_t)len, at, &changed);
		volumes_set_write_through(&fs->vol, 0);
		if (n < 0)
			ret = (int)n;
	}
	return ret;
}

/*
 * Where data written at file offset @off of @ino would continue the file's
 * last extent before it on disk (its start plus the distance in the file,
 * so a gap the writer fills later keeps its room): the allocator's hint is
 * set there when the extent is a plain one no further than MAX_GAP back.
 */
#define MAX_GAP (16ULL << 20)

static void hint_after_extent(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 off)
{
	struct btrfs_key key = { ino, BTRFS_EXTENT_DATA_KEY, off ? off - 1 : 0 };
	struct tree_path path;
	u32 size;

	if (!off)
		return;
	tree_path_init(&path);
	if (tree_search_backward(&fs->cache, &sv->root, &key, &path) == 0) {
		const struct btrfs_file_extent_item *fi = (const void *)path_item(&path, &size);

		path_key(&path, &key);
		if (key.objectid == ino && key.type == BTRFS_EXTENT_DATA_KEY &&
		    size >= sizeof(*fi) && fi->type == BTRFS_FILE_EXTENT_REG &&
		    fi->compression == BTRFS_COMPRESS_NONE &&
		    btrfs_file_extent_disk_bytenr(fi) != 0 &&
		    key.offset + btrfs_file_extent_num_bytes(fi) + MAX_GAP >= off) {
			u64 at = btrfs_file_extent_disk_bytenr(fi) + btrfs_file_extent_offset(fi) +
				 (off - key.offset);
			u32 ss = fs->vol.sectorsize;

			fs->w->es.hint_data = at / ss * ss;
		}
	}
	tree_path_release(&fs->cache, &path);
}

/*
 * Write @b's bytes into the trees (inside a running change; @b is no longer
 * in the table). The inode's mtime/ctime stay what the writes made them.
 */
static void keep_times(struct btrfs_inode_item *ii, void *arg)
{
	const struct btrfs_inode_item *saved = arg;

	ii->mtime = saved->mtime;
	ii->ctime = saved->ctime;
}

static int write_back(struct butter_fs *fs, struct data_buffer *b)
{
	butter_ino_t ino = { b->subvol, b->ino };
	struct btrfs_inode_item ii;
	struct subvol *sv;
	int ret, err = 0;

	ret = inode_read(fs, ino, &ii);
	if (ret == -ENOENT)
		return 0; /* the inode went: its bytes with it */
	if (ret)
		return ret;
	sv = fs_subvol_mut(fs, b->subvol, &err);
	if (!sv)
		return err;
	for (size_t i = 0, j; i < b->nblocks && ret == 0; i = j) {
		j = run_end(b, i);
		ret = write_run(fs, sv, b, i, j, b->blocks[i].index * BLOCK + b->blocks[i].lo,
				b->blocks[j - 1].index * BLOCK + b->blocks[j - 1].hi);
	}
	return ret ? ret : inode_modify(fs, sv, b->ino, keep_times, &ii);
}

/* Write back and free @b (taken out of the table first). */
static int flush_buffer(struct butter_fs *fs, struct data_buffer *b)
{
	struct fs_write_state *w = fs->w;
	int ret;

	unlink_buffer(w, b);
	w->buffers->flushing++;
	ret = write_back(fs, b);
	w->buffers->flushing--;
	free_buffer(w->buffers, b);
	return ret;
}

int data_flush_ino_locked(struct butter_fs *fs, butter_ino_t ino)
{
	struct data_buffer *b = find(fs, ino);

	return b ? flush_buffer(fs, b) : 0;
}

int data_flush_ino(struct butter_fs *fs, butter_ino_t ino)
{
	struct fs_write_state *w;
	int ret;

	if (!find(fs, ino))
		return 0;
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = data_flush_ino_locked(fs, ino);
	return fs_end_change(w, ret, 1);
}

/*
 * Under memory pressure: write back the head of each run of @b that holds
 * a whole extent or more (MAX_EXTENT_SIZE pieces), keeping the rest, so a
 * sequential writer's extents stay whole. *freed: the bytes written back.
 */
static int flush_pieces(struct butter_fs *fs, struct data_buffer *b, u64 *freed)
{
	struct fs_write_state *w = fs->w;
	butter_ino_t ino = { b->subvol, b->ino };
	struct btrfs_inode_item ii;
	struct subvol *sv;
	int ret, err = 0;

	*freed = 0;
	ret = inode_read(fs, ino, &ii);
	if (ret)
		return ret;
	sv = fs_subvol_mut(fs, b->subvol, &err);
	if (!sv)
		return err;
	w->buffers->flushing++;
	for (size_t i = 0, j; i < b->nblocks && ret == 0; i = j) {
		u64 from = b->blocks[i].index * BLOCK + b->blocks[i].lo, to, head;
		size_t k, keep;

		j = run_end(b, i);
		to = b->blocks[j - 1].index * BLOCK + b->blocks[j - 1].hi;
		head = (to - from) / MAX_EXTENT_SIZE * MAX_EXTENT_SIZE;
		if (!head || head == to - from)
			continue; /* too short, or goes whole with the rest */
		ret = write_run(fs, sv, b, i, j, from, from + head);
		if (ret)
			break;
		/* drop what went: whole blocks, and the written head of the block it ends in */
		for (k = i; k < j && b->blocks[k].index * BLOCK + b->blocks[k].hi <= from + head; k++)
			block_put(w->buffers, &b->blocks[k]);
		if (k < j && b->blocks[k].index * BLOCK + b->blocks[k].lo < from + head)
			b->blocks[k].lo = (u32)(from + head - b->blocks[k].index * BLOCK);
		keep = b->nblocks - k;
		memmove(&b->blocks[i], &b->blocks[k], keep * sizeof(*b->blocks));
		b->nblocks = i + keep;
		b->len -= head;
		w->delalloc_bytes -= head;
		*freed += head;
		j = run_end(b, i); /* the run's rest, shorter than an extent now: stays */
	}
	w->buffers->flushing--;
	if (ret == 0 && *freed)
		ret = inode_modify(fs, sv, b->ino, keep_times, &ii);
	return ret;
}

static int by_seq(const void *a, const void *b)
{
	const struct data_buffer *x = *(struct data_buffer *const *)a;
	const struct data_buffer *y = *(struct data_buffer *const *)b;

	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/*
 * Write back buffers, oldest first: all of them (@keep_bytes 0), or the
 * largest ones until at most @keep_bytes stay buffered.
 */
static int flush_some(struct butter_fs *fs, u64 keep_bytes)
{
	struct fs_write_state *w = fs->w;
	struct data_buffers *bs = w->buffers;
	struct data_buffer **all;
	size_t n = 0, i;
	int ret = 0;

	if (!bs || !bs->count || bs->flushing)
		return 0;
	all = malloc(bs->count * sizeof(*all));
	if (!all)
		return -ENOMEM;
	for (i = 0; i < bs->nbuckets; i++)
		for (struct data_buffer *b = bs->buckets[i]; b; b = b->next)
			all[n++] = b;
	qsort(all, n, sizeof(*all), by_seq);
	if (keep_bytes) {
		/*
		 * Largest first, so the fewest writers lose their buffer: whole
		 * extents of it first, then (if that freed nothing) all of it.
		 */
		while (ret == 0 && w->delalloc_bytes > keep_bytes) {
			size_t big = n;
			u64 freed = 0;

			for (i = 0; i < n; i++)
				if (all[i] && (big == n || all[i]->len > all[big]->len))
					big = i;
			if (big == n)
				break;
			ret = flush_pieces(fs, all[big], &freed);
			if (ret == 0 && !freed) {
				ret = flush_buffer(fs, all[big]);
				all[big] = NULL;
			}
		}
	} else {
		for (i = 0; i < n && ret == 0; i++)
			ret = flush_buffer(fs, all[i]);
	}
	free(all);
	return ret;
}

int data_flush_all_locked(struct butter_fs *fs)
{
	int ret = flush_some(fs, 0);

	release_arenas(fs->w->buffers);
	return ret;
}

/* fs_write_state.flush_data: every buffer into the running transaction (butter_sync() and the like). */
static int flush_for_sync(void *arg)
{
	return data_flush_all_locked(arg);
}

void data_discard_ino(struct butter_fs *fs, u64 subvol, u64 ino)
{
	butter_ino_t key = { subvol, ino };
	struct data_buffer *b = find(fs, key);

	if (b) {
		unlink_buffer(fs->w, b);
		free_buffer(fs->w->buffers, b);
	}
}

void data_buffers_destroy(struct fs_write_state *w)
{
	struct data_buffers *bs = w->buffers;

	if (!bs)
		return;
	for (size_t i = 0; i < bs->nbuckets; i++) {
		struct data_buffer *b = bs->buckets[i], *next;

		for (; b; b = next) {
			next = b->next;
			free_buffer(w->buffers, b);
		}
	}
	for (size_t i = 0; i < bs->narenas; i++)
		munmap(bs->arenas[i].base, ARENA);
	free(bs->arenas);
	free(bs->buckets);
	free(bs->stage);
	free(bs);
	w->buffers = NULL;
	w->delalloc_bytes = 0;
	w->flush_data = NULL;
	w->flush_data_arg = NULL;
}

int data_set_write_buffer(struct butter_fs *fs, uint64_t max_bytes)
{
	struct fs_write_state *w;
	int ret;

	if (!fs->w)
		return max_bytes ? -EROFS : 0;
	w = fs->w;
	pthread_mutex_lock(&w->lock);
	w->delalloc_limit = max_bytes;
	pthread_mutex_unlock(&w->lock);
	if (max_bytes)
		return 0;
	ret = data_flush_all(fs);
	return ret;
}

int data_buffered(struct butter_fs *fs, butter_ino_t ino)
{
	return find(fs, ino) != NULL;
}

static void stamp_write(struct btrfs_inode_item *ii, void *arg)
{
	(void)arg;
	fs_now_ts(&ii->mtime);
	ii->ctime = ii->mtime;
}

ssize_t data_write_buffered(struct butter_fs *fs, butter_ino_t ino, const void *buf, size_t len,
			    uint64_t off)
{
	u32 ss = fs->vol.sectorsize;
	struct fs_write_state *w = fs->w;
	struct data_buffers *bs;
	struct data_buffer *b;
	struct btrfs_inode_item ii;
	struct subvol *sv = NULL;
	u64 end = off + len, added = 0;
	int ret, err = 0, changed = 0;

	if (len == 0)
		return 0;
	/* chattr +i: no data written (checked here, at the call; write-back is never refused) */
	if (!w || !w->delalloc_limit || len > w->delalloc_limit) {
		ret = inode_read(fs, ino, &ii);
		if (ret == 0)
			ret = inode_may_change(&ii, BTRFS_INODE_IMMUTABLE_FLAG);
		return ret ? ret : data_write(fs, ino, buf, len, off);
	}
	if (end < off || end > MAX_FILE_BYTES)
		return -EFBIG;
	ret = fs_begin_change_rsv(fs, &w, (off % ss + len + 2ULL * ss) / ss * ss, 0);
	if (ret)
		return ret;
	ret = inode_read(fs, ino, &ii);
	if (ret == 0)
		ret = inode_may_change(&ii, BTRFS_INODE_IMMUTABLE_FLAG);
	if (ret == 0 && !S_ISREG(btrfs_inode_mode(&ii)))
		ret = S_ISDIR(btrfs_inode_mode(&ii)) ? -EISDIR : -EINVAL;
	if (ret == 0 && !(sv = fs_subvol_mut(fs, ino.subvol, &err)))
		ret = err;
	if (ret == 0 && !w->buffers) {
		w->buffers = calloc(1, sizeof(*w->buffers));
		if (!w->buffers)
			ret = -ENOMEM;
		else if ((ret = grow_table(w->buffers)) != 0) {
			free(w->buffers);
			w->buffers = NULL;
		} else {
			w->flush_data = flush_for_sync;
			w->flush_data_arg = fs;
		}
	}
	if (ret)
		return fs_end_change(w, ret, 0);
again:
	bs = w->buffers;
	b = find(fs, ino);
	if (!b) {
		if (bs->count >= bs->nbuckets * 2 && (ret = grow_table(bs)) != 0)
			return fs_end_change(w, ret, 0);
		b = calloc(1, sizeof(*b));
		if (!b)
			return fs_end_change(w, -ENOMEM, 0);
		b->subvol = ino.subvol;
		b->ino = ino.ino;
		b->seq = bs->next_seq++;
		{
			size_t k = bucket_of(bs, ino.subvol, ino.ino);

			b->next = bs->buckets[k];
			bs->buckets[k] = b;
			bs->count++;
		}
	}
	ret = buffer_put(fs, b, buf, len, off, &added);
	w->delalloc_bytes += added; /* what went in, also when the put stopped half way */
	if (ret == -E2BIG) {
		/* a random writer: what it has buffered goes now, this write starts anew */
		changed = 1;
		ret = flush_buffer(fs, b);
		b = NULL;
		if (ret == 0)
			goto again;
	}
	if (ret && b && b->nblocks == 0) {
		unlink_buffer(w, b);
		free_buffer(w->buffers, b);
	}
	if (ret == 0) {
		changed = 1;
		ret = inode_modify(fs, sv, ino.ino, stamp_write, NULL);
	}
	if (ret == 0 && b && b->len >= EARLY_BYTES) {
		u64 freed;

		ret = flush_pieces(fs, b, &freed);
	}
	if (ret == 0 && w->delalloc_bytes > w->delalloc_limit)
		ret = flush_some(fs, w->delalloc_limit / 2);
	ret = fs_end_change(w, ret, changed);
	return ret < 0 ? ret : (ssize_t)len;
}

/*
 * The buffered part of a read (data_read): @size is the stored size; *end
 * becomes the size the reader sees, and the buffered bytes in [off, off +
 * len) are copied over @buf (which holds the stored bytes up to @size and
 * must be zeroed past it by the caller).
 */
void data_buffer_overlay(struct butter_fs *fs, butter_ino_t ino, u8 *buf, u64 len, u64 off)
{
	struct data_buffer *b = find(fs, ino);

	for (size_t i = b ? block_at(b, off / BLOCK) : 0; b && i < b->nblocks; i++) {
		const struct data_block *blk = &b->blocks[i];
		u64 s = blk->index * BLOCK + blk->lo, e = blk->index * BLOCK + blk->hi;

		if (s >= off + len)
			break;
		if (s < off)
			s = off;
		if (e > off + len)
			e = off + len;
		if (s < e)
			memcpy(buf + (s - off), blk->data + (s - blk->index * BLOCK - blk->base), e - s);
	}
}

/* The end of the last buffered byte of @b. */
static u64 buffer_end(const struct data_buffer *b)
{
	const struct data_block *blk = &b->blocks[b->nblocks - 1];

	return blk->index * BLOCK + blk->hi;
}

u64 data_buffered_size(struct butter_fs *fs, butter_ino_t ino, u64 size)
{
	struct data_buffer *b = find(fs, ino);

	return b && buffer_end(b) > size ? buffer_end(b) : size;
}

/*
 * The bytes of stored data (regular and preallocated extents, inline data)
 * of @ino in [from, to), which a write-back of that range replaces. *regular:
 * whether an extent that is not inline meets [from, to).
 */
static int stored_in(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 from, u64 to,
		     u64 *bytes, int *regular)
{
	struct btrfs_key key = { ino, BTRFS_EXTENT_DATA_KEY, from };
	struct tree_path path;
	int ret;

	*bytes = 0;
	*regular = 0;
	tree_path_init(&path);
	/* from the extent holding @from (or the first after it), not the file's first */
	ret = tree_search_backward(&fs->cache, &sv->root, &key, &path);
	if (ret == 0) {
		path_key(&path, &key);
		if (key.objectid != ino || key.type != BTRFS_EXTENT_DATA_KEY)
			ret = tree_next_item(&fs->cache, &path);
	} else if (ret == 1) {
		ret = tree_search_forward(&fs->cache, &sv->root, &key, &path);
	}
	while (ret == 0) {
		const struct btrfs_file_extent_item *fi;
		u64 s, e, len;
		u32 size;

		path_key(&path, &key);
		if (key.objectid != ino || key.type != BTRFS_EXTENT_DATA_KEY || key.offset >= to)
			break;
		fi = (const void *)path_item(&path, &size);
		if (size < BTRFS_FILE_EXTENT_INLINE_DATA_START) {
			ret = -EUCLEAN;
			break;
		}
		if (fi->type == BTRFS_FILE_EXTENT_INLINE) {
			len = btrfs_file_extent_ram_bytes(fi);
			if (from == 0)
				*bytes += len;
		} else if (size >= sizeof(*fi)) {
			*regular = 1;
			len = btrfs_file_extent_num_bytes(fi);
			s = key.offset > from ? key.offset : from;
			e = key.offset + len < to ? key.offset + len : to;
			if (s < e && (btrfs_file_extent_disk_bytenr(fi) ||
				      fi->type == BTRFS_FILE_EXTENT_PREALLOC))
				*bytes += e - s;
		}
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	return ret < 0 ? ret : 0;
}

/*
 * butter_stat() of a file with buffered data: the size and blocks its
 * write-back will leave (as the kernel's stat counts delalloc), so they do
 * not change when it happens: each run replaces the stored data of its
 * sectors with its sectors, and a small file written from its start stays
 * inline (data_write_direct_locked()'s rule).
 */
int data_stat(struct butter_fs *fs, butter_ino_t ino, struct butter_stat *st)
{
	int ret = inode_stat(fs, ino, st);

	return ret ? ret : data_stat_buffered(fs, ino, st);
}

int data_stat_buffered(struct butter_fs *fs, butter_ino_t ino, struct butter_stat *st)
{
	u32 ss = fs->vol.sectorsize;
	struct data_buffer *b;
	struct subvol *sv;
	u64 nbytes, size, stored_size;
	int ret, err = 0, regular = 0;

	if (!(b = find(fs, ino)))
		return 0;
	stored_size = st->size;
	size = buffer_end(b) > st->size ? buffer_end(b) : st->size;
	sv = fs_subvol_cached(fs, ino.subvol, &err);
	if (!sv)
		return err;
	/* blocks back to bytes: exact for what the write-back adds and takes away */
	nbytes = st->blocks * 512;
	if (b->blocks[0].index == 0 && b->blocks[0].lo == 0 && run_end(b, 0) == b->nblocks &&
	    size <= fs->w->max_inline && size >= stored_size) {
		/*
		 * Nothing stored yet (no bytes, no size: no extent item at all,
		 * a preallocation past the end would count in the bytes): the
		 * write-back leaves it inline. Else ask the extents.
		 */
		ret = stored_size == 0 && nbytes == 0 ? 0
			: stored_in(fs, sv, ino.ino, 0, (u64)-1, &nbytes, &regular);
		if (ret)
			return ret;
		if (!regular)
			nbytes = size; /* written back inline, whole */
		else
			nbytes = st->blocks * 512 - nbytes + ss;
	} else {
		for (size_t i = 0, j; i < b->nblocks; i = j) {
			u64 from, to, old;

			j = run_end(b, i);
			from = (b->blocks[i].index * BLOCK + b->blocks[i].lo) / ss * ss;
			to = (b->blocks[j - 1].index * BLOCK + b->blocks[j - 1].hi + ss - 1) / ss * ss;
			ret = stored_in(fs, sv, ino.ino, from, to, &old, &regular);
			if (ret)
				return ret;
			nbytes = nbytes + (to - from) - (old < nbytes + (to - from) ? old : 0);
		}
	}
	st->size = size;
	st->blocks = (nbytes + ss - 1) / ss * (ss / 512);
	return 0;
}

int data_flush_all(struct butter_fs *fs)
{
	struct fs_write_state *w = fs->w;
	int ret;

	if (!w || !w->buffers || !w->buffers->count)
		return 0;
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = data_flush_all_locked(fs);
	return fs_end_change(w, ret, 1);
}

int data_seek_written(struct butter_fs *fs, butter_ino_t ino, uint64_t off, int whence,
		      uint64_t *result)
{
	int ret = data_flush_ino(fs, ino);

	return ret ? ret : data_seek(fs, ino, off, whence, result);
}
