#!/usr/bin/env bash
# bench/extract.sh — extract the same ~1 GiB btrfs image three ways, side by side:
#
#   butter   butter extract -q IMAGE / DEST            (release build, no sanitizers)
#   restore  btrfs restore -m -S -x IMAGE DEST          (btrfs-progs)
#   kernel   mount -o ro,loop IMAGE MNT; cp -a MNT/. DEST; umount MNT
#
#   dd       dd if=IMAGE of=/dev/null bs=1M             (anchor: the cold read floor)
#
# Each run goes into a fresh empty directory on the host filesystem holding
# $BENCH_DIR, after `sync; echo 3 > /proc/sys/vm/drop_caches`. The runs are
# interleaved (butter, restore, kernel, butter, ...) so drift hits all three
# alike, and the best wall time of N runs counts. Every run's output is checked
# against a manifest taken from the kernel mount when the image was made:
# a wrong name, type, size, content (sha256) or symlink target fails the run,
# so a fast-but-wrong result cannot win; differences in mode, owner, mtime,
# xattrs (btrfs.* properties aside: a host filesystem cannot hold them) and
# hard links are counted and shown. A run with right contents but a nonzero
# exit status counts, with a warning.
#
# The image (many small files in nested directories, a few large files, a
# sparse file, and a directory written with `compression zstd`) is made once
# with the kernel and reused while "$BENCH_DIR/image.complete" names the same
# generator version.
#
# Usage: sudo bench/extract.sh [-n RUNS] [--rebuild-image] [--keep]
# Environment: BENCH_DIR (default /tmp/butter-bench), RUNS (default 3),
#   BUTTER (a butter binary to use instead of building $REPO/build-bench).
# Needs root (loop mounts, drop_caches), mkfs.btrfs, btrfs, python3, meson, ninja.
# shellcheck disable=SC2317  # cleanup and run_* are called indirectly
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/tmp/butter-bench}
RUNS=${RUNS:-3}
BUTTER=${BUTTER:-}
REBUILD=0
KEEP=0
GEN_VERSION="extract-image v1 seed=20240601 small=30x20x50 large=300M,200M,sparse128M zstd=200M+5000+64M"

die() { echo "extract.sh: $*" >&2; exit 2; }
# shellcheck source=bench/lib.sh
source "$REPO/bench/lib.sh"

while (($#)); do
	case $1 in
	-n) [[ $# -ge 2 ]] || die "-n needs a number"; RUNS=$2; shift 2 ;;
	--rebuild-image) REBUILD=1; shift ;;
	--keep) KEEP=1; shift ;;
	-h|--help) sed -n '2,/^# Needs root/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument: $1 (try --help)" ;;
	esac
done
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "RUNS must be a positive integer, not '$RUNS'"
[[ $(id -u) -eq 0 ]] || die "must run as root (loop mounts, drop_caches)"
for c in mkfs.btrfs btrfs python3 mount umount mountpoint cp flock; do
	command -v "$c" >/dev/null || die "missing command: $c"
done

mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
exec 9>"$BENCH_DIR/.lock"
flock -n 9 || die "another extract.sh is using $BENCH_DIR"

IMG=$BENCH_DIR/image.btrfs
MARK=$BENCH_DIR/image.complete
REF=$BENCH_DIR/reference.manifest
STATS=$BENCH_DIR/image.stats
MNT=$BENCH_DIR/mnt
OUT=$BENCH_DIR/out
LOGS=$BENCH_DIR/logs
mkdir -p "$MNT" "$OUT" "$LOGS"

cleanup() {
	if mountpoint -q "$MNT"; then umount "$MNT" || true; fi
}
trap cleanup EXIT

# ---- python helpers: image generator, manifest, verifier ---------------------
read -r -d '' PY <<'PYEOF' || true
import json, os, random, stat, sys

import benchlib

def gen(root):
    """Fill ROOT (a fresh btrfs mount) with the benchmark tree, deterministically."""
    R = random.Random(20240601)
    syll = ['ka', 'lo', 'mi', 'ne', 'ru', 'ta', 'vo', 'shi', 'an', 'el', 'or', 'ix',
            'um', 'ber', 'tor', 'sen', 'qua', 'dri', 'fe', 'zo']
    words = [''.join(R.choice(syll) for _ in range(R.randint(1, 4))) for _ in range(3000)]
    lines = [' '.join(R.choice(words) for _ in range(R.randint(3, 12))) for _ in range(20000)]

    def text(n):
        out, size = [], 0
        while size < n:
            l = '%06d %s\n' % (R.randrange(1000000), R.choice(lines))
            out.append(l)
            size += len(l)
        return ''.join(out).encode()[:n]

    T0 = 1_600_000_000 * 10**9
    def stamp(p, follow=True):
        t = T0 + R.randrange(10**17)  # within ~3 years, nanosecond resolution
        os.utime(p, ns=(t, t), follow_symlinks=follow)

    def small_file(p, data):
        with open(p, 'wb') as f:
            f.write(data)
        os.chmod(p, R.choice([0o644, 0o644, 0o644, 0o600, 0o640, 0o755]))
        if R.random() < 0.1:
            os.chown(p, 1000 + R.randrange(3), 1000 + R.randrange(3))
        if R.random() < 0.05:
            os.setxattr(p, 'user.bench', ('tag-%d' % R.randrange(10**6)).encode())
        stamp(p)

    def size_small():
        return 0 if R.random() < 0.03 else R.randint(1, 16384)

    def big(p, total, make):
        with open(p, 'wb') as f:
            left = total
            while left:
                n = min(left, 1 << 20)
                f.write(make(n))
                left -= n
        stamp(p)

    # small/: 30,000 files of 0-16 KiB in 30 x 20 directories, half text, half random
    small = []
    for a in range(30):
        for b in range(20):
            d = '%s/small/d%02d/e%02d' % (root, a, b)
            os.makedirs(d)
            for c in range(50):
                n = size_small()
                p = '%s/f%02d.%s' % (d, c, 'txt' if c % 2 else 'bin')
                small_file(p, text(n) if c % 2 else R.randbytes(n))
                small.append(p)
    # odd names, symlinks (relative, absolute, dangling), hard links
    d = root + '/small/names'
    os.makedirs(d)
    for i, name in enumerate(['with space', 'ünïcødé', 'tab\there', 'new\nline', "quote'\"",
                              '-dash', '#hash', '~tilde', 'x' * 255]):
        small_file('%s/%s' % (d, name), text(size_small()))
    d = root + '/small/links'
    os.makedirs(d)
    for i in range(500):
        p = '%s/l%03d' % (d, i)
        k = i % 10
        if k < 7:
            target = '..' + R.choice(small)[len(root) + len('/small'):]
        elif k < 9:
            target = '/small/d%02d' % R.randrange(30)
        else:
            target = 'dangling-%d' % i
        os.symlink(target, p)
        stamp(p, follow=False)
    d = root + '/small/hard'
    os.makedirs(d)
    for i, src in enumerate(R.sample(small, 300)):
        os.link(src, '%s/h%03d' % (d, i))

    # large/: two incompressible files and a sparse one (1 MiB of data every 8 MiB)
    os.makedirs(root + '/large')
    big(root + '/large/random-300M.bin', 300 << 20, R.randbytes)
    big(root + '/large/random-200M.bin', 200 << 20, R.randbytes)
    p = root + '/large/sparse-128M.bin'
    with open(p, 'wb') as f:
        f.truncate(128 << 20)
        for off in range(4 << 20, 128 << 20, 8 << 20):
            f.seek(off)
            f.write(R.randbytes(1 << 20))
    stamp(p)

    # zstd/ (btrfs property compression=zstd, set by the caller): a 200 MiB log,
    # 5,000 small text files (inline and regular compressed extents), and a
    # 64 MiB file alternating compressible and incompressible MiBs
    z = root + '/zstd'
    big(z + '/log-200M.txt', 200 << 20, text)
    for a in range(10):
        d = '%s/src/m%02d' % (z, a)
        os.makedirs(d)
        for c in range(500):
            small_file('%s/s%03d.c' % (d, c), text(size_small()))
    flip = [0]
    def mixed(n):
        flip[0] ^= 1
        return text(n) if flip[0] else R.randbytes(n)
    big(z + '/mixed-64M.bin', 64 << 20, mixed)

    # directory times last, deepest first
    for dp, dn, fn in sorted(os.walk(root), key=lambda w: -w[0].count('/')):
        if dp != root:
            stamp(dp)

def manifest(root):
    """path -> (content, meta). content: type, size, sha256 / link target.
    meta: mode, owner, mtime, xattrs, hard-link group (first path of the inode)."""
    m, inodes = {}, {}
    for dp, dn, fn in os.walk(root):
        for name in dn + fn:
            p = os.path.join(dp, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            fmt = stat.S_IFMT(st.st_mode)
            if fmt == stat.S_IFREG:
                content = ('f', st.st_size, benchlib.sha256(p))
                if st.st_nlink > 1:
                    inodes.setdefault((st.st_dev, st.st_ino), []).append(rel)
            elif fmt == stat.S_IFDIR:
                content = ('d',)
            elif fmt == stat.S_IFLNK:
                content = ('l', os.readlink(p))
            else:
                content = ('o%o' % fmt, st.st_rdev)
            xa = benchlib.xattrs(p)
            meta = {'mode': '%o' % stat.S_IMODE(st.st_mode) if fmt != stat.S_IFLNK else '-',
                    'owner': '%d:%d' % (st.st_uid, st.st_gid),
                    'mtime': st.st_mtime_ns,
                    'xattrs': xa,
                    'hardlink': '-'}
            m[rel] = [list(content), meta]
    for paths in inodes.values():
        first = min(paths)
        for rel in paths:
            m[rel][1]['hardlink'] = first
    return m

def cmd_manifest(root, out):
    benchlib.save(manifest(root), out)

def cmd_verify(ref, root):
    want, bad, parts = benchlib.compare(ref, manifest(root), 'content: ')
    if bad:
        print('FAIL: %d of %d paths wrong; first: %s' % (len(bad), len(want), '; '.join(bad[:5])))
        return 1
    print('contents OK (%d paths); metadata %s' %
          (len(want), 'identical' if not parts else 'differs: ' + ', '.join(parts)))
    return 0

def cmd_stats(ref):
    with open(ref) as f:
        m = json.load(f)
    n = {'f': 0, 'd': 0, 'l': 0}
    size, seen, links = 0, set(), 0
    for rel, (c, meta) in m.items():
        n[c[0][0]] = n.get(c[0][0], 0) + 1
        if c[0] == 'f':
            if meta['hardlink'] != '-' and meta['hardlink'] != rel:
                links += 1
            else:
                size += c[1]
    print('regular files %d (%d more names as hard links), directories %d, symlinks %d, '
          'file data %.1f MiB' % (n['f'] - links, links, n['d'], n['l'], size / 2**20))

if __name__ == '__main__':
    cmd, args = sys.argv[1], sys.argv[2:]
    sys.exit({'gen': gen, 'manifest': cmd_manifest, 'verify': cmd_verify,
              'stats': cmd_stats}[cmd](*args) or 0)
PYEOF
py() { PYTHONPATH="$REPO/bench${PYTHONPATH:+:$PYTHONPATH}" python3 -c "$PY" "$@"; }
# the reference manifest, taken from a read-only kernel mount of the image
py_manifest_ro() {
	mount -o ro,loop "$IMG" "$MNT"
	py manifest "$MNT" "$REF.tmp"
	umount "$MNT"
	mv "$REF.tmp" "$REF"
}

# ---- the image ----------------------------------------------------------------
if ((REBUILD)) || [[ ! -f $MARK || ! -f $IMG || $(cat "$MARK") != "$GEN_VERSION" ]]; then
	echo "== making the image in $IMG (kernel btrfs; takes a minute)"
	rm -f "$MARK" "$IMG" "$REF" "$STATS"
	truncate -s 2G "$IMG"
	mkfs.btrfs -q -f -L butter-bench "$IMG"
	mount -o loop "$IMG" "$MNT"
	mkdir "$MNT/zstd"
	btrfs property set "$MNT/zstd" compression zstd
	py gen "$MNT"
	sync
	btrfs filesystem df "$MNT" >"$STATS.df"
	umount "$MNT"
	py_manifest_ro
	{
		echo "image: $(du -h --apparent-size "$IMG" | cut -f1) file, $(du -h "$IMG" | cut -f1) allocated"
		echo "tree: $(py stats "$REF")"
		dump=$(btrfs inspect-internal dump-tree -t fs "$IMG")
		echo "zstd-compressed extents (regular and inline): $(grep -c 'compression 3 (zstd)' <<<"$dump" || true)," \
			"inline extents (all): $(grep -c 'inline extent data size' <<<"$dump" || true)"
		sed -n 's/^\(Data\|Metadata\), *\([a-zA-Z0-9]*\): total=\([^,]*\), used=\(.*\)/btrfs \1 (\2): used \4/p' "$STATS.df"
	} >"$STATS"
	echo "$GEN_VERSION" >"$MARK"
else
	echo "== reusing the image in $IMG"
	[[ -f $REF ]] || py_manifest_ro
fi

# ---- butter (release build) --------------------------------------------------------
bench_butter

# ---- the runs ------------------------------------------------------------------
# dd is an anchor, not a contestant: a cold sequential read of the whole image
# file, the floor for anything that has to read the image once.
TOOLS=(butter restore kernel dd)
declare -A LABEL=([butter]="butter extract" [restore]="btrfs restore" [kernel]="kernel (cp -a)"
	[dd]="dd read image")

run_butter() { "$BUTTER" extract -q "$IMG" / "$1"; }
run_restore() { btrfs restore -m -S -x "$IMG" "$1"; }
run_dd() { dd if="$IMG" of=/dev/null bs=1M status=none; }
run_kernel() {
	mount -o ro,loop "$IMG" "$MNT" || return
	local rc=0
	cp -a "$MNT/." "$1" || rc=$?
	umount "$MNT" || rc=$?
	return "$rc"
}

echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -r), $(nproc) CPUs," \
	"$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo) RAM," \
	"host fs $(df -T "$OUT" | awk 'NR == 2 {print $2}')"
bench_butter_line
echo "== $(btrfs --version)"
sed 's/^/== /' "$STATS"
echo "== $RUNS runs each, interleaved; wall seconds, caches dropped before each"

declare -A TIMES BEST CPU WARN
FAILED=0
for ((r = 1; r <= RUNS; r++)); do
	for t in "${TOOLS[@]}"; do
		dest=$OUT/$t
		log=$LOGS/$t.$r.log
		rm -rf "$dest"
		mkdir "$dest"
		sync
		echo 3 >/proc/sys/vm/drop_caches
		rc=0
		TIMEFORMAT='%3R %3U %3S'
		{ time { "run_$t" "$dest" >"$log" 2>&1 || rc=$?; }; } 2>"$LOGS/$t.$r.time"
		read -r real usr sys <"$LOGS/$t.$r.time"
		cpu=$(echo "$usr + $sys" | bc)
		sync
		vrc=0
		if [[ $t == dd ]]; then
			verdict="(anchor: $(du -h "$IMG" | cut -f1) allocated of $(du -h --apparent-size "$IMG" | cut -f1))"
		else
			verdict=$(py verify "$REF" "$dest") || vrc=1
		fi
		if ((vrc)); then
			# wrong output: the time does not count
			FAILED=1
			TIMES[$t]+="${real}(wrong) "
			printf '   run %d %-15s %8.3f s  WRONG OUTPUT (exit %d): %s\n' "$r" "${LABEL[$t]}" "$real" "$rc" "$verdict"
			head -n 3 "$log" | sed 's/^/      | /'
			continue
		fi
		printf '   run %d %-15s %8.3f s  cpu %6.2f s  %s\n' "$r" "${LABEL[$t]}" "$real" "$cpu" "$verdict"
		if ((rc)); then
			# right contents but a nonzero exit: counted, and reported
			WARN[$t]="exit status $rc, $(wc -l <"$log") lines on stderr, e.g.: $(head -n 1 "$log")"
			echo "      ! exit status $rc; $(wc -l <"$log") lines of messages, first: $(head -n 1 "$log")"
		fi
		TIMES[$t]+="$real "
		bench_keep_best "$t" "$real" "$cpu"
	done
done
((KEEP)) || rm -rf "${OUT:?}"/*

echo
printf '%-16s %10s %10s   %s\n' "tool" "best (s)" "cpu (s)" "all runs (s)"
for t in "${TOOLS[@]}"; do
	printf '%-16s %10s %10s   %s\n' "${LABEL[$t]}" "${BEST[$t]:-FAILED}" "${CPU[$t]:--}" "${TIMES[$t]}"
done
echo
if [[ -n ${BEST[butter]:-} && -n ${BEST[restore]:-} && -n ${BEST[kernel]:-} ]]; then
	vr=$(echo "scale=2; ${BEST[restore]} / ${BEST[butter]}" | bc)
	vk=$(echo "scale=2; ${BEST[kernel]} / ${BEST[butter]}" | bc)
	pr=$( (($(echo "$vr >= 2" | bc))) && echo met || echo MISSED)
	pk=$( (($(echo "$vk >= 0.8" | bc))) && echo met || echo MISSED)
	printf 'butter vs btrfs restore: %5sx as fast   (target >= 2x:   %s)\n' "$vr" "$pr"
	printf 'butter vs kernel:        %5sx as fast   (target >= 0.8x: %s)\n' "$vk" "$pk"
else
	echo "no ratios: a tool gave wrong output in every run"
fi
for t in "${TOOLS[@]}"; do
	[[ -z ${WARN[$t]:-} ]] || echo "warning: ${LABEL[$t]}: ${WARN[$t]}"
done
exit $FAILED
