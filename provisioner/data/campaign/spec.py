"""The campaign file: what to read, from where, with how many clients.

`load_campaign(path)` is the only entry point that touches the file system; every
problem is raised as `CampaignError`, one line each, naming the file, the line, the
field (``scenarios[1].url``) and what is wrong.

Example (a read campaign)::

    name: cache-modes
    files: {prefix: camp16m-, count: 4, size: 16M,
            prepare: [/src/deploy/testbed/campaigns/make-files, "{prefix}", "{count}", "{size}"]}
    clients: [1, 2]
    reader: {block_size: 8M, stride: 0}
    step_timeout_s: 600
    scenarios:
      - name: xcache
        site: frankfurt
        url: "root://fra-cache:1094//root://gsi-storage:1094//data/{file}"
        setup: [[/src/deploy/testbed/inside/cache-mode, xcache]]
        warm: false
      - name: direct-local              # the reference of the report's ratio table
        site: frankfurt
        reference: local                # only such a scenario may read a file:// URL
        url: "file:///srv/xcache/data/{file}"

File i is named ``<prefix><i>`` (i = 0 .. count-1); client i of a step reads file
i mod count. ``prepare``, ``setup`` and ``hit_ratio`` are argv lists, never shell
strings: an element that is exactly ``{prefix}``, ``{count}``, ``{size}``,
``{scenario}``, ``{clients}`` or ``{site}`` is replaced by that value, nothing else is.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from provisioner.data.benchread import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S, parse_size

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
SITE_PATTERN = r"^[a-z][a-z0-9_-]*$"
ATTRIBUTE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Attributes the runner sets itself; a scenario cannot override them.
RESERVED_ATTRIBUTES = frozenset({"requirements", "desiredsites", "campaignname", "campaignstep"})
#: Where a relative fio job file is looked up after the campaign file's directory.
REPO_ROOT = Path(__file__).resolve().parents[3]


class CampaignError(Exception):
    """The campaign file cannot be used; one line per problem, each saying where."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _size(value: str | int) -> str:
    text = str(value)
    parse_size(text)  # ValueError names the accepted forms
    return text


def _argv(argv: list[str]) -> list[str]:
    if not argv or not argv[0].strip():
        raise ValueError("an argv list needs a program (first element)")
    return argv


class Files(_Model):
    """The files every client reads: distinct names, identical content."""

    prefix: str = Field(pattern=NAME_PATTERN)
    count: int = Field(ge=1)
    size: str
    #: Run once, on the machine running the campaign, to create the files at the origin.
    prepare: list[str] | None = None
    #: Expected SHA-256 of every file: clients then check each whole file.
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")

    _check_size = field_validator("size", mode="before")(_size)

    @field_validator("prepare")
    @classmethod
    def _prepare(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else _argv(v)

    def names(self) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(self.count)]


class Reader(_Model):
    """Arguments of each client's `benchread.py`."""

    block_size: str = "8M"
    stride: str = "0"
    duration_s: float | None = Field(default=None, gt=0)
    max_bytes: str | None = None
    samples: int = Field(default=4, ge=0)
    #: Seconds any one XRootD request of a client may go unanswered before the client
    #: fails (benchread --timeout): a stalled server fails the step, naming the client.
    timeout_s: int = Field(default=DEFAULT_TIMEOUT_S, ge=1, le=MAX_TIMEOUT_S)
    #: The clients' environment. XRootD's defaults retry a connection for minutes
    #: (5 x 120 s); a benchmark wants an unreachable server to fail its step soon.
    environment: dict[str, str] = {"XRD_CONNECTIONWINDOW": "10", "XRD_CONNECTIONRETRY": "2"}

    @field_validator("environment")
    @classmethod
    def _environment(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if re.search(r"[\s\"'\\]", str(value)):
                raise ValueError(f"{key}: a value cannot contain blanks, quotes or backslashes")
        return v

    _check_sizes = field_validator("block_size", "stride", "max_bytes", mode="before")(
        lambda v: None if v is None else _size(v))

    @field_validator("block_size")
    @classmethod
    def _positive(cls, v: str) -> str:
        if parse_size(v) <= 0:
            raise ValueError("block_size must be > 0")
        return v

    def warm_argv(self) -> list[str]:
        """A warm-up read: the whole file once, nothing checked."""
        return ["--block-size", self.block_size, "--reference", "none",
                "--timeout", str(self.timeout_s)]

    def argv(self) -> list[str]:
        out = ["--block-size", self.block_size, "--stride", self.stride,
               "--samples", str(self.samples), "--timeout", str(self.timeout_s)]
        if self.duration_s is not None:
            out += ["--duration", str(self.duration_s)]
        if self.max_bytes is not None:
            out += ["--max-bytes", self.max_bytes]
        return out


SubmitValue = bool | int | float | str


def _extra_submit(v: dict[str, SubmitValue]) -> dict[str, SubmitValue]:
    for key, value in v.items():
        if not ATTRIBUTE.match(key):
            raise ValueError(f"{key!r} is not a ClassAd attribute name ([A-Za-z_][A-Za-z0-9_]*)")
        if key.lower() in RESERVED_ATTRIBUTES:
            raise ValueError(f"{key!r} is set by the campaign itself")
        if isinstance(value, str) and ("\n" in value or "\r" in value):
            raise ValueError(f"{key}: a value cannot contain a line break")
    return v


class Scenario(_Model):
    """One way of reading the files, measured at every client count."""

    name: str = Field(pattern=NAME_PATTERN)
    site: str = Field(pattern=SITE_PATTERN)
    #: ``local``: the campaign's direct local read, the reference report.md divides the
    #: other scenarios' throughput by; its URL may be a file:// URL (read by the XRootD
    #: client on the worker). Before `url`, so that url's check can see it.
    reference: Literal["local"] | None = None
    #: URL template; ``{file}`` is replaced by the file's name.
    url: str
    #: Commands run before each client-count step (switch the cache mode, flush it).
    setup: list[list[str]] = []
    #: Read every file once (not measured) before measuring.
    warm: bool = False
    #: More job attributes (``+Name = value``); strings are quoted as ClassAd strings.
    extra_submit: dict[str, SubmitValue] = {}
    #: Command printing the step's cache hit ratio (a number) after it ran.
    hit_ratio: list[str] | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, v: str, info: ValidationInfo) -> str:
        if "{file}" not in v:
            raise ValueError("the URL template must contain {file}")
        local = info.data.get("reference") == "local"
        if local and v.startswith("file://") and not v.startswith("file:///"):
            raise ValueError("a file:// URL template names an absolute path: file:///dir/{file}")
        if not v.startswith("root://") and not (local and v.startswith("file://")):
            raise ValueError("the URL template must be a root:// URL (a file:// URL only in "
                             "the scenario with reference: local)")
        if re.search(r"[\s\"'\\]", v):
            raise ValueError("the URL template cannot contain blanks, quotes or backslashes")
        rest = v.replace("{file}", "")
        if "{" in rest or "}" in rest:
            raise ValueError("the only placeholder of a URL template is {file}")
        return v

    _check_setup = field_validator("setup")(lambda v: [_argv(a) for a in v])
    _check_hit = field_validator("hit_ratio")(lambda v: None if v is None else _argv(v))
    _check_extra = field_validator("extra_submit")(_extra_submit)

    def url_of(self, name: str) -> str:
        return self.url.replace("{file}", name)


class Fio(_Model):
    """A fio campaign: one fio client per pilot (node), at each node count."""

    jobfile: str
    nodes: list[int] = Field(min_length=1)
    site: str = Field(pattern=SITE_PATTERN)
    #: Cores each fio job asks for: a site's whole pilot, so no two share a node.
    request_cpus: int = Field(default=4, ge=1)
    setup: list[list[str]] = []
    extra_submit: dict[str, SubmitValue] = {}

    _check_setup = field_validator("setup")(lambda v: [_argv(a) for a in v])
    _check_extra = field_validator("extra_submit")(_extra_submit)

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: list[int]) -> list[int]:
        if any(n < 1 for n in v) or len(set(v)) != len(v):
            raise ValueError("node counts must be distinct and >= 1")
        return v

    @property
    def scenario(self) -> str:
        """The result directory's scenario name: the job file's stem."""
        return re.sub(r"[^A-Za-z0-9._-]", "_", Path(self.jobfile).stem) or "fio"


class Campaign(_Model):
    name: str = Field(pattern=NAME_PATTERN)
    kind: Literal["read", "fio"] = "read"
    files: Files | None = None
    clients: list[int] = []
    reader: Reader = Reader()
    scenarios: list[Scenario] = []
    fio: Fio | None = None
    #: A step (setup, warm-up, measurement) that takes longer fails the campaign.
    step_timeout_s: float = Field(default=1800, gt=0)
    request_memory_mb: int = Field(default=500, ge=1)

    @field_validator("clients")
    @classmethod
    def _clients(cls, v: list[int]) -> list[int]:
        if any(n < 1 for n in v) or len(set(v)) != len(v):
            raise ValueError("client counts must be distinct and >= 1")
        return v

    @model_validator(mode="after")
    def _kind(self) -> Campaign:
        if self.kind == "read":
            missing = [f for f in ("files", "clients", "scenarios") if not getattr(self, f)]
            if missing:
                raise ValueError(f"a read campaign needs {', '.join(missing)}")
            names = [s.name for s in self.scenarios]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"scenario names must be unique: {', '.join(dup)}")
            refs = [s.name for s in self.scenarios if s.reference]
            if len(refs) > 1:
                raise ValueError(f"only one scenario can be the reference: {', '.join(refs)}")
        elif self.fio is None:
            raise ValueError("a fio campaign needs fio: {jobfile, nodes, site}")
        return self

    def reference(self) -> Scenario | None:
        """The scenario with ``reference: local``, if any."""
        return next((s for s in self.scenarios if s.reference), None)

    def scenario_names(self) -> list[str]:
        return [s.name for s in self.scenarios] if self.kind == "read" else [
            self.fio.scenario if self.fio else "fio"]

    def steps(self) -> list[tuple[str, list[int]]]:
        """The steps in the order they run: each scenario with its client (node) counts."""
        if self.kind == "fio" and self.fio:
            return [(self.fio.scenario, self.fio.nodes)]
        return [(s.name, self.clients) for s in self.scenarios]


def _line(root: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the node at `loc` (or of its deepest existing parent)."""
    node, line = root, None if root is None else root.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            hit = [v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part]
            if not hit:
                return line
            node = hit[0]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) \
                and part < len(node.value):
            node = node.value[part]
        else:
            return line
        line = node.start_mark.line + 1
    return line


def _field(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_campaign(text: str, source: str = "<string>") -> Campaign:
    """Validate YAML text; `source` names it in error messages."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise CampaignError(f"{source}{where}: malformed YAML: "
                            f"{getattr(exc, 'problem', None) or exc}") from exc
    if not isinstance(data, dict):
        raise CampaignError(f"{source}: the campaign must be a mapping (name, files, clients, "
                            "reader, scenarios)")
    try:
        return Campaign.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
            line = _line(root, loc)
            msg = err["msg"].removeprefix("Value error, ")
            value = "" if err["type"] == "missing" else f" (got {err.get('input')!r})"
            if isinstance(err.get("input"), dict | list):
                value = ""
            lines.append(f"{source}{f':{line}' if line else ''}: {_field(loc)}: {msg}{value}")
        raise CampaignError("\n".join(lines)) from exc


def resolve_jobfile(jobfile: str, campaign_file: str | os.PathLike[str]) -> Path:
    """A fio job file: absolute; else next to the campaign file; else in the repository."""
    path = Path(jobfile)
    if path.is_absolute():
        return path
    for base in (Path(campaign_file).resolve().parent, REPO_ROOT, Path.cwd()):
        if (base / path).is_file():
            return base / path
    return REPO_ROOT / path


def load_campaign(path: str | os.PathLike[str]) -> Campaign:
    """Read and validate the campaign at `path`; CampaignError on any problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CampaignError(f"{path}: cannot read the campaign: {exc.strerror or exc}") from exc
    campaign = parse_campaign(text, str(path))
    if campaign.fio is not None:
        jobfile = resolve_jobfile(campaign.fio.jobfile, path)
        if not jobfile.is_file():
            raise CampaignError(f"{path}: fio.jobfile: no such file {campaign.fio.jobfile!r} "
                                "(looked next to the campaign file and in the repository)")
    return campaign


def substitute(argv: list[str], values: dict[str, str]) -> list[str]:
    """Replace whole elements ``{key}`` by ``values[key]``; nothing else changes."""
    out = []
    for arg in argv:
        key = arg[1:-1] if arg.startswith("{") and arg.endswith("}") else None
        out.append(values[key] if key is not None and key in values else arg)
    return out


def classad_literal(value: SubmitValue) -> str:
    """A submit value as a ClassAd literal (strings quoted and escaped)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
