/*
 * fsx.c — a file exerciser in the spirit of the classic fsx: one file, a
 * seeded random sequence of operations on it, and every byte checked against
 * an in-memory model of what the file must hold.
 *
 * usage: butter-fsx [options] FILE
 *   -N OPS        operations to run (default 10000)
 *   -S SEED       random seed (default 1)
 *   -l BYTES      largest file size (default 256 KiB)
 *   -o BYTES      largest length of one operation (default 64 KiB)
 *   -c OPS        check the whole file every OPS operations (default 500; 0: only at the end)
 *   -r LOG        replay the operations of LOG (as written by -L or on failure) instead
 *   -L LOG        write every operation to LOG as it runs
 *   -g FILE       at the end, write the model (the expected contents) to FILE
 *   -M            no mmap reads or writes          -F  no fallocate
 *   -C            no copy_file_range               -T  no truncate
 *   -q            quiet: no summary
 *   -X OP         test the tester: after operation OP, change one byte of the model
 *                 (as if the file had lost a write): the run must then fail
 *
 * Operations (weights in pick_op): read, write, mapread, mapwrite (mmap,
 * memcpy, msync), truncate (up or down), fallocate in five modes (plain,
 * keep-size, punch-hole, zero-range, zero-range keep-size), copy_file_range
 * between non-overlapping ranges of the file, fsync, and close+reopen. A
 * third of offsets and lengths are 4 KiB aligned. Written bytes are a
 * function of (operation number, file offset), so a write landing at the
 * wrong place, or an old write coming back, shows.
 *
 * Checks: every read and mapread against the model; the size (fstat) after
 * every operation; the whole file every -c operations and at the end.
 * A fallocate mode the filesystem refuses with EOPNOTSUPP is counted and
 * skipped (the model is left alone); any other unexpected result stops the
 * run.
 *
 * On failure: the first bad offset with expected and found bytes, the last
 * operations, the seed, and a log of every operation so far written to
 * NAME.fsxlog in the current directory (NAME: FILE's last component);
 * `butter-fsx -r NAME.fsxlog -l MAXLEN FILE2` replays exactly that sequence
 * (the log holds the operation numbers the data derives from).
 *
 * Exit status: 0 all good, 1 a mismatch or an unexpected error, 2 usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif
#ifndef FALLOC_FL_ZERO_RANGE
#define FALLOC_FL_ZERO_RANGE 0x10
#endif

#define ALIGN 4096u
#define RING 32        /* operations shown on failure */

enum op {
	OP_READ, OP_WRITE, OP_MAPREAD, OP_MAPWRITE, OP_TRUNCATE,
	OP_FALLOC, OP_FALLOC_KEEP, OP_PUNCH, OP_ZERO, OP_ZERO_KEEP,
	OP_COPY, OP_FSYNC, OP_REOPEN, NOPS
};

static const char *const op_names[NOPS] = {
	"read", "write", "mapread", "mapwrite", "truncate",
	"falloc", "falloc_keep", "punch_hole", "zero_range", "zero_range_keep",
	"copy_range", "fsync", "reopen",
};

static const unsigned op_weight[NOPS] = {
	[OP_READ] = 20, [OP_WRITE] = 24, [OP_MAPREAD] = 8, [OP_MAPWRITE] = 8,
	[OP_TRUNCATE] = 6, [OP_FALLOC] = 3, [OP_FALLOC_KEEP] = 3, [OP_PUNCH] = 4,
	[OP_ZERO] = 3, [OP_ZERO_KEEP] = 2, [OP_COPY] = 8, [OP_FSYNC] = 2, [OP_REOPEN] = 2,
};

struct opdesc {
	uint64_t num;       /* 1-based operation number */
	enum op op;
	uint64_t off, len;  /* copy: source offset and length */
	uint64_t dst;       /* copy: destination offset */
	uint64_t size_before;
};

struct fsx {
	const char *path;
	int fd;
	uint8_t *model;        /* expected contents; capacity maxlen + maxop (copy overshoot) */
	uint8_t *buf;
	uint64_t size;
	uint64_t maxlen, maxop, check_every, nops;
	uint64_t rng, seed;
	uint64_t current;      /* number of the operation running (or last run) */
	uint64_t inject;       /* -X: corrupt the model after this operation (0: never) */
	bool no_mmap, no_falloc, no_copy, no_trunc, quiet;
	FILE *replay;          /* -r */
	FILE *log;             /* -L, else the failure log */
	char *logpath;
	struct opdesc ring[RING];
	uint64_t done;         /* operations completed */
	uint64_t count[NOPS], skipped[NOPS];
	struct opdesc *hist;   /* every operation, for the failure log */
	size_t nhist, caphist;
	long pagesize;
};

/* ---- randomness and data ------------------------------------------------------ */

static uint64_t next_rand(struct fsx *f)
{
	uint64_t x = f->rng;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	f->rng = x;
	return x * 0x2545f4914f6cdd1dull;
}

static uint64_t below(struct fsx *f, uint64_t n)
{
	return n ? next_rand(f) % n : 0;
}

/* The byte operation @num writes at file offset @off. */
static uint8_t data_byte(uint64_t num, uint64_t off)
{
	uint64_t x = (num * 0x9e3779b97f4a7c15ull) ^ (off * 0xbf58476d1ce4e5b9ull);

	x ^= x >> 31;
	x *= 0x94d049bb133111ebull;
	return (uint8_t)(x >> 56);
}

/* ---- failure reporting ---------------------------------------------------------- */

static void format_op(const struct opdesc *d, char *out, size_t cap)
{
	if (d->op == OP_COPY)
		snprintf(out, cap, "%" PRIu64 " %s 0x%" PRIx64 " 0x%" PRIx64 " 0x%" PRIx64, d->num,
			 op_names[d->op], d->off, d->len, d->dst);
	else
		snprintf(out, cap, "%" PRIu64 " %s 0x%" PRIx64 " 0x%" PRIx64, d->num,
			 op_names[d->op], d->off, d->len);
}

static void record(struct fsx *f, const struct opdesc *d)
{
	char line[160];

	f->ring[d->num % RING] = *d;
	if (f->nhist == f->caphist) {
		size_t cap = f->caphist ? f->caphist * 2 : 4096;
		struct opdesc *h = realloc(f->hist, cap * sizeof(*h));

		if (h) {
			f->hist = h;
			f->caphist = cap;
		}
	}
	if (f->nhist < f->caphist)
		f->hist[f->nhist++] = *d;
	if (f->log && f->log != stderr) {
		format_op(d, line, sizeof(line));
		fprintf(f->log, "%s\n", line);
	}
}

static void __attribute__((noreturn, format(printf, 2, 3)))
fail(struct fsx *f, const char *fmt, ...)
{
	char line[160];
	uint64_t first = f->current >= RING ? f->current - RING + 1 : 1;
	va_list ap;
	FILE *out;

	fprintf(stderr, "fsx: FAILED at operation %" PRIu64 " (seed %" PRIu64 ", %s): ", f->current,
		f->seed, f->replay ? "replaying a log" : "random");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nfsx: the last operations (number op offset length [dest]), size "
			"before each:\n");
	for (uint64_t n = first; n <= f->current; n++) {
		const struct opdesc *d = &f->ring[n % RING];

		if (d->num != n)
			continue;
		format_op(d, line, sizeof(line));
		fprintf(stderr, "  %-60s size 0x%" PRIx64 "\n", line, d->size_before);
	}
	out = fopen(f->logpath, "w");
	if (out) {
		for (size_t i = 0; i < f->nhist; i++) {
			format_op(&f->hist[i], line, sizeof(line));
			fprintf(out, "%s\n", line);
		}
		fclose(out);
		fprintf(stderr,
			"fsx: every operation is in %s; replay: butter-fsx -r %s -l %" PRIu64
			" -o %" PRIu64 " FILE\n",
			f->logpath, f->logpath, f->maxlen, f->maxop);
	}
	exit(1);
}

/* Compare @len bytes at file offset @off read into @got with the model. */
static void compare(struct fsx *f, const uint8_t *got, uint64_t off, uint64_t len, const char *how)
{
	const uint8_t *want = f->model + off;

	if (memcmp(got, want, len) == 0)
		return;
	for (uint64_t i = 0; i < len; i++) {
		if (got[i] != want[i]) {
			uint64_t n = 0;
			char exp[3 * 16 + 1] = "", fnd[3 * 16 + 1] = "";

			for (uint64_t j = i; j < len && n < 16; j++, n++) {
				sprintf(exp + 3 * n, " %02x", want[j]);
				sprintf(fnd + 3 * n, " %02x", got[j]);
			}
			fail(f, "%s: bad data at offset 0x%" PRIx64 " (file size 0x%" PRIx64 ")\n"
				"  expected%s\n  found   %s", how, off + i, f->size, exp, fnd);
		}
	}
}

/* ---- operations ------------------------------------------------------------------- */

static void check_size(struct fsx *f, const char *after)
{
	struct stat st;

	if (fstat(f->fd, &st) < 0)
		fail(f, "fstat after %s: %s", after, strerror(errno));
	if ((uint64_t)st.st_size != f->size)
		fail(f, "after %s the file size is 0x%" PRIx64 ", the model says 0x%" PRIx64, after,
		     (uint64_t)st.st_size, f->size);
}

static void full_check(struct fsx *f, const char *when)
{
	uint64_t done = 0;

	check_size(f, when);
	while (done < f->size) {
		uint64_t n = f->size - done < f->maxop ? f->size - done : f->maxop;
		ssize_t r = pread(f->fd, f->buf, n, (off_t)done);

		if (r < 0)
			fail(f, "%s: pread 0x%" PRIx64 "+0x%" PRIx64 ": %s", when, done, n,
			     strerror(errno));
		if (r == 0)
			fail(f, "%s: end of file at 0x%" PRIx64 ", size 0x%" PRIx64, when, done,
			     f->size);
		compare(f, f->buf, done, (uint64_t)r, when);
		done += (uint64_t)r;
	}
	/* nothing past the end */
	if (pread(f->fd, f->buf, 1, (off_t)f->size) != 0)
		fail(f, "%s: data past the end of file (0x%" PRIx64 ")", when, f->size);
}

static void set_size(struct fsx *f, uint64_t size)
{
	if (size > f->size)
		memset(f->model + f->size, 0, size - f->size);
	f->size = size;
}

/* The part of @d's range [off, off + len) before the model's end of file: its length. */
static uint64_t len_to_eof(const struct fsx *f, const struct opdesc *d)
{
	if (d->off >= f->size)
		return 0;
	return d->off + d->len > f->size ? f->size - d->off : d->len;
}

static void do_read(struct fsx *f, const struct opdesc *d)
{
	uint64_t done = 0, len = len_to_eof(f, d);

	while (done < len) {
		ssize_t r = pread(f->fd, f->buf + done, len - done, (off_t)(d->off + done));

		if (r < 0)
			fail(f, "read: %s", strerror(errno));
		if (r == 0)
			fail(f, "read: short read at 0x%" PRIx64 " (size 0x%" PRIx64 ")",
			     d->off + done, f->size);
		done += (uint64_t)r;
	}
	compare(f, f->buf, d->off, len, "read");
}

static void do_write(struct fsx *f, const struct opdesc *d)
{
	uint64_t done = 0;

	for (uint64_t i = 0; i < d->len; i++)
		f->buf[i] = data_byte(d->num, d->off + i);
	while (done < d->len) {
		ssize_t r = pwrite(f->fd, f->buf + done, d->len - done, (off_t)(d->off + done));

		if (r <= 0)
			fail(f, "write: %s", r < 0 ? strerror(errno) : "wrote nothing");
		done += (uint64_t)r;
	}
	/* a write of nothing changes nothing, not even past the end (POSIX pwrite) */
	if (d->len && d->off + d->len > f->size)
		set_size(f, d->off + d->len);
	memcpy(f->model + d->off, f->buf, d->len);
}

static void do_mapread(struct fsx *f, const struct opdesc *d)
{
	uint64_t len = len_to_eof(f, d), start, span;
	uint8_t *p;

	if (len == 0)
		return;
	start = d->off / (uint64_t)f->pagesize * (uint64_t)f->pagesize;
	span = d->off + len - start;
	p = mmap(NULL, span, PROT_READ, MAP_SHARED, f->fd, (off_t)start);
	if (p == MAP_FAILED)
		fail(f, "mapread: mmap: %s", strerror(errno));
	memcpy(f->buf, p + (d->off - start), len);
	munmap(p, span);
	compare(f, f->buf, d->off, len, "mapread");
}

static void do_mapwrite(struct fsx *f, const struct opdesc *d)
{
	uint64_t start, span;
	uint8_t *p;

	if (d->len == 0)
		return;
	if (d->off + d->len > f->size) {
		/* a mapping cannot grow the file: extend it first, as fsx does */
		if (ftruncate(f->fd, (off_t)(d->off + d->len)) < 0)
			fail(f, "mapwrite: ftruncate: %s", strerror(errno));
		set_size(f, d->off + d->len);
	}
	start = d->off / (uint64_t)f->pagesize * (uint64_t)f->pagesize;
	span = d->off + d->len - start;
	p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd, (off_t)start);
	if (p == MAP_FAILED)
		fail(f, "mapwrite: mmap: %s", strerror(errno));
	for (uint64_t i = 0; i < d->len; i++)
		p[d->off - start + i] = f->model[d->off + i] = data_byte(d->num, d->off + i);
	if (msync(p, span, MS_SYNC) < 0)
		fail(f, "mapwrite: msync: %s", strerror(errno));
	munmap(p, span);
}

static void do_truncate(struct fsx *f, const struct opdesc *d)
{
	if (ftruncate(f->fd, (off_t)d->off) < 0)
		fail(f, "truncate to 0x%" PRIx64 ": %s", d->off, strerror(errno));
	if (d->off < f->size)
		f->size = d->off;
	else
		set_size(f, d->off);
}

/* Returns false if the filesystem does not support the mode (counted, skipped). */
static bool do_falloc(struct fsx *f, const struct opdesc *d)
{
	static const int modes[NOPS] = {
		[OP_FALLOC] = 0,
		[OP_FALLOC_KEEP] = FALLOC_FL_KEEP_SIZE,
		[OP_PUNCH] = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		[OP_ZERO] = FALLOC_FL_ZERO_RANGE,
		[OP_ZERO_KEEP] = FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
	};
	int mode = modes[d->op];
	uint64_t end = d->off + d->len, zero_end;

	if (d->len == 0)
		return true;
	if (fallocate(f->fd, mode, (off_t)d->off, (off_t)d->len) < 0) {
		if (errno == EOPNOTSUPP)
			return false;
		fail(f, "%s 0x%" PRIx64 "+0x%" PRIx64 ": %s", op_names[d->op], d->off, d->len,
		     strerror(errno));
	}
	switch (d->op) {
	case OP_FALLOC:            /* contents unchanged; the size grows to the end */
		if (end > f->size)
			set_size(f, end);
		break;
	case OP_FALLOC_KEEP:       /* nothing visible changes */
		break;
	case OP_PUNCH:
	case OP_ZERO_KEEP:         /* zeros inside the file; the size stays */
		zero_end = end < f->size ? end : f->size;
		if (d->off < zero_end)
			memset(f->model + d->off, 0, zero_end - d->off);
		break;
	case OP_ZERO:              /* zeros; the size grows to the end */
		if (end > f->size)
			set_size(f, end);
		memset(f->model + d->off, 0, d->len);
		break;
	default:
		break;
	}
	return true;
}

static bool do_copy(struct fsx *f, const struct opdesc *d)
{
	/* copy_file_range copies up to the source's end of file */
	uint64_t done = 0, len = len_to_eof(f, d);

	while (done < len) {
		loff_t in = (loff_t)(d->off + done), out = (loff_t)(d->dst + done);
		ssize_t r = copy_file_range(f->fd, &in, f->fd, &out, len - done, 0);

		bool unsupported = errno == EOPNOTSUPP || errno == ENOSYS || errno == EXDEV;

		if (r < 0 && unsupported && done == 0)
			return false;
		if (r < 0)
			fail(f, "copy_range: %s", strerror(errno));
		if (r == 0)
			fail(f, "copy_range: copied nothing at 0x%" PRIx64 " of 0x%" PRIx64, done,
			     len);
		done += (uint64_t)r;
	}
	/* a destination past the end grows the file; the gap reads as zeros */
	if (len && d->dst + len > f->size)
		set_size(f, d->dst + len);
	memmove(f->model + d->dst, f->model + d->off, len);
	return true;
}

static void reopen(struct fsx *f)
{
	if (close(f->fd) < 0)
		fail(f, "close: %s", strerror(errno));
	f->fd = open(f->path, O_RDWR);
	if (f->fd < 0)
		fail(f, "reopen %s: %s", f->path, strerror(errno));
}

/* ---- choosing and running ------------------------------------------------------------ */

static bool op_enabled(const struct fsx *f, enum op op)
{
	switch (op) {
	case OP_MAPREAD:
	case OP_MAPWRITE:
		return !f->no_mmap;
	case OP_TRUNCATE:
		return !f->no_trunc;
	case OP_FALLOC: case OP_FALLOC_KEEP: case OP_PUNCH: case OP_ZERO: case OP_ZERO_KEEP:
		return !f->no_falloc;
	case OP_COPY:
		return !f->no_copy;
	default:
		return true;
	}
}

static enum op pick_op(struct fsx *f)
{
	unsigned total = 0, r;

	for (int i = 0; i < NOPS; i++)
		if (op_enabled(f, (enum op)i))
			total += op_weight[i];
	r = (unsigned)below(f, total);
	for (int i = 0; i < NOPS; i++) {
		if (!op_enabled(f, (enum op)i))
			continue;
		if (r < op_weight[i])
			return (enum op)i;
		r -= op_weight[i];
	}
	return OP_READ;
}

/* A random offset below @limit and a length up to maxop, aligned a third of the time. */
static void pick_range(struct fsx *f, uint64_t limit, uint64_t *off, uint64_t *len)
{
	bool aligned = below(f, 3) == 0;

	*off = below(f, limit ? limit : 1);
	*len = below(f, f->maxop + 1);
	if (aligned) {
		*off = *off / ALIGN * ALIGN;
		*len = (*len + ALIGN - 1) / ALIGN * ALIGN;
		if (*len == 0)
			*len = ALIGN;
	}
	if (*off + *len > f->maxlen)
		*len = f->maxlen - *off;
}

static void make_op(struct fsx *f, struct opdesc *d)
{
	d->op = pick_op(f);
	d->dst = 0;
	switch (d->op) {
	case OP_READ:
	case OP_MAPREAD:
		/* mostly inside the file */
		pick_range(f, f->size ? f->size : 1, &d->off, &d->len);
		break;
	case OP_TRUNCATE:
		d->off = below(f, f->maxlen + 1);
		if (below(f, 3) == 0)
			d->off = d->off / ALIGN * ALIGN;
		d->len = 0;
		break;
	case OP_COPY: {
		uint64_t src, len, dst;

		pick_range(f, f->size ? f->size : 1, &src, &len);
		if (src + len > f->size)
			len = f->size > src ? f->size - src : 0;
		/* a destination not overlapping the source, within maxlen */
		dst = below(f, f->maxlen);
		if (below(f, 3) == 0)
			dst = dst / ALIGN * ALIGN;
		if (dst + len > f->maxlen)
			len = f->maxlen - dst;
		if (dst < src + len && src < dst + len)
			len = dst > src ? dst - src : 0;
		d->off = src;
		d->len = len;
		d->dst = dst;
		break;
	}
	case OP_FSYNC:
	case OP_REOPEN:
		d->off = d->len = 0;
		break;
	default:
		pick_range(f, f->maxlen, &d->off, &d->len);
		break;
	}
}

/* Read the next operation of the replay log into @d; false at its end. */
static bool read_logged(struct fsx *f, struct opdesc *d)
{
	char line[256], name[64];

	while (fgets(line, sizeof(line), f->replay)) {
		uint64_t num, a, b, c = 0;
		int n = sscanf(line, "%" SCNu64 " %63s %" SCNx64 " %" SCNx64 " %" SCNx64, &num,
			       name, &a, &b, &c);

		if (n < 4)
			continue;
		for (int i = 0; i < NOPS; i++) {
			if (strcmp(name, op_names[i]) == 0) {
				d->num = num;
				d->op = (enum op)i;
				d->off = a;
				d->len = b;
				d->dst = c;
				if (d->off > f->maxlen || d->len > f->maxlen ||
				    d->off + d->len > f->maxlen || d->dst + d->len > f->maxlen) {
					fprintf(stderr, "fsx: logged op %" PRIu64
						" exceeds -l %" PRIu64 "\n", num, f->maxlen);
					exit(2);
				}
				return true;
			}
		}
		fprintf(stderr, "fsx: unknown operation in the log: %s", line);
		exit(2);
	}
	return false;
}

static void run_op(struct fsx *f, struct opdesc *d)
{
	bool ran = true;

	d->size_before = f->size;
	f->current = d->num;
	record(f, d);
	switch (d->op) {
	case OP_READ: do_read(f, d); break;
	case OP_WRITE: do_write(f, d); break;
	case OP_MAPREAD: do_mapread(f, d); break;
	case OP_MAPWRITE: do_mapwrite(f, d); break;
	case OP_TRUNCATE: do_truncate(f, d); break;
	case OP_FALLOC: case OP_FALLOC_KEEP: case OP_PUNCH: case OP_ZERO: case OP_ZERO_KEEP:
		ran = do_falloc(f, d);
		break;
	case OP_COPY: ran = do_copy(f, d); break;
	case OP_FSYNC:
		if (fsync(f->fd) < 0)
			fail(f, "fsync: %s", strerror(errno));
		break;
	case OP_REOPEN: reopen(f); break;
	default: break;
	}
	if (f->inject && d->num == f->inject) {
		/* a place that depends on the operation only, so a replay hits it too */
		uint64_t at = f->size ? (d->num * 0x9e3779b97f4a7c15ull >> 20) % f->size : 0;

		if (!f->size)
			set_size(f, 1); /* an empty file: the model now expects one byte */
		f->model[at] ^= 0x5a;
	}
	if (ran)
		f->count[d->op]++;
	else
		f->skipped[d->op]++;
	check_size(f, op_names[d->op]);
	f->done++;
}

static uint64_t parse_size(const char *s, const char *what)
{
	char *end;
	uint64_t v = strtoull(s, &end, 0);

	if (*end == 'k' || *end == 'K')
		v <<= 10, end++;
	else if (*end == 'm' || *end == 'M')
		v <<= 20, end++;
	if (*s == '\0' || *end != '\0') {
		fprintf(stderr, "fsx: bad %s '%s'\n", what, s);
		exit(2);
	}
	return v;
}

static void usage(void)
{
	fprintf(stderr, "usage: butter-fsx [-N OPS] [-S SEED] [-l MAXLEN] [-o MAXOP] [-c EVERY] "
			"[-r LOG] [-L LOG] [-g GOODFILE] [-X OP] [-MFCTq] FILE\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct fsx f;
	const char *good = NULL, *replay = NULL, *log = NULL;
	uint64_t seed = 1;
	int c;

	memset(&f, 0, sizeof(f));
	f.nops = 10000;
	f.maxlen = 256 << 10;
	f.maxop = 64 << 10;
	f.check_every = 500;
	while ((c = getopt(argc, argv, "N:S:l:o:c:r:L:g:X:MFCTq")) != -1) {
		switch (c) {
		case 'N': f.nops = parse_size(optarg, "-N"); break;
		case 'S': seed = parse_size(optarg, "-S"); break;
		case 'l': f.maxlen = parse_size(optarg, "-l"); break;
		case 'o': f.maxop = parse_size(optarg, "-o"); break;
		case 'c': f.check_every = parse_size(optarg, "-c"); break;
		case 'r': replay = optarg; break;
		case 'L': log = optarg; break;
		case 'g': good = optarg; break;
		case 'M': f.no_mmap = true; break;
		case 'F': f.no_falloc = true; break;
		case 'C': f.no_copy = true; break;
		case 'T': f.no_trunc = true; break;
		case 'q': f.quiet = true; break;
		case 'X': f.inject = parse_size(optarg, "-X"); break;
		default: usage();
		}
	}
	if (optind != argc - 1 || f.maxlen == 0 || f.maxop == 0 || f.maxlen > (1ULL << 34))
		usage();
	if (f.maxop > f.maxlen)
		f.maxop = f.maxlen;
	f.path = argv[optind];
	f.pagesize = sysconf(_SC_PAGESIZE);
	f.seed = seed;
	f.rng = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
	if (f.rng == 0)
		f.rng = 1;
	f.model = calloc(1, f.maxlen + f.maxop);
	f.buf = malloc(f.maxlen + f.maxop);
	{
		/* the failure log goes to the current directory, off the filesystem under test */
		const char *base = strrchr(f.path, '/') ? strrchr(f.path, '/') + 1 : f.path;

		f.logpath = malloc(strlen(base) + 16);
		if (f.logpath)
			sprintf(f.logpath, "%s.fsxlog", base);
	}
	if (!f.model || !f.buf || !f.logpath) {
		fprintf(stderr, "fsx: out of memory\n");
		return 1;
	}
	if (replay) {
		f.replay = fopen(replay, "r");
		if (!f.replay) {
			fprintf(stderr, "fsx: %s: %s\n", replay, strerror(errno));
			return 2;
		}
	}
	if (log) {
		f.log = fopen(log, "w");
		if (!f.log) {
			fprintf(stderr, "fsx: %s: %s\n", log, strerror(errno));
			return 2;
		}
		setvbuf(f.log, NULL, _IOLBF, 0);
	}
	f.fd = open(f.path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (f.fd < 0) {
		fprintf(stderr, "fsx: %s: %s\n", f.path, strerror(errno));
		return 1;
	}
	if (!f.quiet)
		printf("fsx: %s seed %" PRIu64 ", %" PRIu64 " operations, file up to %" PRIu64
		       " bytes, operations up to %" PRIu64 "\n",
		       f.path, seed, replay ? 0 : f.nops, f.maxlen, f.maxop);
	for (;;) {
		struct opdesc d;

		if (f.replay) {
			if (!read_logged(&f, &d))
				break;
		} else {
			if (f.done >= f.nops)
				break;
			d.num = f.done + 1;
			make_op(&f, &d);
		}
		run_op(&f, &d);
		if (f.check_every && f.done % f.check_every == 0)
			full_check(&f, "periodic check");
	}
	full_check(&f, "final check");
	if (fsync(f.fd) < 0 || close(f.fd) < 0) {
		fprintf(stderr, "fsx: closing %s: %s\n", f.path, strerror(errno));
		return 1;
	}
	if (good) {
		FILE *g = fopen(good, "wb");

		if (!g || fwrite(f.model, 1, f.size, g) != f.size || fclose(g) != 0) {
			fprintf(stderr, "fsx: writing %s failed\n", good);
			return 1;
		}
	}
	if (!f.quiet) {
		printf("fsx: %" PRIu64 " operations passed, final size %" PRIu64 "\n", f.done,
		       f.size);
		for (int i = 0; i < NOPS; i++)
			printf("  %-16s %10" PRIu64 " done %10" PRIu64
			       " unsupported (EOPNOTSUPP)\n",
			       op_names[i], f.count[i], f.skipped[i]);
	}
	if (f.log)
		fclose(f.log);
	if (f.replay)
		fclose(f.replay);
	free(f.model);
	free(f.buf);
	free(f.logpath);
	free(f.hist);
	return 0;
}
