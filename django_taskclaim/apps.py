from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class TaskClaimConfig(AppConfig):
    name = "django_taskclaim"
    label = "django_taskclaim"
    verbose_name = _("Task claims")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, contrib
        from .schedules import checks as schedule_checks

        checks.register()
        contrib.register_checks()
        schedule_checks.register()
