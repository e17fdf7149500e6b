#!/usr/bin/env python3
"""`provisioner bench read`: the generic reader of the cache studies.

Reads a file over XRootD (root://, or file:// for a local file, which the XRootD
client reads itself) in blocks (default 8 MiB) with a stride: block k starts
at k x (block size + stride), so stride 0 is a sequential read, and no block is
read twice. Stops at the end of the file, after `duration_s` or `max_bytes`.
Records per wall-clock second how many blocks and bytes arrived. Then checks
what it read: the whole file against a SHA-256 if one is given, and a sample of
the blocks against a reference copy (by default the origin URL inside a cache
URL, root://cache//root://origin//path; none for a file:// URL): a cache that
serves wrong bytes fails. Every open, stat, read and close waits at most
`--timeout` seconds (default 120; XRootD's own default is 1800): a server that
stops answering fails the run, naming the URL and the offset, instead of
holding it (and its batch slot) for half an hour. A read that stalls so is tried
once more on the file opened again, and a line on stdout says so
(`bench read: warning: ...`; campaign reports list these); a second stall fails.

The schedule, the per-second records and the comparison are pure; `read_url`
does the I/O through a small `Opener` (the XRootD Python bindings in service).
The module needs nothing but the standard library and those bindings, so a
benchmark job can ship it as its executable: `python3 benchread.py URL...`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import os
import random
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

MIB = 1 << 20
#: Seconds an XRootD request may go unanswered (the client checks every 15 s).
DEFAULT_TIMEOUT_S = 120
MAX_TIMEOUT_S = 65535  # XRootD's request timeout is 16 bits
_SIZE = re.compile(r"^([0-9]+)([KMGT]?)(i?B)?$", re.IGNORECASE)
_FACTORS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class ReadError(Exception):
    """A read that failed or returned wrong bytes; the message names URL and offset."""


class Stalled(ReadError):
    """A request the server did not answer within the timeout."""


#: How the reader starts a line about a stall it recovered from (on stdout); campaign
#: reports list these lines.
WARNING = "bench read: warning: "


def parse_size(text: str) -> int:
    """ "8M", "8MiB", "512k", "1048576" -> bytes (powers of 1024)."""
    m = _SIZE.match(text.strip())
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 8M, 512K, 1G, 1048576)")
    return int(m.group(1)) * _FACTORS[m.group(2).upper()]


def offsets(size: int, block: int, stride: int = 0) -> Iterator[int]:
    """Start of each block: k x (block + stride) for k = 0, 1, ... while inside the file."""
    if block <= 0 or stride < 0:
        raise ValueError(f"block size must be > 0 and stride >= 0 (got {block}, {stride})")
    step = block + stride
    offset = 0
    while offset < size:
        yield offset
        offset += step


def origin_of(url: str) -> str | None:
    """The origin URL inside a cache URL (root://cache//root://origin//path), else None
    (also for a file:// URL, even one whose path holds a root:// URL)."""
    if not url.startswith("root://"):
        return None
    rest = url[len("root://"):]
    _, sep, path = rest.partition("//")
    inner = path if sep else ""
    return inner if inner.startswith("root://") else None


@dataclass
class PerSecond:
    """Blocks and bytes per wall-clock second (integer Unix seconds)."""

    blocks: dict[int, int] = field(default_factory=dict)
    nbytes: dict[int, int] = field(default_factory=dict)

    def add(self, at: float, nbytes: int) -> None:
        second = int(at)
        self.blocks[second] = self.blocks.get(second, 0) + 1
        self.nbytes[second] = self.nbytes.get(second, 0) + nbytes

    def rows(self) -> list[tuple[int, int, int]]:
        """(second, blocks, bytes), every second from the first to the last (0 if idle)."""
        if not self.blocks:
            return []
        first, last = min(self.blocks), max(self.blocks)
        return [(s, self.blocks.get(s, 0), self.nbytes.get(s, 0)) for s in range(first, last + 1)]


class RemoteFile(Protocol):
    size: int

    def read(self, offset: int, length: int) -> bytes: ...

    def close(self) -> None: ...


Opener = Callable[[str], RemoteFile]


@dataclass
class ReadResult:
    url: str
    size: int
    blocks: int
    nbytes: int
    started: float
    ended: float
    per_second: PerSecond
    whole_file: bool
    verified: list[str] = field(default_factory=list)

    @property
    def rate_mib_s(self) -> float:
        return self.nbytes / MIB / max(self.ended - self.started, 1e-9)


def read_url(url: str, open_file: Opener, block: int = 8 * MIB, stride: int = 0,
             duration_s: float | None = None, max_bytes: int | None = None,
             sha256: str | None = None, reference: str | None = None, samples: int = 4,
             clock: Callable[[], float] = time.time) -> ReadResult:
    """Read `url` as described above; raises ReadError on a failed read or wrong bytes."""
    f = open_file(url)
    digest = hashlib.sha256()
    read_at: list[int] = []
    records = PerSecond()
    started = clock()
    total = 0
    try:
        for offset in offsets(f.size, block, stride):
            if duration_s is not None and clock() - started >= duration_s:
                break
            length = min(block, f.size - offset)
            if max_bytes is not None:
                length = min(length, max_bytes - total)
                if length <= 0:
                    break
            data = f.read(offset, length)
            if len(data) != length:
                raise ReadError(f"{url}: short read at offset {offset}: {len(data)} of "
                                f"{length} bytes")
            records.add(clock(), len(data))
            digest.update(data)
            read_at.append(offset)
            total += len(data)
    finally:
        f.close()
    result = ReadResult(url, f.size, len(read_at), total, started, clock(), records,
                        whole_file=stride == 0 and total == f.size)
    if sha256:
        if not result.whole_file:
            raise ReadError(f"{url}: --sha256 needs a whole-file read (stride 0, no limit); "
                            f"read {total} of {f.size} bytes")
        if digest.hexdigest() != sha256.lower():
            raise ReadError(f"{url}: wrong bytes: SHA-256 {digest.hexdigest()}, "
                            f"expected {sha256.lower()}")
        result.verified.append("sha256")
    if reference and read_at:
        compare_sample(url, reference, open_file, read_at, block, samples, f.size)
        result.verified.append(f"{min(samples, len(read_at))} blocks vs {reference}")
    return result


def compare_sample(url: str, reference: str, open_file: Opener, read_at: Sequence[int],
                   block: int, samples: int, size: int, seed: int = 0) -> None:
    """Re-read a sample of the blocks from `url` and `reference`; raise on a difference.

    The first and the last block are always in the sample (a cache that truncates or
    pads shows there), the rest drawn at random."""
    chosen = {read_at[0], read_at[-1]}
    rest = [o for o in read_at if o not in chosen]
    chosen.update(random.Random(seed).sample(rest, min(len(rest), max(samples - 2, 0))))
    a, b = open_file(url), open_file(reference)
    try:
        if a.size != b.size:
            raise ReadError(f"{url}: size {a.size} differs from the reference {reference} "
                            f"({b.size})")
        for offset in sorted(chosen):
            length = min(block, size - offset)
            got, want = a.read(offset, length), b.read(offset, length)
            if got != want:
                raise ReadError(f"{url}: wrong bytes in the block at offset {offset} "
                                f"(differs from {reference})")
    finally:
        a.close()
        b.close()


class RetryOnce:
    """A file whose read, if it stalls, is tried once more on the file opened again (a
    new request, often on a new connection), and `warn` says so; a second stall, or any
    other error, fails. Once per file: a server that keeps stalling fails the run."""

    def __init__(self, url: str, open_file: Opener, warn: Callable[[str], None]) -> None:
        self.url = url
        self._open = open_file
        self._warn = warn
        self._f = open_file(url)
        self.size = self._f.size
        self.retried = False

    def read(self, offset: int, length: int) -> bytes:
        try:
            return self._f.read(offset, length)
        except Stalled as exc:
            if self.retried:
                raise
            self.retried = True
            self._warn(f"{exc}; opened the file again and read the block again")
            with contextlib.suppress(ReadError):
                self._f.close()
            self._f = self._open(self.url)
            return self._f.read(offset, length)

    def close(self) -> None:
        self._f.close()


def warn(message: str) -> None:
    print(WARNING + message, flush=True)


class XRootDFile:
    """A file opened with the XRootD Python bindings (python3-xrootd): root:// URLs, and
    file:///path, which the client opens on the local file system."""

    def __init__(self, url: str, timeout: int = DEFAULT_TIMEOUT_S) -> None:
        try:
            from XRootD import client
            from XRootD.client.flags import OpenFlags
        except ImportError as exc:
            raise ReadError("the XRootD Python bindings are not installed "
                            "(Debian: python3-xrootd; PyPI: xrootd)") from exc
        self.url = url
        self.timeout = timeout
        self._f = client.File()
        status, _ = self._f.open(url, OpenFlags.READ, timeout=timeout)
        if not status.ok:
            raise ReadError(f"{url}: cannot open: {self._why(status)}")
        status, info = self._f.stat(timeout=timeout)
        if not status.ok:
            raise ReadError(f"{url}: cannot stat: {self._why(status)}")
        self.size = int(info.size)

    @staticmethod
    def _expired(status: object) -> bool:
        """XRootD's words for a request it gave up waiting for."""
        return "expired" in str(getattr(status, "message", "")).lower()

    def _why(self, status: object) -> str:
        message = str(getattr(status, "message", status)).strip()
        if self._expired(status):
            message += f" (no answer within --timeout {self.timeout} s)"
        return message

    def read(self, offset: int, length: int) -> bytes:
        status, data = self._f.read(offset, length, timeout=self.timeout)
        if not status.ok:
            error = Stalled if self._expired(status) else ReadError
            raise error(f"{self.url}: read at offset {offset} failed: {self._why(status)}")
        return bytes(data)

    def close(self) -> None:
        self._f.close(timeout=self.timeout)



def main(argv: list[str] | None = None) -> int:
    """`provisioner bench read` / `python3 benchread.py`: exit 1 on a failed read or
    wrong bytes, naming the URL and the offset; 2 on bad arguments."""
    parser = argparse.ArgumentParser(prog="provisioner bench read", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("urls", nargs="+", metavar="URL")
    parser.add_argument("--block-size", default="8M", help="default 8M")
    parser.add_argument("--stride", default="0", help="gap between blocks (0: sequential)")
    parser.add_argument("--duration", type=float, default=None, help="stop after S seconds")
    parser.add_argument("--max-bytes", default=None, help="stop after this many bytes")
    parser.add_argument("--sha256", default=None, help="expected SHA-256 of the whole file")
    parser.add_argument("--reference", default="auto",
                        help="URL to compare a sample of blocks with; 'auto' (default): the "
                             "origin inside a cache URL; 'none': no comparison")
    parser.add_argument("--samples", type=int, default=4, help="blocks compared (default 4)")
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help="seconds an open, stat, read or close may go unanswered "
                             f"(default {DEFAULT_TIMEOUT_S}; XRootD checks every 15 s)")
    parser.add_argument("--csv", default=None,
                        help="per-second records: url,second,blocks,bytes,start,end (start "
                             "and end: the URL's read, Unix time to the ms)")
    args = parser.parse_args(argv)
    try:
        block, stride = parse_size(args.block_size), parse_size(args.stride)
        max_bytes = parse_size(args.max_bytes) if args.max_bytes else None
    except ValueError as exc:
        parser.error(str(exc))
    if not 1 <= args.timeout <= MAX_TIMEOUT_S:
        parser.error(f"--timeout must be 1..{MAX_TIMEOUT_S} seconds (got {args.timeout})")
    timeout = args.timeout

    def open_file(url: str) -> RemoteFile:
        return RetryOnce(url, lambda u: XRootDFile(u, timeout), warn)

    rows: list[list[object]] = []
    try:
        for url in args.urls:
            reference = (origin_of(url) if args.reference == "auto" else
                         None if args.reference == "none" else args.reference)
            r = read_url(url, open_file, block, stride, args.duration, max_bytes,
                         args.sha256, reference, args.samples)
            rows.extend([url, *row, f"{r.started:.3f}", f"{r.ended:.3f}"]
                        for row in r.per_second.rows())
            checked = "checked: " + ", ".join(r.verified) if r.verified else "not checked"
            print(f"{url}: {r.nbytes} bytes in {r.blocks} blocks, "
                  f"{r.ended - r.started:.2f} s, {r.rate_mib_s:.1f} MiB/s; {checked}",
                  flush=True)
    except ReadError as exc:
        print(f"bench read: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["url", "second", "blocks", "bytes", "start", "end"])
                writer.writerows(rows)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # As a job's executable: end here, without the XRootD bindings' exit-time
    # finalizer (stopping the client's threads), which has been reported to hang
    # processes at exit; every file was closed above.
    os._exit(code)
