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
# A private /dev: the host's nodes the daemons need, /dev/fuse open to all
# (Apptainer mounts SIF images with squashfuse as the unprivileged pilot).
mount -t tmpfs -o mode=755,nosuid tmpfs "$m/dev"
for node in null zero full random urandom tty; do
    touch "$m/dev/$node"
    mount --bind "/dev/$node" "$m/dev/$node"
done
mknod -m 0666 "$m/dev/fuse" c 10 229
mkdir -p "$m/dev/pts" "$m/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$m/dev/pts"
ln -s pts/ptmx "$m/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$m/dev/shm"
ln -s /proc/self/fd "$m/dev/fd"
ln -s /proc/self/fd/0 "$m/dev/stdin"
ln -s /proc/self/fd/1 "$m/dev/stdout"
ln -s /proc/self/fd/2 "$m/dev/stderr"
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
# This namespace is the "WAN" router between the hosts' namespaces
# (inside/network.sh, started by init.sh).
exec /bin/bash /src/deploy/testbed/inside/init.sh
