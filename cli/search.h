/*
 * search.h — reading tree items the same way from an image and from a mount.
 *
 * Commands that report on file extents (filesystem du --compression,
 * subvolume find-new) read EXTENT_DATA, INODE_REF and ROOT_ITEM items. On an
 * image they come from butter_tree_search(); on a mount (butter's, whose
 * daemon answers the ioctl, or the kernel's btrfs) from BTRFS_IOC_TREE_SEARCH
 * and BTRFS_IOC_INO_LOOKUP on a file descriptor there. A command is written
 * once against struct cli_search_src.
 */
#ifndef BUTTER_CLI_SEARCH_H
#define BUTTER_CLI_SEARCH_H

#include <stdint.h>

#include <linux/btrfs.h>

#include <butter/butter.h>

struct cli_search_src {
	struct butter_fs *fs; /* an image, or NULL for a mount */
	uint64_t subvol;      /* on an image: the tree that "tree 0" means */
	int fd;               /* on a mount: a file or directory there */
};

/*
 * One TREE_SEARCH (v1) of @args->key (tree_id 0: the source's subvolume),
 * filling @args->buf and setting key.nr_items as the ioctl does. 0 or a
 * negative errno (-ENOTTY: the mount answers no btrfs ioctls).
 */
int cli_tree_search(const struct cli_search_src *src, struct btrfs_ioctl_search_args *args);

/*
 * INO_LOOKUP: the path of directory @dirid in the source's subvolume, each
 * name followed by '/' ("" for the subvolume's root), into @out (@cap bytes,
 * at least BTRFS_INO_LOOKUP_PATH_MAX). 0 or a negative errno.
 */
int cli_ino_lookup(const struct cli_search_src *src, uint64_t dirid, char *out, size_t cap);

/* The source's subvolume id (INO_LOOKUP's treeid on a mount). 0 or a negative errno. */
int cli_search_subvol(const struct cli_search_src *src, uint64_t *id);

/* The little-endian u64 at @p (tree item bytes are on-disk order). */
uint64_t cli_le64(const void *p);

#endif
