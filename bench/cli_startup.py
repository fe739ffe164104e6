"""Start-up time of the `opcore` command line: wall time of whole ``opcore ...`` processes
and, from ``python -X importtime``, the import time and whether torch was loaded.

    python bench/cli_startup.py [--runs 7] [--out bench/results/cli_startup.md]

Each command runs ``--runs`` times in a fresh process (the ``opcore`` script next to this
interpreter); the table gives the median, min and max wall time. On a loaded machine the
wall times move with the load (recorded with the figures); the import-time total moves
less and says where the time goes.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import time

COMMANDS = (["--help"], ["new-plugin", "--help"], ["info", "--help"], ["bench", "--help"])
IMPORT_LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)")


def opcore_script() -> str:
    return os.path.join(os.path.dirname(sys.executable), "opcore")


def wall_times(args: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([opcore_script(), *args], capture_output=True, timeout=120, check=False)
        out.append(time.perf_counter() - t0)
    return out


def import_profile(args: list[str]) -> tuple[float, bool, list[tuple[float, str]]]:
    """(top-level import ms, torch imported, the three largest top-level imports)."""
    code = (
        "import sys\nfrom opcore.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
    )
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    top = []
    torch_loaded = False
    for line in proc.stderr.splitlines():
        m = IMPORT_LINE.match(line)
        if not m:
            continue
        torch_loaded |= m.group(3) == "torch"
        if m.group(2) == "":
            top.append((int(m.group(1)) / 1e3, m.group(3)))
    top.sort(reverse=True)
    return sum(ms for ms, _ in top), torch_loaded, top[:3]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch

    from opcore import __version__

    lines = [
        "| command | median s | min s | max s | imports ms | torch loaded | largest imports |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    load_before = os.getloadavg()
    for cmd in COMMANDS:
        times = wall_times(cmd, args.runs)
        total, torch_loaded, top = import_profile(cmd)
        largest = ", ".join(f"{name} {ms:.0f}" for ms, name in top)
        lines.append(
            f"| `opcore {' '.join(cmd)}` | {statistics.median(times):.2f} | {min(times):.2f} | "
            f"{max(times):.2f} | {total:.0f} | {'yes' if torch_loaded else 'no'} | {largest} |"
        )
    load_after = os.getloadavg()
    head = [
        f"- date (UTC): {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}",
        f"- machine: {cpu_model()}, {os.cpu_count()} cores, "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after",
        f"- python {platform.python_version()}, torch {torch.__version__}, opcore {__version__}",
        f"- method: `python bench/cli_startup.py --runs {args.runs}`",
        "",
    ]
    text = "\n".join(head + lines) + "\n"
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
