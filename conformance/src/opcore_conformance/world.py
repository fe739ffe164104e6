"""``opcore conformance --world-size N``: the collective checks across N local processes.

Two phases, each through `opcore.distributed.run_ranks` (``torch.multiprocessing`` spawn,
a free port on 127.0.0.1, the platform's backend, a bound on every wait, the ranks
terminated and killed when a phase fails or runs out of time):

1. **Collectives** (`opcore_conformance.checks.collectives`): the communicator's identity
   and primitives, every collective op x provider x dtype x sample against a float64
   reference of the sum over ranks, the inputs left unmodified, native
   ``fused_all_reduce_add_rms_norm`` bitwise equal to the unfused sequence, a declared
   ``capture_safe`` checked by capturing and replaying; and, here in the parent, every
   case's outputs bitwise the same on every rank.
2. **Killed rank** (N >= 2): the last rank exits abruptly; every other rank must fail with
   an error, not hang, within the collective timeout (plus start-up and a margin).

Results are printed one line per case and, with ``--report-dir``, written to
``collectives.jsonl`` and ``collectives.md`` there. Exit status 1 when a case fails.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from opcore_conformance import status as S

KILL_TIMEOUT_S = 15.0
# The phases, by the names --checks selects them with.
PHASES = ("collectives", "killed_rank")
# Cases whose passing line is worth printing too (the others print only when not passing).
_HEADLINE = (
    "collective.communicator",
    "collective.capture",
    "collective.bitwise_across_ranks",
    "collective.killed_rank",
)


def _phase_timeout(world_size: int, collective_timeout_s: float) -> float:
    # start-up (spawn, import torch and opcore, rendezvous) grows with the ranks on a
    # small host; then every case may wait once more
    return 60.0 + 10.0 * world_size + 3 * collective_timeout_s


def run_collectives(
    world_size: int,
    cfg: dict[str, Any],
    *,
    collective_timeout_s: float,
    env: dict[str, str],
) -> list[dict[str, Any]]:
    """Phase 1; one merged record per case (``ranks``: each rank's status)."""
    from opcore.distributed import run_ranks
    from opcore_conformance.checks import collectives

    t0 = time.monotonic()
    outcomes = run_ranks(
        collectives.run,
        world_size,
        args=(cfg,),
        timeout_s=_phase_timeout(world_size, collective_timeout_s),
        comm_timeout_s=collective_timeout_s,
        env=env,
    )
    bad = [o for o in outcomes if not o.ok]
    if bad:
        lines = [f"rank {o.rank}: {o.status} after {o.elapsed_s:.1f} s: {o.error}" for o in bad]
        tb = next((o.traceback for o in bad if o.traceback), "")
        return [
            {
                "id": "collective.run",
                "status": S.ERROR,
                "detail": "; ".join(lines) + (f"\n{tb}" if tb else ""),
                "ranks": [o.status for o in outcomes],
            }
        ]
    per_rank = [o.value for o in outcomes]
    merged = []
    for i, first in enumerate(per_rank[0]):
        recs = [r[i] for r in per_rank]
        if any(rec["id"] != first["id"] for rec in recs):
            raise RuntimeError(
                f"ranks ran different cases at position {i}: {[r['id'] for r in recs]}"
            )
        statuses = [rec["status"] for rec in recs]
        status = next((s for s in (S.FAIL, S.ERROR) if s in statuses), statuses[0])
        details = sorted(
            {
                f"rank {k}: {rec['detail']}"
                for k, rec in enumerate(recs)
                if rec["detail"] and rec["status"] != S.PASS
            }
        )
        same = all(rec["digests"] == first["digests"] for rec in recs)
        if status == S.PASS and first["digests"] and not same:
            status = S.FAIL
            differing = [k for k, rec in enumerate(recs) if rec["digests"] != first["digests"]]
            details.append(f"outputs differ bitwise between ranks: rank 0 vs rank(s) {differing}")
        merged.append(
            {
                "id": first["id"],
                "status": status,
                "detail": "; ".join(details) or first["detail"],
                "ranks": statuses,
                "bitwise_across_ranks": same if first["digests"] else None,
                "metrics": first["metrics"],
            }
        )
    merged.append(
        {
            "id": "collective.bitwise_across_ranks",
            "status": S.PASS
            if all(m["bitwise_across_ranks"] in (True, None) for m in merged)
            else S.FAIL,
            "detail": f"{sum(m['bitwise_across_ranks'] is True for m in merged)} cases compared "
            f"(SHA-256 of every output on {world_size} ranks) in {time.monotonic() - t0:.1f} s",
            "ranks": [],
        }
    )
    return merged


def run_killed_rank(
    world_size: int, *, env: dict[str, str], kill_timeout_s: float
) -> dict[str, Any]:
    """Phase 2: one record. Passes when every surviving rank failed (raised, or was ended
    by its backend) within the bound, and the killed rank is reported as dead."""
    from opcore.distributed import run_ranks
    from opcore_conformance.checks import collectives

    bound = kill_timeout_s + 10.0
    outcomes = run_ranks(
        collectives.killed_rank,
        world_size,
        args=({},),
        timeout_s=_phase_timeout(world_size, kill_timeout_s),
        comm_timeout_s=kill_timeout_s,
        grace_s=bound,
        env=env,
    )
    victim = outcomes[-1]
    problems: list[str] = []
    notes: list[str] = []
    if victim.status != "died":
        problems.append(f"rank {victim.rank} (killed) reported {victim.status}: {victim.error}")
    for o in outcomes[:-1]:
        if o.status == "ok" and o.value["raised"] is None:
            problems.append(
                f"rank {o.rank}: all_reduce and barrier returned although rank "
                f"{victim.rank} was gone"
            )
        elif o.status == "ok":
            took = o.value["elapsed_s"]
            line = (
                f"rank {o.rank} failed {took:.1f} s after rank {victim.rank} exited: "
                f"{o.value['raised']}"
            )
            (problems if took > bound else notes).append(
                line + (f" (bound {bound:g} s)" if took > bound else "")
            )
        elif o.status == "timeout":
            problems.append(f"rank {o.rank} hung: {o.error} (bound {bound:g} s)")
        else:  # ended by its backend (a watchdog abort) or raised outside the collective
            notes.append(
                f"rank {o.rank} ended ({o.status}, exit code {o.exitcode}) after "
                f"{o.elapsed_s:.1f} s: {o.error}"
            )
    return {
        "id": "collective.killed_rank",
        "status": S.FAIL if problems else S.PASS,
        "detail": "; ".join(problems or notes),
        "ranks": [o.status for o in outcomes],
    }


def _markdown(records: list[dict[str, Any]], head: dict[str, Any]) -> str:
    lines = [
        f"# opcore conformance --world-size {head['world_size']}",
        "",
        ", ".join(f"{k}: {v}" for k, v in head.items()),
        "",
        "| case | status | ranks | detail |",
        "|---|---|---|---|",
    ]
    for r in records:
        detail = r["detail"].splitlines()[0] if r["detail"] else ""
        lines.append(
            f"| `{r['id']}` | {r['status']} | {' '.join(r['ranks'])} | {detail.replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def run_world(options: Any, world_size: int, *, collective_timeout_s: float = 60.0) -> int:
    """Run both phases and report; the exit status (0, or 1 when a case is red)."""
    if world_size < 1:
        print(f"opcore conformance: --world-size must be >= 1, got {world_size}", file=sys.stderr)
        return 2
    env = {}
    if options.platform:
        env["OPCORE_PLATFORM"] = options.platform
        os.environ["OPCORE_PLATFORM"] = options.platform
    report_dir = Path(options.report_dir) if options.report_dir else None
    if (
        report_dir is not None
        and (report_dir / "collectives.jsonl").exists()
        and not options.overwrite
    ):
        print(
            f"opcore conformance: {report_dir} already holds collectives.jsonl; pass "
            f"--overwrite to replace it",
            file=sys.stderr,
        )
        return 2
    from opcore.platforms import get_current_platform

    platform = get_current_platform()
    phases = options.checks or list(PHASES)
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        print(
            f"opcore conformance: with --world-size, --checks takes {', '.join(PHASES)}; "
            f"unknown: {', '.join(unknown)}",
            file=sys.stderr,
        )
        return 2
    cfg = {
        "dtypes": options.dtypes,
        "ops": options.ops,
        "providers": options.providers,
        "imports": options.imports,
    }
    start = time.monotonic()
    records = []
    if "collectives" in phases:
        records += run_collectives(
            world_size, cfg, collective_timeout_s=collective_timeout_s, env=env
        )
    if world_size >= 2 and "killed_rank" in phases:
        records.append(
            run_killed_rank(
                world_size, env=env, kill_timeout_s=min(KILL_TIMEOUT_S, collective_timeout_s)
            )
        )
    head = {
        "world_size": world_size,
        "platform": platform.name,
        "backend": platform.dist_backend,
        "seconds": round(time.monotonic() - start, 1),
    }
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
        if r["status"] != S.PASS:
            print(
                f"{r['status']:>14}  {r['id']}  "
                f"{r['detail'].splitlines()[0] if r['detail'] else ''}"
            )
    for r in records:
        if r["status"] == S.PASS and r["id"] in _HEADLINE:
            print(f"{r['status']:>14}  {r['id']}  {r['detail'].splitlines()[0]}")
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    print(
        f"opcore conformance --world-size {world_size} on {platform.name} "
        f"({platform.dist_backend}): {summary} in {head['seconds']} s"
    )
    if report_dir is not None:
        report_dir.mkdir(parents=True, exist_ok=True)
        with open(report_dir / "collectives.jsonl", "w") as fh:
            for r in records:
                fh.write(json.dumps({**head, **r}) + "\n")
        (report_dir / "collectives.md").write_text(_markdown(records, head))
        print(f"opcore conformance: reports in {report_dir}")
    return 1 if any(S.is_red(r["status"]) for r in records) else 0
