/*
 * helper.c — `butter` as a mount(8) helper, so that
 *
 *   mount -t fuse.butter IMAGE /mnt -o OPTIONS
 *   IMAGE          /mnt  fuse.butter  OPTIONS  0 0      (an fstab line)
 *   butter#IMAGE   /mnt  fuse         OPTIONS  0 0      (the older fstab form)
 *
 * start `butter mount` in the background, as any mount does.
 *
 * Two ways in, one behaviour:
 *   1. mount(8) runs /sbin/mount.fuse.butter (an installed symlink to butter):
 *        mount.fuse.butter SOURCE MOUNTPOINT [-sfnv] [-N NS] [-o OPTIONS] [-t TYPE]
 *      butter_mount_helper_wanted() recognises the name in argv[0].
 *   2. Where there is no such helper, mount(8) runs mount.fuse3 (fuse3), which
 *      splits the type ("fuse.butter") or the source ("butter#IMAGE") and runs
 *        butter SOURCE MOUNTPOINT [-o OPTIONS]
 *      through the shell, finding `butter` on PATH. The command table has no
 *      command named like an existing file, so butter_mount_helper_wanted()
 *      accepts this form when argv[1] is a file or block device and argv[2] a
 *      directory.
 *
 * Options meant for mount(8) or systemd only (defaults, auto, noauto, nofail,
 * _netdev, user, users, nouser, owner, group, comment=, x-*, helper=) are
 * dropped; the rest go to `butter mount -o` unchanged, after "dev,suid" when
 * root runs the helper (as mount.fuse3 does: libfuse's own default is
 * nodev,nosuid, a mount(8) user expects neither). Flags: -f (fake: do
 * nothing), -v (print the command run), -n and -s (accepted; there is no
 * mtab, and no option is ever ignored sloppily); -N (namespaces) is refused.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mount.h"

static const char *const helper_names[] = { "mount.fuse.butter", "mount.butter" };

/* Options that concern mount(8), fstab or systemd, never the filesystem. */
static bool mount8_only(const char *opt)
{
	static const char *const words[] = { "defaults", "auto", "noauto", "nofail", "_netdev",
					     "user", "users", "nouser", "owner", "group" };
	static const char *const prefixes[] = { "comment=", "x-", "helper=", "user=" };

	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
		if (strcmp(opt, words[i]) == 0)
			return true;
	for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++)
		if (strncmp(opt, prefixes[i], strlen(prefixes[i])) == 0)
			return true;
	return false;
}

bool butter_mount_helper_wanted(int argc, char **argv)
{
	const char *base = strrchr(argv[0], '/');
	struct stat src, dir;

	base = base ? base + 1 : argv[0];
	for (size_t i = 0; i < sizeof(helper_names) / sizeof(helper_names[0]); i++)
		if (strcmp(base, helper_names[i]) == 0)
			return true;
	/* form 2: butter SOURCE MOUNTPOINT ... */
	if (argc < 3 || argv[1][0] == '-' || argv[2][0] == '-')
		return false;
	if (stat(argv[1], &src) < 0 || stat(argv[2], &dir) < 0)
		return false;
	return (S_ISREG(src.st_mode) || S_ISBLK(src.st_mode)) && S_ISDIR(dir.st_mode);
}

/* Append the comma-separated @list, without mount(8)'s own options, to @out. */
static int add_options(char **out, const char *list)
{
	char *copy = strdup(list), *save = NULL;
	size_t len = *out ? strlen(*out) : 0;
	int ret = 0;

	if (!copy)
		return -1;
	for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *grown;

		if (mount8_only(tok))
			continue;
		grown = realloc(*out, len + strlen(tok) + 2);
		if (!grown) {
			ret = -1;
			break;
		}
		*out = grown;
		if (len)
			grown[len++] = ',';
		strcpy(grown + len, tok);
		len += strlen(tok);
	}
	free(copy);
	return ret;
}

static void helper_usage(FILE *out, const char *prog)
{
	fprintf(out,
		"usage: %s SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]\n"
		"\n"
		"The mount(8) helper of butter: runs `butter mount -o OPTIONS SOURCE MOUNTPOINT`,\n"
		"which returns once the mount is live and leaves the daemon running. SOURCE\n"
		"may be written butter#SOURCE. Options for mount(8) only (defaults, noauto,\n"
		"nofail, _netdev, user, x-*, ...) are dropped.\n"
		"\n"
		"  -f   fake: check the arguments, mount nothing\n"
		"  -v   print the command\n"
		"  -n, -s  accepted and ignored\n",
		prog);
}

/* The value of flag @arg[@j] (-oVALUE or -o VALUE); NULL if missing. */
static const char *flag_value(char **argv, int argc, int *i, size_t j)
{
	const char *arg = argv[*i];

	if (arg[j + 1])
		return arg + j + 1;
	if (*i + 1 < argc)
		return argv[++*i];
	return NULL;
}

int butter_mount_helper_main(int argc, char **argv)
{
	const char *prog = argv[0], *source = NULL, *mountpoint = NULL;
	char *options = NULL;
	bool fake = false, verbose = false;
	int status;

	/*
	 * Parsed by hand, not with getopt: mount(8) puts the positionals first,
	 * and `butter mount` runs getopt afresh on its own arguments.
	 */
	for (int i = 1; i < argc; i++) {
		const char *arg = argv[i];

		if (arg[0] != '-' || arg[1] == '\0') {
			if (!source) {
				source = arg;
			} else if (!mountpoint) {
				mountpoint = arg;
			} else {
				fprintf(stderr, "%s: unexpected argument '%s'\n", prog, arg);
				free(options);
				return 2;
			}
			continue;
		}
		if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
			helper_usage(stdout, prog);
			free(options);
			return 0;
		}
		for (size_t j = 1; arg[j]; j++) {
			const char *val;

			switch (arg[j]) {
			case 'f':
				fake = true;
				continue;
			case 'v':
				verbose = true;
				continue;
			case 'n':
			case 's':
				continue;
			case 'o':
			case 't':
				val = flag_value(argv, argc, &i, j);
				if (!val) {
					fprintf(stderr, "%s: -%c needs a value\n", prog, arg[j]);
					free(options);
					return 2;
				}
				if (arg[j] == 'o' && add_options(&options, val)) {
					fprintf(stderr, "%s: out of memory\n", prog);
					free(options);
					return 1;
				}
				break;
			case 'N':
				fprintf(stderr, "%s: -N (namespaces) is not supported\n", prog);
				free(options);
				return 2;
			default:
				fprintf(stderr, "%s: unknown option '-%c'\n", prog, arg[j]);
				helper_usage(stderr, prog);
				free(options);
				return 2;
			}
			break; /* the value ended this argument */
		}
	}
	if (!source || !mountpoint) {
		helper_usage(stderr, prog);
		free(options);
		return 2;
	}
	if (strncmp(source, "butter#", 7) == 0)
		source += 7;
	if (geteuid() == 0) {
		/* as mount(8) and mount.fuse3 for root: device files and setuid allowed */
		char *with = NULL;

		if (add_options(&with, "dev,suid") || (options && add_options(&with, options))) {
			fprintf(stderr, "%s: out of memory\n", prog);
			free(with);
			free(options);
			return 1;
		}
		free(options);
		options = with;
	}

	char *mount_argv[6];
	int nargs = 0;

	mount_argv[nargs++] = "mount";
	if (options) {
		mount_argv[nargs++] = "-o";
		mount_argv[nargs++] = options;
	}
	mount_argv[nargs++] = (char *)source;
	mount_argv[nargs++] = (char *)mountpoint;
	mount_argv[nargs] = NULL;
	if (verbose || fake)
		fprintf(stderr, "%sbutter mount%s%s %s %s\n", fake ? "(fake) " : "",
			options ? " -o " : "", options ? options : "", source, mountpoint);
	status = fake ? 0 : butter_mount_main(nargs, mount_argv, NULL, NULL);
	free(options);
	return status;
}
