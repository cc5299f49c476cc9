#!/usr/bin/env bash
# Merges the same synthetic inputs with every per-tensor method (and two mergekit YAML
# configurations: slices into a Hugging Face folder, and slices merged one by one) using two
# mergescope builds
# and compares the outputs byte for byte (a refactor of the merge path must not change a
# single byte). Each build is a folder holding the `mergescope` binary and its plugins (as
# `cargo build --release` leaves them in target/release).
#
#   scripts/merge-parity.sh OLD_BIN_DIR NEW_BIN_DIR [WORK_DIR]
#
# Prints one line per method (same / DIFFERENT with both hashes) and exits 1 on a difference.
set -euo pipefail
old="$1/mergescope"
new="$2/mergescope"
work="${3:-$(mktemp -d)}"
mkdir -p "$work"
# Small LLM-shaped inputs (base + 3 experts, BF16, Hugging Face folders), built by the new binary.
"$new" bench --dir "$work/inputs" --hidden 256 --intermediate 704 --layers 2 --vocab 1000 \
  --methods task-arithmetic >/dev/null
base="$work/inputs/base"
experts=()
for e in "$work"/inputs/expert*; do experts+=(--expert "$e"); done
status=0
# The inputs are sharded, so each output is a folder of shards and an index.
digest() { (cd "$1" && find . -type f | sort | xargs sha256sum | sha256sum | cut -c1-16); }
compare() {
  local name="$1"
  local a b
  a=$(digest "$work/old-$name")
  b=$(digest "$work/new-$name")
  if [ "$a" = "$b" ]; then
    echo "same       $name ($a)"
  else
    echo "DIFFERENT  $name (old $a, new $b)"
    status=1
  fi
}
# Every per-tensor method; SLERP takes one expert, NuSLERP two.
for spec in weight-average task-arithmetic "task-arithmetic:lambda=0.7" ties "ties:trim_scope=tensor" \
  dare cart consensus breadcrumbs della sce model-stock karcher multislerp \
  slerp nuslerp; do
  method="${spec%%:*}"
  params=()
  if [[ "$spec" == *:* ]]; then
    IFS=':' read -ra kv <<<"${spec#*:}"
    for p in "${kv[@]}"; do params+=(--param "$p"); done
  fi
  inputs=("${experts[@]}")
  case "$method" in
    slerp) inputs=("${experts[@]:0:2}") ;;
    nuslerp) inputs=("${experts[@]:0:4}") ;;
  esac
  name="${spec//[:=]/_}"
  for build in old new; do
    bin="$old"; [ "$build" = new ] && bin="$new"
    "$bin" merge --method "$method" --base "$base" "${inputs[@]}" "${params[@]}" --seed 7 \
      --out "$work/$build-$name" --overwrite -q >/dev/null 2>>"$work/merge.log"
  done
  compare "$name"
done
# mergekit YAML: a Hugging Face folder with layer slices and per-model weights, and slices of
# different models (merged slice by slice).
e=("$work"/inputs/expert*)
cat >"$work/sliced.yml" <<YAML
merge_method: task_arithmetic
base_model: $base
slices:
  - sources:
      - {model: $base, layer_range: [0, 2]}
      - {model: ${e[0]}, layer_range: [0, 2], parameters: {weight: 0.5}}
      - {model: ${e[1]}, layer_range: [0, 2], parameters: {weight: 0.7}}
dtype: bfloat16
YAML
cat >"$work/by-slice.yml" <<YAML
merge_method: linear
slices:
  - sources:
      - {model: ${e[0]}, layer_range: [0, 1], parameters: {weight: 1.0}}
      - {model: ${e[1]}, layer_range: [0, 1], parameters: {weight: 0.5}}
  - sources:
      - {model: ${e[2]}, layer_range: [1, 2], parameters: {weight: 1.0}}
      - {model: ${e[0]}, layer_range: [1, 2], parameters: {weight: 2.0}}
dtype: float32
YAML
for yml in sliced by-slice; do
  for build in old new; do
    bin="$old"; [ "$build" = new ] && bin="$new"
    "$bin" merge --config "$work/$yml.yml" --out "$work/$build-yaml-$yml" --overwrite -q >/dev/null 2>>"$work/merge.log"
  done
  compare "yaml-$yml"
done
exit $status
