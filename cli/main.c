/*
 * main.c — the `butter` command: find the command named by argv and run it.
 *
 * Commands are rows of one table; a two-word command ("subvolume list") is a
 * row whose name has a space, and the first word alone names its group. A new
 * command is a new row (and its cmd_*.c file); nothing else changes here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#ifdef BUTTER_HAVE_FUSE
#include "mount.h" /* fuse/mount.h: `butter mount` */

static int cmd_mount(const struct cli_command *cmd, int argc, char **argv)
{
	(void)cmd;
	return butter_mount_main(argc, argv, cli_test_devices.record_log,
				 cli_test_devices.fault_spec);
}
#endif

static const struct cli_command commands[] = {
	{
		.name = "info",
		.main = cmd_info,
		.summary = "show label, fsid, sizes, features, devices and chunk profiles",
		.synopsis = "[--raw] [--device DEV]... IMAGE",
		.usage = "Show what the superblocks and the chunk tree say about the filesystem.\n"
			 "\n"
			 "  --raw          print sizes in bytes\n",
	},
	{
		.name = "ls",
		.main = cmd_ls,
		.summary = "list a directory of the image",
		.synopsis = "[-l] [--device DEV]... IMAGE [PATH]",
		.usage = "List the directory PATH (default \"/\") one name a line, sorted by name\n"
			 "(bytewise). If PATH is not a directory, show PATH itself.\n"
			 "\n"
			 "  -l, --long     mode, links, uid, gid, size, mtime, name (and \"-> target\")\n",
	},
	{
		.name = "cat",
		.main = cmd_cat,
		.summary = "write a file of the image to standard output",
		.synopsis = "[--device DEV]... IMAGE PATH",
		.usage = "Write the contents of the file PATH to standard output (symlinks are\n"
			 "followed inside the image). Stops with an error at an unreadable range.\n",
	},
	{
		.name = "extract",
		.main = cmd_extract,
		.summary = "copy files out of the image into a host directory",
		.synopsis = "[-v] [-q] [-j N] [--device DEV]... IMAGE [SRC] DEST",
		.usage = "Copy SRC (default \"/\") out of the image. A directory SRC becomes DEST\n"
			 "itself (DEST is created if missing and receives SRC's contents and\n"
			 "attributes); any other SRC is created as DEST/NAME. Modes, owners,\n"
			 "timestamps, xattrs and ACLs, symlinks, hard links, fifos, sockets,\n"
			 "device nodes and holes are preserved; subvolumes become directories.\n"
			 "Unreadable ranges are reported by path and skipped (left as holes);\n"
			 "the exit status is 1 if anything could not be copied.\n"
			 "\n"
			 "  -v, --verbose  print each path as it is extracted\n"
			 "  -q, --quiet    no progress line on a terminal\n"
			 "  -j, --jobs N   copy up to N files at once, each on its own thread\n"
			 "                 (default: the number of online CPUs, at most 8; 1 to\n"
			 "                 64). The walk and the result are the same for every N;\n"
			 "                 only messages about different files may come in\n"
			 "                 another order.\n",
	},
	{
		.name = "subvolume list",
		.main = cmd_subvolume_list,
		.summary = "list the subvolumes and snapshots",
		.synopsis = "[-r] [-s] [-t] [-p] [-a] [-c] [-u] [-q] [-R] [-f] [--device DEV]... IMAGE|PATH",
		.usage = "One line per subvolume, as `btrfs subvolume list` prints it:\n"
			 "  ID <id> gen <gen> top level <parent id> path <path>\n"
			 "\n"
			 "  -r, --readonly       only read-only subvolumes\n"
			 "  -s                   only snapshots (with a parent uuid), adding cgen and otime\n"
			 "  -t                   a table, as progs prints it\n"
			 "  -p                   add the parent's id\n"
			 "  -a                   nested subvolumes' paths from \"<FS_TREE>/\"\n"
			 "  -c, --cgen           add the generation at creation\n"
			 "  -u, --uuid           add the uuid\n"
			 "  -q, --parent-uuid    add the parent uuid (snapshots)\n"
			 "  -R, --received-uuid  add the received uuid\n"
			 "  -f, --flags          add \"flags ro\" or \"flags -\" before the path\n"
			 "  -g, -o               accepted (gen is always shown; paths are from the top)\n",
	},
	{
		.name = "subvolume show",
		.main = cmd_subvolume_show,
		.summary = "show a subvolume's uuids, generations, times and snapshots",
		.synopsis = "[--device DEV]... IMAGE PATH | -r ID IMAGE | [-r ID] MOUNTED-PATH",
		.usage = "What `btrfs subvolume show` prints, in its layout, of the subvolume\n"
			 "whose root directory is PATH inside IMAGE (or of id ID):\n"
			 "\n"
			 "  -r, --rootid ID  the subvolume with this id\n",
	},
	{
		.name = "subvolume find-new",
		.main = cmd_subvolume_find_new,
		.summary = "list the file extents written since a generation",
		.synopsis = "[--device DEV]... IMAGE PATH LASTGEN | MOUNTED-PATH LASTGEN",
		.usage = "As `btrfs subvolume find-new`: every file extent of the subvolume whose\n"
			 "root directory is PATH (inside IMAGE, or inside a live mount) written\n"
			 "in generation LASTGEN or later, with its file's path, then the\n"
			 "subvolume's generation (\"transid marker\") to start the next call from.\n"
			 "A mount is committed first.\n",
	},
	{
		.name = "subvolume get-default",
		.main = cmd_subvolume_get_default,
		.summary = "show the default subvolume (what a mount without subvol= shows)",
		.synopsis = "[--device DEV]... IMAGE|MOUNTED-PATH",
		.usage = "As `btrfs subvolume get-default`: \"ID 5 (FS_TREE)\" for the top level,\n"
			 "else the subvolume's line as `subvolume list` prints it.\n",
	},
	{
		.name = "subvolume set-default",
		.main = cmd_subvolume_set_default,
		.summary = "make a subvolume the default one",
		.synopsis = "[--device DEV]... IMAGE ID|PATH | [ID] MOUNTED-PATH",
		.usage = "Make the subvolume with id ID (0 or 5: the top level), or whose root is\n"
			 "PATH inside IMAGE, the one a mount without subvol= or subvolid= shows,\n"
			 "as `btrfs subvolume set-default` does. Committed at once.\n",
	},
	{
		.name = "subvolume create",
		.main = cmd_subvolume_create,
		.summary = "create an empty subvolume in an image",
		.synopsis = "[--device DEV]... [IMAGE] PATH",
		.usage = "Create the empty subvolume PATH (its parent directory must exist):\n"
			 "inside IMAGE, or without IMAGE a path inside a live `butter mount`.\n",
	},
	{
		.name = "filesystem df",
		.main = cmd_filesystem,
		.summary = "space by chunk type and profile",
		.synopsis = "[-b|-h|-H|-k|-m|-g|-t] [--iec|--si] [--device DEV]... IMAGE|PATH",
		.usage = "One line per kind of chunk, as `btrfs filesystem df`. IMAGE is an\n"
			 "image file or device; PATH a directory inside a live `butter mount`.\n"
			 "Sizes as btrfs-progs prints them:\n"
			 "  -b, --raw             bytes\n"
			 "  -h, --human-readable  base 1024: KiB, MiB, ... (the default)\n"
			 "  -H                    base 1000: kB, MB, ...\n"
			 "  -k, -m, -g, -t        in KiB, MiB, GiB, TiB (--kbytes ... --tbytes)\n"
			 "  --iec, --si           base 1024 or 1000 for the rest\n"
			 "(-h is human-readable here, as in btrfs; --help is help.)\n",
	},
	{
		.name = "filesystem show",
		.main = cmd_filesystem,
		.summary = "label, uuid, size and devices",
		.synopsis = "[--raw|--kbytes|--mbytes|--gbytes|--tbytes|--human-readable] [--si|--iec]\n"
			    "       [--device DEV]... IMAGE|PATH",
		.usage = "The label, fsid, bytes used and (for an image) every device, as\n"
			 "`btrfs filesystem show` prints them, in its units.\n",
	},
	{
		.name = "filesystem usage",
		.main = cmd_usage,
		.summary = "space of each device: allocated by kind, unallocated, free",
		.synopsis = "[-b|-h|-H|-k|-m|-g|-t] [--iec|--si] [--device DEV]... IMAGE|PATH",
		.usage = "What `btrfs filesystem usage` prints, in its layout and units: the\n"
			 "totals, then each kind of chunk with the bytes it takes on each device,\n"
			 "then each device's unallocated bytes. IMAGE is an image file or\n"
			 "device; PATH a directory inside a live `butter mount` (root: the chunk\n"
			 "tree is read as btrfs's TREE_SEARCH reads it).\n",
	},
	{
		.name = "filesystem du",
		.main = cmd_du,
		.summary = "bytes of files: total, exclusive, shared (or per compression)",
		.synopsis = "[-s] [--raw|--human-readable|--kbytes|...] PATH...\n"
			    "       [-s] [units] [--device DEV]... IMAGE [PATH]...\n"
			    "       --compression [-b] PATH... | [--device DEV]... IMAGE [PATH]...",
		.usage = "What `btrfs filesystem du` prints for every regular file and directory\n"
			 "under each PATH (inside a live mount, or inside IMAGE; default: all):\n"
			 "the bytes of its extents (Total), those nothing else shares (Exclusive:\n"
			 "no other file, range or snapshot), and for each PATH the bytes its shared\n"
			 "extents cover once (Set shared). Bytes unless a unit option says\n"
			 "otherwise (progs' long ones: --human-readable, --kbytes, --si, ...).\n"
			 "  -s, --summarize  a line for each PATH only\n"
			 "\n"
			 "With --compression, what compsize(8) reports for the regular files\n"
			 "under each PATH (a live mount, a kernel btrfs mount, or inside IMAGE):\n"
			 "per algorithm the bytes on disk, the bytes they hold uncompressed and\n"
			 "the bytes the files refer to. An extent shared by several files (or\n"
			 "reflinks, snapshots) counts once on disk, once per reference as\n"
			 "referenced. Sizes in compsize's short form unless -b (bytes).\n",
	},
	{
		.name = "filesystem sync",
		.main = cmd_filesystem,
		.summary = "commit what a live mount has written",
		.synopsis = "PATH",
		.usage = "Commit everything written to the `butter mount` holding PATH so far.\n",
	},
	{
		.name = "heatmap",
		.main = cmd_heatmap,
		.summary = "draw where data and metadata lie on each device (PNG)",
		.synopsis = "[--trace FILE] [--size PIXELS] [-o FILE.png] [--device DEV]... IMAGE|PATH",
		.usage = "Draw each device's bytes as a square (a Hilbert curve through it, so\n"
			 "bytes close on the device are close in the picture), side by side:\n"
			 "black is unallocated; white data, blue metadata, red system, purple mixed\n"
			 "block groups, dim when empty and bright when full; with --trace, the\n"
			 "places the traced files' data is read from in orange (a trace as\n"
			 "`layout` takes it). See before and after `layout` or `filesystem\n"
			 "defragment`. Prints each device's allocated, used and traced bytes.\n"
			 "IMAGE is read offline; a PATH inside a live `butter mount` commits it\n"
			 "first and reads its image.\n"
			 "  --trace FILE    highlight the files of this access trace\n"
			 "  --size PIXELS   side of each device's square, a power of two from 16\n"
			 "                  to 4096 (default 256)\n"
			 "  -o FILE.png     where to write the picture (default heatmap.png)\n",
	},
	{
		.name = "layout",
		.main = cmd_layout,
		.summary = "place the files an access trace reads one after another, in its order",
		.synopsis = "--trace FILE [--device DEV]... IMAGE|PATH",
		.usage = "Move the data the trace FILE reads so that it lies in one run, in the\n"
			 "order it is read, in a fresh region of the disk: a cold start that reads\n"
			 "those files then reads sequentially. FILE is what `butter mount -o\n"
			 "trace=FILE` recorded (files by subvolume and inode, with the ranges\n"
			 "read), or a plain list of paths, one a line (e.g. from fatrace),\n"
			 "read whole. Snapshot-aware as `filesystem defragment`: data shared with\n"
			 "snapshots or reflinks moves once, for all its owners. IMAGE is worked on\n"
			 "offline; PATH is the top of a live `butter mount`, where the trace's\n"
			 "paths start. Prints the runs and the seek distance (bytes skipped\n"
			 "between runs, in logical addresses) before and after, and what moved.\n",
	},
	{
		.name = "filesystem defragment",
		.main = cmd_defrag,
		.summary = "make files' data lie in one run, keeping what snapshots share",
		.synopsis = "[-r] [-v] [-c[ALGO]] [-L LEVEL] [-t SIZE] [-s START] [-l LEN] PATH... | "
			    "[--device DEV]... IMAGE [PATH...]",
		.usage = "Lay the data of each file out again so that it lies in one contiguous\n"
			 "run, in file order. Data only the file uses is rewritten into extents as\n"
			 "large as the free space allows. Snapshot-aware: an extent shared with\n"
			 "snapshots or reflinked files is moved once and every file that shares it\n"
			 "follows, so nothing shared is copied apart (the kernel's defragment\n"
			 "breaks sharing); checksums move with it. PATHs inside a live\n"
			 "`butter mount` are defragmented by the mount; with an IMAGE first, PATHs\n"
			 "are inside it (default \"/\"). Every file is committed when done.\n"
			 "\n"
			 "  -r          files in directories too, recursively (within one subvolume)\n"
			 "  -v          a line for each file\n"
			 "  -c[ALGO]    rewrite the files' own data compressed with zlib (default),\n"
			 "              lzo or zstd, fragmented or not; shared data keeps its own\n"
			 "  -L LEVEL    the compression level (zlib 1-9, zstd 1-15)\n"
			 "  -t SIZE     leave files whose every run is at least SIZE (default 32M)\n"
			 "  -s START    from this file offset (default 0)\n"
			 "  -l LEN      this many bytes (default: to the end)\n"
			 "  -f          accepted (btrfs-progs' flush); each file is committed anyway\n",
	},
	{
		.name = "send",
		.main = cmd_send,
		.summary = "write a read-only subvolume as a btrfs send stream",
		.synopsis = "[-f FILE] [-p PARENT] [-q] [--device DEV]... IMAGE PATH\n"
			    "       [-f FILE] [-p PARENT] [-q] MOUNTED-PATH",
		.usage = "Write the read-only subvolume PATH of the image as a send stream\n"
			 "(version 1) to standard output or FILE, for\n"
			 "`btrfs receive`, which makes it a read-only subvolume again with PATH's\n"
			 "uuid as its received uuid. A writable subvolume is refused, as by\n"
			 "btrfs send: snapshot it with -r first. Nested subvolumes are not part\n"
			 "of the stream. With MOUNTED-PATH (and PARENT) inside a live `butter\n"
			 "mount`, the mount commits and the stream is made from that commit.\n"
			 "\n"
			 "  -f FILE        write to FILE instead of standard output\n"
			 "  -p PARENT      an incremental stream: the changes from the read-only\n"
			 "                 subvolume PARENT, which the receiver already has\n"
			 "  -q, --quiet    no progress line on a terminal\n",
	},
	{
		.name = "receive",
		.main = cmd_receive,
		.summary = "apply a btrfs send stream to an image or a mount",
		.synopsis = "[-f FILE] [-q] [-e] [--device DEV]... IMAGE [DIR]\n"
			    "       [-f FILE] [-q] [-e] DIR-IN-MOUNT\n"
			    "       --dump [-f FILE]",
		.usage = "Read a send stream (from `btrfs send` or `butter send`) from standard\n"
			 "input or FILE and make its subvolumes in the directory DIR of the\n"
			 "image (default \"/\"), as `btrfs receive` does: read-only, with the\n"
			 "sender's uuid as their received uuid. An incremental stream needs its\n"
			 "parent received here before. Version 2 streams work unless they use\n"
			 "version 2's own commands (fallocate, fileattr, encoded writes).\n"
			 "DIR-IN-MOUNT, a directory inside a live `butter mount`: the daemon\n"
			 "receives there from a pipe this command fills (root only, as btrfs\n"
			 "receive; the mount's log says where a damaged stream broke).\n"
			 "\n"
			 "--dump prints the stream's commands, one a line, as btrfs receive --dump\n"
			 "does, and applies nothing.\n"
			 "\n"
			 "  -f FILE        read FILE instead of standard input\n"
			 "  -e             stop at the first end marker (read nothing after it)\n"
			 "  -q, --quiet    no progress line on a terminal\n",
	},
	{
		.name = "device add",
		.main = cmd_device_add,
		.summary = "add a device to the filesystem of an image",
		.synopsis = "[-f] [--device DEV]... IMAGE NEWDEV",
		.usage = "Make NEWDEV (an image file, block device or NBD URI, at least 16 MiB)\n"
			 "a device of the filesystem, as `btrfs device add`: new chunks may be\n"
			 "allocated on it; existing ones stay where they are. Its first MiB and\n"
			 "superblock places are overwritten. From then on the filesystem opens\n"
			 "only with NEWDEV among its devices (--device NEWDEV, or `device=` for\n"
			 "mount).\n"
			 "\n"
			 "  -f, --force    overwrite a device that holds another btrfs filesystem\n",
	},
	{
		.name = "device remove",
		.main = cmd_device_remove,
		.summary = "move everything off devices, then drop them from the filesystem",
		.synopsis = "[--device DEV]... DEVID|DEVICE|missing... IMAGE",
		.usage = "As `btrfs device remove`: every block group with a stripe on the device\n"
			 "moves to the other devices (keeping every shared extent shared), then\n"
			 "the device leaves the filesystem and its superblocks are wiped. Refused\n"
			 "when the profiles in use need more devices than would remain (convert\n"
			 "them first with `balance start -dconvert=... -mconvert=...`).\n",
	},
	{
		.name = "device delete",
		.main = cmd_device_remove,
		.summary = "the same as device remove",
		.synopsis = "[--device DEV]... DEVID|DEVICE|missing... IMAGE",
		.usage = "An alias of `butter device remove`.\n",
	},
	{
		.name = "replace start",
		.main = cmd_replace_start,
		.summary = "replace a device, copying only what is used on it",
		.synopsis = "[-r] [-f] [-B] [--device DEV]... SRC TARGET IMAGE|PATH",
		.usage = "As `btrfs replace start`: SRC (a devid, a member's path, or missing) is\n"
			 "replaced by TARGET (an image file, block device or NBD URI at least as\n"
			 "large as the part of SRC in use): only the used parts of SRC are\n"
			 "copied, read through the checked paths (a bad or missing copy is read\n"
			 "from the other copies or rebuilt from parity), to the same places on\n"
			 "TARGET, which then takes SRC's devid; SRC's superblocks are wiped. On\n"
			 "an image (it runs to its end), or a directory inside a live `butter\n"
			 "mount`: its daemon copies a piece at a time while the mount serves\n"
			 "every request (writes meanwhile reach both devices), in the background\n"
			 "as btrfs does unless -B; `butter replace status|cancel PATH` follow it.\n"
			 "Nothing of a running replace is recorded: after an unmount or crash the\n"
			 "old device is in place, and the replace is started again.\n"
			 "\n"
			 "  -B             on a mount, wait for the replace to end\n"
			 "  -f, --force    overwrite a TARGET holding another btrfs filesystem\n"
			 "  -r             read SRC only where no other copy is good (a failing disk)\n",
	},
	{
		.name = "replace status",
		.main = cmd_replace_ctl,
		.summary = "progress of the replace a mount runs",
		.synopsis = "[-1] PATH",
		.usage = "As `btrfs replace status`: the running (or last) replace of the live\n"
			 "`butter mount` holding PATH, printed every second until it ends.\n"
			 "\n"
			 "  -1             print once and return\n",
	},
	{
		.name = "replace cancel",
		.main = cmd_replace_ctl,
		.summary = "stop the replace a mount runs; the old device stays",
		.synopsis = "PATH",
		.usage = "As `btrfs replace cancel`: the replace of the live `butter mount` holding\n"
			 "PATH stops after its current piece; the old device stays in place and\n"
			 "the new one belongs to nothing.\n",
	},
	{
		.name = "balance start",
		.main = cmd_balance_start,
		.summary = "move block groups elsewhere: compact, spread, convert profiles",
		.synopsis = "[-d[FILTERS]] [-m[FILTERS]] [-s[FILTERS]] [-f] [--full-balance]\n"
			    "       [-q] [--device DEV]... IMAGE|PATH",
		.usage = "As `btrfs balance start`: every block group the filters select (all of\n"
			 "them with none given) is emptied into other or new groups and its chunk\n"
			 "removed; data and tree blocks shared by snapshots or reflinks stay\n"
			 "shared. PATH is a directory inside a live `butter mount`: the mount's\n"
			 "daemon runs the balance (serving everything else between block groups)\n"
			 "and this waits for it unless --bg; IMAGE an image file or device. A\n"
			 "balance is recorded on disk until it ends, as the kernel records it, so\n"
			 "an interrupted one can be resumed (by butter or a kernel mount).\n"
			 "\n"
			 "  -d[FILTERS]   data block groups      -m[FILTERS]   metadata (and system)\n"
			 "  -s[FILTERS]   system (needs -f)      -f, --force   allow lowering the\n"
			 "                                                     metadata redundancy\n"
			 "  --bg          on a mount: return once the balance runs\n"
			 "  -v            say which block group moves\n"
			 "  -q            no progress line (drawn only on a terminal anyway)\n"
			 "FILTERS, comma-separated: usage=N|N..M (percent used), devid=N,\n"
			 "drange=N..M (bytes on devid), vrange=N..M (logical bytes), limit=N|N..M,\n"
			 "stripes=N|N..M, profiles=P|P..., convert=PROFILE, soft (with convert:\n"
			 "skip groups already converted). PROFILE: single, dup, raid0, raid1,\n"
			 "raid1c3, raid1c4, raid10, raid5, raid6.\n",
	},
	{
		.name = "balance status",
		.main = cmd_balance_ctl,
		.summary = "is a balance running, paused or recorded, and how far it got",
		.synopsis = "[--device DEV]... IMAGE|PATH",
		.usage = "As `btrfs balance status`: exit status 1 while a balance runs or is\n"
			 "recorded (paused, or interrupted by a crash), 0 when there is none.\n",
	},
	{
		.name = "balance pause",
		.main = cmd_balance_ctl,
		.summary = "stop the running balance after its current block group",
		.synopsis = "PATH",
		.usage = "The balance stays recorded: `balance resume` (or the next mount)\n"
			 "goes on with it.\n",
	},
	{
		.name = "balance cancel",
		.main = cmd_balance_ctl,
		.summary = "stop a balance and drop its record",
		.synopsis = "[--device DEV]... IMAGE|PATH",
		.usage = "Block groups already moved stay where they went.\n",
	},
	{
		.name = "balance resume",
		.main = cmd_balance_ctl,
		.summary = "go on with the balance recorded on disk",
		.synopsis = "[--bg] [--device DEV]... IMAGE|PATH",
		.usage = "With the arguments it was started with (by butter or by the kernel).\n"
			 "\n"
			 "  --bg           on a mount: return once it runs\n",
	},
	{
		.name = "filesystem resize",
		.main = cmd_filesystem_resize,
		.summary = "grow or shrink the space a device gives the filesystem",
		.synopsis = "[--device DEV]... [DEVID:][+|-]SIZE[kKmMgGtT]|[DEVID:]max IMAGE",
		.usage = "As `btrfs filesystem resize`, on an image, without root or a mount:\n"
			 "grow into the device (max: all of it), or shrink, moving the block\n"
			 "groups that lie past the new end to the space that remains. DEVID\n"
			 "defaults to 1. The image file keeps its size (truncate it after).\n",
	},
	{
		.name = "device usage",
		.main = cmd_usage,
		.summary = "what each device holds, by kind of chunk",
		.synopsis = "[-b|-h|-H|-k|-m|-g|-t] [--iec|--si] [--device DEV]... IMAGE|PATH",
		.usage = "What `btrfs device usage` prints: per device its size, slack, the\n"
			 "bytes of each kind of chunk on it and what is unallocated.\n",
	},
	{
		.name = "device stats",
		.main = cmd_device_stats,
		.summary = "show (or reset) each device's error counters",
		.synopsis = "[-z] [-c] [--device DEV]... IMAGE|PATH",
		.usage = "Print the error counters the filesystem keeps per device, as `btrfs\n"
			 "device stats`: write, read and flush I/O errors, corruption (checksum\n"
			 "mismatches) and generation errors (stale tree blocks). butter counts them\n"
			 "as the kernel does and a read-write open writes them to the device tree,\n"
			 "where the kernel finds them (and the other way round). PATH, a directory\n"
			 "inside a live `butter mount`, asks that mount.\n"
			 "\n"
			 "  -z, --reset    print the counters, then set them to zero (committed)\n"
			 "  -c, --check    exit 64 if a counter is not zero\n",
	},
	{
		.name = "check",
		.main = cmd_check,
		.summary = "check the trees and the extent tree's bookkeeping (read-only)",
		.synopsis = "[-f] [--readonly] [--device DEV]... IMAGE",
		.usage = "Read every tree and check that it hangs together, that the extent\n"
			 "tree's reference counts match the pointers the trees hold, that\n"
			 "block group usage matches its extents, and that no device is smaller\n"
			 "than the filesystem records. Each problem is printed on stderr. Exit\n"
			 "status 1 when a problem was found. Not checked yet: inode link counts\n"
			 "and directory entries, checksum coverage, the free space tree (btrfs\n"
			 "check --readonly covers those). A filesystem open read-write elsewhere\n"
			 "(a live `butter mount`) is refused, as btrfs check refuses it.\n"
			 "\n"
			 "  -f, --force    check it anyway, as it is on disk now\n"
			 "  --readonly     accepted, as btrfs check takes it: butter check never writes\n",
	},
	{
		.name = "scrub",
		.main = cmd_scrub,
		.summary = "check every copy of the used blocks and repair bad ones",
		.synopsis = "[-q] [-r] [--limit SIZE] [--device DEV]... IMAGE|PATH\n"
			    "       start|resume [-B] [-q] [-r] [-d] [-R] [--limit SIZE] IMAGE|PATH\n"
			    "       status [-d] [-R] [--raw|--si|--iec|...] IMAGE|PATH\n"
			    "       cancel IMAGE|PATH",
		.usage = "Read every copy of every allocated block: tree blocks against their\n"
			 "headers, data against the csum tree, every superblock copy, and the\n"
			 "parity of RAID5/6 rows that hold data. A bad copy is rewritten from a\n"
			 "good one (a mirror, or a rebuild from RAID5/6 parity); parity that\n"
			 "disagrees with its data is recomputed. Free space is not read. Each\n"
			 "error is reported on stderr as found, with its logical address, copy,\n"
			 "and for data the subvolume, inode and file offset; totals follow.\n"
			 "PATH, a directory inside a live `butter mount`, scrubs that mount: the\n"
			 "daemon does the work in a thread of its own, 64 MiB at a time (the mount\n"
			 "stays usable), and logs each error in its log.\n"
			 "Exit status: 0 nothing wrong is left, 3 errors remain (with -r, or no\n"
			 "good copy), 1 the scrub could not run, 2 cancel or resume of nothing.\n"
			 "\n"
			 "btrfs-progs' grammar: on a mount, `scrub start` starts the daemon's scrub\n"
			 "and returns (-B: waits, then prints progs' summary); `status` reports\n"
			 "the running or last scrub as progs does (--format json: README);\n"
			 "`cancel` stops it after its step; `resume` goes on from there. On an\n"
			 "image, `start` scrubs in the foreground and prints the summary; an\n"
			 "image has no scrub in the background, so `status` has no stats and\n"
			 "`cancel` and `resume` find nothing. -d is accepted (one report for the\n"
			 "filesystem); -R prints bytes.\n"
			 "\n"
			 "  -r, --readonly  report only; an image is opened read-only\n"
			 "  --limit SIZE    at most SIZE bytes a second (K, M, G suffixes); 0 none\n"
			 "  -q              no progress line (drawn only on a terminal anyway)\n",
	},
	{
		.name = "filesystem label",
		.main = cmd_filesystem,
		.summary = "show or set the label",
		.synopsis = "[--device DEV]... IMAGE|PATH [LABEL]",
		.usage = "Print the label, or set it to LABEL (at most 255 bytes; committed).\n",
	},
	{
		.name = "subvolume snapshot",
		.main = cmd_subvolume_snapshot,
		.summary = "snapshot a subvolume of an image",
		.synopsis = "[-r] [--device DEV]... [IMAGE] SOURCE PATH",
		.usage = "Make PATH a snapshot of the subvolume SOURCE (both paths inside the\n"
			 "image, or without IMAGE inside a live `butter mount`, where the\n"
			 "snapshot holds everything written before the command; PATH's parent\n"
			 "directory must exist). It costs the same whatever the size of SOURCE:\n"
			 "the two share every block until either changes.\n"
			 "\n"
			 "  -r, --readonly  a read-only snapshot\n",
	},
	{
		.name = "subvolume delete",
		.main = cmd_subvolume_delete,
		.summary = "delete a subvolume or snapshot of an image",
		.synopsis = "[--device DEV]... [IMAGE] PATH",
		.usage = "Delete the subvolume or snapshot PATH (in IMAGE, or without IMAGE in a\n"
			 "live `butter mount`) with everything in it, and free\n"
			 "the space only it used. A subvolume that contains subvolumes is refused.\n",
	},
	{
		.name = "property get",
		.main = cmd_property,
		.summary = "show the properties of a file, subvolume or the filesystem",
		.synopsis = "[--device DEV]... IMAGE PATH [NAME] | MOUNTED-PATH [NAME]",
		.usage = "As `btrfs property get`: \"NAME=VALUE\" lines. NAME is ro (PATH is a\n"
			 "subvolume's root), label (PATH is /) or compression (any file or\n"
			 "directory; shown only when set). Without NAME, all that PATH has.\n",
	},
	{
		.name = "property set",
		.main = cmd_property,
		.summary = "set a property: ro, label or compression",
		.synopsis = "[--device DEV]... IMAGE PATH NAME VALUE | MOUNTED-PATH NAME VALUE",
		.usage = "As `btrfs property set`: ro true|false (a subvolume's root; a received\n"
			 "subvolume stays read-only), label TEXT (PATH is /), compression\n"
			 "zlib|lzo|zstd[:LEVEL]|no|none (an empty VALUE removes it; chattr's c or\n"
			 "m follow). Committed at once.\n",
	},
	{
		.name = "property list",
		.main = cmd_property,
		.summary = "list the properties PATH can have",
		.synopsis = "[--device DEV]... IMAGE PATH | MOUNTED-PATH",
		.usage = "As `btrfs property list`: each property PATH can have, with what it is.\n",
	},
	{
		.name = "mkfs",
		.main = cmd_mkfs,
		.summary = "make a btrfs filesystem, optionally filled from a host directory",
		.synopsis = "[-L LABEL] [-d PROFILE] [-m PROFILE] [-n NODESIZE] [-s SECTORSIZE]\n"
			    "                   [--csum ALGO] [-b SIZE] [-f] [-M] [-q] [-v] [--rootdir DIR [--subvol PATH]...\n"
			    "                   [--compress ALGO] [--max-inline SIZE] [--shrink]]"
			    "                   DEV...",
		.usage = "Make one btrfs filesystem over the image files, block devices or NBD\n"
			 "exports (nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH) DEV...\n"
			 "(with the features of current mkfs.btrfs: no-holes, free-space-tree,\n"
			 "skinny-metadata, extref). An image file that does not exist is created\n"
			 "with -b SIZE; a smaller one is grown to it. A device that holds a btrfs\n"
			 "filesystem is refused without -f. SIZE takes K, M, G, T suffixes. When\n"
			 "mkfs fails, the image files it created are removed again.\n"
			 "\n"
			 "  -L, --label LABEL        filesystem label\n"
			 "  -d, --data PROFILE       data profile: single, dup, raid0, raid1, raid1c3,\n"
			 "                           raid1c4, raid10, raid5, raid6 (default single)\n"
			 "  -m, --metadata PROFILE   metadata profile (default dup on one device,\n"
			 "                           raid1 on several)\n"
			 "  -n, --nodesize SIZE      tree node size, 4K to 64K (default 16K)\n"
			 "  -s, --sectorsize SIZE    sector size (4K)\n"
			 "      --csum ALGO          crc32c (default), xxhash, sha256, blake2\n"
			 "  -b, --byte-count SIZE    use (and create or grow image files to) SIZE bytes\n"
			 "                           per device\n"
			 "  -f, --force              overwrite an existing filesystem\n"
			 "  -M, --mixed              mixed block groups: data and metadata share\n"
			 "                           the same chunks (for small devices; node size\n"
			 "                           = sector size, one profile, single by default)\n"
			 "  -r, --rootdir DIR        copy the tree DIR into the top-level subvolume:\n"
			 "                           data and holes, every file type, hard links,\n"
			 "                           owners, modes, times, xattrs and ACLs\n"
			 "      --subvol [rw:]PATH   make the directory PATH of DIR (relative to it)\n"
			 "                           a subvolume; repeatable\n"
			 "      --compress ALGO[:LEVEL]  compress the copied files: zlib[:1-9], lzo,\n"
			 "                           zstd[:1-15] (what does not compress is stored\n"
			 "                           plainly)\n"
			 "      --max-inline SIZE    store copied files of at most SIZE bytes inline,\n"
			 "                           in the metadata (default: below one sector, as\n"
			 "                           mkfs.btrfs; 2048 is the kernel's default for\n"
			 "                           new writes; 0: none)\n"
			 "      --shrink             cut the image files to what the copied tree\n"
			 "                           needs (image files only)\n"
			 "  -q, --quiet              no summary, no progress line (a progress line\n"
			 "                           is drawn only on a terminal)\n"
			 "  -v, --verbose            print each path copied from DIR\n"
			 "\n"
			 "Not supported yet: --subvol ro:/default:.\n"
			 "A DEV may also be given with --device.\n",
	},
	{
		.name = "put",
		.main = cmd_put,
		.summary = "copy a host file or directory tree into the image",
		.synopsis = "[-v] [--device DEV]... IMAGE HOSTPATH DEST",
		.usage = "Copy HOSTPATH (a file of any type, or a directory with everything below\n"
			 "it) into the unmounted image as the new entry DEST; a DEST ending in \"/\"\n"
			 "is a directory that receives HOSTPATH under its own name. Data and holes,\n"
			 "hard links, owners, modes, times, xattrs and ACLs are kept (as cp -a).\n"
			 "DEST must not exist: nothing is ever replaced, and a refused command\n"
			 "leaves the image unchanged. Problems with single host files are reported\n"
			 "by path, the rest is copied, and the exit status is 1.\n"
			 "\n"
			 "  -v, --verbose  print each host path as it is copied\n",
	},
	{
		.name = "mkdir",
		.main = cmd_mkdir,
		.summary = "make a directory in the image",
		.synopsis = "[-p] [-m MODE] [--device DEV]... IMAGE PATH",
		.usage = "Make the directory PATH in the unmounted image, owned by your uid and\n"
			 "gid, with mode 0777 minus the umask.\n"
			 "\n"
			 "  -p, --parents  make missing parents too; an existing directory is fine\n"
			 "  -m, --mode     the new directory's mode (octal)\n",
	},
	{
		.name = "rm",
		.main = cmd_rm,
		.summary = "remove files or directory trees from the image",
		.synopsis = "[-r] [--device DEV]... IMAGE PATH...",
		.usage = "Remove each PATH from the unmounted image; a directory only with -r\n"
			 "(with everything below it). Subvolumes are not removed this way: use\n"
			 "`butter subvolume delete`. Each path that cannot be removed is reported\n"
			 "and the exit status is 1; what was removed stays removed.\n"
			 "\n"
			 "  -r, -R, --recursive  remove directories and their contents\n",
	},
	{
		.name = "ln",
		.main = cmd_ln,
		.summary = "make a symlink (or a hard link) in the image",
		.synopsis = "[-s] [--device DEV]... TARGET IMAGE PATH",
		.usage = "With -s, make PATH in the unmounted image a symlink to TARGET (any\n"
			 "text). Without it, make PATH a hard link to the existing file TARGET of\n"
			 "the image. PATH must not exist.\n"
			 "\n"
			 "  -s, --symbolic make a symlink\n",
	},
#ifdef BUTTER_HAVE_FUSE
	{
		.name = "mount",
		.main = cmd_mount,
		.summary = butter_mount_summary,
		.synopsis = butter_mount_synopsis,
		.usage = butter_mount_usage,
	},
#endif
	{
		.name = "umount",
		.main = cmd_umount,
		.summary = "unmount a butter mount once its daemon has committed and exited",
		.synopsis = "[-t SECONDS] MOUNTPOINT",
		.usage = "Unmount the `butter mount` at MOUNTPOINT: write back the kernel's cached\n"
			 "pages, commit, unmount (umount2 as root, else fusermount3 -u), then wait\n"
			 "for the daemon to finish its final commit, close the devices and exit.\n"
			 "When it returns 0 the image is final. umount(8) and fusermount3 -u\n"
			 "return before the daemon has exited.\n"
			 "\n"
			 "  -t, --timeout SECONDS  wait at most this long for the daemon (300)\n",
	},
	{
		.name = "fsync",
		.main = cmd_fsync,
		.summary = "make files durable, many in one flush",
		.synopsis = "[--data] FILE...",
		.usage = "fsync(2) every FILE. Files inside a live `butter mount` are written\n"
			 "to its tree log together (one flush sequence per batch of up to 128\n"
			 "files), not one commit each; other files get fsync(2) one by one.\n"
			 "\n"
			 "  -d, --data     fdatasync(2) instead\n",
	},
	/*
	 * Commands still to come take a row here: mkfs, mount, check, scrub,
	 * balance, device add/remove/replace, resize, subvolume create/delete/
	 * snapshot, send, receive.
	 */
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void print_main_usage(FILE *out)
{
	fprintf(out, "usage: butter COMMAND [ARGS]...\n"
		     "       butter COMMAND --help\n"
		     "\n"
		     "Read and write btrfs filesystem images without the kernel.\n"
		     "\n"
		     "Commands:\n");
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(out, "  %-17s %s\n", commands[i].name, commands[i].summary);
	fprintf(out, "\n"
		     "Every command opening IMAGE takes --device DEV (repeatable) for the other\n"
		     "members of a multi-device filesystem. IMAGE (and DEV) may be a file, a block\n"
		     "device or an NBD export's URI (nbd://HOST[:PORT]/EXPORT,\n"
		     "nbd+unix:///EXPORT?socket=PATH, nbds://... with TLS; each request is bounded\n"
		     "by BUTTER_NBD_TIMEOUT seconds, default 30).\n"
		     "`butter version` (or --version) prints the version.\n"
		     "\n"
		     "Global option (before COMMAND):\n"
		     "  --format json|text  JSON, in btrfs-progs' layout, from the commands that\n"
		     "                      have it: filesystem df, device stats, subvolume list;\n"
		     "                      in butter's layout (README): info, ls, scrub status,\n"
		     "                      send -f FILE, receive\n");
}

/* `butter help testing`: the global options of the crash and fault tests, kept out of the main help. */
static void print_testing_usage(FILE *out)
{
	fprintf(out, "Global options (before COMMAND), for crash and fault tests:\n"
		     "  --record LOG   log every write and flush reaching the devices to LOG\n"
		     "                 (replayed by crashreplay; format in lib/device/recorder.c)\n"
		     "  --fault SPEC   make device operations fail as SPEC says, e.g.\n"
		     "                 \"write-eio=40\" or \"read-eio,dev=1,start=1M\"\n"
		     "                 (language in lib/device/fault.c)\n");
}

/* Does @name start with the word @word followed by a space? */
static bool in_group(const char *name, const char *word)
{
	size_t n = strlen(word);
	return strncmp(name, word, n) == 0 && name[n] == ' ';
}

/*
 * The subcommands of @group, a line each; with @full (`butter GROUP --help`,
 * as `btrfs GROUP --help`) followed by the whole usage of each, which is
 * also the text of the group's man page (help2man, cli/meson.build).
 */
static void print_group_usage(const char *group, FILE *out, bool full)
{
	fprintf(out, "usage: butter %s SUBCOMMAND [ARGS]...\n\nSubcommands:\n", group);
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (in_group(commands[i].name, group))
			fprintf(out, "  %-17s %s\n", commands[i].name + strlen(group) + 1,
				commands[i].summary);
	for (size_t i = 0; full && i < NCOMMANDS; i++) {
		if (!in_group(commands[i].name, group))
			continue;
		fputs("\n", out);
		cli_print_usage(&commands[i], out);
	}
}

static bool is_help(const char *arg)
{
	return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

static int run(const struct cli_command *cmd, int argc, char **argv)
{
	/* the commands with a JSON form (btrfs-progs' layout) */
	if (cli_json && strcmp(cmd->name, "filesystem df") && strcmp(cmd->name, "device stats") &&
	    strcmp(cmd->name, "subvolume list") && strcmp(cmd->name, "scrub") &&
	    strcmp(cmd->name, "info") && strcmp(cmd->name, "ls") && strcmp(cmd->name, "send") &&
	    strcmp(cmd->name, "receive"))
		return cli_json_unsupported();
	optind = 1;
	return cmd->main(cmd, argc, argv);
}

/*
 * Take the global options --format json|text, --record LOG and --fault SPEC
 * (also --opt=VALUE) off the front of argv. Returns how many arguments they used, or -1 after
 * printing a usage error.
 */
static int global_options(int argc, char **argv)
{
	int i = 1;

	while (i < argc) {
		const char **slot = NULL, *format = NULL;
		const char *name = NULL, *value = NULL;

		if (strncmp(argv[i], "--format", 8) == 0) {
			slot = &format;
			name = "--format";
		} else if (strncmp(argv[i], "--record", 8) == 0) {
			slot = &cli_test_devices.record_log;
			name = "--record";
		} else if (strncmp(argv[i], "--fault", 7) == 0) {
			slot = &cli_test_devices.fault_spec;
			name = "--fault";
		}
		if (!slot)
			break;
		if (argv[i][strlen(name)] == '=') {
			value = argv[i] + strlen(name) + 1;
			i++;
		} else if (argv[i][strlen(name)] == '\0' && i + 1 < argc) {
			value = argv[i + 1];
			i += 2;
		} else if (argv[i][strlen(name)] == '\0') {
			fprintf(stderr, "butter: option '%s' needs an argument\n", name);
			return -1;
		} else {
			break;
		}
		*slot = value;
		if (slot == &format) {
			if (strcmp(format, "json") && strcmp(format, "text")) {
				fprintf(stderr, "butter: --format is json or text, not '%s'\n", format);
				return -1;
			}
			cli_json = !strcmp(format, "json");
		}
	}
	return i - 1;
}

int main(int argc, char **argv)
{
#ifdef BUTTER_HAVE_FUSE
	/* installed as mount.fuse.butter: mount(8)'s helper (fuse/helper.c) */
	if (argc > 0 && butter_mount_helper_wanted(1, argv))
		return butter_mount_helper_main(argc, argv);
#endif
	int used = global_options(argc, argv);

	if (used < 0) {
		print_main_usage(stderr);
		return CLI_EXIT_USAGE;
	}
	argv[used] = argv[0];
	argv += used;
	argc -= used;
	if (argc < 2) {
		print_main_usage(stderr);
		return CLI_EXIT_USAGE;
	}
	const char *word = argv[1];
	if (is_help(word) || strcmp(word, "help") == 0) {
		if (strcmp(word, "help") == 0 && argc == 3 && strcmp(argv[2], "commands") == 0) {
			/* one command per line, for shell completion (cli/completion/butter.bash) */
			for (size_t i = 0; i < NCOMMANDS; i++)
				printf("%s\n", commands[i].name);
			return cli_finish_stdout(CLI_EXIT_OK);
		}
		if (strcmp(word, "help") == 0 && argc == 3 && strcmp(argv[2], "testing") == 0) {
			print_testing_usage(stdout);
			return cli_finish_stdout(CLI_EXIT_OK);
		}
		if (strcmp(word, "help") == 0 && argc > 2) {
			/* "butter help CMD [SUB]": same as "butter CMD [SUB] --help" */
			for (size_t i = 0; i < NCOMMANDS; i++) {
				bool one = strcmp(commands[i].name, argv[2]) == 0;
				bool two = argc > 3 && in_group(commands[i].name, argv[2]) &&
					   strcmp(commands[i].name + strlen(argv[2]) + 1, argv[3]) == 0;
				if (one || two) {
					cli_print_usage(&commands[i], stdout);
					return cli_finish_stdout(CLI_EXIT_OK);
				}
			}
			fprintf(stderr, "butter: unknown command '%s'\n", argv[2]);
			print_main_usage(stderr);
			return CLI_EXIT_USAGE;
		}
		print_main_usage(stdout);
		return cli_finish_stdout(CLI_EXIT_OK);
	}
	if (strcmp(word, "version") == 0 && argc > 2) {
		fprintf(stderr, "butter version: takes no arguments\n");
		return CLI_EXIT_USAGE;
	}
	if (strcmp(word, "--version") == 0 || strcmp(word, "version") == 0) {
		printf("butter %s\n", butter_version());
		return cli_finish_stdout(CLI_EXIT_OK);
	}

	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(commands[i].name, word) == 0)
			return run(&commands[i], argc - 1, argv + 1);

	bool group = false;
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (in_group(commands[i].name, word))
			group = true;
	if (group) {
		if (argc < 3) {
			fprintf(stderr, "butter %s: missing subcommand\n", word);
			print_group_usage(word, stderr, false);
			return CLI_EXIT_USAGE;
		}
		if (is_help(argv[2])) {
			print_group_usage(word, stdout, true);
			return cli_finish_stdout(CLI_EXIT_OK);
		}
		for (size_t i = 0; i < NCOMMANDS; i++)
			if (in_group(commands[i].name, word) &&
			    strcmp(commands[i].name + strlen(word) + 1, argv[2]) == 0)
				return run(&commands[i], argc - 2, argv + 2);
		fprintf(stderr, "butter %s: unknown subcommand '%s'\n", word, argv[2]);
		print_group_usage(word, stderr, false);
		return CLI_EXIT_USAGE;
	}

#ifdef BUTTER_HAVE_FUSE
	/* "butter SOURCE MOUNTPOINT -o OPTIONS", as mount.fuse3 runs it (fuse/helper.c) */
	if (butter_mount_helper_wanted(argc, argv))
		return butter_mount_helper_main(argc, argv);
#endif
	fprintf(stderr, "butter: unknown command '%s'\n", word);
	print_main_usage(stderr);
	return CLI_EXIT_USAGE;
}
