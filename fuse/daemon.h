/*
 * daemon.h — what the files of the FUSE daemon share: the daemon's state
 * (one per mount), its lock rule, and the table of request handlers.
 *
 * Locking:
 *   the library's lock  every library call takes it itself (butter.h: reads
 *            shared, changes exclusive). A handler that needs several calls
 *            to see one state (check, then change) runs them in a section,
 *            butter_lock() ... butter_unlock() (ops.c section_read() and
 *            section_change()); one call needs no section.
 *   nodes    its own mutex (nodes.c); taken inside a section, never around one.
 * Every other field is set before the session starts and only read after.
 */
#ifndef BUTTER_FUSE_DAEMON_H
#define BUTTER_FUSE_DAEMON_H

#define FUSE_USE_VERSION 314

#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <butter/butter.h>
#include <butter/testing.h>

#include "nodes.h"
#include "options.h"
#include "pollloop.h"
#include "wire.h"

/* fsync requests waiting for the next tree log sync (fsync.c); its own lock, taken outside the library's */
struct fsync_queue {
	pthread_mutex_t lock;
	struct fsync_entry *head, **tail;   /* protected by lock */
};

struct daemon {
	struct wire wire;             /* FIRST member (wire.h): FUSE_HANDLE_KILLPRIV_V2 */
	const struct mount_opts *opts;
	struct butter_fs *fs;
	struct node_table nodes;
	atomic_bool readonly;         /* changes refused: -o ro, or remounted read-only */
	atomic_bool handle_rdonly;    /* fs was opened read-only (until a remount reopens it) */
	atomic_bool reopened;         /* fs was opened again read-write by a remount */
	atomic_ulong writes_served;   /* WRITE requests answered (the exit's write-back loop) */
	bool posix_acl;               /* the kernel enforces ACLs; we inherit them (op_init) */
	bool writeback;               /* the kernel caches writes and owns mtime/ctime (op_init) */
	unsigned blksize;             /* st_blksize: the sector size */
	struct fuse_session *se;
	bool daemonized;              /* stderr is /dev/null: messages go to log_fd or syslog */
	int log_fd;                   /* the log file once in the background; -1: syslog (daemon.c) */

	struct fsync_queue fsyncq;    /* fsync.c */
	struct committer *committer;  /* daemon.c; NULL before it starts and once stopped */
	atomic_bool commit_failed;    /* a commit failed: the library refuses changes (-EROFS) */

	/* the balance thread (balance.c); balancer_lock guards the pointer */
	pthread_mutex_t balancer_lock;
	struct balancer *balancer;

	/* the scrub thread (scrub.c); scrubber_lock guards the pointer */
	pthread_mutex_t scrubber_lock;
	struct scrubber *scrubber;

	/* the receive thread (receive.c); receiving_lock guards the pointer */
	pthread_mutex_t receiving_lock;
	struct receiving *receiving;

	struct tracer *tracer;        /* -o trace=FILE (trace.c); NULL: none */

	/* nodes whose written-back data found no space (ops.c, "ENOSPC under the writeback cache") */
#define FULL_NODES 64
	pthread_mutex_t full_lock;
	struct {
		uint64_t ino;           /* node id; 0: a free slot */
		uint64_t avail;         /* the free bytes when it was marked */
		uint64_t when;          /* full_clock then: the oldest slot is reused */
	} full[FULL_NODES];
	uint64_t full_clock;

	/* open directories (ops.c struct dir_handle), freed at exit if the kernel did not */
	pthread_mutex_t dirs_lock;
	struct dir_handle *dirs;

	/* shutdown: see daemon.c */
	pthread_t main_thread;
	atomic_bool loop_done;        /* the session loop has returned */
};

/*
 * Remount (BUTTER_IOC_REMOUNT, after the kernel made its superblock read-only
 * or before it makes it writable): read-only commits everything and refuses
 * every later change; read-write allows them again, opening the filesystem
 * read-write when the mount began with -o ro. Returns 0 or -errno (logged).
 */
int daemon_remount(struct daemon *d, bool readonly);

/*
 * `butter mount -o remount[,ro|rw] ... MOUNTPOINT` (remount.c): switch the
 * live mount at MOUNTPOINT; returns the exit status.
 */
int butter_remount_main(const struct mount_opts *o);

/*
 * The daemon's balance (balance.c): BUTTER_IOC_BALANCE's commands; the
 * resume of a recorded balance once the mount is live; and, at unmount,
 * pausing it (the record stays for the next mount) and joining its thread.
 */
struct butter_ioc_balance;
struct butter_ioc_device;
int balancer_ioctl(struct daemon *d, struct butter_ioc_balance *io);
int balancer_device_ioctl(struct daemon *d, const struct butter_ioc_device *io);
void balancer_resume_at_mount(struct daemon *d);
void balancer_stop(struct daemon *d);

/*
 * The daemon's scrub (scrub.c): BUTTER_IOC_SCRUB's commands; at unmount,
 * stopping it after its step and joining its thread.
 */
struct butter_ioc_scrub;
int scrubber_ioctl(struct daemon *d, struct butter_ioc_scrub *io);
void scrubber_stop(struct daemon *d);

/*
 * The daemon's receive (receive.c): BUTTER_IOC_RECEIVE's commands on the
 * directory node @ino; at unmount, ending it and joining its thread.
 */
struct butter_ioc_receive;
int receiving_ioctl(struct daemon *d, fuse_req_t req, fuse_ino_t ino, struct butter_ioc_receive *io);
void receiving_stop(struct daemon *d);

/*
 * A second mount of an image a live butter mount serves (bind.c): a bind
 * mount of that one (of the subvolume the options ask for), as the kernel's
 * btrfs shares one filesystem between its mounts. 1 when done so, 0 when
 * the image has no live mount, -errno (logged) when it has one that cannot
 * be shared so.
 */
int bind_if_mounted(struct daemon *d);

/* The request handlers (ops.c). */
extern const struct fuse_lowlevel_ops butter_fuse_ops;
/* Free the open-directory handles left at exit (ops.c). */
void butter_fuse_dirs_free(struct daemon *d);

/* The control ioctls of <butter/control.h> (control.c). */
void butter_fuse_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg,
		       struct fuse_file_info *fi, unsigned flags, const void *in_buf,
		       size_t in_bufsz, size_t out_bufsz);

/*
 * The kernel btrfs's fixed-size ioctls (btrfs_ioctl.c): 1 when @cmd is one
 * (the reply is sent), 0 when it is not btrfs's (nothing sent).
 */
int btrfs_ioctl_answer(fuse_req_t req, fuse_ino_t ino, unsigned cmd, const void *in,
		       size_t in_size, size_t out_size);

/*
 * O_TMPFILE (ops.c): create a nameless file in the directory node @parent for
 * the caller @uid/@gid with @mode and @umask, count one kernel lookup and
 * one open of it, and fill @e. butter_fuse_tmpfile_unref() undoes both when
 * the reply could not be given. tmpfile.c speaks the protocol.
 */
int butter_fuse_tmpfile(struct daemon *d, uint64_t parent, uint32_t mode, uint32_t uid,
			uint32_t gid, uint32_t umask, struct fuse_entry_param *e);
void butter_fuse_tmpfile_unref(struct daemon *d, uint64_t nodeid);

/* The raw request hook of the poll loop (tmpfile.c): answers FUSE_TMPFILE. */
bool butter_fuse_raw_request(void *daemon, const void *req, size_t len);

/* fsync and fsyncdir, grouped into tree log syncs (fsync.c). */
void butter_fuse_fsync(fuse_req_t req, fuse_ino_t ino, int datasync);
void fsync_queue_init(struct fsync_queue *q);
void fsync_queue_destroy(struct fsync_queue *q);

/*
 * Note that a change was made (or is being made):
 * the commit thread writes it out about a second after changes stop, at
 * most commit= seconds after it (daemon.c). Cheap; any thread.
 */
void daemon_note_change(struct daemon *d);

/* A commit failed with @err: say so once (the mount is read-only from now on). */
void daemon_commit_failed(struct daemon *d, int err);

/* Report @msg at @level (a BUTTER_LOG_* value): stderr, or once in the background the log file or syslog. */
void daemon_log(struct daemon *d, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
