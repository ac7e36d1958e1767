"""The decoder's dense layers, numpy's BLAS against ONNX Runtime, side by side in one run: the five
matmuls of a GPT-2 layer (QKV, attention output, MLP in and out) plus the LM head, at the row counts a
step has (a few decodes up to a 512-token prefill chunk). numpy is `x @ w`, as the runner computed them
before; ONNX Runtime is a session per weight, the weight an initializer that it packs once, as
engine/dense_layers.py builds them. Median of --repeats, each the mean of --number calls.

    python scripts/bench_dense_layers.py [--rows 1,8,16,32,64,512] [--repeats 5]

Prints a table and writes bench_results/dense_layers.json.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backends" / "continuous_decoding"))  # the engine, as the backend loads it

from engine.cpu import available_cores  # noqa: E402
from engine.dense_layers import DenseGraph  # noqa: E402
from engine.weights import load_weights  # noqa: E402
from scripts.bench_record import write_record  # noqa: E402


def matmul_session(weight: np.ndarray, threads: int):
    """One MatMul session, built and configured as engine/dense_layers.py builds its sessions."""
    graph = DenseGraph(epsilon=0.0)  # no layer norm in this graph
    product = graph.linear("x", weight, None, "w")
    return graph.session({"x": weight.shape[0]}, {product: weight.shape[1]}, threads)


def timed(call, number: int, repeats: int) -> float:
    """Median over repeats of the mean seconds per call."""
    call()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            call()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", type=Path, default=ROOT / "model_repository" / "gpt2" / "1")
    p.add_argument("--rows", default="1,8,16,32,64,512")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--number", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "dense_layers.json")
    args = p.parse_args(argv)
    w = load_weights(args.weights)
    layer = w.layers[0]
    weights = [np.ascontiguousarray(a) for a in (layer.qkv_weight, layer.attn_out_weight, layer.fc_weight,
                                                 layer.mlp_out_weight, w.lm_head.T)]
    threads = available_cores()
    sessions = [matmul_session(weight, threads) for weight in weights]
    rng = np.random.default_rng(0)
    print(f"{'rows':>5} {'numpy ms':>9} {'ORT ms':>8} {'numpy GFLOP/s':>14} {'ORT GFLOP/s':>12} {'ORT speed-up':>13}")
    results = []
    for rows in (int(r) for r in args.rows.split(",")):
        inputs = [rng.standard_normal((rows, weight.shape[0]), dtype=np.float32) for weight in weights]
        numpy_s = timed(lambda: [x @ weight for x, weight in zip(inputs, weights)], args.number, args.repeats)
        ort_s = timed(lambda: [s.run(None, {"x": x}) for x, s in zip(inputs, sessions)], args.number, args.repeats)
        flops = 2 * rows * sum(weight.size for weight in weights)
        results.append({"rows": rows, "numpy_ms": 1e3 * numpy_s, "onnxruntime_ms": 1e3 * ort_s,
                        "numpy_gflops": flops / numpy_s / 1e9, "onnxruntime_gflops": flops / ort_s / 1e9,
                        "speedup": numpy_s / ort_s})
        r = results[-1]
        print(f"{rows:>5} {r['numpy_ms']:>9.2f} {r['onnxruntime_ms']:>8.2f} {r['numpy_gflops']:>14.1f} "
              f"{r['onnxruntime_gflops']:>12.1f} {r['speedup']:>12.2f}x")
    write_record(args.out, "dense_layers", args, threads=threads, shapes=[list(wt.shape) for wt in weights],
                 results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
