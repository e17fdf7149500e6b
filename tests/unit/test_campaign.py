"""Benchmark campaigns: the campaign file, the pure aggregation, the job-event fold,
the report from synthetic client CSVs, and the runner's bookkeeping against a
hand-written pool that records what it was asked."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.data.campaign.aggregate import (
    GBIT,
    StepSummary,
    aggregate,
    fio_bandwidth,
    netdev_series,
    parse_client_csv,
    parse_client_span,
    percentile,
    step_span,
    summarize,
)
from provisioner.data.campaign.fioclient import bw_series, read_netdev
from provisioner.data.campaign.report import (
    HIT_GOAL,
    campaign_copy,
    completeness,
    markdown,
    ratios,
    render,
    roles,
)
from provisioner.data.campaign.runner import (
    CondorPool,
    Event,
    Runner,
    csv_bytes,
    fold_events,
    submit_file,
)
from provisioner.data.campaign.spec import (
    CampaignError,
    classad_literal,
    load_campaign,
    parse_campaign,
    substitute,
)

REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"

GOOD = """\
name: t
files: {prefix: f-, count: 2, size: 16M}
clients: [1, 2]
reader: {block_size: 1M}
step_timeout_s: 100
scenarios:
  - name: xcache
    site: frankfurt
    url: "root://fra-cache:1094//root://gsi-storage:1094//data/{file}"
    setup: [[cache-mode, xcache]]
  - name: no-cache
    site: frankfurt
    url: "root://gsi-storage:1094//data/{file}"
    extra_submit: {Note: 'a "quoted" value'}
"""


# -- the campaign file -------------------------------------------------------------------

def test_a_good_campaign_parses() -> None:
    c = parse_campaign(GOOD)
    assert [s.name for s in c.scenarios] == ["xcache", "no-cache"]
    assert c.files is not None and c.files.names() == ["f-0", "f-1"]
    assert c.scenarios[0].url_of("f-1") == "root://fra-cache:1094//root://gsi-storage:1094//data/f-1"


@pytest.mark.parametrize("old, new, field", [
    ("count: 2", "count: 0", "files.count"),
    ("size: 16M", "size: 16Q", "files.size"),
    ("clients: [1, 2]", "clients: [1, 1]", "clients"),
    ("block_size: 1M", "block_size: lots", "reader.block_size"),
    ("step_timeout_s: 100", "step_timeout_s: -1", "step_timeout_s"),
    ("site: frankfurt\n    url: \"root://fra", "site: Frankfurt\n    url: \"root://fra",
     "scenarios[0].site"),
    ("data/{file}\"\n    setup", "data/x\"\n    setup", "scenarios[0].url"),
    ("[[cache-mode, xcache]]", "[[]]", "scenarios[0].setup"),
    ("{Note: ", "{Requirements: ", "scenarios[1].extra_submit"),
    ("name: xcache", "name: xcache\n    colour: red", "scenarios[0].colour"),
    ("name: no-cache", "name: xcache", "(top level)"),
    ("block_size: 1M}", "block_size: 1M, environment: {X: 'a b'}}", "reader.environment"),
    ("block_size: 1M}", "block_size: 1M, timeout_s: 0}", "reader.timeout_s"),
])
def test_a_bad_field_is_named_with_its_line(old: str, new: str, field: str) -> None:
    assert old in GOOD
    with pytest.raises(CampaignError) as err:
        parse_campaign(GOOD.replace(old, new, 1), "c.yaml")
    lines = str(err.value).splitlines()
    assert any(line.startswith("c.yaml:") and f" {field}: " in line for line in lines), lines


def test_a_read_campaign_needs_files_clients_and_scenarios() -> None:
    with pytest.raises(CampaignError, match="needs files, clients, scenarios"):
        parse_campaign("name: x\n")


def test_fio_campaign_needs_an_existing_jobfile(tmp_path: Path) -> None:
    f = tmp_path / "fio.yaml"
    f.write_text("name: f\nkind: fio\nfio: {jobfile: nope.fio, nodes: [1, 2], site: gsi}\n")
    with pytest.raises(CampaignError, match=r"fio\.jobfile: no such file"):
        load_campaign(f)
    f.write_text("name: f\nkind: fio\nfio: {jobfile: deploy/testbed/campaigns/seq-read.fio, "
                 "nodes: [1, 2], site: frankfurt}\n")
    c = load_campaign(f)
    assert c.fio is not None and c.fio.scenario == "seq-read"


LOCAL = """\
  - name: direct-local
    site: frankfurt
    reference: local
    url: "file:///srv/xcache/data/{file}"
"""


def test_only_the_local_reference_may_read_a_file_url() -> None:
    c = parse_campaign(GOOD + LOCAL)
    reference = c.reference()
    assert reference is not None and reference.name == "direct-local"
    assert reference.url_of("f-1") == "file:///srv/xcache/data/f-1"
    assert parse_campaign(GOOD).reference() is None
    for text, field, message in [
            (LOCAL.replace("    reference: local\n", ""), "scenarios[2].url",
             "must be a root:// URL (a file:// URL only in the scenario with reference: "
             "local) (got 'file:///srv/xcache/data/{file}')"),
            (LOCAL.replace("file:///", "http://host/"), "scenarios[2].url", "root:// URL"),
            (LOCAL.replace("file:///", "file://host/"), "scenarios[2].url", "absolute path"),
            (LOCAL.replace("reference: local", "reference: remote"), "scenarios[2].reference",
             "'local'"),
            (LOCAL + LOCAL.replace("direct-local", "second"), "(top level)",
             "only one scenario can be the reference: direct-local, second")]:
        with pytest.raises(CampaignError) as err:
            parse_campaign(GOOD + text, "c.yaml")
        assert any(f" {field}: " in line and message in line
                   for line in str(err.value).splitlines()), str(err.value)


def test_the_shipped_campaigns_are_valid() -> None:
    files = sorted((REPO / "deploy/testbed/campaigns").glob("*.yaml"))
    assert files
    for f in files:
        load_campaign(f)


def test_the_cache_hit_campaign_reads_its_reference_after_the_dca_cache_filled() -> None:
    c = load_campaign(REPO / "deploy/testbed/campaigns/cache-hit-ratio.yaml")
    names = [s.name for s in c.scenarios]
    reference = c.reference()
    assert reference is not None and reference.url.startswith("file:///srv/xcache/")
    before = c.scenarios[names.index(reference.name) - 1]
    assert before.warm and before.setup[-1][-2:] == ["xcache-dca", "--keep"]
    # Only the cold scenario flushes; warm ones keep what the cache holds.
    assert [s.name for s in c.scenarios if "--keep" not in s.setup[-1]] == ["xcache"]
    assert reference.setup[-1][-2:] == ["xcache-dca", "--keep"] and not reference.warm
    assert {s.name for s in c.scenarios if s.warm} == {
        "xcache-warm", "xcache-dca-warm", "dcotf-warm"}


def test_placeholders_replace_whole_arguments_only() -> None:
    values = {"prefix": "f-", "count": "4"}
    assert substitute(["mk", "{prefix}", "--n={count}", "{count}", "{other}"], values) == [
        "mk", "f-", "--n={count}", "4", "{other}"]


def test_classad_literals() -> None:
    assert classad_literal(False) == "false"
    assert classad_literal(3) == "3"
    assert classad_literal('a "b" \\c') == '"a \\"b\\" \\\\c"'


# -- aggregation ---------------------------------------------------------------------

clients_strategy = st.lists(
    st.dictionaries(st.integers(1_700_000_000, 1_700_000_060), st.integers(0, 10**10),
                    max_size=30), max_size=8)


@given(clients_strategy)
def test_aggregate_is_the_sum_of_the_clients_bytes(clients: list[dict[int, int]]) -> None:
    series = aggregate(clients)
    assert sum(b for _, b in series) == sum(sum(c.values()) for c in clients)


@given(clients_strategy)
def test_aggregate_seconds_are_sorted_consecutive_and_idle_seconds_zero(
        clients: list[dict[int, int]]) -> None:
    series = aggregate(clients)
    seconds = [s for s, _ in series]
    assert seconds == list(range(seconds[0], seconds[-1] + 1)) if seconds else series == []
    read = {s for c in clients for s in c}
    if read:
        assert (seconds[0], seconds[-1]) == (min(read), max(read))
    for second, nbytes in series:
        if second not in read:
            assert nbytes == 0
        else:
            assert nbytes == sum(c.get(second, 0) for c in clients)


@given(clients_strategy)
def test_summary_bounds(clients: list[dict[int, int]]) -> None:
    s = summarize("x", len(clients), aggregate(clients), len(clients), 0)
    assert s.total_bytes == sum(sum(c.values()) for c in clients)
    assert 0 <= s.p50_gbit_s <= s.max_gbit_s
    assert s.mean_gbit_s <= s.max_gbit_s + 1e-9


def test_summary_of_a_known_series() -> None:
    series = aggregate([{10: int(GBIT), 12: int(GBIT)}, {10: int(GBIT)}])
    assert series == [(10, 2 * int(GBIT)), (11, 0), (12, int(GBIT))]
    s = summarize("x", 2, series, 2, 0)
    assert (s.seconds, s.mean_gbit_s, s.p50_gbit_s, s.max_gbit_s) == (3, 1.0, 1.0, 2.0)
    assert percentile([], 0.5) == 0.0


def test_a_client_csv_with_several_urls_sums_by_second() -> None:
    text = "url,second,blocks,bytes\nr://a,5,1,100\nr://a,6,2,200\nr://b,6,1,50\n"
    assert parse_client_csv(text) == {5: 100, 6: 250}


def test_the_mean_is_over_the_recorded_read_span_not_whole_seconds() -> None:
    # 1 GB read in 1.1 s across two wall-clock seconds: whole seconds halve the rate.
    text = ("url,second,blocks,bytes,start,end\n"
            "r://a,100,1,400000000,100.600,101.700\nr://a,101,1,600000000,100.600,101.700\n")
    assert parse_client_span(text) == (100.6, 101.7)
    series = aggregate([parse_client_csv(text)])
    binned = summarize("x", 1, series, 1, 0)
    assert binned.mean_gbit_s == 4.0 and binned.span_s is None
    exact = summarize("x", 1, series, 1, 0, span_s=step_span([parse_client_span(text)]))
    assert abs(exact.mean_gbit_s - 8 / 1.1) < 1e-6 and exact.seconds == 2
    assert exact.max_gbit_s == 4.8  # per-second figures stay per second
    # Clients overlap: the span runs from the first start to the last end.
    assert step_span([(10.0, 12.0), (11.0, 13.5)]) == 3.5
    # An older reader (no start/end) or any client without one: whole seconds.
    assert parse_client_span("url,second,blocks,bytes\nr://a,5,1,100\n") is None
    assert step_span([(10.0, 12.0), None]) is None and step_span([]) is None


def test_network_counters_become_bytes_per_second() -> None:
    rows = [(1, "eth0", 1000, 0), (1, "lo", 5, 5), (2, "eth0", 1500, 0), (3, "eth0", 1500, 0),
            (2, "lo", 999, 999)]
    assert netdev_series(rows) == {2: 500, 3: 0}
    text = ("Inter-|   Receive |  Transmit\n face |bytes packets\n"
            "    lo: 10 1 0 0 0 0 0 0 20 1 0 0 0 0 0 0\n"
            "  eth0: 300 3 0 0 0 0 0 0 400 4 0 0 0 0 0 0\n")
    assert read_netdev(text) == [("lo", 10, 20), ("eth0", 300, 400)]


def test_fio_bandwidth_sums_jobs() -> None:
    report = {"jobs": [{"read": {"bw_bytes": 100}, "write": {"bw_bytes": 0}},
                       {"read": {"bw_bytes": 50}}]}
    assert fio_bandwidth(report) == 150


# -- job events ------------------------------------------------------------------------

def test_fold_events() -> None:
    events: list[Event] = [
        (0, "SUBMIT", {}), (1, "SUBMIT", {}), (2, "SUBMIT", {}), (3, "SUBMIT", {}),
        (0, "EXECUTE", {}), (0, "JOB_TERMINATED", {"TerminatedNormally": True, "ReturnValue": 0}),
        (1, "EXECUTE", {}), (1, "JOB_TERMINATED", {"TerminatedNormally": True, "ReturnValue": 1}),
        (2, "JOB_HELD", {"HoldReason": "no"}), (2, "JOB_RELEASED", {}), (2, "EXECUTE", {}),
        (3, "JOB_TERMINATED", {"TerminatedNormally": False, "TerminatedBySignal": 9})]
    s = fold_events(events)
    assert (s[0].status, s[0].exit_code) == ("done", 0)
    assert (s[1].status, s[1].exit_code) == ("done", 1)
    assert s[2].status == "running"
    assert (s[3].exit_code, s[3].reason) == (-9, "killed by signal 9")


# -- report ------------------------------------------------------------------------------

def write_client(directory: Path, index: int, start: int, seconds: int, rate: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / f"client-{index}.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["url", "second", "blocks", "bytes"])
        for s in range(seconds):
            w.writerow([f"root://x//f-{index}", start + s, 1, rate])


def synthetic(out: Path) -> None:
    (out / "campaign.yaml").write_text(GOOD)
    base = 1_700_000_000
    for k, scenario in enumerate(["xcache", "no-cache"]):
        for n in (1, 2):
            for i in range(n):
                write_client(out / scenario / str(n), i, base + 100 * n + i, 10 + 3 * i,
                             (2 - k) * 60_000_000 + i * 10_000_000)
    step = out / "no-cache" / "2"
    (step / "step.json").write_text(json.dumps({"error": "scenario no-cache, 2 clients, "
                                                "client 1: bench read: boom",
                                                "failed_clients": [1], "hit_ratio": None}))
    (out / "xcache" / "2" / "step.json").write_text(json.dumps({"hit_ratio": 0.75}))


def test_report_renders_tables_and_plots_from_client_csvs(tmp_path: Path) -> None:
    synthetic(tmp_path)
    written = render(tmp_path)
    names = {p.name for p in written}
    assert {"results.csv", "summary.csv", "report.md", "throughput-xcache.png",
            "throughput-no-cache.png", "scaling.png"} <= names
    for p in written:
        if p.suffix == ".png":
            data = p.read_bytes()
            assert data[:8] == PNG and len(data) > 1000, p
    results = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert sum(int(r["bytes"]) for r in results if r["scenario"] == "xcache"
               and r["clients"] == "2") == 10 * 120_000_000 + 13 * 130_000_000
    summary = {(r["scenario"], r["clients"]): r
               for r in csv.DictReader((tmp_path / "summary.csv").open())}
    assert list(summary) == [("xcache", "1"), ("xcache", "2"), ("no-cache", "1"),
                             ("no-cache", "2")]
    assert summary[("xcache", "2")]["hit_ratio"] == "0.750"
    assert (summary[("no-cache", "2")]["clients_ok"],
            summary[("no-cache", "2")]["clients_failed"]) == ("1", "1")
    md = (tmp_path / "report.md").read_text()
    assert "| xcache | 2 |" in md and "| no-cache | 1 |" in md
    assert "client 1: bench read: boom" in md
    assert "![scaling](scaling.png)" in md
    assert "## Warnings" not in md


def test_report_lists_the_stalls_a_reader_recovered_from(tmp_path: Path) -> None:
    synthetic(tmp_path)
    (tmp_path / "xcache" / "2" / "client-1.out").write_text(
        "bench read: warning: root://x//f-1: read at offset 0 failed: [ERROR] Operation "
        "expired (no answer within --timeout 120 s); opened the file again and read the "
        "block again\nroot://x//f-1: 1 bytes in 1 blocks\n")
    (tmp_path / "xcache" / "2" / "client-0.out").write_text("root://x//f-0: 1 bytes\n")
    render(tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert md.endswith(
        "## Warnings\n\n- scenario xcache, 2 clients: client 1: root://x//f-1: read at "
        "offset 0 failed: [ERROR] Operation expired (no answer within --timeout 120 s); "
        "opened the file again and read the block again\n\n## Plots\n\n"
        "![throughput-xcache](throughput-xcache.png)\n"
        "![throughput-no-cache](throughput-no-cache.png)\n![scaling](scaling.png)\n")


def step_summary(scenario: str, clients: int, gbit_s: float, failed: int = 0) -> StepSummary:
    return summarize(scenario, clients, [(1, int(gbit_s * GBIT))], clients - failed, failed)


def test_ratios_divide_by_the_local_reference_at_the_same_client_count() -> None:
    table = [step_summary("cold", 1, 0.5), step_summary("cold", 2, 0.5),
             step_summary("warm", 1, 1.8), step_summary("warm", 2, 3.0),
             step_summary("warm", 4, 4.0), step_summary("broken", 1, 1.0, failed=1),
             step_summary("local", 1, 2.0), step_summary("local", 2, 4.0)]
    rows = {(r.scenario, r.clients): r for r in ratios(table, "local", {"warm"})}
    assert list(rows) == [("cold", 1), ("cold", 2), ("warm", 1), ("warm", 2), ("warm", 4),
                          ("broken", 1)]
    assert (rows["warm", 1].label, rows["warm", 1].ratio, rows["warm", 1].goal) == (
        "hit / direct local", 0.9, HIT_GOAL)
    assert (rows["warm", 2].reference_gbit_s, rows["warm", 2].ratio) == (4.0, 0.75)
    assert (rows["cold", 2].label, rows["cold", 2].ratio, rows["cold", 2].goal) == (
        "miss / direct local", 0.125, None)
    assert rows["warm", 4].ratio is None  # the reference did not run with 4 clients
    assert rows["broken", 1].gbit_s is None and rows["broken", 1].ratio is None
    md = markdown("c", table, [], "", "local", {"warm"})
    assert "## Cache hit and miss vs the direct local read" in md
    assert "| warm | 1 | hit / direct local | 1.800 | 2.000 | 0.900 | >= 0.9 met |" in md
    assert "| warm | 2 | hit / direct local | 3.000 | 4.000 | 0.750 | >= 0.9 missed |" in md
    assert "| warm | 4 | hit / direct local | 4.000 | - | - | >= 0.9 |" in md
    assert "| cold | 2 | miss / direct local | 0.500 | 4.000 | 0.125 | - |" in md
    assert "| local |" not in md.split("## Cache hit")[1]
    assert "direct local" not in markdown("c", table, [], "")


def test_report_takes_the_reference_and_warm_scenarios_from_the_campaign_copy(
        tmp_path: Path) -> None:
    synthetic(tmp_path)
    assert roles(campaign_copy(tmp_path)) == (None, set())
    (tmp_path / "campaign.yaml").write_text(
        GOOD.replace("setup: [[cache-mode, xcache]]", "setup: [[cache-mode, xcache]]\n"
                     "    warm: true").replace("name: no-cache", "name: no-cache\n"
                                             "    reference: local"))
    assert roles(campaign_copy(tmp_path)) == ("no-cache", {"xcache"})
    render(tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| xcache | 1 | hit / direct local |" in md
    assert "| xcache | 2 | hit / direct local | " in md  # no-cache failed with 2 clients
    (tmp_path / "campaign.yaml").write_text("name: [not, valid]\n")
    assert roles(campaign_copy(tmp_path)) == (None, set())


# -- the runner against a recording pool ---------------------------------------------------

class RecordingPool:
    """Answers submits by writing what a client would send back; `fail` maps
    (step, client) -> stderr of a client that exits 1; `stuck` steps never finish."""

    def __init__(self, fail: dict[tuple[str, int], str] | None = None,
                 stuck: set[str] | None = None) -> None:
        self.fail, self.stuck = fail or {}, stuck or set()
        self.submitted: list[tuple[dict[str, str], list[dict[str, str]]]] = []
        self.removed: list[int] = []
        self.logs: dict[Path, list[Event]] = {}

    def submit(self, description: dict[str, str], items: list[dict[str, str]]) -> int:
        self.submitted.append((description, items))
        directory = Path(description["initialdir"])
        step = description["+CampaignStep"].strip('"')
        events: list[Event] = []
        for i, _item in enumerate(items):
            events.append((i, "SUBMIT", {}))
            if step in self.stuck:
                continue
            write_client(directory, i, 1_700_000_000 + i, 3, 1000)
            code = 0
            if (step, i) in self.fail:
                (directory / f"client-{i}.err").write_text(self.fail[step, i] + "\n")
                code = 1
            events += [(i, "EXECUTE", {}), (i, "JOB_TERMINATED",
                                           {"TerminatedNormally": True, "ReturnValue": code})]
        self.logs[directory / "jobs.log"] = events
        return 100 + len(self.submitted)

    def remove(self, cluster: int, reason: str) -> None:
        self.removed.append(cluster)

    def events(self, log: Path) -> list[Event]:
        return self.logs.get(log, [])


def make_runner(tmp_path: Path, pool: RecordingPool, text: str = GOOD
                ) -> tuple[Runner, list[str], list[list[str]]]:
    spec = tmp_path / "c.yaml"
    spec.write_text(text)
    lines: list[str] = []
    commands: list[list[str]] = []
    now = [0.0]

    def command(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        commands.append(argv)
        return subprocess.CompletedProcess(argv, 0, "0.5\n", "")

    def sleep(s: float) -> None:
        now[0] += s

    runner = Runner(load_campaign(spec), spec, tmp_path / "out", pool=pool, echo=lines.append,
                    clock=lambda: now[0], sleep=sleep, command=command)
    return runner, lines, commands


def test_runner_submits_each_step_and_renders(tmp_path: Path) -> None:
    pool = RecordingPool()
    runner, _, commands = make_runner(tmp_path, pool)
    assert runner.run() == 0
    assert commands == [["cache-mode", "xcache"]] * 2
    assert len(pool.submitted) == 4 and not pool.removed
    desc, items = pool.submitted[1]
    assert desc["requirements"] == 'PilotSite == "frankfurt"'
    assert (desc["+DesiredSites"], desc["+WantXCache"]) == ('"frankfurt"', "false")
    assert desc["executable"].endswith("provisioner/data/benchread.py")
    assert desc["transfer_output_remaps"] == '"reads.csv = client-$(client).csv"'
    assert items == [{"client": "0", "url": "root://fra-cache:1094//root://gsi-storage:1094"
                      "//data/f-0"}, {"client": "1", "url": "root://fra-cache:1094//root://"
                                      "gsi-storage:1094//data/f-1"}]
    assert desc["environment"] == '"XRD_CONNECTIONWINDOW=10 XRD_CONNECTIONRETRY=2"'
    assert desc["arguments"] == ("$(url) --csv reads.csv --block-size 1M --stride 0 "
                                 "--samples 4 --timeout 120")
    assert pool.submitted[3][0]["+Note"] == '"a \\"quoted\\" value"'
    out = tmp_path / "out"
    assert (out / "report.md").exists() and (out / "scaling.png").exists()
    assert json.loads((out / "xcache" / "2" / "step.json").read_text())["status"] == "ok"
    assert "Partial report" not in (out / "report.md").read_text()


def test_the_warm_up_reads_without_checks_but_with_the_reader_s_timeout(
        tmp_path: Path) -> None:
    runner, _, _ = make_runner(tmp_path, RecordingPool(), GOOD.replace(
        "block_size: 1M}", "block_size: 1M, timeout_s: 30}"))
    desc = runner.description(tmp_path, "frankfurt", "xcache", 2, warm=True)
    assert desc["arguments"] == ("$(url) --csv reads.csv --block-size 1M --reference none "
                                 "--timeout 30")
    assert desc["+CampaignStep"] == '"xcache/2/warm"'


def test_interrupted_campaign_removes_its_jobs_and_leaves_a_partial_report(
        tmp_path: Path) -> None:
    pool = RecordingPool(stuck={"no-cache/1"})
    runner, lines, _ = make_runner(tmp_path, pool)
    waits = []

    def ctrl_c(seconds: float) -> None:  # Ctrl-C while the stuck step waits
        waits.append(seconds)
        if len(waits) > 2:
            raise KeyboardInterrupt

    runner.sleep = ctrl_c
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert pool.removed == [101, 102, 103]  # every cluster of the campaign
    out = tmp_path / "out"
    step = json.loads((out / "no-cache" / "1" / "step.json").read_text())
    assert step["status"] == "interrupted" and "Ctrl-C" in step["error"]
    md = (out / "report.md").read_text()
    head, table = md.split("Aggregate throughput", 1)
    assert "**Partial report: the campaign did not run to its end.**" in head
    assert "- scenario no-cache, 1 client: interrupted" in head
    assert "- not run: no-cache with 2 clients" in head
    assert "| xcache | 1 |" in table and "| xcache | 2 |" in table  # what finished stays
    assert "interrupted (Ctrl-C) before the step finished" in md.split("## Failures")[1]
    assert any("partial report" in line for line in lines)


def test_completeness_names_steps_never_recorded_and_never_run(tmp_path: Path) -> None:
    (tmp_path / "campaign.yaml").write_text(GOOD)
    campaign = campaign_copy(tmp_path)
    for scenario, n in (("xcache", 1), ("xcache", 2)):
        (tmp_path / scenario / str(n)).mkdir(parents=True)
    (tmp_path / "xcache" / "1" / "step.json").write_text('{"status": "ok"}')
    assert completeness(tmp_path, campaign) == [
        "scenario xcache, 2 clients: started, never recorded as finished (the run was "
        "stopped)", "not run: no-cache with 1 client, no-cache with 2 clients"]
    for scenario, n in (("xcache", 2), ("no-cache", 1), ("no-cache", 2)):
        (tmp_path / scenario / str(n)).mkdir(parents=True, exist_ok=True)
        (tmp_path / scenario / str(n) / "step.json").write_text('{"status": "failed"}')
    assert completeness(tmp_path, campaign) == []
    assert completeness(tmp_path, None) == []


def test_the_local_reference_reads_its_file_urls(tmp_path: Path) -> None:
    pool = RecordingPool()
    runner, _, _ = make_runner(tmp_path, pool, GOOD + LOCAL)
    assert runner.run() == 0
    assert [i["url"] for i in pool.submitted[-1][1]] == [
        "file:///srv/xcache/data/f-0", "file:///srv/xcache/data/f-1"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| xcache | 2 | miss / direct local |" in md


def test_more_clients_than_files_read_round_robin(tmp_path: Path) -> None:
    pool = RecordingPool()
    runner, _, _ = make_runner(tmp_path, pool, GOOD.replace("[1, 2]", "[3]"))
    assert runner.run() == 0
    assert [i["url"][-3:] for i in pool.submitted[0][1]] == ["f-0", "f-1", "f-0"]


def test_a_failed_client_stops_the_campaign_naming_it(tmp_path: Path) -> None:
    pool = RecordingPool(fail={("xcache/2", 1): "bench read: root://x: wrong bytes in the "
                                                "block at offset 0"})
    runner, lines, _ = make_runner(tmp_path, pool)
    assert runner.run() == 1
    failure = next(line for line in lines if "FAILED" in line)
    assert ("scenario xcache, 2 clients, client 1: bench read: root://x: wrong bytes"
            in failure), failure
    assert len(pool.submitted) == 2  # nothing after the failed step
    assert pool.removed == [101, 102]  # only the campaign's own clusters
    step = json.loads((tmp_path / "out" / "xcache" / "2" / "step.json").read_text())
    assert step["status"] == "failed" and step["failed_clients"] == [1]
    assert "client 1: bench read" in (tmp_path / "out" / "report.md").read_text()


def test_a_step_that_takes_too_long_fails(tmp_path: Path) -> None:
    pool = RecordingPool(stuck={"no-cache/1"})
    runner, lines, _ = make_runner(tmp_path, pool)
    assert runner.run() == 1
    failure = next(line for line in lines if "FAILED" in line)
    assert "scenario no-cache, 1 client: timed out after 100 s (1 idle" in failure, failure
    progress = [line for line in lines if line.startswith("scenario no-cache, 1 client: ")
                and " idle, " in line]
    assert 10 <= len(progress) <= 21  # at most one line per 5 s of a 100 s step
    assert pool.removed == [101, 102, 103]


def test_a_fio_client_asks_for_a_whole_pilot_and_ships_its_jobfile(tmp_path: Path) -> None:
    pool = RecordingPool()
    text = (REPO / "deploy/testbed/campaigns/fio-seq.yaml").read_text()
    runner, _, _ = make_runner(tmp_path, pool, text)
    runner.file = REPO / "deploy/testbed/campaigns/fio-seq.yaml"
    desc = runner.description(tmp_path, "frankfurt", "seq-read", 2, warm=False)
    assert desc["request_cpus"] == "4"
    assert desc["executable"].endswith("provisioner/data/campaign/fioclient.py")
    assert desc["transfer_input_files"].endswith("deploy/testbed/campaigns/seq-read.fio")
    assert desc["arguments"] == "seq-read.fio --json fio.json --netdev netdev.csv --bwlog bw.csv"
    # fio's own data files (64 MiB each here) stay on the node.
    assert desc["transfer_output_files"] == "fio.json, netdev.csv, bw.csv"
    assert "bw.csv = client-$(client).bw.csv" in desc["transfer_output_remaps"]
    assert desc["requirements"] == 'PilotSite == "frankfurt"'
    assert runner.c.steps() == [("seq-read", [1, 2])]


def test_the_fio_client_samples_the_network_while_fio_runs(tmp_path: Path) -> None:
    # A stand-in for fio that writes what fio writes: its JSON report, and the bandwidth
    # log of each of its two jobs when the job file it was given asks for one.
    fake = tmp_path / "fio"
    fake.write_text(
        "#!/bin/sh\nsleep 1.5\nfor a in \"$@\"; do case $a in --output=*) "
        "echo '{\"jobs\": []}' > \"${a#--output=}\";; *.fio) job=$a;; esac; done\n"
        "if grep -q '^write_bw_log=fioclient$' \"$job\"; then\n"
        "  printf '10000500, 1024, 0, 1048576, 0\\n10001500, 2048, 0, 1048576, 0\\n'"
        " > fioclient_bw.1.log\n"
        "  printf '10001500, 1, 0, 1048576, 0\\n' > fioclient_bw.2.log\nfi\n")
    fake.chmod(0o755)
    (tmp_path / "job.fio").write_text("[x]\n")
    script = REPO / "provisioner/data/campaign/fioclient.py"
    proc = subprocess.run(["python3", str(script), "job.fio", "--fio", str(fake),
                           "--bwlog", "bw.csv"],
                          cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "fio.json").read_text()) == {"jobs": []}
    rows = list(csv.DictReader((tmp_path / "netdev.csv").open()))
    assert len({r["second"] for r in rows}) >= 2 and {"lo"} <= {r["interface"] for r in rows}
    assert (tmp_path / "bw.csv").read_text().splitlines() == [
        "second,bytes", "10000,1048576", "10001,2098176"]
    assert (tmp_path / "job.fio").read_text() == "[x]\n"  # the user's file is left alone
    missing = subprocess.run(["python3", str(script), "job.fio", "--fio", "/nonexistent/fio",
                              "--bwlog", "bw.csv", "--json", "none.json"],
                             cwd=tmp_path, capture_output=True, text=True, check=False)
    assert missing.returncode == 1 and "fio client: cannot run /nonexistent/fio" in missing.stderr
    # Every file the job names is there for HTCondor to return, so the error above is
    # what the campaign reports (not a hold for a missing output file).
    assert (tmp_path / "none.json").read_text() == "{}\n"
    assert (tmp_path / "bw.csv").read_text() == "second,bytes\n"


def test_fio_bandwidth_logs_become_bytes_per_wall_clock_second() -> None:
    # ms since the epoch at the end of each 1 s window, KiB/s, direction, block size...
    lines = ["1000999, 1000, 0, 4096, 0", "1002000, 1000, 1, 4096, 0", "1002001, 0.5, 0, 4096",
             "garbage", ""]
    assert bw_series(lines) == {1000: 1_024_000, 1001: 1_024_000 + 512}


# -- the submit file condor_submit reads -----------------------------------------------------
def test_submit_file_queues_each_item_after_its_variables() -> None:
    text = submit_file({"executable": "x", "arguments": "$(url) --csv r.csv"},
                       [{"client": "0", "url": "root://a//f0"}, {"client": "1"}])
    assert text.splitlines() == [
        "executable = x", "arguments = $(url) --csv r.csv",
        "client = 0", "url = root://a//f0", "queue 1", "client = 1", "queue 1"]


@pytest.mark.parametrize("where", ["key", "value", "item"])
def test_submit_file_refuses_a_line_break(where: str) -> None:
    desc, items = {"a": "1"}, [{"client": "0"}]
    if where == "key":
        desc = {"a\nqueue 9": "1"}
    elif where == "value":
        desc = {"a": "1\nexecutable = /bin/sh"}
    else:
        items = [{"client": "0\rqueue"}]
    with pytest.raises(ValueError, match="line break"):
        submit_file(desc, items)


def test_condor_pool_runs_condor_submit_and_rm_as_argv(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def command(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        out = "17.0 - 17.1\n" if argv[0] == "condor_submit" else ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    pool = CondorPool(command)
    assert pool.submit({"initialdir": str(tmp_path), "executable": "x"},
                       [{"client": "0"}, {"client": "1"}]) == 17
    assert calls[0] == ["condor_submit", "-terse", str(tmp_path / "clients.sub")]
    assert (tmp_path / "clients.sub").read_text().count("queue 1") == 2
    pool.remove(17, "campaign failed; it said \"why\"")
    assert calls[1] == ["condor_rm", "-reason", "campaign failed; it said \"why\"", "17"]


def test_condor_pool_reports_condor_submit_errors(tmp_path: Path) -> None:
    def command(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "", "ERROR: Executable file x not found\n")

    with pytest.raises(RuntimeError, match="Executable file x not found"):
        CondorPool(command).submit({"initialdir": str(tmp_path)}, [{"client": "0"}])


def test_progress_counts_the_bytes_of_the_clients_back_so_far(tmp_path: Path) -> None:
    (tmp_path / "client-0.csv").write_text("url,second,blocks,bytes,start,end\n"
                                           "r://a,5,1,100,5.1,6.2\nr://a,6,2,200,5.1,6.2\n")
    (tmp_path / "client-1.csv").write_text("url,second,blocks,bytes\nr://b,5,1,50\n")
    (tmp_path / "client-2.csv").write_text("not a csv of ours\n")
    (tmp_path / "client-0.netdev.csv").write_text("second,interface,rx_bytes,tx_bytes\n")
    assert csv_bytes(tmp_path) == 350


def test_an_unexpected_error_is_recorded_with_its_message_and_the_report_written(
        tmp_path: Path) -> None:
    class Refusing(RecordingPool):
        def submit(self, description: dict[str, str], items: list[dict[str, str]]) -> int:
            if self.submitted:
                raise RuntimeError("Failed to connect to schedd")
            return super().submit(description, items)

    runner, _, _ = make_runner(tmp_path, Refusing())
    with pytest.raises(RuntimeError):
        runner.run()
    step = json.loads((tmp_path / "out" / "xcache" / "2" / "step.json").read_text())
    assert step["status"] == "interrupted"
    assert "(RuntimeError: Failed to connect to schedd)" in step["error"]
    assert "Partial report" in (tmp_path / "out" / "report.md").read_text()


def test_ctrl_c_is_taken_between_two_polls_and_a_second_one_at_once() -> None:
    from provisioner.data.campaign.command import CtrlC

    stop = CtrlC()
    stop.sleep(0.01)  # nothing pressed: an ordinary sleep
    stop.handler(signal.SIGINT, None)  # in the middle of a schedd call: only noted
    with pytest.raises(KeyboardInterrupt):
        stop.sleep(60)  # the runner's next poll: raised there, at once
    with pytest.raises(KeyboardInterrupt):
        stop.handler(signal.SIGINT, None)  # pressed again: right away


def test_a_fio_step_is_fio_s_own_seconds_beside_the_nodes_network(tmp_path: Path) -> None:
    step = tmp_path / "seq-read" / "2"
    step.mkdir(parents=True)
    for i, base in enumerate((100, 101)):
        (step / f"client-{i}.json").write_text(json.dumps(
            {"jobs": [{"read": {"bw_bytes": 1_000_000_000}}]}))
        (step / f"client-{i}.bw.csv").write_text(
            "second,bytes\n" + "".join(f"{base + k},1000000000\n" for k in range(3)))
        (step / f"client-{i}.netdev.csv").write_text(
            "second,interface,rx_bytes,tx_bytes\n"
            + "".join(f"{base + k},eth0,{k * 125_000_000},0\n{base + k},lo,{k * 10**9},0\n"
                      for k in range(4)))
    (step / "step.json").write_text(json.dumps({"status": "done"}))
    written = render(tmp_path, "fio-test")
    summary = next(csv.DictReader((tmp_path / "summary.csv").open()))
    assert (summary["seconds"], summary["total_bytes"]) == ("4", str(6 * 10**9))
    assert float(summary["max_gbit_s"]) == 16.0  # two nodes' fio at 1 GB/s each
    assert float(summary["fio_gbit_s"]) == 16.0
    # 125 MB/s per node for 3 s, the nodes 1 s apart: 750 MB over 4 s; loopback not counted.
    assert float(summary["nic_rx_gbit_s"]) == 1.5
    md = (tmp_path / "report.md").read_text()
    assert "| scenario | nodes |" in md and "| fio Gbit/s | NIC rx Gbit/s |" in md
    assert "| 16.000 | 1.500 |" in md
    plot = next(p for p in written if p.name == "throughput-seq-read.png")
    assert plot.read_bytes()[:8] == PNG
    # The series over time is fio's (.bw.csv), never read as a reader's client CSV twice.
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert [int(r["bytes"]) for r in rows] == [10**9, 2 * 10**9, 2 * 10**9, 10**9]
