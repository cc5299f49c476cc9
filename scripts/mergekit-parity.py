#!/usr/bin/env python3
"""Make small parity fixtures from mergekit, the reference model-merging library.

What it makes, under OUT_DIR:
  inputs/{base,expert1,expert2,expert3}/  tiny Llama-shaped Hugging Face folders
                                           (config.json + one bfloat16 model.safetensors),
                                           generated deterministically with numpy
  mergekit/<name>.yml                      the mergekit config of each merge
  mergekit/<name>/                         mergekit's output for it (float32 safetensors,
                                           config.json)
  manifest.json                            mergekit/torch versions, the generation
                                           settings, and per merge its method, parameters,
                                           models, output files and every output tensor's
                                           shape and dtype
  modules/                                 a tiny multimodal model (Mistral3ForConditionalGeneration,
                                           one of mergekit's modular architectures) merged per module
                                           with `modules:`: inputs/, mergekit/, manifest.json
  slices/                                  a tiny 6-layer Llama (float32 inputs, so that TIES's magnitude
                                           cuts have no ties) merged with `slices` whose sources carry
                                           their own parameters, gradients restarting in every slice,
                                           slices merging different numbers of models:
                                           inputs/, mergekit/, manifest.json
  tokenizer_union/                         the same for models whose tokenizers differ (added
                                           tokens, a permuted vocabulary) merged with
                                           tokenizer_source: union and the tokenizer block
                                           (with models, and with slices):
                                           inputs/ (with tokenizer.json), mergekit/ (outputs with
                                           tokenizer files), manifest.json (each output's vocab)

Why: mergescope's tests compare its merges (linear, task arithmetic, TIES, DARE, SLERP,
Model Stock, NuSLERP, Breadcrumbs) with mergekit's on these inputs (DARE's random masks
statistically: mergekit's output is one draw of torch's generator). The fixtures are committed to the repository, so
the tests and CI need no Python; this script only has to be run again to regenerate them
(for instance against a newer mergekit), and the diff of manifest.json shows what changed.

How to run:
  python3 scripts/mergekit-parity.py OUT_DIR [--venv DIR] [--mergekit VERSION] [--only tokenizer-union|modules|slices]

It creates a virtualenv (default ~/.cache/mergescope/mergekit-venv, reused when present),
pip-installs mergekit into it from the default package index (that pulls torch), then runs
itself again inside that virtualenv to generate the inputs, run `mergekit-yaml` on the CPU
for every config and write the manifest. OUT_DIR's inputs/, mergekit/, manifest.json and
tokenizer_union/, modules/, slices/ and frontier/ are replaced (with --only NAME: that folder only); nothing
else in OUT_DIR is touched. Any failure exits non-zero.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_VENV = Path.home() / ".cache" / "mergescope" / "mergekit-venv"

# --- the tiny model ---------------------------------------------------------------------
ARCH = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 64,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
BASE_SEED = 0
BASE_STD = 0.02  # matrices ~ N(0, BASE_STD)
NORM_STD = 0.01  # norm weights = 1 + N(0, NORM_STD)
DELTA_STD = 0.005  # expert = base + N(0, DELTA_STD), for every tensor
EXPERT_SEEDS = {"expert1": 1, "expert2": 2, "expert3": 3}
# expert3's delta for this tensor is COLINEAR_FACTOR x expert1's (nearly colinear task vectors).
COLINEAR_TENSOR = "model.layers.0.mlp.up_proj.weight"
COLINEAR_FACTOR = 1.0001


def tensor_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the architecture, in a fixed order (the order values are drawn in)."""
    h, i, v = ARCH["hidden_size"], ARCH["intermediate_size"], ARCH["vocab_size"]
    heads, kv_heads = ARCH["num_attention_heads"], ARCH["num_key_value_heads"]
    kv = h // heads * kv_heads
    out = [("model.embed_tokens.weight", (v, h))]
    for layer in range(ARCH["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        out += [
            (f"{p}.input_layernorm.weight", (h,)),
            (f"{p}.self_attn.q_proj.weight", (h, h)),
            (f"{p}.self_attn.k_proj.weight", (kv, h)),
            (f"{p}.self_attn.v_proj.weight", (kv, h)),
            (f"{p}.self_attn.o_proj.weight", (h, h)),
            (f"{p}.post_attention_layernorm.weight", (h,)),
            (f"{p}.mlp.gate_proj.weight", (i, h)),
            (f"{p}.mlp.up_proj.weight", (i, h)),
            (f"{p}.mlp.down_proj.weight", (h, i)),
        ]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return out


# --- the merges ---------------------------------------------------------------------------
EXPERTS = ["expert1", "expert2", "expert3"]


def merge_configs() -> dict[str, dict]:
    """mergekit YAML configs by fixture name. Model paths are relative to OUT_DIR."""

    def m(name: str, **params) -> dict:
        entry = {"model": f"inputs/{name}"}
        if params:
            entry["parameters"] = params
        return entry

    dtypes = {"dtype": "float32", "out_dtype": "float32"}
    base = "inputs/base"
    return {
        "linear": {
            "merge_method": "linear",
            "models": [m(e, weight=1.0) for e in EXPERTS],
            "parameters": {"normalize": True},
            **dtypes,
        },
        "task_arithmetic": {
            "merge_method": "task_arithmetic",
            "base_model": base,
            "models": [m(e, weight=0.3) for e in EXPERTS],
            **dtypes,
        },
        "ties": {
            "merge_method": "ties",
            "base_model": base,
            "models": [m(e, density=0.2, weight=1.0) for e in EXPERTS],
            "parameters": {"normalize": False},
            **dtypes,
        },
        "slerp_t03": {
            "merge_method": "slerp",
            "base_model": base,
            "models": [m("base"), m("expert1")],
            "parameters": {"t": 0.3},
            **dtypes,
        },
        "slerp_t07": {
            "merge_method": "slerp",
            "base_model": base,
            "models": [m("base"), m("expert3")],
            "parameters": {"t": 0.7},
            **dtypes,
        },
        "model_stock": {
            "merge_method": "model_stock",
            "base_model": base,
            "models": [m(e) for e in EXPERTS],
            **dtypes,
        },
        "model_stock_filter_wise": {
            "merge_method": "model_stock",
            "base_model": base,
            "models": [m(e) for e in EXPERTS],
            "parameters": {"filter_wise": True},
            **dtypes,
        },
        # Layer-wise parameters: a gradient per filter and a catch-all value; tensors outside the
        # layers take the first anchor of the first matching entry (mergekit's t = 0).
        "slerp_gradient": {
            "merge_method": "slerp",
            "base_model": base,
            "models": [m("base"), m("expert2")],
            "parameters": {
                "t": [
                    {"filter": "self_attn", "value": [0.1, 0.9, 0.4, 0.6]},
                    {"filter": "mlp", "value": [0.8, 0.2]},
                    {"value": 0.35},
                ]
            },
            **dtypes,
        },
        # NuSLERP: two models, t = w2 / (w1 + w2); with a base, their task vectors.
        "nuslerp": {
            "merge_method": "nuslerp",
            "models": [m("expert1", weight=1.0), m("expert2", weight=3.0)],
            **dtypes,
        },
        "nuslerp_base": {
            "merge_method": "nuslerp",
            "base_model": base,
            "models": [m("expert1", weight=2.0), m("expert3", weight=1.0)],
            **dtypes,
        },
        "nuslerp_rows": {
            "merge_method": "nuslerp",
            "base_model": base,
            "models": [m("expert2", weight=1.0), m("expert3", weight=1.0)],
            "parameters": {"nuslerp_flatten": False},
            **dtypes,
        },
        # Model Breadcrumbs: the smallest entries and the largest gamma fraction dropped per
        # tensor, with and without TIES sign consensus.
        "breadcrumbs": {
            "merge_method": "breadcrumbs",
            "base_model": base,
            "models": [m(e, density=0.7, gamma=0.05, weight=w) for e, w in zip(EXPERTS, [1.0, 0.5, 0.8])],
            "parameters": {"lambda": 0.9},
            **dtypes,
        },
        "breadcrumbs_ties": {
            "merge_method": "breadcrumbs_ties",
            "base_model": base,
            "models": [m(e, density=0.5, gamma=0.02, weight=1.0) for e in EXPERTS],
            "parameters": {"normalize": True},
            **dtypes,
        },
        "nuslerp_row_wise": {
            "merge_method": "nuslerp",
            "base_model": base,
            "models": [m("expert1", weight=1.0), m("expert2", weight=1.0)],
            "parameters": {"nuslerp_flatten": False, "nuslerp_row_wise": True},
            **dtypes,
        },
        # TIES with per-model density and weight, normalised by the agreeing weights.
        "ties_weighted": {
            "merge_method": "ties",
            "base_model": base,
            "models": [
                m(e, density=d, weight=w) for e, d, w in zip(EXPERTS, [0.3, 0.5, 0.2], [0.5, 0.3, 0.8])
            ],
            "parameters": {"normalize": True},
            **dtypes,
        },
        # DARE (random masks: one draw of torch's generator, seeded by --random-seed), with
        # per-model density and weight and mergekit's default rescale (L1 norm match).
        "dare_linear": {
            "merge_method": "dare_linear",
            "base_model": base,
            "models": [
                m(e, density=d, weight=w) for e, d, w in zip(EXPERTS, [0.6, 0.4, 0.8], [0.5, 0.3, 0.8])
            ],
            "parameters": {"normalize": True},
            **dtypes,
        },
        "dare_ties": {
            "merge_method": "dare_ties",
            "base_model": base,
            "models": [
                m(e, density=d, weight=w) for e, d, w in zip(EXPERTS, [0.5, 0.7, 0.3], [0.7, 0.4, 0.6])
            ],
            **dtypes,
        },
        # Per-model gradients and filters: expert 1's weight rises over the layers, expert 2's
        # depends on the tensor, expert 3's is one number.
        "task_arithmetic_gradients": {
            "merge_method": "task_arithmetic",
            "base_model": base,
            "models": [
                m("expert1", weight=[0.0, 1.0]),
                m("expert2", weight=[{"filter": "mlp", "value": 0.8}, {"value": [0.2, 0.4]}]),
                m("expert3", weight=0.5),
            ],
            **dtypes,
        },
        # SCE: the default select_topk (1, no selection) and a variance top-50 % selection.
        "sce": {
            "merge_method": "sce",
            "base_model": base,
            "models": [m(e) for e in EXPERTS],
            **dtypes,
        },
        "sce_topk": {
            "merge_method": "sce",
            "base_model": base,
            "models": [m(e) for e in EXPERTS],
            "parameters": {"select_topk": 0.5},
            **dtypes,
        },
        # Karcher mean of the three experts (no base role: mergekit would add a base as an input).
        "karcher": {
            "merge_method": "karcher",
            "models": [m(e) for e in EXPERTS],
            "parameters": {"max_iter": 20, "tol": 1e-6},
            **dtypes,
        },
        # Multi-SLERP without and with a base (task vectors on the sphere).
        "multislerp": {
            "merge_method": "multislerp",
            "models": [m(e, weight=w) for e, w in zip(EXPERTS, [1.0, 2.0, 3.0])],
            **dtypes,
        },
        "multislerp_base": {
            "merge_method": "multislerp",
            "base_model": base,
            "models": [m(e, weight=w) for e, w in zip(EXPERTS, [0.5, 0.3, 0.2])],
            **dtypes,
        },
        # DELLA-linear without rescale (random masks, magnitude-ranked keep probabilities): its
        # expected value is linear in the probabilities, which the test computes.
        "della_linear": {
            "merge_method": "della_linear",
            "base_model": base,
            "models": [
                m(e, density=d, epsilon=0.15, weight=w) for e, d, w in zip(EXPERTS, [0.5, 0.6, 0.4], [0.6, 0.3, 0.5])
            ],
            "parameters": {"rescale": False},
            **dtypes,
        },
        # A frankenmerge: layer 0 of the base, then layer 1 of expert 2 (passthrough slices).
        "passthrough_slices": {
            "merge_method": "passthrough",
            "slices": [
                {"sources": [{"model": base, "layer_range": [0, 1]}]},
                {"sources": [{"model": "inputs/expert2", "layer_range": [1, 2]}]},
            ],
            **dtypes,
        },
    }

# Methods whose `density` is a deterministic magnitude cut (random ones have no threshold ties).
MAGNITUDE_METHODS = {"ties", "breadcrumbs", "breadcrumbs_ties"}


# mergekit-yaml flags: CPU only, one thread (deterministic reductions, light on the machine),
# no tokenizer (the inputs have none), no README model card (the YAML sits beside the output).
MERGEKIT_FLAGS = [
    "--device", "cpu",
    "--no-copy-tokenizer",
    "--no-write-model-card",
    "--num-threads", "1",
    "--random-seed", "0",
]


def die(msg: str) -> None:
    print(f"mergekit-parity: error: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+ " + " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run([str(c) for c in cmd], **kw)


# --- phase 1: the virtualenv (any Python 3) ------------------------------------------------
def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def installed_mergekit(py: Path) -> str | None:
    r = subprocess.run(
        [str(py), "-c", "import importlib.metadata as m; print(m.version('mergekit'))"],
        capture_output=True,
        text=True,
    )
    return r.stdout.strip() if r.returncode == 0 else None


def ensure_venv(venv: Path, pin: str | None) -> Path:
    py = venv_python(venv)
    if not py.exists():
        print(f"Creating virtualenv {venv}", flush=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        if run([sys.executable, "-m", "venv", venv]).returncode != 0:
            die(f"could not create the virtualenv {venv}")
    have = installed_mergekit(py)
    if have is None or (pin is not None and have != pin):
        spec = f"mergekit=={pin}" if pin else "mergekit"
        print(f"Installing {spec} into {venv} (this pulls torch; it may take minutes)", flush=True)
        if run([py, "-m", "pip", "install", spec]).returncode != 0:
            die(f"pip install {spec} failed (see pip's output above)")
        if installed_mergekit(py) is None:
            die("mergekit is still not importable after pip install")
    else:
        print(f"Reusing {venv} (mergekit {have})", flush=True)
    return py


# --- phase 2: inside the virtualenv ---------------------------------------------------------
def to_bf16_file(tensors_f32: dict, path: Path) -> None:
    """Write float32 numpy arrays as a bfloat16 safetensors file (round to nearest even)."""
    import torch
    from safetensors.torch import save_file

    save_file(
        {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in tensors_f32.items()},
        str(path),
        metadata={"format": "pt"},
    )


def generate_inputs(inputs: Path) -> dict:
    import numpy as np
    import torch

    def bf16_round(a):
        # The value bfloat16 stores, back as float32: experts are built on the stored base.
        return torch.from_numpy(a).to(torch.bfloat16).to(torch.float32).numpy()

    shapes = tensor_shapes()
    rng = np.random.default_rng(BASE_SEED)
    base = {}
    for name, shape in shapes:
        if len(shape) == 1:  # norm weights
            a = 1.0 + rng.normal(0.0, NORM_STD, size=shape)
        else:
            a = rng.normal(0.0, BASE_STD, size=shape)
        base[name] = bf16_round(a.astype(np.float32))

    models = {"base": base}
    deltas = {}
    for expert, seed in EXPERT_SEEDS.items():
        rng = np.random.default_rng(seed)
        deltas[expert] = {n: rng.normal(0.0, DELTA_STD, size=s).astype(np.float32) for n, s in shapes}
    deltas["expert3"][COLINEAR_TENSOR] = (
        deltas["expert1"][COLINEAR_TENSOR].astype(np.float64) * COLINEAR_FACTOR
    ).astype(np.float32)
    for expert in EXPERT_SEEDS:
        models[expert] = {n: base[n] + deltas[expert][n] for n, _ in shapes}

    for name, tensors in models.items():
        folder = inputs / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(ARCH, indent=2) + "\n")
        to_bf16_file(tensors, folder / "model.safetensors")

    # After rounding to bfloat16 the colinear edge case may collapse to equal tensors.
    e1 = bf16_round(models["expert1"][COLINEAR_TENSOR])
    e3 = bf16_round(models["expert3"][COLINEAR_TENSOR])
    colinear_equal = int((e1 == e3).sum())

    return {
        "architecture": ARCH,
        "dtype": "bfloat16",
        "generator": "numpy.random.default_rng(seed).normal, drawn in float64 in the tensor order "
        "below, cast to float32, stored as bfloat16 (round to nearest even via torch)",
        "base": {"seed": BASE_SEED, "std": BASE_STD, "norm_weights": f"1 + N(0, {NORM_STD})"},
        "experts": {
            "formula": "bf16(base_as_stored + N(0, delta_std)), every tensor",
            "delta_std": DELTA_STD,
            "seeds": EXPERT_SEEDS,
        },
        "colinear_edge_case": {
            "tensor": COLINEAR_TENSOR,
            "rule": f"expert3 delta = {COLINEAR_FACTOR} x expert1 delta",
            "elements": int(e1.size),
            "elements_equal_after_bf16": colinear_equal,
        },
        "models": {n: f"inputs/{n}" for n in models},
        "tensors": {n: list(s) for n, s in shapes},
    }


def describe_output(folder: Path, expected: dict) -> dict:
    from safetensors import safe_open

    files = sorted(p.name for p in folder.iterdir() if p.is_file())
    st_files = [f for f in files if f.endswith(".safetensors")]
    if not st_files:
        die(f"{folder} has no .safetensors file (files: {files})")
    tensors, order, sha = {}, {}, {}
    for f in st_files:
        data = (folder / f).read_bytes()
        sha[f] = hashlib.sha256(data).hexdigest()
        # The order the writer laid the tensors out in (safe_open's keys() are sorted).
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + header_len])
        header.pop("__metadata__", None)
        order[f] = sorted(header, key=lambda k: header[k]["data_offsets"][0])
        with safe_open(str(folder / f), framework="pt") as fh:
            for k in fh.keys():
                t = fh.get_tensor(k)
                tensors[k] = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "file": f}
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        die(f"{folder}: tensors missing {missing}, unexpected {extra}")
    for k, info in tensors.items():
        if info["shape"] != expected[k]:
            die(f"{folder}: {k} has shape {info['shape']}, expected {expected[k]}")
        if info["dtype"] != "float32":
            die(f"{folder}: {k} is {info['dtype']}, expected float32 (out_dtype)")
    return {"files": files, "safetensors_files": st_files, "sha256": sha,
            "tensor_order_in_file": order, "tensors": tensors}


def tied_topk(out: Path, cfg: dict) -> dict[str, list[str]]:
    """For a config with `density`: per tensor, the experts whose task vector has several
    elements at its k-th largest magnitude (k = max(1, int(density * numel)), as in
    mergekit's magnitude pruning). mergekit picks the top k with torch.argsort, which
    breaks such ties arbitrarily, so another implementation may keep other, equally large
    elements there: a parity test must allow for it on exactly these tensors."""
    import torch
    from safetensors.torch import load_file

    base = load_file(str(out / cfg["base_model"] / "model.safetensors"))
    res: dict[str, list[str]] = {}
    for entry in cfg["models"]:
        density = entry.get("parameters", {}).get("density", 1.0)
        if density >= 1:
            continue
        model = load_file(str(out / entry["model"] / "model.safetensors"))
        for name, b in base.items():
            mag = (model[name].float() - b.float()).abs().reshape(-1)
            k = max(1, int(density * mag.numel()))
            top = torch.sort(mag, descending=True).values
            if k < mag.numel() and top[k] == top[k - 1]:
                res.setdefault(name, []).append(entry["model"])
    return dict(sorted(res.items()))


def frontier_configs() -> dict[str, dict]:
    """mergekit 0.1.5's newest methods (nearswap, ram, ramplus_tl, arcee_fusion) on the same
    tiny inputs; paths relative to OUT_DIR/frontier."""
    dtypes = {"dtype": "float32", "out_dtype": "float32"}
    base = "inputs/base"
    experts = [{"model": f"inputs/{e}"} for e in EXPERTS]
    return {
        "nearswap": {
            "merge_method": "nearswap",
            "base_model": base,
            "models": experts[:1],
            "parameters": {"t": 0.002},
            **dtypes,
        },
        "ram": {"merge_method": "ram", "base_model": base, "models": experts, **dtypes},
        # A larger epsilon, so that some task-vector elements count as unchanged.
        "ram_epsilon": {
            "merge_method": "ram",
            "base_model": base,
            "models": experts,
            "parameters": {"epsilon": 0.004},
            **dtypes,
        },
        "ramplus_tl": {
            "merge_method": "ramplus_tl",
            "base_model": base,
            "models": experts,
            "parameters": {"r": 0.5, "alpha": 0.8, "epsilon": 0.004},
            **dtypes,
        },
        "arcee_fusion": {"merge_method": "arcee_fusion", "base_model": base, "models": experts[:1], **dtypes},
    }


def inside_venv(out: Path, venv: Path, configs=None) -> None:
    import importlib.metadata as md

    import yaml

    versions = {p: md.version(p) for p in ("mergekit", "torch", "safetensors", "numpy", "transformers")}
    versions["python"] = platform.python_version()
    print("Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)

    out.mkdir(parents=True, exist_ok=True)
    for stale in ("inputs", "mergekit"):
        shutil.rmtree(out / stale, ignore_errors=True)
    (out / "manifest.json").unlink(missing_ok=True)

    print(f"Generating inputs in {out / 'inputs'}", flush=True)
    inputs = generate_inputs(out / "inputs")
    expected = inputs["tensors"]

    mergekit_yaml = venv / "bin" / "mergekit-yaml"
    if not mergekit_yaml.exists():
        die(f"{mergekit_yaml} not found: is mergekit installed in {venv}?")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    (out / "mergekit").mkdir()
    results, warnings = [], {}
    for name, cfg in (configs or merge_configs()).items():
        rel_yaml, rel_out = f"mergekit/{name}.yml", f"mergekit/{name}"
        (out / rel_yaml).write_text(yaml.safe_dump(cfg, sort_keys=False))
        r = run([mergekit_yaml, rel_yaml, rel_out, *MERGEKIT_FLAGS], cwd=out, env=env,
                capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stdout + r.stderr)
            die(f"mergekit-yaml failed for {name} (exit {r.returncode}); config: {out / rel_yaml}")
        # Everything mergekit printed except progress bars and blank lines.
        noise = [l.strip() for l in (r.stdout + r.stderr).replace("\r", "\n").splitlines()
                 if l.strip() and "it/s]" not in l and "%|" not in l]
        if noise:
            warnings[name] = sorted(set(noise))
        desc = describe_output(out / rel_out, expected)
        results.append({
            "name": name,
            "merge_method": cfg["merge_method"],
            "base_model": cfg.get("base_model"),
            "parameters": cfg.get("parameters", {}),
            "models": cfg.get("models", []),
            "slices": cfg.get("slices"),
            "dtype": cfg["dtype"],
            "out_dtype": cfg["out_dtype"],
            "config": rel_yaml,
            "output": rel_out,
            **desc,
        })
        if cfg["merge_method"] in MAGNITUDE_METHODS and any(
            "density" in m.get("parameters", {}) for m in cfg.get("models", [])
        ):
            results[-1]["topk_threshold_ties"] = tied_topk(out, cfg)

    manifest = {
        "about": "Parity fixtures made by scripts/mergekit-parity.py: mergekit's merges of "
        "the tiny inputs; paths are relative to this file's folder.",
        "versions": versions,
        "mergekit_yaml_flags": MERGEKIT_FLAGS,
        "inputs": inputs,
        "configs": results,
        "mergekit_warnings": warnings,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")

    def size(p: Path) -> int:
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())

    print("\nSummary")
    print("  " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    c = inputs["colinear_edge_case"]
    print(f"  inputs: 4 models x {len(expected)} tensors, {size(out / 'inputs')} bytes; "
          f"{c['tensor']}: {c['elements_equal_after_bf16']}/{c['elements']} elements of "
          f"expert3 equal expert1's after bf16")
    for r in results:
        print(f"  {r['name']:<24} {r['merge_method']:<16} {len(r['tensors'])} tensors in "
              f"{', '.join(r['safetensors_files'])}")
    for r in results:
        if "topk_threshold_ties" in r:
            print(f"  {r['name']}: {len(r['topk_threshold_ties'])} tensors have magnitude ties "
                  "at the density cut (mergekit breaks them arbitrarily; see manifest)")
    print(f"  mergekit outputs: {size(out / 'mergekit')} bytes")
    for name, lines in warnings.items():
        for l in lines:
            print(f"  warning ({name}): {l}")
    print(f"  manifest: {out / 'manifest.json'}")


# --- tokenizer union: models whose vocabularies differ ----------------------------------------
# A separate case under OUT_DIR/tokenizer_union/ (inputs, mergekit outputs, manifest), so the
# fixtures above stay as they are. Three tiny Llamas with byte-level-free BPE tokenizers (one
# character per token, no merges):
#   base     <unk> <s> </s> + a-z A-Z 0-8                     (64 tokens, vocab_size 64)
#   expert1  the base's tokens + added <|im_start|> <|im_end|> (66, vocab_size 66)
#   expert2  the base's characters in reverse order, without 'Z' but with '@', + added
#            <|im_end|>                                        (65, vocab_size 65)
# so the union has tokens every model has (rows permuted for expert2), tokens only one model
# has, one two models have, and one ('Z') that expert2 lacks.
TOK_SPECIALS = ["<unk>", "<s>", "</s>"]
TOK_CHARS = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ012345678")
TOK_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)
TOK_MODELS = {
    # name: (regular tokens in id order, added special tokens, chat template)
    "base": (TOK_SPECIALS + TOK_CHARS, [], None),
    "expert1": (TOK_SPECIALS + TOK_CHARS, ["<|im_start|>", "<|im_end|>"], TOK_CHAT_TEMPLATE),
    "expert2": (TOK_SPECIALS + [c for c in reversed(TOK_CHARS) if c != "Z"] + ["@"], ["<|im_end|>"],
                TOK_CHAT_TEMPLATE),
}
TOK_SEEDS = {"base": 10, "expert1": 11, "expert2": 12}


def tokenizer_union_configs() -> dict[str, dict]:
    dtypes = {"dtype": "float32", "out_dtype": "float32"}
    base = "inputs/base"
    return {
        # No base model: tokens some models lack take the mean of the models that have them.
        "linear_union": {
            "merge_method": "linear",
            "models": [{"model": f"inputs/{n}", "parameters": {"weight": w}}
                       for n, w in [("base", 1.0), ("expert1", 2.0), ("expert2", 1.0)]],
            "parameters": {"normalize": True},
            "tokenizer_source": "union",
            **dtypes,
        },
        # With a base: the base's row where it has the token.
        "task_arithmetic_union": {
            "merge_method": "task_arithmetic",
            "base_model": base,
            "models": [{"model": f"inputs/{n}", "parameters": {"weight": 0.5}} for n in ("expert1", "expert2")],
            "tokenizer_source": "union",
            **dtypes,
        },
        # The tokenizer block: per-token sources, a new token, padding, and the chat template
        # the inputs agree on.
        "task_arithmetic_tokenizer_block": {
            "merge_method": "task_arithmetic",
            "base_model": base,
            "models": [{"model": f"inputs/{n}", "parameters": {"weight": 0.5}} for n in ("expert1", "expert2")],
            "tokenizer": {
                "source": "union",
                "pad_to_multiple_of": 8,
                "tokens": {
                    "<|im_end|>": {"source": {"kind": "model_token", "model": "inputs/expert1", "token": "</s>"},
                                   "force": True},
                    "<|im_start|>": {"source": "inputs/expert1"},
                    "<new>": {"source": {"kind": "zero"}},
                },
            },
            "chat_template": "auto",
            **dtypes,
        },
        # Slices with a union: embeddings come from slices[0]'s sources and the output head from
        # slices[-1]'s, each permuted with the tokenizer of its own model. A frankenmerge (no
        # base_model: the tokenizer base is one of the models, in Python set order) ...
        "passthrough_slices_union": {
            "merge_method": "passthrough",
            "slices": [
                {"sources": [{"model": "inputs/expert1", "layer_range": [0, 1]}]},
                {"sources": [{"model": "inputs/expert2", "layer_range": [1, 2]}]},
            ],
            "tokenizer_source": "union",
            **dtypes,
        },
        # ... and a merge per slice whose experts change places between the slices.
        "task_arithmetic_slices_union": {
            "merge_method": "task_arithmetic",
            "base_model": base,
            "slices": [
                {"sources": [{"model": m, "layer_range": [0, 1]} for m in (base, "inputs/expert1", "inputs/expert2")]},
                {"sources": [{"model": m, "layer_range": [1, 2]} for m in (base, "inputs/expert2", "inputs/expert1")]},
            ],
            "parameters": {"weight": 0.5},
            "tokenizer_source": "union",
            **dtypes,
        },
    }


def generate_tokenizer_inputs(inputs: Path) -> dict:
    import numpy as np
    import torch
    from tokenizers import AddedToken, Tokenizer
    from tokenizers import models as tok_models
    from transformers import PreTrainedTokenizerFast

    def bf16_round(a):
        return torch.from_numpy(a).to(torch.bfloat16).to(torch.float32).numpy()

    h = ARCH["hidden_size"]
    shapes = [(n, s) for n, s in tensor_shapes() if n not in ("model.embed_tokens.weight", "lm_head.weight")]
    rng = np.random.default_rng(BASE_SEED)
    base_vocab = TOK_MODELS["base"][0]
    base_rows = {name: {t: rng.normal(0.0, BASE_STD, size=(h,)).astype(np.float32) for t in base_vocab}
                 for name in ("model.embed_tokens.weight", "lm_head.weight")}
    base_other = {}
    for name, shape in shapes:
        a = 1.0 + rng.normal(0.0, NORM_STD, size=shape) if len(shape) == 1 else rng.normal(0.0, BASE_STD, size=shape)
        base_other[name] = bf16_round(a.astype(np.float32))
    described = {}
    for model, (regular, added, template) in TOK_MODELS.items():
        folder = inputs / model
        folder.mkdir(parents=True)
        rng = np.random.default_rng(TOK_SEEDS[model])
        delta = 0.0 if model == "base" else DELTA_STD
        tensors = {}
        for name, shape in shapes:
            tensors[name] = base_other[name] + rng.normal(0.0, delta, size=shape).astype(np.float32) * (delta > 0)
        order = regular + added
        for name, rows in base_rows.items():
            m = np.stack([
                (rows[t] + rng.normal(0.0, delta, size=(h,)).astype(np.float32) * (delta > 0)) if t in rows
                else rng.normal(0.0, BASE_STD, size=(h,)).astype(np.float32)
                for t in order
            ])
            tensors[name] = bf16_round(m)
        config = dict(ARCH, vocab_size=len(order))
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        to_bf16_file(tensors, folder / "model.safetensors")

        tok = Tokenizer(tok_models.BPE(vocab={t: i for i, t in enumerate(regular)}, merges=[], unk_token="<unk>"))
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TOK_SPECIALS + added])
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
        if template:
            fast.chat_template = template
        fast.save_pretrained(str(folder))
        described[model] = {"vocab_size": len(order), "regular_tokens": regular, "added_tokens": added,
                            "chat_template": template}
    return {
        "architecture": ARCH,
        "models": described,
        "generator": "as the main inputs; embed_tokens/lm_head rows per token: the base's row "
        "(+ N(0, delta_std) for the experts) for a token the base has, else N(0, std)",
        "seeds": TOK_SEEDS,
    }


def inside_venv_tokenizer_union(out: Path, venv: Path) -> None:
    import importlib.metadata as md

    import yaml
    from safetensors import safe_open
    from transformers import AutoTokenizer

    root = out / "tokenizer_union"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    versions = {p: md.version(p) for p in ("mergekit", "torch", "safetensors", "transformers", "tokenizers")}
    versions["python"] = platform.python_version()
    inputs = generate_tokenizer_inputs(root / "inputs")
    mergekit_yaml = venv / "bin" / "mergekit-yaml"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    flags = [f for f in MERGEKIT_FLAGS if f != "--no-copy-tokenizer"]
    (root / "mergekit").mkdir()
    results = []
    for name, cfg in tokenizer_union_configs().items():
        rel_yaml, rel_out = f"mergekit/{name}.yml", f"mergekit/{name}"
        (root / rel_yaml).write_text(yaml.safe_dump(cfg, sort_keys=False))
        r = run([mergekit_yaml, rel_yaml, rel_out, *flags], cwd=root, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stdout + r.stderr)
            die(f"mergekit-yaml failed for tokenizer_union/{name} (exit {r.returncode})")
        folder = root / rel_out
        for junk in ("README.md",):
            (folder / junk).unlink(missing_ok=True)
        tok = AutoTokenizer.from_pretrained(str(folder))
        vocab = tok.get_vocab()
        tensors = {}
        for f in sorted(folder.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    tensors[k] = list(fh.get_tensor(k).shape)
        results.append({
            "name": name,
            "config": rel_yaml,
            "output": rel_out,
            "files": sorted(p.name for p in folder.iterdir()),
            "vocab": dict(sorted(vocab.items(), key=lambda kv: kv[1])),
            "vocab_size_in_config": json.loads((folder / "config.json").read_text()).get("vocab_size"),
            "chat_template": tok.chat_template,
            "tensors": tensors,
        })
    manifest = {
        "about": "mergekit's merges of models with different tokenizers (tokenizer_source: union), made by "
        "scripts/mergekit-parity.py; paths are relative to this file's folder.",
        "versions": versions,
        "mergekit_yaml_flags": flags,
        "inputs": inputs,
        "configs": results,
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    print(f"\nTokenizer union: {len(results)} merges, {size} bytes under {root}")
    for r in results:
        print(f"  {r['name']:<34} vocab {len(r['vocab'])} (config {r['vocab_size_in_config']})")


# --- modules: a multimodal model merged per module -------------------------------------------
# Mistral3ForConditionalGeneration is one of mergekit 0.1.5's modular architectures
# (mergekit/_data/architectures/mistral3.json): modules text_decoder (weight prefix
# "language_model."), vision_tower ("vision_tower.") and multi_modal_projector
# ("multi_modal_projector."). A tiny one: 2 text layers, 2 vision layers.
MODULES_ARCH = {
    "architectures": ["Mistral3ForConditionalGeneration"],
    "model_type": "mistral3",
    "image_token_index": 10,
    "projector_hidden_act": "gelu",
    "spatial_merge_size": 2,
    "multimodal_projector_bias": False,
    "vision_feature_layer": -1,
    "text_config": {
        "model_type": "mistral", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 32,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    },
    "vision_config": {
        "model_type": "pixtral", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "head_dim": 8, "patch_size": 4, "image_size": 16, "num_channels": 3,
    },
    "torch_dtype": "bfloat16",
}
MODULES_SEEDS = {"base": 10, "expert1": 11, "expert2": 12}


def modules_tensor_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """The tiny Mistral3's tensors, named as mergekit's mistral3.json names them."""
    t, v = MODULES_ARCH["text_config"], MODULES_ARCH["vision_config"]
    h, i, vocab = t["hidden_size"], t["intermediate_size"], t["vocab_size"]
    out = [("language_model.model.embed_tokens.weight", (vocab, h))]
    for l in range(t["num_hidden_layers"]):
        p = f"language_model.model.layers.{l}."
        out += [(p + "input_layernorm.weight", (h,))]
        out += [(p + f"self_attn.{x}_proj.weight", (h, h)) for x in "qkvo"]
        out += [(p + "post_attention_layernorm.weight", (h,)), (p + "mlp.up_proj.weight", (i, h)),
                (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.down_proj.weight", (h, i))]
    out += [("language_model.model.norm.weight", (h,)), ("language_model.lm_head.weight", (vocab, h))]
    vh, vi = v["hidden_size"], v["intermediate_size"]
    out += [("multi_modal_projector.linear_1.weight", (h, vh)), ("multi_modal_projector.linear_2.weight", (h, h)),
            ("multi_modal_projector.norm.weight", (vh,)),
            ("multi_modal_projector.patch_merger.merging_layer.weight", (vh, vh * 4))]
    out += [("vision_tower.patch_conv.weight", (vh, 3, 4, 4)), ("vision_tower.ln_pre.weight", (vh,))]
    for l in range(v["num_hidden_layers"]):
        p = f"vision_tower.transformer.layers.{l}."
        out += [(p + "ffn_norm.weight", (vh,)), (p + "feed_forward.down_proj.weight", (vh, vi)),
                (p + "feed_forward.gate_proj.weight", (vi, vh)), (p + "feed_forward.up_proj.weight", (vi, vh)),
                (p + "attention_norm.weight", (vh,))]
        out += [(p + f"attention.{x}_proj.weight", (vh, vh)) for x in "koqv"]
    return out


def modules_configs() -> dict[str, dict]:
    """mergekit configs with `modules`, by fixture name; paths relative to OUT_DIR/modules."""
    dtypes = {"dtype": "float32", "out_dtype": "float32"}

    def m(name: str, **params) -> dict:
        entry = {"model": f"inputs/{name}"}
        if params:
            entry["parameters"] = params
        return entry

    return {
        # Per-module models (in another order for the vision tower) and parameters, whose
        # precedence is model > module > top level, a model's filter list falling through.
        "modules_task_arithmetic": {
            "merge_method": "task_arithmetic",
            "base_model": "inputs/base",
            "parameters": {"weight": 0.5, "lambda": 1.0},
            "modules": {
                "text_decoder": {"models": [m("expert1", weight=0.7), m("expert2", weight=0.3)]},
                "vision_tower": {
                    "models": [m("expert2"), m("expert1", weight=[{"filter": "attention", "value": 0.9}])],
                    "parameters": {"weight": 0.2},
                },
                "multi_modal_projector": {"models": [m("expert1"), m("expert2")], "parameters": {"lambda": 0.5}},
            },
            **dtypes,
        },
        # A shared parameter per module (SLERP's t).
        "modules_slerp": {
            "merge_method": "slerp",
            "base_model": "inputs/base",
            "parameters": {"t": 0.5},
            "modules": {
                "text_decoder": {"models": [m("base"), m("expert1")], "parameters": {"t": 0.3}},
                "vision_tower": {"models": [m("base"), m("expert2")], "parameters": {"t": 0.8}},
                "multi_modal_projector": {"models": [m("base"), m("expert1")]},
            },
            **dtypes,
        },
        # Slices inside a module (the text decoder's layers taken from either expert), whole
        # models for the vision tower, and no projector: a module not listed is not written.
        "modules_linear_slices": {
            "merge_method": "linear",
            "parameters": {"weight": 1.0},
            "modules": {
                "text_decoder": {"slices": [
                    {"sources": [{"model": "inputs/expert1", "layer_range": [0, 1]},
                                 {"model": "inputs/expert2", "layer_range": [1, 2]}]},
                    {"sources": [{"model": "inputs/expert2", "layer_range": [0, 1]},
                                 {"model": "inputs/expert1", "layer_range": [1, 2]}]},
                ]},
                "vision_tower": {"models": [m("expert1", weight=2.0), m("expert2")]},
            },
            **dtypes,
        },
        # Modules that merge different numbers of models (two experts in the text decoder's
        # first slice, one in its second, one in the vision tower and the projector): every
        # slice is then merged on its own, with the parameters of its module.
        "modules_counts": {
            "merge_method": "task_arithmetic",
            "base_model": "inputs/base",
            "parameters": {"lambda": 0.9, "weight": 1.0},
            "modules": {
                "text_decoder": {"slices": [
                    {"sources": [{"model": "inputs/base", "layer_range": [0, 1]},
                                 {"model": "inputs/expert1", "layer_range": [0, 1]},
                                 {"model": "inputs/expert2", "layer_range": [0, 1], "parameters": {"weight": 0.5}}]},
                    {"sources": [{"model": "inputs/base", "layer_range": [1, 2]},
                                 {"model": "inputs/expert2", "layer_range": [1, 2]}],
                     "parameters": {"lambda": 0.7}},
                ]},
                "vision_tower": {"models": [m("expert1", weight=0.8)], "parameters": {"lambda": 0.3}},
                "multi_modal_projector": {"models": [m("expert2")]},
            },
            **dtypes,
        },
        # The vision tower and the projector kept as the base has them (a module of the base
        # alone: mergekit's task-vector methods merge nothing into it), the text decoder's
        # second slice too.
        "modules_base_only": {
            "merge_method": "ties",
            "base_model": "inputs/base",
            "parameters": {"density": 1.0, "weight": 1.0, "lambda": 0.6},
            "modules": {
                "text_decoder": {"slices": [
                    {"sources": [{"model": "inputs/base", "layer_range": [0, 1]},
                                 {"model": "inputs/expert1", "layer_range": [0, 1]},
                                 {"model": "inputs/expert2", "layer_range": [0, 1]}]},
                    {"sources": [{"model": "inputs/base", "layer_range": [1, 2]}]},
                ]},
                "vision_tower": {"models": [m("base")]},
                "multi_modal_projector": {"models": [m("base")]},
            },
            **dtypes,
        },
        # Gradients in several modules, each restarting in every slice of its module: the text
        # decoder in two one-layer slices (t = 1 in each), the vision tower's two layers from
        # its models (t = 0, 1), the projector (no layers) at t = 0.
        "modules_gradients": {
            "merge_method": "task_arithmetic",
            "base_model": "inputs/base",
            "parameters": {"weight": [0.2, 0.8]},
            "modules": {
                "text_decoder": {"slices": [
                    {"sources": [{"model": "inputs/base", "layer_range": [0, 1]},
                                 {"model": "inputs/expert1", "layer_range": [0, 1],
                                  "parameters": {"weight": [{"filter": "mlp", "value": [1.0, 0.0]}]}},
                                 {"model": "inputs/expert2", "layer_range": [0, 1]}]},
                    {"sources": [{"model": "inputs/base", "layer_range": [1, 2]},
                                 {"model": "inputs/expert2", "layer_range": [1, 2], "parameters": {"weight": 0.5}},
                                 {"model": "inputs/expert1", "layer_range": [1, 2]}]},
                ]},
                "vision_tower": {"models": [m("expert1", weight=[0.9, 0.1]), m("expert2")],
                                 "parameters": {"lambda": [0.5, 1.5]}},
                "multi_modal_projector": {"models": [m("expert1"), m("expert2")]},
            },
            **dtypes,
        },
    }


def inside_venv_modules(out: Path, venv: Path) -> None:
    import importlib.metadata as md

    import numpy as np
    import torch
    import yaml
    from safetensors import safe_open

    root = out / "modules"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    versions = {p: md.version(p) for p in ("mergekit", "torch", "safetensors", "numpy", "transformers")}
    versions["python"] = platform.python_version()
    shapes = modules_tensor_shapes()
    for model, seed in MODULES_SEEDS.items():
        rng = np.random.default_rng(seed)
        tensors = {}
        for name, shape in shapes:
            a = 1.0 + rng.normal(0.0, NORM_STD, size=shape) if len(shape) == 1 else rng.normal(0.0, BASE_STD, size=shape)
            tensors[name] = torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16).to(torch.float32).numpy()
        folder = root / "inputs" / model
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(MODULES_ARCH, indent=2) + "\n")
        to_bf16_file(tensors, folder / "model.safetensors")
    mergekit_yaml = venv / "bin" / "mergekit-yaml"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    (root / "mergekit").mkdir()
    results = []
    for name, cfg in modules_configs().items():
        rel_yaml, rel_out = f"mergekit/{name}.yml", f"mergekit/{name}"
        (root / rel_yaml).write_text(yaml.safe_dump(cfg, sort_keys=False))
        r = run([mergekit_yaml, rel_yaml, rel_out, *MERGEKIT_FLAGS], cwd=root, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stdout + r.stderr)
            die(f"mergekit-yaml failed for modules/{name} (exit {r.returncode})")
        folder = root / rel_out
        (folder / "README.md").unlink(missing_ok=True)
        tensors = {}
        for f in sorted(folder.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    tensors[k] = list(fh.get_tensor(k).shape)
        results.append({"name": name, "config": rel_yaml, "output": rel_out,
                        "files": sorted(p.name for p in folder.iterdir()), "tensors": dict(sorted(tensors.items()))})
    manifest = {
        "about": "mergekit's per-module merges (`modules`) of a tiny Mistral3ForConditionalGeneration, made by "
        "scripts/mergekit-parity.py; paths are relative to this file's folder.",
        "versions": versions,
        "mergekit_yaml_flags": MERGEKIT_FLAGS,
        "inputs": {"architecture": MODULES_ARCH, "seeds": MODULES_SEEDS,
                   "generator": "per model numpy.random.default_rng(seed): norms 1 + N(0, norm_std), else "
                   "N(0, std), stored as bfloat16", "tensors": {n: list(s) for n, s in shapes}},
        "configs": results,
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    print(f"\nModules: {len(results)} merges, {size} bytes under {root}")
    for r in results:
        print(f"  {r['name']:<34} {len(r['tensors'])} tensors")


# --- slices: per-source parameters in every slice ---------------------------------------------
# mergekit resolves a tensor's parameters from the slice that produces it (MergePlanner.plan_slice,
# ConfigReader.parameter_sources: the source's parameters, then the slice's, then the top level's)
# and restarts a gradient's position t in every slice (t = i / (n - 1) over the slice's n layers,
# 1 for a one-layer slice); pre-layer weights take slices[0]'s models and parameters, post-layer
# weights slices[-1]'s, both at t = 0 (MergePlanner.plan_module). A tiny Llama with 6 layers,
# stored as float32 so that magnitude cuts (TIES) have no ties to break.
SLICES_ARCH = dict(ARCH, hidden_size=8, intermediate_size=16, num_hidden_layers=6, num_attention_heads=2,
                   num_key_value_heads=2, vocab_size=16, max_position_embeddings=16, torch_dtype="float32")
SLICES_SEEDS = {"base": 20, "expert1": 21, "expert2": 22, "expert3": 23}


def slices_tensor_shapes() -> list[tuple[str, tuple[int, ...]]]:
    h, i, v = SLICES_ARCH["hidden_size"], SLICES_ARCH["intermediate_size"], SLICES_ARCH["vocab_size"]
    out = [("model.embed_tokens.weight", (v, h))]
    for layer in range(SLICES_ARCH["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        out += [(f"{p}.input_layernorm.weight", (h,))]
        out += [(f"{p}.self_attn.{x}_proj.weight", (h, h)) for x in "qkvo"]
        out += [(f"{p}.post_attention_layernorm.weight", (h,)), (f"{p}.mlp.gate_proj.weight", (i, h)),
                (f"{p}.mlp.up_proj.weight", (i, h)), (f"{p}.mlp.down_proj.weight", (h, i))]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return out


def slices_configs() -> dict[str, dict]:
    """mergekit configs with per-source parameters in several slices; paths relative to OUT_DIR/slices."""
    dtypes = {"dtype": "float32", "out_dtype": "float32"}

    def src(name: str, first: int, end: int, **params) -> dict:
        entry = {"model": f"inputs/{name}", "layer_range": [first, end]}
        if params:
            entry["parameters"] = params
        return entry

    return {
        # TIES: density and weight per source, different in every slice; the second slice lists
        # the base second and its experts in another order; the third has a slice-level lambda,
        # a weight gradient (over its 2 layers) and a filter list falling through to the top level.
        "ties_slices": {
            "merge_method": "ties",
            "base_model": "inputs/base",
            "parameters": {"normalize": True, "weight": 1.0},
            "slices": [
                {"sources": [src("base", 0, 3), src("expert1", 0, 3, density=0.3, weight=0.5),
                             src("expert2", 0, 3, density=0.6, weight=0.3), src("expert3", 0, 3, density=0.5)]},
                {"sources": [src("expert3", 3, 4, density=0.8, weight=0.9), src("base", 3, 4),
                             src("expert1", 3, 4, density=0.2), src("expert2", 3, 4, density=0.4, weight=0.6)]},
                {"sources": [src("base", 4, 6), src("expert2", 4, 6, density=0.7, weight=[0.2, 0.8]),
                             src("expert1", 4, 6, density=0.5, weight=0.4),
                             src("expert3", 4, 6, density=0.3, weight=[{"filter": "mlp", "value": 1.2}])],
                 "parameters": {"lambda": 0.8}},
            ],
            **dtypes,
        },
        # Task arithmetic: gradients per source and at the top level, each restarting in every
        # slice; the second slice takes expert3 where the others take expert1, and a lambda of its
        # own; the last slice has one layer (t = 1).
        "task_arithmetic_slices": {
            "merge_method": "task_arithmetic",
            "base_model": "inputs/base",
            "parameters": {"weight": [{"filter": "self_attn", "value": [0.2, 0.6]}, {"value": 0.4}],
                           "lambda": [1.0, 0.5]},
            "slices": [
                {"sources": [src("base", 0, 2), src("expert1", 0, 2, weight=[0.0, 1.0]), src("expert2", 0, 2)]},
                {"sources": [src("base", 2, 5), src("expert3", 2, 5, weight=[1.0, 0.5, 0.0]),
                             src("expert2", 2, 5, weight=[{"filter": "mlp", "value": [0.9, 0.1]}])],
                 "parameters": {"lambda": 0.9}},
                {"sources": [src("base", 5, 6), src("expert1", 5, 6, weight=0.3),
                             src("expert2", 5, 6, weight=[0.5, 1.5])]},
            ],
            **dtypes,
        },
        # Linear without a base: other models and layers in every slice (5 output layers),
        # weights per source or per slice, normalised.
        "linear_slices": {
            "merge_method": "linear",
            "parameters": {"normalize": True},
            "slices": [
                {"sources": [src("expert1", 0, 2, weight=1.0), src("expert2", 0, 2, weight=[1.0, 3.0])]},
                {"sources": [src("expert3", 4, 6, weight=2.0), src("expert1", 1, 3)],
                 "parameters": {"weight": [0.5, 1.5]}},
                {"sources": [src("expert2", 5, 6), src("expert3", 5, 6)], "parameters": {"weight": 0.25}},
            ],
            **dtypes,
        },
        # SLERP: a top-level t gradient restarting in each slice, and a slice's own filtered t;
        # the second slice lists the base second.
        "slerp_slices": {
            "merge_method": "slerp",
            "base_model": "inputs/base",
            "parameters": {"t": [0.0, 1.0]},
            "slices": [
                {"sources": [src("base", 0, 3), src("expert1", 0, 3)]},
                {"sources": [src("expert2", 3, 6), src("base", 3, 6)],
                 "parameters": {"t": [{"filter": "self_attn", "value": [0.9, 0.1]}, {"value": [0.2, 0.7]}]}},
            ],
            **dtypes,
        },
        # A frankenmerge (7 layers) with a per-source scale: o_proj and down_proj scaled in the
        # repeated layers, a gradient in the last slice.
        "passthrough_slices_scale": {
            "merge_method": "passthrough",
            "slices": [
                {"sources": [src("expert1", 0, 3)]},
                {"sources": [src("expert2", 2, 5, scale=[{"filter": "o_proj", "value": 0.5},
                                                          {"filter": "down_proj", "value": 0.25},
                                                          {"value": 1.0}])]},
                {"sources": [src("expert3", 4, 6, scale=[0.6, 1.0])]},
            ],
            **dtypes,
        },
        # Slices merging different numbers of models (mergekit merges each slice with the models
        # it lists): TIES over the base with three experts in the first slice and two in the
        # second (another order), a top-level weight gradient restarting in each slice.
        "ties_slices_3_then_2": {
            "merge_method": "ties",
            "base_model": "inputs/base",
            "parameters": {"normalize": True, "weight": [0.4, 1.0], "density": 0.6},
            "slices": [
                {"sources": [src("base", 0, 3), src("expert1", 0, 3, density=0.3),
                             src("expert2", 0, 3, weight=0.7), src("expert3", 0, 3)]},
                {"sources": [src("expert3", 3, 6, density=0.8), src("base", 3, 6), src("expert1", 3, 6)],
                 "parameters": {"lambda": 0.9}},
            ],
            **dtypes,
        },
        # Linear without a base: three models in the first slice, two in the second, one in the
        # last (5 output layers), weights per source and per slice, normalised.
        "linear_slices_3_2_1": {
            "merge_method": "linear",
            "parameters": {"normalize": True, "weight": 1.0},
            "slices": [
                {"sources": [src("expert1", 0, 2, weight=2.0), src("expert2", 0, 2, weight=[1.0, 3.0]),
                             src("expert3", 0, 2)]},
                {"sources": [src("expert3", 2, 4, weight=0.5), src("expert1", 3, 5)],
                 "parameters": {"weight": [0.5, 1.5]}},
                {"sources": [src("expert2", 5, 6)]},
            ],
            **dtypes,
        },
    }


def inside_venv_slices(out: Path, venv: Path) -> None:
    import importlib.metadata as md

    import numpy as np
    import yaml
    from safetensors import safe_open
    from safetensors.numpy import save_file

    root = out / "slices"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    versions = {p: md.version(p) for p in ("mergekit", "torch", "safetensors", "numpy", "transformers")}
    versions["python"] = platform.python_version()
    shapes = slices_tensor_shapes()
    base = {}
    for model, seed in SLICES_SEEDS.items():
        rng = np.random.default_rng(seed)
        tensors = {}
        for name, shape in shapes:
            if model == "base":
                a = 1.0 + rng.normal(0.0, NORM_STD, size=shape) if len(shape) == 1 else rng.normal(0.0, BASE_STD, size=shape)
                tensors[name] = a.astype(np.float32)
            else:
                tensors[name] = (base[name] + rng.normal(0.0, DELTA_STD, size=shape).astype(np.float32)).astype(np.float32)
        if model == "base":
            base = tensors
        folder = root / "inputs" / model
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(SLICES_ARCH, indent=2) + "\n")
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    mergekit_yaml = venv / "bin" / "mergekit-yaml"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    (root / "mergekit").mkdir()
    results = []
    for name, cfg in slices_configs().items():
        rel_yaml, rel_out = f"mergekit/{name}.yml", f"mergekit/{name}"
        (root / rel_yaml).write_text(yaml.safe_dump(cfg, sort_keys=False))
        r = run([mergekit_yaml, rel_yaml, rel_out, *MERGEKIT_FLAGS], cwd=root, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stdout + r.stderr)
            die(f"mergekit-yaml failed for slices/{name} (exit {r.returncode})")
        folder = root / rel_out
        (folder / "README.md").unlink(missing_ok=True)
        tensors = {}
        for f in sorted(folder.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    tensors[k] = list(fh.get_tensor(k).shape)
        layers = json.loads((folder / "config.json").read_text()).get("num_hidden_layers")
        results.append({"name": name, "config": rel_yaml, "output": rel_out, "num_hidden_layers": layers,
                        "files": sorted(p.name for p in folder.iterdir()), "tensors": dict(sorted(tensors.items()))})
    manifest = {
        "about": "mergekit's merges of `slices` with per-source parameters in every slice, made by "
        "scripts/mergekit-parity.py --only slices; paths are relative to this file's folder.",
        "versions": versions,
        "mergekit_yaml_flags": MERGEKIT_FLAGS,
        "inputs": {"architecture": SLICES_ARCH, "seeds": SLICES_SEEDS,
                   "generator": "per model numpy.random.default_rng(seed): the base's norms 1 + N(0, norm_std), "
                   "its other tensors N(0, std); experts = base + N(0, delta_std); stored as float32",
                   "std": BASE_STD, "norm_std": NORM_STD, "delta_std": DELTA_STD,
                   "tensors": {n: list(s) for n, s in shapes}},
        "configs": results,
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    print(f"\nSlices: {len(results)} merges, {size} bytes under {root}")
    for r in results:
        print(f"  {r['name']:<34} {len(r['tensors'])} tensors, {r['num_hidden_layers']} layers")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path, help="where inputs/, mergekit/ and manifest.json go")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV,
                    help=f"virtualenv to create or reuse (default {DEFAULT_VENV})")
    ap.add_argument("--mergekit", metavar="VERSION", default=None,
                    help="install exactly this mergekit version (default: the latest, or "
                    "whatever the reused virtualenv has)")
    ap.add_argument("--only", choices=["tokenizer-union", "modules", "slices", "frontier"], default=None,
                    help="make only this case (tokenizer-union: OUT_DIR/tokenizer_union/, modules: "
                    "OUT_DIR/modules/, slices: OUT_DIR/slices/, frontier: OUT_DIR/frontier/, mergekit's "
                    "newest methods, leaving the other fixtures as they are); default: every fixture")
    args = ap.parse_args()
    out, venv = args.out_dir.resolve(), args.venv.expanduser().absolute()

    if Path(sys.prefix).resolve() == venv.resolve():
        if args.only is None:
            inside_venv(out, venv)
        if args.only in (None, "tokenizer-union"):
            inside_venv_tokenizer_union(out, venv)
        if args.only in (None, "modules"):
            inside_venv_modules(out, venv)
        if args.only in (None, "slices"):
            inside_venv_slices(out, venv)
        if args.only in (None, "frontier"):
            inside_venv(out / "frontier", venv, frontier_configs())
        return
    if sys.version_info < (3, 10):
        die("Python 3.10 or newer is needed (mergekit requires it)")
    py = ensure_venv(venv, args.mergekit)
    argv = [str(py), str(Path(__file__).resolve()), str(out), "--venv", str(venv)]
    if args.only:
        argv += ["--only", args.only]
    sys.stdout.flush()
    os.execv(str(py), argv)


if __name__ == "__main__":
    main()
