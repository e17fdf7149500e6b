"""Would a site's pilot match a job? HTCondor's own ClassAd matching against a prototype.

Per site, `prototype_ad()` builds the machine ad a fresh pilot's partitionable slot would
advertise: the site's largest pilot (Cpus, Memory and, with GPUs, the GPU attributes of
`use feature : GPUs`), the platform and image
attributes the admin declares (`sites[].pilot_ad`), the attributes the pilot wrapper sets
(PilotSite, PilotProvisionerId, PilotSlurmJobId, PilotWalltimeEnd, PilotXCache, the
FileSystemDomain of its own), file transfer, and the START expression of
condor_config/pilot.conf as its Requirements. A job shape's ad holds its requests, the
job attributes its Requirements reads, and the Requirements. `SiteMatcher.annotate()`
tells, per demand row, the sites whose prototype matches symmetrically (both
Requirements), with the failing clause when none does. Results are cached by (shape,
site) across cycles: one evaluation per shape and site.

Choices:
- Resources: the prototype has the largest pilot's cores and memory and an unbounded
  disk. The packing (`provisioner.decide.matching`) decides whether a shape fits a pilot by its
  requests with better reasons; here only what no pilot size can change decides.
- Time: START compares ``time()`` with the pilot's walltime end; the prototype is a
  pilot that starts at time 0 and ends at its walltime (`PilotStartTime`), so a result
  never depends on the clock and the cache stays valid.
- Values only a real node knows (its Machine or Name, its SLURM job id, its HTCondor
  version, its file-transfer plugins): a clause that fails only on such attributes does
  not make a job unmatchable (we cannot tell), unless the site declares them in
  `pilot_ad.extra_attributes`.
- A shape without a Requirements string is not evaluated (matched on resources alone).

The ClassAd library evaluates in memory: no I/O, but it is the bindings' code, so it runs
in the service's observe phase and `plan()` only sees its result (`Demand.sites`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from provisioner.config import Config, PoolConfig, SiteBase
from provisioner.model import Demand, JobShape

log = logging.getLogger(__name__)

#: condor_config/pilot.conf's START with ``time()`` as the pilot's start (the prototype's
#: clock) and ``$(PILOT_STOP_AT)`` as `PilotStopAt` (a unit test keeps them equal), less
#: its GPU clause: a CPU-only job's pilot asks for no GPUs, so the clause never bites it.
PILOT_START = ("(PilotStartTime < PilotStopAt) && "
               "(TARGET.MaxRuntime =?= undefined || "
               "PilotStartTime + TARGET.MaxRuntime < PilotStopAt)")

#: Attributes (lower case) whose value only a real pilot knows: a clause failing on them
#: alone is no reason to call a job unmatchable (unless the site declares them).
NODE_ATTRIBUTES = frozenset({"machine", "name", "pilotslurmjobid", "myaddress",
                             "startdipaddr", "utsnamenodename", "publicclaimid",
                             "condorversion", "condorplatform",
                             "hasfiletransferpluginmethods", "hasjobtransferplugins",
                             "detectedgpus", "availablegpus", "assignedgpus"})

#: Unbounded disk (KB): a pilot's disk is its node's scratch, not planned for.
PROTOTYPE_DISK_KB = 2**40

#: Shape/site results kept across cycles (least recently used dropped beyond this).
CACHE_SIZE = 20_000


def _classad() -> Any:
    import classad2

    return classad2


def prototype_ad(site: SiteBase, pool: PoolConfig) -> Any:
    """The machine ad of a fresh, unclaimed pilot of `site` (a classad2.ClassAd)."""
    ca = _classad()
    p = site.pilot
    name = f"pilot-{site.name}-prototype@{site.name}"
    attrs: dict[str, Any] = {
        "MyType": "Machine", "TargetType": "Job",
        "Name": f"slot1@{name}", "Machine": f"{site.name}-node",
        "Arch": site.pilot_ad.arch, "OpSys": site.pilot_ad.opsys,
        "Cpus": p.cpus, "TotalSlotCpus": p.cpus, "TotalCpus": p.cpus,
        "Memory": p.memory_mb, "TotalSlotMemory": p.memory_mb, "TotalMemory": p.memory_mb,
        "Disk": PROTOTYPE_DISK_KB, "TotalSlotDisk": PROTOTYPE_DISK_KB,
        "PartitionableSlot": True, "SlotType": "Partitionable",
        "State": "Unclaimed", "Activity": "Idle",
        "HasFileTransfer": True, "FileSystemDomain": name, "UidDomain": pool.uid_domain,
        "PilotSite": site.name, "PilotProvisionerId": pool.provisioner_id,
        "PilotSlurmJobId": "0",
        "PilotStartTime": 0, "PilotWalltimeEnd": p.walltime_s,
    }
    if p.gpus > 0:
        # as the startd advertises them with `use feature : GPUs` (condor_config/pilot.conf);
        # a pilot without GPUs has no GPU attributes at all. Device properties
        # (GPUs_Capability, GPUs_DeviceName, ...) only a node knows: declare them in
        # `pilot_ad.extra_attributes`.
        attrs.update({"GPUs": p.gpus, "TotalSlotGPUs": p.gpus, "TotalGPUs": p.gpus,
                      "DetectedGPUs": ", ".join(f"GPU-{i:08x}" for i in range(p.gpus))})
    if site.pilot_ad.opsys_and_ver:
        attrs["OpSysAndVer"] = site.pilot_ad.opsys_and_ver
    if site.xcache:
        attrs["PilotXCache"] = site.xcache
    if site.runtime.containers:
        # What a pilot whose start-up test passed advertises (pilot/containers.py);
        # registry images are refused on the submit side, never matched here.
        attrs.update({"HasContainer": True, "HasSingularity": True, "HasSIF": True,
                      "HasSandboxImage": True, "HasDockerURL": False})
    attrs.update(site.pilot_ad.extra_attributes)
    ad = ca.ClassAd(attrs)
    ad["PilotStopAt"] = ca.ExprTree(f"PilotWalltimeEnd - {int(p.shutdown_margin_s)}")
    ad["Start"] = ca.ExprTree(PILOT_START)
    ad["Requirements"] = ca.ExprTree(PILOT_START)
    return ad


def job_ad(shape: JobShape) -> Any:
    """The ad of one job of `shape`: its requests, the attributes its Requirements reads,
    and the Requirements."""
    ca = _classad()
    ad = ca.ClassAd({"MyType": "Job", "TargetType": "Machine",
                     "RequestCpus": shape.cpus, "RequestMemory": shape.memory_mb,
                     "RequestDisk": shape.disk_kb, "RequestGPUs": shape.gpus})
    if shape.runtime_s is not None:
        ad["MaxRuntime"] = shape.runtime_s
    for attr, literal in shape.match_attrs:
        ad[attr] = ca.ExprTree(literal)
    ad["Requirements"] = ca.ExprTree(shape.requirements)
    return ad


def conjuncts(text: str) -> list[str]:
    """The top-level ``&&`` clauses of a ClassAd expression, outer parentheses removed
    and nested conjunctions flattened (a text that cannot be split is one clause)."""
    text = _unwrap(text.strip())
    parts, depth, start, i, quote = [], 0, 0, 0, False
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == '"':
                quote = False
        elif c == '"':
            quote = True
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith("&&", i):
            parts.append(text[start:i])
            start = i + 2
            i += 1
        i += 1
    parts.append(text[start:])
    if len(parts) == 1:
        return [text]
    out: list[str] = []
    for part in parts:
        out.extend(conjuncts(part))
    return out


def _unwrap(text: str) -> str:
    """`text` without parentheses that enclose all of it."""
    while text.startswith("(") and text.endswith(")"):
        depth, quote = 0, False
        for i, c in enumerate(text):
            if quote:
                quote = c != '"' or text[i - 1] == "\\"
            elif c == '"':
                quote = True
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0 and i < len(text) - 1:
                    return text  # "(a) && (b)": the first group closes early
        text = text[1:-1].strip()
    return text


def _failing_clause(mine: Any, theirs: Any, unknowable: frozenset[str] = frozenset()
                    ) -> tuple[str, bool, list[str]]:
    """The first clause of `mine`'s Requirements that is not true against `theirs`;
    whether it fails only on what a real node alone knows; the attributes it reads that
    neither ad has. Whether it fails only on `unknowable` attributes (lower case).
    ("", False, []) if no single clause fails."""
    ca = _classad()
    whole = mine.lookup("Requirements")
    text = str(whole)
    try:
        for clause in conjuncts(text):
            try:
                mine["Requirements"] = ca.ExprTree(clause)
            except Exception:  # a clause the splitter cut wrongly: judge the whole
                return text, False, []
            if theirs.matches(mine):
                continue
            refs = sorted(mine.externalRefs(mine.lookup("Requirements")))
            attrs = [r.split(".", 1)[-1] for r in refs]
            missing = [r for r, a in zip(refs, attrs, strict=True)
                       if theirs.get(a) is None and mine.get(a) is None]
            node_only = bool(attrs) and {a.lower() for a in attrs} <= unknowable
            return clause.strip(), node_only, missing
    finally:
        mine["Requirements"] = whole
    return "", False, []


def site_verdict(shape: JobShape, machine: Any, declared: frozenset[str] = frozenset()
                 ) -> str:
    """"" if a pilot advertising `machine` would match jobs of `shape`, else the clause
    (of the job's Requirements, or of the pilot's START) that fails. `declared`: the
    attributes (lower case) the site declares, known even if in `NODE_ATTRIBUTES`."""
    job = job_ad(shape)
    if job.symmetricMatch(machine):
        return ""
    clause, node_only, missing = _failing_clause(job, machine, NODE_ATTRIBUTES - declared)
    if clause:
        if node_only:
            return ""  # fails only on what a real node knows: cannot tell, so it may match
        return clause + (f" (undefined: {', '.join(missing)})" if missing else "")
    start, _node_only, _missing = _failing_clause(machine, job)
    return f"pilot START: {start or PILOT_START}"


class SiteMatcher:
    """The prototype of every site's pilot and the cached verdicts per (shape, site)."""

    def __init__(self, config: Config) -> None:
        self.enabled = config.policy.match_requirements
        self.sites: Sequence[SiteBase] = config.sites
        self.ads = {s.name: prototype_ad(s, config.pool) for s in config.sites} \
            if self.enabled else {}
        self.declared = {s.name: frozenset(a.lower() for a in s.pilot_ad.extra_attributes)
                         for s in config.sites}
        self.cache: OrderedDict[tuple[JobShape, str], str] = OrderedDict()
        self.evaluations = 0  # verdicts computed (not from the cache), for tests and logs

    def verdict(self, shape: JobShape, site: str) -> str:
        """`site_verdict` of `shape` at `site`, cached."""
        key = (shape, site)
        hit = self.cache.get(key)
        if hit is not None:
            self.cache.move_to_end(key)
            return hit
        try:
            why = site_verdict(shape, self.ads[site], self.declared[site])
        except Exception as exc:  # a Requirements the library cannot parse: no verdict
            log.warning("cannot evaluate Requirements %r: %s", shape.requirements, exc)
            why = ""
        self.evaluations += 1
        self.cache[key] = why
        if len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)
        return why

    def annotate(self, demand: Iterable[Demand]) -> tuple[Demand, ...]:
        """`demand` with the matching sites (and, if none, why) on each row whose shape
        states Requirements; rows without stay as they are."""
        out = []
        for d in demand:
            if not self.enabled or not d.shape.requirements:
                out.append(d)
                continue
            before = self.evaluations
            verdicts = {s.name: self.verdict(d.shape, s.name) for s in self.sites}
            sites = frozenset(name for name, why in verdicts.items() if not why)
            mismatch = "" if sites else mismatch_reason(verdicts)
            if mismatch and self.evaluations > before:  # newly evaluated: said once
                log.warning("%d idle job(s) of %d cores, %d MB cause no pilot: %s", d.idle,
                            d.shape.cpus, d.shape.memory_mb, mismatch)
            out.append(replace(d, sites=sites, mismatch=mismatch))
        return tuple(out)


def mismatch_reason(verdicts: dict[str, str]) -> str:
    """One line for a shape no site's pilot matches: the failing clause, per site if the
    sites differ."""
    clauses = list(dict.fromkeys(verdicts.values()))
    head = "Requirements not met by any site's pilot ad: "
    if len(clauses) == 1:
        return head + clauses[0]
    return head + "; ".join(f"{site}: {why}" for site, why in verdicts.items())
