"""Helpers of butter's integration tests: the kernel is the oracle.

Modules:
  env       environment knobs (scale, timeouts, temp dir) and the skip-or-fail rule
  kfs       kernel-made btrfs images: sparse files, loop devices, mkfs, mount, and
            always cleaning them up; chunk mapping and corruption of on-disk bytes
  tree      the deterministic, seeded tree generator that fills a mounted filesystem
  manifest  a stat-for-stat, byte-for-byte description of a tree, and the comparison
  oracle    judging an image: btrfs check --readonly, the kernel's mount of it and the
            comparison of what the kernel shows with what was expected
  butter    running the butter CLI with timeouts
  fusemount one `butter mount` daemon per `with`, always unmounted
  tools     the test programs of tests/tools (workload, crashreplay) and their files

Test modules import from here only, never from one another.
"""
