"""The LLC measure against devinterp called directly, its head coordinates against devinterp's masks, its
manners as a guest (random state, modes), its diagnostics, and a missing extra."""

import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from emergence import measures
from emergence.core.errors import UsageError
from emergence.measures import MeasureInput, llc
from emergence.recipe.capture import register_attention
from emergence.recipe.probe import make_probe_batch
from tests.helpers.cli import SMALL_RUN, last_line, run_cli
from tests.helpers.tiny_models import VOCAB, tiny_config

devinterp = pytest.importorskip("devinterp")
from datasets import Dataset  # noqa: E402  # devinterp's data type
from devinterp.slt.llc import llc as devinterp_llc  # noqa: E402
from devinterp.slt.sampling import sample  # noqa: E402
from devinterp.slt.weight_restrictions import create_param_masks  # noqa: E402

QUICK = dict(chains=2, draws=12, burn_in=0, sequences=32, batch=8, lr=1e-3)


def loaded(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=register_attention())


@pytest.fixture(scope="module")
def tokens():
    return make_probe_batch(32, 48, 10, 500, 42).tokens


def direct(settings: llc.Settings, tokens) -> dict:
    """devinterp's own arguments for ``settings`` on ``tokens``: the data set, then the sampler's keywords
    (what ``llc.estimate`` passes it, written out independently)."""
    return dict(
        dataset=Dataset.from_dict({"input_ids": tokens.tolist()}).with_format("torch"),
        observables={},
        lr=settings.lr,
        n_beta=settings.inverse_temperature,
        num_chains=settings.chains,
        num_draws=settings.draws,
        batch_size=settings.batch,
        num_burnin_steps=settings.burn_in,
        num_init_loss_batches=settings.sequences // settings.batch,
        init_seed=settings.seed,
        localization=settings.localization,
        sampling_method="rmsprop_sgld",
        device="cpu",
        loss_fn=llc.eval_mode_loss,
    )


def test_the_estimate_equals_devinterps_own_with_the_same_seed_data_and_settings(tiny_dirs, tokens):
    """With no burn-in devinterp's ``llc`` averages the same draws: its per-chain values are ours."""
    settings = llc.Settings(**QUICK)
    ours = llc.estimate(loaded(tiny_dirs["gpt_neox"]).eval(), tokens, settings, torch.device("cpu"))
    theirs = devinterp_llc(loaded(tiny_dirs["gpt_neox"]).eval(), **direct(settings, tokens), output_path=None)
    # the same draws and losses; devinterp averages them in float32, we in float64
    # (twelve draws without burn-in still climb from w*: ``diagnose`` fails them, the numbers are compared)
    np.testing.assert_allclose(ours.chains, theirs.llc_per_chain.values, rtol=1e-5)
    assert np.mean(ours.chains) == pytest.approx(float(theirs.llc_mean), rel=1e-5)


def test_burn_in_draws_are_left_out(tiny_dirs, tokens, tmp_path):
    settings = llc.Settings(**{**QUICK, "burn_in": 5})
    ours = llc.estimate(loaded(tiny_dirs["llama"]).eval(), tokens, settings, torch.device("cpu"))
    samples = sample(
        loaded(tiny_dirs["llama"]).eval(), **direct(settings, tokens), output_path=tmp_path / "samples.zarr"
    ).dataset
    trace = samples.sampling_loss_micro.values.astype(np.float64).mean(axis=(2, 3))  # [chain, step]
    assert trace.shape == (2, 17)
    expected = settings.inverse_temperature * (trace[:, 5:].mean(1) - samples.init_loss.values.mean())
    np.testing.assert_allclose(ours.chains, expected, rtol=1e-6)
    assert len(ours.loss_trace[0]) == 17  # the trace keeps the burn-in, the estimate does not


@pytest.mark.parametrize("arch", ["gpt_neox", "llama", "qwen2"])
def test_head_coordinates_are_devinterps_mask_without_biases(arch, tiny_dirs):
    """devinterp's own ``create_param_masks(model, "l1h2")`` for the architectures it has: the same weight
    elements; it adds the q/k/v biases (GPT-NeoX's fused ones, Qwen2's), which the tool's head slices leave out."""
    model = loaded(tiny_dirs[arch])
    ours = llc.head_masks(model, 1, 2)
    theirs = create_param_masks(model, "l1h2")
    weights = {name: mask for name, mask in theirs.items() if name.endswith("weight")}
    assert sorted(ours) == sorted(weights)
    for name, mask in weights.items():
        assert torch.equal(ours[name], mask.expand_as(ours[name]))
    biases = sorted(name for name in theirs if name.endswith("bias"))  # the difference, named
    assert (
        biases
        == {
            "gpt_neox": ["gpt_neox.layers.1.attention.query_key_value.bias"],
            "llama": [],
            "qwen2": [f"model.layers.1.self_attn.{p}_proj.bias" for p in "kqv"],
        }[arch]
    )


def test_a_call_leaves_the_random_state_modes_and_gradients_as_they_were(tiny_dirs, tokens):
    model = loaded(tiny_dirs["llama"]).train()
    model.model.layers[0].eval()  # a mixed state, as in the middle of a training's evaluation
    modes = [m.training for m in model.modules()]
    model(tokens[:2], labels=tokens[:2]).loss.backward()  # a training's gradients, mid-accumulation
    grads = [p.grad.clone() for p in model.parameters()]
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    llc.estimate(model, tokens, llc.Settings(**QUICK), torch.device("cpu"))
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]
    assert [m.training for m in model.modules()] == modes
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))


def test_a_step_size_far_too_large_fails_the_estimate_with_its_reason(tiny_dirs, tokens):
    model = loaded(tiny_dirs["gpt_neox"]).eval()
    batch = make_probe_batch(32, 48, 10, 500, 42)
    inputs = MeasureInput(
        model, 2, 4, batch, "synthetic", None, torch.device("cpu"), llc.Settings(**{**QUICK, "lr": 1.0}, heads=["L1H1"])
    )
    result = llc.MEASURE.run(inputs)
    assert result.per_run["llc"] is None and "diverged" in result.per_run["failed"]
    assert np.isnan(result.per_head["llc_refined"]).all()  # the head's failed too: not reported
    assert "diverged" in result.per_run["heads"]["L1H1"]["failed"]


def test_diagnose_names_each_failure():
    s = llc.Settings(burn_in=2, draws=8)
    flat = np.full((2, 10), 1.0)
    assert llc.diagnose(flat, np.array([1.0, 1.0]), s) is None
    nan = flat.copy()
    nan[1, 6:] = np.nan
    assert "chain 1 diverged at step 6" in llc.diagnose(nan, np.array([1.0, np.nan]), s)
    rising = flat + np.linspace(0, 1, 10)[None]  # its last quarter far above its first
    assert "keeps rising" in llc.diagnose(rising, np.array([1.0, 1.0]), s)
    assert "negative estimate" in llc.diagnose(flat, np.array([-1.0, -1.2]), s)
    assert "chains disagree" in llc.diagnose(flat, np.array([1.0, 4.0]), s)  # std 1.5 over mean 2.5
    assert llc.diagnose(flat, np.array([1.0, 3.0]), s) is None  # std 1 over mean 2: the bound itself


@pytest.mark.parametrize(
    "settings, says",
    [
        ({"lr": -1}, "lr=-1.0: the step size must be > 0"),
        ({"chains": 0}, "chains=0: must be >= 1"),
        ({"heads": ["H3"]}, "'H3' is not a head name"),
        ({"sampler": "hmc"}, "sampler=hmc: use one of rmsprop_sgld, sgld"),
        ({"batch": 64, "sequences": 32}, "batch=64 is more than sequences=32"),
    ],
)
def test_a_bad_setting_is_one_line(settings, says):
    with pytest.raises(UsageError, match=says):
        measures.chosen({"llc": settings})


def test_a_token_file_is_checked_with_the_settings_and_its_ids_against_the_vocabulary(tmp_path):
    """Before any weights load: the file is there, a .npy of [sequences, T] integers with enough rows
    (its header only is read); once the model is there: its ids lie in the vocabulary."""
    floats, short, good = tmp_path / "floats.npy", tmp_path / "short.npy", tmp_path / "ids.npy"
    np.save(floats, np.zeros((300, 8)))
    np.save(short, np.zeros((10, 8), dtype=np.int64))
    np.save(good, np.full((300, 8), VOCAB, dtype=np.int64))  # one past the tiny models' vocabulary
    for data, says in [
        (tmp_path / "none.npy", "not a readable .npy of token ids"),
        (floats, r"need \[sequences, T\] integer token ids with at least 256 sequences; it holds float64 \[300, 8\]"),
        (short, r"need \[sequences, T\] integer token ids with at least 256 sequences; it holds int64 \[10, 8\]"),
    ]:
        with pytest.raises(UsageError, match=f"measures.llc: data={data}: {says}"):
            measures.chosen({"llc": {"data": str(data)}})
    settings = llc.Settings(data=str(good))  # a file of the right form: taken
    model = AutoModelForCausalLM.from_config(tiny_config("gpt_neox"))
    inputs = MeasureInput(model, 2, 4, None, "synthetic", None, torch.device("cpu"), settings)
    says = f"data={good}: token ids run from {VOCAB} to {VOCAB}; this model's vocabulary is 0..{VOCAB - 1}"
    with pytest.raises(UsageError, match=says):
        llc.sampling_data(inputs, settings)


def test_a_head_the_model_lacks_is_one_line(tiny_dirs):
    inputs = MeasureInput(None, 2, 4, None, "synthetic", None, torch.device("cpu"), llc.Settings(heads=["L5H0"]))
    with pytest.raises(UsageError, match=r"L5H0 is not a head of this model \(2 layers x 4 heads\)"):
        llc.compute(inputs)


def test_without_devinterp_the_measure_is_refused_in_one_line(monkeypatch, tmp_path):
    find_spec = measures.importlib.util.find_spec
    monkeypatch.setattr(
        measures.importlib.util, "find_spec", lambda name, *a: None if name == "devinterp" else find_spec(name, *a)
    )
    with pytest.raises(
        UsageError, match=r'measures.llc needs devinterp, which is not installed: pip install -e ".\[llc\]"'
    ):
        measures.chosen({"llc": {}})
    # and on the command line, before any weights load: a site without devinterp
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import importlib.util\n_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'devinterp' else _find(name, *a)\n"
    )
    done = run_cli(
        "measures=[default,llc]", f"hydra.run.dir={tmp_path / 'run'}", *SMALL_RUN, env={"PYTHONPATH": str(site)}
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert last_line(done.stderr).startswith(
        'error: measures.llc needs devinterp, which is not installed: pip install -e ".[llc]"'
    )


def test_the_estimate_runs_under_no_grad_as_track_calls_it(tiny_dirs, tokens):
    """``track`` analyses under ``torch.no_grad``: the chains still take gradients."""
    model = loaded(tiny_dirs["gpt_neox"]).eval()
    with torch.no_grad():
        found = llc.estimate(model, tokens, llc.Settings(**{**QUICK, "burn_in": 4}), torch.device("cpu"))
        assert not torch.is_grad_enabled()  # the caller's mode, given back
    assert all(np.isfinite(c) for c in found.chains)
