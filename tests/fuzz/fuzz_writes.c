/*
 * fuzz_writes.c — the fixed sequence of changes the write-path harness runs
 * on a (mutated) image (see fuzz_writes.h).
 *
 * The sequence is fixed so a finding replays exactly; what varies is the
 * image: existing inodes, extents, directory items, the extent tree, free
 * space tree and block group items the changes have to COW, split, drop and
 * account. Budgets (entries touched, bytes written) keep one run short. A
 * result the API contract rules out (a write reporting more bytes than asked,
 * a positive error) abort()s, as in fuzz_walk.c.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "butter/butter.h"
#include "butter/testing.h"
#include "fuzz_walk.h"
#include "fuzz_writes.h"

#define MAX_EXISTING 12     /* entries of the top directory changed */
#define BUF_BYTES (24u << 10)

#define CONTRACT(cond) FUZZ_CONTRACT("fuzz_writes", cond)

struct run {
	struct butter_fs *fs;
	int verbose;
	int failures;
	uint8_t buf[BUF_BYTES];
};

static void note(struct run *r, const char *what, const char *name, long long ret)
{
	CONTRACT(ret >= -4095);
	if (ret < 0)
		r->failures++;
	if (r->verbose)
		printf("%-10s %-24s -> %lld%s%s\n", what, name, ret, ret < 0 ? " " : "",
		       ret < 0 ? strerror((int)-ret) : "");
}

static void do_write(struct run *r, butter_ino_t ino, const char *name, size_t len, uint64_t off)
{
	ssize_t n;

	if (len > BUF_BYTES)
		len = BUF_BYTES;
	n = butter_write(r->fs, ino, r->buf, len, off);
	CONTRACT(n < 0 || (size_t)n == len);
	note(r, "write", name, n);
}

static int lookup(struct run *r, butter_ino_t dir, const char *name, butter_ino_t *out)
{
	int ret = butter_lookup(r->fs, dir, name, strlen(name), out);

	note(r, "lookup", name, ret);
	return ret;
}

struct names {
	char name[MAX_EXISTING][256];
	butter_ino_t ino[MAX_EXISTING];
	unsigned dtype[MAX_EXISTING];
	size_t n;
};

static int collect(void *arg, const char *name, size_t namelen, butter_ino_t ino, unsigned dtype,
		   uint64_t next_pos)
{
	struct names *ns = arg;

	(void)next_pos;
	CONTRACT(namelen > 0 && namelen <= 255);
	if (namelen >= 3 && memcmp(name, "fz-", 3) == 0)
		return 0; /* ours */
	memcpy(ns->name[ns->n], name, namelen);
	ns->name[ns->n][namelen] = '\0';
	ns->ino[ns->n] = ino;
	ns->dtype[ns->n] = dtype;
	return ++ns->n == MAX_EXISTING;
}

/* Files, a directory, a symlink, a hard link, an xattr and a rename, all new. */
static void new_things(struct run *r, butter_ino_t root)
{
	struct butter_new_inode file = { .mode = S_IFREG | 0644, .uid = 1000, .gid = 1000 };
	struct butter_new_inode dir = { .mode = S_IFDIR | 0755 };
	butter_ino_t f, small, d, ino;

	note(r, "create", "fz-file", butter_create(r->fs, root, "fz-file", 7, &file, &f));
	if (lookup(r, root, "fz-file", &f) == 0) {
		do_write(r, f, "fz-file", 10000, 0);
		do_write(r, f, "fz-file", 5000, 3000);   /* overwrite the middle */
		do_write(r, f, "fz-file", 100, 20000);   /* past a hole */
		note(r, "setxattr", "fz-file", butter_setxattr(r->fs, f, "user.fz", "v", 1));
	}
	note(r, "create", "fz-small", butter_create(r->fs, root, "fz-small", 8, &file, &small));
	if (lookup(r, root, "fz-small", &small) == 0) {
		do_write(r, small, "fz-small", 100, 0);  /* inline */
		do_write(r, small, "fz-small", 50, 80);  /* inline, rewritten */
	}
	note(r, "mkdir", "fz-dir", butter_create(r->fs, root, "fz-dir", 6, &dir, &d));
	if (lookup(r, root, "fz-dir", &d) == 0) {
		note(r, "symlink", "fz-dir/link",
		     butter_symlink(r->fs, d, "link", 4, "../fz-file", 0, 0, &ino));
		if (lookup(r, root, "fz-file", &f) == 0)
			note(r, "link", "fz-dir/hard", butter_link(r->fs, f, d, "hard", 4));
		note(r, "rename", "fz-small",
		     butter_rename(r->fs, root, "fz-small", 8, d, "small", 5, 0));
	}
}

/* Change the first entries of @dir that the image already had. */
static void existing_things(struct run *r, butter_ino_t dir, int depth)
{
	struct butter_new_inode file = { .mode = S_IFREG | 0600 };
	struct names *ns = calloc(1, sizeof(*ns));
	size_t i;
	int ret;

	if (!ns)
		return;
	ret = butter_readdir(r->fs, dir, 0, collect, ns);
	note(r, "readdir", "", ret);
	for (i = 0; i < ns->n; i++) {
		struct butter_stat st;
		butter_ino_t ino;

		ret = butter_stat(r->fs, ns->ino[i], &st);
		note(r, "stat", ns->name[i], ret);
		if (ret)
			continue;
		if (S_ISREG(st.mode)) {
			struct butter_stat sz = { 0 };

			do_write(r, ns->ino[i], ns->name[i], 4096, 0);
			do_write(r, ns->ino[i], ns->name[i], 10, st.size / 2);
			do_write(r, ns->ino[i], ns->name[i], 3000, st.size + 5000);
			sz.size = st.size / 3;
			note(r, "truncate", ns->name[i],
			     butter_setattr(r->fs, ns->ino[i], &sz, BUTTER_SET_SIZE));
			note(r, "setxattr", ns->name[i],
			     butter_setxattr(r->fs, ns->ino[i], "user.fz", "value", 5));
			note(r, "rmxattr", ns->name[i],
			     butter_removexattr(r->fs, ns->ino[i], "user.fz"));
		} else if (S_ISDIR(st.mode) && depth == 0) {
			note(r, "create", "fz-in",
			     butter_create(r->fs, ns->ino[i], "fz-in", 5, &file, &ino));
			existing_things(r, ns->ino[i], depth + 1);
		}
	}
	/* take away names the image had: one unlink, one rename, one rmdir */
	for (i = 0; i < ns->n; i++) {
		if (ns->dtype[i] != 4 /* DT_DIR */) {
			note(r, "unlink", ns->name[i],
			     butter_unlink(r->fs, dir, ns->name[i], strlen(ns->name[i])));
			break;
		}
	}
	for (i = ns->n; i-- > 0;) {
		if (ns->dtype[i] != 4) {
			note(r, "rename", ns->name[i],
			     butter_rename(r->fs, dir, ns->name[i], strlen(ns->name[i]), dir,
					   "fz-renamed", 10, 0));
			break;
		}
	}
	for (i = 0; i < ns->n; i++) {
		if (ns->dtype[i] == 4) {
			note(r, "rmdir", ns->name[i],
			     butter_rmdir(r->fs, dir, ns->name[i], strlen(ns->name[i])));
			break;
		}
	}
	free(ns);
}

int fuzz_write_image(const void *image, size_t size, int verbose)
{
	struct butter_open_opts opts = { 0 };
	struct run *r = calloc(1, sizeof(*r));
	butter_ino_t root, ino;
	uint64_t id;
	size_t i;
	int ret, failures;

	if (!r)
		return 1;
	r->verbose = verbose;
	for (i = 0; i < BUF_BYTES; i++)
		r->buf[i] = (uint8_t)(i * 131 + (i >> 9));
	opts.cache_bytes = 512u << 10; /* small: eviction of clean nodes is exercised too */
	opts.log = fuzz_walk_log_fn(verbose);
	opts.log_level = BUTTER_LOG_DEBUG;
	ret = butter_open_memory_cow(image, size, &opts, &r->fs);
	note(r, "open", "rw", ret);
	if (ret) {
		failures = r->failures;
		free(r);
		return failures;
	}
	ret = butter_root(r->fs, 5, &root);
	note(r, "root", "5", ret);
	if (ret == 0) {
		new_things(r, root);
		existing_things(r, root, 0);
		note(r, "sync", "1", butter_sync(r->fs));
		/* change what the first commit wrote */
		if (lookup(r, root, "fz-file", &ino) == 0)
			do_write(r, ino, "fz-file", BUF_BYTES, 8192);
		note(r, "unlink", "fz-file", butter_unlink(r->fs, root, "fz-file", 7));
		note(r, "subvol", "fz-sub", butter_subvol_create(r->fs, root, "fz-sub", 6, &id));
		note(r, "sync", "2", butter_sync(r->fs));
	}
	butter_close(r->fs);
	failures = r->failures;
	free(r);
	return failures;
}
