"""The outbox (issue 34): ``OutboxMessage``, the messages ``claim.outbox.http()`` records inside
``fenced()`` with the completion and ``manage.py taskclaim_relay`` delivers. The relay's claim reads
pending messages by id: a partial index on PostgreSQL and SQLite (MySQL/MariaDB have no partial
indexes and create none: the table holds what is waiting or recently answered)."""

import django.utils.timezone
from django.db import migrations, models

from django_taskclaim.compat import check_constraint


class Migration(migrations.Migration):

    dependencies = [
        ('django_taskclaim', '0006_wakeup_trigger'),
    ]

    operations = [
        migrations.CreateModel(
            name='OutboxMessage',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('tenant', models.CharField(blank=True, default='', max_length=255, verbose_name='tenant')),
                ('task_key', models.CharField(max_length=255, verbose_name='task key')),
                ('token', models.BigIntegerField(verbose_name='fencing token')),
                ('effect', models.CharField(blank=True, default='', max_length=255, verbose_name='effect')),
                ('idempotency_key', models.CharField(max_length=68, verbose_name='idempotency key')),
                ('method', models.CharField(max_length=8, verbose_name='method')),
                ('url', models.CharField(max_length=2048, verbose_name='URL')),
                ('body', models.JSONField(blank=True, null=True, verbose_name='JSON body')),
                ('status', models.CharField(choices=[('pending', 'Pending'), ('delivered', 'Delivered'), ('failed', 'Failed')], default='pending', max_length=16, verbose_name='status')),
                ('attempts', models.PositiveIntegerField(default=0, verbose_name='attempts')),
                ('next_try_at', models.DateTimeField(blank=True, null=True, verbose_name='next try')),
                ('answer_status', models.PositiveIntegerField(blank=True, null=True, verbose_name="last answer's status code")),
                ('answer_excerpt', models.TextField(blank=True, default='', verbose_name='last answer (excerpt)')),
                ('relay_owner', models.CharField(blank=True, default='', max_length=255, verbose_name='relay')),
                ('relay_token', models.BigIntegerField(default=0, verbose_name='relay token')),
                ('lease_expires_at', models.DateTimeField(blank=True, null=True, verbose_name='relay lease expires at')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='created at')),
                ('delivered_at', models.DateTimeField(blank=True, null=True, verbose_name='answered at')),
            ],
            options={
                'verbose_name': 'outbox message',
                'verbose_name_plural': 'outbox messages',
                'ordering': ['-id'],
                'indexes': [models.Index(condition=models.Q(('status', 'pending')), fields=['id'], name='taskclaim_outbox_pending_idx'), models.Index(fields=['idempotency_key'], name='taskclaim_outbox_idem_idx')],
                'constraints': [check_constraint(condition=models.Q(('status__in', ['pending', 'delivered', 'failed'])), name='taskclaim_outbox_status_valid')],
            },
        ),
    ]
