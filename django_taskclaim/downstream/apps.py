from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DownstreamConfig(AppConfig):
    """A service that receives fenced calls: its two tables, apart from the task tables."""

    name = "django_taskclaim.downstream"
    label = "taskclaim_downstream"
    verbose_name = _("Fenced calls received")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .checks import register_downstream

        register_downstream()
