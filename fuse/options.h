/*
 * options.h — the command line of `butter mount`: what the user asked for,
 * parsed once into struct mount_opts. Options butter does not know are
 * collected for libfuse, which knows the kernel's mount options
 * (allow_other, noatime, nodev, ...).
 */
#ifndef BUTTER_FUSE_OPTIONS_H
#define BUTTER_FUSE_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOUNT_DEFAULT_COMMIT 30u            /* seconds, as btrfs */
#define MOUNT_DEFAULT_MAX_WRITE (1u << 20)   /* libfuse's largest request */

struct mount_opts {
	/* how the daemon runs */
	bool foreground;         /* -f (and -d) */
	bool debug;              /* -d: libfuse prints every request */
	bool single_thread;      /* -s */
	unsigned max_threads;    /* 0: libfuse's default */
	const char *log_file;    /* log=FILE: messages once in the background (daemon.c) */
	unsigned spin_us;        /* spin=US: poll this long after a reply (pollloop.c); 0: libfuse's loop */
	bool uring;              /* uring: FUSE over io_uring when the kernel offers it (uring.c) */

	/* the filesystem */
	const char **devices;    /* DEV... then device=DEV and --device DEV, absolute paths */
	size_t ndevices;
	const char *mountpoint;  /* absolute */
	bool readonly;           /* ro */
	bool remount;            /* remount: change a live mount (remount.c), start nothing */
	bool degraded;
	bool skip_balance;       /* a recorded balance is not resumed at mount */
	const char *subvol;      /* subvol=PATH; NULL: not given */
	uint64_t subvolid;       /* subvolid=ID; 0: not given */
	unsigned commit_secs;    /* commit=SECONDS */
	uint64_t write_buffer;   /* write_buffer=SIZE: delayed allocation's bound; UINT64_MAX: default */
	uint64_t max_inline;     /* max_inline=SIZE; UINT64_MAX: the library's default */
	const char *compress;    /* the compress= or compress-force= option as given */
	bool noatime;            /* noatime (atime: off again); passed on to the kernel too */
	bool strictatime;        /* strictatime; relatime (the default): off again */
	bool nodiratime;         /* nodiratime; diratime: off again */
	const char *trace;       /* trace=FILE: record first reads (trace.c); absolute */

	/* FUSE behaviour */
	int writeback_cache;     /* -1: on when read-write; 0/1 as asked */
	bool keep_cache;         /* FOPEN_KEEP_CACHE for files unchanged since their last open */
	unsigned max_write;
	unsigned max_readahead;  /* 0: the kernel's default */
	double attr_timeout, entry_timeout;
	bool no_permission_checks; /* no_permission_checks: no default_permissions for libfuse */
	bool killpriv_v2;        /* FUSE_HANDLE_KILLPRIV_V2 when the kernel offers it (wire.c) */

	const char *record_log, *fault_spec; /* test devices (butter --record/--fault) */

	char *fuse_opts;         /* comma-separated options passed on to libfuse */
	char **owned;            /* strings to free */
	size_t nowned;
};

/*
 * Parse the arguments of `butter mount` (argv[0] is "mount"). Returns 0 and
 * fills @o, 1 if --help was printed (exit 0), or -1 after printing a usage
 * error on stderr (exit 2).
 */
int mount_opts_parse(struct mount_opts *o, int argc, char **argv);

void mount_opts_free(struct mount_opts *o);

#endif
