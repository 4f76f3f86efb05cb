from django.db import models


class TestSuite(models.Model):
    """A generated test suite, published by the agent whose claim was valid at commit time.

    Written inside ``claim.fenced()`` together with ``claim.complete()``. There is deliberately
    no unique constraint on ``(tenant, job_key)`` and no foreign key to the task: the demo counts
    these rows to prove that no job took effect twice, so the claim alone must prevent it.
    """

    tenant = models.CharField(max_length=255)
    job_key = models.CharField(max_length=255)
    run = models.CharField(max_length=100)
    service = models.CharField(max_length=100)
    endpoint = models.CharField(max_length=200)
    token = models.BigIntegerField(help_text="Fencing token of the claim that published it.")
    agent = models.CharField(max_length=255)
    artifact = models.CharField(max_length=1024, help_text="Path relative to ARTIFACT_DIR.")
    tests = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["tenant", "job_key"], name="testgen_suite_job_idx")]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.job_key} ({self.tests} tests)"
