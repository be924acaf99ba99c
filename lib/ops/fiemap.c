/*
 * fiemap.c — butter_file_extents(): where a file's data lies and whether
 * anything else uses it, as the kernel's FIEMAP answers on btrfs (what
 * `btrfs filesystem du` counts as shared and exclusive).
 *
 * Each EXTENT_DATA item of the file is one extent. It is shared when the
 * data extent has a reference from another subvolume or another inode
 * (reflinks, snapshots whose leaves were copied since) or from a leaf other
 * than the one holding this item (a snapshot's copy), or when a tree block
 * between the subvolume's root and the file's item counts more than one
 * reference (a snapshot still sharing that part of the tree). References
 * of the same inode at other file offsets (an extent split by a hole punched
 * in it) do not make it shared, as the kernel's FIEMAP says. The root node
 * never counts: each tree has its own. The references are those of the
 * extent tree as it is: on a writable handle, the ones queued for the next
 * commit are not in it yet.
 */
#include <errno.h>
#include <string.h>

#include "ops/ops.h"

/* The reference count of the extent item at @bytenr (a tree block); 0 if there is none. */
static int extent_refs_at(struct butter_fs *fs, u64 bytenr, u64 *refs)
{
	struct btrfs_key key = { bytenr, BTRFS_EXTENT_ITEM_KEY, 0 };
	struct tree_path path;
	const u8 *item;
	u32 size;
	int ret;

	*refs = 0;
	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &fs->extent_tree, &key, &path);
	if (ret == 0) {
		path_key(&path, &key);
		item = path_item(&path, &size);
		if (key.objectid == bytenr &&
		    (key.type == BTRFS_EXTENT_ITEM_KEY || key.type == BTRFS_METADATA_ITEM_KEY)) {
			if (size < sizeof(struct btrfs_extent_item))
				ret = BLOG_CORRUPT(&fs->log, "extent item %llu: %u bytes",
						   (unsigned long long)bytenr, size);
			else
				*refs = btrfs_extent_refs((const struct btrfs_extent_item *)item);
		}
	}
	tree_path_release(&fs->cache, &path);
	return ret < 0 ? ret : 0;
}

/*
 * Whether data extent @bytenr has a reference other than inode @ino of
 * @subvol's own (through @leaf, for a reference naming its parent leaf).
 */
static int data_shared(struct butter_fs *fs, u64 bytenr, butter_ino_t ino, u64 leaf)
{
	/* the reading half of the extent layer needs only the trees and the log */
	struct extent_state es = {
		.vol = &fs->vol, .cache = &fs->cache, .log = &fs->log,
		.extent_root = &fs->extent_tree,
	};
	struct extent_refs refs;
	int ret = extent_get_refs(&es, bytenr, &refs), shared = 0;

	if (ret)
		return ret == 1 ? 0 : ret;
	for (size_t i = 0; i < refs.n && !shared; i++) {
		const struct extent_ref *r = &refs.r[i];

		if (r->type == BTRFS_EXTENT_DATA_REF_KEY)
			shared = r->root_or_parent != ino.subvol || r->owner != ino.ino;
		else
			shared = r->root_or_parent != leaf; /* a shared reference naming another leaf */
	}
	extent_refs_free(&refs);
	return shared;
}

/*
 * Whether a block on @path below the root is shared. The answer for the
 * leaf's path is kept in *@memo_leaf / *@memo_shared: a leaf's items share it.
 */
static int path_shared(struct butter_fs *fs, const struct tree_root *root,
		       const struct tree_path *path, u64 *memo_leaf, int *memo_shared)
{
	u64 refs;
	int ret;

	if (path->nodes[0]->bytenr == *memo_leaf)
		return *memo_shared;
	*memo_shared = 0;
	for (int level = 0; level < root->level; level++) {
		ret = extent_refs_at(fs, path->nodes[level]->bytenr, &refs);
		if (ret)
			return ret;
		if (refs > 1) {
			*memo_shared = 1;
			break;
		}
	}
	*memo_leaf = path->nodes[0]->bytenr;
	return *memo_shared;
}

int ops_file_extents(struct butter_fs *fs, butter_ino_t ino, uint64_t start,
		     struct butter_file_extent *out, size_t n, size_t *got)
{
	struct btrfs_key key = { ino.ino, BTRFS_EXTENT_DATA_KEY, 0 };
	struct butter_file_extent *last = NULL;
	u64 memo_leaf = 0;
	int memo_shared = 0, ret;
	struct tree_path path;
	struct subvol *sv;

	*got = 0;
	sv = fs_subvol_cached(fs, ino.subvol, &ret);
	if (!sv)
		return ret;
	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &sv->root, &key, &path);
	while (ret == 0) {
		const struct btrfs_file_extent_item *fi;
		struct butter_file_extent e = { 0 };
		u64 bytenr;
		u32 size;
		int shared;

		path_key(&path, &key);
		if (key.objectid != ino.ino || key.type != BTRFS_EXTENT_DATA_KEY)
			break;
		fi = (const void *)path_item(&path, &size);
		if (size < BTRFS_FILE_EXTENT_INLINE_DATA_START ||
		    (fi->type != BTRFS_FILE_EXTENT_INLINE && size < sizeof(*fi))) {
			ret = BLOG_CORRUPT(&fs->log, "subvolume %llu inode %llu: file extent item at %llu: %u bytes",
					   (unsigned long long)ino.subvol, (unsigned long long)ino.ino,
					   (unsigned long long)key.offset, size);
			break;
		}
		e.logical = key.offset;
		if (fi->type == BTRFS_FILE_EXTENT_INLINE) {
			e.length = btrfs_file_extent_ram_bytes(fi);
			e.flags = BUTTER_EXTENT_INLINE;
		} else {
			bytenr = btrfs_file_extent_disk_bytenr(fi);
			e.length = btrfs_file_extent_num_bytes(fi);
			if (!bytenr)
				goto next; /* a hole */
			e.physical = fi->compression ? bytenr : bytenr + btrfs_file_extent_offset(fi);
			if (fi->compression)
				e.flags |= BUTTER_EXTENT_ENCODED;
			if (fi->type == BTRFS_FILE_EXTENT_PREALLOC)
				e.flags |= BUTTER_EXTENT_PREALLOC;
			shared = data_shared(fs, bytenr, ino, path.nodes[0]->bytenr);
			if (shared == 0)
				shared = path_shared(fs, &sv->root, &path, &memo_leaf, &memo_shared);
			if (shared < 0) {
				ret = shared;
				break;
			}
			if (shared)
				e.flags |= BUTTER_EXTENT_SHARED;
		}
		if (start && e.logical + e.length <= start)
			goto next;
		if (*got == n)
			break; /* full: the caller asks again from past the last one */
		out[*got] = e;
		last = &out[(*got)++];
next:
		ret = tree_next_item(&fs->cache, &path);
	}
	if (ret == 1 || (ret == 0 && (key.objectid != ino.ino || key.type != BTRFS_EXTENT_DATA_KEY))) {
		/* the walk left the file's items: what came last is the file's last */
		if (last)
			last->flags |= BUTTER_EXTENT_LAST;
		ret = 0;
	}
	tree_path_release(&fs->cache, &path);
	return ret < 0 ? ret : 0;
}
