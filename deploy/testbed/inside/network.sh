#!/bin/bash
# The testbed's network: one namespace per host (etc/hosts.tsv), one bridge per
# site (etc/networks.tsv), this namespace routing between them as the "WAN".
# Runs once in the testbed's own namespace, before any daemon starts.
set -euo pipefail
etc=/src/deploy/testbed/etc
rows() { grep -v '^#' "$1" | grep -v '^[[:space:]]*$'; }

sysctl -qw net.ipv4.ip_forward=1
while read -r site bridge prefix gateway; do
    ip link add "$bridge" type bridge
    ip addr add "$gateway/${prefix#*/}" dev "$bridge"
    ip link set "$bridge" up
done < <(rows "$etc/networks.tsv")

while read -r host addr site _; do
    read -r bridge prefix gateway < <(rows "$etc/networks.tsv" | awk -v s="$site" '$1 == s {print $2, $3, $4}')
    ip netns add "$host"
    ip link add "v-$host" type veth peer name eth0 netns "$host"
    ip link set "v-$host" master "$bridge" up
    ip -n "$host" link set lo up
    ip -n "$host" addr add "$addr/${prefix#*/}" dev eth0
    ip -n "$host" link set eth0 up
    ip -n "$host" route add default via "$gateway"
    # A peer cut off by the network sends nothing, not even a reset: only TCP
    # keepalive finds out. HTCondor sets the idle time before the first probe
    # (TCP_KEEPALIVE_INTERVAL) but leaves the probes to the kernel (9 every
    # 75 s = 11 min); here a dead connection is given up after 3 x 3 s.
    ip netns exec "$host" sysctl -qw net.ipv4.tcp_keepalive_intvl=3 net.ipv4.tcp_keepalive_probes=3
done < <(rows "$etc/hosts.tsv")

/bin/bash /src/deploy/testbed/inside/firewall.sh
/bin/bash /src/deploy/testbed/inside/wan.sh "${TESTBED_WAN_RATE:-200mbit}"
