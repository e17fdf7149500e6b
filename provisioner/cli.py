"""`provisioner run | once | status | report | check-config | xcache-url | bench | campaign |
image | init | site | why`."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sqlite3
import sys
import time
from collections.abc import Iterator
from typing import NoReturn

from provisioner.config import Config, ConfigError, field_location, load_config
from provisioner.onboard import cli as onboard_cli
from provisioner.service.lock import AlreadyRunning, ServiceLock, lock_path

DEFAULT_CONFIG = "/etc/provisioner/provisioner.yaml"


def _fail(lines: list[str], code: int = 2) -> NoReturn:
    """One line per problem on stderr, then exit."""
    for line in lines:
        print(f"provisioner: {line}", file=sys.stderr)
    raise SystemExit(code)


def _load(path: str) -> Config:
    from provisioner.pilot.script import TemplateError, check_templates
    from provisioner.service.secrets import check_secret_files

    try:
        config = load_config(path)
        check_templates(config)
    except ConfigError as exc:
        _fail(str(exc).splitlines())
    except TemplateError as exc:
        _fail([f"{field_location(path, exc.field)}: {exc}"])
    problems = check_secret_files(config)
    if problems:
        _fail([f"{path}: {p}" for p in problems])
    return config


@contextlib.contextmanager
def _locked(config: Config) -> Iterator[None]:
    """Hold this provisioner id's lock while the block runs, or exit 3."""
    lock = ServiceLock(config.lock_file or lock_path(config.journal, config.pool.provisioner_id))
    try:
        lock.acquire()
    except AlreadyRunning as exc:
        _fail([str(exc)], code=3)
    except OSError as exc:
        _fail([f"cannot take the service lock {lock.path}: {exc.strerror or exc}"], code=3)
    try:
        yield
    finally:
        lock.release()


def cmd_once(config: Config, dry_run: bool) -> int:
    from provisioner.service.loop import Provisioner, describe

    prov = Provisioner(config)
    cycle = prov.run_cycle("once (dry run)" if dry_run else "once", dry_run=dry_run)
    print("Plan (dry run, nothing applied):" if dry_run else "Plan:")
    for action in cycle.plan.actions:
        reason = getattr(action, "reason", "")
        print(f"  {describe(action)}" + (f"  [{reason}]" if reason else ""))
    if not cycle.plan.actions:
        print("  nothing to do")
    for u in cycle.plan.unmatchable:
        print(f"  unmatchable: {u.idle} job(s) {u.shape.cpus} cores/{u.shape.memory_mb} MB: "
              f"{u.reason}")
    for text, outcome in cycle.outcomes:
        print(f"  -> {text}: {outcome}")
    return 0


def cmd_status(config: Config, as_json: bool) -> int:
    """One observation plus what the journal holds (never creates a journal)."""
    import json
    from dataclasses import replace

    from provisioner.decide.stuck import StuckGroups
    from provisioner.service.books import allocation_rows, stopped_read
    from provisioner.service.journal import Journal
    from provisioner.service.journal_health import fault_path, kind_of, read_fault
    from provisioner.service.loop import Provisioner, breakers_of
    from provisioner.service.status import gather, render

    unopened = False
    try:
        journal = Journal.open_existing(config.journal)
        fault = read_fault(fault_path(config.pool.provisioner_id))
    except (sqlite3.Error, OSError) as exc:
        journal, fault = None, {"kind": kind_of(exc), "error": f"cannot be opened: {exc}"}
        unopened = True
    prov = Provisioner(config, journal=journal or Journal(""))
    prov.journal_health.unopened = unopened  # the allocations' books are then unknown
    now = time.time()
    snap = prov.observe(now).snapshot
    j = prov.journal
    learnt = j.get("controller") or {}
    # shapes the service found stuck are shown as it treats them: matching no site
    stuck = StuckGroups(config.policy.stuck_after_s, config.policy.stuck_retry_s)
    stuck.load(learnt.get("stuck") or [])
    snap = replace(snap, demand=stuck.mark(snap.demand))
    st = gather(config, snap, now, breakers_of(j), j.get("flagged", {}) or {},
                j.pilots(since=now - 86400.0), j.get("last_cycle"), learnt.get("estimates"),
                limits=j.get("limits") or {}, journal_fault=fault,
                tokens=j.get("pilot_tokens"),
                allocations=allocation_rows(config, snap, prov.books.entries, now,
                                            stopped_read(j.get("stopped_allocations"))))
    print(json.dumps(st, indent=2, sort_keys=True) if as_json
          else render(st, tty=sys.stdout.isatty()))
    return 0


def cmd_report(journal: str, since: str | None, site: str | None, out: str | None,
               config: Config | None = None) -> int:
    from pathlib import Path

    from provisioner.service.report import ReportError, parse_since, report

    try:
        start = parse_since(since) if since else None
    except ReportError as exc:
        _fail([str(exc)])
    text, written = report(journal, time.time(), start, site, Path(out) if out else None,
                           config)
    print(text)
    for path in written:
        print(f"wrote {path}")
    return 0


def cmd_xcache_url(config: Config, site: str, urls: list[str]) -> int:
    from provisioner.data.xcache import cache_url

    if site not in config.site_names:
        _fail([f"--site {site!r}: no such site (sites: {', '.join(config.site_names)})"])
    cache = config.site(site).xcache
    for url in urls:
        print(cache_url(url, cache))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["campaign"]:  # its own parser (argparse.REMAINDER drops a leading -h)
        from provisioner.data.campaign.command import main as campaign_main

        return campaign_main(argv[1:])
    if argv[:1] == ["why"]:  # any user, no configuration; its own parser, as campaign
        from provisioner.service.why import main as why_main

        return why_main(argv[1:])
    if argv[:1] == ["image"]:  # no configuration needed; its own parser, as campaign
        from provisioner.data.image import main as image_main

        return image_main(argv[1:])
    parser = argparse.ArgumentParser(prog="provisioner",
                                     description="HTCondor pilots on SLURM sites, on demand.")
    parser.add_argument("-c", "--config", default=os.environ.get("PROVISIONER_CONFIG",
                                                                   DEFAULT_CONFIG),
                        help=f"YAML configuration (default {DEFAULT_CONFIG} or "
                             "$PROVISIONER_CONFIG)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the service in the foreground")
    once = sub.add_parser("once", help="run one cycle and print the plan")
    once.add_argument("--dry-run", action="store_true", help="plan only, change nothing")
    status = sub.add_parser("status", help="per site: pilots, cores, lead times, circuit; "
                            "demand, unmatchable jobs, last cycle")
    status.add_argument("--json", action="store_true", help="machine-readable, stable keys")
    rep = sub.add_parser("report", help="allocated/claimed core-hours and efficiency per "
                         "site and day, and the allocations this period, from the journal")
    rep.add_argument("--since", help="first day (YYYY-MM-DD, UTC) or ISO 8601 time")
    rep.add_argument("--site", help="only this site")
    rep.add_argument("--out", help="directory for report.csv and the PNG plots")
    rep.add_argument("--journal", help="journal file to read (default: the configured one; "
                     "then no configuration is read)")
    check = sub.add_parser("check-config", help="validate the configuration and exit")
    check.add_argument("--live", action="store_true", help="also compare every site block "
                       "with what the site's SLURM says, naming each difference")
    onboard_cli.add_subcommands(sub)
    xurl = sub.add_parser("xcache-url", help="a root:// URL read through a site's cache "
                          "(idempotent; other URLs unchanged)")
    xurl.add_argument("urls", nargs="+", metavar="URL")
    xurl.add_argument("--site", required=True, help="the site whose cache to use")
    bench = sub.add_parser("bench", help="benchmarks; `bench read --help` (no configuration "
                           "needed)", add_help=False)
    bench.add_argument("args", nargs=argparse.REMAINDER)
    campaign = sub.add_parser("campaign", help="benchmark campaigns: `campaign run FILE.yaml`, "
                              "`campaign report DIR` (needs a running service)", add_help=False)
    campaign.add_argument("args", nargs=argparse.REMAINDER)
    why = sub.add_parser("why", help="why a job waits, runs or is held: `why "
                         "CLUSTER[.PROC]` (any user; no configuration needed)", add_help=False)
    why.add_argument("args", nargs=argparse.REMAINDER)
    image = sub.add_parser("image", help="payload images: `image check IMAGE.sif` runs its "
                           "%%test, checks its environment, measures start-up and size (no "
                           "configuration needed)", add_help=False)
    image.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # A cycle longer than the quick check (a site timing out) skips checks: expected.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    if args.command == "bench":
        from provisioner.data import benchread

        if not args.args or args.args[0] != "read":
            _fail(["bench: the only benchmark is `read` (provisioner bench read --help)"])
        return benchread.main(args.args[1:])
    if args.command == "campaign":
        from provisioner.data.campaign.command import main as campaign_main

        return campaign_main(args.args)  # after global options: provisioner -v campaign ...
    if args.command == "why":
        from provisioner.service.why import main as why_main

        return why_main(args.args)
    if args.command == "image":
        from provisioner.data.image import main as image_main

        return image_main(args.args)
    if args.command in onboard_cli.COMMANDS:
        return onboard_cli.run(args, lambda: _load(args.config), _fail)
    if args.command == "report" and args.journal:
        return cmd_report(args.journal, args.since, args.site, args.out)
    config = _load(args.config)
    if args.command == "xcache-url":
        return cmd_xcache_url(config, args.site, args.urls)
    if args.command == "report":
        return cmd_report(config.journal, args.since, args.site, args.out, config)
    if args.command == "check-config":
        print(f"{args.config}: ok ({len(config.sites)} site(s): {', '.join(config.site_names)})")
        if args.live:
            from provisioner.onboard.command import live_differences

            return live_differences(config)
        return 0
    if args.command == "once":
        with contextlib.nullcontext() if args.dry_run else _locked(config):
            return cmd_once(config, args.dry_run)
    if args.command == "status":
        return cmd_status(config, args.json)
    from provisioner.service.loop import Provisioner
    from provisioner.service.schedule import run_forever

    with _locked(config):
        from provisioner.service.journal_health import fault_path

        run_forever(Provisioner(config, fault_file=fault_path(config.pool.provisioner_id)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
