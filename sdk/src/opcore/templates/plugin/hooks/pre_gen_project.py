"""Validate the answers before anything is rendered.

A bad answer prints exactly one line, ``ERROR: <what is wrong and what to do>``, and exits
1, so nothing is generated. ``opcore new-plugin`` loads this file and calls the same
``*_problem`` functions before it renders, so both paths reject the same names with the
same words. This file must stay importable unrendered: the answers reach it only through
the ``ANSWERS`` string below, never through template syntax in code.
"""

from __future__ import annotations

import json
import re
import sys

# Rendered by the template engine into a JSON object of the three answers.
ANSWERS = r"""{
    "plugin_name": {{ cookiecutter.plugin_name | jsonify }},
    "vendor": {{ cookiecutter.vendor | jsonify }},
    "device_type": {{ cookiecutter.device_type | jsonify }}
}"""

# One word, lowercase, single underscores between parts: it becomes the entry-point name,
# Platform.name, the provider name, part of the module name and of an environment variable.
# Both patterns are applied with fullmatch: a `$` anchor would let a trailing newline through
# ("acme\n"), which then splits generated code and file names.
NAME_RE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
MAX_NAME_LENGTH = 40
DEVICE_TYPE_RE = re.compile(r"[a-z][a-z0-9_]*")

# Device types torch itself knows (the list torch.device() names when it rejects a string).
# A plugin named after one would read as torch's own device; sdk/tests pin this set to the
# installed torch.
TORCH_DEVICE_TYPES = frozenset(
    {
        "cpu",
        "cuda",
        "ipu",
        "xpu",
        "mkldnn",
        "opengl",
        "opencl",
        "ideep",
        "hip",
        "ve",
        "fpga",
        "maia",
        "xla",
        "lazy",
        "vulkan",
        "mps",
        "meta",
        "hpu",
        "mtia",
        "privateuseone",
        "privateuse1",
    }
)

# Names the first-party plugins (and the core's fallback platform) already use.
FIRST_PARTY = {
    "cpu": "opcore-plugin-cpu",
    "cuda": "opcore-plugin-cuda",
    "rocm": "opcore-plugin-rocm",
    "xpu": "opcore-plugin-xpu",
    "tpu": "opcore-plugin-tpu",
    "ascend": "opcore-plugin-ascend",
    # torch_npu's device type: Ascend NPUs are the first-party ascend plugin's device.
    "npu": "opcore-plugin-ascend (Ascend NPUs, device type 'npu')",
    "vdev": "opcore-plugin-vdev (the virtual accelerator)",
    "unspecified": "the core's fallback platform when no plugin is installed",
}

# The plugin name is also its provider name on the ops; these are taken.
RESERVED_PROVIDERS = {
    "native": "the reference provider of every op",
    "triton": "the core's portable Triton kernels (opcore.kernels.triton)",
}


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a plugin name, in one line; ``None`` when it can."""
    if not NAME_RE.fullmatch(name):
        hint = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
        example = f" such as {hint!r}" if hint and NAME_RE.fullmatch(hint) else ""
        return (
            f"plugin name {name!r} is not a lowercase identifier: use letters a-z and digits, "
            f"parts joined by single underscores, starting with a letter{example}"
        )
    if len(name) > MAX_NAME_LENGTH:
        return f"plugin name {name!r} is {len(name)} characters long; at most {MAX_NAME_LENGTH}"
    if name.startswith("opcore"):
        return (
            f"plugin name {name!r} repeats the prefix: the distribution is already named "
            f"'opcore-plugin-NAME'; give only NAME (your product or device)"
        )
    if name in FIRST_PARTY:
        return (
            f"plugin name {name!r} is taken by {FIRST_PARTY[name]}; name the plugin after "
            f"your product or device"
        )
    if name in TORCH_DEVICE_TYPES:
        return (
            f"plugin name {name!r} is a torch device type; name the plugin after your product "
            f"(e.g. 'acme') and pass the device type with --device-type {name}"
        )
    if name in RESERVED_PROVIDERS:
        return f"plugin name {name!r} is reserved: it is {RESERVED_PROVIDERS[name]}"
    return None


def device_type_problem(device_type: str) -> str | None:
    """Why ``device_type`` cannot be the platform's torch device type; ``None`` if it can."""
    if not DEVICE_TYPE_RE.fullmatch(device_type):
        return (
            f"device type {device_type!r} is not a torch device type name: expected a lowercase "
            f"identifier such as 'cpu', 'cuda' or your extension's device (e.g. 'npu')"
        )
    return None


def vendor_problem(vendor: str) -> str | None:
    """Why ``vendor`` cannot be written into pyproject.toml and the sources; ``None`` if
    it can.

    Any printable text on one line is accepted, quotes, backslashes and template syntax
    included: the template escapes it where it lands (a TOML string, a Python docstring) and
    the text is never evaluated as a template. Control characters, line breaks and other
    unprintable characters are refused: they would split the line they land on.
    """
    if not vendor.strip():
        return "vendor is empty: give the person or organisation that publishes the plugin"
    bad = sorted({ch for ch in vendor if not ch.isprintable()})
    if bad:
        shown = ", ".join(repr(ch) for ch in bad)
        return f"vendor {vendor!r} contains {shown}: use printable text on one line"
    return None


def problems(answers: dict[str, str]) -> list[str]:
    """Every problem of ``answers`` (keys plugin_name, vendor, device_type), in order."""
    found = [
        name_problem(answers["plugin_name"]),
        vendor_problem(answers["vendor"]),
        device_type_problem(answers["device_type"]),
    ]
    return [p for p in found if p]


def main() -> int:
    found = problems(json.loads(ANSWERS))
    if found:
        # One line: the first problem is the one to fix first.
        print(f"ERROR: {found[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
