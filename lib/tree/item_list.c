/*
 * item_list.c — the list of owned item copies (item_list.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tree/item_list.h"

int item_list_push(struct item_list *l, const struct btrfs_key *key, const void *data, u32 size)
{
	struct item_copy *c;

	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		struct item_copy *v = realloc(l->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		l->v = v;
		l->cap = cap;
	}
	c = &l->v[l->n];
	c->key = *key;
	c->size = size;
	c->data = malloc(size ? size : 1);
	if (!c->data)
		return -ENOMEM;
	if (size)
		memcpy(c->data, data, size);
	l->n++;
	return 0;
}

void item_list_free(struct item_list *l)
{
	size_t i;

	for (i = 0; i < l->n; i++)
		free(l->v[i].data);
	free(l->v);
	memset(l, 0, sizeof(*l));
}
