"""A task's progress (``claim.progress()``): the fraction, the note, and the token of the claim that
wrote them. Nullable columns with no default: an instant ALTER on every database, and the stores'
own inserts, which name only the columns they set, need no change."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_taskclaim", "0013_epochs"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="progress",
            field=models.FloatField(blank=True, null=True, verbose_name="progress"),
        ),
        migrations.AddField(
            model_name="task",
            name="progress_note",
            field=models.CharField(blank=True, max_length=255, null=True, verbose_name="progress note"),
        ),
        migrations.AddField(
            model_name="task",
            name="progress_token",
            field=models.BigIntegerField(blank=True, null=True, verbose_name="progress written by token"),
        ),
    ]
