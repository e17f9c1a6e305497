import json
import os
from pathlib import Path

import pytest

from tests.helpers.hub_server import hub_server  # noqa: F401  (the fixture, for every test module)
from tests.helpers.hub_twin import hub_twin  # noqa: F401  (the session's Hub twin, for every test module)
from tests.helpers.real_model import GGUF_FILE, RealModel, save_dequantized, smollm2_folder
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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    """The tests of the trained toy panel run on one worker (``--dist loadgroup``), which trains it
    once, and first: it is the longest chain of the suite, so the other workers share the rest. The
    tests of the real model (SmolLM2) likewise share one worker, which dequantizes it once. The toy
    panel's tests are all ``slow``: its training alone takes five minutes on one core."""
    shared = []
    for fixture in ("toy_panel", "smollm2"):
        group = [item for item in items if fixture in getattr(item, "fixturenames", ()) and item not in shared]
        for item in group:
            item.add_marker(pytest.mark.xdist_group(fixture))
            if fixture == "toy_panel":
                item.add_marker(pytest.mark.slow)
        shared += group
    items[:] = shared + [item for item in items if item not in shared]


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
    the environment that points at its cache)."""
    from tests.helpers.cli import run_cli

    root = tmp_path_factory.mktemp("toy_panel")
    env = {"EMERGENCE_CACHE": str(root / "cache"), "WANDB_MODE": "disabled"}
    sweep = root / "panel"
    res = run_cli(
        "-m",
        "model=toy_neox",
        "revision=glob(r*)",
        "model.toy.save_every=32",
        "ablate.enabled=false",
        f"hydra.sweep.dir={sweep}",
        env=env,
        timeout=1800,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    manifest = json.loads((root / "cache" / "toy" / "toy_neox" / "seed0" / "manifest.json").read_text())
    assert len(manifest["checkpoints"]) == 65  # step0 .. step2048, the panel's 10 among them
    return sweep, env


@pytest.fixture(scope="session")
def trainer_run(tmp_path_factory) -> Path:
    """The output folder of a transformers Trainer run (tests/helpers/trainer_run.py): checkpoint-10 ..
    checkpoint-120, with token counts."""
    from tests.helpers.trainer_run import train_run

    return train_run(tmp_path_factory.mktemp("trainer") / "out")


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory) -> RealModel:
    """SmolLM2-135M-Instruct's GGUF (tests/helpers/real_model.py), and its dequantized float32 folder."""
    folder = smollm2_folder()
    hf_dir = tmp_path_factory.mktemp("smollm2") / "hf"
    save_dequantized(folder, hf_dir)
    return RealModel(folder, GGUF_FILE, hf_dir)
