/*
 * bench/libmeta.c — what butter's library spends on the metadata operations
 * of bench/io.sh's rounds, with no FUSE in the way: on a fresh image file,
 * 100 directories, then N files in them (create plus a 100-byte write),
 * stat of each directory, lookup, rename and unlink of each file, all on
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

int main(int argc, char **argv)
{
	const char *devs[1];
	struct butter_mkfs_opts mo;
	struct butter_fs *fs;
	butter_ino_t root, dirs[DIRS], ino;
	struct butter_stat st;
	unsigned long per, files;
	char name[32], other[32], data[100];
	double t;
	int ret;

	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: butter-libmeta IMAGE [FILES]\n");
		return 2;
	}
	files = argc == 3 ? strtoul(argv[2], NULL, 10) : 20000;
	per = files / DIRS ? files / DIRS : 1;
	files = per * DIRS;
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
	memset(data, 'x', sizeof(data));

	t = seconds();
	for (int d = 0; d < DIRS && ret == 0; d++)
		for (unsigned long i = 0; i < per && ret == 0; i++) {
			struct butter_new_inode a = { .mode = S_IFREG | 0644 };
			ssize_t n;

			snprintf(name, sizeof(name), "f%06lu", i);
			ret = butter_create(fs, dirs[d], name, strlen(name), &a, &ino);
			n = ret ? 0 : butter_write(fs, ino, data, sizeof(data), 0);
			if (n < 0)
				ret = (int)n;
		}
	if (ret)
		return fail("create", ret);
	report("create+write", t, files);

	t = seconds();
	for (unsigned long k = 0; k < files && ret == 0; k++)
		ret = butter_stat(fs, dirs[k % DIRS], &st);
	if (ret)
		return fail("stat", ret);
	report("stat (dir)", t, files);

	t = seconds();
	for (int d = 0; d < DIRS && ret == 0; d++)
		for (unsigned long i = 0; i < per && ret == 0; i++) {
			snprintf(name, sizeof(name), "f%06lu", i);
			ret = butter_lookup(fs, dirs[d], name, strlen(name), &ino);
		}
	if (ret)
		return fail("lookup", ret);
	report("lookup", t, files);

	t = seconds();
	for (int d = 0; d < DIRS && ret == 0; d++)
		for (unsigned long i = 0; i < per && ret == 0; i++) {
			snprintf(name, sizeof(name), "f%06lu", i);
			snprintf(other, sizeof(other), "g%06lu", i);
			ret = butter_rename(fs, dirs[d], name, strlen(name), dirs[d], other,
					    strlen(other), 0);
		}
	if (ret)
		return fail("rename", ret);
	report("rename", t, files);

	t = seconds();
	for (int d = 0; d < DIRS && ret == 0; d++)
		for (unsigned long i = 0; i < per && ret == 0; i++) {
			snprintf(name, sizeof(name), "g%06lu", i);
			ret = butter_unlink(fs, dirs[d], name, strlen(name));
		}
	if (ret)
		return fail("unlink", ret);
	report("unlink", t, files);
	butter_close(fs);
	return 0;
}
