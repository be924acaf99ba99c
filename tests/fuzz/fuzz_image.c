/*
 * fuzz_image.c — loading the seed images and applying a fuzz input's edits
 * to them (the language is described in fuzz_image.h).
 *
 * Invariants:
 *  1. seed->pristine never changes after loading; seed->work equals it
 *     between fuzz_image_restore() and the next fuzz_image_apply().
 *  2. Every byte of work that an edit or a checksum fix-up changes lies in a
 *     range recorded in the touched log, so restore needs no full copy.
 *  3. Edits never write outside [work, work + size): offsets are reduced
 *     modulo the target size and lengths clipped to the target's end.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "format/checksum.h"
#include "format/ondisk.h"
#include "fuzz_image.h"

#define MAX_SEEDS 16

static struct fuzz_seed seeds[MAX_SEEDS];
static size_t nseeds;

/* The touched log and the set of tree blocks edited by the current input. */
struct range {
	size_t off, len;
};
static struct range *touched;
static size_t ntouched, touched_cap;
static int touched_overflow;
static uint8_t *block_dirty;     /* one flag per block of the current seed */
static size_t *dirty_list;
static size_t ndirty;

/* ---- loading ------------------------------------------------------------ */

static uint8_t *gunzip_file(const char *path, size_t *size)
{
	gzFile gz = gzopen(path, "rb");
	size_t cap = 1 << 20, len = 0;
	uint8_t *buf = NULL;

	if (!gz)
		return NULL;
	for (;;) {
		uint8_t *nb;
		int n;

		if (len == cap || !buf) {
			if (buf)
				cap *= 2;
			nb = realloc(buf, cap);
			if (!nb)
				goto fail;
			buf = nb;
		}
		n = gzread(gz, buf + len, (unsigned)(cap - len > (1u << 30) ? 1u << 30 : cap - len));
		if (n < 0)
			goto fail;
		if (n == 0)
			break;
		len += (size_t)n;
	}
	gzclose(gz);
	*size = len;
	return buf;
fail:
	gzclose(gz);
	free(buf);
	return NULL;
}

static int is_super_offset(const struct fuzz_seed *s, uint64_t off, uint64_t len)
{
	int i;

	for (i = 0; i < s->nsupers; i++)
		if (off < s->supers[i] + BTRFS_SUPER_INFO_SIZE && s->supers[i] < off + len)
			return 1;
	return 0;
}

/* Find the superblock copies and every tree block whose checksum matches. */
static int index_seed(struct fuzz_seed *s)
{
	const struct btrfs_super_block *sb;
	const uint8_t *fsid;
	size_t cap = 0;
	uint64_t off;
	int m;

	for (m = 0; m < BTRFS_SUPER_MIRROR_MAX; m++) {
		uint64_t o = btrfs_sb_offset(m);

		if (o + BTRFS_SUPER_INFO_SIZE > s->size)
			break;
		sb = (const struct btrfs_super_block *)(s->pristine + o);
		if (btrfs_super_magic(sb) == BTRFS_MAGIC)
			s->supers[s->nsupers++] = o;
	}
	if (s->nsupers == 0 || s->supers[0] != BTRFS_SUPER_INFO_OFFSET)
		return -1;
	sb = (const struct btrfs_super_block *)(s->pristine + BTRFS_SUPER_INFO_OFFSET);
	s->nodesize = btrfs_super_nodesize(sb);
	s->sectorsize = btrfs_super_sectorsize(sb);
	s->csum_type = btrfs_super_csum_type(sb);
	if (btrfs_csum_size(s->csum_type) == 0 || s->sectorsize < 512 || s->nodesize < 512 ||
	    s->nodesize > 65536 || s->sectorsize > s->nodesize)
		return -1;
	fsid = btrfs_super_incompat_flags(sb) & BTRFS_FEATURE_INCOMPAT_METADATA_UUID
		       ? sb->metadata_uuid
		       : sb->fsid;
	for (off = 0; off + s->nodesize <= s->size; off += s->sectorsize) {
		const struct btrfs_header *h = (const struct btrfs_header *)(s->pristine + off);
		uint8_t csum[BTRFS_CSUM_SIZE];

		if (memcmp(h->fsid, fsid, BTRFS_FSID_SIZE) != 0 || is_super_offset(s, off, s->nodesize))
			continue;
		btrfs_csum_compute(s->csum_type, s->pristine + off + BTRFS_CSUM_SIZE,
				   s->nodesize - BTRFS_CSUM_SIZE, csum);
		if (memcmp(csum, h->csum, (size_t)btrfs_csum_size(s->csum_type)) != 0)
			continue;
		if (s->nblocks == cap) {
			struct fuzz_block *nb;

			cap = cap ? cap * 2 : 64;
			nb = realloc(s->blocks, cap * sizeof(*nb));
			if (!nb)
				return -1;
			s->blocks = nb;
		}
		s->blocks[s->nblocks].physical = off;
		s->blocks[s->nblocks].logical = btrfs_header_bytenr(h);
		s->nblocks++;
		off += s->nodesize - s->sectorsize; /* blocks do not overlap */
	}
	return s->nblocks ? 0 : -1;
}

static long find_logical(const struct fuzz_seed *s, uint64_t logical)
{
	size_t i;

	for (i = 0; i < s->nblocks; i++)
		if (s->blocks[i].logical == logical)
			return (long)i;
	return -1;
}

/* Mark the block at @logical and everything below it reachable. */
static void reach(const struct fuzz_seed *s, uint64_t logical, uint8_t *live, int depth)
{
	const struct btrfs_header *h;
	const uint8_t *b;
	long idx = find_logical(s, logical);
	u32 i, n;

	if (idx < 0 || live[idx] || depth > BTRFS_MAX_LEVEL)
		return;
	live[idx] = 1;
	b = s->pristine + s->blocks[idx].physical;
	h = (const struct btrfs_header *)b;
	n = btrfs_header_nritems(h);
	if (h->level > 0) {
		for (i = 0; i < n && sizeof(*h) + (i + 1) * sizeof(struct btrfs_key_ptr) <= s->nodesize;
		     i++) {
			const struct btrfs_key_ptr *p = (const struct btrfs_key_ptr *)(b + sizeof(*h)) + i;

			reach(s, btrfs_key_ptr_blockptr(p), live, depth + 1);
		}
		return;
	}
	/* a leaf of the root tree names the other trees' roots */
	for (i = 0; i < n && sizeof(*h) + (i + 1) * sizeof(struct btrfs_item) <= s->nodesize; i++) {
		const struct btrfs_item *it = (const struct btrfs_item *)(b + sizeof(*h)) + i;
		u32 off = btrfs_item_offset(it), size = btrfs_item_size(it);

		if (it->key.type != BTRFS_ROOT_ITEM_KEY || size < BTRFS_ROOT_ITEM_V1_SIZE ||
		    off > s->nodesize - sizeof(*h) || size > s->nodesize - sizeof(*h) - off)
			continue;
		reach(s, btrfs_root_bytenr((const struct btrfs_root_item *)(b + sizeof(*h) + off)),
		      live, 0);
	}
}

/*
 * Keep only the blocks the filesystem can reach (a kernel-made image also
 * holds stale copies whose checksums still match; editing those is wasted).
 */
static void keep_live_blocks(struct fuzz_seed *s)
{
	const struct btrfs_super_block *sb =
		(const struct btrfs_super_block *)(s->pristine + BTRFS_SUPER_INFO_OFFSET);
	uint8_t *live = calloc(s->nblocks, 1);
	size_t i, n = 0;

	if (!live)
		return;
	reach(s, btrfs_super_chunk_root(sb), live, 0);
	reach(s, btrfs_super_root(sb), live, 0);
	if (btrfs_super_log_root(sb))
		reach(s, btrfs_super_log_root(sb), live, 0);
	for (i = 0; i < s->nblocks; i++)
		if (live[i])
			s->blocks[n++] = s->blocks[i];
	if (n)
		s->nblocks = n;
	free(live);
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

size_t fuzz_seeds_load(const char *dir)
{
	char *names[MAX_SEEDS];
	size_t nnames = 0, i, maxblocks = 0;
	struct dirent *de;
	DIR *d = opendir(dir);

	if (!d) {
		fprintf(stderr, "fuzz: cannot open seed directory %s\n", dir);
		return 0;
	}
	while ((de = readdir(d)) && nnames < MAX_SEEDS) {
		size_t len = strlen(de->d_name);

		if (len > 7 && strcmp(de->d_name + len - 7, ".img.gz") == 0)
			names[nnames++] = strdup(de->d_name);
	}
	closedir(d);
	qsort(names, nnames, sizeof(names[0]), name_cmp);
	for (i = 0; i < nnames; i++) {
		struct fuzz_seed *s = &seeds[nseeds];
		char path[4096];

		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		memset(s, 0, sizeof(*s));
		snprintf(s->name, sizeof(s->name), "%.*s", (int)(strlen(names[i]) - 7), names[i]);
		s->pristine = gunzip_file(path, &s->size);
		if (s->pristine && index_seed(s) == 0)
			keep_live_blocks(s);
		if (!s->pristine || s->nblocks == 0) {
			fprintf(stderr, "fuzz: %s: not a usable seed image\n", path);
			free(s->pristine);
			free(s->blocks);
		} else if (!(s->work = malloc(s->size))) {
			free(s->pristine);
			free(s->blocks);
		} else {
			memcpy(s->work, s->pristine, s->size);
			if (s->nblocks > maxblocks)
				maxblocks = s->nblocks;
			nseeds++;
		}
		free(names[i]);
	}
	block_dirty = calloc(maxblocks ? maxblocks : 1, 1);
	dirty_list = calloc(maxblocks ? maxblocks : 1, sizeof(*dirty_list));
	if (!block_dirty || !dirty_list)
		nseeds = 0;
	return nseeds;
}

const char *fuzz_seeds_dir(const char *fallback)
{
	const char *dir = getenv("BUTTER_FUZZ_SEEDS");

	return dir && *dir ? dir : fallback;
}

int fuzz_seed_digest(size_t idx, char hex[65])
{
	uint8_t digest[BTRFS_CSUM_SIZE];
	int i;

	if (idx >= nseeds ||
	    btrfs_csum_compute(BTRFS_CSUM_TYPE_SHA256, seeds[idx].pristine, seeds[idx].size, digest))
		return -1;
	for (i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", digest[i]);
	return 0;
}

size_t fuzz_seed_count(void)
{
	return nseeds;
}

struct fuzz_seed *fuzz_seed_get(size_t idx)
{
	return idx < nseeds ? &seeds[idx] : NULL;
}

/* ---- edits -------------------------------------------------------------- */

static void touch(size_t off, size_t len)
{
	if (ntouched == touched_cap) {
		size_t cap = touched_cap ? touched_cap * 2 : 256;
		struct range *t = realloc(touched, cap * sizeof(*t));

		if (!t) {
			touched_overflow = 1;
			return;
		}
		touched = t;
		touched_cap = cap;
	}
	touched[ntouched].off = off;
	touched[ntouched].len = len;
	ntouched++;
}

static void mark_block(size_t idx)
{
	if (!block_dirty[idx]) {
		block_dirty[idx] = 1;
		dirty_list[ndirty++] = idx;
	}
}

/* Mark every tree block overlapping [off, off + len) as edited. */
static void mark_blocks_in(const struct fuzz_seed *s, size_t off, size_t len)
{
	size_t lo = 0, hi = s->nblocks;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (s->blocks[mid].physical + s->nodesize <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < s->nblocks && s->blocks[lo].physical < off + len; lo++)
		mark_block(lo);
}

/* Bytes read from the input; a read past its end sets *short_input. */
struct reader {
	const uint8_t *p, *end;
	int short_input;
};

static uint64_t take(struct reader *r, int nbytes)
{
	uint64_t v = 0;
	int i;

	if (r->end - r->p < nbytes) {
		r->short_input = 1;
		r->p = r->end;
		return 0;
	}
	for (i = 0; i < nbytes; i++)
		v |= (uint64_t)r->p[i] << (8 * i);
	r->p += nbytes;
	return v;
}

static uint64_t interesting(const struct fuzz_seed *s, unsigned v)
{
	static const uint64_t table[] = {
		0, 1, 2, 3, 4, 7, 8, 15, 16, 17, 25, 31, 32, 33, 63, 64, 100, 101, 127, 128, 255, 256,
		511, 512, 1023, 1024, 2047, 2048, 4095, 4096, 4097, 8192, 16383, 16384, 32767, 32768,
		65535, 65536, 65537, 1ULL << 20, 1ULL << 30, 0x7fffffffULL, 0x80000000ULL,
		0xffffffffULL, 0x100000000ULL, 0x7fffffffffffffffULL, 0x8000000000000000ULL,
		0xfffffffffffffffeULL, 0xffffffffffffffffULL,
	};
	const size_t n = sizeof(table) / sizeof(table[0]);

	v %= (unsigned)n + 4;
	if (v < n)
		return table[v];
	switch (v - n) {
	case 0: return s->nodesize;
	case 1: return s->nodesize - 101; /* a leaf's data area */
	case 2: return s->sectorsize;
	default: return s->size;
	}
}

/*
 * Resolve target byte @t to the regions an edit at @off of length @len
 * covers: one tree block, or every superblock copy. Returns the number of
 * regions written to @starts (0 if the seed has no such target).
 */
static int target_regions(const struct fuzz_seed *s, unsigned t, size_t *tsize, size_t starts[3])
{
	int i;

	if (t == FUZZ_TARGET_SUPER) {
		for (i = 0; i < s->nsupers; i++)
			starts[i] = s->supers[i];
		*tsize = BTRFS_SUPER_INFO_SIZE;
		return s->nsupers;
	}
	starts[0] = s->blocks[t % s->nblocks].physical;
	*tsize = s->nodesize;
	return 1;
}

/* Where the seed's (pristine) copy of target @t starts. */
static const uint8_t *target_source(const struct fuzz_seed *s, unsigned t, size_t *tsize)
{
	if (t == FUZZ_TARGET_SUPER) {
		*tsize = BTRFS_SUPER_INFO_SIZE;
		return s->pristine + s->supers[0];
	}
	*tsize = s->nodesize;
	return s->pristine + s->blocks[t % s->nblocks].physical;
}

/* Write @len bytes of @src at @off of every region of target @t (clipped). */
static void put_target(struct fuzz_seed *s, unsigned t, size_t off, const uint8_t *src, size_t len)
{
	size_t starts[3], tsize;
	int n = target_regions(s, t, &tsize, starts), i;

	off %= tsize;
	if (len > tsize - off)
		len = tsize - off;
	for (i = 0; i < n; i++) {
		memcpy(s->work + starts[i] + off, src, len);
		touch(starts[i] + off, len);
		if (t != FUZZ_TARGET_SUPER)
			mark_block(t % s->nblocks);
	}
}

/* The current value (little-endian, @width bytes) at @off of target @t's first region. */
static uint64_t get_target(const struct fuzz_seed *s, unsigned t, size_t off, size_t width)
{
	size_t starts[3], tsize, i;
	uint64_t v = 0;

	target_regions(s, t, &tsize, starts);
	off %= tsize;
	for (i = 0; i < width && off + i < tsize; i++)
		v |= (uint64_t)s->work[starts[0] + off + i] << (8 * i);
	return v;
}

static void put_int(struct fuzz_seed *s, unsigned t, size_t off, size_t width, uint64_t v)
{
	uint8_t b[8];
	size_t i;

	for (i = 0; i < width; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	put_target(s, t, off, b, width);
}

/*
 * Where an item-relative edit lands, as an offset into block @t: slot @slot
 * (modulo the item count) and byte @fld of its data (@in_data) or of its
 * header / key pointer. Uses the block as edited so far, falling back to the
 * header when the item's own offset and size are already nonsense. Returns
 * -1 when the block has no items.
 */
static long item_position(const struct fuzz_seed *s, unsigned t, unsigned slot, unsigned fld,
			  int in_data)
{
	const uint8_t *b = s->work + s->blocks[t % s->nblocks].physical;
	const struct btrfs_header *h = (const struct btrfs_header *)b;
	const size_t hsz = sizeof(*h), room = s->nodesize - hsz;
	size_t each = h->level ? sizeof(struct btrfs_key_ptr) : sizeof(struct btrfs_item);
	u32 nritems = btrfs_header_nritems(h);
	const struct btrfs_item *it;
	u32 ioff, isize;

	if (nritems > room / each)
		nritems = (u32)(room / each);
	if (nritems == 0)
		return -1;
	slot %= nritems;
	if (h->level || !in_data)
		return (long)(hsz + slot * each + fld % each);
	it = (const struct btrfs_item *)(b + hsz) + slot;
	ioff = btrfs_item_offset(it);
	isize = btrfs_item_size(it);
	if (isize == 0 || ioff > room || isize > room - ioff)
		return (long)(hsz + slot * each + fld % each);
	return (long)(hsz + ioff + fld % isize);
}

/* Ops 8-11: item-relative SET, ADD, WRITE, and SET in the item header. */
static void apply_item_edit(struct fuzz_seed *s, struct reader *r, unsigned op, unsigned t)
{
	unsigned slot = (unsigned)take(r, 1), fld = (unsigned)take(r, 1);
	size_t width = 1, n;
	uint8_t buf[256];
	long pos;

	if (t == FUZZ_TARGET_SUPER)
		t = 0;
	if (op == 10) {
		n = (size_t)take(r, 1);
		if (r->end - r->p < (ptrdiff_t)n)
			n = (size_t)(r->end - r->p);
		memcpy(buf, r->p, n);
		r->p += n;
	} else {
		width = (size_t)1 << (take(r, 1) & 3);
		n = (size_t)take(r, 1);
	}
	if (r->short_input)
		return;
	pos = item_position(s, t, slot, fld, op != 11);
	if (pos < 0)
		return;
	if (op == 10)
		put_target(s, t, (size_t)pos, buf, n);
	else if (op == 9)
		put_int(s, t, (size_t)pos, width,
			get_target(s, t, (size_t)pos, width) + (uint64_t)(int64_t)(int8_t)n);
	else
		put_int(s, t, (size_t)pos, width, interesting(s, (unsigned)n));
}

static void apply_edit(struct fuzz_seed *s, struct reader *r)
{
	unsigned op = (unsigned)take(r, 1) & 15, t = (unsigned)take(r, 1);
	size_t off, n, width;
	uint8_t buf[256];

	if (op >= 12)
		op -= 12; /* spare codes repeat WRITE, ADD, PTR, COPY */
	if (op >= 8) {
		apply_item_edit(s, r, op, t);
		return;
	}

	if (op == 5) { /* RAW: no target */
		off = (size_t)(take(r, 4) % s->size);
		n = (size_t)take(r, 1);
		if (r->end - r->p < (ptrdiff_t)n)
			n = (size_t)(r->end - r->p);
		if (n > s->size - off)
			n = s->size - off;
		memcpy(s->work + off, r->p, n);
		r->p += n;
		touch(off, n);
		mark_blocks_in(s, off, n);
		return;
	}
	off = (size_t)take(r, 2);
	switch (op) {
	case 0: /* WRITE */
		n = (size_t)take(r, 1);
		if (r->end - r->p < (ptrdiff_t)n)
			n = (size_t)(r->end - r->p);
		memcpy(buf, r->p, n);
		r->p += n;
		if (!r->short_input)
			put_target(s, t, off, buf, n);
		break;
	case 1: /* ADD */
		width = (size_t)1 << (take(r, 1) & 3);
		{
			int8_t delta = (int8_t)take(r, 1);

			if (!r->short_input)
				put_int(s, t, off, width,
					get_target(s, t, off, width) + (uint64_t)(int64_t)delta);
		}
		break;
	case 2: /* PTR */
		n = (size_t)take(r, 1);
		if (!r->short_input)
			put_int(s, t, off, 8, s->blocks[n % s->nblocks].logical);
		break;
	case 3: /* COPY */
	{
		unsigned src_t = (unsigned)take(r, 1);
		size_t soff = (size_t)take(r, 2), ssize;
		const uint8_t *src;

		n = (size_t)take(r, 1);
		if (r->short_input)
			break;
		src = target_source(s, src_t, &ssize);
		soff %= ssize;
		if (n > ssize - soff)
			n = ssize - soff;
		memcpy(buf, src + soff, n);
		put_target(s, t, off, buf, n);
		break;
	}
	case 4: /* SET */
		width = (size_t)1 << (take(r, 1) & 3);
		n = (size_t)take(r, 1);
		if (!r->short_input)
			put_int(s, t, off, width, interesting(s, (unsigned)n));
		break;
	case 6: /* FLIP */
		n = (size_t)take(r, 1);
		if (!r->short_input)
			put_int(s, t, off, 1, get_target(s, t, off, 1) ^ (1u << (n & 7)));
		break;
	case 7: /* FILL */
	{
		size_t len = (size_t)take(r, 2), done;
		uint8_t byte = (uint8_t)take(r, 1);

		if (r->short_input)
			break;
		memset(buf, byte, sizeof(buf));
		len %= s->nodesize + 1;
		for (done = 0; done < len; done += sizeof(buf))
			put_target(s, t, off + done,  buf,
				   len - done < sizeof(buf) ? len - done : sizeof(buf));
		break;
	}
	}
}

static void fix_checksums(struct fuzz_seed *s, unsigned mode)
{
	size_t i;
	int c;

	if (mode & FUZZ_MODE_FIX_NODES) {
		for (i = 0; i < ndirty; i++) {
			uint8_t *block = s->work + s->blocks[dirty_list[i]].physical;

			btrfs_csum_compute(s->csum_type, block + BTRFS_CSUM_SIZE,
					   s->nodesize - BTRFS_CSUM_SIZE, block);
			touch((size_t)(block - s->work), BTRFS_CSUM_SIZE);
		}
	}
	if (mode & FUZZ_MODE_FIX_SUPER) {
		for (c = 0; c < s->nsupers; c++) {
			uint8_t *sb = s->work + s->supers[c];
			uint16_t type = btrfs_super_csum_type((const struct btrfs_super_block *)sb);

			if (btrfs_csum_size(type) == 0)
				type = s->csum_type;
			btrfs_csum_compute(type, sb + BTRFS_CSUM_SIZE,
					   BTRFS_SUPER_INFO_SIZE - BTRFS_CSUM_SIZE, sb);
			touch(s->supers[c], BTRFS_CSUM_SIZE);
		}
	}
}

struct fuzz_seed *fuzz_image_apply(const uint8_t *data, size_t size)
{
	struct reader r = { data, data + size, 0 };
	struct fuzz_seed *s;
	unsigned mode;

	if (size == 0 || nseeds == 0)
		return NULL;
	mode = data[0];
	s = &seeds[(mode >> 2) % nseeds];
	r.p++;
	ntouched = 0;
	touched_overflow = 0;
	ndirty = 0;
	while (r.p < r.end && !r.short_input)
		apply_edit(s, &r);
	fix_checksums(s, mode);
	return s;
}

void fuzz_image_restore(struct fuzz_seed *seed)
{
	size_t i;

	if (!seed)
		return;
	if (touched_overflow) {
		memcpy(seed->work, seed->pristine, seed->size);
	} else {
		for (i = ntouched; i-- > 0;)
			memcpy(seed->work + touched[i].off, seed->pristine + touched[i].off,
			       touched[i].len);
	}
	for (i = 0; i < ndirty; i++)
		block_dirty[dirty_list[i]] = 0;
	ntouched = 0;
	ndirty = 0;
	touched_overflow = 0;
}
