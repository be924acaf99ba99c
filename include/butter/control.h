/*
 * control.h — controlling a mounted butter filesystem: ioctls on any
 * directory (or file) inside a `butter mount`, answered by the daemon.
 *
 * Why ioctls: they travel with an open file descriptor through the kernel's
 * FUSE driver to the daemon that serves that very mount, need no second
 * channel to find or secure, and carry the caller's credentials. Each
 * request is a fixed-size struct (FUSE passes "restricted" ioctls whose
 * size is encoded in the command), so paths and names have fixed caps.
 *
 *   BUTTER_IOC_INFO           what the fd names: subvolume id and inode
 *   BUTTER_IOC_SUBVOL_CREATE  new empty subvolume @name in the fd's directory
 *   BUTTER_IOC_SNAPSHOT       snapshot of subvolume @src_subvol as @name there
 *   BUTTER_IOC_SUBVOL_DELETE  delete the subvolume @name in the fd's directory
 *   BUTTER_IOC_SUBVOL_NEXT    the first subvolume with id >= @id (iterate)
 *   BUTTER_IOC_SYNC           commit everything written so far
 *   BUTTER_IOC_FS_INFO        label, fsid, sizes, devices
 *   BUTTER_IOC_SPACE          the @idx-th kind of chunk (df)
 *   BUTTER_IOC_SET_LABEL      change the label (committed)
 *   BUTTER_IOC_SCRUB          start, resume or cancel the daemon's scrub, or
 *                             ask how it goes
 *   BUTTER_IOC_DAEMON_INFO    the daemon's pid and state (`butter umount`
 *                             waits for that pid to exit)
 *   BUTTER_IOC_REMOUNT        read-only / read-write on a live mount
 *   BUTTER_IOC_DEV_STATS      the error counters of the @idx-th device
 *                             (butter_device_stats); with the reset flag they
 *                             are zeroed and the zeros committed
 *   BUTTER_IOC_FSYNC          fsync up to BUTTER_IOC_FSYNC_MAX files of the
 *                             mount in one tree log sync
 *   BUTTER_IOC_BALANCE        start, resume, pause or cancel the daemon's
 *                             balance, or ask how it goes
 *   BUTTER_IOC_DEVICE         device remove, resize or replace, run by the
 *                             same thread
 *   BUTTER_IOC_DEFRAG         defragment the fd's file (snapshot-aware)
 *   BUTTER_IOC_LAYOUT         place the ranges of an access trace in order
 *   BUTTER_IOC_SUBVOL_GET     all the library says of a subvolume
 *                             (butter_subvol_get), and the default's id
 *   BUTTER_IOC_SUBVOL_SET     make a subvolume the default, or read-only or
 *                             writable (committed)
 *   BUTTER_IOC_FILE_EXTENTS   the fd's file's extents, shared or not (FIEMAP)
 *   BUTTER_IOC_RECEIVE        receive a send stream into the fd's directory,
 *                             read by the daemon from the caller's pipe
 * Errors come back as errno of the ioctl(2) call, as the library's.
 * A snapshot or subvolume change commits first, so it sees every write
 * made before the call.
 */
#ifndef BUTTER_CONTROL_H
#define BUTTER_CONTROL_H

#include <stdint.h>
#include <sys/ioctl.h>

#include <butter/butter.h>

#define BUTTER_IOC_MAGIC 0xB7
#define BUTTER_IOC_VERSION 1
#define BUTTER_IOC_NAME_MAX 255
#define BUTTER_IOC_PATH_MAX 4000
#define BUTTER_IOC_LABEL_MAX 255

struct butter_ioc_info {
	uint32_t version;       /* BUTTER_IOC_VERSION */
	uint32_t reserved;
	uint64_t subvol;        /* the subvolume holding the fd's inode */
	uint64_t ino;           /* its inode number in that subvolume */
};

struct butter_ioc_subvol {
	uint64_t src_subvol;    /* SNAPSHOT: the subvolume to snapshot */
	uint64_t flags;         /* SNAPSHOT: BUTTER_SNAPSHOT_RDONLY */
	uint64_t id;            /* out: the new subvolume's id */
	char name[BUTTER_IOC_NAME_MAX + 1]; /* NUL-terminated */
};

struct butter_ioc_subvol_next {
	uint64_t id;            /* in: start here; out: the subvolume found */
	uint64_t parent;        /* out: parent subvolume id (0 for 5) */
	uint64_t generation;
	uint64_t otransid;      /* generation at creation */
	uint64_t flags;         /* root item flags (BTRFS_ROOT_SUBVOL_RDONLY = 1) */
	uint8_t uuid[16], parent_uuid[16], received_uuid[16];
	char path[BUTTER_IOC_PATH_MAX]; /* from the top level, NUL-terminated */
};

struct butter_ioc_fs_info {
	char label[BUTTER_IOC_LABEL_MAX + 1];
	uint8_t fsid[16];
	uint64_t generation;
	uint64_t total_bytes;
	uint64_t bytes_used;
	uint64_t num_devices;
	uint32_t nodesize, sectorsize;
	uint32_t csum_type;
	uint32_t reserved;
};

struct butter_ioc_space {
	uint64_t idx;           /* in */
	uint64_t flags;         /* out: BTRFS_BLOCK_GROUP_* type and profile */
	uint64_t total, used;
};

struct butter_ioc_label {
	char label[BUTTER_IOC_LABEL_MAX + 1];
};

/*
 * BUTTER_IOC_SCRUB: the daemon's scrub, which runs in a thread of its own,
 * 64 MiB of allocated blocks per step (the mount serves every other request
 * between steps), then the superblocks, and outlives the command that
 * started it, as the kernel's does:
 *   START   a scrub from the start, read-only with BUTTER_SCRUB_READONLY
 *           in @flags, at most @limit bytes a second unless 0 (EINPROGRESS
 *           if one runs)
 *   RESUME  the last scrub, cancelled or interrupted, from where it stopped,
 *           with the new @limit (ENOENT if there is none, or it finished)
 *   STATUS  the running or last scrub (@state BUTTER_SCRUB_STATE_NONE: none
 *           since the mount)
 *   CANCEL  stop after the step being scrubbed (ENOTCONN if none runs);
 *           the answer comes once it has stopped
 * The counters are butter_scrub_stats' (<butter/butter.h>), summed over the
 * steps since START, resumes included. Unmounting interrupts a scrub; what
 * it found stays in the daemon's log.
 */
#define BUTTER_SCRUB_CMD_START 1u
#define BUTTER_SCRUB_CMD_RESUME 2u
#define BUTTER_SCRUB_CMD_STATUS 3u
#define BUTTER_SCRUB_CMD_CANCEL 4u

#define BUTTER_SCRUB_STATE_NONE 0u        /* no scrub since the mount */
#define BUTTER_SCRUB_STATE_RUNNING 1u
#define BUTTER_SCRUB_STATE_FINISHED 2u
#define BUTTER_SCRUB_STATE_CANCELED 3u    /* by CANCEL: RESUME goes on */
#define BUTTER_SCRUB_STATE_INTERRUPTED 4u /* by an error (@error): RESUME goes on */

struct butter_ioc_scrub {
	uint32_t cmd;           /* in: BUTTER_SCRUB_CMD_* */
	uint32_t flags;         /* in (START): BUTTER_SCRUB_READONLY; out: the scrub's */
	uint32_t state;         /* out: BUTTER_SCRUB_STATE_* */
	int32_t error;          /* out: why it stopped (-errno), 0 otherwise */
	uint64_t pid;           /* out: the daemon's process id (it does the work) */
	int64_t started;        /* out: when START came, seconds since the epoch */
	int64_t resumed;        /* out: when the last RESUME came, 0 if none */
	uint64_t seconds;       /* out: time spent scrubbing, resumes summed */
	uint64_t bytes_total;   /* out: bytes to check: the allocated bytes now (0 for CANCEL) */
	uint64_t cursor;        /* out: where the walk of the blocks stands */
	uint64_t limit;         /* in (START, RESUME), out: bytes a second at most, 0 none */
	struct butter_scrub_stats stats; /* out */
};

#define BUTTER_IOC_INFO _IOR(BUTTER_IOC_MAGIC, 1, struct butter_ioc_info)
#define BUTTER_IOC_SUBVOL_CREATE _IOWR(BUTTER_IOC_MAGIC, 2, struct butter_ioc_subvol)
#define BUTTER_IOC_SNAPSHOT _IOWR(BUTTER_IOC_MAGIC, 3, struct butter_ioc_subvol)
#define BUTTER_IOC_SUBVOL_DELETE _IOW(BUTTER_IOC_MAGIC, 4, struct butter_ioc_subvol)
#define BUTTER_IOC_SUBVOL_NEXT _IOWR(BUTTER_IOC_MAGIC, 5, struct butter_ioc_subvol_next)
#define BUTTER_IOC_SYNC _IO(BUTTER_IOC_MAGIC, 6)
#define BUTTER_IOC_FS_INFO _IOR(BUTTER_IOC_MAGIC, 7, struct butter_ioc_fs_info)
#define BUTTER_IOC_SPACE _IOWR(BUTTER_IOC_MAGIC, 8, struct butter_ioc_space)
#define BUTTER_IOC_SET_LABEL _IOW(BUTTER_IOC_MAGIC, 9, struct butter_ioc_label)
#define BUTTER_IOC_SCRUB _IOWR(BUTTER_IOC_MAGIC, 12, struct butter_ioc_scrub)

struct butter_ioc_subvol_get {
	uint64_t id;            /* in: the subvolume (0: the one holding the fd) */
	uint64_t default_id;    /* out: the default subvolume */
	struct butter_subvol_info info; /* out */
};

#define BUTTER_SUBVOL_SET_DEFAULT 1u  /* @value unused */
#define BUTTER_SUBVOL_SET_READONLY 2u /* @value 1 read-only, 0 writable */

struct butter_ioc_subvol_set {
	uint64_t id;            /* the subvolume (0: the one holding the fd) */
	uint32_t what;          /* BUTTER_SUBVOL_SET_* */
	uint32_t value;
};

#define BUTTER_IOC_SUBVOL_GET _IOWR(BUTTER_IOC_MAGIC, 22, struct butter_ioc_subvol_get)
#define BUTTER_IOC_SUBVOL_SET _IOW(BUTTER_IOC_MAGIC, 23, struct butter_ioc_subvol_set)

/* The daemon serving the mount: who it is and whether its commits still work. */
#define BUTTER_DAEMON_READONLY 0x1u      /* mounted -o ro */
#define BUTTER_DAEMON_FAILED 0x2u        /* a commit failed: the mount is read-only now */

struct butter_ioc_daemon_info {
	uint32_t version;       /* BUTTER_IOC_VERSION */
	uint32_t flags;         /* BUTTER_DAEMON_* */
	uint64_t pid;           /* the daemon's process id (in its pid namespace) */
	uint64_t pidns;         /* that namespace: st_ino of /proc/self/ns/pid (0: unknown) */
	uint64_t generation;    /* the last committed generation */
};

#define BUTTER_IOC_DAEMON_INFO _IOR(BUTTER_IOC_MAGIC, 13, struct butter_ioc_daemon_info)

/*
 * BUTTER_IOC_REMOUNT: switch the daemon read-only (it commits first, then
 * refuses every change) or read-write again. `butter mount -o remount,ro`
 * (and mount(8)'s remount through the helper) makes the kernel's superblock
 * read-only first, so the kernel writes its cached pages back before the
 * daemon stops taking them, and calls this after; going read-write it calls
 * this first.
 */
#define BUTTER_REMOUNT_RDONLY 0x1u

struct butter_ioc_remount {
	uint32_t version;       /* BUTTER_IOC_VERSION */
	uint32_t flags;         /* BUTTER_REMOUNT_*; other bits: EINVAL */
};

#define BUTTER_IOC_REMOUNT _IOW(BUTTER_IOC_MAGIC, 15, struct butter_ioc_remount)

/* One device's error counters (butter_device_stats() in <butter/butter.h>). */
#define BUTTER_IOC_DEV_STATS_MAX 8
#define BUTTER_IOC_DEV_PATH_MAX 1024
struct butter_ioc_dev_stats {
	uint64_t idx;           /* in: the idx-th device in devid order (ENOENT past the end) */
	uint64_t flags;         /* in: BUTTER_DEV_STATS_RESET (1): zero them, committed */
	uint64_t devid;         /* out */
	uint64_t nr_items;      /* out: counters filled in values[] (BUTTER_DEV_STAT_NR) */
	uint64_t values[BUTTER_IOC_DEV_STATS_MAX]; /* out: BUTTER_DEV_STAT_* order */
	char path[BUTTER_IOC_DEV_PATH_MAX];        /* out: "" if the device is missing */
};

#define BUTTER_IOC_DEV_STATS _IOWR(BUTTER_IOC_MAGIC, 14, struct butter_ioc_dev_stats)

/*
 * BUTTER_IOC_FSYNC: fsync many files of the mount in one log sync
 * (butter_fsync_many(): one flush sequence for all). The files are named by
 * what BUTTER_IOC_INFO answers for them; the fd the ioctl goes to may be any
 * file or directory of the mount. The caller pushes the kernel's dirty pages
 * of each file to the daemon first (sync_file_range), as fsync(2) would.
 */
#define BUTTER_IOC_FSYNC_MAX 128
#define BUTTER_FSYNC_DATA 0x1u     /* fdatasync */

struct butter_ioc_fsync {
	uint32_t count;             /* entries used in inos[], 1..BUTTER_IOC_FSYNC_MAX */
	uint32_t flags;             /* BUTTER_FSYNC_*; other bits: EINVAL */
	struct {
		uint64_t subvol, ino;
	} inos[BUTTER_IOC_FSYNC_MAX];
};

#define BUTTER_IOC_FSYNC _IOW(BUTTER_IOC_MAGIC, 10, struct butter_ioc_fsync)

/*
 * BUTTER_IOC_BALANCE: the daemon's balance, which runs in a thread of its
 * own one block group at a time (the mount serves every other request
 * between groups) and outlives the command that started it, as the
 * kernel's does:
 *   START   a balance with @args (EINPROGRESS if one runs, or one is
 *           recorded on disk: resume or cancel that first)
 *   RESUME  the balance recorded on disk (ENOENT if none)
 *   STATUS  what runs (or ran last, or is recorded): @state, @args, @stats
 *   PAUSE   stop after the group being moved; the record stays (ENOTCONN
 *           if none runs)
 *   CANCEL  stop after that group and delete the record; also a recorded
 *           balance that does not run (ENOTCONN if there is neither)
 * A mount resumes a recorded balance by itself unless -o skip_balance.
 */
#define BUTTER_BALANCE_CMD_START 1u
#define BUTTER_BALANCE_CMD_RESUME 2u
#define BUTTER_BALANCE_CMD_STATUS 3u
#define BUTTER_BALANCE_CMD_PAUSE 4u
#define BUTTER_BALANCE_CMD_CANCEL 5u

#define BUTTER_BALANCE_STATE_RUNNING 0x1u
#define BUTTER_BALANCE_STATE_PAUSE_REQ 0x2u
#define BUTTER_BALANCE_STATE_CANCEL_REQ 0x4u
#define BUTTER_BALANCE_STATE_RECORDED 0x8u   /* a balance item is on disk */
#define BUTTER_BALANCE_STATE_PAUSED 0x10u    /* the last one ended paused */
#define BUTTER_BALANCE_STATE_CANCELED 0x20u  /* the last one was cancelled */

struct butter_ioc_balance {
	uint32_t cmd;                       /* in: BUTTER_BALANCE_CMD_* */
	uint32_t state;                     /* out: BUTTER_BALANCE_STATE_* */
	int32_t error;                      /* out: how the last balance ended (0 or -errno) */
	uint32_t job;                       /* out: 0 balance, else BUTTER_DEVICE_CMD_* */
	struct butter_balance_args args;    /* in (START); out (STATUS) */
	struct butter_balance_stats stats;  /* out: the running or last balance's counts */
};

#define BUTTER_IOC_BALANCE _IOWR(BUTTER_IOC_MAGIC, 16, struct butter_ioc_balance)

/*
 * BUTTER_IOC_DEVICE: device work on a live mount, run by the same thread as
 * the balance (one job at a time: EINPROGRESS while another runs), and
 * followed the same way (BUTTER_IOC_BALANCE STATUS; PAUSE and CANCEL stop
 * remove and resize after their current block group):
 *   REMOVE   move every group off device @devid, then drop it
 *   RESIZE   device @devid to @size bytes (a shrink moves the groups past it)
 *   REPLACE  device @devid by @path, a piece at a time (butter_replace_step;
 *            writes meanwhile reach both devices); STATUS reports it with
 *            groups = chunks copied, left = chunks to copy, bytes = bytes
 *            written; PAUSE and CANCEL both cancel it (the old device stays)
 */
#define BUTTER_DEVICE_CMD_REMOVE 1u
#define BUTTER_DEVICE_CMD_RESIZE 2u
#define BUTTER_DEVICE_CMD_REPLACE 3u
#define BUTTER_IOC_DEVICE_PATH_MAX 1024

struct butter_ioc_device {
	uint32_t cmd;                       /* in: BUTTER_DEVICE_CMD_* */
	uint32_t flags;                     /* in: REPLACE: BUTTER_REPLACE_* */
	uint64_t devid;                     /* in */
	uint64_t size;                      /* in: RESIZE */
	char path[BUTTER_IOC_DEVICE_PATH_MAX]; /* in: REPLACE's new device */
};

#define BUTTER_IOC_DEVICE _IOW(BUTTER_IOC_MAGIC, 17, struct butter_ioc_device)

/*
 * BUTTER_IOC_DEFRAG: defragment the file the fd names (butter_defrag(): its
 * extents move together, snapshot-aware, committed before the answer).
 * EROFS on a read-only mount, EISDIR on a directory.
 */
struct butter_ioc_defrag {
	struct butter_defrag_args args;     /* in */
	struct butter_defrag_stats stats;   /* out: this file's counts */
};

#define BUTTER_IOC_DEFRAG _IOWR(BUTTER_IOC_MAGIC, 20, struct butter_ioc_defrag)

/*
 * BUTTER_IOC_LAYOUT: place up to BUTTER_IOC_LAYOUT_MAX ranges of a trace
 * (butter_layout()) on any fd of the mount; a longer trace is sent in
 * pieces, each with BUTTER_LAYOUT_CONTINUE and the @stats the previous one
 * returned (which carry where its data ended), so the mount serves other
 * requests between pieces and the data still lies in one run.
 */
#define BUTTER_IOC_LAYOUT_MAX 64

struct butter_ioc_layout {
	uint32_t count;                     /* in: ranges used, 1..BUTTER_IOC_LAYOUT_MAX */
	uint32_t flags;                     /* in: BUTTER_LAYOUT_* */
	struct butter_layout_range ranges[BUTTER_IOC_LAYOUT_MAX]; /* in */
	struct butter_layout_stats stats;   /* in/out: accumulated */
};

#define BUTTER_IOC_LAYOUT _IOWR(BUTTER_IOC_MAGIC, 21, struct butter_ioc_layout)

/*
 * BUTTER_IOC_FILE_EXTENTS on a regular file of the mount: butter_file_extents()
 * of it from byte @start, up to BUTTER_IOC_EXTENTS_MAX at a time (ask again
 * from past the last one until an extent carries BUTTER_EXTENT_LAST or none
 * comes). What `butter filesystem du` reads where the kernel's FIEMAP, which
 * FUSE does not forward, would be asked.
 */
#define BUTTER_IOC_EXTENTS_MAX 120

struct butter_ioc_file_extents {
	uint64_t start;                     /* in */
	uint32_t count;                     /* out */
	uint32_t reserved;
	struct butter_file_extent extents[BUTTER_IOC_EXTENTS_MAX]; /* out */
};

#define BUTTER_IOC_FILE_EXTENTS _IOWR(BUTTER_IOC_MAGIC, 24, struct butter_ioc_file_extents)

/*
 * BUTTER_IOC_RECEIVE on a directory of the mount: butter_receive() into it,
 * run by a thread of the daemon, which reads the stream from a pipe of the
 * caller's (the read end, its fd number @fd in the calling process; the
 * daemon opens it through /proc, so only a pipe the caller holds can be
 * named). Root only, as the kernel's receive (CAP_SYS_ADMIN); one receive
 * at a time per mount:
 *   START   begin; @id names this receive (EINPROGRESS while one runs;
 *           EBADF if @fd is not a pipe the caller holds)
 *   STATUS  how the receive @id goes: @state, @bytes read so far, and once
 *           done @error and the result (ESRCH: a later receive replaced it)
 * The caller writes the stream into the pipe's other end and closes it at
 * the end; the daemon's thread ends at the pipe's end, or at the first error
 * (the caller's writes then fail with EPIPE). New names in the directory
 * are dropped from the kernel's cache at the end.
 */
#define BUTTER_RECEIVE_CMD_START 1u
#define BUTTER_RECEIVE_CMD_STATUS 2u

#define BUTTER_RECEIVE_STATE_RUNNING 1u
#define BUTTER_RECEIVE_STATE_DONE 2u      /* @error says how it ended */

struct butter_ioc_receive {
	uint32_t cmd;           /* in: BUTTER_RECEIVE_CMD_* */
	int32_t fd;             /* in (START): the pipe's read end in the caller */
	uint64_t id;            /* out (START), in (STATUS) */
	uint32_t state;         /* out: BUTTER_RECEIVE_STATE_* */
	int32_t error;          /* out: 0, or butter_receive()'s -errno */
	uint64_t bytes;         /* out: stream bytes read */
	uint64_t subvolumes;    /* out: subvolumes received (butter_receive_result) */
	uint64_t last_subvol;   /* out: the last one's id */
	uint32_t flags;         /* in (START): BUTTER_RECEIVE_END_STOPS (butter_receive_flags) */
	uint32_t reserved;
};

#define BUTTER_IOC_RECEIVE _IOWR(BUTTER_IOC_MAGIC, 25, struct butter_ioc_receive)

#endif
