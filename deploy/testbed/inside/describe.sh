#!/bin/bash
# What runs where, printed after `testbed up`.
cat <<'TXT'
The testbed is up (private network namespace, host name "testbed", loopback only):

  HTCondor central manager   collector+CCB 127.0.0.1:9618 (shared port), negotiator, schedd
                             config /etc/condor/config.d/{20-central-manager,90-testbed}.conf
                             identities: alice (local, FS), provisioner@testbed
                             (/etc/provisioner/tokens.d/provisioner), pilot@testbed
                             (/etc/provisioner/pilot.token, owned by the pilot account)
  SLURM site "gsi"           slurmctld 127.0.0.1:6817, nodes gsi-n1:6821 gsi-n2:6822 (4 CPU, 8000 MB)
                             partitions main (8 h, default) and debug (30 min)
                             SLURM_CONF=/etc/slurm-gsi/slurm.conf (the default)
  SLURM site "frankfurt"     slurmctld 127.0.0.1:6917, nodes fra-n1:6931 fra-n2:6932 (4 CPU, 8000 MB)
                             partition general1 (2 days, whole nodes only)
                             SLURM_CONF=/etc/slurm-frankfurt/slurm.conf
  Apptainer                  pilot image /opt/images/pilot.sif, usable by the "pilot" account
  XRootD origin ("GSI")      root://127.0.0.1:1094//data/  (files and SHA256SUMS in /srv/origin/data)
  XCache ("Frankfurt")       root://127.0.0.1:1095//root://127.0.0.1:1094//data/<file>  (cache /srv/xcache)

  accounts: alice (submits jobs), pilot (runs pilot SLURM jobs); the repository is at /src
  enter:    deploy/testbed/testbed shell [alice|pilot]
  logs:     /var/log/{condor,slurm,xrootd}/ inside; init log in the state directory's log/
TXT
