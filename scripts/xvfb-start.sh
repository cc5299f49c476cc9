# Sourced by scripts/screenshot-xvfb.sh and scripts/walk-xvfb.sh: `xvfb_start WxH` starts a
# virtual X server on a display number it picks itself (`-displayfd`: no clash with a display
# another server or a stale lock holds), waits until it accepts connections (it writes the
# number only then; a fixed `sleep 1` lost that race on a loaded machine, and the window then
# failed with "Failed to open connection to X server"), and sets DISPLAY and xvfb (its pid).
xvfb_start() {
  local size=$1 numfile
  numfile=$(mktemp)
  Xvfb -displayfd 3 -screen 0 "${size}x24" -nolisten tcp 3>"$numfile" >/dev/null 2>&1 &
  xvfb=$!
  local waited=0
  while [ ! -s "$numfile" ]; do
    if ! kill -0 "$xvfb" 2>/dev/null || [ "$waited" -ge 300 ]; then
      rm -f "$numfile"
      echo "Xvfb did not start (within 30 s)" >&2
      return 1
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  DISPLAY=":$(tr -dc '0-9' <"$numfile")"
  export DISPLAY
  rm -f "$numfile"
}
