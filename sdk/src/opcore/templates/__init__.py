"""The templates opcore ships, and rendering them.

`render_plugin` renders the plugin template (``opcore/templates/plugin``, a cookiecutter
template; ``template/`` at the repository root points here) into a new
``opcore-plugin-NAME`` project. The template lives inside the ``opcore`` package so that it
is in every wheel and sdist and in editable installs, with no build step.

Name rules live in one place, the template's ``hooks/pre_gen_project.py``: cookiecutter runs
it before rendering, and `plugin_problems` loads the same functions so ``opcore new-plugin``
rejects a bad name in one line before cookiecutter starts.

What the user types is data, never template: cookiecutter renders every value it is given
as a Jinja template before the files are generated, so `render_plugin` hands it each value
in a form that renders back to exactly the text given (`literal_template`). The template
files then quote the text for where it lands (a TOML string, a Python docstring).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

PLUGIN_TEMPLATE = Path(__file__).resolve().parent / "plugin"
DEFAULT_DEVICE_TYPE = "cpu"
INSTALL_HINT = "pip install 'opcore[template]'"


class TemplateError(Exception):
    """Rendering cannot start or did not finish; the message is one line for the user."""


def plugin_template_dir() -> Path:
    """The cookiecutter template of a platform plugin (a real directory)."""
    if not (PLUGIN_TEMPLATE / "cookiecutter.json").is_file():
        raise TemplateError(
            f"the plugin template is missing from this opcore installation ({PLUGIN_TEMPLATE}); "
            f"reinstall opcore"
        )
    return PLUGIN_TEMPLATE


_checks: ModuleType | None = None


def name_checks() -> ModuleType:
    """The template's ``hooks/pre_gen_project.py`` as a module (its ``*_problem``
    functions and reserved-name tables)."""
    global _checks
    if _checks is None:
        path = plugin_template_dir() / "hooks" / "pre_gen_project.py"
        spec = importlib.util.spec_from_file_location("opcore_template_name_checks", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _checks = module
    return _checks


def default_vendor(name: str) -> str:
    return f"The {name} authors"


def plugin_problems(
    name: str, vendor: str | None = None, device_type: str = DEFAULT_DEVICE_TYPE
) -> list[str]:
    """Every reason the answers cannot be rendered, each one line; empty when they can."""
    return name_checks().problems(
        {
            "plugin_name": name,
            "vendor": default_vendor(name) if vendor is None else vendor,
            "device_type": device_type,
        }
    )


def cookiecutter_api() -> tuple[Any, type[Exception]]:
    """``(cookiecutter function, its base exception class)``; `TemplateError` naming the
    extra to install when cookiecutter is missing."""
    try:
        from cookiecutter.exceptions import CookiecutterException
        from cookiecutter.main import cookiecutter
    except ImportError as exc:
        raise TemplateError(
            f"rendering the template needs cookiecutter ({exc}): {INSTALL_HINT}"
        ) from None
    return cookiecutter, CookiecutterException


def literal_template(text: str) -> str:
    """A Jinja template that renders to exactly ``text``, whatever it holds.

    Every Jinja construct (``{{ }}``, ``{% %}``, ``{# #}``) opens with ``{`` under the default
    delimiters, which the plugin template keeps (it sets no ``_jinja2_env_vars``; a test pins
    that), and line statements are off. So writing each ``{`` as the expression
    ``{{ '{' }}`` leaves nothing in ``text`` that Jinja evaluates: ``{{ 7*7 }}`` renders as
    ``{{ 7*7 }}``, not ``49``, and no attribute access in the text ever runs.
    """
    return text.replace("{", "{{ '{' }}")


def _api_range() -> tuple[str, str]:
    from opcore import PLUGIN_API_VERSION

    major = int(PLUGIN_API_VERSION.split(".")[0])
    return PLUGIN_API_VERSION, f"{major + 1}.0"


def render_plugin(
    name: str,
    output_dir: str | Path = ".",
    *,
    vendor: str | None = None,
    device_type: str = DEFAULT_DEVICE_TYPE,
) -> Path:
    """Render ``opcore-plugin-<name>`` into ``output_dir``; returns the project directory
    (absolute).

    Raises `TemplateError` (one line) for a bad name, vendor or device type, an existing
    target directory, or cookiecutter missing. Never prompts and never reads or writes the
    user's cookiecutter configuration or replay files. Every value, ``output_dir`` included,
    is data: the project holds exactly the text given, never the result of evaluating it.
    """
    problems = plugin_problems(name, vendor, device_type)
    if problems:
        raise TemplateError(problems[0])
    cookiecutter, CookiecutterException = cookiecutter_api()

    import opcore
    from opcore import version_policy

    target = Path(os.path.abspath(output_dir)) / f"opcore-plugin-{name}"
    if target.exists():
        raise TemplateError(f"{target} already exists; choose another -o DIR or remove it")
    api_min, api_max = _api_range()
    context = {
        "plugin_name": name,
        "device_type": device_type,
        "__opcore_version": opcore.__version__,
        "__opcore_requirement": version_policy.requirement(),
        "__conformance_requirement": version_policy.requirement(name="opcore-conformance"),
        "__plugin_api_min": api_min,
        "__plugin_api_max": api_max,
    }
    if vendor is not None:
        context["vendor"] = vendor
    # cookiecutter renders these values as templates: pass each as one that renders to itself.
    context = {key: literal_template(value) for key, value in context.items()}
    with tempfile.TemporaryDirectory(prefix="opcore-new-plugin-") as scratch:
        # cookiecutter also renders the absolute paths of the directories it creates, output
        # directory included, as templates: render into a scratch directory whose path holds
        # no template syntax, then copy the project to where the user asked.
        if "{" in scratch:
            raise TemplateError(
                f"the temporary directory {scratch!r} holds '{{'; set TMPDIR to a plain path"
            )
        # A private cookiecutter configuration: ~/.cookiecutterrc cannot change the result,
        # and no replay file is left in the user's home.
        config = Path(scratch) / "config.yaml"
        config.write_text(
            json.dumps(
                {"cookiecutters_dir": f"{scratch}/templates", "replay_dir": f"{scratch}/replay"}
            ),
            encoding="utf-8",
        )
        try:
            rendered = cookiecutter(
                str(plugin_template_dir()),
                no_input=True,
                extra_context=context,
                output_dir=f"{scratch}/out",
                config_file=str(config),
            )
        except CookiecutterException as exc:
            raise TemplateError(f"rendering {target.name} failed: {exc}") from None
        _place(Path(rendered), target)
    return target


def _place(rendered: Path, target: Path) -> None:
    """Copy the rendered project to ``target``, which must not exist yet (file modes kept;
    a partial copy is removed)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        target.mkdir()  # claims the name: fails if it appeared since the check above
    except FileExistsError:
        raise TemplateError(
            f"{target} already exists; choose another -o DIR or remove it"
        ) from None
    try:
        shutil.copytree(rendered, target, dirs_exist_ok=True)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
