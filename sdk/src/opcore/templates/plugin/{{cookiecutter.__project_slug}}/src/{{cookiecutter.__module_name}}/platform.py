"""`{{ cookiecutter.__class_prefix }}Platform`: what opcore knows about {{ cookiecutter.plugin_name }} devices.

Every member the core calls is declared on `opcore.platforms.Platform`; this class answers
them. The scaffold runs on torch's '{{ cookiecutter.device_type }}' device: point
`device_type`, `dispatch_key`, `dist_backend` and the device queries at your own device
and runtime.
{%- if cookiecutter.device_type != "cpu" %}

The device queries come from `TorchDevicePlatform`, which asks torch's device module
(``torch.{{ cookiecutter.device_type }}``); override one only where your device answers
differently.
{%- endif %}
"""

from __future__ import annotations
{% if cookiecutter.device_type == "cpu" %}
import os
import platform as _pyplatform
{% endif %}
import torch
{%- if cookiecutter.device_type == "cpu" %}
from opcore.platforms import Platform
{%- else %}
from opcore.platforms.torch_device import TorchDevicePlatform
{%- endif %}

from {{ cookiecutter.__module_name }} import PROVIDER
{%- if cookiecutter.__dispatch_key == "PrivateUse1" %}, install_standin, standin_on{% endif %}

# This platform's attention backend (attention.py): its registry name and class path.
ATTENTION_BACKEND = "{{ cookiecutter.plugin_name.upper() }}_ATTN"
ATTENTION_BACKEND_CLASS = "{{ cookiecutter.__module_name }}.attention.{{ cookiecutter.__class_prefix }}AttentionBackend"


class {{ cookiecutter.__class_prefix }}Platform({% if cookiecutter.device_type == "cpu" %}Platform{% else %}TorchDevicePlatform{% endif %}):
    """{{ cookiecutter.plugin_name }} devices, as seen by opcore."""

    name = "{{ cookiecutter.plugin_name }}"  # must equal the entry-point name
    device_name = "{{ cookiecutter.plugin_name }}"
    device_type = "{{ cookiecutter.device_type }}"
    dispatch_key = "{{ cookiecutter.__dispatch_key }}"
    dist_backend = "gloo"  # TODO: your collective library's torch.distributed backend
    device_control_env_var = None  # e.g. "{{ cookiecutter.plugin_name.upper() }}_VISIBLE_DEVICES"
    # Only dtypes the device really computes: conformance checks each one on the device.
    supported_dtypes = (torch.float32, torch.float16, torch.bfloat16)
    # The plugin-API versions this class was written for: min inclusive, max exclusive.
    plugin_api = ("{{ cookiecutter.__plugin_api_min }}", "{{ cookiecutter.__plugin_api_max }}")
    # Declared expected failures and loosened tolerances, read by opcore-conformance.
    conformance_expectations = "{{ cookiecutter.__module_name }}:expectations.toml"
{%- if cookiecutter.__dispatch_key == "PrivateUse1" %}

    def __init__(self) -> None:
        # The stand-in: opcore's virtual device renamed to '{{ cookiecutter.device_type }}'
        # (install_standin). Delete this with the stand-in.
        if standin_on():
            install_standin()
{%- endif %}
{% if cookiecutter.device_type == "cpu" %}
    # ------------------------------------------------------------ device queries
    # TODO: answer these from your runtime. The stand-in is the host CPU as one device.
    def device_count(self) -> int:
        return 1

    def get_device_name(self, index: int = 0) -> str:
        return f"{{ cookiecutter.plugin_name }} stand-in ({_pyplatform.processor() or _pyplatform.machine()})"

    def get_device_total_memory(self, index: int = 0) -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
{% else %}
    # ------------------------------------------------------------ device queries
    # Inherited from TorchDevicePlatform, which calls the functions of the same name on
    # torch.{{ cookiecutter.device_type }} (total memory: get_device_properties().total_memory).
    # Override a query whose function your device module lacks (the base raises, naming
    # it), and get_device_capability when your device has no (major, minor) capability.
    # If torch.{{ cookiecutter.device_type }} appears only once your runtime is imported,
    # import the runtime in device_module():
    #
    # def device_module(self):
    #     import my_runtime  # noqa: F401  (registers torch.{{ cookiecutter.device_type }})
    #     return super().device_module()
{% endif %}
    # If your device copies the tiles of Triton's tensor descriptors in hardware (a bulk
    # tile-copy engine), say so: TRITON_PAGED's prefill then reads key tiles through them.
    #
    # def tensor_descriptor_copies(self, index: int = 0) -> bool:
    #     return True

    # ------------------------------------------------------------ hooks
    def import_kernels(self) -> None:
        """Layer replacements (register_oot), attention backends (register_backend) and any
        torch ops of this platform. Runs once, only when this platform is the current one."""
        from opcore.attention import register_backend

        from {{ cookiecutter.__module_name }} import layers  # noqa: F401  (registers on import)

        # A class path only: the selector imports the class when the name is selected.
        register_backend(ATTENTION_BACKEND, ATTENTION_BACKEND_CLASS)

    def import_ir_kernels(self) -> None:
        """This platform's providers of opcore ops."""
        from {{ cookiecutter.__module_name }} import providers  # noqa: F401  (registers on import)

    def get_default_ir_op_priority(self, config) -> dict[str, list[str]]:
        """Our provider first; native is the reference and the fallback for arguments our
        provider declines (its supports_args)."""
        return {"rms_norm": [PROVIDER, "native"]}

    def get_attn_backend_candidates(self, cfg) -> list[str]:
        """Attention backends to try, best first: ours, then the core's reference (any
        device) for layers ours declines. Names only; import_kernels registered ours."""
        return [ATTENTION_BACKEND, "TORCH_NATIVE"]
