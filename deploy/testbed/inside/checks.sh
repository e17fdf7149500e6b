# Health checks of the testbed's components (sourced inside the namespace).
# Each check_* returns 0 when the component answers; a failing check prints why.
# shellcheck shell=bash
export PATH=/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin
COMPONENTS="munge slurm-gsi slurm-frankfurt condor-collector condor-negotiator condor-schedd tokens xrootd-origin xrootd-cache apptainer"

check_munge() { munge -n 2>&1 | unmunge >/dev/null 2>&1; }

check_slurm() {  # cluster: controller answers and every node is usable
    local out
    out=$(SLURM_CONF=/etc/slurm-$1/slurm.conf timeout 10 sinfo -h -N -o '%N %t' 2>&1) || { echo "$out"; return 1; }
    [ -n "$out" ] || { echo "no nodes"; return 1; }
    if echo "$out" | grep -vqE ' (idle|mix|alloc|comp|plnd)$'; then echo "$out" | tr '\n' ' '; return 1; fi
}
check_slurm-gsi() { check_slurm gsi; }
check_slurm-frankfurt() { check_slurm frankfurt; }

check_daemon_ad() {  # condor_status flag
    local out
    out=$(timeout 10 condor_status "$1" -af Name 2>&1) && [ -n "$out" ] || { echo "${out:-no ad}"; return 1; }
}
check_condor-collector() { check_daemon_ad -collector; }
check_condor-negotiator() { check_daemon_ad -negotiator; }
check_condor-schedd() { check_daemon_ad -schedd; }

check_tokens() { [ -s /etc/provisioner/tokens.d/provisioner ] && [ -s /etc/provisioner/pilot.token ] && [ -s /etc/condor/tokens.d/condor ]; }

check_xrootd() {  # port
    timeout 10 xrdfs "root://127.0.0.1:$1" query config version >/dev/null 2>&1
}
check_xrootd-origin() { check_xrootd 1094; }
check_xrootd-cache() { check_xrootd 1095; }

check_apptainer() {
    [ -e /var/log/testbed/post-start.failed ] && { echo "post-start failed: see init.log"; return 2; }
    [ -e /var/log/testbed/post-start.done ] || { echo "pilot image not built yet"; return 1; }
    runuser -u pilot -- apptainer -s exec /opt/images/pilot.sif true
}
