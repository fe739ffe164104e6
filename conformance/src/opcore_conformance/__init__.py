"""opcore-conformance: checks a platform's kernels and contract against opcore's reference
semantics.

Front ends: the ``opcore conformance`` command (`opcore_conformance.cli`) and a pytest
plugin (`opcore_conformance.pytest_plugin`, activated by ``--opcore``). Both run the same
cases (`opcore_conformance.session.ConformanceSession`) and write the same reports.
"""

__version__ = "2.0.0"  # the distribution's version (conformance/pyproject.toml)
