/*
 * subvol.h — the subvolume layer: listing and describing subvolumes
 * (list.c), creating them (create.c), snapshots and deletion (snapshot.c),
 * what a receive leaves on one (received.c), the uuid tree (uuid_tree.c)
 * and the quota groups butter keeps honest (qgroup.c). Not a public header.
 */
#ifndef BUTTER_SUBVOL_SUBVOL_H
#define BUTTER_SUBVOL_SUBVOL_H

#include "namespace/namespace.h"

/* ---- create.c ---- */
/* The next free subvolume id (largest root item id + 1, at least 256). */
int subvol_next_id(struct butter_fs *fs, u64 *id);
/* Phase 1 of a new subvolume: ns_check_new_name(), subvol_next_id(), inode_next_dir_index(). */
int subvol_check_new(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		     struct subvol **parent, u64 *id, u64 *index);
/* Add @sv to the handle's subvolume records (under subvol_lock); -ENOMEM. */
int subvol_add_record(struct butter_fs *fs, struct subvol *sv);
/* Name subvolume @id as @name in @dir of @parent: ROOT_REF, ROOT_BACKREF, dir entries. */
int subvol_link(struct butter_fs *fs, struct subvol *parent, u64 dir, const char *name,
		size_t namelen, u64 id, u64 index);

/* ---- snapshot.c ---- */
/*
 * Free every deleted subvolume still waiting (orphan item, root refs 0):
 * called when a handle opens read-write. Returns how many, or -errno.
 */
int subvol_drop_orphans(struct butter_fs *fs);
/* Drop the relocation trees an interrupted kernel balance left (snapshot.c says which). */
int subvol_drop_reloc_trees(struct butter_fs *fs);

/* ---- uuid_tree.c: list / unlist subvolume @id under @uuid (type UUID_KEY_*) ---- */
int subvol_uuid_tree_add(struct butter_fs *fs, const u8 *uuid, u8 type, u64 id);
int subvol_uuid_tree_remove(struct butter_fs *fs, const u8 *uuid, u8 type, u64 id);

/* ---- qgroup.c (quotas: its header comment has the rules) ---- */
/* At a read-write open, after fs_setup_write(): find the quota tree, hook the commit. -EOPNOTSUPP: squota. */
int subvol_qgroup_setup(struct butter_fs *fs);
/* Give new subvolume @id its qgroup items (phase 2); @src: a snapshot's source, or 0. */
int subvol_qgroup_create(struct butter_fs *fs, u64 id, u64 src);
/* Remove the qgroup of subvolume @id, dropped completely (phase 2). */
int subvol_qgroup_remove(struct butter_fs *fs, u64 id);

/*
 * The bodies of the public calls of this layer: butter_snapshot(), butter_subvol_create(), butter_subvol_delete() and the rest below.
 * lib/api/api.c takes the handle's lock and calls them; butter.h has the
 * contract of each. Library code calls these, never butter_*() (the lock
 * is not taken twice).
 */
int subvol_snapshot(struct butter_fs *fs, uint64_t src_id, butter_ino_t dir, const char *name,
	size_t namelen, unsigned flags, uint64_t *out_id);
int subvol_create(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
	uint64_t *out_id);
int subvol_delete(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen);
int subvol_get(struct butter_fs *fs, uint64_t id, struct butter_subvol_info *info);
int subvol_set_default(struct butter_fs *fs, uint64_t id);
int subvol_set_readonly(struct butter_fs *fs, uint64_t id, int readonly);
int subvol_list(struct butter_fs *fs, int (*fn)(void *arg, const struct butter_subvol_info *info),
	void *arg);
int subvol_set_received(struct butter_fs *fs, uint64_t id, const uint8_t uuid[16],
	uint64_t stransid, unsigned flags);

#endif
