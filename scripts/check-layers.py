#!/usr/bin/env python3
"""check-layers.py — the library's folders call only the folders below them.

Reads the symbol tables of the built objects of libbutter (nm), finds which
folder defines each global symbol and which folders use it, and fails when a
folder uses a symbol of a folder at or above it in LAYERS (calls inside one
folder are free). The order is the one docs/DESIGN.md describes.

Usage: scripts/check-layers.py [BUILD_DIR]   (default: build)
Exit 0: the layering holds; 1: each violation is printed as
"lower-folder/file.o uses symbol of upper-folder/file.o".
"""
import glob
import os
import subprocess
import sys

# Lowest first (log.c and turn_lock.c sit in lib/ itself). A folder may use the symbols
# of any folder before it.
LAYERS = ['log', 'turn_lock', 'format', 'device', 'volumes', 'tree', 'extent', 'trans', 'fs', 'inode',
          'data', 'namespace', 'subvol', 'treelog', 'ops', 'api']


def folder_of(obj):
    # meson names lib/<folder>/<file>.c's object <folder>_<file>.c.o
    base = os.path.basename(obj)
    for f in sorted(LAYERS, key=len, reverse=True):
        if base == f + '.c.o' or base.startswith(f + '_'):
            return f
    return None


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else 'build'
    objs = glob.glob(os.path.join(build, 'lib', 'libbutter.a.p', '*.o'))
    if not objs:
        print(f'check-layers: no objects under {build}/lib/libbutter.a.p (build first)')
        return 1
    defined, used = {}, {}
    for o in objs:
        out = subprocess.run(['nm', o], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            p = line.split()
            if len(p) == 3 and p[1] in 'TDBRC':
                defined[p[2]] = o
            elif len(p) == 2 and p[0] == 'U':
                used.setdefault(o, set()).add(p[1])
    bad = 0
    for o, syms in sorted(used.items()):
        fo = folder_of(o)
        if fo is None:
            print(f'check-layers: {o}: folder not in LAYERS')
            bad += 1
            continue
        for s in sorted(syms):
            d = defined.get(s)
            if d is None or d == o:
                continue
            fd = folder_of(d)
            if fd is None:
                continue  # reported above as a folder not in LAYERS
            if fd != fo and LAYERS.index(fd) > LAYERS.index(fo):
                print(f'{fo}/{os.path.basename(o)} uses {s} of {fd}/{os.path.basename(d)}')
                bad += 1
    if bad:
        print(f'check-layers: {bad} upward uses')
        return 1
    print(f'check-layers: {len(objs)} objects, {len(LAYERS)} layers, no upward use')
    return 0


if __name__ == '__main__':
    sys.exit(main())
