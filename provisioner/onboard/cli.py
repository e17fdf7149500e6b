"""The onboarding subcommands' arguments and dispatch (provisioner.cli wires them):
`init`, `site check`, `site discover`, and `check-config --live`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from provisioner.config import Config

COMMANDS = ("init", "site")


def add_subcommands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    init = sub.add_parser("init", help="write the configuration directory: a commented "
                          "skeleton, the layout with owners and modes; print what is left")
    init.add_argument("--dir", default="/etc/provisioner", help="(default /etc/provisioner)")
    init.add_argument("--owner", default="provisioner", help="the service's account")
    site = sub.add_parser("site", help="onboard a site: `site discover`, `site check`")
    what = site.add_subparsers(dest="site_command", required=True)
    chk = what.add_parser("check", help="per site: SSH, SLURM, image and a probe pilot; "
                          "exit 0 only if every check passed")
    chk.add_argument("names", nargs="*", metavar="NAME", help="sites (default: all)")
    chk.add_argument("--json", action="store_true", help="machine-readable")
    chk.add_argument("--no-probe", action="store_true", help="no probe pilot")
    chk.add_argument("--pending-s", type=float, default=300,
                     help="give up on a probe SLURM keeps pending this long (300)")
    disc = what.add_parser("discover", help="print a site block from what SLURM says")
    disc.add_argument("--host", help="the login node (omit with --local or --rest-url)")
    disc.add_argument("--rest-url", help="a site without SSH: its slurmrestd's URL")
    disc.add_argument("--token-file", help="with --rest-url: the file of --user's JWT")
    disc.add_argument("--user", help="the site account pilots run as")
    disc.add_argument("--local", action="store_true", help="SLURM is on this host")
    disc.add_argument("--partition", help="default: SLURM's default partition")
    disc.add_argument("--port", type=int, default=22)
    disc.add_argument("--key-file", default="/etc/provisioner/ssh/id_ed25519")
    disc.add_argument("--known-hosts", default="/etc/provisioner/ssh/known_hosts")
    disc.add_argument("--slurm-conf", help="SLURM_CONF at the site (default: SLURM's)")
    disc.add_argument("--image", default="/cvmfs/example.org/images/pilot.sif",
                      help="the pilot image's path at the site")
    disc.add_argument("--account", help="SLURM account for the pilots")
    disc.add_argument("--name", help="site name (default: SLURM's ClusterName)")


def _discover(args: argparse.Namespace, fail: Callable[[list[str]], None]) -> int:
    from pydantic import ValidationError

    from provisioner.config import SshExecutorConfig
    from provisioner.onboard.command import site_discover
    from provisioner.onboard.discover import Access

    if args.rest_url:
        return _discover_rest(args, fail)
    if not args.local and not (args.host and args.user):
        fail(["site discover: --host LOGIN and --user ACCOUNT (or --local, or --rest-url)"])
    if not args.local:
        try:
            SshExecutorConfig(type="ssh", host=args.host, user=args.user, port=args.port,
                              key_file=args.key_file, known_hosts=args.known_hosts)
        except ValidationError as exc:
            fail([f"site discover: --{'-'.join(str(e['loc'][0]).split('_'))} "
                  f"{e['input']!r}: {e['msg']}" for e in exc.errors()])
    access = Access(host=None if args.local else args.host, user=args.user,
                    key_file=args.key_file, known_hosts=args.known_hosts, port=args.port,
                    slurm_conf=args.slurm_conf)
    return site_discover(access, args.partition, args.image, args.account, args.name)


def _discover_rest(args: argparse.Namespace, fail: Callable[[list[str]], None]) -> int:
    from pydantic import ValidationError

    from provisioner.config import RestConfig
    from provisioner.onboard.command import site_discover
    from provisioner.onboard.discover import Access

    if not (args.user and args.token_file):
        fail(["site discover: --rest-url URL needs --user ACCOUNT and --token-file FILE"])
    try:
        RestConfig(url=args.rest_url, user=args.user, token_file=args.token_file)
    except ValidationError as exc:
        fail([f"site discover: --{str(e['loc'][0]).replace('url', 'rest-url').replace('_', '-')}"
              f" {e['input']!r}: {e['msg']}" for e in exc.errors()])
    access = Access(host=None, user=args.user, rest_url=args.rest_url,
                    token_file=args.token_file)
    return site_discover(access, args.partition, args.image, args.account, args.name)


def run(args: argparse.Namespace, load: Callable[[], Config],
        fail: Callable[[list[str]], None]) -> int:
    """Run `init` or `site ...` (they read the configuration only when they need it)."""
    if args.command == "init":
        from provisioner.onboard.init import init

        print(init(Path(args.dir), args.owner), end="")
        return 0
    if args.site_command == "discover":
        return _discover(args, fail)
    from provisioner.onboard.command import site_check
    from provisioner.onboard.probe import Limits

    return site_check(load(), args.names, args.json, not args.no_probe,
                      Limits(pending_s=args.pending_s))
