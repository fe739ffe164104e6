"""A ``compile.*`` failure a plugin author can act on: the op, the provider and the source
line that broke the lowering, and the traceback in the JSONL ``details``.

The provider is a real installed distribution with Python control flow on a size (the
rule it breaks: providers are traced by torch.compile). The small decoder, compiled with a
dynamic token dim, fails with torch's ``ConstraintViolationError``, which names neither;
the suite lowers op by op to find the culprit.
"""

from __future__ import annotations

import pytest

from opcore.testing import make_distribution

SIZE_BRANCH = """
from opcore.ir import ops


def tokens_as_int(x, weight, epsilon, variance_size=None):
    tokens = int(x.shape[0])  # DEFECT: a size turned into a Python int, branched on
    if tokens > 0:
        return ops.rms_norm.native(x, weight, epsilon, variance_size)
    return x


def register():
    if "size_branch" not in ops.rms_norm.impls:
        ops.rms_norm.register_impl("size_branch")(tokens_as_int)
"""


@pytest.fixture(scope="module")
def size_branch_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("size-branch-site")
    make_distribution(
        site,
        "opcore-size-branch",
        entry_points={"opcore.general_plugins": {"sb": "size_branch:register"}},
        files={"size_branch.py": SIZE_BRANCH},
    )
    return site


def test_decoder_compile_failure_names_op_provider_node_and_traceback(
    size_branch_site, tmp_path, run_suite, read_statuses
):
    report_dir = tmp_path / "reports"
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--case",
            "compile.dynamic_batch[eager]",
            "--expectations",
            "none",
            "--no-progress",
        ],
        site=size_branch_site,
        report_dir=report_dir,
        env={"OPCORE_IR_OP_PRIORITY": "rms_norm=size_branch,native"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [rec] = read_statuses(report_dir).values()
    assert rec["status"] == "fail"
    culprit = rec["details"]["culprit"]
    assert culprit["op"] == "rms_norm" and culprit["provider"] == "size_branch"
    assert "size_branch.py:5 in tokens_as_int" in culprit["node"]
    assert "int(x.shape[0])" in culprit["node"]
    assert "ConstraintViolationError" in rec["details"]["traceback"]
    assert (
        "provider 'size_branch'" in rec["message"]
        and "no Python control flow on sizes" in rec["message"]
    )
    # torch's own guard-failure logging is not dumped on the terminal
    assert "torch/_guards.py" not in proc.stderr
