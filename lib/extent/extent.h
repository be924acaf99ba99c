/*
 * extent.h — space and references: block groups and their free space, the
 * allocator, the delayed-ref queue that becomes extent tree items at commit,
 * the free space tree, and data checksums in the csum tree.
 *
 * Invariants (between transactions):
 *  1. For every block group, free ∪ used-by-extents ∪ super stripes is the
 *     whole group, and the free space tree (when present) lists exactly free.
 *  2. Every allocated tree block and data extent has an extent item whose ref
 *     count equals the number of references (inline + keyed) it carries.
 *  3. A block freed in the running transaction stays out of free space
 *     (pinned) until the commit has written the superblocks, because the last
 *     committed tree may still point at it.
 *  4. With mixed block groups (incompat MIXED_GROUPS) every data or metadata
 *     group is both (flags DATA|METADATA): data extents and tree blocks come
 *     from the same groups, and every new data or metadata chunk is mixed.
 *     System groups stay apart. nodesize equals sectorsize there.
 */
#ifndef BUTTER_EXTENT_EXTENT_H
#define BUTTER_EXTENT_EXTENT_H

#include "extent/range.h"
#include "tree/cow.h"

struct block_group {
	u64 start, length, flags;
	u64 used;            /* bytes in extents (block group item 'used') */
	u64 unusable;        /* neither free nor used at the last commit: super stripes */
	struct range_set free;
	int item_dirty;      /* used changed or new: rewrite the block group item */
	int fst_dirty;       /* free space changed: rewrite its free space tree items */
	int is_new;          /* no block group item on disk yet */
	int ro;              /* being emptied (relocation): the allocator skips it */
	int degraded;        /* a stripe on a missing device: the allocator skips it */
	u64 row_bytes;       /* RAID5/6: bytes of data in one full stripe; 0: not RAID5/6 or not known yet */
};

/* May the allocator take space in @bg? */
static inline int extent_bg_allocatable(const struct block_group *bg)
{
	return !bg->ro && !bg->degraded;
}

struct delayed_ref {
	u64 bytenr, num_bytes;
	u64 root;            /* TREE_BLOCK_REF / EXTENT_DATA_REF owner root (0 if parent) */
	u64 parent;          /* SHARED_BLOCK_REF / SHARED_DATA_REF parent block, or 0 */
	u64 owner;           /* tree block: level; data: inode number */
	u64 offset;          /* data: file offset minus extent offset */
	int is_data;
	int delta;           /* references added (> 0) or dropped (< 0); 0: flags only */
	u64 set_flags;       /* extent item flags to set (BTRFS_BLOCK_FLAG_FULL_BACKREF) */
	u64 generation;      /* for a new extent item */
	struct btrfs_key first_key; /* tree blocks on non-skinny filesystems */
};

/*
 * Net change queued for one tree block, so a lookup made before the queue
 * runs sees the references and flags the extent tree will have after it.
 */
struct pending_meta {
	u64 bytenr;          /* 0: free slot */
	s64 delta;
	u64 set_flags;
};

struct dev_space {
	u64 devid;
	struct range_set free;       /* unallocated physical ranges */
	int no_alloc;                /* being removed: new chunks avoid it */
	u64 limit;                   /* being shrunk to this size: space past it stays out (0: none) */
};

struct extent_state {
	struct btrfs_volumes *vol;
	struct node_cache *cache;
	const struct blog *log;
	int skinny;                 /* SKINNY_METADATA: METADATA_ITEM keys */
	int mixed;                  /* MIXED_GROUPS: invariant 4 */
	struct tree_root *extent_root;
	struct tree_root *bg_root;  /* extent tree, or the block group tree */
	struct tree_root *fst_root; /* NULL without a free space tree */
	struct tree_root *csum_root;
	struct tree_root *chunk_root;
	struct tree_root *dev_root;
	struct dev_space *devspace;  /* per device: physical ranges still free */
	size_t ndevspace;

	struct block_group **bgs;   /* sorted by start */
	size_t nbgs;
	struct range_set pinned;    /* freed in the running transaction */

	struct delayed_ref *refs;   /* queued for the commit */
	size_t nrefs, refs_cap;
	struct pending_meta *pend;  /* tree blocks of refs[]: open addressing, power-of-2 size */
	size_t npend, pend_cap;
	u64 transid;
	u64 hint_meta, hint_data, hint_sys;
	/*
	 * RAID5/6 rows (full stripes) that held nothing durable when this
	 * transaction first wrote into them: the allocator may add to them until
	 * the commit or a log sync makes what they hold durable
	 * (extent_seal_rows()). See extent_alloc().
	 */
	struct range_set fresh_rows;
	/*
	 * New chunks start at or above this logical address: the end of the
	 * highest chunk ever removed, so a logical address is never reused
	 * (as the kernel never reuses one; stale cached blocks stay harmless).
	 */
	u64 logical_floor;
	/*
	 * Profile forced on new chunks and allocations of each kind while a
	 * balance converts (BTRFS_BLOCK_GROUP_* profile bits; AVAIL_ALLOC_BIT_SINGLE
	 * for single), 0: none. The allocator then skips groups of other profiles.
	 */
	u64 force_profile_data, force_profile_meta, force_profile_sys;
	/* While a shrink compacts: no new chunk larger than this (0: no cap). */
	u64 chunk_cap;
};

/* One reference of an extent as the extent tree holds it (inline or keyed). */
struct extent_ref {
	u8 type;             /* TREE_BLOCK_REF, EXTENT_DATA_REF, SHARED_BLOCK_REF, SHARED_DATA_REF */
	u64 root_or_parent;
	u64 owner, offset;   /* EXTENT_DATA_REF: inode, file offset minus extent offset */
	u32 count;
};

/* An extent item and every reference it carries (extent_get_refs()). */
struct extent_refs {
	u64 bytenr, num_bytes;
	u64 refs, generation, flags;
	int is_data;
	int level;                  /* tree blocks */
	struct btrfs_key first_key; /* tree blocks on non-skinny filesystems */
	struct extent_ref *r;
	size_t n;
};

int extent_state_init(struct extent_state *es, struct btrfs_volumes *vol,
		      struct node_cache *cache);
void extent_state_destroy(struct extent_state *es);

/* Add a block group (from its item, or new); free space starts empty. */
int extent_add_block_group(struct extent_state *es, u64 start, u64 length, u64 flags, u64 used,
			   int is_new, struct block_group **out);

/* The block group containing @logical, or NULL. */
struct block_group *extent_find_bg(const struct extent_state *es, u64 logical);

/*
 * Load block groups and free space from the trees of an existing filesystem:
 * block group items, then the free space tree, or failing that the extent
 * tree (free = group minus extents minus super stripes).
 */
int extent_load(struct extent_state *es);

/* Mark [start, start+len) of a block group as permanently unusable (super stripes). */
int extent_exclude_super_stripes(struct extent_state *es, struct block_group *bg);

/*
 * Allocate @len bytes in a block group of @type (BTRFS_BLOCK_GROUP_DATA,
 * METADATA or SYSTEM): a group whose flags hold that bit, so mixed groups
 * serve data and metadata. -ENOSPC when no such group has room.
 */
int extent_alloc(struct extent_state *es, u64 type, u64 len, u64 *logical);
/* What RAID5/6 rows hold is durable now (a commit or a log sync): no more writes go into them. */
void extent_seal_rows(struct extent_state *es);

/*
 * The extent item at @bytenr and all its references, inline and keyed, as the
 * extent tree holds them now (queued changes not applied). 0, 1 if there is
 * no extent item at @bytenr, -EUCLEAN for a malformed one. Free with
 * extent_refs_free().
 */
int extent_get_refs(struct extent_state *es, u64 bytenr, struct extent_refs *out);
void extent_refs_free(struct extent_refs *refs);

/* The profile bits new @type (DATA, METADATA, SYSTEM) allocations must use: forced, else 0 (any). */
u64 extent_forced_profile(const struct extent_state *es, u64 type);

/* An extent item as a range: what extent_list_range() gives. */
struct extent_span {
	u64 bytenr, num_bytes;
	int level;           /* tree block level; -1 for data */
};

/*
 * Every extent item (data and tree blocks) starting in [start, end) of the
 * extent tree as it is now, in order, into *out (*n entries; free() it).
 * 0, or -EUCLEAN for a short item, -ENOMEM.
 */
int extent_list_range(struct extent_state *es, u64 start, u64 end, struct extent_span **out,
		      size_t *n);

/* Queue a reference change; merged and applied by extent_run_delayed_refs(). */
int extent_queue_ref(struct extent_state *es, const struct delayed_ref *ref);

/*
 * References and flags of tree block @bytenr as they will be once the queue
 * has run (extent item plus queued changes). -EUCLEAN when it has none.
 */
int extent_lookup_info(struct extent_state *es, u64 bytenr, u64 *refs, u64 *flags);

/*
 * Add @delta to the reference every pointer of @node holds: child blocks of
 * an internal node, data extents of a leaf's file extent items. @full: the
 * references are shared ones naming @node as parent (FULL_BACKREF); else
 * keyed ones for tree @root_id (the owner of the node that points).
 */
int extent_node_refs(struct extent_state *es, const struct tree_node *node, u64 root_id, int full,
		     int delta);

/* Queue setting @flags (BTRFS_BLOCK_FLAG_FULL_BACKREF) on tree block @node's extent item. */
int extent_set_block_flags(struct extent_state *es, const struct tree_node *node, u64 flags);

/*
 * Tree block @orig of @root is being copied to @cow: queue the reference
 * changes that keep every pointee's references right (see backref.c).
 */
int extent_cow_refs(struct extent_state *es, struct tree_root *root, struct tree_node *orig,
		    struct tree_node *cow);

/* May blocks of tree @objectid be shared with other trees (subvolumes, snapshots)? */
int extent_tree_shareable(u64 objectid);

/* Apply every queued reference to the extent tree (may queue more: call until none). */
int extent_run_delayed_refs(struct extent_state *es, struct tree_trans *t);

/* Write changed block group items. */
int extent_write_block_groups(struct extent_state *es, struct tree_trans *t);

/* Rewrite the free space tree entries of changed block groups. */
int extent_write_free_space_tree(struct extent_state *es, struct tree_trans *t);

/* Is there anything left for the commit loop to do? */
int extent_commit_pending(const struct extent_state *es);

/* Pin [bytenr, bytenr+len): freed by this transaction, reusable after its commit. */
int extent_pin(struct extent_state *es, u64 bytenr, u64 len);

/* Delete the data checksums of [logical, logical+len). */
int extent_delete_csums(struct extent_state *es, struct tree_trans *t, u64 logical, u64 len);

/* After the superblocks are written: pinned ranges become free. */
int extent_unpin(struct extent_state *es);

/*
 * Record what of @bg is neither free nor used (its super stripes) while no
 * transaction runs: at load, after a commit's unpin, for a new chunk.
 */
void extent_note_unusable(struct block_group *bg);

/*
 * Bytes of @bg taken now: extents committed or allocated since (data
 * written but not committed yet), and extents freed but still pinned.
 */
u64 extent_bg_taken(const struct block_group *bg);

/* Sum of used bytes over all block groups (superblock bytes_used). */
u64 extent_bytes_used(const struct extent_state *es);

/* The tree-layer hooks (alloc/free/cow of tree blocks); arg is the extent_state. */
extern const struct tree_block_ops extent_tree_block_ops;

/* Insert data checksums for [logical, logical+len) from @csums (csum_size per sector). */
int extent_insert_csums(struct extent_state *es, struct tree_trans *t, u64 logical, u64 len,
			const u8 *csums);

/*
 * Set up per-device free space: [1 MiB, device size) minus @existing dev
 * extents (loaded from the dev tree when @load is set).
 */
int chunk_init_devspace(struct extent_state *es, int load);

/*
 * Create a chunk of @type (a BTRFS_BLOCK_GROUP_* type and profile) with
 * about @stripe_size bytes per device stripe: the chunk map, its block group
 * (free space minus super stripes), device space. On a filesystem with mixed
 * block groups a data or metadata chunk is made DATA|METADATA. Tree items
 * follow with chunk_insert_items(). Returns 0 with *logical, -ENOSPC, -EINVAL.
 */
int chunk_create(struct extent_state *es, u64 type, u64 stripe_size, u64 *logical);

/* Insert the chunk, dev extent and updated dev items of chunk @logical. */
int chunk_insert_items(struct extent_state *es, struct tree_trans *t, u64 logical);

/*
 * Change the size btrfs uses of device @devid to *size bytes (0: as small as
 * its allocated chunks allow), rounded down to the sector size; *size gets
 * the result. Shrinking below an allocated chunk is -ENOSPC (the caller
 * moves them first: ops_shrink_prepare()), growing past the device -EFBIG.
 */
int chunk_resize_device(struct extent_state *es, struct tree_trans *t, u64 devid, u64 *size);

/*
 * The size to ask of a new chunk that would like @want bytes: at most a
 * tenth of the filesystem (as the kernel sizes chunks), and never below
 * 16 MiB, so a small filesystem does not spend most of itself on one chunk.
 */
u64 chunk_max_size(const struct extent_state *es, u64 want);

/*
 * Bytes of device @devid that new chunks can still use: its free physical
 * ranges, each cut to the 1 MiB grid stripes are placed on (what statfs and
 * the space reservation count as unallocated). 0 for an unknown device.
 */
u64 chunk_usable_bytes(const struct extent_state *es, u64 devid);

/*
 * Make @dev (already in vol->devs, with devid, uuid and total_bytes set) a
 * member: its DEV_ITEM in the chunk tree, its free space for allocation, and
 * the superblock's device count and total size. The next commit writes the
 * superblocks to it too.
 */
int chunk_add_device(struct extent_state *es, struct tree_trans *t, const struct btrfs_device *dev);

/*
 * Remove chunk @logical, whose block group holds no extent any more: its
 * block group (item, free space tree entries, the in-memory group), chunk
 * item (and sys_chunk_array entry), dev extents and the dev items' bytes
 * used, and the chunk map. Its device space becomes usable only after the
 * commit (the committed state still maps the chunk there): its stripes are
 * appended to *freed (*nfreed entries, realloc'd) for chunk_release_devspace().
 */
struct chunk_freed {
	u64 devid, physical, length;
};
int chunk_remove(struct extent_state *es, struct tree_trans *t, u64 logical,
		 struct chunk_freed **freed, size_t *nfreed);
/* After the commit that removed chunks: their device space is free again. */
int chunk_release_devspace(struct extent_state *es, const struct chunk_freed *freed, size_t n);

/*
 * Take device @devid, which holds no chunk any more, out of the chunk and
 * dev trees (its DEV_ITEM and DEV_STATS item), the allocator and the
 * superblock's device count and size. The device record stays in vol.
 */
int chunk_remove_device(struct extent_state *es, struct tree_trans *t, u64 devid);

/* Delete every free space tree item of the group at [start, start + len). */
int extent_fst_drop_group(struct extent_state *es, struct tree_trans *t, u64 start, u64 len);

/* Hash of an EXTENT_DATA_REF (keyed item offset and inline order). */
u64 extent_data_ref_hash(u64 root, u64 owner, u64 offset);

#endif
