"""The admin in a real headless Chromium (the Debian package) against a live server.

An operator logs in, finds the RUNNING task, runs *release* on it and reads the message;
the database then shows the task PENDING and the worker's old claim is fenced off.
A screenshot is saved to ``artifacts/`` (the run's test artifact); when a test fails, the page the
browser last saw (its address, HTML and a screenshot) is saved there too.

Every step waits (``WebDriverWait``) for the exact element it uses next on the page it expects:
a page's content can be in the DOM before the page has loaded, and a navigation started then may
return while the old page is still the one being read (the Queues link was once not found).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.models import Attempt, Task

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
TIMEOUT = 20


def save_page(driver: Any, name: str) -> list[Path]:
    """Save what ``driver`` shows, to read after a failed run: its address and HTML
    (``NAME.html``) and a screenshot (``NAME.png``), under ``artifacts/``. Never raises: a browser
    that cannot answer any more is named in the HTML file instead."""
    ARTIFACTS.mkdir(exist_ok=True)
    html, png = ARTIFACTS / f"{name}.html", ARTIFACTS / f"{name}.png"
    try:
        html.write_text(f"<!-- {driver.current_url} -->\n{driver.page_source}")
    except Exception as exc:  # noqa: BLE001 - the run's own failure is the one reported
        html.write_text(f"<!-- the browser could not be read: {exc!r} -->\n")
    saved = [html]
    try:
        if driver.save_screenshot(str(png)):
            saved.append(png)
    except Exception:  # noqa: BLE001, S110 - the HTML above is the artifact that matters
        pass
    return saved


def failed_page_name(nodeid: str) -> str:
    """``browser-failed-<test>-<database>``: a file name per test and database (CI keeps artifacts/)."""
    test = nodeid.rsplit("::", 1)[-1]
    return f"browser-failed-{test}-{os.environ.get('TASKCLAIM_TEST_DB', 'sqlite')}"


@pytest.fixture
def browser(request: pytest.FixtureRequest) -> Iterator[Any]:
    from tests.conftest import requirement_missing

    for binary in (CHROMIUM, CHROMEDRIVER):
        if not os.access(binary, os.X_OK):
            requirement_missing(f"{binary} (Debian packages chromium, chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        requirement_missing("selenium")
    profile = tempfile.mkdtemp(prefix="taskclaim-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1400,1000", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(TIMEOUT)
    failures = request.session.testsfailed
    try:
        yield driver
        if request.session.testsfailed > failures:  # this test's call failed (counted before teardown)
            for path in save_page(driver, failed_page_name(request.node.nodeid)):
                print(f"the page the browser saw is saved in {path}")
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def loaded(by: str, selector: str) -> Any:
    """A wait's condition: the page has loaded (``document.readyState`` is ``complete``) and the
    element is there, visible and enabled; the element, for the step that uses it."""
    from selenium.webdriver.support import expected_conditions as ec

    clickable = ec.element_to_be_clickable((by, selector))

    def condition(driver: Any) -> Any:
        if driver.execute_script("return document.readyState") != "complete":
            return False
        return clickable(driver)

    return condition


def log_in(browser: Any, wait: Any, url: str) -> None:
    """Log in as ``oncall`` through the admin's own login form at ``url``, and wait until the
    login page has gone (the page after it is the caller's to wait for)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    browser.get(url)
    wait.until(loaded(By.NAME, "username")).send_keys("oncall")
    browser.find_element(By.NAME, "password").send_keys("correct horse")
    submit = browser.find_element(By.CSS_SELECTOR, "input[type=submit]")
    submit.click()
    wait.until(ec.staleness_of(submit))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_operator_releases_a_running_task_in_the_browser(browser, live_server) -> None:  # type: ignore[no-untyped-def]
    from django.contrib.auth.models import Permission, User
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    user = User.objects.create_user("oncall", password="correct horse", is_staff=True)  # noqa: S106
    user.user_permissions.set(Permission.objects.filter(
        content_type__app_label="django_taskclaim", codename__in=["view_task", "release_task"]))
    worker_claim = Task.objects.claim("nightly-report", tenant="acme", owner="worker-7",
                                      lease=600).claim
    assert worker_claim is not None
    Task.objects.ensure("waiting-1", tenant="acme")
    done = Task.objects.claim("done-1", tenant="acme").claim
    assert done
    done.complete("ok")
    wait = WebDriverWait(browser, TIMEOUT)

    # Log in through the real admin login form.
    log_in(browser, wait, f"{live_server.url}/admin/login/?next=/admin/django_taskclaim/task/")
    wait.until(loaded(By.ID, "result_list"))

    # Find the RUNNING task: filter by status, then pick its row.
    list_page = browser.find_element(By.ID, "result_list")
    wait.until(ec.element_to_be_clickable((By.LINK_TEXT, "Running"))).click()
    wait.until(ec.staleness_of(list_page))
    wait.until(ec.url_contains("status__exact=running"))
    wait.until(loaded(By.ID, "result_list"))
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 1
    row = rows[0]
    assert "nightly-report" in row.text and "worker-7" in row.text and "left" in row.text
    row.find_element(By.CSS_SELECTOR, "input.action-select").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("release")
    go = browser.find_element(By.CSS_SELECTOR, "button[name=index]")
    go.click()
    wait.until(ec.staleness_of(go))  # the list posted to, not the page that posted

    message = wait.until(loaded(By.CSS_SELECTOR, "ul.messagelist li"))
    assert message.text == "Released 1 task; its owner is fenced off."
    ARTIFACTS.mkdir(exist_ok=True)
    vendor = os.environ.get("TASKCLAIM_TEST_DB", "sqlite")
    assert browser.save_screenshot(str(ARTIFACTS / f"admin-release-{vendor}.png"))

    task = Task.objects.get(key="nightly-report", tenant="acme")
    assert task.status == Task.Status.PENDING and task.owner == ""
    with pytest.raises(StaleClaim):
        worker_claim.complete({"late": True})
    assert Task.objects.get(pk=task.pk).status == Task.Status.PENDING
    attempt = Attempt.objects.get(task=task, token=worker_claim.token)
    assert attempt.outcome == "released" and attempt.stale_writes == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_operator_cancels_a_task_from_its_page_and_reads_the_queues(browser, live_server) -> None:  # type: ignore[no-untyped-def]
    """The task page's Cancel button (a POST form with its CSRF token, in a real browser), then
    the queue overview linked from the list."""
    from django.contrib.auth.models import Permission, User
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    user = User.objects.create_user("oncall", password="correct horse", is_staff=True)  # noqa: S106
    user.user_permissions.set(Permission.objects.filter(
        content_type__app_label="django_taskclaim", codename__in=["view_task", "cancel_task"]))
    task = Task.objects.ensure("mail-7", queue="emails", task_path="shop.tasks.send_mail")
    wait = WebDriverWait(browser, TIMEOUT)
    log_in(browser, wait, f"{live_server.url}/admin/login/?next=/admin/django_taskclaim/task/{task.pk}/change/")
    cancel = "//ul[@class='object-tools']//button[text()='Cancel']"
    button = wait.until(loaded(By.XPATH, cancel))
    button.click()
    wait.until(ec.staleness_of(button))  # the page after the POST, not the one that posted
    message = wait.until(loaded(By.CSS_SELECTOR, "ul.messagelist li"))
    assert message.text == f"Cancelled task {task.pk}."
    assert Task.objects.get(pk=task.pk).status == Task.Status.CANCELLED
    assert not browser.find_elements(By.XPATH, cancel)

    Task.objects.ensure("mail-8", queue="emails", task_path="shop.tasks.send_mail")
    task_page = browser.find_element(By.TAG_NAME, "html")
    browser.get(f"{live_server.url}/admin/django_taskclaim/task/")
    # The list, loaded: not the task's page, which get() may return on while it still loads.
    wait.until(ec.staleness_of(task_page))
    queues = wait.until(loaded(By.CSS_SELECTOR, "ul.object-tools a[href$='/task/queues/']"))
    queues.click()
    wait.until(ec.staleness_of(queues))
    table = wait.until(loaded(By.ID, "queues"))
    assert [c.text for c in table.find_elements(By.CSS_SELECTOR, "tbody td")][:4] == ["emails", "1", "0", "0"]


#: The dashboard's screenshot the README shows; written when TASKCLAIM_DOCS_SCREENSHOT is set (a run
#: that refreshes it), else the run's artifacts/ only.
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_dashboard_charts_a_real_worker_s_run(browser, live_server, worker_env) -> None:  # type: ignore[no-untyped-def]
    """Django tasks run by a real ``manage.py taskclaim_worker`` process, some succeeding, some
    failing; the dashboard, opened as staff with the view permission, charts those numbers."""
    import subprocess
    import sys

    from django.contrib.auth.models import Permission, User
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.testapp.tasks import add, fails

    user = User.objects.create_user("oncall", password="correct horse", is_staff=True)  # noqa: S106
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_taskclaim",
                                                        codename="view_task"))
    for i in range(6):
        add.enqueue(i, 1)
    for i in range(3):
        fails.enqueue(f"card {i} declined")
    worker = subprocess.run([sys.executable, "-m", "django", "taskclaim_worker", "--until-drained"],
                            cwd=Path(__file__).resolve().parents[2], env=worker_env, capture_output=True,
                            text=True, timeout=180)
    assert worker.returncode == 0, worker.stderr
    running = Task.objects.claim("nightly-export", owner="worker-7", lease=600).claim
    assert running is not None
    running.progress(0.6, "600k of 1M rows")
    added, failing = "default · tests.testapp.tasks.add", "default · tests.testapp.tasks.fails"
    expected = {
        (added, "succeeded"): Attempt.objects.filter(task__task_path="tests.testapp.tasks.add",
                                                     outcome="succeeded").count(),
        (failing, "failed"): Attempt.objects.filter(task__task_path="tests.testapp.tasks.fails",
                                                    outcome__in=("failed", "retry")).count(),
    }
    assert expected == {(added, "succeeded"): 6, (failing, "failed"): expected[(failing, "failed")]}
    assert expected[(failing, "failed")] >= 3

    wait = WebDriverWait(browser, TIMEOUT)
    browser.set_window_size(1100, 1000)
    log_in(browser, wait, f"{live_server.url}/admin/login/?next=/admin/django_taskclaim/task/dashboard/")
    chart = wait.until(loaded(By.CSS_SELECTOR, "svg[data-chart='per-group']"))
    shown = {(r.get_attribute("data-group"), r.get_attribute("data-series")): int(r.get_attribute("data-value"))
             for r in chart.find_elements(By.CSS_SELECTOR, "rect")}
    assert shown[(added, "succeeded")] == expected[(added, "succeeded")]
    assert shown[(failing, "failed")] == expected[(failing, "failed")]
    # The bars are drawn (a size the browser laid out), not only present in the markup.
    assert all(r.size["width"] > 0 for r in chart.find_elements(By.CSS_SELECTOR, "rect"))
    over_time = browser.find_element(By.CSS_SELECTOR, "svg[data-chart='over-time']")
    assert sum(int(r.get_attribute("data-value")) for r in over_time.find_elements(By.CSS_SELECTOR, "rect")) \
        == Attempt.objects.exclude(outcome="duplicate").count()
    run = browser.find_element(By.CSS_SELECTOR, "svg[data-chart='run']")
    assert {r.get_attribute("data-group") for r in run.find_elements(By.CSS_SELECTOR, "rect")} >= {added, failing}
    table = browser.find_element(By.ID, "running")
    assert "nightly-export" in table.text and "worker-7" in table.text and "60% 600k of 1M rows (token 1)" in table.text
    ARTIFACTS.mkdir(exist_ok=True)
    vendor = os.environ.get("TASKCLAIM_TEST_DB", "sqlite")
    assert browser.save_screenshot(str(ARTIFACTS / f"admin-dashboard-{vendor}.png"))
    if os.environ.get("TASKCLAIM_DOCS_SCREENSHOT"):
        assert browser.save_screenshot(str(DOCS_SCREENSHOT))
