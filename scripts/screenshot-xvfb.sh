#!/usr/bin/env bash
# Starts the real mergescope window under Xvfb (a virtual X server, no GPU needed: wgpu runs
# on Mesa's lavapipe) and saves a screenshot of it.
#
#   scripts/screenshot-xvfb.sh OUT.png [mergescope arguments…]
#
# Environment: MERGESCOPE_BIN (default target/release/mergescope, else target/debug),
# WAIT seconds before the shot (default 8), SIZE (default 1360x820).
# Needs the Debian packages xvfb, x11-apps (xwd), imagemagick (convert),
# mesa-vulkan-drivers and libvulkan1.
set -euo pipefail
out=${1:?usage: $0 OUT.png [mergescope arguments…]}
shift
bin=${MERGESCOPE_BIN:-}
if [ -z "$bin" ]; then
  for b in target/release/mergescope target/debug/mergescope; do
    if [ -x "$b" ]; then bin=$b; break; fi
  done
fi
[ -n "$bin" ] && [ -x "$bin" ] || { echo "no mergescope binary: build it first (cargo build --release)" >&2; exit 1; }
for tool in Xvfb xwd; do
  command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install xvfb x11-apps" >&2; exit 1; }
done
# ImageMagick 6 names its tool convert-im6 on Debian; `convert` may be something else.
conv=$(command -v convert-im6 || command -v magick || command -v convert || true)
[ -n "$conv" ] || { echo "missing ImageMagick: apt-get install imagemagick" >&2; exit 1; }
size=${SIZE:-1360x820}
# shellcheck source=scripts/xvfb-start.sh
. "$(dirname "$0")/xvfb-start.sh"
xvfb="" app=""
cleanup() {
  [ -n "$app" ] && kill "$app" 2>/dev/null || true
  [ -n "$xvfb" ] && kill "$xvfb" 2>/dev/null || true
}
trap cleanup EXIT
xvfb_start "$size" || exit 1
display=$DISPLAY
# A private config so the shot does not depend on (or change) the user's settings.
config=$(mktemp -d)
DISPLAY=$display WAYLAND_DISPLAY='' XDG_DATA_HOME="$config" MERGESCOPE_CONFIG_DIR="$config" \
  "$bin" "$@" >"$config/app.log" 2>&1 &
app=$!
sleep "${WAIT:-8}"
if ! kill -0 "$app" 2>/dev/null; then
  echo "mergescope exited before the screenshot; its output:" >&2
  cat "$config/app.log" >&2
  exit 1
fi
DISPLAY=$display xwd -root -silent | "$conv" xwd:- "$out"
echo "saved $out ($(wc -c <"$out") bytes)"
