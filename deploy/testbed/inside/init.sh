#!/bin/bash
# Init of the testbed namespace (PID 1): configures and starts every daemon,
# then waits; on TERM it stops them gracefully. Health is checked separately
# (wait-healthy.sh), so this script never sleeps to "let things settle".
set -uo pipefail
export PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
touch /var/log/testbed/init.started
here=/src/deploy/testbed

stop_all() {
    echo "stopping daemons"
    pkill -TERM condor_master
    pkill -TERM -x xrootd
    pkill -TERM -x cmsd
    pkill -TERM -x slurmd
    pkill -TERM -x slurmctld
    pkill -TERM -x sshd
    pkill -TERM -x slurmrestd
    pkill -TERM -x prometheus
    for _ in $(seq 100); do
        pgrep -x 'condor_master|slurmd|slurmctld|xrootd|cmsd' >/dev/null || break
        sleep 0.1
    done
    # the controllers are gone: nothing sends their slurmdbd records any more
    pkill -TERM -x slurmdbd
    for _ in $(seq 50); do pgrep -x slurmdbd >/dev/null || break; sleep 0.1; done
    pkill -TERM -x mariadbd
    pkill -TERM -x munged
    exit 0
}
trap stop_all TERM INT

/bin/bash "$here/inside/configure.sh" || { echo "configure failed"; exit 1; }

echo "starting the network"
/bin/bash "$here/inside/network.sh" || { echo "network set-up failed"; exit 1; }
on() { "$here/inside/on" "$@"; }

echo "starting munge"
runuser -u munge -- /usr/sbin/munged

echo "starting SLURM in the background: MariaDB, each site's slurmdbd, accounts, controller"
/bin/bash "$here/inside/slurm-up.sh" &

echo "starting slurmrestd on fra-login (JWT; the provisioner reaches frankfurt only so)"
"$here/inside/slurmrestd-ctl" start

echo "starting sshd on the login nodes"
for login in $(grep -v '^#' "$here/etc/hosts.tsv" | awk '$4 == "login" {print $1}'); do
    on "$login" -- /usr/sbin/sshd -f /etc/ssh/testbed/sshd_config \
        -o "HostKey=/etc/ssh/testbed/${login}_ed25519" -o "PidFile=/run/sshd-$login.pid" \
        -E "/var/log/testbed/sshd-$login.log"
done

echo "starting HTCondor on cm, and the second schedd on submit2"
on cm -- condor_master
on submit2 -- condor_master

echo "starting XRootD: origin on gsi-storage, cache on fra-cache"
on gsi-storage -u xrootd -- xrootd -b -n origin -c /etc/xrootd/origin.cfg -l /var/log/xrootd/origin.log
on fra-cache -u xrootd -- xrootd -b -n cache -c /etc/xrootd/cache.cfg -l /var/log/xrootd/xrootd.log

echo "starting Prometheus on cm (http://127.0.0.1:9090 there)"
on cm -u prometheus -- prometheus --config.file=/etc/prometheus/testbed.yml \
    --storage.tsdb.path=/var/lib/prometheus/testbed --web.listen-address=127.0.0.1:9090 \
    >/var/log/testbed/prometheus.log 2>&1 &

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
