from django.db import models


class Effect(models.Model):
    """One application of a task's effect: the checker counts these per task (no unique constraint on purpose)."""

    task_key = models.CharField(max_length=255, db_index=True)
    token = models.BigIntegerField()
    worker = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
