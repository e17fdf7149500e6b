"""`provisioner campaign run FILE.yaml [--out DIR]` and `provisioner campaign report DIR`."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path

from provisioner.data.campaign.spec import CampaignError, load_campaign

RUN_HELP = """\
Run a benchmark campaign: for every scenario and client count, submit one HTCondor
job per client (as you, with the htcondor2 bindings) and wait for them, then write
results.csv, summary.csv, report.md and PNG plots into DIR.

The campaign does NOT start pilots: a provisioner service (`provisioner run`) must be
running for the pool, or the jobs stay idle until the step times out. Jobs ask for
`PilotSite == "<site>"` and carry `+DesiredSites = "<site>"` and `+WantXCache = false`.
Exit 0 when every step succeeded; 1 when a step failed (the error names scenario,
client count and client; the campaign's queued jobs are removed); 2 on a bad file.
"""


def _fail(message: str, code: int = 2) -> int:
    for line in message.splitlines():
        print(f"provisioner campaign: {line}", file=sys.stderr)
    return code


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="provisioner campaign",
                                     description="benchmark campaigns (no configuration "
                                                 "needed)")
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="run a campaign (a provisioner service must be running)",
                         description=RUN_HELP,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("file", metavar="FILE.yaml")
    run.add_argument("--out", default=None, metavar="DIR",
                     help="result directory, must be new or empty (default: "
                          "./<name>-<YYYYmmdd-HHMMSS>)")
    rep = sub.add_parser("report", help="render the tables, report.md and plots again from "
                         "a result directory's per-client files")
    rep.add_argument("dir", metavar="DIR")
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.action == "report":
        from provisioner.data.campaign.report import render

        out = Path(args.dir)
        if not out.is_dir():
            return _fail(f"{out}: no such result directory")
        for path in render(out):
            print(path)
        return 0
    try:
        campaign = load_campaign(args.file)
    except CampaignError as exc:
        return _fail(str(exc))
    out = Path(args.out or f"{campaign.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        return _fail(f"--out {out}: exists and is not an empty directory (results of "
                     "different runs are not mixed)")
    from provisioner.data.campaign.runner import Runner

    def echo(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    stop = CtrlC()
    previous = signal.signal(signal.SIGINT, stop.handler)
    try:
        return Runner(campaign, Path(args.file), out, echo=echo, sleep=stop.sleep).run()
    except KeyboardInterrupt:  # the runner removed the jobs and said where the report is
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)


class CtrlC:
    """Ctrl-C stops the campaign between two polls of its jobs, never in the middle of a
    call to the schedd (an HTCondor call cut short may leave the bindings unusable for
    the removal that follows): the first one is noted and raised as KeyboardInterrupt by
    the runner's next sleep (within its poll period); a second one at once."""

    def __init__(self) -> None:
        self.pressed = threading.Event()

    def handler(self, signum: int, _frame: object) -> None:
        if self.pressed.is_set():
            raise KeyboardInterrupt
        self.pressed.set()

    def sleep(self, seconds: float) -> None:
        if self.pressed.wait(seconds):
            raise KeyboardInterrupt
