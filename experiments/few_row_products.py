"""What the few-row products of one forward cost on this machine, by path and row count.

Every ``nn.Linear`` of the default model (SmolLM2-135M-Instruct, float32: 211 layers), multiplied
by R random rows through each path this machine has, summed over the layers (ms, median of
``--repeats`` rounds, paths interleaved within a round so drift hits them alike):

- ``pytorch``: ``F.linear``, the usual path (MKL's GEMM on x86 builds);
- ``onednn``: ``medusa_lite.cpu.prepack.onednn_linear`` on the dense weight (the fallback);
- ``mkl_packed``: MKL's packed GEMM for exactly R rows (the fallback before oneDNN; its packing
  is excluded, and a real decode pays for padding to a row bucket);
- ``row_gemm_avx512`` / ``row_gemm_avx2``: medusa-lite's kernel variants this CPU runs.

    python experiments/few_row_products.py --out benchmarks/issue20_epyc_onednn/few_row_products.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from medusa_lite.artifacts.default_model import ensure_default_model
from medusa_lite.bench.measure import machine_info, timed
from medusa_lite.cpu import kernels
from medusa_lite.cpu.prepack import onednn_available, onednn_linear

ROW_COUNTS = (1, 2, 4, 8, 14, 20)
WARMUP_ROUNDS = 2


def default_linear_weights() -> list[torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(ensure_default_model(torch.float32), dtype=torch.float32)
    return [module.weight.detach() for module in model.modules() if isinstance(module, torch.nn.Linear)]


def row_gemm_path(variant: str, weights: list[torch.Tensor]) -> Callable[[torch.Tensor, int], torch.Tensor]:
    packed = [kernels.pack_for_row_gemm(weight, variant) for weight in weights]
    return lambda inputs, index: kernels.row_gemm(inputs, packed[index], weights[index].shape[0], variant)


def paths(weights: list[torch.Tensor], rows: int) -> dict[str, Callable[[torch.Tensor, int], torch.Tensor]]:
    """Each path as (inputs [rows, in], layer index) -> outputs."""
    found = {"pytorch": lambda inputs, index: F.linear(inputs, weights[index])}
    if onednn_available():
        found["onednn"] = lambda inputs, index: onednn_linear(inputs, weights[index], None)
    if torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear"):
        packed = [torch.ops.mkl._mkl_reorder_linear_weight(weight, rows) for weight in weights]
        found["mkl_packed"] = lambda inputs, index: torch.ops.mkl._mkl_linear(
            inputs, packed[index], weights[index], None, rows
        )
    for variant in kernels.VARIANT_FLAGS:
        if kernels.variant_unavailable_reason(variant) is None:
            found[f"row_gemm_{variant}"] = row_gemm_path(variant, weights)
    return found


def one_forward_ms(path, inputs: list[torch.Tensor]) -> float:
    return 1000 * timed(lambda: [path(rows_in, index) for index, rows_in in enumerate(inputs)])[1]


@torch.inference_mode()
def measure(weights: list[torch.Tensor], repeats: int) -> dict[int, dict[str, float]]:
    results = {}
    for rows in ROW_COUNTS:
        inputs = [torch.randn(rows, weight.shape[1]) for weight in weights]
        by_path = paths(weights, rows)
        for path in by_path.values():  # every path agrees with the usual one before it is timed
            torch.testing.assert_close(path(inputs[0], 0), F.linear(inputs[0], weights[0]), rtol=1e-4, atol=1e-4)
        samples: dict[str, list[float]] = {name: [] for name in by_path}
        for round_ in range(WARMUP_ROUNDS + repeats):
            for name, path in by_path.items():
                elapsed = one_forward_ms(path, inputs)
                if round_ >= WARMUP_ROUNDS:
                    samples[name].append(elapsed)
        results[rows] = {name: round(statistics.median(values), 2) for name, values in samples.items()}
        print(rows, results[rows], flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    weights = default_linear_weights()
    results = {
        "machine": machine_info(torch.float32),
        "linear_layers": len(weights),
        "repeats": args.repeats,
        "ms_per_forward_by_rows": measure(weights, args.repeats),
    }
    if args.out:
        with open(args.out, "w") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
