import json
import os
from pathlib import Path

import pytest

from tests.helpers.hub_server import hub_server  # noqa: F401  (the fixture, for every test module)
from tests.helpers.hub_twin import hub_twin  # noqa: F401  (the session's Hub twin, for every test module)
from tests.helpers.real_model import GGUF_FILE, RealModel, save_dequantized, smollm2_folder
from tests.helpers.shared import made_once
from tests.helpers.tiny_models import ARCHS, save_tiny_model

# Under pytest-xdist (``-n``), each worker gets its share of the cores, for its own torch and for
# every process its tests start (they inherit OMP_NUM_THREADS): workers never oversubscribe them.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    import torch

    threads = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    # A toy's portable training pins its own threads (2), beside the other workers: threads waiting at a
    # barrier sleep instead of spinning on the cores the others need (3.3x faster so; no bit depends on it).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than the cores. Some tests wait, holding their worker, on what uses
    no core of ours (a SLURM job past its time limit, a queue, a Hub server); measured on 2 cores, two
    workers left 12% of the cores idle over the suite, three about 1% (docs/testing.md)."""
    return (os.cpu_count() or 1) + 1


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    """The trained toy panel and the dequantized real model (SmolLM2) are made once for the session,
    by the first worker to ask (``tests/helpers/shared.py``); the others wait for them. So one worker
    trains the panel first, with the SLURM tests after it (group ``toy_panel``, which
    ``--dist loadgroup`` hands out before any single test, as its largest), while the others run the
    tests that need neither; the tests that read them come last. The toy panel's tests are all
    ``slow``: its training takes minutes."""
    reads = lambda item, fixture: fixture in getattr(item, "fixturenames", ())  # noqa: E731
    readers = [item for item in items if reads(item, "toy_panel")]
    for item in readers:
        item.add_marker(pytest.mark.slow)
    trainer = readers[:1]  # the test that trains it
    for item in trainer:
        item.add_marker(pytest.mark.xdist_group("toy_panel"))
    items[:] = sorted(items, key=lambda item: (item not in trainer, reads(item, "toy_panel") + reads(item, "smollm2")))


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Toy panels and cached measurements of the tests go to a temporary cache, not the user's."""
    os.environ["EMERGENCE_CACHE"] = str(tmp_path_factory.mktemp("emergence-cache"))


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """A saved (safetensors) tiny random model directory per architecture."""
    root = tmp_path_factory.mktemp("tiny")
    dirs = {}
    for arch in ARCHS:
        dirs[arch] = root / arch
        save_tiny_model(arch, dirs[arch])
    return dirs


@pytest.fixture(scope="session")
def toy_panel(tmp_path_factory) -> tuple[Path, dict]:
    """The real toy_neox, trained once for the session by the command line a user types (a sweep
    over its 10-revision panel, which trains it first) with a checkpoint every 32 steps (65 in
    all; ``save_every`` adds checkpoints, the weights are the default's): (the sweep's directory,
    the environment that points at its cache). Shared by every worker: the tests read it and may add
    measurements to its cache (each entry written whole), never change what is there."""
    from tests.helpers.cli import run_cli

    def panel_env(root: Path) -> dict:
        return {"EMERGENCE_CACHE": str(root / "cache"), "WANDB_MODE": "disabled"}

    def train(root: Path) -> None:
        res = run_cli(
            "-m",
            "model=toy_neox",
            "revision=glob(r*)",
            "model.toy.save_every=32",
            "ablate.enabled=false",
            f"hydra.sweep.dir={root / 'panel'}",
            env=panel_env(root),
            timeout=1800,
        )
        assert res.returncode == 0, res.stderr[-3000:]

    root = made_once(tmp_path_factory, "toy_panel", train)
    manifest = json.loads((root / "cache" / "toy" / "toy_neox" / "seed0" / "manifest.json").read_text())
    assert len(manifest["checkpoints"]) == 65  # step0 .. step2048, the panel's 10 among them
    return root / "panel", panel_env(root)


@pytest.fixture(scope="session")
def trainer_run(tmp_path_factory) -> Path:
    """The output folder of a transformers Trainer run (tests/helpers/trainer_run.py): checkpoint-10 ..
    checkpoint-120, with token counts. Shared by every worker."""
    from tests.helpers.trainer_run import train_run

    return made_once(tmp_path_factory, "trainer", lambda root: train_run(root / "out")) / "out"


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory) -> RealModel:
    """SmolLM2-135M-Instruct's GGUF (tests/helpers/real_model.py), and its dequantized float32 folder,
    made once for the session and shared by every worker."""
    folder = smollm2_folder()
    shared = made_once(tmp_path_factory, "smollm2", lambda root: save_dequantized(folder, root / "hf"))
    return RealModel(folder, GGUF_FILE, shared / "hf")
