/*
 * cmd_find_new.c — `butter subvolume find-new`: the file extents of a
 * subvolume written in or after a given generation, one line each, in the
 * words of `btrfs subvolume find-new`, and the subvolume's generation last
 * ("transid marker"), which the next call can start from.
 *
 * The walk is progs' own, so the output is the same line for line: every
 * item of the subvolume's tree in leaves at least that new, in key order,
 * of which the EXTENT_DATA items whose own generation is new enough are
 * printed with the file's path (its first INODE_REF, under its directory's
 * INO_LOOKUP path). A file without a name (an orphan) is skipped. The items
 * come through cli/search.h: from an image, or through a live mount (which
 * is committed first, as progs syncs first).
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "search.h"

#define INODE_REF_KEY 12
#define EXTENT_DATA_KEY 108
#define ROOT_ITEM_KEY 132
#define ROOT_ITEM_GENERATION 160  /* after the embedded inode item */
#define FILE_EXTENT_INLINE 0
#define FILE_EXTENT_REG 1
#define FILE_EXTENT_PREALLOC 2

/* The newest generation among the subvolume's ROOT_ITEMs (snapshots being dropped may leave several). */
static int root_generation(const struct cli_search_src *src, uint64_t *gen)
{
	struct btrfs_ioctl_search_args *a = calloc(1, sizeof(*a));
	uint64_t id;
	int ret = cli_search_subvol(src, &id);

	*gen = 0;
	if (!a)
		return -ENOMEM;
	if (ret == 0) {
		a->key = (struct btrfs_ioctl_search_key){
			.tree_id = 1, .min_objectid = id, .max_objectid = id,
			.min_type = ROOT_ITEM_KEY, .max_type = ROOT_ITEM_KEY,
			.max_offset = UINT64_MAX, .max_transid = UINT64_MAX, .nr_items = 4096,
		};
		ret = cli_tree_search(src, a);
	}
	for (uint32_t i = 0, pos = 0; ret == 0 && i < a->key.nr_items; i++) {
		struct btrfs_ioctl_search_header h;

		memcpy(&h, a->buf + pos, sizeof(h));
		pos += sizeof(h);
		if (h.len >= ROOT_ITEM_GENERATION + 8) {
			uint64_t g = cli_le64(a->buf + pos + ROOT_ITEM_GENERATION);

			if (g > *gen)
				*gen = g;
		}
		pos += h.len;
	}
	free(a);
	return ret;
}

/* The path of inode @ino in the subvolume (first INODE_REF), into @out; -ENOENT without a name. */
static int file_path(const struct cli_search_src *src, uint64_t ino, char *out, size_t cap)
{
	struct btrfs_ioctl_search_args *a = calloc(1, sizeof(*a));
	struct btrfs_ioctl_search_header h;
	uint16_t namelen;
	size_t dirlen;
	int ret;

	if (!a)
		return -ENOMEM;
	a->key = (struct btrfs_ioctl_search_key){
		.min_objectid = ino, .max_objectid = ino,
		.min_type = INODE_REF_KEY, .max_type = INODE_REF_KEY,
		.max_offset = UINT64_MAX, .max_transid = UINT64_MAX, .nr_items = 1,
	};
	ret = cli_tree_search(src, a);
	if (ret == 0 && a->key.nr_items == 0)
		ret = -ENOENT;
	if (ret == 0) {
		memcpy(&h, a->buf, sizeof(h));
		memcpy(&namelen, a->buf + sizeof(h) + 8, sizeof(namelen));
		namelen = le16toh(namelen);
		if (h.len < 10u + namelen)
			ret = -EUCLEAN;
	}
	if (ret == 0)
		ret = cli_ino_lookup(src, h.offset, out, cap);
	if (ret == 0) {
		dirlen = strlen(out);
		if (dirlen + namelen + 1 > cap)
			ret = -ENAMETOOLONG;
		else {
			memcpy(out + dirlen, a->buf + sizeof(h) + 10, namelen);
			out[dirlen + namelen] = '\0';
		}
	}
	free(a);
	return ret;
}

static int print_extent(const struct cli_search_src *src, const struct btrfs_ioctl_search_header *h,
			const uint8_t *item, uint64_t gen, char *name, size_t cap, uint64_t *name_ino)
{
	uint64_t len, disk_start = 0, disk_offset = 0;
	uint8_t type = item[20];
	int ret;

	if (*name_ino != h->objectid) {
		*name_ino = 0;
		ret = file_path(src, h->objectid, name, cap);
		if (ret)
			return ret;
		*name_ino = h->objectid;
	}
	if (type == FILE_EXTENT_REG || type == FILE_EXTENT_PREALLOC) {
		if (h->len < 53)
			return -EUCLEAN;
		disk_start = cli_le64(item + 21);
		disk_offset = cli_le64(item + 37);
		len = cli_le64(item + 45);
	} else if (type == FILE_EXTENT_INLINE) {
		len = cli_le64(item + 8);
	} else {
		cli_error("unknown file extent type %u of inode %llu at file offset %llu", type,
			  (unsigned long long)h->objectid, (unsigned long long)h->offset);
		return -EUCLEAN;
	}
	printf("inode %llu file offset %llu len %llu disk start %llu offset %llu gen %llu flags %s%s%s%s%s %s\n",
	       (unsigned long long)h->objectid, (unsigned long long)h->offset,
	       (unsigned long long)len, (unsigned long long)disk_start,
	       (unsigned long long)disk_offset, (unsigned long long)gen,
	       item[16] ? "COMPRESS" : "",
	       item[16] && type != FILE_EXTENT_REG ? "|" : "",
	       type == FILE_EXTENT_PREALLOC ? "PREALLOC" : "",
	       type == FILE_EXTENT_INLINE ? "INLINE" : "",
	       !item[16] && type == FILE_EXTENT_REG ? "NONE" : "", name);
	return 0;
}

static int find_new(const struct cli_search_src *src, uint64_t since)
{
	struct btrfs_ioctl_search_args *a = calloc(1, sizeof(*a));
	char *name = malloc(PATH_MAX + BTRFS_INO_LOOKUP_PATH_MAX);
	uint64_t marker, name_ino = 0;
	int ret = 0;

	if (!a || !name) {
		free(a);
		free(name);
		return -ENOMEM;
	}
	ret = root_generation(src, &marker);
	a->key = (struct btrfs_ioctl_search_key){
		.max_objectid = UINT64_MAX, .max_type = EXTENT_DATA_KEY, .max_offset = UINT64_MAX,
		.min_transid = since, .max_transid = UINT64_MAX,
	};
	while (ret == 0) {
		struct btrfs_ioctl_search_header h = { 0 };
		uint32_t pos = 0, n;

		a->key.nr_items = 4096;
		ret = cli_tree_search(src, a);
		n = a->key.nr_items;
		if (ret || n == 0)
			break;
		for (uint32_t i = 0; i < n; i++) {
			const uint8_t *item;

			memcpy(&h, a->buf + pos, sizeof(h));
			pos += sizeof(h);
			item = (const uint8_t *)a->buf + pos;
			pos += h.len;
			if (h.type != EXTENT_DATA_KEY || h.len < 21 || cli_le64(item) < since)
				continue;
			int r = print_extent(src, &h, item, cli_le64(item), name,
					     PATH_MAX + BTRFS_INO_LOOKUP_PATH_MAX, &name_ino);
			if (r == -EUCLEAN || r == -ENOMEM) {
				ret = r;
				break;
			}
		}
		if (ret)
			break;
		a->key.min_objectid = h.objectid;
		a->key.min_type = h.type;
		a->key.min_offset = h.offset;
		if (h.offset != UINT64_MAX) {
			a->key.min_offset++;
		} else if (h.objectid != UINT64_MAX) {
			a->key.min_objectid++;
			a->key.min_type = 0;
			a->key.min_offset = 0;
		} else {
			break;
		}
	}
	if (ret == 0)
		printf("transid marker was %llu\n", (unsigned long long)marker);
	free(a);
	free(name);
	return ret;
}

int cmd_subvolume_find_new(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = { CLI_COMMON_LONGOPTS, { 0 } };
	struct cli_args args = { .cmd = cmd };
	struct cli_search_src src = { .fd = -1 };
	struct butter_fs *fs = NULL;
	const char *path, *gen_arg;
	unsigned long long since;
	char *end;
	int c, ret, n;

	while ((c = cli_getopt(&args, argc, argv, ":h", longopts)) != -1)
		;
	n = argc - optind;
	if (n != 2 && n != 3) {
		free(args.devices);
		return cli_usage_error(cmd, n < 2 ? "missing arguments" : "too many arguments");
	}
	gen_arg = argv[argc - 1];
	errno = 0;
	since = strtoull(gen_arg, &end, 10);
	if (errno || !*gen_arg || *end || *gen_arg == '-') {
		free(args.devices);
		return cli_usage_error(cmd, "not a generation number: %s", gen_arg);
	}
	path = argv[argc - 2];
	if (n == 3) {
		butter_ino_t ino;

		if (cli_open(&args, argv[optind], &fs)) {
			free(args.devices);
			return CLI_EXIT_ERROR;
		}
		ret = cli_resolve(fs, path, false, &ino);
		if (ret == 0 && ino.ino != BUTTER_SUBVOL_ROOT_INO)
			ret = -EINVAL;
		if (ret) {
			cli_error("%s: %s", path, ret == -EINVAL ? "not a subvolume" : strerror(-ret));
			butter_close(fs);
			free(args.devices);
			return CLI_EXIT_ERROR;
		}
		src.fs = fs;
		src.subvol = ino.subvol;
	} else {
		struct stat sb;

		src.fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (src.fd < 0 || fstat(src.fd, &sb) < 0) {
			cli_error("%s: %s", path, strerror(errno));
			free(args.devices);
			return CLI_EXIT_ERROR;
		}
		/* what the kernel's writeback cache holds reaches butter, then one commit */
		if (syncfs(src.fd) < 0 || ioctl(src.fd, BTRFS_IOC_SYNC) < 0) {
			cli_error("%s: %s", path, errno == ENOTTY ? "not inside a butter or btrfs mount"
								  : strerror(errno));
			close(src.fd);
			free(args.devices);
			return CLI_EXIT_ERROR;
		}
		/*
		 * a subvolume's root directory: inode 256 on the kernel's btrfs; on
		 * butter's mount 1 (the mounted one) or 256 in the low bits
		 * (fuse/nodes.c: each subvolume's numbers above 2^44)
		 */
		if (sb.st_ino != BUTTER_SUBVOL_ROOT_INO && sb.st_ino != 1 &&
		    (sb.st_ino >= (1ULL << 63) ||
		     (sb.st_ino & ((1ULL << 44) - 1)) != BUTTER_SUBVOL_ROOT_INO)) {
			cli_error("%s: not a subvolume", path);
			close(src.fd);
			free(args.devices);
			return CLI_EXIT_ERROR;
		}
	}
	ret = find_new(&src, since);
	if (ret)
		cli_error("%s: %s", path, ret == -EUCLEAN ? "a damaged item (see above)" : strerror(-ret));
	if (fs)
		butter_close(fs);
	if (src.fd >= 0)
		close(src.fd);
	free(args.devices);
	return cli_finish_stdout(ret ? CLI_EXIT_ERROR : CLI_EXIT_OK);
}
