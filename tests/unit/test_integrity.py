"""The branch check's verdicts on hand-made listings (``integrity.verdicts``), and its store: a
relaunched sweep lists only branches it has not seen. Against the Hub twin: test_hub_families.py."""

from emergence.hub import integrity
from emergence.hub.integrity import BranchFiles, check, stored_verdicts, verdicts
from emergence.hub.weights import fingerprint


def listing(step, files, model_type="gpt_neox"):
    return BranchFiles(step, files, model_type)


def test_identical_weights_belong_to_the_latest_branch_holding_them():
    listings = {
        "step0": listing(0, {"pytorch_model.bin": "a"}),
        "step1": listing(1, {"pytorch_model.bin": "a"}),
        "step2": listing(2, {"pytorch_model.bin": "b"}),
        "step9": listing(9, {"pytorch_model.bin": "b"}),
        "step5": listing(5, {"pytorch_model.bin": "c"}),
    }
    lines = {b: c.line for b, c in verdicts(listings, "gpt_neox").items()}
    assert lines == {
        "step0": "duplicate of step1",
        "step1": "ok",
        "step2": "duplicate of step9",
        "step5": "ok",
        "step9": "ok",
    }
    assert list(verdicts(listings, "gpt_neox")) == ["step0", "step1", "step2", "step5", "step9"]  # in step order
    assert not any(c.fails for c in verdicts(listings, "gpt_neox").values())


def test_a_shared_shard_no_weights_and_a_model_type_other_than_the_familys():
    shards = lambda *shas: {f"pytorch_model-0000{i}-of-00003.bin": s for i, s in enumerate(shas, 1)}  # noqa: E731
    olmo2 = lambda step, files: listing(step, files, "olmo2")  # noqa: E731
    listings = {
        "ckpt_128": olmo2(128, shards("final1", "x2", "x3")),
        "ckpt_256": olmo2(256, shards("y1", "y2", "y3")),
        "ckpt_358": olmo2(358, shards("final1", "f2", "f3")),
        "ckpt_300": olmo2(300, {}),
        "ckpt_002": listing(2, shards("z1", "z2", "z3"), model_type="olmo_1124"),
        "ckpt_004": listing(4, shards("w1", "w2", "w3"), model_type="llama"),
    }
    checks = verdicts(listings, "olmo2")
    assert checks["ckpt_128"].line == "foreign shard pytorch_model-00001-of-00003.bin from ckpt_358"
    assert checks["ckpt_358"].line == "ok" and checks["ckpt_256"].verdict == "ok"
    assert checks["ckpt_300"].line == "no weights"
    assert checks["ckpt_002"].line == "model_type olmo_1124 is not olmo2" and not checks["ckpt_002"].fails  # mapped
    assert checks["ckpt_004"].line == "model_type llama is not olmo2" and checks["ckpt_004"].fails
    assert checks["ckpt_128"].fails and checks["ckpt_300"].fails
    assert checks["ckpt_256"].weights_sha256 == fingerprint(shards("y1", "y2", "y3"))
    assert checks["ckpt_300"].weights_sha256 is None


def test_the_store_keeps_listings_so_a_relaunch_asks_only_about_new_branches(tmp_path, monkeypatch):
    asked = []

    def list_branch(repo, branch, step):
        asked.append(branch)
        return None if branch == "gone" else listing(step, {"model.safetensors": "same" if step < 3 else branch})

    monkeypatch.setattr(integrity, "list_branch", list_branch)
    store = tmp_path / "integrity.json"
    first = check("org/repo", {"step1": 1, "step2": 2, "gone": 5}, "gpt_neox", store)
    assert asked == ["step1", "step2", "gone"] and set(first) == {"step1", "step2"}  # an unlisted branch: no verdict
    second = check("org/repo", {"step1": 1, "step4": 4, "step2": 2}, "gpt_neox", store)
    assert asked[3:] == ["step4"]
    assert {b: c.line for b, c in second.items()} == {"step1": "duplicate of step2", "step2": "ok", "step4": "ok"}
    # what every job of the sweep reads: the verdicts among every branch the store keeps
    assert {b: c.line for b, c in stored_verdicts(store)["org/repo"].items()} == {
        "step1": "duplicate of step2",
        "step2": "ok",
        "step4": "ok",
    }
