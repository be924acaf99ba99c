/*
 * testing.h — the hooks of libbutter for its own tests, fuzzers and the
 * crash and fault harnesses. Not part of the installed API (meson installs
 * butter.h and control.h only); what is here may change with any commit.
 *
 * Everything here keeps the contract of butter.h: errors are negative errno
 * values, handles are the same handles, the same lock serialises calls.
 */
#ifndef BUTTER_TESTING_H
#define BUTTER_TESTING_H

#include "butter/butter.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Test devices stacked over the real ones (NULL: none).
 *   record_log  create this file and log every write and flush that reaches
 *               the devices (format in lib/device/recorder.c; replayed by
 *               tests/tools/crashreplay); the caller owns the string.
 *   fault_spec  make chosen device operations fail, e.g.
 *               "read-eio,dev=1,start=1M" or "write-eio=40" (language in
 *               lib/device/fault.c; -EINVAL if it does not parse).
 * A handle opened with test devices is never reopened in place (a remount
 * read-write of a read-only one fails with -EROFS).
 */
struct butter_test_devices {
	const char *record_log;
	const char *fault_spec;
};

/* butter_open() with test devices (@test NULL or both NULL: butter_open() itself). */
int butter_open_testing(const char *path, const struct butter_open_opts *opts,
			const struct butter_test_devices *test, struct butter_fs **out);

/*
 * Open the single-device filesystem image held in @size bytes of memory at
 * @image (for fuzzing and tests: no file is touched). The handle borrows the
 * bytes and never writes them (it is read-only whatever opts->flags say); they
 * must stay valid and unchanged until butter_close(). opts->devices must be
 * empty (-EINVAL otherwise). Errors as butter_open().
 */
int butter_open_memory(const void *image, size_t size, const struct butter_open_opts *opts,
		       struct butter_fs **out);

/*
 * As butter_open_memory(), but writable unless opts->flags say
 * BUTTER_OPEN_RDONLY: writes go to private copies of the pages they touch,
 * so @image is still never written, and the changes vanish at
 * butter_close() (for fuzzing the write path and for tests).
 */
int butter_open_memory_cow(const void *image, size_t size, const struct butter_open_opts *opts,
			   struct butter_fs **out);

/*
 * When a change finds no room while its transaction holds freed space (not
 * reusable before a commit), the library commits, then tries again, as the
 * kernel does. That commit holds the filesystem as it was before the change.
 * @fn, if set, is called just before such a commit, with the write state's
 * mutex dropped and the handle's lock still held exclusive by the change: it
 * may make read calls on the handle (a test that records what each commit
 * holds lists the tree there), no change.
 */
void butter_set_space_commit_hook(struct butter_fs *fs, void (*fn)(void *arg), void *arg);

#ifdef __cplusplus
}
#endif

#endif
