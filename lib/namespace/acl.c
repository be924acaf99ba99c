/*
 * acl.c — POSIX ACLs kept in step with modes, as the kernel's btrfs keeps
 * them: inheritance of a directory's default ACL by new inodes, the mode
 * that follows from a new access ACL, and the access ACL that follows from a
 * chmod.
 *
 * On disk an ACL is the xattr system.posix_acl_access (or _default):
 *   le32 version (2), then entries { le16 tag, le16 perm, le32 id }
 * with tags USER_OBJ 1, USER 2, GROUP_OBJ 4, GROUP 8, MASK 0x10, OTHER 0x20.
 * An ACL of only USER_OBJ, GROUP_OBJ and OTHER says no more than the mode:
 * it is not stored.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "namespace/namespace.h"

#define ACL_VERSION 2
#define ACL_USER_OBJ 0x01
#define ACL_USER 0x02
#define ACL_GROUP_OBJ 0x04
#define ACL_GROUP 0x08
#define ACL_MASK 0x10
#define ACL_OTHER 0x20
#define ACL_ENTRY_SIZE 8

/* Check an ACL xattr value; the number of entries, or -EINVAL. */
static int acl_entries(const u8 *v, size_t len)
{
	if (len < 4 || (len - 4) % ACL_ENTRY_SIZE || get_le32(v) != ACL_VERSION)
		return -EINVAL;
	return (int)((len - 4) / ACL_ENTRY_SIZE);
}

static u16 entry_tag(const u8 *v, int i)
{
	return get_le16(v + 4 + (size_t)i * ACL_ENTRY_SIZE);
}

static u16 entry_perm(const u8 *v, int i)
{
	return get_le16(v + 4 + (size_t)i * ACL_ENTRY_SIZE + 2);
}

static void set_entry_perm(u8 *v, int i, u16 perm)
{
	put_le16(v + 4 + (size_t)i * ACL_ENTRY_SIZE + 2, perm);
}

int ns_acl_update_mode(const void *value, size_t len, u32 *mode)
{
	const u8 *v = value;
	int n = acl_entries(v, len), i, equiv = 1;
	u32 m = 0, group = 0, mask = 0, has_mask = 0;

	if (n < 0)
		return n;
	for (i = 0; i < n; i++) {
		u16 perm = entry_perm(v, i) & 7;

		switch (entry_tag(v, i)) {
		case ACL_USER_OBJ:
			m |= (u32)perm << 6;
			break;
		case ACL_GROUP_OBJ:
			group = perm;
			break;
		case ACL_OTHER:
			m |= perm;
			break;
		case ACL_MASK:
			mask = perm;
			has_mask = 1;
			equiv = 0;
			break;
		case ACL_USER:
		case ACL_GROUP:
			equiv = 0;
			break;
		default:
			return -EINVAL;
		}
	}
	m |= (has_mask ? mask : group) << 3;
	*mode = (*mode & ~(u32)0777) | m;
	return equiv;
}

int ns_acl_chmod(void *value, size_t len, u32 mode)
{
	u8 *v = value;
	int n = acl_entries(v, len), i, group_obj = -1, mask = -1;

	if (n < 0)
		return n;
	for (i = 0; i < n; i++) {
		u16 perm = entry_perm(v, i) & ~7;

		switch (entry_tag(v, i)) {
		case ACL_USER_OBJ:
			set_entry_perm(v, i, perm | ((mode >> 6) & 7));
			break;
		case ACL_OTHER:
			set_entry_perm(v, i, perm | (mode & 7));
			break;
		case ACL_GROUP_OBJ:
			group_obj = i;
			break;
		case ACL_MASK:
			mask = i;
			break;
		}
	}
	i = mask >= 0 ? mask : group_obj;
	if (i < 0)
		return -EINVAL;
	set_entry_perm(v, i, (entry_perm(v, i) & ~7) | ((mode >> 3) & 7));
	return 0;
}

/*
 * Narrow a copy of the parent's default ACL (@acl, @n entries) by the new
 * inode's requested @mode, and the mode by it. Returns 1 if the result
 * says more than the mode (store it), 0 if not.
 */
static int create_masq(u8 *acl, int n, u32 *mode)
{
	u32 m = *mode;
	int i, group_obj = -1, mask = -1, not_equiv = 0;

	for (i = 0; i < n; i++) {
		u16 perm = entry_perm(acl, i);

		switch (entry_tag(acl, i)) {
		case ACL_USER_OBJ:
			perm &= ((m >> 6) & 7) | ~7;
			set_entry_perm(acl, i, perm);
			m &= ((u32)(perm & 7) << 6) | ~(u32)0700;
			break;
		case ACL_USER:
		case ACL_GROUP:
			not_equiv = 1;
			break;
		case ACL_GROUP_OBJ:
			group_obj = i;
			break;
		case ACL_OTHER:
			perm &= (m & 7) | ~7;
			set_entry_perm(acl, i, perm);
			m &= (u32)(perm & 7) | ~(u32)07;
			break;
		case ACL_MASK:
			mask = i;
			not_equiv = 1;
			break;
		}
	}
	i = mask >= 0 ? mask : group_obj;
	if (i >= 0) {
		u16 perm = entry_perm(acl, i) & (((m >> 3) & 7) | ~7);

		set_entry_perm(acl, i, perm);
		m &= ((u32)(perm & 7) << 3) | ~(u32)070;
	}
	*mode = (*mode & ~(u32)0777) | (m & 0777);
	return not_equiv;
}

int ns_acl_inherit(struct butter_fs *fs, butter_ino_t dir, u32 *mode, u32 umask,
		   struct fs_acl_set *out)
{
	ssize_t len;
	int n;

	memset(out, 0, sizeof(*out));
	len = inode_getxattr(fs, dir, "system.posix_acl_default", NULL, 0);
	if (len == -ENODATA || len == 0 || S_ISLNK(*mode)) {
		if (!S_ISLNK(*mode))
			*mode &= ~(umask & 0777);
		return 0;
	}
	if (len < 0)
		return (int)len;
	out->dflt = malloc((size_t)len);
	out->access = malloc((size_t)len);
	if (!out->dflt || !out->access) {
		ns_acl_set_free(out);
		return -ENOMEM;
	}
	len = inode_getxattr(fs, dir, "system.posix_acl_default", out->dflt, (size_t)len);
	n = len < 0 ? (int)len : acl_entries(out->dflt, (size_t)len);
	if (n < 0) {
		ns_acl_set_free(out);
		/* a malformed default ACL: as if there were none */
		*mode &= ~(umask & 0777);
		return n == -EINVAL ? 0 : n;
	}
	out->len = (size_t)len;
	memcpy(out->access, out->dflt, out->len);
	if (!create_masq(out->access, n, mode)) {
		free(out->access);
		out->access = NULL;
	}
	if (!S_ISDIR(*mode)) {
		free(out->dflt);
		out->dflt = NULL;
	}
	return 0;
}

void ns_acl_set_free(struct fs_acl_set *s)
{
	free(s->access);
	free(s->dflt);
	memset(s, 0, sizeof(*s));
}
