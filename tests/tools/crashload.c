/*
 * crashload.c — the power-cut and fault workload: tests/tools/workload.c as it
 * was before fallocate and clone ops were added, plus recording, fault
 * injection, manifests and profiles. (To be folded back into workload.c.)
 *
 * usage: butter-crashload [OPTIONS] IMAGE REFDIR SEED OPS [SYNC_EVERY]
 *
 * Every operation is first applied to the reference with POSIX calls; the
 * library must then succeed or fail exactly as the kernel did (same errno),
 * otherwise the program stops with exit status 1 and says which step. Paths
 * are kept in a small pool so that operations collide (renames over existing
 * names, unlinks of hard links, writes to renamed files...).
 *
 * Options (crash and fault tests, tests/integration/test_crash.py and
 * test_faults.py):
 *   --device DEV      a further member of a multi-device filesystem (up to 4)
 *   --record LOG      log every device write and flush (butter_open_opts.record_log)
 *   --fault SPEC      inject device faults (butter_open_opts.fault_spec); the first
 *                     operation or commit failing where the reference did not ends
 *                     the run with exit status 3 and a "stopped:" line
 *   --manifest FILE   write what each commit holds (format below)
 *   --profile NAME    mix (default: every operation), overwrite (large writes over
 *                     a few files), fill (large appends and unlinks: runs into ENOSPC)
 *   --max-file BYTES  largest file offset written (default 3 MiB)
 *   --enospc-ok       ENOSPC from butter where the reference had room is fine: from
 *                     then on results are no longer compared (a small image fills up)
 *
 * Manifest (text, for tests/tools/crashreplay.c):
 *   state GEN         followed by the tree (treelist.h lines) as commit GEN holds it,
 *   ...               written before the commit is attempted (or after a commit the
 *   end               library made on its own); the last block for a GEN counts
 *   durable GEN POS   commit GEN was complete when the record log was POS bytes
 *                     long (written when butter_sync() returned)
 * The first block is the state at open, durable at the log's size then.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "butter/butter.h"
#include "treelist.h"

#define NDIRS 6
#define NNAMES 12
#define MAXFILE_DEFAULT (3u << 20)

enum op_kind { OP_CREATE, OP_WRITE, OP_TRUNC, OP_UNLINK, OP_RENAME, OP_MKDIR, OP_RMDIR, OP_LINK,
	       OP_SETXATTR, OP_RMXATTR, OP_SYMLINK, NOPS };

/* Weights (out of 100) of each operation, in enum order, per profile. */
struct profile {
	const char *name;
	unsigned weight[NOPS];
	unsigned names;     /* names per directory in the pool */
	int root_only;      /* every path in the top directory */
	size_t write_min, write_span; /* large writes: min + pick(span) bytes; 0: the default mix */
	int append;         /* writes go to the end of the file half of the time */
};

static const struct profile profiles[] = {
	{ "mix", { 18, 27, 8, 10, 10, 7, 5, 5, 5, 3, 2 }, NNAMES, 0, 0, 0, 0 },
	{ "overwrite", { 6, 70, 8, 4, 6, 0, 0, 2, 2, 0, 2 }, 4, 1, 65536, 1 << 20, 0 },
	{ "fill", { 15, 70, 3, 8, 2, 0, 0, 0, 2, 0, 0 }, 8, 1, 262144, 2 << 20, 1 },
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

/* Split "x/y/z" into the parent's inode and the last name. */
static int parent_of(struct butter_fs *fs, const char *path, butter_ino_t *dir, const char **name)
{
	char tmp[512];
	const char *slash = strrchr(path, '/');

	if (!slash) {
		*name = path;
		return butter_root(fs, 5, dir);
	}
	snprintf(tmp, sizeof(tmp), "%.*s", (int)(slash - path), path);
	*name = slash + 1;
	return butter_resolve(fs, tmp, dir);
}

static int failures;

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

static void compare(const char *what, const char *path, int ref, int got)
{
	if (got == -ENOSPC)
		enospc_seen++;
	if (got == -ENOSPC && ref == 0 && enospc_ok)
		diverged = 1;
	if (ref != got && (fault_mode && got != 0)) {
		char msg[600];

		snprintf(msg, sizeof(msg), "%s %s: %s", what, path, strerror(-got));
		stop(msg);
	}
	if (ref != got && !diverged) {
		fprintf(stderr, "MISMATCH %s %s: reference %d (%s), butter %d (%s)\n", what, path, ref,
			ref ? strerror(-ref) : "ok", got, got ? strerror(-got) : "ok");
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

/* Write "state GEN" and the tree as butter shows it now. */
static void manifest_state(struct butter_fs *fs, uint64_t gen)
{
	struct treelist t;
	int ret;

	if (!manifest)
		return;
	ret = treelist_butter(fs, &t);
	if (ret) {
		treelist_free(&t);
		if (fault_mode) {
			char msg[300];

			snprintf(msg, sizeof(msg), "listing the tree: %s", strerror(-ret));
			stop(msg);
		}
		fprintf(stderr, "listing the tree for the manifest: %s\n", strerror(-ret));
		exit(1);
	}
	fprintf(manifest, "state %llu\n", (unsigned long long)gen);
	treelist_write(&t, manifest);
	fprintf(manifest, "end\n");
	fflush(manifest);
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

/* Commit, with the manifest lines around it. Returns butter_sync()'s result. */
static int sync_with_manifest(struct butter_fs *fs, uint64_t *gen)
{
	int ret;

	manifest_state(fs, *gen + 1);
	ret = butter_sync(fs);
	if (ret == 0) {
		*gen = generation(fs);
		manifest_durable(*gen);
	}
	return ret;
}

static int usage(const char *argv0)
{
	fprintf(stderr, "usage: %s [--device DEV]... [--record LOG] [--fault SPEC] "
			"[--manifest FILE]\n       [--profile mix|overwrite|fill] [--max-file BYTES] "
			"[--enospc-ok]\n"
			"       IMAGE REFDIR SEED OPS [SYNC_EVERY]\n", argv0);
	return 2;
}

int main(int argc, char **argv)
{
	struct butter_open_opts opts = { 0 };
	struct butter_fs *fs;
	const char *image, *ref;
	char rpath[1024], p1[512], p2[512];
	unsigned ops, i, sync_every;
	unsigned char *buf;
	const char *extra_devs[4];
	uint64_t gen;
	int ret, a = 1;

	while (a < argc && strncmp(argv[a], "--", 2) == 0) {
		const char *o = argv[a];

		if (strcmp(o, "--enospc-ok") == 0) {
			enospc_ok = 1;
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
			record_log = opts.record_log = argv[a + 1];
		} else if (strcmp(o, "--fault") == 0) {
			opts.fault_spec = argv[a + 1];
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
	ref = argv[2];
	rng = strtoull(argv[3], NULL, 0) * 2654435761u + 88172645463325252ull;
	ops = (unsigned)strtoul(argv[4], NULL, 0);
	sync_every = argc > 5 ? (unsigned)strtoul(argv[5], NULL, 0) : 50;
	buf = malloc(maxfile + prof->write_min + prof->write_span + 200001);
	if (!buf)
		return 2;
	ret = butter_open(image, &opts, &fs);
	if (ret) {
		fprintf(stderr, "open %s: %s\n", image, strerror(-ret));
		return 2;
	}
	the_fs = fs;
	gen = generation(fs);
	manifest_state(fs, gen);
	manifest_durable(gen);
	for (i = 1; i < NDIRS; i++) {
		butter_ino_t dir, out;
		const char *name;
		struct butter_new_inode a = { .mode = S_IFDIR | 0755 };

		snprintf(rpath, sizeof(rpath), "%s/%s", ref, dirs[i]);
		mkdir(rpath, 0755);
		parent_of(fs, dirs[i], &dir, &name);
		butter_create(fs, dir, name, strlen(name), &a, &out);
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
		snprintf(rpath, sizeof(rpath), "%s/%s", ref, p1);
		{
			/* the kernel follows symlinks where butter's calls name inodes: skip those */
			struct stat lst;

			if (lstat(rpath, &lst) == 0 && S_ISLNK(lst.st_mode) &&
			    (op == OP_WRITE || op == OP_TRUNC || op == OP_SETXATTR ||
			     op == OP_RMXATTR))
				continue;
		}
		if (op == OP_CREATE) { /* create + write */
			struct butter_new_inode a = { .mode = S_IFREG | 0644 };
			int fd = open(rpath, O_CREAT | O_EXCL | O_WRONLY, 0644);

			r = fd < 0 ? -errno : 0;
			if (fd >= 0)
				close(fd);
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_create(fs, dir, name, strlen(name), &a, &ino);
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
			g = butter_resolve(fs, p1, &ino);
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
		} else if (op == OP_TRUNC) {
			uint64_t size = pick(3) == 0 ? 0 : pick(maxfile / 2);
			struct butter_stat st = { 0 };

			r = errno_ret(truncate(rpath, (off_t)size));
			g = butter_resolve(fs, p1, &ino);
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
			char rpath2[1024];
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
			struct butter_new_inode a = { .mode = S_IFDIR | 0750 };

			r = errno_ret(mkdir(rpath, 0750));
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_create(fs, dir, name, strlen(name), &a, &ino);
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
			char rpath2[1024];
			struct stat hst;

			snprintf(rpath2, sizeof(rpath2), "%s/%s", ref, p2);
			if (lstat(rpath, &hst) == 0 && S_ISDIR(hst.st_mode))
				continue;
			r = errno_ret(link(rpath, rpath2));
			g = butter_resolve(fs, p1, &ino);
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
			g = butter_resolve(fs, p1, &ino);
			if (g == 0)
				g = butter_setxattr(fs, ino, xname, val, (size_t)vlen);
			compare("setxattr", p1, r, g);
		} else if (op == OP_RMXATTR) {
			char xname[32];

			snprintf(xname, sizeof(xname), "user.x%u", pick(3));
			r = errno_ret(lremovexattr(rpath, xname));
			g = butter_resolve(fs, p1, &ino);
			if (g == 0)
				g = butter_removexattr(fs, ino, xname);
			compare("removexattr", p1, r, g);
		} else { /* OP_SYMLINK */
			r = errno_ret(symlink("target/of/link", rpath));
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_symlink(fs, dir, name, strlen(name), "target/of/link", 0, 0, &ino);
			compare("symlink", p1, r, g);
		}
		if (generation(fs) != gen) {
			/* the library committed on its own (too much dirty metadata) */
			gen = generation(fs);
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
	butter_close(fs);
	if (manifest)
		fclose(manifest);
	free(buf);
	if (failures) {
		fprintf(stderr, "stopped at op %u of seed %s\n", i, argv[3]);
		return 1;
	}
	printf("%u operations, %u ENOSPC\n", ops, enospc_seen);
	return 0;
}
