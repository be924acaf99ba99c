/*
 * cmd_du.c — `butter filesystem du --compression`: how the data of files is
 * stored, per compression algorithm, as compsize(8) reports it: the bytes on
 * disk, the bytes they hold uncompressed, and the bytes the files refer to.
 *
 * Counted from each regular file's EXTENT_DATA items: an extent counts once
 * for disk and uncompressed bytes however many files (or parts of one file,
 * reflinks, snapshots among the paths) refer to it, and each reference
 * counts its own length toward "Referenced"; preallocated extents are their
 * own kind, inline data counts its stored bytes; holes count nothing.
 *
 * The items come from butter_tree_search() on an image, and on a live mount
 * from the kernel btrfs's TREE_SEARCH ioctl on the file (fuse/btrfs_ioctl.c
 * answers it), so the same code reads both, and the kernel's mount too.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <linux/btrfs.h>

#include "cli.h"
#include "search.h"

#define EXTENT_DATA_KEY 108
#define FILE_EXTENT_INLINE 0
#define FILE_EXTENT_PREALLOC 2
#define FILE_EXTENT_HEAD 21 /* generation, ram_bytes, compression, encryption, encoding, type */

enum { KIND_NONE, KIND_ZLIB, KIND_LZO, KIND_ZSTD, KIND_PREALLOC, NKINDS };
static const char *const kind_name[NKINDS] = { "none", "zlib", "lzo", "zstd", "prealloc" };

struct du_totals {
	uint64_t disk[NKINDS], uncomp[NKINDS], refd[NKINDS];
	uint64_t files, extents, refs, inline_items;
	/* disk_bytenr of every extent counted: open addressing, 0 is empty */
	uint64_t *seen;
	size_t seen_cap, seen_n;
};

/* Record @bytenr; 1 if it is new, 0 if seen before, -ENOMEM. */
static int seen_add(struct du_totals *t, uint64_t bytenr)
{
	size_t i;

	if (2 * (t->seen_n + 1) > t->seen_cap) {
		size_t cap = t->seen_cap ? 2 * t->seen_cap : 1024;
		uint64_t *n = calloc(cap, sizeof(*n));

		if (!n)
			return -ENOMEM;
		for (i = 0; i < t->seen_cap; i++) {
			size_t j;

			if (!t->seen[i])
				continue;
			for (j = (size_t)(t->seen[i] * 0x9E3779B97F4A7C15ULL >> 20) % cap; n[j];
			     j = (j + 1) % cap)
				;
			n[j] = t->seen[i];
		}
		free(t->seen);
		t->seen = n;
		t->seen_cap = cap;
	}
	for (i = (size_t)(bytenr * 0x9E3779B97F4A7C15ULL >> 20) % t->seen_cap; t->seen[i];
	     i = (i + 1) % t->seen_cap)
		if (t->seen[i] == bytenr)
			return 0;
	t->seen[i] = bytenr;
	t->seen_n++;
	return 1;
}

/* Add one EXTENT_DATA item of @len bytes. */
static int add_item(struct du_totals *t, const uint8_t *item, uint32_t len)
{
	uint64_t ram, bytenr;
	int kind, ret;

	if (len < FILE_EXTENT_HEAD)
		return -EUCLEAN;
	ram = cli_le64(item + 8);
	kind = item[16] < KIND_PREALLOC ? item[16] : -1;
	if (item[20] == FILE_EXTENT_INLINE) {
		if (kind < 0)
			return -EUCLEAN;
		t->refs++;
		t->inline_items++;
		t->disk[kind] += len - FILE_EXTENT_HEAD;
		t->uncomp[kind] += ram;
		t->refd[kind] += ram;
		return 0;
	}
	if (len < FILE_EXTENT_HEAD + 32)
		return -EUCLEAN;
	if (item[20] == FILE_EXTENT_PREALLOC)
		kind = KIND_PREALLOC;
	if (kind < 0)
		return -EUCLEAN;
	bytenr = cli_le64(item + 21);
	if (bytenr == 0)
		return 0; /* a hole */
	t->refs++;
	t->refd[kind] += cli_le64(item + 45);
	ret = seen_add(t, bytenr);
	if (ret > 0) {
		t->extents++;
		t->disk[kind] += cli_le64(item + 29);
		t->uncomp[kind] += ram;
	}
	return ret < 0 ? ret : 0;
}

/* Add every EXTENT_DATA item of file @objectid of the source's subvolume. */
static int add_file(struct du_totals *t, const struct cli_search_src *src, uint64_t objectid)
{
	struct btrfs_ioctl_search_args *args = calloc(1, sizeof(*args));
	uint64_t offset = 0;
	int ret = 0;

	if (!args)
		return -ENOMEM;
	for (;;) {
		struct btrfs_ioctl_search_header h;
		uint32_t n, pos = 0;

		memset(&args->key, 0, sizeof(args->key));
		args->key.min_objectid = args->key.max_objectid = objectid;
		args->key.min_type = args->key.max_type = EXTENT_DATA_KEY;
		args->key.min_offset = offset;
		args->key.max_offset = UINT64_MAX;
		args->key.max_transid = UINT64_MAX;
		args->key.nr_items = 4096;
		ret = cli_tree_search(src, args);
		n = args->key.nr_items;
		if (ret || n == 0)
			break;
		for (uint32_t i = 0; i < n; i++) {
			memcpy(&h, args->buf + pos, sizeof(h));
			pos += sizeof(h);
			if (h.len == 0 || pos + h.len > sizeof(args->buf)) {
				ret = -EOVERFLOW;
				break;
			}
			ret = add_item(t, (const uint8_t *)args->buf + pos, h.len);
			if (ret)
				break;
			pos += h.len;
		}
		if (ret || h.offset == UINT64_MAX)
			break;
		offset = h.offset + 1;
	}
	free(args);
	t->files += ret == 0;
	return ret;
}

/* The bytes in compsize's short form: "  3B", " 700B", " 6.2M", " 204K" (cut, not rounded). */
static const char *du_human(char *buf, size_t cap, uint64_t bytes)
{
	static const char units[] = "BKMGTPE";
	int u = 0;
	uint64_t scale = 1;

	while (bytes / scale >= 1024 && u < 6) {
		scale *= 1024;
		u++;
	}
	if (u > 0 && bytes / scale < 10)
		snprintf(buf, cap, " %llu.%llu%c", (unsigned long long)(bytes / scale),
			 (unsigned long long)(bytes % scale * 10 / scale), units[u]);
	else
		snprintf(buf, cap, "%4llu%c", (unsigned long long)(bytes / scale), units[u]);
	return buf;
}

static void print_row(const char *name, uint64_t disk, uint64_t uncomp, uint64_t refd, bool raw)
{
	char a[32], b[32], c[32];

	if (raw) {
		snprintf(a, sizeof(a), "%llu", (unsigned long long)disk);
		snprintf(b, sizeof(b), "%llu", (unsigned long long)uncomp);
		snprintf(c, sizeof(c), "%llu", (unsigned long long)refd);
	} else {
		du_human(a, sizeof(a), disk);
		du_human(b, sizeof(b), uncomp);
		du_human(c, sizeof(c), refd);
	}
	/* the percentage cut, not rounded, as compsize */
	printf("%-10s %3llu%%     %-12s %-12s %-12s\n", name,
	       (unsigned long long)(uncomp ? disk * 100 / uncomp : 100), a, b, c);
}

static void print_totals(const struct du_totals *t, bool raw)
{
	uint64_t disk = 0, uncomp = 0, refd = 0;

	for (int k = 0; k < NKINDS; k++) {
		disk += t->disk[k];
		uncomp += t->uncomp[k];
		refd += t->refd[k];
	}
	printf("Processed %llu file%s, %llu regular extents (%llu refs), %llu inline.\n",
	       (unsigned long long)t->files, t->files == 1 ? "" : "s",
	       (unsigned long long)t->extents, (unsigned long long)(t->refs - t->inline_items),
	       (unsigned long long)t->inline_items);
	printf("%-10s %-8s %-12s %-12s %-12s\n", "Type", "Perc", "Disk Usage", "Uncompressed",
	       "Referenced");
	print_row("TOTAL", disk, uncomp, refd, raw);
	for (int k = 0; k < NKINDS; k++)
		if (t->disk[k] || t->uncomp[k] || t->refd[k])
			print_row(kind_name[k], t->disk[k], t->uncomp[k], t->refd[k], raw);
}

/* ---- a live mount: walk the directory tree ------------------------------- */

/* nftw() offers no argument: the walk's state for the duration of one walk. */
static struct du_walk {
	struct du_totals *t;
	int err;
} *walk_state;

static int walk_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	struct cli_search_src src = { .fd = -1 };
	int ret;

	(void)ftw;
	if (type != FTW_F || !S_ISREG(sb->st_mode))
		return 0;
	src.fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (src.fd < 0) {
		cli_error("%s: %s", path, strerror(errno));
		walk_state->err = -errno;
		return 0;
	}
	ret = add_file(walk_state->t, &src, sb->st_ino);
	close(src.fd);
	if (ret) {
		cli_error("%s: %s", path, ret == -ENOTTY ? "not on btrfs or a butter mount"
						       : strerror(-ret));
		walk_state->err = ret;
		return ret == -ENOTTY ? 1 : 0;
	}
	return 0;
}

static int du_mount_path(struct du_totals *t, const char *path)
{
	struct du_walk w = { t, 0 };
	int ret;

	walk_state = &w;
	ret = nftw(path, walk_one, 64, FTW_PHYS);
	walk_state = NULL;
	if (ret < 0) {
		cli_error("%s: %s", path, strerror(errno));
		return -errno;
	}
	return w.err;
}

/* ---- an image: walk through the library ------------------------------------ */

struct dir_walk {
	struct butter_fs *fs;
	struct du_totals *t;
	butter_ino_t *pending;
	size_t n, cap;
	int err;
};

static int take_entry(void *arg, const char *name, size_t namelen, butter_ino_t ino,
		      unsigned type, uint64_t next)
{
	struct dir_walk *w = arg;

	(void)next;
	(void)name;
	(void)namelen;
	if (type != DT_DIR && type != DT_REG)
		return 0;
	if (w->n == w->cap) {
		size_t cap = w->cap ? 2 * w->cap : 64;
		butter_ino_t *p = realloc(w->pending, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		w->pending = p;
		w->cap = cap;
	}
	w->pending[w->n++] = ino;
	return 0;
}

static int du_image_path(struct du_totals *t, struct butter_fs *fs, const char *path)
{
	struct dir_walk w = { .fs = fs, .t = t };
	butter_ino_t top;
	int ret = cli_resolve(fs, path, false, &top);

	if (ret) {
		cli_error("%s: %s", path, strerror(-ret));
		return ret;
	}
	ret = take_entry(&w, "x", 1, top, DT_DIR, 0);
	while (ret == 0 && w.n) {
		butter_ino_t ino = w.pending[--w.n];
		struct butter_stat st;

		ret = butter_stat(fs, ino, &st);
		if (ret)
			break;
		if (S_ISREG(st.mode)) {
			struct cli_search_src src = { .fs = fs, .subvol = ino.subvol, .fd = -1 };

			ret = add_file(t, &src, ino.ino);
		} else if (S_ISDIR(st.mode)) {
			ret = butter_readdir(fs, ino, 0, take_entry, &w);
		}
	}
	free(w.pending);
	if (ret)
		cli_error("%s: %s", path, ret == -EUCLEAN ? "a file extent item is damaged"
							  : strerror(-ret));
	return ret;
}

/* @path lies on a FUSE mount (butter's) or the kernel's btrfs: walk it; otherwise it is an image. */
static bool on_mount(const char *path)
{
	struct statfs sf;

	return statfs(path, &sf) == 0 &&
	       ((unsigned long)sf.f_type == 0x65735546UL /* FUSE */ ||
		(unsigned long)sf.f_type == 0x9123683EUL /* btrfs */);
}

int cmd_du(const struct cli_command *cmd, int argc, char **argv)
{
	enum { OPT_COMPRESSION = CLI_OPT_FIRST_FREE };
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		CLI_UNITS_LONGOPTS,
		{ "compression", no_argument, NULL, OPT_COMPRESSION },
		{ "bytes", no_argument, NULL, 'b' },
		{ "summarize", no_argument, NULL, 's' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct cli_units units = { 0, false };
	struct du_totals t = { 0 };
	struct butter_fs *fs = NULL;
	bool compression = false, raw = false, summarize = false;
	int c, ret = 0, first;

	while ((c = cli_getopt(&args, argc, argv, ":hbs", longopts)) != -1) {
		if (c == OPT_COMPRESSION)
			compression = true;
		else if (c == 'b')
			raw = true;
		else if (c == 's')
			summarize = true;
		else if (!cli_units_option(&units, c)) {
			free(args.devices);
			return cli_usage_error(cmd, "unknown option");
		}
	}
	if (argc - optind < 1) {
		free(args.devices);
		return cli_usage_error(cmd, "missing IMAGE or PATH");
	}
	if (!compression) { /* btrfs filesystem du: total, exclusive, set shared (du_files.c) */
		ret = du_files(&args, argv + optind, argc - optind, summarize, &units);
		free(args.devices);
		return ret;
	}
	first = optind;
	if (args.ndevices || !on_mount(argv[first])) {
		/* IMAGE PATH... */
		ret = cli_open(&args, argv[first], &fs);
		if (ret) {
			free(args.devices);
			return CLI_EXIT_ERROR;
		}
		for (int i = first + 1; i < argc && ret == 0; i++)
			ret = du_image_path(&t, fs, argv[i]);
		if (first + 1 == argc) /* the whole filesystem as it opens */
			ret = du_image_path(&t, fs, "/");
		butter_close(fs);
	} else {
		for (int i = first; i < argc; i++) {
			int r = du_mount_path(&t, argv[i]);

			if (r && !ret)
				ret = r;
		}
	}
	free(t.seen);
	free(args.devices);
	if (ret)
		return CLI_EXIT_ERROR;
	if (t.files == 0) {
		cli_error("no files");
		return CLI_EXIT_ERROR;
	}
	print_totals(&t, raw);
	return cli_finish_stdout(CLI_EXIT_OK);
}
