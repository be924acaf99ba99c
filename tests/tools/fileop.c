/*
 * fileop.c — apply single file operations to a btrfs image through libbutter,
 * for integration tests that need the library itself rather than a mount.
 *
 * usage: butter-fileop IMAGE < COMMANDS
 *
 * One command per line; paths are from the top-level subvolume's root:
 *   create PATH                      an empty regular file (mode 0644)
 *   write PATH OFF LEN SEED          LEN pseudo-random bytes made from SEED
 *   truncate PATH SIZE
 *   falloc PATH MODE OFF LEN         MODE: Linux FALLOC_FL_* bits (decimal or 0x..)
 *   clone SRC SRC_OFF DST DST_OFF LEN
 *   sync
 * For each command one line goes to stdout: "0" or the negative errno. The
 * image is committed at the end (butter_close). Exit status 0 unless the
 * image cannot be opened or a line cannot be parsed (2).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "butter/butter.h"
#include "toolutil.h"

static int do_write(struct butter_fs *fs, const char *path, uint64_t off, uint64_t len,
		    uint64_t seed)
{
	butter_ino_t ino;
	unsigned char *buf;
	ssize_t n;
	int ret = butter_resolve(fs, path, &ino);

	if (ret)
		return ret;
	buf = malloc(len ? len : 1);
	if (!buf)
		return -ENOMEM;
	tool_fill(buf, len, seed);
	n = butter_write(fs, ino, buf, len, off);
	free(buf);
	return n < 0 ? (int)n : 0;
}

static int run(struct butter_fs *fs, char *line)
{
	char cmd[32], a[4096], b[4096];
	unsigned long long x, y, z;
	butter_ino_t ino, ino2, dir;
	const char *name;
	int ret;

	if (sscanf(line, "%31s", cmd) != 1)
		return 1;
	if (!strcmp(cmd, "create") && sscanf(line, "%*s %4095s", a) == 1) {
		struct butter_new_inode attr = { .mode = S_IFREG | 0644 };

		ret = tool_parent_of(fs, a, &dir, &name);
		return ret ? ret : butter_create(fs, dir, name, strlen(name), &attr, &ino);
	}
	if (!strcmp(cmd, "write") && sscanf(line, "%*s %4095s %lli %lli %lli", a, &x, &y, &z) == 4)
		return do_write(fs, a, x, y, z);
	if (!strcmp(cmd, "truncate") && sscanf(line, "%*s %4095s %lli", a, &x) == 2) {
		struct butter_stat st = { 0 };

		st.size = x;
		ret = butter_resolve(fs, a, &ino);
		return ret ? ret : butter_setattr(fs, ino, &st, BUTTER_SET_SIZE);
	}
	if (!strcmp(cmd, "falloc") && sscanf(line, "%*s %4095s %lli %lli %lli", a, &x, &y, &z) == 4) {
		ret = butter_resolve(fs, a, &ino);
		return ret ? ret : butter_fallocate(fs, ino, (int)x, y, z);
	}
	if (!strcmp(cmd, "clone") &&
	    sscanf(line, "%*s %4095s %lli %4095s %lli %lli", a, &x, b, &y, &z) == 5) {
		ret = butter_resolve(fs, a, &ino);
		if (ret == 0)
			ret = butter_resolve(fs, b, &ino2);
		return ret ? ret : butter_clone_range(fs, ino, x, ino2, y, z);
	}
	if (!strcmp(cmd, "sync"))
		return butter_sync(fs);
	return 1;
}

int main(int argc, char **argv)
{
	struct butter_open_opts opts = { 0 };
	struct butter_fs *fs;
	char line[8192];
	int ret, status = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: %s IMAGE < COMMANDS\n", argv[0]);
		return 2;
	}
	ret = butter_open(argv[1], &opts, &fs);
	if (ret) {
		fprintf(stderr, "open %s: %s\n", argv[1], strerror(-ret));
		return 2;
	}
	while (fgets(line, sizeof(line), stdin)) {
		if (line[0] == '\n' || line[0] == '#')
			continue;
		ret = run(fs, line);
		if (ret == 1) {
			fprintf(stderr, "cannot parse: %s", line);
			status = 2;
			break;
		}
		printf("%d\n", ret);
		fflush(stdout);
	}
	butter_close(fs);
	return status;
}
