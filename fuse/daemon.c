/*
 * daemon.c — `butter mount`: open the filesystem, mount it through the FUSE
 * low-level API, serve requests on many threads, and on the way out commit
 * and close.
 *
 * The life of a daemon:
 *
 *   parse options -> butter_open -> pick the root subvolume -> fuse_session_new
 *     -> open the log file (open_log; without -f) -> fuse_session_mount
 *     -> fuse_daemonize (returns in the child; the parent
 *     exits 0 once the mount is live; -f stays in the foreground)
 *     -> start the signal and commit threads -> session loop (multithreaded;
 *     -s: one thread)
 *   the loop returns when the kernel ends the connection (umount, fusermount3
 *   -u) or after a signal (below)
 *     -> butter_begin_close (a new opener of the devices waits for us)
 *     -> stop the threads -> fuse_session_unmount -> butter_sync (unless
 *     read-only) -> butter_close
 *
 * Threads:
 *   main      runs the session loop (libfuse starts and cancels the workers)
 *   workers   one request each at a time (ops.c); SIGINT/SIGTERM/SIGHUP are
 *             blocked in every thread but arrive through sigwait below
 *   signal    waits for SIGINT, SIGTERM or SIGHUP; then syncfs() on the mount
 *             point, so the kernel writes back what it holds in its writeback
 *             cache while requests are still served, then ends the session
 *             (fuse_session_exit) and wakes the main thread with SIGUSR1
 *             (a no-op handler: it only interrupts the loop's wait), again
 *             every 50 ms until the loop has returned, so a wake-up that lands
 *             just before the wait is not lost
 *   commit    about a second after changes stop, and at most commit=SECONDS
 *             (30) after a change, calls butter_sync() (below); started for
 *             read-only mounts too (a remount may make them writable)
 *
 * After `fusermount3 -u` or umount returns, the daemon still commits and
 * closes: the image is final when the daemon process has exited, which is
 * what `butter umount` waits for (cli/cmd_umount.c, BUTTER_IOC_DAEMON_INFO).
 * A commit that fails leaves the library's handle refusing changes (-EROFS):
 * the daemon says so once (daemon_commit_failed), refuses writable opens and
 * keeps serving reads.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "trace.h"
#include "uring.h"
#include "mount.h"

#define BTRFS_FIRST_FREE_OBJECTID 256u /* a subvolume's root directory */
#define DEFAULT_ROOT_LOG "/var/log/butter.log" /* messages of root's daemons without syslog */

const char butter_mount_summary[] = "mount a filesystem through FUSE (the daemon)";
const char butter_mount_synopsis[] = "[-f] [-d] [-s] [-o OPTION[,OPTION]...] [--device DEV]... "
				     "DEV... MOUNTPOINT";
const char butter_mount_usage[] =
	"Mount the btrfs filesystem on the image files, block devices or NBD URIs\n"
	"(nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH) DEV... at\n"
	"MOUNTPOINT, read-write unless -o ro. Without -f the daemon goes to the\n"
	"background once the mount is live. `butter umount MOUNTPOINT` unmounts and\n"
	"returns once the daemon has committed and exited. `fusermount3 -u`, umount\n"
	"and SIGTERM/SIGINT/SIGHUP to the daemon unmount too, but return while the\n"
	"daemon still commits: the image is final when the process is gone.\n"
	"\n"
	"  -f             stay in the foreground (messages on stderr)\n"
	"  -d             print every FUSE request (implies -f)\n"
	"  -s             serve requests on one thread\n"
	"  -o OPTIONS     comma-separated mount options:\n"
	"\n"
	"  btrfs options\n"
	"    ro, rw                     read-only (the devices are never written) or\n"
	"                               read-write (the default)\n"
	"    remount,ro  remount,rw     switch the live mount at MOUNTPOINT (root;\n"
	"                               what `mount -o remount,ro MOUNTPOINT` runs):\n"
	"                               read-only commits first and fails while files\n"
	"                               are open for writing; no daemon is started\n"
	"    subvol=PATH, subvolid=ID   mount this subvolume (default: the default\n"
	"                               subvolume); both must name the same one\n"
	"    device=DEV                 another member of the filesystem (repeatable)\n"
	"    degraded                   mount with missing devices where the\n"
	"                               profiles allow it (read-write: new chunks\n"
	"                               go to the devices present)\n"
	"    skip_balance               do not resume a balance recorded on disk\n"
	"    write_buffer=SIZE          file data held in memory before it gets its\n"
	"                               extents (delayed allocation: large extents,\n"
	"                               fsync writes only its file); 0: write at\n"
	"                               once (default: 1/16 of RAM, at most 1G)\n"
	"    max_inline=SIZE            files up to SIZE bytes are stored in the\n"
	"                               metadata (default 2048, at most a sector\n"
	"                               less one byte; 0: none), as the kernel's\n"
	"    commit=SECONDS             commit a change at most this long after it\n"
	"                               (default 30); changes are also committed\n"
	"                               about 1 s after they stop\n"
	"    compress[=ALGO], compress-force[=ALGO]\n"
	"                               compress new data: zlib[:1-9], lzo, zstd[:1-15]\n"
	"    noatime, relatime, strictatime, nodiratime\n"
	"                               when reads set access times (default:\n"
	"                               relatime, as the kernel's btrfs)\n"
	"  access\n"
	"    allow_other                let other users in (see /etc/fuse.conf);\n"
	"                               permissions are checked all the same\n"
	"    no_permission_checks       check no mode bits and no ACLs: every user\n"
	"                               the mount lets in may read and change every\n"
	"                               file (default: the kernel checks both, as\n"
	"                               on btrfs; default_permissions is accepted)\n"
	"  FUSE performance\n"
	"    writeback_cache, no_writeback_cache\n"
	"                               let the kernel gather writes in its page cache\n"
	"                               (default: on when read-write)\n"
	"    killpriv_v2, no_killpriv_v2\n"
	"                               the daemon clears setuid/setgid on write,\n"
	"                               truncate and chown (FUSE_HANDLE_KILLPRIV_V2),\n"
	"                               sparing a security.capability lookup at\n"
	"                               every write (default: on when the kernel\n"
	"                               offers it)\n"
	"    keep_cache, no_keep_cache  keep the kernel's cache of a file across opens\n"
	"                               while the file is unchanged (default: on)\n"
	"    max_write=BYTES            largest write request (default and most: 1 MiB)\n"
	"    max_readahead=BYTES        kernel read-ahead limit\n"
	"    attr_timeout=S, entry_timeout=S\n"
	"                               how long the kernel trusts attributes and\n"
	"                               names, missing names too (default 86400:\n"
	"                               every change goes through the kernel)\n"
	"    max_threads=N              most request threads\n"
	"    spin=US                    after each reply, keep reading requests for US\n"
	"                               microseconds before sleeping (one thread at a\n"
	"                               time; faster round trips on VMs for some CPU;\n"
	"                               default 50; 0: libfuse's own loop)\n"
	"    uring, no_uring            FUSE over io_uring: requests and replies pass\n"
	"                               through ring entries served on each CPU (Linux\n"
	"                               6.14+ with the fuse module's enable_uring=Y;\n"
	"                               else a warning and /dev/fuse; default: off)\n"
	"  messages\n"
	"    log=FILE                   where the daemon in the background writes its\n"
	"                               messages (one line each, with time and pid)\n"
	"    trace=FILE                 record the first read of each file range, in\n"
	"                               order, for `butter layout --trace FILE`\n"
	"  Any other option (noatime, nodev, nosuid, fsname=, ...) goes to libfuse.\n"
	"\n"
	"Messages go to stderr until the daemon is in the background (always with\n"
	"-f), then to log=FILE if given, else to syslog if /dev/log answers, else to\n"
	"" DEFAULT_ROOT_LOG " (root) or $XDG_STATE_HOME/butter.log, by default\n"
	"~/.local/state/butter.log (other users).\n"
	"\n"
	"Inode numbers are unique across subvolumes (st_ino is not btrfs's inode\n"
	"number outside the top-level subvolume), so tar, du and find see no false\n"
	"hard links between snapshots.\n";

void butter_mount_print_usage(FILE *out)
{
	fprintf(out, "usage: butter mount %s\n\n%s", butter_mount_synopsis, butter_mount_usage);
	fprintf(out, "\n  --device DEV   another member of a multi-device filesystem (repeatable)\n"
		     "  -h, --help     show this help\n");
}

/* ---- messages -------------------------------------------------------------- */

/*
 * Where messages go (so that someone sees them, a failed final commit
 * above all):
 *  1. until the daemon goes to the background, and always with -f: stderr;
 *  2. in the background with -o log=FILE: FILE;
 *  3. in the background without it: syslog, when /dev/log takes a
 *     connection (glibc's syslog() drops messages silently without one,
 *     as in containers and CI), else the default file: DEFAULT_ROOT_LOG for
 *     root, $XDG_STATE_HOME/butter.log or ~/.local/state/butter.log for
 *     anyone else.
 * A file gets one line per message, "TIME butter[PID]: LEVEL: message",
 * written by one write(2) on an O_APPEND descriptor, so lines of several
 * threads (or daemons) never mix.
 */
static const char *const level_names[] = { "error", "warning", "info", "debug" };

static void write_log_line(int fd, int level, const char *msg)
{
	char line[1200], stamp[64], zone[8];
	struct timespec ts;
	struct tm tm;
	int n;

	clock_gettime(CLOCK_REALTIME, &ts);
	localtime_r(&ts.tv_sec, &tm);
	strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &tm);
	strftime(zone, sizeof(zone), "%z", &tm);
	n = snprintf(line, sizeof(line), "%s.%03ld%s butter[%d]: %s: %s\n", stamp,
		     ts.tv_nsec / 1000000, zone, (int)getpid(), level_names[level], msg);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(line)) {
		n = sizeof(line) - 1;
		line[n - 1] = '\n';
	}
	if (write(fd, line, (size_t)n) < 0)
		return; /* nowhere left to say it */
}

__attribute__((format(printf, 3, 0)))
static void vlog(struct daemon *d, int level, const char *fmt, va_list ap)
{
	static const int prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };
	char msg[1024];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	if (level < 0)
		level = 0;
	if (level > BUTTER_LOG_DEBUG)
		level = BUTTER_LOG_DEBUG;
	if (d && d->daemonized && d->log_fd >= 0)
		write_log_line(d->log_fd, level, msg);
	else if (d && d->daemonized)
		syslog(prio[level], "%s", msg);
	else
		fprintf(stderr, "butter: %s\n", msg);
}

void daemon_log(struct daemon *d, int level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(d, level, fmt, ap);
	va_end(ap);
}

/* Does a syslog daemon listen on /dev/log (datagram or stream, as glibc tries)? */
static bool syslog_reachable(void)
{
	static const int types[] = { SOCK_DGRAM, SOCK_STREAM };
	struct sockaddr_un addr = { .sun_family = AF_UNIX, .sun_path = "/dev/log" };

	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		int fd = socket(AF_UNIX, types[i] | SOCK_CLOEXEC, 0);
		bool ok;

		if (fd < 0)
			continue;
		ok = connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0;
		close(fd);
		if (ok)
			return true;
	}
	return false;
}

/* The default log file of a user other than root (rule 3); malloc'ed, or NULL. */
static char *user_log_path(void)
{
	const char *state = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
	char *path = NULL, *dir;

	if (state && state[0] == '/') {
		if (asprintf(&path, "%s/butter.log", state) < 0)
			return NULL;
	} else {
		if (!home || home[0] != '/') {
			struct passwd *pw = getpwuid(geteuid());

			home = pw ? pw->pw_dir : NULL;
		}
		if (!home || asprintf(&path, "%s/.local/state/butter.log", home) < 0)
			return NULL;
		if (asprintf(&dir, "%s/.local", home) >= 0) {
			mkdir(dir, 0700);
			free(dir);
		}
	}
	dir = strdup(path);
	if (dir) {
		*strrchr(dir, '/') = '\0';
		mkdir(dir, 0700);
		free(dir);
	}
	return path;
}

/*
 * Choose where messages go once in the background (rules 2 and 3) and open
 * the file, while stderr can still say why not. -errno if -o log=FILE cannot
 * be opened; a default file that cannot be opened is only reported.
 */
static int open_log(struct daemon *d)
{
	const char *path = d->opts->log_file;
	char *user_path = NULL;
	int ret = 0;

	d->log_fd = -1;
	if (!path) {
		if (syslog_reachable())
			return 0;
		path = geteuid() == 0 ? DEFAULT_ROOT_LOG : (user_path = user_log_path());
		if (!path) {
			daemon_log(d, BUTTER_LOG_WARNING, "no syslog and no home directory: "
				   "messages of the daemon will be lost (give -o log=FILE)");
			return 0;
		}
	}
	d->log_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0600);
	if (d->log_fd < 0) {
		ret = -errno;
		daemon_log(d, BUTTER_LOG_ERROR, "log file %s: %s%s", path, strerror(-ret),
			   d->opts->log_file ? "" : " (no syslog either: messages will be lost)");
		if (!d->opts->log_file)
			ret = 0;
	}
	free(user_path);
	return ret;
}

/*
 * libfuse's own messages (fuse_log) once in the background, where its
 * default (stderr) is /dev/null. Its callback takes no argument, so the one
 * daemon of this process is kept here (set once daemonized, cleared before
 * it goes away).
 */
static struct daemon *fuse_log_daemon;

__attribute__((format(printf, 2, 0)))
static void fuse_log_to_daemon(enum fuse_log_level level, const char *fmt, va_list ap)
{
	char msg[1024];
	size_t n;
	int ours = level <= FUSE_LOG_ERR       ? BUTTER_LOG_ERROR
		   : level == FUSE_LOG_WARNING ? BUTTER_LOG_WARNING
		   : level == FUSE_LOG_DEBUG   ? BUTTER_LOG_DEBUG
					       : BUTTER_LOG_INFO;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n && msg[n - 1] == '\n')
		msg[--n] = '\0';
	if (fuse_log_daemon)
		daemon_log(fuse_log_daemon, ours, "libfuse: %s", msg);
}

/* The library's log callback. */
static void library_log(void *arg, int level, const char *msg)
{
	daemon_log(arg, level, "%s", msg);
}

/* ---- the commit thread -------------------------------------------------------- */

/*
 * When changes reach the disk. A change is any request that changes the
 * filesystem (ops.c change_begin(), fsync.c, control.c note it through
 * daemon_note_change()). The commit thread commits
 *  1. IDLE_COMMIT_MS after the last change, once changes stop, so that what a
 *     program wrote and `sync` pushed out (sync(2) never reaches a FUSE
 *     daemon: the kernel only writes its dirty pages back to us) is on disk
 *     about a second later;
 *  2. commit= seconds after the first change of a stream that never pauses;
 *  3. never while nothing changed: an idle mount is not written.
 * Only the first change after a commit takes the lock and wakes the thread;
 * every other one stores a time and a flag (two atomics on the write path).
 */
#define IDLE_COMMIT_MS 1000

struct committer {
	struct daemon *d;
	unsigned secs;
	pthread_mutex_t lock;
	pthread_cond_t wake;        /* signalled to stop, or at the first change */
	bool stop;                  /* protected by lock */
	int64_t first_change_ns;    /* protected by lock: first change since the last commit */
	atomic_bool dirty;          /* a change since the commit thread last started a commit */
	atomic_int_least64_t last_change_ns; /* CLOCK_MONOTONIC of the latest change */
	pthread_t thread;
	bool running;
};

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static struct timespec ns_to_timespec(int64_t ns)
{
	struct timespec ts = { (time_t)(ns / 1000000000), (long)(ns % 1000000000) };

	return ts;
}

void daemon_note_change(struct daemon *d)
{
	struct committer *c = d->committer;
	int64_t now;

	if (!c)
		return;
	now = now_ns();
	atomic_store(&c->last_change_ns, now);
	if (atomic_load(&c->dirty) || atomic_exchange(&c->dirty, true))
		return;
	pthread_mutex_lock(&c->lock);
	c->first_change_ns = now;
	pthread_cond_signal(&c->wake);
	pthread_mutex_unlock(&c->lock);
}

void daemon_commit_failed(struct daemon *d, int err)
{
	if (atomic_exchange(&d->commit_failed, true))
		return;
	daemon_log(d, BUTTER_LOG_ERROR,
		   "%s: commit failed: %s; the mount is read-only from now on (changes fail "
		   "with EROFS), the image keeps its last committed state",
		   d->opts->mountpoint, strerror(-err));
}

/* When the changes noted so far are due on disk (rules 1 and 2 above); lock held. */
static int64_t commit_due_ns(struct committer *c)
{
	int64_t idle = atomic_load(&c->last_change_ns) + (int64_t)IDLE_COMMIT_MS * 1000000;
	int64_t bound = c->first_change_ns + (int64_t)c->secs * 1000000000;

	return idle < bound ? idle : bound;
}

static void *commit_main(void *arg)
{
	struct committer *c = arg;

	pthread_mutex_lock(&c->lock);
	while (!c->stop) {
		if (!atomic_load(&c->dirty)) {
			pthread_cond_wait(&c->wake, &c->lock);
			continue;
		}
		int64_t due = commit_due_ns(c);

		if (now_ns() < due) {
			struct timespec deadline = ns_to_timespec(due);

			pthread_cond_timedwait(&c->wake, &c->lock, &deadline);
			continue; /* a later change may have moved the time */
		}
		/* changes from here on mark the mount dirty again */
		atomic_store(&c->dirty, false);
		pthread_mutex_unlock(&c->lock);
		int ret = butter_sync(c->d->fs);
		if (ret)
			daemon_commit_failed(c->d, ret);
		pthread_mutex_lock(&c->lock);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

static int committer_start(struct committer *c, struct daemon *d, unsigned secs)
{
	pthread_condattr_t attr;
	int ret;

	memset(c, 0, sizeof(*c));
	c->d = d;
	c->secs = secs;
	atomic_init(&c->dirty, false);
	atomic_init(&c->last_change_ns, 0);
	pthread_mutex_init(&c->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&c->wake, &attr);
	pthread_condattr_destroy(&attr);
	ret = pthread_create(&c->thread, NULL, commit_main, c);
	c->running = ret == 0;
	if (c->running)
		d->committer = c;
	return -ret;
}

static void committer_stop(struct committer *c)
{
	if (c->running) {
		c->d->committer = NULL;
		pthread_mutex_lock(&c->lock);
		c->stop = true;
		pthread_cond_signal(&c->wake);
		pthread_mutex_unlock(&c->lock);
		pthread_join(c->thread, NULL);
		c->running = false;
	}
	pthread_cond_destroy(&c->wake);
	pthread_mutex_destroy(&c->lock);
}

/* ---- signals --------------------------------------------------------------------- */

static void on_wake(int sig)
{
	(void)sig;
}

static void exit_signals(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGTERM);
	sigaddset(set, SIGHUP);
}

static void *signal_main(void *arg)
{
	struct daemon *d = arg;
	const struct timespec pause = { 0, 50 * 1000 * 1000 };
	sigset_t set;
	int sig = 0, fd;

	exit_signals(&set);
	while (sigwait(&set, &sig) != 0)
		;
	if (atomic_load(&d->loop_done))
		return NULL; /* woken by the main thread: the loop is over */
	daemon_log(d, BUTTER_LOG_INFO, "%s: writing back, then unmounting %s", strsignal(sig),
		   d->opts->mountpoint);
	fd = open(d->opts->mountpoint, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		/*
		 * One syncfs can miss pages dirtied just before it (seen on Linux
		 * 6.18: it returned 0 and sent nothing for a file written the
		 * moment before): again, 20 ms later, until one sends no write.
		 */
		const struct timespec gap = { 0, 20 * 1000 * 1000 };
		unsigned long seen;

		for (int round = 0; round < 10; round++) {
			seen = atomic_load(&d->writes_served);
			syncfs(fd);
			nanosleep(&gap, NULL);
			syncfs(fd);
			if (round && atomic_load(&d->writes_served) == seen)
				break;
		}
		close(fd);
	}
	fuse_session_exit(d->se);
	while (!atomic_load(&d->loop_done)) {
		pthread_kill(d->main_thread, SIGUSR1);
		nanosleep(&pause, NULL);
	}
	return NULL;
}

/*
 * Block the exit signals in this thread (and so in every thread it starts),
 * make SIGUSR1 interrupt waits, ignore SIGPIPE.
 */
static int setup_signals(void)
{
	struct sigaction sa;
	sigset_t set;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_wake;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = 0; /* no SA_RESTART: the wake-up must interrupt */
	if (sigaction(SIGUSR1, &sa, NULL) < 0)
		return -errno;
	sa.sa_handler = SIG_IGN;
	if (sigaction(SIGPIPE, &sa, NULL) < 0)
		return -errno;
	exit_signals(&set);
	return -pthread_sigmask(SIG_BLOCK, &set, NULL);
}

/* ---- opening ------------------------------------------------------------------------ */

/* Pick the root of the mount as subvol= / subvolid= say (default: the default subvolume). */
static int pick_root(struct daemon *d, butter_ino_t *root)
{
	const struct mount_opts *o = d->opts;
	butter_ino_t by_path;
	int ret;

	if (o->subvolid) {
		ret = butter_root(d->fs, o->subvolid, root);
		if (ret) {
			daemon_log(d, BUTTER_LOG_ERROR, "subvolid=%llu: %s",
				   (unsigned long long)o->subvolid,
				   ret == -ENOENT ? "no such subvolume" : strerror(-ret));
			return ret;
		}
	}
	if (o->subvol) {
		struct butter_stat st;

		ret = butter_resolve(d->fs, o->subvol, &by_path);
		if (ret == 0)
			ret = butter_stat(d->fs, by_path, &st);
		if (ret) {
			daemon_log(d, BUTTER_LOG_ERROR, "subvol=%s: %s", o->subvol, strerror(-ret));
			return ret;
		}
		if (!S_ISDIR(st.mode) || by_path.ino != BTRFS_FIRST_FREE_OBJECTID) {
			daemon_log(d, BUTTER_LOG_ERROR, "subvol=%s: not a subvolume", o->subvol);
			return -EINVAL;
		}
		if (o->subvolid && by_path.subvol != root->subvol) {
			daemon_log(d, BUTTER_LOG_ERROR,
				   "subvol=%s is subvolume %llu, not subvolid=%llu", o->subvol,
				   (unsigned long long)by_path.subvol,
				   (unsigned long long)o->subvolid);
			return -EINVAL;
		}
		*root = by_path;
	}
	if (!o->subvolid && !o->subvol) {
		ret = butter_root(d->fs, 0, root);
		if (ret) {
			daemon_log(d, BUTTER_LOG_ERROR, "the default subvolume: %s", strerror(-ret));
			return ret;
		}
	}
	return 0;
}

/* Open the filesystem into d->fs, read-only or read-write. */
static int open_fs(struct daemon *d, bool readonly)
{
	const struct mount_opts *o = d->opts;
	struct butter_open_opts bo = {
		.devices = o->devices + 1,
		.ndevices = o->ndevices - 1,
		.flags = (readonly ? BUTTER_OPEN_RDONLY : 0) |
			 (o->degraded ? BUTTER_OPEN_DEGRADED : 0),
		.log = library_log,
		.log_arg = d,
		.log_level = o->debug ? BUTTER_LOG_INFO : BUTTER_LOG_WARNING,
	};
	struct butter_test_devices test = { o->record_log, o->fault_spec };
	struct butter_info info;
	int ret;

	for (size_t i = 0; i < o->ndevices; i++) {
		if (!butter_device_is_nbd(o->devices[i]) &&
		    access(o->devices[i], readonly ? R_OK : R_OK | W_OK) < 0) {
			ret = -errno;
			daemon_log(d, BUTTER_LOG_ERROR, "%s: %s", o->devices[i], strerror(-ret));
			return ret;
		}
	}
	ret = butter_open_testing(o->devices[0], &bo, &test, &d->fs);
	if (ret) {
		bool nbd = false;

		for (size_t i = 0; i < o->ndevices; i++)
			nbd = nbd || butter_device_is_nbd(o->devices[i]);
		/* an NBD device that failed to open was named by the library above */
		nbd = nbd && butter_nbd_open_error(ret);
		daemon_log(d, BUTTER_LOG_ERROR, "%s: %s", o->devices[0],
			   nbd ? "a device could not be opened (see above)"
			   : ret == -EINVAL ? "not a btrfs filesystem" : strerror(-ret));
		return ret;
	}
	ret = butter_get_info(d->fs, &info);
	d->blksize = ret == 0 && info.sectorsize ? info.sectorsize : 4096;
	d->readonly = readonly;
	d->handle_rdonly = readonly;
	return 0;
}

/* compress[=ALGO] / compress-force[=ALGO] on a read-write handle; no ALGO means zlib, as btrfs */
static int apply_compression(struct daemon *d)
{
	const char *c = d->opts->compress, *eq;
	int r;

	if (!c || d->handle_rdonly)
		return 0;
	eq = strchr(c, '=');
	r = butter_set_compression(d->fs, eq ? eq + 1 : "zlib", !strncmp(c, "compress-force", 14));
	if (r < 0)
		daemon_log(d, BUTTER_LOG_ERROR, "-o %s: unknown algorithm or level", c);
	return r < 0 ? r : 0;
}

/*
 * Delayed allocation's bound (write_buffer=): as given, else 1/16 of the
 * machine's memory, at most 1 GiB (the kernel lets a tenth to a fifth of
 * memory be dirty; butter's part of it is this).
 */
static int apply_write_buffer(struct daemon *d)
{
	uint64_t bytes = d->opts->write_buffer;

	if (d->handle_rdonly)
		return 0;
	if (bytes == UINT64_MAX) {
		long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);

		bytes = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize / 16 : 0;
		if (bytes > (1ULL << 30))
			bytes = 1ULL << 30;
	}
	return butter_set_write_buffer(d->fs, bytes);
}

/* Every setting of a writable handle from the options: compress=, write_buffer=, max_inline=. */
static int apply_settings(struct daemon *d)
{
	int ret = apply_compression(d);

	if (ret == 0)
		ret = apply_write_buffer(d);
	if (ret == 0 && !d->handle_rdonly && d->opts->max_inline != UINT64_MAX) {
		ret = butter_set_max_inline(d->fs, d->opts->max_inline);
		ret = ret < 0 ? ret : 0;
	}
	return ret;
}

int daemon_remount(struct daemon *d, bool readonly)
{
	int ret;

	if (readonly) {
		ret = butter_set_readonly(d->fs, 1);
		if (ret == 0)
			d->readonly = true;
	} else if (atomic_load(&d->commit_failed)) {
		ret = -EROFS;
	} else {
		/*
		 * Mounted -o ro, the handle holds the devices shared and has no
		 * write state: the library opens the filesystem again read-write
		 * in place (the node ids stay: nodes.c maps subvolume and inode,
		 * not handles), or stays read-only if it cannot.
		 */
		bool was_rdonly = atomic_load(&d->handle_rdonly);

		ret = butter_set_readonly(d->fs, 0);
		if (ret == 0) {
			d->readonly = false;
			if (was_rdonly) {
				atomic_store(&d->handle_rdonly, false);
				d->reopened = true;
				ret = apply_settings(d);
			}
		} else if (was_rdonly) {
			struct butter_info info;

			if (butter_get_info(d->fs, &info) == -EIO) {
				/*
				 * Not even read-only again: nothing to serve from and nothing
				 * to commit (it was read-only); end as a daemon that died
				 * would, the mount answers ENOTCONN.
				 */
				daemon_log(d, BUTTER_LOG_ERROR, "remount: the filesystem cannot be "
					   "opened again: the daemon exits");
				_exit(1);
			}
		}
	}
	if (ret == 0)
		daemon_log(d, BUTTER_LOG_INFO, "%s: remounted %s", d->opts->mountpoint,
			   readonly ? "read-only" : "read-write");
	else
		daemon_log(d, BUTTER_LOG_ERROR, "%s: remount %s failed: %s", d->opts->mountpoint,
			   readonly ? "read-only" : "read-write", strerror(-ret));
	return ret;
}

/*
 * The -o string for libfuse: fsname=DEV and subtype=butter unless given,
 * default_permissions unless no_permission_checks, then the rest.
 */
static char *fuse_option_string(const struct mount_opts *o)
{
	const char *user = o->fuse_opts ? o->fuse_opts : "";
	size_t len = strlen(user) + 2 * strlen(o->devices[0]) + 96;
	char *s = malloc(len), *p;

	if (!s)
		return NULL;
	p = s;
	if (!strstr(user, "fsname=")) {
		p += sprintf(p, "fsname=");
		for (const char *c = o->devices[0]; *c; c++) {
			if (*c == ',' || *c == '\\')
				*p++ = '\\';
			*p++ = *c;
		}
		*p++ = ',';
	}
	if (!strstr(user, "subtype="))
		p += sprintf(p, "subtype=butter,");
	if (!o->no_permission_checks)
		p += sprintf(p, "default_permissions,");
	strcpy(p, user);
	if (p[0] == '\0' && p > s)
		p[-1] = '\0'; /* no trailing comma */
	return s;
}

static int run_loop(struct daemon *d)
{
	struct fuse_loop_config *cfg;
	int ret;

	if (d->opts->single_thread)
		return fuse_session_loop(d->se);
	if (d->opts->uring) {
		/*
		 * Ring threads: max_threads (8) spread over the CPUs, and two
		 * a CPU at least: a request that makes the kernel send others
		 * from its thread (an invalidation writing dirty pages back,
		 * ops.c) has them queued on its own CPU's queue.
		 */
		struct butter_uring_cfg ucfg = {
			.threads = d->opts->max_threads ? d->opts->max_threads : 8,
			.min_per_queue = 2,
			.pin = true,
			.dev_workers = d->opts->max_threads,
			.spin_us = d->opts->spin_us,
			.raw = butter_fuse_raw_request,
			.raw_arg = d,
		};

		return butter_uring_loop(d->se, &d->wire, &ucfg);
	}
	if (d->opts->spin_us)
		return butter_poll_loop_raw(d->se, d->opts->max_threads, d->opts->spin_us,
					    butter_fuse_raw_request, d);
	cfg = fuse_loop_cfg_create();
	if (!cfg)
		return -ENOMEM;
	if (d->opts->max_threads)
		fuse_loop_cfg_set_max_threads(cfg, d->opts->max_threads);
	ret = fuse_session_loop_mt(d->se, cfg);
	fuse_loop_cfg_destroy(cfg);
	return ret;
}

/* Everything after the options: returns the exit status. */
static int run(const struct mount_opts *o)
{
	struct daemon d;
	struct committer committer = { 0 };
	struct stat st;
	butter_ino_t root;
	pthread_t sig_thread;
	bool sig_running = false, mounted = false;
	char *fuse_opts = NULL;
	int status = 1, ret;

	memset(&d, 0, sizeof(d));
	d.opts = o;
	atomic_init(&d.loop_done, false);
	atomic_init(&d.commit_failed, false);
	d.log_fd = -1;

	if (stat(o->mountpoint, &st) < 0) {
		daemon_log(&d, BUTTER_LOG_ERROR, "%s: %s", o->mountpoint, strerror(errno));
		return 1;
	}
	if (!S_ISDIR(st.st_mode)) {
		daemon_log(&d, BUTTER_LOG_ERROR, "%s: not a directory", o->mountpoint);
		return 1;
	}
	ret = bind_if_mounted(&d); /* served by a live mount already: share it (bind.c) */
	if (ret)
		return ret > 0 ? 0 : 1;
	if (open_fs(&d, o->readonly))
		return 1;
	if (apply_settings(&d)) {
		butter_close(d.fs);
		return 1;
	}
	if (pick_root(&d, &root) || nodes_init(&d.nodes, root)) {
		butter_close(d.fs);
		return 1;
	}
	if (o->trace && trace_open(&d, o->trace, root) < 0) {
		nodes_destroy(&d.nodes);
		butter_close(d.fs);
		return 1;
	}
	fsync_queue_init(&d.fsyncq);
	pthread_mutex_init(&d.balancer_lock, NULL);
	pthread_mutex_init(&d.scrubber_lock, NULL);
	pthread_mutex_init(&d.receiving_lock, NULL);
	pthread_mutex_init(&d.dirs_lock, NULL);
	pthread_mutex_init(&d.full_lock, NULL);

	fuse_opts = fuse_option_string(o);
	char *fuse_argv[] = { "butter", "-o", fuse_opts, o->debug ? "-d" : NULL, NULL };
	struct fuse_args args = FUSE_ARGS_INIT(o->debug ? 4 : 3, fuse_argv);

	if (!fuse_opts)
		goto out;
	d.se = fuse_session_new(&args, &butter_fuse_ops, sizeof(butter_fuse_ops), &d);
	fuse_opt_free_args(&args);
	if (!d.se)
		goto out; /* libfuse said why */
	if (!o->foreground && open_log(&d) < 0)
		goto out;
	if (fuse_session_mount(d.se, o->mountpoint) != 0)
		goto out;
	mounted = true;
	d.wire.want_killpriv_v2 = o->killpriv_v2;
	if (wire_attach(d.se, &d.wire) != 0)
		goto out;
	if (fuse_daemonize(o->foreground) != 0)
		goto out;
	if (!o->foreground) {
		if (d.log_fd < 0)
			openlog("butter", LOG_PID, LOG_DAEMON);
		d.daemonized = true;
		fuse_log_daemon = &d;
		fuse_set_log_func(fuse_log_to_daemon);
	}

	ret = setup_signals();
	if (ret == 0) {
		d.main_thread = pthread_self();
		ret = -pthread_create(&sig_thread, NULL, signal_main, &d);
		sig_running = ret == 0;
	}
	if (ret == 0) /* also read-only: a remount may make the mount writable */
		ret = committer_start(&committer, &d, o->commit_secs);
	if (ret) {
		daemon_log(&d, BUTTER_LOG_ERROR, "cannot start: %s", strerror(-ret));
		goto out;
	}
	balancer_resume_at_mount(&d);

	ret = run_loop(&d);
	status = ret < 0 ? 1 : 0;
	if (ret < 0)
		daemon_log(&d, BUTTER_LOG_ERROR, "FUSE session ended: %s", strerror(-ret));

out:
	/* a `butter mount` of the same image made now waits for our last commit */
	butter_begin_close(d.fs);
	atomic_store(&d.loop_done, true);
	if (sig_running) {
		pthread_kill(sig_thread, SIGTERM); /* ends its sigwait; it sees loop_done */
		pthread_join(sig_thread, NULL);
	}
	balancer_stop(&d); /* after the group it moves; the record stays */
	scrubber_stop(&d); /* after its step */
	receiving_stop(&d); /* what it received stays; a subvolume cut short stays writable */
	if (committer.running || committer.d)
		committer_stop(&committer);
	if (d.se) {
		if (mounted)
			fuse_session_unmount(d.se);
		fuse_session_destroy(d.se);
	}
	free(fuse_opts);
	if (d.fs && !d.readonly) {
		ret = butter_sync(d.fs);
		if (ret) {
			daemon_log(&d, BUTTER_LOG_ERROR, "%s: final commit failed: %s", o->mountpoint,
				   strerror(-ret));
			status = 1;
		}
	}
	trace_close(&d);
	if (mounted) {
		struct butter_info info;

		if (butter_get_info(d.fs, &info) == 0)
			daemon_log(&d, BUTTER_LOG_INFO, "%s: unmounted, generation %llu on disk%s",
				   o->mountpoint, (unsigned long long)info.generation,
				   status ? " (errors above)" : "");
	}
	butter_close(d.fs);
	nodes_destroy(&d.nodes);
	butter_fuse_dirs_free(&d);
	fsync_queue_destroy(&d.fsyncq);
	if (fuse_log_daemon) {
		fuse_set_log_func(NULL); /* libfuse's default again */
		fuse_log_daemon = NULL;
	}
	if (d.daemonized && d.log_fd < 0)
		closelog();
	if (d.log_fd >= 0)
		close(d.log_fd);
	return status;
}

int butter_mount_main(int argc, char **argv, const char *record_log, const char *fault_spec)
{
	struct mount_opts o;
	int ret = mount_opts_parse(&o, argc, argv);

	if (ret)
		return ret > 0 ? 0 : 2;
	o.record_log = record_log;
	o.fault_spec = fault_spec;
	ret = o.remount ? butter_remount_main(&o) : run(&o);
	mount_opts_free(&o);
	return ret;
}
