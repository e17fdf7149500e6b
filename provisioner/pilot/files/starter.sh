#!/bin/sh
# A pilot's STARTER (provisioner/pilot/workfiles.py): HTCondor's condor_starter, except
# for the startd's capability query at start-up (`-classad`), which with Apptainer
# configured runs two nested containers first: seconds of every pilot's boot.
# - starter-classad beside this script (written by the pilot wrapper from this node's
#   record, provisioner/pilot/testcache.py): that is the answer, the starter is not run;
# - otherwise the starter answers, and its answer is left in starter-classad.new for
#   the wrapper to keep in the node's record.
# Every other call (each job's starter) is the starter itself.
real=${PILOT_REAL_STARTER:-/usr/sbin/condor_starter}
here=$(dirname -- "$0")
if [ "$#" -eq 1 ] && [ "$1" = "-classad" ]; then
    if [ -s "$here/starter-classad" ]; then
        exec cat -- "$here/starter-classad"
    fi
    tmp="$here/.starter-classad.$$"
    "$real" -classad >"$tmp"
    rc=$?
    cat -- "$tmp"
    if [ "$rc" -eq 0 ] && [ -s "$tmp" ]; then
        mv -f -- "$tmp" "$here/starter-classad.new"
    else
        rm -f -- "$tmp"
    fi
    exit "$rc"
fi
exec "$real" "$@"
