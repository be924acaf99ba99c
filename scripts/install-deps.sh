#!/usr/bin/env bash
# Install what butter needs to build and test, from Debian's packages.
# Idempotent: does nothing when everything is present.
set -euo pipefail

PKGS=(meson ninja-build pkg-config gcc clang libclang-rt-14-dev
      libfuse3-dev fuse3 liburing-dev zlib1g-dev libzstd-dev liblzo2-dev libxxhash-dev
      libsodium-dev libisal-dev uuid-dev libpng-dev libnbd-dev libnbd-bin nbdkit qemu-utils
      python3-pytest btrfs-progs attr acl e2fsprogs util-linux kmod strace help2man man-db python3-btrfs btrfs-compsize go-md2man)

missing=()
for p in "${PKGS[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "installing: ${missing[*]}"
	SUDO=""
	[ "$(id -u)" -ne 0 ] && SUDO=sudo
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
