/*
 * mkfs.c — making a new, empty filesystem.
 *
 * The bootstrap builds the in-memory state a mounted filesystem would have
 * (device set, chunk maps, block groups with free space) for three chunks —
 * system, metadata, data — and then uses the ordinary write path: one
 * transaction creates every tree and its first items, and the ordinary
 * commit writes tree blocks, extent items, the free space tree and the
 * superblocks. So mkfs exercises the same code every later change uses.
 *
 * With mixed block groups (opts->mixed, mkfs.btrfs -M) the metadata and data
 * chunks are one DATA|METADATA chunk, nodesize is the sector size and both
 * use one profile (single unless one is given).
 *
 * What an empty filesystem holds (as mkfs.btrfs makes it):
 *   root tree   ROOT_ITEMs of the extent, dev, fs (5), csum, free space and
 *               data reloc trees; the root tree directory (6) with its
 *               "default" entry pointing at subvolume 5
 *   chunk tree  a DEV_ITEM per device and a CHUNK_ITEM per chunk
 *   dev tree    a DEV_EXTENT per chunk stripe
 *   fs tree, data reloc tree   the root directory, inode 256
 *   extent tree block group items and an item per tree block
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <uuid/uuid.h>

#include "butter/butter.h"
#include "format/checksum.h"
#include "ops/ops.h"
#include "trans/transaction.h"

#define MIB (1ULL << 20)

struct mkfs_state {
	struct blog log;
	struct btrfs_volumes vol;
	struct node_cache cache;
	struct extent_state es;
	struct txn_ctx txn;
	struct tree_root root_tree, chunk_tree, extent_tree, dev_tree, fs_tree, csum_tree, fst,
		data_reloc;
	int cache_ok, es_ok;
};

int butter_profile_parse(const char *name, uint64_t *profile)
{
	static const struct {
		const char *name;
		uint64_t bits;
	} tab[] = {
		{ "single", BUTTER_PROFILE_SINGLE },   { "dup", BTRFS_BLOCK_GROUP_DUP },
		{ "raid0", BTRFS_BLOCK_GROUP_RAID0 },   { "raid1", BTRFS_BLOCK_GROUP_RAID1 },
		{ "raid1c3", BTRFS_BLOCK_GROUP_RAID1C3 }, { "raid1c4", BTRFS_BLOCK_GROUP_RAID1C4 },
		{ "raid10", BTRFS_BLOCK_GROUP_RAID10 }, { "raid5", BTRFS_BLOCK_GROUP_RAID5 },
		{ "raid6", BTRFS_BLOCK_GROUP_RAID6 },
	};
	size_t i;

	for (i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
		if (strcasecmp(name, tab[i].name) == 0) {
			*profile = tab[i].bits;
			return 0;
		}
	}
	return -EINVAL;
}

int butter_csum_parse(const char *name, int *csum_type)
{
	if (!strcmp(name, "crc32c"))
		*csum_type = BTRFS_CSUM_TYPE_CRC32;
	else if (!strcmp(name, "xxhash") || !strcmp(name, "xxhash64"))
		*csum_type = BTRFS_CSUM_TYPE_XXHASH;
	else if (!strcmp(name, "sha256"))
		*csum_type = BTRFS_CSUM_TYPE_SHA256;
	else if (!strcmp(name, "blake2") || !strcmp(name, "blake2b"))
		*csum_type = BTRFS_CSUM_TYPE_BLAKE2;
	else
		return -EINVAL;
	return 0;
}

static void set_time(struct btrfs_timespec *t, const struct timespec *now)
{
	btrfs_set_timespec_sec(t, (u64)now->tv_sec);
	btrfs_set_timespec_nsec(t, (u32)now->tv_nsec);
}

static void fill_dir_inode(struct btrfs_inode_item *ii, u64 gen, u32 nbytes,
			   const struct timespec *now)
{
	memset(ii, 0, sizeof(*ii));
	btrfs_set_inode_generation(ii, gen);
	btrfs_set_inode_transid(ii, gen);
	btrfs_set_inode_nbytes(ii, nbytes);
	btrfs_set_inode_nlink(ii, 1);
	btrfs_set_inode_mode(ii, S_IFDIR | 0755);
	set_time(&ii->atime, now);
	set_time(&ii->ctime, now);
	set_time(&ii->mtime, now);
	set_time(&ii->otime, now);
}

/* Insert the ROOT_ITEM of a freshly created tree. */
static int insert_root_item(struct mkfs_state *m, struct tree_root *root, int subvol,
			    const struct timespec *now)
{
	struct btrfs_root_item ri;
	struct btrfs_key key = { root->objectid, BTRFS_ROOT_ITEM_KEY, 0 };
	u64 gen = m->txn.tt.transid;

	memset(&ri, 0, sizeof(ri));
	if (subvol) {
		fill_dir_inode(&ri.inode, 1, m->vol.nodesize, now);
		btrfs_set_inode_size(&ri.inode, 3);
		btrfs_set_root_dirid(&ri, BTRFS_FIRST_FREE_OBJECTID);
		set_time(&ri.ctime, now);
		set_time(&ri.otime, now);
		if (root->objectid == BTRFS_FS_TREE_OBJECTID)
			uuid_generate(ri.uuid);
	}
	btrfs_set_inode_flags(&ri.inode, BTRFS_INODE_ROOT_ITEM_INIT);
	btrfs_set_root_generation(&ri, gen);
	btrfs_set_root_generation_v2(&ri, gen);
	btrfs_set_root_bytenr(&ri, root->bytenr);
	btrfs_set_root_bytes_used(&ri, root->bytes_used);
	btrfs_set_root_refs(&ri, 1);
	ri.level = root->level;
	return tree_insert_item(&m->txn.tt, &m->root_tree, &key, &ri, sizeof(ri));
}

/* Directory 6 of the root tree and its "default" entry. */
static int make_root_tree_dir(struct mkfs_state *m, const struct timespec *now)
{
	static const char def[] = "default";
	struct btrfs_inode_item ii;
	struct btrfs_key key = { BTRFS_ROOT_TREE_DIR_OBJECTID, BTRFS_INODE_ITEM_KEY, 0 };
	u8 buf[sizeof(struct btrfs_dir_item) + sizeof(def)];
	struct btrfs_dir_item *di = (void *)buf;
	struct btrfs_key loc = { BTRFS_FS_TREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, (u64)-1 };
	u8 ref[sizeof(struct btrfs_inode_ref) + 7];
	int ret;

	fill_dir_inode(&ii, m->txn.tt.transid, m->vol.nodesize, now);
	ret = inode_insert_top_dir(&m->txn.tt, &m->root_tree, BTRFS_ROOT_TREE_DIR_OBJECTID, &ii);
	if (ret)
		return ret;
	memset(buf, 0, sizeof(buf));
	btrfs_cpu_to_disk_key(&di->location, &loc);
	btrfs_set_dir_name_len(di, sizeof(def) - 1);
	di->type = BTRFS_FT_DIR;
	memcpy(buf + sizeof(*di), def, sizeof(def) - 1);
	key.type = BTRFS_DIR_ITEM_KEY;
	key.offset = btrfs_name_hash(def, sizeof(def) - 1);
	ret = tree_insert_item(&m->txn.tt, &m->root_tree, &key, buf,
			       sizeof(*di) + sizeof(def) - 1);
	if (ret)
		return ret;
	/* subvolume 5 is named "default" inside directory 6 */
	memset(ref, 0, sizeof(ref));
	btrfs_set_inode_ref_name_len((struct btrfs_inode_ref *)ref, 7);
	memcpy(ref + sizeof(struct btrfs_inode_ref), def, 7);
	key.objectid = BTRFS_FS_TREE_OBJECTID;
	key.type = BTRFS_INODE_REF_KEY;
	key.offset = BTRFS_ROOT_TREE_DIR_OBJECTID;
	return tree_insert_item(&m->txn.tt, &m->root_tree, &key, ref, sizeof(ref));
}

static int insert_dev_items(struct mkfs_state *m)
{
	size_t i;
	int ret;

	for (i = 0; i < m->vol.ndevs; i++) {
		const struct btrfs_device *dev = m->vol.devs[i];
		struct btrfs_dev_item di;
		struct btrfs_key key = { BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, dev->devid };

		memset(&di, 0, sizeof(di));
		btrfs_set_dev_item_devid(&di, dev->devid);
		btrfs_set_dev_item_total_bytes(&di, dev->total_bytes);
		btrfs_set_dev_item_bytes_used(&di, dev->bytes_used);
		put_le32(&di.io_align, m->vol.sectorsize);
		put_le32(&di.io_width, m->vol.sectorsize);
		put_le32(&di.sector_size, m->vol.sectorsize);
		memcpy(di.uuid, dev->uuid, BTRFS_UUID_SIZE);
		memcpy(di.fsid, m->vol.fsid, BTRFS_FSID_SIZE);
		ret = tree_insert_item(&m->txn.tt, &m->chunk_tree, &key, &di, sizeof(di));
		if (ret)
			return ret;
	}
	return 0;
}

static u64 clamp_u64(u64 v, u64 lo, u64 hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

static int check_opts(const struct butter_mkfs_opts *o, const struct blog *log, u32 *nodesize,
		      u32 *sectorsize, u16 *csum_type, u64 *data_p, u64 *meta_p)
{
	*sectorsize = o->sectorsize ? o->sectorsize : 4096;
	*nodesize = o->nodesize ? o->nodesize : o->mixed ? *sectorsize : 16384;
	*csum_type = o->csum_type < 0 ? BTRFS_CSUM_TYPE_CRC32 : (u16)o->csum_type;
	if (*sectorsize != 4096) {
		blog_err(log, "sector size %u is not supported (only 4096, the page size here)",
			 *sectorsize);
		return -EINVAL;
	}
	if (*nodesize < *sectorsize || *nodesize > BTRFS_MAX_NODESIZE ||
	    (*nodesize & (*nodesize - 1))) {
		blog_err(log, "invalid node size %u (a power of two from %u to 65536)", *nodesize,
			 *sectorsize);
		return -EINVAL;
	}
	if (o->mixed && *nodesize != *sectorsize) {
		blog_err(log, "node size %u must equal the sector size %u with mixed block groups",
			 *nodesize, *sectorsize);
		return -EINVAL;
	}
	if (btrfs_csum_size(*csum_type) == 0) {
		blog_err(log, "unknown checksum type %d", o->csum_type);
		return -EINVAL;
	}
	if (o->label && strlen(o->label) >= BTRFS_LABEL_SIZE) {
		blog_err(log, "label is longer than %d bytes", BTRFS_LABEL_SIZE - 1);
		return -EINVAL;
	}
	*data_p = o->data_profile ? o->data_profile : BUTTER_PROFILE_SINGLE;
	*meta_p = o->meta_profile ? o->meta_profile
				  : (o->ndevices > 1 ? BTRFS_BLOCK_GROUP_RAID1 : BTRFS_BLOCK_GROUP_DUP);
	if (o->mixed) {
		/* one profile for both, single unless one is given (as mkfs.btrfs -M) */
		if (o->data_profile && o->meta_profile && o->data_profile != o->meta_profile) {
			blog_err(log, "with mixed block groups data and metadata profiles must be "
				      "the same");
			return -EINVAL;
		}
		*data_p = *meta_p = o->data_profile	? o->data_profile
				    : o->meta_profile ? o->meta_profile
						      : BUTTER_PROFILE_SINGLE;
	}
	if (((*data_p | *meta_p) & BTRFS_BLOCK_GROUP_RAID6) && o->ndevices < 3) {
		blog_err(log, "raid6 needs at least 3 devices");
		return -EINVAL;
	}
	if (((*data_p | *meta_p) & BTRFS_BLOCK_GROUP_RAID5) && o->ndevices < 2) {
		blog_err(log, "raid5 needs at least 2 devices");
		return -EINVAL;
	}
	*data_p &= ~BUTTER_PROFILE_SINGLE;
	*meta_p &= ~BUTTER_PROFILE_SINGLE;
	return 0;
}

/* Open and size the devices, refusing to overwrite a filesystem unless forced. */
static int open_devices(struct mkfs_state *m, const struct butter_mkfs_opts *o)
{
	struct btrfs_volumes *vol = &m->vol;
	size_t i;
	int ret;

	vol->devs = calloc(o->ndevices, sizeof(*vol->devs));
	if (!vol->devs)
		return -ENOMEM;
	for (i = 0; i < o->ndevices; i++) {
		struct btrfs_super_block *old = malloc(sizeof(*old));
		struct blog quiet = { NULL, NULL, -1 };
		struct btrfs_device *dev;
		struct blockdev *bdev;

		if (!old)
			return -ENOMEM;
		ret = blockdev_create(o->devices[i], o->size, &m->log, &bdev);
		if (ret) {
			free(old);
			/* a busy claim named the holder; the NBD backend names its URI */
			if (ret != -EBUSY && !blockdev_name_is_nbd(o->devices[i]))
				blog_err(&m->log, "%s: %s", o->devices[i], strerror(-ret));
			return ret;
		}
		if (!o->force && btrfs_read_super(bdev, &quiet, old) == 0) {
			free(old);
			blockdev_close(bdev);
			blog_err(&m->log, "%s: already holds a btrfs filesystem (use -f to overwrite)",
				 o->devices[i]);
			return -EEXIST;
		}
		free(old);
		dev = calloc(1, sizeof(*dev));
		if (!dev || !(dev->path = strdup(o->devices[i]))) {
			free(dev);
			blockdev_close(bdev);
			return -ENOMEM;
		}
		dev->devid = i + 1;
		uuid_generate(dev->uuid);
		dev->bdev = bdev;
		dev->total_bytes = (o->size && o->size < bdev->size ? o->size : bdev->size);
		dev->total_bytes -= dev->total_bytes % vol->sectorsize;
		vol->devs[vol->ndevs++] = dev;
		if (dev->total_bytes < 64 * MIB) {
			blog_err(&m->log, "%s: %llu bytes is too small (at least 64 MiB)",
				 o->devices[i], (unsigned long long)dev->total_bytes);
			return -ENOSPC;
		}
	}
	return 0;
}

static void init_super(struct mkfs_state *m, const struct butter_mkfs_opts *o, u64 data_p,
		       u64 meta_p)
{
	struct btrfs_super_block *sb = &m->vol.super;
	u64 total = 0, incompat;
	size_t i;

	for (i = 0; i < m->vol.ndevs; i++)
		total += m->vol.devs[i]->total_bytes;
	memset(sb, 0, sizeof(*sb));
	memcpy(sb->fsid, m->vol.fsid, BTRFS_FSID_SIZE);
	memcpy(sb->metadata_uuid, m->vol.fsid, BTRFS_FSID_SIZE);
	btrfs_set_super_magic(sb, BTRFS_MAGIC);
	btrfs_set_super_total_bytes(sb, total);
	btrfs_set_super_root_dir(sb, BTRFS_ROOT_TREE_DIR_OBJECTID);
	btrfs_set_super_num_devices(sb, m->vol.ndevs);
	btrfs_set_super_sectorsize(sb, m->vol.sectorsize);
	btrfs_set_super_nodesize(sb, m->vol.nodesize);
	put_le32(&sb->unused_leafsize, m->vol.nodesize);
	btrfs_set_super_stripesize(sb, m->vol.sectorsize);
	btrfs_set_super_csum_type(sb, m->vol.csum_type);
	incompat = BTRFS_FEATURE_INCOMPAT_MIXED_BACKREF | BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF |
		   BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA | BTRFS_FEATURE_INCOMPAT_NO_HOLES;
	if (m->vol.nodesize > 4096)
		incompat |= BTRFS_FEATURE_INCOMPAT_BIG_METADATA;
	if (o->mixed)
		incompat |= BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS;
	if ((data_p | meta_p) & (BTRFS_BLOCK_GROUP_RAID1C3 | BTRFS_BLOCK_GROUP_RAID1C4))
		incompat |= BTRFS_FEATURE_INCOMPAT_RAID1C34;
	if ((data_p | meta_p) & BTRFS_BLOCK_GROUP_RAID56_MASK)
		incompat |= BTRFS_FEATURE_INCOMPAT_RAID56;
	btrfs_set_super_incompat_flags(sb, incompat);
	btrfs_set_super_compat_ro_flags(sb, BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE |
						    BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID);
	if (o->label)
		strncpy(sb->label, o->label, BTRFS_LABEL_SIZE - 1);
}

static void mkfs_cleanup(struct mkfs_state *m)
{
	txn_ctx_destroy(&m->txn);
	if (m->es_ok)
		extent_state_destroy(&m->es);
	if (m->cache_ok)
		node_cache_destroy(&m->cache);
	volumes_close(&m->vol);
}

int butter_mkfs(const struct butter_mkfs_opts *o)
{
	struct mkfs_state *m;
	struct timespec now;
	u64 data_p, meta_p, sys_l = 0, meta_l = 0, data_l = 0, smallest = UINT64_MAX;
	u16 csum_type;
	u32 nodesize, sectorsize;
	size_t i;
	int ret;

	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->log.fn = o->log;
	m->log.arg = o->log_arg;
	m->log.level = BUTTER_LOG_WARNING;
	if (o->ndevices == 0) {
		free(m);
		return -EINVAL;
	}
	ret = check_opts(o, &m->log, &nodesize, &sectorsize, &csum_type, &data_p, &meta_p);
	if (ret) {
		free(m);
		return ret;
	}
	clock_gettime(CLOCK_REALTIME, &now);
	m->vol.log = &m->log;
	m->vol.sectorsize = sectorsize;
	m->vol.nodesize = nodesize;
	m->vol.csum_type = csum_type;
	m->vol.csum_size = (u32)btrfs_csum_size(csum_type);
	uuid_generate(m->vol.fsid);
	memcpy(m->vol.meta_fsid, m->vol.fsid, BTRFS_FSID_SIZE);
	uuid_generate(m->vol.chunk_tree_uuid);
	ret = open_devices(m, o);
	if (ret)
		goto out;
	init_super(m, o, data_p, meta_p);
	ret = node_cache_init(&m->cache, &m->vol, 64 * MIB);
	if (ret)
		goto out;
	m->cache_ok = 1;
	extent_state_init(&m->es, &m->vol, &m->cache);
	m->es_ok = 1;
	m->es.extent_root = &m->extent_tree;
	m->es.bg_root = &m->extent_tree;
	m->es.fst_root = &m->fst;
	m->es.csum_root = &m->csum_tree;
	m->es.chunk_root = &m->chunk_tree;
	m->es.dev_root = &m->dev_tree;
	ret = chunk_init_devspace(&m->es, 0);
	if (ret)
		goto out;

	/* chunk sizes scale with the smallest device */
	for (i = 0; i < m->vol.ndevs; i++)
		if (m->vol.devs[i]->total_bytes < smallest)
			smallest = m->vol.devs[i]->total_bytes;
	ret = chunk_create(&m->es, BTRFS_BLOCK_GROUP_SYSTEM | meta_p, 4 * MIB, &sys_l);
	if (ret == 0)
		ret = chunk_create(&m->es, BTRFS_BLOCK_GROUP_METADATA | meta_p,
				   clamp_u64(smallest / 16, 8 * MIB, 256 * MIB), &meta_l);
	/* mixed: the metadata chunk is DATA|METADATA (chunk_create) and holds data too */
	data_l = meta_l;
	if (ret == 0 && !o->mixed)
		ret = chunk_create(&m->es, BTRFS_BLOCK_GROUP_DATA | data_p,
				   clamp_u64(smallest / 8, 8 * MIB, 1024 * MIB), &data_l);
	if (ret) {
		blog_err(&m->log, "cannot place the initial chunks: %s%s", strerror(-ret),
			 ret == -ENOSPC ? " (devices too small or too few for the profile)" : "");
		goto out;
	}

	m->txn.vol = &m->vol;
	m->txn.cache = &m->cache;
	m->txn.es = &m->es;
	m->txn.log = &m->log;
	m->txn.root_tree = &m->root_tree;
	m->txn.chunk_tree = &m->chunk_tree;
	ret = txn_begin(&m->txn);
	if (ret)
		goto out;
	{
		struct {
			struct tree_root *root;
			u64 objectid;
		} trees[] = {
			{ &m->root_tree, BTRFS_ROOT_TREE_OBJECTID },
			{ &m->chunk_tree, BTRFS_CHUNK_TREE_OBJECTID },
			{ &m->extent_tree, BTRFS_EXTENT_TREE_OBJECTID },
			{ &m->dev_tree, BTRFS_DEV_TREE_OBJECTID },
			{ &m->fs_tree, BTRFS_FS_TREE_OBJECTID },
			{ &m->csum_tree, BTRFS_CSUM_TREE_OBJECTID },
			{ &m->fst, BTRFS_FREE_SPACE_TREE_OBJECTID },
			{ &m->data_reloc, BTRFS_DATA_RELOC_TREE_OBJECTID },
		};

		for (i = 0; i < sizeof(trees) / sizeof(trees[0]) && ret == 0; i++) {
			ret = tree_create_root(&m->txn.tt, trees[i].objectid, trees[i].root);
			if (ret == 0 && i >= 2)
				ret = txn_track_root(&m->txn, trees[i].root);
		}
	}
	if (ret == 0)
		ret = insert_dev_items(m);
	if (ret == 0)
		ret = chunk_insert_items(&m->es, &m->txn.tt, sys_l);
	if (ret == 0)
		ret = chunk_insert_items(&m->es, &m->txn.tt, meta_l);
	if (ret == 0 && data_l != meta_l)
		ret = chunk_insert_items(&m->es, &m->txn.tt, data_l);
	if (ret == 0)
		ret = inode_make_root_dir(&m->txn.tt, &m->fs_tree, m->vol.nodesize);
	if (ret == 0)
		ret = inode_make_root_dir(&m->txn.tt, &m->data_reloc, m->vol.nodesize);
	if (ret == 0)
		ret = make_root_tree_dir(m, &now);
	if (ret == 0)
		ret = insert_root_item(m, &m->extent_tree, 0, &now);
	if (ret == 0)
		ret = insert_root_item(m, &m->dev_tree, 0, &now);
	if (ret == 0)
		ret = insert_root_item(m, &m->fs_tree, 1, &now);
	if (ret == 0)
		ret = insert_root_item(m, &m->csum_tree, 0, &now);
	if (ret == 0)
		ret = insert_root_item(m, &m->fst, 0, &now);
	if (ret == 0)
		ret = insert_root_item(m, &m->data_reloc, 1, &now);
	if (ret) {
		txn_abort(&m->txn, ret, "mkfs");
		goto out;
	}
	ret = txn_commit(&m->txn);
out:
	mkfs_cleanup(m);
	free(m);
	return ret;
}
