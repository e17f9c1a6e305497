"""Captured attention statistics and head outputs vs the model's own eager attention."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from emergence.ablation import score_logits
from emergence.capture import ATTN_IMPLEMENTATION, run_probe
from emergence.checkpoints import Architecture
from emergence.probe import baseline_positions, make_probe_batch
from reference_impl import eager_model, eager_targets, head_outputs_at_last
from tiny_models import ARCHS, VOCAB

T = 64


def capture_model(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                attn_implementation=ATTN_IMPLEMENTATION).eval()


@pytest.fixture(scope="module")
def probe_batch():
    return make_probe_batch(12, T, 10, VOCAB, 42), baseline_positions(T, 50)


@pytest.mark.parametrize("arch", ARCHS)
def test_captured_attention_equals_eager_output_attentions(arch, tiny_dirs, probe_batch):
    batch, baseline = probe_batch
    model = capture_model(tiny_dirs[arch])
    cap = run_probe(model, Architecture.of(model), batch, baseline, batch_size=5, spectral_n=12,
                    keep_position_means=False, score=score_logits)
    expected = eager_targets(eager_model(tiny_dirs[arch]), batch.tokens, batch.ab.numpy(), baseline)
    assert cap.targets.shape == expected.shape == (12, 2, 4, 7)
    np.testing.assert_allclose(cap.targets, expected, rtol=1e-5, atol=1e-7)
    assert model.config._attn_implementation == ATTN_IMPLEMENTATION  # the fast path was kept


@pytest.mark.parametrize("arch", ARCHS)
def test_spectral_sums_equal_head_outputs_from_hooks(arch, tiny_dirs, probe_batch):
    batch, baseline = probe_batch
    model = capture_model(tiny_dirs[arch])
    arch_info = Architecture.of(model)
    cap = run_probe(model, arch_info, batch, baseline, batch_size=5, spectral_n=7,
                    keep_position_means=True, score=score_logits)
    x = head_outputs_at_last(eager_model(tiny_dirs[arch]), arch, batch.tokens, arch_info.n_heads)[:7]
    gram = np.einsum("nlhd,nlhe->lhde", x, x)
    # SDPA and eager kernels differ in float32 rounding only: tolerance relative to the scale.
    np.testing.assert_allclose(cap.gram, gram, rtol=1e-4, atol=1e-5 * np.abs(gram).max())
    np.testing.assert_allclose(cap.total, x.sum(0), rtol=1e-4, atol=1e-5 * np.abs(x).max())
    assert cap.spectral_n == 7


@pytest.mark.parametrize("arch", ARCHS)
def test_head_outputs_times_output_projection_reproduce_attention_output(arch, tiny_dirs, probe_batch):
    batch, _ = probe_batch
    model = capture_model(tiny_dirs[arch])
    arch_info = Architecture.of(model)
    outputs = []
    hook = arch_info.attentions[1].register_forward_hook(lambda m, a, out: outputs.append(out[0][:, -1]))
    x = torch.from_numpy(head_outputs_at_last(model, arch, batch.tokens, arch_info.n_heads))[:, 1]
    hook.remove()
    proj = arch_info.out_projs[1]
    per_head = torch.einsum("nhd,ohd->nho", x.float(),
                            proj.weight.view(-1, arch_info.n_heads, arch_info.head_dim))
    rebuilt = per_head.sum(1) + (proj.bias if proj.bias is not None else 0)
    torch.testing.assert_close(rebuilt, outputs[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ["olmo", "olmoe"])
def test_clip_qkv_stays_in_effect(arch, tiny_dirs, probe_batch):
    batch, baseline = probe_batch
    unclipped = AutoModelForCausalLM.from_pretrained(tiny_dirs[arch], dtype=torch.float32,
                                                     attn_implementation=ATTN_IMPLEMENTATION,
                                                     clip_qkv=None).eval()
    cap_unclipped = run_probe(unclipped, Architecture.of(unclipped), batch, baseline, 12, 12, False, score_logits)
    clipped = capture_model(tiny_dirs[arch])
    assert clipped.config.clip_qkv == 0.5
    cap = run_probe(clipped, Architecture.of(clipped), batch, baseline, 12, 12, False, score_logits)
    assert np.abs(cap.targets - cap_unclipped.targets).max() > 1e-3  # the clip changes attention ...
    expected = eager_targets(eager_model(tiny_dirs[arch]), batch.tokens, batch.ab.numpy(), baseline)
    np.testing.assert_allclose(cap.targets, expected, rtol=1e-5, atol=1e-7)  # ... and we see the clipped one


def test_clean_metrics_match_full_logits(tiny_dirs, probe_batch):
    batch, baseline = probe_batch
    model = capture_model(tiny_dirs["gpt_neox"])
    cap = run_probe(model, Architecture.of(model), batch, baseline, 5, 12, False, score_logits)
    with torch.no_grad():
        logits = eager_model(tiny_dirs["gpt_neox"])(batch.tokens).logits[:, -1].double()
    target = batch.b
    loss = torch.nn.functional.cross_entropy(logits, target).item()
    ranks = (logits > logits.gather(1, target[:, None])).sum(1)
    assert cap.clean_metrics["loss"] == pytest.approx(loss, rel=1e-5)
    assert cap.clean_metrics["top1"] == pytest.approx((ranks == 0).double().mean().item())
    assert cap.clean_metrics["top5"] == pytest.approx((ranks < 5).double().mean().item())
    assert cap.clean_metrics["logit_b"] == pytest.approx(logits.gather(1, target[:, None]).mean().item(), rel=1e-5)


def test_non_finite_attention_stops_with_a_float32_hint(tiny_dirs, probe_batch):
    batch, baseline = probe_batch
    model = capture_model(tiny_dirs["olmo"])
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.fill_(float("inf"))
    with pytest.raises(FloatingPointError, match="model.dtype=float32"):
        run_probe(model, Architecture.of(model), batch, baseline, 6, 12, False, score_logits)
