/*
 * trace.c — reading an access trace (trace.h has the format): lines grouped
 * per file in order of first appearance, each file's ranges sorted and
 * merged. Files are found again by (subvolume, inode), or by path in a
 * plain list, through a hash table, so a trace of a million reads loads in
 * one pass. Then a plain list's paths are looked up (trace_resolve()) and
 * the whole becomes the library's file ranges (trace_to_ranges()), for
 * `butter layout` and `butter heatmap`.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <butter/control.h>

#include "cli.h"
#include "trace.h"

#define TRACE_HEADER "# butter-trace 1"

struct loader {
	const char *name;
	struct trace *t;
	size_t *slots;  /* hash table of file index + 1 (0: empty) */
	size_t cap;     /* a power of two */
};

static uint64_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ULL; /* FNV-1a */

	while (n--)
		h = (h ^ (uint8_t)*s++) * 1099511628211ULL;
	return h;
}

static uint64_t file_hash(const struct trace *t, const struct trace_file *f)
{
	if (t->plain)
		return hash_bytes(f->path, strlen(f->path));
	return (f->subvol * 0x9E3779B97F4A7C15ULL) ^ (f->ino * 0xC2B2AE3D27D4EB4FULL);
}

static int same_file(const struct trace *t, const struct trace_file *a, const struct trace_file *b)
{
	return t->plain ? !strcmp(a->path, b->path) : a->subvol == b->subvol && a->ino == b->ino;
}

static int grow_table(struct loader *ld)
{
	size_t cap = ld->cap ? ld->cap * 2 : 1024, i;
	size_t *slots = calloc(cap, sizeof(*slots));

	if (!slots)
		return -1;
	for (i = 0; i < ld->t->nfiles; i++) {
		size_t s = (size_t)file_hash(ld->t, &ld->t->files[i]) & (cap - 1);

		while (slots[s])
			s = (s + 1) & (cap - 1);
		slots[s] = i + 1;
	}
	free(ld->slots);
	ld->slots = slots;
	ld->cap = cap;
	return 0;
}

/* The file @key names (its path is taken over when it is new); NULL: no memory. */
static struct trace_file *find_or_add(struct loader *ld, struct trace_file *key)
{
	struct trace *t = ld->t;
	size_t s;

	if ((t->nfiles + 1) * 2 > ld->cap && grow_table(ld) < 0)
		return NULL;
	s = (size_t)file_hash(t, key) & (ld->cap - 1);
	for (; ld->slots[s]; s = (s + 1) & (ld->cap - 1)) {
		struct trace_file *f = &t->files[ld->slots[s] - 1];

		if (same_file(t, f, key)) {
			free(key->path);
			key->path = NULL;
			return f;
		}
	}
	if ((t->nfiles & (t->nfiles - 1)) == 0) { /* 0, 1, 2, 4, ...: double */
		struct trace_file *nf = realloc(t->files, (t->nfiles ? t->nfiles * 2 : 1) * sizeof(*nf));

		if (!nf)
			return NULL;
		t->files = nf;
	}
	t->files[t->nfiles] = *key;
	key->path = NULL;
	ld->slots[s] = ++t->nfiles;
	return &t->files[t->nfiles - 1];
}

static int add_range(struct trace_file *f, uint64_t off, uint64_t len)
{
	if ((f->nranges & (f->nranges - 1)) == 0) {
		struct trace_range *r = realloc(f->ranges, (f->nranges ? f->nranges * 2 : 1) * sizeof(*r));

		if (!r)
			return -1;
		f->ranges = r;
	}
	f->ranges[f->nranges].off = off;
	f->ranges[f->nranges].len = len;
	f->nranges++;
	return 0;
}

/* Undo the recorder's escapes in place; -1 for a bad one. */
static int unescape(char *s)
{
	char *out = s;

	while (*s) {
		if (*s != '\\') {
			*out++ = *s++;
			continue;
		}
		s++;
		if (*s == '\\' || *s == 'n' || *s == 't') {
			*out++ = *s == 'n' ? '\n' : *s == 't' ? '\t' : '\\';
			s++;
		} else if (s[0] >= '0' && s[0] <= '3' && s[1] >= '0' && s[1] <= '7' && s[2] >= '0' &&
			   s[2] <= '7') {
			int v = (s[0] - '0') * 64 + (s[1] - '0') * 8 + (s[2] - '0');

			if (v == 0)
				return -1; /* a NUL cannot be part of a name */
			*out++ = (char)v;
			s += 3;
		} else {
			return -1;
		}
	}
	*out = 0;
	return 0;
}

static int parse_u64(const char *s, const char *end, uint64_t *out)
{
	uint64_t v = 0;

	if (s == end)
		return -1;
	for (; s < end; s++) {
		if (*s < '0' || *s > '9' || v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
			return -1;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return 0;
}

/* One line of a trace (no newline, NUL-terminated). */
static int trace_line(struct loader *ld, char *line, size_t lineno)
{
	char *field[5], *p = line;
	struct trace_file key, *f;
	uint64_t num[4];
	int i;

	for (i = 0; i < 4; i++) {
		char *tab = strchr(p, '\t');

		if (!tab)
			goto bad;
		field[i] = p;
		*tab = 0;
		p = tab + 1;
		if (parse_u64(field[i], tab, &num[i]) < 0)
			goto bad;
	}
	field[4] = p;
	if (num[0] == 0 || num[1] == 0 || *p != '/' || unescape(p) < 0)
		goto bad;
	if (num[3] && num[2] + num[3] < num[2])
		goto bad;
	memset(&key, 0, sizeof(key));
	key.subvol = num[0];
	key.ino = num[1];
	key.path = strdup(p);
	if (!key.path || !(f = find_or_add(ld, &key)) || add_range(f, num[2], num[3]) < 0) {
		free(key.path);
		cli_error("%s: out of memory", ld->name);
		return -1;
	}
	return 0;
bad:
	cli_error("%s:%zu: not a trace line (SUBVOLID, INO, OFFSET, LENGTH and a path from '/', "
		  "separated by tabs)", ld->name, lineno);
	return -1;
}

static int plain_line(struct loader *ld, char *line)
{
	struct trace_file key, *f;

	memset(&key, 0, sizeof(key));
	key.path = strdup(line);
	if (!key.path || !(f = find_or_add(ld, &key)) || (f->nranges == 0 && add_range(f, 0, 0) < 0)) {
		free(key.path);
		cli_error("%s: out of memory", ld->name);
		return -1;
	}
	return 0;
}

static int cmp_range(const void *pa, const void *pb)
{
	const struct trace_range *a = pa, *b = pb;

	return a->off < b->off ? -1 : a->off > b->off;
}

/* Sort and merge a file's ranges; one of length 0 (the whole file) covers all. */
static void merge_ranges(struct trace_file *f)
{
	size_t i, n = 0;

	for (i = 0; i < f->nranges; i++)
		if (f->ranges[i].len == 0) {
			f->ranges[0].off = 0;
			f->ranges[0].len = 0;
			f->nranges = 1;
			return;
		}
	qsort(f->ranges, f->nranges, sizeof(*f->ranges), cmp_range);
	for (i = 0; i < f->nranges; i++) {
		struct trace_range *r = &f->ranges[i];

		if (n && r->off <= f->ranges[n - 1].off + f->ranges[n - 1].len) {
			uint64_t end = r->off + r->len, last = f->ranges[n - 1].off + f->ranges[n - 1].len;

			if (end > last)
				f->ranges[n - 1].len = end - f->ranges[n - 1].off;
		} else {
			f->ranges[n++] = *r;
		}
	}
	f->nranges = n;
}

static char *read_all(const char *path, size_t *len)
{
	FILE *in = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	size_t cap = 1 << 16, n = 0;
	char *buf = NULL;

	if (!in)
		return NULL;
	for (;;) {
		char *nb = realloc(buf, cap + 1);
		size_t got;

		if (!nb) {
			free(buf);
			buf = NULL;
			errno = ENOMEM;
			break;
		}
		buf = nb;
		got = fread(buf + n, 1, cap - n, in);
		n += got;
		if (n < cap) {
			if (ferror(in)) {
				free(buf);
				buf = NULL;
				errno = EIO;
			}
			break;
		}
		cap *= 2;
	}
	if (in != stdin)
		fclose(in);
	if (buf) {
		buf[n] = 0;
		*len = n;
	}
	return buf;
}

int trace_load(const char *path, struct trace *out)
{
	struct loader ld = { path, out, NULL, 0 };
	size_t len, lineno = 0;
	char *buf, *line, *next;
	int ret = 0;

	memset(out, 0, sizeof(*out));
	buf = read_all(path, &len);
	if (!buf) {
		cli_error("%s: %s", path, strerror(errno));
		return -1;
	}
	if (memchr(buf, 0, len)) {
		cli_error("%s: not a trace or a list of paths (it holds NUL bytes)", path);
		free(buf);
		return -1;
	}
	out->plain = strncmp(buf, TRACE_HEADER, strlen(TRACE_HEADER)) != 0;
	for (line = buf; ret == 0 && line < buf + len; line = next) {
		char *nl = strchr(line, '\n');

		next = nl ? nl + 1 : buf + len;
		if (nl)
			*nl = 0;
		lineno++;
		if (nl && nl > line && nl[-1] == '\r' && out->plain)
			nl[-1] = 0;
		if (!*line || (!out->plain && line[0] == '#'))
			continue;
		if (out->plain) {
			if (strchr(line, '\t')) {
				cli_error("%s:%zu: a tab in a list of paths (a trace starts with \"%s\")",
					  path, lineno, TRACE_HEADER);
				ret = -1;
			} else {
				ret = plain_line(&ld, line);
			}
		} else {
			ret = trace_line(&ld, line, lineno);
		}
	}
	free(buf);
	free(ld.slots);
	if (ret == 0) {
		for (size_t i = 0; i < out->nfiles; i++)
			merge_ranges(&out->files[i]);
		if (out->nfiles == 0) {
			cli_error("%s: names no file", path);
			ret = -1;
		}
	}
	if (ret)
		trace_free(out);
	return ret;
}

void trace_free(struct trace *t)
{
	size_t i;

	for (i = 0; i < t->nfiles; i++) {
		free(t->files[i].path);
		free(t->files[i].ranges);
	}
	free(t->files);
	memset(t, 0, sizeof(*t));
}

int trace_resolve(struct trace *t, struct butter_fs *fs, int top_fd, size_t *missing)
{
	size_t i;

	for (i = 0; i < t->nfiles; i++) {
		struct trace_file *f = &t->files[i];
		const char *rel = f->path;

		if (f->ino)
			continue;
		if (fs) {
			char *abs = NULL;
			butter_ino_t ino;
			int ret;

			if (rel[0] != '/' && asprintf(&abs, "/%s", rel) < 0)
				return -ENOMEM;
			ret = cli_resolve(fs, abs ? abs : rel, true, &ino);
			free(abs);
			if (ret == 0) {
				f->subvol = ino.subvol;
				f->ino = ino.ino;
			} else if (ret == -ENOENT || ret == -ENOTDIR) {
				(*missing)++;
			} else {
				return ret;
			}
		} else {
			struct butter_ioc_info info;
			int fd;

			while (*rel == '/')
				rel++;
			fd = openat(top_fd, *rel ? rel : ".", O_RDONLY | O_CLOEXEC | O_NONBLOCK);
			if (fd < 0) {
				if (errno != ENOENT && errno != ENOTDIR)
					return -errno;
				(*missing)++;
				continue;
			}
			if (ioctl(fd, BUTTER_IOC_INFO, &info) == 0) {
				f->subvol = info.subvol;
				f->ino = info.ino;
			} else {
				(*missing)++;
			}
			close(fd);
		}
	}
	return 0;
}

struct butter_layout_range *trace_to_ranges(const struct trace *t, size_t *n)
{
	struct butter_layout_range *r;
	size_t i, k, total = 0;

	for (i = 0; i < t->nfiles; i++)
		if (t->files[i].ino)
			total += t->files[i].nranges;
	r = calloc(total ? total : 1, sizeof(*r));
	if (!r)
		return NULL;
	*n = 0;
	for (i = 0; i < t->nfiles; i++) {
		const struct trace_file *f = &t->files[i];

		if (!f->ino)
			continue;
		for (k = 0; k < f->nranges; k++) {
			r[*n].ino.subvol = f->subvol;
			r[*n].ino.ino = f->ino;
			r[*n].off = f->ranges[k].off;
			r[*n].len = f->ranges[k].len;
			(*n)++;
		}
	}
	return r;
}
