#!/usr/bin/env bash
# Side-by-side speed and memory benchmark of mergekit (the Python reference tool) and
# mergescope, on the same synthetic Llama-shaped inputs, on the CPU.
#
#   scripts/mergekit-bench.sh [--dir DIR] [--out DIR] [--rounds N] [--methods LIST]
#       [--mergescope PATH] [--venv DIR] [--mergekit VERSION] [--threads N]
#       [--hidden N] [--intermediate N] [--layers N] [--vocab N] [--heads N] [--table FILE]
#
# What it does:
#  1. Reuses (or creates, as scripts/mergekit-parity.py does) a virtualenv with mergekit:
#     `python3 -m venv DIR` + `pip install mergekit`, only when DIR/bin/mergekit-yaml is missing
#     (or, with --mergekit VERSION, when the installed version differs).
#  2. Makes the inputs with `mergescope bench --dir DIR --methods task-arithmetic [size flags]`
#     (a base and three experts, bf16, sharded safetensors folders; ~0.84 B parameters and
#     1.7 GB per model at the default size) when DIR/base is missing or DIR holds another size.
#     `mergescope bench` also times one task-arithmetic merge after generating; that is its own
#     output, not part of this comparison.
#  3. Builds mergekit-readable views of the inputs under OUT/views: per model a folder of
#     symlinks to the shards and the index plus a generated Hugging Face config.json
#     (LlamaForCausalLM). No weights are copied. The tensor names are checked against
#     mergekit's own Llama architecture definition before any timing.
#  4. For each method and round runs mergekit-yaml and the equivalent `mergescope merge`, each
#     under `/usr/bin/time -v`, recording wall, user and sys seconds and peak RSS. The order
#     alternates between rounds (mergekit first in odd rounds, mergescope first in even ones)
#     so neither tool always gets the warmer page cache. Each output is deleted right after
#     its run. Any failed run stops the script with the tail of that tool's stderr.
#  5. Prints a Markdown report (machine, versions, inputs, summary table, every run), and
#     writes it to --table FILE too when given.
#
# Options (defaults in brackets):
#   --dir DIR           inputs [${XDG_CACHE_HOME:-$HOME/.cache}/mergescope/bench]. When the
#                       folder must be (re)generated, `mergescope bench` empties it first, so
#                       the script refuses a non-empty folder that is not a bench folder.
#   --out DIR           configs, views, logs and (transient) outputs [a temporary folder,
#                       removed at the end; a folder given here is kept, minus the outputs]
#   --rounds N          rounds per method [2]
#   --methods LIST      comma-separated mergekit method names
#                       [linear,task_arithmetic,ties,dare_ties,dare_linear,slerp,model_stock]
#   --mergescope PATH   mergescope binary, its plugins next to it [target/release/mergescope]
#   --venv DIR          mergekit virtualenv [~/.cache/mergescope/mergekit-venv]
#   --mergekit VERSION  pip-install exactly this mergekit version into the venv [whatever it has,
#                       else the latest]
#   --threads N         worker threads for both tools (mergekit --num-threads, mergescope
#                       --threads) [each tool's default: all cores]
#   --hidden N --intermediate N --layers N --vocab N
#                       size of the synthetic models, passed to `mergescope bench`
#                       [2048, 5632, 16, 32000]
#   --heads N           num_attention_heads written to config.json [16]; the synthetic
#                       key/value width is 256, so num_key_value_heads = 256 / (hidden / heads)
#   --table FILE        also write the report to FILE
#   --cache read|as-is  how the inputs enter the page cache before the first run [read]:
#                       read: each input file's cached pages are dropped (`dd iflag=nocache`,
#                       no root needed) and the file is read once from start to end, the state
#                       a first sequential read from disk leaves; as-is: read once, keeping
#                       whatever pages are already cached. The size of the page cache's folios
#                       differs between the two (see the notes below) and both tools read
#                       the same pages.
#
# Example (a small run first, then the real one on a quiet machine):
#   scripts/mergekit-bench.sh --dir bench-small --layers 1 --hidden 256 \
#       --intermediate 512 --vocab 1000 --rounds 1
#   scripts/mergekit-bench.sh --rounds 3 --table mergekit-bench.md
#
# Notes on fairness:
#  - mergekit computes in `dtype: bfloat16`, which is what mergekit's README examples and
#    most published merge configs use with bf16 models (out_dtype defaults to dtype); mergescope
#    reads the bf16 inputs, computes in f32 and writes bf16 (`--dtype bf16`). Both therefore
#    read and write the same bytes.
#  - Both tools memory-map the safetensors inputs, so peak RSS includes the resident pages
#    of the mapped inputs for both.
#  - Outputs: mergekit writes one shard (its default --out-shard-size is 5B parameters),
#    mergescope shards like the inputs (two shards). Same bytes written either way.
#  - The inputs are read once before the first run so that the first run does not pay for a
#    cold page cache. With less free memory than the inputs (6.7 GB at the default size),
#    later runs re-read from disk for both tools.
#  - How the inputs were cached matters to both tools, mergescope more: Linux (6.x, ext4/xfs)
#    caches a sequential read with a large read-ahead, or a large write, in folios of up to
#    2 MiB, which a memory map reaches with one fault and one TLB entry per 2 MiB; a file first
#    read through a memory map, or with a small read-ahead (128 KiB is common), is cached in
#    4 KiB pages. The report gives the device's read-ahead and how much of the page cache was
#    in 2 MiB folios (FileHugePages) after warming.
set -euo pipefail

die() {
  echo "mergekit-bench: error: $*" >&2
  exit 1
}
note() { echo "mergekit-bench: $*" >&2; }

# --- options --------------------------------------------------------------------------------
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir="${XDG_CACHE_HOME:-$HOME/.cache}/mergescope/bench"
out=""
rounds=2
methods="linear,task_arithmetic,ties,dare_ties,dare_linear,slerp,model_stock"
mergescope="$repo/target/release/mergescope"
venv="$HOME/.cache/mergescope/mergekit-venv"
pin=""
threads=""
hidden=2048
intermediate=5632
layers=16
vocab=32000
heads=16
table=""
cache=read

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
need_arg() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) need_arg "$@"; dir="$2"; shift 2 ;;
    --out) need_arg "$@"; out="$2"; shift 2 ;;
    --rounds) need_arg "$@"; rounds="$2"; shift 2 ;;
    --methods) need_arg "$@"; methods="$2"; shift 2 ;;
    --mergescope) need_arg "$@"; mergescope="$2"; shift 2 ;;
    --venv) need_arg "$@"; venv="$2"; shift 2 ;;
    --mergekit) need_arg "$@"; pin="$2"; shift 2 ;;
    --threads) need_arg "$@"; threads="$2"; shift 2 ;;
    --hidden) need_arg "$@"; hidden="$2"; shift 2 ;;
    --intermediate) need_arg "$@"; intermediate="$2"; shift 2 ;;
    --layers) need_arg "$@"; layers="$2"; shift 2 ;;
    --vocab) need_arg "$@"; vocab="$2"; shift 2 ;;
    --heads) need_arg "$@"; heads="$2"; shift 2 ;;
    --table) need_arg "$@"; table="$2"; shift 2 ;;
    --cache) need_arg "$@"; cache="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
for v in rounds hidden intermediate layers vocab heads; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "--$v must be a positive integer, not '${!v}'"
done
case "$cache" in read | as-is) ;; *) die "--cache must be 'read' or 'as-is', not '$cache'" ;; esac
[ -z "$threads" ] || [[ "$threads" =~ ^[1-9][0-9]*$ ]] || die "--threads must be a positive integer"

IFS=',' read -ra method_list <<<"$methods"
[ ${#method_list[@]} -gt 0 ] || die "--methods is empty"
for m in "${method_list[@]}"; do
  case "$m" in
    linear | task_arithmetic | ties | dare_ties | dare_linear | slerp | model_stock) ;;
    *) die "unknown method '$m': use linear, task_arithmetic, ties, dare_ties, dare_linear, slerp, model_stock" ;;
  esac
done

[ -x /usr/bin/time ] || die "/usr/bin/time is missing: install it with 'apt-get install time'"
[ -x "$mergescope" ] || die "mergescope binary '$mergescope' not found: build it with 'cargo build --release' or pass --mergescope PATH"
mergescope=$(cd "$(dirname "$mergescope")" && pwd)/$(basename "$mergescope")
dir=$(mkdir -p "$(dirname "$dir")" && cd "$(dirname "$dir")" && pwd)/$(basename "$dir")

# Every requested method must be installed (the plugins sit next to the binary).
ms_method() {
  case "$1" in
    linear) echo weight-average ;;
    task_arithmetic) echo task-arithmetic ;;
    ties) echo ties ;;
    dare_ties | dare_linear) echo dare ;;
    slerp) echo slerp ;;
    model_stock) echo model-stock ;;
  esac
}
installed=$("$mergescope" plugins list 2>/dev/null | awk 'NF && $1 !~ /^[A-Z]/ && /^[^ ]/ {print $1}') ||
  die "'$mergescope plugins list' failed"
for m in "${method_list[@]}"; do
  id=$(ms_method "$m")
  grep -qx "$id" <<<"$installed" ||
    die "mergescope method '$id' (for mergekit's $m) is not installed next to $mergescope; build it (cargo build --release builds every plugin) or leave $m out of --methods"
done

# --- output folder ----------------------------------------------------------------------------
tmp_out=""
if [ -z "$out" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/mergekit-bench.XXXXXX")
  tmp_out=1
else
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
fi
runs="$out/runs"
logs="$out/logs"
# Merged weights never outlive the script; a temporary --out goes entirely, a given one stays
# (configs, views, logs, results.tsv).
cleanup() {
  rm -rf "$runs"
  [ -z "$tmp_out" ] || rm -rf "$out"
}
trap cleanup EXIT
mkdir -p "$runs" "$logs" "$out/configs"

# --- 1. the mergekit virtualenv (as scripts/mergekit-parity.py makes it) ------------------------
py="$venv/bin/python"
mergekit_yaml="$venv/bin/mergekit-yaml"
mk_version() { "$py" -c "import importlib.metadata as m; print(m.version('mergekit'))" 2>/dev/null || true; }
if [ ! -x "$py" ]; then
  command -v python3 >/dev/null || die "python3 is needed to create the mergekit virtualenv"
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
    die "Python 3.10 or newer is needed (mergekit requires it)"
  note "creating virtualenv $venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv" || die "could not create the virtualenv $venv"
fi
have=$(mk_version)
if [ ! -x "$mergekit_yaml" ] || [ -z "$have" ] || { [ -n "$pin" ] && [ "$have" != "$pin" ]; }; then
  spec="mergekit${pin:+==$pin}"
  note "installing $spec into $venv (this pulls torch; it may take minutes)"
  "$py" -m pip install "$spec" || die "pip install $spec failed (see pip's output above)"
  have=$(mk_version)
  [ -n "$have" ] && [ -x "$mergekit_yaml" ] || die "mergekit is still not usable after pip install"
else
  note "reusing $venv (mergekit $have)"
fi

# --- 2. the inputs ------------------------------------------------------------------------------
# True when DIR holds bench inputs of the requested size (its config.json is bench's marker).
inputs_match() {
  [ -d "$dir/base" ] && [ -f "$dir/config.json" ] || return 1
  "$py" - "$dir/config.json" "$hidden" "$intermediate" "$layers" "$vocab" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
want = dict(zip(("hidden", "intermediate", "layers", "vocab"), map(int, sys.argv[2:6])))
ok = all(c.get(k) == v for k, v in want.items()) and c.get("dtype") == "BF16" and c.get("experts", 0) >= 3
sys.exit(0 if ok else 1)
EOF
}
# Bytes of one model: embedding + head + final norm + per layer (q, k, v, o, gate, up, down,
# two norms), bf16, key/value width 256 (app/engine/src/synthetic.rs).
model_bytes=$(( 2 * (2 * vocab * hidden + hidden + layers * (2 * hidden * hidden + 2 * 256 * hidden + 3 * intermediate * hidden + 2 * hidden)) ))
if ! inputs_match; then
  # bench's marker config.json (app/engine/src/synthetic.rs), not a Hugging Face one.
  if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ] && ! "$py" -c '
import json, sys
c = json.load(open(sys.argv[1]))
sys.exit(0 if {"hidden", "kv_dim", "layers", "noise", "shards"} <= set(c) else 1)' "$dir/config.json" 2>/dev/null; then
    die "$dir is not empty and not a 'mergescope bench' folder; 'mergescope bench' would delete its contents. Pass another --dir."
  fi
  # Four models, plus the task-arithmetic output `mergescope bench` writes and deletes.
  need=$(( 5 * model_bytes ))
  mkdir -p "$dir"
  avail=$(( $(df -Pk "$dir" | awk 'NR == 2 {print $4}') * 1024 ))
  [ "$avail" -gt "$need" ] ||
    die "$dir needs about $((need / 1000000)) MB free for the inputs, $((avail / 1000000)) MB are"
  note "making the inputs in $dir with mergescope bench"
  "$mergescope" bench --dir "$dir" --methods task-arithmetic --hidden "$hidden" \
    --intermediate "$intermediate" --layers "$layers" --vocab "$vocab" >&2 ||
    die "'mergescope bench' failed to make the inputs in $dir"
  inputs_match || die "$dir does not hold the requested inputs after 'mergescope bench'"
fi
avail=$(( $(df -Pk "$out" | awk 'NR == 2 {print $4}') * 1024 ))
[ "$avail" -gt $(( model_bytes + model_bytes / 10 )) ] ||
  die "$out needs about $((model_bytes / 1000000)) MB free for one merged model, $((avail / 1000000)) MB are"

# --- 3. mergekit views ---------------------------------------------------------------------------
models=(base expert1 expert2 expert3)
for name in "${models[@]}"; do
  view="$out/views/$name"
  rm -rf "$view"
  mkdir -p "$view"
  [ -f "$dir/$name/model.safetensors.index.json" ] || die "$dir/$name has no model.safetensors.index.json"
  for f in "$dir/$name"/*.safetensors "$dir/$name/model.safetensors.index.json"; do
    ln -s "$f" "$view/$(basename "$f")"
  done
done
# config.json for every view, then check the tensor names against mergekit's Llama definition
# (mergekit picks the architecture by `architectures` and then only looks tensors up by name).
"$py" - "$dir" "$out/views" "$heads" <<'EOF' || die "the synthetic models do not fit mergekit's Llama architecture (see above)"
import json, sys
from pathlib import Path

src, views, heads = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
syn = json.loads((src / "config.json").read_text())
h, kv = syn["hidden"], syn["kv_dim"]
if h % heads or kv % (h // heads):
    sys.exit(f"--heads {heads} does not fit hidden {h} and key/value width {kv}: "
             f"hidden/heads must divide both")
head_dim = h // heads
names = set(json.loads((src / "base" / "model.safetensors.index.json").read_text())["weight_map"])
config = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": h,
    "intermediate_size": syn["intermediate"],
    "num_hidden_layers": syn["layers"],
    "num_attention_heads": heads,
    "num_key_value_heads": kv // head_dim,
    "head_dim": head_dim,
    "vocab_size": syn["vocab"],
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": "lm_head.weight" not in names,
    "torch_dtype": "bfloat16",
}
for view in sorted(views.iterdir()):
    (view / "config.json").write_text(json.dumps(config, indent=2) + "\n")

from transformers import AutoConfig
from mergekit.architecture import arch_info_for_config

cfg = AutoConfig.from_pretrained(views / "base")
arch = arch_info_for_config(cfg)
if arch is None:
    sys.exit("mergekit has no architecture definition for LlamaForCausalLM")
weights = arch.all_weights(cfg)
known = {n for w in weights for n in (w.name, *(w.aliases or ()), *(w.tied_names or ()))}
required = {w.name for w in weights if not w.optional}
unknown, missing = sorted(names - known), sorted(required - names)
for n in unknown:
    print(f"  not in mergekit's Llama architecture: {n}", file=sys.stderr)
for n in missing:
    print(f"  required by mergekit but not in the inputs: {n}", file=sys.stderr)
sys.exit(1 if unknown or missing else 0)
EOF

# --- the method pairs ---------------------------------------------------------------------------
v="$out/views"
# mergekit YAML of method $1 (paths absolute, so it runs from anywhere).
mk_config() {
  case "$1" in
    linear)
      cat <<EOF
merge_method: linear
models:
  - {model: $v/expert1, parameters: {weight: 1.0}}
  - {model: $v/expert2, parameters: {weight: 1.0}}
  - {model: $v/expert3, parameters: {weight: 1.0}}
parameters: {normalize: true}
EOF
      ;;
    task_arithmetic)
      cat <<EOF
merge_method: task_arithmetic
base_model: $v/base
models:
  - {model: $v/expert1, parameters: {weight: 0.3}}
  - {model: $v/expert2, parameters: {weight: 0.3}}
  - {model: $v/expert3, parameters: {weight: 0.3}}
EOF
      ;;
    ties)
      cat <<EOF
merge_method: ties
base_model: $v/base
models:
  - {model: $v/expert1, parameters: {density: 0.2, weight: 1.0}}
  - {model: $v/expert2, parameters: {density: 0.2, weight: 1.0}}
  - {model: $v/expert3, parameters: {density: 0.2, weight: 1.0}}
parameters: {normalize: false}
EOF
      ;;
    dare_ties)
      cat <<EOF
merge_method: dare_ties
base_model: $v/base
models:
  - {model: $v/expert1, parameters: {density: 0.2, weight: 1.0}}
  - {model: $v/expert2, parameters: {density: 0.2, weight: 1.0}}
  - {model: $v/expert3, parameters: {density: 0.2, weight: 1.0}}
EOF
      ;;
    dare_linear)
      cat <<EOF
merge_method: dare_linear
base_model: $v/base
models:
  - {model: $v/expert1, parameters: {density: 0.2, weight: 1.0}}
  - {model: $v/expert2, parameters: {density: 0.2, weight: 1.0}}
  - {model: $v/expert3, parameters: {density: 0.2, weight: 1.0}}
EOF
      ;;
    slerp)
      cat <<EOF
merge_method: slerp
base_model: $v/base
models:
  - {model: $v/base}
  - {model: $v/expert1}
parameters: {t: 0.3}
EOF
      ;;
    model_stock)
      cat <<EOF
merge_method: model_stock
base_model: $v/base
models:
  - {model: $v/expert1}
  - {model: $v/expert2}
  - {model: $v/expert3}
EOF
      ;;
  esac
  # What mergekit users write for bf16 models (see the notes at the top).
  echo "dtype: bfloat16"
}
# mergescope arguments of method $1 (the equivalent of mk_config's merge).
ms_args() {
  local experts=(--expert "$dir/expert1" "$dir/expert2" "$dir/expert3")
  case "$1" in
    linear) echo weight-average; printf '%s\n' "${experts[@]}" ;;
    task_arithmetic)
      printf '%s\n' task-arithmetic --base "$dir/base" "${experts[@]}" \
        --param lambda=1 --param task_weights=0.3 ;;
    ties)
      printf '%s\n' ties --base "$dir/base" "${experts[@]}" --param density=0.2 \
        --param trim_scope=tensor --param count_rule=mergekit --param election=mass \
        --param zero_sign=positive --param aggregation=dis-sum ;;
    # DARE-TIES. The random masks differ between the tools (torch's generator vs mergescope's
    # counter-based one), so the outputs differ: only time and memory are compared. mergekit
    # 0.1.5's dare_ties rescales the kept entries to keep each task vector's L1 norm
    # (sparsify.rescaled_masked_tensor with RescaleNorm.l1, not 1/density), which is
    # mergescope's rescale=l1; its default normalize=false sums the agreeing entries where
    # mergescope's combine=ties takes their mean (the same work).
    dare_ties)
      printf '%s\n' dare --base "$dir/base" "${experts[@]}" --param drop_rate=0.8 \
        --param rescale=l1 --param combine=ties ;;
    # DARE-linear: mergekit's dare_linear (l1 rescale, normalize false) is combine=sum,
    # rescale=l1; the masks differ as for dare_ties.
    dare_linear)
      printf '%s\n' dare --base "$dir/base" "${experts[@]}" --param drop_rate=0.8 \
        --param rescale=l1 --param combine=sum ;;
    slerp) printf '%s\n' slerp --base "$dir/base" --expert "$dir/expert1" --param t=0.3 ;;
    model_stock) printf '%s\n' model-stock --base "$dir/base" "${experts[@]}" ;;
  esac
}
for m in linear task_arithmetic ties dare_ties dare_linear slerp model_stock; do
  mk_config "$m" >"$out/configs/$m.yml"
done

# --- 4. the runs ----------------------------------------------------------------------------------
mk_env=(env CUDA_VISIBLE_DEVICES= HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false)
# --lazy-unpickle only matters for pickled .bin checkpoints, not safetensors; --quiet hides the
# progress bar (mergescope's -q likewise).
mk_flags=(--device cpu --no-copy-tokenizer --no-write-model-card --random-seed 0 --quiet)
ms_flags=(--dtype bf16 --seed 0 --overwrite -q)
if [ -n "$threads" ]; then
  mk_flags+=(--num-threads "$threads")
  ms_flags+=(--threads "$threads")
fi

# Parses /usr/bin/time -v's report $1 into "wall user sys peak_kB minor_faults".
parse_time() {
  awk -F': ' '
    /Elapsed \(wall clock\)/ { n = split($2, p, ":"); w = 0; for (i = 1; i <= n; i++) w = w * 60 + p[i] }
    /User time \(seconds\)/ { u = $2 }
    /System time \(seconds\)/ { s = $2 }
    /Maximum resident set size/ { r = $2 }
    /Minor \(reclaiming a frame\) page faults/ { f = $2 }
    END { printf "%.2f %.2f %.2f %d %d\n", w, u, s, r, f }' "$1"
}

results="$out/results.tsv"
printf 'method\ttool\tround\twall_s\tuser_s\tsys_s\tpeak_rss_kb\tminor_faults\n' >"$results"
# Runs tool $1 (mergekit|mergescope) on method $2, round $3.
run_one() {
  local tool="$1" m="$2" r="$3" tag="$1-$2-r$3"
  local dest="$runs/$tool-$m" cmd
  if [ "$tool" = mergekit ]; then
    cmd=("${mk_env[@]}" "$mergekit_yaml" "$out/configs/$m.yml" "$dest" "${mk_flags[@]}")
  else
    mapfile -t args < <(ms_args "$m")
    cmd=("$mergescope" merge --method "${args[@]}" "${ms_flags[@]}" --out "$dest")
  fi
  rm -rf "$dest"
  note "$m, round $r: $tool"
  echo "${cmd[*]}" >"$logs/$tag.cmd"
  if ! /usr/bin/time -v -o "$logs/$tag.time" "${cmd[@]}" >"$logs/$tag.stdout" 2>"$logs/$tag.stderr"; then
    echo "---- last lines of $tool's stderr ($logs/$tag.stderr) ----" >&2
    tail -n 30 "$logs/$tag.stderr" >&2
    echo "---- command: ${cmd[*]}" >&2
    rm -rf "$dest"
    die "$tool failed on $m (round $r)$keep_hint"
  fi
  rm -rf "$dest"
  read -r wall user sys rss faults < <(parse_time "$logs/$tag.time")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$m" "$tool" "$r" "$wall" "$user" "$sys" "$rss" "$faults" >>"$results"
  note "  $wall s wall, $(awk -v k="$rss" 'BEGIN {printf "%.2f", k * 1024 / 1e9}') GB peak RSS"
}
keep_hint=""
[ -z "$tmp_out" ] || keep_hint=" (pass --out DIR to keep the logs)"

# Warm the page cache with the inputs once, so the first run is not the only cold one.
inputs=("$dir"/{base,expert1,expert2,expert3}/*.safetensors)
if [ "$cache" = read ]; then
  note "dropping the inputs' cached pages, then reading them once ($(( 4 * model_bytes / 1000000 )) MB)"
  for f in "${inputs[@]}"; do dd if="$f" iflag=nocache count=0 status=none; done
else
  note "reading the inputs once ($(( 4 * model_bytes / 1000000 )) MB) to warm the page cache"
fi
cat "${inputs[@]}" >/dev/null
huge_gb=$(awk '/^FileHugePages/ {printf "%.1f", $2 * 1024 / 1e9}' /proc/meminfo 2>/dev/null)
dev=$(df --output=source "$dir" 2>/dev/null | tail -1)
dev=$(basename "$dev")
ra="?"
for d in "$dev" "$(lsblk -no pkname "/dev/$dev" 2>/dev/null | head -1)"; do
  [ -n "$d" ] && [ -r "/sys/class/block/$d/queue/read_ahead_kb" ] && ra=$(cat "/sys/class/block/$d/queue/read_ahead_kb") && break
done

# The fixed start-up cost inside every run (Python, torch and transformers imports for mergekit),
# reported next to the table so that small inputs can be read correctly.
startup() {
  local tag="startup-$1"
  shift
  /usr/bin/time -v -o "$logs/$tag.time" "$@" >"$logs/$tag.stdout" 2>"$logs/$tag.stderr" ||
    die "'$*' failed: $(tail -n 5 "$logs/$tag.stderr")"
  read -r wall _ _ rss _ < <(parse_time "$logs/$tag.time")
  echo "$wall s, $(awk -v k="$rss" 'BEGIN {printf "%.2f", k * 1024 / 1e9}') GB"
}
mk_startup=$(startup mergekit "${mk_env[@]}" "$mergekit_yaml" --help)
ms_startup=$(startup mergescope "$mergescope" plugins list)

for m in "${method_list[@]}"; do
  for ((r = 1; r <= rounds; r++)); do
    if ((r % 2)); then
      run_one mergekit "$m" "$r"
      run_one mergescope "$m" "$r"
    else
      run_one mergescope "$m" "$r"
      run_one mergekit "$m" "$r"
    fi
  done
done

# --- 5. the report --------------------------------------------------------------------------------
cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
mem=$(awk '/^MemTotal/ {printf "%.1f", $2 * 1024 / 1e9}' /proc/meminfo)
versions=$("$py" -c '
import importlib.metadata as m, platform
print(", ".join(f"{p} {m.version(p)}" for p in ("mergekit", "torch", "transformers", "safetensors")) + f", Python {platform.python_version()}")')
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$repo" diff --quiet HEAD 2>/dev/null || commit="$commit (with local changes)"
params=$(( model_bytes / 2 ))
threads_text="all cores (the default of each tool)"
[ -z "$threads" ] || threads_text="$threads"
report=$(
  echo "## mergekit vs mergescope on the CPU"
  echo
  echo "- Machine: $(nproc) cores ($cpu), ${mem} GB memory, $(uname -sr)"
  echo "- mergescope: $("$mergescope" --version) at commit $commit ($mergescope)"
  echo "- mergekit: $versions"
  echo "- Inputs: base + 3 experts, synthetic Llama (hidden $hidden, intermediate $intermediate, layers $layers, vocab $vocab), $params parameters and $(awk -v b="$model_bytes" 'BEGIN {if (b < 1e9) printf "%.1f MB", b / 1e6; else printf "%.2f GB", b / 1e9}') (bf16) each; $dir"
  echo "- $rounds round(s) per method, threads: $threads_text; mergekit computes in bfloat16, mergescope in f32, both write bf16"
  echo "- Page cache: inputs warmed with --cache $cache; read-ahead of $dev ${ra} KiB; ${huge_gb:-?} GB of the page cache in 2 MiB folios (FileHugePages) after warming"
  echo "- Start-up cost included in every run: mergekit ($(basename "$mergekit_yaml") --help) $mk_startup; mergescope (plugins list, which loads every plugin) $ms_startup"
  echo
  awk -F'\t' '
    NR == 1 { next }
    {
      k = $1 SUBSEP $2
      if (!(k in wmin) || $4 < wmin[k]) wmin[k] = $4
      if (!(k in wmax) || $4 > wmax[k]) wmax[k] = $4
      if ($7 > rss[k]) rss[k] = $7
      if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 }
    }
    function range(k) { return wmin[k] == wmax[k] ? sprintf("%.2f", wmin[k]) : sprintf("%.2f–%.2f", wmin[k], wmax[k]) }
    function gb(kb) { return sprintf("%.2f", kb * 1024 / 1e9) }
    END {
      print "| method | mergekit wall s (min–max) | mergekit peak RSS GB | mergescope wall s (min–max) | mergescope peak RSS GB | speed ratio (mergekit ÷ mergescope, min wall) | memory ratio (mergekit ÷ mergescope, peak RSS) |"
      print "|---|---:|---:|---:|---:|---:|---:|"
      for (i = 1; i <= n; i++) {
        m = order[i]; a = m SUBSEP "mergekit"; b = m SUBSEP "mergescope"
        speed = wmin[b] > 0 ? sprintf("%.2f×", wmin[a] / wmin[b]) : "n/a"
        memr = rss[b] > 0 ? sprintf("%.2f×", rss[a] / rss[b]) : "n/a"
        printf "| %s | %s | %s | %s | %s | %s | %s |\n", m, range(a), gb(rss[a]), range(b), gb(rss[b]), speed, memr
      }
    }' "$results"
  echo
  echo "Every run (wall, user and sys seconds and minor page faults from /usr/bin/time -v; peak RSS = its maximum resident set size):"
  echo
  echo "| method | tool | round | wall s | user s | sys s | peak RSS GB | minor faults |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|"
  awk -F'\t' 'NR > 1 { printf "| %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %d |\n", $1, $2, $3, $4, $5, $6, $7 * 1024 / 1e9, $8 }' "$results"
)
echo "$report"
if [ -n "$table" ]; then
  mkdir -p "$(dirname "$table")"
  echo "$report" >"$table"
  note "report written to $table"
fi
