#!/bin/bash
# What runs where, printed after `testbed up`.
cat <<'TXT'
The testbed is up: one network namespace and host name per host, a bridge per
site, the WAN routed (and shaped) in between.

  cm           10.10.0.10  collector+CCB cm:9618 (shared port), negotiator, schedd;
                           alice submits here; the provisioner runs here as "provisioner"
                           (token /etc/provisioner/tokens.d/provisioner, SSH key and
                           known_hosts in /etc/provisioner/ssh/)
  submit2      10.10.0.11  a second submit host: its own condor_master and schedd
                           ("submit2", its own directories /var/*/condor-submit2);
                           alice may submit here too (testbed exec submit2 -u alice -- ...)
  gsi-login    10.10.1.10  slurmctld :6817 (cluster "gsi": partitions main 8 h, debug
                           30 min, shared nodes), slurmdbd :6819, sshd (key only,
                           account pilot)
  gsi-n1, -n2  10.10.1.11-12  slurmd, 4 CPU / 8000 MB each; pilots run here
  gsi-storage  10.10.1.20  XRootD origin root://gsi-storage:1094//data/
  fra-login    10.10.2.10  slurmctld :6917 (cluster "frankfurt": general1 2 days,
                           whole nodes), slurmdbd :6919, slurmrestd :6820, sshd
  fra-n1, -n2  10.10.2.11-12  slurmd, 4 CPU / 8000 MB each
  fra-cache    10.10.2.20  XCache root://fra-cache:1094//root://gsi-storage:1094//data/<file>

  SLURM's accounting: one MariaDB (socket only) holds both slurmdbd's databases;
  accounts hpc-physics (every user's default), alloc-a (GrpTRESMins cpu=6000),
  alloc-b (cpu=3000), from deploy/testbed/etc/accounts.cfg (sshare -l, sacct).

  Workers accept no connection from outside their site (nftables): pilots join
  through CCB. Pilot image /opt/images/pilot.sif (Apptainer, account pilot).

  hosts:    deploy/testbed/testbed hosts
  enter:    deploy/testbed/testbed shell [HOST] [alice|pilot|provisioner]
  run:      deploy/testbed/testbed exec [HOST] [-u USER] -- CMD
  WAN:      deploy/testbed/testbed wan 100mbit|off
  logs:     /var/log/{condor,slurm,xrootd,mysql}/ inside; init and sshd logs in the state
            directory's log/; the repository is at /src on every host
TXT
