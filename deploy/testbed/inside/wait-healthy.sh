#!/bin/bash
# Wait until every component answers (polling, no fixed sleeps); fail after
# TESTBED_UP_TIMEOUT seconds naming the components that did not come up. Each
# component is polled by its own process: a check that waits for its daemon (a
# controller still starting) holds up no other.
source /src/deploy/testbed/inside/checks.sh
deadline=$((SECONDS + ${TESTBED_UP_TIMEOUT:-300}))
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Poll one component until it answers (exit 0), will never (2) or time runs out (1).
poll() {
    local c=$1 rc
    while true; do
        "check_$c" >"$out/$c.out" 2>&1
        rc=$?
        if [ $rc -eq 0 ]; then echo "[testbed] $c: up ($SECONDS s)"; return 0; fi
        if [ $rc -eq 2 ]; then echo "[testbed] $c: failed: $(cat "$out/$c.out")" >&2; return 2; fi
        if [ $SECONDS -ge $deadline ]; then
            echo "[testbed] $c: not up: $(tail -n 3 "$out/$c.out")" >&2
            return 1
        fi
        sleep 0.5
    done
}

pids=()
for c in $COMPONENTS; do
    poll "$c" &
    pids+=($!)
done
# Stop at the first component that failed for good or ran out of time.
for _ in "${pids[@]}"; do
    if ! wait -n; then
        kill "${pids[@]}" 2>/dev/null
        wait
        exit 1
    fi
done
exit 0
