/*
 * transaction.c — begin, commit and abort (the order is in transaction.h).
 */
#include <errno.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "format/checksum.h"
#include "trans/transaction.h"

#define MAX_COMMIT_PASSES 64

int txn_track_root(struct txn_ctx *ctx, struct tree_root *root)
{
	struct tree_root **r;
	size_t i;

	for (i = 0; i < ctx->nroots; i++)
		if (ctx->roots[i] == root)
			return 0;
	r = realloc(ctx->roots, (ctx->nroots + 1) * sizeof(*r));
	if (!r)
		return -ENOMEM;
	ctx->roots = r;
	ctx->roots[ctx->nroots++] = root;
	return 0;
}

void txn_ctx_forget_root(struct txn_ctx *ctx, struct tree_root *root)
{
	size_t i;

	for (i = 0; i < ctx->nroots; i++) {
		if (ctx->roots[i] == root) {
			ctx->roots[i] = ctx->roots[--ctx->nroots];
			return;
		}
	}
}

void txn_ctx_destroy(struct txn_ctx *ctx)
{
	tree_trans_release_dirty(&ctx->tt);
	free(ctx->roots);
	ctx->roots = NULL;
	ctx->nroots = 0;
}

int txn_begin(struct txn_ctx *ctx)
{
	if (ctx->aborted)
		return -EROFS;
	if (ctx->running)
		return 0;
	memset(&ctx->tt, 0, sizeof(ctx->tt));
	ctx->tt.transid = btrfs_super_generation(&ctx->vol->super) + 1;
	ctx->tt.cache = ctx->cache;
	ctx->tt.ops = &extent_tree_block_ops;
	ctx->tt.ops_arg = ctx->es;
	memcpy(ctx->tt.chunk_tree_uuid, ctx->vol->chunk_tree_uuid, BTRFS_UUID_SIZE);
	ctx->es->transid = ctx->tt.transid;
	ctx->tt.open = 1;
	ctx->running = 1;
	return 0;
}

void txn_abort(struct txn_ctx *ctx, int err, const char *where)
{
	if (!ctx->aborted)
		blog_err(ctx->log, "transaction %llu aborted in %s: %s; the filesystem is now "
				   "read-only (the last committed state is intact)",
			 (unsigned long long)ctx->tt.transid, where, strerror(-err));
	ctx->aborted = 1;
}

/* Rewrite the root items of trees that moved. Returns how many were updated. */
static int update_root_items(struct txn_ctx *ctx, int *updated)
{
	size_t i;

	*updated = 0;
	for (i = 0; i < ctx->nroots; i++) {
		struct tree_root *root = ctx->roots[i];
		struct btrfs_key key = { root->objectid, BTRFS_ROOT_ITEM_KEY, 0 };
		struct tree_path path;
		struct btrfs_root_item *ri;
		u32 size;
		u64 gen;
		int ret;

		if (!root->dirty)
			continue;
		root->dirty = 0;
		(*updated)++;
		/* root items may carry a non-zero offset (snapshots): find the first */
		tree_path_init(&path);
		ret = tree_search_forward(ctx->cache, ctx->root_tree, &key, &path);
		if (ret == 0)
			path_key(&path, &key);
		tree_path_release(ctx->cache, &path);
		if (ret < 0)
			return ret;
		if (ret == 1 || key.objectid != root->objectid || key.type != BTRFS_ROOT_ITEM_KEY) {
			blog_err(ctx->log, "tree %llu has no root item", (unsigned long long)root->objectid);
			return -EUCLEAN;
		}
		ret = tree_search_slot(&ctx->tt, ctx->root_tree, &key, &path, 0, 1);
		if (ret) {
			tree_path_release(ctx->cache, &path);
			return ret < 0 ? ret : -EUCLEAN;
		}
		ri = (struct btrfs_root_item *)path_item_mut(&path, &size);
		if (size < BTRFS_ROOT_ITEM_V1_SIZE) {
			tree_path_release(ctx->cache, &path);
			return -EUCLEAN;
		}
		/*
		 * The root item's generation is what readers expect of the root
		 * node's header: the transaction for a root copied in it, the
		 * node's own for a root relocation moved unchanged.
		 */
		gen = root->generation ? root->generation : ctx->tt.transid;
		btrfs_set_root_bytenr(ri, root->bytenr);
		btrfs_set_root_bytes_used(ri, root->bytes_used);
		btrfs_set_root_generation(ri, gen);
		ri->level = root->level;
		if (root->last_snapshot)
			btrfs_set_root_last_snapshot(ri, root->last_snapshot);
		if (size >= sizeof(*ri))
			btrfs_set_root_generation_v2(ri, gen);
		if (root->touched && size >= sizeof(*ri)) {
			struct timespec now;

			clock_gettime(CLOCK_REALTIME, &now);
			btrfs_set_root_ctransid(ri, ctx->tt.transid);
			btrfs_set_timespec_sec(&ri->ctime, (u64)now.tv_sec);
			btrfs_set_timespec_nsec(&ri->ctime, (u32)now.tv_nsec);
		}
		root->touched = 0;
		tree_path_release(ctx->cache, &path);
	}
	return 0;
}

/*
 * The superblock's generation is what readers expect of the root tree's root
 * node, so every commit carries a copy of it made in this transaction.
 */
static int cow_root_tree(struct txn_ctx *ctx)
{
	struct btrfs_key key = { 0, 0, 0 };
	struct tree_path path;
	int ret;

	if (ctx->root_tree->generation == ctx->tt.transid)
		return 0;
	tree_path_init(&path);
	ret = tree_search_slot(&ctx->tt, ctx->root_tree, &key, &path, 0, 1);
	tree_path_release(ctx->cache, &path);
	return ret < 0 ? ret : 0;
}

static int write_dirty_nodes(struct txn_ctx *ctx)
{
	struct tree_node *n;
	u32 nodesize = ctx->cache->nodesize;

	for (n = ctx->tt.dirty; n; n = n->dirty_next) {
		struct btrfs_header *h = (struct btrfs_header *)n->data;
		int ret;

		if (n->removed)
			continue;
		btrfs_set_header_flags(h, btrfs_header_flags(h) | BTRFS_HEADER_FLAG_WRITTEN);
		memset(h->csum, 0, BTRFS_CSUM_SIZE);
		btrfs_csum_compute(ctx->vol->csum_type, n->data + BTRFS_CSUM_SIZE,
				   nodesize - BTRFS_CSUM_SIZE, h->csum);
		ret = volumes_write(ctx->vol, n->bytenr, n->data, nodesize);
		if (ret) {
			blog_err(ctx->log, "writing tree block %llu: %s", (unsigned long long)n->bytenr,
				 strerror(-ret));
			return ret;
		}
	}
	return 0;
}

/* Fill the superblock for the new state, including the backup root slot. */
static void fill_super(struct txn_ctx *ctx)
{
	struct btrfs_super_block *sb = &ctx->vol->super;
	u64 gen = ctx->tt.transid;
	struct btrfs_root_backup *b = &sb->super_roots[gen % BTRFS_NUM_BACKUP_ROOTS];
	size_t i;

	btrfs_set_super_generation(sb, gen);
	btrfs_set_super_root(sb, ctx->root_tree->bytenr);
	sb->root_level = ctx->root_tree->level;
	btrfs_set_super_chunk_root(sb, ctx->chunk_tree->bytenr);
	sb->chunk_root_level = ctx->chunk_tree->level;
	if (ctx->chunk_tree->generation)
		btrfs_set_super_chunk_root_generation(sb, ctx->chunk_tree->generation);
	btrfs_set_super_bytes_used(sb, extent_bytes_used(ctx->es));

	memset(b, 0, sizeof(*b));
	put_le64(&b->tree_root, ctx->root_tree->bytenr);
	put_le64(&b->tree_root_gen, gen);
	b->tree_root_level = ctx->root_tree->level;
	put_le64(&b->chunk_root, ctx->chunk_tree->bytenr);
	put_le64(&b->chunk_root_gen, btrfs_super_chunk_root_generation(sb));
	b->chunk_root_level = ctx->chunk_tree->level;
	for (i = 0; i < ctx->nroots; i++) {
		const struct tree_root *r = ctx->roots[i];

		switch (r->objectid) {
		case BTRFS_EXTENT_TREE_OBJECTID:
			put_le64(&b->extent_root, r->bytenr);
			put_le64(&b->extent_root_gen, r->generation);
			b->extent_root_level = r->level;
			break;
		case BTRFS_FS_TREE_OBJECTID:
			put_le64(&b->fs_root, r->bytenr);
			put_le64(&b->fs_root_gen, r->generation);
			b->fs_root_level = r->level;
			break;
		case BTRFS_DEV_TREE_OBJECTID:
			put_le64(&b->dev_root, r->bytenr);
			put_le64(&b->dev_root_gen, r->generation);
			b->dev_root_level = r->level;
			break;
		case BTRFS_CSUM_TREE_OBJECTID:
			put_le64(&b->csum_root, r->bytenr);
			put_le64(&b->csum_root_gen, r->generation);
			b->csum_root_level = r->level;
			break;
		}
	}
	put_le64(&b->total_bytes, btrfs_super_total_bytes(sb));
	put_le64(&b->bytes_used, btrfs_super_bytes_used(sb));
	put_le64(&b->num_devices, btrfs_super_num_devices(sb));
}

int txn_commit(struct txn_ctx *ctx)
{
	int ret = 0, pass, updated;

	if (ctx->aborted)
		return -EROFS;
	if (ctx->es && ctx->es->dev_root && volumes_stats_dirty(ctx->vol)) {
		ret = txn_begin(ctx);
		if (ret == 0)
			ret = txn_write_dev_stats(ctx);
		if (ret)
			goto abort;
	}
	if (!ctx->running)
		return 0;
	if (ctx->pre_commit) {
		ret = ctx->pre_commit(ctx->pre_commit_arg);
		if (ret)
			goto abort;
	}
	if (!ctx->tt.dirty && !extent_commit_pending(ctx->es) && !ctx->super_dirty) {
		/* nothing changed: the on-disk state is current */
		ctx->tt.open = 0;
		ctx->running = 0;
		return 0;
	}
	if (ctx->pre_write) {
		ret = ctx->pre_write(ctx->pre_write_arg);
		if (ret)
			goto abort;
	}
	for (pass = 0; pass < MAX_COMMIT_PASSES; pass++) {
		ret = extent_run_delayed_refs(ctx->es, &ctx->tt);
		if (ret)
			goto abort;
		ret = extent_write_block_groups(ctx->es, &ctx->tt);
		if (ret)
			goto abort;
		ret = extent_write_free_space_tree(ctx->es, &ctx->tt);
		if (ret)
			goto abort;
		ret = update_root_items(ctx, &updated);
		if (ret)
			goto abort;
		ret = cow_root_tree(ctx);
		if (ret)
			goto abort;
		if (!updated && !extent_commit_pending(ctx->es))
			break;
	}
	if (pass == MAX_COMMIT_PASSES) {
		ret = -EDEADLK;
		goto abort;
	}
	ret = write_dirty_nodes(ctx);
	if (ret)
		goto abort;
	ret = volumes_flush(ctx->vol);
	if (ret)
		goto abort;
	fill_super(ctx);
	ret = volumes_write_supers(ctx->vol);
	if (ret)
		goto abort;
	ret = volumes_flush(ctx->vol);
	if (ret)
		goto abort;
	ret = extent_unpin(ctx->es);
	tree_trans_release_dirty(&ctx->tt);
	ctx->root_tree->dirty = 0;
	ctx->chunk_tree->dirty = 0;
	ctx->super_dirty = 0;
	ctx->tt.open = 0;
	ctx->running = 0;
	return ret;
abort:
	txn_abort(ctx, ret, "commit");
	return ret;
}
