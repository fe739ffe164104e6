"""`opcore bench`: op x provider x shape timings, with bandwidth against the measured copy
rate and speedups against native eager and torch.compile.

Modules: `timing` (the platform's timing events and graphs, or the host clock), `shapes`
and `cases` (shape sets, argument builders with their byte counts), `baselines` (native
eager, torch.compile of the native function, F.rms_norm, Liger), `runner` (the matrix),
`report` (JSON, Markdown, PNG). Device-specific calls go through the `Platform`
(`synchronize`, `empty_cache`, `timing_event`, `capture_graph`, `device_summary`), so the
benchmark runs on any platform.
Performance is measured here and in bench/, never by timed tests.
"""
