#!/usr/bin/env bash
# Merges the same synthetic inputs with every per-tensor method using two mergescope builds
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
for spec in weight-average task-arithmetic "task-arithmetic:lambda=0.7" ties "ties:trim_scope=tensor" \
  dare cart consensus; do
  method="${spec%%:*}"
  params=()
  if [[ "$spec" == *:* ]]; then
    IFS=':' read -ra kv <<<"${spec#*:}"
    for p in "${kv[@]}"; do params+=(--param "$p"); done
  fi
  for build in old new; do
    bin="$old"; [ "$build" = new ] && bin="$new"
    "$bin" merge --method "$method" --base "$base" "${experts[@]}" "${params[@]}" --seed 7 \
      --out "$work/$build-${spec//[:=]/_}" --overwrite -q >/dev/null 2>>"$work/merge.log"
  done
  # The inputs are sharded, so each output is a folder of shards and an index.
  digest() { (cd "$1" && find . -type f | sort | xargs sha256sum | sha256sum | cut -c1-16); }
  a=$(digest "$work/old-${spec//[:=]/_}")
  b=$(digest "$work/new-${spec//[:=]/_}")
  if [ "$a" = "$b" ]; then
    echo "same       $spec ($a)"
  else
    echo "DIFFERENT  $spec (old $a, new $b)"
    status=1
  fi
done
exit $status
