"""Tasks of an installed app, found by autodiscover_tasks()."""

from django_taskclaim.celery import claimed_task


@claimed_task(key="charge-{order_id}", lease=60)
def charge(order_id: int) -> str:
    return f"charged {order_id}"
