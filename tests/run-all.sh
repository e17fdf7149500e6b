#!/usr/bin/env bash
# `make test`: the unit tests run beside the integration tests, not before them.
#
# The integration tests spend most of their time waiting on the testbed's daemons
# (pilots booting, jobs running, timeouts running out), the unit tests need one core
# for a few minutes: run together, `make test` takes as long as the integration
# tests. The unit tests run at a lower priority (nice) so the testbed's daemons keep
# the cores they need, and their output is kept in a file, shown when both are done
# (all of it if they failed, their summary if they passed). The exit status fails if
# either failed.
set -uo pipefail
cd "$(dirname "$0")/.."

log=$(mktemp -t unit-tests.XXXXXX)
trap 'rm -f "$log"' EXIT
echo "unit tests: started beside the integration tests (output shown at the end)"
nice -n 10 make -s unit >"$log" 2>&1 &
unit_pid=$!

make -s integration
integration_rc=$?

wait "$unit_pid"
unit_rc=$?
echo
echo "--- unit tests (run beside the integration tests): exit status $unit_rc ---"
if [ "$unit_rc" -ne 0 ]; then cat "$log"; else tail -n 3 "$log"; fi
echo "--- integration tests: exit status $integration_rc ---"
[ "$unit_rc" -eq 0 ] && [ "$integration_rc" -eq 0 ]
