from django.db import models


class PublishedArtifact(models.Model):
    """A test suite as the registry received it: one row per ``POST /artifacts/`` that ran.

    Like ``TestSuite``, deliberately without a unique constraint on ``(tenant, job_key)``: the demo
    counts these rows to prove each suite arrived once, so the outbox's idempotency key (checked
    by ``fenced_endpoint``) alone must prevent a second row when a message is delivered again.
    """

    tenant = models.CharField(max_length=255)
    job_key = models.CharField(max_length=255)
    run = models.CharField(max_length=100)
    token = models.BigIntegerField(help_text="Fencing token of the claim that published it.")
    artifact = models.CharField(max_length=1024, help_text="The caller's path, relative to its ARTIFACT_DIR.")
    tests = models.PositiveIntegerField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["run"], name="registry_artifact_run_idx")]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.job_key} ({self.tests} tests)"
