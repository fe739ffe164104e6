"""`opcore new-plugin` asks again after a bad interactive answer, a bounded number of times.

stdin is replaced by one that says it is a terminal (none exists under pytest) and
``input`` by a list of typed answers; rendering is real.
"""

from __future__ import annotations

import io
import sys

import pytest
import tomllib

from opcore.cli import main
from opcore.cli.new_plugin import ATTEMPTS


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _typed(monkeypatch, answers: list[str]) -> list[str]:
    monkeypatch.setattr(sys, "stdin", Terminal())
    typed, asked = iter(answers), []
    monkeypatch.setattr("builtins.input", lambda prompt: (asked.append(prompt), next(typed))[1])
    return asked


def test_a_bad_device_type_is_asked_again(tmp_path, capsys, monkeypatch):
    asked = _typed(monkeypatch, ["Acme Labs", "Not A Device", "cuda"])
    rc = main(["new-plugin", "acme", "-o", str(tmp_path)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert asked.count("torch device type [cpu]: ") == 2
    assert "device type 'Not A Device' is not a torch device type name" in out.err
    assert "try again" in out.err
    platform = tmp_path / "opcore-plugin-acme" / "src" / "opcore_plugin_acme" / "platform.py"
    assert '"cuda"' in platform.read_text() or "'cuda'" in platform.read_text()


def test_a_bad_vendor_is_asked_again(tmp_path, capsys, monkeypatch):
    asked = _typed(monkeypatch, ["Acme\x07Labs", "Acme Labs", ""])
    rc = main(["new-plugin", "acme", "-o", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    assert asked[0] == asked[1] and asked[0].startswith("Vendor")
    meta = tomllib.loads((tmp_path / "opcore-plugin-acme" / "pyproject.toml").read_text())
    assert meta["project"]["authors"] == [{"name": "Acme Labs"}]


@pytest.mark.parametrize("answers", [["Acme", *["bad type"] * ATTEMPTS]])
def test_answers_refused_every_time_end_the_run_in_one_line(tmp_path, capsys, monkeypatch, answers):
    asked = _typed(monkeypatch, answers)
    rc = main(["new-plugin", "acme", "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and len(asked) == 1 + ATTEMPTS
    last = err.strip().splitlines()[-1]
    assert last.startswith("opcore new-plugin: error: device type 'bad type'")
    assert list(tmp_path.iterdir()) == []
