# Health checks of the testbed's components (sourced inside the namespace).
# Each check_* returns 0 when the component answers, 1 when it does not (yet),
# 2 when it never will (then `up` stops waiting); a failing check prints why.
# Every check runs on the host a user of that component would run it from.
# shellcheck shell=bash
export PATH=/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin
COMPONENTS="network munge slurmdbd-gsi slurmdbd-frankfurt slurm-gsi slurm-frankfurt ssh-gsi rest-frankfurt condor-collector condor-negotiator condor-schedd condor-schedd-submit2 tokens xrootd-origin xrootd-cache prometheus apptainer"
ON=/src/deploy/testbed/inside/on
on() { "$ON" "$@"; }

check_network() {  # every host has its namespace and reaches the central manager's address
    local h
    for h in $(grep -v '^#' /src/deploy/testbed/etc/hosts.tsv | awk 'NF {print $1}'); do
        [ -e "/run/netns/$h" ] || { echo "no namespace for $h"; return 1; }
    done
}

check_munge() { munge -n 2>&1 | unmunge >/dev/null 2>&1; }

# inside/slurm-up.sh starts SLURM in the background; it says here if it failed.
slurm_failed() {
    [ -e /var/log/testbed/slurm.failed ] || return 1
    tail -n 1 /var/log/testbed/slurm.failed
}

check_slurmdbd() {  # cluster login: its slurmdbd answers, with the accounts loaded
    local out
    slurm_failed && return 2
    out=$(SLURM_CONF=/etc/slurm-$1/slurm.conf timeout 10 "$ON" "$2" -- sacctmgr -n -P \
        show assoc where "cluster=$1" account=alloc-a user=pilot format=account 2>&1) \
        || { echo "$out"; return 1; }
    [ "$out" = alloc-a ] || { echo "no association of pilot with alloc-a (yet)"; return 1; }
}
check_slurmdbd-gsi() { check_slurmdbd gsi gsi-login; }
check_slurmdbd-frankfurt() { check_slurmdbd frankfurt fra-login; }

check_slurm() {  # cluster login: controller answers on the login node, every node usable
    local out
    slurm_failed && return 2
    out=$(SLURM_CONF=/etc/slurm-$1/slurm.conf timeout 10 "$ON" "$2" -- sinfo -h -N -o '%N %t' 2>&1) || { echo "$out"; return 1; }
    [ -n "$out" ] || { echo "no nodes"; return 1; }
    if echo "$out" | grep -vqE ' (idle|mix|alloc|comp|plnd)$'; then echo "$out" | tr '\n' ' '; return 1; fi
}
check_slurm-gsi() { check_slurm gsi gsi-login; }
check_slurm-frankfurt() { check_slurm frankfurt fra-login; }

check_ssh() {  # login host: the provisioner reaches the pilot account with strict host
    # keys, through its forced-command gate (`id -un` is among what the gate allows)
    timeout 15 "$ON" cm -u provisioner -- ssh -F none -o BatchMode=yes \
        -o IdentitiesOnly=yes -i /etc/provisioner/ssh/id_ed25519 -o StrictHostKeyChecking=yes \
        -o UserKnownHostsFile=/etc/provisioner/ssh/known_hosts -o ConnectTimeout=5 \
        "pilot@$1" id -un 2>&1 || return 1
}
check_ssh-gsi() { check_ssh gsi-login; }
# frankfurt's slurmrestd answers the provisioner's JWT (and only over HTTP: no SSH).
check_rest-frankfurt() {
    [ -s /etc/provisioner/tokens.d/frankfurt.jwt ] || { echo "no JWT yet"; return 1; }
    timeout 10 "$ON" cm -u provisioner -- python3 -c 'import sys, urllib.request
token = open("/etc/provisioner/tokens.d/frankfurt.jwt").read().strip()
req = urllib.request.Request("http://fra-login:6820/openapi/v3",
    headers={"X-SLURM-USER-NAME": "pilot", "X-SLURM-USER-TOKEN": token})
sys.exit(0 if urllib.request.urlopen(req, timeout=5).status == 200 else 1)' 2>&1 | tail -n 1
    return "${PIPESTATUS[0]}"
}

check_daemon_ad() {  # condor_status flag
    local out
    out=$(timeout 10 "$ON" cm -- condor_status "$1" -af Name 2>&1) && [ -n "$out" ] || { echo "${out:-no ad}"; return 1; }
}
check_condor-collector() { check_daemon_ad -collector; }
check_condor-negotiator() { check_daemon_ad -negotiator; }
check_condor-schedd() { check_daemon_ad -schedd; }
# The second submit host's schedd: in the collector, its queue readable from cm.
check_condor-schedd-submit2() {
    local out
    # (condor_q -name wants a DNS host name; the bindings locate by the ad's Name)
    out=$(timeout 10 "$ON" cm -- python3 -c 'import htcondor2 as h
h.Schedd(h.Collector().locate(h.DaemonType.Schedd, "submit2")).query(projection=["ClusterId"])' \
        2>&1) || { echo "$out"; return 1; }
}

check_tokens() { [ -s /etc/provisioner/tokens.d/provisioner ] && [ -s /root/.condor/tokens.d/provisioner ] && [ -s /etc/provisioner/pilot-keys/pilot-1 ] && [ -s /etc/condor/pilot-keys.d/pilot-1 ] && [ -s /etc/condor/tokens.d/condor ]; }

check_xrootd() {  # from-host url
    timeout 10 "$ON" "$1" -- xrdfs "$2" query config version >/dev/null 2>&1 || return 1
}
check_xrootd-origin() { check_xrootd gsi-n1 root://gsi-storage:1094; }
check_xrootd-cache() { check_xrootd fra-n1 root://fra-cache:1094; }

check_prometheus() {  # its HTTP API answers on cm
    on cm -- python3 -c 'import sys, urllib.request
sys.exit(0 if urllib.request.urlopen("http://127.0.0.1:9090/-/ready", timeout=5).status == 200 else 1)' \
        >/dev/null 2>&1 || { tail -n 2 /var/log/testbed/prometheus.log 2>/dev/null; return 1; }
}

check_apptainer() {
    [ -e /var/log/testbed/post-start.failed ] && { echo "post-start failed: see init.log"; return 2; }
    [ -e /var/log/testbed/post-start.done ] || { echo "pilot image not built yet"; return 1; }
    on gsi-n1 -u pilot -- apptainer -s exec /opt/images/pilot.sif true || return 1
    on gsi-n1 -u pilot -- apptainer -s exec /opt/images/payload.sif true || return 1
}
