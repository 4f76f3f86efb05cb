"""The test settings with the async views' URLs, for the ASGI app served by uvicorn in the tests."""

from tests.settings import *  # noqa: F403

ROOT_URLCONF = "tests.programs.async_views"
