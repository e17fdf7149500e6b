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
            resolve_mirror_uri "$uri" "$f"
            return
        fi
    done
    if [ -r /etc/apt/sources.list ]; then
        uri=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {print $i; exit}}' /etc/apt/sources.list)
        [ -n "$uri" ] && { resolve_mirror_uri "$uri" /etc/apt/sources.list; return; }
    fi
    die "no Debian mirror found in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list; set TESTBED_MIRROR"
}

# apt's mirror method (Debian cloud images: URIs: mirror+file:///etc/apt/mirrors/debian.list)
# is unknown to debootstrap: use the first URL of the mirror list (lines are
# "URL[<tab>priority...]"). $1: uri, $2: where it came from.
resolve_mirror_uri() {
    local uri=$1 src=$2 list
    case "$uri" in
        mirror+file://*)
            list=${uri#mirror+file://}
            [ -r "$list" ] || die "apt mirror list $list (from $src) is not readable; set TESTBED_MIRROR"
            uri=$(awk '$1 !~ /^#/ && NF { print $1; exit }' "$list")
            [ -n "$uri" ] || die "apt mirror list $list (from $src) has no URL; set TESTBED_MIRROR"
            echo "$uri $list (via $src)"
            ;;
        mirror*)
            die "the mirror $uri (from $src) uses apt's mirror method, which debootstrap cannot use; set TESTBED_MIRROR"
            ;;
        *) echo "$uri $src" ;;
    esac
}

# Identity of a root filesystem: its package lists, build script and this file
# (TB_SUITE, the mirror logic).
rootfs_key() {
    cat "$TB_DIR/packages.txt" "$TB_DIR/sid-packages.txt" "$TB_DIR/requirements.txt" \
        "$TB_DIR/build-rootfs.sh" "$TB_DIR/lib.sh" | sha256sum | cut -c1-12
}

rootfs_path() { echo "$TB_CACHE/rootfs-$(rootfs_key)"; }

# True if process $1 runs the testbed's namespace init (enter.sh, which execs
# init.sh). Guards against a stale holder.pid naming an unrelated process.
is_holder_process() {
    local cmd
    cmd=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
    case "$cmd" in
        *inside/init.sh*|*inside/enter.sh*) return 0 ;;
        *) return 1 ;;
    esac
}

# Host pid of the namespace's init, empty if the testbed is not up.
holder_pid() {
    local pid
    [ -r "$TB_STATE/holder.pid" ] || return 0
    pid=$(cat "$TB_STATE/holder.pid")
    case "$pid" in ''|*[!0-9]*) return 0 ;; esac
    if kill -0 "$pid" 2>/dev/null \
        && [ "$(readlink "/proc/$pid/ns/mnt")" != "$(readlink /proc/self/ns/mnt)" ] \
        && is_holder_process "$pid"; then
        echo "$pid"
    fi
}

# Direct children of process $1, one pid a line (empty if it has none or is gone).
children_of() {
    local f line rest
    if [ -e "/proc/$$/task/$$/children" ]; then
        for f in /proc/"$1"/task/*/children; do
            [ -r "$f" ] && tr ' ' '\n' <"$f" 2>/dev/null
        done | grep -E '^[0-9]+$' || true
        return 0
    fi
    # Kernel without CONFIG_PROC_CHILDREN: field 4 of /proc/PID/stat (after
    # the parenthesised command name) is the parent pid.
    for f in /proc/[0-9]*/stat; do
        line=$(cat "$f" 2>/dev/null) || continue
        rest=${line##*) }
        # shellcheck disable=SC2086  # split the stat fields on purpose
        set -- "$1" $rest
        [ "${3:-}" = "$1" ] && { f=${f#/proc/}; echo "${f%/stat}"; }
    done
    return 0
}

# Delete a tree that may have file systems mounted below it (a chroot's /proc
# after an interrupted build): unmount them lazily, deepest first, then delete
# without crossing into any that remain.
remove_tree() {
    local d=$1 m
    [ -n "$d" ] && [ -e "$d" ] || return 0
    d=$(cd "$d" 2>/dev/null && pwd -P) || d=$1
    findmnt -rn -o TARGET 2>/dev/null | while IFS= read -r m; do
        m=$(printf '%b' "$m")  # findmnt -r escapes blanks as \x20
        case "$m" in "$d"|"$d"/*) echo "$m" ;; esac
    done | LC_ALL=C sort -r | while IFS= read -r m; do
        umount -l "$m" 2>/dev/null || log "warning: could not unmount $m"
    done || true
    rm -rf --one-file-system "$1"
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
