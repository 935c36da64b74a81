"""The language-model workflows, run as a user runs them (subprocesses, CPU, offline): the quickstart, training on a
file or a `datasets` folder with a char or BPE tokenizer, continued training, LoRA then merge, and a classifier that
starts from the trained LM."""

import csv
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, pipeline

from examples.helpers import data
from turner_tfm import TurnerForMaskedLM

from .once import made_once
from .workflow_utils import (
    EXAMPLES,
    TINY_MODEL,
    WORKFLOWS_PAGE,
    checked_output,
    listed_files,
    printed_number,
    run_example,
    run_examples_unchecked,
    training_losses,
    write_text,
)

SAVED_FILES = ("config.json", "configuration_turner.py", "modeling_turner.py", "model.safetensors", "README.md")


# The quickstart's bad flags (what each must say: argparse's usage error, or the config's own ValueError)
BAD_FLAGS = {
    ("--hidden-size", "30"): "`hidden_size`=30 is invalid; it must be divisible by num_attention_heads=4",
    ("--position-embedding-type", "rope"): "argument --position_embedding_type/--position-embedding-type: invalid",
}
# generate.py on the BPE run's model (32 learned positions), in one process: what it continues, and what it refuses
GENERATE_FLAGS = {
    ("--prompt", "Return the", "--max-new-tokens", "16"): None,
    ("--prompt", "Return the", "--max-new-tokens", "16", "--tp-size", "2"): (
        "argument --tp-size: 2 is not valid: it must equal the number of processes, 1"
    ),
    ("--max-new-tokens", "100"): "argument --max-new-tokens: 100 is not valid: the model has 32 positions",
}
EXAMPLE_SCRIPTS = (
    "finetune_lora.py",
    "generate.py",
    "push_to_hub.py",
    "quickstart.py",
    "sentence_embeddings.py",
    "train_causal_lm.py",
    "train_image_classifier.py",
    "train_masked_lm.py",
    "train_question_answering.py",
    "train_text_classifier.py",
    "train_token_classifier.py",
)
# The training scripts that run in one process or DDP, without --fsdp-size
WITHOUT_FSDP = ("train_masked_lm.py", "train_question_answering.py", "train_token_classifier.py")
# What `--arguments-file`'s YAML sets: five `TrainingArguments` fields the scripts did not take before, and a tiny run
ARGUMENTS_FILE = {
    **{"train_file": "text.txt", "output_dir": "out", "max_steps": 12, "logging_steps": 1, "warmup_steps": 0},
    **{"block_size": 32, "max_new_tokens": 5, "per_device_train_batch_size": 4, "hidden_size": 32},
    **{"num_hidden_layers": 2, "num_attention_heads": 4, "seed": 1},
    **{"eval_strategy": "steps", "eval_steps": 4, "save_strategy": "steps", "save_steps": 4},
    **{"load_best_model_at_end": True, "metric_for_best_model": "eval_loss", "greater_is_better": False},
    **{"lr_scheduler_type": "cosine_with_restarts", "lr_scheduler_kwargs": {"num_cycles": 2}},
    **{"max_grad_norm": 0.5, "adam_beta2": 0.95},
}


def write_inputs(folder: Path) -> None:
    """The files the runs read: a `datasets` folder of JSON lines, text files, a CSV of moods, a YAML arguments file."""
    (folder / "my_data").mkdir()
    with (folder / "my_data" / "train.jsonl").open("w") as file:
        for i in range(300):
            file.write(json.dumps({"body": f"Record {i}: the quick brown fox jumps over the lazy dog {i % 7} times."}))
            file.write("\n")
    (folder / "zen.txt").write_text("Beautiful is better than ugly.\nExplicit is better than implicit.\n" * 40)
    (folder / "code.txt").write_text("\n".join(path.read_text() for path in sorted(EXAMPLES.glob("*.py"))))
    with (folder / "moods.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["sentence", "mood"])
        for i in range(60):
            writer.writerow([f"What a lovely, happy day number {i}!", "happy"])
            writer.writerow([f"Error {i}: the build failed again.", "sad"])
    write_text(folder)
    (folder / "args.yaml").write_text("\n".join(f"{key}: {json.dumps(value)}" for key, value in ARGUMENTS_FILE.items()))


def planned_runs(folder: Path) -> dict[str, tuple[str, ...]]:
    """Every run of the tests below, by name, in the order they run: a short quickstart run first (into `lm`), as the
    continued training, LoRA and the text classifier start from its model."""
    base = ("--model-name-or-path", str(folder / "lm"))
    short = ("--output-dir", "lm", "--max-steps", "30", "--logging-steps", "5", "--learning-rate", "5e-3")
    short += ("--block-size", "64", "--max-new-tokens", "30", "--per-device-train-batch-size", "8", *TINY_MODEL)
    bpe = ("--dataset-name", str(folder / "my_data"), "--text-column", "body", "--tokenizer", "bpe")
    bpe += ("--vocab-size", "300", "--output-dir", "bpe", "--max-steps", "20", "--logging-steps", "5")
    bpe += ("--block-size", "32", "--max-new-tokens", "10", "--per-device-train-batch-size", "8", *TINY_MODEL)
    zen = (*base, "--train-file", str(folder / "zen.txt"), "--output-dir", "zen", "--max-steps", "10")
    zen += ("--logging-steps", "5", "--block-size", "64", "--max-new-tokens", "20")
    lora = (*base, "--train-file", "code.txt", "--output-dir", "lora", "--max-steps", "15", "--logging-steps", "5")
    lora += ("--block-size", "64", "--max-new-tokens", "20")
    moods = ("--train-file", "moods.csv", "--text-column", "sentence", "--label-column", "mood", *base)
    moods += ("--output-dir", "moods", "--num-train-epochs", "3", "--logging-steps", "5")
    moods += ("--per-device-train-batch-size", "8")
    masked = ("--train-file", str(folder / "zen.txt"), "--output-dir", "masked", "--max-steps", "40")
    masked += ("--logging-steps", "5", "--learning-rate", "5e-3", "--block-size", "16", "--vocab-size", "300")
    masked += ("--validation-split-percentage", "20")
    masked += ("--per-device-train-batch-size", "8", "--fill-mask-text", "Explicit is <mask> than implicit.")
    return {
        "quickstart": ("quickstart.py", *short),
        **{f"quickstart {' '.join(flags)}": ("quickstart.py", *flags) for flags in BAD_FLAGS},
        **{f"{script} --help": (script, "--help") for script in EXAMPLE_SCRIPTS},
        "bpe": ("train_causal_lm.py", *bpe),
        **{f"generate.py {' '.join(flags)}": ("generate.py", "bpe", *flags) for flags in GENERATE_FLAGS},
        "no such column": ("train_causal_lm.py", "--dataset-name", str(folder / "my_data"), "--text-column", "text"),
        "continued": ("train_causal_lm.py", *zen),
        "no such model folder": ("train_causal_lm.py", "--model-name-or-path", "no-such-folder"),
        "no such text file": ("train_causal_lm.py", "--train-file", "no-such.txt"),
        "lora": ("finetune_lora.py", *lora),
        "no such lora target": ("finetune_lora.py", *base, "--target-modules", "c_attn", "--block-size", "64"),
        "text classifier": ("train_text_classifier.py", *moods),
        "no label column": ("train_text_classifier.py", "--train-file", "moods.csv", "--text-column", "sentence"),
        "arguments file": ("train_causal_lm.py", "args.yaml", "--seed", "3"),
        "masked lm": ("train_masked_lm.py", *masked, *TINY_MODEL),
    }


@dataclass(frozen=True)
class Runs:
    """The runs of `planned_runs`, all made in `folder`: (exit status, output) by name."""

    folder: Path
    results: dict[str, tuple[int, str]]

    def output(self, name: str, expect_failure: bool = False) -> str:
        """What run `name` printed; fails the test unless it ended as expected."""
        return checked_output(*self.results[name], expect_failure)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Every run of the tests below, one after another in one interpreter (`run_examples_unchecked`): an interpreter
    costs ~8 s of imports, more than any of these tiny runs. Each test checks its own runs' exit statuses, so a run
    that breaks fails its test only. Made once for the session (`made_once`: not once per pytest-xdist worker)."""

    def make(folder: Path) -> dict[str, tuple[int, str]]:
        write_inputs(folder)
        planned = planned_runs(folder)
        results = run_examples_unchecked(list(planned.values()), tmp_path=folder, timeout=1800)
        return dict(zip(planned, results, strict=True))

    return Runs(*made_once(tmp_path_factory, "lm-runs", make))


@pytest.fixture(scope="module")
def quickstart(runs: Runs) -> tuple[Path, str]:
    """A short quickstart run: (its output folder, what it printed)."""
    return runs.folder / "lm", runs.output("quickstart")


def test_quickstart_trains_prints_a_sample_and_saves_a_loadable_model(quickstart: tuple[Path, str]) -> None:
    model_dir, output = quickstart
    losses = training_losses(output)
    assert losses[-1] < losses[0] - 0.5, f"the loss did not fall: {losses}"
    assert "sample from pipeline('text-generation'):\nReturn the" in output
    for name in (*SAVED_FILES, "tokenizer.json", "tokenizer_config.json"):
        assert (model_dir / name).is_file(), name
    assert listed_files(output, "saved to") == listed_files(WORKFLOWS_PAGE.read_text(), "saved to ./turner-quickstart/")

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert tokenizer.decode(tokenizer("Return the value.")["input_ids"]) == "Return the value."
    generator = pipeline("text-generation", model=str(model_dir))
    text = generator("The ", max_new_tokens=10, do_sample=False)[0]["generated_text"]
    assert text.startswith("The ") and len(text) == 14  # one character per token

    card = ModelCard.load(model_dir / "README.md")
    assert card.data.pipeline_tag == "text-generation" and card.data.library_name == "transformers"
    results = {result.metric_type: result.metric_value for result in card.data.eval_results}
    assert results["perplexity"] == pytest.approx(printed_number(output, "perplexity"), abs=0.01)
    assert results["loss"] == pytest.approx(math.log(results["perplexity"]), abs=1e-3)
    assert "trust_remote_code=True" in card.text and 'model_id = "lm"' in card.text


def test_quickstart_rejects_bad_flags_naming_the_flag_the_value_and_what_is_valid(runs: Runs) -> None:
    for flags, message in BAD_FLAGS.items():
        output = runs.output(f"quickstart {' '.join(flags)}", expect_failure=True)
        assert message in output, output[-2000:]  # argparse's usage error, or the config's own ValueError
    assert not (runs.folder / "turner-quickstart").exists(), "a refused run saved a model"


def test_generate_continues_a_prompt_and_refuses_what_one_process_cannot_do(runs: Runs) -> None:
    for flags, message in GENERATE_FLAGS.items():
        output = runs.output(f"generate.py {' '.join(flags)}", expect_failure=message is not None)
        if message is None:
            text = output.split("parameters in one process\n", 1)[1].splitlines()[0]  # the prompt and what follows
            assert text.startswith("Return the") and len(text) > len("Return the"), output[-2000:]
        else:
            assert message in output, output[-2000:]


def test_every_example_answers_help_with_the_same_flag_names(runs: Runs) -> None:
    common = ("--output-dir", "--max-steps", "--num-train-epochs", "--learning-rate", "--seed")
    common += ("--per-device-train-batch-size", "--per-device-eval-batch-size", "--use-cpu", "--report-to")
    for script in EXAMPLE_SCRIPTS:
        output = runs.output(f"{script} --help")
        assert output.startswith(f"usage: {script} "), script
        if script not in ("push_to_hub.py", "generate.py"):  # they train nothing
            assert all(flag in output for flag in common), script
        if script.startswith("train_") and script not in WITHOUT_FSDP:
            assert "--fsdp-size" in output, script


def test_train_causal_lm_on_a_datasets_folder_with_a_bpe_tokenizer(runs: Runs) -> None:
    output = runs.output("bpe")
    losses = training_losses(output)
    assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
    tokenizer = AutoTokenizer.from_pretrained(runs.folder / "bpe")
    assert 256 < len(tokenizer) <= 300, len(tokenizer)  # bytes + specials + merges learned here
    tokens = tokenizer("the quick brown fox")["input_ids"]
    assert len(tokens) < len("the quick brown fox") / 2, f"the BPE merges do not shorten the text: {tokens}"
    card = ModelCard.load(runs.folder / "bpe" / "README.md")
    assert card.data.datasets == ["my_data"], card.data.datasets
    no_column = runs.output("no such column", expect_failure=True)
    assert "the dataset has no column 'text': its columns are ['body']" in no_column, no_column[-2000:]


def test_train_causal_lm_continues_a_saved_model_on_a_text_file(runs: Runs, quickstart: tuple[Path, str]) -> None:
    output = runs.output("continued")
    assert "text: zen" in output, output[-2000:]
    card = ModelCard.load(runs.folder / "zen" / "README.md")
    assert card.data.base_model == str(quickstart[0]), card.data.base_model
    assert "fine-tuned from" in card.text, card.text
    for name, said in {
        "no such model folder": "--model_name_or_path 'no-such-folder' is not valid: no saved model folder",
        "no such text file": "--train_file 'no-such.txt' is not valid: no such file in ",
    }.items():  # refused as the flags are parsed: the usage, then one line
        output = runs.output(name, expect_failure=True)
        assert said in output.strip().splitlines()[-1] and "Traceback" not in output, output[-2000:]


def test_lora_on_q_and_v_trains_and_the_merged_model_matches_the_adapter(
    runs: Runs, quickstart: tuple[Path, str]
) -> None:
    from peft import PeftModel

    output, lora = runs.output("lora"), runs.folder / "lora"
    trainable = printed_number(output, "trainable%:")
    assert 0 < trainable < 10, trainable
    assert "merged model matches the adapter model" in output, output[-2000:]
    documented = listed_files(WORKFLOWS_PAGE.read_text(), "saved to ./turner-lora/")
    assert listed_files(output, "saved to") == documented, "finetune_lora.py saved other files than the page shows"
    adapter_config = json.loads((lora / "adapter" / "adapter_config.json").read_text())
    assert sorted(adapter_config["target_modules"]) == ["qkv_proj"], adapter_config["target_modules"]

    tokenizer = AutoTokenizer.from_pretrained(lora)
    inputs = tokenizer(["def main(argv):", "return parser"], return_tensors="pt", padding=True)
    base = AutoModelForCausalLM.from_pretrained(quickstart[0]).eval()
    with torch.no_grad():
        base_logits = base(**inputs).logits
        adapter_model = PeftModel.from_pretrained(base, lora / "adapter").eval()
        adapter_logits = adapter_model(**inputs).logits
        merged = AutoModelForCausalLM.from_pretrained(lora).eval()
        merged_logits = merged(**inputs).logits
    assert not any("lora" in name for name, _ in merged.named_parameters()), "the merged model kept LoRA layers"
    assert (adapter_logits - base_logits).abs().max() > 1e-4, "the adapter learned nothing"
    torch.testing.assert_close(merged_logits, adapter_logits, atol=1e-4, rtol=1e-4)
    wrong_target = runs.output("no such lora target", expect_failure=True)
    # PEFT's own message
    assert "c_attn" in wrong_target and "not found in the base model" in wrong_target, wrong_target[-2000:]


def test_text_classifier_fine_tunes_the_language_model_on_a_csv(runs: Runs) -> None:
    output, moods = runs.output("text classifier"), runs.folder / "moods"
    accuracy = printed_number(output, "test accuracy:")
    assert accuracy >= 0.9, output[-2000:]
    classifier = pipeline("text-classification", model=str(moods))
    prediction = classifier("Error 999: the build failed again.")[0]
    assert prediction["label"] == "sad", prediction
    card = ModelCard.load(moods / "README.md")
    assert card.data.pipeline_tag == "text-classification", card.data.pipeline_tag
    assert card.data.eval_results[0].metric_value == pytest.approx(accuracy, abs=1e-4), (
        "the card's accuracy is not the run's"
    )
    no_label = runs.output("no label column", expect_failure=True)
    assert "--label_column 'label' is not valid" in no_label and "['sentence', 'mood']" in no_label, no_label[-2000:]


@pytest.mark.slow
def test_quickstart_with_its_defaults_learns_and_saves(tmp_path: Path) -> None:
    output = run_example("quickstart.py", tmp_path=tmp_path, timeout=1800)
    print(output)  # the numbers docs/workflows.md quotes: shown with `pytest -s`
    losses = training_losses(output)
    assert losses[0] > 4.0 and losses[-1] < 1.9, losses  # from uniform over ~100 characters to below 1.9 nats
    assert printed_number(output, "held-out loss") <= 1.90
    prompt = "Return the"  # then 100 new characters, one token each
    sample = output.split(f"sample from pipeline('text-generation'):\n{prompt}", 1)[1][:100]
    words = re.findall(r"[A-Za-z]+", sample)
    corpus_words = set(re.findall(r"[A-Za-z]+", data.stdlib_docstrings()))  # the quickstart's corpus
    known = [word for word in words if word in corpus_words]
    assert len(words) >= 8 and len(known) >= 0.8 * len(words), f"the sample does not read as words: {sample!r}"
    assert len(set(words)) >= 0.65 * len(words), f"the sample repeats itself: {sample!r}"
    assert (tmp_path / "turner-quickstart" / "model.safetensors").is_file()


def test_flags_run_clm_users_know_and_an_arguments_file_take_effect(runs: Runs) -> None:
    """Five `TrainingArguments` fields the scripts did not take before (evaluation and saving every 4 steps, the best
    checkpoint loaded at the end, a cosine schedule with restarts and its keywords, gradient clipping, Adam's beta2),
    from a YAML file (`ARGUMENTS_FILE`) as transformers' run_clm.py reads one, with a flag after it that wins."""
    output = runs.output("arguments file")
    assert "held-out loss" in output, output[-2000:]

    saved = torch.load(runs.folder / "out" / "training_args.bin", weights_only=False)
    assert (saved.eval_strategy, saved.eval_steps, saved.save_strategy, saved.save_steps) == ("steps", 4, "steps", 4)
    assert saved.load_best_model_at_end and saved.metric_for_best_model == "eval_loss"
    assert saved.lr_scheduler_type == "cosine_with_restarts" and saved.lr_scheduler_kwargs == {"num_cycles": 2}
    assert (saved.max_grad_norm, saved.adam_beta2, saved.seed) == (0.5, 0.95, 3)  # --seed after the file wins
    state = json.loads((runs.folder / "out" / "checkpoint-12" / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"] if "eval_loss" in entry] == [4, 8, 12]
    best = min((entry["eval_loss"], entry["step"]) for entry in state["log_history"] if "eval_loss" in entry)
    assert state["best_model_checkpoint"] == f"out/checkpoint-{best[1]}"  # loaded at the end
    rates = [entry["learning_rate"] for entry in state["log_history"] if "learning_rate" in entry]
    assert rates[0] == rates[6] == 2e-3 and rates[5] < rates[0]  # two cosine cycles of 6 steps: restarted at step 7


def test_train_masked_lm_pretrains_a_model_that_fills_masks_in_the_pipeline(runs: Runs) -> None:
    output, model_dir = runs.output("masked lm"), runs.folder / "masked"
    losses = training_losses(output)
    assert losses[-1] < losses[0] - 0.5, f"the loss did not fall: {losses}"
    assert "pipeline('fill-mask') on 'Explicit is <mask> than implicit.':" in output
    filler = pipeline("fill-mask", model=str(model_dir))
    assert isinstance(filler.model, TurnerForMaskedLM) and not filler.model.config.is_causal
    guesses = filler("Explicit is <mask> than implicit.", top_k=5)
    scores = [guess["score"] for guess in guesses]
    assert len(guesses) == 5 and scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1 + 1e-6
    assert all(guess["sequence"].startswith("Explicit is") for guess in guesses)
    card = ModelCard.load(model_dir / "README.md")
    assert card.data.pipeline_tag == "fill-mask" and 'pipeline("fill-mask", model=model_id' in card.text
    results = {result.metric_type: result.metric_value for result in card.data.eval_results}
    assert results["loss"] == pytest.approx(printed_number(output, "held-out loss"), abs=1e-3)
