"""Several processes on the CPU: `accelerate launch` of train_causal_lm.py as DDP over gloo. (A Turner model sharded
by hand with FSDP2's `fully_shard` is checked in tests/test_parallel.py, in its one launch of parallel checks.)"""

from pathlib import Path

from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM, AutoTokenizer

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
