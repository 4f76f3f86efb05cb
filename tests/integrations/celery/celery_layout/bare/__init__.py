"""A project package that does not import its Celery app (a worker finds it with -A bare)."""
