/*
 * test_format.c — the on-disk format layer (lib/format/ondisk.h) against the
 * published btrfs on-disk format:
 *
 *  - sizes and field offsets of every packed struct, written out here from the
 *    format documentation (superblock table, header 101 bytes, item 25,
 *    key_ptr 33, inode item 160, root item 439, file extent 53 with inline
 *    data at 21, ...);
 *  - accessor round trips: set, get back, and the exact little-endian bytes
 *    at the field's offset, with the neighbouring bytes left untouched;
 *  - key conversion and the key order (objectid, then type, then offset, all
 *    unsigned);
 *  - superblock mirror offsets (64 KiB, 64 MiB, 256 GiB).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "format/ondisk.h"

#define CHECK_OFF(type, field, off) CHECK_EQ_U64(offsetof(type, field), (off))
#define CHECK_SIZE(type, size) CHECK_EQ_U64(sizeof(type), (size))

static void test_struct_sizes(void)
{
	CHECK_SIZE(struct btrfs_disk_key, 17);
	CHECK_SIZE(struct btrfs_header, 101);
	CHECK_SIZE(struct btrfs_item, 25);
	CHECK_SIZE(struct btrfs_key_ptr, 33);
	CHECK_SIZE(struct btrfs_dev_item, 98);
	CHECK_SIZE(struct btrfs_root_backup, 168);
	CHECK_SIZE(struct btrfs_super_block, 4096);
	CHECK_SIZE(struct btrfs_stripe, 32);
	CHECK_SIZE(struct btrfs_chunk, 80);
	CHECK_SIZE(struct btrfs_dev_extent, 48);
	CHECK_SIZE(struct btrfs_timespec, 12);
	CHECK_SIZE(struct btrfs_inode_item, 160);
	CHECK_SIZE(struct btrfs_inode_ref, 10);
	CHECK_SIZE(struct btrfs_inode_extref, 18);
	CHECK_SIZE(struct btrfs_dir_item, 30);
	CHECK_SIZE(struct btrfs_root_item, 439);
	CHECK_SIZE(struct btrfs_root_ref, 18);
	CHECK_SIZE(struct btrfs_file_extent_item, 53);
	CHECK_SIZE(struct btrfs_extent_item, 24);
	CHECK_SIZE(struct btrfs_tree_block_info, 18);
	CHECK_SIZE(struct btrfs_extent_inline_ref, 9);
	CHECK_SIZE(struct btrfs_extent_data_ref, 28);
	CHECK_SIZE(struct btrfs_shared_data_ref, 4);
	CHECK_SIZE(struct btrfs_block_group_item, 24);
	CHECK_SIZE(struct btrfs_free_space_info, 8);
	CHECK_EQ_U64(BTRFS_ROOT_ITEM_V1_SIZE, 239);
	CHECK_EQ_U64(BTRFS_FILE_EXTENT_INLINE_DATA_START, 21);
	CHECK_EQ_U64(btrfs_chunk_item_size(1), 80);
	CHECK_EQ_U64(btrfs_chunk_item_size(2), 112);
	CHECK_EQ_U64(btrfs_chunk_item_size(4), 176);
	CHECK_EQ_U64(btrfs_chunk_item_size(6), 240);
}

static void test_super_offsets(void)
{
	typedef struct btrfs_super_block sb;

	CHECK_OFF(sb, csum, 0x000);
	CHECK_OFF(sb, fsid, 0x020);
	CHECK_OFF(sb, bytenr, 0x030);
	CHECK_OFF(sb, flags, 0x038);
	CHECK_OFF(sb, magic, 0x040);
	CHECK_OFF(sb, generation, 0x048);
	CHECK_OFF(sb, root, 0x050);
	CHECK_OFF(sb, chunk_root, 0x058);
	CHECK_OFF(sb, log_root, 0x060);
	CHECK_OFF(sb, unused_log_root_transid, 0x068);
	CHECK_OFF(sb, total_bytes, 0x070);
	CHECK_OFF(sb, bytes_used, 0x078);
	CHECK_OFF(sb, root_dir_objectid, 0x080);
	CHECK_OFF(sb, num_devices, 0x088);
	CHECK_OFF(sb, sectorsize, 0x090);
	CHECK_OFF(sb, nodesize, 0x094);
	CHECK_OFF(sb, unused_leafsize, 0x098);
	CHECK_OFF(sb, stripesize, 0x09c);
	CHECK_OFF(sb, sys_chunk_array_size, 0x0a0);
	CHECK_OFF(sb, chunk_root_generation, 0x0a4);
	CHECK_OFF(sb, compat_flags, 0x0ac);
	CHECK_OFF(sb, compat_ro_flags, 0x0b4);
	CHECK_OFF(sb, incompat_flags, 0x0bc);
	CHECK_OFF(sb, csum_type, 0x0c4);
	CHECK_OFF(sb, root_level, 0x0c6);
	CHECK_OFF(sb, chunk_root_level, 0x0c7);
	CHECK_OFF(sb, log_root_level, 0x0c8);
	CHECK_OFF(sb, dev_item, 0x0c9);
	CHECK_OFF(sb, label, 0x12b);
	CHECK_OFF(sb, cache_generation, 0x22b);
	CHECK_OFF(sb, uuid_tree_generation, 0x233);
	CHECK_OFF(sb, metadata_uuid, 0x23b);
	CHECK_OFF(sb, nr_global_roots, 0x24b);
	CHECK_OFF(sb, sys_chunk_array, 0x32b);
	CHECK_OFF(sb, super_roots, 0xb2b);
	CHECK_OFF(sb, super_roots[1], 0xb2b + 168);
	CHECK_OFF(sb, super_roots[3], 0xb2b + 3 * 168);
	CHECK_OFF(sb, padding, 0xdcb);
	CHECK_EQ_U64(sizeof(((sb *)0)->sys_chunk_array), 2048);
	CHECK_EQ_U64(sizeof(((sb *)0)->label), 256);
	CHECK_EQ_U64(sizeof(((sb *)0)->padding), 565);

	/* the dev_item embedded at 0xc9 */
	CHECK_OFF(struct btrfs_dev_item, devid, 0);
	CHECK_OFF(struct btrfs_dev_item, total_bytes, 8);
	CHECK_OFF(struct btrfs_dev_item, bytes_used, 16);
	CHECK_OFF(struct btrfs_dev_item, io_align, 24);
	CHECK_OFF(struct btrfs_dev_item, io_width, 28);
	CHECK_OFF(struct btrfs_dev_item, sector_size, 32);
	CHECK_OFF(struct btrfs_dev_item, type, 36);
	CHECK_OFF(struct btrfs_dev_item, generation, 44);
	CHECK_OFF(struct btrfs_dev_item, start_offset, 52);
	CHECK_OFF(struct btrfs_dev_item, dev_group, 60);
	CHECK_OFF(struct btrfs_dev_item, seek_speed, 64);
	CHECK_OFF(struct btrfs_dev_item, bandwidth, 65);
	CHECK_OFF(struct btrfs_dev_item, uuid, 66);
	CHECK_OFF(struct btrfs_dev_item, fsid, 82);

	/* backup roots */
	CHECK_OFF(struct btrfs_root_backup, tree_root, 0);
	CHECK_OFF(struct btrfs_root_backup, chunk_root_gen, 24);
	CHECK_OFF(struct btrfs_root_backup, fs_root, 48);
	CHECK_OFF(struct btrfs_root_backup, csum_root_gen, 88);
	CHECK_OFF(struct btrfs_root_backup, total_bytes, 96);
	CHECK_OFF(struct btrfs_root_backup, num_devices, 112);
	CHECK_OFF(struct btrfs_root_backup, unused_64, 120);
	CHECK_OFF(struct btrfs_root_backup, tree_root_level, 152);
	CHECK_OFF(struct btrfs_root_backup, csum_root_level, 157);
	CHECK_OFF(struct btrfs_root_backup, unused_8, 158);
}

static void test_tree_struct_offsets(void)
{
	CHECK_OFF(struct btrfs_disk_key, objectid, 0);
	CHECK_OFF(struct btrfs_disk_key, type, 8);
	CHECK_OFF(struct btrfs_disk_key, offset, 9);

	CHECK_OFF(struct btrfs_header, csum, 0);
	CHECK_OFF(struct btrfs_header, fsid, 32);
	CHECK_OFF(struct btrfs_header, bytenr, 48);
	CHECK_OFF(struct btrfs_header, flags, 56);
	CHECK_OFF(struct btrfs_header, chunk_tree_uuid, 64);
	CHECK_OFF(struct btrfs_header, generation, 80);
	CHECK_OFF(struct btrfs_header, owner, 88);
	CHECK_OFF(struct btrfs_header, nritems, 96);
	CHECK_OFF(struct btrfs_header, level, 100);

	CHECK_OFF(struct btrfs_item, key, 0);
	CHECK_OFF(struct btrfs_item, offset, 17);
	CHECK_OFF(struct btrfs_item, size, 21);

	CHECK_OFF(struct btrfs_key_ptr, key, 0);
	CHECK_OFF(struct btrfs_key_ptr, blockptr, 17);
	CHECK_OFF(struct btrfs_key_ptr, generation, 25);

	CHECK_OFF(struct btrfs_chunk, length, 0);
	CHECK_OFF(struct btrfs_chunk, owner, 8);
	CHECK_OFF(struct btrfs_chunk, stripe_len, 16);
	CHECK_OFF(struct btrfs_chunk, type, 24);
	CHECK_OFF(struct btrfs_chunk, io_align, 32);
	CHECK_OFF(struct btrfs_chunk, io_width, 36);
	CHECK_OFF(struct btrfs_chunk, sector_size, 40);
	CHECK_OFF(struct btrfs_chunk, num_stripes, 44);
	CHECK_OFF(struct btrfs_chunk, sub_stripes, 46);
	CHECK_OFF(struct btrfs_chunk, stripe, 48);
	CHECK_OFF(struct btrfs_stripe, devid, 0);
	CHECK_OFF(struct btrfs_stripe, offset, 8);
	CHECK_OFF(struct btrfs_stripe, dev_uuid, 16);

	CHECK_OFF(struct btrfs_dev_extent, chunk_tree, 0);
	CHECK_OFF(struct btrfs_dev_extent, chunk_objectid, 8);
	CHECK_OFF(struct btrfs_dev_extent, chunk_offset, 16);
	CHECK_OFF(struct btrfs_dev_extent, length, 24);
	CHECK_OFF(struct btrfs_dev_extent, chunk_tree_uuid, 32);

	CHECK_OFF(struct btrfs_block_group_item, used, 0);
	CHECK_OFF(struct btrfs_block_group_item, chunk_objectid, 8);
	CHECK_OFF(struct btrfs_block_group_item, flags, 16);

	CHECK_OFF(struct btrfs_extent_item, refs, 0);
	CHECK_OFF(struct btrfs_extent_item, generation, 8);
	CHECK_OFF(struct btrfs_extent_item, flags, 16);
	CHECK_OFF(struct btrfs_tree_block_info, level, 17);
	CHECK_OFF(struct btrfs_extent_inline_ref, offset, 1);
	CHECK_OFF(struct btrfs_extent_data_ref, root, 0);
	CHECK_OFF(struct btrfs_extent_data_ref, objectid, 8);
	CHECK_OFF(struct btrfs_extent_data_ref, offset, 16);
	CHECK_OFF(struct btrfs_extent_data_ref, count, 24);
	CHECK_OFF(struct btrfs_free_space_info, extent_count, 0);
	CHECK_OFF(struct btrfs_free_space_info, flags, 4);
}

static void test_fs_struct_offsets(void)
{
	CHECK_OFF(struct btrfs_timespec, sec, 0);
	CHECK_OFF(struct btrfs_timespec, nsec, 8);

	CHECK_OFF(struct btrfs_inode_item, generation, 0);
	CHECK_OFF(struct btrfs_inode_item, transid, 8);
	CHECK_OFF(struct btrfs_inode_item, size, 16);
	CHECK_OFF(struct btrfs_inode_item, nbytes, 24);
	CHECK_OFF(struct btrfs_inode_item, block_group, 32);
	CHECK_OFF(struct btrfs_inode_item, nlink, 40);
	CHECK_OFF(struct btrfs_inode_item, uid, 44);
	CHECK_OFF(struct btrfs_inode_item, gid, 48);
	CHECK_OFF(struct btrfs_inode_item, mode, 52);
	CHECK_OFF(struct btrfs_inode_item, rdev, 56);
	CHECK_OFF(struct btrfs_inode_item, flags, 64);
	CHECK_OFF(struct btrfs_inode_item, sequence, 72);
	CHECK_OFF(struct btrfs_inode_item, reserved, 80);
	CHECK_OFF(struct btrfs_inode_item, atime, 112);
	CHECK_OFF(struct btrfs_inode_item, ctime, 124);
	CHECK_OFF(struct btrfs_inode_item, mtime, 136);
	CHECK_OFF(struct btrfs_inode_item, otime, 148);

	CHECK_OFF(struct btrfs_inode_ref, index, 0);
	CHECK_OFF(struct btrfs_inode_ref, name_len, 8);
	CHECK_OFF(struct btrfs_inode_extref, parent_objectid, 0);
	CHECK_OFF(struct btrfs_inode_extref, index, 8);
	CHECK_OFF(struct btrfs_inode_extref, name_len, 16);

	CHECK_OFF(struct btrfs_dir_item, location, 0);
	CHECK_OFF(struct btrfs_dir_item, transid, 17);
	CHECK_OFF(struct btrfs_dir_item, data_len, 25);
	CHECK_OFF(struct btrfs_dir_item, name_len, 27);
	CHECK_OFF(struct btrfs_dir_item, type, 29);

	CHECK_OFF(struct btrfs_root_item, inode, 0);
	CHECK_OFF(struct btrfs_root_item, generation, 160);
	CHECK_OFF(struct btrfs_root_item, root_dirid, 168);
	CHECK_OFF(struct btrfs_root_item, bytenr, 176);
	CHECK_OFF(struct btrfs_root_item, byte_limit, 184);
	CHECK_OFF(struct btrfs_root_item, bytes_used, 192);
	CHECK_OFF(struct btrfs_root_item, last_snapshot, 200);
	CHECK_OFF(struct btrfs_root_item, flags, 208);
	CHECK_OFF(struct btrfs_root_item, refs, 216);
	CHECK_OFF(struct btrfs_root_item, drop_progress, 220);
	CHECK_OFF(struct btrfs_root_item, drop_level, 237);
	CHECK_OFF(struct btrfs_root_item, level, 238);
	CHECK_OFF(struct btrfs_root_item, generation_v2, 239);
	CHECK_OFF(struct btrfs_root_item, uuid, 247);
	CHECK_OFF(struct btrfs_root_item, parent_uuid, 263);
	CHECK_OFF(struct btrfs_root_item, received_uuid, 279);
	CHECK_OFF(struct btrfs_root_item, ctransid, 295);
	CHECK_OFF(struct btrfs_root_item, otransid, 303);
	CHECK_OFF(struct btrfs_root_item, stransid, 311);
	CHECK_OFF(struct btrfs_root_item, rtransid, 319);
	CHECK_OFF(struct btrfs_root_item, ctime, 327);
	CHECK_OFF(struct btrfs_root_item, otime, 339);
	CHECK_OFF(struct btrfs_root_item, stime, 351);
	CHECK_OFF(struct btrfs_root_item, rtime, 363);
	CHECK_OFF(struct btrfs_root_item, reserved, 375);

	CHECK_OFF(struct btrfs_root_ref, dirid, 0);
	CHECK_OFF(struct btrfs_root_ref, sequence, 8);
	CHECK_OFF(struct btrfs_root_ref, name_len, 16);

	CHECK_OFF(struct btrfs_file_extent_item, generation, 0);
	CHECK_OFF(struct btrfs_file_extent_item, ram_bytes, 8);
	CHECK_OFF(struct btrfs_file_extent_item, compression, 16);
	CHECK_OFF(struct btrfs_file_extent_item, encryption, 17);
	CHECK_OFF(struct btrfs_file_extent_item, other_encoding, 18);
	CHECK_OFF(struct btrfs_file_extent_item, type, 20);
	CHECK_OFF(struct btrfs_file_extent_item, disk_bytenr, 21);
	CHECK_OFF(struct btrfs_file_extent_item, disk_num_bytes, 29);
	CHECK_OFF(struct btrfs_file_extent_item, offset, 37);
	CHECK_OFF(struct btrfs_file_extent_item, num_bytes, 45);
}

/* The constants a reader must agree with the kernel on. */
static void test_constants(void)
{
	u8 raw[8];

	put_le64(raw, BTRFS_MAGIC);
	CHECK_MEM(raw, "_BHRfS_M", 8);
	CHECK_EQ_U64(BTRFS_SUPER_INFO_OFFSET, 0x10000);
	CHECK_EQ_U64(BTRFS_SUPER_INFO_SIZE, 4096);
	CHECK_EQ_U64(BTRFS_STRIPE_LEN, 0x10000);
	CHECK_EQ_U64(BTRFS_CHUNK_ITEM_KEY, 228);
	CHECK_EQ_U64(BTRFS_EXTENT_DATA_KEY, 108);
	CHECK_EQ_U64(BTRFS_ROOT_ITEM_KEY, 132);
	CHECK_EQ_U64(BTRFS_DIR_INDEX_KEY, 96);
	CHECK_EQ_U64(BTRFS_METADATA_ITEM_KEY, 169);
	CHECK_EQ_U64(BTRFS_FIRST_CHUNK_TREE_OBJECTID, 256);
	CHECK_EQ_U64(BTRFS_TREE_LOG_OBJECTID, 0xfffffffffffffffaULL);
	CHECK_EQ_U64(BTRFS_BLOCK_GROUP_RAID6, 0x100);
	CHECK_EQ_U64(BTRFS_BLOCK_GROUP_RAID1C4, 0x400);
	CHECK_EQ_U64(BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA, 0x100);
	CHECK_EQ_U64(BTRFS_FEATURE_INCOMPAT_NO_HOLES, 0x200);
}

static void test_sb_offset(void)
{
	CHECK_EQ_U64(btrfs_sb_offset(0), 64ULL * 1024);
	CHECK_EQ_U64(btrfs_sb_offset(1), 64ULL * 1024 * 1024);
	CHECK_EQ_U64(btrfs_sb_offset(2), 256ULL * 1024 * 1024 * 1024);
	CHECK_EQ_U64(btrfs_sb_offset(0), BTRFS_SUPER_INFO_OFFSET);
}

static void test_raw_le(void)
{
	static const u8 b[8] = { 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef };
	u8 out[10];

	CHECK_EQ_U64(get_le16(b), 0x2301);
	CHECK_EQ_U64(get_le32(b), 0x67452301);
	CHECK_EQ_U64(get_le64(b), 0xefcdab8967452301ULL);
	/* unaligned reads */
	CHECK_EQ_U64(get_le16(b + 1), 0x4523);
	CHECK_EQ_U64(get_le32(b + 3), 0xcdab8967);
	CHECK_EQ_U64(get_u8(b + 7), 0xef);

	memset(out, 0x5a, sizeof(out));
	put_le64(out + 1, 0xefcdab8967452301ULL);
	CHECK_MEM(out + 1, b, 8);
	CHECK(out[0] == 0x5a && out[9] == 0x5a);
	memset(out, 0x5a, sizeof(out));
	put_le32(out + 1, 0x67452301);
	CHECK_MEM(out + 1, b, 4);
	CHECK(out[0] == 0x5a && out[5] == 0x5a);
	memset(out, 0x5a, sizeof(out));
	put_le16(out + 1, 0x2301);
	CHECK_MEM(out + 1, b, 2);
	CHECK(out[0] == 0x5a && out[3] == 0x5a);
}

/*
 * Set @val through the accessor on a struct filled with 0xa5, read it back,
 * and check the bytes at @off are @val little-endian and the bytes just
 * outside the field are untouched.
 */
static void expect_le_bytes(const u8 *base, size_t struct_size, size_t off, unsigned bytes,
			    u64 val)
{
	for (unsigned i = 0; i < bytes; i++)
		CHECK_EQ_U64(base[off + i], (val >> (8 * i)) & 0xff);
	if (off > 0)
		CHECK_EQ_U64(base[off - 1], 0xa5);
	if (off + bytes < struct_size)
		CHECK_EQ_U64(base[off + bytes], 0xa5);
}

#define ROUND_TRIP(name, type, field, bits, val)                                        \
	do {                                                                            \
		type *s_ = malloc(sizeof(type));                                        \
		u##bits v_ = (u##bits)(val);                                            \
		CHECK(s_ != NULL);                                                      \
		if (!s_)                                                                \
			break;                                                          \
		memset(s_, 0xa5, sizeof(type));                                         \
		btrfs_set_##name(s_, v_);                                               \
		CHECK_EQ_U64(btrfs_##name(s_), v_);                                     \
		expect_le_bytes((const u8 *)s_, sizeof(type), offsetof(type, field),    \
				(bits) / 8, v_);                                        \
		free(s_);                                                               \
	} while (0)

#define V64 0x0102030405060708ULL
#define V32 0x0a0b0c0dU
#define V16 0x1e1fU

static void test_accessors_super(void)
{
	typedef struct btrfs_super_block sb;

	ROUND_TRIP(super_bytenr, sb, bytenr, 64, V64);
	ROUND_TRIP(super_flags, sb, flags, 64, V64);
	ROUND_TRIP(super_magic, sb, magic, 64, BTRFS_MAGIC);
	ROUND_TRIP(super_generation, sb, generation, 64, V64);
	ROUND_TRIP(super_root, sb, root, 64, V64);
	ROUND_TRIP(super_chunk_root, sb, chunk_root, 64, V64);
	ROUND_TRIP(super_log_root, sb, log_root, 64, V64);
	ROUND_TRIP(super_total_bytes, sb, total_bytes, 64, V64);
	ROUND_TRIP(super_bytes_used, sb, bytes_used, 64, V64);
	ROUND_TRIP(super_root_dir, sb, root_dir_objectid, 64, 6);
	ROUND_TRIP(super_num_devices, sb, num_devices, 64, V64);
	ROUND_TRIP(super_sectorsize, sb, sectorsize, 32, V32);
	ROUND_TRIP(super_nodesize, sb, nodesize, 32, V32);
	ROUND_TRIP(super_stripesize, sb, stripesize, 32, V32);
	ROUND_TRIP(super_sys_array_size, sb, sys_chunk_array_size, 32, V32);
	ROUND_TRIP(super_chunk_root_generation, sb, chunk_root_generation, 64, V64);
	ROUND_TRIP(super_compat_flags, sb, compat_flags, 64, V64);
	ROUND_TRIP(super_compat_ro_flags, sb, compat_ro_flags, 64, V64);
	ROUND_TRIP(super_incompat_flags, sb, incompat_flags, 64, V64);
	ROUND_TRIP(super_csum_type, sb, csum_type, 16, V16);
	ROUND_TRIP(super_cache_generation, sb, cache_generation, 64, V64);
	ROUND_TRIP(super_uuid_tree_generation, sb, uuid_tree_generation, 64, V64);

	/* explicit bytes at the published offsets */
	{
		u8 *raw = calloc(1, sizeof(sb));
		sb *s = (sb *)raw;
		static const u8 magic[8] = { '_', 'B', 'H', 'R', 'f', 'S', '_', 'M' };
		static const u8 root[8] = { 0x00, 0x40, 0x50, 0x01, 0x00, 0x00, 0x00, 0x00 };

		CHECK(raw != NULL);
		if (!raw)
			return;
		btrfs_set_super_magic(s, BTRFS_MAGIC);
		btrfs_set_super_root(s, 0x1504000ULL);
		btrfs_set_super_csum_type(s, BTRFS_CSUM_TYPE_XXHASH);
		btrfs_set_super_nodesize(s, 16384);
		CHECK_MEM(raw + 0x40, magic, 8);
		CHECK_MEM(raw + 0x50, root, 8);
		CHECK(raw[0xc4] == 0x01 && raw[0xc5] == 0x00);
		CHECK(raw[0x94] == 0x00 && raw[0x95] == 0x40 && raw[0x96] == 0 && raw[0x97] == 0);
		free(raw);
	}
}

static void test_accessors_tree(void)
{
	ROUND_TRIP(header_bytenr, struct btrfs_header, bytenr, 64, V64);
	ROUND_TRIP(header_flags, struct btrfs_header, flags, 64, V64);
	ROUND_TRIP(header_generation, struct btrfs_header, generation, 64, V64);
	ROUND_TRIP(header_owner, struct btrfs_header, owner, 64, V64);
	ROUND_TRIP(header_nritems, struct btrfs_header, nritems, 32, V32);
	ROUND_TRIP(item_offset, struct btrfs_item, offset, 32, V32);
	ROUND_TRIP(item_size, struct btrfs_item, size, 32, V32);
	ROUND_TRIP(key_ptr_blockptr, struct btrfs_key_ptr, blockptr, 64, V64);
	ROUND_TRIP(key_ptr_generation, struct btrfs_key_ptr, generation, 64, V64);

	ROUND_TRIP(dev_item_devid, struct btrfs_dev_item, devid, 64, V64);
	ROUND_TRIP(dev_item_total_bytes, struct btrfs_dev_item, total_bytes, 64, V64);
	ROUND_TRIP(dev_item_bytes_used, struct btrfs_dev_item, bytes_used, 64, V64);
	ROUND_TRIP(dev_item_generation, struct btrfs_dev_item, generation, 64, V64);

	ROUND_TRIP(chunk_length, struct btrfs_chunk, length, 64, V64);
	ROUND_TRIP(chunk_owner, struct btrfs_chunk, owner, 64, V64);
	ROUND_TRIP(chunk_stripe_len, struct btrfs_chunk, stripe_len, 64, V64);
	ROUND_TRIP(chunk_type, struct btrfs_chunk, type, 64, V64);
	ROUND_TRIP(chunk_sector_size, struct btrfs_chunk, sector_size, 32, V32);
	ROUND_TRIP(chunk_num_stripes, struct btrfs_chunk, num_stripes, 16, V16);
	ROUND_TRIP(chunk_sub_stripes, struct btrfs_chunk, sub_stripes, 16, V16);
	ROUND_TRIP(stripe_devid, struct btrfs_stripe, devid, 64, V64);
	ROUND_TRIP(stripe_offset, struct btrfs_stripe, offset, 64, V64);

	ROUND_TRIP(extent_refs, struct btrfs_extent_item, refs, 64, V64);
	ROUND_TRIP(extent_generation, struct btrfs_extent_item, generation, 64, V64);
	ROUND_TRIP(extent_flags, struct btrfs_extent_item, flags, 64, V64);
	ROUND_TRIP(block_group_used, struct btrfs_block_group_item, used, 64, V64);
	ROUND_TRIP(block_group_chunk_objectid, struct btrfs_block_group_item, chunk_objectid, 64,
		   V64);
	ROUND_TRIP(block_group_flags, struct btrfs_block_group_item, flags, 64, V64);
	ROUND_TRIP(dev_extent_chunk_offset, struct btrfs_dev_extent, chunk_offset, 64, V64);
	ROUND_TRIP(dev_extent_length, struct btrfs_dev_extent, length, 64, V64);
}

static void test_accessors_fs(void)
{
	ROUND_TRIP(timespec_sec, struct btrfs_timespec, sec, 64, V64);
	ROUND_TRIP(timespec_nsec, struct btrfs_timespec, nsec, 32, 999999999U);

	ROUND_TRIP(inode_generation, struct btrfs_inode_item, generation, 64, V64);
	ROUND_TRIP(inode_transid, struct btrfs_inode_item, transid, 64, V64);
	ROUND_TRIP(inode_size, struct btrfs_inode_item, size, 64, V64);
	ROUND_TRIP(inode_nbytes, struct btrfs_inode_item, nbytes, 64, V64);
	ROUND_TRIP(inode_nlink, struct btrfs_inode_item, nlink, 32, V32);
	ROUND_TRIP(inode_uid, struct btrfs_inode_item, uid, 32, V32);
	ROUND_TRIP(inode_gid, struct btrfs_inode_item, gid, 32, V32);
	ROUND_TRIP(inode_mode, struct btrfs_inode_item, mode, 32, 0100644);
	ROUND_TRIP(inode_rdev, struct btrfs_inode_item, rdev, 64, V64);
	ROUND_TRIP(inode_flags, struct btrfs_inode_item, flags, 64, V64);
	ROUND_TRIP(inode_sequence, struct btrfs_inode_item, sequence, 64, V64);

	ROUND_TRIP(inode_ref_index, struct btrfs_inode_ref, index, 64, V64);
	ROUND_TRIP(inode_ref_name_len, struct btrfs_inode_ref, name_len, 16, V16);
	ROUND_TRIP(inode_extref_parent, struct btrfs_inode_extref, parent_objectid, 64, V64);
	ROUND_TRIP(inode_extref_index, struct btrfs_inode_extref, index, 64, V64);
	ROUND_TRIP(inode_extref_name_len, struct btrfs_inode_extref, name_len, 16, V16);

	ROUND_TRIP(dir_transid, struct btrfs_dir_item, transid, 64, V64);
	ROUND_TRIP(dir_data_len, struct btrfs_dir_item, data_len, 16, V16);
	ROUND_TRIP(dir_name_len, struct btrfs_dir_item, name_len, 16, V16);

	ROUND_TRIP(root_generation, struct btrfs_root_item, generation, 64, V64);
	ROUND_TRIP(root_dirid, struct btrfs_root_item, root_dirid, 64, V64);
	ROUND_TRIP(root_bytenr, struct btrfs_root_item, bytenr, 64, V64);
	ROUND_TRIP(root_bytes_used, struct btrfs_root_item, bytes_used, 64, V64);
	ROUND_TRIP(root_last_snapshot, struct btrfs_root_item, last_snapshot, 64, V64);
	ROUND_TRIP(root_flags, struct btrfs_root_item, flags, 64, V64);
	ROUND_TRIP(root_refs, struct btrfs_root_item, refs, 32, V32);
	ROUND_TRIP(root_generation_v2, struct btrfs_root_item, generation_v2, 64, V64);
	ROUND_TRIP(root_ctransid, struct btrfs_root_item, ctransid, 64, V64);
	ROUND_TRIP(root_otransid, struct btrfs_root_item, otransid, 64, V64);

	ROUND_TRIP(root_ref_dirid, struct btrfs_root_ref, dirid, 64, V64);
	ROUND_TRIP(root_ref_sequence, struct btrfs_root_ref, sequence, 64, V64);
	ROUND_TRIP(root_ref_name_len, struct btrfs_root_ref, name_len, 16, V16);

	ROUND_TRIP(file_extent_generation, struct btrfs_file_extent_item, generation, 64, V64);
	ROUND_TRIP(file_extent_ram_bytes, struct btrfs_file_extent_item, ram_bytes, 64, V64);
	ROUND_TRIP(file_extent_other_encoding, struct btrfs_file_extent_item, other_encoding, 16,
		   V16);
	ROUND_TRIP(file_extent_disk_bytenr, struct btrfs_file_extent_item, disk_bytenr, 64, V64);
	ROUND_TRIP(file_extent_disk_num_bytes, struct btrfs_file_extent_item, disk_num_bytes, 64,
		   V64);
	ROUND_TRIP(file_extent_offset, struct btrfs_file_extent_item, offset, 64, V64);
	ROUND_TRIP(file_extent_num_bytes, struct btrfs_file_extent_item, num_bytes, 64, V64);
}

/* A file extent item laid out byte by byte as the format describes it. */
static void test_file_extent_bytes(void)
{
	static const u8 raw[53] = {
		/* generation 7 */
		0x07, 0, 0, 0, 0, 0, 0, 0,
		/* ram_bytes 0x3000 */
		0x00, 0x30, 0, 0, 0, 0, 0, 0,
		/* compression zstd, encryption 0, other_encoding 0 */
		0x03, 0x00, 0x00, 0x00,
		/* type regular */
		0x01,
		/* disk_bytenr 0x1234000 */
		0x00, 0x40, 0x23, 0x01, 0, 0, 0, 0,
		/* disk_num_bytes 0x1000 */
		0x00, 0x10, 0, 0, 0, 0, 0, 0,
		/* offset 0x800 */
		0x00, 0x08, 0, 0, 0, 0, 0, 0,
		/* num_bytes 0x2000 */
		0x00, 0x20, 0, 0, 0, 0, 0, 0,
	};
	const struct btrfs_file_extent_item *fe = (const struct btrfs_file_extent_item *)raw;

	CHECK_EQ_U64(btrfs_file_extent_generation(fe), 7);
	CHECK_EQ_U64(btrfs_file_extent_ram_bytes(fe), 0x3000);
	CHECK_EQ_U64(fe->compression, BTRFS_COMPRESS_ZSTD);
	CHECK_EQ_U64(fe->type, BTRFS_FILE_EXTENT_REG);
	CHECK_EQ_U64(btrfs_file_extent_disk_bytenr(fe), 0x1234000);
	CHECK_EQ_U64(btrfs_file_extent_disk_num_bytes(fe), 0x1000);
	CHECK_EQ_U64(btrfs_file_extent_offset(fe), 0x800);
	CHECK_EQ_U64(btrfs_file_extent_num_bytes(fe), 0x2000);
	/* inline data would start where disk_bytenr is */
	CHECK(raw + BTRFS_FILE_EXTENT_INLINE_DATA_START == (const u8 *)&fe->disk_bytenr);
}

/* A chunk item with two stripes as bytes, read through the accessors. */
static void test_chunk_bytes(void)
{
	u8 raw[112];
	const struct btrfs_chunk *c = (const struct btrfs_chunk *)raw;
	const struct btrfs_stripe *s1 = &c->stripe + 1;

	memset(raw, 0, sizeof(raw));
	raw[3] = 0x40;                  /* length 0x40000000 (1 GiB) */
	raw[8] = 2;                     /* owner: extent tree */
	raw[18] = 0x01;                 /* stripe_len 0x10000 */
	raw[24] = 0x11;                 /* type DATA | RAID1 */
	raw[41] = 0x10;                 /* sector_size 4096 */
	raw[44] = 2;                    /* num_stripes */
	raw[46] = 1;                    /* sub_stripes */
	raw[48] = 1;                    /* stripe 0: devid 1 */
	raw[58] = 0x50;                 /* stripe 0: offset 0x500000 */
	raw[80] = 2;                    /* stripe 1: devid 2 */
	raw[88 + 3] = 0x01;             /* stripe 1: offset 0x1000000 */
	raw[96] = 0xee;                 /* stripe 1: uuid[0] */

	CHECK_EQ_U64(btrfs_chunk_length(c), 1ULL << 30);
	CHECK_EQ_U64(btrfs_chunk_owner(c), 2);
	CHECK_EQ_U64(btrfs_chunk_stripe_len(c), BTRFS_STRIPE_LEN);
	CHECK_EQ_U64(btrfs_chunk_type(c), BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID1);
	CHECK_EQ_U64(btrfs_chunk_sector_size(c), 4096);
	CHECK_EQ_U64(btrfs_chunk_num_stripes(c), 2);
	CHECK_EQ_U64(btrfs_chunk_sub_stripes(c), 1);
	CHECK_EQ_U64(btrfs_stripe_devid(&c->stripe), 1);
	CHECK_EQ_U64(btrfs_stripe_offset(&c->stripe), 0x500000);
	CHECK_EQ_U64(btrfs_stripe_devid(s1), 2);
	CHECK_EQ_U64(btrfs_stripe_offset(s1), 0x1000000);
	CHECK_EQ_U64(s1->dev_uuid[0], 0xee);
}

static void test_key_conversion(void)
{
	static const u8 expect[17] = {
		0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* objectid */
		0x6c,                                           /* type 108 */
		0xf0, 0xde, 0xbc, 0x9a, 0x78, 0x56, 0x34, 0x12, /* offset */
	};
	struct btrfs_key cpu = { 0x0102030405060708ULL, BTRFS_EXTENT_DATA_KEY,
				 0x123456789abcdef0ULL };
	struct btrfs_key back;
	struct btrfs_disk_key disk;

	btrfs_cpu_to_disk_key(&disk, &cpu);
	CHECK_MEM(&disk, expect, 17);
	btrfs_disk_to_cpu_key(&back, (const struct btrfs_disk_key *)expect);
	CHECK_EQ_U64(back.objectid, cpu.objectid);
	CHECK_EQ_U64(back.type, cpu.type);
	CHECK_EQ_U64(back.offset, cpu.offset);
	CHECK(btrfs_comp_keys(&back, &cpu) == 0);
}

static int sign(int v)
{
	return (v > 0) - (v < 0);
}

static void test_key_order(void)
{
	/* strictly increasing in btrfs key order */
	static const struct btrfs_key keys[] = {
		{ 0, 0, 0 },
		{ 0, 0, 1 },
		{ 0, 0, UINT64_MAX },
		{ 0, 1, 0 },
		{ 0, 255, 0 },
		{ 1, 0, 0 },
		{ 256, BTRFS_INODE_ITEM_KEY, 0 },
		{ 256, BTRFS_INODE_REF_KEY, 256 },
		{ 256, BTRFS_DIR_ITEM_KEY, 0x7fffffffffffffffULL },
		{ 256, BTRFS_DIR_ITEM_KEY, 0x8000000000000000ULL },
		{ 256, BTRFS_DIR_INDEX_KEY, 2 },
		{ 256, BTRFS_EXTENT_DATA_KEY, 0 },
		{ 256, BTRFS_EXTENT_DATA_KEY, 4096 },
		{ 257, BTRFS_INODE_ITEM_KEY, 0 },
		{ 0x8000000000000000ULL, 0, 0 },
		{ BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, 0 },
		{ BTRFS_TREE_LOG_OBJECTID, BTRFS_ROOT_ITEM_KEY, 5 },
		{ UINT64_MAX, 255, UINT64_MAX - 1 },
		{ UINT64_MAX, 255, UINT64_MAX },
	};
	size_t n = sizeof(keys) / sizeof(keys[0]);

	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < n; j++) {
			int want = i < j ? -1 : i > j ? 1 : 0;

			if (sign(btrfs_comp_keys(&keys[i], &keys[j])) != want) {
				fprintf(stderr, "key order: %zu vs %zu\n", i, j);
				CHECK(0);
			}
		}
}

int main(void)
{
	RUN(test_struct_sizes);
	RUN(test_super_offsets);
	RUN(test_tree_struct_offsets);
	RUN(test_fs_struct_offsets);
	RUN(test_constants);
	RUN(test_sb_offset);
	RUN(test_raw_le);
	RUN(test_accessors_super);
	RUN(test_accessors_tree);
	RUN(test_accessors_fs);
	RUN(test_file_extent_bytes);
	RUN(test_chunk_bytes);
	RUN(test_key_conversion);
	RUN(test_key_order);
	return check_summary();
}
