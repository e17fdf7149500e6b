#!/bin/bash
# Shape the "WAN": traffic routed into each site leaves the router through the
# site's bridge, where a token bucket limits it to RATE (e.g. 100mbit, 1gbit;
# "off" removes the limit). Traffic inside a site is bridged and never shaped.
#   wan.sh RATE
set -euo pipefail
rate=${1:?usage: wan.sh RATE|off}
rows() { grep -v '^#' "$1" | grep -v '^[[:space:]]*$'; }
while read -r site bridge _; do
    [ "$site" = public ] && continue
    tc qdisc del dev "$bridge" root 2>/dev/null || true
    [ "$rate" = off ] && continue
    tc qdisc add dev "$bridge" root tbf rate "$rate" burst 256kb latency 100ms
done < <(rows /src/deploy/testbed/etc/networks.tsv)
echo "WAN rate into each site: $rate"
