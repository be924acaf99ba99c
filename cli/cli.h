/*
 * cli.h — what the files of the `butter` command share: the command table
 * entry, option parsing common to every command (--device, --help), opening
 * an image, and small output helpers.
 *
 * The command is a thin front end over <butter/butter.h>: it parses
 * arguments, prints, and reports progress; every filesystem decision is the
 * library's. Exit status of every command:
 *   0  success
 *   1  an error (named on stderr as "butter: WHAT: problem")
 *   2  usage error (unknown command or option, missing argument); usage on stderr
 */
#ifndef BUTTER_CLI_H
#define BUTTER_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <butter/butter.h>
#include <butter/testing.h>

#define CLI_EXIT_OK 0
#define CLI_EXIT_ERROR 1
#define CLI_EXIT_USAGE 2

struct cli_command;

/* A command: argv[0] is the command's own name; returns the exit status. */
typedef int (*cli_main_fn)(const struct cli_command *cmd, int argc, char **argv);

struct cli_command {
	const char *name;    /* as typed: "info", "subvolume list" */
	cli_main_fn main;
	const char *summary; /* one line for `butter --help` */
	const char *usage;   /* the full --help text after the "usage:" line(s) */
	const char *synopsis;/* "[--device DEV]... IMAGE" */
};

/* Long-only option codes shared by every command (outside the char range). */
enum {
	CLI_OPT_DEVICE = 0x100,
	CLI_OPT_HELP = 'h',
	CLI_OPT_FIRST_FREE = 0x200, /* commands number their own long-only options from here */
};

/* Put these two entries in every command's struct option table. */
#define CLI_COMMON_LONGOPTS                                          \
	{ "device", required_argument, NULL, CLI_OPT_DEVICE },      \
	{ "help", no_argument, NULL, CLI_OPT_HELP }

/* Parsing state common to every command that opens an image. */
struct cli_args {
	const struct cli_command *cmd;
	const char **devices; /* --device values, in order */
	size_t ndevices;
	unsigned open_flags;  /* BUTTER_OPEN_* that cli_open() adds to its own */
};

/*
 * Return the next command-specific option of argv (as getopt_long does), or -1
 * when options end (optind then indexes the first operand). --device is
 * collected into @args, --help prints usage on stdout and exits 0, an unknown
 * option or a missing argument prints usage on stderr and exits 2.
 * @shortopts must start with ":" and include "h"; @longopts must include
 * CLI_COMMON_LONGOPTS.
 */
int cli_getopt(struct cli_args *args, int argc, char **argv, const char *shortopts,
	       const struct option *longopts);

/* Print "butter CMD: MESSAGE" and the usage on stderr; return CLI_EXIT_USAGE. */
int cli_usage_error(const struct cli_command *cmd, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Print the usage of @cmd on @out. */
void cli_print_usage(const struct cli_command *cmd, FILE *out);

/*
 * Open @image and the --device members read-only, degraded allowed, plus
 * args->open_flags. On failure print "butter: WHAT: problem" and return the
 * negative errno.
 */
int cli_open(const struct cli_args *args, const char *image, struct butter_fs **fs);

/*
 * Check that @image and @devices[0..n) exist (NBD URIs are not looked
 * for), printing "butter: NAME: problem" for the first that does not:
 * 0 or its negative errno.
 */
int cli_devices_exist(const char *image, const char *const *devices, size_t ndevices);

/*
 * When @image or @devices name an NBD export and @err (positive) is what a
 * device's open returns (a connection refused, a read-only export, ...):
 * the words for "IMAGE: ..." that blame no one in particular, the backend
 * having named the URI above. NULL otherwise.
 */
const char *cli_nbd_open_error(const char *image, const char *const *devices, size_t ndevices,
			       int err);

/*
 * Whether @path names the command's mount form: a directory (inside a live
 * mount) given without --device, rather than an image file or device.
 */
bool cli_is_mount_path(const char *path, const struct cli_args *args);

/* The size of the file or block device at @path; 0 if it cannot be told. */
uint64_t cli_device_size(const char *path);

/* "Data", "Metadata", "System", "Data+Metadata", "GlobalReserve" for chunk type bits (cmd_info.c). */
const char *cli_space_type(uint64_t flags);
/* A profile as btrfs-progs spells it ("single", "DUP", "RAID1C3") into @buf (cmd_info.c). */
const char *cli_profile_text(char buf[16], uint64_t flags);

/* Explain the butter_open() errors (positive @err) whose strerror() text would mislead. */
const char *cli_open_error(int err);

/*
 * Test devices named by the global options before COMMAND (`butter --record
 * LOG --fault SPEC COMMAND ...`); NULL when not given. Every open of an image
 * (cli_open, copyin_open_rw) passes them to butter_open_testing().
 */
extern struct butter_test_devices cli_test_devices;

/* A progress line on a terminal (progress.c): only on a tty, never with -q. */
struct cli_progress {
	const char *what;
	const char *unit;     /* NULL: done and total are bytes; else a count of these ("block groups") */
	uint64_t total, done; /* total may grow as the work learns it (set it before an update) */
	struct timespec start, last;
	bool on, drawn;
};
void cli_progress_begin(struct cli_progress *p, const char *what, uint64_t total, bool quiet);
void cli_progress_update(struct cli_progress *p, uint64_t done);
void cli_progress_end(struct cli_progress *p);

/*
 * --format json (a global option, as `btrfs --format json`): the commands
 * that have a JSON form print it, with btrfs-progs' layout where progs has
 * one (filesystem df, device stats); the others refuse it, as progs does.
 */
extern bool cli_json;
/* JSON output (cli_json): the document's start and end, list items, "key": "value" members. */
void cli_json_begin(const char *list_name);
void cli_json_item_begin(bool first);
void cli_json_member(const char *key, const char *value, bool last);
void cli_json_member_u64(const char *key, uint64_t value, bool last);
void cli_json_item_end(void);
void cli_json_end(bool any);
/*
 * Nested JSON, for butter's own layouts (README): cli_jw_open() an object
 * ('{') or a list ('[') under @key (NULL in a list, and for the document,
 * which starts with progs' "__header"), members, cli_jw_close(). Numbers
 * are written as strings, as progs writes them.
 */
void cli_jw_open(const char *key, char kind);
void cli_jw_close(void);
void cli_jw_str(const char *key, const char *value);
void cli_jw_u64(const char *key, uint64_t value);
/* For a command without a JSON form: the error and exit status progs gives. */
int cli_json_unsupported(void);

/* Print "butter: " + the formatted message + "\n" on stderr. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Flush stdout; on a write error say so and return CLI_EXIT_ERROR, else @status. */
int cli_finish_stdout(int status);

/* Format @bytes as "1.50GiB" (or the plain number if @raw) into @buf. */
const char *cli_size(char *buf, size_t bufsize, uint64_t bytes, bool raw);

/*
 * btrfs-progs' size units, for the commands that take its options: -b/--raw
 * (bytes), -h/--human-readable (the default: base 1024, KiB...), -H (base
 * 1000, kB...), -k/-m/-g/-t and --kbytes... (one fixed unit), --iec and --si
 * (the base of the rest).
 */
struct cli_units {
	int fixed;   /* -1 bytes, 0 human, 1..4 Ki/Mi/Gi/Ti (or k/M/G/T with si) */
	bool si;     /* base 1000 */
};
#define CLI_UNITS_SHORTOPTS "bHkmgt"
enum { CLI_OPT_RAW = 0x180, CLI_OPT_HUMAN, CLI_OPT_IEC, CLI_OPT_SI, CLI_OPT_KBYTES,
       CLI_OPT_MBYTES, CLI_OPT_GBYTES, CLI_OPT_TBYTES };
#define CLI_UNITS_LONGOPTS                                             \
	{ "raw", no_argument, NULL, CLI_OPT_RAW },                       \
	{ "human-readable", no_argument, NULL, CLI_OPT_HUMAN },          \
	{ "iec", no_argument, NULL, CLI_OPT_IEC },                       \
	{ "si", no_argument, NULL, CLI_OPT_SI },                         \
	{ "kbytes", no_argument, NULL, CLI_OPT_KBYTES },                 \
	{ "mbytes", no_argument, NULL, CLI_OPT_MBYTES },                 \
	{ "gbytes", no_argument, NULL, CLI_OPT_GBYTES },                 \
	{ "tbytes", no_argument, NULL, CLI_OPT_TBYTES }
/* Take option @c into @u if it is a units option: 1, else 0. */
int cli_units_option(struct cli_units *u, int c);
/* progs' "-h" is human-readable, not help, for commands with units: rewrite it to the long form. */
void cli_units_fix_h(int argc, char **argv);
const char *cli_size_units(char *buf, size_t bufsize, uint64_t bytes, const struct cli_units *u);

/*
 * Parse a size: digits with an optional K, M, G, T, P or E suffix (powers of
 * 1024, either case, "KiB" and "KB" spellings too). 0 or -EINVAL/-ERANGE.
 */
int cli_parse_size(const char *s, uint64_t *out);

/* The library's log level for opens made by this command (0: warnings; -v: progress). */
extern int cli_log_level;
/* Extra butter_open flags for copyin_open_rw() (BUTTER_OPEN_DEGRADED). */
extern unsigned cli_open_flags;

/* Format a 16-byte UUID as the usual 36-character string into @buf (37 bytes). */
const char *cli_uuid(char buf[37], const uint8_t uuid[16]);

/*
 * Resolve @path inside the image, following a symlink in the last component
 * as well (up to 40 times, then -ELOOP) when @follow is set.
 */
int cli_resolve(struct butter_fs *fs, const char *path, bool follow, butter_ino_t *out);

/*
 * Read the target of symlink @ino into a malloc'd NUL-terminated string
 * (*out); @size_hint is the inode size. Returns 0 or a negative errno.
 */
int cli_readlink(struct butter_fs *fs, butter_ino_t ino, uint64_t size_hint, char **out);

/*
 * Split subvolume path @path (trailing slashes dropped) into a malloc'd copy (*copy, which
 * the caller frees, also on failure), its last name (*name, in the copy) and the '/' before
 * that name (*slash, in the copy; NULL when there is none). Returns 0, or prints
 * "not a subvolume name" (empty, ".", "..") and returns -1.
 */
int cli_split_subvol_path(const char *path, char **copy, const char **name, char **slash);

/* Make room for @need bytes in *@buf (capacity *@cap); 0 or -ENOMEM. */
int cli_grow(char **buf, size_t *cap, size_t need);

/*
 * openat(2) @name in @dirfd read-only, close-on-exec, never following a final
 * symlink, with @flags or-ed in; with @noatime asking for O_NOATIME too where
 * the caller may (it needs ownership or CAP_FOWNER). An fd, or -1 and errno.
 */
int cli_openat(int dirfd, const char *name, int flags, bool noatime);

/*
 * Open the host directory @rel (@len bytes, relative to @top_fd, may be empty)
 * one component at a time with cli_openat(), so no symlink is followed and no
 * path is too long for one system call. An fd or -errno.
 */
int cli_open_dir_path(int top_fd, const char *rel, size_t len, bool noatime);

/* The commands. */
int cmd_info(const struct cli_command *cmd, int argc, char **argv);
int cmd_ls(const struct cli_command *cmd, int argc, char **argv);
int cmd_cat(const struct cli_command *cmd, int argc, char **argv);
int cmd_extract(const struct cli_command *cmd, int argc, char **argv);
int cmd_subvolume_list(const struct cli_command *cmd, int argc, char **argv);
int cmd_property(const struct cli_command *cmd, int argc, char **argv);
int cmd_subvolume_show(const struct cli_command *cmd, int argc, char **argv);
int cmd_subvolume_get_default(const struct cli_command *cmd, int argc, char **argv);
int cmd_subvolume_set_default(const struct cli_command *cmd, int argc, char **argv);
int cmd_subvolume_create(const struct cli_command *cmd, int argc, char **argv);
int cmd_subvolume_snapshot(const struct cli_command *cmd, int argc, char **argv);
int cmd_rm(const struct cli_command *cmd, int argc, char **argv);
int cmd_filesystem(const struct cli_command *cmd, int argc, char **argv);
int cmd_defrag(const struct cli_command *cmd, int argc, char **argv);
int cmd_layout(const struct cli_command *cmd, int argc, char **argv);
int cmd_heatmap(const struct cli_command *cmd, int argc, char **argv);
int cmd_du(const struct cli_command *cmd, int argc, char **argv);
/* `filesystem du` without --compression (du_files.c): @paths are IMAGE PATH... or mounted paths. */
int du_files(const struct cli_args *args, char **paths, int npaths, bool summarize,
	     const struct cli_units *units);
int cmd_usage(const struct cli_command *cmd, int argc, char **argv);
int cmd_subvolume_find_new(const struct cli_command *cmd, int argc, char **argv);
int cmd_scrub(const struct cli_command *cmd, int argc, char **argv);
int cmd_send(const struct cli_command *cmd, int argc, char **argv);
int cmd_receive(const struct cli_command *cmd, int argc, char **argv);
int cmd_device_add(const struct cli_command *cmd, int argc, char **argv);
int cmd_device_stats(const struct cli_command *cmd, int argc, char **argv);
int cmd_check(const struct cli_command *cmd, int argc, char **argv);
int cmd_balance_start(const struct cli_command *cmd, int argc, char **argv);
int cmd_balance_ctl(const struct cli_command *cmd, int argc, char **argv);
int cmd_replace_start(const struct cli_command *cmd, int argc, char **argv);
int cmd_replace_ctl(const struct cli_command *cmd, int argc, char **argv);
int cmd_device_remove(const struct cli_command *cmd, int argc, char **argv);
int cmd_filesystem_resize(const struct cli_command *cmd, int argc, char **argv);

/* One `btrfs filesystem df` style line: "Data, single: total=..., used=..." (cmd_info.c). */
/* One df line; with @count (and cli_json) a JSON item instead, *@count items so far. */
void cli_print_space(const char *indent, uint64_t flags, uint64_t total, uint64_t used,
		     const struct cli_units *u, int *count);

/*
 * control.c: the same commands on a live `butter mount`, through its control
 * ioctls. Each returns an exit status and reports its own errors.
 */
struct butter_subvol_info;
struct butter_ioc_info;
/*
 * Open @path (a file or directory) and check the daemon answers there (its
 * BUTTER_IOC_INFO into @info unless NULL); fd or -1 (reported, "not inside a
 * butter mount" where no daemon answers).
 */
int ctl_open(const char *path, struct butter_ioc_info *info);
int ctl_subvol(const char *what, const char *src, const char *path, bool readonly);
int ctl_subvol_list(const char *path, int (*print)(void *arg, const struct butter_subvol_info *si),
		    void *arg);
/*
 * BUTTER_IOC_SCRUB command @cmd (with @flags and @limit) to the mount holding @path;
 * the daemon's answer in @io. 0, -EBADF when @path is not in a mount
 * (reported), else the ioctl's -errno (not reported: the caller knows what
 * EINPROGRESS, ENOENT or ENOTCONN mean for its command).
 */
struct butter_ioc_scrub;
int ctl_scrub(const char *path, uint32_t cmd, uint32_t flags, uint64_t limit,
	      struct butter_ioc_scrub *io);
/* BUTTER_IOC_FS_INFO of the live mount holding @path; 0, or -1 after a message. */
struct butter_ioc_fs_info;
int ctl_fs_info(const char *path, struct butter_ioc_fs_info *fi);
int ctl_filesystem(const char *what, const char *path, const char *label,
		   const struct cli_units *units);
/*
 * The filesystem of the live mount holding @path, as its last commit left it:
 * the mount commits first (what the kernel caches included), then its devices
 * are opened read-only beside the daemon (the library allows readers there).
 * For work on what does not change while the daemon writes: read-only
 * snapshots (send). 0 with *fs, or -1 after a message.
 */
int ctl_open_committed(const char *path, struct butter_fs **fs);
int cmd_subvolume_delete(const struct cli_command *cmd, int argc, char **argv);
int cmd_mkfs(const struct cli_command *cmd, int argc, char **argv);
int cmd_put(const struct cli_command *cmd, int argc, char **argv);
int cmd_mkdir(const struct cli_command *cmd, int argc, char **argv);
int cmd_ln(const struct cli_command *cmd, int argc, char **argv);

/* cmd_umount.c */
int cmd_umount(const struct cli_command *cmd, int argc, char **argv);

/* cmd_fsync.c */
int cmd_fsync(const struct cli_command *cmd, int argc, char **argv);

#endif /* BUTTER_CLI_H */
