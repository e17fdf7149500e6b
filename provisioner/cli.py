"""`provisioner run | once | status | check-config`."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import NoReturn

from provisioner.config import Config, ConfigError, field_location, load_config
from provisioner.lock import AlreadyRunning, ServiceLock, lock_path

DEFAULT_CONFIG = "/etc/provisioner/provisioner.yaml"


def _fail(lines: list[str], code: int = 2) -> NoReturn:
    """One line per problem on stderr, then exit."""
    for line in lines:
        print(f"provisioner: {line}", file=sys.stderr)
    raise SystemExit(code)


def _load(path: str) -> Config:
    from provisioner.pilot.script import TemplateError, check_templates
    from provisioner.secrets import check_secret_files

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


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def cmd_once(config: Config, dry_run: bool) -> int:
    from provisioner.service import Provisioner, describe

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


def cmd_status(config: Config) -> int:
    from provisioner.journal import Journal
    from provisioner.service import Provisioner, breakers_of

    journal = Journal(config.journal)
    prov = Provisioner(config, journal=journal)
    obs = prov.observe()
    snap = obs.snapshot
    print(f"Pool {config.pool.collector} (provisioner id {config.pool.provisioner_id})")
    if not snap.pool_known:
        print("  pool: UNKNOWN (schedd or collector unreadable)")
    else:
        rows = [[str(d.shape.cpus), str(d.shape.memory_mb), str(d.shape.runtime_s or "-"),
                 ",".join(d.shape.desired_sites) or "any", str(d.idle)]
                for d in sorted(snap.demand, key=lambda d: -d.idle)]
        print("\nIdle demand by job shape:")
        print(_table(rows, ["cores", "memory MB", "runtime s", "sites", "idle jobs"])
              if rows else "  no idle jobs")
    flagged = journal.get("flagged", {}) or {}
    print("\nPilots:")
    rows = []
    now = time.time()
    for p in sorted(snap.pilots, key=lambda p: (p.site, int(p.job_id) if p.job_id.isdigit()
                                                 else 0)):
        left = f"{(p.walltime_end - now) / 60:.0f} min" if p.walltime_end else "-"
        rows.append([p.site, p.job_id, p.state.value, f"{p.cpus - p.free_cpus}/{p.cpus}",
                     str(p.memory_mb), left, "yes" if p.key in flagged else ""])
    print(_table(rows, ["site", "job", "state", "cores used", "memory MB", "walltime left",
                        "flagged"]) if rows else "  no pilots")
    print("\nSites:")
    breakers = breakers_of(journal)  # as the running service last saw them
    for view in snap.sites:
        counts = Counter(p.state.value for p in snap.pilots if p.site == view.name)
        state = "ok" if view.known else f"UNKNOWN ({view.error})"
        breaker = breakers.get(view.name, "closed")
        print(f"  {view.name}: {state}; " + (", ".join(f"{n} {s}" for s, n in
                                                       sorted(counts.items())) or "no pilots")
              + f"; circuit breaker {breaker}")
    last = journal.get("last_cycle")
    if last:
        print(f"\nLast cycle {now - last['at']:.0f} s ago: {last['summary']}")
    return 0


def cmd_xcache_url(config: Config, site: str, urls: list[str]) -> int:
    from provisioner.xcache import cache_url

    if site not in config.site_names:
        _fail([f"--site {site!r}: no such site (sites: {', '.join(config.site_names)})"])
    cache = config.site(site).xcache
    for url in urls:
        print(cache_url(url, cache))
    return 0


def main(argv: list[str] | None = None) -> int:
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
    sub.add_parser("status", help="queue demand, pilots per site and state, flagged pilots")
    sub.add_parser("check-config", help="validate the configuration and exit")
    xurl = sub.add_parser("xcache-url", help="a root:// URL read through a site's cache "
                          "(idempotent; other URLs unchanged)")
    xurl.add_argument("urls", nargs="+", metavar="URL")
    xurl.add_argument("--site", required=True, help="the site whose cache to use")
    bench = sub.add_parser("bench", help="benchmarks; `bench read --help` (no configuration "
                           "needed)", add_help=False)
    bench.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # A cycle longer than the quick check (a site timing out) skips checks: expected.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    if args.command == "bench":
        from provisioner import benchread

        if not args.args or args.args[0] != "read":
            _fail(["bench: the only benchmark is `read` (provisioner bench read --help)"])
        return benchread.main(args.args[1:])
    config = _load(args.config)
    if args.command == "xcache-url":
        return cmd_xcache_url(config, args.site, args.urls)
    if args.command == "check-config":
        print(f"{args.config}: ok ({len(config.sites)} site(s): {', '.join(config.site_names)})")
        return 0
    if args.command == "once":
        with contextlib.nullcontext() if args.dry_run else _locked(config):
            return cmd_once(config, args.dry_run)
    if args.command == "status":
        return cmd_status(config)
    from provisioner.service import Provisioner, run_forever

    with _locked(config):
        run_forever(Provisioner(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
