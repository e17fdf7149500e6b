#!/bin/bash
# SLURM with its accounting, started by init.sh in the background (the rest of the
# testbed comes up meanwhile): the testbed's MariaDB with both sites' databases, then
# per site, both sites at once, its slurmdbd, its accounts (etc/accounts.cfg) and its
# controller. The slurmds start at once: they register when their controller is up.
# A controller needs its slurmdbd at its first start (it has no cached associations),
# and slurmdbd is given databases it need not create (Debian trixie's MariaDB 11.8
# client breaks a slurmdbd that creates its own).
# On failure it writes why into /var/log/testbed/slurm.failed (checks.sh reads it).
set -uo pipefail
here=/src/deploy/testbed
CLUSTERS="gsi frankfurt"
FAILED=/var/log/testbed/slurm.failed
on() { "$here/inside/on" "$@"; }
fail() { echo "slurm-up: $*" | tee -a "$FAILED" >&2; exit 1; }

# Poll `cmd...` until it succeeds, for at most $1 seconds.
until_ok() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.1
    done
}

start_mariadb() {
    local sql="CREATE USER IF NOT EXISTS slurm@localhost IDENTIFIED VIA unix_socket;"
    mariadb-install-db --defaults-file=/etc/mysql/testbed.cnf --user=mysql --skip-test-db \
        --auth-root-authentication-method=socket --innodb-undo-tablespaces=0 \
        >/var/log/mysql/install.log 2>&1 || fail "mariadb-install-db: see /var/log/mysql/install.log"
    setsid mariadbd --defaults-file=/etc/mysql/testbed.cnf --user=mysql </dev/null \
        >/dev/null 2>&1 &
    until_ok 60 mariadb-admin ping || fail "MariaDB did not answer: see /var/log/mysql/testbed.log"
    for c in $CLUSTERS; do
        sql+=" CREATE DATABASE IF NOT EXISTS slurm_acct_$c;"
        sql+=" GRANT ALL ON slurm_acct_$c.* TO slurm@localhost;"
    done
    mariadb -e "$sql" || fail "could not create the accounting databases"
}

# One site: slurmdbd, the accounts, the controller.
cluster_up() {
    local c=$1 conf=/etc/slurm-$1/slurm.conf ctl
    ctl=$(awk -F= '/^SlurmctldHost=/ {print $2}' "$conf")
    SLURM_CONF=$conf on "$ctl" -- slurmdbd || fail "$c: slurmdbd did not start"
    until_ok 120 env SLURM_CONF="$conf" "$here/inside/on" "$ctl" -- sacctmgr -n show cluster \
        || fail "$c: slurmdbd did not answer: see /var/log/slurm/slurmdbd-$c.log"
    SLURM_CONF=$conf on "$ctl" -- sacctmgr -i load file=/etc/slurm-accounts.cfg "cluster=$c" \
        >"/var/log/slurm/accounts-$c.log" 2>&1 \
        || fail "$c: sacctmgr load: $(tail -n 1 "/var/log/slurm/accounts-$c.log")"
    SLURM_CONF=$conf on "$ctl" -- slurmctld -f "$conf" || fail "$c: slurmctld did not start"
}

for c in $CLUSTERS; do
    conf=/etc/slurm-$c/slurm.conf
    for n in $(awk '/^NodeName=/ {sub("NodeName=", "", $1); print $1}' "$conf"); do
        on "$n" -- slurmd -f "$conf" -N "$n"
    done
done
start_mariadb
pids=()
for c in $CLUSTERS; do
    cluster_up "$c" &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ $rc -eq 0 ] && echo "slurm-up: SLURM and its accounting started"
exit $rc
