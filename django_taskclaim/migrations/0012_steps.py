"""Durable steps (issue 43): ``Step``, a step's stored result under its task (``claim.step(name,
fn)``), written once by a fenced write of the claim that ran it; unique by ``(task, name)``.

Follows 0011 (the outbox's headers).
"""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_taskclaim', '0011_outbox_headers'),
    ]

    operations = [
        migrations.CreateModel(
            name='Step',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=255, verbose_name='name')),
                ('result', models.JSONField(blank=True, null=True, verbose_name='result')),
                ('token', models.BigIntegerField(verbose_name='fencing token')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='stored at')),
                ('task', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='step_set', to='django_taskclaim.task', verbose_name='task')),
            ],
            options={
                'verbose_name': 'step',
                'verbose_name_plural': 'steps',
                'ordering': ['task_id', 'id'],
                'constraints': [models.UniqueConstraint(fields=('task', 'name'), name='taskclaim_step_task_name_uniq')],
            },
        ),
    ]
