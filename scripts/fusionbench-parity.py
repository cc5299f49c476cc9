#!/usr/bin/env python3
"""Make parity fixtures from FusionBench, the model-merging research benchmark.

What it makes, under OUT_DIR (the tests read tests/fixtures/fusionbench):
  f32/inputs/{base,expert1..expert4}.safetensors   small float32 checkpoints (numpy, seeded)
  bf16/inputs/...                                    the same values rounded to bfloat16
  {f32,bf16}/fusionbench/<merge>.safetensors         FusionBench's merge of them, float32
  manifest.json                                      versions, generator, and per merge the
                                                     method id and parameters mergescope uses,
                                                     the FusionBench function called and its
                                                     arguments

The merges are FusionBench 0.2.33's own functions on the task vectors τ_t = θ_t − θ_0:
  tsv-m    method/task_singular_vector/utils/TSVM_utils.py::compute_and_sum_svd_mem_reduction,
           then θ_0 + alpha·τ (TaskSingularVectorMerging.run with a single alpha)
  iso-c    method/isotropic_merging/iso_utils.py::iso_c, then θ_0 + scaling_factor·τ (ISO_C_Merge.run)
  iso-cts  iso_utils.py::iso_cts(common_space_fraction), then θ_0 + scaling_factor·τ
  wudi     method/wudi/wudi.py::wudi_merging(iter_num), then θ_0 + τ (WUDIMerging.run)
For bfloat16 inputs the task vectors are taken in float32 from the bfloat16 values (FusionBench
runs torch.linalg.svd, which has no bfloat16 kernel on the CPU, and Adam steps of 1e-5 vanish
in bfloat16), which is what mergescope computes too.

Tensors: 2-D matrices of both orientations and of a rank below the number of experts (where
TSV-M keeps no singular vector and Iso-CTS no task-specific one), a bias, a 4-D kernel and a
scalar, so that every branch of the references runs.

How to run:
  python3 scripts/fusionbench-parity.py OUT_DIR [--venv DIR]

It creates a virtualenv (default ~/.cache/mergescope/fusionbench-venv, reused when present),
pip-installs fusion-bench==0.2.33 into it from the default package index (that pulls torch
and lightning; minutes), then runs itself again inside it. OUT_DIR's f32/, bf16/ and
manifest.json are replaced; nothing else is touched. Any failure exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

FUSIONBENCH = "0.2.33"
DEFAULT_VENV = Path.home() / ".cache" / "mergescope" / "fusionbench-venv"
N_EXPERTS = 4

# name, shape. Row-major, HF-style names.
TENSORS = [
    ("layers.0.weight", (24, 16)),
    ("layers.0.bias", (24,)),
    ("layers.1.weight", (20, 36)),
    ("head.weight", (3, 9)),
    ("conv.weight", (4, 2, 3, 3)),
    ("scale", ()),
]

# merge name -> (mergescope method id, mergescope params, FusionBench call, its arguments)
MERGES = {
    "tsv_m": ("tsv-m", {"lambda": 1.0}, "compute_and_sum_svd_mem_reduction", {}),
    "tsv_m_lambda_0_7": ("tsv-m", {"lambda": 0.7}, "compute_and_sum_svd_mem_reduction", {}),
    "iso_c": ("iso-c", {"lambda": 1.0}, "iso_c", {}),
    "iso_c_lambda_1_3": ("iso-c", {"lambda": 1.3}, "iso_c", {}),
    "iso_cts": ("iso-cts", {"lambda": 1.0, "common_space_fraction": 0.8}, "iso_cts",
                {"common_space_fraction": 0.8}),
    "iso_cts_half": ("iso-cts", {"lambda": 1.0, "common_space_fraction": 0.5}, "iso_cts",
                     {"common_space_fraction": 0.5}),
    "wudi": ("wudi", {}, "wudi_merging", {"iter_num": 400}),
    "wudi_50": ("wudi", {"iterations": 50}, "wudi_merging", {"iter_num": 50}),
}


def die(msg: str) -> None:
    print(f"fusionbench-parity: {msg}", file=sys.stderr)
    sys.exit(1)


def ensure_venv(venv: Path) -> Path:
    py = venv / "bin" / "python"
    if not py.exists():
        print(f"Creating virtualenv {venv}", flush=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        if subprocess.run([sys.executable, "-m", "venv", str(venv)]).returncode != 0:
            die(f"could not create the virtualenv {venv}")
    probe = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('fusion-bench'))"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != FUSIONBENCH:
        print(f"Installing fusion-bench=={FUSIONBENCH} into {venv} (this pulls torch; minutes)", flush=True)
        if subprocess.run([str(py), "-m", "pip", "install", f"fusion-bench=={FUSIONBENCH}"]).returncode != 0:
            die("pip install fusion-bench failed")
    return py


def generate(np, dtype: str) -> list[dict]:
    """Base and experts as {name: float32 array}; bf16 rounds every value to bfloat16."""
    import torch

    models = []
    for seed in range(N_EXPERTS + 1):
        rng = np.random.default_rng(100 + seed)
        model = {}
        for name, shape in TENSORS:
            if seed == 0:
                a = rng.normal(0.0, 0.05, size=shape)
            else:
                # Each expert moves the base by a task vector with its own low-rank structure
                # plus noise, as fine-tuning does.
                base = models[0][name].astype(np.float64)
                delta = rng.normal(0.0, 0.01, size=shape)
                if len(shape) == 2:
                    u = rng.normal(0.0, 1.0, size=(shape[0], 2))
                    v = rng.normal(0.0, 1.0, size=(2, shape[1]))
                    delta += 0.02 * (u @ v) / np.sqrt(shape[1])
                a = base + delta
            a = np.asarray(a, dtype=np.float32)
            if dtype == "bf16":
                a = torch.from_numpy(a.copy()).to(torch.bfloat16).to(torch.float32).numpy()
            model[name] = a
        models.append(model)
    return models


def save(path: Path, tensors: dict, dtype: str) -> None:
    import torch
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    save_file({k: torch.from_numpy(v.copy()).to(torch_dtype).contiguous() for k, v in tensors.items()}, str(path))


def inside_venv(out: Path) -> None:
    import numpy as np
    import torch
    import fusion_bench
    from fusion_bench.method.isotropic_merging.iso_utils import iso_c, iso_cts
    from fusion_bench.method.task_singular_vector.utils.TSVM_utils import compute_and_sum_svd_mem_reduction
    from fusion_bench.method.wudi.wudi import wudi_merging

    torch.set_num_threads(1)
    calls = {
        "compute_and_sum_svd_mem_reduction": lambda tvs, **kw: compute_and_sum_svd_mem_reduction(
            tvs, accelerator="cpu", **kw),
        "iso_c": lambda tvs, **kw: iso_c(tvs, accelerator="cpu", **kw),
        "iso_cts": lambda tvs, **kw: iso_cts(tvs, accelerator="cpu", **kw),
        "wudi_merging": lambda tvs, **kw: wudi_merging(tvs, accelerator="cpu", **kw),
    }
    merges_manifest = {}
    for dtype in ("f32", "bf16"):
        root = out / dtype
        models = generate(np, dtype)
        for i, m in enumerate(models):
            save(root / "inputs" / ("base.safetensors" if i == 0 else f"expert{i}.safetensors"), m, dtype)
        base = {k: torch.from_numpy(v.copy()) for k, v in models[0].items()}
        for name, (method, params, call, kwargs) in MERGES.items():
            tvs = [{k: torch.from_numpy(v.copy()) - base[k] for k, v in m.items()} for m in models[1:]]
            torch.manual_seed(0)
            merged = calls[call](tvs, **kwargs)
            scale = params.get("lambda", 1.0)
            result = {k: (base[k] + scale * merged[k].detach().to(torch.float32)).numpy() for k in base}
            save(root / "fusionbench" / f"{name}.safetensors", result, "f32")
            merges_manifest[name] = {
                "method": method,
                "params": params,
                "fusionbench": call,
                "arguments": kwargs,
                "then": f"θ_0 + {scale}·τ",
            }
    manifest = {
        "about": "Parity fixtures made by scripts/fusionbench-parity.py: FusionBench's own merge "
                 "functions on small seeded checkpoints (f32, and the same rounded to bf16). "
                 "Outputs are float32.",
        "versions": {
            "fusion_bench": fusion_bench.__version__ if hasattr(fusion_bench, "__version__") else FUSIONBENCH,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "generator": "numpy.random.default_rng(100 + i): base N(0, 0.05); expert i = base + N(0, 0.01) "
                     "+ 0.02·(u v)/√n with u, v of rank 2 on 2-D tensors; float32, bf16 rounded via torch",
        "experts": N_EXPERTS,
        "tensors": {name: list(shape) for name, shape in TENSORS},
        "merges": merges_manifest,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {len(MERGES)} merges × 2 dtypes to {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = args.out_dir.resolve()
    if args.inside:
        for sub in ("f32", "bf16"):
            shutil.rmtree(out / sub, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        inside_venv(out)
        return
    py = ensure_venv(args.venv.expanduser().absolute())
    r = subprocess.run([str(py), str(Path(__file__).resolve()), str(out), "--inside"])
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
