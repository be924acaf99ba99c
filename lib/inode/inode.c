/*
 * inode.c — inodes and names: reading inode items, looking a name up in a
 * directory, crossing into subvolumes, resolving paths, stat.
 *
 * Identity: a file is (subvolume id, inode number). A directory entry whose
 * location is a ROOT_ITEM names a subvolume; it resolves to that subvolume's
 * root directory when the subvolume is linked there (a ROOT_REF from this
 * subvolume exists), otherwise — a snapshot taken of a tree that contained a
 * subvolume — to the empty placeholder directory, inode 2, as the kernel
 * shows it.
 */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "format/checksum.h"
#include "inode/inode.h"


int inode_read(struct butter_fs *fs, butter_ino_t ino, struct btrfs_inode_item *item)
{
	struct btrfs_key key = { ino.ino, BTRFS_INODE_ITEM_KEY, 0 };
	struct subvol sv;
	int ret;

	ret = fs_get_subvol(fs, ino.subvol, &sv);
	if (ret)
		return ret;
	ret = tree_lookup_item(&fs->cache, &sv.root, &key, item, sizeof(*item));
	if (ret < 0)
		return ret;
	if ((size_t)ret < sizeof(*item))
		return BLOG_CORRUPT(&fs->log, "subvolume %llu inode %llu: item of %d bytes",
				    (unsigned long long)ino.subvol, (unsigned long long)ino.ino, ret);
	return 0;
}

/* The kernel stores rdev as its internal dev_t: major << 20 | minor. */
u64 inode_rdev_to_user(u64 disk)
{
	return makedev((unsigned)(disk >> 20), (unsigned)(disk & 0xfffff));
}

u64 inode_rdev_to_disk(u64 user)
{
	return ((u64)major(user) << 20) | (minor(user) & 0xfffff);
}

unsigned inode_mode_to_dtype(u32 mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG: return DT_REG;
	case S_IFDIR: return DT_DIR;
	case S_IFLNK: return DT_LNK;
	case S_IFCHR: return DT_CHR;
	case S_IFBLK: return DT_BLK;
	case S_IFIFO: return DT_FIFO;
	case S_IFSOCK: return DT_SOCK;
	default: return DT_UNKNOWN;
	}
}

unsigned inode_ft_to_dtype(u8 ft)
{
	switch (ft & ~BTRFS_FT_ENCRYPTED) {
	case BTRFS_FT_REG_FILE: return DT_REG;
	case BTRFS_FT_DIR: return DT_DIR;
	case BTRFS_FT_CHRDEV: return DT_CHR;
	case BTRFS_FT_BLKDEV: return DT_BLK;
	case BTRFS_FT_FIFO: return DT_FIFO;
	case BTRFS_FT_SOCK: return DT_SOCK;
	case BTRFS_FT_SYMLINK: return DT_LNK;
	default: return DT_UNKNOWN;
	}
}

int inode_walk_dir_items(struct butter_fs *fs, const u8 *item, u32 size,
			 int (*fn)(void *arg, const struct btrfs_dir_item *di, const char *name,
				const u8 *value),
			 void *arg)
{
	u32 pos = 0;

	while (pos < size) {
		const struct btrfs_dir_item *di = (const struct btrfs_dir_item *)(item + pos);
		u32 name_len, data_len, total;
		int ret;

		if (size - pos < sizeof(*di))
			return BLOG_CORRUPT(&fs->log, "dir item: truncated entry header");
		name_len = btrfs_dir_name_len(di);
		data_len = btrfs_dir_data_len(di);
		total = (u32)sizeof(*di) + name_len + data_len;
		if (total > size - pos)
			return BLOG_CORRUPT(&fs->log, "dir item: entry overruns the item (%u > %u)",
					    total, size - pos);
		if (name_len == 0 || (di->type != BTRFS_FT_XATTR && name_len > BTRFS_NAME_LEN))
			return BLOG_CORRUPT(&fs->log, "dir item: invalid name length %u", name_len);
		ret = fn(arg, di, (const char *)(di + 1), (const u8 *)(di + 1) + name_len);
		if (ret)
			return ret;
		pos += total;
	}
	return 0;
}

/* Does subvolume @parent hold a ROOT_REF to @child? */
static int subvol_linked(struct butter_fs *fs, u64 parent, u64 child)
{
	struct btrfs_key key = { parent, BTRFS_ROOT_REF_KEY, child };
	u8 buf[sizeof(struct btrfs_root_ref)];
	int ret = tree_lookup_item(&fs->cache, &fs->root_tree, &key, buf, sizeof(buf));

	if (ret == -ENOENT)
		return 0;
	return ret < 0 ? ret : 1;
}

int inode_location_to_ino(struct butter_fs *fs, u64 subvol, const struct btrfs_key *location,
			  butter_ino_t *out)
{
	struct subvol sv;
	int ret;

	if (location->type == BTRFS_INODE_ITEM_KEY) {
		out->subvol = subvol;
		out->ino = location->objectid;
		return 0;
	}
	if (location->type != BTRFS_ROOT_ITEM_KEY)
		return BLOG_CORRUPT(&fs->log, "subvolume %llu: dir entry location type %u",
				    (unsigned long long)subvol, location->type);
	ret = subvol_linked(fs, subvol, location->objectid);
	if (ret < 0)
		return ret;
	if (ret == 1) {
		ret = fs_get_subvol(fs, location->objectid, &sv);
		if (ret == 0) {
			out->subvol = sv.id;
			out->ino = sv.dirid;
			return 0;
		}
		if (ret != -ENOENT)
			return ret;
	}
	out->subvol = subvol;
	out->ino = BTRFS_EMPTY_SUBVOL_DIR_OBJECTID;
	return 0;
}

int inode_root(struct butter_fs *fs, uint64_t subvolid, butter_ino_t *out)
{
	struct subvol sv;
	int ret;

	if (subvolid == 0)
		subvolid = fs->default_subvol;
	ret = fs_get_subvol(fs, subvolid, &sv);
	if (ret)
		return ret;
	out->subvol = sv.id;
	out->ino = sv.dirid;
	return 0;
}

static void fill_time(struct timespec *ts, const struct btrfs_timespec *t)
{
	ts->tv_sec = (time_t)btrfs_timespec_sec(t);
	ts->tv_nsec = (long)btrfs_timespec_nsec(t);
	if (ts->tv_nsec >= 1000000000L)
		ts->tv_nsec = 999999999L;
}

/*
 * Return st_blocks for an inode of @nbytes bytes, as the kernel's getattr
 * reports it: the bytes rounded up to whole sectors, in 512-byte units (a file
 * of 5 inline bytes holds one sector). butter has no delayed allocation: what
 * a write adds is in nbytes when the write returns.
 */
static u64 stat_blocks(u64 nbytes, u32 sectorsize)
{
	u64 sectors = nbytes / sectorsize + (nbytes % sectorsize != 0);

	return sectors * (sectorsize / 512);
}

/* butter_stat().flags are the inode item's: the public names must be btrfs's bits */
_Static_assert(BUTTER_INODE_IMMUTABLE == BTRFS_INODE_IMMUTABLE_FLAG, "chattr +i bit");
_Static_assert(BUTTER_INODE_APPEND == BTRFS_INODE_APPEND_FLAG, "chattr +a bit");

void inode_item_stat(struct butter_fs *fs, butter_ino_t ino, const struct btrfs_inode_item *item,
		     struct butter_stat *st)
{
	memset(st, 0, sizeof(*st));
	st->subvol = ino.subvol;
	st->ino = ino.ino;
	st->mode = btrfs_inode_mode(item);
	st->nlink = btrfs_inode_nlink(item);
	st->uid = btrfs_inode_uid(item);
	st->gid = btrfs_inode_gid(item);
	st->rdev = inode_rdev_to_user(btrfs_inode_rdev(item));
	st->size = btrfs_inode_size(item);
	st->blocks = stat_blocks(btrfs_inode_nbytes(item), fs->vol.sectorsize);
	st->generation = btrfs_inode_generation(item);
	st->transid = btrfs_inode_transid(item);
	st->flags = btrfs_inode_flags(item);
	fill_time(&st->atime, &item->atime);
	fill_time(&st->mtime, &item->mtime);
	fill_time(&st->ctime, &item->ctime);
	fill_time(&st->otime, &item->otime);
}

int inode_stat(struct butter_fs *fs, butter_ino_t ino, struct butter_stat *st)
{
	struct btrfs_inode_item item;
	int ret;

	if (ino.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID) {
		/* placeholder for a subvolume not present in this snapshot */
		memset(st, 0, sizeof(*st));
		st->subvol = ino.subvol;
		st->ino = ino.ino;
		st->mode = S_IFDIR | 0755;
		st->nlink = 1;
		return 0;
	}
	ret = inode_read(fs, ino, &item);
	if (ret)
		return ret;
	inode_item_stat(fs, ino, &item, st);
	return 0;
}

struct name_match {
	const char *name;
	size_t len;
	struct btrfs_key location;
	u8 type;     /* the entry's BTRFS_FT_* */
	int found;
};

static int match_name(void *arg, const struct btrfs_dir_item *di, const char *name,
		      const u8 *value)
{
	struct name_match *m = arg;

	(void)value;
	if (btrfs_dir_name_len(di) == m->len && memcmp(name, m->name, m->len) == 0) {
		btrfs_disk_to_cpu_key(&m->location, &di->location);
		m->type = di->type;
		m->found = 1;
		return 1;
	}
	return 0;
}

/* The parent directory of @dir (for ".."). */
static int lookup_parent(struct butter_fs *fs, butter_ino_t dir, butter_ino_t *out)
{
	struct btrfs_key key = { dir.ino, BTRFS_INODE_REF_KEY, 0 };
	struct tree_path path;
	struct subvol sv;
	int ret;

	ret = fs_get_subvol(fs, dir.subvol, &sv);
	if (ret)
		return ret;
	if (dir.ino == sv.dirid) {
		/* a subvolume root: its parent is the directory holding its entry */
		struct btrfs_key bkey = { dir.subvol, BTRFS_ROOT_BACKREF_KEY, 0 };

		if (dir.subvol == BTRFS_FS_TREE_OBJECTID) {
			*out = dir;
			return 0;
		}
		tree_path_init(&path);
		ret = tree_search_forward(&fs->cache, &fs->root_tree, &bkey, &path);
		if (ret == 0) {
			const u8 *item;
			u32 size;

			path_key(&path, &bkey);
			item = path_item(&path, &size);
			if (bkey.objectid == dir.subvol && bkey.type == BTRFS_ROOT_BACKREF_KEY &&
			    size >= sizeof(struct btrfs_root_ref)) {
				out->subvol = bkey.offset;
				out->ino = btrfs_root_ref_dirid((const struct btrfs_root_ref *)item);
			} else {
				*out = dir;
			}
		} else if (ret == 1) {
			*out = dir;
			ret = 0;
		}
		tree_path_release(&fs->cache, &path);
		return ret;
	}
	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &sv.root, &key, &path);
	if (ret == 0) {
		path_key(&path, &key);
		if (key.objectid == dir.ino && key.type == BTRFS_INODE_REF_KEY) {
			out->subvol = dir.subvol;
			out->ino = key.offset;
		} else {
			ret = -ENOENT;
		}
	} else if (ret == 1) {
		ret = -ENOENT;
	}
	tree_path_release(&fs->cache, &path);
	return ret;
}

int inode_lookup_full(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		      butter_ino_t *out, unsigned *dtype, struct btrfs_inode_item *dir_item)
{
	struct btrfs_inode_item own, *item = dir_item ? dir_item : &own;
	struct name_match m = { name, namelen, { 0, 0, 0 }, 0, 0 };
	struct btrfs_key key;
	struct tree_path path;
	struct subvol sv;
	int ret;

	if (namelen == 0)
		return -ENOENT;
	if (namelen > BTRFS_NAME_LEN)
		return -ENAMETOOLONG;
	if (dir.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID)
		return -ENOENT;
	ret = inode_read(fs, dir, item);
	if (ret)
		return ret;
	if (!S_ISDIR(btrfs_inode_mode(item)))
		return -ENOTDIR;
	if (dtype)
		*dtype = DT_DIR;
	if (namelen == 1 && name[0] == '.') {
		*out = dir;
		return 0;
	}
	if (namelen == 2 && name[0] == '.' && name[1] == '.')
		return lookup_parent(fs, dir, out);
	ret = fs_get_subvol(fs, dir.subvol, &sv);
	if (ret)
		return ret;
	key.objectid = dir.ino;
	key.type = BTRFS_DIR_ITEM_KEY;
	key.offset = btrfs_name_hash(name, namelen);
	tree_path_init(&path);
	ret = tree_search(&fs->cache, &sv.root, &key, &path);
	if (ret == 0) {
		const u8 *data;
		u32 size;

		data = path_item(&path, &size);
		ret = inode_walk_dir_items(fs, data, size, match_name, &m);
		if (ret > 0)
			ret = 0;
	} else if (ret == 1) {
		ret = 0;
	}
	tree_path_release(&fs->cache, &path);
	if (ret)
		return ret;
	if (!m.found)
		return -ENOENT;
	if (dtype)
		*dtype = inode_ft_to_dtype(m.type);
	return inode_location_to_ino(fs, dir.subvol, &m.location, out);
}

int inode_lookup(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		 butter_ino_t *out)
{
	return inode_lookup_full(fs, dir, name, namelen, out, NULL, NULL);
}
