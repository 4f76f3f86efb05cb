"""``python -m example_project.simulator.registry_server [--port N]``: the registry over HTTP on 127.0.0.1.

Migrates its own SQLite file, then serves with the standard library's ``wsgiref``: no server
package on a fresh machine, one request at a time (which suits SQLite's single writer, and the
relays retry a refused connection). ``--port 0`` (the default) takes a free port; the process
says which on stdout as one JSON line ``{"event": "ready", "port": N}``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m example_project.simulator.registry_server")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    args = parser.parse_args()
    # The registry's settings, whatever the shell says: it is a second service, not the caller.
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.registry_settings"
    import django

    django.setup()
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from django.conf import settings
    from django.core.management import call_command
    from django.core.wsgi import get_wsgi_application

    from devtools.events import emit

    Path(settings.DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    call_command("migrate", verbosity=0)

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass  # the demo prints its own lines

    server = make_server("127.0.0.1", args.port, get_wsgi_application(), handler_class=Quiet)
    emit(event="ready", port=server.server_port)
    server.serve_forever()


if __name__ == "__main__":
    main()
