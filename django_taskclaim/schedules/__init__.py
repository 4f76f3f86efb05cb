"""Schedules that fire once: ``TASKCLAIM_SCHEDULES``, each tick a task identity
(``TaskKey("schedule:" + name, run=<tick, ISO 8601 UTC>)``) that any number of schedulers
(``manage.py taskclaim_scheduler``, ``taskclaim_worker --schedule``) may enqueue, and that runs once.

``spec`` reads and checks the setting and computes ticks; ``firing`` enqueues them (one statement
a tick a scheduler) and runs the loop; ``status`` says where each schedule stands (admin, metrics).
See docs/django-tasks.md, "Schedules".
"""

from .firing import Scheduler, configured, fire
from .spec import ALL, CATCH_UP, CATCH_UP_LIMIT, LATEST, SKIP, Schedule, ScheduleError

__all__ = ["ALL", "CATCH_UP", "CATCH_UP_LIMIT", "LATEST", "SKIP", "Schedule", "ScheduleError", "Scheduler",
           "configured", "fire"]
