"""`opcore_conformance.checks.properties.capture`, the graph capture both capture-safety
checks (ops and attention backends) go through. The CPU platform has no graphs, so a
stand-in platform (``fake_gpu_*``: capturing needs a GPU no machine here has) supplies
the capture's outcomes: a replay, an error, or no graphs."""

from __future__ import annotations

import types

import pytest

from opcore_conformance.case import CheckFailed, NotApplicable, Unsupported
from opcore_conformance.checks.properties import capture

WHO = "rms_norm with provider 'planted'"


def _ctx(capture_graph):
    return types.SimpleNamespace(
        platform=types.SimpleNamespace(name="fake_gpu", capture_graph=capture_graph)
    )


def _raising(fn):
    raise RuntimeError("operation not permitted when stream is capturing\nsecond line")


def test_fake_gpu_capture_returns_the_replay() -> None:
    calls: list[str] = []

    def replay() -> None:
        calls.append("replay")

    got = capture(_ctx(lambda fn: replay), lambda: None, frozenset(), WHO, "it")
    got()
    assert calls == ["replay"]


def test_fake_gpu_capture_error_fails_a_declared_capture_safe_naming_its_first_line() -> None:
    with pytest.raises(CheckFailed) as info:
        capture(_ctx(_raising), lambda: None, frozenset({"capture_safe"}), WHO, "its forward")
    assert str(info.value).startswith(
        f"{WHO} declares capture_safe, but capturing its forward raised RuntimeError: "
        "operation not permitted when stream is capturing"
    )
    assert "second line" not in str(info.value)


def test_fake_gpu_capture_error_is_unsupported_when_not_declared() -> None:
    with pytest.raises(Unsupported, match="does not declare capture_safe"):
        capture(_ctx(_raising), lambda: None, frozenset(), WHO, "it")


def test_no_graphs_is_not_applicable_naming_the_platform() -> None:
    with pytest.raises(NotApplicable, match="platform 'fake_gpu' has no graphs"):
        capture(_ctx(lambda fn: None), lambda: None, frozenset({"capture_safe"}), WHO, "it")
