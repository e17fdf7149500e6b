"""Split the integration test files into shards that take about as long each.

`make test` runs each shard in a testbed of its own at the same time
(tests/run-all.sh): the integration tests mostly wait (pilots booting, jobs running,
fault timeouts running out), so two testbeds on two cores take little more than half
the time of one.

The split is by file (a file's tests share helpers and clean the pool between each
other), longest first, each to the shard with the least so far, on the minutes each
file took in the last measured full run (tests/integration/durations.tsv). A file
missing from that table counts as DEFAULT_MIN and is named on stderr, so that it gets
measured.

    python3 tests/shards.py K N     the files of shard K (1..N), one per line
    python3 tests/shards.py N       every shard's files and expected minutes
    python3 tests/shards.py --from-log LOG
                                    the table from the output of `make test
                                    PYTEST_ARGS=--durations=0` (to stdout)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
INTEGRATION = HERE / "integration"
TABLE = INTEGRATION / "durations.tsv"
DEFAULT_MIN = 2.0
#: The table's head, written with every table from a log (not read back from the table:
#: `--from-log LOG > durations.tsv` empties that file before this reads it).
HEADER = """\
# Minutes each integration file took in the last measured full run (`make test
# PYTEST_ARGS=--durations=0`, summed per file; setup and teardown included).
# tests/shards.py splits the files between the testbeds of `make test` on these.
"""


def measured(table: Path = TABLE) -> dict[str, float]:
    """file name -> minutes, from the table's `name<TAB>minutes` rows (# comments)."""
    minutes: dict[str, float] = {}
    for number, line in enumerate(table.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            name, value = line.split()
            minutes[name] = float(value)
        except ValueError:
            raise SystemExit(f"{table}:{number}: expected `file<TAB>minutes`, "
                             f"got {line!r}") from None
    return minutes


def test_files(directory: Path = INTEGRATION) -> list[str]:
    return sorted(p.name for p in directory.glob("test_*.py"))


def split(files: list[str], minutes: dict[str, float], shards: int) -> list[list[str]]:
    """Longest file first, each to the shard with the fewest minutes so far (ties:
    the lower shard); every file in exactly one shard."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    loads = [0.0] * shards
    out: list[list[str]] = [[] for _ in range(shards)]
    for name in sorted(files, key=lambda f: (-minutes.get(f, DEFAULT_MIN), f)):
        k = min(range(shards), key=lambda i: (loads[i], i))
        out[k].append(name)
        loads[k] += minutes.get(name, DEFAULT_MIN)
    return [sorted(s) for s in out]


#: A line of pytest's --durations report, as `make test` prints it (a shard's prefix
#: first): "[testbed 1] 12.34s call     src/tests/integration/test_x.py::test_y".
_DURATION = re.compile(r"^(?:\[testbed \d+\] )?\s*([\d.]+)s (?:call|setup|teardown)\s+"
                       r"\S*?(test_\w+\.py)::")


def from_log(text: str) -> str:
    """The durations table of a `make test PYTEST_ARGS=--durations=0` output."""
    seconds: dict[str, float] = {}
    for line in text.splitlines():
        found = _DURATION.match(line)
        if found:
            name = found.group(2)
            seconds[name] = seconds.get(name, 0.0) + float(found.group(1))
    rows = [f"{name}\t{total / 60:.1f}" for name, total in
            sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))]
    return HEADER + "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--from-log":
        print(from_log(Path(argv[1]).read_text()), end="")
        return 0
    if len(argv) not in (1, 2) or not all(a.isdigit() for a in argv):
        print(__doc__, file=sys.stderr)
        return 2
    minutes = measured()
    files = test_files()
    unmeasured = [f for f in files if f not in minutes]
    if unmeasured:
        print(f"shards: no measured duration for {', '.join(unmeasured)}: counted as "
              f"{DEFAULT_MIN} min each (add them to {TABLE.name})", file=sys.stderr)
    if len(argv) == 1:
        for k, shard in enumerate(split(files, minutes, int(argv[0])), 1):
            total = sum(minutes.get(f, DEFAULT_MIN) for f in shard)
            print(f"shard {k}: {total:.1f} min: {' '.join(shard)}")
        return 0
    k, n = int(argv[0]), int(argv[1])
    if not 1 <= k <= n:
        print(f"shard {k} of {n}: K must be 1..N", file=sys.stderr)
        return 2
    print("\n".join(split(files, minutes, n)[k - 1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
