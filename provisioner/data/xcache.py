"""A site's XRootD cache, as jobs see it: the explicit URL prefix and the
environment that makes the cache transparent (the XRootD client proxy plugin).

Pure: no I/O. The pilot puts `proxy_environment()` into every job's environment;
`cache_url()` is what `provisioner xcache-url` prints.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The client plugin shipped with XRootD 5 (Debian: xrootd-client-plugins). A bare
#: name: the dynamic loader finds it where the distribution installed it.
PROXY_PLUGIN = "libXrdClProxyPlugin-5.so"

#: Always read directly: xrdcp opens its local destination as file://localhost,
#: which the plugin would otherwise send to the cache (which refuses it).
LOCAL_NAMES = ("localhost", "localhost.localdomain")

#: The variables the proxy plugin reads; a job that opts out loses all of them.
PROXY_VARIABLES = ("XRD_PLUGIN", "XROOT_PROXY", "XROOT_PROXY_EXCL_DOMAINS")

#: Submit attribute by which a job opts out: `+WantXCache = false`.
OPT_OUT_ATTRIBUTE = "WantXCache"


def host_of(url: str) -> str:
    """The host of a root:// URL, without port: "root://a.b:1094//x" -> "a.b"."""
    if not url.startswith("root://"):
        raise ValueError(f"not a root:// URL: {url!r}")
    hostport = url[len("root://"):].split("/", 1)[0]
    host = hostport.rsplit("@", 1)[-1].split(":", 1)[0]
    if not host:
        raise ValueError(f"no host in URL {url!r}")
    return host


def excluded_domains(cache: str, exclude: Iterable[str] = ()) -> list[str]:
    """Domains the plugin leaves alone (it matches them as suffixes of the host's
    canonical name): the cache itself (so an explicit $XCACHE URL is not prefixed
    twice), the site's own list, and localhost."""
    out: list[str] = []
    for name in (host_of(cache), *exclude, *LOCAL_NAMES):
        if name and name not in out:
            out.append(name)
    return out


def proxy_environment(cache: str, exclude: Iterable[str] = ()) -> dict[str, str]:
    """The job environment for a site whose cache is `cache` (root://host:port)."""
    prefix = cache.rstrip("/")
    return {
        "XCACHE": prefix,
        "XRD_PLUGIN": PROXY_PLUGIN,
        "XROOT_PROXY": prefix + "//",
        "XROOT_PROXY_EXCL_DOMAINS": ",".join(excluded_domains(prefix, exclude)),
    }


def cache_url(url: str, cache: str | None) -> str:
    """`url` read through `cache`: root://origin//path -> root://cache//root://origin//path.

    Idempotent (a URL already through this cache is returned as it is); a URL that
    is not root://, or a site without a cache, is returned unchanged."""
    if not cache or not url.startswith("root://"):
        return url
    prefix = cache.rstrip("/") + "//"
    if url.startswith(prefix):
        return url
    return prefix + url
