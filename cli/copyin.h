/*
 * copyin.h — copying host files into an image: what `butter mkfs --rootdir`
 * and `butter put` share (copyin.c), and opening an image for writing.
 */
#ifndef BUTTER_CLI_COPYIN_H
#define BUTTER_CLI_COPYIN_H

#include <stdbool.h>
#include <stdint.h>

#include <butter/butter.h>

struct copyin_opts {
	bool copy_ctime; /* give files the source's ctime (mkfs --rootdir, as mkfs.btrfs); else now */
	bool verbose;    /* print each host path as it is copied */
	/* host files never copied (the image files themselves), as st_dev/st_ino pairs */
	const uint64_t (*skip)[2];
	size_t nskip;
	/* directories (paths relative to the copied tree, no leading or trailing
	 * slash) made subvolumes instead of plain directories (mkfs --subvol) */
	const char *const *subvols;
	size_t nsubvols;
	struct cli_progress *progress; /* updated with the bytes copied (NULL: none) */
};

struct copyin_stats {
	uint64_t files; /* entries created (names, hard links included) */
	uint64_t bytes; /* file data written */
};

/*
 * Copy the host file or tree @src (a symlink is copied as a symlink) into the
 * image directory @dir as the new entry @name. With @name NULL, @src must be
 * a directory: its entries go into @dir itself and its attributes (mode,
 * owner, xattrs, times) become @dir's.
 *
 * Every problem is reported as "butter: HOSTPATH: problem" on stderr and the
 * copy goes on with the next file, unless the image cannot take more changes
 * (-EROFS after a failed change, -ENOSPC): then it stops there.
 * Returns 0 when everything was copied, 1 when something was reported, or a
 * negative errno when nothing could be started (also reported).
 */
int copyin(struct butter_fs *fs, const char *src, butter_ino_t dir, const char *name,
	   const struct copyin_opts *opts, struct copyin_stats *stats);

/*
 * Open @image plus @devices read-write. On failure print
 * "butter: IMAGE: problem" and return the negative errno.
 */
int copyin_open_rw(const char *image, const char *const *devices, size_t ndevices,
		   struct butter_fs **fs);

#endif /* BUTTER_CLI_COPYIN_H */
