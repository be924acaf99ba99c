/*
 * logtool.c — drive butter_fsync() and then "lose power": file operations on
 * an image through libbutter, read from stdin, for tests/integration/
 * test_tree_log.py.
 *
 * usage: butter-logtool IMAGE < COMMANDS
 *
 * One command per line; paths are from the top-level subvolume's root:
 *   create PATH | mkdir PATH | unlink PATH
 *   write PATH OFF LEN SEED          LEN bytes made from SEED (see tool_fill())
 *   writec PATH OFF LEN SEED         LEN compressible bytes (see fill_pattern())
 *   truncate PATH SIZE
 *   falloc PATH MODE OFF LEN         MODE: Linux FALLOC_FL_* bits
 *   setxattr PATH NAME VALUE | rmxattr PATH NAME
 *   link SRC DST | rename SRC DST
 *   subvol PATH                      a new subvolume
 *   snapshot SRC PATH                a snapshot of the subvolume SRC (committed)
 *   compress SPEC                    butter_set_compression(SPEC, force)
 *   fsync PATH...                    butter_fsync() (one) or butter_fsync_many()
 *   fdatasync PATH
 *   sync                             butter_sync(): a commit
 *   crash                            _exit(0) at once: no commit, no close
 * For each command one line goes to stdout: "0" or the negative errno. At the
 * end of input the handle is closed (a commit). Exit status 2 on usage errors.
 *
 * Environment: BUTTER_RECORD=LOG records every device write and flush
 * (lib/device/recorder.c); then after each command "POS" (the log's size
 * when the command returned: every record before it reached the disk) is
 * added to its output line, for the power-cut test. BUTTER_LOG_LEVEL=N: the
 * library's messages up to level N (3: why an fsync committed).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "butter/butter.h"
#include "butter/testing.h"
#include "toolutil.h"

#define MAX_PATHS 256

/* Compressible bytes: runs of 64 equal bytes (test_tree_log.py: pattern()). */
static void fill_pattern(unsigned char *buf, uint64_t len, uint64_t seed)
{
	uint64_t i;

	for (i = 0; i < len; i++)
		buf[i] = (unsigned char)((i / 64) * 7 + seed);
}

static int do_new(struct butter_fs *fs, const char *path, uint32_t mode)
{
	struct butter_new_inode a = { 0 };
	butter_ino_t dir, out;
	const char *name;
	int ret = tool_parent_of(fs, path, &dir, &name);

	a.mode = mode;
	return ret ? ret : butter_create(fs, dir, name, strlen(name), &a, &out);
}

static int do_fsync(struct butter_fs *fs, char *rest, int datasync)
{
	butter_ino_t inos[MAX_PATHS];
	size_t n = 0;
	char *tok, *save = NULL;
	int ret;

	for (tok = strtok_r(rest, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save)) {
		if (n == MAX_PATHS)
			return -E2BIG;
		ret = butter_resolve(fs, tok, &inos[n++]);
		if (ret)
			return ret;
	}
	if (n == 1)
		return butter_fsync(fs, inos[0], datasync);
	return butter_fsync_many(fs, inos, n, datasync);
}

static int run(struct butter_fs *fs, char *line)
{
	char cmd[32], a[4096], b[4096], c[4096];
	long long x, y, z;
	butter_ino_t ino, dir;
	const char *name;
	int ret;

	if (sscanf(line, "%31s", cmd) != 1)
		return 1;
	if (!strcmp(cmd, "create") && sscanf(line, "%*s %4095s", a) == 1)
		return do_new(fs, a, S_IFREG | 0644);
	if (!strcmp(cmd, "mkdir") && sscanf(line, "%*s %4095s", a) == 1)
		return do_new(fs, a, S_IFDIR | 0755);
	if (!strcmp(cmd, "unlink") && sscanf(line, "%*s %4095s", a) == 1) {
		ret = tool_parent_of(fs, a, &dir, &name);
		return ret ? ret : butter_unlink(fs, dir, name, strlen(name));
	}
	if ((!strcmp(cmd, "write") || !strcmp(cmd, "writec")) &&
	    sscanf(line, "%*s %4095s %lli %lli %lli", a, &x, &y, &z) == 4) {
		unsigned char *buf = malloc(y ? (size_t)y : 1);
		ssize_t n;

		if (!buf)
			return -ENOMEM;
		if (cmd[5] == 'c')
			fill_pattern(buf, (uint64_t)y, (uint64_t)z);
		else
			tool_fill(buf, (uint64_t)y, (uint64_t)z);
		ret = butter_resolve(fs, a, &ino);
		n = ret ? ret : butter_write(fs, ino, buf, (size_t)y, (uint64_t)x);
		free(buf);
		return n < 0 ? (int)n : n == y ? 0 : -EIO;
	}
	if (!strcmp(cmd, "truncate") && sscanf(line, "%*s %4095s %lli", a, &x) == 2) {
		struct butter_stat st = { 0 };

		st.size = (uint64_t)x;
		ret = butter_resolve(fs, a, &ino);
		return ret ? ret : butter_setattr(fs, ino, &st, BUTTER_SET_SIZE);
	}
	if (!strcmp(cmd, "falloc") &&
	    sscanf(line, "%*s %4095s %lli %lli %lli", a, &x, &y, &z) == 4) {
		ret = butter_resolve(fs, a, &ino);
		return ret ? ret : butter_fallocate(fs, ino, (int)x, (uint64_t)y, (uint64_t)z);
	}
	if (!strcmp(cmd, "setxattr") && sscanf(line, "%*s %4095s %4095s %4095s", a, b, c) == 3) {
		ret = butter_resolve(fs, a, &ino);
		return ret ? ret : butter_setxattr(fs, ino, b, c, strlen(c));
	}
	if (!strcmp(cmd, "rmxattr") && sscanf(line, "%*s %4095s %4095s", a, b) == 2) {
		ret = butter_resolve(fs, a, &ino);
		return ret ? ret : butter_removexattr(fs, ino, b);
	}
	if (!strcmp(cmd, "link") && sscanf(line, "%*s %4095s %4095s", a, b) == 2) {
		ret = butter_resolve(fs, a, &ino);
		if (ret == 0)
			ret = tool_parent_of(fs, b, &dir, &name);
		return ret ? ret : butter_link(fs, ino, dir, name, strlen(name));
	}
	if (!strcmp(cmd, "rename") && sscanf(line, "%*s %4095s %4095s", a, b) == 2) {
		butter_ino_t odir;
		const char *oname;

		ret = tool_parent_of(fs, a, &odir, &oname);
		if (ret == 0)
			ret = tool_parent_of(fs, b, &dir, &name);
		return ret ? ret : butter_rename(fs, odir, oname, strlen(oname), dir, name,
						 strlen(name), 0);
	}
	if (!strcmp(cmd, "subvol") && sscanf(line, "%*s %4095s", a) == 1) {
		uint64_t id;

		ret = tool_parent_of(fs, a, &dir, &name);
		return ret ? ret : butter_subvol_create(fs, dir, name, strlen(name), &id);
	}
	if (!strcmp(cmd, "snapshot") && sscanf(line, "%*s %4095s %4095s", a, b) == 2) {
		uint64_t id;

		ret = butter_resolve(fs, a, &ino);
		if (ret == 0)
			ret = tool_parent_of(fs, b, &dir, &name);
		return ret ? ret : butter_snapshot(fs, ino.subvol, dir, name, strlen(name), 0, &id);
	}
	if (!strcmp(cmd, "compress") && sscanf(line, "%*s %4095s", a) == 1)
		return butter_set_compression(fs, a, 1);
	if (!strcmp(cmd, "fsync"))
		return do_fsync(fs, line + 5, 0);
	if (!strcmp(cmd, "fdatasync"))
		return do_fsync(fs, line + 9, 1);
	if (!strcmp(cmd, "sync"))
		return butter_sync(fs);
	if (!strcmp(cmd, "crash")) {
		fflush(stdout);
		_exit(0);
	}
	return 1;
}

int main(int argc, char **argv)
{
	struct butter_open_opts opts = { 0 };
	struct butter_test_devices test = { 0 };
	struct butter_fs *fs;
	char line[16384];
	int ret;

	if (argc != 2) {
		fprintf(stderr, "usage: %s IMAGE < COMMANDS\n", argv[0]);
		return 2;
	}
	if (getenv("BUTTER_LOG_LEVEL"))
		opts.log_level = atoi(getenv("BUTTER_LOG_LEVEL"));
	test.record_log = getenv("BUTTER_RECORD");
	ret = butter_open_testing(argv[1], &opts, &test, &fs);
	if (ret) {
		fprintf(stderr, "%s: %s\n", argv[1], strerror(-ret));
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin)) {
		ret = run(fs, line);
		if (ret == 1) {
			fprintf(stderr, "cannot parse: %s", line);
			butter_close(fs);
			return 2;
		}
		if (test.record_log) {
			struct stat st;

			if (stat(test.record_log, &st) < 0) {
				perror(test.record_log);
				return 2;
			}
			printf("%d %lld\n", ret, (long long)st.st_size);
		} else {
			printf("%d\n", ret);
		}
	}
	butter_close(fs);
	return 0;
}
