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
 *   a write that would make a MAX_RANGES + 1st range (a random writer);
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
#include <sys/stat.h>
#include <time.h>

#include "data/data.h"

/* Bytes [start, start + len) of a file; cap: what data has room for. */
struct data_range {
	u64 start, len, cap;
	u8 *data;
};

/*
 * What one inode has buffered: ranges sorted by start, neither overlapping
 * nor touching (touching ones are merged), at most MAX_RANGES of them.
 */
struct data_buffer {
	struct data_buffer *next;    /* hash chain */
	u64 subvol, ino;
	u64 len;                     /* the bytes of all ranges */
	u64 seq;                     /* creation order: written back oldest first */
	struct data_range *ranges;
	size_t nranges;
};

struct data_buffers {
	struct data_buffer **buckets;
	size_t nbuckets, count;
	u64 next_seq;
	int flushing;                /* a write-back runs: flush_some() does nothing */
};

#define MIN_BUCKETS 256
#define MIN_CAP (64ULL << 10)
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

static void free_buffer(struct data_buffer *b)
{
	for (size_t i = 0; i < b->nranges; i++)
		free(b->ranges[i].data);
	free(b->ranges);
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

/*
 * Put @len bytes at @off into @b: the ranges overlapping or touching [off,
 * off + len) become one (the first of them grows, or a new one), the new
 * bytes over the old. *added: how many bytes @b holds more.
 */
static int buffer_put(struct data_buffer *b, const u8 *buf, u64 len, u64 off, u64 *added)
{
	u64 end = off + len, nstart = off, nend = end, cap;
	size_t first = 0, last, i;
	struct data_range *r;

	while (first < b->nranges && b->ranges[first].start + b->ranges[first].len < off)
		first++;
	last = first;
	while (last < b->nranges && b->ranges[last].start <= end)
		last++;
	/* ranges [first, last) merge with the new bytes */
	if (first < last) {
		if (b->ranges[first].start < nstart)
			nstart = b->ranges[first].start;
		r = &b->ranges[last - 1];
		if (r->start + r->len > nend)
			nend = r->start + r->len;
	} else {
		struct data_range *nr;

		if (b->nranges + 1 > MAX_RANGES)
			return -E2BIG;
		nr = realloc(b->ranges, (b->nranges + 1) * sizeof(*nr));
		if (!nr)
			return -ENOMEM;
		b->ranges = nr;
		memmove(&nr[first + 1], &nr[first], (b->nranges - first) * sizeof(*nr));
		memset(&nr[first], 0, sizeof(*nr));
		nr[first].start = off;
		b->nranges++;
		last = first + 1;
	}
	r = &b->ranges[first];
	cap = r->cap;
	if (r->start != nstart || cap < nend - nstart) {
		u8 *data;

		while (cap < nend - nstart)
			cap = cap ? cap * 2 : MIN_CAP;
		if (r->start != nstart) {
			/* the bytes start earlier now: a new copy, the old bytes after the head */
			data = malloc(cap);
			if (data && r->len)
				memcpy(data + (r->start - nstart), r->data, r->len);
			if (data)
				free(r->data);
		} else {
			data = realloc(r->data, cap);
		}
		if (!data) {
			if (r->len == 0) { /* the range just made: take it out again */
				memmove(r, r + 1, (b->nranges - first - 1) * sizeof(*r));
				b->nranges--;
			}
			return -ENOMEM;
		}
		r->data = data;
		r->cap = cap;
	}
	*added = 0;
	for (i = first + 1; i < last; i++) {
		struct data_range *o = &b->ranges[i];

		memcpy(r->data + (o->start - nstart), o->data, o->len);
		*added -= o->len; /* counted again below as part of the merged range */
		free(o->data);
	}
	*added -= r->len;
	r->start = nstart;
	r->len = nend - nstart;
	*added += r->len;
	memcpy(r->data + (off - nstart), buf, len);
	memmove(&b->ranges[first + 1], &b->ranges[last], (b->nranges - last) * sizeof(*r));
	b->nranges -= last - first - 1;
	b->len += *added;
	return 0;
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
	u64 done, piece;
	int ret, err = 0, changed = 0;

	ret = inode_read(fs, ino, &ii);
	if (ret == -ENOENT)
		return 0; /* the inode went: its bytes with it */
	if (ret)
		return ret;
	sv = fs_subvol_mut(fs, b->subvol, &err);
	if (!sv)
		return err;
	for (size_t i = 0; i < b->nranges; i++) {
		const struct data_range *r = &b->ranges[i];

		hint_after_extent(fs, sv, b->ino, r->start);
		for (done = 0; done < r->len; done += piece) {
			ssize_t n;

			piece = r->len - done;
			if (piece > MAX_EXTENT_SIZE)
				piece = MAX_EXTENT_SIZE;
			n = data_write_direct_locked(fs, ino, r->data + done, (size_t)piece,
						     r->start + done, &changed);
			if (n < 0)
				return (int)n;
		}
	}
	return inode_modify(fs, sv, b->ino, keep_times, &ii);
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
	free_buffer(b);
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
 * Under memory pressure: write back the head of each range of @b that holds
 * a whole extent or more (MAX_EXTENT_SIZE pieces), keeping the rest, so a
 * sequential writer's extents stay whole. *freed: the bytes written back.
 */
static int flush_pieces(struct butter_fs *fs, struct data_buffer *b, u64 *freed)
{
	struct fs_write_state *w = fs->w;
	butter_ino_t ino = { b->subvol, b->ino };
	struct btrfs_inode_item ii;
	struct subvol *sv;
	int ret, err = 0, changed = 0;

	*freed = 0;
	ret = inode_read(fs, ino, &ii);
	if (ret)
		return ret;
	sv = fs_subvol_mut(fs, b->subvol, &err);
	if (!sv)
		return err;
	w->buffers->flushing++;
	for (size_t i = 0; i < b->nranges && ret == 0; i++) {
		struct data_range *r = &b->ranges[i];
		u64 head = r->len / MAX_EXTENT_SIZE * MAX_EXTENT_SIZE, done;

		if (!head || head == r->len)
			continue; /* too short, or goes whole with the rest */
		hint_after_extent(fs, sv, b->ino, r->start);
		for (done = 0; done < head && ret == 0; done += MAX_EXTENT_SIZE) {
			ssize_t n = data_write_direct_locked(fs, ino, r->data + done,
							     (size_t)MAX_EXTENT_SIZE, r->start + done,
							     &changed);
			if (n < 0)
				ret = (int)n;
		}
		if (ret)
			break;
		memmove(r->data, r->data + head, r->len - head);
		r->start += head;
		r->len -= head;
		b->len -= head;
		w->delalloc_bytes -= head;
		*freed += head;
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
	return flush_some(fs, 0);
}

/* fs_write_state.flush_data: every buffer into the running transaction (butter_sync() and the like). */
static int flush_for_sync(void *arg)
{
	return flush_some(arg, 0);
}

void data_discard_ino(struct butter_fs *fs, u64 subvol, u64 ino)
{
	butter_ino_t key = { subvol, ino };
	struct data_buffer *b = find(fs, key);

	if (b) {
		unlink_buffer(fs->w, b);
		free_buffer(b);
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
			free_buffer(b);
		}
	}
	free(bs->buckets);
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

	if (!w || !w->delalloc_limit || len > w->delalloc_limit)
		return data_write(fs, ino, buf, len, off);
	if (len == 0)
		return 0;
	if (end < off || end > MAX_FILE_BYTES)
		return -EFBIG;
	ret = fs_begin_change_rsv(fs, &w, (off % ss + len + 2ULL * ss) / ss * ss, 0);
	if (ret)
		return ret;
	ret = inode_read(fs, ino, &ii);
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
	ret = buffer_put(b, buf, len, off, &added);
	if (ret == -E2BIG) {
		/* a random writer: what it has buffered goes now, this write starts anew */
		changed = 1;
		ret = flush_buffer(fs, b);
		b = NULL;
		if (ret == 0)
			goto again;
	}
	if (ret == 0)
		w->delalloc_bytes += added;
	else if (b && b->nranges == 0) {
		unlink_buffer(w, b);
		free_buffer(b);
	}
	if (ret == 0) {
		changed = 1;
		ret = inode_modify(fs, sv, ino.ino, stamp_write, NULL);
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

	for (size_t i = 0; b && i < b->nranges; i++) {
		const struct data_range *r = &b->ranges[i];
		u64 from = r->start > off ? r->start : off;
		u64 to = r->start + r->len < off + len ? r->start + r->len : off + len;

		if (from < to)
			memcpy(buf + (from - off), r->data + (from - r->start), to - from);
	}
}

/* The end of the last buffered byte of @b. */
static u64 buffer_end(const struct data_buffer *b)
{
	const struct data_range *r = &b->ranges[b->nranges - 1];

	return r->start + r->len;
}

u64 data_buffered_size(struct butter_fs *fs, butter_ino_t ino, u64 size)
{
	struct data_buffer *b = find(fs, ino);

	return b && buffer_end(b) > size ? buffer_end(b) : size;
}

int data_stat(struct butter_fs *fs, butter_ino_t ino, struct butter_stat *st)
{
	struct data_buffer *b;
	int ret = inode_stat(fs, ino, st);

	if (ret || !(b = find(fs, ino)))
		return ret;
	if (buffer_end(b) > st->size)
		st->size = buffer_end(b);
	st->blocks += (b->len + 511) / 512;
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
