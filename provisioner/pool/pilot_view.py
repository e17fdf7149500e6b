"""From what the pool and the sites report to `Pilot` records (pure translation).

A pilot's state comes from its SLURM job (pending, running, ending), its startd ad in the
collector (absent, idle, busy, draining) and the startds the schedd runs jobs on (a pilot
running a job is busy even if its ad is missing, e.g. after a collector restart).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from provisioner.model import Pilot, PilotState
from provisioner.pool.classads import PilotAd
from provisioner.sites.base import SiteJob, SiteJobState

#: SLURM sends a job's warning signal (--signal) up to this much before the time asked.
SLURM_SIGNAL_SLOP_S = 60


def runs_jobs(site: str, job_id: str, running_on: frozenset[str]) -> bool:
    """The schedd runs a job on this pilot's startd (named pilot-<site>-<job>@host)."""
    prefix = f"pilot-{site}-{job_id}@"
    return any(name.startswith(prefix) for name in running_on)


def ad_busy(ad: PilotAd, running_on: frozenset[str]) -> bool:
    """Claimed resources per the collector, or a running job per the schedd."""
    return (ad.claimed_slots > 0 or ad.free_cpus < ad.cpus
            or ad.free_memory_mb < ad.memory_mb or ad.free_gpus < ad.gpus
            or ad.name in running_on)


def idle_ad_keys(ads: Mapping[str, PilotAd]) -> frozenset[str]:
    """Pilots whose startd ad shows nothing claimed (what the quick check compares). An
    idle pilot that advertises container support is told apart ("<key> containers"):
    one whose start-up test ended beside its master (provisioner.pilot.nested) then
    looks newly idle, and container jobs waiting are negotiated for at once."""
    return frozenset(f"{k} containers" if a.containers else k for k, a in ads.items()
                     if a.claimed_slots == 0 and a.free_cpus == a.cpus)


def pilot_state(job: SiteJob, ad: PilotAd | None,
                running_on: frozenset[str] = frozenset(), site: str = "",
                past_stop: bool = False) -> PilotState:
    """The pilot's state from its SLURM job, its startd ad (None: no ad) and the
    startds the schedd runs jobs on (busy even if its ad is missing, e.g. after
    a collector restart).

    `past_stop`: the pilot is within its shutdown margin (and SLURM's signal slop) of
    its walltime end, where a pilot with no ad has ended its startd for good rather
    than not started it yet: ENDING, however long its batch job lingers."""
    if job.state is SiteJobState.PENDING:
        return PilotState.PENDING
    if job.state is SiteJobState.ENDING:
        return PilotState.ENDING
    if ad is None:
        if runs_jobs(site, job.job_id, running_on):
            return PilotState.BUSY
        if past_stop:
            return PilotState.ENDING
        return PilotState.STARTING
    if ad.draining:
        return PilotState.DRAINING
    if ad_busy(ad, running_on):
        return PilotState.BUSY
    return PilotState.IDLE


def account_of(job: SiteJob | None, ad: PilotAd | None,
               accounts: Mapping[str, str]) -> str:
    """The SLURM account a pilot is charged to: SLURM's word (squeue's or /jobs'
    account) first; where SLURM says none, the account of the allocation its ad names
    (`accounts`: the site's allocation names -> their accounts); "" if neither says."""
    if job is not None and job.account:
        return job.account
    if ad is not None and ad.allocation:
        return accounts.get(ad.allocation, "")
    return ""


def merge_pilots(site: str, jobs: list[SiteJob], ads: Mapping[str, PilotAd],
                 running_on: frozenset[str] = frozenset(), now: float | None = None,
                 margin_s: float = 0.0, accounts: Mapping[str, str] | None = None
                 ) -> list[Pilot]:
    """One Pilot per live SLURM job of the site, with what its startd advertises.
    With `now`, a running pilot with no ad within `margin_s` of its walltime end is
    ENDING (its startd has stopped for good), not STARTING (capacity to come).
    `accounts`: the site's allocation names -> their SLURM accounts (`account_of`)."""
    accounts = accounts or {}
    out = []
    for job in jobs:
        ad = ads.get(f"{site}/{job.job_id}")
        past_stop = (now is not None and job.ends_at is not None
                     and now >= job.ends_at - margin_s)
        state = pilot_state(job, ad, running_on, site, past_stop)
        up = state in (PilotState.IDLE, PilotState.BUSY, PilotState.DRAINING)
        busy_draining = state is PilotState.DRAINING and ad is not None and ad_busy(
            ad, running_on)
        out.append(Pilot(
            site=site,
            job_id=job.job_id,
            state=state,
            cpus=ad.cpus if ad else job.cpus,
            memory_mb=ad.memory_mb if ad else job.memory_mb,
            submitted_at=job.submitted_at,
            started_at=job.started_at,
            walltime_end=(ad.walltime_end if ad and ad.walltime_end else job.ends_at),
            # a draining pilot that runs anything shows no free cores (never "empty")
            free_cpus=(0 if busy_draining
                       else ad.free_cpus if up and ad else job.cpus),
            free_memory_mb=ad.free_memory_mb if up and ad else job.memory_mb,
            name=ad.name if ad else None,
            # GPUs: what the startd advertises once it is up, what SLURM gave before
            gpus=ad.gpus if ad else job.gpus,
            free_gpus=(0 if busy_draining else ad.free_gpus if up and ad else job.gpus),
            joined_at=ad.started_at if ad else None,
            limit_reason=job.limit_reason if state is PilotState.PENDING else "",
            account=account_of(job, ad, accounts),
        ))
    return out


def ad_only_pilots(site: str, ads: Mapping[str, PilotAd], now: float,
                   running_on: frozenset[str] = frozenset(),
                   accounts: Mapping[str, str] | None = None) -> list[Pilot]:
    """Pilots of a site whose squeue failed: what the collector shows, counted as is
    (charged to the account of the allocation the ad names, `account_of`)."""
    accounts = accounts or {}
    out = []
    for ad in ads.values():
        if ad.site != site:
            continue
        busy = ad_busy(ad, running_on)
        out.append(Pilot(site=site, job_id=ad.job_id,
                         state=PilotState.BUSY if busy else PilotState.IDLE,
                         cpus=ad.cpus, memory_mb=ad.memory_mb, submitted_at=now,
                         walltime_end=ad.walltime_end, free_cpus=ad.free_cpus,
                         free_memory_mb=ad.free_memory_mb, name=ad.name,
                         gpus=ad.gpus, free_gpus=ad.free_gpus,
                         account=account_of(None, ad, accounts)))
    return out


@dataclass
class Disagreements:
    """Where SLURM and the collector disagree, each reported once: a startd ad whose SLURM
    job is gone (a ghost: never counted as capacity), and a pilot that was running jobs
    and is gone from SLURM, also when it was ending in between (its startd gone before
    its batch job): at its walltime, or lost while the schedd still runs jobs there. A
    busy pilot that left once its jobs had ended (retired) is no disagreement."""

    ghosts: set[str] = field(default_factory=set)  # already reported
    busy_ends: dict[str, float | None] = field(default_factory=dict)  # busy -> walltime end

    def report(self, pilots: Iterable[Pilot], ads: Mapping[str, PilotAd],
               jobs: Mapping[str, list[SiteJob]], now: float,
               margin: Callable[[str], float],
               running_on: frozenset[str] = frozenset()) -> list[str]:
        """This cycle's new disagreements, one line each. `pilots`: the cycle's pilots;
        `jobs`: the live SLURM jobs of the sites read (others are not judged);
        `margin(site)`: how long before its walltime end a pilot of the site may stop;
        `running_on`: the startds the schedd runs jobs on now."""
        out = []
        live = {f"{site}/{j.job_id}" for site, site_jobs in jobs.items() for j in site_jobs}
        ghosts = {key for key, ad in ads.items() if ad.site in jobs and key not in live}
        for key in sorted(ghosts - self.ghosts):
            out.append(f"pilot {key}: startd ad in the collector but no SLURM job (killed or "
                       "node lost); not counted, the collector drops the ad")
        self.ghosts = ghosts
        for key, end in sorted(self.busy_ends.items()):
            site, job_id = key.split("/", 1)
            if site not in jobs or key in live:
                continue
            if end is not None and now >= end - margin(site):
                out.append(f"pilot {key} reached its walltime with jobs running (jobs that "
                           "state no +MaxRuntime can be cut off); HTCondor runs them again")
            elif runs_jobs(site, job_id, running_on):
                out.append(f"pilot {key} left SLURM while running jobs (node lost or pilot "
                           "killed); HTCondor runs them again after their job lease")
            # else its jobs had ended when it left (retired, or drained by the site)
        # busy, or ending since it was last seen busy (its startd gone, its batch
        # job not yet): its running jobs end with it
        self.busy_ends = {p.key: p.walltime_end for p in pilots if p.site in jobs and (
            p.state is PilotState.BUSY
            or (p.state is PilotState.ENDING and p.key in self.busy_ends))}
        return out
