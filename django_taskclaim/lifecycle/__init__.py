"""The lifecycle of a task, internal to the package: every transition (``transitions``), the
claim a worker holds (``claim``, with ``keepalive``), the claim API (``api``), and how work runs
under a claim (``execution``). Its public names are handed on by :mod:`django_taskclaim.claims`
and :mod:`django_taskclaim.execution`; this package re-exports nothing."""
