"""Onboarding a slurm-rest site: slurmrestd's partition and node records (as SLURM
24.11's v0.0.42 sends them, captured in the testbed) read as scontrol's, and the check
rows of its token, server and version. HTTP from a fake server (httpx MockTransport)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from provisioner.config import parse_config
from provisioner.onboard.discover import Access, LiveError, site_block
from provisioner.onboard.restcheck import rest_checks
from provisioner.onboard.restinfo import node, partition, read_live_rest
from provisioner.sites.rest_client import RestClient
from provisioner.sites.rest_token import TokenFile

from .test_slurm_rest import NOW, FakeServer, reply, token_file

UNSET = {"set": False, "infinite": False, "number": 0}
INFINITE = {"set": False, "infinite": True, "number": 0}


def num(n: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": n}


#: frankfurt's general1, as /slurm/v0.0.42/partitions gives it (fields not read left out).
GENERAL1 = {
    "nodes": {"allowed_allocation": "", "configured": "fra-n[1-2]", "total": 2},
    "accounts": {"allowed": "", "deny": ""}, "qos": {"allowed": "", "deny": "", "assigned": ""},
    "defaults": {"memory_per_cpu": -9223372036854774808,
                 "partition_memory_per_cpu": num(1000),
                 "partition_memory_per_node": UNSET, "time": num(60), "job": ""},
    "maximums": {"cpus_per_node": INFINITE, "cpus_per_socket": INFINITE, "memory_per_cpu": 0,
                 "partition_memory_per_cpu": UNSET, "partition_memory_per_node": num(0),
                 "nodes": INFINITE, "shares": 0, "oversubscribe": {"jobs": 0, "flags": []},
                 "time": num(2880), "over_time_limit": UNSET},
    "name": "general1", "partition": {"state": ["UP"]},
}
FRA_N1 = {"name": "fra-n1", "cpus": 4, "real_memory": 8000, "gres": "", "state": ["IDLE"],
          "partitions": ["general1"], "cluster_name": ""}


def test_a_partition_record_reads_as_scontrols() -> None:
    part = partition(GENERAL1, default=True)
    assert (part.name, part.default, part.state, part.nodes) == (
        "general1", True, "UP", "fra-n[1-2]")
    assert part.max_time_s == 172800 and part.max_nodes is None
    assert part.max_cpus_per_node is None and part.max_mem_per_node_mb is None
    assert part.def_mem_per_cpu_mb == 1000
    assert part.whole_node and part.oversubscribe == "EXCLUSIVE"
    assert part.allow_accounts == ("ALL",) and part.allows_account("hpc-physics")


@pytest.mark.parametrize(("over", "word"), [
    ({"jobs": 1, "flags": []}, "NO"), ({"jobs": 4, "flags": []}, "YES:4"),
    ({"jobs": 4, "flags": ["force"]}, "FORCE:4"), ({"jobs": 0, "flags": []}, "EXCLUSIVE")])
def test_oversubscribe_in_scontrols_words(over: dict[str, Any], word: str) -> None:
    doc = {**GENERAL1, "maximums": {**GENERAL1["maximums"], "oversubscribe": over}}
    assert partition(doc).oversubscribe == word


def test_a_node_record_reads_as_scontrols() -> None:
    gpu = node({**FRA_N1, "name": "g1", "gres": "gpu:a100:2(S:0-1)"})
    assert (gpu.name, gpu.cpus, gpu.real_memory_mb, gpu.gpus.count, gpu.gpus.types) == (
        "g1", 4, 8000, 2, ("a100",))
    assert node(FRA_N1).partitions == ("general1",) and node(FRA_N1).state == "IDLE"


def client(tmp_path: Path, server: FakeServer, exp: float = NOW + 3600) -> RestClient:
    token = TokenFile(site="fra", path=str(token_file(tmp_path, exp=exp)),
                      what="sites[1].rest.token_file", clock=lambda: NOW)
    return RestClient(site="fra", url="http://rest:6820", user="pilot", token=token,
                      where="sites[1].rest.url", transport=httpx.MockTransport(server))


def routes(parts: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> FakeServer:
    return FakeServer({"GET partitions": lambda r: reply({"partitions": parts}),
                       "GET nodes": lambda r: reply({"nodes": nodes})})


def test_discover_prints_a_slurm_rest_block(tmp_path: Path) -> None:
    live = read_live_rest(client(tmp_path, routes([GENERAL1], [FRA_N1])), "here")
    (part,) = live.partitions
    assert part.default  # the only partition
    access = Access(host=None, user="pilot", rest_url="http://rest:6820",
                    token_file="/etc/provisioner/tokens.d/fra.jwt")
    block = site_block("fra", part, live.nodes, access, "/opt/images/pilot.sif", "hpc")
    assert block["backend"] == "slurm-rest" and "executor" not in block
    assert block["rest"] == {"url": "http://rest:6820", "user": "pilot",
                             "token_file": "/etc/provisioner/tokens.d/fra.jwt"}
    assert (block["partition"], block["account"], block["max_walltime_s"]) == (
        "general1", "hpc", 172800)
    assert block["pilot"]["min_cpus"] == 4 and block["template"] == "frankfurt.sh.j2"


def test_a_record_missing_a_field_is_named(tmp_path: Path) -> None:
    broken = {k: v for k, v in FRA_N1.items() if k != "real_memory"}
    with pytest.raises(LiveError, match=r"here: a record of slurmrestd lacks the field "
                                        r"'real_memory'"):
        read_live_rest(client(tmp_path, routes([GENERAL1], [broken])), "here")


SITE = parse_config("""
sites:
  - name: fra
    backend: slurm-rest
    rest: {url: "http://rest:6820", user: pilot, token_file: /t.jwt}
    max_walltime_s: 7200
    template: frankfurt.sh.j2
    image: /opt/images/pilot.sif
    pilot: {cpus: 4, memory_mb: 7800, walltime_s: 3600, shutdown_margin_s: 300}
""").sites[0]


def rows_of(tmp_path: Path, server: FakeServer, exp: float = NOW + 3600) -> dict[str, Any]:
    rows = rest_checks(1, SITE, client(tmp_path, server, exp))  # type: ignore[arg-type]
    return {r.name: r for r in rows}


def test_a_good_site_passes_every_rest_row(tmp_path: Path) -> None:
    rows = rows_of(tmp_path, routes([GENERAL1], [FRA_N1]))
    assert [r.ok for r in rows.values()] == [True, True, True]
    assert "API v0.0.42" in rows["slurmrestd answers"].found


def test_check_names_an_expired_token(tmp_path: Path) -> None:
    rows = rows_of(tmp_path, routes([GENERAL1], [FRA_N1]), exp=NOW - 1)
    row = rows["JWT token file"]
    assert row.ok is False and "expired" in row.found
    assert "scontrol token username=pilot" in row.fix and "sites[1].rest.token_file" in row.fix


@pytest.mark.parametrize("status", [401, 511])
def test_check_names_a_refused_token(tmp_path: Path, status: int) -> None:
    server = FakeServer({"GET partitions": lambda r: httpx.Response(status, text="no")})
    row = rows_of(tmp_path, server)["token accepted"]
    assert row.ok is False and f"HTTP {status}" in row.found
    assert "sites[1].rest.token_file" in row.fix


def test_check_names_a_url_that_is_not_slurmrestd(tmp_path: Path) -> None:
    server = FakeServer(openapi=lambda r: httpx.Response(404, text="404 page not found"))
    row = rows_of(tmp_path, server)["slurmrestd answers"]
    assert row.ok is False and "is this slurmrestd?" in row.found
    assert "sites[1].rest.url" in row.fix


def test_check_names_an_api_version_neither_speaks(tmp_path: Path) -> None:
    server = FakeServer(openapi=lambda r: httpx.Response(
        200, json={"paths": {"/slurm/v0.0.44/jobs/": {}}}))
    row = rows_of(tmp_path, server)["slurmrestd answers"]
    assert row.ok is False and "slurmrestd offers v0.0.44" in row.found
    assert "api_version" in row.fix
