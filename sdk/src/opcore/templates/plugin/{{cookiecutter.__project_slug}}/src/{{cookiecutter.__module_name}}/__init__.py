"""{{ cookiecutter.__project_slug }}: the opcore platform plugin for {{ cookiecutter.plugin_name }} devices, by {{ cookiecutter.vendor | replace('\\', '\\\\') | replace('"', '\\"') }}{% if not cookiecutter.vendor.endswith('.') %}.{% endif %}

opcore calls `probe` once per process, through the entry point
``{{ cookiecutter.plugin_name }} = "{{ cookiecutter.__module_name }}:probe"`` in the group
``opcore.platform_plugins``. The probe only detects: it registers nothing and never asks
opcore for the current platform. Kernels are registered later, by the platform's
``import_kernels`` / ``import_ir_kernels`` hooks, and only when this platform won.
"""

from __future__ import annotations

import os

from opcore.platforms import Absent

# This plugin's provider name on opcore ops (provider names share the plugin's name rules).
PROVIDER = "{{ cookiecutter.plugin_name }}"
PLATFORM_CLASS = "{{ cookiecutter.__module_name }}.platform.{{ cookiecutter.__class_prefix }}Platform"

# The scaffold's stand-in detection: with {{ cookiecutter.__standin_env }}=1 the probe
# reports the device present without looking for it, so the plugin can be installed, tried
# and conformance-checked before real detection exists. Remove it once `_detect` is real.
STANDIN_ENV = "{{ cookiecutter.__standin_env }}"
DEVICE_TYPE = "{{ cookiecutter.device_type }}"


def standin_on() -> bool:
    """Whether the stand-in switch {{ cookiecutter.__standin_env }} is on (``1``; ``0`` or unset: off).

    Raises ``ValueError`` for any other value, so a typo is reported instead of ignored.
    """
    standin = os.environ.get(STANDIN_ENV, "")
    if standin not in ("", "0", "1"):
        raise ValueError(f"{STANDIN_ENV}={standin!r}: expected '1' (stand-in on) or '0' (off)")
    return standin == "1"


def probe() -> str | Absent:
    """The platform class's dotted path when {{ cookiecutter.plugin_name }} hardware is here (or the
    stand-in is switched on), otherwise `Absent` with the reason.

    Raises ``ValueError`` when {{ cookiecutter.__standin_env }} is set to anything but ``1`` or
    ``0``, so a typo is reported instead of ignored.
    """
    if standin_on():
        return PLATFORM_CLASS
    return _detect()
{%- if cookiecutter.__dispatch_key == "PrivateUse1" %}


def install_standin():
    """The stand-in device: opcore's virtual accelerator (`opcore.vdev`) on torch's
    PrivateUse1 key, renamed to '{{ cookiecutter.device_type }}', its data in host memory, so the
    platform, its tests and the conformance suite run on '{{ cookiecutter.device_type }}:0' on any
    machine. The platform installs it when constructed with the stand-in on (the probe
    never does: probes only detect). Shaped by OPCORE_VDEV_DEVICES, OPCORE_VDEV_DTYPES and
    OPCORE_VDEV_MEMORY; torch renames PrivateUse1 once per process. Delete it with the
    stand-in once your torch extension provides the device."""
    from opcore import vdev

    return vdev.install(DEVICE_TYPE, **vdev.settings_from_env())
{%- endif %}


def _detect() -> str | Absent:
    """Real hardware detection. Never return PLATFORM_CLASS unconditionally: opcore picks
    an activated out-of-tree platform over every other, so a probe that always says yes
    takes over every machine the plugin is installed on."""
{%- if cookiecutter.device_type == "cpu" %}
    # TODO: import your runtime, count devices, and return
    # PLATFORM_CLASS only when there is at least one, for example:
    #
    #     try:
    #         import {{ cookiecutter.plugin_name }}_runtime
    #     except ImportError as exc:
    #         return Absent(f"{{ cookiecutter.plugin_name }}_runtime failed to import: {exc}")
    #     if {{ cookiecutter.plugin_name }}_runtime.device_count() == 0:
    #         return Absent("{{ cookiecutter.plugin_name }}_runtime found no device")
    #     return PLATFORM_CLASS
    return Absent(
        "{{ cookiecutter.plugin_name }} device detection is not written yet; "
        f"{STANDIN_ENV}=1 runs this plugin on the cpu device as a stand-in"
    )
{%- else %}
    # TODO: import the torch extension that provides the
    # '{{ cookiecutter.device_type }}' device type here if torch does not know it by itself.
    import torch

    module = getattr(torch, "{{ cookiecutter.device_type }}", None)
    if module is None or not hasattr(module, "device_count"):
        return Absent(
            "torch has no 'torch.{{ cookiecutter.device_type }}' device module "
            "(is the torch extension for '{{ cookiecutter.device_type }}' installed and imported?)"
{%- if cookiecutter.__dispatch_key == "PrivateUse1" %}
            f"; {STANDIN_ENV}=1 runs this plugin on opcore's virtual device renamed to "
            "'{{ cookiecutter.device_type }}'"
{%- endif %}
        )
    try:
        count = module.device_count()
    except Exception as exc:  # a broken runtime is a reason, not a crash of resolution
        return Absent(f"torch.{{ cookiecutter.device_type }}.device_count() failed: {exc}")
    if count == 0:
        return Absent("torch.{{ cookiecutter.device_type }}.device_count() found no device")
    return PLATFORM_CLASS
{%- endif %}
