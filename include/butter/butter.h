/*
 * butter.h — the public API of libbutter, a userspace implementation of the
 * Linux btrfs filesystem. Front ends (the CLI, the FUSE daemon) include only
 * this header.
 *
 * Conventions:
 *  - Every function returns 0 (or a non-negative count) on success and a
 *    negative errno value on failure. -EUCLEAN means the image is corrupt; the
 *    library has already logged where (through the log callback).
 *  - Handles are opaque. Files are named by (subvolume id, inode number):
 *    btrfs repeats inode numbers across subvolumes, so the pair is the identity.
 *  - Nothing that failed its checksum reaches the caller: a read that cannot
 *    find a good copy returns -EIO.
 *  - Ownership: every pointer a caller passes in stays the caller's (the
 *    library copies what it keeps past the call); a pointer the library
 *    hands out says beside its field how long it lives; names and buffers
 *    passed to a callback live until the callback returns. Handles are freed
 *    by butter_close() only.
 *  - Threads: every call on a handle may be made from any thread at any
 *    time; the library serialises them itself with the handle's lock.
 *    Calls that only read (lookup, stat, read, readdir, readlink, seek,
 *    xattr reads, statfs and info, subvolume listing, send, open_ref) run at
 *    the same time as each other; a call that changes anything (every change,
 *    sync, fsync, scrub, receive, device calls, check, the settings) runs
 *    alone and sees the effects of every call that returned before it.
 *    butter_close() waits for the calls still running; no call may start on
 *    a handle once butter_close() has been called. Callbacks a call makes
 *    (readdir's, subvolume listing's, send's and receive's) run under the
 *    call's hold and may call back into the same handle: reads always, changes
 *    only from inside an exclusive hold (else -EDEADLK).
 *  - Several calls that must see one state (check, then change) go in a
 *    section: butter_lock() ... butter_unlock() (see there).
 */
#ifndef BUTTER_BUTTER_H
#define BUTTER_BUTTER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "butter/version.h"

#ifdef __cplusplus
extern "C" {
#endif

struct butter_fs;

/* The version of the library the program runs with ("0.1.0"; BUTTER_VERSION_* are the headers'). */
const char *butter_version(void);

/* Log levels passed to the log callback. */
enum butter_log_level {
	BUTTER_LOG_ERROR = 0,
	BUTTER_LOG_WARNING = 1,
	BUTTER_LOG_INFO = 2,
	BUTTER_LOG_DEBUG = 3,
};

typedef void (*butter_log_fn)(void *arg, int level, const char *msg);

/* butter_open() flags */
#define BUTTER_OPEN_RDONLY 0x1u   /* never write to any device */
#define BUTTER_OPEN_DEGRADED 0x2u /* allow missing devices within the profiles' tolerance */
#define BUTTER_OPEN_NO_WRITER 0x4u /* with RDONLY: -EBUSY while another opener writes it */

struct butter_open_opts {
	const char *const *devices; /* further members of a multi-device filesystem (the caller's;
	                             * read during butter_open() only) */
	size_t ndevices;
	uint64_t cache_bytes;       /* node cache bound; 0 means the default (32 MiB) */
	unsigned flags;             /* BUTTER_OPEN_* */
	butter_log_fn log;          /* NULL: messages go to stderr prefixed "butter: " */
	void *log_arg;              /* passed to log as it is; the caller's, valid until butter_close() */
	int log_level;              /* highest level passed to log; 0 means WARNING */
};

/*
 * Open the filesystem on @path (an image file or block device) plus
 * opts->devices. @opts may be NULL. On success *out holds the handle.
 *
 * Exclusive access: a read-write open claims every device exclusively until
 * butter_close() (open file description locks; block devices also O_EXCL);
 * a read-only open shares them with other readers, and beside a writer it
 * reads what the writer's last commit left (with a warning; -EBUSY instead
 * with BUTTER_OPEN_NO_WRITER). A read-write open beside any other opener is
 * refused, except that it waits (up to 60 s, saying so in the log) for an
 * opener that has called butter_begin_close() and is finishing.
 *
 * Errors: -ENOENT/-EACCES (a path), -EINVAL (not btrfs), -EOPNOTSUPP (an
 * unsupported feature, named in the log), -EUCLEAN (corrupt), -ENXIO (a device
 * is missing and the profile cannot do without it), -EBUSY (a device is in
 * use: open read-write elsewhere, or mounted by the kernel; the holder is
 * named in the log), -EFBIG (read-write only: a device is smaller than the
 * size the filesystem records for it; read-only opens warn and go on).
 */
int butter_open(const char *path, const struct butter_open_opts *opts, struct butter_fs **out);

/*
 * Say that the handle is closing: no change will start any more. Openers
 * waiting for its devices then wait for butter_close() instead of being
 * refused. Call it as soon as the last user of the handle is gone (the FUSE
 * daemon: when its session ends, before its final butter_sync()); reads and
 * butter_sync() still work. butter_close() calls it itself.
 */
void butter_begin_close(struct butter_fs *fs);

/* Commit what is left (read-write), release everything the handle holds. */
void butter_close(struct butter_fs *fs);

/*
 * Hold the handle's lock across several calls of this thread: shared
 * (@exclusive 0: calls that read, and nothing changes until butter_unlock())
 * or exclusive (any call; no other thread's call runs meanwhile). The calls
 * inside the section do not take the lock again. Sections nest (the lock
 * goes when the outermost ends); an exclusive section inside a shared hold
 * of this thread is -EDEADLK. 0 on success, -EIO on a handle that died at a
 * failed reopen.
 */
int butter_lock(struct butter_fs *fs, int exclusive);
/* End the section butter_lock() began on this thread. */
void butter_unlock(struct butter_fs *fs);

/* ---- filesystem information --------------------------------------------- */

struct butter_info {
	char label[257];
	uint8_t fsid[16];
	uint8_t metadata_uuid[16];
	uint64_t generation;
	uint64_t total_bytes;
	uint64_t bytes_used;
	uint64_t num_devices;
	uint32_t sectorsize;
	uint32_t nodesize;
	uint16_t csum_type;
	const char *csum_name;  /* a static string: valid for ever */
	uint64_t compat_flags;
	uint64_t compat_ro_flags;
	uint64_t incompat_flags;
	uint64_t default_subvol;
};

int butter_get_info(struct butter_fs *fs, struct butter_info *info);

struct butter_device_info {
	uint64_t devid;
	uint64_t total_bytes;
	uint64_t bytes_used;
	uint8_t uuid[16];
	/*
	 * NULL if the device is missing; else the handle's string, valid until
	 * butter_close() or a reopen (butter_set_readonly(fs, 0) of a read-only handle)
	 */
	const char *path;
};

/* Fill @out with the @idx-th device (in devid order); -ENOENT past the end. */
int butter_get_device(struct butter_fs *fs, size_t idx, struct butter_device_info *out);

/*
 * Device names: wherever butter takes a device (butter_open() and its
 * devices, mkfs, device add, replace), it takes an image file, a block
 * device, or an NBD export as a URI (nbd://host[:port]/export,
 * nbds://..., nbd+unix:///export?socket=PATH, nbd+vsock://...), spoken to
 * through libnbd without the kernel's nbd module; BUTTER_NBD_TIMEOUT (in
 * seconds, default 30) bounds each request. Nonzero when @name is such a
 * URI (no file by that name is looked for).
 */
int butter_device_is_nbd(const char *name);

/*
 * Nonzero when @err (negative), returned by an open with an NBD URI among
 * its devices, may be an export that could not be opened (connection
 * refused or lost, timed out, a read-only export opened read-write, NBD
 * not built in); the library has then logged which URI and why.
 */
int butter_nbd_open_error(int err);

/*
 * The size in bytes of the device @name (a regular file's length, a block
 * device's, an NBD export's as its server says) into *size; the device is
 * neither claimed nor written. -errno (-EPROTONOSUPPORT: an NBD URI in a
 * build without libnbd).
 */
int butter_device_size(const char *name, uint64_t *size);

struct butter_space_info {
	uint64_t flags;      /* BTRFS_BLOCK_GROUP_* type and profile bits */
	uint64_t total;      /* logical bytes of chunks of this kind */
	uint64_t used;       /* from the block group items */
};

/* Fill @out with the @idx-th kind of chunk (type+profile); -ENOENT past the end. */
int butter_get_space(struct butter_fs *fs, size_t idx, struct butter_space_info *out);

/* Names of feature bits: @kind 0 = compat, 1 = compat_ro, 2 = incompat. NULL if unknown. */
const char *butter_feature_name(int kind, int bit);

/* "single", "dup", "raid0", ... for the profile bits of a chunk type. */
const char *butter_profile_name(uint64_t flags);

/* ---- files -------------------------------------------------------------- */

typedef struct butter_ino {
	uint64_t subvol; /* subvolume (tree) id; 5 is the top level */
	uint64_t ino;    /* inode number inside that subvolume */
} butter_ino_t;

/* The inode number of every subvolume's root directory. */
#define BUTTER_SUBVOL_ROOT_INO 256

struct butter_stat {
	uint64_t subvol;
	uint64_t ino;
	uint32_t mode;
	uint32_t nlink;
	uint32_t uid;
	uint32_t gid;
	uint64_t rdev;       /* userspace dev_t, as st_rdev (makedev) */
	uint64_t size;
	uint64_t blocks;     /* in 512-byte units, as st_blocks */
	uint64_t generation;
	uint64_t transid;
	uint64_t flags;      /* btrfs inode flags (BUTTER_INODE_* below among them) */
	struct timespec atime, mtime, ctime, otime;
};

/* Two of btrfs's inode flags (struct butter_stat.flags): chattr +i and +a. */
#define BUTTER_INODE_IMMUTABLE (1ULL << 6)
#define BUTTER_INODE_APPEND (1ULL << 7)

/*
 * One path of @ino from its subvolume's root directory ("a/b/c"; "" for the
 * root itself), following the first name of each inode up. -ENOENT (no name:
 * an orphan), -ENAMETOOLONG when it does not fit @cap bytes, -ELOOP.
 */
int butter_ino_path(struct butter_fs *fs, butter_ino_t ino, char *out, size_t cap);

/* The root directory of subvolume @subvolid (5: top level; 0: the default subvolume). */
int butter_root(struct butter_fs *fs, uint64_t subvolid, butter_ino_t *out);

/*
 * Look @name up in directory @dir. Entries naming a subvolume give that
 * subvolume's root directory. -ENOENT if absent, -ENOTDIR if @dir is not one.
 */
int butter_lookup(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		  butter_ino_t *out);

/*
 * butter_lookup(), and the file's type as the directory entry gives it, a
 * DT_* value as in readdir (the inode itself is not read).
 */
int butter_lookup_type(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		       butter_ino_t *out, unsigned *dtype);

/*
 * Resolve an absolute or relative @path from the top-level subvolume's root,
 * without following symlinks in the last component (lstat semantics);
 * symlinks in earlier components are followed inside the image.
 */
int butter_resolve(struct butter_fs *fs, const char *path, butter_ino_t *out);

int butter_stat(struct butter_fs *fs, butter_ino_t ino, struct butter_stat *st);

/*
 * Directory iteration callback: return 0 to continue, anything else to stop
 * (butter_readdir then returns that value). @next_pos resumes after this entry.
 * @dtype is a DT_* value. "." and ".." are not reported.
 */
typedef int (*butter_dirent_fn)(void *arg, const char *name, size_t namelen, butter_ino_t ino,
				unsigned dtype, uint64_t next_pos);

/* Iterate @dir in DIR_INDEX order from position @pos (0: the start). */
int butter_readdir(struct butter_fs *fs, butter_ino_t dir, uint64_t pos, butter_dirent_fn fn,
		   void *arg);

/*
 * The position just past @dir's last entry now, into *@end: a listing that
 * stops there (butter_readdir_until) ends even while entries are renamed
 * inside @dir, since a new name always gets a position past the last one (the
 * kernel bounds readdir by the last index at opendir, and again at rewinddir).
 * Returns 0, -ENOTDIR, negative errno.
 */
int butter_readdir_end(struct butter_fs *fs, butter_ino_t dir, uint64_t *end);

/* butter_readdir() that reports no entry at a position >= @end. */
int butter_readdir_until(struct butter_fs *fs, butter_ino_t dir, uint64_t pos, uint64_t end,
			 butter_dirent_fn fn, void *arg);

/*
 * Read up to @len bytes at @off. Returns the bytes read (short only at end of
 * file), or -EIO if any part of the range has no good copy, -EISDIR, ...
 */
ssize_t butter_read(struct butter_fs *fs, butter_ino_t ino, void *buf, size_t len, uint64_t off);

/*
 * Find the next data or hole at or after @off, as lseek(2) SEEK_DATA (@whence
 * 3) and SEEK_HOLE (@whence 4) do. Prealloc extents count as holes. -ENXIO if
 * there is no data at or after @off (SEEK_DATA) or @off is past the end.
 */
int butter_seek(struct butter_fs *fs, butter_ino_t ino, uint64_t off, int whence, uint64_t *result);

/* Copy a symlink's target into @buf (NUL-terminated if room); returns its length. */
ssize_t butter_readlink(struct butter_fs *fs, butter_ino_t ino, char *buf, size_t size);

/* As listxattr(2): NUL-separated names; @size 0 returns the size needed. */
ssize_t butter_listxattr(struct butter_fs *fs, butter_ino_t ino, char *buf, size_t size);

/* As getxattr(2): -ENODATA if absent, -ERANGE if @size is too small (0 asks the size). */
ssize_t butter_getxattr(struct butter_fs *fs, butter_ino_t ino, const char *name, void *buf,
			size_t size);

/* ---- subvolumes --------------------------------------------------------- */

struct butter_subvol_info {
	uint64_t id;
	uint64_t parent_id;   /* subvolume holding its directory entry (0 for id 5) */
	uint64_t dirid;       /* directory inode in the parent holding the entry */
	uint64_t generation;
	uint64_t ctransid;
	uint64_t otransid;
	uint64_t flags;       /* BTRFS_ROOT_SUBVOL_RDONLY (1) when read-only */
	uint8_t uuid[16];
	uint8_t parent_uuid[16];
	uint8_t received_uuid[16];
	struct timespec otime;
	char path[4096];      /* from the top level, no leading slash ("" for id 5) */
	uint64_t stransid;    /* received: the sender's transid; 0 otherwise */
	uint64_t rtransid;    /* received: the transid of the receive */
	struct timespec stime, rtime; /* as the root item keeps them (0: never) */
};

/* Call @fn for every subvolume except the top level, in id order. */
int butter_subvol_list(struct butter_fs *fs,
		       int (*fn)(void *arg, const struct butter_subvol_info *info), void *arg);

int butter_subvol_get(struct butter_fs *fs, uint64_t id, struct butter_subvol_info *info);

/*
 * Make subvolume @id (0 or 5: the top level) the default one, which a mount
 * without subvol= shows (butter_info.default_subvol), as `btrfs subvolume
 * set-default`; committed at once. -ENOENT if there is no such subvolume.
 */
int butter_subvol_set_default(struct butter_fs *fs, uint64_t id);

/*
 * Make subvolume @id (0: the top level) read-only (@readonly 1) or writable,
 * committed at once (`btrfs property set SUBVOL ro true|false`). -EBUSY to
 * make a received subvolume writable (its received uuid names what it was
 * sent as: make a snapshot instead), -ENOENT for no such subvolume.
 */
int butter_subvol_set_readonly(struct butter_fs *fs, uint64_t id, int readonly);

/* ---- changing files ----------------------------------------------------- */
/*
 * These need a handle opened without BUTTER_OPEN_RDONLY; otherwise -EROFS.
 * Changes become durable at butter_sync() or butter_close() (a commit).
 * After a failed commit the handle refuses changes (-EROFS); what was
 * committed before stays intact on disk.
 */

struct butter_new_inode {
	uint32_t mode;     /* file type and permission bits (S_IFREG, S_IFDIR, ...) */
	uint32_t uid, gid;
	uint64_t rdev;     /* device nodes */
	uint32_t umask;    /* with BUTTER_NEW_INHERIT_ACL */
	uint32_t flags;    /* BUTTER_NEW_* */
};

/*
 * Create as the kernel does on a POSIX-ACL filesystem: the parent's default
 * ACL is inherited (the new inode's access ACL, and its default ACL for a
 * directory) and narrows the mode; without one, @umask narrows the mode.
 * Without this flag the mode is taken as given and no ACL is made.
 */
#define BUTTER_NEW_INHERIT_ACL 0x1u

/* Create a file, directory, device node, fifo or socket named @name in @dir. -EEXIST if taken. */
int butter_create(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		  const struct butter_new_inode *attr, butter_ino_t *out);

/*
 * Create a regular file without a name in @dir's subvolume (open(2) with
 * O_TMPFILE in @dir): it is counted as open once (release it with
 * butter_release(), which frees it unless butter_link() gave it a name
 * first) and lives as an orphan until then, as the kernel keeps it.
 * On a read-only handle -EROFS.
 */
int butter_create_tmpfile(struct butter_fs *fs, butter_ino_t dir,
			  const struct butter_new_inode *attr, butter_ino_t *out);

/* Create a symlink to @target. */
int butter_symlink(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen,
		   const char *target, uint32_t uid, uint32_t gid, butter_ino_t *out);

/*
 * Add the name @name in @dir for the existing non-directory @ino. A file
 * whose last name went while open gets none (-ENOENT), except one made by
 * butter_create_tmpfile() (linkat(2) of an O_TMPFILE file).
 */
int butter_link(struct butter_fs *fs, butter_ino_t ino, butter_ino_t dir, const char *name,
		size_t namelen);

/* Write @len bytes at @off (anywhere: past the end, into holes, over data). */
ssize_t butter_write(struct butter_fs *fs, butter_ino_t ino, const void *buf, size_t len,
		     uint64_t off);

/* Remove the name @name (not a directory) from @dir; the inode goes with its last name. */
int butter_unlink(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen);

/* Remove the empty directory @name from @dir (-ENOTEMPTY otherwise). */
int butter_rmdir(struct butter_fs *fs, butter_ino_t dir, const char *name, size_t namelen);

#define BUTTER_RENAME_NOREPLACE 0x1u /* fail with -EEXIST if the new name exists */
#define BUTTER_RENAME_EXCHANGE 0x2u  /* swap the two names (both must exist) */

/* Rename, replacing an existing compatible target as rename(2) does. */
int butter_rename(struct butter_fs *fs, butter_ino_t olddir, const char *oldname, size_t oldlen,
		  butter_ino_t newdir, const char *newname, size_t newlen, unsigned flags);

/* Remove an extended attribute (-ENODATA if absent). */
int butter_removexattr(struct butter_fs *fs, butter_ino_t ino, const char *name);

struct butter_statfs {
	uint64_t bsize;       /* sector size */
	uint64_t blocks;      /* total data capacity in bsize units */
	uint64_t bfree;       /* free data space (allocated-but-free plus unallocated) */
	uint64_t bavail;
	uint64_t files, ffree;
	uint64_t namemax;
};

/*
 * Space for statfs(2): data capacity and what is free of it. On a read-write
 * handle data written since the last commit counts as taken at once (as on
 * the kernel's btrfs); on a read-only one the committed block group usage.
 */
int butter_statfs(struct butter_fs *fs, struct butter_statfs *out);

/*
 * Set (or replace) an extended attribute. -EOPNOTSUPP for a namespace btrfs
 * has no handler for, -EINVAL for a bare prefix or a bad btrfs.compression
 * value (an empty one removes that property), -E2BIG if name and value do
 * not fit one leaf item (the kernel's btrfs says -ENOSPC there).
 */
int butter_setxattr(struct butter_fs *fs, butter_ino_t ino, const char *name, const void *value,
		    size_t size);

/* Which fields of struct butter_stat butter_setattr() applies. */
#define BUTTER_SET_MODE 0x1u  /* permission bits only */
#define BUTTER_SET_UID 0x2u
#define BUTTER_SET_GID 0x4u
#define BUTTER_SET_ATIME 0x8u
#define BUTTER_SET_MTIME 0x10u
#define BUTTER_SET_CTIME 0x20u
#define BUTTER_SET_SIZE 0x40u /* truncate: shrink, or grow with a hole */
#define BUTTER_SET_TIMES_NOW 0x80u /* the times given are the current time (utimes(f, NULL)) */
/*
 * A regular file's mtime and ctime that the mask does not give stay as they
 * are (no ctime of now, none from a truncate): a FUSE kernel with the
 * writeback cache keeps those times itself and sends them when they change.
 */
#define BUTTER_SET_KEEP_FILE_TIMES 0x100u

/*
 * Set the fields of @st that @mask names; the ctime becomes now unless
 * BUTTER_SET_CTIME gives it. On an immutable inode (BUTTER_FL_IMMUTABLE)
 * every field but the ctime is -EPERM; on an append-only one
 * (BUTTER_FL_APPEND) the mode, owner, group, size and an atime that is not
 * BUTTER_SET_TIMES_NOW are -EPERM, as the kernel refuses them. (An mtime
 * alone stays allowed there: a FUSE kernel with the writeback cache sends
 * the mtime its writes made that way.)
 */
int butter_setattr(struct butter_fs *fs, butter_ino_t ino, const struct butter_stat *st,
		   unsigned mask);

/*
 * butter_setattr(), and what butter_stat() says of the file after it in
 * *@out: one call, one reading of the inode.
 */
int butter_setattr_stat(struct butter_fs *fs, butter_ino_t ino, const struct butter_stat *st,
			unsigned mask, struct butter_stat *out);

/*
 * The inode attributes of chattr(1) and lsattr(1) that btrfs keeps, with the
 * values of Linux's FS_*_FL (what FS_IOC_GETFLAGS and FS_IOC_SETFLAGS carry).
 * What they do, as on the kernel's btrfs:
 *   IMMUTABLE  no change to the inode, its data or its names: writes,
 *              truncate, setattr (but the ctime), xattrs, fallocate, clone
 *              into it, link, unlink and rename of it, and for a directory
 *              new or removed names in it, are -EPERM;
 *   APPEND     as IMMUTABLE, except that data may be written (a front end
 *              lets it be opened for writing only with O_APPEND) and a
 *              directory may get new names;
 *   NOCOW      nodatacow (and nodatasum): taken only by an empty regular file
 *              or a directory (whose new files inherit it);
 *   COMPR      compress (the btrfs.compression property becomes the
 *              filesystem's algorithm, or zlib); NOCOMP never compress;
 *   SYNC, DIRSYNC, NOATIME, NODUMP  kept for the kernel (butter's mount
 *              reads them too: NOATIME stops atime updates);
 *   VERITY     read-only here: an fs-verity file.
 */
#define BUTTER_FL_SYNC 0x00000008u
#define BUTTER_FL_IMMUTABLE 0x00000010u
#define BUTTER_FL_APPEND 0x00000020u
#define BUTTER_FL_NODUMP 0x00000040u
#define BUTTER_FL_NOATIME 0x00000080u
#define BUTTER_FL_COMPR 0x00000004u
#define BUTTER_FL_NOCOMP 0x00000400u
#define BUTTER_FL_DIRSYNC 0x00010000u
#define BUTTER_FL_VERITY 0x00100000u
#define BUTTER_FL_NOCOW 0x00800000u

/* The BUTTER_FL_* attributes of @ino into *@flags. */
int butter_get_fileattr(struct butter_fs *fs, butter_ino_t ino, uint32_t *flags);

/*
 * Make @ino's BUTTER_FL_* attributes @flags (all of them: what is not set
 * is cleared), as btrfs's FS_IOC_SETFLAGS does: -EOPNOTSUPP for a flag
 * btrfs does not take, -EINVAL for COMPR with NOCOMP or with NOCOW, or
 * COMPR/NOCOMP on a NOCOW inode. NOCOW on a regular file that is not empty
 * is left as it was, without an error (as btrfs). Who may change which flag
 * (the owner; CAP_LINUX_IMMUTABLE for IMMUTABLE and APPEND) is the front
 * end's to check (on a mount, the kernel does). The ctime becomes now.
 */
int butter_set_fileattr(struct butter_fs *fs, butter_ino_t ino, uint32_t flags);

/* Create an empty subvolume named @name in directory @dir; *out_id gets its id. */
int butter_subvol_create(struct butter_fs *fs, butter_ino_t dir, const char *name,
			 size_t namelen, uint64_t *out_id);

#define BUTTER_SNAPSHOT_RDONLY 0x1u

/*
 * Snapshot subvolume @src_id as @name in directory @dir, in O(1): the new
 * subvolume shares every block with the source until either changes. What
 * was written before the call is in the snapshot (it commits first, and
 * commits the snapshot). *out_id gets the new id. A read-only snapshot
 * (BUTTER_SNAPSHOT_RDONLY) refuses changes inside it with -EROFS.
 */
int butter_snapshot(struct butter_fs *fs, uint64_t src_id, butter_ino_t dir, const char *name,
		    size_t namelen, unsigned flags, uint64_t *out_id);

/*
 * Delete the subvolume or snapshot named @name in @dir: it disappears at
 * once (committed), then its blocks that no other tree shares are freed.
 * -EINVAL if @name is not a subvolume, -ENOTEMPTY if it contains
 * subvolumes, -EPERM for the default subvolume. A crash during the freeing
 * leaves it to the next read-write open, which finishes it.
 */
int butter_subvol_delete(struct butter_fs *fs, butter_ino_t dir, const char *name,
			 size_t namelen);

/* Commit everything changed so far. */
int butter_sync(struct butter_fs *fs);

/*
 * Switch a read-write handle to read-only and back (a remount): going
 * read-only commits everything first (its error is returned, and the handle
 * stays writable); afterwards every change is refused with -EROFS and
 * nothing is written, while the devices stay claimed. Going back is refused
 * (-EROFS) on a handle opened read-only or after a failed commit.
 */
int butter_set_readonly(struct butter_fs *fs, int readonly);

/*
 * Compress data written from now on: @spec is "zlib[:1-9]", "lzo",
 * "zstd[:1-15]" or "no" (the names and levels of btrfs's compress= mount
 * option). Without @force, a write whose data does not compress is stored
 * plainly from there on (as compress=); with it every 128 KiB piece is tried
 * (compress-force=). -EINVAL for an unknown spec, -EROFS on a read-only handle.
 */
int butter_set_compression(struct butter_fs *fs, const char *spec, int force);

/*
 * Store files of at most @max_bytes inline, in the metadata leaf beside
 * their inode (the kernel's max_inline= mount option; 0 turns inlining
 * off). The default is the kernel's, 2048; mkfs.btrfs --rootdir inlines
 * everything below a sector. Bounded to what a leaf item holds and below
 * the sector size. Returns the bound in effect, or -EROFS on a read-only
 * handle. Files already stored keep their form until rewritten.
 */
int butter_set_max_inline(struct butter_fs *fs, uint64_t max_bytes);

/*
 * Delayed allocation: butter_write() keeps file data in memory, up to
 * @max_bytes over all files, and gives it extents when it is written back:
 * at every commit, at butter_fsync() of its file (that file only), when the
 * bound is passed (the largest files first), and before anything else
 * changes or maps the file's extents. A file written in many calls, or
 * several written at once, so lands in large extents, and an fsync does not
 * carry other files' data. Reads and butter_stat() see the buffered bytes.
 * 0 (the default) turns it off and writes back what is held. -EROFS on a
 * read-only handle (for a non-zero bound).
 */
int butter_set_write_buffer(struct butter_fs *fs, uint64_t max_bytes);

/*
 * Make the filesystem use *size bytes of device @devid (0: as few as its
 * allocated chunks allow), rounded down to the sector size; committed at
 * once, and *size gets the size set. -ENOSPC when chunks lie beyond the size
 * (they are not moved yet), -EFBIG when the device is smaller, -ENODEV for no
 * such (present) device.
 */
int butter_device_resize(struct butter_fs *fs, uint64_t devid, uint64_t *size);

/*
 * Add the device (image file or block device) at @path, as `btrfs device
 * add`: it gets the next devid (in *devid if not NULL) and a new uuid, and
 * new chunks may go to it; committed at once. Existing chunks stay where
 * they are. -EEXIST if it already belongs to this filesystem, -EBUSY if it
 * holds another btrfs (unless BUTTER_DEVICE_ADD_FORCE), -ENOSPC if it is
 * smaller than 16 MiB, -EROFS on a read-only handle. Afterwards the
 * filesystem opens only with the new device among its devices.
 */
#define BUTTER_DEVICE_ADD_FORCE 0x1u
int butter_device_add(struct butter_fs *fs, const char *path, unsigned flags, uint64_t *devid);

/*
 * Error counters of one device, as the kernel keeps them in the device tree
 * and `btrfs device stats` prints them: I/O errors of writes, reads and
 * flushes, checksum (and other block header) mismatches, and tree blocks
 * older than their parent says (a lost write). Counted while the handle is
 * open, added to what was on disk; a read-write handle writes them at its
 * next commit, a read-only one never.
 */
#define BUTTER_DEV_STAT_WRITE_ERRS 0
#define BUTTER_DEV_STAT_READ_ERRS 1
#define BUTTER_DEV_STAT_FLUSH_ERRS 2
#define BUTTER_DEV_STAT_CORRUPTION_ERRS 3
#define BUTTER_DEV_STAT_GENERATION_ERRS 4
#define BUTTER_DEV_STAT_NR 5

struct butter_device_stats {
	uint64_t devid;
	const char *path;                    /* as butter_device_info.path */
	uint64_t values[BUTTER_DEV_STAT_NR]; /* BUTTER_DEV_STAT_* */
};

/*
 * The counters of the @idx-th device (devid order) into @out. With
 * BUTTER_DEV_STATS_RESET they are also set to zero (@out holds the values
 * before), which the next commit writes (butter_sync()). -ENOENT past the
 * end, -EROFS for a reset on a read-only handle, -EINVAL for unknown flags.
 * Safe beside any other call.
 */
#define BUTTER_DEV_STATS_RESET 0x1u
int butter_device_stats(struct butter_fs *fs, size_t idx, unsigned flags,
			struct butter_device_stats *out);

/* Set the filesystem label (at most 255 bytes; -EINVAL if longer); committed at once. */
int butter_set_label(struct butter_fs *fs, const char *label);

/* ---- scrub ---------------------------------------------------------------- */
/*
 * Scrub reads every copy of every allocated block (only those: free space is
 * never read) and checks it: tree blocks against their header (checksum,
 * bytenr, fsid, level), data sectors against the csum tree, every superblock
 * copy, and the parity of every RAID5/6 stripe row that holds allocated
 * bytes. A bad copy is rewritten from a good one (a mirror, or for RAID5/6 a
 * rebuild from parity), and parity that disagrees with its data is
 * recomputed, unless BUTTER_SCRUB_READONLY is given or the handle is
 * read-only. Every error is logged with its logical address, the copy, and
 * for data the subvolume and inode that own it.
 *
 * Counts are of tree blocks and data sectors (one per bad copy), of
 * superblock copies and of parity rows.
 */
#define BUTTER_SCRUB_READONLY 1u

struct butter_scrub_stats {
	uint64_t tree_bytes;      /* tree blocks checked (bytes, each block once) */
	uint64_t data_bytes;      /* data checked (bytes, each extent once) */
	uint64_t no_csum_bytes;   /* data without checksums: only read back */
	uint64_t read_errors;     /* copies that could not be read */
	uint64_t csum_errors;     /* data sectors whose checksum did not match */
	uint64_t verify_errors;   /* tree blocks whose header or checksum was wrong */
	uint64_t super_errors;    /* superblock copies damaged or behind */
	uint64_t parity_errors;   /* RAID5/6 parity stripes that disagreed with their data */
	uint64_t corrected;       /* bad copies (and parity, superblocks) rewritten */
	uint64_t uncorrectable;   /* blocks or sectors with no good copy at all */
};

/*
 * Scrub the whole filesystem. On a writable handle the running transaction
 * is committed first and changes wait until the scrub ends. Returns 0 when
 * the scrub ran (look at @st for what it found), or a negative errno when it
 * could not (reading the trees failed, ENOMEM, a repair write failed).
 */
int butter_scrub(struct butter_fs *fs, unsigned flags, struct butter_scrub_stats *st);

/*
 * butter_scrub() in steps, so that a front end can let other work in between
 * (each step holds the library lock; changes wait only for one step).
 * butter_scrub_range() scrubs the allocated blocks from *cursor (0 to start)
 * for about @budget bytes (0: all), ending at a RAID5/6 stripe row boundary;
 * it moves *cursor on and returns 1 while blocks remain, 0 when the walk is
 * done. Each step commits first and walks the trees as they are then.
 * butter_scrub_supers() checks (and repairs, with a commit) the superblock
 * copies; call it last. Both add to @st (zero it before the first step).
 */
int butter_scrub_range(struct butter_fs *fs, unsigned flags, uint64_t *cursor, uint64_t budget,
		       struct butter_scrub_stats *st);
int butter_scrub_supers(struct butter_fs *fs, unsigned flags, struct butter_scrub_stats *st);

/* ---- balance: moving what is on disk --------------------------------------- */
/*
 * Relocation empties block groups: every data extent and tree block of a
 * chosen group moves to other groups (new chunks are made as needed) and the
 * group's chunk goes away, while every tree that points at what moved follows,
 * so that nothing shared (snapshots, reflinks) becomes unshared. Each group
 * is moved in transactions of its own; a crash leaves the state before or
 * after any of them. docs/DESIGN.md says how.
 *
 * Which groups: those of the kinds in @flags (BUTTER_BALANCE_DATA, _METADATA,
 * _SYSTEM) that pass every filter set in the kind's butter_balance_filter,
 * with btrfs-progs' meaning (`btrfs balance start -d... -m... -s...`):
 *   USAGE     min_pct <= used*100/size < max_pct (usage=N is 0..N; usage=0
 *             takes only empty groups)
 *   DEVID     a stripe on device @devid
 *   DRANGE    a stripe on @devid overlapping physical [pstart, pend)
 *   VRANGE    the group overlaps logical [vstart, vend)
 *   LIMIT     at most @limit_max groups of this kind (and at least @limit_min)
 *   STRIPES   num_stripes in [stripes_min, stripes_max]
 *   PROFILES  the group's profile is one of @profiles (BTRFS profile bits,
 *             BUTTER_PROFILE_SINGLE for single)
 *   CONVERT   its copies go to new groups of profile @target (same bits), and
 *             new chunks of this kind take that profile from then on
 *   SOFT      with CONVERT: groups already of @target are left alone
 * Groups are taken from the highest logical address down; groups made while
 * the balance runs are not visited.
 *
 * A balance records itself on disk (the balance item, as the kernel's) from
 * its first group until none is left, and drops the record when it fails;
 * starting one while another is recorded is -EINPROGRESS unless @flags has
 * BUTTER_BALANCE_RESUME (see butter_balance_item()).
 *
 * Lowering the redundancy of metadata or system groups (e.g. dup to single)
 * needs BUTTER_BALANCE_FORCE. A conversion the devices cannot hold (raid1
 * on one device) is -EINVAL before anything moves; no room for a copy is
 * -ENOSPC. A failure after a group began to move aborts the transaction
 * (the handle turns read-only; the last commit is intact).
 */
#define BUTTER_BALANCE_DATA     0x1u
#define BUTTER_BALANCE_METADATA 0x2u
#define BUTTER_BALANCE_SYSTEM   0x4u
#define BUTTER_BALANCE_FORCE    0x8u
#define BUTTER_BALANCE_RESUME   0x10u  /* going on with the recorded balance (its record may exist) */

#define BUTTER_BALANCE_F_USAGE    0x1u
#define BUTTER_BALANCE_F_DEVID    0x2u
#define BUTTER_BALANCE_F_DRANGE   0x4u
#define BUTTER_BALANCE_F_VRANGE   0x8u
#define BUTTER_BALANCE_F_LIMIT    0x10u
#define BUTTER_BALANCE_F_STRIPES  0x20u
#define BUTTER_BALANCE_F_PROFILES 0x40u
#define BUTTER_BALANCE_F_CONVERT  0x80u
#define BUTTER_BALANCE_F_SOFT     0x100u

#define BUTTER_PROFILE_SINGLE (1ULL << 48)

struct butter_balance_filter {
	unsigned flags;                 /* BUTTER_BALANCE_F_* */
	uint32_t usage_min, usage_max;  /* percent */
	uint64_t devid;
	uint64_t pstart, pend;
	uint64_t vstart, vend;
	uint32_t limit_min, limit_max;
	uint32_t stripes_min, stripes_max;
	uint64_t profiles;
	uint64_t target;
};

struct butter_balance_args {
	unsigned flags;                 /* BUTTER_BALANCE_* */
	struct butter_balance_filter data, meta, sys;
};

struct butter_balance_stats {
	uint64_t considered;            /* groups looked at */
	uint64_t groups;                /* groups moved (their chunks removed) */
	uint64_t data_extents, tree_blocks, bytes;
	uint64_t left;                  /* groups still to do (butter_balance_step) */
	uint64_t kind_groups[3];        /* groups moved: data, metadata, system (LIMIT) */
};

/* Balance every group @args selects. Returns 0, or a negative errno. @st (zeroed here) may be NULL. */
int butter_balance(struct butter_fs *fs, const struct butter_balance_args *args,
		   struct butter_balance_stats *st);

/*
 * The same one group at a time, so that a front end can serve other calls in
 * between: *cursor is UINT64_MAX to start, and each call moves the next
 * selected group below it (adding to @st, and setting st->left to the groups
 * still selected). Returns 1 when none is left, 0 after moving one, or a
 * negative errno. The LIMIT filter counts from @st's kind_groups, so pass
 * the same @st (zeroed at the start) to every call.
 */
int butter_balance_step(struct butter_fs *fs, const struct butter_balance_args *args,
			uint64_t *cursor, struct butter_balance_stats *st);

/*
 * The balance recorded on disk (the balance item): one running, paused, or
 * interrupted by a crash, by butter or by the kernel. 0 with its arguments,
 * -ENOENT when there is none. butter_balance_cancel() deletes the record
 * (committed): the groups already moved stay moved. Resuming is
 * butter_balance() (or steps) with the arguments read here.
 */
int butter_balance_item(struct butter_fs *fs, struct butter_balance_args *out);
int butter_balance_cancel(struct butter_fs *fs);

/*
 * Replace device @srcdevid (present, failing or missing) by the file or
 * block device @target, as `btrfs replace start`: only the used parts of the
 * old device are copied (read through the checked paths: a bad copy, or a
 * missing device, is read from the other copies or rebuilt from parity) to
 * the same places on @target, which then takes the old device's devid and
 * uuid in one commit; the old device's superblocks are wiped. @target must
 * be at least as large as the part of the old device in use. Refused:
 * a member of this filesystem (-EEXIST), one of another unless
 * BUTTER_REPLACE_FORCE (-EBUSY). An I/O error writing @target stops it with
 * nothing changed. BUTTER_REPLACE_AVOID_SRC (-r): the old device is read only
 * where no other copy is good (else reads follow the mirror order). @st (may be NULL) gets the counts.
 *
 * In steps, for a front end that serves other calls meanwhile:
 * butter_replace_start() checks, opens and wipes @target; from then on every
 * write to the old device reaches @target as well. Each butter_replace_step()
 * copies the next piece (at most 256 MiB of a chunk) and returns 0, until the
 * last one, which swaps the devices and returns 1; or a negative errno (the
 * replace is over, the old device stays). butter_replace_cancel() stops it
 * (the old device stays); butter_replace_status() reports the running one
 * (-ENOENT: none). Closing the handle cancels a running replace. While it
 * runs, removing or resizing the old device is -EBUSY, a second replace
 * -EINPROGRESS. Nothing of a running replace is recorded on disk: after a
 * crash the old device is in place and the replace starts again.
 */
#define BUTTER_REPLACE_FORCE 0x1u
#define BUTTER_REPLACE_AVOID_SRC 0x2u

struct butter_replace_stats {
	uint64_t devid;
	uint64_t bytes_written;         /* to the new device, by the copy */
	uint64_t chunks_done, chunks_total;
};

int butter_replace(struct butter_fs *fs, uint64_t srcdevid, const char *target, unsigned flags,
		   struct butter_replace_stats *st);
int butter_replace_start(struct butter_fs *fs, uint64_t srcdevid, const char *target,
			 unsigned flags);
int butter_replace_step(struct butter_fs *fs, struct butter_replace_stats *st);
int butter_replace_cancel(struct butter_fs *fs);
int butter_replace_status(struct butter_fs *fs, struct butter_replace_stats *st);

/*
 * Remove device @devid from the filesystem: every group with a stripe on it
 * is moved to the other devices, then its item goes, the superblocks of the
 * remaining devices count one device less, and its own superblocks are wiped
 * (it no longer looks like a member). -EINVAL when the profiles in use need
 * more devices than would remain, -ENOSPC when the others lack the room,
 * -ENODEV for an unknown devid.
 */
int butter_device_remove(struct butter_fs *fs, uint64_t devid);

/*
 * butter_device_remove() and butter_device_resize() one block group per call,
 * for a front end that serves other calls in between: *cursor is UINT64_MAX
 * to start; each call moves one group off the device (or past the new size)
 * and returns 0, until the last one, which removes the device (sets the
 * size) and returns 1; or a negative errno. Between calls new chunks avoid
 * the device (the space past the size); a failure gives it back.
 */
int butter_device_remove_step(struct butter_fs *fs, uint64_t devid, uint64_t *cursor,
			      struct butter_balance_stats *st);
int butter_device_resize_step(struct butter_fs *fs, uint64_t devid, uint64_t size,
			      uint64_t *cursor, struct butter_balance_stats *st);

/* ---- where data lies: defragment and layout -------------------------------- */
/*
 * Defragment regular file @ino: when the pieces of [start, start + len) (len 0:
 * to the end) do not lie one after another on disk and some stretch of
 * consecutive ones is shorter than @target (0: 32 MiB, btrfs-progs' -t), they
 * are laid out again, in file order, one after another: data only this file
 * uses (one reference, younger than the subvolume's last snapshot) is
 * rewritten through the file into extents as large as the free space allows
 * (the file's times stay); everything else is **moved, snapshot-aware**: an
 * extent shared with snapshots or reflinked files moves once, and every file
 * extent item that names it, in every subvolume, follows, so sharing is kept
 * (the kernel's defragment breaks it), checksums carried over, compression
 * kept, unused ends left behind. Preallocated extents stay. With @compress
 * the file's own data is rewritten compressed so (all of it, fragmented or
 * not), shared data keeps its compression. Commits. Adds to @st (may be NULL). -EISDIR for a directory,
 * -EINVAL for another non-regular file, -EROFS on a read-only handle, -ENOSPC
 * when no free space can take the extents (nothing changed then).
 */
struct butter_defrag_args {
	uint64_t start, len;  /* the file range */
	uint64_t target;      /* stretches at least this long are fine (0: 32 MiB) */
	unsigned flags;       /* none yet: 0 */
	char compress[16];    /* "": keep; else a butter_set_compression() spec: recompress */
};

struct butter_defrag_stats {
	uint64_t files;         /* files looked at */
	uint64_t files_moved;   /* files whose data moved or was rewritten */
	uint64_t extents_moved, bytes_moved;          /* moved for all their owners */
	uint64_t extents_rewritten, bytes_rewritten;  /* the file's own, written anew */
	uint64_t runs_before, runs_after; /* contiguous stretches, summed over the files */
};

int butter_defrag(struct butter_fs *fs, butter_ino_t ino, const struct butter_defrag_args *args,
		  struct butter_defrag_stats *st);

/*
 * Lay out the data of @ranges (an access trace: files and byte ranges in the
 * order they are read; len 0 is to the end of the file) one after another in
 * that order, in a fresh region of the address space (new chunks first, free
 * space of existing groups when no device space is left). Snapshot-aware as
 * butter_defrag(). A file that no longer exists is counted in @st->missing.
 * @st (required) accumulates over calls; with BUTTER_LAYOUT_CONTINUE and
 * the @st->hint a previous call left, the data goes on right after the
 * previous call's, so a long trace can be placed in several calls (a mount
 * does, to serve other requests between them). Commits.
 */
struct butter_layout_range {
	butter_ino_t ino;
	uint64_t off, len;
};

struct butter_layout_stats {
	uint64_t files, missing;
	uint64_t extents_moved, bytes_moved;
	uint64_t runs_before, runs_after;  /* stretches read without a seek, over the trace */
	uint64_t seek_before, seek_after;  /* bytes skipped between them (logical addresses) */
	uint64_t hint;                     /* where the placed data ends (for CONTINUE) */
};

#define BUTTER_LAYOUT_CONTINUE 0x1u

int butter_layout(struct butter_fs *fs, const struct butter_layout_range *ranges, size_t n,
		  unsigned flags, struct butter_layout_stats *st);

/* ---- the space map (butter heatmap) ---------------------------------------- */
/*
 * One cell of device @devid's bytes [i * cell_bytes, (i + 1) * cell_bytes):
 * what butter_space_map() found there.
 */
/* The type bits of block group flags (btrfs's BTRFS_BLOCK_GROUP_DATA, _SYSTEM, _METADATA). */
#define BUTTER_BG_DATA 0x1ull
#define BUTTER_BG_SYSTEM 0x2ull
#define BUTTER_BG_METADATA 0x4ull

struct butter_space_cell {
	uint64_t flags;     /* block group type (BUTTER_BG_*) and profile of the chunk there; 0: none */
	uint64_t allocated; /* bytes in chunks */
	uint64_t used;      /* bytes holding extents or tree blocks (every copy, RAID5/6 parity) */
	uint64_t marked;    /* bytes holding the data of the @marks ranges */
};

/*
 * Fill @ncells cells of @cell_bytes each from byte 0 of device @devid (the
 * device's size divided by @ncells, rounded up, covers it): allocation from
 * the chunks, use from the extent tree (as the running transaction sees it),
 * and the disk places of the file ranges @marks (a trace, see
 * butter_layout(); files gone are skipped). -ENODEV for an unknown devid,
 * -EINVAL for a zero @cell_bytes.
 */
int butter_space_map(struct butter_fs *fs, uint64_t devid, uint64_t cell_bytes,
		     const struct butter_layout_range *marks, size_t nmarks,
		     struct butter_space_cell *cells, size_t ncells);

/* ---- check ---------------------------------------------------------------- */
/*
 * A read-only consistency check (lib/ops/check.c says what it covers): every
 * tree reads and hangs together, the extent tree's reference counts match
 * the pointers the trees hold, block group usage matches its extents. Each
 * problem is logged; the counts come back in @res. Returns 0 when the check
 * ran (errors or not), a negative errno when it could not. On a writable
 * handle, call it with no change running after butter_sync().
 */
struct butter_check_result {
	uint64_t errors;
	uint64_t trees, tree_blocks, data_refs, extent_items, block_groups;
	int refs_checked;  /* 0: a tree being dropped made the counts unknowable */
};

int butter_check(struct butter_fs *fs, struct butter_check_result *res);

/* ---- where a file's data lies (FIEMAP) ----------------------------------- */
/*
 * The extents of regular file @ino from the first one ending after byte
 * @start, in file order, as the kernel's FIEMAP reports them on btrfs: each
 * file extent item one entry (holes have none), @logical its file offset,
 * @length its bytes in the file, @physical the filesystem (logical) address
 * its bytes start at (a compressed extent's own start; 0 for inline data).
 * Up to @n entries into @out, their number in *got; the file's last extent
 * carries BUTTER_EXTENT_LAST. File data still buffered in memory (see
 * butter_set_write_buffer()) is not reported: butter_sync() first.
 *
 * BUTTER_EXTENT_SHARED: something else uses these bytes too — another file
 * or another range of this one (reflinks), or a snapshot (the extent's item
 * counts more than one reference, or a tree block on the way to the file's
 * item is shared), as the kernel's FIEMAP_EXTENT_SHARED says.
 */
#define BUTTER_EXTENT_LAST     0x01u
#define BUTTER_EXTENT_INLINE   0x02u  /* stored in the metadata leaf */
#define BUTTER_EXTENT_PREALLOC 0x04u  /* allocated, reads as zeros (FIEMAP's UNWRITTEN) */
#define BUTTER_EXTENT_ENCODED  0x08u  /* compressed */
#define BUTTER_EXTENT_SHARED   0x10u

struct butter_file_extent {
	uint64_t logical, physical, length;
	uint32_t flags;     /* BUTTER_EXTENT_* */
	uint32_t reserved;
};

int butter_file_extents(struct butter_fs *fs, butter_ino_t ino, uint64_t start,
			struct butter_file_extent *out, size_t n, size_t *got);

/* ---- raw tree search (BTRFS_IOC_TREE_SEARCH) ------------------------------ */
/*
 * The items of one tree whose keys lie between (min_objectid, min_type,
 * min_offset) and (max_objectid, max_type, max_offset), compared as whole
 * keys (not field by field), in key order, as the kernel's TREE_SEARCH
 * ioctl returns them: each as a struct butter_search_header followed by the
 * item's bytes as they are on disk (little-endian). Only items in leaves
 * whose generation lies in [min_transid, max_transid] come back; the
 * header's transid is that generation. The trees are seen as the running
 * transaction has them (file data still buffered in memory is not in them).
 *
 * @tree_id: 1 root, 2 extent, 3 chunk, 4 device, 5 top-level subvolume,
 * 7 csum, 8 quota, 9 uuid, 10 free space, 11 block group, a subvolume id,
 * or the data relocation tree; -ENOENT for a tree the filesystem lacks.
 *
 * At most @nr_items items, and what fits @bufsize bytes; *@nr_found gets how
 * many came. An item larger than the whole buffer is returned alone, as a
 * header with len 0, when it is the first (the kernel's TREE_SEARCH v1
 * does this); search again past its key to go on.
 */
struct butter_search_key {
	uint64_t tree_id;
	uint64_t min_objectid, max_objectid;
	uint64_t min_offset, max_offset;
	uint64_t min_transid, max_transid;
	uint32_t min_type, max_type;
};

struct butter_search_header {  /* the kernel's struct btrfs_ioctl_search_header */
	uint64_t transid;
	uint64_t objectid;
	uint64_t offset;
	uint32_t type;
	uint32_t len;                   /* item bytes that follow */
};

int butter_tree_search(struct butter_fs *fs, const struct butter_search_key *key,
		       uint32_t nr_items, void *buf, size_t bufsize, uint32_t *nr_found);

/* ---- send ----------------------------------------------------------------- */
/*
 * Write read-only subvolume @subvol as a btrfs send stream (version 1)
 * through @write, which gets the stream in pieces and returns 0 or a
 * negative errno (that stops the send and is returned). With @parent 0 a
 * full send; with the id of a read-only @parent an incremental one: the
 * changes from @parent, which the receiver must have received before.
 * `btrfs receive` makes the subvolume from it, read-only, with the source's
 * uuid as its received uuid. -EPERM if a subvolume is not read-only (as
 * btrfs send, which needs stable sources), -ENAMETOOLONG for a path or
 * xattr that does not fit a v1 command.
 */
typedef int (*butter_send_write_fn)(void *arg, const void *buf, size_t len);
int butter_send(struct butter_fs *fs, uint64_t subvol, uint64_t parent, butter_send_write_fn write,
		void *arg);

/* ---- receive -------------------------------------------------------------- */
/*
 * Apply a btrfs send stream (from `btrfs send` or butter_send(); version 1,
 * and version 2 without its new commands) as `btrfs receive` does: each
 * subvolume in it is made in directory @dest (a full stream: a new
 * subvolume; an incremental one: a snapshot of the subvolume received
 * earlier from its parent's uuid), built by the commands, then given the
 * sender's uuid as its received uuid and made read-only. @read gets up to
 * @len bytes into @buf and returns how many (0 at the end) or a negative
 * errno. Returns 0, -EBADMSG for a malformed stream (the handle's log says
 * where), -EOPNOTSUPP for a command not handled, -ENOENT when the parent of
 * an incremental stream is not here, or the error of a change. @result (may
 * be NULL) gets how many subvolumes were received and the last one's id.
 * @read is called without the library's lock (unless the caller holds it in
 * a butter_lock() section), so other callers go on while the stream comes:
 * they see the subvolume being built as it grows.
 */
typedef ssize_t (*butter_receive_read_fn)(void *arg, void *buf, size_t len);

struct butter_receive_result {
	uint64_t subvolumes;
	uint64_t last_subvol;
};

int butter_receive(struct butter_fs *fs, butter_ino_t dest, butter_receive_read_fn read,
		   void *arg, struct butter_receive_result *result);

/*
 * butter_receive() with @flags: BUTTER_RECEIVE_END_STOPS ends the receive at
 * the first END command (`btrfs receive -e`), reading nothing after it;
 * without it streams that follow one another are all received, to the end
 * of the input.
 */
#define BUTTER_RECEIVE_END_STOPS 0x1u
int butter_receive_flags(struct butter_fs *fs, butter_ino_t dest, unsigned flags,
			 butter_receive_read_fn read, void *arg,
			 struct butter_receive_result *result);

/*
 * The commands of a send stream as text, one line each, as `btrfs receive
 * --dump` prints them (paths from "./", the subvolume's name first; names
 * escaped as progs escapes them): @line gets each line, without its newline.
 * Nothing is applied and no filesystem is needed; the stream is checked as
 * butter_receive() checks it (errors go to @log, stderr if NULL). 0,
 * -EBADMSG, -EOPNOTSUPP (version 2's own commands), or @read's error.
 */
typedef void (*butter_dump_line_fn)(void *arg, const char *line);
int butter_receive_dump(butter_receive_read_fn read, void *arg, butter_dump_line_fn line,
			void *line_arg, butter_log_fn log, void *log_arg);

/*
 * Mark subvolume @id as received from @uuid at the sender's transid
 * @stransid (root item and uuid tree, committed), and with
 * BUTTER_RECEIVED_RDONLY make it read-only: the end of a receive.
 */
#define BUTTER_RECEIVED_RDONLY 0x1u
int butter_subvol_set_received(struct butter_fs *fs, uint64_t id, const uint8_t uuid[16],
			       uint64_t stransid, unsigned flags);

/* ---- open files ----------------------------------------------------------- */
/*
 * POSIX keeps a file whose last name is removed alive while it is open. A
 * front end that holds files open (the FUSE daemon) reports each open with
 * butter_open_ref() and each close with butter_release(). When the last name
 * of an open inode goes (unlink, rmdir, rename over it), the inode stays,
 * readable and writable, with nlink 0 and an ORPHAN_ITEM, as the kernel
 * keeps it; the last release frees it with its data. After a crash the
 * orphan item is on disk, and the next read-write open (ours or the
 * kernel's) frees the inode. butter_close() frees orphans still open.
 * On a read-only handle both calls do nothing and return 0.
 */

/* Count one open of @ino. -ENOMEM. */
int butter_open_ref(struct butter_fs *fs, butter_ino_t ino);

/*
 * With this flag butter_release() changes nothing on disk: if the call would
 * free an orphan it returns 1 and counts nothing, and the caller repeats it
 * without the flag where changes may run (for front ends that keep reads
 * and changes apart).
 */
#define BUTTER_RELEASE_NOFREE 0x1u

/*
 * Drop one open of @ino; the last one of an orphan frees it (a change).
 * Returns 0, 1 (BUTTER_RELEASE_NOFREE, see above), -EINVAL if @ino has no
 * opens, or the error of freeing it (the orphan then stays for the next open).
 */
int butter_release(struct butter_fs *fs, butter_ino_t ino, unsigned flags);

/* ---- making filesystems ------------------------------------------------- */

/* Profile values for butter_mkfs_opts (0 means the mkfs.btrfs default). */
#define BUTTER_PROFILE_SINGLE (1ULL << 48)

/* Parse "single", "dup", "raid0", "raid1", "raid1c3", "raid1c4", "raid10", "raid5", "raid6". */
int butter_profile_parse(const char *name, uint64_t *profile);

/* Parse "crc32c", "xxhash" (or "xxhash64"), "sha256", "blake2" (or "blake2b"). */
int butter_csum_parse(const char *name, int *csum_type);

struct butter_mkfs_opts {
	const char *const *devices; /* one or more image files or block devices (the caller's) */
	size_t ndevices;
	const char *label;          /* NULL: none (the caller's) */
	uint64_t data_profile;      /* 0: single */
	uint64_t meta_profile;      /* 0: dup on one device, raid1 on several */
	uint32_t nodesize;          /* 0: 16384 */
	uint32_t sectorsize;        /* 0: 4096 */
	int csum_type;              /* -1: crc32c */
	uint64_t size;              /* bytes per device; 0: the device's size */
	int force;                  /* overwrite an existing filesystem */
	int mixed;                  /* mixed block groups (DATA|METADATA, mkfs.btrfs -M):
				     * nodesize = sectorsize, one profile for both */
	butter_log_fn log;
	void *log_arg;
};

/*
 * Create an empty btrfs filesystem (features as current mkfs.btrfs: skinny
 * metadata, extended iref, no-holes, free space tree). Regular files are
 * created or grown to opts->size. -EEXIST if a device holds a filesystem and
 * !force; -ENOSPC if a device is too small; -EOPNOTSUPP for raid5/6 (not yet).
 */
int butter_mkfs(const struct butter_mkfs_opts *opts);

/* ---- preallocation and reflink -------------------------------------------- */

/*
 * fallocate(2) on the regular file @ino, @mode holding Linux FALLOC_FL_*
 * bits: 0 or KEEP_SIZE (0x01) preallocate the holes of [off, off+len)
 * (unwritten extents that read as zeros; i_size grows unless KEEP_SIZE);
 * PUNCH_HOLE|KEEP_SIZE (0x03) deallocates the range (edge sectors are zeroed);
 * ZERO_RANGE (0x10, with or without KEEP_SIZE) makes the range read as zeros
 * and be allocated. Errors as the kernel gives them: -EINVAL (len 0),
 * -EOPNOTSUPP (another mode, or PUNCH_HOLE without KEEP_SIZE), -EISDIR,
 * -ESPIPE (fifo), -ENODEV (not a regular file), -EFBIG, -ENOSPC, -EROFS.
 */
int butter_fallocate(struct butter_fs *fs, butter_ino_t ino, int mode, uint64_t off,
		     uint64_t len);

/*
 * Reflink [src_off, src_off+len) of @src into @dst at @dst_off, sharing the
 * data extents (FICLONERANGE; @len 0 means to the end of @src). Both may be
 * the same file (the ranges must not overlap) and may sit in different
 * subvolumes. Offsets must be sector-aligned and so must @len unless the
 * range ends at @src's end, which then may only land at or past @dst's end.
 * -EINVAL for any of these, for a range past @src's end and for a NODATASUM
 * mismatch; -EISDIR; -EROFS (read-only subvolume or handle).
 */
int butter_clone_range(struct butter_fs *fs, butter_ino_t src, uint64_t src_off, butter_ino_t dst,
		       uint64_t dst_off, uint64_t len);

/* ---- access times ----------------------------------------------------------- */

/* How reads set atimes (lib/namespace/atime.c), as the kernel's mount options. */
#define BUTTER_ATIME_RELATIME 0x0u  /* relatime: the kernel's default */
#define BUTTER_ATIME_STRICT 0x1u    /* strictatime */
#define BUTTER_ATIME_NEVER 0x2u     /* noatime */
#define BUTTER_ATIME_MODE_MASK 0x3u
#define BUTTER_ATIME_NODIR 0x10u    /* or-ed in: nodiratime */

/*
 * Would a read of @ino now (its data, or a directory's entries) set its atime
 * under @policy? 1 yes, 0 no (also on a read-only handle), negative errno.
 * Changes nothing and takes no lock: a cheap question to ask after a read.
 */
int butter_atime_due(struct butter_fs *fs, butter_ino_t ino, unsigned policy);

/*
 * Record a read of @ino: set its atime (only that) to now if @policy asks for
 * it, decided again under the change lock. Returns 1 if set, 0 if not due or
 * not possible (read-only handle or subvolume, NOATIME inode flag), negative
 * errno.
 */
int butter_touch_atime(struct butter_fs *fs, butter_ino_t ino, unsigned policy);

/* ---- fsync: the tree log ---------------------------------------------------- */

/*
 * Make regular file @ino durable without a commit, as the kernel's fsync
 * does: its inode, names, xattrs, data and checksums go into the tree log
 * (lib/treelog/writer.c), which the kernel or the next read-write butter_open()
 * replays after a crash. Where the log cannot say what changed (directories,
 * renames or unlinks since the last commit, names in new directories, new
 * chunks...), a full commit is made instead, as butter_sync(). @datasync
 * (fdatasync): nothing is written when only times, modes, owners or xattrs
 * changed since the last commit. 0 or negative errno; -EROFS after a failed
 * commit.
 */
int butter_fsync(struct butter_fs *fs, butter_ino_t ino, int datasync);

/*
 * butter_fsync() of @n files in one log sync: one flush sequence for all of
 * them (POSIX has no such call). If any one of them needs a commit, the
 * commit covers all.
 */
int butter_fsync_many(struct butter_fs *fs, const butter_ino_t *inos, size_t n, int datasync);

#ifdef __cplusplus
}
#endif

#endif /* BUTTER_BUTTER_H */
