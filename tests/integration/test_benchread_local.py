"""The reader with XRootD's own client on a local file:// URL, as a campaign's direct
local reference reads the cached copy: right bytes pass, wrong ones and a missing file
fail with the reason."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

SIZE = 3 * 1024 * 1024 + 123


def bench_read(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["provisioner", "bench", "read", *args], capture_output=True,
                          text=True, timeout=120)


def test_the_xrootd_client_reads_a_local_file_url(tmp_path: Path) -> None:
    data = os.urandom(SIZE)
    path = tmp_path / "camp-0"
    path.write_bytes(data)
    url = f"file://{path}"
    digest = hashlib.sha256(data).hexdigest()
    out = bench_read(url, "--block-size", "1M", "--sha256", digest)
    assert out.returncode == 0, out.stderr
    assert f"{url}: {SIZE} bytes in 4 blocks" in out.stdout
    wrong = bench_read(url, "--block-size", "1M", "--sha256", "0" * 64)
    assert wrong.returncode == 1 and "wrong bytes: SHA-256" in wrong.stderr
    missing = bench_read(f"file://{tmp_path}/missing", "--block-size", "1M")
    assert missing.returncode != 0 and "cannot open" in missing.stderr, missing.stderr
