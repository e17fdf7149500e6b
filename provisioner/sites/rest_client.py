"""HTTP to one site's slurmrestd: the JWT headers, the API version both sides speak
(from the server's OpenAPI description), and every failure as a backend error that
names the site and what was wrong.

httpx, one connection pool per site; no client generated from one SLURM release's
OpenAPI description: the few fields the backend reads are read by name, and a
missing one is an error naming it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from provisioner.errors import BackendError, Transient, Unreachable
from provisioner.sites.rest_token import TokenFile
from provisioner.sites.slurm_refusals import classify_failure

log = logging.getLogger(__name__)
# httpx logs every request at INFO: a few lines a cycle per site that say nothing the
# cycle's own line does not; its warnings still come through.
logging.getLogger("httpx").setLevel(logging.WARNING)

#: The data_parser versions this backend speaks (their job, partition and node
#: records carry the fields it reads under the same names), oldest first.
SPOKEN_VERSIONS = ("v0.0.40", "v0.0.41", "v0.0.42")
#: HTTP statuses of a refused token: slurmrestd's own check (401), and the
#: controller's (511, Network Authentication Required: e.g. another user's token).
REFUSED = (401, 403, 511)
_PATH_VERSION = re.compile(r"^/slurm/(v[0-9]+\.[0-9]+\.[0-9]+)/")


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version[1:].split("."))


def server_versions(doc: Any) -> set[str]:
    """The API versions an OpenAPI description offers (its /slurm/vX.Y.Z/ paths)."""
    paths = doc.get("paths") if isinstance(doc, dict) else None
    if not isinstance(paths, dict):
        raise ValueError("no 'paths' in its OpenAPI description")
    return {m.group(1) for p in paths if (m := _PATH_VERSION.match(str(p)))}


def pick_version(offered: Iterable[str], wanted: str | None = None) -> str:
    """The newest version both sides speak, or `wanted` if the server offers it and
    this backend speaks it; ValueError saying what each side speaks otherwise."""
    offered = set(offered)
    shared = offered & set(SPOKEN_VERSIONS)
    spoken = ", ".join(SPOKEN_VERSIONS)
    have = ", ".join(sorted(offered, key=_key)) or "none"
    if wanted is not None:
        if wanted in shared:
            return wanted
        raise ValueError(f"api_version {wanted} is not spoken by both: slurmrestd offers "
                         f"{have}; this backend speaks {spoken}")
    if not shared:
        raise ValueError(f"no API version both speak: slurmrestd offers {have}; this "
                         f"backend speaks {spoken}")
    return max(shared, key=_key)


class RestError(BackendError):
    """A request that reached slurmrestd and was answered with SLURM's errors: `status`
    is the HTTP status, `text` SLURM's words ("error: description; ..."), `numbers`
    its error numbers."""


def reply_errors(doc: Any) -> tuple[str, list[int]]:
    """SLURM's words and error numbers in a reply's `errors` list."""
    words: list[str] = []
    numbers: list[int] = []
    for err in (doc.get("errors") or []) if isinstance(doc, dict) else []:
        if not isinstance(err, dict):
            continue
        said = dict.fromkeys(str(err[k]) for k in ("error", "description") if err.get(k))
        if said:
            words.append(": ".join(said))
        number = err.get("error_number")
        if isinstance(number, int) and not isinstance(number, bool) and number:
            numbers.append(number)
    return "; ".join(words), numbers


@dataclass
class RestReply:
    status: int
    doc: dict[str, Any]
    text: str  # SLURM's words from `errors` ("" if none)
    numbers: list[int]


@dataclass
class RestClient:
    """One site's slurmrestd (`where`: the config field of its URL, for errors)."""

    site: str
    url: str
    user: str
    token: TokenFile
    where: str
    api_version: str | None = None
    timeout_s: float = 30.0
    verify: str | bool = True
    transport: httpx.BaseTransport | None = None
    on_version: Callable[[str], None] | None = None
    _http: httpx.Client | None = field(default=None, init=False, repr=False)
    _version: str | None = field(default=None, init=False, repr=False)

    def _client(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(base_url=self.url.rstrip("/"), timeout=self.timeout_s,
                                      verify=self.verify, transport=self.transport,
                                      follow_redirects=False)
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def _fail(self, why: str) -> Unreachable:
        return Unreachable(f"site {self.site}: {self.where} {self.url}: {why}")

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self.token.token(),
                   "Accept": "application/json"}
        try:
            return self._client().request(method, path, headers=headers, **kwargs)
        except httpx.TimeoutException as exc:
            raise Transient(f"site {self.site}: {method} {path} timed out after "
                            f"{self.timeout_s:g} s: {exc}") from None
        except httpx.HTTPError as exc:
            raise self._fail(f"{method} {path}: {exc or type(exc).__name__}") from None

    def _json(self, method: str, path: str, response: httpx.Response) -> dict[str, Any]:
        kind = response.headers.get("content-type", "").split(";")[0].strip() or "no type"
        try:
            doc = response.json()
        except ValueError:
            body = response.text[:80].replace("\n", " ")
            raise self._fail(f"{method} {path} answered HTTP {response.status_code} with "
                             f"{kind}, not JSON ({body!r}): is this slurmrestd?") from None
        if not isinstance(doc, dict):
            raise self._fail(f"{method} {path} answered a JSON {type(doc).__name__}, not "
                             f"an object: is this slurmrestd?")
        return doc

    def version(self) -> str:
        """The API version used: negotiated once from GET /openapi/v3."""
        if self._version is None:
            response = self._send("GET", "/openapi/v3")
            if response.status_code in REFUSED:
                raise self._refused(response, "GET /openapi/v3")
            if response.status_code != 200:
                raise self._fail(f"GET /openapi/v3 answered HTTP {response.status_code}: "
                                 f"is this slurmrestd?")
            doc = self._json("GET", "/openapi/v3", response)
            try:
                self._version = pick_version(server_versions(doc), self.api_version)
            except ValueError as exc:
                raise self._fail(str(exc)) from None
            log.info("site %s: slurmrestd API %s", self.site, self._version)
            if self.on_version:
                self.on_version(self._version)
        return self._version

    def _refused(self, response: httpx.Response, what: str) -> Unreachable:
        exp = self.token.expires_at()
        return Unreachable(
            f"site {self.site}: slurmrestd refused the token of {self.user} from "
            f"{self.token.what} {self.token.path} (HTTP {response.status_code} to {what})"
            + (f"; it expires at epoch {exp:.0f}" if exp is not None else ""))

    def call(self, method: str, path: str, *, ok: Iterable[int] = (200,),
             json: Mapping[str, Any] | None = None,
             params: Mapping[str, str] | None = None) -> RestReply:
        """`method` on /slurm/<version>/`path`; the reply when its status is in `ok`
        or when it carries SLURM's own errors (the caller classifies them). An answer
        that is not slurmrestd's, a refused token, a server error without SLURM's
        words: Unreachable; a timeout or a 503: Transient."""
        full = f"/slurm/{self.version()}/{path.lstrip('/')}"
        response = self._send(method, full, json=json, params=params)
        if response.status_code in REFUSED:
            raise self._refused(response, f"{method} {full}")
        if response.status_code == 404 and "json" not in response.headers.get(
                "content-type", ""):
            self._version = None  # the server changed: ask again next time
            raise self._fail(f"{method} {full}: HTTP 404, no such path")
        doc = self._json(method, full, response)
        text, numbers = reply_errors(doc)
        if response.status_code in set(ok) or text:
            return RestReply(response.status_code, doc, text, numbers)
        message = (f"site {self.site}: {method} {full} answered HTTP {response.status_code} "
                   f"without SLURM's words")
        if response.status_code in (502, 503, 504):
            raise Transient(message)
        raise classify_failure(message, message) if response.status_code < 500 \
            else Unreachable(message)
