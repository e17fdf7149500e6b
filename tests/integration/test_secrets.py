"""No secret in argv, logs, batch scripts or the journal, on any host, while the
service provisions for real: the pool tokens, the provisioner's SSH key and
frankfurt's JWT (sent to slurmrestd in a header) are only ever passed by file path;
each pilot's own token travels only in its batch script (on sbatch's stdin, or in
the body of slurmrestd's submit request) and lives only in its private work directory."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SITES, slurm
from servicectl import Service, pilot_ids, service_dir, write_config
from test_loop import clean_pool, jobs_left, submit, wait_for

SECRET_FILES = ("/etc/provisioner/tokens.d/provisioner", "/etc/condor/tokens.d/condor",
                "/etc/provisioner/ssh/id_ed25519", "/etc/provisioner/tokens.d/frankfurt.jwt")
#: A pilot's token in its batch script (slurm_templates/_pilot.sh.j2).
TOKEN_BLOCK = re.compile(r"exec 3<<'END_OF_PILOT_TOKEN'\n(\S+)\nEND_OF_PILOT_TOKEN\n")


def secrets() -> dict[str, list[str]]:
    """file -> the distinctive pieces of its content (a token's signature, a key's body)."""
    out = {}
    for path in SECRET_FILES:
        text = Path(path).read_text().strip()
        if "PRIVATE KEY" in text:
            pieces = [line for line in text.splitlines() if "PRIVATE KEY" not in line]
        else:
            pieces = [text, text.rsplit(".", 1)[-1]]  # the whole JWT and its signature
        out[path] = [p for p in pieces if len(p) >= 16]
    assert all(out.values()), out
    return out


def argv_snapshots(stop: threading.Event, seen: list[str]) -> None:
    """Every process's argv on every host (one PID namespace), twice a second."""
    while not stop.is_set():
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                seen.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
        stop.wait(0.5)


@pytest.fixture
def provisioned() -> Iterator[tuple[Service, list[str], list[str]]]:
    """A real run (2 jobs, pilots at both sites) with argv sampled throughout;
    yields the service, the argv seen and the batch scripts SLURM kept."""
    clean_pool()
    directory = service_dir()
    svc = Service(write_config(directory), directory / "service.log")
    seen: list[str] = []
    scripts: list[str] = []
    stop = threading.Event()
    sampler = threading.Thread(target=argv_snapshots, args=(stop, seen), daemon=True)
    sampler.start()
    try:
        cluster = submit("secrets", 6, 15)
        svc.start()
        wait_for("pilots at both sites", lambda: all(pilot_ids(s) for s in SITES), 90)
        for site in SITES:
            for job_id in pilot_ids(site):
                scripts.append(slurm(site, ["scontrol", "write", "batch_script", job_id, "-"],
                                     check=False).stdout)
        wait_for("jobs done", lambda: jobs_left(cluster) == 0, 240, step=2)
        yield svc, seen, scripts
    finally:
        stop.set()
        sampler.join(timeout=10)
        svc.stop()
        clean_pool()


def test_no_secret_in_argv_logs_batch_scripts_or_journal(
        provisioned: tuple[Service, list[str], list[str]]) -> None:
    svc, seen, scripts = provisioned
    assert len(seen) > 100 and any("condor_master" in a for a in seen)
    tokens = [t for s in scripts for t in TOKEN_BLOCK.findall(s)]
    assert len(tokens) >= 2 and len(set(tokens)) == len(tokens), "no pilot token per script"
    journal = sqlite3.connect(svc.config.parent / "journal.sqlite")
    rows = "\n".join(str(r) for table in ("cycles", "actions", "state")
                     for r in journal.execute(f"SELECT * FROM {table}"))
    places = {
        "process argv": "\n".join(seen),
        "service log": svc.text(),
        "batch scripts": "\n".join(scripts),
        "journal": rows,
        "pilot logs": "\n".join(p.read_text(errors="replace")
                                for p in Path("/var/log/pilots").rglob("*") if p.is_file()),
        "SLURM logs": "\n".join(p.read_text(errors="replace")
                                for p in Path("/var/log/slurm").glob("*.log")),
        "collector log": Path("/var/log/condor/CollectorLog").read_text(errors="replace"),
    }
    pilot_places = {k: v for k, v in places.items() if k != "batch scripts"}
    leaks = [f"a pilot's token found in the {where}" for where, text in pilot_places.items()
             if any(t in text or t.rsplit(".", 1)[-1] in text for t in tokens)]
    assert not leaks, "\n".join(leaks)
    # Only names in the failure message: pytest would print a failed `in`
    # comparison in full, the secret with it.
    leaks = [f"content of {path} found in the {where}"
             for path, pieces in secrets().items() for where, text in places.items()
             if any(piece in text for piece in pieces)]
    assert not leaks, "\n".join(leaks)
