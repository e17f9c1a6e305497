"""A training run as a user saves one: transformers' ``Trainer`` on a tiny Llama (2 layers, 4 heads,
context 64, vocabulary 128) on CPU, a checkpoint every ``SAVE_STEPS`` steps, token counts recorded
(``include_num_input_tokens_seen=True``). The output folder holds ``checkpoint-10/`` .. ``checkpoint-120/``
with their weights, ``trainer_state.json`` and the optimizer, scheduler and RNG states."""

from pathlib import Path

STEPS, SAVE_STEPS, BATCH, SEQ_LEN, VOCAB = 120, 10, 8, 64, 128


def tokens_at(step: int) -> int:
    """Tokens seen after ``step`` steps: every step reads BATCH sequences of SEQ_LEN ids."""
    return step * BATCH * SEQ_LEN


def train_run(
    out: Path, count_tokens: bool = True, steps: int = STEPS, save_steps: int = SAVE_STEPS, callbacks=(), report_to=()
) -> Path:
    """The run, saved under ``out``; ``callbacks`` join the ``Trainer``'s, ``report_to`` its loggers. Every
    step's loss is logged (``trainer_state.json`` ``log_history``), unrounded."""
    import torch
    from torch.utils.data import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    class Repeats(Dataset):  # each sequence a random span written twice: the copy induction heads learn
        def __init__(self, n: int):
            half = torch.randint(0, VOCAB, (n, SEQ_LEN // 2), generator=torch.Generator().manual_seed(0))
            self.ids = torch.cat([half, half], 1)

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=SEQ_LEN,
        )
    )
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        save_steps=save_steps,
        per_device_train_batch_size=BATCH,
        learning_rate=3e-3,
        report_to=list(report_to),
        use_cpu=True,
        include_num_input_tokens_seen=count_tokens,
        seed=0,
        disable_tqdm=True,
        logging_steps=1,
    )
    Trainer(model=model, args=args, train_dataset=Repeats(steps * BATCH), callbacks=list(callbacks)).train()
    return out
