/*
 * trace.h — reading an access trace (what `butter mount -o trace=FILE`
 * records, or a plain list of paths) into the files it names, in the order
 * they were first read.
 *
 * The format (the recorder writes it, fuse/trace.c):
 *   # butter-trace 1
 *   SUBVOLID<TAB>INO<TAB>OFFSET<TAB>LENGTH<TAB>PATH
 * decimal numbers; PATH from the top of the mounted subvolume, starting with
 * '/', with '\\' written "\\\\", newline "\\n", tab "\\t" and any other byte
 * below 0x20 or 0x7f as "\\ooo". Other lines starting with '#' are comments.
 * A file without the header line whose lines have no tab is a plain list of
 * paths, one whole file a line, taken literally.
 */
#ifndef BUTTER_CLI_TRACE_H
#define BUTTER_CLI_TRACE_H

#include <stddef.h>
#include <stdint.h>

struct trace_range {
	uint64_t off, len; /* len 0: to the end of the file */
};

struct trace_file {
	uint64_t subvol, ino;      /* 0, 0: from a plain list (resolve the path) */
	char *path;                /* unescaped */
	struct trace_range *ranges;/* sorted by offset, merged */
	size_t nranges;
};

struct trace {
	struct trace_file *files;  /* in order of first appearance */
	size_t nfiles;
	int plain;                 /* a plain list of paths */
};

/*
 * Read @path (or standard input for "-") into *out. Returns 0, or -1 after
 * printing "butter: FILE:LINE: problem" (malformed line, unreadable file,
 * no memory).
 */
int trace_load(const char *path, struct trace *out);
void trace_free(struct trace *t);

/*
 * Give the files of a plain list (those without an inode) their subvolume
 * and inode: looked up by path from the top of @fs, or (@fs NULL) inside the
 * `butter mount` whose top directory is open as @top_fd. Paths that name
 * nothing count in *missing. 0 or a negative errno.
 */
struct butter_fs;
int trace_resolve(struct trace *t, struct butter_fs *fs, int top_fd, size_t *missing);
/* The ranges of the files with an inode, in trace order, as butter_layout() takes them (*n of them). */
struct butter_layout_range *trace_to_ranges(const struct trace *t, size_t *n);

#endif
