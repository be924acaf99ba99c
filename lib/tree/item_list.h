/*
 * item_list.h — owned copies of tree items (key and bytes) in a growable
 * list: what the tree log's writer (lib/treelog/writer.c) and its replay
 * (lib/treelog/replay.c) gather from one tree before they change another.
 *
 * Invariant: v[0..n) each own their data (malloc'd, at least 1 byte even for
 * an empty item); item_list_free() releases them and leaves an empty list.
 */
#ifndef BUTTER_TREE_ITEM_LIST_H
#define BUTTER_TREE_ITEM_LIST_H

#include "format/ondisk.h"

struct item_copy {
	struct btrfs_key key;
	u32 size;
	u8 *data;
};

struct item_list {
	struct item_copy *v;
	size_t n, cap;
};

/* Append a copy of @size bytes at @data under @key; -ENOMEM. */
int item_list_push(struct item_list *l, const struct btrfs_key *key, const void *data, u32 size);

void item_list_free(struct item_list *l);

#endif
