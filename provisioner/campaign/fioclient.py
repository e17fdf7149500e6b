#!/usr/bin/env python3
"""One fio client of a `kind: fio` campaign: the executable of its HTCondor job.

Runs ``fio --output-format=json --output=fio.json JOBFILE`` in the job's scratch
directory while a sampler reads the node's network interface counters from
/proc/net/dev once a second into netdev.csv (second,interface,rx_bytes,tx_bytes;
counters since boot). Both files come back by HTCondor's file transfer. Exit
status: fio's (1 if fio cannot be started). Standard library only, so the job
ships this file as its executable: `python3 fioclient.py JOBFILE`.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import threading
import time


def read_netdev(text: str) -> list[tuple[str, int, int]]:
    """/proc/net/dev -> (interface, rx_bytes, tx_bytes) per interface."""
    out = []
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if sep and len(fields) >= 9:
            out.append((name.strip(), int(fields[0]), int(fields[8])))
    return out


def sample(path: str, stop: threading.Event, every: float = 1.0) -> None:
    """Write a sample of every interface about once a second until `stop` is set."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["second", "interface", "rx_bytes", "tx_bytes"])
        while True:
            now = int(time.time())
            with open("/proc/net/dev") as dev:
                for iface, rx, tx in read_netdev(dev.read()):
                    writer.writerow([now, iface, rx, tx])
            f.flush()
            if stop.wait(every - time.time() % every):
                return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("jobfile")
    parser.add_argument("--json", default="fio.json", help="fio's report (default fio.json)")
    parser.add_argument("--netdev", default="netdev.csv", help="samples (default netdev.csv)")
    parser.add_argument("--fio", default="fio", help="the fio program (default: fio on PATH)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(args.netdev, stop), daemon=True)
    sampler.start()
    try:
        proc = subprocess.run([args.fio, "--output-format=json", f"--output={args.json}",
                               args.jobfile], check=False)
    except OSError as exc:
        print(f"fio client: cannot run {args.fio}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        time.sleep(1.0)  # one more sample after fio ended
        stop.set()
        sampler.join(timeout=5)
    if proc.returncode != 0:
        print(f"fio client: fio exited {proc.returncode}", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
