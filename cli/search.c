/*
 * search.c — see search.h: tree items from an image or through a mount.
 */
#include <endian.h>
#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>

#include "search.h"

uint64_t cli_le64(const void *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return le64toh(v);
}

int cli_tree_search(const struct cli_search_src *src, struct btrfs_ioctl_search_args *args)
{
	struct btrfs_ioctl_search_key *k = &args->key;
	uint32_t n = 0;
	int ret;

	if (!src->fs)
		return ioctl(src->fd, BTRFS_IOC_TREE_SEARCH, args) < 0 ? -errno : 0;
	struct butter_search_key sk = {
		.tree_id = k->tree_id ? k->tree_id : src->subvol,
		.min_objectid = k->min_objectid, .max_objectid = k->max_objectid,
		.min_offset = k->min_offset, .max_offset = k->max_offset,
		.min_transid = k->min_transid, .max_transid = k->max_transid,
		.min_type = k->min_type, .max_type = k->max_type,
	};
	ret = butter_tree_search(src->fs, &sk, k->nr_items, args->buf, sizeof(args->buf), &n);
	k->nr_items = n;
	return ret;
}

int cli_ino_lookup(const struct cli_search_src *src, uint64_t dirid, char *out, size_t cap)
{
	size_t len;
	int ret;

	if (!src->fs) {
		struct btrfs_ioctl_ino_lookup_args a = { .objectid = dirid };

		if (ioctl(src->fd, BTRFS_IOC_INO_LOOKUP, &a) < 0)
			return -errno;
		len = strnlen(a.name, sizeof(a.name));
		if (len >= cap)
			return -ENAMETOOLONG;
		memcpy(out, a.name, len + 1);
		return 0;
	}
	ret = butter_ino_path(src->fs, (butter_ino_t){ src->subvol, dirid }, out, cap - 1);
	if (ret)
		return ret;
	len = strlen(out);
	if (len) {
		out[len] = '/';
		out[len + 1] = '\0';
	}
	return 0;
}

int cli_search_subvol(const struct cli_search_src *src, uint64_t *id)
{
	struct btrfs_ioctl_ino_lookup_args a = { .objectid = BUTTER_SUBVOL_ROOT_INO };

	if (src->fs) {
		*id = src->subvol;
		return 0;
	}
	if (ioctl(src->fd, BTRFS_IOC_INO_LOOKUP, &a) < 0)
		return -errno;
	*id = a.treeid;
	return 0;
}
