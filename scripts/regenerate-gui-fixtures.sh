#!/usr/bin/env bash
# Regenerates the GUI tests' committed inputs and pictures: the test benchmark
# (app/gui/tests/fixtures/bench, trained with the recipe of app/gui/tests/common/mod.rs), the
# reference results of the Experiments window's tiny sweep
# (app/gui/tests/fixtures/sweep/results.csv) and the snapshots drawn from them
# (app/gui/tests/snapshots). Run it after a change that is meant to change what the tests see
# (the demo recipe or its version, the training, a merge method, the views), then look at the
# new pictures and commit them with the change.
#
#   scripts/regenerate-gui-fixtures.sh
#
# Training depends on the CPU (the order in which matrix products are summed), so the files
# this writes differ from one machine to another: that is why the tests read them instead of
# training. Rendering needs a Vulkan driver (Debian: mesa-vulkan-drivers, libvulkan1).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -p mergescope-gui --test gui -- --ignored --exact regenerate_benchmark_fixture
MERGESCOPE_UPDATE_FIXTURES=1 UPDATE_SNAPSHOTS=force cargo test -p mergescope-gui --test experiments
UPDATE_SNAPSHOTS=force cargo test -p mergescope-gui --test gui
git status --short app/gui/tests
