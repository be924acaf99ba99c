/*
 * bench/libmeta.c — what butter's library spends on the metadata operations
 * of bench/io.sh's rounds, with no FUSE in the way: on a fresh image file,
 * 100 directories, then N files in them (create plus a 100-byte write),
 * stat of each directory, lookup, rename, lookup plus a ctime SETATTR (what
 * the kernel sends after a rename) and unlink of each file, all on
 * one thread with hot caches. Prints microseconds per operation: the floor
 * of what a request of that kind costs the daemon (bench/RESULTS.md, "what a
 * metadata request costs butter").
 *
 * Usage: butter-libmeta IMAGE [FILES]   (IMAGE: a file, made anew: an 8 GiB
 * sparse image; FILES default 20000)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "butter/butter.h"

#define DIRS 100

static double seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void report(const char *what, double start, unsigned long n)
{
	printf("%-14s %8.3f us\n", what, (seconds() - start) / (double)n * 1e6);
}

static int fail(const char *what, int ret)
{
	fprintf(stderr, "butter-libmeta: %s: %s\n", what, strerror(-ret));
	return 1;
}

/* One operation on file @i of directory @dir: 0 or a negative errno. */
typedef int (*file_op)(struct butter_fs *fs, butter_ino_t dir, unsigned long i);

static int create_one(struct butter_fs *fs, butter_ino_t dir, unsigned long i)
{
	struct butter_new_inode a = { .mode = S_IFREG | 0644 };
	char name[32], data[100];
	butter_ino_t ino;
	ssize_t n;
	int ret;

	snprintf(name, sizeof(name), "f%06lu", i);
	ret = butter_create(fs, dir, name, strlen(name), &a, &ino);
	if (ret)
		return ret;
	memset(data, 'x', sizeof(data));
	n = butter_write(fs, ino, data, sizeof(data), 0);
	return n < 0 ? (int)n : 0;
}

static int lookup_one(struct butter_fs *fs, butter_ino_t dir, unsigned long i)
{
	char name[32];
	butter_ino_t ino;

	snprintf(name, sizeof(name), "f%06lu", i);
	return butter_lookup(fs, dir, name, strlen(name), &ino);
}

static int rename_one(struct butter_fs *fs, butter_ino_t dir, unsigned long i)
{
	char name[32], other[32];

	snprintf(name, sizeof(name), "f%06lu", i);
	snprintf(other, sizeof(other), "g%06lu", i);
	return butter_rename(fs, dir, name, strlen(name), dir, other, strlen(other), 0);
}

/* The SETATTR the kernel sends after a rename: the ctime it set, as op_setattr passes it. */
static int setattr_one(struct butter_fs *fs, butter_ino_t dir, unsigned long i)
{
	struct butter_stat st, out;
	char name[32];
	butter_ino_t ino;
	int ret;

	snprintf(name, sizeof(name), "g%06lu", i);
	ret = butter_lookup(fs, dir, name, strlen(name), &ino);
	if (ret)
		return ret;
	memset(&st, 0, sizeof(st));
	clock_gettime(CLOCK_REALTIME, &st.ctime);
	return butter_setattr_stat(fs, ino, &st, BUTTER_SET_CTIME | BUTTER_SET_KEEP_FILE_TIMES, &out);
}

static int unlink_one(struct butter_fs *fs, butter_ino_t dir, unsigned long i)
{
	char name[32];

	snprintf(name, sizeof(name), "g%06lu", i);
	return butter_unlink(fs, dir, name, strlen(name));
}

static int stat_dir(struct butter_fs *fs, butter_ino_t dir, unsigned long i)
{
	struct butter_stat st;

	(void)i;
	return butter_stat(fs, dir, &st);
}

/* @op on every file, directory by directory as io.sh's rounds go; report the time per file. */
static int phase(struct butter_fs *fs, const butter_ino_t *dirs, unsigned long per, const char *what,
		 file_op op)
{
	double start = seconds();
	int ret = 0;

	for (int d = 0; d < DIRS && ret == 0; d++)
		for (unsigned long i = 0; i < per && ret == 0; i++)
			ret = op(fs, dirs[d], i);
	if (ret)
		return fail(what, ret);
	report(what, start, per * DIRS);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct {
		const char *what;
		file_op op;
	} phases[] = {
		{ "create+write", create_one }, { "stat (dir)", stat_dir }, { "lookup", lookup_one },
		{ "rename", rename_one }, { "lookup+setattr", setattr_one }, { "unlink", unlink_one },
	};
	const char *devs[1];
	struct butter_mkfs_opts mo;
	struct butter_fs *fs;
	butter_ino_t root, dirs[DIRS];
	unsigned long per;
	char name[32];
	int ret;

	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: butter-libmeta IMAGE [FILES]\n");
		return 2;
	}
	per = (argc == 3 ? strtoul(argv[2], NULL, 10) : 20000) / DIRS;
	if (per == 0)
		per = 1;
	devs[0] = argv[1];
	memset(&mo, 0, sizeof(mo));
	mo.devices = devs;
	mo.ndevices = 1;
	mo.csum_type = -1;
	mo.size = 8ULL << 30;
	mo.force = 1;
	ret = butter_mkfs(&mo);
	if (ret)
		return fail("mkfs", ret);
	ret = butter_open(argv[1], NULL, &fs);
	if (ret)
		return fail("open", ret);
	ret = butter_resolve(fs, "/", &root);
	for (int d = 0; d < DIRS && ret == 0; d++) {
		struct butter_new_inode a = { .mode = S_IFDIR | 0755 };

		snprintf(name, sizeof(name), "d%03d", d);
		ret = butter_create(fs, root, name, strlen(name), &a, &dirs[d]);
	}
	if (ret)
		return fail("mkdir", ret);
	for (size_t k = 0; k < sizeof(phases) / sizeof(phases[0]) && ret == 0; k++)
		ret = phase(fs, dirs, per, phases[k].what, phases[k].op);
	butter_close(fs);
	return ret;
}
