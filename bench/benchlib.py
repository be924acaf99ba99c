"""bench/benchlib.py — the Python the bench scripts share. Their embedded
helpers import it (the scripts run them with bench/ on PYTHONPATH).

A manifest maps each path of a tree, relative to its top, to [content, meta]:
a difference in content makes a run wrong, a difference in a meta field is
only counted. Each script decides what goes in content and in meta.
"""
import hashlib
import json
import os


def sha256(p):
    """The SHA-256 of file P's bytes, as hex."""
    h = hashlib.sha256()
    with open(p, 'rb') as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


def xattrs(p):
    """[[name, value hex], ...] of P (not followed), sorted; ['?'] when unreadable.
    btrfs.* (properties such as btrfs.compression) exist only on btrfs: left out."""
    try:
        return sorted([k, os.getxattr(p, k, follow_symlinks=False).hex()]
                      for k in os.listxattr(p, follow_symlinks=False)
                      if not k.startswith('btrfs.'))
    except OSError:
        return ['?']


def save(manifest, out):
    """Write MANIFEST to the file OUT as JSON."""
    with open(out, 'w') as f:
        json.dump(manifest, f, sort_keys=True)


def compare(ref, manifest, content_label=''):
    """Compare MANIFEST with the one saved in the file REF. Returns (want, bad, parts):
    the reference, one line per missing, extra or different-content path (sorted;
    CONTENT_LABEL before the last kind), and per meta field that differs somewhere
    'FIELD COUNT (e.g. PATH)'."""
    with open(ref) as f:
        want = json.load(f)
    got = json.loads(json.dumps(manifest))  # same shapes as the loaded reference
    bad = []
    for rel in sorted(set(want) | set(got)):
        if rel not in got:
            bad.append('missing: %r' % rel)
        elif rel not in want:
            bad.append('extra: %r' % rel)
        elif want[rel][0] != got[rel][0]:
            bad.append('%s%r want %r got %r' % (content_label, rel, want[rel][0], got[rel][0]))
    meta = {}
    for rel in set(want) & set(got):
        for k, v in want[rel][1].items():
            if got[rel][1][k] != v:
                meta.setdefault(k, []).append(rel)
    parts = ['%s %d (e.g. %r)' % (k, len(v), min(v)) for k, v in sorted(meta.items())]
    return want, bad, parts
