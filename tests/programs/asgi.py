"""The ASGI application the async server tests run under uvicorn (``tests.programs.asgi:application``)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings_asgi")
application = get_asgi_application()
