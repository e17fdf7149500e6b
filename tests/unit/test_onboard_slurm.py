"""site discover / site check / check-config --live: SLURM's own output parsed, the
fit of a site block to it, and the block discover prints (plain data)."""

from __future__ import annotations

import pytest
import yaml

from provisioner.config import SiteConfig, parse_config
from provisioner.onboard import fit
from provisioner.onboard.discover import Access, Live, LiveError, discover, site_block
from provisioner.onboard.slurminfo import (
    SlurmOutputError,
    duration_s,
    memory_mb,
    node_gpus,
    parse_nodes,
    parse_partitions,
    parse_record,
)

# `scontrol show partition -o` (Slurm 24.11) of the testbed's two clusters.
GSI_PARTITIONS = (
    "PartitionName=main AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL "
    "Default=YES QoS=N/A DefaultTime=01:00:00 DisableRootJobs=NO ExclusiveUser=NO "
    "ExclusiveTopo=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxTime=08:00:00 MinNodes=0 "
    "LLN=NO MaxCPUsPerNode=UNLIMITED MaxCPUsPerSocket=UNLIMITED Nodes=gsi-n[1-2] "
    "PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO "
    "OverTimeLimit=NONE PreemptMode=OFF State=UP TotalCPUs=8 TotalNodes=2 "
    "SelectTypeParameters=NONE JobDefaults=(null) DefMemPerCPU=2000 MaxMemPerNode=UNLIMITED "
    "TRES=cpu=8,mem=16000M,node=2,billing=8,gres/gpu=4\n"
    "PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL "
    "Default=NO QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 "
    "Hidden=NO MaxNodes=UNLIMITED MaxTime=00:30:00 MinNodes=0 LLN=NO "
    "MaxCPUsPerNode=UNLIMITED Nodes=gsi-n[1-2] PriorityJobFactor=1 PriorityTier=1 "
    "RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP "
    "TotalCPUs=8 TotalNodes=2 SelectTypeParameters=NONE JobDefaults=(null) "
    "DefMemPerCPU=2000 MaxMemPerNode=UNLIMITED TRES=cpu=8,mem=16000M,node=2,billing=8\n")
FRA_PARTITIONS = (
    "PartitionName=general1 AllowGroups=ALL AllowAccounts=hpc-physics,hpc-bio AllowQos=ALL "
    "AllocNodes=ALL Default=YES QoS=N/A DefaultTime=01:00:00 DisableRootJobs=NO "
    "ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxTime=2-00:00:00 "
    "MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=fra-n[1-2] PriorityJobFactor=1 "
    "PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=EXCLUSIVE OverTimeLimit=NONE "
    "PreemptMode=OFF State=UP TotalCPUs=8 TotalNodes=2 SelectTypeParameters=NONE "
    "JobDefaults=(null) DefMemPerCPU=1000 MaxMemPerNode=UNLIMITED "
    "TRES=cpu=8,mem=16000M,node=2,billing=8\n")
# `scontrol show node -o`: OS= and Reason= hold spaces.
GSI_NODES = "".join(
    f"NodeName=gsi-n{i} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=4 CPUTot=4 "
    "CPULoad=0.12 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 "
    f"NodeAddr=gsi-n{i} NodeHostName=gsi-n{i} Version=24.11.5 "
    "OS=Linux 6.12.12-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.12.12-1 (2025-02-02) "
    "RealMemory=8000 AllocMem=0 FreeMem=3112 Sockets=4 Boards=1 State=IDLE "
    "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=main,debug "
    "BootTime=2025-03-01T10:00:00 SlurmdStartTime=2025-03-01T10:01:00 "
    "LastBusyTime=2025-03-01T10:05:00 ResumeAfterTime=None "
    "CfgTRES=cpu=4,mem=8000M,billing=4,gres/gpu=2 AllocTRES= CurrentWatts=0 AveWatts=0\n"
    for i in (1, 2))
FRA_NODES = (
    "NodeName=fra-n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=4 CPUTot=4 "
    "CPULoad=0.00 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) "
    "NodeAddr=fra-n1 NodeHostName=fra-n1 Version=24.11.5 OS=Linux 6.12.12-amd64 #1 SMP "
    "RealMemory=8000 AllocMem=0 FreeMem=3000 Sockets=4 Boards=1 State=IDLE+DRAIN "
    "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=general1 "
    "CfgTRES=cpu=4,mem=8000M,billing=4 AllocTRES= CurrentWatts=0 AveWatts=0 "
    "Reason=Kernel update [root@2025-03-01T09:00:00]\n"
    "NodeName=fra-n2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=4 CPUEfctv=4 CPUTot=4 "
    "Gres=(null) RealMemory=8000 State=ALLOCATED Partitions=general1\n")

TESTBED = """
sites:
  - name: gsi
    partition: main
    max_walltime_s: 28800
    template: gsi.sh.j2
    image: /opt/images/pilot.sif
    pilot: {cpus: 4, memory_mb: 7800, memory_per_cpu_mb: 1950, walltime_s: 3600, gpus: 2}
  - name: frankfurt
    partition: general1
    account: hpc-physics
    max_walltime_s: 172800
    template: frankfurt.sh.j2
    image: /opt/images/pilot.sif
    pilot: {cpus: 4, min_cpus: 4, memory_mb: 7800, walltime_s: 7200, shutdown_margin_s: 300}
"""


def site(name: str, **changes: object) -> SiteConfig:
    data = yaml.safe_load(TESTBED)
    block = next(s for s in data["sites"] if s["name"] == name)
    for key, value in changes.items():
        target = block
        *path, last = key.split(".")
        for part in path:
            target = target[part]
        target[last] = value
    return parse_config(yaml.safe_dump(data)).site(name)


def test_record_values_with_spaces_end_at_the_next_key() -> None:
    node = parse_record(FRA_NODES.splitlines()[0])
    assert node["OS"] == "Linux 6.12.12-amd64 #1 SMP"
    assert node["Reason"] == "Kernel update [root@2025-03-01T09:00:00]"
    assert node["AllocTRES"] == ""
    assert node["CfgTRES"] == "cpu=4,mem=8000M,billing=4"


@pytest.mark.parametrize(("text", "seconds"), [
    ("08:00:00", 28800), ("2-00:00:00", 172800), ("30", 1800), ("00:30:00", 1800),
    ("5:30", 330), ("1-12", 129600), ("1-02:03", 93780), ("UNLIMITED", None),
    ("INFINITE", None)])
def test_time_limits(text: str, seconds: int | None) -> None:
    assert duration_s(text) == seconds


@pytest.mark.parametrize("bad", ["8h", "", "1-", "a:b"])
def test_a_time_limit_slurm_never_prints_is_an_error(bad: str) -> None:
    with pytest.raises(SlurmOutputError, match="time limit"):
        duration_s(bad)


def test_memory_and_gres() -> None:
    assert memory_mb("8000") == 8000
    assert memory_mb("16000M") == 16000
    assert memory_mb("2G") == 2048
    assert memory_mb("UNLIMITED") is None
    assert node_gpus("gpu:2").count == 2
    typed = node_gpus("gpu:a100:4(S:0-1),gpu:v100:2,shard:8")
    assert (typed.count, typed.types) == (6, ("a100", "v100"))
    assert node_gpus("(null)").count == 0


def test_partitions_and_nodes() -> None:
    main, debug = parse_partitions(GSI_PARTITIONS)
    assert (main.name, main.default, main.max_time_s, main.whole_node) == \
        ("main", True, 28800, False)
    assert (debug.default, debug.max_time_s, debug.def_mem_per_cpu_mb) == (False, 1800, 2000)
    (general,) = parse_partitions(FRA_PARTITIONS)
    assert general.whole_node and general.max_time_s == 172800
    assert general.allows_account("hpc-physics") and not general.allows_account("other")
    assert general.allows_account(None)
    n1, _n2 = parse_nodes(GSI_NODES)
    assert (n1.name, n1.cpus, n1.real_memory_mb, n1.gpus.count, n1.partitions) == \
        ("gsi-n1", 4, 8000, 2, ("main", "debug"))
    with pytest.raises(SlurmOutputError, match="not a NodeName record"):
        parse_nodes(GSI_PARTITIONS)


def _rows(s: SiteConfig, parts: str, nodes: str) -> dict[str, tuple[bool | None, str, str]]:
    checks = fit.slurm_checks(0, s, parse_partitions(parts), parse_nodes(nodes))
    return {c.name: (c.ok, c.found, c.fix) for c in checks}


def test_the_testbed_blocks_fit_their_sites() -> None:
    for s, parts, nodes in ((site("gsi"), GSI_PARTITIONS, GSI_NODES),
                            (site("frankfurt"), FRA_PARTITIONS, FRA_NODES)):
        rows = _rows(s, parts, nodes)
        assert all(ok for ok, _, _ in rows.values()), rows
        assert fit.differences(0, s, parse_partitions(parts), parse_nodes(nodes)) == []


def test_each_misfit_names_its_field_and_slurms_value() -> None:
    rows = _rows(site("gsi", partition="debug"), GSI_PARTITIONS, GSI_NODES)
    ok, found, fix = rows["MaxTime >= pilot walltime"]
    assert not ok and "MaxTime=00:30:00" in found and "sites[0].pilot.walltime_s" in fix
    rows = _rows(site("gsi", partition="gpu"), GSI_PARTITIONS, GSI_NODES)
    ok, found, fix = rows["partition exists"]
    assert not ok and "no partition 'gpu'" in found and "main*, debug" in found
    assert rows["a node fits the pilot"][0] is None  # not checked: no partition
    rows = _rows(site("gsi", **{"pilot.cpus": 8, "pilot.gpus": 3}), GSI_PARTITIONS, GSI_NODES)
    ok, _, fix = rows["a node fits the pilot"]
    assert not ok and "sites[0].pilot.cpus to at most 4" in fix and "gpus to at most 2" in fix
    rows = _rows(site("frankfurt", account="other"), FRA_PARTITIONS, FRA_NODES)
    ok, found, fix = rows["account allowed"]
    assert not ok and "AllowAccounts=hpc-physics,hpc-bio" in found and "sites[0].account" in fix
    rows = _rows(site("frankfurt", **{"pilot.min_cpus": 1}), FRA_PARTITIONS, FRA_NODES)
    ok, _, fix = rows["pilot shape"]
    assert not ok and "min_cpus to 4" in fix


def test_differences_name_a_lower_configured_limit_too() -> None:
    s = site("gsi", max_walltime_s=7200)
    diff = fit.differences(0, s, parse_partitions(GSI_PARTITIONS), parse_nodes(GSI_NODES))
    assert diff == ["sites[0].max_walltime_s: 7200 in the configuration, 28800 "
                    "(MaxTime=08:00:00) at the site"]


def test_discovered_blocks_are_valid_config_and_match_the_testbed() -> None:
    access = Access(host="gsi-login", user="pilot", slurm_conf="/etc/slurm-gsi/slurm.conf")
    live = Live("gsi", tuple(parse_partitions(GSI_PARTITIONS)), tuple(parse_nodes(GSI_NODES)))
    text = discover(live, None, access, "/opt/images/pilot.sif", None, None, "pilot@gsi-login")
    assert text.startswith("# Site block from SLURM at pilot@gsi-login: partition main")
    assert "# Other partitions: debug" in text
    config = parse_config(text)
    gsi = config.site("gsi")
    assert (gsi.partition, gsi.max_walltime_s, gsi.template) == ("main", 28800, "gsi.sh.j2")
    assert (gsi.pilot.cpus, gsi.pilot.min_cpus, gsi.pilot.memory_mb, gsi.pilot.gpus,
            gsi.pilot.memory_per_cpu_mb) == (4, 1, 7800, 2, 1950)
    assert gsi.slurm_conf == "/etc/slurm-gsi/slurm.conf"
    assert fit.differences(0, gsi, live.partitions, live.nodes) == []
    (general,) = parse_partitions(FRA_PARTITIONS)
    fra = site_block("frankfurt", general, parse_nodes(FRA_NODES),
                     Access(host="fra-login", user="pilot"), "/opt/images/pilot.sif",
                     "hpc-physics")
    assert fra["template"] == "frankfurt.sh.j2" and fra["account"] == "hpc-physics"
    assert (fra["pilot"]["cpus"], fra["pilot"]["min_cpus"], fra["max_walltime_s"],
            fra["pilot"]["walltime_s"]) == (4, 4, 172800, 86400)
    assert "gpus" not in fra["pilot"]


def test_discover_names_a_missing_partition() -> None:
    live = Live("gsi", tuple(parse_partitions(GSI_PARTITIONS)), tuple(parse_nodes(GSI_NODES)))
    with pytest.raises(LiveError, match=r"no partition 'gpu' \(partitions: main, debug\)"):
        discover(live, "gpu", Access(host="h", user="u"), "/i.sif", None, None, "u@h")
