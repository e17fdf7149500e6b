#!/bin/bash
# Write the testbed's configuration into the (fresh, overlay) root filesystem.
set -euo pipefail
etc=/src/deploy/testbed/etc
repo=/src

# Every host's name and address (etc/hosts.tsv), the same file on every host.
{
    echo "127.0.0.1 localhost"
    echo "10.10.0.1 testbed"  # the router (this namespace)
    grep -v '^#' "$etc/hosts.tsv" | awk 'NF {print $2, $1}'
} >/etc/hosts

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
    if [ -f "$etc/gres-$c.conf" ]; then install -m 0644 "$etc/gres-$c.conf" "/etc/slurm-$c/gres.conf"; fi
    # an account submit limit, opt-in per test (job_submit.lua says how)
    sed "s|/etc/slurm-CLUSTER/|/etc/slurm-$c/|" "$etc/job_submit.lua" >"/etc/slurm-$c/job_submit.lua"
    chmod 0644 "/etc/slurm-$c/job_submit.lua"
    install -d -o slurm -g slurm "/var/lib/slurm/$c"
    # its slurmdbd (on its login node): slurmdbd refuses a file others may read
    install -m 0600 -o slurm -g slurm "$etc/slurmdbd-$c.conf" "/etc/slurm-$c/slurmdbd.conf"
done
# The accounts both clusters load (inside/slurm-up.sh), and their one MariaDB.
install -m 0644 "$etc/accounts.cfg" /etc/slurm-accounts.cfg
install -m 0644 "$etc/mariadb.cnf" /etc/mysql/testbed.cnf
install -d -o mysql -g mysql /run/mysqld /run/testbed-mariadb /var/log/mysql
# frankfurt's JWT signing key (slurm-frankfurt.conf AuthAltParameters): the
# controller's alone. slurmrestd runs as an account of its own (it refuses root
# and SlurmUser) and needs no key: it passes each client's token on.
key=/var/lib/slurm/frankfurt/jwt_hs256.key
[ -s "$key" ] || (umask 077 && head -c 32 /dev/urandom >"$key")
chown slurm:slurm "$key"
chmod 0600 "$key"
id slurmrestd >/dev/null 2>&1 || useradd -r -M -d /nonexistent -s /usr/sbin/nologin slurmrestd
# Plain `sinfo` talks to gsi; SLURM_CONF selects the other cluster.
rm -rf /etc/slurm && ln -s /etc/slurm-gsi /etc/slurm

# HTCondor central manager.
rm -f /etc/condor/config.d/*
install -m 0644 "$repo/condor_config/central-manager.conf" /etc/condor/config.d/20-central-manager.conf
install -m 0644 "$etc/condor-testbed.conf" /etc/condor/config.d/90-testbed.conf
# The second submit host's own settings and directories (etc/condor-host-submit2.conf).
install -d -m 0755 /etc/condor/hosts
install -m 0644 "$etc/condor-host-submit2.conf" /etc/condor/hosts/submit2.conf
install -d -o condor -g condor /var/log/condor-submit2 /var/spool/condor-submit2 \
    /run/lock/condor-submit2 /run/condor-submit2 /var/lib/condor-submit2 \
    /var/lib/condor-submit2/execute
install -d -m 0700 /etc/condor/passwords.d /etc/condor/tokens.d
# FS authentication at the collector (etc/condor-testbed.conf): like /tmp.
install -d -m 1777 /var/lib/condor-fsauth
install -d -m 1777 /run/lock
install -d -o condor -g condor /run/lock/condor /run/condor
install -d -m 0755 /etc/provisioner /var/log/pilots
install -m 0644 "$repo/condor_config/pilot.conf" /etc/provisioner/pilot.conf
chown pilot: /var/log/pilots

# The provisioner service's own unprivileged account on the central manager.
id provisioner >/dev/null 2>&1 || useradd -r -m -d /var/lib/provisioner -s /bin/bash provisioner
# A second physicist: jobs of two users on one pilot (isolation tests).
id bob >/dev/null 2>&1 || useradd -m -u 2003 -s /bin/bash bob
install -d -o provisioner -g provisioner -m 0750 /var/log/provisioner
install -d -o provisioner -g provisioner -m 0700 /run/provisioner

# SSH: each site's login node runs its own sshd with its own host key; the
# provisioner's key may log in as the site's pilot account, nothing else
# (`restrict`: no pty, no forwarding). known_hosts is written here, from the
# real host keys, so the client checks them strictly.
install -d -m 0755 /run/sshd /etc/ssh/testbed /etc/ssh/testbed/authorized_keys
install -d -o provisioner -g provisioner -m 0700 /etc/provisioner/ssh
rm -f /etc/provisioner/ssh/id_ed25519 /etc/provisioner/ssh/id_ed25519.pub
runuser -u provisioner -- ssh-keygen -q -t ed25519 -N "" -C provisioner@cm \
    -f /etc/provisioner/ssh/id_ed25519
: >/etc/provisioner/ssh/known_hosts
for login in $(grep -v '^#' "$etc/hosts.tsv" | awk '$4 == "login" {print $1}'); do
    rm -f "/etc/ssh/testbed/$login"_ed25519*
    ssh-keygen -q -t ed25519 -N "" -C "$login" -f "/etc/ssh/testbed/${login}_ed25519"
    echo "$login $(cut -d' ' -f1,2 "/etc/ssh/testbed/${login}_ed25519.pub")" \
        >>/etc/provisioner/ssh/known_hosts
done
chmod 0644 /etc/provisioner/ssh/known_hosts
# The provisioner's key runs only what the backend needs (deploy/site-gate/): the
# gate is its forced command at both login nodes, its refusals logged.
install -m 0755 "$repo/deploy/site-gate/provisioner-gate" /usr/local/libexec/provisioner-gate
install -m 0644 "$etc/provisioner-gate.ini" /etc/provisioner-gate.ini
install -d -o pilot -g pilot -m 0700 /var/log/provisioner-gate
gate='restrict,command="/usr/local/libexec/provisioner-gate /etc/provisioner-gate.ini"'
echo "$gate $(cat /etc/provisioner/ssh/id_ed25519.pub)" >/etc/ssh/testbed/authorized_keys/pilot
# The SSH executor's own test (tests/integration/test_ssh.py) sends arbitrary words
# to the remote side: a second key, root's on cm and only in the testbed, without
# the gate.
rm -f /root/.ssh/testbed-shell_ed25519 /root/.ssh/testbed-shell_ed25519.pub
install -d -m 0700 /root/.ssh
ssh-keygen -q -t ed25519 -N "" -C testbed-shell@cm -f /root/.ssh/testbed-shell_ed25519
echo "restrict $(cat /root/.ssh/testbed-shell_ed25519.pub)" >>/etc/ssh/testbed/authorized_keys/pilot
chmod 0644 /etc/ssh/testbed/authorized_keys/pilot
install -m 0644 "$etc/sshd.conf" /etc/ssh/testbed/sshd_config
# Key-only logins: "*" (no password) instead of useradd's "!" (locked), which
# sshd refuses without PAM.
usermod -p '*' pilot

# XRootD origin (on gsi-storage) and cache (on fra-cache).
install -m 0644 "$etc/xrootd-origin.cfg" /etc/xrootd/origin.cfg
install -m 0644 "$etc/xrootd-cache.cfg" /etc/xrootd/cache.cfg
install -m 0644 "$etc/xrootd-cache-dca.cfg" /etc/xrootd/cache-dca.cfg
install -m 0644 "$etc/xrootd-dcotf.cfg" /etc/xrootd/dcotf.cfg
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

# Prometheus (on cm) scrapes the provisioner's metrics endpoint.
install -d /etc/prometheus
install -m 0644 "$etc/prometheus.yml" /etc/prometheus/testbed.yml
install -d -o prometheus -g prometheus /var/lib/prometheus/testbed

# Benchmark campaigns run as alice and switch the Frankfurt cache's mode between
# scenarios: that one command, and nothing else, as root.
echo "alice ALL=(root) NOPASSWD: /src/deploy/testbed/inside/cache-mode" >/etc/sudoers.d/cache-mode
chmod 0440 /etc/sudoers.d/cache-mode
