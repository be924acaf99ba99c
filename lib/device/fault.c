/*
 * fault.c — a device backend that wraps another one and makes chosen
 * operations fail, as a dying disk would: reads or writes returning EIO,
 * a flush that fails, a write that reaches the disk only in part (torn), a
 * device that vanishes. Tests drive it through butter_open_opts.fault_spec.
 *
 * Spec language (whitespace is not allowed):
 *
 *   SPEC  := RULE (';' RULE)*
 *   RULE  := KIND ['=' N] (',' KEY '=' VALUE)*
 *
 *   KIND        the first N matching operations succeed (N defaults to 0), then
 *   read-eio    every matching read fails
 *   write-eio   every matching write fails (nothing of it is written)
 *   flush-eio   every flush fails
 *   torn        the next matching write (only that one) writes its first
 *               `bytes` bytes (default: half its length, rounded down to a
 *               multiple of 512) and fails
 *   vanish      every operation of any kind fails from then on (N counts all
 *               operations: reads, writes and flushes)
 *   slow-read   every matching read waits `ms` milliseconds (default 10), then
 *               succeeds: a slow disk, so that long work (a replace's copy)
 *               can be watched and cancelled while it runs
 *
 *   KEY         applies to
 *   dev=D       only the device with index D in the open order (0 = the first
 *               path given); default: every device
 *   start=B     only operations overlapping [start, start + len) (bytes;
 *   len=B       len 0 or absent: to the end of the device); not for flush-eio
 *               or vanish
 *   err=E       the error returned: EIO (default), ENOSPC, ENXIO, EROFS, or
 *               a number
 *   bytes=B     torn: how much of the write reaches the disk
 *   ms=N        slow-read: the wait of each read
 *   when=PATH   the rule sleeps (fires on nothing, counts nothing) while no
 *               file PATH exists: a test creates PATH to make a device fail
 *               at a moment of its choosing, e.g. mid-mount (PATH holds no
 *               ',' or ';'); N then counts from that moment
 *   Numbers take K, M, G suffixes (powers of 1024).
 *
 * Examples: "read-eio,dev=1,start=1M" (every read of device 1 past its first
 * MiB fails: the superblock stays readable, every chunk copy there does not);
 * "write-eio=40;flush-eio=3"; "torn=7,bytes=4096"; "vanish=100,err=ENXIO".
 *
 * Counters are per device (each device of a filesystem gets its own copy of
 * the rules that apply to it). Failing operations count too.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/device.h"

enum fault_kind { FAULT_READ, FAULT_WRITE, FAULT_FLUSH, FAULT_TORN, FAULT_VANISH, FAULT_SLOW };

struct fault_rule {
	enum fault_kind kind;
	uint64_t after;   /* operations that succeed before the fault */
	int dev;          /* device index, -1 for every device */
	uint64_t start;   /* byte range of matching operations */
	uint64_t len;     /* 0: to the end */
	int err;          /* positive errno */
	uint64_t bytes;   /* torn: bytes written; UINT64_MAX: half */
	uint64_t ms;      /* slow-read: the wait */
	uint64_t count;   /* matching operations seen so far (while awake) */
	char when[256];   /* when=PATH: awake only while PATH exists; "" always */
};

struct fault_priv {
	pthread_mutex_t lock;     /* protects the counters */
	struct blockdev *inner;
	struct fault_rule *rules;
	size_t nrules;
	uint64_t ops;             /* every operation so far */
};

static int parse_number(const char *s, size_t n, uint64_t *out)
{
	uint64_t v = 0, mult = 1;
	size_t i;

	if (n == 0)
		return -EINVAL;
	switch (s[n - 1]) {
	case 'K': case 'k': mult = 1ULL << 10; n--; break;
	case 'M': case 'm': mult = 1ULL << 20; n--; break;
	case 'G': case 'g': mult = 1ULL << 30; n--; break;
	}
	if (n == 0)
		return -EINVAL;
	for (i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9' || v > (UINT64_MAX - 9) / 10)
			return -EINVAL;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	if (v > UINT64_MAX / mult)
		return -EINVAL;
	*out = v * mult;
	return 0;
}

static int parse_errno(const char *s, size_t n, int *out)
{
	static const struct { const char *name; int err; } names[] = {
		{ "EIO", EIO }, { "ENOSPC", ENOSPC }, { "ENXIO", ENXIO }, { "EROFS", EROFS },
		{ "ENODEV", ENODEV },
	};
	uint64_t v;
	size_t i;

	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (strlen(names[i].name) == n && memcmp(names[i].name, s, n) == 0) {
			*out = names[i].err;
			return 0;
		}
	}
	if (parse_number(s, n, &v) || v == 0 || v > 4095)
		return -EINVAL;
	*out = (int)v;
	return 0;
}

static int word_is(const char *s, size_t n, const char *word)
{
	return strlen(word) == n && memcmp(s, word, n) == 0;
}

/* Parse one RULE of @n bytes at @s into @r. */
static int parse_rule(const char *s, size_t n, struct fault_rule *r)
{
	const char *end = s + n, *p, *comma, *eq;
	size_t wl;
	int ranged;

	memset(r, 0, sizeof(*r));
	r->dev = -1;
	r->err = EIO;
	r->bytes = UINT64_MAX;
	r->ms = 10;
	comma = memchr(s, ',', n);
	if (!comma)
		comma = end;
	eq = memchr(s, '=', (size_t)(comma - s));
	wl = (size_t)((eq ? eq : comma) - s);
	if (word_is(s, wl, "read-eio"))
		r->kind = FAULT_READ;
	else if (word_is(s, wl, "write-eio"))
		r->kind = FAULT_WRITE;
	else if (word_is(s, wl, "flush-eio"))
		r->kind = FAULT_FLUSH;
	else if (word_is(s, wl, "torn"))
		r->kind = FAULT_TORN;
	else if (word_is(s, wl, "vanish"))
		r->kind = FAULT_VANISH;
	else if (word_is(s, wl, "slow-read"))
		r->kind = FAULT_SLOW;
	else
		return -EINVAL;
	if (eq && parse_number(eq + 1, (size_t)(comma - eq - 1), &r->after))
		return -EINVAL;
	ranged = r->kind != FAULT_FLUSH && r->kind != FAULT_VANISH;
	for (p = comma; p < end; p = comma) {
		uint64_t v;

		p++;
		comma = memchr(p, ',', (size_t)(end - p));
		if (!comma)
			comma = end;
		eq = memchr(p, '=', (size_t)(comma - p));
		if (!eq)
			return -EINVAL;
		wl = (size_t)(eq - p);
		if (word_is(p, wl, "err")) {
			if (parse_errno(eq + 1, (size_t)(comma - eq - 1), &r->err))
				return -EINVAL;
			continue;
		}
		if (word_is(p, wl, "when")) {
			size_t plen = (size_t)(comma - eq - 1);

			if (plen == 0 || plen >= sizeof(r->when))
				return -EINVAL;
			memcpy(r->when, eq + 1, plen);
			r->when[plen] = '\0';
			continue;
		}
		if (parse_number(eq + 1, (size_t)(comma - eq - 1), &v))
			return -EINVAL;
		if (word_is(p, wl, "dev") && v < 65536)
			r->dev = (int)v;
		else if (word_is(p, wl, "start") && ranged)
			r->start = v;
		else if (word_is(p, wl, "len") && ranged)
			r->len = v;
		else if (word_is(p, wl, "bytes") && r->kind == FAULT_TORN)
			r->bytes = v;
		else if (word_is(p, wl, "ms") && r->kind == FAULT_SLOW && v <= 60000)
			r->ms = v;
		else
			return -EINVAL;
	}
	return 0;
}

/*
 * Parse @spec and keep the rules that apply to device @devidx (@devidx -1:
 * keep all, to validate a spec). Returns 0, -EINVAL on a syntax error,
 * -ENOMEM.
 */
static int parse_spec(const char *spec, int devidx, struct fault_rule **rules, size_t *nrules)
{
	const char *p = spec, *semi;
	struct fault_rule *arr = NULL, r;
	size_t n = 0;

	if (!*spec)
		return -EINVAL;
	for (;;) {
		semi = strchr(p, ';');
		if (parse_rule(p, semi ? (size_t)(semi - p) : strlen(p), &r)) {
			free(arr);
			return -EINVAL;
		}
		if (devidx < 0 || r.dev < 0 || r.dev == devidx) {
			struct fault_rule *na = realloc(arr, (n + 1) * sizeof(*na));

			if (!na) {
				free(arr);
				return -ENOMEM;
			}
			arr = na;
			arr[n++] = r;
		}
		if (!semi)
			break;
		p = semi + 1;
	}
	*rules = arr;
	*nrules = n;
	return 0;
}

int blockdev_fault_spec_valid(const char *spec)
{
	struct fault_rule *rules = NULL;
	size_t n;
	int ret = parse_spec(spec, -1, &rules, &n);

	free(rules);
	return ret;
}

static int overlaps(const struct fault_rule *r, uint64_t offset, size_t len)
{
	uint64_t end = r->len ? r->start + r->len : UINT64_MAX;

	return offset < end && offset + len > r->start;
}

/* Is @r awake (no when=, or its file exists)? */
static int awake(const struct fault_rule *r)
{
	return r->when[0] == '\0' || access(r->when, F_OK) == 0;
}

/* Count the operation; nonzero (the errno) if the device is gone. */
static int vanished(struct fault_priv *fp)
{
	uint64_t ops = fp->ops++;
	size_t i;

	for (i = 0; i < fp->nrules; i++) {
		struct fault_rule *r = &fp->rules[i];

		if (r->kind != FAULT_VANISH || !awake(r))
			continue;
		if ((r->when[0] ? r->count++ : ops) >= r->after)
			return r->err;
	}
	return 0;
}

/*
 * Count a read (@kind FAULT_READ, of @len bytes at @offset) or a flush
 * (FAULT_FLUSH, no range) against the rules of its kind; the errno of the
 * first that fires, after a vanished device, or 0.
 */
static int fires(struct fault_priv *fp, enum fault_kind kind, uint64_t offset, size_t len)
{
	int err;
	size_t i;

	pthread_mutex_lock(&fp->lock);
	err = vanished(fp);
	for (i = 0; i < fp->nrules && !err; i++) {
		struct fault_rule *r = &fp->rules[i];

		if (r->kind == kind && (kind == FAULT_FLUSH || overlaps(r, offset, len)) &&
		    awake(r) && r->count++ >= r->after)
			err = r->err;
	}
	pthread_mutex_unlock(&fp->lock);
	return err;
}

/* The wait slow-read rules put on a read of @len bytes at @offset, in milliseconds. */
static uint64_t slowness(struct fault_priv *fp, uint64_t offset, size_t len)
{
	uint64_t ms = 0;

	pthread_mutex_lock(&fp->lock);
	for (size_t i = 0; i < fp->nrules; i++) {
		struct fault_rule *r = &fp->rules[i];

		if (r->kind == FAULT_SLOW && overlaps(r, offset, len) && awake(r) &&
		    r->count++ >= r->after)
			ms += r->ms;
	}
	pthread_mutex_unlock(&fp->lock);
	return ms;
}

static int fault_read(struct blockdev *dev, void *buf, size_t len, uint64_t offset)
{
	struct fault_priv *fp = dev->priv;
	int err = fires(fp, FAULT_READ, offset, len);
	uint64_t ms;

	if (err)
		return -err;
	ms = slowness(fp, offset, len);
	if (ms)
		usleep((useconds_t)(ms * 1000));
	return blockdev_read(fp->inner, buf, len, offset);
}

static int fault_write(struct blockdev *dev, const void *buf, size_t len, uint64_t offset)
{
	struct fault_priv *fp = dev->priv;
	uint64_t torn = UINT64_MAX;
	int err;
	size_t i;

	pthread_mutex_lock(&fp->lock);
	err = vanished(fp);
	for (i = 0; i < fp->nrules && !err; i++) {
		struct fault_rule *r = &fp->rules[i];

		if (!overlaps(r, offset, len) || !awake(r))
			continue;
		if (r->kind == FAULT_WRITE && r->count++ >= r->after) {
			err = r->err;
		} else if (r->kind == FAULT_TORN && r->count++ == r->after) {
			err = r->err;
			torn = r->bytes == UINT64_MAX ? len / 2 / 512 * 512 : r->bytes;
			if (torn > len)
				torn = len;
		}
	}
	pthread_mutex_unlock(&fp->lock);
	if (!err)
		return blockdev_write(fp->inner, buf, len, offset);
	if (torn != UINT64_MAX && torn) {
		int ret = blockdev_write(fp->inner, buf, (size_t)torn, offset);

		if (ret)
			return ret;
	}
	return -err;
}

static int fault_flush(struct blockdev *dev)
{
	struct fault_priv *fp = dev->priv;
	int err = fires(fp, FAULT_FLUSH, 0, 0);

	if (err)
		return -err;
	return blockdev_flush(fp->inner);
}

static void fault_close(struct blockdev *dev)
{
	struct fault_priv *fp = dev->priv;

	blockdev_close(fp->inner);
	pthread_mutex_destroy(&fp->lock);
	free(fp->rules);
	free(fp);
	free(dev->name);
	free(dev);
}

static void fault_end_service(struct blockdev *dev)
{
	struct fault_priv *fp = dev->priv;

	blockdev_end_service(fp->inner);
}

static int fault_gone(struct blockdev *dev)
{
	struct fault_priv *fp = dev->priv;

	return blockdev_gone(fp->inner);
}

static const struct blockdev_ops fault_ops = {
	.read = fault_read,
	.write = fault_write,
	.flush = fault_flush,
	.close = fault_close,
	.end_service = fault_end_service,
	.gone = fault_gone,
};

int blockdev_open_fault(struct blockdev *inner, const char *spec, int devidx,
			struct blockdev **out)
{
	struct blockdev *dev;
	struct fault_priv *fp;
	int ret;

	dev = calloc(1, sizeof(*dev));
	fp = calloc(1, sizeof(*fp));
	if (!dev || !fp || !(dev->name = strdup(inner->name))) {
		free(dev);
		free(fp);
		return -ENOMEM;
	}
	ret = parse_spec(spec, devidx, &fp->rules, &fp->nrules);
	if (ret) {
		free(dev->name);
		free(dev);
		free(fp);
		return ret;
	}
	pthread_mutex_init(&fp->lock, NULL);
	fp->inner = inner;
	dev->ops = &fault_ops;
	dev->size = inner->size;
	dev->readonly = inner->readonly;
	dev->priv = fp;
	*out = dev;
	return 0;
}
