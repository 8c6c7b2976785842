"""Benchmarks; run bench/queue.py from the repository root (the helpers are the _*.py beside it)."""
