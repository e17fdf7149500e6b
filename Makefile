# The two commands a newcomer needs: `make demo` and `make test`.
# Both build and start the local mini-grid (deploy/testbed) as needed; root required.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
TESTBED := deploy/testbed/testbed
# Run pytest, treating "no tests collected" (exit 5) as the failure it is.
PYTEST_STRICT = rc=0; $(1) || rc=$$?; if [ $$rc -eq 5 ]; then echo "error: no tests collected by: $(1)" >&2; exit 1; fi; exit $$rc

.PHONY: test test-fast unit integration integration-shard lint bench bench-budget bench-overhead bench-report bench-scale bench-why bench-small demo campaign testbed testbed-status clean-testbed venv

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test,bench]'
	touch $@

# The unit tests run beside the integration tests (tests/run-all.sh): as long as the
# integration tests take.
test: venv
	@bash tests/run-all.sh

# For development: the unit tests and one smoke test through the testbed (a testbed
# that is up, the testbed's own checks, then 8 jobs on pilots at both sites): about 5
# minutes once the testbed is built.
SMOKE := /src/tests/integration/test_testbed.py \
	/src/tests/integration/test_loop.py::test_jobs_run_on_pilots_at_both_sites_then_pilots_are_released
test-fast: unit testbed
	@$(call PYTEST_STRICT,$(TESTBED) exec -- pytest -q -p no:cacheprovider $(SMOKE))

unit: venv
	@$(call PYTEST_STRICT,$(VENV)/bin/pytest -q tests/unit)

# PYTEST_ARGS: more pytest options, e.g. PYTEST_ARGS=--durations=0 for each test's time.
PYTEST_ARGS ?=
# Every integration file in one testbed: the one shard of one.
integration:
	@$(MAKE) --no-print-directory integration-shard SHARD=1/1

# One shard of the integration files (SHARD=K/N, split by tests/shards.py) in the
# testbed whose state directory is TESTBED_STATE (`make test` runs N at once), a line
# per test as it ends (the shards' lines interleave).
SHARD ?= 1/1
integration-shard: testbed
	@files=$$($(PYTHON) tests/shards.py $(subst /, ,$(SHARD)) | sed 's|^|/src/tests/integration/|') \
		&& [ -n "$$files" ] || { echo "error: no files in shard $(SHARD)" >&2; exit 1; }; \
		$(call PYTEST_STRICT,$(TESTBED) exec -- pytest -v -p no:cacheprovider $(PYTEST_ARGS) $$files)

lint: venv
	$(VENV)/bin/ruff check provisioner tests bench
	$(VENV)/bin/mypy

bench: venv
	$(VENV)/bin/python bench/run.py
	$(VENV)/bin/python bench/budget.py $(BUDGET_FLAGS)
	$(VENV)/bin/python bench/overhead.py

# Allocations as budgets: a simulated month, two groups, six variants
# (bench/results/budget.md and its burn-downs). BUDGET_FLAGS: more options of
# bench/budget.py, e.g. --days 6 for a quick look (docs/benchmarks.md, Allocations).
BUDGET_FLAGS ?=
bench-budget: venv
	$(VENV)/bin/python bench/budget.py $(BUDGET_FLAGS)

# What the journal, accounting and metrics add to one cycle (20k jobs, 200 pilots; ~2 s).
bench-overhead: venv
	$(VENV)/bin/python bench/overhead.py

# A simulated two-day run through `provisioner report` (bench/results/sim-report/).
bench-report: venv
	$(VENV)/bin/python bench/sim_report.py

# One cycle against 20,000 idle jobs and 200 pilots in the testbed (bench/results/scale.md).
bench-scale: testbed
	$(TESTBED) exec -- python /src/bench/scale.py

# `provisioner why` as alice at bench-scale's queue: how long each answer takes.
bench-why: testbed
	$(TESTBED) exec -- python /src/bench/why.py

# The small workload of issue 10 on the production policy defaults, RUNS times (about
# 15-25 min each): 8 one-minute jobs, 4 more six minutes later, from zero pilots;
# efficiency and job waits per run in bench/results/testbed-small.md.
# WORKLOAD=testbed-first: 4 one-minute jobs from zero pilots (the first jobs' wait).
RUNS ?= 3
WORKLOAD ?= testbed-small
bench-small: testbed
	$(TESTBED) exec -- python /src/deploy/testbed/smallload.py --runs $(RUNS) \
		--workload $(WORKLOAD)

testbed:
	$(TESTBED) up

testbed-status:
	$(TESTBED) status

clean-testbed:
	$(TESTBED) clean

demo: testbed
	$(TESTBED) exec -- python /src/deploy/testbed/demo.py

# A benchmark campaign in the testbed (default: every cache mode, 1 and 2 clients):
# deploy/testbed/campaign.py runs the provisioner service and the campaign as alice;
# the results land in build/campaigns/$(CAMPAIGN), rendered again here (plots need
# matplotlib, which the host's venv has). CAMPAIGN=fio-seq runs the fio campaign.
CAMPAIGN ?= cache-modes
campaign: testbed venv
	@rc=0; $(TESTBED) exec -- python /src/deploy/testbed/campaign.py \
		/src/deploy/testbed/campaigns/$(CAMPAIGN).yaml || rc=$$?; \
	if [ -d build/campaigns/$(CAMPAIGN) ]; then \
		$(VENV)/bin/provisioner campaign report build/campaigns/$(CAMPAIGN) >/dev/null && \
		echo "report: build/campaigns/$(CAMPAIGN)/report.md"; fi; exit $$rc
