/*
 * btrfs_ioctl.c — the kernel btrfs's own ioctls, answered on a butter mount
 * as btrfs answers them, so that tools built on them (python3-btrfs and the
 * like) work here too.
 *
 * FUSE forwards an ioctl of a regular mount "restricted": the kernel copies
 * exactly the size the command number encodes into the request (for _IOW
 * and _IOWR) and back out of the reply (for _IOR and _IOWR). So only
 * commands whose argument has a fixed size can be answered: TREE_SEARCH
 * (v1, 4096 bytes), INO_LOOKUP, FS_INFO, DEV_INFO, GET_DEV_STATS,
 * GET_FEATURES, SUBVOL_GETFLAGS, DEFAULT_SUBVOL, SYNC and GET/SET_FSLABEL
 * (the VFS's FS_IOC_GETFSLABEL/SETFSLABEL are the same numbers). The variable ones
 * (TREE_SEARCH_V2, SPACE_INFO's array, LOGICAL_INO, INO_PATHS) cannot be
 * (the kernel fails them with EIO or hands back only their head) and stay
 * ENOTTY, as every other command.
 *
 * Differences forced by the transport, documented in the README:
 * - FS_INFO is _IOR, so the caller's request flags never reach the daemon:
 *   every optional field (checksum, generation, metadata uuid) is filled
 *   and flagged.
 * - st_ino is not the btrfs inode number outside the top-level subvolume
 *   (fuse/nodes.c gives each subvolume's files numbers of their own). An
 *   inode number as the mount shows it is understood where the kernel's
 *   callers pass st_ino: INO_LOOKUP's objectid, and TREE_SEARCH's when it
 *   asks for one objectid (min == max) of a subvolume tree.
 * - Who may: the kernel asks for CAP_SYS_ADMIN for TREE_SEARCH, INO_LOOKUP
 *   beyond the subvolume root, a stats reset, DEFAULT_SUBVOL and SET_FSLABEL; the daemon
 *   sees only the caller's uid and asks for uid 0.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <linux/btrfs.h>
#include <linux/fs.h>

#include "daemon.h"

#define BTRFS_FS_TREE_ID 5ULL

/* One request's argument, the largest of the commands answered (4096 bytes). */
union btrfs_arg {
	struct btrfs_ioctl_search_args search;
	struct btrfs_ioctl_ino_lookup_args lookup;
	struct btrfs_ioctl_fs_info_args fs_info;
	struct btrfs_ioctl_dev_info_args dev_info;
	struct btrfs_ioctl_get_dev_stats stats;
	struct btrfs_ioctl_feature_flags features;
	char label[BTRFS_LABEL_SIZE];
	__u64 u64;
};

static int caller_is_root(fuse_req_t req)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);

	return ctx && ctx->uid == 0;
}

/* The index of device @devid for butter_get_device()/butter_device_stats(); -ENODEV. */
static int device_index(struct daemon *d, uint64_t devid, struct butter_device_info *dev,
			size_t *idx)
{
	for (size_t i = 0;; i++) {
		int ret = butter_get_device(d->fs, i, dev);

		if (ret == -ENOENT)
			return -ENODEV;
		if (ret)
			return ret;
		if (dev->devid == devid) {
			*idx = i;
			return 0;
		}
	}
}

/*
 * @objectid as a btrfs inode number of subvolume @tree: a number the mount
 * shows as st_ino for a file of @tree becomes that file's inode number;
 * anything else is taken as it is.
 */
static uint64_t btrfs_objectid(struct daemon *d, uint64_t tree, uint64_t objectid)
{
	butter_ino_t id;

	if (objectid != 1 && (objectid < (1ULL << 44) || objectid >= (1ULL << 63)))
		return objectid; /* the same number on both sides, or no arithmetic mapping */
	if (nodes_resolve(&d->nodes, objectid, &id) == 0 && id.subvol == tree)
		return id.ino;
	return objectid;
}

static int tree_search(struct daemon *d, butter_ino_t id, struct btrfs_ioctl_search_args *a)
{
	struct btrfs_ioctl_search_key *k = &a->key;
	struct butter_search_key sk = {
		.tree_id = k->tree_id ? k->tree_id : id.subvol,
		.min_objectid = k->min_objectid, .max_objectid = k->max_objectid,
		.min_offset = k->min_offset, .max_offset = k->max_offset,
		.min_transid = k->min_transid, .max_transid = k->max_transid,
		.min_type = k->min_type, .max_type = k->max_type,
	};
	uint32_t found = 0;
	int ret;

	if (sk.min_objectid == sk.max_objectid)
		sk.min_objectid = sk.max_objectid = btrfs_objectid(d, sk.tree_id, sk.min_objectid);
	ret = butter_tree_search(d->fs, &sk, k->nr_items, a->buf, sizeof(a->buf), &found);
	k->nr_items = found;
	return ret;
}

/* INO_LOOKUP: the path of inode @objectid in its subvolume, each name followed by '/'. */
static int ino_lookup(struct daemon *d, fuse_req_t req, butter_ino_t id,
		      struct btrfs_ioctl_ino_lookup_args *a)
{
	butter_ino_t target;
	size_t len;
	int ret;

	if (a->treeid == 0)
		a->treeid = id.subvol;
	a->objectid = btrfs_objectid(d, a->treeid, a->objectid);
	if (a->objectid == BUTTER_SUBVOL_ROOT_INO) {
		a->name[0] = '\0';
		return 0;
	}
	if (!caller_is_root(req))
		return -EPERM;
	target = (butter_ino_t){ a->treeid, a->objectid };
	ret = butter_ino_path(d->fs, target, a->name, sizeof(a->name) - 1);
	if (ret)
		return ret == -ENAMETOOLONG ? -EOVERFLOW : ret;
	len = strlen(a->name);
	a->name[len] = '/';
	a->name[len + 1] = '\0';
	return 0;
}

static int fs_info(struct daemon *d, struct btrfs_ioctl_fs_info_args *a)
{
	struct butter_device_info dev;
	struct butter_info bi;
	int ret = butter_get_info(d->fs, &bi);

	if (ret)
		return ret;
	memset(a, 0, sizeof(*a));
	for (size_t i = 0; butter_get_device(d->fs, i, &dev) == 0; i++)
		if (dev.devid > a->max_id)
			a->max_id = dev.devid;
	a->num_devices = bi.num_devices;
	memcpy(a->fsid, bi.fsid, sizeof(a->fsid));
	a->nodesize = bi.nodesize;
	a->sectorsize = bi.sectorsize;
	a->clone_alignment = bi.sectorsize;
	a->csum_type = bi.csum_type;
	a->csum_size = bi.csum_type == 0 ? 4 : bi.csum_type == 1 ? 8 : 32;
	a->generation = bi.generation;
	memcpy(a->metadata_uuid, bi.metadata_uuid, sizeof(a->metadata_uuid));
	a->flags = BTRFS_FS_INFO_FLAG_CSUM_INFO | BTRFS_FS_INFO_FLAG_GENERATION |
		   BTRFS_FS_INFO_FLAG_METADATA_UUID;
	return 0;
}

static int dev_info(struct daemon *d, struct btrfs_ioctl_dev_info_args *a)
{
	static const uint8_t zero[16];
	struct butter_device_info dev;
	struct butter_info bi;
	size_t idx;
	int ret = device_index(d, a->devid, &dev, &idx);

	if (ret == 0)
		ret = butter_get_info(d->fs, &bi);
	if (ret)
		return ret;
	if (memcmp(a->uuid, zero, 16) && memcmp(a->uuid, dev.uuid, 16))
		return -ENODEV;
	memset(a, 0, sizeof(*a));
	a->devid = dev.devid;
	memcpy(a->uuid, dev.uuid, 16);
	a->bytes_used = dev.bytes_used;
	a->total_bytes = dev.total_bytes;
	if (dev.path)
		snprintf((char *)a->path, sizeof(a->path), "%s", dev.path);
	return 0;
}

static int dev_stats(struct daemon *d, fuse_req_t req, struct btrfs_ioctl_get_dev_stats *a)
{
	struct butter_device_stats st;
	struct butter_device_info dev;
	size_t idx;
	int ret;

	if (a->flags & ~(uint64_t)BTRFS_DEV_STATS_RESET)
		return -EOPNOTSUPP;
	if ((a->flags & BTRFS_DEV_STATS_RESET) && !caller_is_root(req))
		return -EPERM;
	ret = device_index(d, a->devid, &dev, &idx);
	if (ret == 0)
		ret = butter_device_stats(d->fs, idx,
					  (a->flags & BTRFS_DEV_STATS_RESET) ? BUTTER_DEV_STATS_RESET : 0,
					  &st);
	if (ret)
		return ret;
	if (a->nr_items > BTRFS_DEV_STAT_VALUES_MAX)
		a->nr_items = BTRFS_DEV_STAT_VALUES_MAX;
	for (uint64_t i = 0; i < a->nr_items && i < BUTTER_DEV_STAT_NR; i++)
		a->values[i] = st.values[i];
	return 0;
}

int btrfs_ioctl_answer(fuse_req_t req, fuse_ino_t ino, unsigned cmd, const void *in,
		       size_t in_size, size_t out_size)
{
	struct daemon *d = fuse_req_userdata(req);
	size_t size = _IOC_SIZE(cmd), out = 0;
	union btrfs_arg *a;
	butter_ino_t id;
	int ret;

	if (_IOC_TYPE(cmd) != BTRFS_IOCTL_MAGIC)
		return 0;
	switch (cmd) {
	case BTRFS_IOC_TREE_SEARCH:
	case BTRFS_IOC_INO_LOOKUP:
	case BTRFS_IOC_FS_INFO:
	case BTRFS_IOC_DEV_INFO:
	case BTRFS_IOC_GET_DEV_STATS:
	case BTRFS_IOC_GET_FEATURES:
	case BTRFS_IOC_SUBVOL_GETFLAGS:
	case BTRFS_IOC_DEFAULT_SUBVOL:
	case BTRFS_IOC_SYNC:
	case BTRFS_IOC_GET_FSLABEL:
	case BTRFS_IOC_SET_FSLABEL:
		break;
	default:
		return 0;
	}
	if (size > sizeof(*a) || ((_IOC_DIR(cmd) & _IOC_WRITE) && in_size != size) ||
	    ((_IOC_DIR(cmd) & _IOC_READ) && out_size != size)) {
		fuse_reply_err(req, ENOTTY);
		return 1;
	}
	a = calloc(1, sizeof(*a));
	if (!a) {
		fuse_reply_err(req, ENOMEM);
		return 1;
	}
	if (in_size)
		memcpy(a, in, in_size);
	ret = nodes_resolve(&d->nodes, ino, &id);
	if (ret)
		goto out;
	switch (cmd) {
	case BTRFS_IOC_TREE_SEARCH:
		ret = caller_is_root(req) ? tree_search(d, id, &a->search) : -EPERM;
		break;
	case BTRFS_IOC_INO_LOOKUP:
		ret = ino_lookup(d, req, id, &a->lookup);
		break;
	case BTRFS_IOC_FS_INFO:
		ret = fs_info(d, &a->fs_info);
		break;
	case BTRFS_IOC_DEV_INFO:
		ret = dev_info(d, &a->dev_info);
		break;
	case BTRFS_IOC_GET_DEV_STATS:
		ret = dev_stats(d, req, &a->stats);
		break;
	case BTRFS_IOC_GET_FEATURES: {
		struct butter_info bi;

		ret = butter_get_info(d->fs, &bi);
		a->features.compat_flags = bi.compat_flags;
		a->features.compat_ro_flags = bi.compat_ro_flags;
		a->features.incompat_flags = bi.incompat_flags;
		break;
	}
	case BTRFS_IOC_SUBVOL_GETFLAGS: {
		struct butter_subvol_info si;

		if (id.ino != BUTTER_SUBVOL_ROOT_INO) {
			ret = -EINVAL;
			break;
		}
		ret = butter_subvol_get(d->fs, id.subvol, &si);
		a->u64 = (si.flags & 1) ? BTRFS_SUBVOL_RDONLY : 0;
		break;
	}
	case BTRFS_IOC_DEFAULT_SUBVOL:
		if (!caller_is_root(req))
			ret = -EPERM;
		else if (d->readonly)
			ret = -EROFS;
		else
			ret = butter_subvol_set_default(d->fs, a->u64 ? a->u64 : BTRFS_FS_TREE_ID);
		break;
	case BTRFS_IOC_SYNC:
		ret = d->readonly ? 0 : butter_sync(d->fs);
		if (ret)
			daemon_commit_failed(d, ret);
		break;
	case BTRFS_IOC_GET_FSLABEL: { /* also FS_IOC_GETFSLABEL: the same number */
		struct butter_info bi;

		ret = butter_get_info(d->fs, &bi);
		if (ret == 0) /* the rest of a->label is zeros (calloc) */
			memcpy(a->label, bi.label, strnlen(bi.label, sizeof(a->label) - 1));
		break;
	}
	case BTRFS_IOC_SET_FSLABEL:
		if (!caller_is_root(req))
			ret = -EPERM;
		else if (strnlen(a->label, sizeof(a->label)) == sizeof(a->label))
			ret = -EINVAL; /* no room for the NUL: the kernel's refusal too */
		else if (d->readonly)
			ret = -EROFS;
		else
			ret = butter_set_label(d->fs, a->label); /* committed */
		break;
	}
	if (_IOC_DIR(cmd) & _IOC_READ)
		out = size;
out:
	if (ret < 0)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_ioctl(req, 0, out ? a : NULL, out);
	free(a);
	return 1;
}
