"""The service's own disk full: the file system of its journal (a small tmpfs of its
own, mounted by the test) filled while a pilot runs jobs.

The service goes on with what is safe without a journal: the jobs end, and the idle
pilot is released and leaves SLURM (busy pilots are not retired here, so that it is
idle). The fault is one line in its log (no
traceback per cycle), a line of `provisioner status` and `provisioner_journal_writable`
0. A job submitted meanwhile gets no pilot: its submission waits, and the log says so.
Once space returns, the journal takes what was done meanwhile and the waiting job gets
its pilot; the service restarted right after submits no pilot twice: every pilot SLURM
ran is in the journal, once.

To see the safeguard matter: delete the lines of `Provisioner._submit_all` that return
the waiting outcomes; the job submitted while the journal is full gets a pilot at once,
which this test refuses.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml
from conftest import SITES, run
from faults import assert_completed, assert_converged
from servicectl import Service, SiteWatch, pilot_ids, service_dir, write_config
from test_loop import clean_pool, gated_jobs_left, submit_gated, wait_for

from provisioner.service.journal import Journal

GSI_ONLY = '+DesiredSites = "gsi"\nrequirements = PilotSite == "gsi"\n'
#: The journal's own file system: room for the journal, not for much else.
JOURNAL_FS = "size=4m,mode=0755"


@contextlib.contextmanager
def small_fs() -> Iterator[Path]:
    """A tmpfs of JOURNAL_FS, unmounted after the block."""
    mnt = Path(tempfile.mkdtemp(prefix="journal-fs.", dir="/var/tmp"))
    run(["mount", "-t", "tmpfs", "-o", JOURNAL_FS, "tmpfs", str(mnt)])
    try:
        yield mnt
    finally:
        run(["umount", "-l", str(mnt)], check=False)
        mnt.rmdir()


def no_retirement(data: dict) -> None:
    """Busy pilots are not told to leave when their jobs end: they go idle, and are
    released."""
    data["policy"]["retire_when_done"] = False


def fill(mnt: Path) -> Path:
    """Write a file on `mnt` until its file system is full; the file."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def metric(config: Path, name: str) -> float:
    listen = yaml.safe_load(config.read_text())["metrics"]["listen"]
    text = urllib.request.urlopen(f"http://{listen}/metrics", timeout=10).read().decode()
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, text
    return float(found.group(1))


def submitted_ids(journal: Path) -> list[str]:
    """Every SLURM job id the journal's submit actions name ("site/id"), repeats kept."""
    j = Journal(str(journal))
    out = []
    for detail, outcome in j.db.execute(
            "SELECT detail, outcome FROM actions WHERE kind = 'submit'"):
        site = detail.split(" at ", 1)[1].split(" ", 1)[0] if " at " in detail else "?"
        out += [f"{site}/{i}" for i in re.findall(r"'(\d+)'", outcome)]
    return out


def test_a_full_journal_releases_idle_pilots_and_submits_nothing_twice() -> None:
    clean_pool()
    with small_fs() as mnt:
        directory = mnt / "service"
        directory.mkdir()
        config = write_config(directory, no_retirement)
        journal = directory / "journal.sqlite"
        svc = Service(config, service_dir() / "service.log")  # the log: another disk
        try:
            with SiteWatch() as watch:
                _full_then_back(svc, config, mnt, journal, watch)
        finally:
            svc.stop()
            print(f"--- service log ({svc.log}) ---\n{svc.text()}")
            clean_pool()


def _full_then_back(svc: Service, config: Path, mnt: Path, journal: Path,
                    watch: SiteWatch) -> None:
    first = submit_gated("journal-full", 2, GSI_ONLY)
    svc.start()
    wait_for("both jobs running", lambda: jobs_running(first) == 2, 180)
    filler = fill(mnt)
    wait_for("the jobs done", lambda: gated_jobs_left(first) == 0, 120, step=2)
    # the pilot, idle, is released and leaves, though nothing can be recorded
    wait_for("no pilot left in SLURM", lambda: not any(pilot_ids(s) for s in SITES), 240,
             step=2)
    log = svc.text()
    assert log.count("cannot be written") == 1 and "Traceback" not in log, log
    assert metric(config, "provisioner_journal_writable") == 0.0
    status = run(["provisioner", "-c", str(config), "status"]).stdout
    lines = [ln for ln in status.splitlines() if "CANNOT BE WRITTEN" in ln]
    assert len(lines) == 1 and "(full: " in lines[0], status

    # a job now: its pilot waits for the journal
    seen_before = {s: set(watch.seen[s]) for s in SITES}
    second = submit_gated("journal-full-2", 1, GSI_ONLY)
    wait_for("a submission waiting for the journal",
             lambda: "wait for the journal" in svc.text(), 120)
    assert not any(pilot_ids(s) for s in SITES), svc.text()

    # space returns: the journal takes the backlog, the waiting job gets its pilot;
    # the service is restarted as soon as that pilot is in SLURM
    filler.unlink()
    wait_for("the journal writable again", lambda: "writable again" in svc.text(), 60)
    wait_for("a pilot for the waiting job", lambda: any(pilot_ids(s) for s in SITES), 60,
             step=1)
    svc.stop()
    svc.start()
    wait_for("the second job done", lambda: gated_jobs_left(second) == 0, 300, step=2)
    assert_completed("journal-full", 2)
    assert_completed("journal-full-2", 1)
    assert_converged(svc, watch)
    new = {f"{s}/{i}" for s in SITES for i in watch.seen[s] - seen_before[s]}
    assert len(new) == 1, (new, watch.story(), svc.text())
    ids = submitted_ids(journal)
    assert len(ids) == len(set(ids)), ids  # no pilot submitted twice
    assert set(ids) == {f"{s}/{i}" for s in SITES for i in watch.seen[s]}, (
        ids, watch.story())
    j = Journal(str(journal))
    later = j.db.execute("SELECT kind FROM actions WHERE detail LIKE "
                         "'%done while the journal could not be written%'").fetchall()
    assert ("release",) in later, later
    assert svc.text().count("cannot be written") == 1


def jobs_running(cluster: str) -> int:
    out = run(["condor_q", cluster, "-af", "JobStatus"]).stdout.split()
    return out.count("2")
