"""The demo's simulator: a queue that duplicates and redelivers, agents paused and killed.

It imports the example's core (:mod:`example_project.testgen`) and is never imported by it.
``python3 -m example_project`` runs :func:`.main.main`.
"""
