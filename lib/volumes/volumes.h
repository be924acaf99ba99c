/*
 * volumes.h — the device set of one filesystem, its superblock, and the chunk
 * map that turns logical addresses into (device, physical offset) per profile.
 *
 * Invariants:
 *  1. vol->devs is sorted by devid; a device whose bdev is NULL is missing.
 *  2. vol->chunks is sorted by logical start and the chunks do not overlap;
 *     every chunk has 1 <= num_stripes and a stripe_len that is a power of two
 *     and a multiple of the sector size (checked when the chunk is added).
 *  3. A mirror number is 1-based: mirror 1 is the preferred copy; for RAID5/6
 *     mirrors beyond the stripe count of copies are reconstructions from
 *     parity (see volumes_num_copies()).
 */
#ifndef BUTTER_VOLUMES_VOLUMES_H
#define BUTTER_VOLUMES_VOLUMES_H

#include <pthread.h>

#include "device/device.h"
#include "format/ondisk.h"
#include "log.h"

struct btrfs_device {
	u64 devid;
	u8 uuid[BTRFS_UUID_SIZE];
	u64 total_bytes;
	u64 bytes_used;
	u64 generation;         /* superblock generation read from this device */
	struct blockdev *bdev;  /* NULL: missing */
	char *path;
	int write_through;      /* data writes now go past the page cache (volumes_set_write_through) */
	/*
	 * Error counters as the device tree's DEV_STATS item keeps them
	 * (BTRFS_DEV_STAT_*): loaded at open and added to, by any thread, with
	 * atomic operations only (volumes_dev_stat_inc()). stats_dirty is set
	 * after every change and cleared (atomically, before the values are
	 * read) by the commit that writes the item, so no count is ever lost.
	 */
	u64 stats[BTRFS_DEV_STAT_VALUES_MAX];
	int stats_dirty;
	/*
	 * A replace running on this device (lib/ops/replace.c): every write to
	 * it goes to replace_target too, at the same physical place, so what the
	 * copy has passed stays equal on both. A failed write there sets
	 * replace_error (the replace stops; the filesystem's write succeeds).
	 * Set and cleared under the library's exclusive lock, as are all writes.
	 */
	struct blockdev *replace_target;
	int replace_error;
	/*
	 * Reads of this device fail at once (as if it were missing), so that
	 * readers take another copy: a replace with -r sets it around each read
	 * (and reads again without it when no other copy is good).
	 */
	int avoid_reads;
	int listed;             /* the chunk tree has its DEV_ITEM (volumes_add_dev_item()) */
};

struct map_stripe {
	u64 devid;
	u64 physical;           /* start of this stripe's area on the device */
	struct btrfs_device *dev;
};

struct chunk_map {
	u64 logical;
	u64 length;
	u64 type;               /* BTRFS_BLOCK_GROUP_* */
	u64 stripe_len;
	u32 num_stripes;
	u32 sub_stripes;
	struct map_stripe stripes[];
};

struct btrfs_volumes {
	const struct blog *log;
	struct btrfs_super_block super; /* the newest valid copy */
	u32 sectorsize;
	u32 nodesize;
	u16 csum_type;
	u32 csum_size;
	u8 fsid[BTRFS_FSID_SIZE];
	u8 meta_fsid[BTRFS_FSID_SIZE];  /* fsid stamped in node headers */
	u8 chunk_tree_uuid[BTRFS_UUID_SIZE]; /* stamped in node headers */

	struct btrfs_device **devs;
	size_t ndevs;

	struct chunk_map **chunks;
	size_t nchunks, chunks_cap;
	int allow_degraded;
};

/*
 * Read and validate the superblocks of @dev (primary and mirrors that fit):
 * returns 0 with the newest valid copy in @sb, -EINVAL if no copy has the
 * btrfs magic, -EUCLEAN if copies exist but none is valid.
 */
int btrfs_read_super(struct blockdev *dev, const struct blog *log, struct btrfs_super_block *sb);

/*
 * Read superblock copy @mirror (0..2) of @dev into @sb and check it (magic,
 * bytenr, checksum, btrfs_check_super). Returns 1 if the device is too small
 * to hold that copy, 0 if it is valid, -EINVAL without the magic (*has_magic
 * stays untouched), -EUCLEAN if it is damaged (logged), or an I/O error.
 */
int btrfs_read_super_copy(struct blockdev *dev, int mirror, const struct blog *log,
			  struct btrfs_super_block *sb, int *has_magic);

/* Check a superblock's own consistency (sizes, levels, csum type, array). */
int btrfs_check_super(const struct btrfs_super_block *sb, const struct blog *log,
		      const char *where);

/* Return the name of the first incompat feature we cannot handle, or NULL. */
const char *btrfs_unsupported_incompat(u64 incompat);

/*
 * Assemble a filesystem from the opened devices @bdevs (ownership passes to
 * @vol on success and on failure). Picks the newest superblock among devices
 * of the same fsid, loads sys_chunk_array. Devices of another fsid are an
 * error naming the file.
 */
int volumes_open(struct btrfs_volumes *vol, struct blockdev **bdevs, size_t nbdevs,
		 const struct blog *log, int allow_degraded);
void volumes_close(struct btrfs_volumes *vol);

/* Add a chunk from an on-disk chunk item of @item_size bytes at @logical. */
int volumes_add_chunk(struct btrfs_volumes *vol, u64 logical, const struct btrfs_chunk *chunk,
		      u32 item_size);

/* Forget chunk @logical (its items are gone); -ENOENT if no chunk starts there. */
int volumes_remove_chunk(struct btrfs_volumes *vol, u64 logical);

/* Take device @devid out of vol->devs and return it (NULL if unknown); the caller owns it. */
struct btrfs_device *volumes_detach_device(struct btrfs_volumes *vol, u64 devid);

/* Insert a device record (ownership passes to @vol), keeping vol->devs sorted by devid. */
int volumes_insert_device(struct btrfs_volumes *vol, struct btrfs_device *dev);

/* Record a device item from the chunk tree (creates a missing device if needed). */
int volumes_add_dev_item(struct btrfs_volumes *vol, const struct btrfs_dev_item *item);

/* After the chunk tree is loaded: check every stripe's device is present or tolerable. */
int volumes_check_devices(struct btrfs_volumes *vol);

/*
 * After the chunk tree's dev items are loaded: close and forget every
 * opened device the chunk tree does not list (a device removed, whose
 * superblocks a crash kept from being wiped), with a warning, so that no
 * commit makes it look like a member again. As the kernel at mount.
 */
void volumes_drop_unlisted(struct btrfs_volumes *vol);

/* The chunk containing @logical, or NULL. */
const struct chunk_map *volumes_find_chunk(const struct btrfs_volumes *vol, u64 logical);

/* How many distinct ways exist to read @logical (copies and reconstructions). */
int volumes_num_copies(const struct btrfs_volumes *vol, u64 logical);

/*
 * Read @len bytes at @logical from copy @mirror (1-based). The range may span
 * stripes but not chunks. Returns 0, -EIO if that copy is unavailable (device
 * missing or I/O error), -ENOENT if no chunk maps @logical. No checksums are
 * checked here: the caller verifies and tries the next mirror.
 */
int volumes_read(struct btrfs_volumes *vol, u64 logical, void *buf, size_t len, int mirror);

/*
 * Write @len bytes at @logical to every copy (RAID5/6: data and the row's
 * parity, reading what the row needs). -EIO if a copy's device is missing.
 */
int volumes_write(struct btrfs_volumes *vol, u64 logical, const void *buf, size_t len);

/* ---- error reporting and device statistics ---- */

/*
 * Where copy @mirror of @logical is stored: its device (NULL if the chunk
 * names a device not known) and physical byte. For a RAID5/6 rebuild mirror
 * (> 1) that is the data stripe the rebuild stands in for, and *rebuilt is
 * set. -ENOENT if no chunk maps @logical, -EIO if the mirror does not exist.
 */
int volumes_locate(const struct btrfs_volumes *vol, u64 logical, int mirror,
		   struct btrfs_device **dev, u64 *physical, int *rebuilt);

/*
 * Describe copy @mirror of @logical for a message, into @buf:
 * "logical L copy M on /dev/x (devid D) physical P" (the device "missing"
 * when absent; "rebuilt from parity for ..." for RAID5/6 rebuilds).
 */
const char *volumes_describe(const struct btrfs_volumes *vol, u64 logical, int mirror,
			     char *buf, size_t size);

/*
 * Is copy @mirror of @logical on a device that is missing, or gone since it
 * was opened (blockdev_gone), so that a read error is expected?
 */
int volumes_copy_missing(const struct btrfs_volumes *vol, u64 logical, int mirror);

/* Count one error of kind @which (BTRFS_DEV_STAT_*) on @dev. Thread-safe. */
void volumes_dev_stat_inc(struct btrfs_device *dev, int which);

/*
 * Count one error of kind @which on the device storing copy @mirror of
 * @logical; nothing for RAID5/6 rebuilds (no one device holds them).
 */
void volumes_count_error(struct btrfs_volumes *vol, u64 logical, int mirror, int which);

/* Does some device hold counts not yet written to the device tree? */
int volumes_stats_dirty(const struct btrfs_volumes *vol);

/*
 * From now on (@on) write data past the page cache where the device can
 * (blockdev_write_through), or not: delayed allocation writes large
 * written-back pieces so; the writes of the change path are serialised.
 */
void volumes_set_write_through(struct btrfs_volumes *vol, int on);

/* Flush every present device. */
int volumes_flush(struct btrfs_volumes *vol);

/*
 * Write vol->super to every copy location on every present device, each
 * with that device's dev_item, bytenr and checksum.
 */
int volumes_write_supers(struct btrfs_volumes *vol);

/*
 * Map one position of a chunk: for @offset (bytes into the chunk) and
 * @mirror, the stripe index and physical byte, plus how many bytes from there
 * stay in the same stripe. For RAID5/6 only data positions are mapped (mirror
 * must be 1). Exposed for unit tests of the arithmetic.
 */
int chunk_map_position(const struct chunk_map *map, u64 offset, int mirror, u32 *stripe_index,
		       u64 *physical, u64 *contiguous);

/* Number of data stripes in one full stripe row (RAID5/6) or 1 otherwise. */
u32 chunk_data_stripes(const struct chunk_map *map);

/* Bytes one stripe of @map takes on its device (the length of each dev extent). */
u64 chunk_stripe_size(const struct chunk_map *map);

/*
 * Write @len bytes at @physical of @dev (present), and to its replace target
 * when a replace runs. Counts a write error in the device's statistics.
 */
int volumes_dev_write(struct btrfs_device *dev, const void *buf, size_t len, u64 physical);

/* ---- repair (repair.c): scrub writes one copy, checks RAID5/6 parity ---- */

/*
 * Write @len bytes at @logical to copy @mirror only (1-based, as
 * volumes_read() numbers them). For RAID5/6 every mirror names the data
 * stripe itself (the other mirrors are rebuilt from parity, not stored), and
 * the parity is left as it is: the caller writes data that the parity
 * already agrees with. -EIO if that copy's device is missing.
 */
int volumes_write_copy(struct btrfs_volumes *vol, u64 logical, const void *buf, size_t len,
		       int mirror);

/*
 * The full stripe row (RAID5/6) holding @logical: its first logical byte and
 * its length (stripe_len times the data stripes). -EINVAL if @logical is not
 * in a RAID5/6 chunk.
 */
int volumes_raid56_row(const struct btrfs_volumes *vol, u64 logical, u64 *row_logical,
		       u64 *row_len);

/* What volumes_raid56_check_parity() found, with the places for messages. */
struct raid56_parity_check {
	int mismatch;                  /* parity stripes that differ (0..2) */
	struct btrfs_device *dev[2];   /* each differing one (P before Q): device */
	u64 physical[2];               /* and physical byte of its stripe in the row */
	struct btrfs_device *unreadable_dev; /* -EIO: the stripe that could not be read */
	u64 unreadable_physical;
};

/*
 * Check the parity of the row starting at @row_logical against its data
 * stripes as they are on disk: @res says how many parity stripes differ and
 * where they are; with @repair those are rewritten. -EIO if a stripe of the
 * row cannot be read (res names it; nothing is written then).
 */
int volumes_raid56_check_parity(struct btrfs_volumes *vol, u64 row_logical, int repair,
				struct raid56_parity_check *res);

#endif
