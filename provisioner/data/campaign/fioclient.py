#!/usr/bin/env python3
"""One fio client of a `kind: fio` campaign: the executable of its HTCondor job.

Runs ``fio --output-format=json --output=fio.json JOBFILE`` in the job's scratch
directory while a sampler reads the node's network interface counters from
/proc/net/dev once a second into netdev.csv (second,interface,rx_bytes,tx_bytes;
counters since boot). With ``--bwlog bw.csv`` fio also logs its own bandwidth each
second (the job file is run with a ``[global]`` section in front that switches on
``write_bw_log``, averaged over 1 s, Unix timestamps), summed over fio's jobs into
bw.csv (second,bytes): what fio read each wall-clock second, beside what the node's
network carried. The files come back by HTCondor's file transfer. Exit status: fio's
(1 if fio cannot be started). Standard library only, so the job ships this file as
its executable: `python3 fioclient.py JOBFILE`.
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
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


#: fio's bandwidth logs are written as <prefix>_bw.<job>.log in the scratch directory.
BW_PREFIX = "fioclient"
#: What is put in front of the job file: applies to every job of it (a later [global]
#: section of the job file could still change it).
BW_GLOBAL = f"[global]\nwrite_bw_log={BW_PREFIX}\nlog_avg_msec=1000\nlog_unix_epoch=1\n\n"


def bw_series(lines: list[str]) -> dict[int, int]:
    """PURE: the lines of fio's bandwidth logs (time ms since the epoch, KiB/s averaged
    over the second before, direction, block size, ...) -> bytes per wall-clock second,
    each window put at the second its middle falls in, summed over directions and jobs."""
    out: dict[int, int] = {}
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 2 or not fields[0].isdigit():
            continue
        second = (int(fields[0]) - 500) // 1000
        out[second] = out.get(second, 0) + int(float(fields[1]) * 1024)
    return out


def write_bw(path: str, logs: list[str]) -> None:
    series: dict[int, int] = {}
    for log in logs:
        with open(log) as f:
            for second, nbytes in bw_series(f.read().splitlines()).items():
                series[second] = series.get(second, 0) + nbytes
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["second", "bytes"])
        writer.writerows(sorted(series.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("jobfile")
    parser.add_argument("--json", default="fio.json", help="fio's report (default fio.json)")
    parser.add_argument("--netdev", default="netdev.csv", help="samples (default netdev.csv)")
    parser.add_argument("--bwlog", metavar="CSV",
                        help="fio's own bytes per second, summed over its jobs, to CSV")
    parser.add_argument("--fio", default="fio", help="the fio program (default: fio on PATH)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(args.netdev, stop), daemon=True)
    sampler.start()
    try:
        rc = run_fio(args.fio, args.jobfile, args.json, bool(args.bwlog))
    finally:
        time.sleep(1.0)  # one more sample after fio ended
        stop.set()
        sampler.join(timeout=5)
        # The job returns every file it names, whatever happened to fio.
        if args.bwlog:
            write_bw(args.bwlog, sorted(glob.glob(f"{BW_PREFIX}_bw.*.log")))
        if not os.path.exists(args.json):
            with open(args.json, "w") as f:
                f.write("{}\n")
    return rc


def run_fio(fio: str, jobfile: str, report: str, bwlog: bool) -> int:
    """fio's exit status (1 if it cannot be started); its bandwidth logs if `bwlog`."""
    try:
        if bwlog:
            for old in glob.glob(f"{BW_PREFIX}_bw.*.log"):
                os.unlink(old)
            with open(jobfile) as f:
                text = f.read()
            jobfile = f"{BW_PREFIX}.fio"
            with open(jobfile, "w") as f:
                f.write(BW_GLOBAL + text)
        proc = subprocess.run([fio, "--output-format=json", f"--output={report}", jobfile],
                              check=False)
    except OSError as exc:
        print(f"fio client: cannot run {fio} on {jobfile}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    if proc.returncode != 0:
        print(f"fio client: fio exited {proc.returncode}", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
