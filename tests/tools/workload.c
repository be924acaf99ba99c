/*
 * workload.c — a seeded random sequence of file operations applied both to a
 * btrfs image through libbutter and to a reference directory on the host, so
 * that the caller (tests/integration/test_write_workload.py) can check the
 * image with btrfs check, mount it with the kernel and compare both trees.
 *
 * usage: butter-workload IMAGE REFDIR SEED OPS [SYNC_EVERY]
 *
 * Every operation is first applied to the reference with POSIX calls; the
 * library must then succeed or fail exactly as the kernel did (same errno),
 * otherwise the program stops with exit status 1 and says which step. Paths
 * are kept in a small pool so that operations collide (renames over existing
 * names, unlinks of hard links, writes to renamed files...).
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

#define NDIRS 6
#define NNAMES 12
#define MAXFILE (3u << 20)

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

static void compare(const char *what, const char *path, int ref, int got)
{
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
		struct butter_new_inode a = { S_IFDIR | 0755, 0, 0, 0 };

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
			    ((op >= 18 && op < 53) || (op >= 90 && op < 98)))
				continue;
		}
		if (op < 18) { /* create + write */
			struct butter_new_inode a = { S_IFREG | 0644, 0, 0, 0 };
			int fd = open(rpath, O_CREAT | O_EXCL | O_WRONLY, 0644);

			r = fd < 0 ? -errno : 0;
			if (fd >= 0)
				close(fd);
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_create(fs, dir, name, strlen(name), &a, &ino);
			compare("create", p1, r, g);
		} else if (op < 45) { /* write at a random place */
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
		} else if (op < 53) { /* truncate */
			uint64_t size = pick(3) == 0 ? 0 : pick(MAXFILE / 2);
			struct butter_stat st = { 0 };

			r = errno_ret(truncate(rpath, (off_t)size));
			g = butter_resolve(fs, p1, &ino);
			if (g == 0) {
				st.size = size;
				g = butter_setattr(fs, ino, &st, BUTTER_SET_SIZE);
			}
			compare("truncate", p1, r, g);
		} else if (op < 63) { /* unlink */
			struct stat hst;

			if (lstat(rpath, &hst) == 0 && S_ISDIR(hst.st_mode))
				continue; /* unlink(2) of a dir differs by errno across systems */
			r = errno_ret(unlink(rpath));
			g = parent_of(fs, p1, &dir, &name);
			if (g == 0)
				g = butter_unlink(fs, dir, name, strlen(name));
			compare("unlink", p1, r, g);
		} else if (op < 73) { /* rename */
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
			struct butter_new_inode a = { S_IFDIR | 0750, 0, 0, 0 };

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
	return 0;
}
