/*
 * stress.c — many threads calling libbutter at once on ONE read-write handle,
 * each result checked against an exact model; meant to run under
 * ThreadSanitizer (scripts/tsan.sh) and AddressSanitizer. Uses only the
 * public API (<butter/butter.h>) and libc.
 *
 * usage: butter-stress [OPTIONS] IMAGE
 *   IMAGE is a freshly made btrfs image (mkfs.btrfs), or with --mkfs the
 *   tool makes it with butter_mkfs() (created or grown to --size).
 *
 * Options:
 *   --seconds N    how long the threads run (default 30)
 *   --seed S       seeds every thread's choices and data (default 1)
 *   --threads N    writers and readers, N of each (default 4)
 *   --writers N / --readers N   set them apart
 *   --max-file B   largest offset a writer writes (default 262144)
 *   --mkfs         make IMAGE with butter_mkfs() first
 *   --size B       image size with --mkfs (default 1 GiB)
 *   --app-lock     serialise every library call with one pthread rwlock held
 *                  by this program (reads shared, changes exclusive) on top of
 *                  the library's own, as the FUSE daemon did before the
 *                  library took its lock
 *   --no-snapshots no snapshot thread
 *
 * Layout made at start: subvolume "vol" and directory "snaps" in the top
 * level; "vol/w<i>" belongs to writer i. Threads:
 *   writer i   alone changes vol/w<i>: files f0..f5 in it and in its
 *              subdirectories d1..d3 (create, write at random offsets,
 *              truncate, rename with and without NOREPLACE/EXCHANGE, unlink,
 *              mkdir, rmdir, xattrs, fsync, fsync_many), and "sealed" files
 *              s<k> that never change once published. Every call's result
 *              is compared with what the model says (errors included).
 *   reader     verifies a writer's tree exactly (names, inodes, types, sizes,
 *              bytes, xattrs) while holding that writer's mutex (so the model
 *              is stable; other writers keep changing the same trees inside
 *              the library), and reads published sealed files with no test
 *              lock at all.
 *   syncer     butter_sync(), fsync of sealed files, statfs, info, subvol list.
 *   snapshot   holds every writer's mutex only while it copies the models and
 *              calls butter_snapshot() (read-only or writable), then verifies
 *              the snapshot against the copy byte for byte, writes into a
 *              writable one, keeps it through the next round, re-verifies it
 *              and deletes it.
 * The model's lock order is writer mutexes in index order, then (with
 * --app-lock) the rwlock, which is always innermost.
 *
 * At the end: every thread stopped, last snapshot deleted, butter_close();
 * a read-only open verifies every file against the model, walks the whole
 * tree (every entry stat'ed, every file read), runs butter_check(), closes.
 * Prints "stress: N calls, 0 errors" and exits 0; on any mismatch or
 * unexpected result it says what and where and exits 1 (2: usage/setup).
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <butter/butter.h>

#define NSUB 4          /* sub 0: the writer's directory; 1..3: d1..d3 inside it */
#define NNAMES 6        /* f0..f5 per directory */
#define MAX_SEALED 24   /* sealed files per writer */
#define SEALED_MAX_SIZE (160u * 1024)
#define MAX_WRITE (96u * 1024)
#define MAX_THREADS 32
#define XNAME "user.stress"
#define MAX_ENTS 64

/* ---- options and global state ------------------------------------------ */

static struct {
	unsigned seconds, writers, readers;
	uint64_t seed, maxfile, size;
	int app_lock, mkfs, snapshots;
	const char *image;
} opt = { 30, 4, 4, 1, 262144, 1ull << 30, 0, 0, 1, NULL };

static struct butter_fs *fs;
static pthread_rwlock_t app_rw;
static atomic_ulong ncalls;
static atomic_int nerrors;
static atomic_int stopping;
static atomic_ulong nsyncs, nsnaps, nfsyncs, nverified_bytes;

static uint64_t vol_id;
static butter_ino_t top_root, vol_root, snaps_dir;

static _Thread_local char tname[32];

/* ---- the library, optionally behind the test's own rwlock -------------- */

static void lk(int excl)
{
	if (!opt.app_lock)
		return;
	if (excl)
		pthread_rwlock_wrlock(&app_rw);
	else
		pthread_rwlock_rdlock(&app_rw);
}

static void unlk(void)
{
	if (opt.app_lock)
		pthread_rwlock_unlock(&app_rw);
	atomic_fetch_add_explicit(&ncalls, 1, memory_order_relaxed);
}

/* A read-side call (shared) and a change (exclusive), each counted. */
#define RD(expr) ({ lk(0); __typeof__(expr) r_ = (expr); unlk(); r_; })
#define WR(expr) ({ lk(1); __typeof__(expr) r_ = (expr); unlk(); r_; })

/* ---- failures ------------------------------------------------------------ */

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void fail(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "stress: FAIL [%s] %s\n", tname, msg);
	atomic_fetch_add(&nerrors, 1);
	atomic_store(&stopping, 1);
}

static const char *errname(long r)
{
	static _Thread_local char buf[64];

	if (r >= 0) {
		snprintf(buf, sizeof(buf), "%ld", r);
		return buf;
	}
	snprintf(buf, sizeof(buf), "%ld (%s)", r, strerror((int)-r));
	return buf;
}

/* 0 if @got is @want, otherwise a failure naming @what. */
static int expect(long got, long want, const char *what, const char *path)
{
	char g[64];

	if (got == want)
		return 0;
	snprintf(g, sizeof(g), "%s", errname(got));
	fail("%s %s: returned %s, expected %s", what, path, g, errname(want));
	return -1;
}

static int stop_now(void)
{
	return atomic_load_explicit(&stopping, memory_order_relaxed);
}

/* ---- random numbers and data --------------------------------------------- */

static uint64_t xs(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static uint64_t rnd(uint64_t *s, uint64_t n)
{
	return n ? xs(s) % n : 0;
}

static uint64_t seed_for(uint64_t a, uint64_t b)
{
	uint64_t x = (opt.seed + 1) * 0x9e3779b97f4a7c15ull ^ (a * 0xbf58476d1ce4e5b9ull) ^
		     (b * 0x94d049bb133111ebull);

	return x ? x : 1;
}

static void fill(unsigned char *buf, size_t len, uint64_t seed)
{
	uint64_t s = seed | 1;
	size_t i;

	for (i = 0; i < len; i++) {
		if (!(i & 7))
			xs(&s);
		buf[i] = (unsigned char)(s >> ((i & 7) * 8));
	}
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* ---- the model ----------------------------------------------------------- */

struct mfile {
	int live;
	butter_ino_t ino;
	unsigned char *data;
	size_t size, cap;
	int has_x;
	size_t xlen;
	char xval[32];
};

struct sealed {
	butter_ino_t ino;
	uint64_t seed;
	size_t size;
};

struct model {
	int dlive[NSUB];
	butter_ino_t dino[NSUB];
	struct mfile f[NSUB][NNAMES];
	unsigned nsealed;
	struct sealed sealed[MAX_SEALED];
};

struct writer {
	pthread_mutex_t mu; /* the model may change only under it */
	unsigned id;
	struct model m;
	atomic_uint sealed_pub; /* sealed[0..sealed_pub) readable with no lock */
	uint64_t rng;
	unsigned long ops;
};

static struct writer writers[MAX_THREADS];

static void fname(char *buf, size_t cap, unsigned n)
{
	snprintf(buf, cap, "f%u", n);
}

static void dname(char *buf, size_t cap, unsigned d)
{
	snprintf(buf, cap, "d%u", d);
}

static void wpath(char *buf, size_t cap, unsigned w, unsigned d, unsigned n)
{
	if (d)
		snprintf(buf, cap, "w%u/d%u/f%u", w, d, n);
	else
		snprintf(buf, cap, "w%u/f%u", w, n);
}

static void mfile_reserve(struct mfile *f, size_t size)
{
	if (size <= f->cap)
		return;
	size_t cap = f->cap ? f->cap : 4096;

	while (cap < size)
		cap *= 2;
	f->data = realloc(f->data, cap);
	if (!f->data) {
		fprintf(stderr, "stress: out of memory\n");
		exit(2);
	}
	f->cap = cap;
}

/* Make the model file @size bytes: what grows reads as zeros. */
static void mfile_resize(struct mfile *f, size_t size)
{
	mfile_reserve(f, size);
	if (size > f->size)
		memset(f->data + f->size, 0, size - f->size);
	f->size = size;
}

static void mfile_clear(struct mfile *f)
{
	free(f->data);
	memset(f, 0, sizeof(*f));
}

static void model_copy(struct model *dst, const struct model *src)
{
	unsigned d, n;

	*dst = *src;
	for (d = 0; d < NSUB; d++)
		for (n = 0; n < NNAMES; n++) {
			struct mfile *f = &dst->f[d][n];

			f->data = NULL;
			f->cap = 0;
			if (f->live && f->size) {
				f->data = malloc(f->size);
				if (!f->data) {
					fprintf(stderr, "stress: out of memory\n");
					exit(2);
				}
				memcpy(f->data, src->f[d][n].data, f->size);
				f->cap = f->size;
			}
		}
}

static void model_free(struct model *m)
{
	unsigned d, n;

	for (d = 0; d < NSUB; d++)
		for (n = 0; n < NNAMES; n++)
			mfile_clear(&m->f[d][n]);
}

/* ---- verification ----------------------------------------------------------- */

struct ent {
	char name[16];
	uint64_t ino;
	unsigned dtype;
};

struct listing {
	struct ent e[MAX_ENTS];
	unsigned n, batch, in_batch;
	int overflow;
	uint64_t next;
};

static int collect(void *arg, const char *name, size_t namelen, butter_ino_t ino, unsigned dtype,
		   uint64_t next_pos)
{
	struct listing *l = arg;

	if (l->n >= MAX_ENTS || namelen >= sizeof(l->e[0].name)) {
		l->overflow = 1;
		return 3;
	}
	memcpy(l->e[l->n].name, name, namelen);
	l->e[l->n].name[namelen] = 0;
	l->e[l->n].ino = ino.ino;
	l->e[l->n].dtype = dtype;
	l->n++;
	l->next = next_pos;
	if (++l->in_batch >= l->batch)
		return 2; /* resume from next_pos in another call */
	return 0;
}

/* List @dir fully in batches of @batch entries; 0 or -1 (failure reported). */
static int list_dir(butter_ino_t dir, unsigned batch, struct listing *l, const char *path)
{
	uint64_t pos = 0;
	int r;

	memset(l, 0, sizeof(*l));
	l->batch = batch ? batch : 1;
	for (;;) {
		l->in_batch = 0;
		r = RD(butter_readdir(fs, dir, pos, collect, l));
		if (l->overflow) {
			fail("readdir %s: more than %d entries or an unexpected long name", path,
			     MAX_ENTS);
			return -1;
		}
		if (r == 0)
			return 0;
		if (r != 2) {
			expect(r, 0, "readdir", path);
			return -1;
		}
		if (l->next <= pos) {
			fail("readdir %s: next_pos %" PRIu64 " does not move on from %" PRIu64, path,
			     l->next, pos);
			return -1;
		}
		pos = l->next;
	}
}

static int ent_cmp(const void *a, const void *b)
{
	return strcmp(((const struct ent *)a)->name, ((const struct ent *)b)->name);
}

/* Compare a listing with the expected entries (both get sorted). */
static int compare_listing(struct listing *got, struct ent *want, unsigned nwant, const char *path)
{
	unsigned i;

	qsort(got->e, got->n, sizeof(got->e[0]), ent_cmp);
	qsort(want, nwant, sizeof(want[0]), ent_cmp);
	for (i = 0; i < got->n || i < nwant; i++) {
		if (i >= got->n) {
			fail("readdir %s: entry %s missing", path, want[i].name);
			return -1;
		}
		if (i >= nwant || strcmp(got->e[i].name, want[i].name)) {
			fail("readdir %s: unexpected entry %s", path, got->e[i].name);
			return -1;
		}
		if (got->e[i].ino != want[i].ino || got->e[i].dtype != want[i].dtype) {
			fail("readdir %s: entry %s is inode %" PRIu64 " type %u, expected %" PRIu64
			     " type %u",
			     path, want[i].name, got->e[i].ino, got->e[i].dtype, want[i].ino,
			     want[i].dtype);
			return -1;
		}
	}
	return 0;
}

static void add_ent(struct ent *v, unsigned *n, const char *name, uint64_t ino, unsigned dtype)
{
	snprintf(v[*n].name, sizeof(v[*n].name), "%s", name);
	v[*n].ino = ino;
	v[*n].dtype = dtype;
	(*n)++;
}

/*
 * Read @ino in pieces of random sizes over [from, to) and compare with @want
 * (the whole file, @size bytes); then a read at the end must return 0.
 */
static int read_verify(butter_ino_t ino, const unsigned char *want, size_t size, size_t from,
		       size_t to, uint64_t *rng, unsigned char *buf, const char *path)
{
	size_t pos = from;

	while (pos < to) {
		size_t len = 1 + rnd(rng, MAX_WRITE * 2);
		size_t exp = size - pos < len ? size - pos : len;
		ssize_t r;

		if (rnd(rng, 3) == 0)
			len = (len + 4095) & ~(size_t)4095;
		exp = size - pos < len ? size - pos : len;
		r = RD(butter_read(fs, ino, buf, len, pos));
		if (r != (ssize_t)exp) {
			fail("read %s [%zu, +%zu) of a %zu-byte file: returned %s, expected %zu", path,
			     pos, len, size, errname(r), exp);
			return -1;
		}
		if (memcmp(buf, want + pos, exp)) {
			size_t i = 0;

			while (buf[i] == want[pos + i])
				i++;
			fail("read %s: byte %zu is 0x%02x, expected 0x%02x (file size %zu, read at %zu "
			     "len %zu)",
			     path, pos + i, buf[i], want[pos + i], size, pos, len);
			return -1;
		}
		atomic_fetch_add_explicit(&nverified_bytes, exp, memory_order_relaxed);
		pos += exp;
		if (exp < len)
			break;
	}
	if (to >= size) {
		ssize_t r = RD(butter_read(fs, ino, buf, 4096, size + rnd(rng, 3) * 4096));

		if (r != 0) {
			fail("read %s past its end (%zu bytes): returned %s", path, size, errname(r));
			return -1;
		}
	}
	return 0;
}

static int stat_verify(butter_ino_t ino, uint32_t mode, size_t size, uint32_t nlink,
		       const char *path)
{
	struct butter_stat st;
	int r = RD(butter_stat(fs, ino, &st));

	if (expect(r, 0, "stat", path))
		return -1;
	if (st.mode != mode || st.ino != ino.ino || st.subvol != ino.subvol ||
	    (size != (size_t)-1 && st.size != size) || (nlink && st.nlink != nlink)) {
		fail("stat %s: mode 0%o ino %" PRIu64 ":%" PRIu64 " size %" PRIu64 " nlink %u, expected "
		     "mode 0%o ino %" PRIu64 ":%" PRIu64 " size %zd nlink %u",
		     path, st.mode, st.subvol, st.ino, st.size, st.nlink, mode, ino.subvol, ino.ino,
		     (ssize_t)size, nlink);
		return -1;
	}
	return 0;
}

struct vbuf {
	unsigned char *buf;   /* read buffer */
	unsigned char *want;  /* expected bytes of a sealed file */
};

static int vbuf_init(struct vbuf *v)
{
	size_t n = (opt.maxfile > SEALED_MAX_SIZE ? opt.maxfile : SEALED_MAX_SIZE) + 4 * MAX_WRITE;

	v->buf = malloc(n);
	v->want = malloc(n);
	return v->buf && v->want ? 0 : -1;
}

static void vbuf_free(struct vbuf *v)
{
	free(v->buf);
	free(v->want);
}

static int verify_sealed(const struct sealed *s, butter_ino_t ino, const char *path,
			 uint64_t *rng, struct vbuf *v, int full)
{
	size_t from = 0, to = s->size;

	if (stat_verify(ino, S_IFREG | 0600, s->size, 1, path))
		return -1;
	fill(v->want, s->size, s->seed);
	if (!full && s->size) {
		from = rnd(rng, s->size);
		to = from + 1 + rnd(rng, s->size - from);
	}
	return read_verify(ino, v->want, s->size, from, to, rng, v->buf, path);
}

static int verify_file(const struct mfile *f, butter_ino_t ino, const char *path, uint64_t *rng,
		       struct vbuf *v, int full)
{
	size_t from = 0, to = f->size;
	char x[64];
	ssize_t r;

	if (stat_verify(ino, S_IFREG | 0644, f->size, 1, path))
		return -1;
	r = RD(butter_getxattr(fs, ino, XNAME, x, sizeof(x)));
	if (f->has_x) {
		if (r != (ssize_t)f->xlen || memcmp(x, f->xval, f->xlen)) {
			fail("getxattr %s: returned %s, expected the %zu-byte value \"%.*s\"", path,
			     errname(r), f->xlen, (int)f->xlen, f->xval);
			return -1;
		}
	} else if (expect(r, -ENODATA, "getxattr", path)) {
		return -1;
	}
	if (!full && f->size) {
		from = rnd(rng, f->size);
		to = from + 1 + rnd(rng, f->size - from);
	}
	return read_verify(ino, f->data, f->size, from, to, rng, v->buf, path);
}

/*
 * Verify writer @w's tree as model @m says, found at @wdir in subvolume
 * @subvol (the live "vol" or a snapshot of it; inode numbers are the same in
 * both). @full: every file and every byte; otherwise a random part.
 */
static int verify_model(const struct model *m, unsigned w, butter_ino_t wdir, uint64_t subvol,
			int full, uint64_t *rng, struct vbuf *v, const char *where)
{
	struct listing l;
	struct ent want[MAX_ENTS];
	char path[128], name[16];
	butter_ino_t dirs[NSUB], ino;
	unsigned d, n, k, nw;
	int r;

	dirs[0] = wdir;
	for (d = 1; d < NSUB; d++) {
		dname(name, sizeof(name), d);
		snprintf(path, sizeof(path), "%sw%u/%s", where, w, name);
		r = RD(butter_lookup(fs, wdir, name, strlen(name), &dirs[d]));
		if (!m->dlive[d]) {
			if (expect(r, -ENOENT, "lookup", path))
				return -1;
			continue;
		}
		if (expect(r, 0, "lookup", path))
			return -1;
		if (dirs[d].ino != m->dino[d].ino || dirs[d].subvol != subvol) {
			fail("lookup %s: inode %" PRIu64 ":%" PRIu64 ", expected %" PRIu64 ":%" PRIu64,
			     path, dirs[d].subvol, dirs[d].ino, subvol, m->dino[d].ino);
			return -1;
		}
	}
	for (d = 0; d < NSUB; d++) {
		if (!m->dlive[d])
			continue;
		if (!full && rnd(rng, 2))
			continue;
		nw = 0;
		for (n = 0; n < NNAMES; n++)
			if (m->f[d][n].live) {
				fname(name, sizeof(name), n);
				add_ent(want, &nw, name, m->f[d][n].ino.ino, DT_REG);
			}
		if (d == 0) {
			for (k = 1; k < NSUB; k++)
				if (m->dlive[k]) {
					dname(name, sizeof(name), k);
					add_ent(want, &nw, name, m->dino[k].ino, DT_DIR);
				}
			for (k = 0; k < m->nsealed; k++) {
				snprintf(name, sizeof(name), "s%u", k);
				add_ent(want, &nw, name, m->sealed[k].ino.ino, DT_REG);
			}
			snprintf(path, sizeof(path), "%sw%u", where, w);
		} else {
			snprintf(path, sizeof(path), "%sw%u/d%u", where, w, d);
		}
		if (stat_verify(dirs[d], S_IFDIR | 0755, (size_t)-1, 1, path))
			return -1;
		if (list_dir(dirs[d], 1 + (unsigned)rnd(rng, 8), &l, path) ||
		    compare_listing(&l, want, nw, path))
			return -1;
	}
	for (d = 0; d < NSUB; d++) {
		for (n = 0; n < NNAMES; n++) {
			const struct mfile *f = &m->f[d][n];

			if (!full && rnd(rng, 4))
				continue;
			fname(name, sizeof(name), n);
			snprintf(path, sizeof(path), "%s", where);
			wpath(path + strlen(path), sizeof(path) - strlen(path), w, d, n);
			if (!m->dlive[d])
				continue;
			r = RD(butter_lookup(fs, dirs[d], name, strlen(name), &ino));
			if (!f->live) {
				if (expect(r, -ENOENT, "lookup", path))
					return -1;
				continue;
			}
			if (expect(r, 0, "lookup", path))
				return -1;
			if (ino.ino != f->ino.ino || ino.subvol != subvol) {
				fail("lookup %s: inode %" PRIu64 ":%" PRIu64 ", expected %" PRIu64
				     ":%" PRIu64,
				     path, ino.subvol, ino.ino, subvol, f->ino.ino);
				return -1;
			}
			if (verify_file(f, ino, path, rng, v, full))
				return -1;
		}
	}
	for (k = 0; k < m->nsealed; k++) {
		butter_ino_t si = { subvol, m->sealed[k].ino.ino };

		if (!full && rnd(rng, 4))
			continue;
		snprintf(path, sizeof(path), "%sw%u/s%u", where, w, k);
		if (verify_sealed(&m->sealed[k], si, path, rng, v, full))
			return -1;
	}
	return 0;
}

/* ---- writers --------------------------------------------------------------- */

static struct mfile *pick_live(struct writer *w, unsigned *pd, unsigned *pn)
{
	unsigned cand[NSUB * NNAMES], nc = 0, d, n;

	for (d = 0; d < NSUB; d++)
		for (n = 0; n < NNAMES; n++)
			if (w->m.f[d][n].live)
				cand[nc++] = d * NNAMES + n;
	if (!nc)
		return NULL;
	d = cand[rnd(&w->rng, nc)];
	*pd = d / NNAMES;
	*pn = d % NNAMES;
	return &w->m.f[*pd][*pn];
}

static unsigned pick_dir(struct writer *w)
{
	unsigned d;

	do
		d = (unsigned)rnd(&w->rng, NSUB);
	while (!w->m.dlive[d]);
	return d;
}

static void w_create(struct writer *w)
{
	struct butter_new_inode attr = { .mode = S_IFREG | 0644 };
	unsigned d = pick_dir(w), n = (unsigned)rnd(&w->rng, NNAMES);
	struct mfile *f = &w->m.f[d][n];
	char name[16], path[64];
	butter_ino_t ino;
	int r;

	fname(name, sizeof(name), n);
	wpath(path, sizeof(path), w->id, d, n);
	r = WR(butter_create(fs, w->m.dino[d], name, strlen(name), &attr, &ino));
	if (f->live) {
		expect(r, -EEXIST, "create", path);
		return;
	}
	if (expect(r, 0, "create", path))
		return;
	if (ino.subvol != vol_id) {
		fail("create %s: inode in subvolume %" PRIu64 ", expected %" PRIu64, path,
		     ino.subvol, vol_id);
		return;
	}
	f->live = 1;
	f->ino = ino;
	f->size = 0;
	f->has_x = 0;
}

static void w_write(struct writer *w, unsigned char *buf)
{
	unsigned d, n;
	struct mfile *f = pick_live(w, &d, &n);
	uint64_t off, len, room;
	char path[64];
	ssize_t r;

	if (!f)
		return;
	wpath(path, sizeof(path), w->id, d, n);
	switch (rnd(&w->rng, 4)) {
	case 0: /* append */
		off = f->size < opt.maxfile ? f->size : rnd(&w->rng, opt.maxfile);
		break;
	case 1: /* sector-aligned */
		off = rnd(&w->rng, opt.maxfile) & ~4095ull;
		break;
	default:
		off = rnd(&w->rng, opt.maxfile);
	}
	room = opt.maxfile - off;
	len = 1 + rnd(&w->rng, room < MAX_WRITE ? room : MAX_WRITE);
	if (rnd(&w->rng, 3) == 0 && len >= 4096)
		len &= ~4095ull;
	fill(buf, len, xs(&w->rng));
	r = WR(butter_write(fs, f->ino, buf, len, off));
	if (r != (ssize_t)len) {
		fail("write %s [%" PRIu64 ", +%" PRIu64 "): returned %s", path, off, len, errname(r));
		return;
	}
	if (off + len > f->size)
		mfile_resize(f, off + len);
	memcpy(f->data + off, buf, len);
}

static void w_truncate(struct writer *w)
{
	unsigned d, n;
	struct mfile *f = pick_live(w, &d, &n);
	struct butter_stat st = { 0 };
	char path[64];
	uint64_t size;

	if (!f)
		return;
	wpath(path, sizeof(path), w->id, d, n);
	switch (rnd(&w->rng, 4)) {
	case 0:
		size = 0;
		break;
	case 1:
		size = f->size / 2;
		break;
	default:
		size = rnd(&w->rng, opt.maxfile + 1);
	}
	st.size = size;
	if (expect(WR(butter_setattr(fs, f->ino, &st, BUTTER_SET_SIZE)), 0, "truncate", path))
		return;
	mfile_resize(f, size);
}

static void w_rename(struct writer *w)
{
	unsigned sd, sn, dd = pick_dir(w), dn = (unsigned)rnd(&w->rng, NNAMES), flags = 0;
	struct mfile *src = pick_live(w, &sd, &sn), *dst = &w->m.f[dd][dn], tmp;
	char sname[16], dname_[16], spath[64], dpath[64], what[96];
	uint64_t c = rnd(&w->rng, 10);
	int r, want;

	if (!src)
		return;
	if (c < 2)
		flags = BUTTER_RENAME_NOREPLACE;
	else if (c < 4)
		flags = BUTTER_RENAME_EXCHANGE;
	if (src == dst && flags)
		return; /* rename(2) onto itself: only the plain kind is defined */
	fname(sname, sizeof(sname), sn);
	fname(dname_, sizeof(dname_), dn);
	wpath(spath, sizeof(spath), w->id, sd, sn);
	wpath(dpath, sizeof(dpath), w->id, dd, dn);
	snprintf(what, sizeof(what), "rename(flags %u) to %s of", flags, dpath);
	r = WR(butter_rename(fs, w->m.dino[sd], sname, strlen(sname), w->m.dino[dd], dname_,
			     strlen(dname_), flags));
	if (src == dst) {
		expect(r, 0, what, spath);
		return;
	}
	want = 0;
	if (flags == BUTTER_RENAME_NOREPLACE && dst->live)
		want = -EEXIST;
	if (flags == BUTTER_RENAME_EXCHANGE && !dst->live)
		want = -ENOENT;
	if (expect(r, want, what, spath) || want)
		return;
	if (flags == BUTTER_RENAME_EXCHANGE) {
		tmp = *dst;
		*dst = *src;
		*src = tmp;
		return;
	}
	mfile_clear(dst);
	*dst = *src;
	memset(src, 0, sizeof(*src));
}

static void w_unlink(struct writer *w)
{
	unsigned d = pick_dir(w), n = (unsigned)rnd(&w->rng, NNAMES);
	struct mfile *f = &w->m.f[d][n];
	char name[16], path[64];
	int r;

	/* mostly a live one */
	if (!f->live && rnd(&w->rng, 4)) {
		f = pick_live(w, &d, &n);
		if (!f)
			return;
	}
	fname(name, sizeof(name), n);
	wpath(path, sizeof(path), w->id, d, n);
	r = WR(butter_unlink(fs, w->m.dino[d], name, strlen(name)));
	if (expect(r, f->live ? 0 : -ENOENT, "unlink", path) || !f->live)
		return;
	mfile_clear(f);
}

static int dir_empty(const struct writer *w, unsigned d)
{
	unsigned n;

	for (n = 0; n < NNAMES; n++)
		if (w->m.f[d][n].live)
			return 0;
	return 1;
}

static void w_mkdir(struct writer *w)
{
	struct butter_new_inode attr = { .mode = S_IFDIR | 0755 };
	unsigned d = 1 + (unsigned)rnd(&w->rng, NSUB - 1);
	char name[16], path[64];
	butter_ino_t ino;
	int r;

	dname(name, sizeof(name), d);
	snprintf(path, sizeof(path), "w%u/%s", w->id, name);
	r = WR(butter_create(fs, w->m.dino[0], name, strlen(name), &attr, &ino));
	if (expect(r, w->m.dlive[d] ? -EEXIST : 0, "mkdir", path) || w->m.dlive[d])
		return;
	w->m.dlive[d] = 1;
	w->m.dino[d] = ino;
}

static void w_rmdir(struct writer *w)
{
	unsigned d = 1 + (unsigned)rnd(&w->rng, NSUB - 1);
	char name[16], path[64];
	int r, want;

	dname(name, sizeof(name), d);
	snprintf(path, sizeof(path), "w%u/%s", w->id, name);
	want = !w->m.dlive[d] ? -ENOENT : dir_empty(w, d) ? 0 : -ENOTEMPTY;
	r = WR(butter_rmdir(fs, w->m.dino[0], name, strlen(name)));
	if (expect(r, want, "rmdir", path) || want)
		return;
	w->m.dlive[d] = 0;
}

static void w_xattr(struct writer *w)
{
	unsigned d, n;
	struct mfile *f = pick_live(w, &d, &n);
	char path[64], val[32];
	int r, len;

	if (!f)
		return;
	wpath(path, sizeof(path), w->id, d, n);
	if (rnd(&w->rng, 3)) {
		len = snprintf(val, sizeof(val), "v%" PRIu64, xs(&w->rng) >> (rnd(&w->rng, 60)));
		r = WR(butter_setxattr(fs, f->ino, XNAME, val, (size_t)len));
		if (expect(r, 0, "setxattr", path))
			return;
		f->has_x = 1;
		f->xlen = (size_t)len;
		memcpy(f->xval, val, (size_t)len);
		return;
	}
	r = WR(butter_removexattr(fs, f->ino, XNAME));
	if (expect(r, f->has_x ? 0 : -ENODATA, "removexattr", path))
		return;
	f->has_x = 0;
}

static void w_fsync(struct writer *w)
{
	butter_ino_t inos[NSUB * NNAMES];
	unsigned d, n, k = 0;
	struct mfile *f;
	char path[64];

	if (rnd(&w->rng, 4)) {
		f = pick_live(w, &d, &n);
		if (!f)
			return;
		wpath(path, sizeof(path), w->id, d, n);
		expect(WR(butter_fsync(fs, f->ino, (int)rnd(&w->rng, 2))), 0, "fsync", path);
	} else {
		for (d = 0; d < NSUB; d++)
			for (n = 0; n < NNAMES; n++)
				if (w->m.f[d][n].live)
					inos[k++] = w->m.f[d][n].ino;
		if (!k)
			return;
		snprintf(path, sizeof(path), "w%u (%u files)", w->id, k);
		expect(WR(butter_fsync_many(fs, inos, k, (int)rnd(&w->rng, 2))), 0, "fsync_many",
		       path);
	}
	atomic_fetch_add_explicit(&nfsyncs, 1, memory_order_relaxed);
}

/* A new sealed file: written once, published, never changed again. */
static void w_seal(struct writer *w, unsigned char *buf)
{
	struct butter_new_inode attr = { .mode = S_IFREG | 0600 };
	unsigned k = w->m.nsealed;
	struct sealed *s = &w->m.sealed[k];
	char name[16], path[64];
	size_t pos = 0;
	butter_ino_t ino;
	int r;

	if (k >= MAX_SEALED)
		return;
	snprintf(name, sizeof(name), "s%u", k);
	snprintf(path, sizeof(path), "w%u/%s", w->id, name);
	s->seed = xs(&w->rng);
	s->size = rnd(&w->rng, 4) ? rnd(&w->rng, SEALED_MAX_SIZE + 1) :
				    4096 * rnd(&w->rng, SEALED_MAX_SIZE / 4096 + 1);
	r = WR(butter_create(fs, w->m.dino[0], name, strlen(name), &attr, &ino));
	if (expect(r, 0, "create", path))
		return;
	s->ino = ino;
	w->m.nsealed++; /* in the directory from now on */
	fill(buf, s->size, s->seed);
	while (pos < s->size) {
		size_t len = 1 + rnd(&w->rng, s->size - pos);
		ssize_t wr = WR(butter_write(fs, ino, buf + pos, len, pos));

		if (wr != (ssize_t)len) {
			fail("write %s [%zu, +%zu): returned %s", path, pos, len, errname(wr));
			return;
		}
		pos += len;
	}
	if (rnd(&w->rng, 2) &&
	    expect(WR(butter_fsync(fs, ino, (int)rnd(&w->rng, 2))), 0, "fsync", path))
		return;
	atomic_store_explicit(&w->sealed_pub, w->m.nsealed, memory_order_release);
}

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	unsigned char *buf = malloc(SEALED_MAX_SIZE + MAX_WRITE);
	struct vbuf v;

	snprintf(tname, sizeof(tname), "writer %u", w->id);
	if (!buf || vbuf_init(&v)) {
		fail("out of memory");
		return NULL;
	}
	while (!stop_now()) {
		uint64_t c = rnd(&w->rng, 100);

		pthread_mutex_lock(&w->mu);
		if (c < 12)
			w_create(w);
		else if (c < 42)
			w_write(w, buf);
		else if (c < 50)
			w_truncate(w);
		else if (c < 60)
			w_rename(w);
		else if (c < 67)
			w_unlink(w);
		else if (c < 71)
			w_mkdir(w);
		else if (c < 75)
			w_rmdir(w);
		else if (c < 81)
			w_xattr(w);
		else if (c < 86)
			w_fsync(w);
		else if (c < 89)
			w_seal(w, buf);
		else if (c < 91) {
			butter_ino_t wdir = w->m.dino[0];

			verify_model(&w->m, w->id, wdir, vol_id, 0, &w->rng, &v, "vol/");
		}
		w->ops++;
		pthread_mutex_unlock(&w->mu);
	}
	free(buf);
	vbuf_free(&v);
	return NULL;
}

/* ---- readers ------------------------------------------------------------- */

static void *reader_main(void *arg)
{
	unsigned id = (unsigned)(uintptr_t)arg;
	uint64_t rng = seed_for(2, id);
	struct vbuf v;
	char path[64];

	snprintf(tname, sizeof(tname), "reader %u", id);
	if (vbuf_init(&v)) {
		fail("out of memory");
		return NULL;
	}
	while (!stop_now()) {
		uint64_t c = rnd(&rng, 100);
		struct writer *w = &writers[rnd(&rng, opt.writers)];

		if (c < 55) {
			pthread_mutex_lock(&w->mu);
			verify_model(&w->m, w->id, w->m.dino[0], vol_id, rnd(&rng, 8) == 0, &rng, &v,
				     "vol/");
			pthread_mutex_unlock(&w->mu);
		} else if (c < 90) {
			unsigned pub = atomic_load_explicit(&w->sealed_pub, memory_order_acquire), k;
			const struct sealed *s;
			butter_ino_t ino;

			if (!pub)
				continue;
			k = (unsigned)rnd(&rng, pub);
			s = &w->m.sealed[k];
			snprintf(path, sizeof(path), "vol/w%u/s%u", w->id, k);
			if (rnd(&rng, 2)) {
				int r = RD(butter_resolve(fs, path, &ino));

				if (expect(r, 0, "resolve", path))
					break;
				if (ino.subvol != s->ino.subvol || ino.ino != s->ino.ino) {
					fail("resolve %s: inode %" PRIu64 ":%" PRIu64
					     ", expected %" PRIu64 ":%" PRIu64,
					     path, ino.subvol, ino.ino, s->ino.subvol, s->ino.ino);
					break;
				}
			}
			verify_sealed(s, s->ino, path, &rng, &v, rnd(&rng, 4) == 0);
		} else {
			struct butter_statfs sf;
			struct butter_info info;
			struct butter_subvol_info si;

			expect(RD(butter_statfs(fs, &sf)), 0, "statfs", "/");
			expect(RD(butter_get_info(fs, &info)), 0, "get_info", "/");
			if (!expect(RD(butter_subvol_get(fs, vol_id, &si)), 0, "subvol_get", "vol") &&
			    (si.parent_id != 5 || strcmp(si.path, "vol")))
				fail("subvol_get vol: parent %" PRIu64 " path \"%s\"", si.parent_id,
				     si.path);
		}
	}
	vbuf_free(&v);
	return NULL;
}

/* ---- syncer --------------------------------------------------------------- */

static int count_subvol(void *arg, const struct butter_subvol_info *info)
{
	(void)info;
	(*(unsigned *)arg)++;
	return 0;
}

static void *syncer_main(void *arg)
{
	uint64_t rng = seed_for(3, 0);
	unsigned n;

	(void)arg;
	snprintf(tname, sizeof(tname), "syncer");
	while (!stop_now()) {
		uint64_t c = rnd(&rng, 100);

		sleep_ms((unsigned)rnd(&rng, 60));
		if (c < 50) {
			if (!expect(WR(butter_sync(fs)), 0, "sync", "/"))
				atomic_fetch_add_explicit(&nsyncs, 1, memory_order_relaxed);
		} else if (c < 75) {
			struct writer *w = &writers[rnd(&rng, opt.writers)];
			unsigned pub = atomic_load_explicit(&w->sealed_pub, memory_order_acquire);
			char path[64];
			unsigned k;

			if (!pub)
				continue;
			k = (unsigned)rnd(&rng, pub);
			snprintf(path, sizeof(path), "vol/w%u/s%u", w->id, k);
			if (!expect(WR(butter_fsync(fs, w->m.sealed[k].ino, (int)rnd(&rng, 2))), 0,
				    "fsync", path))
				atomic_fetch_add_explicit(&nfsyncs, 1, memory_order_relaxed);
		} else {
			struct butter_statfs sf;

			n = 0;
			expect(RD(butter_statfs(fs, &sf)), 0, "statfs", "/");
			expect(RD(butter_subvol_list(fs, count_subvol, &n)), 0, "subvol_list", "/");
		}
	}
	return NULL;
}

/* ---- snapshots ------------------------------------------------------------ */

struct snap {
	int live, rdonly;
	char name[16];
	uint64_t id;
	int extra;            /* a writable one got the file "extra" in its root */
	butter_ino_t extra_ino;
	size_t extra_len;     /* its bytes: fill(..., 77) */
	struct model m[MAX_THREADS];
};

/* Verify every writer's tree in snapshot @s. */
static int verify_snap(struct snap *s, uint64_t *rng, struct vbuf *v)
{
	butter_ino_t root, wdir;
	struct butter_subvol_info si;
	char where[48], name[16];
	unsigned i;
	int r;

	r = RD(butter_lookup(fs, snaps_dir, s->name, strlen(s->name), &root));
	if (expect(r, 0, "lookup snaps/", s->name))
		return -1;
	if (root.subvol != s->id || root.ino != BUTTER_SUBVOL_ROOT_INO) {
		fail("lookup snaps/%s: inode %" PRIu64 ":%" PRIu64 ", expected the root of %" PRIu64,
		     s->name, root.subvol, root.ino, s->id);
		return -1;
	}
	r = RD(butter_subvol_get(fs, s->id, &si));
	if (expect(r, 0, "subvol_get", s->name))
		return -1;
	if (si.parent_id != 5 || (si.flags & 1) != (uint64_t)s->rdonly) {
		fail("subvol_get snaps/%s: parent %" PRIu64 " flags 0x%" PRIx64 " (read-only %d "
		     "expected)",
		     s->name, si.parent_id, si.flags, s->rdonly);
		return -1;
	}
	snprintf(where, sizeof(where), "snaps/%s/", s->name);
	{
		struct listing l;
		struct ent want[MAX_ENTS];
		unsigned nw = 0;

		for (i = 0; i < opt.writers; i++) {
			snprintf(name, sizeof(name), "w%u", i);
			add_ent(want, &nw, name, s->m[i].dino[0].ino, DT_DIR);
		}
		if (s->extra)
			add_ent(want, &nw, "extra", s->extra_ino.ino, DT_REG);
		if (list_dir(root, 1 + (unsigned)rnd(rng, 4), &l, where) ||
		    compare_listing(&l, want, nw, where))
			return -1;
	}
	if (s->extra) {
		char path[64];

		snprintf(path, sizeof(path), "%sextra", where);
		fill(v->want, s->extra_len, 77);
		if (stat_verify(s->extra_ino, S_IFREG | 0644, s->extra_len, 1, path) ||
		    read_verify(s->extra_ino, v->want, s->extra_len, 0, s->extra_len, rng, v->buf,
				path))
			return -1;
	}
	for (i = 0; i < opt.writers; i++) {
		snprintf(name, sizeof(name), "w%u", i);
		r = RD(butter_lookup(fs, root, name, strlen(name), &wdir));
		if (expect(r, 0, "lookup", where))
			return -1;
		if (verify_model(&s->m[i], i, wdir, s->id, 1, rng, v, where))
			return -1;
	}
	return 0;
}

/* Change a writable snapshot (its model too): a write over a file, a new file. */
static int change_snap(struct snap *s, uint64_t *rng, unsigned char *buf)
{
	struct butter_new_inode attr = { .mode = S_IFREG | 0644 };
	unsigned i = (unsigned)rnd(rng, opt.writers), d, n;
	struct model *m = &s->m[i];
	butter_ino_t root = { s->id, BUTTER_SUBVOL_ROOT_INO }, ino;
	char path[96], name[16];
	uint64_t off, len;
	ssize_t r;

	for (d = 0; d < NSUB; d++)
		for (n = 0; n < NNAMES; n++) {
			struct mfile *f = &m->f[d][n];
			butter_ino_t fi = { s->id, f->ino.ino };

			if (!f->live || rnd(rng, 3))
				continue;
			snprintf(path, sizeof(path), "snaps/%s/", s->name);
			wpath(path + strlen(path), sizeof(path) - strlen(path), i, d, n);
			off = rnd(rng, opt.maxfile);
			len = 1 + rnd(rng, MAX_WRITE);
			fill(buf, len, xs(rng));
			r = WR(butter_write(fs, fi, buf, len, off));
			if (r != (ssize_t)len) {
				fail("write %s [%" PRIu64 ", +%" PRIu64 "): returned %s", path, off, len,
				     errname(r));
				return -1;
			}
			if (off + len > f->size)
				mfile_resize(f, off + len);
			memcpy(f->data + off, buf, len);
		}
	snprintf(name, sizeof(name), "extra");
	snprintf(path, sizeof(path), "snaps/%s/extra", s->name);
	r = WR(butter_create(fs, root, name, strlen(name), &attr, &ino));
	if (expect(r, 0, "create", path))
		return -1;
	len = rnd(rng, MAX_WRITE);
	fill(buf, len, 77);
	if (len && expect(WR(butter_write(fs, ino, buf, len, 0)), (long)len, "write", path))
		return -1;
	s->extra = 1;
	s->extra_ino = ino;
	s->extra_len = len;
	return 0;
}

static int delete_snap(struct snap *s)
{
	butter_ino_t ino;
	int r;

	r = WR(butter_subvol_delete(fs, snaps_dir, s->name, strlen(s->name)));
	if (expect(r, 0, "subvol_delete snaps/", s->name))
		return -1;
	r = RD(butter_lookup(fs, snaps_dir, s->name, strlen(s->name), &ino));
	if (expect(r, -ENOENT, "lookup (deleted) snaps/", s->name))
		return -1;
	for (unsigned i = 0; i < opt.writers; i++)
		model_free(&s->m[i]);
	s->live = 0;
	return 0;
}

static void *snapshot_main(void *arg)
{
	static struct snap snaps[2]; /* the one just made, the one before */
	uint64_t rng = seed_for(4, 0);
	unsigned char *buf = malloc(MAX_WRITE);
	unsigned serial = 0, cur = 0, i;
	struct vbuf v;
	int r;

	(void)arg;
	snprintf(tname, sizeof(tname), "snapshot");
	if (!buf || vbuf_init(&v)) {
		fail("out of memory");
		return NULL;
	}
	while (!stop_now()) {
		struct snap *s = &snaps[cur], *old = &snaps[cur ^ 1];

		sleep_ms(50 + (unsigned)rnd(&rng, 300));
		if (stop_now())
			break;
		snprintf(s->name, sizeof(s->name), "snap%u", serial++);
		s->rdonly = (int)rnd(&rng, 2);
		s->extra = 0;
		for (i = 0; i < opt.writers; i++)
			pthread_mutex_lock(&writers[i].mu);
		for (i = 0; i < opt.writers; i++)
			model_copy(&s->m[i], &writers[i].m);
		r = WR(butter_snapshot(fs, vol_id, snaps_dir, s->name, strlen(s->name),
				       s->rdonly ? BUTTER_SNAPSHOT_RDONLY : 0, &s->id));
		for (i = opt.writers; i-- > 0;)
			pthread_mutex_unlock(&writers[i].mu);
		if (expect(r, 0, "snapshot vol as snaps/", s->name)) {
			for (i = 0; i < opt.writers; i++)
				model_free(&s->m[i]);
			break;
		}
		s->live = 1;
		atomic_fetch_add_explicit(&nsnaps, 1, memory_order_relaxed);
		if (verify_snap(s, &rng, &v))
			break;
		if (!s->rdonly && (change_snap(s, &rng, buf) || verify_snap(s, &rng, &v)))
			break;
		if (old->live && (verify_snap(old, &rng, &v) || delete_snap(old)))
			break;
		cur ^= 1;
	}
	for (i = 0; i < 2; i++)
		if (snaps[i].live)
			delete_snap(&snaps[i]);
	free(buf);
	vbuf_free(&v);
	return NULL;
}

/* ---- setup and the final check -------------------------------------------- */

static int setup(void)
{
	struct butter_new_inode dattr = { .mode = S_IFDIR | 0755 };
	char name[16];
	unsigned i;

	if (expect(butter_root(fs, 5, &top_root), 0, "root", "/"))
		return -1;
	if (expect(butter_subvol_create(fs, top_root, "vol", 3, &vol_id), 0, "subvol_create",
		   "vol (is the image fresh?)"))
		return -1;
	vol_root.subvol = vol_id;
	vol_root.ino = BUTTER_SUBVOL_ROOT_INO;
	if (expect(butter_create(fs, top_root, "snaps", 5, &dattr, &snaps_dir), 0, "mkdir", "snaps"))
		return -1;
	for (i = 0; i < opt.writers; i++) {
		struct writer *w = &writers[i];

		pthread_mutex_init(&w->mu, NULL);
		w->id = i;
		w->rng = seed_for(1, i);
		w->m.dlive[0] = 1;
		snprintf(name, sizeof(name), "w%u", i);
		if (expect(butter_create(fs, vol_root, name, strlen(name), &dattr, &w->m.dino[0]), 0,
			   "mkdir vol/", name))
			return -1;
	}
	return expect(butter_sync(fs), 0, "sync", "/");
}

struct walk {
	uint64_t entries, bytes;
	unsigned char *buf;
};

/* Every entry below @dir stat'ed, every regular file read to its end. */
static int walk(struct walk *wk, butter_ino_t dir, const char *path, int depth)
{
	struct listing *l = malloc(sizeof(*l));
	struct butter_stat st;
	char sub[256];
	unsigned i;
	int ret = -1;

	if (!l)
		return -1;
	if (depth > 8) {
		fail("walk %s: deeper than the layout allows", path);
		goto out;
	}
	if (list_dir(dir, MAX_ENTS, l, path))
		goto out;
	for (i = 0; i < l->n; i++) {
		butter_ino_t ino;
		int r;

		if ((size_t)snprintf(sub, sizeof(sub), "%s/%s", path, l->e[i].name) >= sizeof(sub)) {
			fail("walk %s: a path longer than %zu bytes", path, sizeof(sub));
			goto out;
		}
		r = butter_lookup(fs, dir, l->e[i].name, strlen(l->e[i].name), &ino);
		if (expect(r, 0, "lookup", sub) || expect(butter_stat(fs, ino, &st), 0, "stat", sub))
			goto out;
		wk->entries++;
		if (S_ISDIR(st.mode) != (l->e[i].dtype == DT_DIR) ||
		    S_ISREG(st.mode) != (l->e[i].dtype == DT_REG)) {
			fail("walk %s: mode 0%o but directory entry type %u", sub, st.mode,
			     l->e[i].dtype);
			goto out;
		}
		if (S_ISDIR(st.mode)) {
			if (walk(wk, ino, sub, depth + 1))
				goto out;
		} else if (S_ISREG(st.mode)) {
			uint64_t pos = 0;
			ssize_t n;

			while ((n = butter_read(fs, ino, wk->buf, 1 << 20, pos)) > 0)
				pos += (uint64_t)n;
			if (n < 0 || pos != st.size) {
				fail("walk %s: read %" PRIu64 " of %" PRIu64 " bytes, then %s", sub, pos,
				     st.size, errname(n));
				goto out;
			}
			wk->bytes += pos;
		} else {
			fail("walk %s: unexpected mode 0%o", sub, st.mode);
			goto out;
		}
	}
	ret = 0;
out:
	free(l);
	return ret;
}

static int final_check(void)
{
	struct butter_open_opts oo = { .flags = BUTTER_OPEN_RDONLY };
	struct butter_check_result res;
	struct walk wk = { 0, 0, NULL };
	struct listing l;
	struct ent want[2];
	struct vbuf v;
	uint64_t rng = seed_for(5, 0);
	char name[16];
	unsigned i, nw = 0;
	int r, ret = -1;

	snprintf(tname, sizeof(tname), "final");
	r = butter_open(opt.image, &oo, &fs);
	if (expect(r, 0, "reopen read-only", opt.image))
		return -1;
	if (vbuf_init(&v) || !(wk.buf = malloc(1 << 20)))
		goto out;
	opt.app_lock = 0; /* one thread from here on */
	for (i = 0; i < opt.writers; i++) {
		butter_ino_t wdir;

		snprintf(name, sizeof(name), "w%u", i);
		if (expect(butter_lookup(fs, vol_root, name, strlen(name), &wdir), 0, "lookup vol/",
			   name))
			goto out;
		if (verify_model(&writers[i].m, i, wdir, vol_id, 1, &rng, &v, "vol/"))
			goto out;
	}
	add_ent(want, &nw, "snaps", snaps_dir.ino, DT_DIR);
	add_ent(want, &nw, "vol", BUTTER_SUBVOL_ROOT_INO, DT_DIR);
	if (list_dir(top_root, 1, &l, "/") || compare_listing(&l, want, nw, "/"))
		goto out;
	if (list_dir(snaps_dir, 1, &l, "/snaps") || compare_listing(&l, want, 0, "/snaps"))
		goto out;
	if (walk(&wk, top_root, "", 0))
		goto out;
	r = butter_check(fs, &res);
	if (expect(r, 0, "check", opt.image))
		goto out;
	if (res.errors) {
		fail("check: %" PRIu64 " errors (logged above)", res.errors);
		goto out;
	}
	printf("stress: final: %" PRIu64 " entries, %" PRIu64 " bytes walked; check: %" PRIu64
	       " trees, %" PRIu64 " tree blocks, %" PRIu64 " extent items, refs %s, 0 errors\n",
	       wk.entries, wk.bytes, res.trees, res.tree_blocks, res.extent_items,
	       res.refs_checked ? "checked" : "not checked (a tree being dropped)");
	ret = 0;
out:
	free(wk.buf);
	vbuf_free(&v);
	butter_close(fs);
	fs = NULL;
	return ret;
}

/* ---- main ------------------------------------------------------------------- */

static void usage(void)
{
	fprintf(stderr, "usage: butter-stress [--seconds N] [--seed S] [--threads N] [--writers N] "
			"[--readers N] [--max-file BYTES] [--mkfs] [--size BYTES] [--app-lock] "
			"[--no-snapshots] IMAGE\n");
	exit(2);
}

static uint64_t num(const char *s)
{
	char *end;
	uint64_t v = strtoull(s, &end, 0);

	if (*end == 'k' || *end == 'K')
		v <<= 10, end++;
	else if (*end == 'm' || *end == 'M')
		v <<= 20, end++;
	else if (*end == 'g' || *end == 'G')
		v <<= 30, end++;
	if (*end || end == s)
		usage();
	return v;
}

int main(int argc, char **argv)
{
	pthread_t th[2 * MAX_THREADS + 2];
	pthread_rwlockattr_t rwattr;
	struct timespec t0, t1;
	unsigned nth = 0, i;
	double secs;
	int a;

	snprintf(tname, sizeof(tname), "main");
	for (a = 1; a < argc; a++) {
		const char *s = argv[a];
		const char *val = a + 1 < argc ? argv[a + 1] : NULL;

		if (!strcmp(s, "--app-lock"))
			opt.app_lock = 1;
		else if (!strcmp(s, "--mkfs"))
			opt.mkfs = 1;
		else if (!strcmp(s, "--no-snapshots"))
			opt.snapshots = 0;
		else if (s[0] == '-' && s[1] == '-' && !val)
			usage();
		else if (!strcmp(s, "--seconds"))
			opt.seconds = (unsigned)num(argv[++a]);
		else if (!strcmp(s, "--seed"))
			opt.seed = num(argv[++a]);
		else if (!strcmp(s, "--threads"))
			opt.writers = opt.readers = (unsigned)num(argv[++a]);
		else if (!strcmp(s, "--writers"))
			opt.writers = (unsigned)num(argv[++a]);
		else if (!strcmp(s, "--readers"))
			opt.readers = (unsigned)num(argv[++a]);
		else if (!strcmp(s, "--max-file"))
			opt.maxfile = num(argv[++a]);
		else if (!strcmp(s, "--size"))
			opt.size = num(argv[++a]);
		else if (s[0] == '-' || opt.image)
			usage();
		else
			opt.image = s;
	}
	if (!opt.image || !opt.writers || opt.writers > MAX_THREADS || opt.readers > MAX_THREADS ||
	    opt.maxfile < 4096 || opt.maxfile > (64u << 20))
		usage();

	if (opt.mkfs) {
		const char *devs[1] = { opt.image };
		struct butter_mkfs_opts mo = { .devices = devs, .ndevices = 1, .csum_type = -1,
					       .size = opt.size, .force = 1 };
		int r = butter_mkfs(&mo);

		if (r) {
			fprintf(stderr, "stress: mkfs %s: %s\n", opt.image, strerror(-r));
			return 2;
		}
	}
	a = butter_open(opt.image, NULL, &fs);
	if (a) {
		fprintf(stderr, "stress: open %s: %s\n", opt.image, strerror(-a));
		return 2;
	}
	if (setup()) {
		butter_close(fs);
		return 2;
	}
	pthread_rwlockattr_init(&rwattr);
	pthread_rwlockattr_setkind_np(&rwattr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&app_rw, &rwattr);
	pthread_rwlockattr_destroy(&rwattr);

	printf("stress: %s, %u s, seed %" PRIu64 ", %u writers, %u readers, syncer%s%s\n",
	       opt.image, opt.seconds, opt.seed, opt.writers, opt.readers,
	       opt.snapshots ? ", snapshots" : "", opt.app_lock ? ", --app-lock" : "");
	fflush(stdout);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < opt.writers; i++)
		pthread_create(&th[nth++], NULL, writer_main, &writers[i]);
	for (i = 0; i < opt.readers; i++)
		pthread_create(&th[nth++], NULL, reader_main, (void *)(uintptr_t)i);
	pthread_create(&th[nth++], NULL, syncer_main, NULL);
	if (opt.snapshots)
		pthread_create(&th[nth++], NULL, snapshot_main, NULL);
	for (i = 0; i < opt.seconds * 10 && !stop_now(); i++)
		sleep_ms(100);
	atomic_store(&stopping, 1);
	for (i = 0; i < nth; i++)
		pthread_join(th[i], NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	{
		unsigned long wops = 0;

		for (i = 0; i < opt.writers; i++)
			wops += writers[i].ops;
		printf("stress: %.1f s: %lu calls (%.0f/s), %lu writer ops, %lu commits, %lu fsyncs, "
		       "%lu snapshots, %lu bytes verified\n",
		       secs, atomic_load(&ncalls), (double)atomic_load(&ncalls) / secs, wops,
		       atomic_load(&nsyncs), atomic_load(&nfsyncs), atomic_load(&nsnaps),
		       atomic_load(&nverified_bytes));
	}
	butter_close(fs);
	fs = NULL;
	if (!atomic_load(&nerrors))
		final_check();
	for (i = 0; i < opt.writers; i++) {
		model_free(&writers[i].m);
		pthread_mutex_destroy(&writers[i].mu);
	}
	pthread_rwlock_destroy(&app_rw);
	printf("stress: %lu calls, %d errors\n", atomic_load(&ncalls), atomic_load(&nerrors));
	return atomic_load(&nerrors) ? 1 : 0;
}
