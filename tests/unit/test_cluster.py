"""A SLURM request judged against the cluster's nodes (emergence/run/cluster.py), without a cluster:
sinfo's fields read, and each field a partition cannot give refused with the line naming it."""

import pytest
from omegaconf import OmegaConf

from emergence.core.errors import UsageError
from emergence.run.cluster import STARTING_S, Node, check_request, gpu_count, minutes

CPU_NODE = Node("debug", default=True, cpus=2, mem_mb=8192, gpus=0, time_limit_min=60)
FITS = {
    "gpus_per_node": 0,
    "cpus_per_task": 1,
    "tasks_per_node": 1,
    "mem_gb": 4,
    "timeout_min": 30,
    "signal_delay_s": 120,
    "partition": None,
}


@pytest.mark.parametrize(
    "gres, count",
    [
        ("(null)", 0),
        ("gpu:4", 4),
        ("gpu:a100:4(S:0-1),tmpdisk:100", 4),
        ("gpu", 0),
        ("gpu:a100", 1),
        ("tmpdisk:100,gpu:2", 2),
    ],
)
def test_gpus_are_counted_from_sinfos_generic_resources(gres, count):
    assert gpu_count(gres) == count


@pytest.mark.parametrize(
    "limit, mins", [("infinite", None), ("30:00", 30), ("2:00:00", 120), ("1-12:00:00", 36 * 60), ("30:01", 31)]
)
def test_a_partitions_time_limit_is_read_in_whole_minutes_rounded_up(limit, mins):
    assert minutes(limit) == mins


def test_a_request_the_node_holds_passes():
    check_request(OmegaConf.create(FITS), [CPU_NODE])


@pytest.mark.parametrize(
    "change, line",
    [
        ({"gpus_per_node": 1}, "hydra.launcher.gpus_per_node=1: partition 'debug' has no GPUs"),
        ({"cpus_per_task": 3}, "hydra.launcher.cpus_per_task=3: a node of partition 'debug' has at most 2 CPUs"),
        ({"mem_gb": 9}, "hydra.launcher.mem_gb=9: a node of partition 'debug' has at most 8 GB"),
        ({"timeout_min": 61}, "hydra.launcher.timeout_min=61: partition 'debug' allows at most 60 minutes"),
        ({"partition": "gpu"}, "hydra.launcher.partition='gpu' is not a partition of this cluster"),
        # SLURM's warning 120 s before a 2-minute limit: at the job's start, before anything answers it
        (
            {"timeout_min": 2},
            "hydra.launcher.signal_delay_s=120: SLURM would warn a job (USR2) within its first 60 s "
            "(hydra.launcher.timeout_min=2), while it starts, and the warning would end it: lower it to "
            "at most 60",
        ),
        (
            {"timeout_min": 1},
            "hydra.launcher.signal_delay_s=120: SLURM would warn a job (USR2) within its first 60 s "
            "(hydra.launcher.timeout_min=1), while it starts, and the warning would end it: raise "
            "hydra.launcher.timeout_min to at least 3",
        ),
    ],
    ids=["gpus", "cpus", "memory", "time", "partition", "warning-at-start", "limit-within-the-start"],
)
def test_a_field_the_partition_cannot_give_is_named_with_its_fix(change, line):
    with pytest.raises(UsageError) as err:
        check_request(OmegaConf.create({**FITS, **change}), [CPU_NODE])
    assert str(err.value).startswith(line)


@pytest.mark.parametrize("timeout_min, signal_delay_s", [(2, 60), (3, 120), (60, 120), (1, 0)])
def test_each_fix_the_warning_line_names_is_accepted(timeout_min, signal_delay_s):
    """The values the line proposes pass the check: the warning then comes at least STARTING_S in."""
    assert timeout_min * 60 - signal_delay_s >= STARTING_S
    check_request(OmegaConf.create({**FITS, "timeout_min": timeout_min, "signal_delay_s": signal_delay_s}), [CPU_NODE])
