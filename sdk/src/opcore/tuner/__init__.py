"""The offline tuner behind ``opcore tune``: `search` measures launch candidates and
provider orders per token bucket, gating each against the float64 reference (`gate`), and
writes a tuning table (`opcore.tuning.table`) that the run-time index
(`opcore.tuning.runtime`) serves.

It sits beside `opcore.bench` (whose timing it uses), above the index: nothing in a
process that only runs ops imports it.
"""
