/*
 * mount.h — `butter mount`: the FUSE daemon, as the `butter` command runs it.
 *
 * The daemon lives in fuse/ and is linked into the `butter` executable; the
 * command table in cli/main.c has one row that calls butter_mount_main() and
 * shows the texts below in `butter --help` and `butter help mount`.
 */
#ifndef BUTTER_FUSE_MOUNT_H
#define BUTTER_FUSE_MOUNT_H

#include <stdbool.h>
#include <stdio.h>

/*
 * Run `butter mount` with its arguments (argv[0] is "mount"). Returns the
 * exit status: 0 after a clean unmount (or SIGTERM/SIGINT/SIGHUP, which
 * unmount), 1 on an error, 2 on a usage error. Without -f it returns in the
 * parent as soon as the mount is live, and the daemon carries on alone.
 * @record_log and @fault_spec (NULL: none) are butter_open_opts' test
 * devices, from `butter --record LOG --fault SPEC mount ...`.
 */
int butter_mount_main(int argc, char **argv, const char *record_log, const char *fault_spec);

/* The row of the command table. */
extern const char butter_mount_summary[];
extern const char butter_mount_synopsis[];
extern const char butter_mount_usage[];

/* Print "usage: butter mount SYNOPSIS" and the usage text on @out. */
void butter_mount_print_usage(FILE *out);

/*
 * helper.c: is this a mount(8) helper call (argv[0] named mount.fuse.butter,
 * or "butter SOURCE MOUNTPOINT ..." as mount.fuse3 runs it)?
 */
bool butter_mount_helper_wanted(int argc, char **argv);

/* Run the mount(8) helper; returns the exit status (helper.c says how). */
int butter_mount_helper_main(int argc, char **argv);

#endif
