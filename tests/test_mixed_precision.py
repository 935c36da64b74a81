"""bf16 mixed precision as a user turns it on (`TrainingArguments(bf16=True)`: autocast on the CPU): training reaches
the loss fp32 training reaches. How much faster it is depends on the CPU's bf16 units; benchmarks/bench_train.py
measures that, tests never time anything."""

from pathlib import Path

import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments, default_data_collator

from turner_tfm import TurnerForCausalLM

from .tiny import text_config


def arithmetic_sequences(count: int = 64, length: int = 32) -> Dataset:
    """Sequences that count up in steps of 7 (mod 96) from a random start: learnable from the previous token."""
    starts = torch.randint(0, 96, (count, 1), generator=torch.Generator().manual_seed(0))
    ids = ((starts + 7 * torch.arange(length)) % 96 + 3).tolist()
    return Dataset.from_dict({"input_ids": ids, "labels": ids})


def train(bf16: bool, data: Dataset, output_dir: Path) -> tuple[list[float], float]:
    """40 steps of the Trainer from the same initial weights; the logged losses, then the fp32 loss on the data."""
    torch.manual_seed(0)
    model = TurnerForCausalLM(text_config())
    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=40,
        learning_rate=1e-2,
        warmup_steps=0,
        per_device_train_batch_size=8,
        bf16=bf16,
        use_cpu=True,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator)
    trainer.train()
    model.eval()
    with torch.no_grad():
        ids = torch.tensor(data["input_ids"])
        final_loss = model(input_ids=ids, labels=ids).loss.item()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry], final_loss


def test_bf16_training_reaches_the_fp32_loss(tmp_path: Path) -> None:
    data = arithmetic_sequences()
    fp32_curve, fp32_loss = train(False, data, tmp_path / "fp32")
    bf16_curve, bf16_loss = train(True, data, tmp_path / "bf16")
    assert bf16_curve != fp32_curve, "autocast did not change a single rounding: bf16 was not used"
    assert fp32_loss < fp32_curve[0] / 2, f"fp32 did not learn: {fp32_curve}, final {fp32_loss:.3f}"
    assert abs(bf16_loss - fp32_loss) < 0.05, f"bf16 ended at {bf16_loss:.3f} nats, fp32 at {fp32_loss:.3f}"
