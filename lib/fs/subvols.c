/*
 * subvols.c — the handle's records of subvolume trees: found in the root tree
 * on first use, kept until close (fs.h invariant 2), and the writable record
 * a change inside a subvolume works on.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "fs/fs.h"

struct subvol *fs_subvol_cached(struct butter_fs *fs, u64 id, int *err)
{
	struct btrfs_root_item item;
	struct subvol *sv, **arr;
	size_t i;
	int ret;

	pthread_mutex_lock(&fs->subvol_lock);
	for (i = 0; i < fs->nsubvols; i++) {
		if (fs->subvols[i]->id == id) {
			sv = fs->subvols[i];
			pthread_mutex_unlock(&fs->subvol_lock);
			if (sv->deleted) {
				*err = -ENOENT;
				return NULL;
			}
			return sv;
		}
	}
	pthread_mutex_unlock(&fs->subvol_lock);

	*err = -ENOENT;
	/* the data relocation tree too: orphan cleanup frees a cut kernel balance's inode there */
	if (id != BTRFS_FS_TREE_OBJECTID && id != BTRFS_DATA_RELOC_TREE_OBJECTID &&
	    (id < BTRFS_FIRST_FREE_OBJECTID || id > BTRFS_LAST_FREE_OBJECTID))
		return NULL;
	ret = fs_read_root_item(fs, id, &item, NULL);
	if (ret) {
		*err = ret;
		return NULL;
	}
	if (item.level >= BTRFS_MAX_LEVEL) {
		*err = BLOG_CORRUPT(&fs->log, "subvolume %llu: root level %u",
				    (unsigned long long)id, item.level);
		return NULL;
	}
	sv = calloc(1, sizeof(*sv));
	if (!sv) {
		*err = -ENOMEM;
		return NULL;
	}
	sv->id = id;
	sv->root.objectid = id;
	sv->root.bytenr = btrfs_root_bytenr(&item);
	sv->root.generation = btrfs_root_generation(&item);
	sv->root.level = item.level;
	sv->root.last_snapshot = btrfs_root_last_snapshot(&item);
	sv->root.bytes_used = btrfs_root_bytes_used(&item);
	sv->dirid = btrfs_root_dirid(&item);
	sv->flags = btrfs_root_flags(&item);
	if (sv->dirid < BTRFS_FIRST_FREE_OBJECTID)
		sv->dirid = BTRFS_FIRST_FREE_OBJECTID;

	pthread_mutex_lock(&fs->subvol_lock);
	for (i = 0; i < fs->nsubvols; i++) {
		if (fs->subvols[i]->id == id) {
			/* another thread loaded it meanwhile */
			free(sv);
			sv = fs->subvols[i];
			pthread_mutex_unlock(&fs->subvol_lock);
			return sv;
		}
	}
	arr = realloc(fs->subvols, (fs->nsubvols + 1) * sizeof(*arr));
	if (!arr) {
		pthread_mutex_unlock(&fs->subvol_lock);
		free(sv);
		*err = -ENOMEM;
		return NULL;
	}
	fs->subvols = arr;
	fs->subvols[fs->nsubvols++] = sv;
	pthread_mutex_unlock(&fs->subvol_lock);
	return sv;
}

struct subvol *fs_subvol_mut(struct butter_fs *fs, u64 id, int *err)
{
	struct subvol *sv = fs_subvol_cached(fs, id, err);

	if (sv && (sv->flags & BTRFS_ROOT_SUBVOL_RDONLY)) {
		*err = -EROFS;
		return NULL;
	}
	if (sv)
		sv->root.touched = 1; /* changes follow: ctransid and ctime at commit */
	return sv;
}

int fs_get_subvol(struct butter_fs *fs, u64 id, struct subvol *out)
{
	int err = 0;
	struct subvol *sv = fs_subvol_cached(fs, id, &err);

	if (!sv)
		return err;
	pthread_mutex_lock(&fs->subvol_lock);
	*out = *sv;
	pthread_mutex_unlock(&fs->subvol_lock);
	return 0;
}
