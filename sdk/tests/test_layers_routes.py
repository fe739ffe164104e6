"""`opcore info` says which route each layer took and why: ``forward_native`` reaching the
op's providers by priority, or a ``register_oot`` whole-layer replacement. The replacements
come from a real installed general plugin (`make_distribution`), run in a fresh interpreter
through the real CLI."""

from __future__ import annotations

import json

import pytest

from opcore.plugins import GENERAL_PLUGINS_GROUP
from opcore.testing import make_distribution, run_python

PLUGIN = """
from opcore.layers import Attention, FusedMoE, SiluAndMul


class AcmeSiluAndMul(SiluAndMul):
    def forward_oot(self, x):
        return self.forward_native(x)


class AcmeAttention(Attention):
    pass


class AcmeFusedMoE(FusedMoE):
    pass


def register():
    SiluAndMul.register_oot(AcmeSiluAndMul)
    Attention.register_oot(AcmeAttention)
    FusedMoE.register_oot(AcmeFusedMoE)
"""

INFO = "from opcore.cli import main; raise SystemExit(main({args!r}))"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    path = tmp_path_factory.mktemp("routes-site")
    make_distribution(
        path,
        "opcore-acme-layers",
        entry_points={GENERAL_PLUGINS_GROUP: {"acme_layers": "acme_layers:register"}},
        files={"acme_layers.py": PLUGIN},
    )
    return path


def _info(site, *args):
    proc = run_python(INFO.format(args=["info", *args]), site=site, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _row(text: str, op: str) -> str:
    """The row of layer ``op`` in the "Layers:" table (other tables name the ops too)."""
    section = text.split("\nLayers:\n", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in section.splitlines() if line.strip().startswith(op + " ")]
    assert len(rows) == 1, section
    return rows[0]


def test_info_layer_table_names_each_route(site):
    out = _info(site)
    assert "ROUTE" in out
    assert "forward_native -> op rms_norm, fused_add_rms_norm (priority picks the kernel)" in (
        _row(out, "rms_norm")
    )
    silu = _row(out, "silu_and_mul")
    assert "register_oot: AcmeSiluAndMul (whole-layer replacement), forward_oot" in silu
    assert "the replacement acme_layers.AcmeSiluAndMul defines forward_oot" in silu
    assert "register_oot: AcmeAttention (whole-layer replacement), forward" in (
        _row(out, "attention")
    )


def test_info_json_carries_the_route(site):
    data = json.loads(_info(site, "--json"))
    registry = data["layers"]["registry"]
    assert registry["silu_and_mul"]["bound"] == "forward_oot"
    assert registry["silu_and_mul"]["route"].startswith("register_oot: AcmeSiluAndMul")
    assert registry["gelu_and_mul"]["route"] == (
        "forward_native -> op gelu_and_mul (priority picks the kernel)"
    )


def test_info_names_the_fused_moe_route_in_tree_and_replaced(site, tmp_path):
    replaced = _row(_info(site), "fused_moe")
    assert "AcmeFusedMoE (replaces opcore.layers.moe.FusedMoE)" in replaced
    assert "register_oot: AcmeFusedMoE (whole-layer replacement), forward" in replaced
    in_tree = _row(_info(tmp_path), "fused_moe")  # no plugin on this site
    assert "forward -> op topk_softmax, grouped_topk, fused_experts (priority picks" in in_tree
