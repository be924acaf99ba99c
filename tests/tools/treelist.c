/*
 * treelist.c — the two walkers of treelist.h (libbutter and POSIX) and the
 * comparison. Both produce exactly the same line for the same inode, so any
 * difference is a difference of content.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <xxhash.h>

#include "treelist.h"

#define CHUNK (1u << 20)

void treelist_free(struct treelist *t)
{
	for (size_t i = 0; i < t->n; i++)
		free(t->lines[i]);
	free(t->lines);
	memset(t, 0, sizeof(*t));
}

int treelist_add(struct treelist *t, const char *line)
{
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 64;
		char **l = realloc(t->lines, cap * sizeof(*l));

		if (!l)
			return -ENOMEM;
		t->lines = l;
		t->cap = cap;
	}
	t->lines[t->n] = strdup(line);
	if (!t->lines[t->n])
		return -ENOMEM;
	t->n++;
	{
		/* count regular file bytes: TYPE is field 2, SIZE field 7 */
		const char *f = line;
		int field;

		for (field = 1; field < 7 && f; field++) {
			f = strchr(f, '\t');
			if (f)
				f++;
			if (field == 1 && f && (f[0] != 'f' || f[1] != '\t'))
				f = NULL;
		}
		if (f)
			t->file_bytes += strtoull(f, NULL, 10);
	}
	return 0;
}

static int cmp_line(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void treelist_sort(struct treelist *t)
{
	if (t->n)
		qsort(t->lines, t->n, sizeof(*t->lines), cmp_line);
}

/* Append @s escaped (\\, \t, \n) to @out (capacity @cap, always terminated). */
static void escape(char *out, size_t cap, const char *s, size_t len)
{
	size_t o = strlen(out);

	for (size_t i = 0; i < len && o + 3 < cap; i++) {
		if (s[i] == '\\' || s[i] == '\t' || s[i] == '\n') {
			out[o++] = '\\';
			out[o++] = s[i] == '\t' ? 't' : s[i] == '\n' ? 'n' : '\\';
		} else {
			out[o++] = s[i];
		}
	}
	out[o] = '\0';
}

static void hex(char *out, const unsigned char *d, size_t n)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

static char type_char(unsigned mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG: return 'f';
	case S_IFDIR: return 'd';
	case S_IFLNK: return 'l';
	case S_IFCHR: return 'c';
	case S_IFBLK: return 'b';
	case S_IFIFO: return 'p';
	default: return 's';
	}
}

/* An xattr list as name/value pairs, hashed in name order. */
struct xattrs {
	char **names;
	unsigned char **values;
	size_t *lens;
	size_t n;
};

static void xattrs_free(struct xattrs *x)
{
	for (size_t i = 0; i < x->n; i++) {
		free(x->names[i]);
		free(x->values[i]);
	}
	free(x->names);
	free(x->values);
	free(x->lens);
	memset(x, 0, sizeof(*x));
}

static int xattrs_add(struct xattrs *x, const char *name, const void *value, size_t len)
{
	char **nn = realloc(x->names, (x->n + 1) * sizeof(*nn));
	unsigned char **nv;
	size_t *nl;

	if (!nn)
		return -ENOMEM;
	x->names = nn;
	nv = realloc(x->values, (x->n + 1) * sizeof(*nv));
	if (!nv)
		return -ENOMEM;
	x->values = nv;
	nl = realloc(x->lens, (x->n + 1) * sizeof(*nl));
	if (!nl)
		return -ENOMEM;
	x->lens = nl;
	x->names[x->n] = strdup(name);
	x->values[x->n] = malloc(len ? len : 1);
	if (!x->names[x->n] || !x->values[x->n]) {
		free(x->names[x->n]);
		free(x->values[x->n]);
		return -ENOMEM;
	}
	memcpy(x->values[x->n], value, len);
	x->lens[x->n] = len;
	x->n++;
	return 0;
}

static void xattrs_digest(struct xattrs *x, char out[33])
{
	XXH3_state_t *st;
	XXH128_canonical_t d;
	size_t i, j;

	if (x->n == 0) {
		strcpy(out, "-");
		return;
	}
	for (i = 1; i < x->n; i++) { /* insertion sort by name: lists are short */
		for (j = i; j > 0 && strcmp(x->names[j - 1], x->names[j]) > 0; j--) {
			char *tn = x->names[j];
			unsigned char *tv = x->values[j];
			size_t tl = x->lens[j];

			x->names[j] = x->names[j - 1];
			x->values[j] = x->values[j - 1];
			x->lens[j] = x->lens[j - 1];
			x->names[j - 1] = tn;
			x->values[j - 1] = tv;
			x->lens[j - 1] = tl;
		}
	}
	st = XXH3_createState();
	if (!st) {
		strcpy(out, "?");
		return;
	}
	XXH3_128bits_reset(st);
	for (i = 0; i < x->n; i++) {
		XXH3_128bits_update(st, x->names[i], strlen(x->names[i]));
		XXH3_128bits_update(st, "=", 1);
		XXH3_128bits_update(st, x->values[i], x->lens[i]);
		XXH3_128bits_update(st, "\n", 1);
	}
	XXH128_canonicalFromHash(&d, XXH3_128bits_digest(st));
	XXH3_freeState(st);
	hex(out, d.digest, sizeof(d.digest));
}

/* Format one line. @data is the DATA field, already escaped. */
static int add_entry(struct treelist *t, const char *path, unsigned mode, unsigned uid,
		     unsigned gid, unsigned nlink, uint64_t size, const char *data,
		     const char *xattrs)
{
	char line[8192];
	size_t o;

	line[0] = '\0';
	escape(line, sizeof(line) - 200, path, strlen(path));
	o = strlen(line);
	snprintf(line + o, sizeof(line) - o, "\t%c\t%o\t%u\t%u\t%u\t%llu\t%s\t%s", type_char(mode),
		 mode & 07777, uid, gid, nlink, (unsigned long long)size, data, xattrs);
	return treelist_add(t, line);
}

/* ---- through libbutter --------------------------------------------------- */

struct bnames {
	char **names;
	butter_ino_t *inos;
	size_t n;
};

static int collect(void *arg, const char *name, size_t namelen, butter_ino_t ino, unsigned dtype,
		   uint64_t next_pos)
{
	struct bnames *b = arg;
	char **nn;
	butter_ino_t *ni;

	(void)dtype;
	(void)next_pos;
	nn = realloc(b->names, (b->n + 1) * sizeof(*nn));
	if (!nn)
		return -ENOMEM;
	b->names = nn;
	ni = realloc(b->inos, (b->n + 1) * sizeof(*ni));
	if (!ni)
		return -ENOMEM;
	b->inos = ni;
	b->names[b->n] = strndup(name, namelen);
	if (!b->names[b->n])
		return -ENOMEM;
	b->inos[b->n++] = ino;
	return 0;
}

static int butter_xattrs(struct butter_fs *fs, butter_ino_t ino, char out[33])
{
	struct xattrs x = { 0 };
	ssize_t n = butter_listxattr(fs, ino, NULL, 0);
	char *names = NULL, *p;
	int ret = 0;

	if (n < 0)
		return (int)n;
	if (n > 0) {
		names = malloc((size_t)n);
		if (!names)
			return -ENOMEM;
		n = butter_listxattr(fs, ino, names, (size_t)n);
		if (n < 0)
			ret = (int)n;
		for (p = names; ret == 0 && p < names + n; p += strlen(p) + 1) {
			ssize_t vl = butter_getxattr(fs, ino, p, NULL, 0);
			char *v;

			if (vl < 0) {
				ret = (int)vl;
				break;
			}
			v = malloc((size_t)vl + 1);
			if (!v) {
				ret = -ENOMEM;
				break;
			}
			vl = butter_getxattr(fs, ino, p, v, (size_t)vl);
			if (vl < 0)
				ret = (int)vl;
			else
				ret = xattrs_add(&x, p, v, (size_t)vl);
			free(v);
		}
	}
	if (ret == 0)
		xattrs_digest(&x, out);
	xattrs_free(&x);
	free(names);
	return ret;
}

static int butter_hash_file(struct butter_fs *fs, butter_ino_t ino, uint64_t size, char out[33])
{
	XXH3_state_t *st = XXH3_createState();
	XXH128_canonical_t d;
	unsigned char *buf = malloc(CHUNK);
	uint64_t off = 0;
	int ret = 0;

	if (!buf || !st) {
		free(buf);
		XXH3_freeState(st);
		return -ENOMEM;
	}
	XXH3_128bits_reset(st);
	while (off < size) {
		ssize_t n = butter_read(fs, ino, buf, CHUNK, off);

		if (n < 0) {
			ret = (int)n;
			break;
		}
		if (n == 0)
			break;
		XXH3_128bits_update(st, buf, (size_t)n);
		off += (uint64_t)n;
	}
	if (ret == 0 && off != size)
		ret = -EIO; /* short file: the size lies */
	if (ret == 0) {
		XXH128_canonicalFromHash(&d, XXH3_128bits_digest(st));
		hex(out, d.digest, sizeof(d.digest));
	}
	free(buf);
	XXH3_freeState(st);
	return ret;
}

static int walk_butter(struct butter_fs *fs, butter_ino_t dir, const char *path,
		       struct treelist *t, int depth)
{
	struct bnames b = { 0 };
	int ret;
	size_t i;

	if (depth > 64)
		return -ELOOP;
	ret = butter_readdir(fs, dir, 0, collect, &b);
	for (i = 0; i < b.n && ret == 0; i++) {
		char sub[4096], data[8192], xd[65];
		struct butter_stat st;

		snprintf(sub, sizeof(sub), "%s%s%s", path, *path ? "/" : "", b.names[i]);
		ret = butter_stat(fs, b.inos[i], &st);
		if (ret)
			break;
		ret = butter_xattrs(fs, b.inos[i], xd);
		if (ret)
			break;
		strcpy(data, "-");
		if (S_ISREG(st.mode)) {
			ret = butter_hash_file(fs, b.inos[i], st.size, data);
		} else if (S_ISLNK(st.mode)) {
			char target[4097];
			ssize_t n = butter_readlink(fs, b.inos[i], target, sizeof(target));

			if (n < 0 || (size_t)n >= sizeof(target)) {
				ret = n < 0 ? (int)n : -ENAMETOOLONG;
				break;
			}
			data[0] = '\0';
			escape(data, sizeof(data), target, (size_t)n);
		} else if (S_ISCHR(st.mode) || S_ISBLK(st.mode)) {
			snprintf(data, sizeof(data), "%u:%u", major(st.rdev), minor(st.rdev));
		}
		if (ret)
			break;
		ret = add_entry(t, sub, st.mode, st.uid, st.gid, st.nlink, st.size, data, xd);
		if (ret == 0 && S_ISDIR(st.mode))
			ret = walk_butter(fs, b.inos[i], sub, t, depth + 1);
	}
	for (i = 0; i < b.n; i++)
		free(b.names[i]);
	free(b.names);
	free(b.inos);
	return ret;
}

int treelist_butter(struct butter_fs *fs, struct treelist *out)
{
	struct butter_stat st;
	butter_ino_t root;
	char xd[65];
	int ret;

	memset(out, 0, sizeof(*out));
	ret = butter_root(fs, 5, &root);
	if (ret == 0)
		ret = butter_stat(fs, root, &st);
	if (ret == 0)
		ret = butter_xattrs(fs, root, xd);
	if (ret == 0)
		ret = add_entry(out, ".", st.mode, st.uid, st.gid, st.nlink, st.size, "-", xd);
	if (ret == 0)
		ret = walk_butter(fs, root, "", out, 0);
	treelist_sort(out);
	return ret;
}

/* ---- through POSIX ------------------------------------------------------- */

static int posix_xattrs(const char *path, char out[33])
{
	struct xattrs x = { 0 };
	ssize_t n = llistxattr(path, NULL, 0);
	char *names = NULL, *p;
	int ret = 0;

	if (n < 0)
		return -errno;
	if (n > 0) {
		names = malloc((size_t)n);
		if (!names)
			return -ENOMEM;
		n = llistxattr(path, names, (size_t)n);
		if (n < 0)
			ret = -errno;
		for (p = names; ret == 0 && p < names + n; p += strlen(p) + 1) {
			ssize_t vl = lgetxattr(path, p, NULL, 0);
			char *v;

			if (vl < 0) {
				ret = -errno;
				break;
			}
			v = malloc((size_t)vl + 1);
			if (!v) {
				ret = -ENOMEM;
				break;
			}
			vl = lgetxattr(path, p, v, (size_t)vl);
			if (vl < 0)
				ret = -errno;
			else
				ret = xattrs_add(&x, p, v, (size_t)vl);
			free(v);
		}
	}
	if (ret == 0)
		xattrs_digest(&x, out);
	xattrs_free(&x);
	free(names);
	return ret;
}

static int posix_hash_file(const char *path, char out[33])
{
	XXH3_state_t *st;
	XXH128_canonical_t d;
	unsigned char *buf;
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC), ret = 0;

	if (fd < 0)
		return -errno;
	buf = malloc(CHUNK);
	st = XXH3_createState();
	if (!buf || !st) {
		free(buf);
		XXH3_freeState(st);
		close(fd);
		return -ENOMEM;
	}
	XXH3_128bits_reset(st);
	for (;;) {
		ssize_t n = read(fd, buf, CHUNK);

		if (n < 0) {
			ret = -errno;
			break;
		}
		if (n == 0)
			break;
		XXH3_128bits_update(st, buf, (size_t)n);
	}
	close(fd);
	if (ret == 0) {
		XXH128_canonicalFromHash(&d, XXH3_128bits_digest(st));
		hex(out, d.digest, sizeof(d.digest));
	}
	free(buf);
	XXH3_freeState(st);
	return ret;
}

static int walk_posix(const char *root, const char *rel, dev_t dev, struct treelist *t,
		      int depth)
{
	char dirpath[8200];
	struct dirent **names;
	int n, i, ret = 0;

	if (depth > 64)
		return -ELOOP;
	snprintf(dirpath, sizeof(dirpath), "%s%s%s", root, *rel ? "/" : "", rel);
	n = scandir(dirpath, &names, NULL, alphasort);
	if (n < 0)
		return -errno;
	for (i = 0; i < n; i++) {
		char full[8200], sub[4096], data[8192], xd[65];
		const char *name = names[i]->d_name;
		struct stat st;

		if (ret || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
			continue;
		snprintf(sub, sizeof(sub), "%s%s%s", rel, *rel ? "/" : "", name);
		snprintf(full, sizeof(full), "%s/%s", root, sub);
		if (lstat(full, &st) < 0) {
			ret = -errno;
			continue;
		}
		ret = posix_xattrs(full, xd);
		if (ret)
			continue;
		strcpy(data, "-");
		if (S_ISREG(st.st_mode)) {
			ret = posix_hash_file(full, data);
		} else if (S_ISLNK(st.st_mode)) {
			char target[4097];
			ssize_t len = readlink(full, target, sizeof(target));

			if (len < 0 || (size_t)len >= sizeof(target)) {
				ret = len < 0 ? -errno : -ENAMETOOLONG;
				continue;
			}
			data[0] = '\0';
			escape(data, sizeof(data), target, (size_t)len);
		} else if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
			snprintf(data, sizeof(data), "%u:%u", major(st.st_rdev), minor(st.st_rdev));
		}
		if (ret == 0)
			ret = add_entry(t, sub, st.st_mode, st.st_uid, st.st_gid,
					(unsigned)st.st_nlink, (uint64_t)st.st_size, data, xd);
		/* subvolumes have their own st_dev on the kernel: descend anyway */
		(void)dev;
		if (ret == 0 && S_ISDIR(st.st_mode))
			ret = walk_posix(root, sub, dev, t, depth + 1);
	}
	for (i = 0; i < n; i++)
		free(names[i]);
	free(names);
	return ret;
}

int treelist_posix(const char *root, struct treelist *out)
{
	struct stat st;
	char xd[65];
	int ret;

	memset(out, 0, sizeof(*out));
	if (lstat(root, &st) < 0)
		return -errno;
	ret = posix_xattrs(root, xd);
	if (ret == 0)
		ret = add_entry(out, ".", st.st_mode, st.st_uid, st.st_gid, (unsigned)st.st_nlink,
				(uint64_t)st.st_size, "-", xd);
	if (ret == 0)
		ret = walk_posix(root, "", st.st_dev, out, 0);
	treelist_sort(out);
	return ret;
}

/* ---- comparing ----------------------------------------------------------- */

int treelist_diff(const struct treelist *want, const struct treelist *got, const char *what,
		  int max)
{
	size_t i = 0, j = 0;
	int shown = 0, differ = 0;

	while (i < want->n || j < got->n) {
		int c = i == want->n ? 1 : j == got->n ? -1 : strcmp(want->lines[i], got->lines[j]);

		if (c == 0) {
			i++;
			j++;
			continue;
		}
		differ = 1;
		if (shown++ < max)
			fprintf(stderr, "%s: %s %s\n", what, c < 0 ? "missing:" : "unexpected:",
				c < 0 ? want->lines[i] : got->lines[j]);
		if (c < 0)
			i++;
		else
			j++;
	}
	return differ;
}

int treelist_write(const struct treelist *t, FILE *f)
{
	for (size_t i = 0; i < t->n; i++)
		if (fprintf(f, "%s\n", t->lines[i]) < 0)
			return -EIO;
	return 0;
}
