#!/bin/bash
# Wait until every component answers (polling, no fixed sleeps); fail after
# TESTBED_UP_TIMEOUT seconds naming the components that did not come up.
source /src/deploy/testbed/inside/checks.sh
deadline=$((SECONDS + ${TESTBED_UP_TIMEOUT:-300}))
pending=$COMPONENTS
while [ -n "$pending" ]; do
    still=""
    for c in $pending; do
        out=$("check_$c" 2>&1)
        rc=$?
        if [ $rc -eq 0 ]; then
            echo "[testbed] $c: up ($SECONDS s)"
        elif [ $rc -eq 2 ]; then
            echo "[testbed] $c: failed: $out" >&2
            exit 1
        else
            still="$still $c"
            last[${#last[@]}]="$c: $out"
        fi
    done
    pending=$still
    if [ -n "$pending" ] && [ $SECONDS -ge $deadline ]; then
        for c in $pending; do echo "[testbed] $c: not up: $("check_$c" 2>&1 | tail -n 3)" >&2; done
        exit 1
    fi
    [ -n "$pending" ] && sleep 0.5
done
exit 0
