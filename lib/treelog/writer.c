/*
 * writer.c — fsync without a commit: the write side of the btrfs tree log.
 * butter_fsync() copies what one file is now into the log tree of its
 * subvolume and makes the log durable with one superblock write; the next
 * commit forgets the log. Replay (the kernel's, or replay.c at the next
 * read-write open) turns the log into subvolume items after a crash.
 *
 * What goes to disk (the layout replay.c describes, as the kernel writes
 * it; one log transaction per fsync, all inside the running transaction T):
 *   log root tree (owner TREE_LOG, blocks of generation T)
 *     (TREE_LOG, ROOT_ITEM, subvol)  root item of that subvolume's log tree
 *   log tree of a subvolume (owner TREE_LOG), per logged inode ino:
 *     (ino, INODE_ITEM, 0)           the inode item as it is now
 *     (ino, INODE_REF / EXTREF, ..)  every name it has
 *     (ino, XATTR_ITEM, hash)        every xattr (replay deletes the others)
 *     (ino, EXTENT_DATA, off)        the file extent items that may differ
 *                                    from the committed ones, plus a hole
 *                                    item (disk_bytenr 0) for each gap
 *                                    below i_size where the committed tree
 *                                    may hold an extent (replay drops it)
 *   and (EXTENT_CSUM, EXTENT_CSUM, logical) items with the checksums of the
 *   data extents written in T that logged items point at (older extents have
 *   theirs in the committed csum tree).
 *   superblock: the committed one with log_root / log_root_level set; its
 *   generation stays that of the last commit (the log root block has
 *   generation + 1, as every reader of a log expects).
 *
 * Which extents (the kernel's fast fsync logs its modified extent maps; this
 * finds the same from the trees): a leaf of the subvolume tree older than the
 * running transaction is a block the committed tree holds too, so the
 * extent items in it are committed ones, and between two items that sit
 * next to each other in such a leaf the committed tree has nothing either.
 * Every other extent item is logged, and every other gap between extents
 * (up to i_size) gets a hole item. Replay starts from the committed tree and
 * so ends with exactly the current extents; a log sync costs the leaves the
 * file changed in this transaction, not the file's size.
 *
 * Order of one log sync (butter_fsync_many()):
 *   1. check every inode (below); any that the log cannot express makes the
 *      whole call a full commit instead (the kernel's "log full commit");
 *   2. bring its items in the log tree to what step 1 planned, changing only
 *      those that differ from the previous log sync's (COW: blocks a previous
 *      log sync wrote are copied, never rewritten); update the log root tree;
 *   3. write the new log blocks, flush (the file data was written by
 *      butter_write() already: this flush makes it durable too);
 *   4. write the superblocks naming the new log root tree, flush.
 * A crash before 4 leaves the previous log (or none) in force: its blocks
 * were not touched.
 *
 * Invariants:
 *  1. Log tree blocks have no extent items and stay out of the committed free
 *     space tree; in memory they are taken out of free space (extent_alloc)
 *     and kept out while a log on disk may point at them: a block a log sync
 *     replaces (COW) is free again once that sync's superblock is written;
 *     the commit that drops the log pins the rest (free again once its
 *     superblock is written) and clears log_root.
 *  2. Data extents the log points at are committed ones or allocated in T;
 *     references to either change only when T's delayed references run at
 *     its commit, so nothing reuses them before it (an extent whose last
 *     reference went in T is pinned at the commit).
 *  3. The log describes inodes only relative to the last committed state: an
 *     inode is logged only if each of its committed names is still there
 *     (same directory, name and index) and each new name goes into a
 *     directory that exists in the committed tree where that name and index
 *     are free. Renames, unlinks and names in new directories are therefore
 *     full commits, as is anything in a block group created in T (the
 *     committed chunk tree does not know it). Inodes logged earlier in T are
 *     checked again at every log sync; if one lost or moved a name, the sync
 *     commits.
 *  4. Only regular files are logged, and not on mixed block groups (the
 *     replay refuses those logs); directories, symlinks, special files,
 *     files without links and subvolumes without a committed root item
 *     commit. So does a log sync that would hold more than LOG_MAX_INODES
 *     inodes (the checks of invariant 3 grow with them) or copy more than
 *     LOG_MAX_ITEMS items.
 *
 * @datasync (fdatasync): an inode not logged yet in this transaction whose
 * size, names and file extents are as committed is skipped (only times,
 * modes, owners or xattrs changed); otherwise it is logged whole, as for
 * fsync.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/checksum.h"
#include "treelog/treelog.h"

/*
 * Inodes one transaction's log holds at most: every log sync checks the names
 * of all of them again (invariant 3), so past this many the next fsync
 * commits and the log starts over, keeping a log sync's cost bounded.
 */
#define LOG_MAX_INODES 1024
/*
 * Items one log sync copies at most: the changed leaves of a file add up over
 * a transaction (random overwrites of a big file touch a new leaf each), and
 * past this a commit, which starts the count over, costs less than the log.
 */
#define LOG_MAX_ITEMS 1024

struct log_subvol {
	u64 subvol;
	struct tree_root root;       /* its log tree (objectid TREE_LOG) */
};

/* An inode in the log, and the names it had when it was logged. */
struct logged_inode {
	u64 subvol, ino;
	u8 *names;                   /* its INODE_REF/EXTREF items, serialised */
	size_t names_len;
};

/*
 * The log of the running transaction. Protected by the write lock (w->lock);
 * empty (transid 0) between a commit and the next log sync.
 */
struct tree_log {
	struct butter_fs *fs;
	u64 transid;                 /* transaction the log belongs to; 0: none */
	struct tree_root root_tree;  /* the log root tree */
	struct log_subvol *subvols;
	size_t nsubvols;
	struct logged_inode *inodes;
	size_t ninodes;
	struct range_set blocks;     /* log blocks allocated and not released (invariant 1) */
	struct range_set replaced;   /* of those, replaced in the log sync under way */
	struct range_set csummed;    /* data ranges whose checksums the log holds */
	u64 syncs, fallbacks;        /* statistics, for messages */
};

/* What one inode puts in the log (decided before anything changes). */
struct inode_plan {
	struct subvol *sv;
	u64 ino;
	int skip;                    /* unchanged since the commit: nothing to log */
	const char *why;             /* why it cannot be logged (a commit instead) */
	struct item_list items;       /* items to copy, holes included */
	struct range_set csums;      /* data ranges whose checksums to log */
	u8 *names;                   /* serialised name items (logged_inode.names) */
	size_t names_len;
};

/* ---- small containers ---- */

/* Copy every item of @root with objectid @ino and type in [@tmin, @tmax] into @out. */
static int collect(struct butter_fs *fs, const struct tree_root *root, u64 ino, u8 tmin, u8 tmax,
		   struct item_list *out)
{
	struct btrfs_key key = { ino, tmin, 0 };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, root, &key, &path);
	while (ret == 0) {
		const u8 *p;
		u32 size;

		path_key(&path, &key);
		if (key.objectid != ino || key.type > tmax)
			break;
		p = path_item(&path, &size);
		ret = item_list_push(out, &key, p, size);
		if (ret == 0)
			ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	return ret < 0 ? ret : 0;
}

/* Serialise @l (keys, sizes, data) into one buffer, to compare later. */
static int serialise(const struct item_list *l, u8 **out, size_t *len)
{
	size_t i, total = 0, pos = 0;
	u8 *buf;

	for (i = 0; i < l->n; i++)
		total += sizeof(struct btrfs_disk_key) + sizeof(u32) + l->v[i].size;
	buf = malloc(total ? total : 1);
	if (!buf)
		return -ENOMEM;
	for (i = 0; i < l->n; i++) {
		struct btrfs_disk_key dk;

		btrfs_cpu_to_disk_key(&dk, &l->v[i].key); /* packed: no padding to compare */
		memcpy(buf + pos, &dk, sizeof(dk));
		pos += sizeof(dk);
		memcpy(buf + pos, &l->v[i].size, sizeof(u32));
		pos += sizeof(u32);
		memcpy(buf + pos, l->v[i].data, l->v[i].size);
		pos += l->v[i].size;
	}
	*out = buf;
	*len = total;
	return 0;
}

/* ---- names: what the log can express (invariant 3) ---- */

/* Decode the @i-th name of the ref items @refs into @r: 1 found, 0 past the end, -EUCLEAN. */
static int ref_at(const struct item_list *refs, size_t i, struct inode_ref_name *r)
{
	size_t k, n = 0;

	for (k = 0; k < refs->n; k++) {
		const struct item_copy *c = &refs->v[k];
		u32 pos = 0;

		while (pos < c->size) {
			u32 len = inode_ref_entry_len(c->key.type, c->data + pos, c->size - pos);

			if (!len)
				return -EUCLEAN;
			inode_ref_decode(c->key.type, c->key.offset, c->data + pos, r);
			if (n++ == i)
				return 1;
			pos += len;
		}
	}
	return 0;
}

static int has_ref(const struct item_list *refs, const struct inode_ref_name *want)
{
	struct inode_ref_name r;
	size_t i;
	int ret;

	for (i = 0; (ret = ref_at(refs, i, &r)) == 1; i++)
		if (r.parent == want->parent && r.index == want->index && r.len == want->len &&
		    !memcmp(r.name, want->name, r.len))
			return 1;
	return ret;
}

struct find_name {
	const char *name;
	u32 len;
	int found;
};

static int match_name(void *arg, const struct btrfs_dir_item *di, const char *name,
		      const u8 *value)
{
	struct find_name *f = arg;

	(void)value;
	if (btrfs_dir_name_len(di) == f->len && !memcmp(name, f->name, f->len)) {
		f->found = 1;
		return 1;
	}
	return 0;
}

/*
 * May the name @r be added by replay to the committed tree @croot: its
 * directory exists there, and neither the name nor the index is taken?
 * 1 yes, 0 no, negative errno.
 */
static int name_is_new(struct butter_fs *fs, const struct tree_root *croot,
		       const struct inode_ref_name *r)
{
	struct btrfs_inode_item dir;
	struct btrfs_key key = { r->parent, BTRFS_INODE_ITEM_KEY, 0 };
	struct find_name f = { r->name, r->len, 0 };
	u8 *buf;
	int ret;

	ret = tree_lookup_item(&fs->cache, croot, &key, &dir, sizeof(dir));
	if (ret == -ENOENT)
		return 0;
	if (ret < 0)
		return ret;
	if ((u32)ret < sizeof(dir) || !S_ISDIR(btrfs_inode_mode(&dir)))
		return 0;
	key.type = BTRFS_DIR_INDEX_KEY;
	key.offset = r->index;
	ret = tree_lookup_item(&fs->cache, croot, &key, NULL, 0);
	if (ret != -ENOENT)
		return ret < 0 ? ret : 0;
	key.type = BTRFS_DIR_ITEM_KEY;
	key.offset = btrfs_name_hash(r->name, r->len);
	ret = tree_lookup_item(&fs->cache, croot, &key, NULL, 0);
	if (ret == -ENOENT)
		return 1;
	if (ret < 0)
		return ret;
	buf = malloc((size_t)ret ? (size_t)ret : 1);
	if (!buf)
		return -ENOMEM;
	ret = tree_lookup_item(&fs->cache, croot, &key, buf, (u32)ret);
	if (ret >= 0)
		ret = inode_walk_dir_items(fs, buf, (u32)ret, match_name, &f);
	free(buf);
	if (ret < 0)
		return ret;
	return !f.found;
}

/* The committed tree of subvolume @id (from the superblock's root tree). -ENOENT if none. */
static int committed_root(struct butter_fs *fs, u64 id, struct tree_root *out)
{
	const struct btrfs_super_block *sb = &fs->vol.super;
	struct tree_root rt = { 0 };
	struct btrfs_key key = { id, BTRFS_ROOT_ITEM_KEY, 0 };
	struct btrfs_root_item ri;
	struct tree_path path;
	int ret;

	rt.objectid = BTRFS_ROOT_TREE_OBJECTID;
	rt.bytenr = btrfs_super_root(sb);
	rt.generation = btrfs_super_generation(sb);
	rt.level = sb->root_level;
	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &rt, &key, &path);
	if (ret == 0) {
		u32 size;
		const u8 *p = path_item(&path, &size);

		path_key(&path, &key);
		if (key.objectid != id || key.type != BTRFS_ROOT_ITEM_KEY)
			ret = -ENOENT;
		else if (size < BTRFS_ROOT_ITEM_V1_SIZE)
			ret = -EUCLEAN;
		else
			memcpy(&ri, p, BTRFS_ROOT_ITEM_V1_SIZE);
	} else if (ret == 1) {
		ret = -ENOENT;
	}
	tree_path_release(&fs->cache, &path);
	if (ret)
		return ret;
	if (btrfs_root_refs(&ri) == 0)
		return -ENOENT;
	memset(out, 0, sizeof(*out));
	out->objectid = id;
	out->bytenr = btrfs_root_bytenr(&ri);
	out->generation = btrfs_root_generation(&ri);
	out->level = ri.level;
	return 0;
}

/*
 * Check the names of @ino (current ones in @now) against the committed tree
 * (invariant 3). 1: the log can express them, 0: not, negative errno.
 */
static int names_expressible(struct butter_fs *fs, const struct tree_root *croot, u64 ino,
			     const struct item_list *now)
{
	struct item_list then = { 0 };
	struct inode_ref_name r;
	size_t i;
	int ret;

	ret = collect(fs, croot, ino, BTRFS_INODE_REF_KEY, BTRFS_INODE_EXTREF_KEY, &then);
	for (i = 0; ret == 0; i++) {
		ret = ref_at(&then, i, &r);
		if (ret != 1)
			break;
		ret = has_ref(now, &r);
		if (ret == 1)
			ret = 0;
		else if (ret == 0)
			ret = 2; /* a committed name went: an unlink or rename */
	}
	for (i = 0; ret == 0; i++) {
		ret = ref_at(now, i, &r);
		if (ret != 1)
			break;
		ret = has_ref(&then, &r);
		if (ret == 1) {
			ret = 0;
			continue;
		}
		if (ret == 0) {
			ret = name_is_new(fs, croot, &r);
			ret = ret == 1 ? 0 : ret == 0 ? 2 : ret;
		}
	}
	item_list_free(&then);
	if (ret == 2)
		return 0;
	if (ret == -EUCLEAN)
		return BLOG_CORRUPT(&fs->log, "inode %llu: malformed ref item",
				    (unsigned long long)ino);
	return ret < 0 ? ret : 1;
}

/* ---- planning one inode (no changes) ---- */

static void plan_free(struct inode_plan *p)
{
	item_list_free(&p->items);
	range_set_free(&p->csums);
	free(p->names);
	p->names = NULL;
}

static int push_hole(struct inode_plan *p, u64 transid, u64 start, u64 end)
{
	struct btrfs_file_extent_item fi;
	struct btrfs_key key = { p->ino, BTRFS_EXTENT_DATA_KEY, start };

	memset(&fi, 0, sizeof(fi));
	btrfs_set_file_extent_generation(&fi, transid);
	btrfs_set_file_extent_ram_bytes(&fi, end - start);
	btrfs_set_file_extent_num_bytes(&fi, end - start);
	fi.type = BTRFS_FILE_EXTENT_REG;
	return item_list_push(&p->items, &key, &fi, sizeof(fi));
}

/*
 * Decide what @ino of @sv puts in the log. 1: planned (or p->skip),
 * 0: the log cannot express it (commit instead), negative errno.
 */
/* Do @a and @b hold the same items (inode items and xattrs aside)? */
static int same_items(const struct item_list *a, const struct item_list *b)
{
	size_t i = 0, j = 0;

	for (;;) {
		while (i < a->n && (a->v[i].key.type == BTRFS_INODE_ITEM_KEY ||
				    a->v[i].key.type == BTRFS_XATTR_ITEM_KEY))
			i++;
		while (j < b->n && (b->v[j].key.type == BTRFS_INODE_ITEM_KEY ||
				    b->v[j].key.type == BTRFS_XATTR_ITEM_KEY))
			j++;
		if (i == a->n || j == b->n)
			return i == a->n && j == b->n;
		if (btrfs_comp_keys(&a->v[i].key, &b->v[j].key) || a->v[i].size != b->v[j].size ||
		    memcmp(a->v[i].data, b->v[j].data, a->v[i].size))
			return 0;
		i++;
		j++;
	}
}

/*
 * Add to @p the extent items of its inode that may differ from the committed
 * tree, and hole items for the gaps where the committed tree may hold more
 * (the rule in the header comment); note the data ranges whose checksums go
 * to the log. 0 or negative errno.
 */
static int plan_extents(struct butter_fs *fs, struct inode_plan *p, u64 iflags, u64 size)
{
	u64 transid = fs->w->txn.tt.transid;
	u32 ss = fs->vol.sectorsize;
	u64 isize = (size + ss - 1) / ss * ss, covered = 0;
	int nodatasum = !!(iflags & BTRFS_INODE_NODATASUM_FLAG);
	int next_in_old_leaf = 0;   /* the last item has a successor in the same old leaf */
	struct btrfs_key key = { p->ino, BTRFS_EXTENT_DATA_KEY, 0 };
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_forward(&fs->cache, &p->sv->root, &key, &path);
	while (ret == 0) {
		const struct tree_node *leaf = path.nodes[0];
		u32 slot = path.slots[0], size_now;
		const struct btrfs_file_extent_item *fi;
		int old = leaf->generation < transid; /* shared with the committed tree */
		u64 end;

		path_key(&path, &key);
		if (key.objectid != p->ino || key.type != BTRFS_EXTENT_DATA_KEY)
			break;
		fi = (const void *)path_item(&path, &size_now);
		if (size_now < BTRFS_FILE_EXTENT_INLINE_DATA_START ||
		    (fi->type != BTRFS_FILE_EXTENT_INLINE && size_now < sizeof(*fi))) {
			ret = BLOG_CORRUPT(&fs->log, "inode %llu: short extent item",
					   (unsigned long long)p->ino);
			break;
		}
		if (fi->type == BTRFS_FILE_EXTENT_INLINE)
			end = key.offset + (btrfs_file_extent_ram_bytes(fi) + ss - 1) / ss * ss;
		else
			end = key.offset + btrfs_file_extent_num_bytes(fi);
		/* the gap before: the committed tree has nothing there only inside an old leaf */
		if (key.offset > covered && covered < isize && !(old && slot > 0))
			ret = push_hole(p, transid, covered, key.offset < isize ? key.offset : isize);
		if (ret == 0 && !old) {
			ret = item_list_push(&p->items, &key, fi, size_now);
			if (ret == 0 && fi->type == BTRFS_FILE_EXTENT_REG && !nodatasum &&
			    btrfs_file_extent_disk_bytenr(fi) &&
			    btrfs_file_extent_generation(fi) >= transid) {
				u64 s = btrfs_file_extent_disk_bytenr(fi);
				u64 len = btrfs_file_extent_disk_num_bytes(fi);

				if (!fi->compression) {
					s += btrfs_file_extent_offset(fi);
					len = btrfs_file_extent_num_bytes(fi);
				}
				ret = range_add(&p->csums, s, s + len);
			}
		}
		if (end > covered)
			covered = end;
		next_in_old_leaf = old && slot + 1 < leaf->nritems;
		if (ret == 0)
			ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	if (ret < 0)
		return ret;
	ret = 0;
	if (covered < isize && !next_in_old_leaf)
		ret = push_hole(p, transid, covered, isize);
	return ret;
}

/*
 * Would the extent items planned in @p change nothing in the committed tree
 * @croot? Each is the committed item with that key, or a hole over a range
 * where the committed tree has no extent. 1 yes, 0 no, negative errno.
 */
static int extents_as_committed(struct butter_fs *fs, const struct tree_root *croot,
				const struct inode_plan *p)
{
	size_t i;
	int ret;

	for (i = 0; i < p->items.n; i++) {
		const struct item_copy *c = &p->items.v[i];
		const struct btrfs_file_extent_item *fi = (const void *)c->data;
		struct btrfs_key key = c->key;
		struct tree_path path;
		u8 *buf;
		u64 end;

		if (c->key.type != BTRFS_EXTENT_DATA_KEY)
			continue;
		ret = tree_lookup_item(&fs->cache, croot, &c->key, NULL, 0);
		if (ret >= 0 && (u32)ret == c->size) {
			buf = malloc(c->size);
			if (!buf)
				return -ENOMEM;
			ret = tree_lookup_item(&fs->cache, croot, &c->key, buf, c->size);
			if (ret >= 0)
				ret = !memcmp(buf, c->data, c->size);
			free(buf);
			if (ret < 0)
				return ret;
			if (ret)
				continue;
		} else if (ret < 0 && ret != -ENOENT) {
			return ret;
		}
		if (fi->type != BTRFS_FILE_EXTENT_REG || btrfs_file_extent_disk_bytenr(fi))
			return 0; /* data the committed tree does not have */
		/* a hole: no committed extent may reach into it */
		end = key.offset + btrfs_file_extent_num_bytes(fi);
		key.offset = end - 1;
		tree_path_init(&path);
		ret = tree_search_backward(&fs->cache, croot, &key, &path);
		if (ret == 0) {
			const struct btrfs_file_extent_item *cf;
			u32 size;

			path_key(&path, &key);
			cf = (const void *)path_item(&path, &size);
			if (key.objectid == p->ino && key.type == BTRFS_EXTENT_DATA_KEY &&
			    size >= BTRFS_FILE_EXTENT_INLINE_DATA_START &&
			    (cf->type == BTRFS_FILE_EXTENT_INLINE ||
			     (size >= sizeof(*cf) && btrfs_file_extent_disk_bytenr(cf) &&
			      key.offset + btrfs_file_extent_num_bytes(cf) > c->key.offset)))
				ret = 2;
		}
		tree_path_release(&fs->cache, &path);
		if (ret < 0)
			return ret;
		if (ret == 2)
			return 0;
	}
	return 1;
}

static int plan_inode(struct butter_fs *fs, struct subvol *sv, u64 ino, int datasync,
		      int logged_before, struct inode_plan *p)
{
	struct tree_root croot;
	struct btrfs_inode_item ii, cii;
	struct btrfs_key key = { ino, BTRFS_INODE_ITEM_KEY, 0 };
	struct item_list refs = { 0 };
	int ret, in_commit = 0;
	size_t i;

	memset(p, 0, sizeof(*p));
	p->sv = sv;
	p->ino = ino;
	range_set_init(&p->csums);
	p->why = "a subvolume made or deleted since the commit";
	if (sv->deleted)
		return 0;
	ret = committed_root(fs, sv->id, &croot);
	if (ret)
		return ret == -ENOENT ? 0 : ret;
	p->why = "not a regular file with links";
	ret = tree_lookup_item(&fs->cache, &sv->root, &key, &ii, sizeof(ii));
	if (ret < 0)
		return ret;
	if ((u32)ret < sizeof(ii))
		return BLOG_CORRUPT(&fs->log, "inode %llu: short item", (unsigned long long)ino);
	if (!S_ISREG(btrfs_inode_mode(&ii)) || btrfs_inode_nlink(&ii) == 0)
		return 0;
	ret = tree_lookup_item(&fs->cache, &croot, &key, &cii, sizeof(cii));
	if (ret >= 0 && (u32)ret >= sizeof(cii)) {
		in_commit = 1;
		if (!memcmp(&cii, &ii, sizeof(ii))) {
			p->skip = 1; /* nothing changed since the commit */
			return 1;
		}
		p->why = "the inode number was reused since the commit";
		if (btrfs_inode_generation(&cii) != btrfs_inode_generation(&ii) ||
		    !S_ISREG(btrfs_inode_mode(&cii)))
			return 0;
	} else if (ret >= 0) {
		return BLOG_CORRUPT(&fs->log, "inode %llu: short item", (unsigned long long)ino);
	} else if (ret != -ENOENT) {
		return ret;
	}

	ret = collect(fs, &sv->root, ino, 0, BTRFS_EXTENT_DATA_KEY - 1, &p->items);
	if (ret)
		return ret;
	for (i = 0; i < p->items.n && ret == 0; i++) {
		const struct item_copy *c = &p->items.v[i];

		switch (c->key.type) {
		case BTRFS_INODE_ITEM_KEY:
		case BTRFS_XATTR_ITEM_KEY:
			break;
		case BTRFS_INODE_REF_KEY:
		case BTRFS_INODE_EXTREF_KEY:
			ret = item_list_push(&refs, &c->key, c->data, c->size);
			break;
		default:
			p->why = "an item the log does not carry (verity...)";
			ret = 2;
		}
	}
	if (ret == 0)
		ret = plan_extents(fs, p, btrfs_inode_flags(&ii), btrfs_inode_size(&ii));
	if (ret == 0 && datasync && !logged_before && in_commit &&
	    btrfs_inode_size(&cii) == btrfs_inode_size(&ii) &&
	    btrfs_inode_nbytes(&cii) == btrfs_inode_nbytes(&ii)) {
		struct item_list then = { 0 };

		/* only times, modes, owners or xattrs changed: fdatasync need not keep them */
		ret = collect(fs, &croot, ino, BTRFS_INODE_REF_KEY, BTRFS_INODE_EXTREF_KEY, &then);
		if (ret == 0 && same_items(&refs, &then))
			ret = extents_as_committed(fs, &croot, p);
		if (ret == 1) {
			p->skip = 1;
			ret = 0;
		}
		item_list_free(&then);
		if (ret == 0 && p->skip) {
			item_list_free(&refs);
			return 1;
		}
	}
	if (ret == 0) {
		u32 n = 0;
		struct inode_ref_name r;

		while ((ret = ref_at(&refs, n, &r)) == 1)
			n++;
		if (ret == 0 && n != btrfs_inode_nlink(&ii)) {
			p->why = "a link count its names do not explain";
			ret = 2;
		}
	}
	if (ret == 0) {
		ret = names_expressible(fs, &croot, ino, &refs);
		if (ret == 0)
			p->why = "a name changed since the commit (rename, unlink, new directory)";
		ret = ret == 1 ? 0 : ret == 0 ? 2 : ret;
	}
	if (ret == 0)
		ret = serialise(&refs, &p->names, &p->names_len);
	item_list_free(&refs);
	if (ret == 2)
		return 0;
	return ret < 0 ? ret : 1;
}

/* Are the names of an inode logged earlier in this transaction still what the log says? */
static int still_named(struct butter_fs *fs, const struct logged_inode *li)
{
	struct item_list refs = { 0 };
	struct subvol *sv;
	u8 *names = NULL;
	size_t len = 0;
	int ret, err = 0;

	sv = fs_subvol_cached(fs, li->subvol, &err);
	if (!sv)
		return err == -ENOENT ? 0 : err;
	ret = collect(fs, &sv->root, li->ino, BTRFS_INODE_REF_KEY, BTRFS_INODE_EXTREF_KEY, &refs);
	if (ret == 0)
		ret = serialise(&refs, &names, &len);
	item_list_free(&refs);
	if (ret)
		return ret;
	ret = len == li->names_len && !memcmp(names, li->names, len);
	free(names);
	return ret;
}

/* ---- the log trees ---- */

static int log_alloc_block(void *arg, struct tree_root *root, int level, u64 *bytenr)
{
	struct tree_log *l = arg;
	u32 nodesize = l->fs->vol.nodesize;
	int ret;

	(void)root;
	(void)level;
	ret = extent_alloc(&l->fs->w->es, BTRFS_BLOCK_GROUP_METADATA, nodesize, bytenr);
	if (ret == 0)
		ret = range_add(&l->blocks, *bytenr, *bytenr + nodesize);
	return ret;
}

/*
 * A log block copied or emptied: the log on disk may still point at it, so it
 * stays reserved until this log sync's superblock is written (log_release()).
 */
static int log_free_block(void *arg, struct tree_root *root, struct tree_node *node)
{
	struct tree_log *l = arg;

	(void)root;
	return range_add(&l->replaced, node->bytenr, node->bytenr + l->fs->vol.nodesize);
}

/*
 * After a log sync's superblock is durable: the blocks it replaced belong to
 * no log on disk any more and return to free space (invariant 1 keeps only
 * the live log reserved, so a long run of fsyncs does not eat metadata space).
 */
static int log_release(struct tree_log *l)
{
	struct extent_state *es = &l->fs->w->es;
	size_t i;
	int ret = 0;

	for (i = 0; i < l->replaced.n && ret == 0; i++) {
		u64 start = l->replaced.r[i].start, end = l->replaced.r[i].end;
		struct block_group *bg = extent_find_bg(es, start);

		if (!bg || end > bg->start + bg->length) {
			ret = -EUCLEAN;
			break;
		}
		ret = range_remove(&l->blocks, start, end);
		if (ret == 0)
			ret = range_add(&bg->free, start, end);
		bg->fst_dirty = 1;
	}
	range_set_free(&l->replaced);
	range_set_init(&l->replaced);
	return ret;
}

static const struct tree_block_ops log_block_ops = {
	.alloc_block = log_alloc_block,
	.free_block = log_free_block,
	.cow_block = NULL,
};

/* Forget the log: after a commit, or when the handle goes. */
static void log_reset(struct tree_log *l)
{
	size_t i;

	for (i = 0; i < l->ninodes; i++)
		free(l->inodes[i].names);
	free(l->inodes);
	free(l->subvols);
	l->inodes = NULL;
	l->subvols = NULL;
	l->ninodes = l->nsubvols = 0;
	range_set_free(&l->blocks);
	range_set_free(&l->replaced);
	range_set_free(&l->csummed);
	range_set_init(&l->blocks);
	range_set_init(&l->replaced);
	range_set_init(&l->csummed);
	memset(&l->root_tree, 0, sizeof(l->root_tree));
	l->transid = 0;
}

/*
 * The commit hook (txn_ctx.pre_commit): the commit being made holds
 * everything the log holds, so the superblock it writes names no log, and
 * the log blocks become free once it is written (pinned until then).
 */
static int log_drop_at_commit(void *arg)
{
	struct tree_log *l = arg;
	struct butter_fs *fs = l->fs;
	struct btrfs_super_block *sb = &fs->vol.super;
	size_t i;
	int ret = 0;

	if (l->transid) {
		for (i = 0; i < l->blocks.n && ret == 0; i++) {
			const struct range *r = &l->blocks.r[i];

			ret = extent_pin(&fs->w->es, r->start, r->end - r->start);
		}
		log_reset(l);
	}
	if (btrfs_super_log_root(sb)) {
		btrfs_set_super_log_root(sb, 0);
		sb->log_root_level = 0;
		fs->w->txn.super_dirty = 1;
	}
	return ret;
}

static struct tree_log *log_get(struct butter_fs *fs)
{
	struct fs_write_state *w = fs->w;
	struct tree_log *l = w->tlog;

	if (l)
		return l;
	l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->fs = fs;
	range_set_init(&l->blocks);
	range_set_init(&l->replaced);
	range_set_init(&l->csummed);
	w->tlog = l;
	w->txn.pre_commit = log_drop_at_commit;
	w->txn.pre_commit_arg = l;
	return l;
}

void tlog_destroy(struct fs_write_state *w)
{
	if (!w->tlog)
		return;
	blog_info(&w->tlog->fs->log, "tree log: %llu log syncs, %llu fsyncs committed instead",
		   (unsigned long long)w->tlog->syncs, (unsigned long long)w->tlog->fallbacks);
	log_reset(w->tlog);
	free(w->tlog);
	w->tlog = NULL;
	w->txn.pre_commit = NULL;
	w->txn.pre_commit_arg = NULL;
}

static struct log_subvol *log_subvol(struct tree_log *l, struct tree_trans *t, u64 subvol,
				     int *err)
{
	struct log_subvol *ls;
	size_t i;

	for (i = 0; i < l->nsubvols; i++)
		if (l->subvols[i].subvol == subvol)
			return &l->subvols[i];
	ls = realloc(l->subvols, (l->nsubvols + 1) * sizeof(*ls));
	if (!ls) {
		*err = -ENOMEM;
		return NULL;
	}
	l->subvols = ls;
	ls += l->nsubvols;
	memset(ls, 0, sizeof(*ls));
	ls->subvol = subvol;
	*err = tree_create_root(t, BTRFS_TREE_LOG_OBJECTID, &ls->root);
	if (*err)
		return NULL;
	l->nsubvols++;
	return ls;
}

static int cmp_items(const void *a, const void *b)
{
	return btrfs_comp_keys(&((const struct item_copy *)a)->key,
			       &((const struct item_copy *)b)->key);
}

/* Make the item at @key of log tree @root @data (@size bytes), or delete it (NULL). */
static int log_set_item(struct tree_trans *t, struct tree_root *root, const struct btrfs_key *key,
			const void *data, u32 size)
{
	struct tree_path path;
	int ret;

	tree_path_init(&path);
	ret = tree_search_slot(t, root, key, &path, 0, 1);
	if (ret == 0) {
		u32 have;
		u8 *p = path_item_mut(&path, &have);

		if (data && have == size) {
			memcpy(p, data, size);
			tree_path_release(t->cache, &path);
			return 0;
		}
		ret = tree_del_items(t, root, &path, 1);
	} else if (ret == 1) {
		ret = 0;
	}
	tree_path_release(t->cache, &path);
	if (ret == 0 && data)
		ret = tree_insert_item(t, root, key, data, size);
	return ret;
}

/*
 * Bring the items of inode @ino in log tree @root to @want (sorted here),
 * touching only those that differ: a file logged again in the same
 * transaction costs what changed since its last log sync.
 */
static int log_put_items(struct butter_fs *fs, struct tree_trans *t, struct tree_root *root,
			 u64 ino, struct item_list *want)
{
	struct item_list have = { 0 };
	size_t i = 0, j = 0;
	int ret;

	if (want->n > 1)
		qsort(want->v, want->n, sizeof(want->v[0]), cmp_items);
	ret = collect(fs, root, ino, 0, 255, &have);
	while (ret == 0 && (i < want->n || j < have.n)) {
		const struct item_copy *w = i < want->n ? &want->v[i] : NULL;
		const struct item_copy *h = j < have.n ? &have.v[j] : NULL;
		int c = !w ? 1 : !h ? -1 : btrfs_comp_keys(&w->key, &h->key);

		if (c > 0) {
			ret = log_set_item(t, root, &h->key, NULL, 0);
			j++;
		} else if (c < 0) {
			ret = tree_insert_item(t, root, &w->key, w->data, w->size);
			i++;
		} else {
			if (w->size != h->size || memcmp(w->data, h->data, w->size))
				ret = log_set_item(t, root, &w->key, w->data, w->size);
			i++;
			j++;
		}
	}
	item_list_free(&have);
	return ret;
}

/* Log the checksums of data range [start, end) that the log does not hold yet. */
static int log_csum_range(struct tree_log *l, struct tree_trans *t, struct tree_root *root,
			  u64 start, u64 end)
{
	struct butter_fs *fs = l->fs;
	u32 ss = fs->vol.sectorsize, cs = fs->vol.csum_size;
	u32 per = (tree_max_item_size(&fs->cache) - sizeof(struct btrfs_item)) / cs / 2;
	struct btrfs_key key = { BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, start };
	struct item_list found = { 0 };
	struct tree_path path;
	size_t i;
	int ret;

	/* the csum items of the committed + running csum tree that touch the range */
	tree_path_init(&path);
	ret = tree_search_backward(&fs->cache, &fs->csum_tree, &key, &path);
	if (ret == 1) {
		tree_path_release(&fs->cache, &path);
		tree_path_init(&path);
		ret = tree_search_forward(&fs->cache, &fs->csum_tree, &key, &path);
	}
	while (ret == 0) {
		const u8 *p;
		u32 size;

		path_key(&path, &key);
		if (key.objectid == BTRFS_EXTENT_CSUM_OBJECTID &&
		    key.type == BTRFS_EXTENT_CSUM_KEY) {
			if (key.offset >= end)
				break;
			p = path_item(&path, &size);
			if (key.offset + (u64)(size / cs) * ss > start)
				ret = item_list_push(&found, &key, p, size);
		} else if (key.objectid > BTRFS_EXTENT_CSUM_OBJECTID) {
			break;
		}
		if (ret == 0)
			ret = tree_next_item(&fs->cache, &path);
	}
	tree_path_release(&fs->cache, &path);
	if (ret < 0) {
		item_list_free(&found);
		return ret;
	}
	ret = 0;
	for (i = 0; i < found.n && ret == 0; i++) {
		u64 s = found.v[i].key.offset, e = s + (u64)(found.v[i].size / cs) * ss;
		u64 a = s > start ? s : start, b = e < end ? e : end;

		while (a < b && ret == 0) {
			u64 piece_end = b;
			size_t k;

			/* skip what the log has; stop the piece where the log has more */
			for (k = 0; k < l->csummed.n; k++) {
				const struct range *r = &l->csummed.r[k];

				if (r->end <= a || r->start >= piece_end)
					continue;
				if (r->start <= a) {
					a = r->end;
					piece_end = b;
					k = (size_t)-1; /* look again from the first range */
					if (a >= b)
						break;
					continue;
				}
				piece_end = r->start;
			}
			if (a >= b)
				break;
			if ((piece_end - a) / ss > per)
				piece_end = a + (u64)per * ss;
			key.objectid = BTRFS_EXTENT_CSUM_OBJECTID;
			key.type = BTRFS_EXTENT_CSUM_KEY;
			key.offset = a;
			ret = tree_insert_item(t, root, &key, found.v[i].data + (a - s) / ss * cs,
					       (u32)((piece_end - a) / ss * cs));
			if (ret == 0)
				ret = range_add(&l->csummed, a, piece_end);
			a = piece_end;
		}
	}
	item_list_free(&found);
	return ret;
}

/* Put one planned inode into its subvolume's log tree. */
static int log_inode(struct tree_log *l, struct tree_trans *t, struct inode_plan *p)
{
	struct log_subvol *ls;
	struct logged_inode *li = NULL;
	size_t i;
	int ret = 0;

	ls = log_subvol(l, t, p->sv->id, &ret);
	if (!ls)
		return ret;
	ret = log_put_items(l->fs, t, &ls->root, p->ino, &p->items);
	for (i = 0; i < p->csums.n && ret == 0; i++)
		ret = log_csum_range(l, t, &ls->root, p->csums.r[i].start, p->csums.r[i].end);
	if (ret)
		return ret;
	for (i = 0; i < l->ninodes; i++)
		if (l->inodes[i].subvol == p->sv->id && l->inodes[i].ino == p->ino)
			li = &l->inodes[i];
	if (!li) {
		li = realloc(l->inodes, (l->ninodes + 1) * sizeof(*li));
		if (!li)
			return -ENOMEM;
		l->inodes = li;
		li += l->ninodes++;
		li->subvol = p->sv->id;
		li->ino = p->ino;
	} else {
		free(li->names);
	}
	li->names = p->names;
	li->names_len = p->names_len;
	p->names = NULL;
	return 0;
}

/* Point the log root tree at every log tree where it now is. */
static int update_log_roots(struct tree_log *l, struct tree_trans *t)
{
	u32 nodesize = l->fs->vol.nodesize;
	size_t i;
	int ret = 0;

	if (!l->root_tree.bytenr)
		ret = tree_create_root(t, BTRFS_TREE_LOG_OBJECTID, &l->root_tree);
	for (i = 0; i < l->nsubvols && ret == 0; i++) {
		struct log_subvol *ls = &l->subvols[i];
		struct btrfs_key key = { BTRFS_TREE_LOG_OBJECTID, BTRFS_ROOT_ITEM_KEY, ls->subvol };
		struct btrfs_root_item ri;
		struct tree_path path;

		if (!ls->root.dirty)
			continue;
		ls->root.dirty = 0;
		/* as the kernel makes a log tree's root item */
		memset(&ri, 0, sizeof(ri));
		btrfs_set_inode_generation(&ri.inode, 1);
		btrfs_set_inode_size(&ri.inode, 3);
		btrfs_set_inode_nlink(&ri.inode, 1);
		btrfs_set_inode_nbytes(&ri.inode, nodesize);
		btrfs_set_inode_mode(&ri.inode, S_IFDIR | 0755);
		btrfs_set_root_bytenr(&ri, ls->root.bytenr);
		btrfs_set_root_generation(&ri, ls->root.generation);
		btrfs_set_root_generation_v2(&ri, ls->root.generation);
		ri.level = ls->root.level;
		tree_path_init(&path);
		ret = tree_search_slot(t, &l->root_tree, &key, &path, 0, 1);
		if (ret == 0) {
			u32 size;
			u8 *dst = path_item_mut(&path, &size);

			memcpy(dst, &ri, size < sizeof(ri) ? size : sizeof(ri));
		}
		tree_path_release(t->cache, &path);
		if (ret == 1)
			ret = tree_insert_item(t, &l->root_tree, &key, &ri, sizeof(ri));
	}
	return ret;
}

/* Steps 3 and 4 of the order above. */
static int write_log(struct tree_log *l, struct tree_trans *t)
{
	struct butter_fs *fs = l->fs;
	struct btrfs_super_block *sb = &fs->vol.super;
	u32 nodesize = fs->vol.nodesize;
	struct tree_node *n;
	int ret;

	for (n = t->dirty; n; n = n->dirty_next) {
		struct btrfs_header *h = (struct btrfs_header *)n->data;

		if (n->removed)
			continue;
		btrfs_set_header_flags(h, btrfs_header_flags(h) | BTRFS_HEADER_FLAG_WRITTEN);
		memset(h->csum, 0, BTRFS_CSUM_SIZE);
		btrfs_csum_compute(fs->vol.csum_type, n->data + BTRFS_CSUM_SIZE,
				   nodesize - BTRFS_CSUM_SIZE, h->csum);
		ret = volumes_write(&fs->vol, n->bytenr, n->data, nodesize);
		if (ret) {
			blog_err(&fs->log, "writing log tree block %llu: %s",
				 (unsigned long long)n->bytenr, strerror(-ret));
			return ret;
		}
	}
	ret = volumes_flush(&fs->vol);
	if (ret)
		return ret;
	btrfs_set_super_log_root(sb, l->root_tree.bytenr);
	sb->log_root_level = l->root_tree.level;
	ret = volumes_write_supers(&fs->vol);
	if (ret == 0)
		ret = volumes_flush(&fs->vol);
	return ret;
}

/*
 * Can this transaction log at all? Block groups made in it are unknown to the
 * committed state. Mixed block groups commit: butter's replay refuses their
 * logs (replay.c), and a log butter wrote must be one butter can replay.
 */
static int log_possible(struct fs_write_state *w)
{
	size_t i;

	if (w->es.mixed)
		return 0;
	for (i = 0; i < w->es.nbgs; i++)
		if (w->es.bgs[i]->is_new)
			return 0;
	return 1;
}

static int full_commit(struct fs_write_state *w, struct tree_log *l)
{
	if (l)
		l->fallbacks++;
	return txn_commit(&w->txn);
}

int tlog_fsync_many(struct butter_fs *fs, const butter_ino_t *inos, size_t n, int datasync)
{
	struct fs_write_state *w = fs->w;
	struct inode_plan *plans = NULL;
	struct tree_trans t;
	struct tree_log *l;
	size_t i, j, nlog = 0;
	int ret = 0, ok = 1;

	if (!w)
		return 0;
	pthread_mutex_lock(&w->lock);
	if (w->txn.aborted) {
		ret = -EROFS;
		goto out;
	}
	if (!w->txn.running)
		goto out; /* everything is committed */
	/* the files' buffered data gets its extents now (lib/data/delalloc.c), theirs alone */
	for (i = 0; i < n; i++) {
		ret = data_flush_ino_locked(fs, inos[i]);
		if (ret) {
			txn_abort(&w->txn, ret, "writing back an fsynced file's buffered data");
			goto out;
		}
	}
	l = log_get(fs);
	if (!l) {
		ret = -ENOMEM;
		goto out;
	}
	if (l->transid && l->transid != w->txn.tt.transid) {
		ret = -EUCLEAN; /* a commit always drops the log */
		goto out;
	}
	if (!log_possible(w) || n == 0 || l->ninodes + n > LOG_MAX_INODES) {
		blog_debug(&fs->log, "fsync commits: %s",
			   n && l->ninodes + n > LOG_MAX_INODES
				   ? "the log holds enough inodes"
				   : "a block group was made since the commit");
		ret = full_commit(w, l);
		goto out;
	}
	plans = calloc(n, sizeof(*plans));
	if (!plans) {
		ret = -ENOMEM;
		goto out;
	}
	/* 1. every inode checked before the log changes */
	for (i = 0; i < n && ok; i++) {
		struct subvol *sv;
		int err = 0;

		sv = fs_subvol_cached(fs, inos[i].subvol, &err);
		if (!sv) {
			ret = err;
			break;
		}
		for (j = 0; j < l->ninodes; j++)
			if (l->inodes[j].subvol == inos[i].subvol &&
			    l->inodes[j].ino == inos[i].ino)
				break;
		ret = plan_inode(fs, sv, inos[i].ino, datasync, j < l->ninodes, &plans[i]);
		nlog = i + 1;
		if (ret < 0)
			break;
		ok = ret == 1;
		ret = 0;
		if (!ok)
			blog_debug(&fs->log, "fsync of inode %llu in subvolume %llu commits: %s",
				   (unsigned long long)inos[i].ino,
				   (unsigned long long)inos[i].subvol, plans[i].why);
	}
	for (i = 0; ret == 0 && ok && i < l->ninodes; i++) {
		ret = still_named(fs, &l->inodes[i]);
		ok = ret == 1;
		ret = ret < 0 ? ret : 0;
		if (!ok)
			blog_debug(&fs->log, "fsync commits: inode %llu, logged before, "
				   "lost or changed a name", (unsigned long long)l->inodes[i].ino);
	}
	if (ret)
		goto out;
	if (!ok) {
		ret = full_commit(w, l);
		goto out;
	}
	for (i = 0, j = 0; i < n; i++)
		j += plans[i].skip ? 0 : plans[i].items.n;
	if (j == 0)
		goto out; /* nothing changed since the commit */
	if (j > LOG_MAX_ITEMS) {
		blog_debug(&fs->log, "fsync commits: %zu items to log", j);
		ret = full_commit(w, l);
		goto out;
	}

	/* 2. into the log trees */
	memset(&t, 0, sizeof(t));
	t.transid = w->txn.tt.transid;
	t.open = 1;
	t.cache = &fs->cache;
	t.ops = &log_block_ops;
	t.ops_arg = l;
	memcpy(t.chunk_tree_uuid, fs->vol.chunk_tree_uuid, BTRFS_UUID_SIZE);
	l->transid = t.transid;
	for (i = 0; i < n && ret == 0; i++)
		if (!plans[i].skip)
			ret = log_inode(l, &t, &plans[i]);
	if (ret == 0)
		ret = update_log_roots(l, &t);
	/* 3, 4 */
	if (ret == 0)
		ret = write_log(l, &t);
	tree_trans_release_dirty(&t);
	if (ret == 0)
		ret = log_release(l);
	if (ret == 0) {
		l->syncs++;
	} else if (ret == -ENOSPC) {
		/* the log found no room: a commit needs none of it */
		ret = full_commit(w, l);
	} else {
		/*
		 * The log in memory may be half changed and the disk may name
		 * either log: only a commit makes the state certain again.
		 */
		blog_err(&fs->log, "tree log sync failed (%s): committing instead", strerror(-ret));
		ret = full_commit(w, l);
	}
out:
	for (i = 0; i < nlog; i++)
		plan_free(&plans[i]);
	free(plans);
	pthread_mutex_unlock(&w->lock);
	return ret;
}

int tlog_fsync(struct butter_fs *fs, butter_ino_t ino, int datasync)
{
	return tlog_fsync_many(fs, &ino, 1, datasync);
}
