"""The probe pilot's node checks: run on a worker node by the probe's batch script,
just before the real pilot wrapper (provisioner.onboard.probe).

Standard library only (it runs with the site's pilot Python). It reads the same
``PILOT_*`` environment the wrapper does and prints one line per step on stdout (the
probe's SLURM output file, read back by `provisioner site check`):

    onboard-probe {"step": "collector", "ok": true, "seconds": 0.01, "detail": "..."}

It never fails the job: whatever it finds, the wrapper runs next.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

PREFIX = "onboard-probe "
#: XRootD's initial handshake (XProtocol: 0, 0, 0, 4, 2012 as four-byte integers); a
#: server answers with an 8-byte response header (status 0) and its protocol version.
XROOTD_HANDSHAKE = struct.pack("!iiiii", 0, 0, 0, 4, 2012)
TIMEOUT_S = 10.0
APPTAINER_TIMEOUT_S = 120.0

Step = tuple[bool, str]


def host_port(address: str, default_port: int) -> tuple[str, int]:
    """"host:port" (or "root://host:port", or "host") -> (host, port)."""
    address = address.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return address, default_port
    return host, int(port)


def check_image(env: Mapping[str, str]) -> Step:
    image = env.get("PILOT_IMAGE", "")
    if not image:
        return False, "PILOT_IMAGE is not set"
    if not os.access(image, os.R_OK):
        return False, f"{image} is missing or unreadable on {socket.gethostname()}"
    return True, f"{image} ({os.stat(image).st_size // 2**20} MiB) on {socket.gethostname()}"


def check_apptainer(env: Mapping[str, str]) -> Step:
    binary = shutil.which("apptainer") or shutil.which("singularity")
    if binary is None:
        return False, f"no apptainer (nor singularity) on PATH on {socket.gethostname()}"
    argv = [binary, "-s", "exec", "--contain", "--cleanenv", "--no-home",
            env.get("PILOT_IMAGE", ""), "/bin/true"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True,
                              timeout=APPTAINER_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return False, f"apptainer exec did not end within {APPTAINER_TIMEOUT_S:.0f} s"
    if proc.returncode != 0:
        text = " ".join((proc.stderr or proc.stdout).split())[-300:]
        return False, f"apptainer exec exited {proc.returncode}: {text}"
    return True, f"{binary} exec of the pilot image"


def check_collector(env: Mapping[str, str]) -> Step:
    host, port = host_port(env.get("PILOT_COLLECTOR", ""), 9618)
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT_S):
            pass
    except OSError as exc:
        return False, f"{socket.gethostname()} cannot connect to {host}:{port}: {exc}"
    return True, f"TCP to {host}:{port} from {socket.gethostname()}"


def check_xcache(env: Mapping[str, str]) -> Step:
    host, port = host_port(env.get("PILOT_XCACHE", ""), 1094)
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT_S) as conn:
            conn.settimeout(TIMEOUT_S)
            conn.sendall(XROOTD_HANDSHAKE)
            header = _read(conn, 8)
            _stream, status, length = struct.unpack("!HHi", header)
            body = _read(conn, length) if 0 < length <= 64 else b""
    except OSError as exc:
        return False, f"{host}:{port} does not answer from {socket.gethostname()}: {exc}"
    if status != 0:
        return False, f"{host}:{port} answered the XRootD handshake with status {status}"
    version = struct.unpack("!i", body[:4])[0] if len(body) >= 4 else 0
    return True, f"XRootD at {host}:{port} (protocol {version:#x})"


def _read(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise OSError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return data


STEPS: tuple[tuple[str, Callable[[Mapping[str, str]], Step]], ...] = (
    ("image", check_image), ("apptainer", check_apptainer),
    ("collector", check_collector), ("xcache", check_xcache))


def to_comment(lines: list[str], job_id: str) -> None:
    """The step lines into the job's comment (``scontrol update``, as the job's owner):
    at a site read through slurmrestd (``PILOT_END_COMMENT=1``) the probe's output
    file cannot be read, its comment can. Never raises."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "Comment=" + "\n".join(lines)],
                       capture_output=True, timeout=30, stdin=subprocess.DEVNULL, check=False)


def main(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    lines = []
    for name, step in STEPS:
        if name == "xcache" and not env.get("PILOT_XCACHE"):
            continue
        start = time.monotonic()
        try:
            ok, detail = step(env)
        except Exception as exc:  # a probe step never stops the probe
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        line = {"step": name, "ok": ok, "seconds": round(time.monotonic() - start, 3),
                "detail": detail}
        lines.append(PREFIX + json.dumps(line, sort_keys=True, separators=(",", ":")))
        print(lines[-1], flush=True)
    if env.get("PILOT_END_COMMENT") == "1" and env.get("SLURM_JOB_ID", "").isdigit():
        to_comment(lines, env["SLURM_JOB_ID"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
