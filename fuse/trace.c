/*
 * trace.c — `butter mount -o trace=FILE`: the access trace. Each read that
 * reaches the daemon and is not already covered by what was recorded of its
 * file becomes a line of FILE, in the order the reads arrive, in the format
 * cli/trace.h describes (and `butter layout --trace` reads):
 *
 *   SUBVOLID<TAB>INO<TAB>OFFSET<TAB>LENGTH<TAB>PATH
 *
 * PATH is one name of the file from the top of the mounted subvolume. Only
 * reads that reach the daemon are seen: the kernel's page cache answers the
 * others, so the trace holds each page's first read since the mount, which is
 * what a cold start (the boot experiment) needs.
 *
 * Memory: each file's recorded ranges are kept, merged, to drop repeated
 * reads; past TRACE_MAX_FILES files nothing new is recorded and a comment
 * line says so. Lines are buffered and written when a second has passed
 * since the last write, and at unmount (trace_close()).
 *
 * Locking: the recorder's mutex is taken by the read path after its library
 * section has ended; under it the library is never called (a new file's path
 * is looked up before), so it orders after every other lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "trace.h"

#define TRACE_MAX_FILES (1u << 20)

struct traced_file {
	butter_ino_t ino;
	uint64_t *ranges;   /* [start, end) pairs, sorted, merged */
	size_t nranges, cap;
};

struct tracer {
	pthread_mutex_t lock;
	FILE *out;
	char *path;
	butter_ino_t root;          /* the mount's root directory */
	char *root_path;            /* its subvolume's path from the top level ("" for 5) */
	struct traced_file *files;  /* open addressing by inode */
	size_t cap, n;
	int full;                   /* TRACE_MAX_FILES reached, said once */
	int failed;                 /* a write failed, said once; recording stops */
	struct timespec last_flush;
};

static size_t slot_of(const struct tracer *t, butter_ino_t ino)
{
	uint64_t h = ino.subvol * 0x9E3779B97F4A7C15ULL ^ ino.ino * 0xC2B2AE3D27D4EB4FULL;

	return (size_t)(h >> 7) & (t->cap - 1);
}

static struct traced_file *find(struct tracer *t, butter_ino_t ino)
{
	size_t s;

	if (!t->cap)
		return NULL;
	for (s = slot_of(t, ino); t->files[s].ino.ino; s = (s + 1) & (t->cap - 1))
		if (t->files[s].ino.ino == ino.ino && t->files[s].ino.subvol == ino.subvol)
			return &t->files[s];
	return NULL;
}

static struct traced_file *insert(struct tracer *t, butter_ino_t ino)
{
	size_t s;

	if ((t->n + 1) * 2 > t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 1024, i;
		struct traced_file *files = calloc(cap, sizeof(*files));

		if (!files)
			return NULL;
		for (i = 0; i < t->cap; i++) {
			if (!t->files[i].ino.ino)
				continue;
			for (s = (size_t)((t->files[i].ino.subvol * 0x9E3779B97F4A7C15ULL ^
					   t->files[i].ino.ino * 0xC2B2AE3D27D4EB4FULL) >> 7) & (cap - 1);
			     files[s].ino.ino; s = (s + 1) & (cap - 1))
				;
			files[s] = t->files[i];
		}
		free(t->files);
		t->files = files;
		t->cap = cap;
	}
	for (s = slot_of(t, ino); t->files[s].ino.ino; s = (s + 1) & (t->cap - 1))
		;
	t->files[s].ino = ino;
	t->n++;
	return &t->files[s];
}

/* The part of [start, end) @f has not recorded yet, at or after start: 0 when none. */
static int uncovered(const struct traced_file *f, uint64_t *start, uint64_t end)
{
	size_t i;

	for (i = 0; i < f->nranges; i++) {
		uint64_t a = f->ranges[2 * i], b = f->ranges[2 * i + 1];

		if (a <= *start && *start < b)
			*start = b;
	}
	return *start < end;
}

/* Record [start, end) in @f, merged. -ENOMEM leaves @f as it was. */
static int cover(struct traced_file *f, uint64_t start, uint64_t end)
{
	size_t i, j;

	if (f->nranges == f->cap) {
		size_t cap = f->cap ? f->cap * 2 : 4;
		uint64_t *r = realloc(f->ranges, cap * 2 * sizeof(*r));

		if (!r)
			return -ENOMEM;
		f->ranges = r;
		f->cap = cap;
	}
	for (i = 0; i < f->nranges && f->ranges[2 * i] < start; i++)
		;
	memmove(&f->ranges[2 * (i + 1)], &f->ranges[2 * i], (f->nranges - i) * 2 * sizeof(uint64_t));
	f->ranges[2 * i] = start;
	f->ranges[2 * i + 1] = end;
	f->nranges++;
	/* merge neighbours that touch or overlap */
	for (i = 0, j = 0; i < f->nranges; i++) {
		if (j && f->ranges[2 * i] <= f->ranges[2 * (j - 1) + 1]) {
			if (f->ranges[2 * i + 1] > f->ranges[2 * (j - 1) + 1])
				f->ranges[2 * (j - 1) + 1] = f->ranges[2 * i + 1];
		} else {
			f->ranges[2 * j] = f->ranges[2 * i];
			f->ranges[2 * j + 1] = f->ranges[2 * i + 1];
			j++;
		}
	}
	f->nranges = j;
	return 0;
}

/* Write @s escaped as the format says. */
static void put_escaped(FILE *out, const char *s)
{
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '\\')
			fputs("\\\\", out);
		else if (c == '\n')
			fputs("\\n", out);
		else if (c == '\t')
			fputs("\\t", out);
		else if (c < 0x20 || c == 0x7f)
			fprintf(out, "\\%03o", c);
		else
			fputc(c, out);
	}
}

/* The path of @ino from the top of the mount, into @out ("/a/b"). */
static void path_of(struct daemon *d, struct tracer *t, butter_ino_t ino, char *out, size_t cap)
{
	char *in_subvol = malloc(PATH_MAX);
	struct butter_subvol_info *si = NULL;
	const char *prefix = "";
	int ret;

	if (!in_subvol) {
		snprintf(out, cap, "/?");
		return;
	}
	ret = butter_ino_path(d->fs, ino, in_subvol, PATH_MAX);
	if (ret == 0 && ino.subvol != t->root.subvol) {
		/* a nested subvolume: its own path, from the mounted one's */
		si = malloc(sizeof(*si));
		if (si && butter_subvol_get(d->fs, ino.subvol, si) == 0) {
			size_t rl = strlen(t->root_path);

			prefix = si->path;
			if (rl && !strncmp(prefix, t->root_path, rl) && prefix[rl] == '/')
				prefix += rl + 1;
			else if (rl)
				prefix = "?"; /* outside the mounted subvolume */
		} else {
			ret = -ENOENT;
		}
	}
	if (ret)
		snprintf(out, cap, "/?"); /* an orphan: the ids still name it */
	else
		snprintf(out, cap, "%s%s%s%s", *prefix ? "/" : "", prefix,
			 *in_subvol || !*prefix ? "/" : "", in_subvol);
	free(si);
	free(in_subvol);
}

int trace_open(struct daemon *d, const char *path, butter_ino_t root)
{
	struct tracer *t = calloc(1, sizeof(*t));
	struct butter_subvol_info *si = malloc(sizeof(*si));
	size_t ml = strlen(d->opts->mountpoint);
	char *dir = NULL, *real = NULL, *slash;
	int fd, ret = 0;

	if (!t || !si || !(t->path = strdup(path))) {
		ret = -ENOMEM;
		goto fail;
	}
	/* the trace must not be a file of the mount it records */
	dir = strdup(path);
	slash = dir ? strrchr(dir, '/') : NULL;
	if (slash)
		*slash = 0;
	real = dir ? realpath(*dir ? dir : "/", NULL) : NULL;
	if (!real) {
		ret = dir ? -errno : -ENOMEM;
		daemon_log(d, BUTTER_LOG_ERROR, "trace=%s: %s", path, strerror(-ret));
		goto fail;
	}
	if (!strncmp(real, d->opts->mountpoint, ml) && (real[ml] == '/' || real[ml] == 0)) {
		daemon_log(d, BUTTER_LOG_ERROR, "trace=%s: inside the mountpoint %s; put it elsewhere",
			   path, d->opts->mountpoint);
		ret = -EINVAL;
		goto fail;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || !(t->out = fdopen(fd, "w"))) {
		ret = -errno;
		if (fd >= 0)
			close(fd);
		daemon_log(d, BUTTER_LOG_ERROR, "trace=%s: %s", path, strerror(-ret));
		goto fail;
	}
	t->root = root;
	if (butter_subvol_get(d->fs, root.subvol, si) == 0)
		t->root_path = strdup(si->path);
	else
		t->root_path = strdup("");
	if (!t->root_path) {
		ret = -ENOMEM;
		goto fail;
	}
	pthread_mutex_init(&t->lock, NULL);
	fprintf(t->out, "# butter-trace 1\n");
	fflush(t->out);
	clock_gettime(CLOCK_MONOTONIC, &t->last_flush);
	d->tracer = t;
	free(si);
	free(dir);
	free(real);
	return 0;
fail:
	if (t && t->out)
		fclose(t->out);
	if (t) {
		free(t->path);
		free(t->root_path);
	}
	free(t);
	free(si);
	free(dir);
	free(real);
	return ret;
}

void trace_read(struct daemon *d, butter_ino_t ino, uint64_t off, uint64_t len)
{
	struct tracer *t = d->tracer;
	struct traced_file *f;
	struct timespec now;
	char path[PATH_MAX + 8];
	uint64_t start = off;

	if (!t || !len)
		return;
	pthread_mutex_lock(&t->lock);
	f = find(t, ino);
	if (t->failed || (f && !uncovered(f, &start, off + len)) || (!f && t->full)) {
		pthread_mutex_unlock(&t->lock);
		return;
	}
	pthread_mutex_unlock(&t->lock);
	/* the library, outside the recorder's lock */
	path_of(d, t, ino, path, sizeof(path));
	pthread_mutex_lock(&t->lock);
	f = find(t, ino);
	start = off;
	if (!f && t->n >= TRACE_MAX_FILES) {
		if (!t->full)
			fprintf(t->out, "# trace full: %u files; later files are not recorded\n",
				TRACE_MAX_FILES);
		t->full = 1;
	} else if ((f || (f = insert(t, ino))) && uncovered(f, &start, off + len) &&
		   cover(f, start, off + len) == 0) {
		fprintf(t->out, "%llu\t%llu\t%llu\t%llu\t", (unsigned long long)ino.subvol,
			(unsigned long long)ino.ino, (unsigned long long)start,
			(unsigned long long)(off + len - start));
		put_escaped(t->out, path);
		fputc('\n', t->out);
	}
	clock_gettime(CLOCK_MONOTONIC, &now);
	if (now.tv_sec > t->last_flush.tv_sec) {
		t->last_flush = now;
		if (fflush(t->out) != 0 && !t->failed) {
			t->failed = 1;
			daemon_log(d, BUTTER_LOG_ERROR, "trace=%s: %s; no longer recording", t->path,
				   strerror(errno));
		}
	}
	pthread_mutex_unlock(&t->lock);
}

void trace_close(struct daemon *d)
{
	struct tracer *t = d->tracer;
	size_t i;

	if (!t)
		return;
	d->tracer = NULL;
	{
		int flushed = fflush(t->out), err = errno;

		if (fclose(t->out) != 0 && flushed == 0)
			err = errno, flushed = -1;
		if (flushed != 0 && !t->failed)
			daemon_log(d, BUTTER_LOG_ERROR, "trace=%s: %s", t->path, strerror(err));
	}
	for (i = 0; i < t->cap; i++)
		free(t->files[i].ranges);
	free(t->files);
	free(t->path);
	free(t->root_path);
	pthread_mutex_destroy(&t->lock);
	free(t);
}
