#!/usr/bin/env bash
# `make test`: the integration tests in TEST_SHARDS testbeds at once (default 2), the
# unit tests beside them.
#
# The integration tests spend most of their time waiting on the testbed's daemons
# (pilots booting, jobs running, timeouts running out): one testbed keeps this
# machine's cores busy about a tenth of the time. So the integration files are split
# into shards of about equal length (tests/shards.py, on the durations measured in
# tests/integration/durations.tsv), and each shard runs in a testbed of its own: the
# same rootfs and images, its own namespaces, daemons, pool and sites, nothing shared
# but the read-only images and the repository. The first testbed is the usual one
# (`make testbed`); testbed K's state is "$TESTBED_STATE-K" (see its logs with
# `TESTBED_STATE=/var/lib/htcondor-slurm-testbed-2 deploy/testbed/testbed shell`).
#
# Each shard's lines are prefixed with its testbed. The unit tests run at a lower
# priority (nice), their output kept in a file and shown when all are done (all of
# it if they failed, their summary if they passed). The exit status fails if any
# part failed.
set -uo pipefail
cd "$(dirname "$0")/.."

shards=${TEST_SHARDS:-2}
case "$shards" in
    [1-9]) ;;
    *) echo "TEST_SHARDS must be 1-9, got '$shards'" >&2; exit 2 ;;
esac
base=${TESTBED_STATE:-/var/lib/htcondor-slurm-testbed}
state_of() { if [ "$1" -eq 1 ]; then echo "$base"; else echo "$base-$1"; fi; }

# Up one after the other: the first builds the rootfs and images (once), the others
# reuse them.
for k in $(seq "$shards"); do
    TESTBED_STATE=$(state_of "$k") make -s testbed || { echo "testbed $k did not come up" >&2; exit 1; }
done
python3 tests/shards.py "$shards" | sed 's/^/[plan] /'

log=$(mktemp -t unit-tests.XXXXXX)
trap 'rm -f "$log"' EXIT
echo "unit tests: started beside the integration tests (output shown at the end)"
nice -n 10 make -s unit >"$log" 2>&1 &
unit_pid=$!

declare -a pids
for k in $(seq "$shards"); do
    ( TESTBED_STATE=$(state_of "$k") make -s integration-shard SHARD="$k/$shards" 2>&1 \
        | sed -u "s/^/[testbed $k] /" ) &
    pids[k]=$!
done
failed=0
for k in $(seq "$shards"); do
    wait "${pids[k]}"
    rc=$?
    echo "--- integration tests, shard $k of $shards: exit status $rc ---"
    [ "$rc" -eq 0 ] || failed=1
done

wait "$unit_pid"
unit_rc=$?
echo
echo "--- unit tests (run beside the integration tests): exit status $unit_rc ---"
if [ "$unit_rc" -ne 0 ]; then cat "$log"; else tail -n 3 "$log"; fi
[ "$unit_rc" -eq 0 ] && [ "$failed" -eq 0 ]
