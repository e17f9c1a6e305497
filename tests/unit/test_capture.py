"""Captured attention statistics and head outputs vs the model's own eager attention."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from emergence.core.config import StatsConfig
from emergence.measures import MeasureInput, sink_importance
from emergence.recipe import capture
from emergence.recipe.ablation import METRICS, metrics_per_sequence
from emergence.recipe.capture import (
    ATTN_IMPLEMENTATION,
    Architecture,
    PassOptions,
    Subject,
    register_attention,
    run_probe,
)
from emergence.recipe.probe import baseline_positions, make_probe_batch
from tests.helpers.cli import run_fresh
from tests.helpers.reference_impl import (
    OUT_PROJ,
    eager_model,
    eager_sink_importance,
    eager_targets,
    head_outputs_at_last,
)
from tests.helpers.tiny_models import ARCHS, VOCAB

T = 64


def capture_model(path):
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=register_attention()
    ).eval()


@pytest.fixture(scope="module")
def probe_batch():
    return make_probe_batch(12, T, 10, VOCAB, 42), baseline_positions(T, 50)


@pytest.mark.parametrize("arch", ARCHS)
def test_captured_attention_equals_eager_output_attentions(arch, tiny_dirs, probe_batch):
    batch, baseline = probe_batch
    model = capture_model(tiny_dirs[arch])
    cap = run_probe(Subject(model, Architecture.of(model), batch, 5), PassOptions(baseline, 12), metrics_per_sequence)
    expected = eager_targets(eager_model(tiny_dirs[arch]), batch.tokens, batch.ab.numpy(), baseline)
    assert cap.targets.shape == expected.shape == (12, 2, 4, 7)
    np.testing.assert_allclose(cap.targets, expected, rtol=1e-5, atol=1e-7)
    assert model.config._attn_implementation == ATTN_IMPLEMENTATION  # the fast path was kept


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel_lse", [True, False], ids=["kernel-lse", "score-matrix"])
def test_sink_importance_equals_eager_attention_to_key_0(arch, kernel_lse, tiny_dirs, probe_batch, monkeypatch):
    """Key 0's importance from every query (the kernel's log-sum-exp on a CPU; elsewhere, and with a
    softcap, a transient score matrix), as the ``sink_importance`` measure reads it in the pass, vs the
    column of the full eager pattern; the sink fraction agrees to at most one (sequence, layer, head) at
    an epsilon between the tiny models' importances."""
    monkeypatch.setattr(capture, "kernel_returns_lse", lambda query: kernel_lse)
    batch, baseline = probe_batch
    model = capture_model(tiny_dirs[arch])
    expected = eager_sink_importance(eager_model(tiny_dirs[arch]), batch.tokens)
    epsilon = float(np.median(expected))  # half the (sequence, layer, head) above: the fraction is not trivial
    arch_info = Architecture.of(model)
    settings = sink_importance.Settings(epsilon=epsilon)
    inputs = MeasureInput(model, 2, 4, batch, "synthetic", None, torch.device("cpu"), settings, stats=StatsConfig(50))
    sinks = sink_importance.FirstKeyImportance(inputs)
    run_probe(Subject(model, arch_info, batch, 5), PassOptions(baseline, 12), metrics_per_sequence, [sinks])
    result = sink_importance.MEASURE.checked(sinks.result(), (2, 4))
    importance = result.per_sequence["sink_importance"]
    assert importance.shape == expected.shape == (12, 2, 4) and importance.dtype == np.float32
    np.testing.assert_allclose(importance, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(result.per_head["sink_importance"], importance.astype(np.float64).mean(0))
    ours = result.per_run
    assert ours["epsilon"] == epsilon and abs(ours["fraction"] - (expected > epsilon).mean()) <= 1 / expected.size
    assert ours["per_layer"] == pytest.approx((expected > epsilon).mean(axis=(0, 2)), abs=1 / (12 * 4))
    assert ours["fraction_ci"][0] <= ours["fraction"] <= ours["fraction_ci"][1]


@pytest.mark.parametrize("arch", ARCHS)
def test_last_query_row_equals_eager_output_attentions_row(arch, tiny_dirs, probe_batch):
    """The whole row T-1, every key, from the tensors the model passes to the attention function."""
    batch, _ = probe_batch
    model = capture_model(tiny_dirs[arch])
    arch_info = Architecture.of(model)
    rows = {}

    def keep_row(call: capture.AttentionCall):
        rows[arch_info.attentions.index(call.module)] = call.last_query_row()

    with torch.no_grad():
        model(batch.tokens, **{capture.LISTENER: keep_row})
        attentions = eager_model(tiny_dirs[arch])(batch.tokens, output_attentions=True).attentions
    assert sorted(rows) == list(range(len(attentions)))
    for layer, eager in enumerate(attentions):
        torch.testing.assert_close(rows[layer], eager[:, :, -1, :], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("arch", ARCHS)
def test_spectral_sums_equal_head_outputs_from_hooks(arch, tiny_dirs, probe_batch):
    batch, baseline = probe_batch
    model = capture_model(tiny_dirs[arch])
    arch_info = Architecture.of(model)
    cap = run_probe(
        Subject(model, arch_info, batch, 5), PassOptions(baseline, 7, keep_position_means=True), metrics_per_sequence
    )
    x = head_outputs_at_last(eager_model(tiny_dirs[arch]), arch, batch.tokens, arch_info.n_heads)[:7]
    gram = np.einsum("nlhd,nlhe->lhde", x, x)
    # SDPA and eager kernels differ in float32 rounding only: tolerance relative to the scale.
    np.testing.assert_allclose(cap.gram, gram, rtol=1e-4, atol=1e-5 * np.abs(gram).max())
    np.testing.assert_allclose(cap.total, x.sum(0), rtol=1e-4, atol=1e-5 * np.abs(x).max())
    assert cap.spectral_n == 7


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_under_capture_equal_the_models_own_eager_logits(arch, tiny_dirs, probe_batch):
    batch, baseline = probe_batch
    model = capture_model(tiny_dirs[arch])
    seen = []

    def keep_logits(logits, b):
        seen.append(logits.double())
        return metrics_per_sequence(logits, b)

    run_probe(Subject(model, Architecture.of(model), batch, 5), PassOptions(baseline, 12), keep_logits)
    with torch.no_grad():
        expected = eager_model(tiny_dirs[arch])(batch.tokens).logits[:, -1].double()
    torch.testing.assert_close(torch.cat(seen), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_discovered_projection_reassembles_the_attention_output_from_head_outputs(arch, tiny_dirs, probe_batch):
    batch, _ = probe_batch
    model = capture_model(tiny_dirs[arch])
    arch_info = Architecture.of(model)
    assert arch_info.out_projs == OUT_PROJ[arch](model)  # discovery finds what the source names
    outputs = []
    hook = arch_info.attentions[1].register_forward_hook(lambda m, a, out: outputs.append(out[0][:, -1]))
    x = torch.from_numpy(head_outputs_at_last(model, arch, batch.tokens, arch_info.n_heads))[:, 1].float()
    hook.remove()
    proj = arch_info.out_projs[1]
    with torch.no_grad():  # affine: proj(x) = sum over heads of (proj(that head only) - proj(0)), + proj(0)
        zero = proj(torch.zeros_like(x.flatten(1)))
        per_head = [
            proj((x * (torch.arange(arch_info.n_heads) == h)[:, None]).flatten(1)) - zero
            for h in range(arch_info.n_heads)
        ]
    torch.testing.assert_close(sum(per_head) + zero, outputs[0], rtol=1e-4, atol=1e-5)


# Each family's own twist, switched off in a copy: the captured row must change with it and
# still equal eager attention with it on (so we really see the clipped / windowed / capped one).
TWISTS = [
    ("olmo", {"clip_qkv": None}),
    ("olmoe", {"clip_qkv": None}),
    ("mistral", {"sliding_window": None}),
    ("qwen2", {"layer_types": ["full_attention"] * 2}),
    ("phi3", {"sliding_window": None}),
    ("gemma2", {"attn_logit_softcapping": None}),
    ("gemma2", {"query_pre_attn_scalar": 8}),
]


@pytest.mark.parametrize("arch,off", TWISTS)
def test_family_twists_stay_in_effect(arch, off, tiny_dirs, probe_batch):
    batch, baseline = probe_batch
    plain = AutoModelForCausalLM.from_pretrained(
        tiny_dirs[arch], dtype=torch.float32, attn_implementation=register_attention(), **off
    ).eval()
    cap_plain = run_probe(
        Subject(plain, Architecture.of(plain), batch, 12), PassOptions(baseline, 12), metrics_per_sequence
    )
    model = capture_model(tiny_dirs[arch])
    cap = run_probe(Subject(model, Architecture.of(model), batch, 12), PassOptions(baseline, 12), metrics_per_sequence)
    assert np.abs(cap.targets - cap_plain.targets).max() > 1e-3
    expected = eager_targets(eager_model(tiny_dirs[arch]), batch.tokens, batch.ab.numpy(), baseline)
    np.testing.assert_allclose(cap.targets, expected, rtol=1e-5, atol=1e-7)


def test_attention_that_bypasses_the_interface_stops_with_one_line(tiny_dirs, monkeypatch):
    """As remote code might: the attention layers run eager attention without asking the interface."""
    from transformers.models.llama import modeling_llama

    from emergence.core.errors import UsageError

    class EagerOnly:
        def get_interface(self, name, default):
            return modeling_llama.eager_attention_forward

    model = capture_model(tiny_dirs["llama"])
    monkeypatch.setattr(modeling_llama, "ALL_ATTENTION_FUNCTIONS", EagerOnly())
    with pytest.raises(UsageError, match="'llama' is not supported.*AttentionInterface") as err:
        Architecture.of(model)
    assert "\n" not in str(err.value)


def test_clean_metrics_match_full_logits(tiny_dirs, probe_batch):
    batch, baseline = probe_batch
    model = capture_model(tiny_dirs["gpt_neox"])
    cap = run_probe(Subject(model, Architecture.of(model), batch, 5), PassOptions(baseline, 12), metrics_per_sequence)
    with torch.no_grad():
        logits = eager_model(tiny_dirs["gpt_neox"])(batch.tokens).logits[:, -1].double()
    target = batch.b
    loss = torch.nn.functional.cross_entropy(logits, target).item()
    ranks = (logits > logits.gather(1, target[:, None])).sum(1)
    clean = dict(zip(METRICS, cap.scores.mean(0)))  # [n, metrics]: one row per sequence
    assert cap.scores.shape == (batch.n, len(METRICS))
    assert clean["loss"] == pytest.approx(loss, rel=1e-5)
    assert clean["top1"] == pytest.approx((ranks == 0).double().mean().item())
    assert clean["top5"] == pytest.approx((ranks < 5).double().mean().item())
    assert clean["logit_b"] == pytest.approx(logits.gather(1, target[:, None]).mean().item(), rel=1e-5)


def test_non_finite_attention_stops_with_a_float32_hint(tiny_dirs, probe_batch):
    batch, baseline = probe_batch
    model = capture_model(tiny_dirs["olmo"])
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.fill_(float("inf"))
    with pytest.raises(FloatingPointError, match="model.dtype=float32"):
        run_probe(Subject(model, Architecture.of(model), batch, 6), PassOptions(baseline, 12), metrics_per_sequence)


def test_a_layer_without_a_mask_or_with_attention_sinks_is_refused(tiny_dirs, monkeypatch):
    """Either would make our output differ from the model's own (non-causal, or sinks ignored)."""
    from transformers.models.llama import modeling_llama

    from emergence.core.errors import UsageError
    from emergence.recipe.capture import capture_attention

    q = k = v = torch.randn(1, 2, 4, 8)
    mask = torch.zeros(1, 1, 4, 4)
    module = torch.nn.Module()
    with pytest.raises(UsageError, match="'s_aux'"):
        capture_attention(module, q, k, v, mask, scaling=0.3, s_aux=torch.zeros(2))
    model = capture_model(tiny_dirs["llama"])
    monkeypatch.setattr(modeling_llama, "create_causal_mask", lambda **kwargs: None)
    with pytest.raises(UsageError, match="no attention mask"):
        Architecture.of(model)


def drop_our_kwargs(module, args, kwargs):
    """A forward pre-hook: the layer passes none of the forward's keyword arguments for us on (as remote code might)."""
    return args, {k: v for k, v in kwargs.items() if k not in (capture.LISTENER, capture.LAST_QUERY_ONLY)}


def test_a_layer_that_does_not_pass_the_forwards_keyword_arguments_on_is_refused(tiny_dirs, probe_batch):
    """The pass hands the attention function its state as keyword arguments of the forward: a layer
    that drops them is found missing, at discovery or, if it drops them later, in the probe pass."""
    from emergence.core.errors import UsageError

    batch, baseline = probe_batch
    model = capture_model(tiny_dirs["llama"])
    hook = model.model.layers[1].self_attn.register_forward_pre_hook(drop_our_kwargs, with_kwargs=True)
    with pytest.raises(UsageError, match="'llama' is not supported: 1 of 2 attention layers went through the capture"):
        Architecture.of(model)
    hook.remove()
    arch = Architecture.of(model)
    model.model.layers[0].self_attn.register_forward_pre_hook(drop_our_kwargs, with_kwargs=True)
    with pytest.raises(UsageError, match="'llama' is not supported: 1 of 2 attention layers went through the capture"):
        run_probe(Subject(model, arch, batch, 6), PassOptions(baseline, 12), None)  # stopped before anything is scored


def test_the_capture_registers_nothing_on_import():
    """transformers knows our attention only once a loader asks for it (``register_attention``)."""
    code = (
        "import emergence.recipe.capture, emergence.hub.checkpoints\n"
        "from transformers import AttentionInterface\n"
        "from transformers.masking_utils import AttentionMaskInterface\n"
        "name = emergence.recipe.capture.ATTN_IMPLEMENTATION\n"
        "assert name not in AttentionInterface._global_mapping, 'registered on import'\n"
        "assert name not in AttentionMaskInterface._global_mapping, 'registered on import'\n"
        "register = emergence.recipe.capture.register_attention\n"
        "assert register() == register() == name\n"
        "assert AttentionInterface._global_mapping[name] is emergence.recipe.capture.capture_attention\n"
    )
    run_fresh(code)
