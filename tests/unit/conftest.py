"""Unit tests: no example may fail for taking long. Hypothesis's per-example deadline
(200 ms) is a timing assertion, and this suite shares a 2-core machine with the testbed
and other work; speed is what `make bench` measures."""

from hypothesis import settings

settings.register_profile("unit", deadline=None)
settings.load_profile("unit")
