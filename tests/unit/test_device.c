/*
 * test_device.c — unit tests for the test backends of lib/device/: the
 * copy-on-write memory device, the fault injector's spec language and
 * behaviour, the recorder's log (decoded here from its documented layout,
 * not with the tool that replays it; also a device joining it later,
 * blockdev_record_new), and the claim protocol of the file
 * backend (lib/device/claim.c): OFD locks conflict between two open file
 * descriptions of one process as between processes, so one process can
 * play both sides.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/device.h"
#include "check.h"

static uint64_t le(const unsigned char *p, int n)
{
	uint64_t v = 0;

	while (n--)
		v = v << 8 | p[n];
	return v;
}

static void test_cow(void)
{
	unsigned char base[10000], buf[10000];
	struct blockdev *dev;
	int i;

	for (i = 0; i < 10000; i++)
		base[i] = (unsigned char)(i * 7);
	CHECK(blockdev_open_memory_cow(base, sizeof(base), &dev) == 0);
	memset(buf, 0xee, 5000);
	CHECK(blockdev_write(dev, buf, 5000, 3000) == 0);
	CHECK(blockdev_read(dev, buf, sizeof(buf), 0) == 0);
	for (i = 0; i < 10000; i++) {
		unsigned char want = i >= 3000 && i < 8000 ? 0xee : (unsigned char)(i * 7);

		if (buf[i] != want) {
			CHECK(buf[i] == want);
			break;
		}
	}
	for (i = 0; i < 10000; i++)
		if (base[i] != (unsigned char)(i * 7))
			break;
	CHECK(i == 10000); /* the base is never written */
	CHECK(blockdev_read(dev, buf, 1, 10000) == -EIO);
	CHECK(blockdev_write(dev, buf, 2, 9999) == -EIO);
	blockdev_close(dev);
}

static void test_fault_spec(void)
{
	CHECK(blockdev_fault_spec_valid("read-eio") == 0);
	CHECK(blockdev_fault_spec_valid("read-eio=3,dev=1,start=1M,len=4k") == 0);
	CHECK(blockdev_fault_spec_valid("write-eio=40;flush-eio=2;vanish=100,err=ENXIO") == 0);
	CHECK(blockdev_fault_spec_valid("torn=7,bytes=4096,err=ENOSPC") == 0);
	CHECK(blockdev_fault_spec_valid("") == -EINVAL);
	CHECK(blockdev_fault_spec_valid("read") == -EINVAL);
	CHECK(blockdev_fault_spec_valid("read-eio=x") == -EINVAL);
	CHECK(blockdev_fault_spec_valid("read-eio,bytes=3") == -EINVAL);
	CHECK(blockdev_fault_spec_valid("flush-eio,start=3") == -EINVAL);
	CHECK(blockdev_fault_spec_valid("write-eio;") == -EINVAL);
	CHECK(blockdev_fault_spec_valid("write-eio,err=EBOGUS") == -EINVAL);
	CHECK(blockdev_fault_spec_valid("slow-read,ms=20,dev=0,when=/tmp/x") == 0);
	CHECK(blockdev_fault_spec_valid("slow-read,ms=60001") == -EINVAL);
	CHECK(blockdev_fault_spec_valid("read-eio,ms=3") == -EINVAL);
}

static void test_fault_behaviour(void)
{
	unsigned char buf[8192], back[8192];
	struct blockdev *mem, *dev;

	memset(buf, 0x11, sizeof(buf));
	/* the second write and every later one fail; reads in [4096, 8192) fail */
	CHECK(blockdev_open_memory(NULL, 65536, 1, &mem) == 0);
	CHECK(blockdev_open_fault(mem, "write-eio=1;read-eio,start=4k,len=4k;flush-eio=1", 0,
				  &dev) == 0);
	CHECK(blockdev_write(dev, buf, 512, 0) == 0);
	CHECK(blockdev_write(dev, buf, 512, 0) == -EIO);
	CHECK(blockdev_read(dev, back, 4096, 0) == 0);
	CHECK(blockdev_read(dev, back, 4097, 0) == -EIO);
	CHECK(blockdev_read(dev, back, 4096, 8192) == 0);
	CHECK(blockdev_flush(dev) == 0);
	CHECK(blockdev_flush(dev) == -EIO);
	blockdev_close(dev);

	/* rules for another device do not apply */
	CHECK(blockdev_open_memory(NULL, 65536, 1, &mem) == 0);
	CHECK(blockdev_open_fault(mem, "read-eio,dev=1", 0, &dev) == 0);
	CHECK(blockdev_read(dev, back, 4096, 0) == 0);
	blockdev_close(dev);

	/* a torn write leaves its first bytes and fails; the next write works */
	CHECK(blockdev_open_memory(NULL, 65536, 1, &mem) == 0);
	CHECK(blockdev_open_fault(mem, "torn=1,bytes=1024,err=ENOSPC", 0, &dev) == 0);
	CHECK(blockdev_write(dev, buf, 4096, 0) == 0);
	memset(buf, 0x22, sizeof(buf));
	CHECK(blockdev_write(dev, buf, 4096, 8192) == -ENOSPC);
	CHECK(blockdev_read(dev, back, 4096, 8192) == 0);
	CHECK(back[0] == 0x22 && back[1023] == 0x22 && back[1024] == 0 && back[4095] == 0);
	CHECK(blockdev_write(dev, buf, 4096, 16384) == 0);
	blockdev_close(dev);

	/* vanish after 3 operations of any kind */
	CHECK(blockdev_open_memory(NULL, 65536, 1, &mem) == 0);
	CHECK(blockdev_open_fault(mem, "vanish=3,err=ENXIO", 0, &dev) == 0);
	CHECK(blockdev_read(dev, back, 512, 0) == 0);
	CHECK(blockdev_write(dev, buf, 512, 0) == 0);
	CHECK(blockdev_flush(dev) == 0);
	CHECK(blockdev_read(dev, back, 512, 0) == -ENXIO);
	CHECK(blockdev_flush(dev) == -ENXIO);
	blockdev_close(dev);
}

static void test_recorder(void)
{
	char path[] = "/tmp/butter-test-recorder-XXXXXX";
	unsigned char buf[3000], log[16384];
	struct blockdev *mem, *dev, *stack[1];
	int fd = mkstemp(path);
	ssize_t n;
	size_t pos;

	CHECK(fd >= 0);
	if (fd < 0)
		return;
	close(fd);
	memset(buf, 0x5a, sizeof(buf));
	CHECK(blockdev_open_memory(NULL, 1 << 20, 1, &mem) == 0);
	stack[0] = mem;
	/* the recorder below the injector: a failing write is never logged */
	CHECK(blockdev_stack_test(stack, 1, path, "write-eio=1") == 0);
	dev = stack[0];
	CHECK(blockdev_write(dev, buf, sizeof(buf), 4096) == 0);
	CHECK(blockdev_flush(dev) == 0);
	CHECK(blockdev_write(dev, buf, 10, 0) == -EIO);
	blockdev_close(dev);

	fd = open(path, O_RDONLY);
	n = read(fd, log, sizeof(log));
	close(fd);
	unlink(path);
	/* header 16 + DEVICE (24 + "memory") + WRITE (24 + 3000) + FLUSH 24 */
	CHECK_EQ_U64(n, 16 + 24 + 6 + 24 + 3000 + 24);
	if (n != 16 + 24 + 6 + 24 + 3000 + 24)
		return;
	CHECK(memcmp(log, "BTRREC01", 8) == 0 && le(log + 8, 4) == 1);
	pos = 16;
	CHECK(log[pos] == 1 && le(log + pos + 4, 4) == 0 && le(log + pos + 8, 8) == 1 << 20);
	CHECK(le(log + pos + 16, 8) == 6 && memcmp(log + pos + 24, "memory", 6) == 0);
	pos += 30;
	CHECK(log[pos] == 2 && le(log + pos + 8, 8) == 4096 && le(log + pos + 16, 8) == 3000);
	CHECK(log[pos + 24] == 0x5a && log[pos + 24 + 2999] == 0x5a);
	pos += 24 + 3000;
	CHECK(log[pos] == 3 && le(log + pos + 16, 8) == 0);
}

/* A device opened later joins the record log of a recorded one, in place, as the next index. */
static void test_recorder_new_device(void)
{
	char path[] = "/tmp/butter-test-recorder-XXXXXX";
	unsigned char buf[100], log[4096];
	struct blockdev *stack[1], *late, *plain, *handle;
	int fd = mkstemp(path);
	ssize_t n;
	size_t pos;

	CHECK(fd >= 0);
	if (fd < 0)
		return;
	close(fd);
	memset(buf, 0x33, sizeof(buf));
	CHECK(blockdev_open_memory(NULL, 1 << 20, 1, &stack[0]) == 0);
	CHECK(blockdev_stack_test(stack, 1, path, NULL) == 0);
	CHECK(blockdev_open_memory(NULL, 1 << 16, 1, &late) == 0);
	CHECK(blockdev_open_memory(NULL, 1 << 16, 1, &plain) == 0);
	/* not recorded: nothing happens */
	CHECK(blockdev_record_new(plain, late) == 0 && late->record == NULL);
	handle = late;
	CHECK(blockdev_record_new(stack[0], late) == 0);
	CHECK(late == handle && late->record == stack[0]->record && late->size == 1 << 16);
	CHECK(blockdev_write(late, buf, sizeof(buf), 512) == 0);
	CHECK(blockdev_read(late, log, sizeof(buf), 512) == 0 && log[99] == 0x33);
	blockdev_close(late);
	blockdev_close(plain);
	blockdev_close(stack[0]);

	fd = open(path, O_RDONLY);
	n = read(fd, log, sizeof(log));
	close(fd);
	unlink(path);
	/* header 16 + DEVICE 0 (24 + "memory") + DEVICE 1 (24 + "memory") + WRITE (24 + 100) */
	CHECK_EQ_U64(n, 16 + 30 + 30 + 24 + 100);
	if (n != 16 + 30 + 30 + 24 + 100)
		return;
	pos = 16 + 30;
	CHECK(log[pos] == 1 && le(log + pos + 4, 4) == 1 && le(log + pos + 8, 8) == 1 << 16);
	pos += 30;
	CHECK(log[pos] == 2 && le(log + pos + 4, 4) == 1 && le(log + pos + 8, 8) == 512);
	CHECK(le(log + pos + 16, 8) == 100 && log[pos + 24] == 0x33);
}

struct later_close {
	struct blockdev *dev;
	int msec;
};

static void *close_later(void *arg)
{
	struct later_close *lc = arg;

	nanosleep(&(struct timespec){ 0, lc->msec * 1000000L }, NULL);
	blockdev_close(lc->dev);
	return NULL;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void test_claim(void)
{
	struct blog quiet = { NULL, NULL, -1 };
	char path[] = "/tmp/butter-test-claim-XXXXXX";
	struct blockdev *rw, *rw2, *ro, *ro2;
	struct later_close lc;
	pthread_t th;
	double t0;
	int fd = mkstemp(path);

	CHECK(fd >= 0);
	if (fd < 0)
		return;
	CHECK(ftruncate(fd, 1 << 20) == 0);
	close(fd);

	/* one writer: a second read-write open is refused at once */
	CHECK(blockdev_open_file(path, 0, &quiet, &rw) == 0);
	t0 = now();
	CHECK(blockdev_open_file(path, 0, &quiet, &rw2) == -EBUSY);
	CHECK(now() - t0 < 1.0);
	/* readers go on beside it, unless they ask for no writer */
	CHECK(blockdev_open_file(path, BLOCKDEV_OPEN_RDONLY, &quiet, &ro) == 0);
	blockdev_close(ro);
	CHECK(blockdev_open_file(path, BLOCKDEV_OPEN_RDONLY | BLOCKDEV_OPEN_NO_WRITER, &quiet,
				 &ro) == -EBUSY);
	/* once the writer has begun closing, a new writer waits for its close */
	blockdev_end_service(rw);
	lc.dev = rw;
	lc.msec = 300;
	CHECK(pthread_create(&th, NULL, close_later, &lc) == 0);
	t0 = now();
	CHECK(blockdev_open_file(path, 0, &quiet, &rw2) == 0);
	CHECK(now() - t0 >= 0.25);
	pthread_join(th, NULL);
	blockdev_close(rw2);

	/* readers share; a writer beside a reader is refused at once */
	CHECK(blockdev_open_file(path, BLOCKDEV_OPEN_RDONLY, &quiet, &ro) == 0);
	CHECK(blockdev_open_file(path, BLOCKDEV_OPEN_RDONLY | BLOCKDEV_OPEN_NO_WRITER, &quiet,
				 &ro2) == 0);
	t0 = now();
	CHECK(blockdev_open_file(path, 0, &quiet, &rw) == -EBUSY);
	CHECK(now() - t0 < 1.0);
	blockdev_close(ro2);
	blockdev_close(ro);
	CHECK(blockdev_open_file(path, 0, &quiet, &rw) == 0);
	blockdev_close(rw);
	unlink(path);
}

int main(void)
{
	RUN(test_cow);
	RUN(test_fault_spec);
	RUN(test_fault_behaviour);
	RUN(test_recorder);
	RUN(test_recorder_new_device);
	RUN(test_claim);
	return check_summary();
}
