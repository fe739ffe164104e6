"""`opcore new-plugin NAME`: scaffold ``opcore-plugin-NAME`` from the template opcore ships.

The name, vendor and device type are checked before anything is rendered, each matched
whole (a trailing newline is refused, not trimmed); a bad one is one line on stderr naming
the field, and exit status 2. Everything typed, ``-o DIR`` included, is data: it lands in the
project exactly as typed and is never evaluated as a template (`opcore.templates`).
Interactive runs (a terminal, no ``--no-input``) ask for the vendor and device type that
were not given; otherwise the defaults are used. A bad answer is reported in one line and
asked again, at most `ATTEMPTS` times in all, then the run fails with that line.
Rendering needs cookiecutter: ``pip install 'opcore[template]'``.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "new-plugin",
        help="scaffold a new platform plugin (opcore-plugin-NAME)",
        description="Render opcore-plugin-NAME: a platform plugin that installs, is discovered "
        "and passes the conformance suite out of the box on the cpu device, ready for you to "
        "point at your hardware. See docs/new-plugin.md.",
    )
    parser.add_argument(
        "name", metavar="NAME", help="plugin name: a lowercase identifier, e.g. acme"
    )
    parser.add_argument(
        "-o",
        "--output-dir",
        default=".",
        metavar="DIR",
        help="where to create opcore-plugin-NAME (default: the current directory)",
    )
    parser.add_argument(
        "--no-input", action="store_true", help="ask nothing; use defaults for what is not given"
    )
    parser.add_argument(
        "--vendor",
        metavar="TEXT",
        help="who publishes the plugin, any printable text on one line "
        "(default: 'The NAME authors')",
    )
    parser.add_argument(
        "--device-type",
        metavar="TYPE",
        default=None,
        help="torch device type the platform uses (default: cpu, so the scaffold runs anywhere)",
    )
    parser.set_defaults(run=run)


# Asked this many times in all: a person gets second chances, and a script feeding a
# terminal the same bad line still ends.
ATTEMPTS = 3


class _NoValidAnswer(Exception):
    """Every attempt at a prompt was refused; the message is the last refusal."""


def _ask(question: str, default: str, problem) -> str:
    """The first answer ``problem`` (text -> reason or None) accepts, the default for an
    empty one; `_NoValidAnswer` after `ATTEMPTS` refusals."""
    for _ in range(ATTEMPTS):
        answer = input(f"{question} [{default}]: ").strip() or default
        why = problem(answer)
        if why is None:
            return answer
        print(f"{why}; try again", file=sys.stderr)
    raise _NoValidAnswer(why)


def run(args: argparse.Namespace) -> int:
    from opcore import templates

    def fail(message: str) -> int:
        print(f"opcore new-plugin: error: {message}", file=sys.stderr)
        return 2

    vendor, device_type = args.vendor, args.device_type
    # Check the name before asking anything else.
    problem = templates.name_checks().name_problem(args.name)
    if problem:
        return fail(problem)
    try:
        templates.cookiecutter_api()  # before asking anything: it may need installing first
    except templates.TemplateError as exc:
        return fail(str(exc))
    if not args.no_input and sys.stdin.isatty():
        checks = templates.name_checks()
        try:
            if vendor is None:
                vendor = _ask(
                    "Vendor (who publishes the plugin)",
                    templates.default_vendor(args.name),
                    checks.vendor_problem,
                )
            if device_type is None:
                device_type = _ask(
                    "torch device type", templates.DEFAULT_DEVICE_TYPE, checks.device_type_problem
                )
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return fail("cancelled")
        except _NoValidAnswer as exc:
            return fail(str(exc))
    try:
        project = templates.render_plugin(
            args.name,
            args.output_dir,
            vendor=vendor,
            device_type=device_type or templates.DEFAULT_DEVICE_TYPE,
        )
    except templates.TemplateError as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(f"cannot write the project: {exc}")
    standin = f"OPCORE_{args.name.upper()}_STANDIN"
    print(f"Created {project}")
    print("Next:")
    print(f"  cd {project}")
    print('  pip install -e ".[test]"')
    print(f"  {standin}=1 opcore info     # your platform wins, on the stand-in")
    print(f"  {standin}=1 pytest          # its tests and the conformance suite")
    print(
        "  then README.md, 'Next steps': detection, device queries, kernels, "
        "conformance on the device"
    )
    return 0
