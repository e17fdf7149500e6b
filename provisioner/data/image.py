"""`provisioner image check IMAGE`: is a payload (or pilot) image fit to run jobs?

Checks, each named in the output and failing loudly (exit 1):

- apptainer: `apptainer --version` runs (missing or broken: every other check but
  image is skipped);
- image: the path exists and is a SIF file, a SquashFS image or a sandbox directory,
  and `apptainer inspect` reads it;
- %test: the image has a %test section and `apptainer test` passes;
- environment: every variable the image declares in its label `LABEL_ENVIRONMENT`
  (names separated by spaces or commas), plus any named with --env, is set and not
  empty inside `apptainer exec --cleanenv IMAGE env`;
- loader variables: the image sets no LD_AUDIT/LD_PRELOAD of its own (a site default
  that intercepted the dynamic loader made containers 3x slower). Those set in the
  caller's environment reach every container whatever %environment says (measured
  with Apptainer 1.4), so only the caller can drop them, and the pilot does: the check
  reports them, it does not fail the image for them. Their APPTAINERENV_/
  SINGULARITYENV_ forms are removed from every command run here and reported when the
  caller had them;
- start-up: the median wall time of `apptainer exec IMAGE /bin/true` over a few runs,
  failing above a bound;
- size: bytes on disk (the file; a sandbox's tree) and, with `--unpacked`, the
  apparent size of the tree a SIF unpacks to (`apptainer build --sandbox`) and the
  ratio of the two.

Every command is an argv list run with a timeout through a `Runner` (injected in tests);
nothing here builds a shell string.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from provisioner.data.image_report import FAIL, OK, SKIPPED, Report, human, render

#: Image label naming the variables the image promises to set (spaces or commas).
LABEL_ENVIRONMENT = "org.htcondor-slurm-provisioner.environment"
#: Loader variables that must not reach the container from the caller.
LOADER_VARS = ("LD_AUDIT", "LD_PRELOAD")
#: Prefixes with which the caller sets a variable inside the container.
INJECT_PREFIXES = ("APPTAINERENV_", "SINGULARITYENV_")
#: The value the loader check sets: a library that does not exist, so the loader only
#: warns, and a value no image sets by itself.
LOADER_MARKER = "/nonexistent/provisioner-image-check-loader.so"

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIF_MAGIC = b"SIF_MAGIC"  # at offset 32, after the launch script line
_SQUASHFS_MAGIC = b"hsqs"

#: The checks in the order they run and are shown.
CHECKS = ("apptainer", "image", "%test", "environment", "loader variables", "start-up", "size")

Runner = Callable[[list[str], float, Mapping[str, str]], subprocess.CompletedProcess[str]]


def run_command(argv: list[str], timeout: float,
                env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """Run argv in its own session; on timeout kill the whole group, then raise."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace",
                            env=dict(env), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


class ImageError(Exception):
    """The path is missing or is not an image; the message says which."""


def image_kind(path: Path) -> str:
    """"sif", "squashfs" or "sandbox"; ImageError if missing or none of them."""
    if not path.exists():
        raise ImageError(f"image missing: {path} does not exist")
    if path.is_dir():
        if (path / ".singularity.d").is_dir():
            return "sandbox"
        raise ImageError(f"not an image: {path} is a directory without .singularity.d "
                         "(not a sandbox)")
    try:
        with path.open("rb") as f:
            head = f.read(64)
    except OSError as exc:
        raise ImageError(f"image unreadable: {path}: {exc.strerror or exc}") from None
    if head[32:32 + len(_SIF_MAGIC)] == _SIF_MAGIC:
        return "sif"
    if head[:4] == _SQUASHFS_MAGIC:
        return "squashfs"
    raise ImageError(f"not an image: {path} is neither a SIF file, a SquashFS image nor "
                     "a sandbox directory")


def tree_size(root: Path) -> int:
    """Apparent size of a tree: regular files (each hard-linked inode once) and
    symbolic links; symbolic links are not followed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        # a symbolic link to a directory is listed with the directories
        links = [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]
        for name in [*files, *links]:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            total += st.st_size
    return total


def _remove_tree(root: Path) -> None:
    """rm -rf for a sandbox an unprivileged build left with read-only directories."""
    for dirpath, dirs, _files in os.walk(root, followlinks=False):
        for d in dirs:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                with contextlib.suppress(OSError):
                    os.chmod(p, 0o700)
    shutil.rmtree(root, ignore_errors=True)


def parse_inspect(text: str) -> tuple[dict[str, str], str]:
    """Labels and %test script from `apptainer inspect --json --labels --test`."""
    doc = json.loads(text)
    attrs = (doc.get("data") or {}).get("attributes") or {} if isinstance(doc, dict) else {}
    labels = attrs.get("labels") or {}
    if not isinstance(labels, dict):
        labels = {}
    return {str(k): str(v) for k, v in labels.items()}, str(attrs.get("test") or "")


def declared_variables(labels: Mapping[str, str]) -> list[str]:
    """The names in LABEL_ENVIRONMENT; ValueError naming any that is not a variable name."""
    names = [n for n in re.split(r"[\s,]+", labels.get(LABEL_ENVIRONMENT, "")) if n]
    bad = [n for n in names if not _NAME.match(n)]
    if bad:
        raise ValueError(f"label {LABEL_ENVIRONMENT} names invalid variables: "
                         f"{', '.join(bad)}")
    return names


def parse_env(text: str) -> dict[str, str]:
    """`env` output -> {name: value}; continuation lines of multi-line values skipped."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and _NAME.match(name):
            env[name] = value
    return env


def base_environment(caller: Mapping[str, str],
                     loader_vars: Iterable[str] = LOADER_VARS) -> tuple[dict[str, str], list[str]]:
    """The caller's environment without loader variables in any form, and the names removed."""
    drop = {f"{p}{v}" for v in loader_vars for p in ("", *INJECT_PREFIXES)}
    removed = sorted(k for k in caller if k in drop)
    return {k: v for k, v in caller.items() if k not in drop}, removed


def _tail(proc: subprocess.CompletedProcess[str], lines: int = 6) -> str:
    kept = [ln.strip() for ln in (proc.stderr + "\n" + proc.stdout).splitlines() if ln.strip()]
    return " | ".join(kept[-lines:]) or f"exit status {proc.returncode}"


@dataclass
class Checker:
    """Runs the checks of one image. `runner`, `clock` and `caller_env` are injected."""

    apptainer: str = "apptainer"
    runner: Runner = run_command
    clock: Callable[[], float] = time.monotonic
    caller_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    timeout_s: float = 120.0
    build_timeout_s: float = 900.0
    runs: int = 3
    max_startup_s: float = 10.0
    extra_vars: tuple[str, ...] = ()
    loader_vars: tuple[str, ...] = LOADER_VARS
    unpacked: bool = False
    tmpdir: str | None = None

    def _run(self, argv: list[str], env: Mapping[str, str],
             timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        return self.runner([self.apptainer, *argv], timeout or self.timeout_s, env)

    def check(self, image: str) -> Report:
        report = Report(image)
        path = Path(image)
        env, removed = base_environment(self.caller_env, self.loader_vars)
        self._version(env, report)
        try:
            report.kind = image_kind(path)
        except ImageError as exc:
            report.add("image", FAIL, str(exc))
        if report.failed:
            return self._skip_rest(report, f"{', '.join(c.name for c in report.failed)} failed")
        try:
            labels, test_script = self._inspect(image, env, report)
        except _Stop:
            return self._skip_rest(report, "the image could not be read")
        try:
            self._test(image, env, test_script, report)
            self._environment(image, env, labels, report)
            self._loader(image, env, removed, report)
            self._startup(image, env, report)
        except _ApptainerMissing as exc:  # removed while we ran
            report.add(exc.check, FAIL, str(exc))
            return self._skip_rest(report, "apptainer missing")
        self._size(image, path, env, report)
        return report

    def _skip_rest(self, report: Report, why: str) -> Report:
        done = {c.name for c in report.checks}
        for name in CHECKS:
            if name not in done:
                report.add(name, SKIPPED, f"not checked: {why}")
        return report

    def _version(self, env: Mapping[str, str], report: Report) -> None:
        try:
            proc = self._call("apptainer", ["--version"], env)
        except _ApptainerMissing as exc:
            report.add("apptainer", FAIL, str(exc))
            return
        if isinstance(proc, str) or proc.returncode != 0:
            why = proc if isinstance(proc, str) else _tail(proc)
            report.add("apptainer", FAIL, f"`{self.apptainer} --version` failed: {why}")
            return
        report.add("apptainer", OK, proc.stdout.strip() or self.apptainer)

    def _call(self, check: str, argv: list[str], env: Mapping[str, str],
              timeout: float | None = None) -> subprocess.CompletedProcess[str] | str:
        """The completed process, or a message why it did not complete."""
        limit = timeout or self.timeout_s
        try:
            return self._run(argv, env, limit)
        except FileNotFoundError:
            raise _ApptainerMissing(check, f"apptainer missing: {self.apptainer!r} not "
                                    "found (install it, or name it with --apptainer)") from None
        except PermissionError as exc:
            raise _ApptainerMissing(check, f"apptainer not executable: {self.apptainer}: "
                                    f"{exc.strerror or exc}") from None
        except subprocess.TimeoutExpired:
            return f"`apptainer {' '.join(argv[:2])}` timed out after {limit:g} s"

    def _inspect(self, image: str, env: Mapping[str, str],
                 report: Report) -> tuple[dict[str, str], str]:
        try:
            proc = self._call("image", ["inspect", "--json", "--labels", "--test", image], env)
        except _ApptainerMissing as exc:
            report.add("image", FAIL, str(exc))
            raise _Stop from None
        if isinstance(proc, str):
            report.add("image", FAIL, f"not readable as an image: {proc}")
            raise _Stop
        if proc.returncode != 0:
            report.add("image", FAIL, f"not an image (apptainer inspect: {_tail(proc)})")
            raise _Stop
        try:
            labels, test_script = parse_inspect(proc.stdout)
        except (ValueError, AttributeError) as exc:
            report.add("image", FAIL, f"apptainer inspect gave no JSON metadata: {exc}")
            raise _Stop from None
        report.add("image", OK, f"{report.kind}, read by apptainer inspect")
        return labels, test_script

    def _test(self, image: str, env: Mapping[str, str], script: str, report: Report) -> None:
        if not script.strip():
            report.add("%test", FAIL, "the image has no %test section (a payload image "
                       "must test its own environment)")
            return
        start = self.clock()
        proc = self._call("%test", ["test", image], env)
        if isinstance(proc, str):
            report.add("%test", FAIL, proc)
        elif proc.returncode != 0:
            report.add("%test", FAIL, f"%test failed (exit {proc.returncode}): {_tail(proc)}")
        else:
            report.add("%test", OK, f"passed in {self.clock() - start:.1f} s")

    def _environment(self, image: str, env: Mapping[str, str], labels: Mapping[str, str],
                     report: Report) -> None:
        try:
            declared = declared_variables(labels)
        except ValueError as exc:
            report.add("environment", FAIL, str(exc))
            return
        wanted = list(dict.fromkeys([*declared, *self.extra_vars]))
        if not wanted:
            report.add("environment", FAIL, f"the image declares no environment (label "
                       f"{LABEL_ENVIRONMENT} missing) and none was named with --env")
            return
        inside = self._env_inside("environment", ["exec", "--cleanenv", image, "env"], env,
                                  report)
        if inside is None:
            return
        report.environment = {v: inside[v] for v in wanted if inside.get(v)}
        missing = [v for v in wanted if v not in inside]
        empty = [v for v in wanted if v in inside and not inside[v]]
        if missing or empty:
            parts = ([f"not set inside: {', '.join(missing)}"] if missing else []) + \
                    ([f"empty inside: {', '.join(empty)}"] if empty else [])
            report.add("environment", FAIL, "; ".join(parts))
            return
        report.add("environment", OK, " ".join(f"{v}={inside[v]}" for v in wanted))

    def _env_inside(self, check: str, args: list[str], env: Mapping[str, str],
                    report: Report, setting: str = "") -> dict[str, str] | None:
        """The environment `apptainer ARGS` prints, or None after reporting the failure."""
        proc = self._call(check, args, env)
        if isinstance(proc, str) or proc.returncode != 0:
            why = proc if isinstance(proc, str) else _tail(proc)
            report.add(check, FAIL, f"`apptainer {' '.join(args)}`{setting} failed: {why}")
            return None
        return parse_env(proc.stdout)

    def _loader(self, image: str, env: Mapping[str, str], removed: list[str],
                report: Report) -> None:
        probe = {**env, **dict.fromkeys(self.loader_vars, LOADER_MARKER)}
        inside = self._env_inside("loader variables", ["exec", image, "env"], probe, report,
                                  f" with {', '.join(self.loader_vars)} set")
        if inside is None:
            return
        leaked = [v for v in self.loader_vars if inside.get(v) == LOADER_MARKER]
        set_by_image = [v for v in self.loader_vars
                        if v in inside and inside[v] != LOADER_MARKER]
        note = (f"; the caller had {', '.join(removed)} set: removed for every check "
                "(a pilot must unset the APPTAINERENV_/SINGULARITYENV_ forms, the image "
                "cannot)") if any(r.startswith(INJECT_PREFIXES) for r in removed) else ""
        if set_by_image:
            report.add("loader variables", FAIL,
                       f"the image itself sets {', '.join(set_by_image)}" + note)
            return
        # Apptainer (1.4, measured) passes the caller's LD_AUDIT/LD_PRELOAD into every
        # container whatever %environment says: only whoever starts containers can keep
        # them out (the pilot does). Reported, not a failure of the image.
        passes = (f"; the caller's {', '.join(leaked)} reach the container whatever the "
                  "image says (Apptainer passes them): the caller must unset them, as the "
                  "pilot does") if leaked else ""
        report.add("loader variables", OK, "the image sets none of "
                   f"{', '.join(self.loader_vars)}{passes}{note}")

    def _startup(self, image: str, env: Mapping[str, str], report: Report) -> None:
        for _ in range(self.runs):
            start = self.clock()
            proc = self._call("start-up", ["exec", image, "/bin/true"], env)
            elapsed = self.clock() - start
            if isinstance(proc, str) or proc.returncode != 0:
                why = proc if isinstance(proc, str) else _tail(proc)
                report.add("start-up", FAIL, f"`apptainer exec {image} /bin/true` failed: "
                           f"{why}")
                return
            report.startup_s.append(elapsed)
        median = report.startup_median_s
        assert median is not None
        runs = ", ".join(f"{s:.2f}" for s in report.startup_s)
        detail = f"median {median:.2f} s over {len(report.startup_s)} runs ({runs} s)"
        if median > self.max_startup_s:
            report.add("start-up", FAIL, f"{detail}: above {self.max_startup_s:g} s (a "
                       "loader hook such as LD_AUDIT, or a slow image file system?)")
        else:
            report.add("start-up", OK, detail)

    def _size(self, image: str, path: Path, env: Mapping[str, str], report: Report) -> None:
        if report.kind == "sandbox":
            report.size_bytes = report.unpacked_bytes = tree_size(path)
            report.add("size", OK, f"sandbox tree {human(report.size_bytes)}")
            return
        report.size_bytes = path.stat().st_size
        detail = f"{report.kind} file {human(report.size_bytes)}"
        if not self.unpacked:
            report.add("size", OK, f"{detail} (unpacked size: --unpacked)")
            return
        with tempfile.TemporaryDirectory(prefix="image-check-", dir=self.tmpdir) as tmp:
            tree = Path(tmp) / "tree"
            try:
                proc = self._call("size", ["build", "--sandbox", str(tree), image], env,
                                  self.build_timeout_s)
                if isinstance(proc, str) or proc.returncode != 0:
                    why = proc if isinstance(proc, str) else _tail(proc)
                    report.add("size", FAIL, f"{detail}; unpacking to a sandbox failed: {why}")
                    return
                report.unpacked_bytes = tree_size(tree)
            except _ApptainerMissing as exc:
                report.add("size", FAIL, str(exc))
                return
            finally:
                _remove_tree(tree)
        report.add("size", OK, f"{detail}; unpacked tree {human(report.unpacked_bytes)} "
                   f"({report.ratio:.1f}x the image)")


class _Stop(Exception):
    """The image cannot be read: the remaining checks are skipped."""


class _ApptainerMissing(Exception):
    def __init__(self, check: str, message: str) -> None:
        super().__init__(message)
        self.check = check


def main(argv: list[str] | None = None,
         checker_factory: Callable[..., Checker] = Checker) -> int:
    """`provisioner image check IMAGE`: exit 0 when every check passes, 1 when one fails
    (each failure named on stderr), 2 on bad arguments."""
    parser = argparse.ArgumentParser(prog="provisioner image",
                                     description="Payload image tooling.")
    sub = parser.add_subparsers(dest="command", required=True)
    chk = sub.add_parser("check", help="run the image's %%test, check its declared "
                         "environment and loader variables, measure start-up and size",
                         description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    chk.add_argument("image", metavar="IMAGE", help="a .sif file or a sandbox directory")
    chk.add_argument("--apptainer", default="apptainer", help="apptainer executable "
                     "(default: apptainer from PATH)")
    chk.add_argument("--json", action="store_true", help="machine-readable report")
    chk.add_argument("--env", action="append", default=[], metavar="NAME",
                     help="a variable that must be set inside, besides those the image "
                          "declares (repeatable)")
    chk.add_argument("--runs", type=int, default=3, help="start-up runs (default 3)")
    chk.add_argument("--max-startup", type=float, default=10.0, metavar="S",
                     help="fail if the median start-up exceeds S seconds (default 10)")
    chk.add_argument("--unpacked", action="store_true",
                     help="also unpack a SIF to a temporary sandbox to measure its tree "
                          "(slow: writes the whole tree)")
    chk.add_argument("--tmpdir", default=None, help="where --unpacked unpacks (default "
                     "$TMPDIR or /tmp)")
    chk.add_argument("--timeout", type=float, default=120.0, metavar="S",
                     help="per command (default 120 s; unpacking gets 900 s)")
    args = parser.parse_args(argv)
    bad = [n for n in args.env if not _NAME.match(n)]
    if bad:
        parser.error(f"--env: not a variable name: {', '.join(bad)}")
    if args.runs < 1 or args.timeout <= 0 or args.max_startup <= 0:
        parser.error("--runs must be >= 1, --timeout and --max-startup > 0")
    checker = checker_factory(apptainer=args.apptainer, timeout_s=args.timeout,
                              runs=args.runs, max_startup_s=args.max_startup,
                              extra_vars=tuple(args.env), unpacked=args.unpacked,
                              tmpdir=args.tmpdir)
    report = checker.check(args.image)
    print(json.dumps(report.as_json(), indent=2) if args.json else render(report))
    for c in report.failed:
        print(f"provisioner image check: FAILED {c.name}: {c.detail}", file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
