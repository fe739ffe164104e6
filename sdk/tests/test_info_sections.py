"""`opcore info` sections from other distributions: the ``opcore.info_sections`` entry-point
group (docs/design.md#layers-and-imports, docs/cli-info.md), read from real installed
metadata in a fresh interpreter."""

from __future__ import annotations

import json

from opcore.testing.distributions import make_distribution, run_python

INFO = "import sys; from opcore.cli import main; sys.exit(main(['info', '--json']))"
HUMAN = "import sys; from opcore.cli import main; sys.exit(main(['info']))"


def _install(site):
    make_distribution(
        site,
        "engine-bridge",
        entry_points={
            "opcore.info_sections": {
                "engine": "engine_bridge:section",
                "absent": "engine_bridge:nothing",
                "broken": "engine_bridge:broken",
                "platform": "engine_bridge:section",  # a core field: never replaced
            }
        },
        files={
            "engine_bridge.py": """
                def section():
                    return {"version": "1.2.3", "providers": ["opcore_native"]}

                def nothing():
                    return None  # the engine does not import here: no section

                def broken():
                    raise RuntimeError("engine exploded")
            """
        },
    )


def test_an_installed_info_section_appears_in_opcore_info_json(tmp_path):
    _install(tmp_path)
    out = run_python(INFO, site=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["engine"] == {"version": "1.2.3", "providers": ["opcore_native"]}
    assert "absent" not in data
    assert data["broken"] == {"error": "RuntimeError: engine exploded"}
    assert isinstance(data["platform"], dict) and data["platform"]["name"]  # the core's own
    human = run_python(HUMAN, site=tmp_path, timeout=300)
    assert human.returncode == 0, human.stderr
    assert "Sections from other distributions" in human.stdout
    assert '  engine: {"version": "1.2.3"' in human.stdout


def test_without_such_distributions_there_are_no_extra_keys(tmp_path):
    out = run_python(INFO, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    from opcore.cli import info

    assert set(data) == set(info._skeleton())
