"""A campaign's result directory -> results.csv, summary.csv, report.md and plots.

Everything is rendered from the files the clients sent back, so `provisioner
campaign report DIR` can render again at any time (e.g. where matplotlib is
installed). The layout, written by `runner`::

    DIR/campaign.yaml                     the campaign as it ran (scenario order)
    DIR/<scenario>/<clients>/client-<i>.csv   benchread.py --csv (url,second,blocks,bytes,start,end)
    DIR/<scenario>/<clients>/client-<i>.out, .err   the client's stdout and stderr
    DIR/<scenario>/<clients>/client-<i>.json, .bw.csv, .netdev.csv   fio clients instead:
                                          fio's report, fio's bytes per second, the
                                          node's network counters each second
    DIR/<scenario>/<clients>/step.json    status, error, failed clients, hit ratio

A step without step.json counts every client with a CSV as ok. A reader's warnings
in its stdout (a stalled read it read again) are listed in report.md. If the campaign has
a scenario with ``reference: local`` (a direct local read), report.md also divides
every other scenario's throughput by the reference's at the same client count.
matplotlib is imported only to draw; without it the tables are still written and
report.md says how to draw the plots.
"""

from __future__ import annotations

import csv
import json
import logging
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from provisioner.data.benchread import WARNING
from provisioner.data.campaign.aggregate import (
    GBIT,
    StepSummary,
    aggregate,
    fio_bandwidth,
    netdev_series,
    parse_client_csv,
    parse_client_span,
    step_span,
    summarize,
)
from provisioner.data.campaign.spec import Campaign, CampaignError, parse_campaign

log = logging.getLogger(__name__)

STEP_FILE = "step.json"
SPEC_COPY = "campaign.yaml"
#: A cache hit should deliver at least this fraction of the direct local read.
HIT_GOAL = 0.9
#: A step whose reads fit in this many whole seconds gets a note on its plot.
SHORT_STEP_S = 3


@dataclass
class Step:
    """What one scenario at one client count left in the result directory."""

    scenario: str
    clients: int
    series: list[dict[int, int]] = field(default_factory=list)
    spans: list[tuple[float, float] | None] = field(default_factory=list)
    ok: int = 0
    failed: int = 0
    error: str = ""
    hit_ratio: float | None = None
    fio_bytes_s: int | None = None
    #: fio campaigns: bytes received per second by each client's node (its NICs).
    net_series: list[dict[int, int]] = field(default_factory=list)
    #: "client <i>: <what>", from the readers' warning lines.
    warnings: list[str] = field(default_factory=list)


def _client_index(path: Path) -> int:
    return int(path.name.split(".")[0].removeprefix("client-"))


#: A reader client's CSV (not a fio client's .bw.csv or .netdev.csv).
READER_CSV = re.compile(r"client-\d+\.csv")


def _netdev(path: Path) -> dict[int, int]:
    with path.open() as f:
        return netdev_series((int(r["second"]), r["interface"], int(r["rx_bytes"]),
                              int(r["tx_bytes"])) for r in csv.DictReader(f))


def read_step(directory: Path, scenario: str, clients: int) -> Step:
    step = Step(scenario, clients)
    status: dict[str, object] = {}
    if (directory / STEP_FILE).is_file():
        status = json.loads((directory / STEP_FILE).read_text())
    failed = {int(i) for i in status.get("failed_clients", []) or []}  # type: ignore[attr-defined]
    for path in sorted(directory.glob("client-*.csv"), key=_client_index):
        if READER_CSV.fullmatch(path.name) and _client_index(path) not in failed:
            text = path.read_text()
            step.series.append(parse_client_csv(text))
            step.spans.append(parse_client_span(text))
    fio = sorted(directory.glob("client-*.json"), key=_client_index)
    if fio:
        step.fio_bytes_s = 0
        for path in fio:
            if _client_index(path) in failed:
                continue
            try:
                step.fio_bytes_s += fio_bandwidth(json.loads(path.read_text()))
            except (ValueError, AttributeError) as exc:
                log.warning("%s: not a fio JSON report: %s", path, exc)
            bw = path.with_name(f"client-{_client_index(path)}.bw.csv")
            if bw.is_file():
                step.series.append(parse_client_csv(bw.read_text()))
            netdev = path.with_name(f"client-{_client_index(path)}.netdev.csv")
            if netdev.is_file():
                step.net_series.append(_netdev(netdev))
        step.ok = len(fio) - len(failed & {_client_index(p) for p in fio})
    else:
        step.ok = len(step.series)
    step.failed = len(failed)
    step.error = str(status.get("error", "") or "")
    for path in sorted(directory.glob("client-*.out"), key=_client_index):
        step.warnings += [f"client {_client_index(path)}: {line.removeprefix(WARNING)}"
                          for line in path.read_text(errors="replace").splitlines()
                          if line.startswith(WARNING)]
    ratio = status.get("hit_ratio")
    step.hit_ratio = float(ratio) if isinstance(ratio, int | float) else None
    return step


def scenario_order(out: Path, campaign: Campaign | None) -> list[str]:
    """Scenario names in campaign order (from the copy of the campaign), else sorted."""
    found = sorted(p.name for p in out.iterdir() if p.is_dir() and any(
        c.is_dir() and c.name.isdigit() for c in p.iterdir()))
    order = campaign.scenario_names() if campaign else []
    return [s for s in order if s in found] + [s for s in found if s not in order]


def read_steps(out: Path, campaign: Campaign | None = None) -> list[Step]:
    steps: list[Step] = []
    for scenario in scenario_order(out, campaign):
        counts = sorted(int(p.name) for p in (out / scenario).iterdir()
                        if p.is_dir() and p.name.isdigit())
        steps.extend(read_step(out / scenario / str(n), scenario, n) for n in counts)
    return steps


def clients_text(n: int) -> str:
    return f"{n} client{'s' if n != 1 else ''}"


def campaign_copy(out: Path) -> Campaign | None:
    """The campaign as it ran, from its copy in `out`; None without a copy or if it no
    longer validates."""
    try:
        return parse_campaign((out / SPEC_COPY).read_text(), str(out / SPEC_COPY))
    except (OSError, CampaignError):
        return None


def roles(campaign: Campaign | None) -> tuple[str | None, set[str]]:
    """(the reference scenario, the warm scenarios) of `campaign`."""
    if campaign is None:
        return None, set()
    reference = campaign.reference()
    return (reference.name if reference else None,
            {s.name for s in campaign.scenarios if s.warm})


def completeness(out: Path, campaign: Campaign | None) -> list[str]:
    """Why the results in `out` are partial, one line each (none if the campaign ran every
    step): a step interrupted, a step with results but no record of its end (the run was
    killed), steps never run (after a failure or an interruption)."""
    if campaign is None:
        return []
    lines, not_run = [], []
    for scenario, counts in campaign.steps():
        for n in counts:
            directory = out / scenario / str(n)
            status = ""
            if (directory / STEP_FILE).is_file():
                try:
                    status = str(json.loads((directory / STEP_FILE).read_text())
                                 .get("status", ""))
                except (OSError, ValueError, AttributeError):
                    status = "unreadable"
            if status == "interrupted":
                lines.append(f"scenario {scenario}, {clients_text(n)}: interrupted; its rows are "
                             "what the clients sent before")
            elif not status and directory.is_dir():
                lines.append(f"scenario {scenario}, {clients_text(n)}: started, never recorded as "
                             "finished (the run was stopped)")
            elif not status:
                not_run.append(f"{scenario} with {clients_text(n)}")
    if not_run:
        lines.append(f"not run: {', '.join(not_run)}")
    return lines


@dataclass(frozen=True)
class Ratio:
    """One scenario's mean throughput over the reference's at the same client count."""

    scenario: str
    clients: int
    label: str
    gbit_s: float | None
    reference_gbit_s: float | None
    ratio: float | None
    #: The least ratio wanted (hits), None for misses.
    goal: float | None


def ratios(table: list[StepSummary], reference: str, warm: Collection[str]) -> list[Ratio]:
    """PURE: every other scenario's mean Gbit/s over the reference's at the same client
    count: "hit / direct local" for warm scenarios, "miss / direct local" for cold
    ones. A failed step (its own or the reference's) has no ratio."""
    base = {t.clients: t.mean_gbit_s for t in table if t.scenario == reference and t.ok}
    out = []
    for t in table:
        if t.scenario == reference:
            continue
        hit = t.scenario in warm
        value = t.mean_gbit_s if t.ok else None
        ref = base.get(t.clients)
        out.append(Ratio(t.scenario, t.clients,
                         "hit / direct local" if hit else "miss / direct local", value, ref,
                         value / ref if value is not None and ref else None,
                         HIT_GOAL if hit else None))
    return out


def net_gbit_s(step: Step) -> float | None:
    """A fio step's mean Gbit/s received by its nodes' NICs over the seconds sampled."""
    if step.fio_bytes_s is None:
        return None
    series = aggregate(step.net_series)
    return sum(b for _, b in series) / GBIT / len(series) if series else 0.0


def summaries(steps: list[Step]) -> list[StepSummary]:
    return [summarize(s.scenario, s.clients, aggregate(s.series), s.ok, s.failed, s.hit_ratio,
                      s.error, None if s.fio_bytes_s is None else s.fio_bytes_s / GBIT,
                      step_span(s.spans), net_gbit_s(s))
            for s in steps]


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def write_tables(out: Path, steps: list[Step], table: list[StepSummary]) -> None:
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "clients", "second", "t_s", "bytes", "gbit_s"])
        for s in steps:
            series = aggregate(s.series)
            for second, nbytes in series:
                w.writerow([s.scenario, s.clients, second, second - series[0][0], nbytes,
                            f"{nbytes / GBIT:.6f}"])
    with (out / "summary.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "clients", "seconds", "read_span_s", "total_bytes",
                    "mean_gbit_s", "p50_gbit_s", "max_gbit_s", "clients_ok", "clients_failed",
                    "hit_ratio", "fio_gbit_s", "nic_rx_gbit_s", "error"])
        for t in table:
            w.writerow([t.scenario, t.clients, t.seconds, _fmt(t.span_s), t.total_bytes,
                        f"{t.mean_gbit_s:.6f}", f"{t.p50_gbit_s:.6f}", f"{t.max_gbit_s:.6f}",
                        t.clients_ok, t.clients_failed, _fmt(t.hit_ratio),
                        _fmt(t.fio_gbit_s, 6), _fmt(t.net_gbit_s, 6), t.error])


def ratio_lines(reference: str, rows: list[Ratio]) -> list[str]:
    """The report's section on `ratios`."""
    lines = ["", "## Cache hit and miss vs the direct local read", "",
             f"Each scenario's mean Gbit/s (as above) divided by that of {reference} (the "
             "direct local read) at the same client count: hit / direct local for warm "
             "scenarios (every file read once before), miss / direct local for cold ones "
             f"(the miss path's overhead). Goal for hits: >= {HIT_GOAL}.", "",
             f"| scenario | clients | measure | mean Gbit/s | {reference} Gbit/s | ratio | "
             "goal |", "|" + "---|" * 7]
    for r in rows:
        goal = "-" if r.goal is None else f">= {r.goal}" + (
            "" if r.ratio is None else " met" if r.ratio >= r.goal else " missed")
        lines.append(f"| {r.scenario} | {r.clients} | {r.label} | {_fmt(r.gbit_s)} | "
                     f"{_fmt(r.reference_gbit_s)} | {_fmt(r.ratio)} | {goal} |")
    return lines


def markdown(name: str, table: list[StepSummary], plots: list[Path], plot_note: str,
             reference: str | None = None, warm: Collection[str] = (),
             partial: Collection[str] = (), warnings: Collection[str] = ()) -> str:
    fio = any(t.fio_gbit_s is not None for t in table)
    lines = [f"# Campaign {name}", ""]
    if partial:
        lines += ["**Partial report: the campaign did not run to its end.**", "",
                  *(f"- {p}" for p in partial), ""]
    lines += [
             "Aggregate throughput: the clients' bytes summed per wall-clock second over "
             "every second from the first client's first read to the last client's last "
             "(idle seconds count as 0); p50 and max are of those seconds. Mean = total "
             "bytes / the read span (first client's start to last client's end, to the "
             "ms) where the clients recorded it, else / those seconds.", ""]
    if fio:
        lines += ["fio steps: the bytes per second are fio's own bandwidth log (every fio "
                  "job of every node, averaged over each second); fio Gbit/s is fio's "
                  "report (each node's bytes over its runtime, summed over the nodes); NIC "
                  "rx Gbit/s is what the nodes' network interfaces (all but loopback) "
                  "received per sampled second: reads from network storage show there, "
                  "reads the node serves itself (local disk, page cache) do not.", ""]
    head = ["scenario", "nodes" if fio else "clients", "seconds", "read span s", "total MiB",
            "mean Gbit/s", "p50 Gbit/s", "max Gbit/s", "ok", "failed", "hit ratio"]
    head += ["fio Gbit/s", "NIC rx Gbit/s"] if fio else []
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in table:
        row = [t.scenario, str(t.clients), str(t.seconds), _fmt(t.span_s, 2),
               f"{t.total_bytes / 2**20:.1f}",
               _fmt(t.mean_gbit_s), _fmt(t.p50_gbit_s), _fmt(t.max_gbit_s),
               str(t.clients_ok), str(t.clients_failed), _fmt(t.hit_ratio, 2)]
        fio_cells = [_fmt(t.fio_gbit_s), _fmt(t.net_gbit_s)] if fio else []
        lines.append("| " + " | ".join(row + fio_cells) + " |")
    if reference is not None:
        lines += ratio_lines(reference, ratios(table, reference, warm))
    failures = [t for t in table if not t.ok]
    lines += ["", "## Failures", ""]
    lines += [f"- {t.error}" if t.error else f"- scenario {t.scenario}, {t.clients} "
              f"clients: {t.clients_failed} client(s) failed" for t in failures] or ["none"]
    if warnings:
        lines += ["", "## Warnings", "", *(f"- {w}" for w in warnings)]
    lines += ["", "## Plots", ""]
    lines += [f"![{p.stem}]({p.name})" for p in plots] or [plot_note]
    return "\n".join(lines) + "\n"


def plot(out: Path, steps: list[Step], table: list[StepSummary]) -> list[Path]:
    """Throughput over time per scenario (a line per client count), and throughput
    against the number of clients (a line per scenario). Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    written = []
    for scenario in dict.fromkeys(s.scenario for s in steps):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        longest = 0
        for s in (s for s in steps if s.scenario == scenario):
            series = aggregate(s.series)
            unit = "node" if s.fio_bytes_s is not None else "client"
            label = f"{s.clients} {unit}{'s' if s.clients > 1 else ''}"
            if s.fio_bytes_s is not None:
                label += " (fio)"
            line = None
            if series:
                longest = max(longest, len(series))
                line, = ax.plot([sec - series[0][0] for sec, _ in series],
                                [b / GBIT for _, b in series], marker="o", label=label)
            net = aggregate(s.net_series)
            if net:
                start = series[0][0] if series else net[0][0]
                ax.plot([sec - start for sec, _ in net], [b / GBIT for _, b in net],
                        linestyle="--", marker="x", label=f"{s.clients} {unit}"
                        f"{'s' if s.clients > 1 else ''} (NIC rx)",
                        color=line.get_color() if line else None)
        ax.set(title=f"{scenario}: aggregate throughput", xlabel="seconds since the step's "
               "first read", ylabel="Gbit/s")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if 0 < longest <= SHORT_STEP_S:
            ax.set_xlim(-0.5, max(longest, 2) - 0.5)
            ax.annotate(f"read within {longest} s: one point per whole second; the "
                        "table's mean uses the read span to the ms",
                        xy=(0.02, 0.02), xycoords="axes fraction", fontsize="small")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
        path = out / f"throughput-{scenario}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    fio = any(t.fio_gbit_s is not None for t in table)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for scenario in dict.fromkeys(t.scenario for t in table):
        rows = [t for t in table if t.scenario == scenario and t.ok]
        ys = [(t.fio_gbit_s or 0.0) if fio else t.mean_gbit_s for t in rows]
        line, = ax.plot([t.clients for t in rows], ys, marker="o", label=scenario)
        if fio:
            ax.plot([t.clients for t in rows], [t.net_gbit_s or 0.0 for t in rows],
                    linestyle="--", marker="x", color=line.get_color(),
                    label=f"{scenario} (nodes' NIC rx)")
        else:
            ax.plot([t.clients for t in rows], [t.max_gbit_s for t in rows], linestyle="--",
                    marker="x", color=line.get_color(), label=f"{scenario} (max second)")
    ax.set_xticks(sorted({t.clients for t in table}))
    ax.set(title="throughput vs " + ("nodes (fio's own total; dashed: the nodes' network)"
                                     if fio else
                                     "clients (mean over the step; dashed: best second)"),
           xlabel="nodes" if fio else "clients", ylabel="Gbit/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")  # beside
    path = out / "scaling.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written


def render(out: Path, name: str | None = None) -> list[Path]:
    """Write every table, plot and report.md in `out`; returns the files written."""
    campaign = campaign_copy(out)
    steps = read_steps(out, campaign)
    table = summaries(steps)
    write_tables(out, steps, table)
    try:
        plots = plot(out, steps, table)
        note = ""
    except ImportError:
        plots = []
        note = ("Plots not drawn: matplotlib is not installed here. Install it (the "
                "`bench` extra) and run `provisioner campaign report DIR`.")
        log.warning("no plots: matplotlib is not installed")
    if name is None:
        name = campaign.name if campaign else out.name
    reference, warm = roles(campaign)
    warnings = [f"scenario {s.scenario}, {clients_text(s.clients)}: {w}"
                for s in steps for w in s.warnings]
    (out / "report.md").write_text(markdown(name, table, plots, note, reference, warm,
                                            completeness(out, campaign), warnings))
    return [out / "results.csv", out / "summary.csv", out / "report.md", *plots]
