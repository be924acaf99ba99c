/*
 * replay_check.c — step 0 of a log replay (replay.c): before anything is
 * replayed, walk every block of the log root tree and of each log tree,
 * check each item the way the replay will use it, pin the log's blocks and
 * take the data extents the log names (written after the last commit, so
 * without extent items) out of free space, so nothing the replay allocates
 * can land on them. A log that cannot be replayed exactly is refused here,
 * before any change.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "treelog/replay.h"

/* Does any extent item of the extent tree overlap [start, start + len)? Its key in *found. */
static int extent_overlap(struct butter_fs *fs, u64 start, u64 len, struct btrfs_key *found)
{
	struct btrfs_key key = { start + len - 1, (u8)-1, (u64)-1 };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_backward(&fs->cache, &fs->extent_tree, &key, &path);
	while (ret == 0) {
		u64 end;

		path_key(&path, &key);
		if (key.type == BTRFS_EXTENT_ITEM_KEY || key.type == BTRFS_METADATA_ITEM_KEY) {
			end = key.objectid + (key.type == BTRFS_EXTENT_ITEM_KEY ? key.offset
									: fs->vol.nodesize);
			ret = end > start;
			*found = key;
			break;
		}
		if (key.type == BTRFS_BLOCK_GROUP_ITEM_KEY && key.objectid < start) {
			ret = 0;
			break;
		}
		ret = tree_prev_item(&fs->cache, &path);
		if (ret == 1)
			ret = 0;
		else if (ret == 0)
			continue;
		break;
	}
	tree_path_release(&fs->cache, &path);
	return ret;
}

/* Take the log tree block at @bytenr out of free space until after the commit. */
static int pin_log_block(struct butter_fs *fs, u64 bytenr)
{
	struct extent_state *es = &fs->w->es;
	struct block_group *bg = extent_find_bg(es, bytenr);
	u64 len = fs->vol.nodesize;
	struct btrfs_key found;
	int ret;

	if (!bg || !(bg->flags & BTRFS_BLOCK_GROUP_METADATA) ||
	    bytenr + len > bg->start + bg->length)
		return tlog_refuse(fs, "a log tree block lies outside the metadata block groups", NULL);
	ret = extent_overlap(fs, bytenr, len, &found);
	if (ret < 0)
		return ret;
	if (ret)
		return tlog_refuse(fs, "a log tree block overlaps an allocated extent", &found);
	ret = range_remove(&bg->free, bytenr, bytenr + len);
	if (ret == 0)
		ret = extent_pin(es, bytenr, len);
	return ret;
}

/* Check one logged item before anything changes. */
static int check_log_item(struct butter_fs *fs, struct excluded *ex, const struct btrfs_key *key,
			  const u8 *p, u32 size)
{
	/*
	 * Items of an inode follow its inode item; the kernel's replay relies on
	 * that to skip inodes logged without links, and so does ours.
	 */
	if (key->type != BTRFS_INODE_ITEM_KEY && key->objectid != BTRFS_EXTENT_CSUM_OBJECTID &&
	    key->objectid != ex->cur_inode)
		return tlog_refuse(fs, "items of an inode whose inode item is not logged", key);
	switch (key->type) {
	case BTRFS_INODE_ITEM_KEY:
		if (size < sizeof(struct btrfs_inode_item))
			return BLOG_CORRUPT(&fs->log, "log: short inode item %llu",
					    (unsigned long long)key->objectid);
		ex->cur_inode = key->objectid;
		return 0;
	case BTRFS_INODE_REF_KEY:
	case BTRFS_INODE_EXTREF_KEY: {
		u32 pos = 0;

		while (pos < size) {
			u32 l = inode_ref_entry_len(key->type, p + pos, size - pos);

			if (!l || l - (key->type == BTRFS_INODE_REF_KEY
					       ? sizeof(struct btrfs_inode_ref)
					       : sizeof(struct btrfs_inode_extref)) > BTRFS_NAME_LEN)
				return BLOG_CORRUPT(&fs->log, "log: malformed ref of %llu",
						    (unsigned long long)key->objectid);
			pos += l;
		}
		return 0;
	}
	case BTRFS_XATTR_ITEM_KEY: {
		u32 pos = 0;

		while (pos < size) {
			u32 l = inode_dir_entry_len(p + pos, size - pos);

			if (!l)
				return BLOG_CORRUPT(&fs->log, "log: malformed xattr of %llu",
						    (unsigned long long)key->objectid);
			pos += l;
		}
		return 0;
	}
	case BTRFS_DIR_INDEX_KEY: {
		const struct btrfs_dir_item *di = (const void *)p;
		struct btrfs_key loc;

		if (inode_dir_entry_len(p, size) != size || btrfs_dir_name_len(di) > BTRFS_NAME_LEN ||
		    btrfs_dir_data_len(di))
			return BLOG_CORRUPT(&fs->log, "log: malformed dir index of %llu",
					    (unsigned long long)key->objectid);
		btrfs_disk_to_cpu_key(&loc, &di->location);
		if (loc.type != BTRFS_INODE_ITEM_KEY)
			return tlog_refuse(fs, "the log names a subvolume in a directory", key);
		return 0;
	}
	case BTRFS_DIR_LOG_INDEX_KEY:
		if (size < 8)
			return BLOG_CORRUPT(&fs->log, "log: short dir log item of %llu",
					    (unsigned long long)key->objectid);
		return 0;
	case BTRFS_EXTENT_CSUM_KEY:
		if (key->objectid != BTRFS_EXTENT_CSUM_OBJECTID || size % fs->vol.csum_size)
			return BLOG_CORRUPT(&fs->log, "log: malformed csum item");
		return 0;
	case BTRFS_EXTENT_DATA_KEY: {
		const struct btrfs_file_extent_item *fi = (const void *)p;
		struct extent_state *es = &fs->w->es;
		u64 disk, len;
		struct block_group *bg;
		struct btrfs_key found;
		int ret;

		if (size < BTRFS_FILE_EXTENT_INLINE_DATA_START)
			return BLOG_CORRUPT(&fs->log, "log: short extent of %llu",
					    (unsigned long long)key->objectid);
		if (fi->encryption || btrfs_file_extent_other_encoding(fi) ||
		    fi->compression > BTRFS_COMPRESS_ZSTD)
			return tlog_refuse(fs, "a logged extent has an unknown encoding", key);
		if (fi->type == BTRFS_FILE_EXTENT_INLINE)
			return key->offset ? tlog_refuse(fs, "an inline extent past offset 0", key) : 0;
		if (fi->type != BTRFS_FILE_EXTENT_REG && fi->type != BTRFS_FILE_EXTENT_PREALLOC)
			return tlog_refuse(fs, "a logged extent of unknown type", key);
		if (size < sizeof(*fi))
			return BLOG_CORRUPT(&fs->log, "log: short extent of %llu",
					    (unsigned long long)key->objectid);
		disk = btrfs_file_extent_disk_bytenr(fi);
		len = btrfs_file_extent_disk_num_bytes(fi);
		if (key->offset % fs->vol.sectorsize ||
		    btrfs_file_extent_num_bytes(fi) % fs->vol.sectorsize)
			return tlog_refuse(fs, "a logged extent is not sector aligned", key);
		if (!disk)
			return 0;
		bg = extent_find_bg(es, disk);
		if (!len || len % fs->vol.sectorsize || disk % fs->vol.sectorsize || !bg ||
		    !(bg->flags & BTRFS_BLOCK_GROUP_DATA) || disk + len > bg->start + bg->length)
			return tlog_refuse(fs, "a logged extent lies outside the data block groups", key);
		ret = extent_overlap(fs, disk, len, &found);
		if (ret < 0)
			return ret;
		if (ret) {
			if (found.objectid == disk && found.type == BTRFS_EXTENT_ITEM_KEY &&
			    found.offset == len)
				return 0; /* an extent from before: it gets one more reference */
			return tlog_refuse(fs, "a logged extent overlaps another extent", key);
		}
		/* written since the commit: keep the allocator away from it */
		ret = range_remove(&bg->free, disk, disk + len);
		bg->fst_dirty = 1;
		if (ret == 0)
			ret = tlog_u64_push(&ex->disk, disk);
		if (ret == 0)
			ret = tlog_u64_push(&ex->len, len);
		return ret;
	}
	default:
		return tlog_refuse(fs, key->type == BTRFS_DIR_ITEM_KEY || key->type == BTRFS_DIR_LOG_ITEM_KEY
					  ? "a log in the format of kernels before 5.17 (dir items)"
					  : "an item type the replay does not know",
				   key);
	}
}

/*
 * Visit every block of the tree at @root: pin it, and check (and take the
 * space of) the items of each leaf when @items.
 */
static int walk_log_blocks(struct butter_fs *fs, struct excluded *ex, struct tree_node *node,
			   int items)
{
	u32 i;
	int ret;

	ret = pin_log_block(fs, node->bytenr);
	if (ret)
		return ret;
	if (node->level == 0) {
		for (i = 0; items && i < node->nritems; i++) {
			struct btrfs_key key;

			node_key(node, i, &key);
			ret = check_log_item(fs, ex, &key, leaf_item_data(node, i),
					     leaf_item_size(node, i));
			if (ret)
				return ret;
		}
		return 0;
	}
	for (i = 0; i < node->nritems; i++) {
		struct tree_node *child;

		ret = node_read_child(&fs->cache, node, i, &child);
		if (ret)
			return ret;
		ret = walk_log_blocks(fs, ex, child, items);
		node_put(&fs->cache, child);
		if (ret)
			return ret;
	}
	return 0;
}

int tlog_walk_tree(struct butter_fs *fs, struct excluded *ex, const struct tree_root *root,
		   int items)
{
	struct tree_node *node;
	int ret = node_read(&fs->cache, root->bytenr, root->generation, root->level, NULL, &node);

	if (ret) {
		blog_err(&fs->log, "cannot read the tree log at %llu", (unsigned long long)root->bytenr);
		return ret;
	}
	ret = walk_log_blocks(fs, ex, node, items);
	node_put(&fs->cache, node);
	return ret;
}

/* The log trees named in the log root tree, in subvolume order. */
int tlog_read_log_roots(struct butter_fs *fs, const struct tree_root *lrt, struct log_tree **out,
			  size_t *n)
{
	struct btrfs_key key = { BTRFS_TREE_LOG_OBJECTID, BTRFS_ROOT_ITEM_KEY, 0 };
	struct tree_path path;
	int ret;

	*out = NULL;
	*n = 0;
	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, lrt, &key, &path);
	while (ret == 0) {
		const struct btrfs_root_item *ri;
		struct log_tree *lt;
		u32 size;

		path_key(&path, &key);
		if (key.objectid != BTRFS_TREE_LOG_OBJECTID || key.type != BTRFS_ROOT_ITEM_KEY) {
			ret = tlog_refuse(fs, "the log root tree holds an unknown item", &key);
			break;
		}
		ri = (const void *)path_item(&path, &size);
		if (size < BTRFS_ROOT_ITEM_V1_SIZE || ri->level >= BTRFS_MAX_LEVEL) {
			ret = BLOG_CORRUPT(&fs->log, "log root item %llu malformed",
					   (unsigned long long)key.offset);
			break;
		}
		lt = realloc(*out, (*n + 1) * sizeof(*lt));
		if (!lt) {
			ret = -ENOMEM;
			break;
		}
		*out = lt;
		lt += (*n)++;
		lt->subvol = key.offset;
		memset(&lt->root, 0, sizeof(lt->root));
		lt->root.objectid = BTRFS_TREE_LOG_OBJECTID;
		lt->root.bytenr = btrfs_root_bytenr(ri);
		lt->root.generation = btrfs_root_generation(ri);
		lt->root.level = ri->level;
		ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	return ret < 0 ? ret : 0;
}

/* Give logged data extents that nothing references after all back to free space. */
int tlog_release_unused(struct butter_fs *fs, struct excluded *ex)
{
	struct fs_write_state *w = fs->w;
	size_t i;
	int ret;

	/* the queued references become extent items first */
	ret = extent_run_delayed_refs(&w->es, &w->txn.tt);
	for (i = 0; ret == 0 && i < ex->disk.n; i++) {
		struct btrfs_key key = { ex->disk.v[i], BTRFS_EXTENT_ITEM_KEY, ex->len.v[i] };
		struct block_group *bg;

		ret = tree_lookup_item(&fs->cache, &fs->extent_tree, &key, NULL, 0);
		if (ret >= 0) {
			ret = 0;
			continue;
		}
		if (ret != -ENOENT)
			break;
		bg = extent_find_bg(&w->es, key.objectid);
		ret = range_add(&bg->free, key.objectid, key.objectid + key.offset);
		bg->fst_dirty = 1;
	}
	return ret;
}
