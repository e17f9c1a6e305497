#!/usr/bin/env bash
# Run a whole panel, then the cross-run report.
#   ./multirun.sh toy   [extra Hydra overrides]   the 40-run toy panel on a CPU (trains it first)
#   ./multirun.sh paper [extra Hydra overrides]   the reference panel: pythia, olmo, olmoe x r0..r9 (GPU + Hub)
# Extra arguments are passed to every job, e.g. ./multirun.sh paper wandb.mode=online probe=quick
set -euo pipefail
panel="${1:-toy}"
shift || true
case "$panel" in
  toy) models="toy_neox,toy_olmo,toy_olmoe,toy_olmo_sinks" ;;
  paper) models="pythia,olmo,olmoe" ;;
  *) echo "usage: $0 toy|paper [hydra overrides...]" >&2; exit 2 ;;
esac
sweep_dir="outputs/multirun/${panel}_$(date +%Y-%m-%d_%H-%M-%S)"
# Toy panels are trained up front (once, cached), so the sweep itself only analyses.
if [ "$panel" = toy ]; then python -m emergence.toy; fi
python -m emergence -m "model=${models}" 'revision=glob(r*)' "hydra.sweep.dir=${sweep_dir}" "$@"
python -m emergence.report "$sweep_dir" --out "$sweep_dir/report"
echo "panel report: $sweep_dir/report/report.md"
