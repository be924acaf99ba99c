/*
 * workload.c — a seeded random sequence of file operations applied both to a
 * btrfs image through libbutter and to a reference directory on the host, so
 * that the caller (tests/integration/test_write_workload.py) can check the
 * image with btrfs check, mount it with the kernel and compare both trees.
 *
 * usage: butter-workload IMAGE REFDIR SEED OPS [SYNC_EVERY]
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
 * btrfs, where the kernel's answers are btrfs's own.
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
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "butter/butter.h"

#define NDIRS 6
#define NNAMES 12
#define MAXFILE (3u << 20)
#define SECTOR 4096u

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

/* Per operation: how often it ran and how often the kernel said yes (printed at the end). */
static struct {
	const char *what;
	unsigned runs, ok;
} tally[16];

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

static void compare(const char *what, const char *path, int ref, int got)
{
	count(what, ref == 0);
	if (ref != got) {
		fprintf(stderr, "MISMATCH %s %s: reference %d (%s), butter %d (%s)\n", what, path, ref,
			ref ? strerror(-ref) : "ok", got, got ? strerror(-got) : "ok");
		failures++;
	}
}

static int errno_ret(int r)
{
	return r < 0 ? -errno : 0;
}

/* A random offset: sector-aligned but one time in @odd. */
static uint64_t rand_off(uint64_t limit, unsigned odd)
{
	uint64_t off = limit ? next_rand() % limit : 0;

	return pick(odd) ? off / SECTOR * SECTOR : off;
}

/* Pick a path from the pool, preferring (a few tries) one that is a regular file in @ref. */
static void pick_file(const char *ref, char *path, size_t cap)
{
	char rpath[1024];
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
static void op_fallocate(struct butter_fs *fs, const char *ref)
{
	char rpath[1024], p1[512];
	static const int modes[] = {
		0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		FALLOC_FL_ZERO_RANGE, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
		0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		FALLOC_FL_ZERO_RANGE,
		FALLOC_FL_PUNCH_HOLE,                       /* EOPNOTSUPP: needs KEEP_SIZE */
		FALLOC_FL_COLLAPSE_RANGE,                   /* EOPNOTSUPP on btrfs */
	};
	int mode = modes[pick(sizeof(modes) / sizeof(modes[0]))];
	uint64_t off = rand_off(MAXFILE / 2, 4);
	uint64_t len = pick(50) == 0 ? 0 : 1 + pick(pick(3) == 0 ? 300000 : 20000);
	butter_ino_t ino;
	struct stat lst;
	int fd, r, g;

	pick_file(ref, p1, sizeof(p1));
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
	g = butter_resolve(fs, p1, &ino);
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
static void op_clone(struct butter_fs *fs, const char *ref)
{
	char rsrc[1024], rdst[1024], p1[512], p2[512];
	struct file_clone_range arg;
	struct stat sst, dst_st;
	uint64_t ssize, dsize, soff, doff, len;
	butter_ino_t src, dst;
	int sfd, dfd, r, g;

	pick_file(ref, p1, sizeof(p1));
	if (pick(4) == 0)
		snprintf(p2, sizeof(p2), "%s", p1);
	else
		pick_file(ref, p2, sizeof(p2));
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
	doff = pick(3) == 0 ? rand_off(MAXFILE / 2, 10) : rand_off(dsize + 2 * SECTOR, 10);
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
	g = butter_resolve(fs, p1, &src);
	if (g == 0)
		g = butter_resolve(fs, p2, &dst);
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

int main(int argc, char **argv)
{
	struct butter_open_opts opts = { 0 };
	struct butter_fs *fs;
	const char *image, *ref;
	char rpath[1024], p1[512], p2[512];
	unsigned ops, i, sync_every;
	unsigned char *buf;
	int ret;

	if (argc < 5) {
		fprintf(stderr, "usage: %s IMAGE REFDIR SEED OPS [SYNC_EVERY]\n", argv[0]);
		return 2;
	}
	image = argv[1];
	ref = argv[2];
	rng = strtoull(argv[3], NULL, 0) * 2654435761u + 88172645463325252ull;
	ops = (unsigned)strtoul(argv[4], NULL, 0);
	sync_every = argc > 5 ? (unsigned)strtoul(argv[5], NULL, 0) : 50;
	buf = malloc(MAXFILE);
	if (!buf)
		return 2;
	ret = butter_open(image, &opts, &fs);
	if (ret) {
		fprintf(stderr, "open %s: %s\n", image, strerror(-ret));
		return 2;
	}
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
		unsigned op = pick(100);
		const char *d1 = dirs[pick(NDIRS)], *d2 = dirs[pick(NDIRS)];
		butter_ino_t dir, dir2, ino;
		const char *name, *name2;
		int r, g;

		make_path(p1, sizeof(p1), d1, pick(NNAMES));
		make_path(p2, sizeof(p2), d2, pick(NNAMES));
		snprintf(rpath, sizeof(rpath), "%s/%s", ref, p1);
		{
			/* the kernel follows symlinks where butter's calls name inodes: skip those */
			struct stat lst;

			if (lstat(rpath, &lst) == 0 && S_ISLNK(lst.st_mode) &&
			    ((op >= 16 && op < 56) || (op >= 90 && op < 98)))
				continue;
		}
		if (op < 16) { /* create + write */
			struct butter_new_inode a = { .mode = S_IFREG | 0644 };
			int fd = open(rpath, O_CREAT | O_EXCL | O_WRONLY, 0644);

			r = fd < 0 ? -errno : 0;
			if (fd >= 0)
				close(fd);
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_create(fs, dir, name, strlen(name), &a, &ino);
			compare("create", p1, r, g);
		} else if (op < 37) { /* write at a random place */
			uint64_t off = pick(4) == 0 ? 0 : pick(MAXFILE / 2);
			size_t len = 1 + pick(pick(3) == 0 ? 200000 : 9000);
			int fd = open(rpath, O_WRONLY);
			size_t k;

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
		} else if (op < 45) { /* fallocate */
			op_fallocate(fs, ref);
		} else if (op < 51) { /* clone */
			op_clone(fs, ref);
		} else if (op < 56) { /* truncate */
			uint64_t size = pick(3) == 0 ? 0 : pick(MAXFILE / 2);
			struct butter_stat st = { 0 };

			r = errno_ret(truncate(rpath, (off_t)size));
			g = butter_resolve(fs, p1, &ino);
			if (g == 0) {
				st.size = size;
				g = butter_setattr(fs, ino, &st, BUTTER_SET_SIZE);
			}
			compare("truncate", p1, r, g);
		} else if (op < 65) { /* unlink */
			struct stat hst;

			if (lstat(rpath, &hst) == 0 && S_ISDIR(hst.st_mode))
				continue; /* unlink(2) of a dir differs by errno across systems */
			r = errno_ret(unlink(rpath));
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_unlink(fs, dir, name, strlen(name));
			compare("unlink", p1, r, g);
		} else if (op < 74) { /* rename */
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
		} else if (op < 80) { /* mkdir */
			struct butter_new_inode a = { .mode = S_IFDIR | 0750 };

			r = errno_ret(mkdir(rpath, 0750));
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_create(fs, dir, name, strlen(name), &a, &ino);
			compare("mkdir", p1, r, g);
		} else if (op < 85) { /* rmdir */
			r = errno_ret(rmdir(rpath));
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_rmdir(fs, dir, name, strlen(name));
			if (r == -EEXIST)
				r = -ENOTEMPTY;
			compare("rmdir", p1, r, g);
		} else if (op < 90) { /* link */
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
		} else if (op < 95) { /* setxattr */
			char val[64];
			int vlen = snprintf(val, sizeof(val), "v%llu", (unsigned long long)next_rand());
			char xname[32];

			snprintf(xname, sizeof(xname), "user.x%u", pick(3));
			r = errno_ret(lsetxattr(rpath, xname, val, (size_t)vlen, 0));
			g = butter_resolve(fs, p1, &ino);
			if (g == 0)
				g = butter_setxattr(fs, ino, xname, val, (size_t)vlen);
			compare("setxattr", p1, r, g);
		} else if (op < 98) { /* removexattr */
			char xname[32];

			snprintf(xname, sizeof(xname), "user.x%u", pick(3));
			r = errno_ret(lremovexattr(rpath, xname));
			g = butter_resolve(fs, p1, &ino);
			if (g == 0)
				g = butter_removexattr(fs, ino, xname);
			compare("removexattr", p1, r, g);
		} else { /* symlink */
			r = errno_ret(symlink("target/of/link", rpath));
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_symlink(fs, dir, name, strlen(name), "target/of/link", 0, 0, &ino);
			compare("symlink", p1, r, g);
		}
		if (sync_every && i % sync_every == sync_every - 1) {
			ret = butter_sync(fs);
			if (ret) {
				fprintf(stderr, "sync after op %u: %s\n", i, strerror(-ret));
				failures++;
			}
		}
	}
	butter_close(fs);
	free(buf);
	if (failures) {
		fprintf(stderr, "stopped at op %u of seed %s\n", i, argv[3]);
		return 1;
	}
	printf("%u operations\n", ops);
	for (i = 0; i < sizeof(tally) / sizeof(tally[0]) && tally[i].what; i++)
		printf("%s %u ok %u\n", tally[i].what, tally[i].runs, tally[i].ok);
	return 0;
}
