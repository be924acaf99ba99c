/*
 * claim.c — who may have a device (image file or block device) open at
 * once, and who holds it when an open is refused.
 *
 * Two writers on one filesystem lose each other's commits without a trace,
 * so every device a filesystem opens is claimed with open file description
 * locks (fcntl F_OFD_SETLK) on two bytes of the file itself:
 *
 *   byte 0  "open"        exclusive for a read-write holder, shared for a
 *                         read-only one; held until the descriptor closes.
 *   byte 1  "in service"  taken right after byte 0, in the same mode; a
 *                         holder drops it when it starts closing
 *                         (claim_end_service(), from butter_begin_close()),
 *                         before its last commit, and keeps byte 0 until its
 *                         last write is flushed and the descriptor closed.
 *
 * An opener that cannot take byte 0 looks at byte 1 (F_OFD_GETLK):
 *
 *   byte 1 held  the holder is in service: a read-write open is refused at
 *                once (-EBUSY); a read-only open goes on without a claim,
 *                reading what the holder's last commit left (the holder is
 *                named in a warning), unless BLOCKDEV_OPEN_NO_WRITER, which
 *                refuses it as well;
 *   byte 1 free  the holder is closing (or between its two lock calls): the
 *                opener waits, trying byte 0 every 20 ms for at most
 *                CLAIM_WAIT_SECONDS, and says once whom it waits for
 *                (after 2 s: not for a holder between its locks, nor for the
 *                usual close of a daemon just unmounted). A
 *                holder that takes byte 1 meanwhile turns the wait into the
 *                case above.
 *
 * Rules:
 *  1. The locks belong to the open file description: they go when its last
 *     descriptor closes, also when the holder is killed, and they survive
 *     fork (butter mount daemonizes after opening).
 *  2. OFD locks conflict inside one process too: a second read-write open of
 *     a file in the same process is refused like one from elsewhere.
 *  3. Filesystems without lock support (ENOLCK, EINVAL) are opened unclaimed.
 *  4. Outside this protocol: block devices opened read-write are opened with
 *     O_EXCL as well (file.c), which the kernel refuses while it has the
 *     device mounted; an image file opened read-write is refused while a
 *     loop device backed by it is mounted or held with O_EXCL
 *     (claim_check_loops(): the loop device is tried with O_EXCL and closed
 *     again, so a kernel mount made later is not prevented).
 *  5. A `butter mount` daemon whose mount is already gone from mountinfo
 *     but which still holds byte 1 has not yet noticed its unmount: a
 *     read-write opener gives it up to CLAIM_UNMOUNTED_GRACE_SECONDS to
 *     start closing (and then waits as for any closing holder) instead of
 *     being refused, so `umount; mount` works however fast it is typed.
 *     A holder in service is refused only once it has been seen
 *     CLAIM_REFUSE_POLLS times running (100 ms) as a live process other
 *     than such a daemon: one that is exiting has left /proc/PID/fd before
 *     its locks go, and one that is unmounting may still be listed.
 *
 * An NBD export (nbd.c) has no file of its own to lock: its claim is the
 * same protocol on a lock file named after the URI (nbd_claim() in nbd.c),
 * and its butter mount is found by the URI as mountinfo's source. This
 * guards one machine only, as the file locks do.
 *
 * The holder named in messages is found the way fuser does: the processes
 * with a descriptor on the same file (a link in /proc/PID/fd whose target
 * has the same path, confirmed by st_dev/st_ino), preferring the one whose
 * /proc/PID/fdinfo lists an OFD lock (OFD locks report pid -1 through
 * F_OFD_GETLK); the calling process is named only when it holds the lock
 * itself (rule 2). A `butter mount` is found in
 * /proc/self/mountinfo by its source (fsname=IMAGE) and type fuse.butter; a
 * kernel mount by the device's major:minor or its source (btrfs mounts show
 * an anonymous major:minor).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "device/claim.h"
#include "device/device.h"

#define CLAIM_WAIT_SECONDS 60
#define CLAIM_UNMOUNTED_GRACE_SECONDS 5
#define CLAIM_POLL_NS (20 * 1000 * 1000L)
#define CLAIM_REFUSE_POLLS 5

enum { BYTE_OPEN = 0, BYTE_SERVICE = 1 };

/* Lock one byte of @fd: 0, -EAGAIN when another description holds it, or -errno. */
static int lock_byte(int fd, short type, off_t byte)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1 };

	if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
		return 0;
	return errno == EACCES ? -EAGAIN : -errno;
}

/* How another description holds @byte of @fd: F_UNLCK (free), F_RDLCK, F_WRLCK, or -errno. */
static int byte_holder(int fd, off_t byte)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1 };

	if (fcntl(fd, F_OFD_GETLK, &fl) < 0)
		return -errno;
	return fl.l_type;
}

static int same_file(const struct stat *a, const struct stat *b)
{
	if (S_ISBLK(a->st_mode) || S_ISBLK(b->st_mode))
		return S_ISBLK(a->st_mode) && S_ISBLK(b->st_mode) && a->st_rdev == b->st_rdev;
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* Does /proc/@pid/fdinfo/@fd list an OFD lock? */
static int fd_has_ofd_lock(const char *pid, const char *fd)
{
	char path[600], line[256];
	int found = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%s/fdinfo/%s", pid, fd);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f))
		found = !strncmp(line, "lock:", 5) && strstr(line, "OFDLCK");
	fclose(f);
	return found;
}

/*
 * The process with a descriptor on @real (resolved path, confirmed by @st):
 * another one holding an OFD lock there, else this one if it holds one (a
 * second open of the same file), else another one with it open; 0 if none.
 */
static pid_t find_pid(const char *real, const struct stat *st)
{
	char link[PATH_MAX + 1], path[600];
	pid_t self = getpid(), any = 0, locker = 0;
	int self_locks = 0;
	struct dirent *p, *d;
	DIR *proc, *fds;

	proc = opendir("/proc");
	if (!proc)
		return 0;
	while (!locker && (p = readdir(proc))) {
		if (!isdigit((unsigned char)p->d_name[0]))
			continue;
		snprintf(path, sizeof(path), "/proc/%s/fd", p->d_name);
		fds = opendir(path);
		if (!fds)
			continue;
		while ((d = readdir(fds))) {
			struct stat fst;
			ssize_t n;

			if (d->d_name[0] == '.')
				continue;
			snprintf(path, sizeof(path), "/proc/%s/fd/%s", p->d_name, d->d_name);
			n = readlink(path, link, sizeof(link) - 1);
			if (n <= 0)
				continue;
			link[n] = '\0';
			/* compare names first: stat through every link could block on a stuck mount */
			if (strcmp(link, real) != 0 || stat(path, &fst) < 0 || !same_file(&fst, st))
				continue;
			if (atoi(p->d_name) == self) {
				self_locks |= fd_has_ofd_lock(p->d_name, d->d_name);
				continue;
			}
			if (!any)
				any = (pid_t)atoi(p->d_name);
			if (fd_has_ofd_lock(p->d_name, d->d_name)) {
				locker = (pid_t)atoi(p->d_name);
				break;
			}
		}
		closedir(fds);
	}
	closedir(proc);
	if (locker)
		return locker;
	return self_locks ? self : any;
}

/* The command name of @pid into @buf ("?" if gone). */
static void pid_comm(pid_t pid, char *buf, size_t size)
{
	char path[64];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
	f = fopen(path, "re");
	if (!f || !fgets(buf, (int)size, f))
		snprintf(buf, size, "?");
	else
		buf[strcspn(buf, "\n")] = '\0';
	if (f)
		fclose(f);
}

/* Undo mountinfo's octal escapes (\040 for a space) in place. */
static void unescape(char *s)
{
	char *out = s;

	while (*s) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*out++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 4;
		} else {
			*out++ = *s++;
		}
	}
	*out = '\0';
}

/*
 * The mount point of @st into @buf: a kernel mount of the block device, or a
 * `butter mount` (fuse.butter, or fuse with a "butter#" source) of the file,
 * or (@name not NULL: an NBD URI, which has no file to compare) whose
 * source is @name. 1 if found, 0 if not.
 */
static int find_mount(const struct stat *st, const char *name, char *buf, size_t size)
{
	char *line = NULL;
	size_t cap = 0;
	int found = 0;
	FILE *f = fopen("/proc/self/mountinfo", "re");

	if (!f)
		return 0;
	while (!found && getline(&line, &cap, f) > 0) {
		char *fields[6], *sep, *fstype, *source, *save = NULL;
		unsigned maj, min;
		size_t i;

		sep = strstr(line, " - ");
		if (!sep)
			continue;
		*sep = '\0';
		for (i = 0; i < 6; i++)
			if (!(fields[i] = strtok_r(i ? NULL : line, " ", &save)))
				break;
		if (i < 5)
			continue;
		fstype = strtok_r(sep + 3, " ", &save);
		source = strtok_r(NULL, " \n", &save);
		if (!fstype || !source)
			continue;
		unescape(source);
		if (S_ISBLK(st->st_mode)) {
			struct stat sst;

			/* btrfs shows an anonymous st_dev there: try the source too */
			found = (sscanf(fields[2], "%u:%u", &maj, &min) == 2 &&
				 makedev(maj, min) == st->st_rdev) ||
				(source[0] == '/' && stat(source, &sst) == 0 && same_file(&sst, st));
		} else if (!strcmp(fstype, "fuse.butter") ||
			   (!strcmp(fstype, "fuse") && !strncmp(source, "butter#", 7))) {
			struct stat sst;

			if (!strncmp(source, "butter#", 7))
				source += 7;
			found = name ? strcmp(source, name) == 0
				     : stat(source, &sst) == 0 && same_file(&sst, st);
		}
		if (found) {
			unescape(fields[4]);
			snprintf(buf, size, "%s", fields[4]);
		}
	}
	free(line);
	fclose(f);
	return found;
}

/* claim_describe_holder(), @name as find_mount() takes it. */
static void describe_holder(const char *path, const char *name, const struct stat *st, char *buf,
			    size_t size)
{
	char real[PATH_MAX], comm[64], mnt[PATH_MAX];
	pid_t pid = 0;
	int n = 0;

	buf[0] = '\0';
	if (realpath(path, real))
		pid = find_pid(real, st);
	if (pid == getpid()) {
		n = snprintf(buf, size, "this process (it has the file open already)");
	} else if (pid) {
		pid_comm(pid, comm, sizeof(comm));
		n = snprintf(buf, size, "pid %d (%s)", (int)pid, comm);
	}
	if (n >= 0 && (size_t)n < size && find_mount(st, name, mnt, sizeof(mnt)))
		snprintf(buf + n, size - (size_t)n, "%smounted at %s", n ? ", " : "", mnt);
}

void claim_describe_holder(const char *path, const struct stat *st, char *buf, size_t size)
{
	describe_holder(path, NULL, st, buf, size);
}

/* The holder as claim_describe_holder() says it, or "another program". */
static void holder_phrase(const char *path, const char *name, const struct stat *st, char *buf,
			  size_t size)
{
	char who[PATH_MAX + 128];

	describe_holder(path, name, st, who, sizeof(who));
	snprintf(buf, size, "%s", who[0] ? who : "another program");
}

static double now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * Is the holder of @path a `butter mount` daemon whose mount is gone? After
 * an unmount the kernel has let go of the mount at once, but the daemon
 * learns of it only when its next read of /dev/fuse fails, and drops byte 1
 * after that: an opener that comes in between sees a holder in service.
 * The daemon is told by its command line (`butter mount ...`, or the mount
 * helper mount.fuse.butter); ourselves never. 1: yes; 0: another holder,
 * or a daemon still mounted; -1: no process is found with the file open (the
 * holder is exiting: its descriptors are gone from /proc before its locks).
 */
static int holder_unmounted_daemon(const char *path, const char *name, const struct stat *st)
{
	char real[PATH_MAX], cmd[PATH_MAX + 64], mnt[PATH_MAX];
	pid_t pid = realpath(path, real) ? find_pid(real, st) : 0;
	const char *arg0, *base;
	size_t n = 0;
	FILE *f;

	if (!pid)
		return -1;
	if (pid == getpid())
		return 0;
	snprintf(cmd, sizeof(cmd), "/proc/%d/cmdline", (int)pid);
	f = fopen(cmd, "re");
	if (f) {
		n = fread(cmd, 1, sizeof(cmd) - 1, f);
		fclose(f);
	}
	if (!n)
		return -1; /* gone meanwhile */
	cmd[n] = '\0';
	arg0 = cmd;
	base = strrchr(arg0, '/') ? strrchr(arg0, '/') + 1 : arg0;
	if (strncmp(base, "mount.fuse", 10) != 0 &&
	    !(strlen(arg0) + 1 < n && strcmp(arg0 + strlen(arg0) + 1, "mount") == 0))
		return 0;
	return !find_mount(st, name, mnt, sizeof(mnt));
}

int claim_take(int fd, const char *path, const char *name, const struct stat *st, unsigned flags,
	       const struct blog *log)
{
	const char *said_name = name ? name : path;
	int readonly = !!(flags & BLOCKDEV_OPEN_RDONLY);
	short type = readonly ? F_RDLCK : F_WRLCK;
	char who[PATH_MAX + 160];
	double deadline = 0, grace = 0;
	int ret, said = 0, refuse_seen = 0;

	while ((ret = lock_byte(fd, type, BYTE_OPEN)) != 0) {
		if (ret != -EAGAIN) /* rule 3: no locks here */
			return 0;
		ret = byte_holder(fd, BYTE_SERVICE);
		if (ret < 0)
			return 0;
		if (ret != F_UNLCK) {
			holder_phrase(path, name, st, who, sizeof(who));
			if (readonly && !(flags & BLOCKDEV_OPEN_NO_WRITER)) {
				blog_warn(log, "%s: open read-write by %s; reading it as its last "
					  "commit left it", said_name, who);
				return 0;
			}
			/*
			 * Unmounted, not yet closing: it will drop byte 1 in a moment
			 * (rule 5). What /proc and mountinfo show of a holder that is
			 * unmounting or exiting changes under our feet, so "another
			 * holder" must be seen CLAIM_REFUSE_POLLS times running.
			 */
			if (!grace)
				grace = now_seconds() + CLAIM_UNMOUNTED_GRACE_SECONDS;
			if (now_seconds() < grace) {
				int unmounted = holder_unmounted_daemon(path, name, st);

				refuse_seen = unmounted ? 0 : refuse_seen + 1;
				if (refuse_seen < CLAIM_REFUSE_POLLS) {
					nanosleep(&(struct timespec){ 0, CLAIM_POLL_NS }, NULL);
					continue;
				}
			}
			blog_err(log, "%s: in use: open %s by %s", said_name,
				 ret == F_RDLCK ? "read-only" : "read-write", who);
			return -EBUSY;
		}
		if (!deadline) {
			deadline = now_seconds() + CLAIM_WAIT_SECONDS;
		} else if (!said && now_seconds() > deadline - CLAIM_WAIT_SECONDS + 2) {
			/*
			 * said after 2 s: not for a holder between its two lock calls,
			 * nor for the usual close of a mount unmounted just before
			 * (umount returns before its daemon has exited)
			 */
			char real[PATH_MAX], comm[64];
			pid_t pid = realpath(path, real) ? find_pid(real, st) : 0;

			pid_comm(pid, comm, sizeof(comm));
			if (pid)
				blog_warn(log, "waiting for %d (%s) to finish closing %s", (int)pid,
					  comm, said_name);
			else
				blog_warn(log, "waiting for its holder to finish closing %s",
					  said_name);
			said = 1;
		} else if (now_seconds() > deadline) {
			holder_phrase(path, name, st, who, sizeof(who));
			blog_err(log, "%s: in use: %s is still closing it after %d s", said_name,
				 who, CLAIM_WAIT_SECONDS);
			return -EBUSY;
		}
		nanosleep(&(struct timespec){ 0, CLAIM_POLL_NS }, NULL);
	}
	/* Byte 0 is ours; byte 1 is then free, or shared by readers as ours will be. */
	lock_byte(fd, type, BYTE_SERVICE);
	return 0;
}

void claim_end_service(int fd)
{
	struct flock fl = { .l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = BYTE_SERVICE,
			    .l_len = 1 };

	fcntl(fd, F_OFD_SETLK, &fl);
}

int claim_check_loops(const char *path, const struct stat *st, const struct blog *log)
{
	struct dirent *e;
	DIR *dir;
	int ret = 0;

	dir = opendir("/sys/block");
	if (!dir)
		return 0;
	while (ret == 0 && (e = readdir(dir))) {
		char sys[PATH_MAX], backing[PATH_MAX], dev[300];
		struct stat bst, lst;
		ssize_t n;
		FILE *f;
		int fd;

		if (strncmp(e->d_name, "loop", 4) || !isdigit((unsigned char)e->d_name[4]))
			continue;
		snprintf(sys, sizeof(sys), "/sys/block/%s/loop/backing_file", e->d_name);
		f = fopen(sys, "re");
		if (!f)
			continue; /* not attached */
		n = fgets(backing, sizeof(backing), f) ? (ssize_t)strcspn(backing, "\n") : 0;
		fclose(f);
		backing[n] = '\0';
		if (!n || stat(backing, &bst) < 0 || !same_file(&bst, st))
			continue;
		snprintf(dev, sizeof(dev), "/dev/%s", e->d_name);
		fd = open(dev, O_RDONLY | O_EXCL | O_CLOEXEC);
		if (fd >= 0) {
			close(fd);
			continue;
		}
		if (errno != EBUSY)
			continue;
		ret = -EBUSY;
		if (stat(dev, &lst) == 0) {
			char who[PATH_MAX + 128];

			claim_describe_holder(dev, &lst, who, sizeof(who));
			blog_err(log, "%s: in use: attached to %s, which is %s", path, dev,
				 who[0] ? who : "held exclusively (mounted?)");
		} else {
			blog_err(log, "%s: in use: attached to %s, which is busy", path, dev);
		}
	}
	closedir(dir);
	return ret;
}
