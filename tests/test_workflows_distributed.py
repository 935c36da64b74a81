"""Several processes on the CPU: `accelerate launch` of train_causal_lm.py as DDP over gloo, and a Turner model
sharded with FSDP2 (`fully_shard`) under torchrun, whose gathered weights match single-process training."""

import re
import sys
from pathlib import Path

import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM, AutoTokenizer

from .fsdp_worker import global_batch, tiny_model, train
from .workflow_utils import TINY_MODEL, accelerate_launch, run_example, script_env


def test_accelerate_launch_trains_on_two_processes_and_the_result_loads(tmp_path: Path) -> None:
    (tmp_path / "text.txt").write_text("Simple is better than complex. Complex is better than complicated.\n" * 40)
    output = run_example(
        accelerate_launch("train_causal_lm.py"),
        *("--train-file", "text.txt", "--output-dir", "ddp", "--max-steps", "6", "--logging-steps", "2"),
        *("--block-size", "32", "--max-new-tokens", "10", "--per-device-train-batch-size", "4", *TINY_MODEL),
        tmp_path=tmp_path,
        env=script_env(tmp_path, ACCELERATE_CONFIG_FILE=str(tmp_path / "no-config.yaml")),
    )
    assert output.count("text: text, ") == 1  # printed by the main process only
    card = ModelCard.load(tmp_path / "ddp" / "README.md")
    assert "| parallelism | DDP over 2 processes (gloo) |" in card.text
    assert "| batch size | 4 per process x 2 process(es) x 1 accumulation |" in card.text

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "ddp")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ddp")
    generated = model.generate(**tokenizer("Simple is", return_tensors="pt"), max_new_tokens=5, do_sample=False)
    assert generated.shape == (1, len("Simple is") + 5)


def test_fsdp2_shards_turner_blocks_on_cpu_and_matches_one_process(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += [str(Path(__file__).with_name("fsdp_worker.py")), "fsdp"]
    output = run_example(command, tmp_path=tmp_path)
    held = [int(n) for n in re.findall(r"holds (\d+) of 3072 qkv_proj weights", output)]
    assert sorted(held) == [1536, 1536], output[-2000:]  # each process keeps half of each matrix

    reference = tiny_model()
    train(reference, global_batch())  # the whole batch in one process
    sharded = AutoModelForCausalLM.from_pretrained(tmp_path / "fsdp")
    expected = reference.state_dict()
    for name, tensor in sharded.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], atol=2e-5, rtol=1e-4, msg=name)
    assert not torch.equal(
        expected["model.layers.0.mlp.up_proj.weight"], tiny_model().model.layers[0].mlp.up_proj.weight
    )
