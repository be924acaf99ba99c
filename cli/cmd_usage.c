/*
 * cmd_usage.c — `butter filesystem usage` and `butter device usage`: where
 * the space of each device went (chunks by type and profile, unallocated)
 * and what the filesystem can still take, in btrfs-progs' words, layout,
 * units and arithmetic, so that scripts reading progs' output read ours.
 *
 * The inputs are those progs reads: the devices (id, size the filesystem
 * uses, size of the file or block device), the space of each kind of chunk
 * (total and used, the global reserve among them), the chunk items (each
 * stripe's device, gathered per type, device and stripe count) and
 * statfs's free bytes. They come from the library on an image and, on a
 * live mount, through the mount's ioctls (FS_INFO/DEV_INFO, the space
 * ioctl of <butter/control.h>, TREE_SEARCH of the chunk tree; statvfs).
 *
 * The sums follow progs (cmds/filesystem-usage.c) so every digit agrees:
 * raw bytes are logical bytes times the copies of the profile, RAID5/6
 * chunks count their data stripes with the used ratio of their kind,
 * "Free (estimated)" is the unused data plus unallocated space over the
 * data ratio (over the highest ratio for "min"), and the percentages are
 * computed in float as progs computes them.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>


#include <butter/control.h>

#include "cli.h"
#include "search.h"

#define BG_DATA (1ULL << 0)
#define BG_SYSTEM (1ULL << 1)
#define BG_METADATA (1ULL << 2)
#define BG_RAID0 (1ULL << 3)
#define BG_RAID1 (1ULL << 4)
#define BG_DUP (1ULL << 5)
#define BG_RAID10 (1ULL << 6)
#define BG_RAID5 (1ULL << 7)
#define BG_RAID6 (1ULL << 8)
#define BG_RAID1C3 (1ULL << 9)
#define BG_RAID1C4 (1ULL << 10)
#define BG_TYPE_MASK (BG_DATA | BG_SYSTEM | BG_METADATA)
#define BG_PROFILE_MASK (BG_RAID0 | BG_RAID1 | BG_DUP | BG_RAID10 | BG_RAID5 | BG_RAID6 | \
			 BG_RAID1C3 | BG_RAID1C4)
#define BG_GLOBAL_RSV (1ULL << 49)
#define CHUNK_ITEM_KEY 228
#define CHUNK_ITEM_HEAD 48   /* length, owner, stripe_len, type, io sizes, num_stripes, sub_stripes */
#define CHUNK_STRIPE_SIZE 32 /* devid, offset, dev_uuid */
#define MIN_UNALLOCATED (16ULL << 20) /* below this, unallocated space is not counted as free */

struct usage_dev {
	uint64_t devid;
	uint64_t size;        /* bytes the filesystem uses of it */
	uint64_t device_size; /* bytes of the file or block device; 0: missing or unknown */
	char path[1024];      /* "missing" for a missing device */
};

struct usage_chunk {  /* progs' chunk_info: one per (type, device, stripe count) */
	uint64_t type, devid, size;
	uint32_t num_stripes;
};

struct usage_space {
	uint64_t flags, total, used;
};

struct usage_view {
	struct usage_dev *devs;
	size_t ndevs;
	struct usage_chunk *chunks;
	size_t nchunks;
	struct usage_space *spaces;
	size_t nspaces;
	uint64_t statfs_free;
};

static void view_free(struct usage_view *v)
{
	free(v->devs);
	free(v->chunks);
	free(v->spaces);
	memset(v, 0, sizeof(*v));
}

static int grow(void **arr, size_t n, size_t size)
{
	if ((n & (n - 1)) == 0) { /* at 0, 1, 2, 4, ...: double */
		void *p = realloc(*arr, (n ? 2 * n : 1) * size);

		if (!p)
			return -ENOMEM;
		*arr = p;
	}
	return 0;
}

/* ---- profile arithmetic ------------------------------------------------------ */

static int ncopies(uint64_t flags)
{
	if (flags & (BG_RAID1 | BG_DUP | BG_RAID10))
		return 2;
	if (flags & BG_RAID1C3)
		return 3;
	if (flags & BG_RAID1C4)
		return 4;
	return 1;
}

static uint32_t nparity(uint64_t flags)
{
	return flags & BG_RAID5 ? 1 : flags & BG_RAID6 ? 2 : 0;
}

/* The bytes one device holds of a (type, device, stripe count) group: what progs' calc_chunk_size says. */
static uint64_t chunk_device_bytes(const struct usage_chunk *c)
{
	uint32_t div = 1;

	if (!(c->type & (BG_RAID1 | BG_RAID1C3 | BG_RAID1C4 | BG_DUP)))
		div = (c->num_stripes - nparity(c->type)) / (c->type & BG_RAID10 ? 2 : 1);
	return div ? c->size / div : c->size;
}

/* progs' order of kinds: by type (data, metadata), system last; within a type by profile bits. */
static int kind_cmp(uint64_t a, uint64_t b)
{
	uint64_t mask;

	if ((a & BG_TYPE_MASK) == (b & BG_TYPE_MASK))
		mask = BG_PROFILE_MASK;
	else if (b & BG_SYSTEM)
		return -1;
	else if (a & BG_SYSTEM)
		return 1;
	else
		mask = BG_TYPE_MASK;
	return (a & mask) > (b & mask) ? 1 : (a & mask) < (b & mask) ? -1 : 0;
}

static int chunk_cmp(const void *a, const void *b)
{
	return kind_cmp(((const struct usage_chunk *)a)->type, ((const struct usage_chunk *)b)->type);
}

static int space_cmp(const void *a, const void *b)
{
	return kind_cmp(((const struct usage_space *)a)->flags, ((const struct usage_space *)b)->flags);
}

/* ---- reading -------------------------------------------------------------------- */

/* Every CHUNK_ITEM, gathered per (type, device, stripe count) in the order met. */
static int load_chunks(const struct cli_search_src *src, struct usage_view *v)
{
	struct btrfs_ioctl_search_args *a = calloc(1, sizeof(*a));
	int ret = 0;

	if (!a)
		return -ENOMEM;
	a->key = (struct btrfs_ioctl_search_key){
		.tree_id = 3, .min_objectid = 256, .max_objectid = 256,
		.min_type = CHUNK_ITEM_KEY, .max_type = CHUNK_ITEM_KEY,
		.max_offset = UINT64_MAX, .max_transid = UINT64_MAX,
	};
	for (;;) {
		struct btrfs_ioctl_search_header h = { 0 };
		uint32_t pos = 0, n;

		a->key.nr_items = 4096;
		ret = cli_tree_search(src, a);
		n = a->key.nr_items;
		if (ret || n == 0)
			break;
		for (uint32_t i = 0; i < n && ret == 0; i++) {
			const uint8_t *item;
			uint64_t length, type;
			uint16_t ns;

			memcpy(&h, a->buf + pos, sizeof(h));
			item = (const uint8_t *)a->buf + pos + sizeof(h);
			pos += sizeof(h) + h.len;
			if (h.type != CHUNK_ITEM_KEY)
				continue;
			if (h.len < CHUNK_ITEM_HEAD)
				return free(a), -EUCLEAN;
			length = cli_le64(item);
			type = cli_le64(item + 24);
			memcpy(&ns, item + 44, sizeof(ns));
			ns = le16toh(ns);
			if (ns == 0 || h.len < CHUNK_ITEM_HEAD + (uint32_t)ns * CHUNK_STRIPE_SIZE)
				return free(a), -EUCLEAN;
			for (uint16_t s = 0; s < ns; s++) {
				uint64_t devid = cli_le64(item + CHUNK_ITEM_HEAD + s * CHUNK_STRIPE_SIZE);
				size_t j;

				for (j = 0; j < v->nchunks; j++)
					if (v->chunks[j].type == type && v->chunks[j].devid == devid &&
					    v->chunks[j].num_stripes == ns)
						break;
				if (j == v->nchunks) {
					ret = grow((void **)&v->chunks, v->nchunks, sizeof(*v->chunks));
					if (ret)
						break;
					v->chunks[v->nchunks++] = (struct usage_chunk){ type, devid, 0, ns };
				}
				v->chunks[j].size += length;
			}
		}
		if (ret || h.offset == UINT64_MAX)
			break;
		a->key.min_offset = h.offset + 1;
	}
	free(a);
	/* stable: equal kinds keep the order met (qsort is not stable: an insertion sort) */
	for (size_t i = 1; i < v->nchunks; i++)
		for (size_t j = i; j > 0 && chunk_cmp(&v->chunks[j - 1], &v->chunks[j]) > 0; j--) {
			struct usage_chunk t = v->chunks[j];

			v->chunks[j] = v->chunks[j - 1];
			v->chunks[j - 1] = t;
		}
	return ret;
}

static int add_dev(struct usage_view *v, uint64_t devid, uint64_t size, const char *path)
{
	struct usage_dev *d;

	if (grow((void **)&v->devs, v->ndevs, sizeof(*v->devs)))
		return -ENOMEM;
	d = &v->devs[v->ndevs++];
	memset(d, 0, sizeof(*d));
	d->devid = devid;
	d->size = size;
	if (path && path[0]) {
		snprintf(d->path, sizeof(d->path), "%s", path);
		d->device_size = cli_device_size(path);
	} else {
		strcpy(d->path, "missing");
	}
	return 0;
}

static int add_space(struct usage_view *v, uint64_t flags, uint64_t total, uint64_t used)
{
	if (grow((void **)&v->spaces, v->nspaces, sizeof(*v->spaces)))
		return -ENOMEM;
	v->spaces[v->nspaces++] = (struct usage_space){ flags, total, used };
	return 0;
}

static int load_image(struct butter_fs *fs, struct usage_view *v)
{
	struct cli_search_src src = { .fs = fs, .fd = -1 };
	struct butter_statfs sf;
	int ret = 0;

	for (size_t i = 0; ret == 0; i++) {
		struct butter_device_info d;
		char *real;

		ret = butter_get_device(fs, i, &d);
		if (ret)
			break;
		real = d.path ? realpath(d.path, NULL) : NULL;
		ret = add_dev(v, d.devid, d.total_bytes, real ? real : d.path);
		free(real);
	}
	if (ret == -ENOENT) /* past the last device */
		ret = 0;
	for (size_t i = 0; ret == 0; i++) {
		struct butter_space_info s;

		ret = butter_get_space(fs, i, &s);
		if (ret == 0)
			ret = add_space(v, s.flags, s.total, s.used);
	}
	if (ret == -ENOENT)
		ret = butter_statfs(fs, &sf);
	if (ret == 0) {
		v->statfs_free = sf.bavail * sf.bsize;
		ret = load_chunks(&src, v);
	}
	return ret;
}

static int load_mount(int fd, const char *path, struct usage_view *v)
{
	struct cli_search_src src = { .fd = fd };
	struct btrfs_ioctl_fs_info_args fi;
	struct statvfs sv;
	int ret = 0;

	if (ioctl(fd, BTRFS_IOC_FS_INFO, &fi) < 0)
		return -errno;
	for (uint64_t id = 0; id <= fi.max_id && ret == 0; id++) {
		struct btrfs_ioctl_dev_info_args di = { .devid = id };

		if (ioctl(fd, BTRFS_IOC_DEV_INFO, &di) < 0) {
			if (errno == ENODEV)
				continue;
			return -errno;
		}
		ret = add_dev(v, di.devid, di.total_bytes, (const char *)di.path);
	}
	for (uint64_t i = 0; ret == 0; i++) {
		struct butter_ioc_space sp = { .idx = i };

		if (ioctl(fd, BUTTER_IOC_SPACE, &sp) < 0) {
			if (errno != ENOENT)
				ret = -errno;
			break;
		}
		ret = add_space(v, sp.flags, sp.total, sp.used);
	}
	if (ret == 0 && statvfs(path, &sv) < 0)
		ret = -errno;
	if (ret == 0) {
		v->statfs_free = (uint64_t)sv.f_bavail * sv.f_bsize;
		ret = load_chunks(&src, v);
	}
	return ret;
}

/* ---- printing -------------------------------------------------------------------- */

static const char *sz(char *buf, size_t cap, uint64_t bytes, const struct cli_units *u)
{
	return cli_size_units(buf, cap, bytes, u);
}

static void print_overall(const struct usage_view *v, const struct cli_units *u)
{
	uint64_t total_size = 0, total_missing = 0, total_slack = 0;
	uint64_t r_data_used = 0, r_data_chunks = 0, l_data_chunks = 0;
	uint64_t r_meta_used = 0, r_meta_chunks = 0, l_meta_chunks = 0;
	uint64_t r_sys_used = 0, r_sys_chunks = 0, reserve = 0, reserve_used = 0;
	uint64_t total_chunks, total_used, unused, free_est, free_min;
	double data_ratio, meta_ratio, max_ratio = 1.0;
	int width = u->fixed == 0 && !u->si ? 10 : 18; /* progs: 10 for its default units only */
	bool mixed = false;
	char a[64], b[64], multi[64] = "";

	for (size_t i = 0; i < v->ndevs; i++) {
		total_size += v->devs[i].size;
		if (v->devs[i].device_size > v->devs[i].size)
			total_slack += v->devs[i].device_size - v->devs[i].size;
		if (!v->devs[i].device_size)
			total_missing += v->devs[i].size;
	}
	/* RAID5/6: each chunk's data stripes, at the used ratio of its kind and profile */
	for (size_t i = 0; i < v->nchunks; i++) {
		const struct usage_chunk *c = &v->chunks[i];
		uint64_t lt = 0, lu = 0, size;
		double ratio, rt;

		if (!(c->type & (BG_RAID5 | BG_RAID6)))
			continue;
		for (size_t s = 0; s < v->nspaces; s++)
			if ((v->spaces[s].flags & c->type & (BG_RAID5 | BG_RAID6)) &&
			    (v->spaces[s].flags & BG_TYPE_MASK) == (c->type & BG_TYPE_MASK)) {
				lt += v->spaces[s].total;
				lu += v->spaces[s].used;
			}
		ratio = lt ? (double)lu / (double)lt : 0;
		rt = (double)c->num_stripes / (double)(c->num_stripes - nparity(c->type));
		if (rt > max_ratio)
			max_ratio = rt;
		size = c->size / (c->num_stripes - nparity(c->type));
		if (c->type & BG_DATA) {
			r_data_chunks += size;
			r_data_used += (uint64_t)((double)size * ratio);
		} else if (c->type & BG_METADATA) {
			r_meta_chunks += size;
			r_meta_used += (uint64_t)((double)size * ratio);
		} else if (c->type & BG_SYSTEM) {
			r_sys_chunks += size;
			r_sys_used += (uint64_t)((double)size * ratio);
		}
	}
	for (size_t i = 0; i < v->nspaces; i++) {
		const struct usage_space *s = &v->spaces[i];
		int ratio = (s->flags & (BG_RAID5 | BG_RAID6)) ? 0 : ncopies(s->flags);

		if (ratio > max_ratio)
			max_ratio = ratio;
		if (s->flags & BG_GLOBAL_RSV) {
			reserve = s->total;
			reserve_used = s->used;
			continue;
		}
		if ((s->flags & (BG_DATA | BG_METADATA)) == (BG_DATA | BG_METADATA))
			mixed = true;
		if (s->flags & BG_DATA) {
			r_data_used += s->used * (uint64_t)ratio;
			r_data_chunks += s->total * (uint64_t)ratio;
			l_data_chunks += s->total;
		}
		if (s->flags & BG_METADATA) {
			r_meta_used += s->used * (uint64_t)ratio;
			r_meta_chunks += s->total * (uint64_t)ratio;
			l_meta_chunks += s->total;
		}
		if (s->flags & BG_SYSTEM) {
			r_sys_used += s->used * (uint64_t)ratio;
			r_sys_chunks += s->total * (uint64_t)ratio;
		}
	}
	/* which kinds hold more than one profile (progs: data, metadata, data+metadata, system) */
	{
		static const uint64_t kinds[] = { BG_DATA, BG_METADATA, BG_DATA | BG_METADATA, BG_SYSTEM };
		static const char *const names[] = { "data", "metadata", "data+metadata", "system" };

		for (size_t k = 0; k < 4; k++) {
			int n = 0;

			for (size_t i = 0; i < v->nspaces; i++)
				if (!(v->spaces[i].flags & BG_GLOBAL_RSV) &&
				    (v->spaces[i].flags & BG_TYPE_MASK) == kinds[k])
					n++;
			if (n > 1)
				snprintf(multi + strlen(multi), sizeof(multi) - strlen(multi), "%s%s",
					 multi[0] ? ", " : "", names[k]);
		}
	}
	total_chunks = r_data_chunks + r_sys_chunks + (mixed ? 0 : r_meta_chunks);
	total_used = r_data_used + r_sys_used + (mixed ? 0 : r_meta_used);
	unused = total_size - total_chunks;
	data_ratio = (double)r_data_chunks / (double)l_data_chunks;
	meta_ratio = mixed ? data_ratio : (double)r_meta_chunks / (double)l_meta_chunks;
	free_est = (uint64_t)((double)(r_data_chunks - r_data_used) / data_ratio);
	if (mixed)
		free_est -= reserve - reserve_used;
	free_min = free_est;
	if (unused >= MIN_UNALLOCATED) {
		free_est = (uint64_t)((double)free_est + (double)unused / data_ratio);
		free_min = (uint64_t)((double)free_min + (double)unused / max_ratio);
	}
	printf("Overall:\n");
	printf("    Device size:\t\t%*s\n", width, sz(a, sizeof(a), total_size, u));
	printf("    Device allocated:\t\t%*s\n", width, sz(a, sizeof(a), total_chunks, u));
	printf("    Device unallocated:\t\t%*s\n", width, sz(a, sizeof(a), unused, u));
	printf("    Device missing:\t\t%*s\n", width, sz(a, sizeof(a), total_missing, u));
	printf("    Device slack:\t\t%*s\n", width, sz(a, sizeof(a), total_slack, u));
	printf("    Used:\t\t\t%*s\n", width, sz(a, sizeof(a), total_used, u));
	printf("    Free (estimated):\t\t%*s\t(min: %s)\n", width, sz(a, sizeof(a), free_est, u),
	       sz(b, sizeof(b), free_min, u));
	printf("    Free (statfs, df):\t\t%*s\n", width, sz(a, sizeof(a), v->statfs_free, u));
	printf("    Data ratio:\t\t\t%*.2f\n", width, data_ratio);
	printf("    Metadata ratio:\t\t%*.2f\n", width, meta_ratio);
	printf("    Global reserve:\t\t%*s\t(used: %s)\n", width, sz(a, sizeof(a), reserve, u),
	       sz(b, sizeof(b), reserve_used, u));
	if (multi[0])
		printf("    Multiple profiles:\t\t%*s\t(%s)\n", width, "yes", multi);
	else
		printf("    Multiple profiles:\t\t%*s\n", width, "no");
}

static void print_by_chunk(const struct usage_view *v, const struct cli_units *u)
{
	struct usage_space *spaces = malloc((v->nspaces ? v->nspaces : 1) * sizeof(*spaces));
	char a[64], b[64], p[16];

	if (!spaces)
		return;
	memcpy(spaces, v->spaces, v->nspaces * sizeof(*spaces));
	qsort(spaces, v->nspaces, sizeof(*spaces), space_cmp);
	for (size_t i = 0; i < v->nspaces; i++) {
		const struct usage_space *s = &spaces[i];

		if (s->flags & BG_GLOBAL_RSV)
			continue;
		/* progs computes the percentage in float */
		printf("%s,%s: Size:%s, Used:%s (%.2f%%)\n", cli_space_type(s->flags),
		       cli_profile_text(p, s->flags),
		       sz(a, sizeof(a), s->total, u), sz(b, sizeof(b), s->used, u),
		       (double)(100.0f * (float)s->used / (float)(s->total + 1)));
		for (size_t d = 0; d < v->ndevs; d++) {
			uint64_t total = 0;

			for (size_t c = 0; c < v->nchunks; c++)
				if (v->chunks[c].type == s->flags && v->chunks[c].devid == v->devs[d].devid)
					total += chunk_device_bytes(&v->chunks[c]);
			if (total)
				printf("   %s\t%10s\n", v->devs[d].path, sz(a, sizeof(a), total, u));
		}
		printf("\n");
	}
	free(spaces);
	if (v->nchunks) {
		printf("Unallocated:\n");
		for (size_t d = 0; d < v->ndevs; d++) {
			uint64_t total = 0;

			for (size_t c = 0; c < v->nchunks; c++)
				if (v->chunks[c].devid == v->devs[d].devid)
					total += chunk_device_bytes(&v->chunks[c]);
			printf("   %s\t%10s\n", v->devs[d].path,
			       sz(a, sizeof(a), v->devs[d].size - total, u));
		}
	}
}

static void print_devices(const struct usage_view *v, const struct cli_units *u)
{
	char a[64];

	for (size_t d = 0; d < v->ndevs; d++) {
		const struct usage_dev *dev = &v->devs[d];
		uint64_t allocated = 0;

		printf("%s, ID: %" PRIu64 "\n", dev->path, dev->devid);
		printf("   Device size: %*s%10s\n", (int)(20 - strlen("Device size")), "",
		       sz(a, sizeof(a), dev->device_size, u));
		printf("   Device slack: %*s%10s\n", (int)(20 - strlen("Device slack")), "",
		       sz(a, sizeof(a), dev->device_size > dev->size ? dev->device_size - dev->size : 0,
			  u));
		for (size_t c = 0; c < v->nchunks; c++) {
			const struct usage_chunk *ch = &v->chunks[c];
			char pbuf[16];
			const char *t = cli_space_type(ch->type), *p = cli_profile_text(pbuf, ch->type);
			uint64_t size = chunk_device_bytes(ch);

			if (ch->devid != dev->devid)
				continue;
			if (ch->type & (BG_RAID0 | BG_RAID10 | BG_RAID5 | BG_RAID6)) {
				char n[16];
				int digits = snprintf(n, sizeof(n), "%u", ch->num_stripes);

				printf("   %s,%s/%u:%*s%10s\n", t, p, ch->num_stripes,
				       (int)(20 - strlen(t) - strlen(p) - (size_t)digits - 1), "",
				       sz(a, sizeof(a), size, u));
			} else {
				printf("   %s,%s:%*s%10s\n", t, p, (int)(20 - strlen(t) - strlen(p)), "",
				       sz(a, sizeof(a), size, u));
			}
			allocated += size;
		}
		printf("   Unallocated: %*s%10s\n", (int)(20 - strlen("Unallocated")), "",
		       sz(a, sizeof(a), dev->size - allocated, u));
		printf("\n");
	}
}

/* butter filesystem usage | device usage [units] [--device DEV]... IMAGE|PATH */
int cmd_usage(const struct cli_command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		CLI_UNITS_LONGOPTS,
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct cli_units units = { 0, false };
	struct usage_view v = { 0 };
	bool devices = !strncmp(cmd->name, "device", 6);
	const char *target;
	int c, ret;

	cli_units_fix_h(argc, argv);
	while ((c = cli_getopt(&args, argc, argv, ":h" CLI_UNITS_SHORTOPTS, longopts)) != -1)
		if (!cli_units_option(&units, c))
			return cli_usage_error(cmd, "unknown option");
	if (argc - optind != 1) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 1 ? "missing IMAGE or PATH"
							      : "too many arguments");
	}
	target = argv[optind];
	if (cli_is_mount_path(target, &args)) {
		int fd = open(target, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		ret = fd < 0 ? -errno : load_mount(fd, target, &v);
		if (fd >= 0)
			close(fd);
		if (ret == -ENOTTY) {
			cli_error("%s: not inside a butter mount (give the image file)", target);
			free(args.devices);
			view_free(&v);
			return CLI_EXIT_ERROR;
		}
	} else {
		struct butter_fs *fs;

		if (cli_open(&args, target, &fs) < 0) {
			free(args.devices);
			return CLI_EXIT_ERROR;
		}
		ret = load_image(fs, &v);
		butter_close(fs);
	}
	free(args.devices);
	if (ret) {
		cli_error("%s: %s", target, ret == -EPERM ? "reading the chunk tree needs root"
							  : strerror(-ret));
		view_free(&v);
		return CLI_EXIT_ERROR;
	}
	if (devices) {
		print_devices(&v, &units);
	} else {
		print_overall(&v, &units);
		printf("\n");
		print_by_chunk(&v, &units);
	}
	view_free(&v);
	return cli_finish_stdout(CLI_EXIT_OK);
}
