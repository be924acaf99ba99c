#!/usr/bin/env bash
# bench/mkfs-rootdir.sh — build a btrfs image from the same host tree two ways,
# side by side:
#
#   butter   butter mkfs -q -f -K -b SIZE --rootdir SRC IMAGE   (release build)
#   progs    mkfs.btrfs -q -f -K -b SIZE --rootdir SRC IMAGE    (btrfs-progs)
#
# Both get the same -b (so the image files have the same apparent size) and
# the defaults of each tool otherwise. Each run starts from a fresh empty
# image file on the host filesystem holding $BENCH_DIR, after
# `sync; echo 3 > /proc/sys/vm/drop_caches`, so the source tree is read cold;
# the timed part is the mkfs and an fsync of the image (`sync IMAGE`), so
# neither tool wins by leaving dirty pages behind. Runs are interleaved, and
# the order flips every run (butter, progs; progs, butter; ...) so drift and
# "second to read the tree" hit both alike; the best wall time of N counts,
# and the ratio is also given run by run (each run's two times were taken
# close together, which matters on a shared machine). A cold read of the
# source tree (`find -type f | xargs cat >/dev/null`) runs after each pair as
# an anchor: the floor for anything that has to copy the tree once.
#
# Every image is checked after its run, outside the timing: `btrfs check
# --readonly` must pass, the kernel must mount it read-only, and the mounted
# tree must match the manifest taken from the source tree: a wrong or missing
# name, type, size, content (sha256), symlink target, mode, owner, xattr (any
# namespace) or hard-link group fails the run, so a fast-but-wrong result
# cannot win. Differences in mtime are counted and shown but do not fail
# (mkfs.btrfs 6.2 keeps whole seconds only). A run with a right image but a
# nonzero exit status counts, with a warning.
#
# Sizes reported per image: the apparent size of the file (-b), the bytes used
# inside it (superblock bytes_used: data plus metadata, DUP counted once), the
# chunks allocated (dev_item.bytes_used), the blocks the host allocated to the
# image file (du), and btrfs's own data/metadata split (`btrfs filesystem df`).
#
# The source tree (regular files of mixed sizes in nested directories, a
# directory of a few thousand entries, a 40-level chain, some large files,
# sparse files, hard links, symlinks, xattrs, odd names and fifos, varied
# modes, owners and ns mtimes; no device nodes: mkfs.btrfs 6.2 stores them
# with rdev 0) is generated once from a fixed seed into
# $BENCH_DIR/mkfs-rootdir/source and reused while source.complete names the
# same generator version and scale. --files and --size scale it; the mix
# (file-count and byte shares) stays the same.
#
# Usage: sudo bench/mkfs-rootdir.sh [-n RUNS] [--files N] [--size GiB] [--small]
#                                   [--rebuild-tree] [--keep]
#   -n RUNS        runs per tool (default 3, or $RUNS)
#   --files N      about N regular files (default 50000); N/100 more hard-link
#                  names, N/100 symlinks, about N/40 directories
#   --size GiB     about this much file data (default 2; fractions allowed)
#   --small        every regular file 0-3 KiB instead (sizes uniform; no
#                  medium, large or sparse files; --size is ignored): the
#                  tree where inlining decides the image size, e.g.
#                  `--small --files 100000`
#   --rebuild-tree generate the source tree again even if it is complete
#   --keep         keep the last run's images (butter.img, progs.img)
# Environment: BENCH_DIR (default /tmp/butter-bench), RUNS, BUTTER (a butter
#   binary to use instead of building $REPO/build-bench).
# Needs root (loop mounts, drop_caches, chown, trusted.* xattrs), mkfs.btrfs,
# btrfs, python3, meson, ninja.
# shellcheck disable=SC2317  # cleanup and run_* are called indirectly
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/tmp/butter-bench}
RUNS=${RUNS:-3}
BUTTER=${BUTTER:-}
NFILES=50000
SIZE_GIB=2
REBUILD=0
KEEP=0
SMALL=0
SEED=20240603

die() { echo "mkfs-rootdir.sh: $*" >&2; exit 2; }
# shellcheck source=bench/lib.sh
source "$REPO/bench/lib.sh"

while (($#)); do
	case $1 in
	-n) [[ $# -ge 2 ]] || die "-n needs a number"; RUNS=$2; shift 2 ;;
	--files) [[ $# -ge 2 ]] || die "--files needs a number"; NFILES=$2; shift 2 ;;
	--size) [[ $# -ge 2 ]] || die "--size needs a number of GiB"; SIZE_GIB=$2; shift 2 ;;
	--small) SMALL=1; shift ;;
	--rebuild-tree) REBUILD=1; shift ;;
	--keep) KEEP=1; shift ;;
	-h|--help) sed -n '2,/^# btrfs, python3, meson/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument: $1 (try --help)" ;;
	esac
done
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "RUNS must be a positive integer, not '$RUNS'"
if [[ ! $NFILES =~ ^[1-9][0-9]*$ ]] || ((NFILES < 100)); then
	die "--files must be an integer >= 100, not '$NFILES'"
fi
[[ $SIZE_GIB =~ ^[0-9]*\.?[0-9]+$ ]] || die "--size must be a number of GiB, not '$SIZE_GIB'"
SIZE_BYTES=$(echo "$SIZE_GIB * 1073741824 / 1" | bc)
((SIZE_BYTES >= 16 << 20)) || die "--size must be at least 16 MiB (0.016)"
[[ $(id -u) -eq 0 ]] || die "must run as root (loop mounts, drop_caches, chown, trusted.* xattrs)"
for c in mkfs.btrfs btrfs python3 mount umount mountpoint flock bc du sync truncate find xargs; do
	command -v "$c" >/dev/null || die "missing command: $c"
done
GEN_VERSION="mkfs-rootdir-tree v2 seed=$SEED files=$NFILES bytes=$SIZE_BYTES small=$SMALL"

mkdir -p "$BENCH_DIR/mkfs-rootdir"
WORK=$(cd "$BENCH_DIR/mkfs-rootdir" && pwd)
exec 9>"$WORK/.lock"
flock -n 9 || die "another mkfs-rootdir.sh is using $WORK"

SRC=$WORK/source
MARK=$WORK/source.complete
REF=$WORK/source.manifest
STATS=$WORK/source.stats
MNT=$WORK/mnt
LOGS=$WORK/logs
mkdir -p "$MNT" "$LOGS"

cleanup() {
	if mountpoint -q "$MNT"; then umount "$MNT" || true; fi
}
trap cleanup EXIT

# ---- python helpers: tree generator, manifest, verifier ----------------------
read -r -d '' PY <<'PYEOF' || true
import json, os, random, stat, sys

import benchlib

MiB = 1 << 20

def gen(root, nfiles, nbytes, seed, small='0'):
    """Fill the empty directory ROOT with the benchmark tree, deterministically.

    Byte shares: 15% small files, 30% medium files, 45% four large files, 5% the
    data of a sparse file (whose holes make it 8x larger). File-count shares:
    88% small, 10% medium; N/100 hard-link names and N/100 symlinks on top.
    With SMALL '1': all N files 0-3 KiB (uniform), nothing medium, large or sparse."""
    nfiles, nbytes, small = int(nfiles), int(nbytes), small == '1'

    R = random.Random(int(seed))
    syll = ['ka', 'lo', 'mi', 'ne', 'ru', 'ta', 'vo', 'shi', 'an', 'el', 'or', 'ix',
            'um', 'ber', 'tor', 'sen', 'qua', 'dri', 'fe', 'zo']
    words = [''.join(R.choice(syll) for _ in range(R.randint(1, 4))) for _ in range(3000)]
    lines = ['%06d %s\n' % (R.randrange(10**6), ' '.join(R.choice(words)
             for _ in range(R.randint(3, 12)))) for _ in range(40000)]
    pool = ''.join(lines).encode()  # about 2.5 MiB of text to slice from

    def text(n):
        out = []
        while n > 0:
            k = min(n, len(pool) // 2)
            off = R.randrange(len(pool) - k)
            out.append(pool[off:off + k])
            n -= k
        return b''.join(out)

    def data(n, kind):
        return text(n) if kind == 't' else R.randbytes(n)

    T0 = 1_600_000_000 * 10**9
    def stamp(p, follow=True):
        t = T0 + R.randrange(10**17)  # within ~3 years, nanosecond resolution
        os.utime(p, ns=(t, t), follow_symlinks=follow)

    def attrs(p):
        if R.random() < 0.1:
            os.chown(p, 1000 + R.randrange(3), 1000 + R.randrange(3))
        os.chmod(p, R.choice([0o644] * 6 + [0o600, 0o640, 0o755, 0o444, 0o664, 0o4755]))
        if R.random() < 0.05:
            os.setxattr(p, 'user.bench', ('tag-%d' % R.randrange(10**6)).encode())
            if R.random() < 0.2:
                os.setxattr(p, 'user.note', text(R.randint(100, 2000)))

    def write_file(p, size, kind):
        with open(p, 'wb') as f:
            left = size
            while left:
                n = min(left, 4 * MiB)
                f.write(data(n, kind))
                left -= n
        attrs(p)

    # directories: a random recursive tree (depth ~ln n), one big flat
    # directory, and a 40-level chain
    top = os.path.join(root, 'tree')
    os.makedirs(top)
    dirs = [top]
    for i in range(max(8, nfiles // 40)):
        parent = R.choice(dirs)
        d = os.path.join(parent, '%s-%d' % (R.choice(words), i))
        os.mkdir(d)
        dirs.append(d)
    big_dir = os.path.join(root, 'flat')
    os.mkdir(big_dir)
    d = root
    for i in range(40):
        d = os.path.join(d, 'deep%02d' % i if i else 'deep')
        os.mkdir(d)
    dirs.append(d)
    for d in dirs[1:]:
        os.chmod(d, R.choice([0o755] * 8 + [0o700, 0o750, 0o2775]))
        if R.random() < 0.02:
            os.setxattr(d, 'user.dir', b'dir-tag')

    regular = []
    def place(i, ext):
        d = big_dir if R.random() < 0.05 else R.choice(dirs)
        return os.path.join(d, '%s-%d.%s' % (R.choice(words), i, ext))

    # small: 88% of the files, 15% of the bytes, exponential sizes (many inline)
    n_small = nfiles if small else nfiles * 88 // 100
    mean = max(1.0, 0.15 * nbytes / n_small)
    for i in range(n_small):
        if small:
            size = R.randint(0, 3072)
        else:
            size = 0 if R.random() < 0.03 else min(int(R.expovariate(1 / mean)) + 1, 16 * int(mean) + 1)
        kind = R.choice('tr')
        p = place(i, 'txt' if kind == 't' else 'bin')
        write_file(p, size, kind)
        regular.append(p)
    # medium: 10% of the files, 30% of the bytes
    n_med = 0 if small else nfiles * 10 // 100
    mean = max(1.0, 0.30 * nbytes / max(1, n_med))
    for i in range(n_med):
        size = min(int(R.expovariate(1 / mean)) + 1, 8 * int(mean) + 1)
        kind = R.choice('tr')
        p = place(n_small + i, 'dat' if kind == 't' else 'img')
        write_file(p, size, kind)
        regular.append(p)
    # large: 45% of the bytes in four files (not sector multiples)
    os.makedirs(os.path.join(root, 'large'))
    for j, (share, kind) in enumerate([] if small else [(0.4, 'r'), (0.3, 't'), (0.2, 'r'), (0.1, 't')]):
        size = int(0.45 * nbytes * share) + R.randrange(1, 4096)
        write_file(os.path.join(root, 'large', 'large-%d.%s' % (j, 'bin' if kind == 'r' else 'log')),
                   size, kind)
    # sparse: 5% of the bytes as 1 MiB of data every 8 MiB, from 4 MiB on,
    # ending in a 3 MiB hole; and a 1 MiB file with only its last 100 bytes
    chunks = 0 if small else max(1, int(0.05 * nbytes) // MiB)
    p = os.path.join(root, 'large', 'sparse.bin')
    with open(p, 'wb') as f:
        for k in range(chunks):
            f.seek(4 * MiB + 8 * k * MiB)
            f.write(R.randbytes(MiB))
        f.truncate(4 * MiB + 8 * chunks * MiB + 3 * MiB)
    p = os.path.join(root, 'large', 'sparse-tail.bin')
    with open(p, 'wb') as f:
        f.seek(MiB - 100)
        f.write(text(100))

    # odd names, fifos (no device nodes: mkfs.btrfs 6.2 stores them with rdev 0)
    d = os.path.join(root, 'names')
    os.mkdir(d)
    for name in ['with space', 'ünïcødé', 'tab\there', 'new\nline', "quote'\"", '-dash',
                 '#hash', '~tilde', 'x' * 255, '.hidden', '..dots']:
        write_file(os.path.join(d, name), R.randint(0, 5000), 't')
    d = os.path.join(root, 'special')
    os.mkdir(d)
    os.mkfifo(os.path.join(d, 'fifo-a'), 0o644)
    os.mkfifo(os.path.join(d, 'fifo-b'), 0o600)
    os.setxattr(os.path.join(d, 'fifo-a'), 'trusted.bench', b'trusted-value')

    # hard links: N/100 more names, mostly in links/hard, some beside the
    # original; a file may be picked more than once
    hard = os.path.join(root, 'links', 'hard')
    os.makedirs(hard)
    for i in range(nfiles // 100):
        src = R.choice(regular)
        if R.random() < 0.8:
            dst = os.path.join(hard, 'h%05d' % i)
        else:
            dst = '%s.link%d' % (src, i)
        os.link(src, dst)
    # symlinks: relative, absolute, dangling, long
    sym = os.path.join(root, 'links', 'sym')
    os.makedirs(sym)
    for i in range(nfiles // 100):
        where = sym if R.random() < 0.7 else R.choice(dirs)
        p = os.path.join(where, 'sym-%05d' % i)
        k = i % 10
        if k < 6:
            target = os.path.relpath(R.choice(regular), where)
        elif k < 8:
            target = '/' + os.path.relpath(R.choice(dirs), root)
        elif k < 9:
            target = 'dangling-%d' % i
        else:
            target = '/'.join(R.choice(words) for _ in range(R.randint(20, 150)))[:1000]
        os.symlink(target, p)
    # times last: every non-directory (walked in name order, so the stamps do
    # not depend on the host's readdir order), then directories deepest first,
    # the top one too
    walked = []
    for dp, dn, fn in os.walk(root):
        dn.sort()
        walked.append(dp)
        for name in sorted(dn + fn):
            p = os.path.join(dp, name)
            if os.path.islink(p) or not os.path.isdir(p):
                stamp(p, follow=False)
    for dp in sorted(walked, key=lambda d: (-d.count('/'), d)):
        stamp(dp)

def manifest(root):
    """path -> [content, meta].
    content (a difference fails): type, mode, size and sha256 / link target /
    rdev, owner, xattrs, hard-link group (the first path of the inode).
    meta (a difference is counted): mtime."""
    m, inodes = {}, {}
    for dp, dn, fn in os.walk(root):
        entries = dn + fn
        if dp == root:
            entries = entries + ['.']
        for name in entries:
            p = os.path.normpath(os.path.join(dp, name))
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            fmt = stat.S_IFMT(st.st_mode)
            mode = '%o' % stat.S_IMODE(st.st_mode)
            if fmt == stat.S_IFREG:
                content = ['f', mode, st.st_size, benchlib.sha256(p)]
                if st.st_nlink > 1:
                    inodes.setdefault((st.st_dev, st.st_ino), []).append(rel)
            elif fmt == stat.S_IFDIR:
                content = ['d', mode]
            elif fmt == stat.S_IFLNK:
                content = ['l', os.readlink(p)]
            else:
                content = ['o%o' % fmt, mode, st.st_rdev]
            xa = benchlib.xattrs(p)
            content += ['%d:%d' % (st.st_uid, st.st_gid), xa, '-']
            m[rel] = [content, {'mtime': st.st_mtime_ns}]
    for paths in inodes.values():
        first = min(paths)
        for rel in paths:
            m[rel][0][-1] = first
    return m

def cmd_manifest(root, out):
    benchlib.save(manifest(root), out)

def cmd_verify(ref, root):
    want, bad, parts = benchlib.compare(ref, manifest(root), '')
    if bad:
        print('FAIL: %d of %d paths wrong; first: %s' % (len(bad), len(want), '; '.join(bad[:3])))
        return 1
    print('tree OK (%d paths); %s' %
          (len(want), 'mtimes identical' if not parts else 'differs: ' + ', '.join(parts)))
    return 0

def cmd_stats(ref):
    with open(ref) as f:
        m = json.load(f)
    n = {}
    size, links, xattrs = 0, 0, 0
    for rel, (c, meta) in m.items():
        n[c[0]] = n.get(c[0], 0) + 1
        xattrs += len(c[-2])
        if c[0] == 'f':
            if c[-1] != '-' and c[-1] != rel:
                links += 1
            else:
                size += c[2]
    print('regular files %d (%d more names as hard links), directories %d, symlinks %d, '
          'other %d, xattrs %d, file sizes %.1f MiB' %
          (n.get('f', 0) - links, links, n.get('d', 0), n.get('l', 0),
           sum(v for k, v in n.items() if k not in 'fdl'), xattrs, size / MiB))

def cmd_apparent(ref):
    """Sum of the sizes of the distinct regular files (holes included)."""
    with open(ref) as f:
        m = json.load(f)
    print(sum(c[2] for rel, (c, meta) in m.items()
              if c[0] == 'f' and (c[-1] == '-' or c[-1] == rel)))

if __name__ == '__main__':
    cmd, args = sys.argv[1], sys.argv[2:]
    sys.exit({'gen': gen, 'manifest': cmd_manifest, 'verify': cmd_verify,
              'stats': cmd_stats, 'apparent': cmd_apparent}[cmd](*args) or 0)
PYEOF
py() { PYTHONPATH="$REPO/bench${PYTHONPATH:+:$PYTHONPATH}" python3 -c "$PY" "$@"; }

# ---- the source tree --------------------------------------------------------------
if ((REBUILD)) || [[ ! -d $SRC || ! -f $MARK || ! -f $REF || $(cat "$MARK") != "$GEN_VERSION" ]]; then
	echo "== generating the source tree in $SRC ($NFILES files, $SIZE_GIB GiB; takes a while)"
	rm -f "$MARK" "$REF" "$STATS"
	rm -rf "$SRC"
	mkdir "$SRC"
	chmod 755 "$SRC"
	py gen "$SRC" "$NFILES" "$SIZE_BYTES" "$SEED" "$SMALL"
	sync
	py manifest "$SRC" "$REF.tmp"
	mv "$REF.tmp" "$REF"
	{
		echo "tree: $(py stats "$REF")"
		echo "source on the host: $(du -sh --apparent-size "$SRC" | cut -f1) apparent," \
			"$(du -sh "$SRC" | cut -f1) allocated, $(df -T "$SRC" | awk 'NR == 2 {print $2}')"
	} >"$STATS"
	echo "$GEN_VERSION" >"$MARK"
else
	echo "== reusing the source tree in $SRC"
fi

# Image size: every byte of every file (mkfs.btrfs writes holes out as
# zeros), a quarter on top, and 1 GiB for metadata (DUP) and chunk slack;
# rounded up to 256 MiB.
APPARENT=$(py apparent "$REF")
IMG_SIZE=$(((APPARENT + APPARENT / 4 + (1 << 30) + (256 << 20) - 1) / (256 << 20) * (256 << 20)))

# ---- butter (release build) --------------------------------------------------------
bench_butter

# ---- the runs ------------------------------------------------------------------
# read is an anchor, not a contestant: a cold read of every file of the
# source tree, the floor for anything that has to copy it once.
TOOLS=(butter progs read)
declare -A LABEL=([butter]="butter mkfs" [progs]="mkfs.btrfs" [read]="read tree")

run_butter() { "$BUTTER" mkfs -q -f -K -b "$IMG_SIZE" --rootdir "$SRC" "$1" && sync "$1"; }
run_progs() { mkfs.btrfs -q -f -K -b "$IMG_SIZE" --rootdir "$SRC" "$1" && sync "$1"; }
# every regular file once (hard links twice, from the cache), holes as zeros
run_read() { find "$SRC" -type f -print0 | xargs -0 -r cat >/dev/null; }

# Check the image $1 (fsck, kernel mount, tree against the manifest) and
# measure it. Prints one verdict line; sets SZ_USED SZ_CHUNKS SZ_HOST SZ_DF
# (so call it without a subshell); returns 1 when the image is wrong.
check_image() {
	local img=$1 log=$2 super
	SZ_USED=- SZ_CHUNKS=- SZ_HOST=- SZ_DF=
	if ! btrfs check --readonly "$img" >"$log.check" 2>&1; then
		echo "FAIL: btrfs check --readonly: $(grep -m 1 -i 'error\|wrong\|mismatch' "$log.check" || tail -n 1 "$log.check")"
		return 1
	fi
	super=$(btrfs inspect-internal dump-super "$img")
	SZ_USED=$(awk '$1 == "bytes_used" {print $2}' <<<"$super")
	SZ_CHUNKS=$(awk '$1 == "dev_item.bytes_used" {print $2}' <<<"$super")
	SZ_HOST=$(($(stat -c '%b * %B' "$img")))
	if ! mount -o ro,loop "$img" "$MNT" 2>"$log.mount"; then
		echo "FAIL: kernel mount: $(head -n 1 "$log.mount")"
		return 1
	fi
	SZ_DF=$(btrfs filesystem df -b "$MNT" |
		awk -F'[ ,:=]+' '$1 != "GlobalReserve" { printf "%s%s %s used %.1f MiB", sep, $1, $2, $6 / 1048576; sep = ", " }')
	local vrc=0
	py verify "$REF" "$MNT" || vrc=1
	umount "$MNT" || vrc=1
	return "$vrc"
}

mib() { if [[ $1 == - ]]; then echo -; else awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; fi; }

echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -r), $(nproc) CPUs," \
	"$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo) RAM," \
	"host fs $(df -T "$WORK" | awk 'NR == 2 {print $2}'), load $(cut -d' ' -f1-3 /proc/loadavg)"
bench_butter_line
echo "== $(btrfs --version)"
sed 's/^/== /' "$STATS"
echo "== image files: -b $IMG_SIZE ($(mib "$IMG_SIZE") MiB) each"
echo "== $RUNS runs each, interleaved, order flipped every run; wall seconds of mkfs + fsync, caches dropped before each"

declare -A TIMES BEST CPU WARN USED CHUNKS HOST DF RUN
FAILED=0
for ((r = 1; r <= RUNS; r++)); do
	order=(butter progs read)
	((r % 2)) || order=(progs butter read)
	for t in "${order[@]}"; do
		img=$WORK/$t.img
		log=$LOGS/$t.$r.log
		if [[ $t != read ]]; then
			rm -f "$img"
			truncate -s "$IMG_SIZE" "$img"  # mkfs.btrfs 6.2 says "zoned: unable to stat" without it
		fi
		sync
		echo 3 >/proc/sys/vm/drop_caches
		rc=0
		TIMEFORMAT='%3R %3U %3S'
		{ time { "run_$t" "$img" >"$log" 2>&1 || rc=$?; }; } 2>"$LOGS/$t.$r.time"
		read -r real usr sys <"$LOGS/$t.$r.time"
		cpu=$(printf '%.3f' "$(echo "$usr + $sys" | bc)")
		if [[ $t == read ]]; then
			printf '   run %d %-12s %8.3f s  cpu %6.2f s  (anchor: cold read of the source tree)\n' \
				"$r" "${LABEL[$t]}" "$real" "$cpu"
			((rc == 0)) || die "reading the source tree failed: $(head -n 1 "$log")"
			TIMES[$t]+="$real "
			bench_keep_best "$t" "$real" "$cpu"
			continue
		fi
		vrc=0
		check_image "$img" "$log" >"$log.verdict" || vrc=1
		verdict=$(<"$log.verdict")
		if ((vrc)); then
			# a wrong image: the time does not count
			FAILED=1
			TIMES[$t]+="${real}(wrong) "
			printf '   run %d %-12s %8.3f s  WRONG IMAGE (exit %d): %s\n' "$r" "${LABEL[$t]}" "$real" "$rc" "$verdict"
			head -n 3 "$log" | sed 's/^/      | /'
			if ((KEEP)); then mv "$img" "$WORK/$t.wrong.$r.img"; else rm -f "$img"; fi
			continue
		fi
		printf '   run %d %-12s %8.3f s  cpu %6.2f s  used %7s MiB  host %7s MiB  %s\n' "$r" "${LABEL[$t]}" \
			"$real" "$cpu" "$(mib "$SZ_USED")" "$(mib "$SZ_HOST")" "$verdict"
		if ((rc)); then
			# a right image but a nonzero exit: counted, and reported
			WARN[$t]="exit status $rc, $(wc -l <"$log") lines of messages, e.g.: $(head -n 1 "$log")"
			echo "      ! exit status $rc; $(wc -l <"$log") lines of messages, first: $(head -n 1 "$log")"
		fi
		TIMES[$t]+="$real "
		RUN[$t.$r]=$real
		bench_keep_best "$t" "$real" "$cpu"
		USED[$t]=$SZ_USED CHUNKS[$t]=$SZ_CHUNKS HOST[$t]=$SZ_HOST DF[$t]=$SZ_DF
		((KEEP)) || rm -f "$img"
	done
done
if ((KEEP)); then
	echo "== kept: $(cd "$WORK" && echo ./*.img)"
fi

echo
printf '%-12s %9s %8s %10s %11s %10s   %s\n' "tool" "best (s)" "cpu (s)" "used (MiB)" \
	"chunks (MiB)" "host (MiB)" "all runs (s)"
for t in "${TOOLS[@]}"; do
	printf '%-12s %9s %8s %10s %11s %10s   %s\n' "${LABEL[$t]}" "${BEST[$t]:-FAILED}" "${CPU[$t]:--}" \
		"$(mib "${USED[$t]:--}")" "$(mib "${CHUNKS[$t]:--}")" "$(mib "${HOST[$t]:--}")" "${TIMES[$t]}"
done
for t in butter progs; do
	[[ -z ${DF[$t]:-} ]] || printf '%-12s %s\n' "${LABEL[$t]}" "${DF[$t]}"
done
echo "(used: superblock bytes_used; chunks: dev_item.bytes_used; host: blocks the host allocated to the" \
	"image file; apparent size $(mib "$IMG_SIZE") MiB for both)"
echo
if [[ -n ${BEST[butter]:-} && -n ${BEST[progs]:-} ]]; then
	v=$(awk -v a="${BEST[progs]}" -v b="${BEST[butter]}" 'BEGIN { printf "%.2f", a / b }')
	u=$(awk -v a="${USED[butter]}" -v b="${USED[progs]}" 'BEGIN { printf "%.3f", a / b }')
	h=$(awk -v a="${HOST[butter]}" -v b="${HOST[progs]}" 'BEGIN { printf "%.3f", a / b }')
	pv=$( (($(echo "$v >= 2" | bc))) && echo met || echo MISSED)
	pu=$( (($(echo "${USED[butter]} <= ${USED[progs]}" | bc))) && echo met || echo MISSED)
	ph=$( (($(echo "${HOST[butter]} <= ${HOST[progs]}" | bc))) && echo met || echo MISSED)
	printf 'butter vs mkfs.btrfs --rootdir: %5sx as fast        (target >= 2x: %s)\n' "$v" "$pv"
	# the same ratio within each run, where the two ran minutes apart at most
	pairs=
	for ((r = 1; r <= RUNS; r++)); do
		[[ -n ${RUN[butter.$r]:-} && -n ${RUN[progs.$r]:-} ]] || continue
		pairs+="$(awk -v a="${RUN[progs.$r]}" -v b="${RUN[butter.$r]}" 'BEGIN { printf "%.2f", a / b }') "
	done
	med=$(tr ' ' '\n' <<<"$pairs" | sed '/^$/d' | sort -n |
		awk '{ v[NR] = $1 } END { printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
	printf '  the same, run by run:         %s(median %s)\n' "$pairs" "$med"
	printf 'butter vs cold read of the tree: %5sx the time\n' \
		"$(awk -v a="${BEST[butter]}" -v b="${BEST[read]}" 'BEGIN { printf "%.2f", a / b }')"
	printf 'image bytes used, butter/progs: %6s               (target <= 1:  %s)\n' "$u" "$pu"
	printf 'host blocks, butter/progs:      %6s               (target <= 1:  %s)\n' "$h" "$ph"
else
	echo "no ratios: a tool made a wrong image in every run"
fi
for t in "${TOOLS[@]}"; do
	[[ -z ${WARN[$t]:-} ]] || echo "warning: ${LABEL[$t]}: ${WARN[$t]}"
done
exit $FAILED
