"""Benchmark campaigns: many read (or fio) clients as HTCondor jobs, per scenario and
client count, then aggregate throughput, a report and plots.

- `spec`: the campaign YAML (pydantic); errors name the file, line and field.
- `runner`: submits the clients with the htcondor2 bindings and waits (I/O).
- `aggregate`: pure, sums the clients' per-second bytes by wall-clock second.
- `report`: results.csv, summary.csv, report.md and PNG plots from a result directory.
- `fioclient`: the standalone executable of a fio client job.
- `command`: `provisioner campaign run|report`.
"""
