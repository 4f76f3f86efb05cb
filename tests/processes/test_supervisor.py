"""``taskclaim_worker --processes P``: a supervisor restarts a child that dies, with a backoff when they
die in quick succession; SIGTERM lets the tasks in hand finish within ``--grace``, gives back the ones
not started (attempts unchanged) and exits 0; a child still busy after the grace is killed; children do
not outlive a supervisor killed with SIGKILL. ``--grace`` holds for a single worker process too."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from devtools.polling import wait_until
from devtools.processes import Child, Supervisor
from django_taskclaim.models import Task
from django_taskclaim.supervisor import OVERTIME, STUCK, Backoff
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)
GATED = "tests.programs.worker_handlers.waits_for_the_gate"


def supervisor(processes: Supervisor, handler: str, *extra: str, env: dict[str, str] | None = None) -> Child:
    return processes.start("django", "taskclaim_worker", handler, "--json", *extra,
                           env={"TASKCLAIM_TEST_POLL_INTERVAL": "0.05", **(env or {})})


def gone(pid: int) -> bool:
    """Whether process ``pid`` ended (no longer there, or a zombie nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def started_tasks(where: Path) -> dict[str, int]:
    """Key -> pid of the attempts the gated handler began (files ``key.attempt.pid``)."""
    return {p.name.split(".")[0]: int(p.name.split(".")[2]) for p in where.glob("*.*.*")}


def test_the_backoff_doubles_while_children_die_young_and_starts_over_after_a_long_life() -> None:
    backoff = Backoff(first=0.5, cap=30, steady=30)
    assert [backoff.after(1) for _ in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert backoff.after(31) == 0.5
    assert backoff.after(2) == 1


def test_a_child_killed_is_started_again_and_sigterm_stops_them_all_with_exit_0(processes: Supervisor) -> None:
    boss = supervisor(processes, "tests.programs.worker_handlers.effect", "--processes", "2")
    first = {boss.event("worker_started", timeout=60)["pid"] for _ in range(2)}
    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    died = boss.event("worker_died", timeout=30)
    assert (died["pid"], died["how"], died["restart_in"]) == (victim, "signal SIGKILL", 0.5)
    again = boss.event("worker_started", timeout=60)
    assert again["slot"] == died["slot"] and again["pid"] not in first
    Task.objects.ensure("after-the-restart", queue="default")  # the restarted child works
    wait_until(lambda: Effect.objects.filter(task_key="after-the-restart").exists(), timeout=60,
               what="the task to be run after the restart")
    boss.signal(signal.SIGTERM)
    assert boss.wait(60) == 0, boss.stderr()
    stopped = [e for e in boss.events if e.get("event") == "worker_stopped"]
    # 0, or SIGTERM's own default for a child still starting (its interpreter not yet set up: it
    # had claimed nothing); the supervisor counts both as clean.
    assert len(stopped) == 2 and all(e["exitcode"] in (0, -signal.SIGTERM) for e in stopped), stopped
    assert all(gone(pid) for pid in first | {again["pid"]})


@pytest.mark.slow
def test_a_task_that_kills_its_worker_cannot_make_the_supervisor_spin(processes: Supervisor) -> None:
    """Tasks that each SIGKILL the worker that starts them: each restart waits twice as long as the
    one before (0.5 s, 1 s, 2 s), measured between the death and the next start. Slow (about 10 s:
    3.5 s of backoff and four start-ups of Django) because the backoff is what it measures."""
    for i in range(4):
        Task.objects.ensure(f"killer{i}", queue="default", max_attempts=1)
    boss = supervisor(processes, "tests.programs.worker_handlers.kills_itself_or_counts", "--processes", "1",
                      "--lease", "60")
    boss.event("worker_started", timeout=60)
    processes.events.stamp = "at"  # arrival times from here on
    delays, gaps = [], []
    for _ in range(3):
        died = boss.event("worker_died", timeout=60)
        restarted = boss.event("worker_started", timeout=60)
        delays.append(died["restart_in"])
        gaps.append(restarted["at"] - died["at"])
    assert delays == [0.5, 1, 2]
    assert all(gap >= delay - 0.05 for gap, delay in zip(gaps, delays, strict=True)), gaps
    boss.signal(signal.SIGTERM)
    assert boss.wait(60) == 0, boss.stderr()


def test_a_task_that_exits_2_is_a_death_restarted_not_a_refusal_that_stops_the_fleet(processes: Supervisor) -> None:
    """A task body ends its worker with exit code 2 mid-run (``os._exit(2)``). The child had become
    ready: that is a death, not a refusal of its options. It is started again, the others go on, the
    40 other tasks run once each (one attempt), and the killer's task comes back after its lease, the
    one task charged for the death (its batch-mate, reserved, is not). It used to stop every worker
    and exit 2, the 40 tasks left pending and the killer RUNNING."""
    for i in range(20):
        Task.objects.ensure(f"t{i:02d}", queue="default", max_attempts=3)
    Task.objects.ensure("killer", queue="default", max_attempts=3)
    for i in range(20, 40):
        Task.objects.ensure(f"t{i:02d}", queue="default", max_attempts=3)
    boss = supervisor(processes, "tests.programs.worker_handlers.exits_2_once", "--processes", "2", "--batch", "2",
                      "--lease", "2", "--until-drained")
    died = boss.event("worker_died", timeout=120)
    assert (died["exitcode"], died["how"]) == (2, "exit code 2")
    assert boss.wait(120) == 0, boss.stderr()
    assert not [e for e in boss.events if e.get("event") == "worker_refused"]
    tasks = {t.key: (t.status, t.attempts) for t in Task.objects.all()}
    assert tasks.pop("killer") == (Task.Status.SUCCEEDED, 2)  # charged once for the death, then ran
    assert tasks == {f"t{i:02d}": (Task.Status.SUCCEEDED, 1) for i in range(40)}
    assert Effect.objects.count() == 41 and Effect.objects.filter(task_key="killer").count() == 1


def test_a_worker_whose_sync_task_is_stuck_past_its_timeout_is_replaced_and_the_rest_run_once(
        processes: Supervisor, tmp_path: Path) -> None:
    """A sync task that loops for ever, heedless of its 1 s timeout, under ``--processes 1
    --concurrency 2`` with 20 tasks queued behind it. At the timeout its attempt is fenced off and
    recorded ``TimedOut`` (its task FAILED: one attempt allowed); 1 s later (``--hard-timeout-grace``)
    its worker stops claiming, lets its other task in flight finish, gives back its spare claims
    uncharged and exits; the supervisor starts another, which runs the rest. Every task ran once
    (one start, one attempt), the stuck one never again. It used to hold its slot for ever."""
    Task.objects.ensure("stuck", queue="default", max_attempts=1)
    for i in range(20):
        Task.objects.ensure(f"t{i:02d}", queue="default", max_attempts=1)
    boss = supervisor(processes, "tests.programs.worker_handlers.stuck_or_paced", "--processes", "1",
                      "--concurrency", "2", "--timeout", "1", "--hard-timeout-grace", "1", "--lease", "30",
                      "--until-drained", env={"TASKCLAIM_TEST_STARTED_DIR": str(tmp_path)})
    first = boss.event("worker_started", timeout=60)["pid"]
    died = boss.event("worker_died", timeout=60)
    assert (died["pid"], died["exitcode"]) == (first, STUCK), died
    assert boss.event("worker_started", timeout=60)["pid"] != first
    assert boss.wait(120) == 0, boss.stderr()
    starts = sorted(p.name.rsplit(".", 1)[0] for p in tmp_path.glob("*.*.*"))
    assert starts == sorted([f"t{i:02d}.1" for i in range(20)] + ["stuck.1"])  # each began once, first attempt
    assert started_tasks(tmp_path)["stuck"] == first
    stuck = Task.objects.get(key="stuck")
    assert (stuck.status, stuck.attempts) == (Task.Status.FAILED, 1) and "TimedOut" in stuck.error
    tasks = {t.key: (t.status, t.attempts) for t in Task.objects.exclude(key="stuck")}
    assert tasks == {f"t{i:02d}": (Task.Status.SUCCEEDED, 1) for i in range(20)}
    assert sorted(Effect.objects.values_list("task_key", flat=True)) == [f"t{i:02d}" for i in range(20)]


def test_sigterm_finishes_the_tasks_in_hand_and_gives_back_the_ones_not_started(
        processes: Supervisor, tmp_path: Path) -> None:
    """Two children, each holding one task started (in the handler, waiting for the test's gate) and
    one reserved (``--batch 2``). SIGTERM: the started ones finish, the reserved ones go back PENDING
    with no attempt counted, every child exits 0, then the supervisor."""
    for i in range(4):
        Task.objects.ensure(f"t{i}", queue="default", max_attempts=3)
    boss = supervisor(processes, GATED, "--processes", "2", "--batch", "2", "--grace", "60",
                      env={"TASKCLAIM_TEST_STARTED_DIR": str(tmp_path)})
    started = wait_until(lambda: len(set(started_tasks(tmp_path).values())) == 2 and started_tasks(tmp_path),
                         timeout=60, what="each child to start a task")
    boss.signal(signal.SIGTERM)
    # Forwarded: each child's handler ran as the signal arrived (it interrupts the gated handler's
    # sleep), so the tasks in hand finish after the stop, and nothing more starts.
    assert boss.event("stopping", timeout=30)["signal"] == "SIGTERM"
    (tmp_path / "gate").touch()
    assert boss.wait(60) == 0, boss.stderr()
    tasks = {t.key: (t.status, t.attempts) for t in Task.objects.all()}
    assert {k: v for k, v in tasks.items() if k in started} == dict.fromkeys(started, (Task.Status.SUCCEEDED, 1))
    assert {k: v for k, v in tasks.items() if k not in started} == {
        k: (Task.Status.PENDING, 0) for k in tasks if k not in started}
    assert len(started) == 2 and Effect.objects.count() == 2
    assert sorted(e["exitcode"] for e in boss.events if e.get("event") == "worker_stopped") == [0, 0]


def test_a_child_still_busy_after_the_grace_is_stopped_and_its_task_left_to_its_lease(
        processes: Supervisor, tmp_path: Path) -> None:
    Task.objects.ensure("stuck", queue="default")
    boss = supervisor(processes, GATED, "--processes", "2", "--grace", "1", "--lease", "60",
                      env={"TASKCLAIM_TEST_STARTED_DIR": str(tmp_path)})
    wait_until(lambda: started_tasks(tmp_path), timeout=60, what="a child to start the task")
    boss.signal(signal.SIGTERM)
    assert boss.wait(30) == OVERTIME, boss.stderr()
    assert sorted(e["exitcode"] for e in boss.events if e.get("event") == "worker_stopped") == [0, OVERTIME]
    assert Task.objects.get(key="stuck").status == Task.Status.RUNNING  # back when its lease expires


def test_a_single_worker_still_busy_after_its_grace_exits(processes: Supervisor, tmp_path: Path) -> None:
    Task.objects.ensure("stuck", queue="default")
    worker = supervisor(processes, GATED, "--grace", "0.5", env={"TASKCLAIM_TEST_STARTED_DIR": str(tmp_path)})
    wait_until(lambda: started_tasks(tmp_path), timeout=60, what="the worker to start the task")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == OVERTIME, worker.stderr()
    assert Task.objects.get(key="stuck").status == Task.Status.RUNNING


def test_children_do_not_outlive_a_supervisor_killed_with_sigkill(processes: Supervisor) -> None:
    boss = supervisor(processes, "tests.programs.worker_handlers.effect", "--processes", "2")
    children = [boss.event("worker_started", timeout=60)["pid"] for _ in range(2)]
    boss.kill()
    wait_until(lambda: all(gone(pid) for pid in children), timeout=30, what="the children to exit")


def test_a_child_that_does_not_stop_by_itself_is_killed_after_the_grace(processes: Supervisor, tmp_path: Path) -> None:
    """Each child holds a task in hand; one is frozen (SIGSTOP: it cannot even run its own grace
    timer) and is SIGKILLed by the supervisor a second after the grace; the other finishes its
    task and stops cleanly."""
    for i in range(2):
        Task.objects.ensure(f"t{i}", queue="default")
    boss = supervisor(processes, GATED, "--processes", "2", "--grace", "1",
                      env={"TASKCLAIM_TEST_STARTED_DIR": str(tmp_path)})
    started = wait_until(lambda: len(set(started_tasks(tmp_path).values())) == 2 and started_tasks(tmp_path),
                         timeout=60, what="each child to start a task")
    frozen_key, frozen = sorted(started.items())[0]
    os.kill(frozen, signal.SIGSTOP)
    boss.signal(signal.SIGTERM)
    assert boss.event("stopping", timeout=30)["signal"] == "SIGTERM"
    (tmp_path / "gate").touch()
    assert boss.wait(30) == OVERTIME, boss.stderr()
    stopped = {e["pid"]: e["how"] for e in boss.events if e.get("event") == "worker_stopped"}
    assert stopped == {pid: "signal SIGKILL" if pid == frozen else "exit code 0" for pid in started.values()}
    assert Task.objects.get(key=frozen_key).status == Task.Status.RUNNING  # back when its lease expires
    assert Task.objects.exclude(key=frozen_key).get().status == Task.Status.SUCCEEDED


def test_a_child_that_is_done_exits_within_the_grace_however_long_its_interpreter_takes_to_tear_down(
        processes: Supervisor, tmp_path: Path) -> None:
    """A child holding nothing stops at once on SIGTERM: it leaves without the interpreter's
    teardown (here an object's finaliser of 3 s, past the 1 s grace and its margin; in the wild,
    seconds of tearing down Django's heap on loaded cores), so the supervisor does not kill it
    and exits 0, not 75. The exit hooks still run (a user's flush of its telemetry)."""
    Task.objects.ensure("first", queue="default")
    boss = supervisor(processes, "tests.programs.slow_teardown.effect", "--processes", "1", "--grace", "1",
                      env={"TASKCLAIM_TEST_STARTED_DIR": str(tmp_path)})
    wait_until(lambda: Effect.objects.filter(task_key="first").exists(), timeout=60, what="the child to run a task")
    boss.signal(signal.SIGTERM)
    assert boss.wait(30) == 0, boss.stderr()
    stopped = [(e["pid"], e["how"]) for e in boss.events if e.get("event") == "worker_stopped"]
    assert [how for _, how in stopped] == ["exit code 0"]
    assert (tmp_path / f"atexit.{stopped[0][0]}").exists()


def test_hard_timeout_grace_without_processes_is_refused() -> None:
    """Nothing would start another worker: a usage error, before anything is claimed."""
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    Task.objects.ensure("t", queue="default")
    with pytest.raises(CommandError, match="--hard-timeout-grace is for --processes") as refused:
        call_command("taskclaim_worker", "tests.programs.worker_handlers.effect", "--hard-timeout-grace", "1",
                     stdout=io.StringIO())
    assert refused.value.returncode == 2 and Task.objects.get(key="t").status == Task.Status.PENDING


def test_a_child_that_refuses_its_options_before_it_is_ready_still_stops_the_fleet_with_exit_2(
        processes: Supervisor) -> None:
    """The other side of an exit 2: a child that refuses its options while it starts (here a schedule
    it cannot fire, which only a child reads when the supervisor was started with ``--skip-checks``)
    never became ready: that is a usage error, not a death to restart after; the supervisor stops the
    others and exits 2, and nothing was claimed."""
    Task.objects.ensure("t", queue="default")
    unfireable = '{"bad": {"task": "no.such.task", "every": 60}}'
    boss = supervisor(processes, "tests.programs.worker_handlers.effect", "--processes", "2", "--schedule",
                      "--skip-checks", env={"TASKCLAIM_TEST_SCHEDULES": unfireable})
    assert boss.wait(120) == 2, boss.stderr()
    assert [e for e in boss.events if e.get("event") == "worker_refused"], boss.events
    assert not [e for e in boss.events if e.get("event") == "worker_died"]
    assert Task.objects.get(key="t").status == Task.Status.PENDING
    assert "TASKCLAIM_SCHEDULES['bad']['task']: 'no.such.task' does not import" in boss.stderr()
