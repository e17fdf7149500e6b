"""The read benchmark's schedule, per-second records and byte checks (in-memory files),
and its command line on a local file:// URL (the XRootD client itself reads one in
tests/integration/test_benchread_local.py)."""

from __future__ import annotations

import csv
import hashlib
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.data import benchread
from provisioner.data.benchread import (
    PerSecond,
    ReadError,
    RetryOnce,
    Stalled,
    main,
    offsets,
    origin_of,
    parse_size,
    read_url,
)


@dataclass
class MemFile:
    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)

    def read(self, offset: int, length: int) -> bytes:
        return self.data[offset:offset + length]

    def close(self) -> None:
        pass


class Store:
    """URL -> bytes; opening an unknown URL fails like a missing file."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def __call__(self, url: str) -> MemFile:
        if url not in self.files:
            raise ReadError(f"{url}: cannot open: no such file")
        return MemFile(self.files[url])


class Clock:
    def __init__(self, step: float = 0.25) -> None:
        self.t, self.step = 1000.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


@given(st.integers(0, 10_000), st.integers(1, 700), st.integers(0, 700))
def test_blocks_never_overlap_and_follow_the_stride(size: int, block: int, stride: int) -> None:
    starts = list(offsets(size, block, stride))
    assert all(b - a == block + stride for a, b in itertools.pairwise(starts))
    assert all(0 <= o < size for o in starts)
    assert (not starts) == (size == 0)
    if starts:
        assert starts[-1] + block + stride >= size


def test_bad_block_size() -> None:
    with pytest.raises(ValueError, match="block size"):
        list(offsets(10, 0))


@pytest.mark.parametrize(("text", "value"), [("8M", 8 << 20), ("8MiB", 8 << 20),
                                             ("512k", 512 << 10), ("1048576", 1 << 20)])
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_parse_size_names_the_value() -> None:
    with pytest.raises(ValueError, match="'eight'"):
        parse_size("eight")


def test_origin_inside_a_cache_url() -> None:
    assert origin_of("root://cache:1094//root://origin:1094//data/f") == \
        "root://origin:1094//data/f"
    assert origin_of("root://origin:1094//data/f") is None
    assert origin_of("file:///srv/xcache/data/f") is None
    assert origin_of("file:///srv/xcache/root://origin:1094//data/f") is None


def test_per_second_rows_fill_idle_seconds() -> None:
    rec = PerSecond()
    rec.add(10.2, 5)
    rec.add(10.9, 5)
    rec.add(12.1, 7)
    assert rec.rows() == [(10, 2, 10), (11, 0, 0), (12, 1, 7)]


DATA = bytes(range(256)) * 40  # 10240 bytes
URL = "root://cache//root://origin//data/f"
ORIGIN = "root://origin//data/f"


def test_whole_file_read_is_checked_by_sha256_and_sample() -> None:
    store = Store({URL: DATA, ORIGIN: DATA})
    r = read_url(URL, store, block=1000, sha256=hashlib.sha256(DATA).hexdigest(),
                 reference=ORIGIN, clock=Clock())
    assert (r.nbytes, r.blocks, r.whole_file) == (len(DATA), 11, True)
    assert sum(b for _, _, b in r.per_second.rows()) == len(DATA)
    assert r.verified[0] == "sha256"


def test_wrong_bytes_from_the_cache_fail_loudly() -> None:
    bad = bytearray(DATA)
    bad[-1] ^= 0xFF  # the last block: always in the sample
    store = Store({URL: bytes(bad), ORIGIN: DATA})
    with pytest.raises(ReadError, match=r"wrong bytes in the block at offset 10000"):
        read_url(URL, store, block=1000, reference=ORIGIN, clock=Clock())
    with pytest.raises(ReadError, match="SHA-256"):
        read_url(URL, store, block=1000, sha256=hashlib.sha256(DATA).hexdigest(),
                 clock=Clock())


def test_truncated_copy_fails() -> None:
    store = Store({URL: DATA[:5000], ORIGIN: DATA})
    with pytest.raises(ReadError, match="size 5000 differs"):
        read_url(URL, store, block=1000, reference=ORIGIN, clock=Clock())


def test_limits_and_stride() -> None:
    store = Store({URL: DATA})
    r = read_url(URL, store, block=1000, stride=1000, clock=Clock())
    assert r.blocks == 6 and r.nbytes == 5240 and not r.whole_file
    r = read_url(URL, store, block=1000, max_bytes=2500, clock=Clock())
    assert r.nbytes == 2500
    r = read_url(URL, store, block=1000, duration_s=1.0, clock=Clock(step=0.25))
    assert 0 < r.blocks < 11
    with pytest.raises(ReadError, match="whole-file read"):
        read_url(URL, store, block=1000, max_bytes=10, sha256="00", clock=Clock())


def test_unreachable_reference_is_an_error() -> None:
    with pytest.raises(ReadError, match="no such file"):
        read_url(URL, Store({URL: DATA}), block=1000, reference=ORIGIN, clock=Clock())


# -- a local file:// URL, as a campaign's direct local reference reads it -------------------

class LocalFile:
    """file:///path opened with Python's own I/O: stands in for the XRootD client where
    its bindings are not installed, to check what `main` does with such a URL."""

    def __init__(self, url: str, timeout: int = 0) -> None:
        assert url.startswith("file:///"), url
        self._f = open(url.removeprefix("file://"), "rb")  # noqa: SIM115
        self.size = os.fstat(self._f.fileno()).st_size

    def read(self, offset: int, length: int) -> bytes:
        self._f.seek(offset)
        return self._f.read(length)

    def close(self) -> None:
        self._f.close()


def local_copy(tmp_path: Path) -> tuple[str, str]:
    data = os.urandom(3 * 1024 * 1024 + 123)
    path = tmp_path / "camp-0"
    path.write_bytes(data)
    return f"file://{path}", hashlib.sha256(data).hexdigest()


def check_main_on_a_local_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, digest = local_copy(tmp_path)
    out = tmp_path / "reads.csv"
    assert main([url, "--block-size", "1M", "--sha256", digest, "--csv", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{url}: {3 * 1024 * 1024 + 123} bytes in 4 blocks" in printed
    assert "checked: sha256" in printed and " vs " not in printed  # no origin to compare
    rows = list(csv.DictReader(out.open()))
    assert sum(int(r["bytes"]) for r in rows) == 3 * 1024 * 1024 + 123
    assert {r["url"] for r in rows} == {url}
    start, end = {(float(r["start"]), float(r["end"])) for r in rows}.pop()  # one per URL
    assert 0 <= end - start < 60 and int(start) <= int(rows[0]["second"]) <= int(end)
    assert main([url, "--block-size", "1M", "--sha256", "0" * 64]) == 1
    assert "wrong bytes: SHA-256" in capsys.readouterr().err


def test_main_reads_and_checks_a_local_file_url(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchread, "XRootDFile", LocalFile)
    check_main_on_a_local_url(tmp_path, capsys)


@pytest.mark.parametrize("value", ["0", "-5", "70000"])
def test_a_timeout_outside_xrootd_s_range_is_refused(value: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["root://cache//root://origin//f", "--timeout", value])
    assert exc.value.code == 2
    assert f"--timeout must be 1..65535 seconds (got {value})" in capsys.readouterr().err


class StallingStore(Store):
    """Like Store, but the reads listed in `stalls` (open number, offset) stall."""

    def __init__(self, files: dict[str, bytes], stalls: set[tuple[int, int]],
                 error: type[ReadError] = Stalled) -> None:
        super().__init__(files)
        self.stalls, self.error, self.opens = stalls, error, 0

    def __call__(self, url: str) -> MemFile:
        f = super().__call__(url)
        self.opens += 1
        opened, store = self.opens, self

        class Stalling(MemFile):
            def read(self, offset: int, length: int) -> bytes:
                if (opened, offset) in store.stalls:
                    raise store.error(f"{url}: read at offset {offset} failed: expired")
                return super().read(offset, length)

        return Stalling(f.data)


def test_a_stalled_read_is_read_again_once_on_the_file_opened_again() -> None:
    data = os.urandom(5000)
    store = StallingStore({"root://c//f": data}, {(1, 2000)})
    warnings: list[str] = []
    result = read_url("root://c//f", lambda u: RetryOnce(u, store, warnings.append),
                      block=1000, sha256=hashlib.sha256(data).hexdigest())
    assert result.nbytes == 5000 and result.verified == ["sha256"]
    assert store.opens == 2
    assert warnings == ["root://c//f: read at offset 2000 failed: expired; opened the file "
                        "again and read the block again"]


def test_a_second_stall_or_another_error_fails() -> None:
    data = os.urandom(5000)
    again = StallingStore({"root://c//f": data}, {(1, 1000), (2, 3000)})
    with pytest.raises(Stalled, match="offset 3000"):
        read_url("root://c//f", lambda u: RetryOnce(u, again, print), block=1000)
    other = StallingStore({"root://c//f": data}, {(1, 1000)}, error=ReadError)
    with pytest.raises(ReadError, match="offset 1000"):
        read_url("root://c//f", lambda u: RetryOnce(u, other, print), block=1000)
    assert other.opens == 1
