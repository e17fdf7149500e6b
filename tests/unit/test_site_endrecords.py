"""Reading the pilots' end records through the SLURM backend: with this host's own
`head` and `find` (the local executor), and with a scripted executor for the answers
a login node can give. Bad records are skipped with one warning naming the file."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from provisioner.config import parse_config
from provisioner.errors import Rejected, Unreachable
from provisioner.pilot import endrecord
from provisioner.pilot.endrecord import EndRecord
from provisioner.sites import make_backend
from provisioner.sites.base import MAX_END_RECORDS
from provisioner.sites.executor import CommandResult, LocalExecutor
from provisioner.sites.slurm_cli import (
    RECORD_KEEP_S,
    RECORD_PRUNE_EVERY_S,
    SlurmCliBackend,
    split_head_output,
)


def rec(job_id: str, end: float = 1100.0, site: str = "gsi") -> EndRecord:
    return EndRecord(job_id, site, "prov1", 1000.0, end, 4, "released")


def backend(log_dir: Path | None, executor: object | None = None) -> SlurmCliBackend:
    return SlurmCliBackend(name="gsi", provisioner_id="prov1",
                           executor=executor or LocalExecutor(),  # type: ignore[arg-type]
                           log_dir=str(log_dir) if log_dir else None)


def test_records_read_with_head_bad_ones_skipped_with_one_warning_each(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    end = tmp_path / "end"
    endrecord.write(end, rec("7"))
    endrecord.write(end, rec("8", end=1200.0))
    endrecord.write(end, rec("7", site="fra"))  # another site's job 7: another file
    (end / "gsi-9.json").write_text('{"v": 1, "job_id": "9"')  # cut short
    (end / "gsi-10.json").write_text(rec("11").to_json())  # another job's record
    (end / "gsi-12.json").write_text("")
    b = backend(tmp_path)
    caplog.set_level(logging.WARNING)
    for _ in range(2):
        got = b.end_records(["7", "8", "9", "10", "12", "13"])
        assert got == {"7": rec("7"), "8": rec("8", end=1200.0)}
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3, warned  # once per bad file, not once per read
    assert any(f"{end}/gsi-9.json" in w and "not JSON" in w for w in warned)
    assert any(f"{end}/gsi-10.json" in w and "job_id '11' is not '10'" in w for w in warned)
    assert any(f"{end}/gsi-12.json" in w for w in warned)
    assert all("gsi-13" not in w for w in warned)  # a missing record is no warning


def test_the_read_is_one_argv_command_and_bounded(tmp_path: Path) -> None:
    executor = LocalExecutor()
    b = backend(tmp_path, executor)
    ids = [str(i) for i in range(MAX_END_RECORDS + 10)]
    assert b.end_records(["../../etc/passwd", *ids]) == {}  # skipped, with a warning
    head = executor.calls[0]
    assert head[:5] == ["head", "-v", "-c", str(endrecord.MAX_BYTES), "--"]
    assert head[5:] == [f"{tmp_path}/end/gsi-{i}.json" for i in ids[:MAX_END_RECORDS]]


def test_records_older_than_a_week_are_pruned_once_a_day(tmp_path: Path) -> None:
    end = tmp_path / "end"
    old = endrecord.write(end, rec("1"))
    endrecord.write(end, rec("2"))
    stale_tmp = end / ".gsi-3.json.99.tmp"
    stale_tmp.write_text("{")
    other = end / "notes.txt"
    other.write_text("an admin's")
    week_ago = time.time() - RECORD_KEEP_S - 3600
    for f in (old, stale_tmp, other):
        os.utime(f, (week_ago, week_ago))
    executor = LocalExecutor()
    b = backend(tmp_path, executor)
    assert b.end_records(["1", "2"]) == {"1": rec("1"), "2": rec("2")}  # read, then pruned
    assert sorted(os.listdir(end)) == ["gsi-2.json", "notes.txt"]
    assert [c[0] for c in executor.calls] == ["head", "find"]
    b.end_records(["2"])
    assert [c[0] for c in executor.calls] == ["head", "find", "head"]  # not again today
    b.clock = lambda: time.time() + RECORD_PRUNE_EVERY_S
    b.end_records(["2"])
    assert [c[0] for c in executor.calls][-1] == "find"


def test_a_site_without_log_dir_has_no_records() -> None:
    executor = LocalExecutor()
    assert backend(None, executor).end_records(["7"]) == {} and executor.calls == []


def test_the_backend_reads_the_configured_log_dir() -> None:
    cfg = parse_config("""
pool: {collector: "cm:9618", provisioner_id: prov1, uid_domain: example}
sites:
  - name: gsi
    max_walltime_s: 7200
    template: gsi.sh.j2
    image: /images/pilot.sif
    pilot: {cpus: 4, memory_mb: 8000, walltime_s: 3600}
    runtime: {log_dir: /var/log/pilots/}
""", "t.yaml")
    b = make_backend(cfg.sites[0], cfg.pool)
    assert isinstance(b, SlurmCliBackend) and b.end_dir == "/var/log/pilots/end"


@dataclass
class Scripted:
    """An executor that answers each command with the next result (or error)."""

    answers: list[CommandResult | Exception]
    calls: list[list[str]] = field(default_factory=list)

    def run(self, argv: Sequence[str], env: Mapping[str, str], stdin: str | None = None
            ) -> CommandResult:
        self.calls.append(list(argv))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        return None


def test_a_site_that_cannot_be_reached_raises_and_a_failed_prune_does_not(
        caplog: pytest.LogCaptureFixture) -> None:
    b = backend(Path("/logs"), Scripted([Unreachable("ssh: cannot connect")]))
    with pytest.raises(Unreachable):
        b.end_records(["7"])
    b = backend(Path("/logs"), Scripted([CommandResult(2, "", "head: invalid option")]))
    with pytest.raises(Rejected, match="reading end records at gsi failed"):
        b.end_records(["7"])
    ok = CommandResult(0, f"==> /logs/end/gsi-7.json <==\n{rec('7').to_json()}", "")
    b = backend(Path("/logs"), Scripted([ok, Unreachable("gone")]))
    caplog.set_level(logging.WARNING)
    assert b.end_records(["7"]) == {"7": rec("7")}
    assert "end records at gsi not pruned: gone" in caplog.text


def test_unreadable_record_files_are_logged() -> None:
    stderr = ("head: cannot open '/logs/end/gsi-8.json' for reading: No such file or "
              "directory\nhead: cannot open '/logs/end/gsi-9.json' for reading: "
              "Permission denied\n")
    ok = CommandResult(1, f"==> /logs/end/gsi-7.json <==\n{rec('7').to_json()}", stderr)
    b = backend(Path("/logs"), Scripted([ok, CommandResult(0, "", "")]))
    with pytest.MonkeyPatch.context() as mp:
        lines: list[str] = []
        mp.setattr("provisioner.sites.slurm_cli.log.warning",
                   lambda fmt, *a: lines.append(fmt % a))
        assert b.end_records(["7", "8", "9"]) == {"7": rec("7")}
    assert len(lines) == 1 and "gsi-9.json" in lines[0] and "Permission denied" in lines[0]


def test_split_head_output_keeps_each_file_apart() -> None:
    out = ("==> /a/gsi-1.json <==\n{\"x\": 1}\n\n==> /a/gsi-2.json <==\n{\"y\": 2}"
           "\n==> /a/gsi-3.json <==\n")
    assert split_head_output(out, ["/a/gsi-1.json", "/a/gsi-2.json", "/a/gsi-3.json"]) == {
        "/a/gsi-1.json": "{\"x\": 1}\n\n", "/a/gsi-2.json": "{\"y\": 2}\n",
        "/a/gsi-3.json": ""}
    # a header of a file nobody asked for is content (of a broken record), not a file
    assert split_head_output("==> /a/gsi-1.json <==\n==> /etc/x <==\n", ["/a/gsi-1.json"]) \
        == {"/a/gsi-1.json": "==> /etc/x <==\n"}
