#!/usr/bin/env python3
"""Load a mergescope output folder with Hugging Face transformers and run a forward pass.

The check the mergekit-parity issue asks for: a folder that `mergescope merge --config
merge.yml --out FOLDER` wrote must load in transformers as the inputs do. For a causal LM
(Llama, Mistral, Qwen...) it loads `AutoModelForCausalLM.from_pretrained(FOLDER)`, runs a
forward pass on a few token ids and prints the logits' shape and whether they are finite;
with --compare MERGEKIT_FOLDER it also loads mergekit's output of the same config and prints
the largest difference between the two models' logits and weights.

How to run (transformers and torch: the virtualenv that scripts/mergekit-parity.py makes has
both):
  ~/.cache/mergescope/mergekit-venv/bin/python scripts/hf-load-check.py FOLDER [--compare DIR]

Exits non-zero when the folder does not load, the logits are not finite, or (with --compare)
the logits differ by more than --tolerance (default 1e-4).
"""

import argparse
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def load(folder):
    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    return config, model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--compare", help="another output folder (mergekit's) to compare logits and weights with")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    args = ap.parse_args()

    config, model = load(args.folder)
    vocab = config.vocab_size
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4][: max(2, min(8, vocab))]]) % vocab
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    finite = bool(torch.isfinite(logits).all())
    print(f"{args.folder}: {type(model).__name__}, {config.num_hidden_layers} layers, logits {tuple(logits.shape)}, finite: {finite}")
    ok = finite
    if args.compare:
        _, other = load(args.compare)
        with torch.no_grad():
            other_logits = other(input_ids=ids).logits
        d_logits = float((logits - other_logits).abs().max())
        theirs = other.state_dict()
        d_weights = max(float((w - theirs[k]).abs().max()) for k, w in model.state_dict().items())
        print(f"vs {args.compare}: max |Δ logits| {d_logits:.3e}, max |Δ weights| {d_weights:.3e}")
        ok = ok and d_logits <= args.tolerance
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
