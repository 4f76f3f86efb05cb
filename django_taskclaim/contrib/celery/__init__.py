"""The Celery bridge, one module per job; its public names are imported from ``django_taskclaim.celery``.

- ``app``: finding the project's Celery app as its worker does (system checks, requeue);
- ``broker``: what the broker does with an unacknowledged message (visibility and consumer timeouts);
- ``options``: a claimed task's options, its key from its arguments, the registry of claimed tasks;
- ``tasks``: ``ClaimedTask`` (the body run under a claim) and ``@claimed_task``;
- ``dispatch``: ``enqueue_once`` and ``requeue_lost``;
- ``checks``: the bridge's system checks (E101, W101–W106), registered through ``contrib.INTEGRATIONS``;
- ``admin``: the task admin's link from an attempt's delivery id to django-celery-results' stored
  result, also registered there (it imports neither Celery nor the admin).

Like every plug-in, the bridge reaches the core only through public names
(``django_taskclaim.execution``, ``django_taskclaim.claims``, the models): ``tests/repository/test_plugin_door.py``.

Imports go one way, down this list: ``app`` and ``broker`` import neither, ``options`` imports
``app``, ``tasks`` imports ``options`` and ``broker``, ``dispatch`` imports ``options`` and ``app``,
``checks`` imports ``app``, ``broker`` and ``options`` (only when it runs: Celery may be absent).
"""
