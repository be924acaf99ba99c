/*
 * nodes.h — FUSE node ids for btrfs files: the mapping from (subvolume id,
 * inode number) to one 64-bit number that is both the FUSE node id and the
 * st_ino the mount reports, with the kernel's lookup count per node.
 *
 * The mapping, its invariants and why it is stable are written at the top of
 * nodes.c.
 */
#ifndef BUTTER_FUSE_NODES_H
#define BUTTER_FUSE_NODES_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <butter/butter.h>

struct node;

struct node_table {
	pthread_mutex_t lock;
	butter_ino_t root;        /* the mounted subvolume's root directory: node id 1 */
	struct node **by_id;      /* node id -> node; protected by lock */
	size_t id_buckets;        /* a power of two */
	size_t count;             /* nodes in by_id; protected by lock */
	struct node **by_key;     /* (subvol, ino, placeholder name) -> node, overflow ids only */
	size_t key_buckets;
	size_t key_count;
	uint64_t next_overflow;   /* protected by lock */
};

/* Set up an empty table whose node id 1 is @root. -ENOMEM. */
int nodes_init(struct node_table *t, butter_ino_t root);

void nodes_destroy(struct node_table *t);

/*
 * Return in *nodeid the node id of the file @id, found as @name (@namelen
 * bytes) in the directory @parent. @parent and @name matter only for the
 * placeholder directories btrfs shows where a snapshot lacks a subvolume:
 * each gets its own id. With @ref, count one kernel lookup of the node (a
 * reply to lookup, create, mknod, mkdir, symlink, link or a readdirplus
 * entry); without, only name the number (readdir's d_ino).
 * Returns 0 or -ENOMEM.
 */
int nodes_get(struct node_table *t, butter_ino_t id, butter_ino_t parent, const char *name,
	      size_t namelen, bool ref, uint64_t *nodeid);

/* Find the file of @nodeid. -ESTALE if the kernel sent an id we never gave. */
int nodes_resolve(struct node_table *t, uint64_t nodeid, butter_ino_t *out);

/*
 * Count one kernel lookup of @nodeid itself, an id the kernel holds in a
 * file handle (export support: the lookup of "." in it), and return its file
 * in *out. -ESTALE for an id this mount never gave out and cannot decode (a
 * rule 3 id of an earlier mount), -ENOMEM.
 */
int nodes_ref(struct node_table *t, uint64_t nodeid, butter_ino_t *out);

/*
 * Drop @nlookup kernel lookups of @nodeid (FUSE forget). Returns true when
 * the last lookup of a node marked by nodes_hold() went: the caller drops the
 * open reference it took then.
 */
bool nodes_forget(struct node_table *t, uint64_t nodeid, uint64_t nlookup);

/*
 * Whether the kernel has the file @id as a node nodes_hold() would mark
 * (looked up, not pinned, holding nothing yet); its id in *nodeid. Finds,
 * never adds: a file the kernel does not have needs no hold.
 */
bool nodes_holdable(struct node_table *t, butter_ino_t id, uint64_t *nodeid);

/*
 * Mark @nodeid as holding one butter_open_ref() of its file until the kernel
 * forgets it, if the kernel has it (nlookup > 0), it is not pinned and holds
 * none yet. Returns true if marked: the caller's reference stays.
 */
bool nodes_hold(struct node_table *t, uint64_t nodeid);

/*
 * At an open of @nodeid, whose file now has @mtime and @size: return true if
 * they equal those seen at the previous open of the same node, so that the
 * kernel may keep its page cache (FOPEN_KEEP_CACHE); remember them either way.
 */
bool nodes_open_unchanged(struct node_table *t, uint64_t nodeid, const struct timespec *mtime,
			  uint64_t size);

#endif
