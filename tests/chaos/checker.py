"""The checker: reads the final database state and the workers' replies, and judges the run.

Properties (each violation is listed, and makes the run fail):

- **lost**: every enqueued task ended SUCCEEDED, with its final effect written;
- **duplicated**: no task has more than one final effect;
- **token order**: per task, the tokens of accepted effects in commit order (id order; the
  fenced row lock serialises one task's transactions) never go down, and the final effect
  carries the task's last token;
- **effect inside its claim**: each effect's database-clock timestamp (taken inside its fenced
  transaction) lies within its attempt's ``[started_at, ended_at]``;
- **no overlap**: per task, each attempt ended (``ended_at``) no later than the next one began,
  and one that was taken over or reclaimed had every lease it was granted (the expiry the
  database returned for its claim and heartbeats) run out before it ended;
- **stale writes refused and counted**: every ``StaleClaim`` a worker reported is counted in
  ``Attempt.stale_writes`` of that attempt; a count above the reported number is allowed only
  where the reply could be lost (the worker was killed, or its connection failed);
- **no commit lost**: every claim a worker was told had committed is in the final state, with
  its owner, and so is every effect whose commit it reported (a failover to a standby that
  lacks them, a crash that forgot them);
- **no token reused**: per task, the tokens of the claims the workers were granted strictly
  increase in the order the database granted them (their lease expiry, all leases being
  equal), so no token was handed out twice;
- **no effect twice, counting lost ones**: a task's final effect that a worker reported
  committed and that the final state lacks, with another final effect in its place, happened
  twice (once on a server that is gone).
- **no step called twice**: a durable step (``claim.step``, each step's work but the last) is not
  called again once its result is stored: no call by a later token than the one that stored it,
  and one call by that one. Calls by earlier tokens are the documented window (their owner died,
  or was fenced off, between the call and the store) and are counted, not refused.

It reads the events by task key, not by id: a server that lost commits may give a later task
an id that an earlier, lost one had.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Verdict:
    figures: dict[str, int] = field(default_factory=dict)
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    #: When the harness received each reply of a commit that the final state lacks.
    lost_seen: list[float] = field(default_factory=list)

    def add(self, kind: str, message: str) -> None:
        self.violations[kind].append(message)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())


def parse_time(value: Any) -> dt.datetime | None:
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromisoformat(str(value))


def load_state() -> dict[str, Any]:
    """Everything the checker reads from the database, as plain values."""
    from django_taskclaim.models import Attempt, Step, Task
    from tests.testapp.models import Effect

    return {
        "tasks": list(Task.objects.values("id", "key", "status", "fencing_token", "attempts",
                                          "concurrency_key", "concurrency_limit", "created_at")),
        "attempts": list(Attempt.objects.values(
            "id", "task_id", "token", "owner", "started_at", "ended_at", "outcome", "stale_writes",
        )),
        "effects": list(Effect.objects.order_by("id").values(
            "id", "task_key", "token", "worker", "created_at",
        )),
        "steps": list(Step.objects.values("task_id", "name", "token")),
    }


def check(state: dict[str, Any], events: list[dict[str, Any]], enqueued: list[str],
          killed_pids: set[int]) -> Verdict:
    verdict = Verdict()
    tasks = {t["key"]: t for t in state["tasks"]}
    by_id = {t["id"]: t for t in state["tasks"]}
    attempts: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for a in state["attempts"]:
        if a["token"] is not None:
            attempts[a["task_id"]].append(a)
    effects: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in state["effects"]:
        effects[e["task_key"]].append(e)

    # What the workers replied, per (task id, token).
    granted: dict[tuple[int, int], dt.datetime] = {}
    reported_stale: Counter[tuple[int, int]] = Counter()
    disturbed: set[tuple[int, int]] = set()
    stale_actions: Counter[str] = Counter()
    for ev in events:
        kind = ev.get("event")
        if ev.get("key") is not None:
            if ev["key"] not in tasks:
                continue  # a task the final state lacks: the lost-commit checks report it
            ev = {**ev, "task": tasks[ev["key"]]["id"]}
        ident = (ev["task"], ev["token"]) if "task" in ev and "token" in ev else None
        if ident is None:
            continue
        if kind in ("claimed", "beat") and ev.get("expires"):
            expires = parse_time(ev["expires"])
            assert expires is not None
            if ident not in granted or expires > granted[ident]:
                granted[ident] = expires
        elif kind == "stale":
            reported_stale[ident] += 1
            stale_actions[ev["action"]] += 1
        elif kind in ("dberror", "abandon", "crash"):
            disturbed.add(ident)
    owner_pid = {}
    for a in state["attempts"]:
        if a["token"] is not None:
            try:
                # "w3:pid" (harness workers) or "host:pid:random" (the default owner).
                owner_pid[(a["task_id"], a["token"])] = int(a["owner"].split(":")[1])
            except (IndexError, ValueError):
                verdict.add("harness", f"attempt {a['id']} has an owner the harness did not give: "
                                       f"{a['owner']!r}")

    # Lost / duplicated.
    lost = duplicated = final_effects = 0
    for key in enqueued:
        task = tasks.get(key)
        finals = [e for e in effects.get(key, []) if e["worker"].endswith("#final")]
        final_effects += len(finals)
        if task is None:
            lost += 1
            verdict.add("lost", f"{key}: the task row is gone")
            continue
        if task["status"] != "succeeded":
            lost += 1
            verdict.add("lost", f"{key}: ended {task['status']} (token {task['fencing_token']})")
        elif not finals:
            lost += 1
            verdict.add("lost", f"{key}: SUCCEEDED without its effect")
        if len(finals) > 1:
            duplicated += 1
            verdict.add("duplicated", f"{key}: {len(finals)} final effects, "
                                      f"tokens {[e['token'] for e in finals]}")
        if finals and task is not None and finals[-1]["token"] != task["fencing_token"]:
            verdict.add("token order", f"{key}: final effect token {finals[-1]['token']} "
                                       f"!= task token {task['fencing_token']}")

    # Token order in commit order, and each effect inside its attempt's interval.
    for key, rows in effects.items():
        task = tasks.get(key)
        spans = {a["token"]: a for a in attempts.get(task["id"], [])} if task else {}
        high = None
        for e in rows:
            if high is not None and e["token"] < high:
                verdict.add("token order", f"{key}: effect {e['id']} with token {e['token']} "
                                           f"committed after one with token {high}")
            high = e["token"] if high is None else max(high, e["token"])
            span = spans.get(e["token"])
            if span is None:
                verdict.add("token order", f"{key}: effect {e['id']} carries token {e['token']}, "
                                           "never granted")
                continue
            at = e["created_at"]
            if at < span["started_at"] or (span["ended_at"] is not None and at > span["ended_at"]):
                verdict.add("effect outside claim",
                            f"{key}: effect {e['id']} (token {e['token']}) at {at} outside "
                            f"[{span['started_at']}, {span['ended_at']}] ({span['outcome']})")

    # No two claims of one task overlap on the database clock.
    overlaps = 0
    for task_id, rows in attempts.items():
        rows.sort(key=lambda a: a["token"])
        key = by_id[task_id]["key"] if task_id in by_id else f"task #{task_id}"
        for a, b in zip(rows, rows[1:], strict=False):
            if a["ended_at"] is None or a["ended_at"] > b["started_at"]:
                overlaps += 1
                verdict.add("overlap", f"{key}: token {a['token']} ({a['outcome']}) ended "
                                       f"{a['ended_at']}, token {b['token']} started "
                                       f"{b['started_at']}")
        for a in rows:
            if a["outcome"] == "running":
                verdict.add("overlap", f"{key}: attempt with token {a['token']} still running "
                                       "at the end")
            expiry = granted.get((task_id, a["token"]))
            ended_early = a["outcome"] in ("taken_over", "expired")
            if ended_early and expiry is not None and expiry >= a["ended_at"]:
                overlaps += 1
                verdict.add("overlap", f"{key}: token {a['token']} {a['outcome']} at "
                                       f"{a['ended_at']} while its lease ran until {expiry}")

    # Stale writes: refused (no effect landed, checked above) and counted.
    db_stale = 0
    for a in state["attempts"]:
        if a["token"] is None:
            continue
        ident = (a["task_id"], a["token"])
        db_stale += a["stale_writes"]
        told = reported_stale.get(ident, 0)
        where = f"task {a['task_id']} token {a['token']}"
        undisturbed = ident not in disturbed and owner_pid.get(ident) not in killed_pids
        if told > a["stale_writes"]:
            verdict.add("stale count", f"{where}: {told} refusals reported, "
                                       f"{a['stale_writes']} recorded")
        elif a["stale_writes"] > told and undisturbed:
            verdict.add("stale count", f"{where}: {a['stale_writes']} refusals recorded, {told} "
                                       "reported by an undisturbed worker")

    step_figures = check_steps(state, events, verdict)
    commits = check_commits(state, events, verdict)
    duplicated += commits.pop("duplicated_lost")

    outcomes = Counter(a["outcome"] for a in state["attempts"])
    verdict.figures.update(
        tasks_enqueued=len(enqueued),
        executions_started=sum(len(v) for v in attempts.values()),
        takeovers=outcomes["taken_over"],
        reclaimed=outcomes["expired"],
        retried=outcomes["retry"] + outcomes["released"],
        effects_accepted=final_effects,
        progress_effects=sum(1 for e in state["effects"] if not e["worker"].endswith("#final")),
        stale_refused_db=db_stale,
        stale_reported=sum(reported_stale.values()),
        stale_heartbeat=stale_actions["heartbeat"],
        stale_fenced=stale_actions["fenced write"],
        stale_other=sum(stale_actions.values()) - stale_actions["heartbeat"]
        - stale_actions["fenced write"],
        db_errors_survived=sum(1 for ev in events if ev.get("event") == "dberror"),
        # A connection that landed on a standby: what target_session_attrs=read-write prevents.
        standby_writes=sum(1 for ev in events if ev.get("event") == "dberror"
                           and "read-only transaction" in str(ev.get("message", ""))),
        **commits,
        **step_figures,
        lost=lost,
        duplicated=duplicated,
        overlaps=overlaps,
    )
    return verdict


def owner_of(ev: dict[str, Any]) -> str | None:
    """The owner a worker's event speaks for (the harness's workers say it; Celery's do not)."""
    owner = ev.get("owner")
    return str(owner) if owner else None


def check_steps(state: dict[str, Any], events: list[dict[str, Any]], verdict: Verdict) -> dict[str, int]:
    """Durable steps: the calls of each step (``step_call`` replies) against the token that stored
    it. A call by a later token, or a second by that one, is a step called twice; calls by earlier
    tokens are the window (killed or fenced off between the call and the store). The figures."""
    tasks = {t["key"]: t for t in state["tasks"]}
    stored = {(s["task_id"], s["name"]): s["token"] for s in state.get("steps", [])}
    calls: dict[tuple[int, str], list[int]] = defaultdict(list)
    for ev in events:
        if ev.get("event") == "step_call" and ev.get("key") in tasks:
            calls[(tasks[ev["key"]]["id"], ev["step"])].append(ev["token"])
    twice = rerun = 0
    for (task_id, name), tokens in calls.items():
        by = stored.get((task_id, name))
        if by is None:
            continue  # never stored (its task did not get that far, or was purged)
        again = max(0, tokens.count(by) - 1) + sum(1 for t in tokens if t > by)
        rerun += sum(1 for t in tokens if t < by)
        if again:
            twice += again
            verdict.add("step called twice", f"task {task_id} step {name!r}: stored by token {by}, "
                                             f"called by tokens {sorted(tokens)}")
    return {"steps_stored": len(stored), "step_calls": sum(map(len, calls.values())),
            "step_calls_twice": twice, "step_calls_rerun": rerun}


def check_commits(state: dict[str, Any], events: list[dict[str, Any]], verdict: Verdict) -> dict[str, int]:
    """What the workers saw committed against the final state: lost commits, reused tokens,
    and final effects lost with a server and then executed again. The figures, by name."""
    from tests.chaos.worker import effect_name
    tasks = {t["key"]: t for t in state["tasks"]}
    attempt_owner = {(a["task_id"], a["token"]): a["owner"] for a in state["attempts"]
                     if a["token"] is not None}
    stored = {(e["task_key"], e["token"], e["worker"]) for e in state["effects"]}
    finals: dict[str, set[tuple[int, str]]] = defaultdict(set)
    for e in state["effects"]:
        if e["worker"].endswith("#final"):
            finals[e["task_key"]].add((e["token"], e["worker"].removesuffix("#final")))

    claims: dict[str, list[tuple[dt.datetime, int, str | None]]] = defaultdict(list)
    reported: dict[str, set[tuple[int, str]]] = defaultdict(set)
    claims_lost = effects_lost = 0
    for ev in events:
        kind, key, token = ev.get("event"), ev.get("key"), ev.get("token")
        if key is None or token is None or kind not in ("claimed", "step", "done"):
            continue
        owner = owner_of(ev)
        task = tasks.get(key)
        if kind == "claimed":
            expires = parse_time(ev.get("expires"))
            if expires is not None:
                claims[key].append((expires, token, owner))
            holder = attempt_owner.get((task["id"], token)) if task is not None else None
            if holder is None or (owner is not None and holder != owner):
                claims_lost += 1
                verdict.lost_seen.append(ev.get("seen", 0.0))
                found = ("the task row is gone" if task is None else
                         "no attempt has that token" if holder is None else f"that token is {holder}'s")
                verdict.add("commit lost", f"{key}: claim with token {token} by {owner or 'a worker'} "
                                           f"seen committed; {found}")
            continue
        if owner is None:
            continue
        if kind == "done":
            reported[key].add((token, owner))
        name = f"{owner}#{'final' if kind == 'done' else effect_name(ev.get('step', ''))}"
        if (key, token, name) not in stored:
            effects_lost += 1
            verdict.lost_seen.append(ev.get("seen", 0.0))
            verdict.add("commit lost", f"{key}: effect {name} with token {token} seen committed, "
                                       "not in the final state")

    reused = went_down = 0
    for key, granted in claims.items():
        granted.sort(key=lambda c: c[0])
        times: Counter[int] = Counter(token for _, token, _ in granted)
        for token, n in times.items():
            if n > 1:
                reused += 1
                holders = ", ".join(sorted({o or "?" for _, t, o in granted if t == token}))
                verdict.add("token reused", f"{key}: token {token} granted {n} times ({holders})")
        for (_, a, _), (at, b, _) in zip(granted, granted[1:], strict=False):
            if b < a:
                went_down += 1
                verdict.add("token reused", f"{key}: token {b} granted at {at}, after token {a}")

    # A final effect reported committed, missing now, with another in its place: the task ran
    # twice. (Two final effects in the final state are counted by the caller already.)
    duplicated_lost = 0
    for key, seen in reported.items():
        if len(finals[key]) <= 1 and len(seen | finals[key]) > 1:
            duplicated_lost += 1
            verdict.add("duplicated", f"{key}: final effects of {sorted(seen - finals[key])} reported "
                                      f"committed and lost, then {sorted(finals[key])} committed")
    return {
        "claims_seen": sum(len(v) for v in claims.values()),
        "claims_lost": claims_lost,
        "effects_lost": effects_lost,
        "tokens_reused": reused,
        "tokens_went_down": went_down,
        "duplicated_lost": duplicated_lost,
    }


def recovery(failovers: list[Any], events: list[dict[str, Any]], lease: float,
             lost_seen: Sequence[float] = ()) -> list[dict[str, Any]]:
    """Per failover: seconds from the kill (or the cut) to the promotion, to the first claim the new
    primary granted (its database-clock time: the lease expiry minus the lease) and to the new standby;
    how far behind the standby was; the commits seen before the kill and missing at the end; how
    the primary failed and (cut from etcd) when its own agent demoted it."""
    granted = sorted(t.timestamp() - lease for t in
                     (parse_time(ev.get("expires")) for ev in events if ev.get("event") == "claimed")
                     if t is not None)
    rows = []
    since = float("-inf")
    for f in failovers:
        # A leader cut from etcd still grants claims until its agent demotes it: the first claim
        # of the new leader is the first after that (after the promotion if the demotion went unseen).
        ended = f.killed if f.how != "cut" else f.old_demoted or f.promoted
        first = next((t for t in granted if t >= ended), None)
        lost = sum(1 for seen in lost_seen if since < seen <= f.killed)
        since = f.killed
        rows.append({
            "from": f.old_primary, "to": f.new_primary, "behind": f.standby_behind, "lost": lost,
            "how": f.how, "demoted": None if f.old_demoted is None else f.old_demoted - f.killed,
            "old_leader_claims": sum(1 for t in granted if f.killed <= t < ended),
            "writable": f.promoted - f.killed,
            "first_claim": None if first is None else first - f.killed,
            "standby": None if f.standby_ready is None else f.standby_ready - f.killed,
        })
    return rows


FAULT_LABELS = [
    ("pause", "SIGSTOP for 2-3x the lease, then SIGCONT"),
    ("kill", "SIGKILL (a replacement is started)"),
    ("terminate", "pg_terminate_backend of a worker"),
    ("terminate_in_commit", "pg_terminate_backend inside the completing transaction"),
    ("timeout", "statement_timeout/lock_timeout = 1 ms"),
    ("restart", "pg_ctl restart -m immediate"),
    ("failover", "primary SIGKILLed, standby promoted, new standby built"),
    ("skewed_worker", "worker started with its clock +1 h (libfaketime)"),
    ("crash_after_claim", "crash point: after claim"),
    ("crash_before_commit", "crash point: after effect, before commit"),
    ("crash_after_commit", "crash point: after commit, before reply"),
]

FIGURE_LABELS = [
    ("tasks_enqueued", "tasks enqueued"),
    ("executions_started", "executions started (claims)"),
    ("takeovers", "  of which ended by takeover"),
    ("reclaimed", "  of which ended by reclaim"),
    ("retried", "  of which failed (retried) or released"),
    ("effects_accepted", "effects accepted (final)"),
    ("progress_effects", "progress effects accepted"),
    ("stale_refused_db", "stale writes refused (Attempt.stale_writes)"),
    ("stale_reported", "stale writes reported by workers"),
    ("stale_heartbeat", "  heartbeats"),
    ("stale_fenced", "  fenced writes (effect + completion)"),
    ("stale_other", "  completions, failures, releases, keepalive"),
    ("db_errors_survived", "database errors survived"),
    ("standby_writes", "  of which writes sent to a standby (read-only)"),
    ("claims_seen", "claims seen committed by workers"),
    ("steps_stored", "durable steps stored"),
    ("step_calls", "  calls of their functions"),
    ("step_calls_rerun", "  of which again, their owner gone before the store"),
    ("lost", "LOST"),
    ("duplicated", "DUPLICATED"),
    ("overlaps", "OVERLAPPING CLAIMS"),
    ("claims_lost", "CLAIMS SEEN COMMITTED, MISSING"),
    ("effects_lost", "EFFECTS SEEN COMMITTED, MISSING"),
    ("tokens_reused", "TOKENS GRANTED TWICE"),
    ("tokens_went_down", "TOKENS GOING DOWN"),
    ("step_calls_twice", "STEPS CALLED AGAIN ONCE STORED"),
]


def failover_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The failovers of a run, one line each, then the median and the worst of each column."""
    def cell(value: float | None) -> str:
        return "   never" if value is None else f"{value:8.2f}"

    def behind(value: int | None) -> str:
        return "not streaming" if value is None else f"{value:,} B"

    lines = ["", "failovers (seconds from the SIGKILL of the primary, or its cut from etcd; the standby's lag",
             "just before it; commits seen before it and missing at the end)",
             f"  {'#':>3}  {'primary':<19} {'writable':>8} {'1st claim':>9} {'standby':>8} "
             f"{'standby behind':>14} {'lost':>5}"]
    for i, r in enumerate(rows, 1):
        how = "" if r.get("how", "kill") == "kill" else f" {r['how']}"
        lines.append(f"  {i:>3}  {r['from'] + ' -> ' + r['to'] + how:<19} {cell(r['writable'])} "
                     f"{cell(r['first_claim']):>9} {cell(r['standby'])} {behind(r['behind']):>14} "
                     f"{r['lost']:>5}")
    for label, pick in (("median", statistics.median), ("max", max)):
        cols = []
        for name in ("writable", "first_claim", "standby"):
            values = [r[name] for r in rows if r[name] is not None]
            cols.append(pick(values) if values else None)
        lines.append(f"  {label:<24} {cell(cols[0])} {cell(cols[1]):>9} {cell(cols[2])}")
    return lines


def table(faults: Counter[str], verdict: Verdict, header: str, kinds: list[str], skew: bool,
          crash: str, failovers: list[dict[str, Any]] | None = None) -> str:
    from tests.chaos.worker import parse_crash

    enabled = {*kinds, *(["skewed_worker"] if skew else []),
               *(f"crash_{point}" for point, p in parse_crash(crash).items() if p)}
    lines = [header, "", "faults injected"]
    for kind, label in FAULT_LABELS:
        extra = ""
        if kind == "terminate_in_commit" and faults.get("terminate_in_commit_tried"):
            extra = f"  (of {faults['terminate_in_commit_tried']} tried)"
        count = str(faults.get(kind, 0)) if kind in enabled else "n/a"
        lines.append(f"  {label:<56} {count:>8}{extra}")
    if failovers:
        lines += failover_lines(failovers)
    lines += ["", "run"]
    for name, label in FIGURE_LABELS:
        lines.append(f"  {label:<56} {verdict.figures.get(name, 0):>8}")
    lines += ["", "violations"]
    total = 0
    for kind, items in sorted(verdict.violations.items()):
        if not items:
            continue
        total += len(items)
        lines.append(f"  {kind}: {len(items)}")
        lines += [f"    {m}" for m in items[:10]]
        if len(items) > 10:
            lines.append(f"    ... and {len(items) - 10} more")
    if not total:
        lines.append("  none")
    lines.append("")
    lines.append("PASS" if verdict.ok else "FAIL")
    return "\n".join(lines)
