#!/usr/bin/env bash
# Regenerates the per-architecture tables of docs/results.md from a clean cache, so that the
# docs print what the code gives: for each architecture asked for (default: mlp cnn; vit takes
# about 20 minutes on two cores), builds the demo benchmark of seed 0 in a fresh cache, runs the
# comparison the docs show under "## MLP" / "## CNN" / "## ViT", and replaces each documented
# row with the row of the same method (rows the run does not produce, such as AdaMerging's
# `merge --eval` line, are left as they are).
#
#   scripts/results-tables.sh [mlp] [cnn] [vit]
#
# MERGESCOPE_BIN names the binary (default target/release/mergescope; `cargo build --release`
# builds it with the plugins beside it). The time column is this machine's; every other number
# is the same on any x86-64 machine with FMA (see docs/results.md, "Reproducing these numbers").
# The test the_mlp_demo_build_and_a_merge_of_it_have_the_committed_bytes checks the MLP rows.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${MERGESCOPE_BIN:-target/release/mergescope}
if [ ! -x "$bin" ]; then
  echo "no $bin: run cargo build --release (the binary and its plugins), or set MERGESCOPE_BIN" >&2
  exit 1
fi
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(mlp cnn)
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
methods=weight-average,task-arithmetic,ties,dare,cart,consensus,fisher,frank-wolfe,mima
for arch in "${archs[@]}"; do
  case "$arch" in
    mlp) heading="MLP" ;;
    cnn) heading="CNN" ;;
    vit) heading="ViT" ;;
    *) echo "unknown architecture '$arch': use mlp, cnn or vit" >&2; exit 1 ;;
  esac
  echo "== $arch: building the demo benchmark in a fresh cache" >&2
  MERGESCOPE_CACHE_DIR="$cache" "$bin" demo build --arch "$arch" >&2
  echo "== $arch: comparing $methods" >&2
  MERGESCOPE_CACHE_DIR="$cache" "$bin" compare --arch "$arch" --methods "$methods" \
    --out-dir "$cache/cmp-$arch" -q > "$cache/$arch.md"
  python3 - "$heading" "$cache/$arch.md" docs/results.md <<'EOF'
import sys
heading, new_path, docs_path = sys.argv[1:]
new_rows = {}
for line in open(new_path, encoding="utf-8"):
    if line.startswith("| ") and not line.startswith("| method"):
        new_rows[line.split("|")[1].strip()] = line.rstrip("\n")
lines = open(docs_path, encoding="utf-8").read().split("\n")
start = lines.index(f"## {heading}")
end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
replaced = 0
for i in range(start, end):
    name = lines[i].split("|")[1].strip() if lines[i].startswith("| ") else None
    if name in new_rows:
        lines[i] = new_rows.pop(name)
        replaced += 1
open(docs_path, "w", encoding="utf-8").write("\n".join(lines))
print(f"{heading}: {replaced} rows replaced" + (f"; not in the docs: {', '.join(new_rows)}" if new_rows else ""),
      file=sys.stderr)
EOF
done
git --no-pager diff --stat -- docs/results.md >&2 || true
