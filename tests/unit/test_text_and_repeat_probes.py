"""The repeat and text probes (docs/probes.md): their batches, Olsson et al.'s scores and the
text probe's sinks and mechanism, against the models' own losses and eager attention."""

import json
import shutil

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from emergence.core.config import compose_config
from emergence.main import analyse
from emergence.recipe.probe import PAIR_START, RepeatLayout, make_repeat_batch, make_text_batch
from emergence.run.results import PER_SEQUENCE_FILE, read_run
from tests.helpers.cli import last_line, run_cli
from tests.helpers.reference_impl import eager_model, eager_residual_and_values, eager_sink_importance

ARCHS = ("llama", "gpt_neox", "olmo2", "gemma2")
WORDS = [f"w{i}" for i in range(300)]  # the corpus's words: ids 3.. in the test tokenizer
T = 64
ICL = [5, 50]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple:
    """A jsonl corpus of 200 documents drawn from a Zipf-like law over 300 words (so that a
    window's last word has often occurred in its first half, as in natural text), and a
    word-level tokenizer over them with BOS and EOS, built with the ``tokenizers`` library."""
    root = tmp_path_factory.mktemp("corpus")
    rs = np.random.RandomState(0)
    weights = 1 / np.arange(1, len(WORDS) + 1)
    docs = [" ".join(rs.choice(WORDS, size=rs.randint(20, 120), p=weights / weights.sum())) for _ in range(200)]
    path = root / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    return path, docs, fast, vocab


@pytest.fixture(scope="module")
def text_models(tiny_dirs, corpus, tmp_path_factory) -> dict:
    """The tiny models with the test tokenizer saved beside their weights."""
    root = tmp_path_factory.mktemp("text_models")
    dirs = {}
    for arch in ARCHS:
        dirs[arch] = root / arch
        shutil.copytree(tiny_dirs[arch], dirs[arch])
        corpus[2].save_pretrained(dirs[arch])
    return dirs


def text_overrides(model_dir, source: str, n=16) -> list[str]:
    """A text-probe run of the model in ``model_dir`` on ``source`` (``probe.text_file=...`` or
    ``probe.dataset=...``)."""
    return [
        "model=local",
        f"model.name_or_path={model_dir}",
        "model.dtype=float32",
        "probe=text",
        source,
        f"probe.n_sequences={n}",
        f"probe.seq_len={T}",
        f"probe.icl_positions=[{ICL[0]},{ICL[1]}]",
        "probe.loss_curve=all",
        "probe.batch_size=8",
        "wandb.mode=disabled",
        "ablate.enabled=false",
        "reuse=false",
    ]


def test_repeat_batch_is_a_span_and_its_copy():
    for seq_len in (64, 65):
        layout = RepeatLayout(seq_len)
        batch = make_repeat_batch(5, seq_len, 10, 500, 42)
        span, copy = batch.tokens[:, layout.prefix : layout.copy_start], batch.tokens[:, layout.copy_start :]
        assert layout.prefix + 2 * layout.span == seq_len and layout.span == (seq_len - 1) // 2
        assert torch.equal(span, copy)
        assert (batch.ab == layout.copy_start - 1).all() and torch.equal(batch.a, batch.tokens[:, -1])
        assert torch.equal(batch.tokens[torch.arange(5), batch.ab], batch.a)  # A occurred at ab
        assert torch.equal(batch.b, batch.tokens[:, layout.copy_start])  # B follows it
        assert torch.equal(make_repeat_batch(5, seq_len, 10, 500, 42).tokens, batch.tokens)  # seeded


def test_text_batch_windows_are_consecutive_pieces_of_the_stream_ending_in_a_repeated_token():
    rs = np.random.RandomState(1)
    stream = rs.randint(3, 40, size=20_000)
    batch = make_text_batch(stream, 30, T, 7, bos=1)
    for window, ab in zip(batch.tokens.numpy(), batch.ab.numpy()):
        assert window[0] == 1  # the tokenizer's BOS, then T-1 tokens of the stream
        starts = [s for s in range(0, len(stream) - T + 2, T - 1) if np.array_equal(stream[s : s + T - 1], window[1:])]
        assert len(starts) == 1  # one of the consecutive windows
        earlier = [p for p in range(PAIR_START, T // 2) if window[p] == window[-1]]
        assert earlier and ab == max(earlier)
    assert torch.equal(batch.b, batch.tokens[torch.arange(30), batch.ab + 1])
    assert torch.equal(make_text_batch(stream, 30, T, 7, bos=1).tokens, batch.tokens)
    assert not torch.equal(make_text_batch(stream, 30, T, 8, bos=1).tokens, batch.tokens)
    with pytest.raises(ValueError, match="fewer than the 400 asked for"):
        make_text_batch(stream, 400, T, 7, bos=1)


@pytest.mark.parametrize("arch", ARCHS)
def test_text_probe_losses_icl_score_sinks_and_mechanism_equal_the_models_own(arch, text_models, corpus, tmp_path):
    text_file, docs, tokenizer, _ = corpus
    summary = analyse(compose_config(text_overrides(text_models[arch], f"probe.text_file={text_file}")), tmp_path)
    _, rows = read_run(tmp_path)
    with np.load(tmp_path / PER_SEQUENCE_FILE) as saved:
        tokens, losses = torch.from_numpy(saved["tokens"]), saved["position_losses"]
    assert tokens.shape == (16, T) and losses.shape == (16, T - 1)
    import hashlib

    assert summary.probe.fingerprint == hashlib.sha256(tokens.numpy().astype(np.int64).tobytes()).hexdigest()
    # the windows are the corpus, tokenized with the checkpoint's tokenizer (BOS first)
    stream = " ".join(docs)
    assert (tokens[:, 0] == tokenizer.bos_token_id).all()
    assert tokenizer.decode(tokens[0, 1:].tolist()).replace("</s>", " ").split()[0] in stream.split()

    model = eager_model(text_models[arch])
    with torch.no_grad():
        for i in range(len(tokens)):  # the model's own loss: its mean over the sequence's tokens
            own = model(tokens[i : i + 1], labels=tokens[i : i + 1]).loss
            assert losses[i].mean() == pytest.approx(float(own), rel=1e-5)
        log_probs = torch.log_softmax(model(tokens).logits.double(), dim=-1)
    nll = -log_probs[:, :-1].gather(2, tokens[:, 1:, None])[..., 0].numpy()  # [n, T-1]: position p at column p-1
    icl = summary.measures["icl"]
    assert icl["icl_score"] == pytest.approx((nll[:, ICL[1] - 1] - nll[:, ICL[0] - 1]).mean(), rel=1e-4, abs=1e-5)
    assert icl["icl_score_ci"][0] <= icl["icl_score"] <= icl["icl_score_ci"][1]
    assert icl["loss_by_position"][0] is None
    np.testing.assert_allclose(icl["loss_by_position"][1:], nll.mean(0), rtol=1e-4)
    assert icl["source"] == str(text_file) and icl["tokenizer"].startswith(str(text_models[arch]))
    assert set(summary.measures["repeat_loss"].values()) == {None}  # a repeat-probe measure

    importance = eager_sink_importance(model, tokens)  # Sink_eps on text, eager attention's
    assert abs(summary.measures["sink_importance"]["fraction"] - (importance > 0.3).mean()) <= 1 / importance.size
    hidden, values = eager_residual_and_values(text_models[arch], arch, tokens)
    for record, h in zip(summary.measures["massive_activations"]["layers"], hidden):
        flat = np.sort(np.abs(h).reshape(len(h), -1), axis=1)
        assert record["ratio"] == pytest.approx(np.abs(h).max() / flat[:, (flat.shape[1] - 1) // 2].mean(), rel=1e-5)
    n_rep = 4 // values[0].shape[1]
    for r in rows:
        norms = np.linalg.norm(values[r["layer"]][:, r["head"] // n_rep], axis=-1)  # [n, T]
        assert r["value_norm_ratio"] == pytest.approx(norms[:, 0].mean() / norms[:, 1:].mean(), rel=1e-5)
        assert np.isnan(r["prefix_matching"])  # a repeat-probe measure


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_matching_and_loss_drop_equal_eager_attention_and_the_models_losses(arch, tiny_dirs, tmp_path):
    seq_len = 65
    summary = analyse(
        compose_config(
            [
                "model=local",
                f"model.name_or_path={tiny_dirs[arch]}",
                "model.dtype=float32",
                "probe=repeat",
                "probe.n_sequences=12",
                f"probe.seq_len={seq_len}",
                "probe.vocab_low=10",
                "probe.vocab_high=500",
                "probe.batch_size=5",
                "wandb.mode=disabled",
                "ablate.enabled=false",
                "reuse=false",
            ]
        ),
        tmp_path,
    )
    _, rows = read_run(tmp_path)
    layout = RepeatLayout(seq_len)
    batch = make_repeat_batch(12, seq_len, 10, 500, 42)
    model = eager_model(tiny_dirs[arch])
    with torch.no_grad():
        out = model(batch.tokens, output_attentions=True)
    copy = np.arange(layout.copy_start, seq_len)  # each token of the copy reads the one after its first occurrence
    for r in rows:
        pattern = out.attentions[r["layer"]][:, r["head"]].numpy()  # [n, T, T]
        expected = pattern[:, copy, copy - layout.span + 1].mean()
        assert r["prefix_matching"] == pytest.approx(expected, rel=1e-5, abs=1e-7)
    nll = -torch.log_softmax(out.logits.double(), -1)[:, :-1].gather(2, batch.tokens[:, 1:, None])[..., 0].numpy()
    first = nll[:, layout.prefix : layout.copy_start - 1].mean(1)  # predicted positions prefix+1 .. copy_start-1
    later = nll[:, layout.copy_start :].mean(1)  # copy_start+1 .. T-1
    repeat = summary.measures["repeat_loss"]
    assert repeat["span"] == layout.span
    assert repeat["loss_drop"] == pytest.approx((first - later).mean(), rel=1e-4, abs=1e-5)
    assert repeat["first_copy_loss"] == pytest.approx(first.mean(), rel=1e-5)
    assert repeat["later_copy_loss"] == pytest.approx(later.mean(), rel=1e-5)
    assert repeat["loss_drop_ci"][0] <= repeat["loss_drop"] <= repeat["loss_drop_ci"][1]
    assert set(summary.measures["icl"].values()) == {None}  # a text-probe measure


def test_a_model_that_learned_to_copy_has_prefix_matching_heads_and_a_positive_loss_drop(
    toy_panel, tmp_path, monkeypatch
):
    """The trained toy panel's last checkpoint copies repeated spans (its training repeats them)."""
    monkeypatch.setenv("EMERGENCE_CACHE", toy_panel[1]["EMERGENCE_CACHE"])
    run = analyse(
        compose_config(
            [
                "model=toy_neox",
                "revision=final",
                "probe=repeat",
                "probe.n_sequences=64",
                "wandb.mode=disabled",
                "ablate.enabled=false",
                "reuse=false",
            ]
        ),
        tmp_path,
    )
    _, rows = read_run(tmp_path)
    assert run.measures["repeat_loss"]["loss_drop"] > 1.0  # nats: the copy is predicted
    assert max(r["prefix_matching"] for r in rows) > 0.3


def test_text_probe_reads_a_local_dataset_and_a_text_file_with_bytes(text_models, corpus, tmp_path, monkeypatch):
    text_file, docs, _, _ = corpus
    folder = tmp_path / "local_dataset"
    folder.mkdir()
    shutil.copy(text_file, folder / "train.jsonl")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets_cache"))
    model = text_models["llama"]
    from_dataset = analyse(compose_config(text_overrides(model, f"probe.dataset={folder}")), tmp_path / "dataset")
    from_file = analyse(compose_config(text_overrides(model, f"probe.text_file={text_file}")), tmp_path / "file")
    assert from_dataset.probe.fingerprint == from_file.probe.fingerprint  # the same documents, the same batch
    txt = tmp_path / "book.txt"
    txt.write_text("\n".join(docs))
    as_bytes = analyse(
        compose_config([*text_overrides(model, f"probe.text_file={txt}"), "probe.tokenizer=bytes"]), tmp_path / "bytes"
    )
    with np.load(tmp_path / "bytes" / PER_SEQUENCE_FILE) as saved:
        window = saved["tokens"][0]
    assert bytes(window.astype(np.uint8).tolist()).decode("utf-8", errors="ignore") in txt.read_text()
    assert as_bytes.measures["icl"]["tokenizer"] == "bytes"


@pytest.mark.slow
@pytest.mark.parametrize(
    "source, extra, names",
    [
        ("probe.dataset=nobody/no-such-dataset", [], ["nobody/no-such-dataset", "offline"]),
        ("probe.text_file=FILE", [f"probe.seq_len={ICL[1]}"], ["probe.seq_len", str(ICL[1])]),
        ("probe.text_file=FILE", ["probe.column=body"], ["probe.column='body'", "text"]),
        ("probe.dataset=LOCAL", ["probe.column=body"], ["probe.column='body'", "text, id"]),
    ],
    ids=["dataset-offline", "seq-len-short-of-icl", "column-missing-in-file", "column-missing-in-dataset"],
)
def test_bad_text_probe_input_is_one_line_exit_2_and_no_run_directory(
    source, extra, names, text_models, corpus, tmp_path
):
    folder = tmp_path / "local_dataset"
    folder.mkdir()
    shutil.copy(corpus[0], folder / "train.jsonl")
    source = source.replace("FILE", str(corpus[0])).replace("LOCAL", str(folder))
    run_dir = tmp_path / "run"
    done = run_cli(
        *text_overrides(text_models["llama"], source),
        *extra,
        f"hydra.run.dir={run_dir}",
        env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "datasets_cache")},
    )
    assert done.returncode == 2, done.stderr[-2000:]
    line = last_line(done.stderr)
    assert line.startswith("error: ") and all(name in line for name in names), line
    assert "Traceback" not in done.stderr and not run_dir.exists()


def test_the_toy_panels_report_times_the_icl_score_and_the_mechanism_beside_the_milestones(toy_panel, corpus, tmp_path):
    """The toy panel on a text file read as bytes (``probe.tokenizer=bytes``) beside its synthetic
    sweep: the report puts the ICL score's transition, the mechanism's trajectories and both
    probes' milestones on one token axis."""
    sweep, env = toy_panel
    book = tmp_path / "book.txt"
    book.write_text("\n".join(corpus[1]))
    text_sweep = tmp_path / "text"
    done = run_cli(
        "-m",
        "model=toy_neox",
        "revision=glob(r*)",
        "probe=text",
        f"probe.text_file={book}",
        "probe.tokenizer=bytes",
        "probe.seq_len=128",
        "probe.icl_positions=[10,100]",
        "probe.n_sequences=96",
        "ablate.enabled=false",
        f"hydra.sweep.dir={text_sweep}",
        env=env,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = tmp_path / "report"
    done = run_cli(sweep, text_sweep, "--out", report, module="emergence.report", env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    findings = json.loads((report / "findings.json").read_text())
    axis = findings["token_axis"]["toy_neox"]
    assert axis["probes"] == ["synthetic", "text"]
    transitions = {(t["measure"], t["probe"]): t for t in axis["transitions"]}
    icl = transitions[("icl_score", "text")]
    assert len(icl["values"]) == 10 and icl["jump"] < 0  # the context comes to help: the score falls
    assert icl["half_way"]["revision"] in icl["revisions"]
    for probe in ("synthetic", "text"):
        assert len(transitions[("massive_activation_ratio", probe)]["values"]) == 10
        assert len(transitions[("value_norm_ratio_min", probe)]["values"]) == 10
        assert f"induction_onset ({probe})" in axis["events"] and f"sink_50 ({probe})" in axis["events"]
    assert axis["events"]["induction_onset (synthetic)"]["revision"] is not None
    assert axis["events"]["icl_score (text)"] == icl["half_way"]
    assert len(axis["sinks"]) == 10
    assert any(
        s["earlier"].startswith("induction_onset") or s["later"].startswith("induction_onset")
        for s in axis["separations"]
    )
    text = (report / "report.md").read_text()
    assert "## toy_neox: measures on one token axis" in text and "icl_score (text)" in text
    assert "token_axis.png" in findings["figures"] and (report / "token_axis.png").stat().st_size > 0


def test_a_checkpoint_without_a_tokenizer_is_told_to_read_bytes(tiny_dirs, corpus, tmp_path):
    from emergence.core.errors import UsageError

    with pytest.raises(UsageError, match="has no tokenizer.*probe.tokenizer=bytes"):
        analyse(compose_config(text_overrides(tiny_dirs["llama"], f"probe.text_file={corpus[0]}")), tmp_path)
    assert not (tmp_path / "summary.json").exists()
