/*
 * create.c — new subvolumes: the next free subvolume id, the handle's record
 * of a new tree, linking a subvolume under a name (ROOT_REF, ROOT_BACKREF
 * and the directory entries), and butter_subvol_create() itself: an empty
 * tree with its root directory, a root item, a uuid (listed in the uuid
 * tree) and a qgroup when quotas are on.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <uuid/uuid.h>
#include "subvol/subvol.h"

int subvol_link(struct butter_fs *fs, struct subvol *parent, u64 dir, const char *name,
		size_t namelen, u64 id, u64 index)
{
	struct tree_trans *t = &fs->w->txn.tt;
	u8 ref[sizeof(struct btrfs_root_ref) + BTRFS_NAME_LEN];
	struct btrfs_root_ref *rr = (void *)ref;
	u32 size = (u32)(sizeof(*rr) + namelen);
	struct btrfs_key key = { parent->id, BTRFS_ROOT_REF_KEY, id };
	struct btrfs_key loc = { id, BTRFS_ROOT_ITEM_KEY, (u64)-1 };
	int ret;

	memset(ref, 0, sizeof(ref));
	btrfs_set_root_ref_dirid(rr, dir);
	btrfs_set_root_ref_sequence(rr, index);
	btrfs_set_root_ref_name_len(rr, (u16)namelen);
	memcpy(ref + sizeof(*rr), name, namelen);
	ret = tree_insert_item(t, &fs->root_tree, &key, ref, size);
	if (ret == 0) {
		key.objectid = id;
		key.type = BTRFS_ROOT_BACKREF_KEY;
		key.offset = parent->id;
		ret = tree_insert_item(t, &fs->root_tree, &key, ref, size);
	}
	if (ret == 0)
		ret = inode_add_dir_entries(fs, parent, dir, name, namelen, &loc, BTRFS_FT_DIR, index);
	return ret;
}

/*
 * The next free subvolume id: the largest root item id + 1, at least 256, and
 * above every id this handle handed out before.
 */
int subvol_next_id(struct butter_fs *fs, u64 *id)
{
	struct btrfs_key key = { BTRFS_LAST_FREE_OBJECTID, 0xff, (u64)-1 };
	int ret = tree_find_key(&fs->cache, &fs->root_tree, &key, 1, &key);

	if (ret < 0)
		return ret;
	*id = BTRFS_FIRST_FREE_OBJECTID;
	if (ret == 0 && key.objectid >= BTRFS_FIRST_FREE_OBJECTID)
		*id = key.objectid + 1;
	if (*id <= fs->last_subvol_id)
		*id = fs->last_subvol_id + 1; /* the newest was deleted: not its id again */
	if (*id > BTRFS_LAST_FREE_OBJECTID)
		return -ENOSPC;
	fs->last_subvol_id = *id;
	return 0;
}

/*
 * Phase-1 checks for a new subvolume or snapshot named @name in @dir: the
 * name is free (its subvolume in *@parent); the new tree's id and the
 * directory index of its name.
 */
int subvol_check_new(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		     struct subvol **parent, u64 *id, u64 *index)
{
	int ret = ns_check_new_name(fs, dir, name, namelen, parent);

	if (ret == 0)
		ret = subvol_next_id(fs, id);
	if (ret == 0)
		ret = inode_next_dir_index(fs, *parent, dir.ino, index);
	return ret;
}

/* Add @sv to the handle's subvolume records. */
int subvol_add_record(struct butter_fs *fs, struct subvol *sv)
{
	struct subvol **arr;

	pthread_mutex_lock(&fs->subvol_lock);
	arr = realloc(fs->subvols, (fs->nsubvols + 1) * sizeof(*arr));
	if (arr) {
		fs->subvols = arr;
		fs->subvols[fs->nsubvols++] = sv;
	}
	pthread_mutex_unlock(&fs->subvol_lock);
	return arr ? 0 : -ENOMEM;
}

int subvol_create(struct butter_fs *fs, butter_ino_t dir, const char *name,
		  size_t namelen, uint64_t *out_id)
{
	struct fs_write_state *w;
	struct subvol *parent, *sv;
	struct btrfs_root_item ri;
	struct btrfs_key key;
	u64 id, index;
	int ret;

	ret = fs_begin_change(fs, &w);
	if (ret)
		return ret;
	ret = subvol_check_new(fs, dir, name, namelen, &parent, &id, &index);
	if (ret)
		return fs_end_change(w, ret, 0);
	sv = calloc(1, sizeof(*sv));
	if (!sv)
		return fs_end_change(w, -ENOMEM, 0);
	sv->id = id;
	sv->dirid = BTRFS_FIRST_FREE_OBJECTID;
	ret = tree_create_root(&w->txn.tt, id, &sv->root);
	if (ret == 0)
		ret = inode_make_root_dir(&w->txn.tt, &sv->root, 0);
	if (ret == 0)
		ret = txn_track_root(&w->txn, &sv->root);
	if (ret) {
		free(sv);
		return fs_end_change(w, ret, 1);
	}
	memset(&ri, 0, sizeof(ri));
	btrfs_set_inode_generation(&ri.inode, 1);
	btrfs_set_inode_size(&ri.inode, 3);
	btrfs_set_inode_nlink(&ri.inode, 1);
	btrfs_set_inode_nbytes(&ri.inode, fs->vol.nodesize);
	btrfs_set_inode_mode(&ri.inode, S_IFDIR | 0755);
	btrfs_set_inode_flags(&ri.inode, BTRFS_INODE_ROOT_ITEM_INIT);
	btrfs_set_root_generation(&ri, w->txn.tt.transid);
	btrfs_set_root_generation_v2(&ri, w->txn.tt.transid);
	btrfs_set_root_dirid(&ri, BTRFS_FIRST_FREE_OBJECTID);
	btrfs_set_root_bytenr(&ri, sv->root.bytenr);
	btrfs_set_root_bytes_used(&ri, sv->root.bytes_used);
	btrfs_set_root_refs(&ri, 1);
	ri.level = sv->root.level;
	uuid_generate(ri.uuid);
	put_le64(&ri.ctransid, w->txn.tt.transid);
	put_le64(&ri.otransid, w->txn.tt.transid);
	fs_now_ts(&ri.ctime);
	ri.otime = ri.ctime;
	key.objectid = id;
	key.type = BTRFS_ROOT_ITEM_KEY;
	key.offset = 0;
	ret = tree_insert_item(&w->txn.tt, &fs->root_tree, &key, &ri, sizeof(ri));
	if (ret == 0)
		ret = subvol_link(fs, parent, dir.ino, name, namelen, id, index);
	if (ret == 0)
		ret = subvol_uuid_tree_add(fs, ri.uuid, BTRFS_UUID_KEY_SUBVOL, id);
	if (ret == 0)
		ret = subvol_qgroup_create(fs, id, 0);
	if (ret == 0)
		ret = subvol_add_record(fs, sv);
	if (ret == 0) {
		if (out_id)
			*out_id = id;
	} else {
		txn_ctx_forget_root(&w->txn, &sv->root);
		free(sv);
	}
	return fs_end_change(w, ret, 1);
}
