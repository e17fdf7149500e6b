#!/usr/bin/env bash
# Build the testbed's Debian trixie root filesystem into $1 (a fresh directory).
# Called by `testbed build`, which builds into a temporary directory and renames
# it only when this script succeeds, so a failed build is never used.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

target=$1
# Not `read < <(debian_mirror)`: that would ignore debian_mirror's failure.
mirror_line=$(debian_mirror)
read -r mirror mirror_source <<<"$mirror_line"
log "Debian mirror $mirror (from $mirror_source)"

packages() { grep -v '^#' "$1" | grep -v '^$' | tr '\n' ' '; }

bootstrap() {  # $1: tree
    debootstrap --variant=minbase --include=ca-certificates "$TB_SUITE" "$1" "$mirror" >"$1.log" 2>&1 || {
        tail -n 20 "$1.log" >&2
        die "debootstrap of $TB_SUITE from $mirror failed (mirror from $mirror_source; set TESTBED_MIRROR to override); log: $1.log"
    }
    rm -f "$1.log"
    rm -f "$1/etc/apt/sources.list"
    cat >"$1/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $TB_SUITE sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    printf 'Package: *\nPin: release n=sid\nPin-Priority: 100\n' >"$1/etc/apt/preferences.d/sid"
    printf '%s\n' 'Acquire::Check-Valid-Until "false";' 'APT::Install-Recommends "false";' \
        'Dpkg::Options { "--force-confold"; };' >"$1/etc/apt/apt.conf.d/90testbed"
    # Daemons must not start while packages are installed.
    printf '#!/bin/sh\nexit 101\n' >"$1/usr/sbin/policy-rc.d"
    chmod 755 "$1/usr/sbin/policy-rc.d"
    # Registries' TLS is intercepted by a CA only the host trusts; apt-get in
    # the tree (both the rootfs and the pilot base) needs it.
    if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
        cp /etc/ssl/certs/ca-certificates.crt "$1/usr/local/share/ca-certificates/host-bundle.crt"
    fi
    in_tree "$1" update-ca-certificates >/dev/null
}

# The /proc bind mount of the chroot in use, unmounted on any exit: a tree left
# with host /proc mounted inside would send a later `rm -rf` into /proc.
# (`testbed build` also runs this script in a private mount namespace, so the
# mount vanishes with it even on SIGKILL.)
MOUNTED_PROC=""
unmount_proc() {
    if [ -n "$MOUNTED_PROC" ]; then
        umount "$MOUNTED_PROC" 2>/dev/null || umount -l "$MOUNTED_PROC" 2>/dev/null || true
        MOUNTED_PROC=""
    fi
}
trap unmount_proc EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

in_tree() {  # $1: tree, rest: command
    local t=$1 rc=0
    shift
    mount --bind /proc "$t/proc"
    MOUNTED_PROC=$t/proc
    chroot "$t" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
        LANG=C.UTF-8 "$@" || rc=$?
    unmount_proc
    return $rc
}

apt_in() {  # $1: tree, $2: log, rest: shell command
    local t=$1 logf=$2
    shift 2
    in_tree "$t" sh -c "apt-get update -q && $*" >"$logf" 2>&1 || {
        tail -n 30 "$logf" >&2
        die "apt-get failed (mirror $mirror from $mirror_source); log: $logf"
    }
    rm -f "$logf"
}

bootstrap "$target"
in_target() { in_tree "$target" "$@"; }

log "installing packages (about 90 s)"
apt_in "$target" "$target.apt.log" "apt-get install -y -q $(packages "$TB_DIR/packages.txt") \
    && apt-get install -y -q -t sid $(packages "$TB_DIR/sid-packages.txt") && apt-get clean"

# System site packages: Debian's XRootD bindings (python3-xrootd) are importable
# from the venv (PyPI has only a source build of them).
log "creating the Python venv /opt/venv"
cp "$TB_DIR/requirements.txt" "$target/tmp/requirements.txt"
in_target sh -c 'python3 -m venv --system-site-packages /opt/venv && /opt/venv/bin/pip install -q --disable-pip-version-check -r /tmp/requirements.txt' \
    || die "pip install in the rootfs failed (PyPI through the host's CA bundle)"

# The pilot image's base: a minimal trixie with HTCondor. Built here, as root
# on the host, because Apptainer cannot bootstrap Debian unprivileged;
# images/pilot.def bootstraps from it (Bootstrap: localimage).
log "building the pilot image base /opt/testbed/pilot-base"
base="$target/opt/testbed/pilot-base"
mkdir -p "$(dirname "$base")"
bootstrap "$base"
# The example payload image's base (images/payload.def): the same minimal trixie,
# copied before HTCondor goes in, with a tool chain instead (payloads compile and
# run experiment code; they need no HTCondor).
log "building the payload image base /opt/testbed/payload-base"
payload_base="$target/opt/testbed/payload-base"
cp -a "$base" "$payload_base"
apt_in "$payload_base" "$target.payload-base.log" "apt-get install -y -q gcc libc6-dev make \
    python3 && apt-get clean"
rm -f "$payload_base/usr/sbin/policy-rc.d"
# Jobs read data through XCache (xrdcp, the Python client, the client proxy
# plugin that makes the cache transparent) and check it (coreutils); fio for
# the file system campaigns.
# Apptainer (from sid, as on the hosts) runs jobs in their own containers, nested in
# the pilot's (unprivileged: user namespaces).
apt_in "$base" "$target.pilot-base.log" "apt-get install -y -q condor procps xrootd-client \
    xrootd-client-plugins python3-xrootd fio \
    && apt-get install -y -q -t sid $(packages "$TB_DIR/sid-packages.txt") && apt-get clean"
rm -f "$base/usr/sbin/policy-rc.d"

# Accounts: alice submits jobs; pilot is the site account pilot jobs run as.
in_target sh -c 'useradd -m -u 2001 -s /bin/bash alice && useradd -m -u 2002 -s /bin/bash pilot'
log "rootfs ready: $(du -sh "$target" | cut -f1)"
