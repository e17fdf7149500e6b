#!/bin/bash
# nftables inside each host's namespace. Worker nodes, caches and login nodes
# accept connections from their own site only (gsi's login node also SSH from
# anywhere, frankfurt's slurmrestd instead: the provisioner has no SSH route
# there); the central manager is public. Replies to outbound connections
# are always accepted, so a worker reaches the collector and CCB.
#   firewall.sh [HOST]   (all hosts if none given)
set -euo pipefail
etc=/src/deploy/testbed/etc
rows() { grep -v '^#' "$1" | grep -v '^[[:space:]]*$'; }
only=${1:-}
while read -r host _ site role; do
    [ -z "$only" ] || [ "$only" = "$host" ] || continue
    prefix=$(rows "$etc/networks.tsv" | awk -v s="$site" '$1 == s {print $3}')
    [ "$site" = public ] && continue
    extra=""
    case "$role" in login*) extra="tcp dport 22 accept" ;; esac
    case "$host" in fra-login) extra="tcp dport 6820 accept" ;; esac
    case "$host" in gsi-storage) extra="tcp dport 1094 accept" ;; esac
    ip netns exec "$host" nft -f - <<NFT
table inet testbed
delete table inet testbed
table inet testbed {
    chain input {
        type filter hook input priority 0; policy drop;
        iif lo accept
        ct state established,related accept
        ip saddr $prefix accept
        icmp type echo-request accept
        $extra
        counter comment "dropped from outside the site"
    }
}
NFT
done < <(rows "$etc/hosts.tsv")
