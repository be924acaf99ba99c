/*
 * scrub.c — butter_scrub(): read every copy of every allocated block, find
 * the bad ones, rewrite them from good ones, and bring RAID5/6 parity back in
 * line with its data.
 *
 * What is read: the extent tree says what is allocated (tree blocks by their
 * METADATA_ITEM/EXTENT_ITEM, data by its EXTENT_ITEM); nothing else on the
 * devices is touched, so a scrub costs what is used, not the device size.
 * Log tree blocks and data written since the last commit are not in the
 * extent tree; on a writable handle the running transaction is committed
 * first, so what the trees say is what is on disk.
 *
 * What counts as good:
 *   tree block   node_validate(): checksum, bytenr, fsid, chunk tree uuid,
 *                level (of a METADATA_ITEM) and item layout;
 *   data sector  its checksum in the csum tree; a sector without one
 *                (prealloc, nodatasum) is good when it can be read;
 *   superblock   magic, bytenr, checksum, fsid and the generation of the
 *                last commit, on every copy of every present device;
 *   parity row   P (and Q) equal what the row's data stripes give.
 *
 * Copies: for DUP, RAID1, RAID1C3/4 and RAID10 every mirror is a stored
 * copy and each is checked. For RAID5/6 the data stripe is the only stored copy; when it is
 * bad, the rebuilds from parity (volumes_read mirrors 2..) are the sources,
 * and the parity of each row holding allocated bytes is checked after the
 * data of the row (never recomputed over data that had no good copy).
 *
 * Locking: on a writable handle the library lock is held from the first
 * commit to the end (changes wait); a read-only handle changes nothing, so
 * the scrub only reads.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/checksum.h"
#include "ops/ops.h"

#define BATCH_SECTORS 256u
#define MAX_STORED 4 /* RAID1C4: the most stored copies a profile has */

struct scrub {
	struct butter_fs *fs;
	struct btrfs_volumes *vol;
	struct butter_scrub_stats *st;
	int repair;
	u8 *copy[MAX_STORED + 1];   /* per stored copy (1-based): a batch or a block */
	u8 *ok[MAX_STORED + 1];     /* per stored copy: sector i (or the block) good */
	u8 *csums, *have;
	u8 *rebuilt;                /* a block or sector rebuilt from RAID5/6 parity */
	/* RAID5/6: the row whose parity waits for the next extent */
	u64 row, row_len;
	int row_pending;
	/* rows holding bytes left bad: their parity is not checked (ascending) */
	u64 *tainted;
	size_t ntainted, tainted_cap;
};

/* Who owns a data extent, for messages: the first inline data ref. */
struct owner {
	u64 root, ino, offset;
	int known;
};

static int is_raid56(const struct btrfs_volumes *vol, u64 logical)
{
	const struct chunk_map *map = volumes_find_chunk(vol, logical);

	return map && (map->type & BTRFS_BLOCK_GROUP_RAID56_MASK);
}

/* Copies stored on disk (checked one by one); the rest are rebuilds. */
static int stored_copies(const struct btrfs_volumes *vol, u64 logical)
{
	int n = is_raid56(vol, logical) ? 1 : volumes_num_copies(vol, logical);

	return n > MAX_STORED ? MAX_STORED : n;
}

/* Remember that the row holding @logical has bytes left bad (RAID5/6 only). */
static int taint(struct scrub *sc, u64 logical)
{
	u64 row, row_len;

	if (volumes_raid56_row(sc->vol, logical, &row, &row_len))
		return 0;
	if (sc->ntainted && sc->tainted[sc->ntainted - 1] == row)
		return 0;
	if (sc->ntainted == sc->tainted_cap) {
		size_t cap = sc->tainted_cap ? sc->tainted_cap * 2 : 16;
		u64 *v = realloc(sc->tainted, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		sc->tainted = v;
		sc->tainted_cap = cap;
	}
	sc->tainted[sc->ntainted++] = row;
	return 0;
}

/* Is row @row tainted? Forgets tainted rows below it (rows come in order). */
static int row_tainted(struct scrub *sc, u64 row)
{
	size_t i = 0, j;

	while (i < sc->ntainted && sc->tainted[i] < row)
		i++;
	for (j = i; j < sc->ntainted; j++)
		sc->tainted[j - i] = sc->tainted[j];
	sc->ntainted -= i;
	return sc->ntainted && sc->tainted[0] == row;
}

/* "/dev/x (devid D) physical P" of one stripe of a row, for messages. */
static const char *stripe_place(const struct btrfs_device *dev, u64 physical, char *buf,
				size_t size)
{
	snprintf(buf, size, "%s (devid %llu) physical %llu",
		 !dev || !dev->bdev ? "missing device" : dev->path ? dev->path : "?",
		 (unsigned long long)(dev ? dev->devid : 0), (unsigned long long)physical);
	return buf;
}

static int check_row(struct scrub *sc)
{
	struct raid56_parity_check res;
	char at[2][256];
	int ret, k;

	if (!sc->row_pending)
		return 0;
	sc->row_pending = 0;
	if (row_tainted(sc, sc->row)) {
		/* parity computed over data known to be bad would say nothing */
		blog_warn(&sc->fs->log, "scrub: stripe row at logical %llu: parity not checked (its "
			  "data has errors left)", (unsigned long long)sc->row);
		return 0;
	}
	ret = volumes_raid56_check_parity(sc->vol, sc->row, sc->repair, &res);
	if (ret == -EIO) {
		blog_err(&sc->fs->log, "scrub: stripe row at logical %llu: the stripe on %s cannot "
			 "be read", (unsigned long long)sc->row,
			 stripe_place(res.unreadable_dev, res.unreadable_physical, at[0],
				      sizeof(at[0])));
		sc->st->read_errors++;
		return 0;
	}
	if (ret)
		return ret;
	if (!res.mismatch)
		return 0;
	sc->st->parity_errors += (u64)res.mismatch;
	if (sc->repair)
		sc->st->corrected += (u64)res.mismatch;
	for (k = 0; k < res.mismatch; k++)
		stripe_place(res.dev[k], res.physical[k], at[k], sizeof(at[k]));
	blog_warn(&sc->fs->log, "scrub: stripe row at logical %llu: parity on %s%s%s %s the data%s",
		  (unsigned long long)sc->row, at[0], res.mismatch > 1 ? " and on " : "",
		  res.mismatch > 1 ? at[1] : "", sc->repair ? "did not match" : "does not match",
		  sc->repair ? "; rewritten" : "");
	return 0;
}

/*
 * Note that [logical, logical + len) was scrubbed: rows it completes are
 * checked now, its last row waits for the next extent.
 */
static int note_rows(struct scrub *sc, u64 logical, u64 len)
{
	u64 first, last, row_len, r;
	int ret;

	if (!is_raid56(sc->vol, logical))
		return 0;
	ret = volumes_raid56_row(sc->vol, logical, &first, &row_len);
	if (ret == 0)
		ret = volumes_raid56_row(sc->vol, logical + len - 1, &last, &row_len);
	if (ret)
		return ret;
	if (sc->row_pending && sc->row != first) {
		ret = check_row(sc);
		if (ret)
			return ret;
	}
	for (r = first; r <= last; r += row_len) {
		if (!sc->row_pending || sc->row != r) {
			sc->row = r;
			sc->row_len = row_len;
			sc->row_pending = 1;
		}
		if (r != last) {
			ret = check_row(sc);
			if (ret)
				return ret;
		}
	}
	return 0;
}

/*
 * ", subvolume R inode I path "P" file offset O" for the sector @delta bytes
 * into @o's range; empty when the owner is not known.
 */
static void describe(struct scrub *sc, const struct owner *o, u64 delta, char *buf, size_t size)
{
	char file[1400];

	if (o && o->known)
		snprintf(buf, size, ", %s",
			 inode_describe_file_pos(sc->fs, o->root, o->ino, o->offset + delta, file,
						 sizeof(file)));
	else
		buf[0] = '\0';
}

/* "logical L copy M on DEV (devid D) physical P" into @buf. */
static const char *where(struct scrub *sc, u64 logical, int mirror, char *buf, size_t size)
{
	return volumes_describe(sc->vol, logical, mirror, buf, size);
}

/* ---- tree blocks ---------------------------------------------------------- */

static int block_good(struct scrub *sc, const u8 *data, u64 bytenr, int level, const char **why)
{
	return node_validate(&sc->fs->cache, data, bytenr, 0, level, NULL, why) == 0;
}

static int scrub_tree_block(struct scrub *sc, u64 bytenr, int level)
{
	struct btrfs_volumes *vol = sc->vol;
	u32 nodesize = vol->nodesize;
	int copies = volumes_num_copies(vol, bytenr), stored = stored_copies(vol, bytenr);
	int m, good = 0, nbad = 0, ret;
	const u8 *source = NULL;
	const char *why;
	char at[256];

	sc->st->tree_bytes += nodesize;
	for (m = 1; m <= stored; m++) {
		sc->ok[m][0] = 0;
		if (volumes_read(vol, bytenr, sc->copy[m], nodesize, m) != 0) {
			sc->st->read_errors++;
			blog_warn(&sc->fs->log, "scrub: tree block %s: read error",
				  where(sc, bytenr, m, at, sizeof(at)));
		} else if (!block_good(sc, sc->copy[m], bytenr, level, &why)) {
			sc->st->verify_errors++;
			volumes_count_error(vol, bytenr, m, BTRFS_DEV_STAT_CORRUPTION_ERRS);
			blog_warn(&sc->fs->log, "scrub: tree block %s: %s",
				  where(sc, bytenr, m, at, sizeof(at)), why);
		} else {
			sc->ok[m][0] = 1;
			if (!good) {
				good = m;
				source = sc->copy[m];
			}
			continue;
		}
		nbad++;
	}
	if (!nbad)
		return note_rows(sc, bytenr, nodesize);
	if (!good) {
		/* RAID5/6: rebuild the block from parity */
		for (m = stored + 1; m <= copies && !good; m++)
			if (volumes_read(vol, bytenr, sc->rebuilt, nodesize, m) == 0 &&
			    block_good(sc, sc->rebuilt, bytenr, level, &why)) {
				good = m;
				source = sc->rebuilt;
			}
	}
	if (!good) {
		sc->st->uncorrectable += (u64)nbad;
		blog_err(&sc->fs->log, "scrub: tree block %llu: no good copy among %d",
			 (unsigned long long)bytenr, copies);
	}
	if (!good || !sc->repair) {
		ret = taint(sc, bytenr);
		return ret ? ret : note_rows(sc, bytenr, nodesize);
	}
	for (m = 1; m <= stored && sc->repair; m++) {
		if (sc->ok[m][0])
			continue;
		ret = volumes_write_copy(vol, bytenr, source, nodesize, m);
		if (ret) {
			blog_err(&sc->fs->log, "scrub: tree block %s: repair write failed",
				 where(sc, bytenr, m, at, sizeof(at)));
			return ret;
		}
		sc->st->corrected++;
		blog_warn(&sc->fs->log, "scrub: tree block %s: rewritten from copy %d",
			  where(sc, bytenr, m, at, sizeof(at)), good);
	}
	return note_rows(sc, bytenr, nodesize);
}

/* ---- data ----------------------------------------------------------------- */

static int sector_matches(struct scrub *sc, const u8 *data, u32 i)
{
	u8 csum[BTRFS_CSUM_SIZE];

	if (!sc->have[i])
		return 1; /* nothing to compare: a readable sector is all we can ask */
	btrfs_csum_compute(sc->vol->csum_type, data, sc->vol->sectorsize, csum);
	return memcmp(csum, sc->csums + (size_t)i * sc->vol->csum_size, sc->vol->csum_size) == 0;
}

/* Read @n sectors at @logical from copy @m into sc->copy[m]; ok[m][i] per sector. */
static void read_copy(struct scrub *sc, u64 logical, u32 n, int m, const struct owner *o)
{
	const u32 ss = sc->vol->sectorsize;
	char who[1500], at[256];
	u32 i;

	if (volumes_read(sc->vol, logical, sc->copy[m], (size_t)n * ss, m) == 0) {
		memset(sc->ok[m], 1, n);
	} else {
		/* which sectors: one by one */
		for (i = 0; i < n; i++) {
			u64 pos = logical + (u64)i * ss;

			sc->ok[m][i] = volumes_read(sc->vol, pos, sc->copy[m] + (size_t)i * ss, ss,
						    m) == 0;
			if (!sc->ok[m][i]) {
				describe(sc, o, (u64)i * ss, who, sizeof(who));
				sc->st->read_errors++;
				blog_warn(&sc->fs->log, "scrub: data %s: read error%s",
					  where(sc, pos, m, at, sizeof(at)), who);
			}
		}
	}
	for (i = 0; i < n; i++) {
		u64 pos = logical + (u64)i * ss;

		if (!sc->ok[m][i] || sector_matches(sc, sc->copy[m] + (size_t)i * ss, i))
			continue;
		sc->ok[m][i] = 0;
		sc->st->csum_errors++;
		volumes_count_error(sc->vol, pos, m, BTRFS_DEV_STAT_CORRUPTION_ERRS);
		describe(sc, o, (u64)i * ss, who, sizeof(who));
		blog_warn(&sc->fs->log, "scrub: data %s: checksum mismatch%s",
			  where(sc, pos, m, at, sizeof(at)), who);
	}
}

/* Scrub @n sectors at @logical. */
static int scrub_data_batch(struct scrub *sc, u64 logical, u32 n, const struct owner *o)
{
	struct btrfs_volumes *vol = sc->vol;
	const u32 ss = vol->sectorsize;
	int copies = volumes_num_copies(vol, logical), stored = stored_copies(vol, logical);
	char who[1500], at[256];
	u32 i;
	int m, ret;

	ret = data_lookup_csums(sc->fs, logical, n, sc->csums, sc->have);
	if (ret)
		return ret;
	for (i = 0; i < n; i++)
		if (!sc->have[i])
			sc->st->no_csum_bytes += ss;
	for (m = 1; m <= stored; m++)
		read_copy(sc, logical, n, m, o);
	for (i = 0; i < n; i++) {
		u64 pos = logical + (u64)i * ss;
		const u8 *good = NULL;
		int nbad = 0, from = 0;

		for (m = 1; m <= stored; m++) {
			if (!sc->ok[m][i])
				nbad++;
			else if (!good) {
				good = sc->copy[m] + (size_t)i * ss;
				from = m;
			}
		}
		if (!nbad)
			continue;
		for (m = stored + 1; m <= copies && !good; m++) {
			if (volumes_read(vol, pos, sc->rebuilt, ss, m) == 0 &&
			    sector_matches(sc, sc->rebuilt, i)) {
				good = sc->rebuilt;
				from = m;
			}
		}
		describe(sc, o, (u64)i * ss, who, sizeof(who));
		if (!sc->repair || !good) {
			ret = taint(sc, pos);
			if (ret)
				return ret;
		}
		if (!good) {
			sc->st->uncorrectable += (u64)nbad;
			blog_err(&sc->fs->log, "scrub: data at logical %llu: no good copy among %d%s",
				 (unsigned long long)pos, copies, who);
			continue;
		}
		for (m = 1; m <= stored && sc->repair; m++) {
			if (sc->ok[m][i])
				continue;
			ret = volumes_write_copy(vol, pos, good, ss, m);
			if (ret) {
				blog_err(&sc->fs->log, "scrub: data %s: repair write failed%s",
					 where(sc, pos, m, at, sizeof(at)), who);
				return ret;
			}
			sc->st->corrected++;
			blog_warn(&sc->fs->log, "scrub: data %s: rewritten from copy %d%s",
				  where(sc, pos, m, at, sizeof(at)), from, who);
		}
	}
	return 0;
}

static int scrub_data(struct scrub *sc, u64 logical, u64 len, const struct owner *o)
{
	const u32 ss = sc->vol->sectorsize;
	u64 done = 0;
	int ret = 0;

	if (logical % ss || len % ss)
		return BLOG_CORRUPT(&sc->fs->log, "data extent %llu+%llu: not sector aligned",
				    (unsigned long long)logical, (unsigned long long)len);
	sc->st->data_bytes += len;
	while (done < len && ret == 0) {
		u32 n = (len - done) / ss > BATCH_SECTORS ? BATCH_SECTORS : (u32)((len - done) / ss);
		struct owner at = { 0 };

		if (o->known)
			at = (struct owner){ o->root, o->ino, o->offset + done, 1 };
		ret = scrub_data_batch(sc, logical + done, n, &at);
		done += (u64)n * ss;
	}
	if (ret == 0)
		ret = note_rows(sc, logical, len);
	return ret;
}

/* The first inline EXTENT_DATA_REF of a data extent item, if any. */
static void data_owner(const u8 *item, u32 size, struct owner *o)
{
	u32 at = sizeof(struct btrfs_extent_item);

	memset(o, 0, sizeof(*o)); /* known 0: no keyed data ref found */
	while (at < size) {
		u8 type = item[at];

		if (type == BTRFS_EXTENT_DATA_REF_KEY) {
			struct btrfs_extent_data_ref ref;

			if (at + 1 + sizeof(ref) > size)
				return;
			memcpy(&ref, item + at + 1, sizeof(ref));
			o->root = get_le64(&ref.root);
			o->ino = get_le64(&ref.objectid);
			o->offset = get_le64(&ref.offset);
			o->known = 1;
			return;
		}
		if (type == BTRFS_SHARED_DATA_REF_KEY)
			at += 1 + 8 + sizeof(struct btrfs_shared_data_ref);
		else
			at += 1 + 8;
	}
}

/* ---- the walk ------------------------------------------------------------- */

/* Does the extent at @logical share the stripe row whose parity waits? */
static int continues_row(struct scrub *sc, u64 logical)
{
	u64 row, row_len;

	return sc->row_pending && volumes_raid56_row(sc->vol, logical, &row, &row_len) == 0 &&
	       row == sc->row;
}

/*
 * Scrub the extents from *cursor on, stopping at the first extent after
 * @budget bytes (0: no limit) that starts a new stripe row (a row's parity is
 * checked only once all its extents are). Returns 1 with *cursor at that
 * extent, 0 at the end of the tree, negative errno.
 */
static int scrub_extents(struct scrub *sc, u64 *cursor, u64 budget)
{
	struct butter_fs *fs = sc->fs;
	struct btrfs_key key = { *cursor, 0, 0 };
	struct tree_path path;
	u64 done = 0;
	int ret, stopped = 0;

	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &fs->extent_tree, &key, &path);
	while (ret == 0) {
		const u8 *item;
		u32 size;
		u64 len;

		path_key(&path, &key);
		item = path_item(&path, &size);
		if (key.type != BTRFS_METADATA_ITEM_KEY && key.type != BTRFS_EXTENT_ITEM_KEY) {
			ret = tree_next_item(&fs->cache, &path);
			continue;
		}
		if (budget && done >= budget && !continues_row(sc, key.objectid)) {
			*cursor = key.objectid;
			stopped = 1;
			break;
		}
		if (key.type == BTRFS_METADATA_ITEM_KEY) {
			len = sc->vol->nodesize;
			ret = scrub_tree_block(sc, key.objectid, (int)key.offset);
		} else {
			struct btrfs_extent_item ei;

			if (size < sizeof(ei)) {
				ret = BLOG_CORRUPT(&fs->log, "extent item %llu: %u bytes",
						   (unsigned long long)key.objectid, size);
				break;
			}
			memcpy(&ei, item, sizeof(ei));
			len = key.offset;
			if (btrfs_extent_flags(&ei) & BTRFS_EXTENT_FLAG_TREE_BLOCK) {
				ret = scrub_tree_block(sc, key.objectid, -1);
			} else {
				struct owner o;

				data_owner(item, size, &o);
				ret = scrub_data(sc, key.objectid, key.offset, &o);
			}
		}
		if (ret)
			break;
		done += len;
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	if (ret == 1) {
		ret = 0; /* the end of the tree */
		*cursor = (u64)-1;
	}
	if (ret == 0)
		ret = check_row(sc);
	sc->ntainted = 0;
	return ret < 0 ? ret : stopped;
}

/* Every superblock copy of every present device; the count of bad ones. */
static u64 scrub_supers(struct scrub *sc)
{
	struct btrfs_volumes *vol = sc->vol;
	struct btrfs_super_block *sb = malloc(sizeof(*sb));
	u64 bad = 0;
	size_t d;

	if (!sb)
		return 0;
	for (d = 0; d < vol->ndevs; d++) {
		struct blockdev *bdev = vol->devs[d]->bdev;
		int m;

		if (!bdev)
			continue;
		for (m = 0; m < BTRFS_SUPER_MIRROR_MAX; m++) {
			int has_magic = 0;
			int ret = btrfs_read_super_copy(bdev, m, &sc->fs->log, sb, &has_magic);

			if (ret == 1)
				break;
			if (ret == 0 && memcmp(sb->fsid, vol->super.fsid, BTRFS_FSID_SIZE) == 0 &&
			    btrfs_super_generation(sb) == btrfs_super_generation(&vol->super))
				continue;
			if (ret == 0) {
				volumes_dev_stat_inc(vol->devs[d], BTRFS_DEV_STAT_GENERATION_ERRS);
				blog_warn(&sc->fs->log, "scrub: %s (devid %llu): superblock copy %d "
					  "(physical %llu) is at generation %llu, the filesystem at "
					  "%llu", bdev->name, (unsigned long long)vol->devs[d]->devid,
					  m, (unsigned long long)btrfs_sb_offset(m),
					  (unsigned long long)btrfs_super_generation(sb),
					  (unsigned long long)btrfs_super_generation(&vol->super));
			} else {
				volumes_dev_stat_inc(vol->devs[d],
						     ret == -EIO ? BTRFS_DEV_STAT_READ_ERRS
								 : BTRFS_DEV_STAT_CORRUPTION_ERRS);
				blog_warn(&sc->fs->log, "scrub: %s (devid %llu): superblock copy %d "
					  "(physical %llu) is bad", bdev->name,
					  (unsigned long long)vol->devs[d]->devid, m,
					  (unsigned long long)btrfs_sb_offset(m));
			}
			bad++;
		}
	}
	free(sb);
	return bad;
}

static void scrub_free(struct scrub *sc)
{
	int m;

	for (m = 1; m <= MAX_STORED; m++) {
		free(sc->copy[m]);
		free(sc->ok[m]);
	}
	free(sc->csums);
	free(sc->have);
	free(sc->rebuilt);
	free(sc->tainted);
}

static int scrub_init(struct scrub *sc, struct butter_fs *fs, unsigned flags,
		      struct butter_scrub_stats *st)
{
	u32 ss = fs->vol.sectorsize;
	size_t bytes = (size_t)BATCH_SECTORS * ss;
	int m;

	memset(sc, 0, sizeof(*sc));
	sc->fs = fs;
	sc->vol = &fs->vol;
	sc->st = st;
	sc->repair = fs->w && !fs->w->readonly && !(flags & BUTTER_SCRUB_READONLY);
	if (bytes < fs->vol.nodesize)
		bytes = fs->vol.nodesize;
	for (m = 1; m <= MAX_STORED; m++) {
		sc->copy[m] = malloc(bytes);
		sc->ok[m] = malloc(BATCH_SECTORS);
		if (!sc->copy[m] || !sc->ok[m])
			goto nomem;
	}
	sc->csums = malloc((size_t)BATCH_SECTORS * fs->vol.csum_size);
	sc->have = malloc(BATCH_SECTORS);
	sc->rebuilt = malloc(fs->vol.nodesize > ss ? fs->vol.nodesize : ss);
	if (sc->csums && sc->have && sc->rebuilt)
		return 0;
nomem:
	scrub_free(sc);
	return -ENOMEM;
}

int ops_scrub_range(struct butter_fs *fs, unsigned flags, uint64_t *cursor, uint64_t budget,
		    struct butter_scrub_stats *st)
{
	struct fs_write_state *w = fs->w;
	struct scrub sc;
	int ret;

	if (*cursor == (u64)-1)
		return 0;
	ret = scrub_init(&sc, fs, flags, st);
	if (ret)
		return ret;
	if (w) {
		pthread_mutex_lock(&w->lock);
		ret = txn_commit(&w->txn); /* the trees on disk are the trees we walk */
	}
	if (ret == 0)
		ret = scrub_extents(&sc, cursor, budget);
	if (w)
		pthread_mutex_unlock(&w->lock);
	scrub_free(&sc);
	return ret;
}

int ops_scrub_supers(struct butter_fs *fs, unsigned flags, struct butter_scrub_stats *st)
{
	struct fs_write_state *w = fs->w;
	struct scrub sc = { .fs = fs, .vol = &fs->vol, .st = st };
	u64 bad;
	int ret = 0;

	sc.repair = w && !(flags & BUTTER_SCRUB_READONLY);
	if (w)
		pthread_mutex_lock(&w->lock);
	bad = scrub_supers(&sc);
	st->super_errors += bad;
	if (bad && sc.repair) {
		/* a commit writes every copy on every device */
		ret = txn_commit(&w->txn);
		if (ret == 0)
			ret = txn_begin(&w->txn);
		if (ret == 0) {
			w->txn.super_dirty = 1;
			ret = txn_commit(&w->txn);
		}
		if (ret == 0)
			st->corrected += bad;
	}
	if (w)
		pthread_mutex_unlock(&w->lock);
	return ret;
}

int ops_scrub(struct butter_fs *fs, unsigned flags, struct butter_scrub_stats *st)
{
	uint64_t cursor = 0;
	int ret;

	memset(st, 0, sizeof(*st));
	do
		ret = ops_scrub_range(fs, flags, &cursor, 0, st);
	while (ret == 1);
	if (ret == 0)
		ret = ops_scrub_supers(fs, flags, st);
	return ret;
}
