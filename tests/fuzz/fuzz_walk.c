/*
 * fuzz_walk.c — the "full walk" both the libFuzzer harness and the replay
 * tool run on an image (see fuzz_walk.h).
 *
 * Budgets keep one run short whatever the image claims (sizes of 2^63, a
 * directory that contains its own ancestor, millions of entries): depth,
 * directories, entries and bytes read are all capped, and each directory is
 * walked once. A result the API contract rules out (a read longer than asked,
 * an xattr list longer than its buffer, a readlink longer than PATH_MAX) is a
 * bug in the library, so it abort()s and the fuzzer reports it.
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

#define MAX_DEPTH 24
#define MAX_DIRS 256
#define MAX_ENTRIES 400           /* entries examined per run */
#define MAX_DIR_LIST 256          /* entries collected from one directory */
#define MAX_DIR_EXAMINE 48        /* of which examined (the rest only listed) */
#define MAX_FILE_BYTES (160u << 10)
#define MAX_TOTAL_BYTES (2u << 20)
#define READ_CHUNK (64u << 10)
#define MAX_XATTR_LIST (64u << 10)
#define MAX_SUBVOLS 64

struct entry {
	char name[256];
	size_t namelen;
	butter_ino_t ino;
	unsigned dtype;
	uint64_t next_pos;
};

struct walk {
	struct butter_fs *fs;
	int verbose;
	int failures;
	unsigned entries;
	uint64_t bytes;
	butter_ino_t dirs[MAX_DIRS];
	size_t ndirs;
	uint8_t *buf;
};

#define CONTRACT(cond) FUZZ_CONTRACT("fuzz_walk", cond)

static void (*extra_log)(void *arg, int level, const char *msg);
static void *extra_log_arg;

void fuzz_walk_set_log(void (*fn)(void *arg, int level, const char *msg), void *arg)
{
	extra_log = fn;
	extra_log_arg = arg;
}

static void quiet_log(void *arg, int level, const char *msg)
{
	(void)arg;
	if (extra_log)
		extra_log(extra_log_arg, level, msg);
}

static void loud_log(void *arg, int level, const char *msg)
{
	fprintf(stderr, "  [lib %d] %s\n", level, msg);
	quiet_log(arg, level, msg);
}

butter_log_fn fuzz_walk_log_fn(int verbose)
{
	return verbose ? loud_log : quiet_log;
}

static void note(struct walk *w, const char *what, const char *path, long long ret)
{
	if (ret < 0)
		w->failures++;
	if (w->verbose)
		printf("%-10s %-40s -> %lld%s%s\n", what, path, ret, ret < 0 ? " " : "",
		       ret < 0 ? strerror((int)-ret) : "");
}

struct collect {
	struct entry *list;
	size_t n;
};

static int collect_one(void *arg, const char *name, size_t namelen, butter_ino_t ino,
		       unsigned dtype, uint64_t next_pos)
{
	struct collect *c = arg;
	struct entry *e;

	CONTRACT(namelen > 0 && namelen <= 255);
	if (c->n == MAX_DIR_LIST)
		return 1;
	e = &c->list[c->n++];
	memcpy(e->name, name, namelen);
	e->name[namelen] = '\0';
	e->namelen = namelen;
	e->ino = ino;
	e->dtype = dtype;
	e->next_pos = next_pos;
	return 0;
}

static int count_one(void *arg, const char *name, size_t namelen, butter_ino_t ino,
		     unsigned dtype, uint64_t next_pos)
{
	unsigned *left = arg;

	(void)name;
	(void)ino;
	(void)dtype;
	(void)next_pos;
	CONTRACT(namelen > 0 && namelen <= 255);
	return --*left == 0;
}

static void walk_xattrs(struct walk *w, butter_ino_t ino, const char *path)
{
	ssize_t need, got, vlen;
	char *list;
	size_t pos;

	need = butter_listxattr(w->fs, ino, NULL, 0);
	if (need <= 0) {
		if (need < 0)
			note(w, "listxattr", path, need);
		return;
	}
	if ((size_t)need > MAX_XATTR_LIST)
		need = MAX_XATTR_LIST;
	list = malloc((size_t)need);
	if (!list)
		return;
	got = butter_listxattr(w->fs, ino, list, (size_t)need);
	note(w, "listxattr", path, got);
	CONTRACT(got < 0 || got <= need);
	for (pos = 0; got > 0 && pos < (size_t)got;) {
		const char *name = list + pos;
		size_t len = strnlen(name, (size_t)got - pos);

		CONTRACT(len < (size_t)got - pos); /* every name is NUL-terminated */
		vlen = butter_getxattr(w->fs, ino, name, NULL, 0);
		if (vlen >= 0 && (size_t)vlen <= MAX_XATTR_LIST) {
			void *val = malloc(vlen ? (size_t)vlen : 1);

			if (val) {
				ssize_t r = butter_getxattr(w->fs, ino, name, val, vlen ? (size_t)vlen : 1);

				CONTRACT(r < 0 || r <= (vlen ? vlen : 1));
				note(w, "getxattr", path, r);
				free(val);
			}
		} else {
			note(w, "getxattr", path, vlen);
		}
		pos += len + 1;
	}
	free(list);
}

static void walk_file(struct walk *w, butter_ino_t ino, const struct butter_stat *st,
		      const char *path)
{
	uint64_t off = 0, res;
	ssize_t r = 0;
	int ret;

	while (off < st->size && off < MAX_FILE_BYTES && w->bytes < MAX_TOTAL_BYTES) {
		r = butter_read(w->fs, ino, w->buf, READ_CHUNK, off);
		if (r <= 0)
			break;
		CONTRACT((size_t)r <= READ_CHUNK);
		off += (uint64_t)r;
		w->bytes += (uint64_t)r;
	}
	note(w, "read", path, r < 0 ? r : (long long)off);
	ret = butter_seek(w->fs, ino, 0, 3, &res);
	if (ret != -ENXIO)
		note(w, "seek_data", path, ret ? ret : (long long)res);
	ret = butter_seek(w->fs, ino, 0, 4, &res);
	if (ret != -ENXIO)
		note(w, "seek_hole", path, ret ? ret : (long long)res);
}

static int seen_dir(struct walk *w, butter_ino_t ino)
{
	size_t i;

	for (i = 0; i < w->ndirs; i++)
		if (w->dirs[i].subvol == ino.subvol && w->dirs[i].ino == ino.ino)
			return 1;
	if (w->ndirs == MAX_DIRS)
		return 1; /* out of budget: treat as seen */
	w->dirs[w->ndirs++] = ino;
	return 0;
}

static void walk_dir(struct walk *w, butter_ino_t dir, const char *path, int depth);

static void walk_entry(struct walk *w, butter_ino_t dir, const struct entry *e, const char *path,
		       int depth)
{
	struct butter_stat st;
	butter_ino_t found;
	char target[4096];
	ssize_t n;
	int ret;

	ret = butter_lookup(w->fs, dir, e->name, e->namelen, &found);
	note(w, "lookup", path, ret);
	ret = butter_stat(w->fs, e->ino, &st);
	note(w, "stat", path, ret ? ret : (long long)st.mode);
	if (ret)
		return;
	walk_xattrs(w, e->ino, path);
	if (S_ISDIR(st.mode)) {
		CONTRACT(butter_read(w->fs, e->ino, w->buf, 1, 0) < 0);
		walk_dir(w, e->ino, path, depth + 1);
	} else if (S_ISLNK(st.mode)) {
		n = butter_readlink(w->fs, e->ino, target, sizeof(target));
		CONTRACT(n < (ssize_t)sizeof(target));
		note(w, "readlink", path, n);
	} else {
		walk_file(w, e->ino, &st, path);
	}
}

static void walk_dir(struct walk *w, butter_ino_t dir, const char *path, int depth)
{
	struct collect c;
	char child[4096];
	unsigned left = 4;
	size_t i;
	int ret;

	if (depth > MAX_DEPTH || seen_dir(w, dir) || w->entries >= MAX_ENTRIES)
		return;
	c.list = malloc(MAX_DIR_LIST * sizeof(*c.list));
	c.n = 0;
	if (!c.list)
		return;
	ret = butter_readdir(w->fs, dir, 0, collect_one, &c);
	note(w, "readdir", path, ret < 0 ? ret : (long long)c.n);
	/* resume from the middle, as a reader with a small buffer does */
	if (c.n > 1) {
		ret = butter_readdir(w->fs, dir, c.list[c.n / 2].next_pos, count_one, &left);
		if (ret < 0)
			note(w, "readdir+", path, ret);
	}
	for (i = 0; i < c.n && i < MAX_DIR_EXAMINE && w->entries < MAX_ENTRIES; i++, w->entries++) {
		snprintf(child, sizeof(child), "%s%s%s", path,
			 path[0] && path[strlen(path) - 1] == '/' ? "" : "/", c.list[i].name);
		walk_entry(w, dir, &c.list[i], child, depth);
	}
	free(c.list);
}

struct subvols {
	uint64_t ids[MAX_SUBVOLS];
	size_t n;
	struct walk *w;
};

static int subvol_one(void *arg, const struct butter_subvol_info *info)
{
	struct subvols *s = arg;

	CONTRACT(memchr(info->path, '\0', sizeof(info->path)) != NULL);
	if (s->w->verbose)
		printf("subvol     %llu parent %llu path '%s'\n", (unsigned long long)info->id,
		       (unsigned long long)info->parent_id, info->path);
	if (s->n == MAX_SUBVOLS)
		return 1;
	s->ids[s->n++] = info->id;
	return 0;
}

static void walk_info(struct walk *w)
{
	struct butter_info info;
	struct butter_device_info dev;
	struct butter_space_info space;
	size_t i;
	int ret;

	ret = butter_get_info(w->fs, &info);
	note(w, "info", "", ret);
	if (ret == 0) {
		CONTRACT(memchr(info.label, '\0', sizeof(info.label)) != NULL);
		for (i = 0; i < 3; i++) {
			int bit;

			for (bit = 0; bit < 64; bit++)
				(void)butter_feature_name((int)i, bit);
		}
	}
	for (i = 0; i < 64 && butter_get_device(w->fs, i, &dev) == 0; i++)
		;
	for (i = 0; i < 64; i++) {
		ret = butter_get_space(w->fs, i, &space);
		if (ret)
			break;
		(void)butter_profile_name(space.flags);
	}
	if (ret != -ENOENT)
		note(w, "space", "", ret);
}

int fuzz_walk_image(const void *image, size_t size, int verbose)
{
	static const char *const paths[] = {
		"/", "/inline.txt", "/dir/sub/deeper/leaf.txt", "/link-abs/leaf.txt",
		"/link-rel", "/subvol/in-subvol.txt", "/snap/d/..", "/many/../dir/./regular.txt",
		"/sv/file", "/nonexistent",
	};
	struct butter_open_opts opts = { 0 };
	struct subvols sv;
	struct walk w;
	butter_ino_t root;
	size_t i;
	int ret;

	memset(&w, 0, sizeof(w));
	w.verbose = verbose;
	opts.flags = BUTTER_OPEN_RDONLY | BUTTER_OPEN_DEGRADED;
	opts.cache_bytes = 256u << 10; /* small: eviction is exercised too */
	opts.log = verbose ? loud_log : quiet_log;
	opts.log_level = BUTTER_LOG_DEBUG;
	ret = butter_open_memory(image, size, &opts, &w.fs);
	note(&w, "open", "", ret);
	if (ret)
		return w.failures;
	w.buf = malloc(READ_CHUNK);
	if (!w.buf) {
		butter_close(w.fs);
		return w.failures + 1;
	}
	walk_info(&w);

	ret = butter_root(w.fs, 0, &root);
	note(&w, "root", "default", ret);
	if (ret == 0)
		walk_dir(&w, root, "/", 0);
	ret = butter_root(w.fs, 5, &root);
	note(&w, "root", "5", ret);
	if (ret == 0)
		walk_dir(&w, root, "/", 0);

	memset(&sv, 0, sizeof(sv));
	sv.w = &w;
	ret = butter_subvol_list(w.fs, subvol_one, &sv);
	note(&w, "subvols", "", ret);
	for (i = 0; i < sv.n; i++) {
		struct butter_subvol_info info;

		note(&w, "subvol_get", "", butter_subvol_get(w.fs, sv.ids[i], &info));
		if (butter_root(w.fs, sv.ids[i], &root) == 0)
			walk_dir(&w, root, "/", 1);
	}
	for (i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
		butter_ino_t ino;

		note(&w, "resolve", paths[i], butter_resolve(w.fs, paths[i], &ino));
	}
	free(w.buf);
	butter_close(w.fs);
	return w.failures;
}
