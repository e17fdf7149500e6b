#!/bin/bash
# Init of the testbed namespace (PID 1): configures and starts every daemon,
# then waits; on TERM it stops them gracefully. Health is checked separately
# (wait-healthy.sh), so this script never sleeps to "let things settle".
set -uo pipefail
export PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
touch /var/log/testbed/init.started
here=/src/deploy/testbed
CLUSTERS="gsi frankfurt"

stop_all() {
    echo "stopping daemons"
    pkill -TERM condor_master
    pkill -TERM -x xrootd
    pkill -TERM -x slurmd
    pkill -TERM -x slurmctld
    for _ in $(seq 100); do
        pgrep -x 'condor_master|slurmd|slurmctld|xrootd' >/dev/null || break
        sleep 0.1
    done
    pkill -TERM -x munged
    exit 0
}
trap stop_all TERM INT

/bin/bash "$here/inside/configure.sh" || { echo "configure failed"; exit 1; }

echo "starting munge"
runuser -u munge -- /usr/sbin/munged

echo "starting SLURM"
for c in $CLUSTERS; do
    slurmctld -f "/etc/slurm-$c/slurm.conf"
    for n in $(awk '/^NodeName=/ {sub("NodeName=", "", $1); print $1}' "/etc/slurm-$c/slurm.conf"); do
        slurmd -f "/etc/slurm-$c/slurm.conf" -N "$n"
    done
done

echo "starting HTCondor"
condor_master

echo "starting XRootD"
for role in origin cache; do
    runuser -u xrootd -- xrootd -b -n "$role" -c "/etc/xrootd/$role.cfg" -l "/var/log/xrootd/$role.log"
done

echo "all started"
# Post-start set-up that needs running daemons (tokens, pilot image).
# Runs in the background so that TERM is handled at once.
rm -f /var/log/testbed/post-start.*
{ /bin/bash "$here/inside/post-start.sh" && touch /var/log/testbed/post-start.done; } \
    || touch /var/log/testbed/post-start.failed &
while true; do
    sleep 3600 &
    wait $!
done
