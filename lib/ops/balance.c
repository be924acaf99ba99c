/*
 * balance.c — choosing block groups and moving them (relocate.c does one):
 * balance with btrfs-progs' filters and profile conversion, device remove,
 * and shrinking a device below its last allocated chunk.
 *
 * Order: groups are taken from the highest logical address down, as the
 * kernel takes them. New chunks (the copies' room) always start above every
 * chunk that ever existed (extent_state.logical_floor), so a balance never
 * visits what it made itself.
 *
 * The balance item (root tree, BALANCE_OBJECTID, TEMPORARY_ITEM) records a
 * balance while it runs, as the kernel's does: written (committed) before
 * the first group moves, deleted when none is left, when it is cancelled or
 * fails; a balance paused (its caller stopped stepping) or interrupted keeps
 * it, so `butter balance resume` — or a kernel mount, which resumes a
 * recorded balance unless mounted skip_balance — goes on with the same
 * arguments. Device remove and shrinking move groups without one, as the
 * kernel's do.
 *
 * Conversion sets the profile forced on the kind's allocations for the
 * duration (extent_state.force_profile_*): copies then go only to groups of
 * the target profile, and new chunks get it. After a data conversion the
 * write side's data profile follows, so later chunks keep the target.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

static int put_balance_item(struct fs_write_state *w, struct butter_fs *fs,
			    const struct butter_balance_args *args);

static const struct butter_balance_filter *filter_for(const struct butter_balance_args *args,
						      u64 flags)
{
	if (flags & BTRFS_BLOCK_GROUP_SYSTEM)
		return args->flags & BUTTER_BALANCE_SYSTEM ? &args->sys : NULL;
	if (flags & BTRFS_BLOCK_GROUP_METADATA) {
		/* a mixed group is data and metadata: either kind selects it */
		if (args->flags & BUTTER_BALANCE_METADATA)
			return &args->meta;
		if ((flags & BTRFS_BLOCK_GROUP_DATA) && (args->flags & BUTTER_BALANCE_DATA))
			return &args->data;
		return NULL;
	}
	return args->flags & BUTTER_BALANCE_DATA ? &args->data : NULL;
}

/* Which count of @st a group of @flags adds to, for LIMIT. */
static int kind_index(u64 flags)
{
	if (flags & BTRFS_BLOCK_GROUP_SYSTEM)
		return 2;
	if (flags & BTRFS_BLOCK_GROUP_METADATA)
		return 1;
	return 0;
}

static u64 profile_bits(u64 flags)
{
	u64 p = flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;

	return p ? p : BUTTER_PROFILE_SINGLE;
}

/* Does the group @bg pass the filter @f? @done: groups of its kind moved so far. */
static int passes(struct butter_fs *fs, const struct block_group *bg,
		  const struct butter_balance_filter *f, u64 done)
{
	const struct chunk_map *map = volumes_find_chunk(&fs->vol, bg->start);
	u32 i;

	if (!map)
		return 0;
	if (f->flags & BUTTER_BALANCE_F_USAGE) {
		u64 min = bg->length * f->usage_min / 100, max = bg->length * f->usage_max / 100;

		if (f->usage_max == 0)
			max = 1; /* usage=0: only empty groups */
		if (bg->used < min || bg->used >= max)
			return 0;
	}
	if (f->flags & (BUTTER_BALANCE_F_DEVID | BUTTER_BALANCE_F_DRANGE)) {
		int hit = 0;

		for (i = 0; i < map->num_stripes && !hit; i++) {
			const struct map_stripe *s = &map->stripes[i];
			u64 ssize;

			if (s->devid != f->devid)
				continue;
			if (!(f->flags & BUTTER_BALANCE_F_DRANGE)) {
				hit = 1;
				continue;
			}
			ssize = chunk_stripe_size(map);
			hit = s->physical < f->pend && s->physical + ssize > f->pstart;
		}
		if (!hit)
			return 0;
	}
	if ((f->flags & BUTTER_BALANCE_F_VRANGE) &&
	    !(bg->start < f->vend && bg->start + bg->length > f->vstart))
		return 0;
	if ((f->flags & BUTTER_BALANCE_F_STRIPES) &&
	    (map->num_stripes < f->stripes_min || map->num_stripes > f->stripes_max))
		return 0;
	if ((f->flags & BUTTER_BALANCE_F_PROFILES) && !(profile_bits(bg->flags) & f->profiles))
		return 0;
	if ((f->flags & BUTTER_BALANCE_F_CONVERT) && (f->flags & BUTTER_BALANCE_F_SOFT) &&
	    profile_bits(bg->flags) == (f->target ? f->target : BUTTER_PROFILE_SINGLE))
		return 0;
	if ((f->flags & BUTTER_BALANCE_F_LIMIT) && done >= f->limit_max)
		return 0;
	return 1;
}

/* Copies a profile keeps, and the devices it needs at least. */
static void profile_needs(u64 profile, u32 *copies, u32 *min_devs)
{
	*copies = 1;
	*min_devs = 1;
	if (profile & BTRFS_BLOCK_GROUP_DUP) {
		*copies = 2;
	} else if (profile & BTRFS_BLOCK_GROUP_RAID1) {
		*copies = 2;
		*min_devs = 2;
	} else if (profile & BTRFS_BLOCK_GROUP_RAID1C3) {
		*copies = 3;
		*min_devs = 3;
	} else if (profile & BTRFS_BLOCK_GROUP_RAID1C4) {
		*copies = 4;
		*min_devs = 4;
	} else if (profile & BTRFS_BLOCK_GROUP_RAID0) {
		*min_devs = 2;
	} else if (profile & BTRFS_BLOCK_GROUP_RAID10) {
		*copies = 2;
		*min_devs = 4;
	} else if (profile & BTRFS_BLOCK_GROUP_RAID5) {
		*copies = 2;
		*min_devs = 2;
	} else if (profile & BTRFS_BLOCK_GROUP_RAID6) {
		*copies = 3;
		*min_devs = 3;
	}
}

/* Devices new chunks may use (present, not being removed). */
static u32 usable_devices(const struct extent_state *es)
{
	u32 n = 0;
	size_t i, j;

	for (i = 0; i < es->ndevspace; i++) {
		if (es->devspace[i].no_alloc)
			continue;
		for (j = 0; j < es->vol->ndevs; j++)
			if (es->vol->devs[j]->devid == es->devspace[i].devid && es->vol->devs[j]->bdev)
				n++;
	}
	return n;
}

/* Refuse what cannot work before anything moves. */
static int check_args(struct butter_fs *fs, const struct butter_balance_args *args)
{
	static const unsigned kinds[3] = { BUTTER_BALANCE_DATA, BUTTER_BALANCE_METADATA,
					   BUTTER_BALANCE_SYSTEM };
	static const char *names[3] = { "data", "metadata", "system" };
	const struct butter_balance_filter *fl[3] = { &args->data, &args->meta, &args->sys };
	u32 ndev = usable_devices(&fs->w->es);
	int k;

	for (k = 0; k < 3; k++) {
		const struct butter_balance_filter *f = fl[k];
		u64 target;
		u32 copies, min_devs;
		size_t i;

		if (!(args->flags & kinds[k]) || !(f->flags & BUTTER_BALANCE_F_CONVERT))
			continue;
		target = f->target ? f->target : BUTTER_PROFILE_SINGLE;
		if (__builtin_popcountll(target & (BTRFS_BLOCK_GROUP_PROFILE_MASK |
						   BUTTER_PROFILE_SINGLE)) != 1 ||
		    (target & ~(BTRFS_BLOCK_GROUP_PROFILE_MASK | BUTTER_PROFILE_SINGLE))) {
			blog_err(&fs->log, "balance: convert target %#llx for %s is no profile",
				 (unsigned long long)target, names[k]);
			return -EINVAL;
		}
		profile_needs(target & BTRFS_BLOCK_GROUP_PROFILE_MASK, &copies, &min_devs);
		if (ndev < min_devs) {
			blog_err(&fs->log, "balance: %s cannot be %s on %u device%s (it needs %u)",
				 names[k], butter_profile_name(target), ndev, ndev == 1 ? "" : "s",
				 min_devs);
			return -EINVAL;
		}
		if (k == 0 || (args->flags & BUTTER_BALANCE_FORCE))
			continue;
		/* metadata and system: refuse to lower the redundancy unless forced */
		for (i = 0; i < fs->w->es.nbgs; i++) {
			u64 flags = fs->w->es.bgs[i]->flags;
			u32 have, dummy;

			if (kind_index(flags) != k)
				continue;
			profile_needs(flags & BTRFS_BLOCK_GROUP_PROFILE_MASK, &have, &dummy);
			if (copies < have) {
				blog_err(&fs->log, "balance: converting %s from %s to %s lowers its "
						   "redundancy; force it to do that",
					 names[k], butter_profile_name(flags),
					 butter_profile_name(target));
				return -EINVAL;
			}
		}
	}
	return 0;
}

/* Set (or clear, @on = 0) the profiles forced by conversions. */
static void force_profiles(struct fs_write_state *w, const struct butter_balance_args *args,
			   int on)
{
	struct extent_state *es = &w->es;
	const struct butter_balance_filter *fl[3] = { &args->data, &args->meta, &args->sys };
	static const unsigned kinds[3] = { BUTTER_BALANCE_DATA, BUTTER_BALANCE_METADATA,
					   BUTTER_BALANCE_SYSTEM };
	u64 *slot[3] = { &es->force_profile_data, &es->force_profile_meta, &es->force_profile_sys };
	int k;

	for (k = 0; k < 3; k++) {
		if (!(args->flags & kinds[k]) || !(fl[k]->flags & BUTTER_BALANCE_F_CONVERT))
			continue;
		*slot[k] = on ? (fl[k]->target ? fl[k]->target : BUTTER_PROFILE_SINGLE) : 0;
		if (es->mixed && k < 2)
			es->force_profile_data = es->force_profile_meta = *slot[k];
	}
}

/*
 * The highest selected group starting below @below: its start in *start,
 * and how many are selected in all in *count. 1 if none.
 */
static int next_group(struct butter_fs *fs, const struct butter_balance_args *args, u64 below,
		      const u64 done[3], u64 *start, u64 *count)
{
	struct extent_state *es = &fs->w->es;
	size_t i;
	int found = 0;

	*count = 0;
	for (i = es->nbgs; i-- > 0;) {
		const struct block_group *bg = es->bgs[i];
		const struct butter_balance_filter *f;

		if (bg->start >= below)
			continue;
		f = filter_for(args, bg->flags);
		if (!f || !passes(fs, bg, f, done[kind_index(bg->flags)]))
			continue;
		if (!found)
			*start = bg->start;
		found = 1;
		(*count)++;
	}
	return found ? 0 : 1;
}

/*
 * Move the next selected group below *cursor. @record: keep the balance item
 * (a balance's own steps, not those of device remove or shrink).
 */
static int balance_one(struct butter_fs *fs, const struct butter_balance_args *args,
		       uint64_t *cursor, struct butter_balance_stats *st, int record)
{
	u64 *done = st->kind_groups;
	struct fs_write_state *w;
	u64 start = 0, count = 0, flags;
	struct block_group *bg;
	int ret;

	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = check_args(fs, args);
	if (ret)
		return fs_end_change(w, ret, 0);
	if (record && !st->considered && !(args->flags & BUTTER_BALANCE_RESUME)) {
		struct butter_balance_args recorded;

		if (ops_balance_item(fs, &recorded) == 0) {
			blog_err(&fs->log, "a balance is recorded (paused or interrupted): resume or "
					   "cancel it first");
			return fs_end_change(w, -EINPROGRESS, 0);
		}
	}
	ret = next_group(fs, args, *cursor, done, &start, &count);
	st->left = count;
	if (record && ret == 1) {
		/* done (a resume may find nothing left): the record goes */
		return fs_end_change(w, put_balance_item(w, fs, NULL) ?: 1, 1);
	}
	if (ret)
		return fs_end_change(w, ret, 0);
	if (record && !st->considered) {
		struct butter_balance_args plain = *args;

		plain.flags &= ~BUTTER_BALANCE_RESUME;
		ret = put_balance_item(w, fs, &plain);
		if (ret)
			return fs_end_change(w, ret, 1);
	}
	bg = extent_find_bg(&w->es, start);
	flags = bg->flags;
	st->considered++;
	blog_info(&fs->log, "relocating block group %llu (%s, %s, %llu of %llu bytes used)",
		  (unsigned long long)start,
		  flags & BTRFS_BLOCK_GROUP_DATA ? (flags & BTRFS_BLOCK_GROUP_METADATA ? "mixed" : "data")
		  : flags & BTRFS_BLOCK_GROUP_SYSTEM ? "system" : "metadata",
		  butter_profile_name(flags), (unsigned long long)bg->used,
		  (unsigned long long)bg->length);
	force_profiles(w, args, 1);
	ret = ops_relocate_group_locked(fs, w, start, st);
	force_profiles(w, args, 0);
	if (ret == 0) {
		const struct butter_balance_filter *f = filter_for(args, flags);

		done[kind_index(flags)]++;
		if (f && (f->flags & BUTTER_BALANCE_F_CONVERT) && (flags & BTRFS_BLOCK_GROUP_DATA))
			w->data_profile = f->target & BTRFS_BLOCK_GROUP_PROFILE_MASK;
		st->left = count - 1;
	}
	*cursor = start;
	if (ret && record && !w->txn.aborted) {
		/* a failed balance ends, as the kernel's: its record goes */
		int r = put_balance_item(w, fs, NULL);

		if (r)
			return fs_end_change(w, r, 1);
	}
	/* relocation committed or aborted itself: nothing is left to end */
	return fs_end_change(w, ret, 0);
}

int ops_balance_step(struct butter_fs *fs, const struct butter_balance_args *args,
		     uint64_t *cursor, struct butter_balance_stats *st)
{
	if (!fs->w)
		return -EROFS;
	return balance_one(fs, args, cursor, st, 1);
}

static int balance_all(struct butter_fs *fs, const struct butter_balance_args *args,
		       struct butter_balance_stats *st, int record)
{
	struct butter_balance_stats local;
	u64 cursor = UINT64_MAX;
	int ret;

	if (!fs->w)
		return -EROFS;
	if (!st)
		st = &local;
	memset(st, 0, sizeof(*st));
	do {
		ret = balance_one(fs, args, &cursor, st, record);
	} while (ret == 0);
	return ret == 1 ? 0 : ret;
}

int ops_balance(struct butter_fs *fs, const struct butter_balance_args *args,
		struct butter_balance_stats *st)
{
	return balance_all(fs, args, st, 1);
}

/* ---- the balance item ---- */

static void encode_filter(const struct butter_balance_filter *f, struct btrfs_disk_balance_args *d)
{
	u64 flags = 0;

	memset(d, 0, sizeof(*d));
	if (f->flags & BUTTER_BALANCE_F_PROFILES) {
		flags |= BTRFS_BALANCE_ARGS_PROFILES;
		put_le64(&d->profiles, f->profiles);
	}
	if (f->flags & BUTTER_BALANCE_F_USAGE) {
		flags |= f->usage_min ? BTRFS_BALANCE_ARGS_USAGE_RANGE : BTRFS_BALANCE_ARGS_USAGE;
		if (f->usage_min) {
			put_le32(&d->usage_min, f->usage_min);
			put_le32(&d->usage_max, f->usage_max);
		} else {
			put_le32(&d->usage_min, f->usage_max); /* the low half of the u64 */
		}
	}
	if (f->flags & (BUTTER_BALANCE_F_DEVID | BUTTER_BALANCE_F_DRANGE)) {
		flags |= BTRFS_BALANCE_ARGS_DEVID;
		put_le64(&d->devid, f->devid);
	}
	if (f->flags & BUTTER_BALANCE_F_DRANGE) {
		flags |= BTRFS_BALANCE_ARGS_DRANGE;
		put_le64(&d->pstart, f->pstart);
		put_le64(&d->pend, f->pend);
	}
	if (f->flags & BUTTER_BALANCE_F_VRANGE) {
		flags |= BTRFS_BALANCE_ARGS_VRANGE;
		put_le64(&d->vstart, f->vstart);
		put_le64(&d->vend, f->vend);
	}
	if (f->flags & BUTTER_BALANCE_F_LIMIT) {
		flags |= BTRFS_BALANCE_ARGS_LIMIT_RANGE;
		put_le32(&d->limit_min, f->limit_min);
		put_le32(&d->limit_max, f->limit_max);
	}
	if (f->flags & BUTTER_BALANCE_F_STRIPES) {
		flags |= BTRFS_BALANCE_ARGS_STRIPES_RANGE;
		put_le32(&d->stripes_min, f->stripes_min);
		put_le32(&d->stripes_max, f->stripes_max);
	}
	if (f->flags & BUTTER_BALANCE_F_CONVERT) {
		flags |= BTRFS_BALANCE_ARGS_CONVERT;
		put_le64(&d->target, f->target ? f->target : BUTTER_PROFILE_SINGLE);
	}
	if (f->flags & BUTTER_BALANCE_F_SOFT)
		flags |= BTRFS_BALANCE_ARGS_SOFT;
	put_le64(&d->flags, flags);
}

static void decode_filter(const struct btrfs_disk_balance_args *d, struct butter_balance_filter *f)
{
	u64 flags = get_le64(&d->flags);

	memset(f, 0, sizeof(*f));
	if (flags & BTRFS_BALANCE_ARGS_PROFILES) {
		f->flags |= BUTTER_BALANCE_F_PROFILES;
		f->profiles = get_le64(&d->profiles);
	}
	if (flags & BTRFS_BALANCE_ARGS_USAGE_RANGE) {
		f->flags |= BUTTER_BALANCE_F_USAGE;
		f->usage_min = get_le32(&d->usage_min);
		f->usage_max = get_le32(&d->usage_max);
	} else if (flags & BTRFS_BALANCE_ARGS_USAGE) {
		u64 usage = get_le32(&d->usage_min) | (u64)get_le32(&d->usage_max) << 32;

		f->flags |= BUTTER_BALANCE_F_USAGE;
		f->usage_max = usage > 101 ? 101 : (u32)usage;
	}
	if (flags & BTRFS_BALANCE_ARGS_DEVID) {
		f->flags |= BUTTER_BALANCE_F_DEVID;
		f->devid = get_le64(&d->devid);
	}
	if (flags & BTRFS_BALANCE_ARGS_DRANGE) {
		f->flags |= BUTTER_BALANCE_F_DRANGE;
		f->pstart = get_le64(&d->pstart);
		f->pend = get_le64(&d->pend);
	}
	if (flags & BTRFS_BALANCE_ARGS_VRANGE) {
		f->flags |= BUTTER_BALANCE_F_VRANGE;
		f->vstart = get_le64(&d->vstart);
		f->vend = get_le64(&d->vend);
	}
	if (flags & BTRFS_BALANCE_ARGS_LIMIT_RANGE) {
		f->flags |= BUTTER_BALANCE_F_LIMIT;
		f->limit_min = get_le32(&d->limit_min);
		f->limit_max = get_le32(&d->limit_max);
	} else if (flags & BTRFS_BALANCE_ARGS_LIMIT) {
		u64 limit = get_le32(&d->limit_min) | (u64)get_le32(&d->limit_max) << 32;

		f->flags |= BUTTER_BALANCE_F_LIMIT;
		f->limit_max = limit > UINT32_MAX ? UINT32_MAX : (u32)limit;
	}
	if (flags & BTRFS_BALANCE_ARGS_STRIPES_RANGE) {
		f->flags |= BUTTER_BALANCE_F_STRIPES;
		f->stripes_min = get_le32(&d->stripes_min);
		f->stripes_max = get_le32(&d->stripes_max);
	}
	if (flags & BTRFS_BALANCE_ARGS_CONVERT) {
		f->flags |= BUTTER_BALANCE_F_CONVERT;
		f->target = get_le64(&d->target);
	}
	if (flags & BTRFS_BALANCE_ARGS_SOFT)
		f->flags |= BUTTER_BALANCE_F_SOFT;
}

static const struct btrfs_key balance_key = { BTRFS_BALANCE_OBJECTID, BTRFS_TEMPORARY_ITEM_KEY, 0 };

int ops_balance_item(struct butter_fs *fs, struct butter_balance_args *out)
{
	struct btrfs_balance_item item;
	u64 flags;
	int ret;

	ret = tree_lookup_item(&fs->cache, &fs->root_tree, &balance_key, &item, sizeof(item));
	if (ret < 0)
		return ret;
	if ((size_t)ret < sizeof(item))
		return BLOG_CORRUPT(&fs->log, "balance item: %d bytes", ret);
	memset(out, 0, sizeof(*out));
	flags = get_le64(&item.flags);
	if (flags & BTRFS_BALANCE_ITEM_DATA)
		out->flags |= BUTTER_BALANCE_DATA;
	if (flags & BTRFS_BALANCE_ITEM_METADATA)
		out->flags |= BUTTER_BALANCE_METADATA;
	if (flags & BTRFS_BALANCE_ITEM_SYSTEM)
		out->flags |= BUTTER_BALANCE_SYSTEM;
	if (flags & BTRFS_BALANCE_ITEM_FORCE)
		out->flags |= BUTTER_BALANCE_FORCE;
	decode_filter(&item.data, &out->data);
	decode_filter(&item.meta, &out->meta);
	decode_filter(&item.sys, &out->sys);
	return 0;
}

/* Write (@args) or delete (NULL) the balance item, committed. Under the write lock. */
static int put_balance_item(struct fs_write_state *w, struct butter_fs *fs,
			    const struct butter_balance_args *args)
{
	struct butter_balance_args now;
	struct tree_path path;
	int ret;

	if (!args && ops_balance_item(fs, &now) == -ENOENT)
		return 0; /* nothing to delete: no commit */
	ret = txn_begin(&w->txn);
	if (ret)
		return ret;
	tree_path_init(&path);
	ret = tree_search_slot(&w->txn.tt, &fs->root_tree, &balance_key, &path, 0, 1);
	if (ret == 0)
		ret = tree_del_items(&w->txn.tt, &fs->root_tree, &path, 1);
	else if (ret == 1)
		ret = 0;
	tree_path_release(&fs->cache, &path);
	if (ret == 0 && args) {
		struct btrfs_balance_item item;
		u64 flags = 0;

		memset(&item, 0, sizeof(item));
		if (args->flags & BUTTER_BALANCE_DATA)
			flags |= BTRFS_BALANCE_ITEM_DATA;
		if (args->flags & BUTTER_BALANCE_METADATA)
			flags |= BTRFS_BALANCE_ITEM_METADATA;
		if (args->flags & BUTTER_BALANCE_SYSTEM)
			flags |= BTRFS_BALANCE_ITEM_SYSTEM;
		if (args->flags & BUTTER_BALANCE_FORCE)
			flags |= BTRFS_BALANCE_ITEM_FORCE;
		put_le64(&item.flags, flags);
		encode_filter(&args->data, &item.data);
		encode_filter(&args->meta, &item.meta);
		encode_filter(&args->sys, &item.sys);
		ret = tree_insert_item(&w->txn.tt, &fs->root_tree, &balance_key, &item, sizeof(item));
	}
	if (ret == 0)
		ret = txn_commit(&w->txn);
	return ret;
}

int ops_balance_cancel(struct butter_fs *fs)
{
	struct butter_balance_args args;
	struct fs_write_state *w;
	int ret = ops_balance_item(fs, &args);

	if (ret)
		return ret; /* -ENOENT: no balance recorded */
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = put_balance_item(w, fs, NULL);
	return fs_end_change(w, ret, 1);
}

/* ---- device remove and shrink ---- */

static struct dev_space *find_devspace(struct extent_state *es, u64 devid)
{
	size_t i;

	for (i = 0; i < es->ndevspace; i++)
		if (es->devspace[i].devid == devid)
			return &es->devspace[i];
	return NULL;
}

/* The devices' filter args for the groups with a stripe on @devid past @limit (0: any). */
static void evacuation_args(u64 devid, u64 limit, struct butter_balance_args *args)
{
	struct butter_balance_filter f;

	memset(args, 0, sizeof(*args));
	memset(&f, 0, sizeof(f));
	f.flags = BUTTER_BALANCE_F_DEVID;
	f.devid = devid;
	if (limit) {
		f.flags |= BUTTER_BALANCE_F_DRANGE;
		f.pstart = limit;
		f.pend = UINT64_MAX;
	}
	args->flags = BUTTER_BALANCE_DATA | BUTTER_BALANCE_METADATA | BUTTER_BALANCE_SYSTEM;
	args->data = args->meta = args->sys = f;
}

/* May device @devid go? -EINVAL (logged) when the profiles need it, -ENODEV if unknown. */
static int check_remove(struct butter_fs *fs, u64 devid)
{
	struct btrfs_volumes *vol = &fs->vol;
	struct btrfs_device *dev = NULL;
	struct dev_space *ds;
	size_t i;
	u32 remaining;

	for (i = 0; i < vol->ndevs; i++)
		if (vol->devs[i]->devid == devid)
			dev = vol->devs[i];
	ds = find_devspace(&fs->w->es, devid);
	if (!dev || !ds)
		return -ENODEV;
	if (ops_replace_running(fs, devid)) {
		blog_err(&fs->log, "devid %llu is being replaced: cancel the replace first",
			 (unsigned long long)devid);
		return -EBUSY;
	}
	if (vol->ndevs <= 1) {
		blog_err(&fs->log, "device %llu is the filesystem's only device",
			 (unsigned long long)devid);
		return -EINVAL;
	}
	/* the profiles in use must fit on the devices that remain */
	remaining = usable_devices(&fs->w->es) - (ds->no_alloc || !dev->bdev ? 0 : 1);
	for (i = 0; i < fs->w->es.nbgs; i++) {
		u64 flags = fs->w->es.bgs[i]->flags;
		u32 copies, min_devs;

		profile_needs(flags & BTRFS_BLOCK_GROUP_PROFILE_MASK, &copies, &min_devs);
		if (remaining < min_devs) {
			blog_err(&fs->log, "removing device %llu leaves %u device%s; %s needs %u "
					   "(convert it first)",
				 (unsigned long long)devid, remaining, remaining == 1 ? "" : "s",
				 butter_profile_name(flags), min_devs);
			return -EINVAL;
		}
	}
	return 0;
}

/* The device holds no chunk any more: take it out (its items, the count, its superblocks). */
static int finish_remove(struct butter_fs *fs, u64 devid)
{
	struct btrfs_volumes *vol = &fs->vol;
	struct fs_write_state *w;
	struct btrfs_device *dev;
	int ret;

	ret = ops_begin_alone(fs, &w);
	if (ret)
		return ret;
	ret = chunk_remove_device(&w->es, &w->txn.tt, devid);
	if (ret)
		return fs_end_change(w, ret, 1);
	/* the commit writes the superblocks of the devices that remain only */
	dev = volumes_detach_device(vol, devid);
	w->txn.super_dirty = 1;
	ret = txn_commit(&w->txn);
	if (ret == 0)
		ops_retire_device(fs, dev);
	else if (dev && volumes_insert_device(vol, dev) != 0)
		ops_retire_device(fs, dev);
	return fs_end_change(w, ret, 1);
}

int ops_device_remove_step(struct butter_fs *fs, uint64_t devid, uint64_t *cursor,
			   struct butter_balance_stats *st)
{
	struct butter_balance_args args;
	struct dev_space *ds;
	int ret;

	if (!fs->w)
		return -EROFS;
	if (*cursor == UINT64_MAX) {
		ret = check_remove(fs, devid);
		if (ret)
			return ret;
		find_devspace(&fs->w->es, devid)->no_alloc = 1; /* from now on, nothing new there */
	}
	ds = find_devspace(&fs->w->es, devid);
	if (!ds)
		return -ENODEV;
	evacuation_args(devid, 0, &args);
	ret = balance_one(fs, &args, cursor, st, 0);
	if (ret < 0) {
		ds->no_alloc = 0;
		return ret;
	}
	if (ret == 0)
		return 0;
	ret = finish_remove(fs, devid);
	if (ret)
		ds->no_alloc = 0;
	return ret ? ret : 1;
}

int ops_device_remove(struct butter_fs *fs, uint64_t devid)
{
	struct butter_balance_stats st;
	u64 cursor = UINT64_MAX;
	int ret;

	memset(&st, 0, sizeof(st));
	do {
		ret = ops_device_remove_step(fs, devid, &cursor, &st);
	} while (ret == 0);
	return ret == 1 ? 0 : ret;
}

/*
 * Give back to the allocator the space of device @devid in [from, to) that no
 * chunk uses (a shrink that did not happen).
 */
static int unreserve(struct butter_fs *fs, u64 devid, u64 from, u64 to)
{
	struct dev_space *ds = find_devspace(&fs->w->es, devid);
	struct range_set keep;
	size_t i;
	int ret;

	if (!ds || from >= to)
		return 0;
	ds->limit = 0;
	range_set_init(&keep);
	ret = range_add(&keep, from, to);
	for (i = 0; i < fs->vol.nchunks && ret == 0; i++) {
		const struct chunk_map *map = fs->vol.chunks[i];
		u32 k;

		for (k = 0; k < map->num_stripes && ret == 0; k++)
			if (map->stripes[k].devid == devid)
				ret = range_remove(&keep, map->stripes[k].physical,
						   map->stripes[k].physical + chunk_stripe_size(map));
	}
	for (i = 0; i < keep.n && ret == 0; i++)
		ret = range_add(&ds->free, keep.r[i].start, keep.r[i].end);
	range_set_free(&keep);
	return ret;
}

int ops_shrink_step(struct butter_fs *fs, u64 devid, u64 want, uint64_t *cursor,
		    struct butter_balance_stats *st)
{
	struct butter_balance_args args;
	struct btrfs_device *dev = NULL;
	struct dev_space *ds;
	size_t i;
	int ret;

	if (!fs->w)
		return -EROFS;
	for (i = 0; i < fs->vol.ndevs; i++)
		if (fs->vol.devs[i]->devid == devid)
			dev = fs->vol.devs[i];
	ds = find_devspace(&fs->w->es, devid);
	if (!ds || !dev || !dev->bdev)
		return -ENODEV;
	if (ops_replace_running(fs, devid)) {
		blog_err(&fs->log, "devid %llu is being replaced: cancel the replace first",
			 (unsigned long long)devid);
		return -EBUSY;
	}
	if (want >= dev->total_bytes)
		return 1;
	/* no new chunk past the new end while the old ones move */
	if (*cursor == UINT64_MAX) {
		ret = range_remove(&ds->free, want, dev->total_bytes);
		if (ret)
			return ret;
		ds->limit = want;
	}
	evacuation_args(devid, want, &args);
	ret = balance_one(fs, &args, cursor, st, 0);
	if (ret < 0 && fs->w)
		unreserve(fs, devid, want, dev->total_bytes);
	return ret;
}

static int shrink_all(struct butter_fs *fs, u64 devid, u64 want)
{
	struct butter_balance_stats st;
	u64 cursor = UINT64_MAX;
	int ret;

	memset(&st, 0, sizeof(st));
	do {
		ret = ops_shrink_step(fs, devid, want, &cursor, &st);
	} while (ret == 0);
	return ret == 1 ? 0 : ret;
}

/*
 * Move the groups of the kinds in @kinds (BUTTER_BALANCE_*) used below
 * @usage_max percent into chunks sized to their content (first fit from the
 * device's start), the space past the new end kept out of allocation.
 */
static int compact(struct butter_fs *fs, unsigned kinds, u32 usage_max)
{
	struct butter_balance_args args;

	memset(&args, 0, sizeof(args));
	args.flags = kinds;
	args.data.flags = BUTTER_BALANCE_F_USAGE;
	args.data.usage_max = usage_max;
	args.meta = args.sys = args.data;
	return balance_all(fs, &args, NULL, 0);
}

/*
 * The group with a stripe of device @devid across @want (starting below it,
 * ending past it), the largest if several; 0 if none.
 */
static u64 straddling_group(struct butter_fs *fs, u64 devid, u64 want)
{
	u64 best = 0, best_len = 0;

	for (size_t i = 0; i < fs->vol.nchunks; i++) {
		const struct chunk_map *map = fs->vol.chunks[i];
		u64 size = chunk_stripe_size(map);

		for (u32 k = 0; k < map->num_stripes; k++) {
			const struct map_stripe *s = &map->stripes[k];

			if (s->devid == devid && s->physical < want && s->physical + size > want &&
			    map->length > best_len) {
				best = map->logical;
				best_len = map->length;
			}
		}
	}
	return best;
}

/*
 * A group across the new end that found no room below it occupies part of
 * that very room. Move it out of the way first, anywhere on the device (the
 * space past the end given back for it), then compact and try again: what
 * it held below the end is free for the groups past it.
 */
static int lift_and_retry(struct butter_fs *fs, struct btrfs_device *dev, struct dev_space *ds,
			  u64 want)
{
	int ret = -ENOSPC;

	for (int lift = 0; ret == -ENOSPC && fs->w && lift < 4; lift++) {
		u64 start = straddling_group(fs, dev->devid, want);
		struct butter_balance_args args;

		if (!start)
			break;
		blog_info(&fs->log, "shrinking device %llu: moving block group %llu, across the new "
				    "end, out of the way first", (unsigned long long)dev->devid,
			  (unsigned long long)start);
		ret = unreserve(fs, dev->devid, want, dev->total_bytes);
		memset(&args, 0, sizeof(args));
		args.flags = BUTTER_BALANCE_DATA | BUTTER_BALANCE_METADATA | BUTTER_BALANCE_SYSTEM;
		args.data.flags = BUTTER_BALANCE_F_VRANGE;
		args.data.vstart = start;
		args.data.vend = start + 1;
		args.meta = args.sys = args.data;
		if (ret == 0)
			ret = balance_all(fs, &args, NULL, 0);
		if (ret || !fs->w)
			return ret ? ret : -EROFS;
		ret = range_remove(&ds->free, want, dev->total_bytes);
		ds->limit = want;
		if (ret == 0)
			ret = compact(fs, BUTTER_BALANCE_DATA, 50);
		if (ret == 0 || ret == -ENOSPC)
			ret = shrink_all(fs, dev->devid, want);
	}
	return ret;
}

int ops_shrink_prepare(struct butter_fs *fs, u64 devid, u64 want)
{
	struct btrfs_device *dev = NULL;
	struct dev_space *ds;
	size_t i;
	int ret;

	for (i = 0; i < fs->vol.ndevs; i++)
		if (fs->vol.devs[i]->devid == devid)
			dev = fs->vol.devs[i];
	ds = find_devspace(&fs->w->es, devid);
	if (!dev || !ds || !dev->bdev)
		return -ENODEV;
	if (want >= dev->total_bytes)
		return 0;
	/*
	 * Half-empty tree block groups first (a big metadata chunk that holds
	 * little is common): in chunks sized to their content below the new
	 * end, they leave room for what lies past it. Then the groups past the
	 * end; if those find no room, the half-empty data groups are compacted
	 * too and the move tried once more; and if a group across the end is in
	 * the way, it is moved first (lift_and_retry()).
	 */
	/* new chunks small while it runs, so that they fit the room that stays */
	fs->w->es.chunk_cap = want / 16 > (32ULL << 20) ? want / 16 : 32ULL << 20;
	ret = range_remove(&ds->free, want, dev->total_bytes);
	ds->limit = want;
	if (ret == 0)
		ret = compact(fs, BUTTER_BALANCE_METADATA | BUTTER_BALANCE_SYSTEM, 50);
	if (ret == -ENOSPC)
		ret = 0; /* best effort: what could not be compacted may still fit */
	if (ret == 0)
		ret = shrink_all(fs, devid, want);
	if (ret == -ENOSPC && fs->w) {
		blog_info(&fs->log, "shrinking device %llu: compacting half-empty data groups",
			  (unsigned long long)devid);
		ret = range_remove(&ds->free, want, dev->total_bytes);
		ds->limit = want;
		if (ret == 0)
			ret = compact(fs, BUTTER_BALANCE_DATA, 50);
		if (ret == 0 || ret == -ENOSPC)
			ret = shrink_all(fs, devid, want);
	}
	if (ret == -ENOSPC && fs->w)
		ret = lift_and_retry(fs, dev, ds, want);
	if (fs->w)
		fs->w->es.chunk_cap = 0;
	if (ret && fs->w)
		unreserve(fs, devid, want, dev->total_bytes);
	return ret;
}
