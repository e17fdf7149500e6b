#!/bin/bash
# Write the testbed's configuration into the (fresh, overlay) root filesystem.
set -euo pipefail
etc=/src/deploy/testbed/etc
repo=/src

echo "127.0.0.1 localhost testbed" >/etc/hosts

# munge: one key shared by both clusters.
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
[ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key

# SLURM: one configuration directory per cluster (commands use SLURM_CONF).
install -m 0644 "$etc/slurm-common.conf" /etc/slurm-common.conf
install -d -o slurm -g slurm /var/log/slurm /run/slurm /var/lib/slurm
for c in gsi frankfurt; do
    install -d "/etc/slurm-$c"
    install -m 0644 "$etc/slurm-$c.conf" "/etc/slurm-$c/slurm.conf"
    install -m 0644 "$etc/cgroup.conf" "/etc/slurm-$c/cgroup.conf"
    install -d -o slurm -g slurm "/var/lib/slurm/$c"
done
# Plain `sinfo` talks to gsi; SLURM_CONF selects the other cluster.
rm -rf /etc/slurm && ln -s /etc/slurm-gsi /etc/slurm

# HTCondor central manager.
rm -f /etc/condor/config.d/*
install -m 0644 "$repo/condor_config/central-manager.conf" /etc/condor/config.d/20-central-manager.conf
install -m 0644 "$etc/condor-testbed.conf" /etc/condor/config.d/90-testbed.conf
install -d -m 0700 /etc/condor/passwords.d /etc/condor/tokens.d
install -d -m 1777 /run/lock
install -d -o condor -g condor /run/lock/condor /run/condor
install -d -m 0755 /etc/provisioner /var/log/provisioner /var/log/pilots
install -m 0644 "$repo/condor_config/pilot.conf" /etc/provisioner/pilot.conf
chown pilot: /var/log/pilots

# XRootD origin ("GSI storage") and cache ("Frankfurt cache node").
install -m 0644 "$etc/xrootd-origin.cfg" /etc/xrootd/origin.cfg
install -m 0644 "$etc/xrootd-cache.cfg" /etc/xrootd/cache.cfg
install -d -o xrootd -g xrootd /srv/origin/data /srv/xcache /var/log/xrootd /var/spool/xrootd /run/xrootd
# Test files of known checksum; sizes from TESTBED_DATA_SIZES ("name=size ...").
cd /srv/origin/data
for spec in ${TESTBED_DATA_SIZES:-small.dat=1M medium.dat=64M}; do
    name=${spec%%=*}
    size=${spec#*=}
    [ -s "$name" ] || head -c "$size" /dev/urandom >"$name"
done
sha256sum -- *.dat >SHA256SUMS
chown -R xrootd:xrootd /srv/origin/data
