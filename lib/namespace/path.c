/*
 * path.c — resolving a path from the top of the filesystem ("/a/b/c") to an
 * inode: one lookup per component, "." and "..", symlinks followed as the
 * kernel follows them (a bounded number of times: -ELOOP).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "namespace/namespace.h"

#define MAX_SYMLINK_FOLLOWS 40

int ns_resolve(struct butter_fs *fs, const char *path, butter_ino_t *out)
{
	char buf[8192], link[4096];
	butter_ino_t cur, top, next;
	struct butter_stat st;
	size_t pos = 0;
	int follows = 0, ret;

	if (strlen(path) >= sizeof(buf))
		return -ENAMETOOLONG;
	strcpy(buf, path);
	ret = inode_root(fs, BTRFS_FS_TREE_OBJECTID, &top);
	if (ret)
		return ret;
	cur = top;
	for (;;) {
		size_t start, len;
		int last;

		while (buf[pos] == '/')
			pos++;
		if (!buf[pos])
			break;
		start = pos;
		while (buf[pos] && buf[pos] != '/')
			pos++;
		len = pos - start;
		while (buf[pos] == '/')
			pos++;
		last = buf[pos] == '\0';
		ret = inode_lookup(fs, cur, buf + start, len, &next);
		if (ret)
			return ret;
		if (!last) {
			ret = inode_stat(fs, next, &st);
			if (ret)
				return ret;
			if (S_ISLNK(st.mode)) {
				ssize_t n;
				size_t rest = strlen(buf + pos);

				if (++follows > MAX_SYMLINK_FOLLOWS)
					return -ELOOP;
				n = data_readlink(fs, next, link, sizeof(link));
				if (n < 0)
					return (int)n;
				if ((size_t)n >= sizeof(link) || (size_t)n + 1 + rest >= sizeof(buf))
					return -ENAMETOOLONG;
				/* splice: target + "/" + remaining components */
				memmove(buf + n + 1, buf + pos, rest + 1);
				memcpy(buf, link, (size_t)n);
				buf[n] = '/';
				pos = 0;
				if (link[0] == '/')
					cur = top;
				continue;
			}
			if (!S_ISDIR(st.mode))
				return -ENOTDIR;
		}
		cur = next;
	}
	*out = cur;
	return 0;
}
