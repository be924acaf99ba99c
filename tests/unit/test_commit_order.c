/*
 * test_commit_order.c — the order in which a commit reaches the devices
 * (transaction.h: tree blocks, flush, superblocks, flush), checked on the
 * log of the recorder device (lib/device/recorder.c), which holds every
 * write and flush in the order the devices completed them. The log is
 * decoded here from the format recorder.c documents.
 *
 * Workload: butter_mkfs makes a two-device filesystem (256 MiB each, so each
 * device has two superblock copies: 64 KiB and 64 MiB; metadata raid1);
 * butter_open with record_log set; a few rounds of changes through the
 * public API, each ended by butter_sync(); a label change (a commit for the
 * superblock alone); butter_close().
 *
 * For every commit — the superblock writes of one generation G — it checks:
 *  1. the superblock writes of G are contiguous in the log: no other write
 *     and no flush among them; every superblock copy of every device is
 *     written (2 per device), each a valid superblock (magic, checksum,
 *     bytenr = its offset) holding generation G, and generations grow by
 *     one from commit to commit, starting above mkfs's;
 *  2. every write before them since the previous commit (tree blocks,
 *     data), and every tree block stamped G, is followed by a flush of its
 *     device before the first superblock write of G;
 *  3. after the last superblock write of G, each device is flushed before
 *     any further write reaches any device;
 *  4. no tree block stamped G is written after G's superblocks;
 *  5. the root tree root the superblock names is a tree block stamped G
 *     written before it (the chunk root: one written before, of G or older).
 * At the end the log ends flushed, and the superblock on disk is the last
 * commit's.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "butter/butter.h"
#include "butter/testing.h"
#include "check.h"
#include "format/checksum.h"
#include "format/ondisk.h"

#define MIB (1024ULL * 1024)
#define DEV_SIZE (256 * MIB)
#define NDEVS 2
#define SUPER_SIZE 4096u
#define REC_HEADER 24u
#define REC_DEVICE 1u
#define REC_WRITE 2u
#define REC_FLUSH 3u

static int log_errors;

static void log_fn(void *arg, int level, const char *msg)
{
	(void)arg;
	if (level <= BUTTER_LOG_ERROR) {
		log_errors++;
		fprintf(stderr, "butter: %s\n", msg);
	}
}

/* ---- the log ---------------------------------------------------------------- */

enum kind { K_DEVICE, K_FLUSH, K_SUPER, K_TREE, K_OTHER };

struct rec {
	unsigned type;
	uint32_t dev;
	uint64_t value;   /* DEVICE: size; WRITE: offset */
	uint64_t len;
	const u8 *payload;
	enum kind kind;
	uint64_t gen;     /* K_SUPER, K_TREE: the generation it carries */
	uint64_t bytenr;  /* K_TREE: the logical bytenr in its header */
};

struct parsed {
	u8 *buf;
	size_t size;
	struct rec *r;
	size_t n;
	int bad;          /* the log did not parse */
};

static int read_file(const char *path, u8 **out, size_t *size)
{
	struct stat st;
	size_t done = 0;
	int fd = open(path, O_RDONLY);
	u8 *buf;

	if (fd < 0 || fstat(fd, &st) != 0) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	buf = malloc(st.st_size ? (size_t)st.st_size : 1);
	while (buf && done < (size_t)st.st_size) {
		ssize_t got = read(fd, buf + done, (size_t)st.st_size - done);

		if (got <= 0)
			break;
		done += (size_t)got;
	}
	close(fd);
	if (!buf || done != (size_t)st.st_size) {
		free(buf);
		return -EIO;
	}
	*out = buf;
	*size = done;
	return 0;
}

static int is_super_offset(uint64_t off)
{
	for (int m = 0; m < BTRFS_SUPER_MIRROR_MAX; m++)
		if (off == btrfs_sb_offset(m))
			return 1;
	return 0;
}

static void classify(struct rec *r, const u8 *fsid, u32 nodesize)
{
	r->kind = r->type == REC_DEVICE ? K_DEVICE : r->type == REC_FLUSH ? K_FLUSH : K_OTHER;
	if (r->type != REC_WRITE)
		return;
	if (r->len == SUPER_SIZE && is_super_offset(r->value) &&
	    get_le64(r->payload + offsetof(struct btrfs_super_block, magic)) == BTRFS_MAGIC) {
		r->kind = K_SUPER;
		r->gen = get_le64(r->payload + offsetof(struct btrfs_super_block, generation));
	} else if (r->len == nodesize &&
		   memcmp(r->payload + offsetof(struct btrfs_header, fsid), fsid,
			  BTRFS_FSID_SIZE) == 0) {
		r->kind = K_TREE;
		r->gen = get_le64(r->payload + offsetof(struct btrfs_header, generation));
		r->bytenr = get_le64(r->payload + offsetof(struct btrfs_header, bytenr));
	}
}

static void parse_log(const char *path, const u8 *fsid, u32 nodesize, struct parsed *p)
{
	size_t pos = 16, cap = 0;

	memset(p, 0, sizeof(*p));
	if (read_file(path, &p->buf, &p->size) != 0 || p->size < 16 ||
	    memcmp(p->buf, "BTRREC01", 8) != 0 || get_le32(p->buf + 8) != 1) {
		p->bad = 1;
		return;
	}
	while (pos < p->size) {
		struct rec r;

		if (p->size - pos < REC_HEADER) {
			p->bad = 1;
			return;
		}
		memset(&r, 0, sizeof(r));
		r.type = p->buf[pos];
		r.dev = get_le32(p->buf + pos + 4);
		r.value = get_le64(p->buf + pos + 8);
		r.len = get_le64(p->buf + pos + 16);
		if (r.type < REC_DEVICE || r.type > REC_FLUSH || r.len > p->size - pos - REC_HEADER ||
		    (r.type == REC_FLUSH && (r.len || r.value))) {
			p->bad = 1;
			return;
		}
		r.payload = p->buf + pos + REC_HEADER;
		classify(&r, fsid, nodesize);
		if (p->n == cap) {
			cap = cap ? cap * 2 : 1024;
			p->r = realloc(p->r, cap * sizeof(*p->r));
			if (!p->r) {
				p->bad = 1;
				return;
			}
		}
		p->r[p->n++] = r;
		pos += REC_HEADER + r.len;
	}
}

/* ---- the checks --------------------------------------------------------------- */

/* Is there a flush of @dev among records (from, to)? */
static int flushed_between(const struct parsed *p, uint32_t dev, size_t from, size_t to)
{
	for (size_t i = from + 1; i < to; i++)
		if (p->r[i].kind == K_FLUSH && p->r[i].dev == dev)
			return 1;
	return 0;
}

static void check_super_copy(const struct rec *r, const struct rec *first, u16 csum_type)
{
	const struct btrfs_super_block *sb = (const void *)r->payload;
	u8 csum[BTRFS_CSUM_SIZE];

	CHECK_EQ_U64(btrfs_super_bytenr(sb), r->value);
	CHECK(btrfs_csum_compute(csum_type, r->payload + BTRFS_CSUM_SIZE,
				 SUPER_SIZE - BTRFS_CSUM_SIZE, csum) == 0);
	CHECK_MEM(csum, sb->csum, btrfs_csum_size(csum_type));
	/* every copy describes the same state */
	CHECK_MEM(sb->fsid, ((const struct btrfs_super_block *)first->payload)->fsid,
		  BTRFS_FSID_SIZE);
	CHECK_EQ_U64(btrfs_super_root(sb),
		     btrfs_super_root((const struct btrfs_super_block *)first->payload));
	CHECK_EQ_U64(btrfs_super_chunk_root(sb),
		     btrfs_super_chunk_root((const struct btrfs_super_block *)first->payload));
}

/*
 * Check every commit in the log; returns how many there were and the last
 * generation in *last_gen.
 */
static size_t check_commits(const struct parsed *p, uint64_t mkfs_gen, u16 csum_type,
			    uint64_t *last_gen)
{
	size_t ncommits = 0, window = 0, i = 0;
	uint64_t prev_gen = mkfs_gen;

	while (i < p->n) {
		size_t first, last, k, nsupers = 0;
		uint64_t gen, root;
		int pending[NDEVS] = { 0 }, npending = 0, root_seen = 0, chunk_seen = 0;

		for (; i < p->n && p->r[i].kind != K_SUPER; i++)
			;
		if (i == p->n)
			break;
		first = i;
		gen = p->r[first].gen;
		ncommits++;
		/* 1. contiguous, complete, valid copies of the next generation */
		CHECK_EQ_U64(gen, prev_gen + 1);
		for (last = first; last < p->n && p->r[last].kind == K_SUPER &&
				   p->r[last].gen == gen;
		     last++) {
			check_super_copy(&p->r[last], &p->r[first], csum_type);
			if (p->r[last].dev < NDEVS && !pending[p->r[last].dev]) {
				pending[p->r[last].dev] = 1;
				npending++;
			}
			nsupers++;
		}
		last--;
		CHECK_EQ_U64(nsupers, NDEVS * 2);
		CHECK_EQ_U64(npending, NDEVS);
		for (k = last + 1; k < p->n; k++) {
			if (p->r[k].kind == K_SUPER && p->r[k].gen == gen) {
				CHECK(!"superblock of the same generation after another record");
				break;
			}
		}
		/* 2. what came before is flushed before the first superblock */
		for (k = window; k < first; k++) {
			if (p->r[k].kind != K_SUPER && p->r[k].kind != K_TREE &&
			    p->r[k].kind != K_OTHER)
				continue;
			if (!flushed_between(p, p->r[k].dev, k, first)) {
				fprintf(stderr, "generation %llu: record %zu (write of %llu bytes at %llu "
						"on device %u) is not flushed before the superblocks\n",
					(unsigned long long)gen, k, (unsigned long long)p->r[k].len,
					(unsigned long long)p->r[k].value, p->r[k].dev);
				CHECK(!"a write is not flushed before the superblocks");
				break;
			}
		}
		root = btrfs_super_root((const struct btrfs_super_block *)p->r[first].payload);
		for (k = 0; k < p->n; k++) {
			if (p->r[k].kind != K_TREE)
				continue;
			if (p->r[k].gen == gen && k < first &&
			    !flushed_between(p, p->r[k].dev, k, first))
				CHECK(!"a tree block of the commit is not flushed before its superblocks");
			/* 4. nothing of this generation after its superblocks */
			if (p->r[k].gen == gen && k > last) {
				fprintf(stderr, "generation %llu: tree block %llu written at record %zu, "
						"after the superblocks (%zu..%zu)\n",
					(unsigned long long)gen, (unsigned long long)p->r[k].bytenr, k,
					first, last);
				CHECK(!"a tree block of the commit is written after its superblocks");
			}
			/* 5. the roots it names were written */
			if (k < first && p->r[k].bytenr == root && p->r[k].gen == gen)
				root_seen = 1;
			if (k < first &&
			    p->r[k].bytenr == btrfs_super_chunk_root(
						      (const struct btrfs_super_block *)p->r[first].payload) &&
			    p->r[k].gen <= gen)
				chunk_seen = 1;
		}
		CHECK(root_seen);
		CHECK(chunk_seen);
		/* 3. then a flush of every device before anything else is written */
		for (k = last + 1; k < p->n && npending > 0; k++) {
			if (p->r[k].kind != K_FLUSH) {
				fprintf(stderr, "generation %llu: record %zu is a write before the "
						"superblocks were flushed\n",
					(unsigned long long)gen, k);
				CHECK(!"a write between the superblocks and their flush");
				break;
			}
			if (p->r[k].dev < NDEVS && pending[p->r[k].dev]) {
				pending[p->r[k].dev] = 0;
				npending--;
			}
		}
		CHECK_EQ_U64(npending, 0);
		window = k;
		prev_gen = gen;
		i = last + 1;
	}
	/* the log ends flushed: no write after the last commit's final flush */
	for (size_t k = window; k < p->n; k++)
		CHECK(p->r[k].kind == K_FLUSH);
	*last_gen = prev_gen;
	return ncommits;
}

/* ---- the workload ------------------------------------------------------------- */

static void fill(u8 *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (u8)(seed * 131 + i * 7 + (i >> 9));
}

static int workload(struct butter_fs *fs, int *syncs)
{
	static u8 buf[300 * 1024];
	struct butter_new_inode file = { 0100644, 0, 0, 0, 0, 0 };
	struct butter_new_inode dir = { 0040755, 0, 0, 0, 0, 0 };
	butter_ino_t root, a, b, d;
	int ret;

	ret = butter_root(fs, 0, &root);
	if (ret)
		return ret;
	/* round 1: a file with data */
	ret = butter_create(fs, root, "a", 1, &file, &a);
	fill(buf, sizeof(buf), 1);
	if (ret == 0 && butter_write(fs, a, buf, sizeof(buf), 0) != (ssize_t)sizeof(buf))
		ret = -EIO;
	if (ret == 0)
		ret = butter_sync(fs);
	if (ret)
		return ret;
	(*syncs)++;
	/* round 2: a directory, a second file, an overwrite */
	ret = butter_create(fs, root, "d", 1, &dir, &d);
	if (ret == 0)
		ret = butter_create(fs, d, "b", 1, &file, &b);
	fill(buf, sizeof(buf), 2);
	if (ret == 0 && butter_write(fs, b, buf, 100000, 0) != 100000)
		ret = -EIO;
	if (ret == 0 && butter_write(fs, a, buf, 8192, 4096) != 8192)
		ret = -EIO;
	if (ret == 0)
		ret = butter_sync(fs);
	if (ret)
		return ret;
	(*syncs)++;
	/* round 3: a removal (frees extents, pinned until this commit) */
	ret = butter_unlink(fs, root, "a", 1);
	if (ret == 0)
		ret = butter_sync(fs);
	if (ret)
		return ret;
	(*syncs)++;
	/* round 4: the superblock alone */
	ret = butter_set_label(fs, "commit-order");
	if (ret == 0)
		(*syncs)++;
	return ret;
}

static void test_commit_order(void)
{
	const char *tmp = getenv("TMPDIR");
	char dirpath[4096], devpath[NDEVS][4200], logpath[4200];
	const char *devs[NDEVS], *more[NDEVS - 1];
	struct butter_mkfs_opts mo;
	struct butter_open_opts oo;
	struct butter_test_devices test = { 0 };
	struct btrfs_super_block sb0, sb_end;
	struct butter_fs *fs = NULL;
	struct parsed p;
	uint64_t last_gen = 0;
	size_t ncommits;
	int fd, syncs = 0, ret;

	snprintf(dirpath, sizeof(dirpath), "%s/butter-test-commit-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dirpath)) {
		CHECK(!"mkdtemp");
		return;
	}
	for (int i = 0; i < NDEVS; i++) {
		snprintf(devpath[i], sizeof(devpath[i]), "%s/dev%d.img", dirpath, i);
		devs[i] = devpath[i];
		if (i)
			more[i - 1] = devpath[i];
	}
	snprintf(logpath, sizeof(logpath), "%s/record.log", dirpath);
	memset(&mo, 0, sizeof(mo));
	mo.devices = devs;
	mo.ndevices = NDEVS;
	mo.size = DEV_SIZE;
	mo.csum_type = -1;
	mo.log = log_fn;
	log_errors = 0;
	ret = butter_mkfs(&mo);
	CHECK_EQ_U64(ret, 0);
	fd = open(devpath[0], O_RDONLY);
	CHECK(fd >= 0 && pread(fd, &sb0, sizeof(sb0), BTRFS_SUPER_INFO_OFFSET) == sizeof(sb0));
	if (fd >= 0)
		close(fd);

	memset(&oo, 0, sizeof(oo));
	oo.devices = more;
	oo.ndevices = NDEVS - 1;
	oo.log = log_fn;
	test.record_log = logpath;
	if (ret == 0) {
		ret = butter_open_testing(devpath[0], &oo, &test, &fs);
		CHECK_EQ_U64(ret, 0);
	}
	if (ret == 0) {
		CHECK_EQ_U64(workload(fs, &syncs), 0);
		butter_close(fs);
	}

	parse_log(logpath, sb0.fsid, btrfs_super_nodesize(&sb0), &p);
	CHECK(!p.bad);
	CHECK(p.n > 0 && p.r[0].kind == K_DEVICE);
	if (!p.bad) {
		ncommits = check_commits(&p, btrfs_super_generation(&sb0),
					 btrfs_super_csum_type(&sb0), &last_gen);
		CHECK(ncommits >= (size_t)syncs);
		CHECK_EQ_U64(syncs, 4);
	}
	/* what is on disk is the last commit */
	fd = open(devpath[1], O_RDONLY);
	CHECK(fd >= 0 && pread(fd, &sb_end, sizeof(sb_end), BTRFS_SUPER_INFO_OFFSET) ==
				 sizeof(sb_end));
	if (fd >= 0)
		close(fd);
	CHECK_EQ_U64(btrfs_super_generation(&sb_end), last_gen);
	CHECK(strcmp(sb_end.label, "commit-order") == 0);
	CHECK_EQ_U64(log_errors, 0);

	free(p.buf);
	free(p.r);
	for (int i = 0; i < NDEVS; i++)
		unlink(devpath[i]);
	unlink(logpath);
	rmdir(dirpath);
}

int main(void)
{
	RUN(test_commit_order);
	return check_summary();
}
