"""Async views under a real ASGI server: two uvicorn processes, concurrent requests for one key."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from devtools.processes import Supervisor
from devtools.servers import _wait_for_port, free_port
from django_taskclaim.models import Attempt, Task
from tests.conftest import ROOT, child_env
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def servers(django_db_setup: None) -> Iterator[list[str]]:
    """Two uvicorn processes serving tests/programs/asgi.py on the test database, shared by the
    module's tests: started once (their start-up is most of a test's time), ended after the last.
    Each request opens and closes its own connection (request_finished), so the tables each test
    empties hold nothing of the servers' between tests."""
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings_asgi"}
    with Supervisor(env=child_env(), cwd=ROOT) as processes:
        procs, urls = [], []
        for _ in range(2):
            port = free_port()
            procs.append(processes.start("uvicorn", "tests.programs.asgi:application", "--host", "127.0.0.1",
                                         "--port", str(port), "--lifespan", "off", "--no-access-log", env=env))
            urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(procs, urls, strict=True):
            _wait_for_port(int(url.rsplit(":", 1)[1]), time.monotonic() + 60, "uvicorn", proc.proc)  # type: ignore[arg-type]
        yield urls
        assert all(proc.alive() for proc in procs), processes.failures()


async def post_all(urls: list[str], path: str, per_server: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=100)) as client:
        return await asyncio.gather(*(client.post(url + path) for url in urls for _ in range(per_server)))


def test_concurrent_requests_for_one_key_on_two_server_processes_run_the_work_once(servers) -> None:  # type: ignore[no-untyped-def]
    responses = asyncio.run(post_all(servers, "/run/report-7?work=0.5", per_server=8))
    assert [r.status_code for r in responses] == [200] * 16, [r.text for r in responses]
    bodies = [r.json() for r in responses]
    assert len({b["served_by"] for b in bodies}) == 2  # both server processes answered
    effect = Effect.objects.get()  # one execution among 16 requests
    assert all(b["result"] == {"key": "report-7", "by": effect.worker} for b in bodies)
    outcomes = Counter(Attempt.objects.values_list("outcome", flat=True))
    assert outcomes["succeeded"] == 1 and outcomes["running"] == 0


def test_on_busy_raise_answers_409_to_every_request_but_the_one_that_runs(servers) -> None:  # type: ignore[no-untyped-def]
    responses = asyncio.run(post_all(servers, "/run/report-8?on_busy=raise&work=2", per_server=6))
    codes = Counter(r.status_code for r in responses)
    # The requests that arrive while it runs are refused; any arriving after it ended read the result.
    assert set(codes) == {200, 409} and codes[409] >= 1, codes
    assert len({r.text.split('"served_by"')[0] for r in responses if r.status_code == 200}) == 1
    assert Effect.objects.count() == 1
    assert Task.objects.get().status == "succeeded"


def test_the_fenced_view_under_uvicorn(servers) -> None:  # type: ignore[no-untyped-def]
    first = asyncio.run(post_all(servers[:1], "/fenced/pay-9", per_server=1))[0].json()
    second = asyncio.run(post_all(servers[1:], "/fenced/pay-9", per_server=1))[0].json()
    assert first == {"claimed": True, "token": 1}
    assert second == {"claimed": False, "status": "succeeded", "result": {"token": 1}}
