"""Fault-injection harness: worker processes, a nemesis, and a checker (``python -m tests.chaos``).

See ``docs/fault-injection.md`` for what it injects, what it verifies and how to reproduce a run.
"""
