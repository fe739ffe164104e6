"""bench/gpu/shipped_table.py picks the cuda plugin's table that names the GPU. This
machine has no GPU: the device name comes from a stand-in for torch.cuda (named so below);
the tables are the real shipped files."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from opcore.testing import scripts

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu" / "shipped_table.py"


def run(monkeypatch, capsys, gpu_name_stand_in):
    mod = scripts.load_script(SCRIPT)
    if gpu_name_stand_in is not None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: gpu_name_stand_in)
    rc = mod.main()
    out = capsys.readouterr()
    return rc, out.out.strip(), out.err


def test_each_shipped_tables_device_gets_its_own_table(monkeypatch, capsys):
    tables = sorted((ROOT / "plugins/cuda/src/opcore_plugin_cuda/tuning").glob("*.json"))
    assert len(tables) >= 2
    for path in tables:
        device = json.loads(path.read_text())["environment"]["device"]
        assert run(monkeypatch, capsys, device)[:2] == (0, str(path.relative_to(ROOT)))


def test_a_gpu_no_table_names_is_refused_not_given_another_devices_table(monkeypatch, capsys):
    rc, out, err = run(monkeypatch, capsys, "Stand-in GPU 9000")
    assert (rc, out) == (1, "")
    assert "no table in plugins/cuda/src/opcore_plugin_cuda/tuning names 'Stand-in GPU 9000'" in err


def test_without_a_gpu_the_dry_runs_get_the_h200_table(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, out, _ = run(monkeypatch, capsys, None)
    assert (rc, out) == (
        0,
        "plugins/cuda/src/opcore_plugin_cuda/tuning/nvidia-h200-torch2.11-triton3.6.json",
    )
