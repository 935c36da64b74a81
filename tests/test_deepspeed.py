"""DeepSpeed through the `Trainer` (issue 66, item 5): ZeRO-2 and ZeRO-3 from `TrainingArguments(deepspeed=...)`, in
one process and in two (gloo on 127.0.0.1), on DeepSpeed's CPU accelerator. Turner's losses equal those of the
`Trainer` without DeepSpeed, as GPT-2's do, and the folder `save_model` writes loads to the weights trained.

Run as a module, this file is the worker: `python -m tests.test_deepspeed OUT BATCH` trains GPT-2 and Turner
(`workflow_utils.TINY_LMS`) 4 steps of BATCH rows per process, with the `Trainer` alone and with ZeRO-2 and ZeRO-3,
each into OUT/FAMILY/ENGINE: the saved model, `trained.safetensors` (the weights the run ended with, gathered) and
`losses.json` (the losses logged at every step). One process needs a launcher's environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), as DeepSpeed always starts a process group."""

import json
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from .workflow_utils import (
    LM_RUN,
    TINY_LMS,
    example,
    free_port,
    start,
    tiny_lm,
    tiny_lm_trainer,
    torchrun,
    training_losses,
    wait_all,
    write_text,
)

pytestmark = pytest.mark.skipif(
    find_spec("deepspeed") is None, reason="DeepSpeed is not installed (the deepspeed extra; CI's newest lane has it)"
)

WORKER = ["-m", "tests.test_deepspeed"]
ENGINES = ("trainer", "zero2", "zero3")
# DeepSpeed on the CPU, gloo between processes (DeepSpeed's own choice there without oneCCL)
CPU = {"DS_ACCELERATOR": "cpu"}
# How far a loss, and a weight, may be from the Trainer's alone. Measured (DeepSpeed 0.19.8, torch 2.13): losses 1 ulp
# (5e-7) for either family; weights 1.5e-5 for Turner and 7e-6 for GPT-2, in the key biases: they get no gradient but
# rounding noise, which Adam scales up to steps of ~1e-5, so a sum in another order (DeepSpeed's) moves them apart.
CLOSE = {"loss": 1e-5, "weight": 1e-4}


def zero(stage: int) -> dict:
    """The DeepSpeed config of a ZeRO stage: the rest follows the `Trainer`'s arguments ("auto")."""
    auto = ("train_micro_batch_size_per_gpu", "train_batch_size", "gradient_accumulation_steps", "gradient_clipping")
    return {
        "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True},
        **dict.fromkeys(auto, "auto"),
    }


def launch(processes: int, folder: Path):
    """The worker in one process (with the environment a launcher gives it) or under torchrun with two, so that a
    step sees 8 rows either way; OUT is `folder`."""
    if processes == 1:
        one = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
        command = [sys.executable, *WORKER, str(folder), "8"]
        return start(command, folder, **CPU, **one, MASTER_PORT=str(free_port()))
    return start([*torchrun(port=free_port(), processes=processes), *WORKER, str(folder), "4"], folder, **CPU)


def loaded_weights(folder: Path) -> dict[str, torch.Tensor]:
    return dict(AutoModelForCausalLM.from_pretrained(folder).named_parameters())


@pytest.mark.parametrize("processes", [1, 2])
def test_zero_2_and_3_train_as_the_trainer_alone_and_save_what_they_trained_as_gpt2s_do(
    processes: int, tmp_path: Path
) -> None:
    """One worker launch per test (under pytest -n, the two run side by side)."""
    wait_all(launch(processes, tmp_path), timeout=600)
    found = {}
    for family in TINY_LMS:
        losses = {engine: json.loads((tmp_path / family / engine / "losses.json").read_text()) for engine in ENGINES}
        assert len(losses["trainer"]) == 4, losses
        found[family] = {
            engine: max(abs(a - b) for a, b in zip(losses[engine], losses["trainer"], strict=True))
            for engine in ENGINES[1:]
        }
    print(f"\n{processes} process(es), the largest difference of a logged loss from the Trainer alone's:", found)
    far = {family: gaps for family, gaps in found.items() if max(gaps.values()) > CLOSE["loss"]}
    assert not far, found

    for family in TINY_LMS:  # the saved folder loads to the weights trained, and those are the Trainer alone's
        alone = load_file(tmp_path / family / "trainer" / "trained.safetensors")
        for engine in ENGINES[1:]:
            folder = tmp_path / family / engine
            trained = load_file(folder / "trained.safetensors")
            loaded = loaded_weights(folder)
            assert loaded.keys() == trained.keys() == alone.keys()
            for name, weight in loaded.items():
                where = f"{family} {engine}: {name}"
                torch.testing.assert_close(weight, trained[name], rtol=0, atol=0, msg=where)
                torch.testing.assert_close(weight, alone[name], rtol=0, atol=CLOSE["weight"], msg=where)


@pytest.mark.slow
def test_the_documented_commands_train_as_ddp_does(tmp_path: Path) -> None:
    """docs/scale-out.md's `torchrun --nproc_per_node 2 -m examples.train_causal_lm --deepspeed zero3.json` (and
    zero2.json), tiny, against the same command without DeepSpeed: the same losses and held-out loss, weights within
    CLOSE, and a model card that says what ran."""
    write_text(tmp_path)
    run = (*LM_RUN, "--max-steps", "6")  # dropout too: every process draws what it draws under DDP
    commands = {"ddp": ()}
    for stage in (2, 3):
        (tmp_path / f"zero{stage}.json").write_text(json.dumps(zero(stage)))
        commands[f"zero{stage}"] = ("--deepspeed", f"zero{stage}.json")
    launches = {
        name: start(
            [*torchrun(port=free_port()), *example("train_causal_lm.py"), *run, *args, "--output-dir", name],
            tmp_path,
            **CPU,
        )
        for name, args in commands.items()
    }
    outputs = dict(zip(launches, wait_all(*launches.values(), timeout=600), strict=True))
    ddp = loaded_weights(tmp_path / "ddp")
    for name in ("zero2", "zero3"):
        assert training_losses(outputs[name]) == training_losses(outputs["ddp"]), outputs[name][-3000:]
        held_out = [
            line
            for output in (outputs[name], outputs["ddp"])
            for line in output.splitlines()
            if line.startswith("held-out loss")
        ]
        assert len(held_out) == 2 and held_out[0] == held_out[1], held_out
        assert "| parallelism | DeepSpeed over 2 processes |" in (tmp_path / name / "README.md").read_text()
        weights = loaded_weights(tmp_path / name)  # ZeRO-2 writes the tied head's weight twice, as for GPT-2
        assert weights.keys() == ddp.keys()
        for key, weight in weights.items():
            torch.testing.assert_close(weight, ddp[key], rtol=0, atol=CLOSE["weight"], msg=f"{name}: {key}")


def trained_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of `model` whole, in every process (under ZeRO-3 each holds a part: a collective)."""
    import deepspeed

    parameters = dict(model.named_parameters())
    with deepspeed.zero.GatheredParameters(list(parameters.values())):  # nothing to gather but under ZeRO-3
        return {name: parameter.detach().clone() for name, parameter in parameters.items()}


def main(output_dir: str, batch_size: str) -> None:
    """Every model is made before the first `Trainer` starts a process group, as a script makes its model."""
    models = {(family, engine): tiny_lm(family) for family in TINY_LMS for engine in ENGINES}
    for (family, engine), model in models.items():
        folder = Path(output_dir) / family / engine
        trainer = tiny_lm_trainer(
            model,
            folder,
            per_device_train_batch_size=int(batch_size),
            max_steps=4,
            save_strategy="no",
            deepspeed=zero(int(engine[-1])) if engine.startswith("zero") else None,
        )
        trainer.train()
        trainer.save_model()
        trained = trained_weights(trainer.model)
        if trainer.is_world_process_zero():
            save_file(trained, folder / "trained.safetensors")
            losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
            (folder / "losses.json").write_text(json.dumps(losses))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
