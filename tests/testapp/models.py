from django.db import models


class Effect(models.Model):
    """One application of a task's effect: the checker counts these per task (no unique constraint on purpose)."""

    task_key = models.CharField(max_length=255, db_index=True)
    token = models.BigIntegerField()
    worker = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)


class Span(models.Model):
    """When one run of a task's body started and ended (microseconds of the machine's clock, which
    every process of a test shares): concurrency tests count the bodies that overlapped."""

    task_key = models.CharField(max_length=255)
    started_us = models.BigIntegerField()
    ended_us = models.BigIntegerField()
