/*
 * cmd_umount.c — `butter umount MOUNTPOINT`: unmount a `butter mount` and
 * return only once its daemon has committed, let go of the devices and
 * exited, so the image is final when the command returns (umount(8) and
 * `fusermount3 -u` return as soon as the kernel has let go of the mount,
 * while the daemon still commits).
 *
 * The steps, in this order:
 *  1. BUTTER_IOC_DAEMON_INFO on MOUNTPOINT: the daemon's pid (and a check
 *     that MOUNTPOINT is a butter mount); pidfd_open() holds on to that very
 *     process from here on, whatever pid reuse may follow. A daemon in
 *     another pid namespace (its pid means another process here) is not
 *     waited for: that is reported and the exit status is 1.
 *  2. syncfs(): the kernel's dirty pages (writeback cache) reach the daemon.
 *  3. BUTTER_IOC_SYNC: the daemon commits; a failure is reported and makes
 *     the exit status 1 (the unmount goes on: the image keeps its last
 *     committed state either way).
 *  4. umount2() as root, else `fusermount3 -u`: the kernel ends the FUSE
 *     connection; the daemon then makes its final commit (of what changed
 *     after step 3, if anything) and closes the devices.
 *  5. poll() on the pidfd until the daemon has exited, saying so while it
 *     takes longer than a second, at most --timeout seconds.
 * The daemon is not our child, so its exit status is out of reach; a final
 * commit that fails is in the daemon's log (syslog or its log file).
 *
 * Exit status 0: unmounted, committed, daemon gone; 1 otherwise (each step
 * that failed is reported); 2 for usage errors.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <butter/control.h>

#include "cli.h"

#define DEFAULT_WAIT_SECS 300
#define QUIET_WAIT_MS 1000 /* say nothing while the daemon exits this fast */

static int pidfd_open_of(pid_t pid)
{
#ifdef SYS_pidfd_open
	return (int)syscall(SYS_pidfd_open, pid, 0);
#else
	(void)pid;
	errno = ENOSYS;
	return -1;
#endif
}

/* Is @pidns (the daemon's, 0: unknown) ours, so that its pid names the same process here? */
static bool same_pid_namespace(uint64_t pidns)
{
	struct stat st;

	return pidns == 0 || stat("/proc/self/ns/pid", &st) < 0 || (uint64_t)st.st_ino == pidns;
}

/* Run `fusermount3 -u @mnt`; 0, or -1 (fusermount3 said why on stderr). */
static int fusermount_unmount(const char *mnt)
{
	int wstatus;
	pid_t pid = fork();

	if (pid < 0) {
		cli_error("fork: %s", strerror(errno));
		return -1;
	}
	if (pid == 0) {
		execlp("fusermount3", "fusermount3", "-u", "--", mnt, (char *)NULL);
		cli_error("fusermount3: %s", strerror(errno));
		_exit(127);
	}
	while (waitpid(pid, &wstatus, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0 ? 0 : -1;
}

/* Wait up to @secs for the process behind @pidfd to exit; 0 or -1 (reported). */
static int wait_for_exit(int pidfd, pid_t pid, const char *mnt, unsigned secs)
{
	struct timespec start, now;
	bool said = false;

	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		struct pollfd p = { .fd = pidfd, .events = POLLIN };
		long elapsed_ms;
		int n;

		clock_gettime(CLOCK_MONOTONIC, &now);
		elapsed_ms = (now.tv_sec - start.tv_sec) * 1000 +
			     (now.tv_nsec - start.tv_nsec) / 1000000;
		if (elapsed_ms >= (long)secs * 1000) {
			cli_error("%s: the daemon (pid %d) is still running after %u s; the image "
				  "is final only once it has exited", mnt, (int)pid, secs);
			return -1;
		}
		if (!said && elapsed_ms >= QUIET_WAIT_MS) {
			fprintf(stderr, "butter umount: %s: waiting for the daemon (pid %d) to "
					"commit and exit\n", mnt, (int)pid);
			said = true;
		}
		n = poll(&p, 1, said ? 1000 : QUIET_WAIT_MS);
		if (n > 0)
			return 0;
		if (n < 0 && errno != EINTR) {
			cli_error("poll: %s", strerror(errno));
			return -1;
		}
	}
}

/*
 * Is a filesystem of device number @dev still mounted somewhere (another
 * mount of the same FUSE connection: a bind of it, or the mount a second
 * `butter mount` of the image bound)? Then its daemon goes on serving it.
 */
static bool still_mounted(dev_t dev)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char line[4096];
	bool found = false;

	if (!f)
		return false;
	while (!found && fgets(line, sizeof(line), f)) {
		unsigned maj, min;

		if (sscanf(line, "%*u %*u %u:%u", &maj, &min) == 2 && makedev(maj, min) == dev)
			found = true;
	}
	fclose(f);
	return found;
}

int cmd_umount(const struct cli_command *cmd, int argc, char **argv)
{
	enum { OPT_TIMEOUT = 't' };
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ 0 },
	};
	struct cli_args args = { .cmd = cmd };
	struct butter_ioc_daemon_info info;
	unsigned secs = DEFAULT_WAIT_SECS;
	int c, fd, pidfd, ret, status = CLI_EXIT_OK;
	struct stat mst;
	dev_t mnt_dev = 0;
	const char *mnt;

	while ((c = cli_getopt(&args, argc, argv, ":ht:", longopts)) != -1) {
		if (c == OPT_TIMEOUT) {
			char *end;
			unsigned long v = strtoul(optarg, &end, 10);

			if (*optarg == '\0' || *end != '\0' || v == 0 || v > 86400) {
				free(args.devices);
				return cli_usage_error(cmd, "bad --timeout (seconds, 1 to 86400)");
			}
			secs = (unsigned)v;
		}
	}
	free(args.devices);
	if (argc - optind != 1)
		return cli_usage_error(cmd, optind >= argc ? "missing MOUNTPOINT"
							   : "too many arguments");
	mnt = argv[optind];

	fd = open(mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		cli_error("%s: %s", mnt, strerror(errno));
		return CLI_EXIT_ERROR;
	}
	memset(&info, 0, sizeof(info));
	if (fstat(fd, &mst) == 0)
		mnt_dev = mst.st_dev;
	if (ioctl(fd, BUTTER_IOC_DAEMON_INFO, &info) < 0) {
		cli_error("%s: %s", mnt,
			  errno == ENOTTY || errno == EINVAL || errno == ENOSYS
				  ? "not a butter mount (or its daemon is older than butter umount)"
				  : strerror(errno));
		close(fd);
		return CLI_EXIT_ERROR;
	}
	if (!same_pid_namespace(info.pidns)) {
		cli_error("%s: the daemon runs in another pid namespace; not waiting for it to exit",
			  mnt);
		pidfd = -1;
	} else {
		pidfd = pidfd_open_of((pid_t)info.pid);
		if (pidfd < 0)
			cli_error("%s: cannot watch the daemon (pid %d): %s; not waiting for it "
				  "to exit", mnt, (int)info.pid, strerror(errno));
	}

	if (syncfs(fd) < 0) {
		cli_error("%s: syncfs: %s", mnt, strerror(errno));
		status = CLI_EXIT_ERROR;
	}
	if (ioctl(fd, BUTTER_IOC_SYNC) < 0) {
		cli_error("%s: commit failed: %s", mnt, strerror(errno));
		status = CLI_EXIT_ERROR;
	} else if (info.flags & BUTTER_DAEMON_FAILED) {
		cli_error("%s: an earlier commit failed; the image holds the last committed state",
			  mnt);
		status = CLI_EXIT_ERROR;
	}
	close(fd);

	/*
	 * The kernel sends the release of a FUSE file closed just now (our fd
	 * above, a command's that exited) in the background and keeps the mount
	 * busy until the daemon answers it: EBUSY is asked again for a second.
	 */
	for (int tries = 0;; tries++) {
		if (geteuid() != 0) {
			ret = fusermount_unmount(mnt); /* it says why itself */
			break;
		}
		ret = umount2(mnt, UMOUNT_NOFOLLOW);
		if (ret == 0 || errno != EBUSY || tries == 20)
			break;
		usleep(50 * 1000);
	}
	if (ret < 0) {
		if (geteuid() == 0)
			cli_error("%s: %s", mnt,
				  errno == EINVAL ? "not a mount point (give the mount's top directory)"
				  : errno == EBUSY ? "busy (files open or a process inside): not unmounted"
						   : strerror(errno));
		if (pidfd >= 0)
			close(pidfd);
		return CLI_EXIT_ERROR;
	}
	if (still_mounted(mnt_dev)) {
		/* the daemon serves its other mounts: nothing to wait for */
		if (pidfd >= 0)
			close(pidfd);
		return status;
	}
	if (pidfd >= 0) {
		if (wait_for_exit(pidfd, (pid_t)info.pid, mnt, secs) < 0)
			status = CLI_EXIT_ERROR;
		close(pidfd);
	} else {
		status = CLI_EXIT_ERROR;
	}
	return status;
}
