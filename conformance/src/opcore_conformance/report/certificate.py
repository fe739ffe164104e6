"""``certificate.json``: what a run establishes, in the format `opcore.certificates` reads.

Derived, like the Markdown and JUnit files, from the JSONL as written (header, case
records, footer), so a certificate never says more than the record of the run. The format
is documented in docs/conformance.md ("Certificates"); its reader lives in the core
(`opcore.certificates`), which `opcore info` uses to say which providers in use are
certified here.
"""

from __future__ import annotations

import collections
import time
from typing import Any

from opcore_conformance import status as S

# The core's names, repeated rather than imported so this module stays importable where
# only the suite's report tools are wanted; test_conformance_certificate checks they agree.
FORMAT = "opcore-conformance-certificate"
FORMAT_VERSION = 1


def build(
    header: dict[str, Any],
    records: list[dict[str, Any]],
    footer: dict[str, Any] | None,
    *,
    date: float | None = None,
) -> dict[str, Any]:
    """The certificate of one run. Each provider the run checked (it has a case naming its
    op and provider) is listed with its identity hash, the distribution defining it, its
    counts per status and ``passed`` (a case passed, none failed, errored or xpassed). ``complete``
    is true only for a run that ran every collected case with no filter; ``stopped`` says why
    a run ended before every collected case ran (null when it did not)."""
    identities = header.get("identities") or {}
    per_provider: dict[tuple[str, str], collections.Counter] = {}
    for rec in records:
        if rec.get("op") and rec.get("provider"):
            per_provider.setdefault((rec["op"], rec["provider"]), collections.Counter())[
                rec["status"]
            ] += 1
    providers = []
    for (op, provider), counts in sorted(per_provider.items()):
        known = (identities.get(op) or {}).get(provider) or {}
        if not known.get("identity"):
            continue  # no identity (no source to hash): nothing a reader could match
        providers.append(
            {
                "op": op,
                "provider": provider,
                "identity": known["identity"],
                "distribution": known.get("distribution"),
                "counts": {s: counts[s] for s in S.ALL if counts[s]},
                # at least one case held, none was red: a provider whose cases were all
                # unsupported or skipped here is listed, but certifies nothing
                "passed": counts[S.PASS] > 0 and not any(counts[s] for s in S.RED),
            }
        )
    filters = header.get("filters") or {}
    foot = footer or {}
    totals = foot.get("counts") or dict(collections.Counter(r["status"] for r in records))
    complete = (
        bool(foot)
        and not foot.get("interrupted")
        and foot.get("total") == foot.get("collected")
        and not any(filters.values())
    )
    if not foot:
        stopped = "the run did not finish (its record has no footer)"
    elif foot.get("interrupted"):
        stopped = f"interrupted by {foot['interrupted']}"
    elif foot.get("total") != foot.get("collected"):
        stopped = f"{foot.get('total')} of {foot.get('collected')} collected cases ran"
    else:
        stopped = None
    distributions = sorted(
        {p["distribution"] for p in providers if p["distribution"]}
        | ({header["platform_distribution"]} if header.get("platform_distribution") else set())
    )
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "suite": header.get("suite"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(date)),
        "started": header.get("started"),
        "mode": header.get("mode"),
        "complete": complete,
        # why the run ended before every collected case ran, or null: a reader certifies
        # nothing from such a run, a selection included (complete is false for both)
        "stopped": stopped,
        "filters": filters,
        "platform": header.get("platform"),
        "platform_class": header.get("platform_class"),
        "device_type": header.get("device_type"),
        "device_name": header.get("device_name"),
        "devices": header.get("device_summary"),
        "driver": header.get("driver"),
        "versions": header.get("versions"),
        "plugins": distributions,
        "counts": totals,
        "exit_status": foot.get("exit_status"),
        "providers": providers,
    }
