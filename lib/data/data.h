/*
 * data.h — the data layer: what a regular file holds. Reading (read.c: the
 * extent map, checksums, decompression, holes, SEEK_DATA/HOLE), writing and
 * truncating (write.c), fallocate (fallocate.c), reflinks (clone.c) and the
 * compressed encodings (compression.c). Not a public header.
 */
#ifndef BUTTER_DATA_DATA_H
#define BUTTER_DATA_DATA_H

#include "data/compression.h"
#include "inode/inode.h"

#define COMPRESSED_EXTENT_MAX (128ULL << 10) /* ram bytes of one compressed extent */

/* ---- read.c ---- */

/*
 * Whose data a read is, for its error messages: file byte @file_offset of
 * inode @ino in @subvol is the byte at the read's @logical (for a compressed
 * extent, @file_offset is where the extent's data starts in the file and
 * @compressed is set: its sectors have no file offset of their own).
 */
struct data_owner {
	u64 subvol, ino;
	u64 file_offset;
	int compressed;
};

/*
 * Read @len bytes of data at @logical (both sector-aligned) into @buf,
 * verifying each sector against the csum tree unless @nodatasum; bad or
 * unreadable sectors are retried on every other copy. -EIO if some sector
 * has no good copy. Each bad copy is logged once, naming its device and
 * physical place and (@who not NULL) the file, and counted in the device's
 * statistics (corruption or read errors).
 */
int data_read_logical(struct butter_fs *fs, u64 logical, u64 len, u8 *buf, int nodatasum,
		      const struct data_owner *who);

/*
 * The data checksums of the @nsectors sectors from @logical, as the csum tree
 * holds them: csum_size bytes per sector into @csums, and have[i] set for
 * each sector that has one (prealloc and nodatasum data have none).
 */
int data_lookup_csums(struct butter_fs *fs, u64 logical, u32 nsectors, u8 *csums, u8 *have);

/*
 * Read the stored bytes of [logical, logical + len) (sector-aligned) for a
 * copy of them elsewhere (relocation, replace): sectors with a checksum are
 * verified, and read from another copy when bad; sectors without one
 * (prealloc, nodatasum) are read as they are. Their checksums go to @csums
 * and @have (one entry per sector, as data_lookup_csums()) for the copy's.
 */
int data_read_stored(struct butter_fs *fs, u64 logical, u64 len, u8 *buf, u8 *csums, u8 *have);

/* ---- write.c ---- */

/* Remove file data in [start, end) of @ino, dropping extent references. */
int data_drop_extents(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 start, u64 end);
/* Shrink @ino to @size bytes (phase 2). */
int data_truncate(struct butter_fs *fs, struct subvol *sv, butter_ino_t ino, u64 size);
/* Give @ino an inline extent of @len bytes at file offset 0 (phase 2). */
int data_insert_inline(struct butter_fs *fs, struct subvol *sv, u64 ino, const void *data, u32 len);
/* Allocate a data extent of up to @want bytes (at least a sector); *got is its size. */
int data_alloc(struct butter_fs *fs, u64 want, u64 *logical, u64 *got);
/* Queue a change of @delta to the EXTENT_DATA_REF (root, ino, offset) of an extent. */
int data_queue_data_ref(struct fs_write_state *w, u64 bytenr, u64 num_bytes, u64 root, u64 ino,
			u64 offset, int delta);
/*
 * Write @len bytes at @off into the regular file @ino inside a running change
 * (what butter_write() does between begin and end). Returns @len or a
 * negative errno; *changed says whether trees were touched (a failure then
 * must abort the transaction).
 */
ssize_t data_write_locked(struct butter_fs *fs, butter_ino_t ino, const void *buf, size_t len,
			  u64 off, int *changed);
/* data_write_locked() past delayed allocation: what @ino has buffered stays buffered. */
ssize_t data_write_direct_locked(struct butter_fs *fs, butter_ino_t ino, const void *buf,
				 size_t len, u64 off, int *changed);

/* ---- delalloc.c: delayed allocation (see its first comment) ---- */
/* butter_write(): buffer the bytes (or write them at once when buffering is off). */
ssize_t data_write_buffered(struct butter_fs *fs, butter_ino_t ino, const void *buf, size_t len,
			    uint64_t off);
/* Whether @ino has buffered data (any lock mode). */
int data_buffered(struct butter_fs *fs, butter_ino_t ino);
/* Write back what @ino has buffered: inside a running change, or as a change of its own. */
int data_flush_ino_locked(struct butter_fs *fs, butter_ino_t ino);
int data_flush_ino(struct butter_fs *fs, butter_ino_t ino);
/* Write back every buffer: inside a running change, or as a change of its own. */
int data_flush_all_locked(struct butter_fs *fs);
int data_flush_all(struct butter_fs *fs);
/* Forget what @ino has buffered (the inode is deleted). */
void data_discard_ino(struct butter_fs *fs, u64 subvol, u64 ino);
/* Free every buffer unwritten (teardown of the write state). */
void data_buffers_destroy(struct fs_write_state *w);
/* For data_read(): the size with buffered bytes, and the buffered bytes over @buf. */
u64 data_buffered_size(struct butter_fs *fs, butter_ino_t ino, u64 size);
void data_buffer_overlay(struct butter_fs *fs, butter_ino_t ino, u8 *buf, u64 len, u64 off);
/* The bodies of butter_set_write_buffer(), butter_stat() and butter_seek() on buffered data. */
int data_set_write_buffer(struct butter_fs *fs, uint64_t max_bytes);
int data_stat(struct butter_fs *fs, butter_ino_t ino, struct butter_stat *st);
/* The part of data_stat() after the inode item: @st's size and blocks with @ino's buffered data. */
int data_stat_buffered(struct butter_fs *fs, butter_ino_t ino, struct butter_stat *st);
int data_seek_written(struct butter_fs *fs, butter_ino_t ino, uint64_t off, int whence,
		      uint64_t *result);

/* ---- fallocate.c ---- */
/*
 * On filesystems without the NO_HOLES feature, give every gap between the
 * EXTENT_DATA items of @ino inside [start, end) (sector-aligned) an explicit
 * hole item; with NO_HOLES, nothing.
 */
int data_fill_holes(struct butter_fs *fs, struct subvol *sv, u64 ino, u64 start, u64 end);

/*
 * The bodies of the public calls of this layer: butter_clone_range(), butter_fallocate(), butter_read() and the rest below.
 * lib/api/api.c takes the handle's lock and calls them; butter.h has the
 * contract of each. Library code calls these, never butter_*() (the lock
 * is not taken twice).
 */
int data_clone_range(struct butter_fs *fs, butter_ino_t src, uint64_t src_off, butter_ino_t dst,
	uint64_t dst_off, uint64_t len);
int data_fallocate(struct butter_fs *fs, butter_ino_t ino, int mode, uint64_t off, uint64_t len);
ssize_t data_read(struct butter_fs *fs, butter_ino_t ino, void *buf, size_t len, uint64_t off);
ssize_t data_readlink(struct butter_fs *fs, butter_ino_t ino, char *buf, size_t size);
int data_seek(struct butter_fs *fs, butter_ino_t ino, uint64_t off, int whence, uint64_t *result);
ssize_t data_write(struct butter_fs *fs, butter_ino_t ino, const void *buf, size_t len,
	uint64_t off);

#endif
