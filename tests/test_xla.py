"""Turner on XLA (torch_xla), on its CPU device (`PJRT_DEVICE=CPU`), against the CPU: forward and backward for every
config switch and head, a Trainer run with its evaluation and saved folder, a loop of one's own through accelerate,
`save_pretrained` from XLA, greedy generate() with both caches, and the input checks: no graph execution of their own
in a training step, one host read in a generate() call. CI's core lane runs this file on its own, with torch_xla
2.9.0 beside torch 2.9.0 (.ci/run); elsewhere it skips. Tiny models and few steps: XLA compiles every new graph."""

import os
import sys

import pytest
import torch
from transformers.utils.import_utils import is_torch_xla_available

if not is_torch_xla_available():
    pytest.skip(
        "torch_xla is not installed, or USE_TORCH_XLA=0 (CI's core lane runs this file on its own, with it)",
        allow_module_level=True,
    )

import torch_xla
import torch_xla.debug.metrics as metrics
from accelerate import Accelerator
from datasets import Dataset
from safetensors import safe_open
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from examples.helpers.model_card import run_summary
from turner_tfm import (
    TurnerForCausalLM,
    TurnerForImageClassification,
    TurnerForSequenceClassification,
)

from .test_switches import SWITCHES
from .tiny import image_config, random_ids, text_config

TOLERANCE = 1e-4
CONFIGS = {"default": {}, **SWITCHES}


@pytest.fixture(scope="module")
def xla() -> torch.device:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    return torch_xla.device()


def build(model_class: type, config) -> torch.nn.Module:
    torch.manual_seed(0)
    return model_class(config)


def moved(model: torch.nn.Module, device) -> torch.nn.Module:
    """`model` on `device`, its tied head tied again: on XLA `Module.to` makes new parameters, which splits a tied
    `lm_head` from the embedding (any transformers model's; the Trainer ties them again itself on XLA)."""
    model = model.to(device)
    model.tie_weights()
    return model


def forward_backward(model: torch.nn.Module, inputs: dict[str, torch.Tensor], device) -> tuple[torch.Tensor, dict]:
    """The loss and every parameter's gradient of one training step on `device`, brought back to the CPU."""
    model = moved(model, device).train()
    loss = model(**{name: value.to(device) for name, value in inputs.items()}).loss
    loss.backward()
    torch_xla.sync()
    grads = {name: parameter.grad.cpu() for name, parameter in model.named_parameters()}
    return loss.detach().cpu(), grads


def assert_same_step(model_class: type, config, inputs: dict[str, torch.Tensor], xla: torch.device) -> None:
    expected_loss, expected = forward_backward(build(model_class, config), inputs, "cpu")
    loss, grads = forward_backward(build(model_class, config), inputs, xla)
    torch.testing.assert_close(loss, expected_loss, atol=TOLERANCE, rtol=TOLERANCE)
    for name, grad in expected.items():
        torch.testing.assert_close(grads[name], grad, atol=TOLERANCE, rtol=TOLERANCE, msg=name)


@pytest.mark.parametrize("switch", list(CONFIGS))
def test_a_training_step_on_xla_gives_the_cpus_loss_and_gradients(switch: str, xla: torch.device) -> None:
    ids = random_ids(2, 8)
    assert_same_step(TurnerForCausalLM, text_config(**CONFIGS[switch]), {"input_ids": ids, "labels": ids}, xla)


@pytest.mark.parametrize("head", ["sequence", "image"])
def test_the_classifier_heads_on_xla_give_the_cpus_loss_and_gradients(head: str, xla: torch.device) -> None:
    labels = torch.tensor([0, 2])
    if head == "image":
        pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
        assert_same_step(TurnerForImageClassification, image_config(), {"pixel_values": pixels, "labels": labels}, xla)
    else:
        config = text_config(is_causal=False, num_labels=3)
        inputs = {"input_ids": random_ids(2, 8), "labels": labels}
        assert_same_step(TurnerForSequenceClassification, config, inputs, xla)


def test_the_trainer_trains_evaluates_and_saves_on_xla_as_the_cpu_reads_it(tmp_path, xla: torch.device) -> None:
    """Three Trainer steps on XLA lower the loss with the head still tied; its evaluation, and the folder it saves,
    give on the CPU what they give on XLA. The folder holds the tensors a save from the CPU holds: the tied head once
    (the Trainer's own XLA save hands `save_pretrained` separate copies of the head and the embedding)."""
    model = build(TurnerForCausalLM, text_config())
    model.save_pretrained(tmp_path / "from_cpu")
    ids = random_ids(8, 8)
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        optim="adamw_torch",  # the Trainer's default, fused AdamW, refuses XLA tensors (GPT-2's too)
        report_to="none",
        save_strategy="no",
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert next(model.parameters()).device.type == "xla"
    assert model.lm_head.weight is model.model.embeddings.embed_tokens.weight
    assert after < before
    trainer.save_model(str(tmp_path / "saved"))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    with torch.no_grad():
        on_cpu = reloaded(input_ids=ids, labels=ids)
        on_xla = model.eval()(input_ids=ids.to(xla), labels=ids.to(xla))
    torch.testing.assert_close(on_cpu.logits, on_xla.logits.cpu(), atol=TOLERANCE, rtol=TOLERANCE)
    assert on_cpu.loss.item() == pytest.approx(after, abs=TOLERANCE)
    assert saved_names(tmp_path / "saved") == saved_names(tmp_path / "from_cpu")
    assert run_summary(trainer, 1.0)["hardware"].startswith("1 x XLA (CPU)")  # the examples' model card


def saved_names(folder) -> list[str]:
    with safe_open(folder / "model.safetensors", "pt") as weights:
        return sorted(weights.keys())


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generate_on_xla_gives_the_cpus_tokens(cache: str, xla: torch.device) -> None:
    model = build(TurnerForCausalLM, text_config()).eval()
    prompt = random_ids(2, 5)
    settings = {"max_new_tokens": 4, "do_sample": False, "cache_implementation": cache}
    expected = model.generate(prompt, **settings)
    generated = moved(model, xla).generate(prompt.to(xla), **settings)
    assert generated.cpu().tolist() == expected.tolist()


def counted_step(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, int]:
    """Graph executions and aminmax CPU fallbacks of one forward and backward, synced (what other tests left pending
    is synced first, outside the count)."""
    model.zero_grad(set_to_none=True)
    torch_xla.sync(wait=True)  # executions run asynchronously: each is counted once it has finished
    before = {
        "executions": (metrics.metric_data("ExecuteTime") or (0,))[0],
        "fallbacks": metrics.counter_value("aten::aminmax") or 0,
    }
    model(input_ids=ids, labels=ids).loss.backward()
    torch_xla.sync(wait=True)
    return {
        "executions": (metrics.metric_data("ExecuteTime") or (0,))[0] - before["executions"],
        "fallbacks": (metrics.counter_value("aten::aminmax") or 0) - before["fallbacks"],
    }


def test_the_input_checks_on_xla_run_no_graph_of_their_own_and_still_name_a_bad_id(xla: torch.device) -> None:
    """The ids' extremes join the step's graph (min and max: XLA has no aminmax, which would copy them to the host)
    and are read when the step runs: a checked step is one graph execution. A bad id gets the CPU's error then."""
    checked = moved(build(TurnerForCausalLM, text_config()), xla)
    ids = random_ids(2, 8).to(xla)
    counted_step(checked, ids)  # compiles
    assert counted_step(checked, ids) == {"executions": 1, "fallbacks": 0}

    bad = random_ids(2, 8)
    bad[1, 3] = 99
    with pytest.raises(ValueError) as on_cpu:
        build(TurnerForCausalLM, text_config())(bad)
    with pytest.raises(ValueError) as on_xla:
        checked(bad.to(xla))
        torch_xla.sync()
    assert str(on_xla.value) == str(on_cpu.value)
    assert "`input_ids` has 99 at row 1, position 3" in str(on_xla.value)


def test_a_warm_trainer_step_costs_turner_no_more_than_gpt2(tmp_path) -> None:
    """benchmarks/bench_xla.py at toy sizes: per warm Trainer step, Turner (its checks on) compiles nothing, falls back
    to the CPU for nothing, and executes and transfers no more than GPT-2."""
    from benchmarks.bench_xla import main

    sizes = ["--layers", "1", "--features", "32", "--context", "8", "--batch", "2", "--warmup", "3", "--steps", "2"]
    results = main([*sizes, "--json", str(tmp_path / "xla.json")])["results"]
    turner, gpt2 = results["turner"], results["gpt2"]
    assert turner["compilations"] == turner["cpu_fallbacks"] == 0, results
    assert all(turner[count] <= gpt2[count] for count in turner), results


def own_loop(model: torch.nn.Module, ids: torch.Tensor, accelerator: Accelerator | None = None) -> list[float]:
    """A training loop of one's own over `ids` (batches of 2), plain on the CPU or through `accelerator`: prepare,
    `accelerator.backward`, the optimizer's step, zero_grad. The head is tied again after `prepare`, which moves the
    model to XLA and so splits it from the embedding (GPT-2's too); the optimizer holds the embedding's new parameter
    (accelerate maps the old parameters to the new by name), which the head then shares again."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # not fused: the fused one refuses XLA tensors
    loader = DataLoader([{"input_ids": row, "labels": row} for row in ids], batch_size=2)
    if accelerator is not None:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        model.tie_weights()
    losses = []
    for batch in loader:
        loss = model(**batch).loss
        if accelerator is None:
            loss.backward()
        else:
            accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return [loss.item() for loss in losses]


def test_a_loop_of_ones_own_through_accelerate_on_xla_gives_the_cpus_losses_and_saves(tmp_path, xla) -> None:
    ids = random_ids(8, 8)
    expected = own_loop(build(TurnerForCausalLM, text_config()), ids)
    accelerator = Accelerator()
    assert accelerator.device.type == "xla"
    model = build(TurnerForCausalLM, text_config())
    losses = own_loop(model, ids, accelerator)
    assert losses == pytest.approx(expected, abs=TOLERANCE)
    assert losses[-1] != pytest.approx(losses[0], abs=TOLERANCE)  # it trained
    unwrapped = accelerator.unwrap_model(model).eval()
    assert unwrapped.lm_head.weight is unwrapped.model.embeddings.embed_tokens.weight
    unwrapped.save_pretrained(tmp_path / "own", state_dict=accelerator.get_state_dict(model))
    with torch.no_grad():
        on_xla = unwrapped(input_ids=ids.to(xla)).logits.cpu()
        on_cpu = AutoModelForCausalLM.from_pretrained(tmp_path / "own").eval()(input_ids=ids).logits
    torch.testing.assert_close(on_cpu, on_xla, atol=TOLERANCE, rtol=TOLERANCE)


def test_a_bad_id_in_a_loop_through_accelerate_raises_when_the_next_batch_is_fetched(xla) -> None:
    """accelerate's optimizer step does not sync on XLA; its data loader does, before it hands out the next batch
    (torch_xla's `MpDeviceLoader`): the bad batch's step, clamped lookup and all, has run by then, and the loop stops
    there with the CPU's error."""
    ids = random_ids(8, 8)
    ids[3, 2] = 99  # batch 1, row 1
    with pytest.raises(ValueError) as on_cpu:
        own_loop(build(TurnerForCausalLM, text_config()), ids)
    model, accelerator = build(TurnerForCausalLM, text_config()), Accelerator()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader([{"input_ids": row, "labels": row} for row in ids], batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    batches, stepped = iter(loader), 0
    with pytest.raises(ValueError) as on_xla:
        for _ in range(4):
            batch = next(batches)
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
            stepped += 1
    assert stepped == 2, "the error comes with the batch after the bad one"
    assert str(on_xla.value) == str(on_cpu.value)
    assert "`input_ids` has 99 at row 1, position 2" in str(on_xla.value)


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=99, n_positions=64))


@pytest.mark.parametrize("given", ["own", "accelerate's"])
def test_save_pretrained_from_xla_loads_on_the_cpu_to_the_same_logits(given: str, tmp_path, xla) -> None:
    """The model's state dict, or the one accelerate gets (on XLA too), is saved from CPU copies
    (`pretrained_turner.state_on_cpu`): the folder holds what a save from the CPU holds."""
    model = build(TurnerForCausalLM, text_config())
    model.save_pretrained(tmp_path / "from_cpu")
    model = moved(model, xla).eval()
    ids = random_ids(2, 8)
    with torch.no_grad():
        before = model(input_ids=ids.to(xla)).logits.cpu()
    state = None if given == "own" else Accelerator().get_state_dict(model)
    model.save_pretrained(tmp_path / "from_xla", state_dict=state)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "from_xla").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, before, atol=TOLERANCE, rtol=TOLERANCE)
    saved = {path.name: path.read_bytes() for path in (tmp_path / "from_xla").glob("*.safetensors")}
    assert saved == {path.name: path.read_bytes() for path in (tmp_path / "from_cpu").glob("*.safetensors")}


@pytest.mark.parametrize("save", ["save_pretrained", "accelerator.save_model"])
def test_upstream_gpt2_saved_from_xla_fails_inside_safetensors(save: str, tmp_path, xla) -> None:
    """What Turner's `save_pretrained` works around, and docs/scale-out.md reports: on torch_xla 2.9 an XLA tensor has
    no storage, whose address safetensors' `save_pretrained` (and accelerate's `save_model`, for Turner too) reads.
    When this fails, upstream saves from XLA: drop `pretrained_turner.state_on_cpu` and the docs' note."""
    models = [moved(tiny_gpt2(), xla)]
    if save == "accelerator.save_model":
        models.append(moved(build(TurnerForCausalLM, text_config()), xla))
    for model in models:
        with pytest.raises(RuntimeError, match="invalid python storage"):
            if save == "save_pretrained":
                model.save_pretrained(tmp_path / "gpt2")
            else:
                Accelerator().save_model(model, tmp_path / type(model).__name__)


def test_generate_on_xla_names_a_bad_prompt_id_as_the_cpu_does_and_leaves_nothing_pending(xla) -> None:
    """generate() syncs nowhere: the prompt's checks read at once there (one host read a call), and raise the CPU's
    error from generate() itself, not at the caller's next sync."""
    model = build(TurnerForCausalLM, text_config()).eval()
    prompt = random_ids(2, 5)
    prompt[1, 3] = 99
    settings = {"max_new_tokens": 3, "do_sample": False}
    with pytest.raises(ValueError) as on_cpu:
        model.generate(prompt, **settings)
    model = moved(model, xla)
    with pytest.raises(ValueError) as on_xla:
        model.generate(prompt.to(xla), **settings)
    assert str(on_xla.value) == str(on_cpu.value)
    assert "`input_ids` has 99 at row 1, position 3" in str(on_xla.value)
    model.generate(random_ids(2, 5).to(xla), **settings)
    torch_xla.sync()  # no check of either call left to raise here


def test_a_warm_generate_call_on_xla_pays_its_checks_one_execution_and_one_read() -> None:
    """benchmarks/bench_xla.py --generate at toy sizes: the prompt's checks, read at once inside generate(), are one
    graph execution and one transfer a call, whatever the number of new tokens; nothing compiles once warm."""
    from benchmarks.bench_xla import per_generate
    from benchmarks.peers import LMShape

    shape, counted = LMShape(1, 4, 32, context=8), {}
    for name in ("turner", "turner, checks off"):
        counted[name] = per_generate(name, shape, batch=2, new_tokens=3, cache="static", warmup=2, calls=2)
    checked, unchecked = counted["turner"], counted["turner, checks off"]
    assert checked["compilations"] == unchecked["compilations"] == 0, counted
    assert checked["executions"] - unchecked["executions"] == 1, counted
    assert checked["transfers_to_host"] - unchecked["transfers_to_host"] == 1, counted
    assert checked["cpu_fallbacks"] == unchecked["cpu_fallbacks"], counted


@pytest.mark.parametrize("kind", ["turner", "gpt2"])
def test_upstream_the_trainers_eval_loss_on_xla_weighs_a_partial_last_batch_as_a_whole_one(
    kind: str, tmp_path, xla
) -> None:
    """What docs/scale-out.md reports: on XLA the Trainer's `eval_loss` is the mean of the batches' losses, where the
    CPU's weighs each batch by its rows (12 rows in batches of 8: the last, of 4, counts as 8 there), for GPT-2 as for
    Turner. When this fails, upstream averages rows on XLA too: drop the docs' note."""
    ids = random_ids(12, 8)
    model = build(TurnerForCausalLM, text_config()) if kind == "turner" else tiny_gpt2()
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", per_device_eval_batch_size=8)
    trainer = Trainer(model=model, args=args)

    def eval_loss(rows: torch.Tensor) -> float:
        return trainer.evaluate(Dataset.from_dict({"input_ids": rows.tolist(), "labels": rows.tolist()}))["eval_loss"]

    first, last = eval_loss(ids[:8]), eval_loss(ids[8:])
    assert first != pytest.approx(last, abs=1e-3)  # else the two means could not be told apart
    assert eval_loss(ids) == pytest.approx((first + last) / 2, abs=TOLERANCE)  # the CPU's: (8 * first + 4 * last) / 12


def test_the_docs_tpu_command_trains_evaluates_and_saves_on_xla(tmp_path) -> None:
    """docs/scale-out.md's TPU command, `accelerate launch -m examples.train_causal_lm --optim adamw_torch`, as run
    there on torch_xla's CPU device (a tiny model, a few steps; no accelerate config: its defaults, one process). The
    card names the device the Trainer used, and the folder loads on the CPU."""
    from .workflow_utils import TINY_MODEL, example, run_example, script_env

    launch = [sys.executable, "-m", "accelerate.commands.launch", *example("train_causal_lm.py")]
    env = script_env(tmp_path, PJRT_DEVICE="CPU", ACCELERATE_CONFIG_FILE=str(tmp_path / "no-config.yaml"))
    flags = ["--optim", "adamw_torch", "--max-steps", "4", "--logging-steps", "2", "--max-new-tokens", "5"]
    output = run_example(launch, *flags, *TINY_MODEL, "--output-dir", "tpu", tmp_path=tmp_path, env=env)
    assert "training loss: " in output and "held-out loss " in output
    assert "| hardware | 1 x XLA (CPU) " in (tmp_path / "tpu" / "README.md").read_text()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tpu")
    assert next(model.parameters()).device.type == "cpu"
    assert model.lm_head.weight is model.model.embeddings.embed_tokens.weight
