"""`opcore bench`: op x provider x shape timings, with bandwidth against the measured copy
rate and speedups against native eager and torch.compile.

Modules: `timing` (do_bench / CUDA-graph replay / CPU timers), `cases` (shape sets and
argument builders with their byte counts), `baselines` (native eager, torch.compile of the
native function, F.rms_norm, Liger), `runner` (the matrix), `report` (JSON, Markdown, PNG).
Performance is measured here and in bench/, never by timed tests.
"""
