#!/usr/bin/env bash
# bench/norm_weight_order.py on the GPU (issue 31's weight-load lead; about 20 s; carry .whl
# for Liger; NWO_SHAPES=TxH,... picks the shapes). Results: $OUT/norm_weight_order/out.log (one JSON line per shape).
set -u
mkdir -p "$OUT/norm_weight_order"
python3 bench/norm_weight_order.py ${NWO_SHAPES:+--shapes "$NWO_SHAPES"} 2>&1 | tee "$OUT/norm_weight_order/out.log"
