/*
 * list-and-read.c — the smallest program on libbutter: open a btrfs image
 * read-only, list a directory in it, print a file of it to standard output.
 * Built against the installed library (README, "Using the library"):
 *
 *   cc list-and-read.c $(pkg-config --cflags --libs butter) -o list-and-read
 *   ./list-and-read fs.img /some/dir /some/dir/file
 *
 * Lines on standard output: "entry NAME TYPE" for each entry of the directory
 * (TYPE: dir, file, link or other), then the file's bytes. Errors go to
 * standard error with the call that failed; the exit status is 1.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <butter/butter.h>

static int print_entry(void *arg, const char *name, size_t namelen, butter_ino_t ino,
		       unsigned dtype, uint64_t next_pos)
{
	(void)arg;
	(void)ino;
	(void)next_pos;
	printf("entry %.*s %s\n", (int)namelen, name,
	       dtype == DT_DIR ? "dir" : dtype == DT_REG ? "file" : dtype == DT_LNK ? "link" : "other");
	return 0;
}

static int fail(const char *what, const char *arg, int err)
{
	fprintf(stderr, "list-and-read: %s %s: %s\n", what, arg, strerror(-err));
	return 1;
}

int main(int argc, char **argv)
{
	struct butter_open_opts opts;
	struct butter_fs *fs;
	butter_ino_t dir, file;
	char buf[65536];
	uint64_t off = 0;
	ssize_t n;
	int ret;

	if (argc != 4) {
		fprintf(stderr, "usage: list-and-read IMAGE DIR FILE (libbutter %s)\n", butter_version());
		return 2;
	}
	memset(&opts, 0, sizeof(opts));
	opts.flags = BUTTER_OPEN_RDONLY;
	ret = butter_open(argv[1], &opts, &fs);
	if (ret)
		return fail("butter_open", argv[1], ret);
	ret = butter_resolve(fs, argv[2], &dir);
	if (ret == 0)
		ret = butter_readdir(fs, dir, 0, print_entry, NULL);
	if (ret) {
		butter_close(fs);
		return fail("listing", argv[2], ret);
	}
	ret = butter_resolve(fs, argv[3], &file);
	while (ret == 0 && (n = butter_read(fs, file, buf, sizeof(buf), off)) != 0) {
		if (n < 0) {
			ret = (int)n;
			break;
		}
		fwrite(buf, 1, (size_t)n, stdout);
		off += (uint64_t)n;
	}
	butter_close(fs);
	return ret ? fail("reading", argv[3], ret) : 0;
}
