/*
 * workload.c — a seeded random sequence of file operations applied both to a
 * btrfs image through libbutter and to a reference directory on the host.
 * One tool for the differential tests (tests/integration/test_write_workload.py:
 * the caller checks the image with btrfs check, mounts it with the kernel and
 * compares both trees) and for the power-cut and fault tests
 * (tests/integration/test_crash.py, test_faults.py, bench/reliability.sh:
 * the record log and the manifest go to tests/tools/crashreplay.c).
 *
 * usage: butter-workload [OPTIONS] IMAGE REFDIR SEED OPS [SYNC_EVERY]
 * (BUTTER_WORKLOAD_TRACE=1 in the environment: each fallocate and clone with
 * its arguments and both results on stderr)
 *
 * Every operation is first applied to the reference with POSIX calls; the
 * library must then succeed or fail exactly as the kernel did (same errno),
 * otherwise the program stops with exit status 1 and says which step. Paths
 * are kept in a small pool so that operations collide (renames over existing
 * names, unlinks of hard links, writes to renamed files...).
 *
 * fallocate (allocate, KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE, and refused modes)
 * and clone (FICLONERANGE: aligned and unaligned ranges, to the end of the
 * source, within one file and across files) need a reference directory on
 * btrfs, where the kernel's answers are btrfs's own: only the default profile
 * (full) has them.
 *
 * Options:
 *   --device DEV      a further member of a multi-device filesystem (up to 4)
 *   --record LOG      log every device write and flush (butter_test_devices.record_log)
 *   --fault SPEC      inject device faults (butter_test_devices.fault_spec); the first
 *                     operation or commit failing where the reference did not ends
 *                     the run with exit status 3 and a "stopped:" line
 *   --manifest FILE   write what each commit holds (format below)
 *   --profile NAME    full (default: every operation, fallocate and clone too),
 *                     mix (every operation but fallocate and clone: any reference
 *                     filesystem), overwrite (large writes over a few files), fill
 *                     (large appends and unlinks: runs into ENOSPC), snapshot (the
 *                     mix inside a subvolume "vol", plus snapshots of it, read-only
 *                     and writable, in "snaps/", operations inside the writable
 *                     ones, deletions of snapshots, and rollbacks: "vol" deleted and
 *                     replaced by a snapshot of a snapshot; the reference keeps a
 *                     copy of each snapshot in REFDIR.snaps/)
 *   --max-file BYTES  largest file offset written (default 3 MiB)
 *   --enospc-ok       ENOSPC from butter where the reference had room is fine: from
 *                     then on results are no longer compared (a small image fills up)
 *   --compress ALG    write compressed (butter_set_compression): zlib, lzo, zstd,
 *                     seed (one of the three chosen by SEED), or cycle (the next of
 *                     the three, forced every other time, after every commit)
 *   --balance WHAT    after the operations and their final sync, move block groups
 *                     (butter_balance): "full" (every group), "convert" (data to
 *                     dup, metadata and system to single, forced), "back" (data to
 *                     single, metadata and system to dup), or "shrink" (device 1 to
 *                     8 MiB less than the end of its last chunk, which moves that
 *                     chunk's groups: butter_device_resize), "remove" (the device
 *                     with the highest devid leaves a multi-device filesystem:
 *                     butter_device_remove), or "replace" (the device with the
 *                     highest devid is replaced by --new-device: butter_replace).
 *                     Relocation changes no file: every generation it commits holds
 *                     the tree of the one before (written to the manifest ahead, for
 *                     as many commits as it may make), then a final sync and its
 *                     durable line
 *   --new-device PATH the replace target of --balance replace (with --record, the
 *                     library records its writes as the next device index of the
 *                     log: lib/device/recorder.c, blockdev_record_new)
 *   --log-replay      the image may hold a tree log: its read-only view (before
 *                     replay) goes to the manifest first, then the read-write open
 *                     (which replays the log) is recorded, and a "replays" line ties
 *                     the two generations
 *
 * Manifest (text, for tests/tools/crashreplay.c):
 *   state GEN         followed by the tree (treelist.h lines) as commit GEN holds it,
 *   ...               written before the commit is attempted (or after a commit the
 *   end               library made on its own); the last block for a GEN counts
 *   durable GEN POS   commit GEN was complete when the record log was POS bytes
 *                     long (written when butter_sync() returned)
 *   replays GEN0 GEN1 an image at GEN0 with a tree log shows GEN1's tree once the
 *                     log is replayed (--log-replay)
 * The first block is the state at open, durable at the log's size then.
 * Snapshot operations and subvolume deletions commit inside the library: the
 * generations they make are written after the call returns, each with the tree
 * it holds (before the operation until the commit that makes it visible).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <unistd.h>

#include "butter/butter.h"
#include "butter/testing.h"
#include "treelist.h"

#define NDIRS 6
#define NNAMES 12
#define MAXFILE_DEFAULT (3u << 20)
#define SECTOR 4096u
#define MAX_SNAPS 8

/* In this order: the full profile's cumulative ranges are those of its first version. */
enum op_kind { OP_CREATE, OP_WRITE, OP_FALLOC, OP_CLONE, OP_TRUNC, OP_UNLINK, OP_RENAME,
	       OP_MKDIR, OP_RMDIR, OP_LINK, OP_SETXATTR, OP_RMXATTR, OP_SYMLINK, OP_SNAPSHOT,
	       OP_SNAPDEL, NOPS };

/* Weights (out of 100) of each operation, in enum order, per profile. */
struct profile {
	const char *name;
	unsigned weight[NOPS];
	unsigned names;     /* names per directory in the pool */
	int root_only;      /* every path in the top directory */
	size_t write_min, write_span; /* large writes: min + pick(span) bytes; 0: the default mix */
	int append;         /* writes go to the end of the file half of the time */
	int snapshots;      /* in subvolume "vol", with snapshots in "snaps" */
};

static const struct profile profiles[] = {
	{ "full", { 16, 21, 8, 6, 5, 9, 9, 6, 5, 5, 5, 3, 2, 0, 0 }, NNAMES, 0, 0, 0, 0, 0 },
	{ "mix", { 18, 27, 0, 0, 8, 10, 10, 7, 5, 5, 5, 3, 2, 0, 0 }, NNAMES, 0, 0, 0, 0, 0 },
	{ "overwrite", { 6, 70, 0, 0, 8, 4, 6, 0, 0, 2, 2, 0, 2, 0, 0 }, 4, 1, 65536, 1 << 20,
	  0, 0 },
	{ "fill", { 15, 70, 0, 0, 3, 8, 2, 0, 0, 0, 2, 0, 0, 0, 0 }, 8, 1, 262144, 2 << 20, 1, 0 },
	{ "snapshot", { 14, 24, 0, 0, 6, 9, 9, 6, 4, 5, 5, 2, 2, 8, 6 }, 6, 0, 0, 0, 0, 1 },
	/* small appends to few files between snapshots: fragmented, shared files (defrag) */
	{ "fragment", { 8, 50, 0, 0, 4, 5, 5, 6, 3, 3, 3, 1, 2, 6, 4 }, 6, 0, 16384, 49152, 1,
	  1 },
};

static unsigned maxfile = MAXFILE_DEFAULT;
static const struct profile *prof = &profiles[0];
static const char *record_log;
static FILE *manifest;
static int fault_mode;
static int enospc_ok;
static int diverged; /* a full image made butter and the reference part ways */
static struct butter_fs *the_fs; /* for stop() */
static unsigned enospc_seen;
static const char *compress_mode;
static unsigned compress_turn;

/*
 * Where the pool's paths live: in butter below bprefix ("" or "vol/", or
 * "snaps/sN/" for an operation inside a writable snapshot), in the reference
 * below ref.
 */
static char bprefix[64];
static const char *ref;
static const char *vol_ref; /* the reference of the top directory or of "vol" */

/* Snapshots of the snapshot profile, live ones only. */
struct snap {
	char name[16];
	uint64_t id;
	int rdonly;
};

static struct snap snaps[MAX_SNAPS];
static unsigned nsnaps, snap_serial;
static uint64_t vol_id;
static char refsnaps[1024]; /* REFDIR.snaps */

static uint64_t rng;

static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static unsigned pick(unsigned n)
{
	return (unsigned)(next_rand() % n);
}

static const char *dirs[NDIRS] = { "", "a", "b", "a/c", "b/d", "a/c/e" };

static void make_path(char *buf, size_t cap, const char *dir, unsigned name)
{
	if (*dir)
		snprintf(buf, cap, "%s/n%u", dir, name);
	else
		snprintf(buf, cap, "n%u", name);
}

/* Resolve pool path @path (below bprefix) to its inode. */
static int resolve(struct butter_fs *fs, const char *path, butter_ino_t *out)
{
	char full[600];

	snprintf(full, sizeof(full), "%s%s", bprefix, path);
	return butter_resolve(fs, full, out);
}

/* Split pool path "x/y/z" into the parent's inode and the last name. */
static int parent_of(struct butter_fs *fs, const char *path, butter_ino_t *dir, const char **name)
{
	char tmp[600];
	const char *slash = strrchr(path, '/');

	if (!slash && !*bprefix) {
		*name = path;
		return butter_root(fs, 5, dir);
	}
	if (slash)
		snprintf(tmp, sizeof(tmp), "%s%.*s", bprefix, (int)(slash - path), path);
	else
		snprintf(tmp, sizeof(tmp), "%.*s", (int)strlen(bprefix) - 1, bprefix);
	*name = slash ? slash + 1 : path;
	return butter_resolve(fs, tmp, dir);
}

static int failures;

/* Per operation: how often it ran and how often the kernel said yes (printed at the end). */
static struct {
	const char *what;
	unsigned runs, ok;
} tally[20];

static void count(const char *what, int ok)
{
	unsigned i;

	for (i = 0; i < sizeof(tally) / sizeof(tally[0]); i++) {
		if (!tally[i].what)
			tally[i].what = what;
		if (!strcmp(tally[i].what, what)) {
			tally[i].runs++;
			tally[i].ok += ok;
			return;
		}
	}
}

/*
 * Fault mode: end the run after the first failure the reference did not
 * have. Says what failed, then tries one more change and a commit (a
 * filesystem that aborted must refuse both) and closes the handle.
 */
static void stop(const char *what) __attribute__((noreturn));

static void stop(const char *what)
{
	struct butter_new_inode attr = { .mode = S_IFREG | 0644 };
	butter_ino_t root, ino;
	int c = -ENOENT, sy;

	printf("stopped: %s\n", what);
	if (butter_root(the_fs, 5, &root) == 0)
		c = butter_create(the_fs, root, "after-stop", 10, &attr, &ino);
	sy = butter_sync(the_fs);
	printf("after: create %s, sync %s\n", c ? strerror(-c) : "ok", sy ? strerror(-sy) : "ok");
	fflush(stdout);
	butter_close(the_fs);
	exit(3);
}

static void compare(const char *what, const char *path, int ref_ret, int got)
{
	count(what, ref_ret == 0);
	if (got == -ENOSPC)
		enospc_seen++;
	if (got == -ENOSPC && ref_ret == 0 && enospc_ok)
		diverged = 1;
	if (ref_ret != got && (fault_mode && got != 0)) {
		char msg[600];

		snprintf(msg, sizeof(msg), "%s %s: %s", what, path, strerror(-got));
		stop(msg);
	}
	if (ref_ret != got && !diverged) {
		fprintf(stderr, "MISMATCH %s %s: reference %d (%s), butter %d (%s)\n", what, path,
			ref_ret, ref_ret ? strerror(-ref_ret) : "ok", got,
			got ? strerror(-got) : "ok");
		failures++;
	}
}

static int errno_ret(int r)
{
	return r < 0 ? -errno : 0;
}

/* The record log's size: the log position after everything done so far. */
static uint64_t log_pos(void)
{
	struct stat st;

	return record_log && stat(record_log, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static uint64_t generation(struct butter_fs *fs)
{
	struct butter_info info;

	return butter_get_info(fs, &info) == 0 ? info.generation : 0;
}

/* The tree as butter shows it now, into @t; ends the run if it cannot be listed. */
static void list_tree(struct butter_fs *fs, struct treelist *t)
{
	int ret = treelist_butter(fs, t);

	if (ret == 0)
		return;
	treelist_free(t);
	if (fault_mode) {
		char msg[300];

		snprintf(msg, sizeof(msg), "listing the tree: %s", strerror(-ret));
		stop(msg);
	}
	fprintf(stderr, "listing the tree for the manifest: %s\n", strerror(-ret));
	exit(1);
}

static void manifest_block(uint64_t gen, const struct treelist *t)
{
	fprintf(manifest, "state %llu\n", (unsigned long long)gen);
	treelist_write(t, manifest);
	fprintf(manifest, "end\n");
	fflush(manifest);
}

/* Write "state GEN" and the tree as butter shows it now. */
static void manifest_state(struct butter_fs *fs, uint64_t gen)
{
	struct treelist t;

	if (!manifest)
		return;
	list_tree(fs, &t);
	manifest_block(gen, &t);
	treelist_free(&t);
}

static void manifest_durable(uint64_t gen)
{
	if (!manifest)
		return;
	fprintf(manifest, "durable %llu %llu\n", (unsigned long long)gen,
		(unsigned long long)log_pos());
	fflush(manifest);
}

/*
 * The library commits on its own when a change finds no room while the
 * running transaction holds freed space (butter_set_space_commit_hook):
 * that commit holds the tree as it is before the change, written here
 * before the commit; the operation's loop then knows that generation.
 */
static uint64_t space_gen; /* the generation the last such commit makes */

static void on_space_commit(void *arg)
{
	struct butter_fs *fs = arg;

	space_gen = generation(fs) + 1;
	manifest_state(fs, space_gen);
}

/* --compress cycle: the next algorithm; forced every other round. */
static void next_compression(struct butter_fs *fs)
{
	static const char *const algs[] = { "zlib", "lzo", "zstd" };
	unsigned turn = compress_turn++;
	int ret = butter_set_compression(fs, algs[turn % 3], (turn / 3) % 2);

	if (ret) {
		fprintf(stderr, "butter_set_compression %s: %s\n", algs[turn % 3], strerror(-ret));
		failures++;
	}
}

/* Commit, with the manifest lines around it. Returns butter_sync()'s result. */
static int sync_with_manifest(struct butter_fs *fs, uint64_t *gen)
{
	int ret;

	manifest_state(fs, *gen + 1);
	ret = butter_sync(fs);
	if (ret == 0) {
		*gen = generation(fs);
		manifest_durable(*gen);
		if (compress_mode && !strcmp(compress_mode, "cycle"))
			next_compression(fs);
	}
	return ret;
}

/*
 * After an operation that commits inside the library (snapshot, subvolume
 * delete): generations above *gen up to the current one. @before is the tree
 * before the operation; the last @visible of the new generations hold the
 * tree as it is now, the ones before them @before.
 */
static void note_commits(struct butter_fs *fs, uint64_t *gen, const struct treelist *before,
			 unsigned visible)
{
	uint64_t now = generation(fs), g;
	struct treelist after;

	if (now == *gen)
		return;
	if (manifest) {
		list_tree(fs, &after);
		for (g = *gen + 1; g <= now; g++)
			manifest_block(g, g + visible > now ? &after : before);
		treelist_free(&after);
	}
	*gen = now;
	manifest_durable(now);
}

/* ---- fallocate and clone (full profile) ------------------------------------ */

/* A random offset: sector-aligned but one time in @odd. */
static uint64_t rand_off(uint64_t limit, unsigned odd)
{
	uint64_t off = limit ? next_rand() % limit : 0;

	return pick(odd) ? off / SECTOR * SECTOR : off;
}

/* Pick a path from the pool, preferring (a few tries) one that is a regular file in @ref. */
static void pick_file(char *path, size_t cap)
{
	char rpath[2048];
	struct stat st;
	int tries;

	for (tries = 0; tries < 6; tries++) {
		make_path(path, cap, dirs[pick(NDIRS)], pick(NNAMES));
		snprintf(rpath, sizeof(rpath), "%s/%s", ref, path);
		if (lstat(rpath, &st) == 0 && S_ISREG(st.st_mode))
			return;
	}
}

/* fallocate(2) on @p1: the reference first, then the library. */
static void op_fallocate(struct butter_fs *fs)
{
	char rpath[2048], p1[512];
	static const int modes[] = {
		0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		FALLOC_FL_ZERO_RANGE, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
		0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		FALLOC_FL_ZERO_RANGE,
		FALLOC_FL_PUNCH_HOLE,                       /* EOPNOTSUPP: needs KEEP_SIZE */
		FALLOC_FL_COLLAPSE_RANGE,                   /* EOPNOTSUPP on btrfs */
	};
	int mode = modes[pick(sizeof(modes) / sizeof(modes[0]))];
	uint64_t off = rand_off(maxfile / 2, 4);
	uint64_t len = pick(50) == 0 ? 0 : 1 + pick(pick(3) == 0 ? 300000 : 20000);
	butter_ino_t ino;
	struct stat lst;
	int fd, r, g;

	pick_file(p1, sizeof(p1));
	snprintf(rpath, sizeof(rpath), "%s/%s", ref, p1);
	if (lstat(rpath, &lst) == 0 && S_ISLNK(lst.st_mode))
		return;
	fd = open(rpath, O_WRONLY);
	if (pick(3) == 0)
		len = (len + SECTOR - 1) / SECTOR * SECTOR;
	r = fd < 0 ? -errno : 0;
	if (fd >= 0) {
		r = errno_ret(fallocate(fd, mode, (off_t)off, (off_t)len));
		close(fd);
	}
	g = resolve(fs, p1, &ino);
	if (g == 0) {
		struct butter_stat st;

		g = butter_stat(fs, ino, &st);
		if (g == 0 && S_ISDIR(st.mode))
			g = -EISDIR; /* open(O_WRONLY) refuses a directory */
		if (g == 0)
			g = butter_fallocate(fs, ino, mode, off, len);
	}
	if (getenv("BUTTER_WORKLOAD_TRACE"))
		fprintf(stderr, "falloc %s %d %llu %llu: %d %d\n", p1, mode, (unsigned long long)off,
			(unsigned long long)len, r, g);
	compare("fallocate", p1, r, g);
}

/* FICLONERANGE from @p1 into @p2 (or into @p1 itself). */
static void op_clone(struct butter_fs *fs)
{
	char rsrc[2048], rdst[2048], p1[512], p2[512];
	struct file_clone_range arg;
	struct stat sst, dst_st;
	uint64_t ssize, dsize, soff, doff, len;
	butter_ino_t src, dst;
	int sfd, dfd, r, g;

	pick_file(p1, sizeof(p1));
	if (pick(4) == 0)
		snprintf(p2, sizeof(p2), "%s", p1);
	else
		pick_file(p2, sizeof(p2));
	snprintf(rsrc, sizeof(rsrc), "%s/%s", ref, p1);
	snprintf(rdst, sizeof(rdst), "%s/%s", ref, p2);
	if ((lstat(rsrc, &sst) == 0 && S_ISLNK(sst.st_mode)) ||
	    (lstat(rdst, &dst_st) == 0 && S_ISLNK(dst_st.st_mode)))
		return;
	ssize = stat(rsrc, &sst) == 0 ? (uint64_t)sst.st_size : 0;
	dsize = stat(rdst, &dst_st) == 0 ? (uint64_t)dst_st.st_size : 0;
	soff = rand_off(ssize + SECTOR, 10);
	switch (pick(6)) {
	case 0:
		len = 0;                                    /* to the end of the source */
		break;
	case 1:
		len = ssize > soff ? ssize - soff : 1;      /* to the end, spelt out */
		break;
	case 2:
		len = pick(3) ? 1 + pick(100000) : (1 + pick(8)) * (uint64_t)SECTOR + 1; /* EINVAL mostly */
		break;
	default:
		len = (1 + pick(64)) * (uint64_t)SECTOR;
		if (soff + len > ssize && pick(2))
			len = ssize > soff ? (ssize - soff) / SECTOR * SECTOR : SECTOR;
		break;
	}
	doff = pick(3) == 0 ? rand_off(maxfile / 2, 10) : rand_off(dsize + 2 * SECTOR, 10);
	sfd = open(rsrc, O_RDONLY);
	r = sfd < 0 ? -errno : 0;
	if (sfd >= 0) {
		dfd = open(rdst, O_WRONLY);
		r = dfd < 0 ? -errno : 0;
		if (dfd >= 0) {
			arg.src_fd = sfd;
			arg.src_offset = soff;
			arg.src_length = len;
			arg.dest_offset = doff;
			r = errno_ret(ioctl(dfd, FICLONERANGE, &arg));
			close(dfd);
		}
		close(sfd);
	}
	g = resolve(fs, p1, &src);
	if (g == 0)
		g = resolve(fs, p2, &dst);
	if (g == 0) {
		struct butter_stat st;

		g = butter_stat(fs, dst, &st);
		if (g == 0 && S_ISDIR(st.mode))
			g = -EISDIR; /* open(O_WRONLY) refuses a directory */
		if (g == 0)
			g = butter_clone_range(fs, src, soff, dst, doff, len);
	}
	if (getenv("BUTTER_WORKLOAD_TRACE"))
		fprintf(stderr, "clone %s %llu %s %llu %llu: %d %d\n", p1, (unsigned long long)soff,
			p2, (unsigned long long)doff, (unsigned long long)len, r, g);
	compare("clone", p1, r, g);
}

/* ---- snapshots (snapshot profile) -------------------------------------------- */

/* Run a shell command on reference paths (cp -a, rm -rf); ends the run if it fails. */
static void shell(const char *fmt, const char *a, const char *b)
{
	char cmd[4200];

	/* every caller passes a literal taking two %s */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
	snprintf(cmd, sizeof(cmd), fmt, a, b);
#pragma GCC diagnostic pop
	if (system(cmd) != 0) {
		fprintf(stderr, "reference: '%s' failed\n", cmd);
		exit(2);
	}
}

/* Lines of @t below @prefix ("vol/" etc.), with the prefix cut, the root as ".". */
static void subtree(const struct treelist *t, const char *prefix, struct treelist *out)
{
	size_t plen = strlen(prefix);

	memset(out, 0, sizeof(*out));
	for (size_t i = 0; i < t->n; i++) {
		const char *l = t->lines[i];

		if (!strncmp(l, prefix, plen)) {
			treelist_add(out, l + plen);
		} else if (!strncmp(l, prefix, plen - 1) && l[plen - 1] == '\t') {
			char line[8192];

			snprintf(line, sizeof(line), ".%s", l + plen - 1);
			treelist_add(out, line);
		}
	}
	treelist_sort(out);
}

/* After a snapshot: butter must show the same tree at "snaps/NAME/" as at @src_prefix. */
static void check_snapshot(struct butter_fs *fs, const char *src_prefix, const char *name)
{
	struct treelist all, a, b;
	char prefix[64];

	list_tree(fs, &all);
	snprintf(prefix, sizeof(prefix), "snaps/%s/", name);
	subtree(&all, src_prefix, &a);
	subtree(&all, prefix, &b);
	if (a.n < 1 || treelist_diff(&a, &b, "  snapshot", 10)) {
		fprintf(stderr, "MISMATCH snapshot %s of %s: trees differ\n", name, src_prefix);
		failures++;
	}
	treelist_free(&a);
	treelist_free(&b);
	treelist_free(&all);
}

static int snaps_dir(struct butter_fs *fs, butter_ino_t *dir)
{
	return butter_resolve(fs, "snaps", dir);
}

/* Snapshot "vol" (or a live snapshot) as snaps/sN, read-only half of the time. */
static void op_snapshot(struct butter_fs *fs, uint64_t *gen)
{
	struct treelist before = { 0 };
	struct snap *s, *src = NULL;
	char src_prefix[64], refsrc[1200], refdst[1200];
	butter_ino_t dir;
	int ret;

	if (nsnaps && pick(4) == 0)
		src = &snaps[pick(nsnaps)];
	s = &snaps[nsnaps];
	snprintf(s->name, sizeof(s->name), "s%u", snap_serial++);
	s->rdonly = pick(2);
	if (manifest)
		list_tree(fs, &before);
	ret = snaps_dir(fs, &dir);
	if (ret == 0)
		ret = butter_snapshot(fs, src ? src->id : vol_id, dir, s->name, strlen(s->name),
				      s->rdonly ? BUTTER_SNAPSHOT_RDONLY : 0, &s->id);
	count("snapshot", ret == 0);
	if (ret) {
		fprintf(stderr, "MISMATCH snapshot %s: %s\n", s->name, strerror(-ret));
		failures++;
		treelist_free(&before);
		return;
	}
	note_commits(fs, gen, &before, 1);
	treelist_free(&before);
	if (src) {
		snprintf(src_prefix, sizeof(src_prefix), "snaps/%s/", src->name);
		snprintf(refsrc, sizeof(refsrc), "%s/%s", refsnaps, src->name);
	} else {
		snprintf(src_prefix, sizeof(src_prefix), "vol/");
		snprintf(refsrc, sizeof(refsrc), "%s", vol_ref);
	}
	snprintf(refdst, sizeof(refdst), "%s/%s", refsnaps, s->name);
	shell("cp -a '%s' '%s'", refsrc, refdst);
	nsnaps++;
	check_snapshot(fs, src_prefix, s->name);
}

/* Delete snapshot @k (subvolume delete: unlink commit, then the drop commit). */
static int delete_snapshot(struct butter_fs *fs, unsigned k, uint64_t *gen)
{
	struct treelist before = { 0 };
	char refpath[1200];
	butter_ino_t dir;
	int ret;

	if (manifest)
		list_tree(fs, &before);
	ret = snaps_dir(fs, &dir);
	if (ret == 0)
		ret = butter_subvol_delete(fs, dir, snaps[k].name, strlen(snaps[k].name));
	count("subvol-delete", ret == 0);
	if (ret) {
		fprintf(stderr, "MISMATCH delete snaps/%s: %s\n", snaps[k].name, strerror(-ret));
		failures++;
	} else {
		note_commits(fs, gen, &before, 2);
		snprintf(refpath, sizeof(refpath), "%s/%s", refsnaps, snaps[k].name);
		shell("rm -rf '%s'%s", refpath, "");
		snaps[k] = snaps[--nsnaps];
	}
	treelist_free(&before);
	return ret;
}

/*
 * Delete a snapshot; one time in three roll back instead: delete "vol" and
 * snapshot a live snapshot (writable) in its place.
 */
static void op_snapdel(struct butter_fs *fs, uint64_t *gen)
{
	struct treelist before = { 0 };
	butter_ino_t root;
	struct snap *s;
	char refsrc[1200];
	int ret;

	if (!nsnaps)
		return;
	if (pick(3)) {
		delete_snapshot(fs, pick(nsnaps), gen);
		return;
	}
	s = &snaps[pick(nsnaps)];
	if (manifest)
		list_tree(fs, &before);
	ret = butter_root(fs, 5, &root);
	if (ret == 0)
		ret = butter_subvol_delete(fs, root, "vol", 3);
	count("rollback", ret == 0);
	if (ret == 0) {
		note_commits(fs, gen, &before, 2);
		treelist_free(&before);
		if (manifest)
			list_tree(fs, &before);
		ret = butter_snapshot(fs, s->id, root, "vol", 3, 0, &vol_id);
	}
	if (ret) {
		fprintf(stderr, "MISMATCH rollback to snaps/%s: %s\n", s->name, strerror(-ret));
		failures++;
		treelist_free(&before);
		return;
	}
	note_commits(fs, gen, &before, 1);
	treelist_free(&before);
	snprintf(refsrc, sizeof(refsrc), "%s/%s", refsnaps, s->name);
	shell("rm -rf '%s'%s", vol_ref, "");
	shell("cp -a '%s' '%s'", refsrc, vol_ref);
}

/*
 * Snapshot profile: where this operation works — "vol" mostly, a writable
 * snapshot one time in five. Sets bprefix and ref.
 */
static void choose_target(void)
{
	static char snap_ref[1100];
	unsigned k;

	snprintf(bprefix, sizeof(bprefix), "vol/");
	ref = vol_ref;
	if (!nsnaps || pick(5))
		return;
	k = pick(nsnaps);
	if (snaps[k].rdonly)
		return;
	snprintf(bprefix, sizeof(bprefix), "snaps/%s/", snaps[k].name);
	snprintf(snap_ref, sizeof(snap_ref), "%s/%s", refsnaps, snaps[k].name);
	ref = snap_ref;
}

/*
 * Snapshot profile: subvolume "vol" and directory "snaps" (in the reference:
 * REFDIR.snaps). Creating a subvolume commits.
 */
static int setup_snapshots(struct butter_fs *fs, uint64_t *gen)
{
	struct butter_new_inode a = { .mode = S_IFDIR | 0755 };
	struct treelist before = { 0 };
	butter_ino_t root, out;
	int ret;

	snprintf(refsnaps, sizeof(refsnaps), "%s.snaps", vol_ref);
	if (mkdir(refsnaps, 0755) < 0 && errno != EEXIST)
		return -errno;
	if (manifest)
		list_tree(fs, &before);
	ret = butter_root(fs, 5, &root);
	if (ret == 0)
		ret = butter_subvol_create(fs, root, "vol", 3, &vol_id);
	if (ret == 0)
		note_commits(fs, gen, &before, 1);
	treelist_free(&before);
	if (ret == 0)
		ret = butter_create(fs, root, "snaps", 5, &a, &out);
	snprintf(bprefix, sizeof(bprefix), "vol/");
	return ret;
}

/* ---- the run --------------------------------------------------------------- */

static const char *new_device; /* --new-device */

/*
 * --balance remove|replace: the device with the highest devid leaves (its
 * groups move to the others, then it is wiped) or is replaced by
 * new_device. Prints "remove devid N: D devices left" or "replace devid N:
 * B bytes copied, C chunks".
 */
static int device_op(struct butter_fs *fs, const char *what)
{
	struct butter_device_info di;
	struct butter_replace_stats rst;
	uint64_t devid = 0;
	size_t k;
	int ret;

	for (k = 0; butter_get_device(fs, k, &di) == 0; k++)
		if (di.devid > devid)
			devid = di.devid;
	if (k < 2 && !strcmp(what, "remove"))
		return -EINVAL; /* the last device cannot leave */
	if (!strcmp(what, "remove")) {
		ret = butter_device_remove(fs, devid);
		if (ret == 0)
			printf("remove devid %llu: %zu devices left\n", (unsigned long long)devid,
			       k - 1);
		return ret;
	}
	if (!new_device)
		return -EINVAL;
	memset(&rst, 0, sizeof(rst));
	ret = butter_replace(fs, devid, new_device, 0, &rst);
	if (ret == 0)
		printf("replace devid %llu: %llu bytes copied, %llu chunks\n",
		       (unsigned long long)devid, (unsigned long long)rst.bytes_written,
		       (unsigned long long)rst.chunks_done);
	return ret;
}

/* --balance defrag: every regular file below @dir (into subvolumes too), deepest last. */
struct defrag_walk {
	butter_ino_t *inos;
	size_t n, cap;
	int err;
};

static int take_entry(void *arg, const char *name, size_t namelen, butter_ino_t ino,
		      unsigned dtype, uint64_t next_pos)
{
	struct defrag_walk *dw = arg;

	(void)name;
	(void)namelen;
	(void)next_pos;
	if (dtype != DT_REG && dtype != DT_DIR)
		return 0;
	if (dw->n == dw->cap) {
		size_t cap = dw->cap ? dw->cap * 2 : 64;
		butter_ino_t *p = realloc(dw->inos, cap * sizeof(*p));

		if (!p) {
			dw->err = -ENOMEM;
			return 1;
		}
		dw->inos = p;
		dw->cap = cap;
	}
	/* directories are marked by a set top bit; the walk below clears it */
	dw->inos[dw->n] = ino;
	if (dtype == DT_DIR)
		dw->inos[dw->n].ino |= 1ULL << 63;
	dw->n++;
	return 0;
}

static int defrag_all(struct butter_fs *fs, struct butter_defrag_stats *st)
{
	struct defrag_walk dw = { 0 };
	butter_ino_t root;
	size_t i;
	int ret = butter_root(fs, 5, &root);

	if (ret)
		return ret;
	root.ino |= 1ULL << 63;
	ret = take_entry(&dw, "", 0, root, DT_DIR, 0) ? dw.err : 0;
	/* the list grows as directories are read: a breadth-first walk */
	for (i = 0; ret == 0 && i < dw.n; i++) {
		butter_ino_t ino = dw.inos[i];

		if (ino.ino >> 63) {
			ino.ino &= ~(1ULL << 63);
			ret = butter_readdir(fs, ino, 0, take_entry, &dw);
			if (ret == 0)
				ret = dw.err;
		} else {
			ret = butter_defrag(fs, ino, NULL, st);
		}
	}
	free(dw.inos);
	return ret;
}

/*
 * --balance: relocate block groups as @what says; the tree stays the one of
 * generation *gen, so each generation the relocation may commit gets it.
 */
static int run_balance(struct butter_fs *fs, const char *what, uint64_t *gen)
{
	struct butter_balance_args args;
	struct butter_balance_stats st;
	struct butter_space_info sp;
	struct treelist t;
	size_t groups = 0, k;
	int ret;

	memset(&args, 0, sizeof(args));
	args.flags = BUTTER_BALANCE_DATA | BUTTER_BALANCE_METADATA | BUTTER_BALANCE_SYSTEM |
		     BUTTER_BALANCE_FORCE;
	if (!strcmp(what, "convert") || !strcmp(what, "back")) {
		int to_dup = what[0] == 'c';

		args.data.flags = args.meta.flags = args.sys.flags = BUTTER_BALANCE_F_CONVERT;
		args.data.target = to_dup ? (1ULL << 5) : BUTTER_PROFILE_SINGLE;
		args.meta.target = args.sys.target = to_dup ? BUTTER_PROFILE_SINGLE : (1ULL << 5);
	} else if (strcmp(what, "full") && strcmp(what, "shrink") && strcmp(what, "remove") &&
		   strcmp(what, "replace") && strcmp(what, "defrag")) {
		return -EINVAL;
	}
	for (k = 0; butter_get_space(fs, k, &sp) == 0; k++)
		groups += (size_t)(sp.total / (8ULL << 20)) + 1; /* chunks here are >= 8 MiB */
	if (manifest) {
		list_tree(fs, &t);
		/*
		 * per group: a commit first, one for room, the passes, the removal;
		 * a defragment commits at most twice per file (the tree lists each once)
		 */
		if (!strcmp(what, "defrag") && 2 * t.n > 12 * groups)
			groups = t.n / 6 + 1;
		for (k = 1; k <= 12 * groups + 8; k++)
			manifest_block(*gen + k, &t);
		treelist_free(&t);
	}
	memset(&st, 0, sizeof(st));
	if (!strcmp(what, "shrink")) {
		struct butter_device_info di;
		uint64_t size = 0;

		/* size 0: as small as the chunks allow without moving one (their end) */
		ret = butter_get_device(fs, 0, &di);
		if (ret == 0)
			ret = butter_device_resize(fs, di.devid, &size);
		if (ret == 0 && size > (24ULL << 20)) {
			size -= 8ULL << 20;
			ret = butter_device_resize(fs, di.devid, &size);
		}
		st.groups = st.tree_blocks = 1; /* not counted by the resize; it moved some */
	} else if (!strcmp(what, "remove") || !strcmp(what, "replace")) {
		ret = device_op(fs, what); /* prints its own line */
	} else if (!strcmp(what, "defrag")) {
		struct butter_defrag_stats ds;

		memset(&ds, 0, sizeof(ds));
		ret = defrag_all(fs, &ds);
		st.groups = ds.files_moved;
		st.data_extents = ds.extents_moved;
		st.tree_blocks = ds.runs_after;
	} else {
		ret = butter_balance(fs, &args, &st);
	}
	if (ret)
		return ret;
	if (strcmp(what, "remove") && strcmp(what, "replace"))
		printf("balance %llu groups %llu extents %llu blocks\n",
		       (unsigned long long)st.groups, (unsigned long long)st.data_extents,
		       (unsigned long long)st.tree_blocks);
	*gen = generation(fs);
	manifest_durable(*gen);
	return 0;
}

static int usage(const char *argv0)
{
	fprintf(stderr, "usage: %s [--device DEV]... [--record LOG] [--fault SPEC] "
			"[--manifest FILE]\n"
			"       [--profile full|mix|overwrite|fill|snapshot|fragment] [--max-file BYTES] "
			"[--enospc-ok]\n"
			"       [--compress zlib|lzo|zstd|seed|cycle] [--log-replay]\n"
			"       [--balance full|convert|back|shrink|remove|replace] "
			"[--new-device PATH]\n"
			"       IMAGE REFDIR SEED OPS [SYNC_EVERY]\n", argv0);
	return 2;
}

/*
 * --log-replay: the read-only view of the image (a tree log is not replayed
 * there) as the manifest's first state, durable from the start.
 */
static int pre_replay_state(const char *image, const struct butter_open_opts *opts, uint64_t *gen)
{
	struct butter_open_opts ro = *opts;
	struct butter_fs *fs;
	int ret;

	ro.flags |= BUTTER_OPEN_RDONLY;
	ret = butter_open(image, &ro, &fs); /* no test devices: a look before the run */
	if (ret)
		return ret;
	*gen = generation(fs);
	if (manifest) {
		manifest_state(fs, *gen);
		fprintf(manifest, "durable %llu 0\n", (unsigned long long)*gen);
	}
	butter_close(fs);
	return 0;
}

int main(int argc, char **argv)
{
	struct butter_open_opts opts = { 0 };
	struct butter_test_devices test = { 0 };
	struct butter_fs *fs;
	const char *image;
	char rpath[2048], p1[512], p2[512];
	unsigned ops, i, sync_every;
	unsigned char *buf;
	const char *extra_devs[4];
	uint64_t gen, gen0 = 0;
	int ret, a = 1, log_replay = 0;
	const char *balance_mode = NULL;

	while (a < argc && strncmp(argv[a], "--", 2) == 0) {
		const char *o = argv[a];

		if (strcmp(o, "--enospc-ok") == 0 || strcmp(o, "--log-replay") == 0) {
			if (o[2] == 'e')
				enospc_ok = 1;
			else
				log_replay = 1;
			a++;
			continue;
		}
		if (a + 1 >= argc)
			return usage(argv[0]);
		if (strcmp(o, "--device") == 0) {
			if (opts.ndevices == 4)
				return usage(argv[0]);
			extra_devs[opts.ndevices++] = argv[a + 1];
			opts.devices = extra_devs;
		} else if (strcmp(o, "--record") == 0) {
			record_log = test.record_log = argv[a + 1];
		} else if (strcmp(o, "--fault") == 0) {
			test.fault_spec = argv[a + 1];
			fault_mode = 1;
		} else if (strcmp(o, "--manifest") == 0) {
			manifest = fopen(argv[a + 1], "w");
			if (!manifest) {
				perror(argv[a + 1]);
				return 2;
			}
		} else if (strcmp(o, "--profile") == 0) {
			size_t k;

			for (k = 0; k < sizeof(profiles) / sizeof(profiles[0]); k++)
				if (strcmp(profiles[k].name, argv[a + 1]) == 0)
					prof = &profiles[k];
			if (strcmp(prof->name, argv[a + 1]) != 0)
				return usage(argv[0]);
		} else if (strcmp(o, "--max-file") == 0) {
			maxfile = (unsigned)strtoul(argv[a + 1], NULL, 0);
			if (maxfile < 4096)
				return usage(argv[0]);
		} else if (strcmp(o, "--compress") == 0) {
			compress_mode = argv[a + 1];
		} else if (strcmp(o, "--balance") == 0) {
			balance_mode = argv[a + 1];
		} else if (strcmp(o, "--new-device") == 0) {
			new_device = argv[a + 1];
		} else {
			return usage(argv[0]);
		}
		a += 2;
	}
	argc -= a - 1;
	argv += a - 1;
	if (argc < 5)
		return usage("butter-workload");
	image = argv[1];
	vol_ref = ref = argv[2];
	rng = strtoull(argv[3], NULL, 0) * 2654435761u + 88172645463325252ull;
	ops = (unsigned)strtoul(argv[4], NULL, 0);
	sync_every = argc > 5 ? (unsigned)strtoul(argv[5], NULL, 0) : 50;
	buf = malloc(maxfile + prof->write_min + prof->write_span + 200001);
	if (!buf)
		return 2;
	if (log_replay) {
		ret = pre_replay_state(image, &opts, &gen0);
		if (ret) {
			fprintf(stderr, "open %s read-only: %s\n", image, strerror(-ret));
			return 2;
		}
	}
	ret = butter_open_testing(image, &opts, &test, &fs);
	if (ret) {
		fprintf(stderr, "open %s: %s\n", image, strerror(-ret));
		return 2;
	}
	the_fs = fs;
	if (manifest)
		butter_set_space_commit_hook(fs, on_space_commit, fs);
	gen = generation(fs);
	if (!log_replay || gen != gen0) {
		manifest_state(fs, gen);
		manifest_durable(gen);
	}
	if (log_replay && manifest)
		fprintf(manifest, "replays %llu %llu\n", (unsigned long long)gen0,
			(unsigned long long)gen);
	if (compress_mode) {
		static const char *const algs[] = { "zlib", "lzo", "zstd" };
		unsigned long seed = strtoul(argv[3], NULL, 0);

		if (!strcmp(compress_mode, "cycle")) {
			compress_turn = (unsigned)(seed % 3);
			next_compression(fs);
		} else {
			ret = butter_set_compression(fs, !strcmp(compress_mode, "seed") ?
						     algs[seed % 3] : compress_mode, 0);
			if (ret) {
				fprintf(stderr, "--compress %s: %s\n", compress_mode,
					strerror(-ret));
				return 2;
			}
		}
	}
	if (prof->snapshots) {
		ret = setup_snapshots(fs, &gen);
		if (ret) {
			fprintf(stderr, "setting up subvolume vol: %s\n", strerror(-ret));
			return 2;
		}
	}
	for (i = 1; i < NDIRS; i++) {
		butter_ino_t dir, out;
		const char *name;
		struct butter_new_inode na = { .mode = S_IFDIR | 0755 };

		snprintf(rpath, sizeof(rpath), "%s/%s", ref, dirs[i]);
		mkdir(rpath, 0755);
		parent_of(fs, dirs[i], &dir, &name);
		butter_create(fs, dir, name, strlen(name), &na, &out);
	}
	for (i = 0; i < ops && failures == 0; i++) {
		unsigned roll = pick(100), op = 0, acc = 0;
		const char *d1 = dirs[pick(NDIRS)], *d2 = dirs[pick(NDIRS)];
		butter_ino_t dir, dir2, ino;
		const char *name, *name2;
		int r, g;

		while (op < NOPS - 1 && roll >= acc + prof->weight[op])
			acc += prof->weight[op++];
		if (prof->root_only)
			d1 = d2 = "";
		make_path(p1, sizeof(p1), d1, pick(prof->names));
		make_path(p2, sizeof(p2), d2, pick(prof->names));
		if (prof->snapshots)
			choose_target();
		snprintf(rpath, sizeof(rpath), "%s/%s", ref, p1);
		{
			/* the kernel follows symlinks where butter's calls name inodes: skip those */
			struct stat lst;

			if (lstat(rpath, &lst) == 0 && S_ISLNK(lst.st_mode) &&
			    (op == OP_WRITE || op == OP_FALLOC || op == OP_CLONE ||
			     op == OP_TRUNC || op == OP_SETXATTR || op == OP_RMXATTR))
				continue;
		}
		if (op == OP_CREATE) { /* create + write */
			struct butter_new_inode na = { .mode = S_IFREG | 0644 };
			int fd = open(rpath, O_CREAT | O_EXCL | O_WRONLY, 0644);

			r = fd < 0 ? -errno : 0;
			if (fd >= 0)
				close(fd);
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_create(fs, dir, name, strlen(name), &na, &ino);
			compare("create", p1, r, g);
		} else if (op == OP_WRITE) { /* write at a random place */
			uint64_t off = pick(4) == 0 ? 0 : pick(maxfile / 2);
			size_t len = 1 + pick(pick(3) == 0 ? 200000 : 9000);
			int fd = open(rpath, O_WRONLY);
			size_t k;

			if (prof->write_min) {
				struct stat wst;

				len = prof->write_min + pick((unsigned)prof->write_span);
				off = pick(maxfile - (unsigned)(len < maxfile ? len : 0) + 1);
				if (prof->append && pick(2) && stat(rpath, &wst) == 0)
					off = (uint64_t)wst.st_size;
				if (off + len > maxfile)
					off = len < maxfile ? maxfile - len : 0;
			}

			for (k = 0; k < len; k++)
				buf[k] = (unsigned char)(next_rand() >> (pick(3) ? 60 : 0));
			r = fd < 0 ? -errno : 0;
			if (fd >= 0) {
				if (pwrite(fd, buf, len, (off_t)off) != (ssize_t)len)
					r = -errno;
				close(fd);
			}
			g = resolve(fs, p1, &ino);
			if (g == 0) {
				struct butter_stat st;

				g = butter_stat(fs, ino, &st);
				if (g == 0 && S_ISDIR(st.mode))
					g = -EISDIR;
				if (g == 0) {
					ssize_t n = butter_write(fs, ino, buf, len, off);

					g = n < 0 ? (int)n : 0;
				}
			}
			if (r == -EISDIR && g == -EISDIR)
				g = r;
			compare("write", p1, r, g);
		} else if (op == OP_FALLOC) {
			op_fallocate(fs);
		} else if (op == OP_CLONE) {
			op_clone(fs);
		} else if (op == OP_TRUNC) {
			uint64_t size = pick(3) == 0 ? 0 : pick(maxfile / 2);
			struct butter_stat st = { 0 };

			r = errno_ret(truncate(rpath, (off_t)size));
			g = resolve(fs, p1, &ino);
			if (g == 0) {
				st.size = size;
				g = butter_setattr(fs, ino, &st, BUTTER_SET_SIZE);
			}
			compare("truncate", p1, r, g);
		} else if (op == OP_UNLINK) {
			struct stat hst;

			if (lstat(rpath, &hst) == 0 && S_ISDIR(hst.st_mode))
				continue; /* unlink(2) of a dir differs by errno across systems */
			r = errno_ret(unlink(rpath));
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_unlink(fs, dir, name, strlen(name));
			compare("unlink", p1, r, g);
		} else if (op == OP_RENAME) {
			char rpath2[2048];
			unsigned flags = pick(4) == 0 ? BUTTER_RENAME_NOREPLACE : 0;

			snprintf(rpath2, sizeof(rpath2), "%s/%s", ref, p2);
			if (flags)
				r = errno_ret(renameat2(AT_FDCWD, rpath, AT_FDCWD, rpath2, RENAME_NOREPLACE));
			else
				r = errno_ret(rename(rpath, rpath2));
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = parent_of(fs, p2, &dir2, &name2);
			if (g == 0)
				g = butter_rename(fs, dir, name, strlen(name), dir2, name2, strlen(name2),
						  flags);
			compare("rename", p1, r, g);
		} else if (op == OP_MKDIR) {
			struct butter_new_inode na = { .mode = S_IFDIR | 0750 };

			r = errno_ret(mkdir(rpath, 0750));
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_create(fs, dir, name, strlen(name), &na, &ino);
			compare("mkdir", p1, r, g);
		} else if (op == OP_RMDIR) {
			r = errno_ret(rmdir(rpath));
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_rmdir(fs, dir, name, strlen(name));
			if (r == -EEXIST)
				r = -ENOTEMPTY;
			compare("rmdir", p1, r, g);
		} else if (op == OP_LINK) {
			char rpath2[2048];
			struct stat hst;

			snprintf(rpath2, sizeof(rpath2), "%s/%s", ref, p2);
			if (lstat(rpath, &hst) == 0 && S_ISDIR(hst.st_mode))
				continue;
			r = errno_ret(link(rpath, rpath2));
			g = resolve(fs, p1, &ino);
			if (g == 0)
				g = parent_of(fs, p2, &dir2, &name2);
			if (g == 0)
				g = butter_link(fs, ino, dir2, name2, strlen(name2));
			compare("link", p1, r, g);
		} else if (op == OP_SETXATTR) {
			char val[64];
			int vlen = snprintf(val, sizeof(val), "v%llu", (unsigned long long)next_rand());
			char xname[32];

			snprintf(xname, sizeof(xname), "user.x%u", pick(3));
			r = errno_ret(lsetxattr(rpath, xname, val, (size_t)vlen, 0));
			g = resolve(fs, p1, &ino);
			if (g == 0)
				g = butter_setxattr(fs, ino, xname, val, (size_t)vlen);
			compare("setxattr", p1, r, g);
		} else if (op == OP_RMXATTR) {
			char xname[32];

			snprintf(xname, sizeof(xname), "user.x%u", pick(3));
			r = errno_ret(lremovexattr(rpath, xname));
			g = resolve(fs, p1, &ino);
			if (g == 0)
				g = butter_removexattr(fs, ino, xname);
			compare("removexattr", p1, r, g);
		} else if (op == OP_SYMLINK) {
			r = errno_ret(symlink("target/of/link", rpath));
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_symlink(fs, dir, name, strlen(name), "target/of/link", 0, 0, &ino);
			compare("symlink", p1, r, g);
		} else if (op == OP_SNAPSHOT) {
			if (nsnaps == MAX_SNAPS)
				delete_snapshot(fs, pick(nsnaps), &gen);
			else
				op_snapshot(fs, &gen);
		} else { /* OP_SNAPDEL */
			op_snapdel(fs, &gen);
		}
		if (generation(fs) != gen) {
			/*
			 * The library committed on its own: after the change (too much
			 * dirty metadata: the tree now), or before it for room (its
			 * state was written then, on_space_commit)
			 */
			gen = generation(fs);
			if (gen != space_gen)
				manifest_state(fs, gen);
			manifest_durable(gen);
		}
		if (sync_every && i % sync_every == sync_every - 1) {
			ret = sync_with_manifest(fs, &gen);
			if (ret && fault_mode) {
				char msg[300];

				snprintf(msg, sizeof(msg), "sync after op %u: %s", i, strerror(-ret));
				stop(msg);
			}
			if (ret) {
				fprintf(stderr, "sync after op %u: %s\n", i, strerror(-ret));
				failures++;
			}
		}
	}
	if (failures == 0) {
		ret = sync_with_manifest(fs, &gen);
		if (ret && fault_mode) {
			char msg[300];

			snprintf(msg, sizeof(msg), "final sync: %s", strerror(-ret));
			stop(msg);
		}
		if (ret) {
			fprintf(stderr, "final sync: %s\n", strerror(-ret));
			failures++;
		}
	}
	if (failures == 0 && balance_mode) {
		ret = run_balance(fs, balance_mode, &gen);
		if (ret) {
			fprintf(stderr, "balance %s: %s\n", balance_mode, strerror(-ret));
			failures++;
		}
	}
	butter_close(fs);
	if (manifest)
		fclose(manifest);
	free(buf);
	if (failures) {
		fprintf(stderr, "stopped at op %u of seed %s\n", i, argv[3]);
		return 1;
	}
	printf("%u operations, %u ENOSPC\n", ops, enospc_seen);
	for (i = 0; i < sizeof(tally) / sizeof(tally[0]) && tally[i].what; i++)
		printf("%s %u ok %u\n", tally[i].what, tally[i].runs, tally[i].ok);
	return 0;
}
