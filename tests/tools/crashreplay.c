/*
 * crashreplay.c — power-cut replay: rebuild every state a crash could have
 * left on the disk(s) during a recorded workload, and check each one.
 *
 *   crashreplay [OPTIONS] LOG MANIFEST IMAGE...
 *   crashreplay --verify [OPTIONS] MANIFEST IMAGE...
 *
 * LOG is a record log (lib/device/recorder.c) of a workload that started on
 * the images IMAGE... (device 0, 1, ... in the log's order; they are only
 * read); MANIFEST is the workload's account of what each commit held and
 * when it was durable (tests/tools/workload.c). --verify checks the images
 * themselves as they are now (after a fault test) against the manifest.
 * Devices past the images given (a replace target or an added device, which
 * joined the log in the middle) start as zeroes of the size their DEVICE
 * record says.
 *
 * The device set may change during the log (a device removed, replaced or
 * added), so each state is opened with the devices a scan would find, as
 * the kernel's device scan does: those holding a valid superblock of the
 * filesystem (the fsid of the newest superblock of any device), and of two
 * that claim one devid (the old device and its replacement) the newer. A
 * device counts for butter when any superblock copy is valid (butter reads
 * every copy, the newest valid one wins), for the kernel and btrfs check
 * only by its primary copy (what they read). A removed device whose
 * superblocks are not wiped yet is still given: a stale member must be
 * ignored. Validity: magic, the copy's own offset, and the crc32c of
 * csum_type 0 (other checksum types are taken on magic and offset).
 *
 * States (cut points), each built on copies of the images (sparse files in
 * --work DIR, updated incrementally: every write applied keeps an undo entry
 * with the bytes it replaced, so a state is a few writes away from the next):
 *  1. prefix: the first n records reached the disk, for every n after a
 *     write (every write count between flushes, up to every flush boundary);
 *  2. torn: the first n records and part of write n+1, at --sector
 *     granularity (default 4096: btrfs assumes a 4 KiB superblock write is
 *     atomic): a random prefix of its sectors, and random subsets
 *     (--torn variants per write, default 2);
 *  3. reordered: at each flush, the device may have kept any subset of the
 *     writes issued since the previous flush of that device: --reorder random
 *     subsets (default 3; seeded by --seed).
 *
 * A state is consistent when (each check is counted):
 *  a. no more of its devices hold a superblock of the newest generation than
 *     that superblock counts; butter opens it read-only and lists the whole
 *     tree, reading every file (tests/tools/treelist.c) without an error;
 *  b. its generation G is at least the newest commit the manifest says was
 *     durable before the cut (every synced byte survives), and the tree equals
 *     the manifest's state for G exactly (every file has the content of one
 *     commit, never a mix);
 *  c. `btrfs check --readonly` finds no error (--no-check skips it; states of
 *     a multi-device filesystem are checked only when they are mounted: the
 *     check needs their devices as loop devices; when a scan finds more of
 *     them than the newest superblock counts, only those the kernel's mount
 *     took: see kernel_agrees());
 *  d. for a sample of states (--kernel N, evenly spread; every --verify; with
 *     --kernel, also the first state opened with each new device set): the
 *     kernel mounts the image(s) read-only and shows the manifest's state for
 *     the generation of the newest primary superblock (the kernel reads only
 *     primary copies). A state whose superblock holds a tree log is mounted
 *     from writable copies (the kernel replays the log even for a read-only
 *     mount, and refuses read-only media) and must show the manifest's state
 *     for the generation the log replays to ("replays GEN0 GEN1" lines);
 *  e. --degraded (multi-device states): butter also opens it read-only and
 *     degraded with one device missing (device index % devices, in turn) and
 *     reads the manifest's state of the generation it finds, no older than
 *     the durable one. --degraded-commits requires that only of the states
 *     a commit just completed (every write of it there, nothing of the next
 *     one), and counts the other states' degraded failures as tolerated:
 *     RAID5/6 rewrite the parity of stripe rows in place, so a cut between a
 *     row's data and parity writes leaves that row's parity stale and a
 *     block of it beyond rebuilding from the others (the write hole, as in
 *     the kernel without a stripe tree);
 *  f. for a sample of states (--rw-check N, evenly spread; every state when N
 *     is at least their number; also the first state of each new device set):
 *     butter opens writable copies read-write (the open replays a tree log,
 *     finishes dropping deleted subvolumes, cleans orphans), must show the
 *     tree of the generation it opened (or the one its log replays to),
 *     commits once (the label set again: every device gets a superblock of a
 *     new generation) and closes them; no more devices may then hold a
 *     superblock of the newest generation than it counts, `btrfs check
 *     --readonly` must still be clean (single device), and a read-only open
 *     must show the same tree again.
 *
 * Output: a FAIL line per inconsistent state (the first --show of them with
 * details; --save-failed DIR keeps the images of the first), then one summary
 * line:
 *   crashreplay: records R (writes W, flushes F); states S (prefix P, torn T,
 *   reordered O); consistent C; failed X; btrfs-check B; kernel-mounted K,
 *   agreed A; durable-bytes-verified D; rw-opened W, agreed V, drops-finished
 *   P, logs-replayed L; degraded-opened G, agreed H, tolerated T, at-commits M;
 *   device-sets N (distinct pairs of device sets, butter's and the kernel's,
 *   the states were opened with, and the number of devices the newest
 *   superblock counts; when there are several, a line before the summary
 *   lists them, "0,1,2/0,1:2" for butter's devices 0-2, the kernel's 0-1, 2
 *   counted), stale-dropped K (kernel mounts that left out a device the scan
 *   found: a removed one whose superblocks were not wiped yet)
 * Exit status 0 if every state was consistent, 1 if not, 2 on a usage or
 * setup error.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <spawn.h>
#include <unistd.h>

#include "butter/butter.h"
#include "treelist.h"

extern char **environ;

#define REC_DEVICE 1u
#define REC_WRITE 2u
#define REC_FLUSH 3u
#define REC_HEADER 24u
#define LOG_HEADER 16u
#define SUPER_OFFSET 65536u
#define SUPER_GEN_FIELD 72u /* csum 32, fsid 16, bytenr 8, flags 8, magic 8 */
#define SUPER_LOG_ROOT_FIELD 96u /* then generation 8, root 8, chunk_root 8 */
#define SUPER_FSID_FIELD 32u
#define SUPER_BYTENR_FIELD 48u
#define SUPER_MAGIC_FIELD 64u
#define SUPER_CSUM_TYPE_FIELD 196u
#define SUPER_NUM_DEVICES_FIELD 136u
#define SUPER_DEVID_FIELD 201u /* dev_item.devid */
#define SUPER_SIZE 4096u
#define MAX_DEVS 16

struct rec {
	unsigned type;
	uint32_t dev;
	uint64_t offset;       /* WRITE: device byte; DEVICE: size */
	uint64_t len;
	const uint8_t *data;   /* into the mapped log */
	uint64_t end;          /* log position after this record */
};

struct mstate {
	uint64_t gen;
	struct treelist list;
};

struct durable {
	uint64_t gen, pos;
};

struct replays {
	uint64_t from, to; /* an image at @from with a tree log shows @to's tree after replay */
};

/* The devices a state is opened with (in index order) and what their superblocks say. */
struct members {
	size_t n;
	size_t idx[MAX_DEVS];
	uint64_t gens[MAX_DEVS]; /* the generation of each one's superblock */
	size_t newest;         /* the index of the one with the newest superblock */
	uint64_t gen;          /* that superblock's generation */
	uint64_t ndevices;     /* and the number of devices it counts */
};

struct undo {
	size_t rec;            /* record it undoes */
	uint32_t dev;
	uint64_t off, len;
	uint8_t *old;
};

struct journal {
	struct undo *v;
	size_t n, cap;
};

enum kind { ST_PREFIX, ST_TORN, ST_REORDER, ST_VERIFY };

struct ctx {
	/* options */
	uint64_t seed;
	unsigned torn, reorder, show, ksample, rwsample;
	uint64_t sector, max_states;
	int check, verbose;
	int degraded;          /* 1: every state; 2: only where a commit completed */
	int at_commit;         /* the state being checked holds exactly a completed commit */
	const char *workdir, *save_failed;

	/* the log and the manifest */
	struct rec *recs;
	size_t nrec;
	struct mstate *states;
	size_t nstates;
	struct durable *dur;
	size_t ndur;
	struct replays *rep;
	size_t nrep;

	/* state files */
	size_t ndev;
	char *paths[MAX_DEVS];
	int fds[MAX_DEVS];
	uint64_t sizes[MAX_DEVS];
	char mnt[4300];

	struct journal main_j, tmp_j;

	/* the walk */
	int dry;               /* count states only */
	uint64_t index;        /* states seen so far */
	uint64_t total;        /* from the dry pass */
	uint64_t kernel_every, rw_every;
	int saved;

	/* figures */
	uint64_t n_prefix, n_torn, n_reorder, consistent, failed, checked, kmounted, kagreed;
	uint64_t durable_bytes;
	uint64_t nwrites, nflushes;
	uint64_t rw_opened, rw_agreed, rw_drops, rw_logs, deg_opened, deg_agreed, deg_tolerated,
		 deg_commits;
	/* distinct device sets: bit d butter's device d, MAX_DEVS + d the kernel's, from bit 32
	 * the number of devices the newest superblock counts */
	uint64_t sets[64];
	size_t nsets;
	uint64_t stale_dropped;   /* kernel mounts that left out a device the scan found */
};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
	va_list ap;

	fputs("crashreplay: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

static uint64_t get_le(const uint8_t *p, int n)
{
	uint64_t v = 0;

	while (n--)
		v = v << 8 | p[n];
	return v;
}

/* splitmix64 over (seed, record, variant): the same choice in the dry pass and the real one */
static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

struct rng {
	uint64_t s;
};

static uint64_t rng_next(struct rng *r)
{
	r->s = mix(r->s);
	return r->s;
}

static struct rng rng_for(const struct ctx *c, size_t rec, unsigned variant, unsigned kind)
{
	struct rng r = { mix(c->seed ^ mix((uint64_t)rec * 4 + kind) ^ mix(variant + 0x51ed)) };

	return r;
}

/* ---- reading the log and the manifest ------------------------------------ */

static void load_log(struct ctx *c, const char *path)
{
	struct stat st;
	const uint8_t *m;
	uint64_t pos = LOG_HEADER;
	size_t cap = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0 || fstat(fd, &st) < 0)
		die("%s: %s", path, strerror(errno));
	if ((uint64_t)st.st_size < LOG_HEADER)
		die("%s: too short for a record log", path);
	m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (m == MAP_FAILED)
		die("%s: mmap: %s", path, strerror(errno));
	close(fd);
	if (memcmp(m, "BTRREC01", 8) != 0 || get_le(m + 8, 4) != 1)
		die("%s: not a version 1 record log", path);
	while (pos + REC_HEADER <= (uint64_t)st.st_size) {
		struct rec r;

		r.type = m[pos];
		r.dev = (uint32_t)get_le(m + pos + 4, 4);
		r.offset = get_le(m + pos + 8, 8);
		r.len = get_le(m + pos + 16, 8);
		r.data = m + pos + REC_HEADER;
		if (r.len > (uint64_t)st.st_size - pos - REC_HEADER)
			break; /* a record cut short: the workload died while logging */
		r.end = pos + REC_HEADER + r.len;
		if (r.type < REC_DEVICE || r.type > REC_FLUSH || r.dev >= MAX_DEVS)
			die("%s: bad record at %" PRIu64, path, pos);
		if (r.type == REC_DEVICE) {
			if (r.dev != c->ndev)
				die("%s: devices out of order at %" PRIu64, path, pos);
			c->sizes[c->ndev++] = r.offset;
		} else if (r.dev >= c->ndev) {
			die("%s: record for unknown device %u at %" PRIu64, path, r.dev, pos);
		} else if (r.type == REC_WRITE) {
			if (r.offset > c->sizes[r.dev] || r.len > c->sizes[r.dev] - r.offset)
				die("%s: write past the device's end at %" PRIu64, path, pos);
			c->nwrites++;
		} else {
			c->nflushes++;
		}
		if (c->nrec == cap) {
			cap = cap ? cap * 2 : 1024;
			c->recs = realloc(c->recs, cap * sizeof(*c->recs));
			if (!c->recs)
				die("out of memory");
		}
		c->recs[c->nrec++] = r;
		pos = r.end;
	}
}

static void load_manifest(struct ctx *c, const char *path)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0, scap = 0, dcap = 0;
	struct mstate *cur = NULL;
	ssize_t n;

	if (!f)
		die("%s: %s", path, strerror(errno));
	while ((n = getline(&line, &cap, f)) >= 0) {
		unsigned long long a, b;

		if (n && line[n - 1] == '\n')
			line[--n] = '\0';
		if (cur) {
			if (strcmp(line, "end") == 0) {
				treelist_sort(&cur->list);
				cur = NULL;
			} else if (treelist_add(&cur->list, line)) {
				die("out of memory");
			}
		} else if (sscanf(line, "state %llu", &a) == 1) {
			if (c->nstates == scap) {
				scap = scap ? scap * 2 : 64;
				c->states = realloc(c->states, scap * sizeof(*c->states));
				if (!c->states)
					die("out of memory");
			}
			cur = &c->states[c->nstates++];
			memset(cur, 0, sizeof(*cur));
			cur->gen = a;
		} else if (sscanf(line, "durable %llu %llu", &a, &b) == 2) {
			if (c->ndur == dcap) {
				dcap = dcap ? dcap * 2 : 64;
				c->dur = realloc(c->dur, dcap * sizeof(*c->dur));
				if (!c->dur)
					die("out of memory");
			}
			c->dur[c->ndur].gen = a;
			c->dur[c->ndur++].pos = b;
		} else if (sscanf(line, "replays %llu %llu", &a, &b) == 2) {
			c->rep = realloc(c->rep, (c->nrep + 1) * sizeof(*c->rep));
			if (!c->rep)
				die("out of memory");
			c->rep[c->nrep].from = a;
			c->rep[c->nrep++].to = b;
		} else if (*line) {
			die("%s: unexpected line: %s", path, line);
		}
	}
	free(line);
	fclose(f);
	if (cur)
		c->nstates--; /* an unfinished block: the workload died writing it */
	if (!c->nstates || !c->ndur)
		die("%s: no states or no durable lines", path);
}

/* The last state block written for @gen, or NULL. */
static const struct mstate *state_for(const struct ctx *c, uint64_t gen)
{
	for (size_t i = c->nstates; i-- > 0;)
		if (c->states[i].gen == gen)
			return &c->states[i];
	return NULL;
}

/* The generation an image at @gen shows once its tree log is replayed. */
static uint64_t replayed_gen(const struct ctx *c, uint64_t gen)
{
	for (size_t i = 0; i < c->nrep; i++)
		if (c->rep[i].from == gen)
			return c->rep[i].to;
	return gen;
}

/* The newest generation durable once the log was @pos bytes long (0: none). */
static uint64_t durable_gen(const struct ctx *c, uint64_t pos)
{
	uint64_t gen = 0;

	for (size_t i = 0; i < c->ndur; i++)
		if (c->dur[i].pos <= pos && c->dur[i].gen > gen)
			gen = c->dur[i].gen;
	return gen;
}

/* Did a commit complete exactly when the log was @pos bytes long? */
static int is_durable_pos(const struct ctx *c, uint64_t pos)
{
	for (size_t i = 0; i < c->ndur; i++)
		if (c->dur[i].pos == pos)
			return 1;
	return 0;
}

/* ---- state files --------------------------------------------------------- */

static void copy_image(const char *src, const char *dst, uint64_t want_size)
{
	int in = open(src, O_RDONLY | O_CLOEXEC), out;
	struct stat st;
	uint8_t *buf;
	uint64_t off = 0;

	if (in < 0 || fstat(in, &st) < 0)
		die("%s: %s", src, strerror(errno));
	if (want_size && (uint64_t)st.st_size != want_size)
		die("%s: %" PRIu64 " bytes, but the log says the device had %" PRIu64, src,
		    (uint64_t)st.st_size, want_size);
	out = open(dst, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (out < 0)
		die("%s: %s", dst, strerror(errno));
	if (ioctl(out, FICLONE, in) == 0) {
		close(in);
		close(out);
		return;
	}
	if (ftruncate(out, st.st_size) < 0)
		die("%s: %s", dst, strerror(errno));
	buf = malloc(1 << 20);
	if (!buf)
		die("out of memory");
	while (off < (uint64_t)st.st_size) {
		off_t data = lseek(in, (off_t)off, SEEK_DATA);
		ssize_t n, k;

		if (data < 0 && errno == ENXIO)
			break; /* only a hole is left */
		if (data > (off_t)off)
			off = (uint64_t)data & ~(uint64_t)4095;
		n = pread(in, buf, 1 << 20, (off_t)off);
		if (n <= 0)
			die("%s: read error", src);
		for (k = 0; k < n && !buf[k]; k++)
			;
		if (k < n && pwrite(out, buf, (size_t)n, (off_t)off) != n)
			die("%s: %s", dst, strerror(errno));
		off += (uint64_t)n;
	}
	free(buf);
	close(in);
	close(out);
}

static void xpread(int fd, void *buf, uint64_t len, uint64_t off)
{
	if (pread(fd, buf, len, (off_t)off) != (ssize_t)len)
		die("reading a state file: %s", strerror(errno));
}

static void xpwrite(int fd, const void *buf, uint64_t len, uint64_t off)
{
	if (pwrite(fd, buf, len, (off_t)off) != (ssize_t)len)
		die("writing a state file: %s", strerror(errno));
}

/* Write @len bytes of record @ri's data from byte @from of it, keeping an undo entry. */
static void apply(struct ctx *c, struct journal *j, size_t ri, uint64_t from, uint64_t len)
{
	const struct rec *r = &c->recs[ri];
	struct undo *u;

	if (j->n == j->cap) {
		j->cap = j->cap ? j->cap * 2 : 256;
		j->v = realloc(j->v, j->cap * sizeof(*j->v));
		if (!j->v)
			die("out of memory");
	}
	u = &j->v[j->n++];
	u->rec = ri;
	u->dev = r->dev;
	u->off = r->offset + from;
	u->len = len;
	u->old = malloc(len ? len : 1);
	if (!u->old)
		die("out of memory");
	xpread(c->fds[r->dev], u->old, len, u->off);
	xpwrite(c->fds[r->dev], r->data + from, len, u->off);
}

/* Undo entries (newest first) until only those of records below @rec remain. */
static void rollback(struct ctx *c, struct journal *j, size_t rec)
{
	while (j->n && j->v[j->n - 1].rec >= rec) {
		struct undo *u = &j->v[--j->n];

		xpwrite(c->fds[u->dev], u->old, u->len, u->off);
		free(u->old);
	}
}

/* Forget undo entries of records below @rec (they will never be undone). */
static void forget(struct journal *j, size_t rec)
{
	size_t k = 0, i;

	while (k < j->n && j->v[k].rec < rec)
		free(j->v[k++].old);
	if (!k)
		return;
	for (i = k; i < j->n; i++)
		j->v[i - k] = j->v[i];
	j->n -= k;
}

/* ---- the devices of a state ----------------------------------------------- */

/* CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), initial value and final xor ~0. */
static uint32_t crc32c(const uint8_t *p, size_t len)
{
	uint32_t crc = ~0u;

	while (len--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
	}
	return ~crc;
}

struct super_view {
	int valid;
	uint64_t gen, devid, log_root, ndevices;
	uint8_t fsid[16];
};

/* The newest valid superblock copy of @fd, @size bytes (only the primary one with @primary). */
static void read_super(int fd, uint64_t size, int primary, struct super_view *sv)
{
	static const uint64_t at[3] = { SUPER_OFFSET, 64ull << 20, 256ull << 30 };
	uint8_t sb[SUPER_SIZE];

	memset(sv, 0, sizeof(*sv));
	for (int k = 0; k < (primary ? 1 : 3) && at[k] + SUPER_SIZE <= size; k++) {
		xpread(fd, sb, SUPER_SIZE, at[k]);
		if (memcmp(sb + SUPER_MAGIC_FIELD, "_BHRfS_M", 8) != 0 ||
		    get_le(sb + SUPER_BYTENR_FIELD, 8) != at[k])
			continue;
		if (get_le(sb + SUPER_CSUM_TYPE_FIELD, 2) == 0 &&
		    crc32c(sb + 32, SUPER_SIZE - 32) != (uint32_t)get_le(sb, 4))
			continue;
		/* as butter: a mirror counts only with the fsid of the first valid copy */
		if (sv->valid && (memcmp(sv->fsid, sb + SUPER_FSID_FIELD, 16) != 0 ||
				  get_le(sb + SUPER_GEN_FIELD, 8) <= sv->gen))
			continue;
		sv->valid = 1;
		sv->gen = get_le(sb + SUPER_GEN_FIELD, 8);
		sv->devid = get_le(sb + SUPER_DEVID_FIELD, 8);
		sv->log_root = get_le(sb + SUPER_LOG_ROOT_FIELD, 8);
		sv->ndevices = get_le(sb + SUPER_NUM_DEVICES_FIELD, 8);
		memcpy(sv->fsid, sb + SUPER_FSID_FIELD, 16);
	}
}

/*
 * The devices a scan finds among the state files @fds (rules at the top of
 * this file): butter's view, or with @primary the kernel's. m->n is 0 when
 * no device holds a valid superblock.
 */
static void scan_files(const struct ctx *c, const int *fds, int primary, struct members *m)
{
	struct super_view sv[MAX_DEVS];
	size_t d, e, best = SIZE_MAX;

	memset(m, 0, sizeof(*m));
	for (d = 0; d < c->ndev; d++) {
		read_super(fds[d], c->sizes[d], primary, &sv[d]);
		if (sv[d].valid && (best == SIZE_MAX || sv[d].gen > sv[best].gen))
			best = d;
	}
	if (best == SIZE_MAX)
		return;
	for (d = 0; d < c->ndev; d++) {
		int keep = sv[d].valid && memcmp(sv[d].fsid, sv[best].fsid, 16) == 0;

		/* two claim one devid: the newer superblock (the lower index on a tie) */
		for (e = 0; keep && e < c->ndev; e++)
			if (e != d && sv[e].valid && memcmp(sv[e].fsid, sv[d].fsid, 16) == 0 &&
			    sv[e].devid == sv[d].devid &&
			    (sv[e].gen > sv[d].gen || (sv[e].gen == sv[d].gen && e < d)))
				keep = 0;
		if (keep)
			m->gens[m->n] = sv[d].gen;
		if (keep)
			m->idx[m->n++] = d;
	}
	m->newest = best;
	m->gen = sv[best].gen;
	m->ndevices = sv[best].ndevices;
}

/* scan_files() of the current state. */
static void scan_members(const struct ctx *c, int primary, struct members *m)
{
	scan_files(c, c->fds, primary, m);
}

/*
 * More devices than the newest superblock counts hold a superblock of its
 * generation (a device no longer a member written at its commit)? Then
 * that number, else 0.
 */
static size_t excess_at_newest(const struct members *m)
{
	size_t n = 0;

	for (size_t k = 0; k < m->n; k++)
		n += m->gens[k] == m->gen;
	return n > m->ndevices ? n : 0;
}

static uint32_t set_bits(const struct members *m)
{
	uint32_t bits = 0;

	for (size_t i = 0; i < m->n; i++)
		bits |= 1u << m->idx[i];
	return bits;
}

/*
 * Count the state's device sets, butter's @m and the kernel's, with the
 * number of devices the newest superblock counts, among the distinct ones
 * seen; 1 if this one is new (the state is then also mounted by the kernel).
 */
static int note_set(struct ctx *c, const struct members *m)
{
	struct members km;
	uint64_t bits;
	size_t i;

	scan_members(c, 1, &km);
	bits = set_bits(m) | (uint64_t)set_bits(&km) << MAX_DEVS | m->ndevices << 32;
	for (i = 0; i < c->nsets; i++)
		if (c->sets[i] == bits)
			return 0;
	if (c->nsets == sizeof(c->sets) / sizeof(c->sets[0]))
		return 0;
	c->sets[c->nsets++] = bits;
	return 1;
}

/* "0,1,2/0,1:2" for @bits (butter's devices / the kernel's : devices counted), into @buf. */
static void format_set(uint64_t bits, char *buf, size_t cap)
{
	size_t len = 0;

	buf[0] = '\0';
	for (unsigned d = 0; d < 2 * MAX_DEVS && len + 8 < cap; d++) {
		if (d == MAX_DEVS)
			len += (size_t)snprintf(buf + len, cap - len, "/");
		if (bits & (1u << d))
			len += (size_t)snprintf(buf + len, cap - len, "%s%u",
						len && buf[len - 1] != '/' ? "," : "",
						d % MAX_DEVS);
	}
	snprintf(buf + len, cap - len, ":%llu", (unsigned long long)(bits >> 32));
}

/* Open options for @m's devices of @paths (paths[m->idx[0]] is the one to open). */
static void member_opts(const struct members *m, char *const *paths, const char **devs,
			struct butter_open_opts *o)
{
	for (size_t k = 1; k < m->n; k++)
		devs[k - 1] = paths[m->idx[k]];
	o->devices = devs;
	o->ndevices = m->n ? m->n - 1 : 0;
}

/* ---- checking one state --------------------------------------------------- */

static char *messages;
static size_t messages_len;

static void collect_message(void *arg, int level, const char *msg)
{
	size_t len = strlen(msg);
	char *m;

	(void)arg;
	(void)level;
	if (messages_len > 16384)
		return;
	m = realloc(messages, messages_len + len + 2);
	if (!m)
		return;
	messages = m;
	memcpy(messages + messages_len, msg, len);
	messages_len += len;
	messages[messages_len++] = '\n';
	messages[messages_len] = '\0';
}

/*
 * Run @argv with its output in @out (truncated) and return its exit status
 * (-1: not run). posix_spawn, not fork: forking a sanitizer build's big
 * address space costs a hundred milliseconds a call.
 */
static int run(char *const argv[], const char *out)
{
	posix_spawn_file_actions_t fa;
	pid_t pid;
	int status, ret;

	if (posix_spawn_file_actions_init(&fa))
		return -1;
	posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	posix_spawn_file_actions_adddup2(&fa, 1, 2);
	ret = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (ret)
		return -1;
	if (waitpid(pid, &status, 0) < 0)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void print_file_head(const char *path, int lines)
{
	FILE *f = fopen(path, "r");
	char buf[512];

	if (!f)
		return;
	while (lines-- > 0 && fgets(buf, sizeof(buf), f))
		fprintf(stderr, "    %s", buf);
	fclose(f);
}

/* Attach @path (read-only unless @writable) to a free loop device; its name goes to @loopdev. */
static int loop_attach(const char *path, int writable, const char *out, char *loopdev, size_t cap)
{
	char *argv[] = { "losetup", "--find", "--show", "--read-only", (char *)path, NULL };
	FILE *f;
	int ok;

	if (writable) {
		argv[3] = (char *)path;
		argv[4] = NULL;
	}
	if (run(argv, out) != 0)
		return -1;
	f = fopen(out, "r");
	ok = f && fgets(loopdev, (int)cap, f);
	if (f)
		fclose(f);
	if (!ok)
		return -1;
	loopdev[strcspn(loopdev, "\n")] = '\0';
	return 0;
}

/* Make the kernel forget the device (the next state reuses the fsid), then detach it. */
static void loop_detach(char *loopdev, const char *out)
{
	char *forget[] = { "btrfs", "device", "scan", "--forget", loopdev, NULL };
	char *detach[] = { "losetup", "-d", loopdev, NULL };

	run(forget, out);
	if (run(detach, out) != 0)
		die("cannot detach %s", loopdev);
}

/* Does the newest primary superblock point at a tree log? */
static int has_tree_log(const struct ctx *c)
{
	struct super_view sv;
	struct members m;

	scan_members(c, 1, &m);
	if (!m.n)
		return 0;
	read_super(c->fds[m.newest], c->sizes[m.newest], 1, &sv);
	return sv.log_root != 0;
}

/* Copy every state image to WORKDIR/TAG-N.img; the paths go to @paths. */
static void copy_state(struct ctx *c, const char *tag, char paths[][4400])
{
	for (size_t d = 0; d < c->ndev; d++) {
		snprintf(paths[d], 4400, "%s/%s-%zu.img", c->workdir, tag, d);
		copy_image(c->paths[d], paths[d], 0);
	}
}

static void remove_copies(const struct ctx *c, char paths[][4400])
{
	for (size_t d = 0; d < c->ndev; d++)
		unlink(paths[d]);
}

/* Run btrfs check --readonly on @dev (its other devices attached); 1 if it is clean. */
static int run_check(struct ctx *c, const char *dev, const char *out, const char *what)
{
	char *chk[] = { "btrfs", "check", "--readonly", (char *)dev, NULL };
	int ret;

	c->checked++;
	ret = run(chk, out);
	if (ret == 0)
		return 1;
	fprintf(stderr, "FAIL %s: btrfs check --readonly exits %d:\n", what, ret);
	print_file_head(out, 25);
	return 0;
}

/*
 * Which of @loops[0..n) a mounted btrfs uses (listed in /sys/fs/btrfs/ * /devices/:
 * by fsid, or by the temporary fsid the kernel gives a single-device filesystem
 * whose fsid another device also holds); bit k: loops[k].
 */
static uint32_t kernel_devices(char loops[][128], size_t n)
{
	DIR *top = opendir("/sys/fs/btrfs");
	struct dirent *e;
	struct stat st;
	uint32_t used = 0;

	while (top && (e = readdir(top)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		for (size_t k = 0; k < n; k++) {
			char p[2400];
			const char *name = strrchr(loops[k], '/');

			snprintf(p, sizeof(p), "/sys/fs/btrfs/%s/devices/%s", e->d_name,
				 name ? name + 1 : loops[k]);
			if (lstat(p, &st) == 0)
				used |= 1u << k;
		}
	}
	if (top)
		closedir(top);
	return used;
}

/*
 * Mount the state read-only with the kernel and compare with the manifest's
 * state for the newest primary superblock's generation (the kernel reads
 * only primary copies), given the devices of its scan (scan_members). A
 * multi-device state is also checked here with btrfs check, which needs the
 * devices as block devices: before the mount; but when more devices hold a
 * superblock of the filesystem than the newest one counts (a removed device
 * not wiped yet), after it, with only the devices the kernel took (btrfs
 * check would count the other's size; the kernel drops a device its chunk
 * tree does not list). A state with a tree log is mounted from writable
 * copies: the kernel replays the log.
 */
static int kernel_agrees(struct ctx *c, const char *what)
{
	char out[4200], loops[MAX_DEVS][128], opts[4096], *argv[8];
	static char copies[MAX_DEVS][4400];
	uint64_t gen;
	const struct mstate *want;
	struct treelist got;
	struct members km;
	size_t d, nloops = 0;
	uint32_t used = 0;
	int ret, ok = 0, log = has_tree_log(c), extra;

	snprintf(out, sizeof(out), "%s/cmd.out", c->workdir);
	scan_members(c, 1, &km); /* what the kernel reads: primary superblocks */
	if (!km.n) {
		fprintf(stderr, "FAIL %s: no device holds a valid primary superblock\n", what);
		return 0;
	}
	extra = km.n > km.ndevices;
	gen = km.gen;
	if (log) {
		gen = replayed_gen(c, gen);
		copy_state(c, "kernel", copies);
	}
	want = state_for(c, gen);
	for (d = 0; d < km.n; d++, nloops++) {
		const char *img = log ? copies[km.idx[d]] : c->paths[km.idx[d]];

		if (loop_attach(img, log, out, loops[d], sizeof(loops[d]))) {
			fprintf(stderr, "FAIL %s: losetup failed\n", what);
			print_file_head(out, 5);
			goto detach;
		}
	}
	if (km.n > 1 && c->check && !extra && !run_check(c, loops[0], out, what))
		goto detach;
	snprintf(opts, sizeof(opts), "ro,noatime");
	for (d = 1; d < km.n; d++)
		snprintf(opts + strlen(opts), sizeof(opts) - strlen(opts), ",device=%s", loops[d]);
	argv[0] = "mount";
	argv[1] = "-t";
	argv[2] = "btrfs";
	argv[3] = "-o";
	argv[4] = opts;
	argv[5] = loops[0];
	argv[6] = c->mnt;
	argv[7] = NULL;
	ret = run(argv, out);
	if (ret != 0) {
		fprintf(stderr, "FAIL %s: the kernel does not mount it (generation %" PRIu64 ")\n",
			what, gen);
		print_file_head(out, 5);
		goto detach;
	}
	ret = treelist_posix(c->mnt, &got);
	if (ret)
		fprintf(stderr, "FAIL %s: walking the kernel mount: %s\n", what, strerror(-ret));
	else if (!want)
		fprintf(stderr, "FAIL %s: the kernel shows generation %" PRIu64
				", which the manifest does not know\n", what, gen);
	else if (treelist_diff(&want->list, &got, "  kernel", 10))
		fprintf(stderr, "FAIL %s: the kernel's tree differs from the manifest's "
				"generation %" PRIu64 "\n", what, want->gen);
	else
		ok = 1;
	treelist_free(&got);
	if (extra)
		used = kernel_devices(loops, km.n);
	argv[0] = "umount";
	argv[1] = c->mnt;
	argv[2] = NULL;
	if (run(argv, out) != 0)
		die("cannot unmount %s", c->mnt);
	if (ok && extra) {
		size_t first = SIZE_MAX, dropped = 0;

		/* only what the kernel took stays attached for btrfs check */
		for (d = 0; d < km.n; d++) {
			if (used & (1u << d)) {
				if (first == SIZE_MAX)
					first = d;
				continue;
			}
			loop_detach(loops[d], out);
			loops[d][0] = '\0';
			dropped++;
		}
		if (first == SIZE_MAX) {
			fprintf(stderr, "FAIL %s: the kernel's sysfs lists none of its devices\n",
				what);
			ok = 0;
		} else {
			c->stale_dropped += dropped > 0;
			if (c->check && !run_check(c, loops[first], out, what))
				ok = 0;
		}
	}
detach:
	while (nloops-- > 0)
		if (loops[nloops][0])
			loop_detach(loops[nloops], out);
	if (log)
		remove_copies(c, copies);
	return ok;
}

/*
 * --degraded: open the state read-only without one of its devices @m (the
 * (index % devices)-th) and compare with the manifest's state for the
 * generation found. 1 if it agrees.
 */
static int degraded_agrees(struct ctx *c, const struct members *m, uint64_t dgen,
			   const char *what, int show)
{
	struct butter_open_opts o = { 0 };
	const char *devs[MAX_DEVS], *first = NULL;
	size_t miss = m->idx[c->index % m->n], nd = 0, k, d;
	struct butter_fs *fs = NULL;
	struct butter_info info;
	const struct mstate *want;
	struct treelist got = { 0 };
	int ret, ok = 0;

	for (k = 0; k < m->n; k++) {
		d = m->idx[k];
		if (d == miss)
			continue;
		if (!first)
			first = c->paths[d];
		else
			devs[nd++] = c->paths[d];
	}
	o.devices = devs;
	o.ndevices = nd;
	o.flags = BUTTER_OPEN_RDONLY | BUTTER_OPEN_DEGRADED;
	o.log = collect_message;
	o.log_level = BUTTER_LOG_WARNING;
	messages_len = 0;
	if (messages)
		messages[0] = '\0';
	c->deg_opened++;
	ret = butter_open(first, &o, &fs);
	if (ret) {
		if (show)
			fprintf(stderr, "FAIL %s: butter cannot open it without device %zu: %s\n%s",
				what, miss, strerror(-ret), messages ? messages : "");
		return 0;
	}
	butter_get_info(fs, &info);
	want = state_for(c, info.generation);
	if (info.generation < dgen) {
		if (show)
			fprintf(stderr, "FAIL %s: without device %zu: generation %" PRIu64 " but %"
					PRIu64 " was durable\n", what, miss, info.generation, dgen);
	} else if (!want) {
		if (show)
			fprintf(stderr, "FAIL %s: without device %zu: generation %" PRIu64
					" is not in the manifest\n", what, miss, info.generation);
	} else if ((ret = treelist_butter(fs, &got)) != 0) {
		if (show)
			fprintf(stderr, "FAIL %s: without device %zu: reading the tree: %s\n%s",
				what, miss, strerror(-ret), messages ? messages : "");
	} else if (treelist_diff(&want->list, &got, "  degraded", show ? 10 : 0)) {
		if (show)
			fprintf(stderr, "FAIL %s: without device %zu: the tree differs from "
					"the manifest's generation %" PRIu64 "\n", what, miss,
				want->gen);
	} else {
		ok = 1;
		c->deg_agreed++;
	}
	treelist_free(&got);
	butter_close(fs);
	return ok;
}

/* One commit that changes no file: the label set to what it is. */
static int commit_once(struct butter_fs *fs)
{
	struct butter_info info;
	int ret = butter_get_info(fs, &info);

	return ret ? ret : butter_set_label(fs, info.label);
}

/*
 * Open @m's devices of @paths (read-only with @flags) and compare with @want;
 * a read-write handle then commits once. 1 if equal (and committed).
 */
static int open_and_compare(char *const *paths, const struct members *m, unsigned flags,
			    const struct mstate *want, const char *what, const char *how, int show)
{
	struct butter_open_opts o = { 0 };
	const char *devs[MAX_DEVS];
	struct butter_fs *fs = NULL;
	struct treelist got = { 0 };
	int ret, ok = 0;

	member_opts(m, paths, devs, &o);
	o.flags = flags;
	o.log = collect_message;
	o.log_level = BUTTER_LOG_INFO;
	ret = butter_open(paths[m->idx[0]], &o, &fs);
	if (ret) {
		if (show)
			fprintf(stderr, "FAIL %s: %s: butter cannot open it: %s\n%s", what, how,
				strerror(-ret), messages ? messages : "");
		return 0;
	}
	ret = treelist_butter(fs, &got);
	if (ret) {
		if (show)
			fprintf(stderr, "FAIL %s: %s: reading the tree: %s\n%s", what, how,
				strerror(-ret), messages ? messages : "");
	} else if (treelist_diff(&want->list, &got, "  read-write", show ? 10 : 0)) {
		if (show)
			fprintf(stderr, "FAIL %s: %s: the tree differs from the manifest's "
					"generation %" PRIu64 "\n", what, how, want->gen);
	} else if (!(flags & BUTTER_OPEN_RDONLY) && (ret = commit_once(fs)) != 0) {
		if (show)
			fprintf(stderr, "FAIL %s: %s: a commit (the label set again) fails: %s\n%s",
				what, how, strerror(-ret), messages ? messages : "");
	} else {
		ok = 1;
	}
	treelist_free(&got);
	butter_close(fs);
	return ok;
}

/*
 * After a read-write open of the copies @copies: no more devices hold a
 * superblock of the newest generation than it counts (a device that is no
 * longer a member must not be written one). 1 if so.
 */
static int rw_devices_sane(struct ctx *c, char copies[][4400], const char *what, int show)
{
	int fds[MAX_DEVS];
	struct members m;
	size_t d, excess;

	for (d = 0; d < c->ndev; d++) {
		fds[d] = open(copies[d], O_RDONLY | O_CLOEXEC);
		if (fds[d] < 0)
			die("%s: %s", copies[d], strerror(errno));
	}
	scan_files(c, fds, 0, &m);
	for (d = 0; d < c->ndev; d++)
		close(fds[d]);
	excess = excess_at_newest(&m);
	if (excess && show)
		fprintf(stderr, "FAIL %s: after a read-write open, %zu devices hold a superblock of "
				"generation %" PRIu64 ", which counts %" PRIu64 "\n", what, excess,
			m.gen, m.ndevices);
	return !excess;
}

/*
 * --rw-check: open writable copies of the state read-write (log replay,
 * unfinished subvolume drops, orphans), compare, close, btrfs check, and
 * compare once more read-only. @gen: the generation the read-only open saw.
 */
static int rw_agrees(struct ctx *c, const struct members *m, uint64_t gen, const char *what,
		     int show)
{
	static char copies[MAX_DEVS][4400];
	char *cp[MAX_DEVS];
	int log = has_tree_log(c), ok = 0;
	const struct mstate *want = state_for(c, log ? replayed_gen(c, gen) : gen);

	c->rw_opened++;
	if (!want) {
		if (show)
			fprintf(stderr, "FAIL %s: its log replays to generation %" PRIu64
					", which the manifest does not know\n", what,
				replayed_gen(c, gen));
		return 0;
	}
	copy_state(c, "rw", copies);
	for (size_t d = 0; d < c->ndev; d++)
		cp[d] = copies[d];
	messages_len = 0;
	if (messages)
		messages[0] = '\0';
	if (!open_and_compare(cp, m, 0, want, what, "read-write", show))
		goto out;
	if (!rw_devices_sane(c, copies, what, show))
		goto out;
	if (messages && strstr(messages, "dropping deleted subvolume"))
		c->rw_drops++;
	if (log)
		c->rw_logs++;
	if (c->check && m->n == 1) {
		char out[4200], *argv[] = { "btrfs", "check", "--readonly", cp[m->idx[0]], NULL };

		snprintf(out, sizeof(out), "%s/check.out", c->workdir);
		if (run(argv, out) != 0) {
			if (show) {
				fprintf(stderr, "FAIL %s: after a read-write open, btrfs check "
						"--readonly fails:\n", what);
				print_file_head(out, 25);
			}
			goto out;
		}
	}
	if (!open_and_compare(cp, m, BUTTER_OPEN_RDONLY, want, what,
			      "read-only after the read-write open", show))
		goto out;
	ok = 1;
	c->rw_agreed++;
out:
	remove_copies(c, copies);
	return ok;
}

static void save_state(struct ctx *c)
{
	char dst[4200];

	if (!c->save_failed || c->saved)
		return;
	c->saved = 1;
	mkdir(c->save_failed, 0755);
	for (size_t d = 0; d < c->ndev; d++) {
		snprintf(dst, sizeof(dst), "%s/state-%zu.img", c->save_failed, d);
		copy_image(c->paths[d], dst, 0);
	}
	fprintf(stderr, "    (images saved in %s)\n", c->save_failed);
}

/*
 * Check the current state. @pos: the log position every applied record
 * lies below (durable commits up to there must survive). @what describes it.
 */
static void verify(struct ctx *c, enum kind kind, uint64_t pos, const char *what)
{
	struct butter_open_opts o = { 0 };
	const char *devs[MAX_DEVS];
	struct butter_fs *fs = NULL;
	struct butter_info info;
	const struct mstate *want;
	struct treelist got = { 0 };
	struct members m;
	uint64_t dgen;
	int ret, ok = 0, show, new_set;

	c->index++;
	if (kind == ST_PREFIX)
		c->n_prefix++;
	else if (kind == ST_TORN)
		c->n_torn++;
	else if (kind == ST_REORDER)
		c->n_reorder++;
	if (c->dry)
		return;
	show = c->failed < c->show;
	info.generation = 0;
	scan_members(c, 0, &m);
	new_set = note_set(c, &m);
	if (!m.n) {
		if (show)
			fprintf(stderr, "FAIL %s: no device holds a valid superblock\n", what);
		goto out;
	}
	if (excess_at_newest(&m)) {
		if (show)
			fprintf(stderr, "FAIL %s: %zu devices hold a superblock of generation %" PRIu64
					", which counts %" PRIu64 "\n", what, excess_at_newest(&m),
				m.gen, m.ndevices);
		goto out;
	}
	member_opts(&m, c->paths, devs, &o);
	o.flags = BUTTER_OPEN_RDONLY;
	o.log = collect_message;
	o.log_level = BUTTER_LOG_WARNING;
	messages_len = 0;
	if (messages)
		messages[0] = '\0';
	dgen = kind == ST_VERIFY ? durable_gen(c, UINT64_MAX) : durable_gen(c, pos);
	ret = butter_open(c->paths[m.idx[0]], &o, &fs);
	if (ret) {
		if (show)
			fprintf(stderr, "FAIL %s: butter cannot open it: %s\n%s", what,
				strerror(-ret), messages ? messages : "");
		goto out;
	}
	butter_get_info(fs, &info);
	if (info.generation < dgen) {
		if (show)
			fprintf(stderr, "FAIL %s: generation %" PRIu64 " but %" PRIu64
					" was durable: synced changes are lost\n",
				what, info.generation, dgen);
		goto out;
	}
	want = state_for(c, info.generation);
	if (!want) {
		if (show)
			fprintf(stderr, "FAIL %s: generation %" PRIu64 " is not in the manifest\n",
				what, info.generation);
		goto out;
	}
	ret = treelist_butter(fs, &got);
	if (ret) {
		if (show)
			fprintf(stderr, "FAIL %s: reading the tree: %s\n%s", what, strerror(-ret),
				messages ? messages : "");
		goto out;
	}
	if (treelist_diff(&want->list, &got, "  butter", show ? 10 : 0)) {
		if (show)
			fprintf(stderr, "FAIL %s: the tree differs from the manifest's generation %"
					PRIu64 "\n", what, info.generation);
		goto out;
	}
	butter_close(fs);
	fs = NULL;
	if (c->check && m.n == 1) {
		char out[4200], *argv[] = { "btrfs", "check", "--readonly", c->paths[m.idx[0]],
					    NULL };

		snprintf(out, sizeof(out), "%s/check.out", c->workdir);
		c->checked++;
		ret = run(argv, out);
		if (ret != 0) {
			if (show) {
				fprintf(stderr, "FAIL %s: btrfs check --readonly exits %d:\n", what,
					ret);
				print_file_head(out, 25);
			}
			goto out;
		}
	}
	if (c->kernel_every &&
	    (c->index % c->kernel_every == c->kernel_every / 2 || kind == ST_VERIFY || new_set)) {
		c->kmounted++;
		if (!kernel_agrees(c, what))
			goto out;
		c->kagreed++;
	}
	if (c->degraded && m.n > 1) {
		int hard = c->degraded == 1 || c->at_commit;

		c->deg_commits += (uint64_t)c->at_commit;
		if (!degraded_agrees(c, &m, dgen, what, show && hard)) {
			if (hard)
				goto out;
			c->deg_tolerated++;
		}
	}
	if (c->rw_every && (c->index % c->rw_every == c->rw_every / 2 || new_set) &&
	    !rw_agrees(c, &m, info.generation, what, show))
		goto out;
	ok = 1;
	if (info.generation == dgen)
		c->durable_bytes += want->list.file_bytes;
out:
	treelist_free(&got);
	if (fs)
		butter_close(fs);
	if (ok) {
		c->consistent++;
		if (c->verbose)
			printf("ok %s: generation %" PRIu64 "\n", what, info.generation);
	} else {
		if (!show)
			fprintf(stderr, "FAIL %s\n", what);
		save_state(c);
		c->failed++;
	}
}

/* ---- enumerating the states ---------------------------------------------- */

static int budget_left(const struct ctx *c)
{
	return !c->max_states || c->index < c->max_states;
}

/* Sector pieces of write @ri: how many --sector-aligned pieces it spans. */
static uint64_t pieces(const struct ctx *c, const struct rec *r, uint64_t k, uint64_t *from,
		       uint64_t *len)
{
	uint64_t first_end = (r->offset / c->sector + 1) * c->sector - r->offset;
	uint64_t n;

	if (first_end >= r->len)
		n = 1;
	else
		n = 1 + (r->len - first_end + c->sector - 1) / c->sector;
	if (from) {
		uint64_t s = k == 0 ? 0 : first_end + (k - 1) * c->sector;
		uint64_t e = k == 0 ? first_end : s + c->sector;

		if (e > r->len)
			e = r->len;
		*from = s;
		*len = e - s;
	}
	return n;
}

/* The torn variants of write @ri over the prefix state before it. */
static void torn_variants(struct ctx *c, size_t ri, uint64_t pos)
{
	const struct rec *r = &c->recs[ri];
	uint64_t np = pieces(c, r, 0, NULL, NULL), k, from, len;
	char what[256];

	if (np < 2)
		return;
	for (unsigned v = 0; v < c->torn && budget_left(c); v++) {
		struct rng g = rng_for(c, ri, v, 1);
		uint64_t keep = 1 + rng_next(&g) % (np - 1), kept = 0;

		if (v > 0 && np < 3)
			break; /* a two-piece write has one torn state */
		if (!c->dry) {
			for (k = 0; k < np; k++) {
				int take = v == 0 ? k < keep : (rng_next(&g) & 1);

				if (v > 0 && k == np - 1 && kept == np - 1)
					take = 0; /* never the whole write */
				if (v > 0 && k == np - 1 && kept == 0)
					take = 1; /* never none of it */
				if (!take)
					continue;
				pieces(c, r, k, &from, &len);
				apply(c, &c->tmp_j, ri, from, len);
				kept++;
			}
		}
		snprintf(what, sizeof(what), "torn write #%zu (%" PRIu64 " bytes at %" PRIu64
			 " on device %u): %s of %" PRIu64 " sectors", ri, r->len, r->offset, r->dev,
			 v == 0 ? "a prefix" : "a subset", np);
		verify(c, ST_TORN, pos, what);
		if (!c->dry)
			rollback(c, &c->tmp_j, 0);
	}
}

/* Is write @i still unflushed at record @n (no flush of its device in between)? */
static int pending(const struct ctx *c, size_t i, const size_t *last_flush)
{
	const struct rec *r = &c->recs[i];

	return r->type == REC_WRITE && (last_flush[r->dev] == SIZE_MAX || last_flush[r->dev] < i);
}

/* Reordered states at @n: records below @p0 all applied, any subset of the pending ones. */
static void reorder_variants(struct ctx *c, size_t n, size_t p0, const size_t *last_flush)
{
	size_t npend = 0, i;
	char what[256];

	for (i = p0; i < n; i++)
		npend += pending(c, i, last_flush);
	if (npend < 2)
		return;
	if (!c->dry)
		rollback(c, &c->main_j, p0);
	for (unsigned v = 0; v < c->reorder && budget_left(c); v++) {
		struct rng g = rng_for(c, n, v, 2);
		size_t kept = 0;

		if (!c->dry) {
			for (i = p0; i < n; i++) {
				const struct rec *r = &c->recs[i];

				if (r->type != REC_WRITE)
					continue;
				if (pending(c, i, last_flush) && !(rng_next(&g) & 1))
					continue;
				apply(c, &c->tmp_j, i, 0, r->len);
				kept += pending(c, i, last_flush);
			}
		}
		snprintf(what, sizeof(what),
			 "reordered before record #%zu: %zu of the %zu unflushed writes since #%zu "
			 "(variant %u)", n, kept, npend, p0, v);
		verify(c, ST_REORDER, p0 ? c->recs[p0 - 1].end : LOG_HEADER, what);
		if (!c->dry)
			rollback(c, &c->tmp_j, 0);
	}
	if (!c->dry)
		for (i = p0; i < n; i++)
			if (c->recs[i].type == REC_WRITE)
				apply(c, &c->main_j, i, 0, c->recs[i].len);
}

static void walk(struct ctx *c)
{
	size_t last_flush[MAX_DEVS], n, p0 = 0;
	char what[256];

	for (n = 0; n < MAX_DEVS; n++)
		last_flush[n] = SIZE_MAX;
	c->index = 0;
	c->n_prefix = c->n_torn = c->n_reorder = 0;
	for (n = 0; n <= c->nrec && budget_left(c); n++) {
		const struct rec *r = n < c->nrec ? &c->recs[n] : NULL;
		uint64_t pos = n ? c->recs[n - 1].end : LOG_HEADER;

		if (n == 0 || c->recs[n - 1].type == REC_WRITE) {
			size_t k = n;

			while (k < c->nrec && c->recs[k].type == REC_FLUSH)
				k++;
			c->at_commit = n == 0 || (k > n && is_durable_pos(c, c->recs[k - 1].end));
			snprintf(what, sizeof(what), "prefix of %zu records%s", n,
				 c->at_commit ? " (a commit completed)" : "");
			verify(c, ST_PREFIX, pos, what);
			c->at_commit = 0;
		}
		while (p0 < n && !pending(c, p0, last_flush))
			p0++;
		if (r && r->type == REC_WRITE)
			torn_variants(c, n, pos);
		if (!r || r->type == REC_FLUSH)
			reorder_variants(c, n, p0, last_flush);
		if (!r)
			break;
		if (r->type == REC_WRITE && !c->dry)
			apply(c, &c->main_j, n, 0, r->len);
		if (r->type == REC_FLUSH) {
			last_flush[r->dev] = n;
			while (p0 <= n && !pending(c, p0, last_flush))
				p0++;
			if (!c->dry)
				forget(&c->main_j, p0);
		}
	}
}

static int usage(void)
{
	fprintf(stderr,
		"usage: crashreplay [OPTIONS] LOG MANIFEST IMAGE...\n"
		"       crashreplay --verify [OPTIONS] MANIFEST IMAGE...\n"
		"  --work DIR        where the state images go (default $TMPDIR or /tmp)\n"
		"  --seed N          seed of the torn and reordered choices (1)\n"
		"  --torn N          torn variants per write (2)\n"
		"  --reorder N       reordered variants per flush (3)\n"
		"  --sector BYTES    tear granularity (4096)\n"
		"  --no-check        skip btrfs check\n"
		"  --kernel N        mount about N states with the kernel (0)\n"
		"  --rw-check N      open about N states read-write, on copies (0)\n"
		"  --degraded        open multi-device states without one device too\n"
		"  --degraded-commits  the same, required only where a commit completed\n"
		"  --max-states N    stop after N states\n"
		"  --show N          details for the first N failures (5)\n"
		"  --save-failed DIR keep the images of the first failing state\n"
		"  -v                a line per state\n");
	return 2;
}

int main(int argc, char **argv)
{
	struct ctx c;
	const char *log_path = NULL, *manifest;
	char tmpl[4200];
	int a = 1, verify_mode = 0;
	size_t d;

	memset(&c, 0, sizeof(c));
	c.seed = 1;
	c.torn = 2;
	c.reorder = 3;
	c.show = 5;
	c.sector = 4096;
	c.check = 1;
	c.workdir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	for (; a < argc && argv[a][0] == '-'; a++) {
		const char *o = argv[a];
		int has = a + 1 < argc;

		if (strcmp(o, "--verify") == 0)
			verify_mode = 1;
		else if (strcmp(o, "--no-check") == 0)
			c.check = 0;
		else if (strcmp(o, "-v") == 0)
			c.verbose = 1;
		else if (strcmp(o, "--work") == 0 && has)
			c.workdir = argv[++a];
		else if (strcmp(o, "--seed") == 0 && has)
			c.seed = strtoull(argv[++a], NULL, 0);
		else if (strcmp(o, "--torn") == 0 && has)
			c.torn = (unsigned)strtoul(argv[++a], NULL, 0);
		else if (strcmp(o, "--reorder") == 0 && has)
			c.reorder = (unsigned)strtoul(argv[++a], NULL, 0);
		else if (strcmp(o, "--sector") == 0 && has)
			c.sector = strtoull(argv[++a], NULL, 0);
		else if (strcmp(o, "--kernel") == 0 && has)
			c.ksample = (unsigned)strtoul(argv[++a], NULL, 0);
		else if (strcmp(o, "--rw-check") == 0 && has)
			c.rwsample = (unsigned)strtoul(argv[++a], NULL, 0);
		else if (strcmp(o, "--degraded") == 0)
			c.degraded = 1;
		else if (strcmp(o, "--degraded-commits") == 0)
			c.degraded = 2;
		else if (strcmp(o, "--max-states") == 0 && has)
			c.max_states = strtoull(argv[++a], NULL, 0);
		else if (strcmp(o, "--show") == 0 && has)
			c.show = (unsigned)strtoul(argv[++a], NULL, 0);
		else if (strcmp(o, "--save-failed") == 0 && has)
			c.save_failed = argv[++a];
		else
			return usage();
	}
	if (c.sector < 512 || (c.sector & (c.sector - 1)))
		die("--sector must be a power of two, at least 512");
	if (!verify_mode) {
		if (argc - a < 3)
			return usage();
		log_path = argv[a++];
	} else if (argc - a < 2) {
		return usage();
	}
	manifest = argv[a++];
	if (log_path)
		load_log(&c, log_path);
	else
		c.ndev = (size_t)(argc - a);
	load_manifest(&c, manifest);
	if ((size_t)(argc - a) > c.ndev || argc == a)
		die("the log names %zu device(s) but %d image(s) were given", c.ndev, argc - a);

	snprintf(tmpl, sizeof(tmpl), "%s/crashreplay-XXXXXX", c.workdir);
	if (!mkdtemp(tmpl))
		die("%s: %s", tmpl, strerror(errno));
	c.workdir = tmpl;
	snprintf(c.mnt, sizeof(c.mnt), "%s/mnt", tmpl);
	if (c.ksample && mkdir(c.mnt, 0755) < 0)
		die("%s: %s", c.mnt, strerror(errno));
	for (d = 0; d < c.ndev; d++) {
		char p[4300];

		if (verify_mode) {
			c.paths[d] = strdup(argv[a + d]);
		} else {
			snprintf(p, sizeof(p), "%s/state-%zu.img", tmpl, d);
			if (d < (size_t)(argc - a))
				copy_image(argv[a + d], p, c.sizes[d]);
			c.paths[d] = strdup(p);
		}
		c.fds[d] = open(c.paths[d], (verify_mode ? O_RDONLY : O_RDWR | O_CREAT) | O_CLOEXEC,
				0600);
		if (c.fds[d] < 0)
			die("%s: %s", c.paths[d], strerror(errno));
		if (!verify_mode && d >= (size_t)(argc - a) &&
		    ftruncate(c.fds[d], (off_t)c.sizes[d]) < 0) /* a device that joined later */
			die("%s: %s", c.paths[d], strerror(errno));
		if (verify_mode) {
			off_t end = lseek(c.fds[d], 0, SEEK_END); /* files and block devices */

			if (end < 0)
				die("%s: %s", c.paths[d], strerror(errno));
			c.sizes[d] = (uint64_t)end;
		}
	}

	if (verify_mode) {
		if (c.ksample)
			c.kernel_every = 1;
		verify(&c, ST_VERIFY, UINT64_MAX, "the image");
	} else {
		c.dry = 1;
		walk(&c);
		c.total = c.index;
		c.dry = 0;
		if (c.ksample)
			c.kernel_every = c.total / c.ksample ? c.total / c.ksample : 1;
		if (c.rwsample)
			c.rw_every = c.total / c.rwsample ? c.total / c.rwsample : 1;
		walk(&c);
	}

	if (c.nsets > 1) {
		printf("device sets (butter's/the kernel's:counted):");
		for (size_t i = 0; i < c.nsets; i++) {
			char set[200];

			format_set(c.sets[i], set, sizeof(set));
			printf(" %s", set);
		}
		printf("\n");
	}
	printf("crashreplay: records %zu (writes %" PRIu64 ", flushes %" PRIu64 "); states %" PRIu64
	       " (prefix %" PRIu64 ", torn %" PRIu64 ", reordered %" PRIu64 "); consistent %" PRIu64
	       "; failed %" PRIu64 "; btrfs-check %" PRIu64 "; kernel-mounted %" PRIu64
	       ", agreed %" PRIu64 "; durable-bytes-verified %" PRIu64 "; rw-opened %" PRIu64
	       ", agreed %" PRIu64 ", drops-finished %" PRIu64 ", logs-replayed %" PRIu64
	       "; degraded-opened %" PRIu64 ", agreed %" PRIu64 ", tolerated %" PRIu64
	       ", at-commits %" PRIu64 "; device-sets %zu, stale-dropped %" PRIu64 "\n",
	       c.nrec, c.nwrites, c.nflushes, c.index, c.n_prefix, c.n_torn, c.n_reorder,
	       c.consistent, c.failed, c.checked, c.kmounted, c.kagreed, c.durable_bytes,
	       c.rw_opened, c.rw_agreed, c.rw_drops, c.rw_logs, c.deg_opened, c.deg_agreed,
	       c.deg_tolerated, c.deg_commits, c.nsets, c.stale_dropped);

	rollback(&c, &c.tmp_j, 0);
	forget(&c.main_j, SIZE_MAX);
	free(c.main_j.v);
	free(c.tmp_j.v);
	for (d = 0; d < c.ndev; d++) {
		close(c.fds[d]);
		if (!verify_mode)
			unlink(c.paths[d]);
		free(c.paths[d]);
	}
	{
		char p[4300];

		snprintf(p, sizeof(p), "%s/check.out", tmpl);
		unlink(p);
		snprintf(p, sizeof(p), "%s/cmd.out", tmpl);
		unlink(p);
		rmdir(c.mnt);
		rmdir(tmpl);
	}
	for (size_t i = 0; i < c.nstates; i++)
		treelist_free(&c.states[i].list);
	free(c.states);
	free(c.dur);
	free(c.rep);
	free(c.recs);
	free(messages);
	return c.failed ? 1 : 0;
}
