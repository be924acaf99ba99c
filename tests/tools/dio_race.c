/*
 * dio_race.c — asynchronous O_DIRECT writes racing buffered reads of the same
 * file (plain Linux, runs on any filesystem; tests/integration/
 * test_fuse_page_cache.py runs it on a butter mount and on the kernel's btrfs).
 *
 *   butter-dio-race FILE [ROUNDS]
 *
 * FILE is filled with one byte pattern through the page cache and read back so
 * that its pages are cached. Then, ROUNDS times over the whole file, each
 * 64 KiB piece is written with the other pattern by io_submit on an O_DIRECT
 * descriptor while a second, buffered descriptor reads the piece (the read may
 * see old or new bytes: it races the write); once io_getevents reports the
 * write complete, a buffered read of the piece must return the new bytes.
 * Exit status: 0 when every read after a completion saw what was written,
 * 1 when one saw stale bytes (the count is printed), 2 on an error.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FILE_BYTES (1u << 20)
#define PIECE_BYTES (64u << 10)

static int fail(const char *what)
{
	fprintf(stderr, "dio_race: %s: %s\n", what, strerror(errno));
	return 2;
}

/* Write @len bytes of @buf at @off through the aio context and wait for it. */
static int aio_write_wait(aio_context_t ctx, int fd, const char *buf, size_t len, off_t off,
			  int buffered_fd, char *racing_buf)
{
	struct iocb cb, *cbs[1] = { &cb };
	struct io_event ev;

	memset(&cb, 0, sizeof(cb));
	cb.aio_lio_opcode = IOCB_CMD_PWRITE;
	cb.aio_fildes = (uint32_t)fd;
	cb.aio_buf = (uint64_t)(uintptr_t)buf;
	cb.aio_nbytes = len;
	cb.aio_offset = off;
	if (syscall(SYS_io_submit, ctx, 1, cbs) != 1)
		return fail("io_submit");
	/* the racing read: either pattern is fine here, it only fills the cache */
	if (pread(buffered_fd, racing_buf, len, off) < 0)
		return fail("racing pread");
	if (syscall(SYS_io_getevents, ctx, 1, 1, &ev, NULL) != 1)
		return fail("io_getevents");
	if (ev.res != (int64_t)len) {
		fprintf(stderr, "dio_race: write at %lld returned %lld\n", (long long)off,
			(long long)ev.res);
		return 2;
	}
	return 0;
}

int main(int argc, char **argv)
{
	int rounds = argc > 2 ? atoi(argv[2]) : 8;
	aio_context_t ctx = 0;
	char *pattern, *seen;
	int fd, bfd, dfd, stale = 0, ret;

	if (argc < 2 || rounds <= 0) {
		fprintf(stderr, "usage: butter-dio-race FILE [ROUNDS]\n");
		return 2;
	}
	pattern = aligned_alloc(4096, FILE_BYTES);
	seen = malloc(FILE_BYTES);
	if (!pattern || !seen)
		return fail("malloc");
	memset(pattern, 0x55, FILE_BYTES);
	fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || pwrite(fd, pattern, FILE_BYTES, 0) != FILE_BYTES || fsync(fd) < 0)
		return fail("filling the file");
	bfd = open(argv[1], O_RDONLY);
	dfd = open(argv[1], O_RDWR | O_DIRECT);
	if (bfd < 0 || dfd < 0)
		return fail("open");
	if (pread(bfd, seen, FILE_BYTES, 0) != FILE_BYTES)
		return fail("caching read");
	if (syscall(SYS_io_setup, 8, &ctx) < 0)
		return fail("io_setup");
	for (int round = 0; round < rounds; round++) {
		memset(pattern, round & 1 ? 0x55 : 0xaa, FILE_BYTES);
		for (off_t off = 0; off < FILE_BYTES; off += PIECE_BYTES) {
			ret = aio_write_wait(ctx, dfd, pattern + off, PIECE_BYTES, off, bfd,
					     seen + off);
			if (ret)
				return ret;
			if (pread(bfd, seen + off, PIECE_BYTES, off) != PIECE_BYTES)
				return fail("pread after completion");
			if (memcmp(seen + off, pattern + off, PIECE_BYTES)) {
				fprintf(stderr, "dio_race: round %d: stale bytes at %lld (0x%02x, "
					"wrote 0x%02x)\n", round, (long long)off,
					(unsigned char)seen[off], (unsigned char)pattern[off]);
				stale++;
			}
		}
	}
	printf("dio_race: %d rounds, %d stale pieces\n", rounds, stale);
	syscall(SYS_io_destroy, ctx);
	close(dfd);
	close(bfd);
	close(fd);
	free(pattern);
	free(seen);
	return stale ? 1 : 0;
}
