"""The reader with XRootD's own client on a local file:// URL, as a campaign's direct
local reference reads the cached copy: right bytes pass, wrong ones and a missing file
fail with the reason. And a server that stops answering fails the reader within its
timeout instead of holding the job (and its pilot) for XRootD's half hour."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

from conftest import ON, run
from test_loop import wait_for

SIZE = 3 * 1024 * 1024 + 123
#: A private XRootD server on the cache host, beside the testbed's own.
STALL_PORT = 1096
STALL_CONFIG = f"""xrd.port {STALL_PORT}
oss.localroot /srv/origin
all.export /data
all.adminpath /run/bench-stall
all.pidpath /run/bench-stall
"""


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


def test_a_server_that_stops_answering_fails_the_reader_within_its_timeout() -> None:
    url = f"root://fra-cache:{STALL_PORT}//data/small.dat"  # the testbed's 1 MiB file
    run(["install", "-d", "-o", "xrootd", "-g", "xrootd", "/run/bench-stall"])
    config = Path("/run/bench-stall/xrootd.cfg")
    config.write_text(STALL_CONFIG)
    # In the foreground, so this process is the server (`on` and its helpers exec).
    server = subprocess.Popen([ON, "fra-cache", "-u", "xrootd", "--", "xrootd", "-n",
                               "bench-stall", "-c", str(config), "-l",
                               "/run/bench-stall/xrootd.log"])
    try:
        reader = ["python3", "/src/provisioner/data/benchread.py", url, "--block-size", "1M",
                  "--timeout", "5"]
        wait_for("the private server answers", lambda: run(
            reader, host="fra-n1", check=False).returncode == 0, 60, step=1)
        # Stopped: the kernel still accepts connections; nothing answers them.
        server.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        # Without its timeout the reader waits for XRootD's (minutes): this run's
        # own limit ends the test then.
        out = run(reader, host="fra-n1", check=False, timeout=120)
        print(f"reader failed after {time.monotonic() - started:.1f} s: "
              f"{out.stderr.strip()}")
        assert out.returncode == 1, (out.stdout, out.stderr)
        assert f"bench read: {url}: cannot open: " in out.stderr, out.stderr
        assert "no answer within --timeout 5 s" in out.stderr, out.stderr
    finally:
        server.send_signal(signal.SIGCONT)
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
