"""The Frankfurt cache host in each cache mode of the campaigns
(deploy/testbed/inside/cache-mode): a job on a Frankfurt pilot reads a file three
times and gets the right bytes every time, and the reads go where the mode says:
the origin (no-cache), the cache (xcache), the cached copy on the site's shared
file system once the cache holds it (xcache-dca, dcotf)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run
from test_loop import ALICE, submit_script
from test_testbed import _origin_opens, _sha256
from test_xcache import AT_FRANKFURT, DATA, prov, run_jobs  # noqa: F401 (fixture)

from provisioner.service.loop import Provisioner

CACHE_MODE = "/src/deploy/testbed/inside/cache-mode"
# Three reads; for each: its checksum and where the client was sent.
READ_THRICE = """
for i in 1 2 3; do
    xrdcp -f -d 2 "$URL" "$_CONDOR_SCRATCH_DIR/copy" 2>"$_CONDOR_SCRATCH_DIR/log" || {
        tail -n 5 "$_CONDOR_SCRATCH_DIR/log" >&2; exit 1; }
    where=remote
    # The source (a root:// URL) opened as a local file: sent to the shared copy.
    grep -Eq '@root://[^ ]* successfully opened at localhost' "$_CONDOR_SCRATCH_DIR/log" \
        && where=local
    echo "read$i=$(sha256sum "$_CONDOR_SCRATCH_DIR/copy" | cut -d' ' -f1) $where"
    sleep 1
done
"""


@pytest.fixture
def cache_mode() -> Iterator[None]:
    yield
    run(["sudo", "-n", CACHE_MODE, "xcache"], user="alice", timeout=120)


@pytest.mark.parametrize("mode", ["no-cache", "xcache", "xcache-dca", "dcotf"])
def test_each_cache_mode_serves_correct_bytes(mode: str, prov: Provisioner,  # noqa: F811
                                              cache_mode: None) -> None:
    # alice switches the mode as a campaign does: this one command through sudo.
    out = run(["sudo", "-n", CACHE_MODE, mode], user="alice", timeout=120).stdout
    assert f"fra-cache: {mode}" in out
    name = f"cm-{uuid.uuid4().hex}.dat"
    path = DATA / name
    path.write_bytes(uuid.uuid4().bytes * (1 << 16))  # 1 MiB
    digest = _sha256(path)
    try:
        origin = f"root://gsi-storage:1094//data/{name}"
        url, extra = {
            "no-cache": (origin, "+WantXCache = false\n"),
            "xcache": (origin, ""),  # transparent: the proxy plugin sends it to the cache
            "xcache-dca": (origin, ""),
            "dcotf": (f"root://fra-cache:1094//data/{name}", ""),
        }[mode]
        cluster = submit_script(f"mode-{mode}", f"URL='{url}'\n" + READ_THRICE, 1,
                                AT_FRANKFURT + extra)
        run_jobs(prov, cluster)
        text = (ALICE / "out" / f"mode-{mode}" / "0.out").read_text()
        err = (ALICE / "out" / f"mode-{mode}" / "0.err").read_text()
        reads = dict(line.split("=", 1) for line in text.splitlines() if line.startswith("read"))
        assert len(reads) == 3, (text, err)
        assert all(v.split()[0] == digest for v in reads.values()), (text, err)
        where = [reads[f"read{i}"].split()[1] for i in (1, 2, 3)]
        if mode == "no-cache":
            assert _origin_opens(name) == 3
            assert not Path(f"/srv/xcache/data/{name}").exists()
        else:
            assert _origin_opens(name) == 1  # the cache fetched it once
            assert where[0] == "remote"
            # Direct access: once the cache holds the whole file, the client reads
            # the copy on the shared file system.
            assert where[2] == ("local" if mode in ("xcache-dca", "dcotf") else "remote"), where
    finally:
        path.unlink(missing_ok=True)
