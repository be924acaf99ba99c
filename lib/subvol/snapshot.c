/*
 * snapshot.c — snapshots of a subvolume, and deleting subvolumes.
 *
 * A snapshot costs O(1): the running transaction is committed, the source
 * tree's root node is copied into a block owned by the new tree, and every
 * block that node points at gains a reference keyed by the new tree (see
 * lib/extent/backref.c). Both trees record the transaction in last_snapshot:
 * any block at or below that generation may now be shared, so the next
 * change to it goes through the shared-block copy rules. The snapshot is
 * committed at once, so no block of this transaction is shared while it is
 * still being changed in place.
 *
 * Deleting a subvolume runs in two commits, as the kernel does:
 *   1. unlink: its directory entry, ROOT_REF and ROOT_BACKREF go; its root
 *      item keeps refs 0 and BTRFS_ROOT_SUBVOL_DEAD; an ORPHAN_ITEM
 *      (ORPHAN_OBJECTID, ORPHAN_ITEM, id) in the root tree marks it for
 *      dropping. After this commit the subvolume is gone for users.
 *   2. drop: the tree is walked from its root; a block still referenced by
 *      another tree is left with one reference fewer, a block only this tree
 *      holds is descended into and freed, with the data references of its
 *      leaves. Then the root item and the orphan item go. This runs in one
 *      transaction; a crash in between leaves step 1's state, and the next
 *      read-write open drops every such orphan tree again from its root. A
 *      drop the kernel left half done (drop_progress, drop_level in the root
 *      item) goes on from where it stopped.
 * Before leaving a shared block, its part of the tree that was written by
 * the dying tree itself (generation newer than its creation) is converted to
 * full backrefs, so the trees still sharing it do not depend on keyed
 * references of a tree that no longer exists.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <uuid/uuid.h>

#include "subvol/subvol.h"

#define DROP_RUN_REFS 65536 /* apply queued references every so many while dropping */

int subvol_snapshot(struct butter_fs *fs, uint64_t src_id, butter_ino_t dir, const char *name,
		    size_t namelen, unsigned flags, uint64_t *out_id)
{
	struct fs_write_state *w;
	struct subvol *parent = NULL, *src, *sv = NULL;
	struct btrfs_root_item ri;
	struct btrfs_key key;
	struct tree_node *copy;
	u64 id, index, transid;
	int ret, err = 0;

	if (flags & ~BUTTER_SNAPSHOT_RDONLY)
		return -EINVAL;
	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	/* the snapshot holds what was written, buffered data too (lib/data/delalloc.c) */
	ret = data_flush_all_locked(fs);
	if (ret)
		return fs_end_change(w, ret, 1);
	src = fs_subvol_cached(fs, src_id, &err);
	if (!src)
		ret = err;
	if (ret == 0)
		ret = subvol_check_new(fs, dir, name, namelen, &parent, &id, &index);
	if (ret)
		return fs_end_change(w, ret, 0);
	/* the snapshot shows what is committed: commit what runs first */
	ret = txn_commit(&w->txn);
	if (ret == 0)
		ret = txn_begin(&w->txn);
	if (ret == 0)
		ret = fs_read_root_item(fs, src->id, &ri, NULL);
	if (ret)
		return fs_end_change(w, ret, 0);
	sv = calloc(1, sizeof(*sv));
	if (!sv)
		return fs_end_change(w, -ENOMEM, 0);
	transid = w->txn.tt.transid;
	sv->id = id;
	sv->dirid = src->dirid;
	sv->flags = (flags & BUTTER_SNAPSHOT_RDONLY) ? BTRFS_ROOT_SUBVOL_RDONLY : 0;

	/* phase 2: from here a failure aborts the transaction */
	ret = tree_cow_root_node(&w->txn.tt, &src->root);
	if (ret == 0)
		ret = txn_track_root(&w->txn, &src->root);
	if (ret == 0)
		ret = tree_copy_root(&w->txn.tt, &src->root, id, &sv->root, &copy);
	if (ret == 0) {
		ret = extent_node_refs(&w->es, copy, id, 0, 1);
		node_put(&fs->cache, copy);
	}
	if (ret) {
		free(sv);
		return fs_end_change(w, ret, 1);
	}
	src->root.last_snapshot = transid;
	src->root.dirty = 1;
	sv->root.last_snapshot = transid;
	sv->root.bytes_used = src->root.bytes_used;

	btrfs_set_root_bytenr(&ri, sv->root.bytenr);
	ri.level = sv->root.level;
	btrfs_set_root_generation(&ri, transid);
	btrfs_set_root_generation_v2(&ri, transid);
	btrfs_set_root_last_snapshot(&ri, transid);
	btrfs_set_root_bytes_used(&ri, sv->root.bytes_used);
	btrfs_set_root_refs(&ri, 1);
	btrfs_set_root_flags(&ri, sv->flags);
	btrfs_set_inode_flags(&ri.inode, btrfs_inode_flags(&ri.inode) | BTRFS_INODE_ROOT_ITEM_INIT);
	memset(&ri.drop_progress, 0, sizeof(ri.drop_progress));
	ri.drop_level = 0;
	memcpy(ri.parent_uuid, ri.uuid, BTRFS_UUID_SIZE);
	uuid_generate(ri.uuid);
	if (!(flags & BUTTER_SNAPSHOT_RDONLY)) {
		memset(ri.received_uuid, 0, BTRFS_UUID_SIZE);
		put_le64(&ri.stransid, 0);
		put_le64(&ri.rtransid, 0);
		memset(&ri.stime, 0, sizeof(ri.stime));
		memset(&ri.rtime, 0, sizeof(ri.rtime));
	}
	put_le64(&ri.otransid, transid);
	fs_now_ts(&ri.otime);
	/* a snapshot's root item key records when it was taken */
	key.objectid = id;
	key.type = BTRFS_ROOT_ITEM_KEY;
	key.offset = transid;
	ret = tree_insert_item(&w->txn.tt, &fs->root_tree, &key, &ri, sizeof(ri));
	if (ret == 0)
		ret = txn_track_root(&w->txn, &sv->root);
	if (ret == 0)
		ret = subvol_link(fs, parent, dir.ino, name, namelen, id, index);
	if (ret == 0)
		ret = subvol_uuid_tree_add(fs, ri.uuid, BTRFS_UUID_KEY_SUBVOL, id);
	if (ret == 0 && (flags & BUTTER_SNAPSHOT_RDONLY))
		ret = subvol_uuid_tree_add(fs, ri.received_uuid, BTRFS_UUID_KEY_RECEIVED_SUBVOL, id);
	if (ret == 0)
		ret = subvol_qgroup_create(fs, id, src->id);
	if (ret == 0)
		ret = subvol_add_record(fs, sv);
	if (ret) {
		txn_ctx_forget_root(&w->txn, &sv->root);
		free(sv);
		return fs_end_change(w, ret, 1);
	}
	/* nothing of this transaction may be changed in place once shared */
	ret = txn_commit(&w->txn);
	if (ret == 0 && out_id)
		*out_id = id;
	return fs_end_change(w, ret, 0);
}

/* ---- dropping a tree ---- */

struct drop_ctx {
	struct butter_fs *fs;
	struct extent_state *es;
	struct tree_trans *t;
	u64 root_id;
	u64 created;    /* the root item key offset: blocks newer were written by this tree */
	int root_self_ref; /* a relocation tree: its root block's reference names itself as parent */
};

static int apply_refs_if_many(struct drop_ctx *d)
{
	if (d->es->nrefs < DROP_RUN_REFS)
		return 0;
	return extent_run_delayed_refs(d->es, d->t);
}

/*
 * @node (shared, owned by the dying tree) and the blocks below it written by
 * this tree: make their pointees' references full backrefs.
 */
static int convert_to_full_backref(struct drop_ctx *d, struct tree_node *node)
{
	u64 refs, flags;
	u32 slot;
	int ret;

	if (node->owner != d->root_id)
		return 0;
	ret = extent_lookup_info(d->es, node->bytenr, &refs, &flags);
	if (ret)
		return ret;
	if (!(flags & BTRFS_BLOCK_FLAG_FULL_BACKREF)) {
		ret = extent_node_refs(d->es, node, 0, 1, 1);
		if (ret == 0)
			ret = extent_node_refs(d->es, node, node->owner, 0, -1);
		if (ret == 0)
			ret = extent_set_block_flags(d->es, node, BTRFS_BLOCK_FLAG_FULL_BACKREF);
		if (ret)
			return ret;
	}
	for (slot = 0; node->level > 0 && slot < node->nritems; slot++) {
		struct tree_node *child;

		if (get_le64(&node_key_ptr(node, slot)->generation) <= d->created)
			continue;
		ret = node_read_child(&d->fs->cache, node, slot, &child);
		if (ret)
			return ret;
		ret = convert_to_full_backref(d, child);
		node_put(&d->fs->cache, child);
		if (ret)
			return ret;
	}
	return apply_refs_if_many(d);
}

/* Drop our reference to @node, held by @parent (NULL: the root item). */
static int drop_own_ref(struct drop_ctx *d, const struct tree_node *node,
			const struct tree_node *parent, u64 parent_flags)
{
	struct delayed_ref ref;

	memset(&ref, 0, sizeof(ref));
	ref.bytenr = node->bytenr;
	ref.num_bytes = d->es->vol->nodesize;
	ref.owner = node->level;
	ref.delta = -1;
	if (node->nritems)
		node_key(node, 0, &ref.first_key);
	if (parent && (parent_flags & BTRFS_BLOCK_FLAG_FULL_BACKREF))
		ref.parent = parent->bytenr;
	else if (!parent && d->root_self_ref)
		ref.parent = node->bytenr;
	else
		ref.root = parent ? parent->owner : d->root_id;
	return extent_queue_ref(d->es, &ref);
}

static int drop_block(struct drop_ctx *d, struct tree_node *node, const struct tree_node *parent,
		      u64 parent_flags);

/* Drop the children of @node (its extent flags: @flags) from @slot to the last. */
static int drop_children(struct drop_ctx *d, struct tree_node *node, u64 flags, u32 slot)
{
	int ret = 0;

	for (; slot < node->nritems && ret == 0; slot++) {
		struct tree_node *child;

		ret = node_read_child(&d->fs->cache, node, slot, &child);
		if (ret)
			break;
		ret = drop_block(d, child, node, flags);
		node_put(&d->fs->cache, child);
	}
	return ret;
}

/*
 * Drop the reference @parent (NULL: the root item) holds to @node, first
 * dropping everything below @node when that reference is its last.
 */
static int drop_block(struct drop_ctx *d, struct tree_node *node, const struct tree_node *parent,
		      u64 parent_flags)
{
	u64 refs, flags;
	int ret;

	ret = extent_lookup_info(d->es, node->bytenr, &refs, &flags);
	if (ret)
		return ret;
	if (refs > 1) {
		/*
		 * Even when @node has full backrefs already (a drop that stopped
		 * half way), blocks below it may not have them yet.
		 */
		if (parent && node->generation > d->created &&
		    !(node->level == 0 && (flags & BTRFS_BLOCK_FLAG_FULL_BACKREF)))
			ret = convert_to_full_backref(d, node);
	} else if (node->level > 0) {
		ret = drop_children(d, node, flags, 0);
	} else if (flags & BTRFS_BLOCK_FLAG_FULL_BACKREF) {
		ret = extent_node_refs(d->es, node, 0, 1, -1);
	} else {
		ret = extent_node_refs(d->es, node, node->owner, 0, -1);
	}
	if (ret)
		return ret;
	ret = drop_own_ref(d, node, parent, parent_flags);
	if (ret == 0)
		ret = apply_refs_if_many(d);
	return ret;
}

/*
 * Go on with a drop another run left at @key on level @drop_level (the
 * root item's drop_progress and drop_level, as the kernel records them):
 * on the path to @key, children left of it are gone already; at
 * @drop_level the child at @key is the first not yet dropped, above it the
 * child holding @key was partly dropped.
 */
static int drop_resume(struct drop_ctx *d, struct tree_node *node, const struct tree_node *parent,
		       u64 parent_flags, const struct btrfs_key *key, int drop_level)
{
	u64 refs, flags;
	u32 slot;
	int ret;

	if (node->level < drop_level || node->level == 0)
		return BLOG_CORRUPT(&d->fs->log, "subvolume %llu: drop level %d below node %llu",
				    (unsigned long long)d->root_id, drop_level,
				    (unsigned long long)node->bytenr);
	ret = extent_lookup_info(d->es, node->bytenr, &refs, &flags);
	if (ret)
		return ret;
	if (node_bin_search(node, key, &slot) == 1 && slot > 0)
		slot--;
	if (node->level > drop_level) {
		struct tree_node *child;

		ret = node_read_child(&d->fs->cache, node, slot, &child);
		if (ret)
			return ret;
		ret = drop_resume(d, child, node, flags, key, drop_level);
		node_put(&d->fs->cache, child);
		slot++;
	}
	if (ret == 0)
		ret = drop_children(d, node, flags, slot);
	if (ret == 0)
		ret = drop_own_ref(d, node, parent, parent_flags);
	return ret;
}

static int delete_root_item(struct butter_fs *fs, const struct btrfs_key *key)
{
	struct tree_trans *t = &fs->w->txn.tt;
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(t, &fs->root_tree, key, &path, 0, 1);
	if (ret == 0)
		ret = tree_del_items(t, &fs->root_tree, &path, 1);
	else if (ret == 1)
		ret = BLOG_CORRUPT(&fs->log, "root tree: item (%llu %u %llu) vanished",
				   (unsigned long long)key->objectid, key->type,
				   (unsigned long long)key->offset);
	tree_path_release(&fs->cache, &path);
	return ret;
}

/*
 * Free tree @id (unlinked, refs 0) and its root and orphan items, in the
 * running transaction (phase 2: a failure leaves it to be aborted).
 */
static int drop_tree(struct butter_fs *fs, u64 id)
{
	struct fs_write_state *w = fs->w;
	struct btrfs_root_item ri;
	struct btrfs_key key;
	struct drop_ctx d = { fs, &w->es, &w->txn.tt, id, 0, 0 };
	struct btrfs_key progress;
	struct tree_node *root;
	int ret;

	ret = fs_read_root_item(fs, id, &ri, &key);
	if (ret)
		return ret;
	d.created = key.offset;
	if (ri.level >= BTRFS_MAX_LEVEL)
		return BLOG_CORRUPT(&fs->log, "subvolume %llu: root level %u", (unsigned long long)id,
				    ri.level);
	ret = node_read(&fs->cache, btrfs_root_bytenr(&ri), btrfs_root_generation(&ri), ri.level,
			NULL, &root);
	if (ret)
		return ret;
	btrfs_disk_to_cpu_key(&progress, &ri.drop_progress);
	if (ri.drop_level || progress.objectid || progress.type || progress.offset)
		ret = drop_resume(&d, root, NULL, 0, &progress, ri.drop_level);
	else
		ret = drop_block(&d, root, NULL, 0);
	node_put(&fs->cache, root);
	if (ret == 0)
		ret = delete_root_item(fs, &key);
	if (ret == 0) {
		key.objectid = BTRFS_ORPHAN_OBJECTID;
		key.type = BTRFS_ORPHAN_ITEM_KEY;
		key.offset = id;
		ret = delete_root_item(fs, &key);
	}
	if (ret == 0)
		ret = subvol_qgroup_remove(fs, id);
	return ret;
}

/* Does subvolume @id contain other subvolumes (ROOT_REF items of its own)? */
static int has_child_subvols(struct butter_fs *fs, u64 id)
{
	struct btrfs_key key = { id, BTRFS_ROOT_REF_KEY, 0 };
	int ret = tree_find_key(&fs->cache, &fs->root_tree, &key, 0, &key);

	if (ret < 0)
		return ret;
	return ret == 0 && key.objectid == id && key.type == BTRFS_ROOT_REF_KEY;
}

/* Unlink subvolume @sv (named @name in @dir of @parent): step 1 of a deletion. */
static int unlink_subvol(struct butter_fs *fs, struct subvol *parent, u64 dir, const char *name,
			 size_t namelen, struct subvol *sv)
{
	struct tree_trans *t = &fs->w->txn.tt;
	struct btrfs_key key = { parent->id, BTRFS_ROOT_REF_KEY, sv->id };
	u8 uuid[BTRFS_UUID_SIZE], received[BTRFS_UUID_SIZE];
	struct btrfs_root_ref rr;
	struct tree_path path;
	u64 index;
	int ret;

	ret = tree_lookup_item(&fs->cache, &fs->root_tree, &key, &rr, sizeof(rr));
	if (ret >= 0 && (size_t)ret < sizeof(rr))
		ret = BLOG_CORRUPT(&fs->log, "root ref %llu -> %llu: short",
				   (unsigned long long)parent->id, (unsigned long long)sv->id);
	if (ret < 0)
		return ret == -ENOENT ? BLOG_CORRUPT(&fs->log, "subvolume %llu: no root ref",
						     (unsigned long long)sv->id)
				      : ret;
	index = btrfs_root_ref_sequence(&rr);
	ret = inode_remove_dir_entry(fs, parent, dir, name, namelen, index);
	if (ret == 0)
		ret = delete_root_item(fs, &key);
	if (ret == 0) {
		key.objectid = sv->id;
		key.type = BTRFS_ROOT_BACKREF_KEY;
		key.offset = parent->id;
		ret = delete_root_item(fs, &key);
	}
	if (ret)
		return ret;
	/* refs 0 and DEAD in its root item, an orphan item to find it by */
	key.objectid = sv->id;
	key.type = BTRFS_ROOT_ITEM_KEY;
	key.offset = 0;
	ret = tree_find_key(&fs->cache, &fs->root_tree, &key, 0, &key);
	if (ret == 0 && (key.objectid != sv->id || key.type != BTRFS_ROOT_ITEM_KEY))
		ret = 1;
	if (ret == 1)
		ret = BLOG_CORRUPT(&fs->log, "subvolume %llu: no root item",
				   (unsigned long long)sv->id);
	if (ret)
		return ret;
	tree_path_init(&path);
	ret = tree_search_slot(t, &fs->root_tree, &key, &path, 0, 1);
	if (ret == 0) {
		u32 size;
		struct btrfs_root_item *ri = (void *)path_item_mut(&path, &size);

		if (size < BTRFS_ROOT_ITEM_V1_SIZE) {
			ret = BLOG_CORRUPT(&fs->log, "root item of %llu: short",
					   (unsigned long long)sv->id);
		} else {
			memcpy(uuid, ri->uuid, BTRFS_UUID_SIZE);
			memcpy(received, ri->received_uuid, BTRFS_UUID_SIZE);
			if (size < sizeof(*ri)) {
				memset(uuid, 0, BTRFS_UUID_SIZE);
				memset(received, 0, BTRFS_UUID_SIZE);
			}
			btrfs_set_root_refs(ri, 0);
			btrfs_set_root_flags(ri, btrfs_root_flags(ri) | BTRFS_ROOT_SUBVOL_DEAD);
			memset(&ri->drop_progress, 0, sizeof(ri->drop_progress));
			ri->drop_level = 0;
		}
	} else if (ret == 1) {
		ret = -EUCLEAN;
	}
	tree_path_release(&fs->cache, &path);
	if (ret == 0) {
		key.objectid = BTRFS_ORPHAN_OBJECTID;
		key.type = BTRFS_ORPHAN_ITEM_KEY;
		key.offset = sv->id;
		ret = tree_insert_item(t, &fs->root_tree, &key, NULL, 0);
	}
	if (ret == 0)
		ret = subvol_uuid_tree_remove(fs, uuid, BTRFS_UUID_KEY_SUBVOL, sv->id);
	if (ret == 0)
		ret = subvol_uuid_tree_remove(fs, received, BTRFS_UUID_KEY_RECEIVED_SUBVOL, sv->id);
	return ret;
}

int subvol_delete(struct butter_fs *fs, butter_ino_t dir, const char *name,
		  size_t namelen)
{
	struct fs_write_state *w;
	struct subvol *parent, *sv = NULL;
	butter_ino_t target;
	u64 id;
	int ret, err = 0;

	if ((namelen == 1 && name[0] == '.') || (namelen == 2 && !memcmp(name, "..", 2)))
		return -EINVAL;
	ret = fs_begin_change_rsv(fs, &w, 0, 1);
	if (ret)
		return ret;
	/* no buffered data may outlive its subvolume (lib/data/delalloc.c) */
	ret = data_flush_all_locked(fs);
	if (ret)
		return fs_end_change(w, ret, 1);
	ret = inode_lookup(fs, dir, name, namelen, &target);
	if (ret == 0 && (target.subvol == dir.subvol || target.ino != BTRFS_FIRST_FREE_OBJECTID))
		ret = -EINVAL; /* not a subvolume root (or a placeholder: not ours) */
	id = target.subvol;
	parent = ret == 0 ? fs_subvol_mut(fs, dir.subvol, &err) : NULL;
	if (ret == 0 && !parent)
		ret = err;
	if (ret == 0 && !(sv = fs_subvol_cached(fs, id, &err)))
		ret = err;
	if (ret == 0 && (id == fs->default_subvol || id == BTRFS_FS_TREE_OBJECTID))
		ret = -EPERM;
	if (ret == 0) {
		ret = has_child_subvols(fs, id);
		ret = ret < 0 ? ret : ret ? -ENOTEMPTY : 0;
	}
	/* the tree to drop must be the committed one: commit what runs first */
	if (ret == 0)
		ret = txn_commit(&w->txn);
	if (ret == 0)
		ret = txn_begin(&w->txn);
	if (ret)
		return fs_end_change(w, ret, 0);
	/* step 1: unlink, committed */
	ret = unlink_subvol(fs, parent, dir.ino, name, namelen, sv);
	if (ret)
		return fs_end_change(w, ret, 1);
	txn_ctx_forget_root(&w->txn, &sv->root);
	pthread_mutex_lock(&fs->subvol_lock);
	sv->deleted = 1;
	pthread_mutex_unlock(&fs->subvol_lock);
	ret = txn_commit(&w->txn);
	if (ret == 0)
		ret = txn_begin(&w->txn);
	if (ret)
		return fs_end_change(w, ret, 0);
	/* step 2: drop the tree */
	ret = drop_tree(fs, id);
	if (ret == 0)
		ret = txn_commit(&w->txn);
	return fs_end_change(w, ret, 1);
}

int subvol_drop_orphans(struct butter_fs *fs)
{
	struct btrfs_key key = { BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, 0 };
	struct fs_write_state *w;
	int ret, dropped = 0;

	for (;;) {
		struct btrfs_root_item ri;
		u64 id;

		ret = tree_find_key(&fs->cache, &fs->root_tree, &key, 0, &key);
		if (ret < 0)
			return ret;
		if (ret == 1 || key.objectid != BTRFS_ORPHAN_OBJECTID ||
		    key.type != BTRFS_ORPHAN_ITEM_KEY)
			break;
		id = key.offset;
		key.offset++;
		ret = fs_read_root_item(fs, id, &ri, NULL);
		if (ret == -ENOENT)
			continue;
		if (ret)
			return ret;
		if (btrfs_root_refs(&ri) != 0)
			continue;
		ret = fs_begin_change_rsv(fs, &w, 0, 1);
		if (ret)
			return ret;
		blog_info(&fs->log, "dropping deleted subvolume %llu", (unsigned long long)id);
		ret = drop_tree(fs, id);
		if (ret == 0)
			ret = txn_commit(&w->txn);
		ret = fs_end_change(w, ret, 1);
		if (ret)
			return ret;
		dropped++;
	}
	return dropped;
}

/*
 * Relocation trees a kernel balance left behind when it was cut (a crash, or
 * an unmount in the middle of a block group): as the kernel's recovery ends
 * in dropping them, butter drops them at once instead of merging first.
 * This is safe because everything they hold is counted in the extent tree
 * like any snapshot's blocks: a tree whose merge is done (refs 0) goes on
 * from its drop_progress; one not yet merged (refs 1, no progress) is
 * dropped whole, and the subvolume keeps the blocks it points at (those in
 * the group being moved stay valid until that group is moved again, by the
 * recorded balance that butter or the kernel resumes). One merged in part
 * (refs 1 with a progress key: the kernel swaps subtrees as it merges) is
 * left alone: the kernel's next mount finishes it; butter's relocation
 * refuses to run meanwhile (lib/ops/relocate.c). Each tree goes in a commit
 * of its own. Returns the number dropped, or a negative errno.
 */
int subvol_drop_reloc_trees(struct butter_fs *fs)
{
	struct btrfs_key key = { BTRFS_TREE_RELOC_OBJECTID, BTRFS_ROOT_ITEM_KEY, 0 };
	struct fs_write_state *w;
	int ret, dropped = 0;

	for (;;) {
		struct btrfs_root_item ri;
		struct btrfs_key progress;
		struct tree_node *root;
		struct drop_ctx d;
		int partial;

		memset(&ri, 0, sizeof(ri));
		ret = tree_find_key(&fs->cache, &fs->root_tree, &key, 0, &key);
		if (ret < 0)
			return ret;
		if (ret == 1 || key.objectid != BTRFS_TREE_RELOC_OBJECTID ||
		    key.type != BTRFS_ROOT_ITEM_KEY)
			break;
		ret = tree_lookup_item(&fs->cache, &fs->root_tree, &key, &ri, sizeof(ri));
		if (ret < 0)
			return ret;
		if ((size_t)ret < offsetof(struct btrfs_root_item, drop_level) + sizeof(ri.drop_level))
			return BLOG_CORRUPT(&fs->log, "relocation tree of %llu: root item of %d bytes",
					    (unsigned long long)key.offset, ret);
		btrfs_disk_to_cpu_key(&progress, &ri.drop_progress);
		partial = ri.drop_level || progress.objectid || progress.type || progress.offset;
		if (btrfs_root_refs(&ri) != 0 && partial) {
			blog_warn(&fs->log, "the relocation tree of subvolume %llu is merged in part by an "
					    "interrupted kernel balance; left for the kernel to finish",
				  (unsigned long long)key.offset);
			key.offset++;
			continue;
		}
		if (ri.level >= BTRFS_MAX_LEVEL)
			return BLOG_CORRUPT(&fs->log, "relocation tree of %llu: root level %u",
					    (unsigned long long)key.offset, ri.level);
		ret = fs_begin_change_rsv(fs, &w, 0, 1);
		if (ret)
			return ret;
		blog_info(&fs->log, "dropping the relocation tree of subvolume %llu, left by an "
				    "interrupted kernel balance", (unsigned long long)key.offset);
		memset(&d, 0, sizeof(d));
		d.fs = fs;
		d.es = &w->es;
		d.t = &w->txn.tt;
		d.root_id = BTRFS_TREE_RELOC_OBJECTID;
		d.created = UINT64_MAX; /* its own blocks carry full backrefs already */
		d.root_self_ref = 1;
		ret = node_read(&fs->cache, btrfs_root_bytenr(&ri), btrfs_root_generation(&ri), ri.level,
				NULL, &root);
		if (ret == 0) {
			if (partial)
				ret = drop_resume(&d, root, NULL, 0, &progress, ri.drop_level);
			else
				ret = drop_block(&d, root, NULL, 0);
			node_put(&fs->cache, root);
		}
		if (ret == 0)
			ret = delete_root_item(fs, &key);
		if (ret == 0)
			ret = txn_commit(&w->txn);
		ret = fs_end_change(w, ret, 1);
		if (ret)
			return ret;
		dropped++;
		key.offset++;
	}
	return dropped;
}
