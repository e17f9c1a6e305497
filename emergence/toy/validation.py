"""The toy recipe's checks, for ``python -m emergence.toy`` and for a run of a toy model."""

from emergence.core.config import LR_SCHEDULES, TOY_NUMERICS, TOY_TOKENIZERS, ToyRecipe
from emergence.core.errors import invalid


def validate_recipe(recipe: ToyRecipe) -> None:
    """The toy recipe's settings that the schema's types do not check, one line each."""
    if recipe.lr_schedule not in LR_SCHEDULES:
        raise invalid("model.toy.lr_schedule", recipe.lr_schedule, f"use one of {', '.join(LR_SCHEDULES)}")
    if not 0 <= recipe.min_lr_ratio <= 1:
        raise invalid("model.toy.min_lr_ratio", recipe.min_lr_ratio, "must be in [0, 1]: a share of model.toy.lr")
    if not 0 <= recipe.trigger_fraction < 1:
        raise invalid(
            "model.toy.trigger_fraction", recipe.trigger_fraction, "must be in [0, 1): a share of the vocabulary"
        )
    if recipe.tokenizer not in TOY_TOKENIZERS:
        raise invalid("model.toy.tokenizer", recipe.tokenizer, "use words (emergence/toy/words.py) or null (ids only)")
    if not 0 <= recipe.task_fraction <= 1:
        raise invalid("model.toy.task_fraction", recipe.task_fraction, "must be in [0, 1]: a share of each batch")
    if (recipe.task_fraction > 0) != (recipe.tokenizer is not None):
        raise invalid(
            "model.toy.task_fraction",
            recipe.task_fraction,
            f"with model.toy.tokenizer={recipe.tokenizer}: task sentences need the word tokenizer, and it "
            "needs task sentences; set both (task_fraction > 0, tokenizer=words) or neither",
        )
    if not 0 <= recipe.home_city_share <= 1:
        raise invalid("model.toy.home_city_share", recipe.home_city_share, "must be in [0, 1]: a share of the bindings")
    if recipe.save_every is not None and recipe.save_every < 1:
        raise invalid(
            "model.toy.save_every", recipe.save_every, "must be >= 1 step, or null (only the panel's checkpoints)"
        )
    if recipe.numerics not in TOY_NUMERICS:
        raise invalid(
            "model.toy.numerics",
            recipe.numerics,
            f"use one of {', '.join(TOY_NUMERICS)} (portable: the same bits on any x86 CPU with AVX2)",
        )
    if recipe.threads < 1:
        raise invalid(
            "model.toy.threads", recipe.threads, "must be >= 1: the portable training's threads (they move its bits)"
        )
