from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "example_project.registry"
    label = "registry"
    verbose_name = "Artifact registry (the second service)"
    default_auto_field = "django.db.models.BigAutoField"
