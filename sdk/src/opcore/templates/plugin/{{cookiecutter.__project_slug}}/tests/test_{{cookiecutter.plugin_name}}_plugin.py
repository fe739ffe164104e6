"""The plugin's own contract: discovery, the probe, the platform class, the provider.

These run in this process without resolving the platform, so they work on any machine.
test_{{ cookiecutter.plugin_name }}_conformance.py runs the opcore conformance suite on the device.
"""

from __future__ import annotations

import importlib
import importlib.metadata

import pytest
import torch
from opcore.config import OpcoreConfig
from opcore.ir import ops
from opcore.platforms import Absent

import {{ cookiecutter.__module_name }} as plugin

NAME = "{{ cookiecutter.plugin_name }}"
DEVICE_TYPE = "{{ cookiecutter.device_type }}"


def _platform_class():
    module, _, cls = plugin.PLATFORM_CLASS.rpartition(".")
    return getattr(importlib.import_module(module), cls)


def _device_present() -> bool:
    """Whether torch can use a '{{ cookiecutter.device_type }}' device in this process
{%- if cookiecutter.__dispatch_key == "PrivateUse1" %}: the real one, or with
    the stand-in on, opcore's virtual device renamed to '{{ cookiecutter.device_type }}'{% endif %}."""
{%- if cookiecutter.device_type == "cpu" %}
    return True
{%- else %}
{%- if cookiecutter.__dispatch_key == "PrivateUse1" %}
    if plugin.standin_on():
        plugin.install_standin()
        return True
{%- endif %}
    module = getattr(torch, DEVICE_TYPE, None)
    try:
        return module is not None and module.device_count() > 0
    except Exception:
        return False
{%- endif %}


def test_entry_point_is_installed():
    eps = importlib.metadata.entry_points(group="opcore.platform_plugins")
    ours = [ep for ep in eps if ep.name == NAME]
    assert len(ours) == 1, f"entry point {NAME!r} not installed (pip install -e .): {list(eps)}"
    assert ours[0].value == "{{ cookiecutter.__module_name }}:probe"
    assert ours[0].load() is plugin.probe


def test_probe_without_the_standin(monkeypatch):
    monkeypatch.delenv(plugin.STANDIN_ENV, raising=False)
    result = plugin.probe()
{%- if cookiecutter.device_type == "cpu" %}
    # No detection is written yet: absent, and the reason names the stand-in switch.
    assert isinstance(result, Absent)
    assert plugin.STANDIN_ENV in result.reason
{%- else %}
    if _device_present():
        assert result == plugin.PLATFORM_CLASS
    else:
        assert isinstance(result, Absent) and result.reason
{%- endif %}
    monkeypatch.setenv(plugin.STANDIN_ENV, "0")
    assert repr(plugin.probe()) == repr(result)  # '0' is off, like unset


def test_standin_activates_and_rejects_typos(monkeypatch):
    monkeypatch.setenv(plugin.STANDIN_ENV, "1")
    assert plugin.probe() == plugin.PLATFORM_CLASS
    monkeypatch.setenv(plugin.STANDIN_ENV, "yes")
    with pytest.raises(ValueError, match=plugin.STANDIN_ENV):
        plugin.probe()


def test_platform_class_identity_and_priority():
    cls = _platform_class()
    assert cls.name == NAME
    assert cls.device_type == DEVICE_TYPE
    assert cls.plugin_api == ("{{ cookiecutter.__plugin_api_min }}", "{{ cookiecutter.__plugin_api_max }}")
    priority = cls().get_default_ir_op_priority(OpcoreConfig())
    assert priority["rms_norm"][0] == plugin.PROVIDER


def test_provider_matches_the_native_reference():
    from {{ cookiecutter.__module_name }} import providers  # noqa: F401  (registers the provider)

    impl = ops.rms_norm.impls[plugin.PROVIDER]
    if not _device_present():
        pytest.skip(f"no {DEVICE_TYPE} device here
{%- if cookiecutter.__dispatch_key == "PrivateUse1" %} and the stand-in is off ({plugin.STANDIN_ENV}=1 runs this on opcore's virtual device){% endif %}")
    device = torch.device(DEVICE_TYPE)
    x = torch.randn(5, 96, device=device)
    weight = torch.randn(96, device=device)
    assert impl.supports_args(x, weight, 1e-6)
    assert not impl.supports_args(x.to(torch.int32), weight, 1e-6)
    for variance_size in (None, 40):
        expected = ops.rms_norm.native(x, weight, 1e-6, variance_size)
        got = impl.impl_fn(x, weight, 1e-6, variance_size)
        torch.testing.assert_close(got, expected)
