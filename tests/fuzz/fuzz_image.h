/*
 * fuzz_image.h — seed images and the patch language the fuzz harnesses speak.
 *
 * A fuzz input does not carry a whole image (megabytes of mostly zeroes give a
 * mutator nothing to work with). It names one of the seed images loaded at
 * start-up (tests/fuzz/seeds/NAME.img.gz, made by make_seeds.sh) and lists edits
 * to it. Edits address the places that matter: "tree block #k" (every tree
 * block the seed holds, found by scanning it) or "the superblock" (applied to
 * each copy alike), so nearly every mutation lands in metadata.
 *
 * Input layout:
 *
 *   OFFSET  SIZE  FIELD
 *   0       1     mode: bit 0 recompute the checksum of every tree block an
 *                 edit touched; bit 1 recompute the superblock checksums;
 *                 bits 2-7: seed index (modulo the number of seeds)
 *   1       ...   edits, back to back, until the input ends; a truncated
 *                 last edit is dropped
 *
 * Each edit starts with an opcode byte (low 4 bits select the operation) and a
 * target byte T: T = 0xff is the superblock (4 KiB, every copy), anything else
 * is tree block T modulo the number of blocks; offsets are taken modulo the
 * target's size and lengths clipped to its end.
 *
 *   op  name    operands after T            effect
 *   0   WRITE   off:le16 n:u8 bytes[n]      overwrite n bytes
 *   1   ADD     off:le16 w:u8 delta:s8      add delta to the le integer of width
 *                                           1 << (w & 3) at off
 *   2   PTR     off:le16 k:u8               write the logical address of block k
 *                                           as le64 at off (cross-links, loops)
 *   3   COPY    off:le16 S:u8 soff:le16 n:u8  copy n bytes of the seed's target
 *                                           S at soff (S as T) to off
 *   4   SET     off:le16 w:u8 v:u8          store interesting value v (a table of
 *                                           0, 1, -1, 2^k, 2^k +- 1, sizes) as a
 *                                           le integer of width 1 << (w & 3)
 *   5   RAW     off:le32 n:u8 bytes[n]      overwrite n bytes at physical byte
 *                                           off modulo the image size (T unused)
 *   6   FLIP    off:le16 bit:u8             flip one bit
 *   7   FILL    off:le16 n:le16 byte:u8     fill n bytes with one value
 *   8   ISET    slot:u8 f:u8 w:u8 v:u8      as SET, at byte f (modulo the size) of
 *                                           item slot's data (leaf) or key
 *                                           pointer (node); slot modulo nritems
 *   9   IADD    slot:u8 f:u8 w:u8 delta:s8  as ADD, addressed as ISET
 *   10  IWRITE  slot:u8 f:u8 n:u8 bytes[n]  as WRITE, addressed as ISET
 *   11  HSET    slot:u8 f:u8 w:u8 v:u8      as SET, at byte f of the item header
 *                                           (key, offset, size) or key pointer
 *   12-15       as 0-3
 * Item-relative edits (8-11) let a mutation hit a field of a given item
 * without knowing where the leaf packs it; T = 0xff means block 0 there.
 *
 * After the run, fuzz_image_restore() puts back every byte an edit or a
 * checksum fix-up touched, so an image is copied once at start-up only.
 */
#ifndef BUTTER_FUZZ_IMAGE_H
#define BUTTER_FUZZ_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#define FUZZ_MODE_FIX_NODES 0x1u
#define FUZZ_MODE_FIX_SUPER 0x2u
#define FUZZ_TARGET_SUPER 0xffu

struct fuzz_block {
	uint64_t physical; /* byte offset of the block in the image */
	uint64_t logical;  /* the bytenr its header names */
};

struct fuzz_seed {
	char name[64];
	uint8_t *pristine;         /* the image as loaded */
	uint8_t *work;             /* the image edits apply to */
	size_t size;
	uint32_t nodesize, sectorsize;
	uint16_t csum_type;
	struct fuzz_block *blocks; /* sorted by physical */
	size_t nblocks;
	uint64_t supers[3];        /* physical offsets of the superblock copies */
	int nsupers;
};

/*
 * Load every *.img.gz in @dir (sorted by name) and index its tree blocks.
 * Returns the number of seeds loaded (0 on failure, with a message on stderr).
 */
size_t fuzz_seeds_load(const char *dir);

/* The directory seeds are loaded from: $BUTTER_FUZZ_SEEDS, else @fallback. */
const char *fuzz_seeds_dir(const char *fallback);

/* SHA-256 of seed @idx's image as 64 hex digits (saved findings name their seed by it). */
int fuzz_seed_digest(size_t idx, char hex[65]);

size_t fuzz_seed_count(void);
struct fuzz_seed *fuzz_seed_get(size_t idx);

/*
 * Apply the input @data (layout above) to its seed and return the seed, whose
 * work buffer now holds the edited image. NULL if @size is 0 or no seed is
 * loaded. Every call must be followed by fuzz_image_restore().
 */
struct fuzz_seed *fuzz_image_apply(const uint8_t *data, size_t size);

/* Undo every change the last fuzz_image_apply() made to the work buffer. */
void fuzz_image_restore(struct fuzz_seed *seed);

#endif
