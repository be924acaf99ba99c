/*
 * test_delalloc.c — delayed allocation (lib/data/delalloc.c) against a model:
 * random writes (next to, over, before and away from what is buffered, and
 * out of order as the FUSE threads deliver them), reads, stat, truncates,
 * punched holes, reflinks, SEEK_DATA, fsyncs, commits and unlinks on a few
 * files of a handle with a small write buffer (so memory pressure writes
 * back too); after every step the files read as the model says, and at the
 * end the image, closed and opened again, holds the model and passes
 * butter_check(). Then the extent promise: eight files written at once in
 * 1 MiB requests each come out in one extent.
 * On 512 MiB images made by butter_mkfs() in $TMPDIR; BUTTER_TEST_SEED picks
 * another sequence of random steps.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "butter/butter.h"
#include "check.h"

#define NFILES 3
#define MAX_SIZE (6u << 20)

static char dir[4096], img[4200];
static struct butter_fs *fs;
static butter_ino_t root;

struct model {
	char name[16];
	butter_ino_t ino;
	int exists;
	uint64_t size;
	unsigned char *data; /* MAX_SIZE bytes; past size: zero */
};

static struct model files[NFILES];
static unsigned long long rng = 88172645463325252ULL;

static unsigned long long next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static unsigned rnd(unsigned n)
{
	return (unsigned)(next_rand() % n);
}

static int make_image(const char *name)
{
	const char *tmp = getenv("TMPDIR");
	const char *devs[1] = { img };
	struct butter_mkfs_opts mo;

	snprintf(dir, sizeof(dir), "%s/butter-test-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
	if (!mkdtemp(dir))
		return -errno;
	snprintf(img, sizeof(img), "%s/fs.img", dir);
	memset(&mo, 0, sizeof(mo));
	mo.devices = devs;
	mo.ndevices = 1;
	mo.size = 512ULL << 20;
	mo.csum_type = -1;
	return butter_mkfs(&mo);
}

static void drop_image(void)
{
	unlink(img);
	rmdir(dir);
}

static void create_file(struct model *m)
{
	struct butter_new_inode a = { .mode = S_IFREG | 0644 };

	CHECK(butter_create(fs, root, m->name, strlen(m->name), &a, &m->ino) == 0);
	m->exists = 1;
	m->size = 0;
	memset(m->data, 0, MAX_SIZE);
}

/* Every byte of @m as butter reads it, and its size as butter_stat() says. */
static int verify(const struct model *m)
{
	unsigned char *buf = malloc(MAX_SIZE + 4096);
	struct butter_stat st;
	ssize_t n;
	int ok = 1;

	if (!buf)
		return 0;
	if (butter_stat(fs, m->ino, &st) != 0 || st.size != m->size) {
		fprintf(stderr, "%s: size %llu, model %llu\n", m->name,
			(unsigned long long)st.size, (unsigned long long)m->size);
		ok = 0;
	}
	n = butter_read(fs, m->ino, buf, MAX_SIZE + 4096, 0);
	if (n != (ssize_t)m->size || memcmp(buf, m->data, m->size) != 0) {
		fprintf(stderr, "%s: read %zd bytes, model %llu, first difference at %ld\n", m->name,
			n, (unsigned long long)m->size, (long)({
				long i = 0;
				while (n > 0 && i < n && i < (long)m->size && buf[i] == m->data[i])
					i++;
				i;
			}));
		ok = 0;
	}
	free(buf);
	return ok;
}

static void do_write(struct model *m, uint64_t off, unsigned len)
{
	unsigned char *src = malloc(len);
	unsigned seed = (unsigned)next_rand();

	for (unsigned i = 0; i < len; i++)
		src[i] = (unsigned char)(seed + i * 7 + (i >> 9));
	CHECK(butter_write(fs, m->ino, src, len, off) == (ssize_t)len);
	memcpy(m->data + off, src, len);
	if (off + len > m->size)
		m->size = off + len;
	free(src);
}

/* One random step on a random file. */
static void step(void)
{
	struct model *m = &files[rnd(NFILES)];
	unsigned op = rnd(100);

	if (!m->exists) {
		create_file(m);
		return;
	}
	if (op < 55) {
		/* a write: after the end, into the middle, or a run of out-of-order pieces */
		unsigned len = 1 + rnd(op < 20 ? 300000 : 9000);
		uint64_t off;

		if (op < 30)
			off = m->size + (rnd(4) ? 0 : rnd(20000));
		else
			off = m->size ? rnd((unsigned)m->size) : 0;
		if (off + len > MAX_SIZE)
			return;
		if (op >= 45 && off + 4 * 65536 <= MAX_SIZE) {
			/* four 64 KiB requests reaching the lock in the order 1 0 3 2 */
			static const int order[4] = { 1, 0, 3, 2 };

			for (int i = 0; i < 4; i++)
				do_write(m, off + (uint64_t)order[i] * 65536, 65536);
			return;
		}
		do_write(m, off, len);
	} else if (op < 65) {
		/*
		 * truncate, down or up; half of them by butter_setattr_stat(), whose
		 * answer is what butter_stat() says then, and half of those keeping
		 * the times (BUTTER_SET_KEEP_FILE_TIMES)
		 */
		struct butter_stat st, before, after, now;
		uint64_t size = rnd(MAX_SIZE);
		unsigned how = rnd(4);

		memset(&st, 0, sizeof(st));
		st.size = size;
		if (how < 2) {
			CHECK(butter_setattr(fs, m->ino, &st, BUTTER_SET_SIZE) == 0);
		} else {
			unsigned keep = how == 3 ? BUTTER_SET_KEEP_FILE_TIMES : 0;

			CHECK(butter_stat(fs, m->ino, &before) == 0);
			CHECK(butter_setattr_stat(fs, m->ino, &st, BUTTER_SET_SIZE | keep, &after) == 0);
			CHECK(butter_stat(fs, m->ino, &now) == 0);
			CHECK(memcmp(&after, &now, sizeof(now)) == 0);
			CHECK_EQ_U64(after.size, size);
			if (keep) {
				CHECK(after.mtime.tv_sec == before.mtime.tv_sec &&
				      after.mtime.tv_nsec == before.mtime.tv_nsec);
				CHECK(after.ctime.tv_sec == before.ctime.tv_sec &&
				      after.ctime.tv_nsec == before.ctime.tv_nsec);
			}
		}
		if (size < m->size)
			memset(m->data + size, 0, m->size - size);
		m->size = size;
	} else if (op < 70) {
		/* a hole punched (4 KiB aligned, inside the file) */
		uint64_t off, len;

		if (m->size < 8192)
			return;
		off = rnd((unsigned)m->size) / 4096 * 4096;
		len = (1 + rnd(64)) * 4096ULL;
		if (off + len > m->size)
			len = (m->size - off) / 4096 * 4096;
		if (!len)
			return;
		CHECK(butter_fallocate(fs, m->ino, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off,
				       len) == 0);
		memset(m->data + off, 0, len);
	} else if (op < 75) {
		/* a reflink of a block-aligned piece of another file */
		struct model *s = &files[rnd(NFILES)];
		uint64_t soff, doff, len;

		if (s == m || !s->exists || s->size < 8192)
			return;
		soff = rnd((unsigned)(s->size - 4096)) / 4096 * 4096;
		len = ((s->size - soff) / 4096) * 4096;
		if (len > 256 * 1024)
			len = 256 * 1024;
		doff = m->size / 4096 * 4096;
		if (!len || doff + len > MAX_SIZE)
			return;
		CHECK(butter_clone_range(fs, s->ino, soff, m->ino, doff, len) == 0);
		memcpy(m->data + doff, s->data + soff, len);
		if (doff + len > m->size)
			m->size = doff + len;
	} else if (op < 80) {
		CHECK(butter_fsync(fs, m->ino, rnd(2)) == 0);
	} else if (op < 83) {
		/* the write-back changes no size and no block count */
		struct butter_stat before[NFILES], after;

		for (int i = 0; i < NFILES; i++)
			if (files[i].exists)
				CHECK(butter_stat(fs, files[i].ino, &before[i]) == 0);
		CHECK(butter_sync(fs) == 0);
		for (int i = 0; i < NFILES; i++) {
			if (!files[i].exists)
				continue;
			CHECK(butter_stat(fs, files[i].ino, &after) == 0);
			CHECK_EQ_U64(after.size, before[i].size);
			CHECK_EQ_U64(after.blocks, before[i].blocks);
		}
	} else if (op < 88) {
		/* SEEK_DATA from 0 finds the first byte the model has data at, or a hole before it */
		uint64_t at = 0;
		int ret = butter_seek(fs, m->ino, 0, SEEK_DATA, &at);

		CHECK(ret == 0 || ret == -ENXIO);
		if (ret == 0)
			for (uint64_t i = 0; i < at && i < m->size; i++)
				if (m->data[i]) {
					CHECK(!"SEEK_DATA skipped data");
					break;
				}
	} else if (op < 91) {
		CHECK(butter_unlink(fs, root, m->name, strlen(m->name)) == 0);
		m->exists = 0;
	} else {
		/* a read of a random range */
		unsigned char buf[70000];
		uint64_t off = m->size ? rnd((unsigned)m->size) : 0;
		ssize_t n = butter_read(fs, m->ino, buf, sizeof(buf), off);
		uint64_t want = m->size > off ? m->size - off : 0;

		if (want > sizeof(buf))
			want = sizeof(buf);
		CHECK(n == (ssize_t)want);
		CHECK(n <= 0 || memcmp(buf, m->data + off, (size_t)n) == 0);
	}
}

static void test_model(void)
{
	struct butter_check_result res;
	int i, s;

	CHECK(make_image("delalloc") == 0);
	CHECK(butter_open(img, NULL, &fs) == 0);
	CHECK(butter_resolve(fs, "/", &root) == 0);
	CHECK(butter_set_write_buffer(fs, 2u << 20) == 0); /* small: pressure comes often */
	for (i = 0; i < NFILES; i++) {
		files[i].data = calloc(1, MAX_SIZE);
		snprintf(files[i].name, sizeof(files[i].name), "f%d", i);
		create_file(&files[i]);
	}
	for (s = 0; s < 1500; s++) {
		step();
		if (s % 25 == 0)
			for (i = 0; i < NFILES; i++)
				if (files[i].exists && !verify(&files[i])) {
					fprintf(stderr, "after step %d\n", s);
					CHECK(0);
					s = 1 << 30;
					break;
				}
	}
	for (i = 0; i < NFILES; i++)
		CHECK(!files[i].exists || verify(&files[i]));
	butter_close(fs);
	/* what the close wrote back is on disk */
	CHECK(butter_open(img, NULL, &fs) == 0);
	for (i = 0; i < NFILES; i++) {
		butter_ino_t again;
		unsigned type = 0;

		if (!files[i].exists)
			continue;
		CHECK(butter_lookup(fs, root, files[i].name, strlen(files[i].name),
				    &files[i].ino) == 0);
		CHECK(butter_lookup_type(fs, root, files[i].name, strlen(files[i].name), &again,
					 &type) == 0);
		CHECK(again.ino == files[i].ino.ino && type == DT_REG);
		CHECK(verify(&files[i]));
	}
	{
		butter_ino_t again;
		unsigned type = 0;

		CHECK(butter_lookup_type(fs, root, "..", 2, &again, &type) == 0);
		CHECK(type == DT_DIR);
	}
	memset(&res, 0, sizeof(res));
	CHECK(butter_check(fs, &res) == 0);
	CHECK_EQ_U64(res.errors, 0);
	butter_close(fs);
	for (i = 0; i < NFILES; i++)
		free(files[i].data);
	drop_image();
}

static void test_concurrent_writers_one_extent_each(void)
{
	enum { N = 8, PIECE = 1 << 20, PIECES = 16 };
	butter_ino_t ino[N];
	unsigned char *buf = malloc(PIECE);
	struct butter_defrag_stats st;
	struct butter_defrag_args args;

	CHECK(make_image("delalloc-extents") == 0);
	CHECK(butter_open(img, NULL, &fs) == 0);
	CHECK(butter_resolve(fs, "/", &root) == 0);
	CHECK(butter_set_write_buffer(fs, 256u << 20) == 0);
	for (int f = 0; f < N; f++) {
		struct butter_new_inode a = { .mode = S_IFREG | 0644 };
		char name[16];

		snprintf(name, sizeof(name), "w%d", f);
		CHECK(butter_create(fs, root, name, strlen(name), &a, &ino[f]) == 0);
	}
	/* round robin, as N writers at once; one piece of each out of order */
	for (int p = 0; p < PIECES; p++)
		for (int f = 0; f < N; f++) {
			int q = p == 4 ? 5 : p == 5 ? 4 : p;

			memset(buf, 'a' + f + q, PIECE);
			CHECK(butter_write(fs, ino[f], buf, PIECE, (uint64_t)q * PIECE) == PIECE);
		}
	CHECK(butter_sync(fs) == 0);
	/* defragment counts a file's contiguous runs on disk: one, so nothing moves */
	for (int f = 0; f < N; f++) {
		memset(&args, 0, sizeof(args));
		memset(&st, 0, sizeof(st));
		CHECK(butter_defrag(fs, ino[f], &args, &st) == 0);
		CHECK_EQ_U64(st.runs_before, 1);
		CHECK_EQ_U64(st.files_moved, 0);
	}
	butter_close(fs);
	free(buf);
	drop_image();
}

int main(void)
{
	const char *seed = getenv("BUTTER_TEST_SEED"); /* another sequence of steps */

	if (seed && strtoull(seed, NULL, 0))
		rng = strtoull(seed, NULL, 0);
	RUN(test_model);
	RUN(test_concurrent_writers_one_extent_each);
	return check_summary();
}
