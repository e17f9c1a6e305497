"""The report's figures read at a glance: a token axis starts at 0 tokens, and every panel says
what its lines are (a legend or a y-label naming the quantity)."""

import dataclasses

import numpy as np
import pytest

from emergence.panel import figures
from emergence.panel.findings import panel_findings
from emergence.panel.records import Milestone, TokenAxis, Transition
from emergence.panel.runs import Checkpoint, Trajectory
from emergence.panel.sensitivity import dense
from emergence.recipe.screen import CLASSES

TOKENS = (0.0, 1e6, 1e7, 1e8)  # a panel that starts at step 0, as the toy panels do


def trajectory() -> Trajectory:
    """2 layers x 2 heads: an induction circuit from the third revision, a BOS head at the last."""
    ind, bos = CLASSES.index("induction"), CLASSES.index("bos")
    sels = np.ones((len(TOKENS), 2, 2, 6))
    sels[2:, 1, 0, ind] = 60
    sels[3, 1, 1, ind] = 80
    sels[3, 0, 1, bos] = 40
    prs = np.ones((len(TOKENS), 2, 2))
    prs[1:, 1, 0] = 3.0
    return Trajectory("toy", [Checkpoint(f"r{i}", t, sels[i], prs[i]) for i, t in enumerate(TOKENS)], "pr")


def transition(measure: str, probe: str, values: list[float]) -> Transition:
    return Transition(
        measure,
        probe,
        [f"r{i}" for i in range(len(TOKENS))],
        list(TOKENS),
        values,
        ["r1", "r2"],
        values[2] - values[1],
        Milestone("r2", TOKENS[2], [TOKENS[1], TOKENS[2]]),
    )


@pytest.fixture()
def drawn(monkeypatch, tmp_path):
    """Every figure of a one-model panel with a token axis and a causal-threshold sweep, by file name."""
    made = {}
    save = figures._save

    def keep(fig, path):
        made[path.name] = fig
        return save(fig, path)

    monkeypatch.setattr(figures, "_save", keep)
    traj = trajectory()
    axis = TokenAxis(
        ["synthetic", "text"],
        [
            transition("icl_score", "synthetic", [0.0, 0.1, 1.2, 1.4]),
            transition("icl_score", "text", [0.0, 0.2, 0.9, 1.0]),
            transition("massive_activation_ratio", "synthetic", [3.0, 5.0, 40.0, 60.0]),
        ],
        {
            "induction_onset (synthetic)": Milestone("r2", TOKENS[2], [TOKENS[1], TOKENS[2]]),
            "bos_50 (text)": Milestone("r3", TOKENS[3], [TOKENS[2], TOKENS[3]]),
        },
        [],
        [],
    )
    findings = dataclasses.replace(panel_findings({"toy": traj}, 30, 50, intervals=False), token_axis={"toy": axis})
    points = [
        {
            "threshold": t,
            "circuit": ["L1H0"],
            "circuit_loss_increase": rise,
            "controls_loss_increase_mean": 0.01,
            "causal": causal,
        }
        for t, rise, causal in ((20, 0.05, False), (50, 0.8, True))
    ]
    sweep = {"model": "toy", "revision": "r3", "tokens": TOKENS[3], "causal_factor": 10, "points": points, "t_star": 50}
    figures.bos_vs_tokens(findings, tmp_path)
    figures.recall_vs_tokens(findings, tmp_path)
    figures.trajectories(findings, tmp_path)
    figures.token_axis(findings, tmp_path)
    figures.sensitivity([dense(traj)], 30, 50, tmp_path)
    figures.causal_threshold([sweep], tmp_path)
    figures.bos_heatmap("toy", findings.models["toy"], tmp_path)
    figures.head_trajectories("toy", findings.models["toy"], tmp_path)
    return made


def panels(fig):
    """The figure's plotting axes, without its colorbars (whose label names the colour's quantity)."""
    bars = {a for a in fig.axes if hasattr(a, "_colorbar")}
    return [a for a in fig.axes if a not in bars]


def test_every_figure_is_drawn(drawn):
    assert set(drawn) == {
        "bos_fraction_vs_tokens.png",
        "recall_vs_tokens.png",
        "trajectories.png",
        "token_axis.png",
        "sensitivity.png",
        "causal_threshold.png",
        "bos_per_layer_toy.png",
        "induction_heads_toy.png",
    }


def test_a_token_axis_starts_at_zero_tokens(drawn):
    token_axes = [
        ax
        for fig in drawn.values()
        for ax in panels(fig)
        if any(s.get_xlabel() == "training tokens" for s in ax.get_shared_x_axes().get_siblings(ax))
    ]
    assert len(token_axes) >= 8
    for ax in token_axes:
        low = ax.get_xlim()[0]
        assert low == 0, (ax.get_figure().axes.index(ax), low)
        assert min(ax.get_xticks()[(ax.get_xticks() >= low) & (ax.get_xticks() <= ax.get_xlim()[1])]) >= 0


def test_every_panel_says_what_its_lines_are(drawn):
    for name, fig in drawn.items():
        for ax in panels(fig):
            assert ax.get_legend() is not None or ax.get_ylabel(), (name, ax.get_title())
        for bar in set(fig.axes) - set(panels(fig)):
            assert bar.get_ylabel(), name  # a colorbar names its quantity
