#!/bin/bash
# One line per component: healthy or not (exit 1 if any is not).
source /src/deploy/testbed/inside/checks.sh
rc=0
for c in $COMPONENTS; do
    if out=$("check_$c" 2>&1); then
        printf '%-20s ok\n' "$c"
    else
        printf '%-20s FAIL %s\n' "$c" "$(echo "$out" | tail -n 1)"
        rc=1
    fi
done
exit $rc
