#!/usr/bin/env bash
# The main path of the window walked as a user walks it: the real window under Xvfb, driven by
# real X input events (xdotool clicks and keys) and the real file dialog (zenity, which rfd
# uses when no desktop portal runs):
#
#   open the MLP demo → merge (Ctrl+Enter) → Radar → CART rank × λ → Save PNG… and Save CSV…
#   through the file dialog → save the project (Ctrl+S) → Experiments (Ctrl+Shift+X) → Escape
#
# Every step is checked by what it leaves on disk (the merged file, the figure files and their
# contents, the project); a screenshot of each step goes to OUTDIR.
#
#   scripts/walk-xvfb.sh [OUTDIR]        (default OUTDIR: docs/screenshots/walk)
#
# Environment: MERGESCOPE_BIN (default: the newer of target/release and target/debug). Build
# with `cargo build` first: the window loads the plugin libraries beside its binary (a plain
# `cargo test` leaves them in target/debug/deps, and the walk then fails at its first check).
# Needs the Debian packages xvfb, x11-apps (xwd), imagemagick, xdotool, zenity,
# mesa-vulkan-drivers and libvulkan1. Clicks are at positions in a 1360×820 window with the
# default font: if the layout changes, a step fails naming what it did not find; read the
# screenshots and update the positions below.
set -euo pipefail
outdir=${1:-docs/screenshots/walk}
bin=${MERGESCOPE_BIN:-}
if [ -z "$bin" ]; then
  # The newer of the two builds (an old release binary would walk an old window).
  bin=$(ls -t target/release/mergescope target/debug/mergescope 2>/dev/null | head -1 || true)
  [ -n "$bin" ] && bin=$(realpath "$bin")
fi
[ -n "$bin" ] && [ -x "$bin" ] || { echo "no mergescope binary: build it first (cargo build)" >&2; exit 1; }
for tool in Xvfb xwd xdotool zenity; do
  command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install xvfb x11-apps xdotool zenity" >&2; exit 1; }
done
conv=$(command -v convert-im6 || command -v magick || command -v convert || true)
[ -n "$conv" ] || { echo "missing ImageMagick: apt-get install imagemagick" >&2; exit 1; }
mkdir -p "$outdir"

tmp=$(mktemp -d)
export MERGESCOPE_CACHE_DIR=$tmp/cache MERGESCOPE_CONFIG_DIR=$tmp/config XDG_DATA_HOME=$tmp/config
files=$tmp/files
mkdir -p "$files" "$MERGESCOPE_CONFIG_DIR"
# shellcheck source=scripts/xvfb-start.sh
. "$(dirname "$0")/xvfb-start.sh"
xvfb="" app=""
cleanup() {
  [ -n "$app" ] && kill "$app" 2>/dev/null || true
  [ -n "$xvfb" ] && kill "$xvfb" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "walk failed at: $*" >&2
  shot "$outdir/failed.png" || true
  echo "the window at that moment: $outdir/failed.png; its output:" >&2
  tail -20 "$tmp/app.log" >&2 || true
  exit 1
}
shot() { xwd -root -silent | "$conv" xwd:- -colors 256 PNG8:"$1"; }
step=0
snap() {
  step=$((step + 1))
  local f
  f=$(printf '%s/%02d-%s.png' "$outdir" "$step" "$1")
  shot "$f"
  echo "  screenshot $f"
}
# Waits up to $1 seconds for the glob $2 to name a file.
wait_file() {
  local limit=$1 pattern=$2 i
  for ((i = 0; i < limit * 4; i++)); do
    compgen -G "$pattern" >/dev/null && return 0
    sleep 0.25
  done
  return 1
}
# The window whose title contains $1 (waits up to 20 s).
window() {
  local i w
  for ((i = 0; i < 80; i++)); do
    w=$(xdotool search --onlyvisible --name "$1" 2>/dev/null | tail -1 || true)
    [ -n "$w" ] && { echo "$w"; return 0; }
    sleep 0.25
  done
  return 1
}
click() { xdotool mousemove "$1" "$2" click 1; sleep "${3:-1}"; }
keys() { xdotool windowfocus "$main"; xdotool key "$@"; sleep 1; }
# Answers the file dialog ($1 says which, for messages) with the path $2 and waits for the
# file. rfd runs zenity, whose windows X knows by the name "zenity".
save_as() {
  local title=$1 path=$2 dialog
  dialog=$(window "^zenity$") || fail "no file dialog '$title' opened"
  sleep 1
  xdotool windowfocus "$dialog" 2>/dev/null || { sleep 1; xdotool windowfocus "$dialog"; }
  xdotool key ctrl+a
  xdotool type --delay 15 "$path"
  xdotool key Return
  wait_file 20 "$path" || fail "the dialog '$title' did not save '$path'"
}

echo "building the MLP demo benchmark (a private cache)"
"$bin" demo build --arch mlp >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log" >&2; exit 1; }
xvfb_start 1360x820 || fail "the virtual X server did not start"
WAYLAND_DISPLAY='' "$bin" gui --arch mlp >"$tmp/app.log" 2>&1 &
app=$!
main=$(window "mergescope") || fail "the window did not open"
sleep 4
echo "1. the window opens on the demo"
snap open

echo "2. merge with the form's method (task arithmetic): Ctrl+Enter"
keys ctrl+Return
wait_file 120 "$MERGESCOPE_CACHE_DIR/runs/*/merge-001-*.safetensors" || fail "Ctrl+Enter wrote no merge"
sleep 4
snap merged

echo "3. Radar, from the results' Analyze row"
click 436 90 3
snap radar
click 549 281
save_as "Save the figure" "$files/radar.csv"
grep -q "animal_mnist" "$files/radar.csv" && grep -q "task-arithmetic" "$files/radar.csv" \
  || fail "the saved figure is not the radar of the merge: $(head -3 "$files/radar.csv")"

echo "4. CART rank × λ, from the analysis panel's tabs"
click 733 222
wait_file 300 "$MERGESCOPE_CACHE_DIR/landscapes/*.json" || fail "the CART landscape did not finish"
sleep 3
snap landscape
click 565 291
save_as "Save the figure" "$files/cart.png"
[ "$(head -c 4 "$files/cart.png" | tail -c 3)" = "PNG" ] || fail "cart.png is not a PNG"
click 655 291
save_as "Save the figure" "$files/cart.csv"
grep -qi "lambda\|λ" "$files/cart.csv" || fail "the saved figure is not the rank × λ landscape: $(head -3 "$files/cart.csv")"

echo "5. save the project: Ctrl+S"
keys ctrl+s
save_as "Save the mergescope project" "$files/walk.msproj"
grep -q "task-arithmetic" "$files/walk.msproj" || fail "the project does not hold the merge"
sleep 1
snap saved

echo "6. the Experiments window (Ctrl+Shift+X), closed with Escape"
keys ctrl+shift+x
sleep 2
snap experiments
keys Escape
sleep 1
snap closed
kill -0 "$app" 2>/dev/null || fail "the window closed by itself"
echo "walk passed: $step screenshots in $outdir"
