#!/bin/bash
# PID 1 of the testbed's namespaces, started by `testbed up` through unshare.
# Mounts an overlay of the cached rootfs (so the cache stays pristine and every
# `up` starts clean), pivots into it and hands over to init.sh.
# Args: ROOTFS STATE_DIR REPO_DIR
set -euo pipefail
rootfs=$1 state=$2 repo=$3
m=$state/root
cache_images=${TESTBED_CACHE:-/var/cache/htcondor-slurm-testbed}/images
mkdir -p "$cache_images"

mount -t overlay overlay -o "lowerdir=$rootfs,upperdir=$state/upper,workdir=$state/work" "$m"
mount --rbind /dev "$m/dev"
mount -t proc proc "$m/proc"
mount -t sysfs sysfs "$m/sys"
mount -t tmpfs -o mode=755 tmpfs "$m/run"
mount -t tmpfs -o mode=1777 tmpfs "$m/tmp"
mkdir -p "$m/src" "$m/var/log/testbed" "$m/opt/images"
mount --bind "$repo" "$m/src"
mount --bind "$state/log" "$m/var/log/testbed"
mount --bind "$cache_images" "$m/opt/images"

cd "$m"
mkdir -p .oldroot
pivot_root . .oldroot
cd /
umount -l /.oldroot
rmdir /.oldroot

hostname testbed
ip link set lo up
exec /bin/bash /src/deploy/testbed/inside/init.sh
