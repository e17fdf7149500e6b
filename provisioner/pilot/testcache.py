"""A passed container start-up test, remembered per node.

The nested ``apptainer exec`` of the start-up test (provisioner.pilot.containers) costs
seconds of every pilot's boot, and pilots restart often on the same nodes. When it
passes, the pilot records that in ``<scratch>/.pilot-cache/container-test-<host>.json``
(the pilot account's own: directory 0700, file 0600, written atomically; one file per
host, so that nodes whose scratch is shared do not overwrite each other's record);
the next pilot on that node skips the test while the record is younger than the site's
``runtime.container_test_cache_s`` and its key still matches exactly: the host name,
the test and pilot images (path, size, mtime), the kernel release and the test's argv.

A failed test is never recorded, so a node that gets fixed recovers at the next
pilot. A record that cannot be read, does not parse, has another key, or sits in a
file or directory that is not the pilot account's own or that others may write, is
ignored: the test runs (and a pass overwrites it). Payloads never see the scratch
directory (the job wrapper covers it), so they cannot plant a record.

A test image that is a directory (a sandbox) is keyed by the directory's own size and
mtime only: a change inside it is noticed when the TTL ends.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import stat
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeGuard

from provisioner.pilot.containers import ContainerSupport

log = logging.getLogger("provisioner.pilot")

CACHE_DIR = ".pilot-cache"
CACHE_FILE = "container-test-{host}.json"
#: The default TTL (runtime.container_test_cache_s; the pilot's default for batch
#: scripts that do not pass one).
DEFAULT_TTL_S = 21600
#: The record's layout; part of the key, so a record of another layout is ignored.
FORMAT = 1
#: A record is small; anything larger is not one.
MAX_BYTES = 64 * 1024


def cache_file(scratch: Path, hostname: str | None = None) -> Path:
    """Where this node's record lives under the scratch base `scratch`."""
    host = socket.gethostname() if hostname is None else hostname
    safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in host) or "node"
    return scratch / CACHE_DIR / CACHE_FILE.format(host=safe)


def _file_key(path: str) -> dict[str, Any]:
    st = os.stat(path)
    return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def node_key(test_image: str, pilot_image: str, argv: list[str],
             hostname: str | None = None, kernel: str | None = None) -> dict[str, Any]:
    """What a record must match to stand for a test on this node now. OSError when an
    image cannot be looked at (then nothing is cached)."""
    return {
        "format": FORMAT,
        "hostname": socket.gethostname() if hostname is None else hostname,
        "kernel": os.uname().release if kernel is None else kernel,
        "test_image": _file_key(test_image),
        "pilot_image": _file_key(pilot_image),
        "argv": list(argv),
    }


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float)


def valid(record: dict[str, Any] | None, key: dict[str, Any], now: float,
          ttl_s: int) -> bool:
    """True if `record` stands for a passed test under `key` less than `ttl_s` ago
    (``ttl_s`` 0 or less: never; nor a record from the future: the clock went back)."""
    if not isinstance(record, dict) or record.get("key") != key:
        return False
    passed_at, seconds = record.get("passed_at"), record.get("seconds")
    if not (_number(passed_at) and _number(seconds)):
        return False
    return 0 <= now - passed_at < ttl_s


def lookup(record: dict[str, Any] | None, key: dict[str, Any], now: float, ttl_s: int,
           image: str) -> ContainerSupport | None:
    """The outcome of the cached test of `image`, or None: the test must run."""
    if record is None or not valid(record, key, now, ttl_s):
        return None
    age = now - record["passed_at"]
    return ContainerSupport(ok=True, detail=(
        f"apptainer exec of {image}: passed {age:.0f} s ago on this node "
        f"(cached; took {record['seconds']:.1f} s)"))


def new_record(key: dict[str, Any], passed_at: float, seconds: float) -> dict[str, Any]:
    return {"key": key, "passed_at": passed_at, "seconds": seconds}


def _own(st: os.stat_result, uid: int) -> bool:
    """Owned by `uid`, and neither group- nor world-writable."""
    return st.st_uid == uid and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def read_record(path: Path, uid: int | None = None) -> dict[str, Any] | None:
    """The record at `path`, or None: missing, unreadable, not JSON, not an object,
    or not trustworthy (the file or its directory is not `uid`'s own — the current
    uid by default — or others may write it; a symbolic link; not a regular file)."""
    uid = os.getuid() if uid is None else uid
    try:
        dir_st = os.lstat(path.parent)
    except OSError:
        return None
    if not stat.S_ISDIR(dir_st.st_mode) or not _own(dir_st, uid):
        log.info("container test cache ignored: %s is not the pilot account's own "
                 "directory", path.parent)
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.info("container test cache ignored: %s", exc)
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or not _own(st, uid):
            log.info("container test cache ignored: %s is not the pilot account's own "
                     "file, or others may write it", path)
            return None
        try:
            data = f.read(MAX_BYTES + 1)
        except OSError as exc:
            log.info("container test cache ignored: %s", exc)
            return None
    if len(data) > MAX_BYTES:
        return None
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        log.info("container test cache ignored: %s is not JSON", path)
        return None
    return record if isinstance(record, dict) else None


def write_record(path: Path, record: dict[str, Any], uid: int | None = None) -> None:
    """Write `record` to `path` atomically (a temporary file, then os.replace), the file
    0600 in a directory made 0700. OSError (PermissionError if the directory is not
    `uid`'s own) when it cannot."""
    uid = os.getuid() if uid is None else uid
    directory = path.parent
    with suppress(FileExistsError):
        directory.mkdir(mode=0o700)  # and chmod below: the umask may have taken bits
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        raise PermissionError(f"{directory} is not the pilot account's own directory")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(directory, 0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)
            json.dump(record, f, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


# --- the starter's capability answer ------------------------------------------------
# At start-up the startd asks its starter what this node can run (``condor_starter
# -classad``); with Apptainer configured the starter answers only after running two
# nested containers of its own (seconds of every boot). The answer depends on the node
# and the images (the key above) and on the pilot's HTCondor configuration, so it is
# kept in the node's record beside the pass, under a digest of that configuration, and
# the next pilot's STARTER (provisioner/pilot/files/starter.sh) gives it to the startd
# instead of asking again. Only an answer that says containers work is kept.

#: One line of the starter's answer: an attribute and its value.
_AD_LINE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]* = \S.*")
#: An answer that says the node runs containers (the test passed, so it must).
_CONTAINERS_WORK = "HasSingularity = True"


def config_digest(*parts: str) -> str:
    """What shapes the starter's answer besides the key: the pilot's HTCondor
    configuration (without the lines of one pilot) and its container settings."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def starter_classad_ok(text: str) -> bool:
    """Whether `text` is a starter answer worth keeping: a few KB of ``Name = value``
    lines (the startd refuses the whole answer on one bad line) that say containers
    work."""
    lines = [line for line in text.splitlines() if line.strip()]
    return (0 < len(text) <= MAX_BYTES // 2 and all(_AD_LINE.fullmatch(line) for line in lines)
            and _CONTAINERS_WORK in lines)


def cached_starter_classad(record: dict[str, Any] | None, key: dict[str, Any], now: float,
                           ttl_s: int, digest: str) -> str | None:
    """The starter's answer kept in `record` for `key` and configuration `digest`, or
    None: the starter must be asked."""
    if record is None or not valid(record, key, now, ttl_s):
        return None
    starter = record.get("starter")
    if not isinstance(starter, dict) or starter.get("config") != digest:
        return None
    text = starter.get("classad")
    return text if isinstance(text, str) and starter_classad_ok(text) else None


def with_starter_classad(record: dict[str, Any], digest: str, text: str) -> dict[str, Any]:
    """`record` with the starter's answer `text` under configuration `digest`."""
    return {**record, "starter": {"config": digest, "classad": text}}
