/*
 * names.c — the name items of a directory and of an inode: adding a name
 * (DIR_ITEM, DIR_INDEX, INODE_REF or INODE_EXTREF) and taking one away, the
 * next free directory index, and the top directory of a new tree.
 *
 * What a name costs (btrfs's rules, checked by btrfs check):
 *   INODE_REF (ino, INODE_REF, parent)  {index, name_len, name} (one per link
 *                                        in that parent, packed in one item)
 *   INODE_EXTREF (ino, INODE_EXTREF, hash(parent, name)) {parent, index,
 *                                        name_len, name}, when an INODE_REF
 *                                        item would outgrow a leaf
 *   DIR_ITEM  (parent, DIR_ITEM, hash)  {location, transid, 0, name_len, type, name}
 *   DIR_INDEX (parent, DIR_INDEX, index) same payload, one entry
 *   the parent's i_size grows by 2 * name_len.
 * Directory indexes start at 2; directories have nlink 1.
 *
 * A name is removed from the same places: the DIR_ITEM entry (cut out of its
 * item, or the item deleted if it was alone), the DIR_INDEX item, and the
 * INODE_REF (or INODE_EXTREF) entry that gives the index; the parent's i_size
 * drops by 2 * name_len. Everything here runs in phase 2 of a change.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "format/checksum.h"
#include "inode/inode.h"

int inode_next_dir_index(struct butter_fs *fs, struct subvol *sv, u64 dir, u64 *out)
{
	struct btrfs_key key = { dir, BTRFS_DIR_INDEX_KEY, (u64)-1 };
	int ret = tree_find_key(&fs->cache, &sv->root, &key, 1, &key);

	if (ret < 0)
		return ret;
	*out = 2;
	if (ret == 0 && key.objectid == dir && key.type == BTRFS_DIR_INDEX_KEY)
		*out = key.offset + 1;
	return 0;
}

int inode_insert_dir_entries(struct tree_trans *t, struct tree_root *root, u64 dir, const char *name,
			     size_t namelen, const struct btrfs_key *location, u8 ft, u64 index)
{
	u8 buf[sizeof(struct btrfs_dir_item) + BTRFS_NAME_LEN];
	struct btrfs_dir_item *di = (void *)buf;
	struct btrfs_key key;
	int ret;

	if (namelen > BTRFS_NAME_LEN)
		return -EUCLEAN;
	memset(buf, 0, sizeof(*di));
	btrfs_cpu_to_disk_key(&di->location, location);
	btrfs_set_dir_transid(di, t->transid);
	btrfs_set_dir_data_len(di, 0);
	btrfs_set_dir_name_len(di, (u16)namelen);
	di->type = ft;
	memcpy(buf + sizeof(*di), name, namelen);
	key.objectid = dir;
	key.type = BTRFS_DIR_ITEM_KEY;
	key.offset = btrfs_name_hash(name, namelen);
	ret = fs_insert_or_extend(t, root, &key, buf, (u32)(sizeof(*di) + namelen));
	if (ret)
		return ret;
	key.type = BTRFS_DIR_INDEX_KEY;
	key.offset = index;
	return tree_insert_item(t, root, &key, buf, (u32)(sizeof(*di) + namelen));
}

int inode_add_dir_entries(struct butter_fs *fs, struct subvol *sv, u64 dir, const char *name,
		       size_t namelen, const struct btrfs_key *location, u8 ft, u64 index)
{
	struct dir_update u = { 2 * (s64)namelen };
	int ret = inode_insert_dir_entries(&fs->w->txn.tt, &sv->root, dir, name, namelen, location, ft,
					   index);

	if (ret)
		return ret;
	return inode_modify(fs, sv, dir, inode_touch_dir, &u);
}

int inode_add_name(struct butter_fs *fs, struct subvol *sv, u64 dir, const char *name,
		   size_t namelen, u64 ino, u32 mode)
{
	struct fs_write_state *w = fs->w;
	struct tree_trans *t = &w->txn.tt;
	struct btrfs_key key, loc = { ino, BTRFS_INODE_ITEM_KEY, 0 };
	u8 ref[sizeof(struct btrfs_inode_ref) + BTRFS_NAME_LEN];
	u64 index;
	int ret;

	ret = inode_next_dir_index(fs, sv, dir, &index);
	if (ret)
		return ret;
	btrfs_set_inode_ref_index((struct btrfs_inode_ref *)ref, index);
	btrfs_set_inode_ref_name_len((struct btrfs_inode_ref *)ref, (u16)namelen);
	memcpy(ref + sizeof(struct btrfs_inode_ref), name, namelen);
	key.objectid = ino;
	key.type = BTRFS_INODE_REF_KEY;
	key.offset = dir;
	ret = tree_lookup_item(&fs->cache, &sv->root, &key, NULL, 0);
	if (ret >= 0 && (u64)ret + sizeof(struct btrfs_inode_ref) + namelen >
				tree_max_item_size(&fs->cache) / 2 &&
	    (btrfs_super_incompat_flags(&fs->vol.super) & BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF)) {
		/* the ref item of this parent is full: an extended ref holds the name */
		u8 ext[sizeof(struct btrfs_inode_extref) + BTRFS_NAME_LEN];
		struct btrfs_inode_extref *er = (void *)ext;

		btrfs_set_inode_extref_parent(er, dir);
		btrfs_set_inode_extref_index(er, index);
		btrfs_set_inode_extref_name_len(er, (u16)namelen);
		memcpy(ext + sizeof(*er), name, namelen);
		key.type = BTRFS_INODE_EXTREF_KEY;
		key.offset = btrfs_extref_hash(dir, name, namelen);
		ret = fs_insert_or_extend(t, &sv->root, &key, ext, (u32)(sizeof(*er) + namelen));
	} else if (ret >= 0 || ret == -ENOENT) {
		ret = fs_insert_or_extend(t, &sv->root, &key, ref,
					  (u32)(sizeof(struct btrfs_inode_ref) + namelen));
	}
	if (ret)
		return ret;
	return inode_add_dir_entries(fs, sv, dir, name, namelen, &loc, inode_mode_to_ft(mode), index);
}

/*
 * Insert @ii as the inode item of directory @objectid in @root, and the ".."
 * INODE_REF that makes it its own parent (the top directory of a tree).
 */
int inode_insert_top_dir(struct tree_trans *t, struct tree_root *root, u64 objectid,
			 const struct btrfs_inode_item *ii)
{
	struct btrfs_key key = { objectid, BTRFS_INODE_ITEM_KEY, 0 };
	u8 ref[sizeof(struct btrfs_inode_ref) + 2];
	int ret;

	ret = tree_insert_item(t, root, &key, ii, sizeof(*ii));
	if (ret)
		return ret;
	memset(ref, 0, sizeof(ref));
	btrfs_set_inode_ref_name_len((struct btrfs_inode_ref *)ref, 2);
	memcpy(ref + sizeof(struct btrfs_inode_ref), "..", 2);
	key.type = BTRFS_INODE_REF_KEY;
	key.offset = objectid;
	return tree_insert_item(t, root, &key, ref, sizeof(ref));
}

/*
 * The root directory (inode 256, its own parent) of a new subvolume tree,
 * made in @t. @nbytes goes into the inode (mkfs.btrfs uses the node size).
 * Used by subvolume creation and by mkfs.
 */
int inode_make_root_dir(struct tree_trans *t, struct tree_root *root, u64 nbytes)
{
	struct btrfs_inode_item ii;

	memset(&ii, 0, sizeof(ii));
	btrfs_set_inode_generation(&ii, t->transid);
	btrfs_set_inode_transid(&ii, t->transid);
	btrfs_set_inode_nbytes(&ii, nbytes);
	btrfs_set_inode_nlink(&ii, 1);
	btrfs_set_inode_mode(&ii, S_IFDIR | 0755);
	fs_now_ts(&ii.atime);
	ii.ctime = ii.mtime = ii.otime = ii.atime;
	return inode_insert_top_dir(t, root, BTRFS_FIRST_FREE_OBJECTID, &ii);
}

/* Entry matchers: return the entry's length if it matches, 0 if not, <0 if malformed. */
typedef long (*entry_match_fn)(const u8 *p, u32 left, const void *arg);

struct name_arg {
	const char *name;
	size_t len;
	u64 parent;     /* extrefs */
	u64 index;      /* out: the ref's index */
};

/*
 * The verdict on an entry at @p (@left bytes on) whose @hdr-byte header is
 * followed by its name (@name_len bytes) and @data_len bytes more: its
 * length if it holds @a's name (and @same_parent), -EUCLEAN if it runs past
 * the item, else -(its length) - 1000000.
 */
static long name_verdict(const struct name_arg *a, const u8 *p, u32 left, u32 hdr, u32 name_len,
			 u32 data_len, int same_parent)
{
	u32 total = hdr + name_len + data_len;

	if (total > left)
		return -EUCLEAN;
	if (same_parent && name_len == a->len && !memcmp(p + hdr, a->name, a->len))
		return total;
	return -(long)total - 1000000;
}

static long match_dir_entry(const u8 *p, u32 left, const void *varg)
{
	const struct btrfs_dir_item *di = (const void *)p;

	if (left < sizeof(*di))
		return -EUCLEAN;
	return name_verdict(varg, p, left, sizeof(*di), btrfs_dir_name_len(di),
			    btrfs_dir_data_len(di), 1);
}

static long match_inode_ref(const u8 *p, u32 left, const void *varg)
{
	struct name_arg *a = (struct name_arg *)varg;
	const struct btrfs_inode_ref *r = (const void *)p;
	long m;

	if (left < sizeof(*r))
		return -EUCLEAN;
	m = name_verdict(a, p, left, sizeof(*r), btrfs_inode_ref_name_len(r), 0, 1);
	if (m > 0)
		a->index = btrfs_inode_ref_index(r);
	return m;
}

static long match_inode_extref(const u8 *p, u32 left, const void *varg)
{
	struct name_arg *a = (struct name_arg *)varg;
	const struct btrfs_inode_extref *r = (const void *)p;
	long m;

	if (left < sizeof(*r))
		return -EUCLEAN;
	m = name_verdict(a, p, left, sizeof(*r), btrfs_inode_extref_name_len(r), 0,
			 btrfs_inode_extref_parent(r) == a->parent);
	if (m > 0)
		a->index = btrfs_inode_extref_index(r);
	return m;
}

/*
 * Cut the entry @match accepts out of the item at @key. Returns 0, 1 if no
 * such item or entry, negative errno.
 */
static int cut_entry(struct butter_fs *fs, struct tree_root *root, const struct btrfs_key *key,
		     entry_match_fn match, void *arg)
{
	struct tree_trans *t = &fs->w->txn.tt;
	struct tree_path path;
	u32 size, pos = 0;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(t, root, key, &path, 0, 1);
	if (ret) {
		tree_path_release(&fs->cache, &path);
		return ret;
	}
	{
		u8 *p = path_item_mut(&path, &size);

		while (pos < size) {
			long m = match(p + pos, size - pos, arg);

			if (m == -EUCLEAN) {
				ret = BLOG_CORRUPT(&fs->log, "item (%llu %u %llu): malformed entry",
						   (unsigned long long)key->objectid, key->type,
						   (unsigned long long)key->offset);
				break;
			}
			if (m > 0) {
				if ((u32)m == size) {
					ret = tree_del_items(t, root, &path, 1);
				} else {
					memmove(p + pos, p + pos + m, size - pos - (u32)m);
					ret = tree_truncate_item(t, &path, size - (u32)m);
				}
				tree_path_release(&fs->cache, &path);
				return ret;
			}
			pos += (u32)(-m - 1000000);
		}
	}
	tree_path_release(&fs->cache, &path);
	return ret ? ret : 1;
}

static int delete_item(struct butter_fs *fs, struct tree_root *root, const struct btrfs_key *key)
{
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(&fs->w->txn.tt, root, key, &path, 0, 1);
	if (ret == 0)
		ret = tree_del_items(&fs->w->txn.tt, root, &path, 1);
	tree_path_release(&fs->cache, &path);
	return ret;
}

int inode_remove_dir_entry(struct butter_fs *fs, struct subvol *sv, u64 dir, const char *name,
			   size_t len, u64 index)
{
	struct name_arg a = { name, len, dir, 0 };
	struct btrfs_key key = { dir, BTRFS_DIR_ITEM_KEY, btrfs_name_hash(name, len) };
	struct dir_update u = { -2 * (s64)len };
	int ret;

	ret = cut_entry(fs, &sv->root, &key, match_dir_entry, &a);
	if (ret == 1)
		ret = BLOG_CORRUPT(&fs->log, "dir %llu: entry without its dir item",
				   (unsigned long long)dir);
	if (ret)
		return ret;
	key.type = BTRFS_DIR_INDEX_KEY;
	key.offset = index;
	ret = delete_item(fs, &sv->root, &key);
	if (ret == 1)
		ret = BLOG_CORRUPT(&fs->log, "dir %llu: no index %llu", (unsigned long long)dir,
				   (unsigned long long)index);
	if (ret)
		return ret;
	return inode_modify(fs, sv, dir, inode_touch_dir, &u);
}

int inode_cut_dir_entry(struct butter_fs *fs, struct tree_root *root, const struct btrfs_key *key,
			const char *name, size_t len)
{
	struct name_arg a = { name, len, 0, 0 };

	return cut_entry(fs, root, key, match_dir_entry, &a);
}

int inode_remove_name(struct butter_fs *fs, struct subvol *sv, u64 dir, const char *name,
		   size_t len, u64 ino)
{
	struct name_arg a = { name, len, dir, 0 };
	struct btrfs_key key = { ino, BTRFS_INODE_REF_KEY, dir };
	int ret;

	ret = cut_entry(fs, &sv->root, &key, match_inode_ref, &a);
	if (ret == 1) {
		key.type = BTRFS_INODE_EXTREF_KEY;
		key.offset = btrfs_extref_hash(dir, name, len);
		ret = cut_entry(fs, &sv->root, &key, match_inode_extref, &a);
	}
	if (ret == 1)
		ret = BLOG_CORRUPT(&fs->log, "inode %llu: no back reference from dir %llu",
				   (unsigned long long)ino, (unsigned long long)dir);
	if (ret)
		return ret;
	return inode_remove_dir_entry(fs, sv, dir, name, len, a.index);
}

/* ---- decoding the entries packed in name items ---- */

/* ---- entries packed in items ---- */

/* Length of the dir entry at @p (@left bytes remain), or 0 if it overruns. */
u32 inode_dir_entry_len(const u8 *p, u32 left)
{
	const struct btrfs_dir_item *di = (const void *)p;
	u32 len;

	if (left < sizeof(*di))
		return 0;
	len = (u32)sizeof(*di) + btrfs_dir_name_len(di) + btrfs_dir_data_len(di);
	return len <= left ? len : 0;
}

u32 inode_ref_entry_len(u8 type, const u8 *p, u32 left)
{
	u32 len;

	if (type == BTRFS_INODE_REF_KEY) {
		if (left < sizeof(struct btrfs_inode_ref))
			return 0;
		len = (u32)sizeof(struct btrfs_inode_ref) +
		      btrfs_inode_ref_name_len((const struct btrfs_inode_ref *)p);
	} else {
		if (left < sizeof(struct btrfs_inode_extref))
			return 0;
		len = (u32)sizeof(struct btrfs_inode_extref) +
		      btrfs_inode_extref_name_len((const struct btrfs_inode_extref *)p);
	}
	return len <= left ? len : 0;
}

void inode_ref_decode(u8 type, u64 key_offset, const u8 *p, struct inode_ref_name *r)
{
	if (type == BTRFS_INODE_REF_KEY) {
		const struct btrfs_inode_ref *ir = (const void *)p;

		r->parent = key_offset;
		r->index = btrfs_inode_ref_index(ir);
		r->len = btrfs_inode_ref_name_len(ir);
		r->name = (const char *)(ir + 1);
	} else {
		const struct btrfs_inode_extref *er = (const void *)p;

		r->parent = btrfs_inode_extref_parent(er);
		r->index = btrfs_inode_extref_index(er);
		r->len = btrfs_inode_extref_name_len(er);
		r->name = (const char *)(er + 1);
	}
}

/*
 * Find the entry named @name (and for extrefs / refs with @parent) in the
 * item @data: its offset, -ENOENT if absent, -EUCLEAN if the item is malformed.
 */
long inode_find_ref_entry(u8 type, u64 key_offset, const u8 *data, u32 size, u64 parent,
			   const char *name, u32 len, struct inode_ref_name *out)
{
	u32 pos = 0;

	while (pos < size) {
		u32 l = inode_ref_entry_len(type, data + pos, size - pos);
		struct inode_ref_name r;

		if (!l)
			return -EUCLEAN;
		inode_ref_decode(type, key_offset, data + pos, &r);
		if (r.parent == parent && r.len == len && !memcmp(r.name, name, len)) {
			if (out)
				*out = r;
			return pos;
		}
		pos += l;
	}
	return -ENOENT;
}

long inode_find_dir_entry(const u8 *data, u32 size, const char *name, u32 len,
			   struct btrfs_key *location)
{
	u32 pos = 0;

	while (pos < size) {
		u32 l = inode_dir_entry_len(data + pos, size - pos);
		const struct btrfs_dir_item *di = (const void *)(data + pos);

		if (!l)
			return -EUCLEAN;
		if (btrfs_dir_name_len(di) == len && !memcmp(di + 1, name, len)) {
			if (location)
				btrfs_disk_to_cpu_key(location, &di->location);
			return pos;
		}
		pos += l;
	}
	return -ENOENT;
}
