/*
 * daemon.c — `butter mount`: open the filesystem, mount it through the FUSE
 * low-level API, serve requests on many threads, and on the way out commit
 * and close.
 *
 * The life of a daemon:
 *
 *   parse options -> butter_open -> pick the root subvolume -> fuse_session_new
 *     -> fuse_session_mount -> fuse_daemonize (returns in the child; the parent
 *     exits 0 once the mount is live; -f stays in the foreground)
 *     -> start the signal and commit threads -> session loop (multithreaded;
 *     -s: one thread)
 *   the loop returns when the kernel ends the connection (umount, fusermount3
 *   -u) or after a signal (below)
 *     -> stop the threads -> fuse_session_unmount -> butter_sync -> butter_close
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
 *   commit    every commit=SECONDS (30) takes fs_lock exclusive and calls
 *             butter_sync(); not started read-only
 *
 * After `fusermount3 -u` returns, the daemon still commits and closes: the
 * image is final when the daemon process has exited.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "mount.h"

#define BTRFS_FIRST_FREE_OBJECTID 256u /* a subvolume's root directory */

const char butter_mount_summary[] = "mount a filesystem through FUSE (the daemon)";
const char butter_mount_synopsis[] = "[-f] [-d] [-s] [-o OPTION[,OPTION]...] [--device DEV]... "
				     "DEV... MOUNTPOINT";
const char butter_mount_usage[] =
	"Mount the btrfs filesystem on the image files or block devices DEV... at\n"
	"MOUNTPOINT, read-write unless -o ro. Without -f the daemon goes to the\n"
	"background once the mount is live. `fusermount3 -u MOUNTPOINT` (or umount,\n"
	"or SIGTERM/SIGINT/SIGHUP to the daemon) unmounts; the daemon then commits\n"
	"and exits: the image is final when the process is gone.\n"
	"\n"
	"  -f             stay in the foreground (messages on stderr, not syslog)\n"
	"  -d             print every FUSE request (implies -f)\n"
	"  -s             serve requests on one thread\n"
	"  -o OPTIONS     comma-separated mount options:\n"
	"\n"
	"  btrfs options\n"
	"    ro, rw                     read-only (the devices are never written) or\n"
	"                               read-write (the default)\n"
	"    subvol=PATH, subvolid=ID   mount this subvolume (default: the default\n"
	"                               subvolume); both must name the same one\n"
	"    device=DEV                 another member of the filesystem (repeatable)\n"
	"    degraded                   mount with missing devices where the\n"
	"                               profiles allow it\n"
	"    commit=SECONDS             commit at least this often (default 30)\n"
	"    compress[=ALGO], compress-force[=ALGO]\n"
	"                               compress new data: zlib[:1-9], lzo, zstd[:1-15]\n"
	"    noatime, relatime, strictatime, nodiratime\n"
	"                               when reads set access times (default:\n"
	"                               relatime, as the kernel's btrfs)\n"
	"  access\n"
	"    allow_other                let other users in (see /etc/fuse.conf)\n"
	"    default_permissions        let the kernel check permissions (mode bits;\n"
	"                               ACLs are kept but not enforced yet); without\n"
	"                               it nothing is checked\n"
	"  FUSE performance\n"
	"    writeback_cache, no_writeback_cache\n"
	"                               let the kernel gather writes in its page cache\n"
	"                               (default: on when read-write)\n"
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
	"  Any other option (noatime, nodev, nosuid, fsname=, ...) goes to libfuse.\n"
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

static void vlog(struct daemon *d, int level, const char *fmt, va_list ap)
{
	static const int prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };
	char msg[1024];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	if (level < 0)
		level = 0;
	if (level > BUTTER_LOG_DEBUG)
		level = BUTTER_LOG_DEBUG;
	if (d && d->daemonized)
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

/* The library's log callback. */
static void library_log(void *arg, int level, const char *msg)
{
	daemon_log(arg, level, "%s", msg);
}

/* ---- the commit thread -------------------------------------------------------- */

struct committer {
	struct daemon *d;
	unsigned secs;
	pthread_mutex_t lock;
	pthread_cond_t wake;        /* signalled to stop */
	bool stop;                  /* protected by lock */
	pthread_t thread;
	bool running;
};

static void *commit_main(void *arg)
{
	struct committer *c = arg;
	struct timespec deadline;

	pthread_mutex_lock(&c->lock);
	while (!c->stop) {
		clock_gettime(CLOCK_MONOTONIC, &deadline);
		deadline.tv_sec += c->secs;
		while (!c->stop && pthread_cond_timedwait(&c->wake, &c->lock, &deadline) != ETIMEDOUT)
			;
		if (c->stop)
			break;
		pthread_mutex_unlock(&c->lock);
		pthread_rwlock_wrlock(&c->d->fs_lock);
		int ret = butter_sync(c->d->fs);
		pthread_rwlock_unlock(&c->d->fs_lock);
		if (ret)
			daemon_log(c->d, BUTTER_LOG_ERROR, "periodic commit failed: %s", strerror(-ret));
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
	pthread_mutex_init(&c->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&c->wake, &attr);
	pthread_condattr_destroy(&attr);
	ret = pthread_create(&c->thread, NULL, commit_main, c);
	c->running = ret == 0;
	return -ret;
}

static void committer_stop(struct committer *c)
{
	if (c->running) {
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
		syncfs(fd);
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

static int open_fs(struct daemon *d)
{
	const struct mount_opts *o = d->opts;
	struct butter_open_opts bo = {
		.devices = o->devices + 1,
		.ndevices = o->ndevices - 1,
		.flags = (o->readonly ? BUTTER_OPEN_RDONLY : 0) |
			 (o->degraded ? BUTTER_OPEN_DEGRADED : 0),
		.log = library_log,
		.log_arg = d,
		.log_level = o->debug ? BUTTER_LOG_INFO : BUTTER_LOG_WARNING,
	};
	struct butter_info info;
	int ret;

	for (size_t i = 0; i < o->ndevices; i++) {
		if (access(o->devices[i], o->readonly ? R_OK : R_OK | W_OK) < 0) {
			ret = -errno;
			daemon_log(d, BUTTER_LOG_ERROR, "%s: %s", o->devices[i], strerror(-ret));
			return ret;
		}
	}
	ret = butter_open(o->devices[0], &bo, &d->fs);
	if (ret) {
		daemon_log(d, BUTTER_LOG_ERROR, "%s: %s", o->devices[0],
			   ret == -EINVAL ? "not a btrfs filesystem" : strerror(-ret));
		return ret;
	}
	ret = butter_get_info(d->fs, &info);
	d->blksize = ret == 0 && info.sectorsize ? info.sectorsize : 4096;
	d->readonly = o->readonly;
	return 0;
}

/* The -o string for libfuse: fsname=DEV and subtype=butter unless given, then the rest. */
static char *fuse_option_string(const struct mount_opts *o)
{
	const char *user = o->fuse_opts ? o->fuse_opts : "";
	size_t len = strlen(user) + 2 * strlen(o->devices[0]) + 64;
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
	if (d->opts->spin_us)
		return butter_poll_loop(d->se, d->opts->max_threads, d->opts->spin_us);
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
	pthread_rwlockattr_t rwattr;
	pthread_t sig_thread;
	bool sig_running = false, mounted = false;
	char *fuse_opts = NULL;
	int status = 1, ret;

	memset(&d, 0, sizeof(d));
	d.opts = o;
	atomic_init(&d.loop_done, false);

	if (stat(o->mountpoint, &st) < 0) {
		daemon_log(&d, BUTTER_LOG_ERROR, "%s: %s", o->mountpoint, strerror(errno));
		return 1;
	}
	if (!S_ISDIR(st.st_mode)) {
		daemon_log(&d, BUTTER_LOG_ERROR, "%s: not a directory", o->mountpoint);
		return 1;
	}
	if (open_fs(&d))
		return 1;
	if (o->compress && !o->readonly) {
		/* compress[=ALGO] / compress-force[=ALGO]; no ALGO means zlib, as btrfs */
		int force = !strncmp(o->compress, "compress-force", 14);
		const char *eq = strchr(o->compress, '=');
		int r = butter_set_compression(d.fs, eq ? eq + 1 : "zlib", force);

		if (r < 0) {
			daemon_log(&d, BUTTER_LOG_ERROR, "-o %s: unknown algorithm or level",
				   o->compress);
			butter_close(d.fs);
			return 1;
		}
	}
	if (pick_root(&d, &root) || nodes_init(&d.nodes, root)) {
		butter_close(d.fs);
		return 1;
	}
	pthread_rwlockattr_init(&rwattr);
	pthread_rwlockattr_setkind_np(&rwattr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&d.fs_lock, &rwattr);
	pthread_rwlockattr_destroy(&rwattr);
	fsync_queue_init(&d.fsyncq);

	fuse_opts = fuse_option_string(o);
	char *fuse_argv[] = { "butter", "-o", fuse_opts, o->debug ? "-d" : NULL, NULL };
	struct fuse_args args = FUSE_ARGS_INIT(o->debug ? 4 : 3, fuse_argv);

	if (!fuse_opts)
		goto out;
	d.se = fuse_session_new(&args, &butter_fuse_ops, sizeof(butter_fuse_ops), &d);
	fuse_opt_free_args(&args);
	if (!d.se)
		goto out; /* libfuse said why */
	if (fuse_session_mount(d.se, o->mountpoint) != 0)
		goto out;
	mounted = true;
	if (fuse_daemonize(o->foreground) != 0)
		goto out;
	if (!o->foreground) {
		openlog("butter", LOG_PID, LOG_DAEMON);
		d.daemonized = true;
	}

	ret = setup_signals();
	if (ret == 0) {
		d.main_thread = pthread_self();
		ret = -pthread_create(&sig_thread, NULL, signal_main, &d);
		sig_running = ret == 0;
	}
	if (ret == 0 && !d.readonly)
		ret = committer_start(&committer, &d, o->commit_secs);
	if (ret) {
		daemon_log(&d, BUTTER_LOG_ERROR, "cannot start: %s", strerror(-ret));
		goto out;
	}

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
	if (committer.running || committer.d)
		committer_stop(&committer);
	if (d.se) {
		if (mounted)
			fuse_session_unmount(d.se);
		fuse_session_destroy(d.se);
	}
	free(fuse_opts);
	if (!d.readonly) {
		ret = butter_sync(d.fs);
		if (ret) {
			daemon_log(&d, BUTTER_LOG_ERROR, "final commit failed: %s", strerror(-ret));
			status = 1;
		}
	}
	butter_close(d.fs);
	nodes_destroy(&d.nodes);
	pthread_rwlock_destroy(&d.fs_lock);
	fsync_queue_destroy(&d.fsyncq);
	if (d.daemonized)
		closelog();
	return status;
}

int butter_mount_main(int argc, char **argv)
{
	struct mount_opts o;
	int ret = mount_opts_parse(&o, argc, argv);

	if (ret)
		return ret > 0 ? 0 : 2;
	ret = run(&o);
	mount_opts_free(&o);
	return ret;
}
