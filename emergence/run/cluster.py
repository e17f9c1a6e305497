"""What a SLURM sweep (``hydra/launcher=slurm``) asks of the cluster, judged before anything runs.

``CheckCluster`` (a Hydra callback, registered in ``conf/config.yaml`` before the branch check):
the partition the launcher names (or the cluster's default) must exist, and one of its nodes
must hold the GPUs, CPUs, memory and time a job asks for, and SLURM's warning before the time
limit must come after a job has started. A request the partition cannot give is one line naming
the launcher field to change, and exit 2: no Hub query, nothing submitted.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from emergence.core.errors import UsageError

SLURM_LAUNCHER = "hydra_plugins.emergence_slurm.launcher.SlurmLauncher"


@dataclass(frozen=True)
class Node:
    partition: str
    default: bool  # the cluster's default partition (sinfo marks it with *)
    cpus: int
    mem_mb: int
    gpus: int
    time_limit_min: int | None  # the partition's; None: no limit


def gpu_count(gres: str) -> int:
    """GPUs in sinfo's ``%G`` (``gpu:a100:4(S:0-1),tmpdisk:100``; ``(null)`` for none)."""
    count = 0
    for item in gres.split(","):
        name, *rest = item.split("(")[0].split(":")
        if name == "gpu" and rest:
            count += int(rest[-1]) if rest[-1].isdigit() else 1
    return count


def minutes(limit: str) -> int | None:
    """sinfo's ``%l`` (``infinite``, ``30:00``, ``2:00:00``, ``1-12:00:00``) in minutes."""
    if limit in ("infinite", "UNLIMITED", "n/a"):
        return None
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    hours, mins, secs = [0] * (3 - len(parts)) + parts
    return (int(days or 0) * 24 + hours) * 60 + mins + (secs > 0)


def cluster_nodes() -> list[Node]:
    """Every node of every partition, as ``sinfo`` lists them; RuntimeError where no cluster answers."""
    try:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%P|%c|%m|%G|%l"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RuntimeError(f"hydra/launcher=slurm: no SLURM cluster answers (sinfo: {err})") from None
    if done.returncode != 0:
        raise RuntimeError(f"hydra/launcher=slurm: no SLURM cluster answers (sinfo: {done.stderr.strip()})")
    nodes = []
    for line in done.stdout.splitlines():
        partition, cpus, mem, gres, limit = line.strip().split("|")
        nodes.append(
            Node(
                partition.rstrip("*"),
                partition.endswith("*"),
                int(cpus),
                int(mem.rstrip("+")),
                gpu_count(gres),
                minutes(limit),
            )
        )
    return nodes


def check_request(launcher: DictConfig, nodes: list[Node]) -> None:
    """A UsageError naming the first launcher field no node of the job's partition can satisfy."""
    partitions = sorted({n.partition for n in nodes})
    name = launcher.get("partition")
    if name is None:
        name = next((n.partition for n in nodes if n.default), None)
        if name is None:
            raise UsageError(
                f"the cluster has no default partition: choose one with "
                f"hydra.launcher.partition=<name> ({', '.join(partitions)})"
            )
    elif name not in partitions:
        raise UsageError(
            f"hydra.launcher.partition={name!r} is not a partition of this cluster: "
            f"choose one of {', '.join(partitions)}"
        )
    mine = [n for n in nodes if n.partition == name]
    gpus = launcher.get("gpus_per_node") or 0
    most_gpus = max(n.gpus for n in mine)
    if gpus > most_gpus:
        fix = (
            (
                "set hydra.launcher.gpus_per_node=0 to run on its CPUs, or choose a GPU partition with "
                "hydra.launcher.partition=<name>"
            )
            if most_gpus == 0
            else f"lower it to {most_gpus}"
        )
        raise UsageError(
            f"hydra.launcher.gpus_per_node={gpus}: partition {name!r} has "
            f"{'no GPUs' if most_gpus == 0 else f'at most {most_gpus} a node'}: {fix}"
        )
    cpus = (launcher.get("cpus_per_task") or 1) * (launcher.get("tasks_per_node") or 1)
    most_cpus = max(n.cpus for n in mine)
    if cpus > most_cpus:
        raise UsageError(
            f"hydra.launcher.cpus_per_task={launcher.get('cpus_per_task')}: a node of partition "
            f"{name!r} has at most {most_cpus} CPUs: lower it"
        )
    mem_gb = launcher.get("mem_gb")
    most_mem_gb = max(n.mem_mb for n in mine) // 1024
    if mem_gb is not None and mem_gb > most_mem_gb:
        raise UsageError(
            f"hydra.launcher.mem_gb={mem_gb}: a node of partition {name!r} has at most {most_mem_gb} GB: lower it"
        )
    limit = mine[0].time_limit_min
    if limit is not None and launcher.get("timeout_min", 0) > limit:
        raise UsageError(
            f"hydra.launcher.timeout_min={launcher.timeout_min}: partition {name!r} allows at most "
            f"{limit} minutes a job: lower it"
        )
    check_warning(launcher)


STARTING_S = 60  # a job's first minute: Python still imports, with no answer to SLURM's warning yet


def check_warning(launcher: DictConfig) -> None:
    """A UsageError where SLURM's warning (USR2, ``signal_delay_s`` before ``timeout_min`` runs out)
    would reach a job within ``STARTING_S`` of its start: before submitit answers it, USR2 ends the
    process, and the job would be listed as FAILED instead of TIMEOUT with the limit to raise."""
    timeout_s = (launcher.get("timeout_min") or 0) * 60
    delay_s = launcher.get("signal_delay_s") or 0
    if timeout_s and timeout_s - delay_s < STARTING_S:
        fix = (
            f"lower it to at most {timeout_s - STARTING_S}"
            if timeout_s > STARTING_S
            else f"raise hydra.launcher.timeout_min to at least {-(-(delay_s + STARTING_S) // 60)}"
        )
        raise UsageError(
            f"hydra.launcher.signal_delay_s={delay_s}: SLURM would warn a job (USR2) within its first "
            f"{STARTING_S} s (hydra.launcher.timeout_min={launcher.timeout_min}), while it starts, and "
            f"the warning would end it: {fix}"
        )


class CheckCluster(Callback):
    """At a SLURM multirun's start: the launcher's request judged against the cluster's nodes."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if config.hydra.launcher._target_ != SLURM_LAUNCHER:
            return
        try:
            check_request(config.hydra.launcher, cluster_nodes())
        except UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        except RuntimeError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(1)
