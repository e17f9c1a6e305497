#!/usr/bin/env bash
# Run a whole panel, then the cross-run report.
#   ./multirun.sh toy   [extra Hydra overrides]   the 40-run toy panel on a CPU (trains it first)
#   ./multirun.sh tasks [extra Hydra overrides]   the task toy's 10 revisions x the 4 task probes on a CPU (trains it first)
#   ./multirun.sh paper [extra Hydra overrides]   the reference panel: pythia, olmo, olmoe x r0..r9 (GPU + Hub)
# Extra arguments are passed to every job, e.g. ./multirun.sh paper wandb.mode=online probe=quick
set -euo pipefail
panel="${1:-toy}"
shift || true
task_probes=()  # the tasks panel sweeps the four task probes
case "$panel" in
  toy) models="toy_neox,toy_olmo,toy_olmoe,toy_olmo_sinks" ;;
  tasks) models="toy_tasks"; task_probes=("probe=ioi,greater_than,successor,binding") ;;
  paper) models="pythia,olmo,olmoe" ;;
  *) echo "usage: $0 toy|tasks|paper [hydra overrides...]" >&2; exit 2 ;;
esac
sweep_dir="outputs/multirun/${panel}_$(date +%Y-%m-%d_%H-%M-%S)"
# Toy panels are trained up front (once, cached), so the sweep itself only analyses.
case "$panel" in
  toy) python -m emergence.toy ;;
  tasks) python -m emergence.toy toy_tasks ;;
esac
python -m emergence -m "model=${models}" 'revision=glob(r*)' ${task_probes[@]+"${task_probes[@]}"} \
  "hydra.sweep.dir=${sweep_dir}" "$@"
python -m emergence.report "$sweep_dir" --out "$sweep_dir/report"
echo "panel report: $sweep_dir/report/report.md"
