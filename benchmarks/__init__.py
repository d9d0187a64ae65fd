"""Performance budgets, run with ``python -m benchmarks`` (not part of the test suite)."""
