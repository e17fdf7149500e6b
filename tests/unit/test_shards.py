"""tests/shards.py: how `make test` splits the integration files between testbeds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

_PATH = Path(__file__).resolve().parents[1] / "shards.py"
_spec = importlib.util.spec_from_file_location("shards", _PATH)
assert _spec is not None and _spec.loader is not None
shards = importlib.util.module_from_spec(_spec)
sys.modules["shards"] = shards
_spec.loader.exec_module(shards)


@given(st.dictionaries(st.from_regex(r"test_[a-z]{1,8}\.py", fullmatch=True),
                       st.floats(0, 30), min_size=0, max_size=25),
       st.integers(1, 4))
def test_every_file_in_exactly_one_shard_and_the_shards_balanced(minutes: dict[str, float],
                                                                  n: int) -> None:
    files = sorted(minutes)
    out = shards.split(files, minutes, n)
    assert len(out) == n
    assert sorted(f for shard in out for f in shard) == files
    loads = [sum(minutes[f] for f in shard) for shard in out]
    # greedy longest-first: no shard exceeds another by more than its longest file
    assert max(loads) - min(loads) <= max(minutes.values(), default=0) + 1e-9


def test_an_unmeasured_file_counts_as_the_default() -> None:
    out = shards.split(["test_a.py", "test_new.py"], {"test_a.py": 1.0}, 2)
    assert out == [["test_new.py"], ["test_a.py"]]


def test_every_integration_file_has_a_measured_duration_and_no_stale_row() -> None:
    table = shards.measured()
    files = shards.test_files()
    assert files, "no integration test files found"
    assert sorted(set(files) - set(table)) == [], "add them to tests/integration/durations.tsv"
    assert sorted(set(table) - set(files)) == [], "rows for files that are gone"


def test_a_bad_row_names_the_line(tmp_path: Path) -> None:
    table = tmp_path / "durations.tsv"
    table.write_text("# comment\ntest_a.py\t1.5\ntest_b.py\tslow\n")
    with pytest.raises(SystemExit, match=r"durations.tsv:3: .*'test_b.py\\tslow'"):
        shards.measured(table)


def test_shard_numbers_outside_1_to_n_are_refused() -> None:
    assert shards.main(["3", "2"]) == 2
    with pytest.raises(ValueError, match="at least 1"):
        shards.split(["test_a.py"], {}, 0)


def test_the_table_from_a_make_test_log_sums_each_files_phases() -> None:
    log = ("[testbed 2] 60.00s call     src/tests/integration/test_a.py::test_x\n"
           "[testbed 1] 30.00s teardown tests/integration/test_a.py::test_y[p-1]\n"
           "  6.00s setup    src/tests/integration/test_b.py::test_z\n"
           "[testbed 1] PASSED src/tests/integration/test_c.py::test_w\n")
    rows = [line for line in shards.from_log(log).splitlines() if not line.startswith("#")]
    assert rows == ["test_a.py\t1.5", "test_b.py\t0.1"]


def test_a_table_from_a_log_keeps_its_head_when_written_over_the_table(tmp_path: Path) -> None:
    """`--from-log LOG > durations.tsv`: the shell empties the table before the script
    runs, so the head cannot come from it."""
    log = ("[testbed 1] 90.00s call     src/tests/integration/test_a.py::test_x\n"
           "[testbed 2] 30.00s setup    src/tests/integration/test_b.py::test_y\n"
           "[testbed 1] 30.00s teardown src/tests/integration/test_a.py::test_x\n")
    text = shards.from_log(log)
    assert text.startswith(shards.HEADER) and "durations=0" in shards.HEADER
    table = tmp_path / "durations.tsv"
    table.write_text(text)
    assert shards.measured(table) == {"test_a.py": 2.0, "test_b.py": 0.5}
