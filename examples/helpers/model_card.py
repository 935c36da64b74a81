"""What a training script reports once it has trained: the loss curve in one line, the held-out scores with a
pipeline's answers on a few examples, and the saved folder's model card (`turner_tfm.cards`) filled with how the run
went. With `--push_to_hub`, the `Trainer` uploads the folder with a card of its own (`Trainer.push_to_hub` always
writes one); `save_with_card` then uploads this card over it.
"""

import importlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import Pipeline, PreTrainedModel, Trainer, set_seed

from turner_tfm.cards import write_model_card

from .distributed import announce, pipeline_of


def loss_curve(trainer: Trainer) -> list[tuple[int, float]]:
    """(step, training loss) for every logged step."""
    return [(entry["step"], entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]


def print_loss_curve(trainer: Trainer, points: int = 8) -> None:
    """One line that shows the training loss falling, from the first logged step to the last."""
    curve = loss_curve(trainer)
    if not curve or not trainer.is_world_process_zero():
        return
    picks = sorted({round(i * (len(curve) - 1) / max(points - 1, 1)) for i in range(points)})
    print("training loss: " + " -> ".join(f"{curve[i][1]:.2f} (step {curve[i][0]})" for i in picks))


def held_out_perplexity(trainer: Trainer) -> dict[str, float]:
    """A language model's held-out loss (nats per token) and perplexity, as the model card's results."""
    eval_loss = trainer.evaluate()["eval_loss"]
    return {"eval_loss": eval_loss, "perplexity": math.exp(eval_loss)}


def evaluate_and_sample(trainer: Trainer, prompt: str, max_new_tokens: int) -> dict[str, float]:
    """What a causal language model reports once trained: its `held_out_perplexity` (returned), and `prompt`
    continued by `pipeline("text-generation")` (top-10 sampling from --seed). Every process runs it: a sharded
    model's forward pass needs them all."""
    results = held_out_perplexity(trainer)
    set_seed(trainer.args.seed)
    generator = pipeline_of("text-generation", trainer.model, tokenizer=trainer.processing_class)
    sample = generator(prompt, max_new_tokens=max_new_tokens, do_sample=True, top_k=10)[0]["generated_text"]
    announce(f"held-out loss {results['eval_loss']:.3f} nats/token, perplexity {results['perplexity']:.2f}")
    announce(f"\nsample from pipeline('text-generation'):\n{sample}\n")
    return results


def evaluate_and_classify(
    trainer: Trainer, classify: Pipeline, examples: list, show: Callable[[Any], str], **call: object
) -> dict[str, float]:
    """What a classifier of whole texts or images reports once trained: its accuracy on the held-out set (returned),
    and the label the pipeline `classify` (called with `call`) gives each of `examples`, written as `show(example)`.
    Every process runs it: a sharded model's forward pass needs them all."""
    results = {"accuracy": trainer.evaluate()["eval_accuracy"]}
    predicted = classify(examples, top_k=1, **call)
    lines = [
        f"  {show(example)} -> {guess[0]['label']} ({guess[0]['score']:.2f})"
        for example, guess in zip(examples, predicted, strict=True)
    ]
    announce(
        f"test accuracy: {results['accuracy']:.4f} on {len(trainer.eval_dataset)} held-out examples\n\n"
        f"pipeline({classify.task!r}):\n" + "\n".join(lines) + "\n"
    )
    return results


def count_parameters(model: PreTrainedModel) -> int:
    """Distinct trainable and frozen parameters (tied weights once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def device_name(device: torch.device) -> str:
    """The hardware a process trained on, for the card: the CPU, a CUDA GPU by name, XLA with the device torch_xla
    runs on (`TPU`, `CPU`, ...), any other device by its type."""
    if device.type == "cpu":
        return "CPU"
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "xla":  # torch_xla made the device, so it is there; by name, as the examples extra lacks it
        return f"XLA ({importlib.import_module('torch_xla.runtime').device_type()})"
    return device.type.upper()


def train_seconds(trainer: Trainer) -> float:
    """Seconds the last `trainer.train()` took, as the Trainer logged them when it finished."""
    return next(entry["train_runtime"] for entry in reversed(trainer.state.log_history) if "train_runtime" in entry)


def run_summary(trainer: Trainer, train_runtime: float) -> dict[str, object]:
    """How the model was trained, as rows of the model card's training table."""
    args, state = trainer.args, trainer.state
    device = device_name(args.device)
    curve = loss_curve(trainer)
    optimizer, schedule = (getattr(v, "value", v) for v in (args.optim, args.lr_scheduler_type))
    return {
        "optimiser steps": state.global_step,
        "epochs": f"{state.epoch:.2f}",
        "batch size": f"{args.per_device_train_batch_size} per process x {args.world_size} process(es) x "
        f"{args.gradient_accumulation_steps} accumulation",
        "learning rate": f"{args.learning_rate:g}, {schedule} schedule, warm-up {args.warmup_steps:g}",
        "optimiser": f"{optimizer}, weight decay {args.weight_decay:g}",
        "hardware": f"{args.world_size} x {device} ({torch.get_num_threads()} threads per process)",
        "parallelism": parallelism(trainer),
        "training time": f"{train_runtime:.0f} s",
        "final training loss": f"{curve[-1][1]:.4f}" if curve else "n/a",
        "seed": args.seed,
    }


def parallelism(trainer: Trainer) -> str:
    """How the processes shared the work: FSDP, DeepSpeed, DDP, or none."""
    if (fsdp_size := getattr(trainer.model, "fsdp_size", None) or 1) > 1:
        return f"FSDP2 over {fsdp_size} processes (transformers' plan: DistributedConfig(fsdp_size={fsdp_size}))"
    if trainer.is_fsdp_enabled:
        return f"FSDP{trainer.accelerator.state.fsdp_plugin.fsdp_version} over {trainer.args.world_size} processes"
    if trainer.is_deepspeed_enabled:
        return f"DeepSpeed over {trainer.args.world_size} processes"
    if trainer.args.world_size > 1:
        return f"DDP over {trainer.args.world_size} processes ({torch.distributed.get_backend()})"
    return "none (1 process)"


def save_with_card(
    trainer: Trainer,
    *,
    task: str,
    results: dict[str, float],
    notes: dict[str, object] | None = None,
    **card: object,
) -> None:
    """Save model, code, tokenizer or processor (the Trainer's `processing_class`) and a filled model card, after
    `trainer.train()`; `notes` are extra rows of the card's training table, `card` goes to `write_model_card`.

    Every process must call it (saving a sharded model is collective); only the main process writes the card.
    """
    output_dir = trainer.args.output_dir
    trainer.save_model(output_dir)  # with --push_to_hub, uploads too
    if not trainer.is_world_process_zero():
        return
    model = trainer.model
    card_path = write_model_card(
        output_dir,
        model.config,
        task=task,
        model_id=trainer.hub_model_id if trainer.args.push_to_hub else output_dir,
        results=results,
        training={**run_summary(trainer, train_seconds(trainer)), **(notes or {})},
        num_parameters=count_parameters(model),
        **card,
    )
    files = sorted(p.name for p in Path(output_dir).iterdir() if p.is_file())
    print(f"saved to {output_dir}/: {', '.join(files)}")
    print(f"model card: {card_path}")
    if trainer.args.push_to_hub:
        from huggingface_hub import upload_file

        args = trainer.args
        upload_file(
            path_or_fileobj=card_path,
            path_in_repo="README.md",
            repo_id=trainer.hub_model_id,
            token=args.hub_token,
            revision=args.hub_revision,
            commit_message="Model card",
        )
        print(f"pushed to the Hub: {trainer.hub_model_id}")
