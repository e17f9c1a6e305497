import pytest

from emergence.core.config import compose_config
from emergence.core.errors import UsageError
from emergence.hub.checkpoints import resolve_revision
from emergence.hub.revision_names import parse_revision_name
from emergence.hub.revisions import check_revision_name

PRESETS_WITH_PANELS = [
    "pythia",
    "olmo",
    "olmoe",
    "amber",
    "crfm_gpt2",
    "toy_neox",
    "toy_olmo",
    "toy_olmoe",
    "toy_olmo_sinks",
]


@pytest.mark.parametrize(
    "model,revision,step,tokens",
    [
        ("pythia", "r3", 64, 64 * 2_097_152),
        ("olmo", "r3", 11000, 23 * 10**9),
        ("olmoe", "r3", 50000, 209 * 10**9),
        ("pythia", "final", 143000, 143000 * 2_097_152),
        ("olmoe", "r0", 5000, 20 * 10**9),
    ],
)
def test_panel_revisions_resolve_to_branch_step_and_tokens(model, revision, step, tokens):
    cfg = compose_config([f"model={model}", f"revision={revision}"])
    rev = resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
    assert (rev.step, rev.tokens) == (step, tokens)


@pytest.mark.parametrize("model", PRESETS_WITH_PANELS)
def test_each_panel_branch_name_gives_its_listed_step_and_tokens(model):
    """A panel entry whose name disagrees with its step or tokens would misplace a checkpoint in time."""
    m = compose_config([f"model={model}"]).model
    steps = [int(e.step) for e in m.panel]
    assert len(steps) == 10 and steps == sorted(set(steps))
    for entry in m.panel:
        check_revision_name(entry.revision, m, [])  # a name the family's own naming accepts
        step, tokens = parse_revision_name(entry.revision, m.revision_pattern, m.tokens_per_step)
        assert step == entry.step, entry.revision
        if entry.revision.endswith("B"):  # the name rounds tokens down to whole billions
            assert tokens <= entry.tokens < tokens + 10**9, entry.revision
        else:
            assert tokens == entry.tokens, entry.revision


def test_custom_revisions_parse_tokens():
    cfg = compose_config(["model=pythia", "revision=custom", "revision.name=step2000"])
    rev = resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
    assert (rev.step, rev.tokens) == (2000, 2000 * 2_097_152)
    cfg = compose_config(["model=olmo", "revision=custom", "revision.name=step20000-tokens42B"])
    rev = resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
    assert (rev.step, rev.tokens) == (20000, 42 * 10**9)
    assert parse_revision_name("main", None, None) == (None, None)


@pytest.mark.parametrize(
    "model,name,nearest",
    [
        ("pythia", "step999", "step512, step1000"),
        ("pythia", "step144000", "step142000, step143000"),
        ("olmo", "step11000", "step11000-tokens23B"),
        ("olmoe", "main-ish", "step5000-tokens20B"),
        ("amber", "ckpt_360", "ckpt_357, ckpt_358"),
        ("amber", "ckpt_12", "ckpt_(?P<step>"),
        ("crfm_gpt2", "checkpoint-95", "checkpoint-90, checkpoint-100"),
        ("crfm_gpt2", "checkpoint-20500", "checkpoint-20000, checkpoint-21000"),
        ("smollm2", "step1000", "step-(?P<step>"),
        ("olmo2", "step1000-tokens3B", "stage1-step(?P<step>"),
    ],
)
def test_malformed_custom_revisions_name_the_nearest_valid_ones(model, name, nearest):
    cfg = compose_config([f"model={model}", "revision=custom", f"revision.name={name}"])
    with pytest.raises(UsageError) as err:
        resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
    assert name in str(err.value) and nearest in str(err.value) and "\n" not in str(err.value)


def test_pythia_names_accept_exactly_the_published_branches():
    from tests.unit.test_revisions import PYTHIA_BRANCHES  # the repo's branch listing

    pythia = compose_config(["model=pythia"]).model
    for name in PYTHIA_BRANCHES[1:]:  # all but main
        check_revision_name(name, pythia, [])
    for name in ("step3", "step768", "step999", "step1500", "step143001", "step144000", "stepX"):
        with pytest.raises(UsageError, match=name):
            check_revision_name(name, pythia, [])


@pytest.mark.parametrize(
    "model,revision,name,step,tokens",
    [
        ("amber", "r9", "ckpt_358", 358, 358 * 3_500_000_000),
        ("crfm_gpt2", "r0", "checkpoint-10", 10, None),
        ("crfm_gpt2", "final", "checkpoint-400000", 400000, None),
    ],
)
def test_new_preset_panels(model, revision, name, step, tokens):
    cfg = compose_config([f"model={model}", f"revision={revision}"])
    rev = resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
    assert (rev.name, rev.step, rev.tokens) == (name, step, tokens)


def test_index_out_of_range():
    cfg = compose_config(["model=olmo", "revision=r9"])
    cfg.revision.index = 12
    with pytest.raises(UsageError, match="r0..r9"):
        resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)


def test_pythia_refuses_float16_unless_forced():
    from emergence.run.validation import validate

    cfg = compose_config(["model=pythia", "model.dtype=float16"])
    with pytest.raises(UsageError, match="underflows in float16"):
        validate(cfg)
    validate(compose_config(["model=pythia", "model.dtype=float16", "model.force_dtype=true"]))
    validate(compose_config(["model=olmo", "model.dtype=float16"]))


def test_weight_bytes_counts_parameters_without_allocating(tiny_dirs):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from emergence.hub.checkpoints import check_memory, weight_bytes

    config = AutoConfig.from_pretrained(tiny_dirs["olmoe"])
    n = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_dirs["olmoe"]).parameters())
    assert weight_bytes(config, torch.bfloat16) == 2 * n
    assert check_memory(config, torch.float32, torch.device("cpu")) == 4 * n
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = 8192, 28672, 400  # ~300B params
    config.num_experts = 64
    with pytest.raises(UsageError, match="GiB"):
        check_memory(config, torch.float32, torch.device("cpu"))


def test_auto_batch_size_scales_with_free_memory():
    import torch
    from transformers import GPTNeoXConfig

    from emergence.hub.checkpoints import auto_batch_size

    cfg = GPTNeoXConfig(
        vocab_size=50304, hidden_size=2048, num_hidden_layers=16, num_attention_heads=8, intermediate_size=8192
    )
    small = auto_batch_size(2 * 2**30, 256, cfg, torch.bfloat16)
    large = auto_batch_size(80 * 2**30, 256, cfg, torch.bfloat16)
    assert 1 <= small < large <= 512
    mid = auto_batch_size(16 * 2**30, 256, cfg, torch.bfloat16)
    assert auto_batch_size(16 * 2**30, 256, cfg, torch.float32) < mid  # wider dtype, fewer sequences
    assert auto_batch_size(0, 256, cfg, torch.bfloat16) == 1


def test_attention_support_is_decided_by_the_model_class_capability():
    from transformers import BloomConfig, FalconConfig, Gemma2Config, GPT2Config, LlamaConfig

    from emergence.hub.checkpoints import check_attention_support

    for config in (LlamaConfig(), Gemma2Config(), GPT2Config()):
        check_attention_support(config, trust_remote_code=False)
    for config in (BloomConfig(), FalconConfig()):  # their attention bypasses AttentionInterface
        with pytest.raises(UsageError, match=f"'{config.model_type}' is not supported.*tested: .*llama"):
            check_attention_support(config, trust_remote_code=False)
    # remote code brings its own class: the discovery pass after loading decides
    remote = BloomConfig(auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    check_attention_support(remote, trust_remote_code=True)
    with pytest.raises(UsageError):
        check_attention_support(remote, trust_remote_code=False)


@pytest.mark.parametrize(
    "override,field",
    [
        ("model.revision_pattern='step(\\d+'", "model.revision_pattern"),
        ("model.revision_pattern='step\\d+'", "model.revision_pattern"),  # no step group
        ("model.published_steps=[{first: 1, last: 512, factor: 1}]", "model.published_steps"),
        ("model.published_steps=[{first: 10, last: 5, every: 1}]", "model.published_steps"),
    ],
)
def test_bad_revision_naming_in_a_preset_is_one_line(override, field):
    from emergence.run.validation import validate

    with pytest.raises(UsageError, match=field) as err:
        validate(compose_config(["model=pythia", override]))
    assert "\n" not in str(err.value)
