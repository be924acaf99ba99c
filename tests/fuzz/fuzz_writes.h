/*
 * fuzz_writes.h — open an image from memory read-write (copy-on-write: the
 * image's bytes are never changed) and run a fixed sequence of changes and
 * commits on it, for the write-path harness (fuzz_write.c) and the replay
 * of its findings (replay.c).
 */
#ifndef BUTTER_FUZZ_WRITES_H
#define BUTTER_FUZZ_WRITES_H

#include <stddef.h>

/*
 * Open @size bytes at @image with butter_open_memory_cow() and change it:
 * new files (data, overwrites, inline, holes), a directory, a symlink, a hard
 * link, xattrs, a rename; then, for the first entries of the top directory,
 * overwrites and truncation of existing files, a file in existing
 * directories, an unlink and a rename of existing names; a commit; more
 * changes to what the commit wrote; a second commit; close. Library messages
 * as fuzz_walk_image(). Returns the number of calls that failed (expected on
 * damaged images); a result the API rules out abort()s.
 */
int fuzz_write_image(const void *image, size_t size, int verbose);

#endif
