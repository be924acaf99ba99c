/*
 * cmd_heatmap.c — `butter heatmap [--trace FILE] [--size PIXELS] [-o FILE.png]
 * IMAGE|PATH`: a picture of where things lie on each device, as
 * btrfs-heatmap draws it, without a kernel mount.
 *
 * Each device is a square of PIXELS x PIXELS (a power of two); its bytes, in
 * PIXELS^2 equal cells, follow a Hilbert curve through the square, so bytes
 * close on the device are close in the picture. A cell outside every chunk
 * is black; inside one it has its block group's colour (data white,
 * metadata blue, system red, mixed purple), dim when empty and full bright
 * when all its bytes hold extents; cells holding data of the traced files
 * turn orange. Devices stand side by side in devid order. The library's
 * butter_space_map() counts the bytes; this file only draws.
 *
 * PATH inside a live `butter mount`: the mount commits (BUTTER_IOC_SYNC) and
 * its image (the mount's source in /proc/self/mountinfo) is read as that
 * commit left it; plain trace paths are looked up through the mount.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef BUTTER_HAVE_PNG
#include <png.h>
#endif

#include <butter/control.h>

#include "cli.h"
#include "trace.h"

#define GAP 8 /* pixels between two devices' squares */

struct rgb {
	unsigned char r, g, b;
};

/* Cell @d of the curve through an @n x @n square (n a power of two) to x, y. */
static void hilbert_point(uint32_t n, uint64_t d, uint32_t *x, uint32_t *y)
{
	uint32_t px = 0, py = 0;

	for (uint32_t s = 1; s < n; s *= 2) {
		uint32_t rx = (uint32_t)(1 & (d / 2)), ry = (uint32_t)(1 & (d ^ rx));

		if (ry == 0) {
			/* the quadrant is turned: mirror, then swap the axes */
			uint32_t t;

			if (rx == 1) {
				px = s - 1 - px;
				py = s - 1 - py;
			}
			t = px;
			px = py;
			py = t;
		}
		px += s * rx;
		py += s * ry;
		d /= 4;
	}
	*x = px;
	*y = py;
}

static struct rgb type_colour(uint64_t flags)
{
	struct rgb c = { 255, 255, 255 };              /* data */

	if ((flags & BUTTER_BG_DATA) && (flags & BUTTER_BG_METADATA))
		c = (struct rgb){ 190, 110, 255 };      /* mixed */
	else if (flags & BUTTER_BG_METADATA)
		c = (struct rgb){ 70, 120, 255 };
	else if (flags & BUTTER_BG_SYSTEM)
		c = (struct rgb){ 255, 70, 70 };
	return c;
}

static unsigned char scale(unsigned char v, double f)
{
	double x = v * f;

	return (unsigned char)(x > 255 ? 255 : x < 0 ? 0 : x);
}

/* The colour of one cell (see the top of the file). */
static struct rgb cell_colour(const struct butter_space_cell *c, uint64_t cell_bytes)
{
	struct rgb base, out;
	double allocated, used, bright;

	if (!c->allocated)
		return (struct rgb){ 0, 0, 0 };
	base = type_colour(c->flags);
	allocated = (double)c->allocated / (double)cell_bytes;
	used = (double)(c->used < c->allocated ? c->used : c->allocated) / (double)cell_bytes;
	bright = 0.22 * allocated + 0.78 * used;
	out = (struct rgb){ scale(base.r, bright), scale(base.g, bright), scale(base.b, bright) };
	if (c->marked) {
		double m = (double)c->marked / (double)cell_bytes, w = 0.45 + 0.55 * (m > 1 ? 1 : m);

		out.r = (unsigned char)(out.r * (1 - w) + 255 * w);
		out.g = (unsigned char)(out.g * (1 - w) + 150 * w);
		out.b = (unsigned char)(out.b * (1 - w));
	}
	return out;
}

#ifdef BUTTER_HAVE_PNG
/* Write @rgb (@width x @height, 3 bytes a pixel) to @path. */
static int write_png(const char *path, const unsigned char *rgb, uint32_t width, uint32_t height)
{
	png_structp png = NULL;
	png_infop info = NULL;
	FILE *f = fopen(path, "wb");
	int ret = -1;

	if (!f) {
		cli_error("%s: %s", path, strerror(errno));
		return -1;
	}
	png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
	if (png)
		info = png_create_info_struct(png);
	if (!png || !info) {
		cli_error("%s: out of memory", path);
		goto out;
	}
	if (setjmp(png_jmpbuf(png))) {
		cli_error("%s: writing the PNG failed", path);
		goto out;
	}
	png_init_io(png, f);
	png_set_IHDR(png, info, width, height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
		     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
	png_set_filter(png, 0, PNG_FILTER_NONE); /* simple to read back (the tests do) */
	png_write_info(png, info);
	for (uint32_t y = 0; y < height; y++)
		png_write_row(png, rgb + (size_t)y * width * 3);
	png_write_end(png, NULL);
	ret = 0;
out:
	png_destroy_write_struct(&png, &info);
	if (fclose(f) != 0 && ret == 0) {
		cli_error("%s: %s", path, strerror(errno));
		ret = -1;
	}
	return ret;
}
#endif

/* Undo mountinfo's octal escapes (\040 for a space) in place. */
static void unescape_mountinfo(char *s)
{
	char *o = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*o++ = *s;
		}
	}
	*o = '\0';
}

/*
 * The `butter mount` holding @path: its mount point and source (the first
 * device) from /proc/self/mountinfo, the deepest one that contains @path.
 * 0, or -ENOENT when no butter mount holds it.
 */
static int find_mount(const char *path, char **mnt, char **source)
{
	char real[PATH_MAX], *line = NULL;
	size_t cap = 0, best = 0;
	FILE *f;

	if (!realpath(path, real))
		return -errno;
	f = fopen("/proc/self/mountinfo", "r");
	if (!f)
		return -errno;
	*mnt = *source = NULL;
	while (getline(&line, &cap, f) > 0) {
		char *fields[12], *sep, *save = NULL, *tok;
		size_t nf = 0, len;

		sep = strstr(line, " - ");
		if (!sep)
			continue;
		*sep = '\0';
		for (tok = strtok_r(line, " ", &save); tok && nf < 5; tok = strtok_r(NULL, " ", &save))
			fields[nf++] = tok;
		tok = strtok_r(sep + 3, " \n", &save);
		if (nf < 5 || !tok || strcmp(tok, "fuse.butter") != 0)
			continue;
		tok = strtok_r(NULL, " \n", &save); /* the source */
		if (!tok)
			continue;
		unescape_mountinfo(fields[4]);
		len = strlen(fields[4]);
		if (strncmp(real, fields[4], len) != 0 ||
		    (real[len] != '\0' && real[len] != '/' && len > 1) || len <= best)
			continue;
		free(*mnt);
		free(*source);
		*mnt = strdup(fields[4]);
		unescape_mountinfo(tok);
		*source = strdup(tok);
		best = len;
	}
	free(line);
	fclose(f);
	if (!best)
		return -ENOENT;
	return *mnt && *source ? 0 : -ENOMEM;
}

static void print_device(const struct butter_device_info *dev, const struct butter_space_cell *cells,
			 size_t ncells, uint64_t cell_bytes)
{
	uint64_t allocated = 0, used = 0, marked = 0;
	char a[32], u[32], m[32], t[32], c[32];

	for (size_t i = 0; i < ncells; i++) {
		allocated += cells[i].allocated;
		used += cells[i].used;
		marked += cells[i].marked;
	}
	printf("devid %" PRIu64 " %s: size %s, allocated %s, used %s, traced %s (a pixel: %s)\n",
	       dev->devid, dev->path ? dev->path : "(missing)", cli_size(t, sizeof(t), dev->total_bytes, false),
	       cli_size(a, sizeof(a), allocated, false), cli_size(u, sizeof(u), used, false),
	       cli_size(m, sizeof(m), marked, false), cli_size(c, sizeof(c), cell_bytes, false));
	printf("  bytes: allocated %" PRIu64 ", used %" PRIu64 ", traced %" PRIu64 "\n", allocated, used,
	       marked);
}

int cmd_heatmap(const struct cli_command *cmd, int argc, char **argv)
{
	enum { OPT_TRACE = CLI_OPT_FIRST_FREE, OPT_SIZE };
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "trace", required_argument, NULL, OPT_TRACE },
		{ "size", required_argument, NULL, OPT_SIZE },
		{ "output", required_argument, NULL, 'o' },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_layout_range *ranges = NULL;
	struct butter_space_cell *cells = NULL;
	struct butter_device_info dev;
	struct butter_fs *fs = NULL;
	const char *trace_path = NULL, *out = "heatmap.png", *target, *image;
	char *mnt = NULL, *source = NULL, *end;
	unsigned char *rgb = NULL;
	uint32_t size = 256, width, ndev = 0;
	size_t n = 0, unresolved = 0, i;
	struct trace t = { 0 };
	int c, ret = 0, top_fd = -1, status = CLI_EXIT_ERROR;
	unsigned long v;

	while ((c = cli_getopt(&args, argc, argv, ":ho:", longopts)) != -1) {
		if (c == OPT_TRACE) {
			trace_path = optarg;
		} else if (c == 'o') {
			out = optarg;
		} else if (c == OPT_SIZE) {
			errno = 0;
			v = strtoul(optarg, &end, 10);
			if (errno || *end || v < 16 || v > 4096 || (v & (v - 1))) {
				free(args.devices);
				return cli_usage_error(cmd, "--size must be a power of two from 16 to 4096: %s",
						       optarg);
			}
			size = (uint32_t)v;
		}
	}
	if (argc - optind != 1) {
		free(args.devices);
		return cli_usage_error(cmd, argc - optind < 1 ? "missing IMAGE or PATH" : "too many arguments");
	}
#ifndef BUTTER_HAVE_PNG
	(void)out;
	cli_error("heatmap: this butter was built without libpng (install libpng-dev and rebuild)");
	free(args.devices);
	return CLI_EXIT_ERROR;
#else
	target = image = argv[optind];
	if (cli_is_mount_path(target, &args)) {
		ret = find_mount(target, &mnt, &source);
		if (ret) {
			cli_error("%s: %s", target, ret == -ENOENT ? "not inside a butter mount (give the image file)"
							       : strerror(-ret));
			goto out;
		}
		top_fd = open(mnt, O_RDONLY | O_CLOEXEC | O_DIRECTORY);
		if (top_fd < 0 || ioctl(top_fd, BUTTER_IOC_SYNC) < 0) {
			cli_error("%s: the mount did not commit: %s", mnt, strerror(errno));
			goto out;
		}
		image = source;
	}
	if (trace_path && trace_load(trace_path, &t) < 0)
		goto out;
	if (cli_open(&args, image, &fs) < 0)
		goto out;
	if (trace_path) {
		ret = trace_resolve(&t, top_fd >= 0 ? NULL : fs, top_fd, &unresolved);
		if (ret == 0 && !(ranges = trace_to_ranges(&t, &n)))
			ret = -ENOMEM;
		if (ret) {
			cli_error("%s: %s", trace_path, strerror(-ret));
			goto out;
		}
	}
	while (butter_get_device(fs, ndev, &dev) == 0)
		ndev++;
	width = ndev * size + (ndev ? ndev - 1 : 0) * GAP;
	cells = calloc((size_t)size * size, sizeof(*cells));
	rgb = calloc((size_t)width * size, 3);
	if (!cells || !rgb) {
		cli_error("out of memory");
		goto out;
	}
	for (i = 0; i < (size_t)width * size; i++)
		rgb[i * 3] = rgb[i * 3 + 1] = rgb[i * 3 + 2] = 40; /* the gaps */
	for (uint32_t d = 0; d < ndev; d++) {
		uint64_t ncells = (uint64_t)size * size, cell_bytes;

		ret = butter_get_device(fs, d, &dev);
		if (ret)
			break;
		cell_bytes = (dev.total_bytes + ncells - 1) / ncells;
		if (!cell_bytes)
			cell_bytes = 1;
		ret = butter_space_map(fs, dev.devid, cell_bytes, ranges, n, cells, (size_t)ncells);
		if (ret)
			break;
		for (uint64_t k = 0; k < ncells; k++) {
			uint32_t x, y;
			struct rgb col = cell_colour(&cells[k], cell_bytes);
			unsigned char *p;

			hilbert_point(size, k, &x, &y);
			p = rgb + ((size_t)y * width + d * (size + GAP) + x) * 3;
			p[0] = col.r;
			p[1] = col.g;
			p[2] = col.b;
		}
		print_device(&dev, cells, (size_t)ncells, cell_bytes);
	}
	if (ret) {
		cli_error("%s: %s", image, strerror(-ret));
		goto out;
	}
	if (write_png(out, rgb, width, size) < 0)
		goto out;
	if (trace_path)
		printf("trace: %zu files, %zu ranges%s\n", t.nfiles, n,
		       unresolved ? " (some paths name nothing)" : "");
	printf("wrote %s (%" PRIu32 "x%" PRIu32 ": black unallocated; white data, blue metadata, "
	       "red system, purple mixed, brighter fuller; orange traced)\n",
	       out, width, size);
	status = cli_finish_stdout(CLI_EXIT_OK);
out:
	if (fs)
		butter_close(fs);
	if (top_fd >= 0)
		close(top_fd);
	if (trace_path)
		trace_free(&t);
	free(ranges);
	free(cells);
	free(rgb);
	free(mnt);
	free(source);
	free(args.devices);
	return status;
#endif
}
