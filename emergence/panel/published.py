"""The reference study's published numbers (docs/method.md section 7), for side-by-side tables.
Token counts in billions; BOS fractions in percent."""

BOS_FRACTION = {
    "pythia": [0, 0, 0, 0, 0, 0, 10.9, 29.7, 46.1, 57.8],
    "olmo": [0, 0, 0.4, 0, 0, 7.4, 70.3, 77.7, 80.9, 80.9],
    "olmoe": [3.5, 15.6, 42.2, 43.4, 50.8, 69.9, 71.5, 73.0, 74.2, 75.8],
}
N_INDUCTION = {
    "pythia": [0, 0, 0, 0, 0, 0, 5, 4, 4, 3],
    "olmo": [0, 0, 1, 3, 2, 3, 3, 3, 2, 3],
    "olmoe": [5, 5, 6, 5, 5, 3, 3, 4, 4, 4],
}
LARGEST_JUMP_PP = {"pythia": 18.8, "olmo": 62.9, "olmoe": 26.6}
JUMP_SHARE = {"pythia": 0.33, "olmo": 0.78, "olmoe": 0.35}
SHAPE = {"pythia": "gradual", "olmo": "abrupt", "olmoe": "gradual"}
ONSET_B = {"pythia": 6.29, "olmo": 23, "olmoe": 20}
BOS_50_B = {"pythia": 299.9, "olmo": 264, "olmoe": 419}
GAP_RATIO = {"pythia": None, "olmo": 11.5, "olmoe": 21}
RECALL_67_B = {"pythia": 6.3, "olmo": 10, "olmoe": 41}
F5_LEAD = {"pythia": {"L4H4": 11.7}}
FINAL_CIRCUIT = {
    "pythia": ["L4H4", "L7H1", "L7H0"],
    "olmo": ["L2H11", "L4H12", "L12H8"],
    "olmoe": ["L5H10", "L7H0", "L9H8", "L12H14"],
}
