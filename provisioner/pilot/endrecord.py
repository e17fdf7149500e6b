"""A pilot's end record: one JSON line a pilot leaves when it exits, from which the
provisioner accounts the pilot's SLURM life (sites without slurmdbd have no `sacct`).

The pilot wrapper writes ``<runtime.log_dir>/end/<site>-<slurm job id>.json`` on every
way out (temporary file, then rename: a reader sees a whole record or none); the site
backend reads it from the login node once the job left `squeue`. At a site read
through slurmrestd it also puts the record into its job's comment, where the backend
reads it through the API. Site and job id are
both in the name, as two sites may share one log directory and number their jobs alike.

Contents (no secrets): format version ``v``, ``job_id``, ``site``, ``provisioner_id``,
``start`` (when the wrapper started, epoch s), ``end`` (when it exited, epoch s),
``cores`` and ``reason`` (one of `REASONS`; a reader accepts any well-formed word, so
that a newer pilot may add one).

This module is imported by the pilot on the worker node: the standard library only.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("provisioner.pilot")

#: Subdirectory of the site's pilot log directory that holds the end records.
END_DIR = "end"
VERSION = 1
#: A reader reads at most this much of a record (a real one is ~200 bytes).
MAX_BYTES = 4096

#: Why a pilot ended, as its wrapper saw it.
REASONS = {
    "walltime-drain": "the walltime end came near (SLURM's warning signal, or the startd "
                      "stopped itself after the stop time): drained gracefully",
    "released": "the provisioner released it while idle: drained, then left",
    "retired": "the provisioner asked it to leave when its jobs were done: it left as "
               "soon as it was idle",
    "noclaim-shutdown": "condor_master ended by itself before the stop time (the startd's "
                        "STARTD_NOCLAIM_SHUTDOWN backstop)",
    "terminated": "TERM or INT long before the walltime end (scancel, the site)",
    "released-before-start": "released during its start-up delay",
    "terminated-before-start": "terminated during its start-up delay",
    "master-failed": "the container or condor_master ended with an error",
    "prepare-failed": "its work directory or configuration could not be prepared",
    "bad-environment": "a setting from the batch script is missing or invalid",
    "wrapper-error": "the wrapper itself failed (an unexpected error)",
}

_REASON = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
_JOB_ID = re.compile(r"^[0-9]{1,20}$")
_SITE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


class BadEndRecord(ValueError):
    """A record that cannot be used; the message says why."""


@dataclass(frozen=True)
class EndRecord:
    job_id: str
    site: str
    provisioner_id: str
    start_at: float
    end_at: float
    cores: int
    reason: str

    def to_json(self) -> str:
        return json.dumps({
            "v": VERSION, "job_id": self.job_id, "site": self.site,
            "provisioner_id": self.provisioner_id, "start": self.start_at, "end": self.end_at,
            "cores": self.cores, "reason": self.reason}, sort_keys=True) + "\n"


def file_name(site: str, job_id: str) -> str:
    """The record's file name; ValueError if site or job id could escape the directory."""
    if not _SITE.match(site) or not _JOB_ID.match(job_id):
        raise ValueError(f"no end record name for site {site!r}, job {job_id!r}")
    return f"{site}-{job_id}.json"


def write(directory: Path, record: EndRecord) -> Path:
    """Write `record` into `directory` (created if missing) atomically; returns its path.
    Raises OSError (the caller decides whether that matters)."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / file_name(record.site, record.job_id)
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(record.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return final


def _leading_int(raw: str | None) -> int:
    """SLURM's count variables are "4" or, per node, "4(x2),8": the first count."""
    match = re.match(r"^\s*([0-9]+)", raw or "")
    return int(match.group(1)) if match else 0


def cores_from_env(env: dict[str, str]) -> int:
    """The pilot's cores as SLURM's environment states them (0: unknown), in the order
    the wrapper reads them."""
    for key in ("SLURM_CPUS_ON_NODE", "SLURM_CPUS_PER_TASK", "SLURM_JOB_CPUS_PER_NODE"):
        cores = _leading_int(env.get(key))
        if cores > 0:
            return cores
    return 0


def write_comment(record: EndRecord, timeout_s: float = 30) -> bool:
    """Put `record` into its own job's comment (``scontrol update``, as the job's owner,
    with the node's SLURM): where the service reads the site through slurmrestd and no
    file of the pilot's reaches it. Never raises; True if SLURM took it."""
    text = json.dumps(json.loads(record.to_json()), sort_keys=True, separators=(",", ":"))
    argv = ["scontrol", "update", f"JobId={record.job_id}", f"Comment={text}"]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("end record not put in the job's comment: %s", exc)
        return False
    if result.returncode != 0:
        log.warning("end record not put in the job's comment: %s",
                    (result.stderr or result.stdout).strip()[-300:])
        return False
    return True


def write_from_env(env: dict[str, str], start: float, end: float, reason: str
                   ) -> Path | None:
    """The pilot's last act: its end record into ``$PILOT_LOG_DIR/end/`` from its batch
    script's and SLURM's environment, and into its job's comment too where the batch
    script asks for it (``PILOT_END_COMMENT=1``: a site read through slurmrestd). Never
    raises (a pilot without a log directory, or one that cannot write there, leaves no
    file: its end is then the cycle that saw it leave `squeue`); returns the record's
    path, or None."""
    log_dir = env.get("PILOT_LOG_DIR", "")
    to_comment = env.get("PILOT_END_COMMENT") == "1"
    if not log_dir and not to_comment:
        log.info("no log directory: no end record")
        return None
    try:
        record = EndRecord(
            job_id=env.get("SLURM_JOB_ID", ""), site=env.get("PILOT_SITE", ""),
            provisioner_id=env.get("PILOT_PROVISIONER_ID", ""), start_at=start,
            end_at=max(start, end), cores=cores_from_env(env), reason=reason)
        if to_comment and write_comment(record):
            log.info("end record in the job's comment: %s", reason)
        if not log_dir:
            return None
        path = write(Path(log_dir) / END_DIR, record)
    except Exception as exc:  # the pilot is ending: report, never mask its exit
        log.warning("no end record written in %s: %s", log_dir, exc)
        return None
    log.info("end record %s: %s", path, reason)
    return path


def _number(doc: dict[str, Any], key: str) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value):
        raise BadEndRecord(f"{key!r} is not a number: {value!r}")
    return float(value)


def parse(text: str, site: str, job_id: str, provisioner_id: str) -> EndRecord:
    """The record in `text`, which must be that of job `job_id` at `site` of provisioner
    `provisioner_id`; BadEndRecord (saying what is wrong) otherwise."""
    if len(text) > MAX_BYTES:
        raise BadEndRecord(f"longer than {MAX_BYTES} bytes")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadEndRecord(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadEndRecord(f"not a JSON object: {type(doc).__name__}")
    version = doc.get("v")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BadEndRecord(f"no format version 'v': {version!r}")
    for key, want in (("job_id", job_id), ("site", site), ("provisioner_id", provisioner_id)):
        if doc.get(key) != want:
            raise BadEndRecord(f"{key} {doc.get(key)!r} is not {want!r}")
    start, end = _number(doc, "start"), _number(doc, "end")
    if not 0 < start <= end:
        raise BadEndRecord(f"start {start} and end {end} are not 0 < start <= end")
    cores = doc.get("cores")
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 0:
        raise BadEndRecord(f"'cores' is not a count: {cores!r}")
    reason = doc.get("reason")
    if not isinstance(reason, str) or not _REASON.match(reason):
        raise BadEndRecord(f"'reason' is not a word: {reason!r}")
    return EndRecord(job_id, site, provisioner_id, start, end, cores, reason)
