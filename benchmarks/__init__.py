"""Benchmarks of django-taskclaim on PostgreSQL, side by side with raw SQL and with peers.

Run ``python -m benchmarks --help``; the figures of the last full run are in
``docs/benchmarks.md``.
"""
