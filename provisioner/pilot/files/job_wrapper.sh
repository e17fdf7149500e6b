#!/bin/sh
# HTCondor's USER_JOB_WRAPPER of a pilot: runs every payload in a user+mount+PID
# namespace where
# - an empty tmpfs covers the pilot's private directories, and
# - empty tmpfs cover the node's scratch directory (where every pilot of the site
#   account keeps its work directory: tokens, other jobs' sandboxes), /tmp,
#   /var/tmp and /dev/shm; the job's own sandbox is mounted back in place,
# - /proc shows the job's own processes only (its own PID namespace: it can
#   neither list nor signal another job's processes),
# then drops into a nested user namespace. Mounts made in the outer namespace are
# locked in the inner one, so the payload cannot unmount them to reveal what they
# cover. Fails closed: if a namespace or a mount cannot be made, the job does not
# run.
#
# What to cover comes from job-wrapper.conf beside this script (written by the
# pilot, provisioner.pilot.workfiles), one setting a line: `hide DIR` (a private
# directory), `cover DIR` (a shared one, covered if it exists), `pid-namespace
# off` (tests only). It is data: nothing in it is run as shell.
#
# Signals: the starter signals this script (the job's top process); it forwards
# them to the namespace's first process (a shell with traps: PID 1 ignores what it
# has no handler for), which forwards them to the payload. A payload killed by a
# signal ends this script by the same signal (exit status 128+N is read as that).
# `wait` returns early when a trap ran (`woken`): it is called again for the real
# status (127 then means the status was the one already seen).
#
# An executable that cannot be run (absent on the worker: transfer_executable =
# false; a directory; no execute permission) is found before the exec, as the job's
# own user inside its namespaces, and reported through HTCondor's job-wrapper error
# file (_CONDOR_WRAPPER_ERROR_FILE): the starter then treats the start as failed
# ("The job wrapper failed to execute the job: <the message>", a starter error the
# pool's failed-start policy holds the job for, naming the path) instead of the job
# ending with exit status 127 as if it had run.
set -e
# A job that asked for it (+WantXCache = false) reads root:// URLs directly.
if [ -n "${_CONDOR_JOB_AD:-}" ] && grep -qix 'WantXCache = false' "$_CONDOR_JOB_AD" 2>/dev/null
then
    unset XRD_PLUGIN XROOT_PROXY XROOT_PROXY_EXCL_DOMAINS
fi
sandbox=${_CONDOR_SCRATCH_DIR:-$PWD}
ns=; pending=
settings=$(dirname -- "$0")/job-wrapper.conf
nl='
'
hide=; cover=; pid_namespace=on
while IFS= read -r line; do
    case $line in
        "hide "*) hide=$hide${line#hide }$nl ;;
        "cover "*) cover=$cover${line#cover }$nl ;;
        "pid-namespace off") pid_namespace=off ;;
    esac
done <"$settings"
if [ -z "$hide" ]; then
    echo "job-wrapper: $settings names no private directory: the job does not run" >&2
    exit 1
fi
forward() {
    woken=1
    if [ -z "$ns" ]; then pending=$1; return; fi
    # shellcheck disable=SC2046  # the children's pids, one word each
    kill -s "$1" $(cat /proc/$ns/task/$ns/children 2>/dev/null) 2>/dev/null
}
for sig in TERM INT HUP QUIT USR1 USR2 ALRM; do
    # shellcheck disable=SC2064  # the signal's name is fixed when the trap is set
    trap "forward $sig" $sig
done
# The payload's start, run as the job's own user in its namespaces (where the exec
# happens: a path the namespaces hide does not exist for it): the check, then the
# exec in the same process, so signals and the exit status reach the payload as
# before. A name without a slash is looked up in PATH by the exec: not checked.
# shellcheck disable=SC2016  # expanded by the payload's shell
start='
case $1 in
*/*)
    why=; rc=126
    if [ ! -e "$1" ]; then why="does not exist on this worker node"; rc=127
    elif [ -d "$1" ]; then why="is a directory"
    elif [ ! -x "$1" ]; then why="is not executable by the user the job runs as"
    fi
    if [ -n "$why" ]; then
        echo "job-wrapper: executable $1 $why" >&2
        if [ -n "${_CONDOR_WRAPPER_ERROR_FILE:-}" ]; then
            printf "executable %s %s\n" "$1" "$why" >"$_CONDOR_WRAPPER_ERROR_FILE"
        fi
        exit $rc
    fi
esac
exec "$@"
'
# The namespace's first process: $1 uid, $2 gid, $3 sandbox, $4 the directories to
# hide, $5 those to cover (each a list of lines), $6 the payload's start, then the
# job's command.
# shellcheck disable=SC2016  # expanded by the inner shell
inner='
job=; pending=
fwd() { woken=1; if [ -n "$job" ]; then kill -s "$1" "$job" 2>/dev/null; else pending=$1; fi; }
for sig in TERM INT HUP QUIT USR1 USR2 ALRM; do trap "fwd $sig" $sig; done
set -e
uid=$1; gid=$2; sandbox=$3; hide=$4; cover=$5; start=$6; shift 6
nl="
"
set -f; IFS=$nl
for d in $hide; do mount -t tmpfs -o size=4k,mode=0700 pilot-private "$d"; done
mount -t tmpfs -o size=4k,mode=0700 job-stash /mnt
mkdir /mnt/sandbox
mount --rbind "$sandbox" /mnt/sandbox
for d in $cover; do
    if [ -d "$d" ]; then mount -t tmpfs -o mode=1777 job-private "$d"; fi
done
unset IFS; set +f
mkdir -p "$sandbox"
mount --move /mnt/sandbox "$sandbox"
umount /mnt
cd "$sandbox"
set +e
unshare --user --map-user="$uid" --map-group="$gid" -- /bin/sh -c "$start" job "$@" &
job=$!
if [ -n "$pending" ]; then kill -s "$pending" $job 2>/dev/null; fi
rc=
while :; do
    woken=; wait $job; s=$?
    if [ $s -eq 127 ] && [ -n "$rc" ]; then break; fi
    rc=$s; [ -n "$woken" ] || break
done
exit $rc
'
set +e
if [ "$pid_namespace" = off ]; then
    unshare --user --map-root-user --mount -- \
        /bin/sh -c "$inner" job-wrapper "$(id -u)" "$(id -g)" "$sandbox" "$hide" "$cover" \
        "$start" "$@" &
else
    unshare --user --map-root-user --mount --pid --fork --mount-proc -- \
        /bin/sh -c "$inner" job-wrapper "$(id -u)" "$(id -g)" "$sandbox" "$hide" "$cover" \
        "$start" "$@" &
fi
ns=$!
if [ -n "$pending" ]; then forward "$pending"; fi
rc=
while :; do
    woken=; wait $ns; s=$?
    if [ $s -eq 127 ] && [ -n "$rc" ]; then break; fi
    rc=$s; [ -n "$woken" ] || break
done
if [ $rc -gt 128 ] && [ $rc -lt 160 ]; then
    sig=$(kill -l $((rc - 128)))
    trap - "$sig"
    kill -s "$sig" $$
fi
exit $rc
