# Shared helpers of the testbed commands (sourced, not executed).
# shellcheck shell=bash

TB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$TB_DIR/../.." && pwd)
TB_CACHE=${TESTBED_CACHE:-/var/cache/htcondor-slurm-testbed}
TB_STATE=${TESTBED_STATE:-/var/lib/htcondor-slurm-testbed}
TB_SUITE=trixie

log() { printf '[testbed] %s\n' "$*" >&2; }
die() { printf '[testbed] error: %s\n' "$*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" = 0 ] || die "must run as root (it builds a root filesystem and creates namespaces); try: sudo $0 $*"
}

# The Debian mirror: TESTBED_MIRROR, else the first non-security URI of the
# host's apt configuration. Prints "<uri> <source-of-the-uri>".
debian_mirror() {
    if [ -n "${TESTBED_MIRROR:-}" ]; then
        echo "$TESTBED_MIRROR TESTBED_MIRROR"
        return
    fi
    local f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        # deb822 stanzas are separated by blank lines; skip security stanzas.
        uri=$(awk -v RS= '/(^|\n)Types:[^\n]*deb/ && !/Suites:[^\n]*-security/ {
                  if (match($0, /URIs:[ \t]*[^ \t\n]+/)) { u = substr($0, RSTART, RLENGTH); sub(/URIs:[ \t]*/, "", u); print u; exit } }' "$f")
        if [ -n "$uri" ]; then
            echo "$uri $f"
            return
        fi
    done
    if [ -r /etc/apt/sources.list ]; then
        uri=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {print $i; exit}}' /etc/apt/sources.list)
        [ -n "$uri" ] && { echo "$uri /etc/apt/sources.list"; return; }
    fi
    die "no Debian mirror found in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list; set TESTBED_MIRROR"
}

# Identity of a root filesystem: its package lists and build script.
rootfs_key() {
    cat "$TB_DIR/packages.txt" "$TB_DIR/sid-packages.txt" "$TB_DIR/requirements.txt" \
        "$TB_DIR/build-rootfs.sh" | sha256sum | cut -c1-12
}

rootfs_path() { echo "$TB_CACHE/rootfs-$(rootfs_key)"; }

# Host pid of the namespace's init, empty if the testbed is not up.
holder_pid() {
    local pid
    [ -r "$TB_STATE/holder.pid" ] || return 0
    pid=$(cat "$TB_STATE/holder.pid")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
        && [ "$(readlink "/proc/$pid/ns/mnt")" != "$(readlink /proc/self/ns/mnt)" ]; then
        echo "$pid"
    fi
}

# Run a command inside the testbed's namespaces (root, cwd /).
in_testbed() {
    local pid
    pid=$(holder_pid)
    [ -n "$pid" ] || die "the testbed is not up; run: $TB_DIR/testbed up"
    nsenter --target "$pid" --mount --uts --ipc --net --pid --root -- \
        /usr/bin/env -i --chdir=/ PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 "$@"
}
