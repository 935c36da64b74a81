"""Past one process: tensor parallel and FSDP2 through `from_pretrained(distributed_config=...)`, checked in real
processes (gloo on 127.0.0.1, a free port, a timeout) against one process, for every switch. The plans themselves
are checked in this process: every rule names a module the config builds, and what cannot be sharded is refused."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import transformers
from PIL import Image
from transformers import AutoModelForCausalLM, pipeline
from transformers.distributed.parallel_utils import replace_layer_number_by_wildcard

from turner_tfm import (
    TurnerConfig,
    TurnerForCausalLM,
    TurnerForImageClassification,
    TurnerForMaskedLM,
    TurnerForQuestionAnswering,
    TurnerForSequenceClassification,
    TurnerForTokenClassification,
    TurnerModel,
)
from turner_tfm.pretrained_turner import TENSOR_PARALLEL_TORCH

from .conftest import TORCH_FLOORS
from .fsdp_worker import global_batch, tiny_model, train
from .parallel_worker import CASES
from .test_workflows_classifiers import write_digit_folder
from .tiny import image_config, text_config
from .workflow_utils import TINY_MODEL, example, free_port, run_example, run_examples, script_env

REPO = Path(__file__).resolve().parents[1]
WORLD_SIZE = 2
# torchrun on this machine alone, WORLD_SIZE processes
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(WORLD_SIZE))
COMBINED = ("everything", "classifier-everything", "wide")  # the slow sweep
SWITCHES = [case for case, (head, _) in CASES.items() if head == "lm" and case not in (*COMBINED, "odd-heads")]


def launch_ranks(*checks: str, tmp_path: Path, timeout: float = 300) -> str:
    """Run `tests/parallel_worker.py CHECK ...` in WORLD_SIZE processes; return their output, rank by rank. If any
    process fails or the run outlasts `timeout`, every process is stopped and the test fails showing every rank's
    output."""
    env = script_env(tmp_path, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(WORLD_SIZE))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.parallel_worker", str(tmp_path), *checks],
            cwd=tmp_path,
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(WORLD_SIZE)
    ]
    deadline, outputs = time.monotonic() + timeout, []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
    except subprocess.TimeoutExpired:
        outputs.append(f"(no exit within {timeout} s)")
    finally:
        for process in processes:
            process.kill()
    if len(outputs) < WORLD_SIZE or any(process.returncode for process in processes):
        report = "\n".join(
            f"===== rank {rank} (exit {process.returncode}) =====\n{output[-4000:]}"
            for rank, (process, output) in enumerate(zip(processes, outputs, strict=True))
        )
        pytest.fail(f"parallel_worker.py {' '.join(checks)} failed:\n{report}")
    return "\n".join(outputs)


# The Auto class each FSDP case's checkpoints load with, and the class it gives
FSDP_AUTO_CLASSES = {
    "lm": ("AutoModelForCausalLM", TurnerForCausalLM),
    "masked-lm": ("AutoModelForMaskedLM", TurnerForMaskedLM),
}
HEADS = [
    "sequence-classifier",
    "image-classifier",
    "masked-lm",
    "masked-lm-untied",
    "token-classifier",
    "question-answering",
]
TP_CASES = [*SWITCHES, *HEADS]
FSDP_CASES = ["tied", "untied", "masked-lm"]
# tensor parallel runs from pretrained_turner.TENSOR_PARALLEL_TORCH (torch 2.10); below it, it is refused by name
TENSOR_PARALLEL = torch.__version__ >= TENSOR_PARALLEL_TORCH
TENSOR_PARALLEL_REFUSED = f"tensor parallel is refused below torch {TENSOR_PARALLEL_TORCH}"


@pytest.fixture(scope="module")
def checked_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One launch of WORLD_SIZE processes for the tensor-parallel, FSDP, refusal and `fully_shard` checks of the
    tests below, which read what it printed and saved (each process pays some 10 s of imports: one launch, not
    four). Its output and its folder."""
    work_dir = tmp_path_factory.mktemp("parallel")
    checks = [*(f"tp:{case}" for case in TP_CASES if TENSOR_PARALLEL), *(f"fsdp:{case}" for case in FSDP_CASES)]
    checks += ["refuse:odd-heads:tp", "refuse:batchnorm:fsdp", "fully-shard:fsdp"]
    return launch_ranks(*checks, tmp_path=work_dir), work_dir


def assert_every_rank_said(output: str, cases: list[str], message: str) -> None:
    for rank in range(WORLD_SIZE):
        for case in cases:
            assert f"rank {rank}: {case}: {message}" in output, f"rank {rank} did not report {case!r}:\n{output}"


@pytest.mark.torch_2_10(reason=TENSOR_PARALLEL_REFUSED)
def test_tensor_parallel_matches_one_process_for_every_switch_and_head(checked_ranks: tuple[str, Path]) -> None:
    output, _ = checked_ranks
    assert_every_rank_said(output, TP_CASES, "logits, loss")
    assert_every_rank_said(output, SWITCHES, "greedy generate() gives the same tokens")
    # the vocabulary of 99 does not divide by 2: the ranks hold 50 and 49 rows of the input embedding
    assert "rank 0: tied: holds 50 of 99 rows" in output and "rank 1: tied: holds 49 of 99 rows" in output, (
        f"the embedding is not split 50/49 over the vocabulary of 99:\n{output}"
    )


@pytest.mark.slow
@pytest.mark.torch_2_10(reason=TENSOR_PARALLEL_REFUSED)
def test_tensor_parallel_matches_one_process_with_switches_combined(tmp_path: Path) -> None:
    output = launch_ranks(*(f"tp:{case}" for case in COMBINED), tmp_path=tmp_path)
    assert_every_rank_said(output, list(COMBINED), "logits, loss")


def test_the_tensor_parallel_tests_skip_on_exactly_the_torch_that_refuses_it() -> None:
    assert TORCH_FLOORS["torch_2_10"] == TENSOR_PARALLEL_TORCH, (
        f"pretrained_turner refuses tensor parallel below torch {TENSOR_PARALLEL_TORCH}; its tests are torch_2_10"
    )


def test_fsdp_trains_like_ddp_and_its_checkpoints_load_in_one_process(checked_ranks: tuple[str, Path]) -> None:
    output, work_dir = checked_ranks
    assert_every_rank_said(output, FSDP_CASES, "3 SGD steps under FSDP give DDP's weights")
    assert "rank 0: untied: FSDP wraps lm_head, model.embeddings.embed_tokens, model.layers.0" in output, (
        f"the untied head and embedding are not wrapped on their own:\n{output}"
    )
    for case in FSDP_CASES:
        expected = torch.load(work_dir / f"{case}-expected.pt")
        for saved in ("full", "dcp"):  # save_pretrained(), and save_pretrained(distributed_checkpoint=True)
            folder = work_dir / f"{case}-{saved}"
            auto_name, model_class = FSDP_AUTO_CLASSES[CASES[case][0]]
            auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
            assert auto_map[auto_name] == f"modeling_turner.{model_class.__name__}", auto_map
            assert "modeling_turner.py" in {path.name for path in folder.iterdir()}
            assert not list(folder.glob("_fsdp*.py")), "torch's FSDP sources were copied as the model's code"
            model = getattr(transformers, auto_name).from_pretrained(folder).eval()
            assert type(model) is model_class
            with torch.no_grad():
                logits = model(**expected["inputs"]).logits
            torch.testing.assert_close(logits, expected["logits"], rtol=1e-5, atol=1e-5, msg=f"{case}-{saved}")


def test_unshardable_configs_are_refused_by_name_before_loading(checked_ranks: tuple[str, Path]) -> None:
    """A config that cannot be sharded, and below `TENSOR_PARALLEL_TORCH` tensor parallelism itself (transformers
    would load the stacked qkv_proj weight into the wrong heads), are refused by name before any weight loads."""
    output, _ = checked_ranks
    odd_heads = "TurnerConfig: `num_attention_heads`=3 is invalid"
    if not TENSOR_PARALLEL:
        odd_heads = (
            f"Tensor parallelism (tp_size=2) needs torch >= {TENSOR_PARALLEL_TORCH}; this is torch {torch.__version__}"
        )
    refusals = [
        f"rank 1: odd-heads: refused under tp: {odd_heads}",
        "rank 0: batchnorm: refused under fsdp: TurnerConfig: `normalization`='batchnorm' is invalid",
    ]
    for refusal in refusals:
        assert refusal in output, f"not refused by name: {refusal!r} missing from:\n{output}"


def test_fsdp2_shards_turner_blocks_on_cpu_and_matches_one_process(checked_ranks: tuple[str, Path]) -> None:
    """`fully_shard` by hand on each Turner block and the model (tests/fsdp_worker.py): each process keeps half of
    each matrix, trains on half the batch, and the gathered weights equal one process trained on the whole batch."""
    output, work_dir = checked_ranks
    held = [int(n) for n in re.findall(r"holds (\d+) of 3072 qkv_proj weights", output)]
    assert sorted(held) == [1536, 1536], f"each process should keep half of each matrix:\n{output[-2000:]}"

    reference = tiny_model()
    train(reference, global_batch())  # the whole batch in one process
    sharded = AutoModelForCausalLM.from_pretrained(work_dir / "fsdp")
    expected = reference.state_dict()
    for name, tensor in sharded.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], atol=2e-5, rtol=1e-4, msg=name)
    assert not torch.equal(
        expected["model.layers.0.mlp.up_proj.weight"], tiny_model().model.layers[0].mlp.up_proj.weight
    ), "the reference did not train: comparing untrained weights tests nothing"


def all_names(model: torch.nn.Module) -> set[str]:
    named = [*model.named_modules(), *model.named_parameters()]
    return {replace_layer_number_by_wildcard(name) for name, _ in named}


@pytest.mark.parametrize(
    ("model_class", "config"),
    [
        (TurnerForCausalLM, text_config(**overrides))
        for _, (_, overrides) in CASES.items()
        if "hidden_size" not in overrides
    ]
    + [
        (TurnerForSequenceClassification, text_config(is_causal=False, use_pooler=True, classifier_pooling="cls")),
        (TurnerForImageClassification, image_config()),
        (TurnerModel, text_config(mlp_hidden_layers=2, share_query_key=True)),
        (TurnerForMaskedLM, text_config(is_causal=False)),
        (TurnerForMaskedLM, text_config(is_causal=False, tie_word_embeddings=False)),
        (TurnerForTokenClassification, text_config()),
        (TurnerForQuestionAnswering, text_config()),
    ],
)
def test_every_plan_rule_names_a_module_the_config_builds(model_class: type, config: TurnerConfig) -> None:
    model = model_class(config)
    names = all_names(model)
    for plan in (model.tp_plan, model.fsdp_plan):
        assert set(plan) <= names, f"rules naming nothing: {sorted(set(plan) - names)}"
    projections = {name.rsplit(".", 1)[-1] for name in model.tp_plan if ".layers." in f".{name}"}
    qkv_style = model.tp_plan[next(name for name in model.tp_plan if name.endswith("qkv_proj"))]
    assert qkv_style == f"stacked_heads_colwise_{2 if config.share_query_key else 3}"
    assert ("hidden_proj" in projections) == (config.mlp_hidden_layers == 2)
    embedding_rules = [style for name, style in model.tp_plan.items() if name.endswith("embed_tokens")]
    assert embedding_rules == ([] if config.is_image_model else ["embedding_rowwise"])


def test_a_tied_head_shares_the_root_fsdp_group_and_an_untied_one_has_its_own() -> None:
    tied, untied = TurnerForCausalLM(text_config()), TurnerForCausalLM(text_config(tie_word_embeddings=False))
    assert "lm_head" not in tied.fsdp_plan and "model.embeddings.embed_tokens" not in tied.fsdp_plan
    assert untied.fsdp_plan["lm_head"] == "keep_full_weight"
    assert untied.fsdp_plan["model.embeddings.embed_tokens"] == "free_full_weight"
    assert untied.fsdp_plan["model.layers.*"] == "free_full_weight"


@pytest.mark.parametrize(
    ("overrides", "sizes", "field"),
    [
        ({"hidden_size": 48, "num_attention_heads": 3}, {"tp_size": 2}, "num_attention_heads"),
        ({"hidden_size": 48, "num_attention_heads": 6}, {"tp_size": 4}, "num_attention_heads"),
        ({"normalization": "batchnorm"}, {"data_parallel_size": 2}, "normalization"),
    ],
)
def test_check_parallelism_names_the_field(overrides: dict, sizes: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"`{field}`"):
        text_config(**overrides).check_parallelism(**sizes)


def test_check_parallelism_accepts_what_shards_exactly() -> None:
    text_config(normalization="batchnorm").check_parallelism(tp_size=2)  # every rank sees the whole batch
    text_config(hidden_size=48, num_attention_heads=6).check_parallelism(tp_size=3, data_parallel_size=2)


@pytest.mark.slow  # a smoke run of benchmarks/bench_parallel.py; the tensor-parallel numbers are checked by default
@pytest.mark.torch_2_10(reason=TENSOR_PARALLEL_REFUSED)
def test_the_parallel_benchmark_runs_on_two_processes_and_halves_the_parameters(tmp_path: Path) -> None:
    command = list(TORCHRUN)
    command += ["-m", "benchmarks.bench_parallel", "--hidden-size", "128", "--num-hidden-layers", "2"]
    command += ["--vocab-size", "512", "--tokens", "16", "--prompt", "8", "--new-tokens", "4", "--repeats", "2"]
    command += ["--warmup", "1", "--json", str(tmp_path / "parallel.json")]
    result = subprocess.run(command, cwd=REPO, env=script_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    report = json.loads((tmp_path / "parallel.json").read_text())
    assert report["max_logit_difference"] < 1e-4
    assert {"load_before", "load_after", "noisy"} <= set(report["environment"])  # every figure says its load
    memory = report["parameter_mib_rank0"]
    assert memory["one process"] / 2 <= memory["tensor parallel"] < 0.7 * memory["one process"]  # positions: whole
    assert set(report["results"]) == {"forward", "decode"}
    assert "| decode | tensor parallel |" in result.stdout


# slow (about 90 s a lane). By default: FSDP training in the classifier script's test below, tensor parallel greedy
# generation against one process for every switch (`checked_ranks`), generate.py's refusals in test_workflows_lm
@pytest.mark.slow
@pytest.mark.torch_2_10(reason=TENSOR_PARALLEL_REFUSED)
def test_fsdp_training_script_then_tensor_parallel_generation_give_one_process_results(tmp_path: Path) -> None:
    """A user's path: train_causal_lm.py sharded with --fsdp-size 2 under torchrun, then generate.py with the saved
    model in one process and tensor parallel over two: the same text."""
    env = script_env(tmp_path, HF_HUB_DISABLE_PROGRESS_BARS="1")
    trained = run_example(
        [*TORCHRUN, *example("train_causal_lm.py")],
        *("--fsdp-size", "2", "--output-dir", "lm", "--max-steps", "2", "--block-size", "32"),
        *("--max-new-tokens", "5", *TINY_MODEL),
        tmp_path=tmp_path,
        env=env,
    )
    assert trained.count("held-out loss") == 1  # printed by the first process only
    assert "is not supported for" not in trained  # the pipeline's class-name check, answered for FSDP<Name>
    card = (tmp_path / "lm" / "README.md").read_text()
    assert "| parallelism | FSDP2 over 2 processes (transformers' plan: DistributedConfig(fsdp_size=2)) |" in card

    flags = ("lm", "--prompt", "Return the", "--max-new-tokens", "16")
    generate = [*TORCHRUN, *example("generate.py")]
    sharded = run_example(generate, *flags, "--tp-size", "2", tmp_path=tmp_path, env=env)
    alone, refused, too_long, not_launched = run_examples(
        [
            ("generate.py", *flags),
            ("generate.py", *flags, "--tp-size", "2"),
            ("generate.py", "lm", "--max-new-tokens", "30"),
            ("train_causal_lm.py", "--fsdp-size", "2"),
        ],
        tmp_path=tmp_path,
        env=env,
        expect_failure=[False, True, True, True],
    )
    text = alone.split("parameters in one process\n", 1)[1].splitlines()[0]  # the prompt and what follows
    assert text.startswith("Return the") and len(text) > len("Return the")
    assert sharded.split("the first holds", 1)[1].splitlines()[1] == text, sharded[-2000:]
    assert sharded.count("Return the") == 1  # printed by the first process only

    assert "argument --tp-size: 2 is not valid: it must equal the number of processes, 1" in refused
    assert "argument --max-new-tokens: 30 is not valid: the model has 32 positions" in too_long
    assert "fsdp_size=2 is not valid: it must equal the number of processes, 1" in not_launched


def test_a_classifier_script_trains_fully_sharded_and_loads_in_one_process(tmp_path: Path) -> None:
    write_digit_folder(tmp_path / "digits", classes=(0, 1, 7), per_class=12)
    output = run_example(
        [*TORCHRUN, *example("train_image_classifier.py")],
        *("--fsdp-size", "2", "--train-dir", "digits", "--image-size", "8", "--patch-size", "4"),
        *("--output-dir", "img", "--num-train-epochs", "2", "--per-device-train-batch-size", "8", *TINY_MODEL),
        tmp_path=tmp_path,
        env=script_env(tmp_path, HF_HUB_DISABLE_PROGRESS_BARS="1"),
    )
    assert output.count("pipeline('image-classification'):") == 1  # every process classifies, the first prints
    assert "is not supported for" not in output
    card = (tmp_path / "img" / "README.md").read_text()
    assert "| parallelism | FSDP2 over 2 processes (transformers' plan: DistributedConfig(fsdp_size=2)) |" in card
    classifier = pipeline("image-classification", model=str(tmp_path / "img"))
    assert {p["label"] for p in classifier(Image.open(tmp_path / "digits" / "7" / "0.png"))} == {"0", "1", "7"}
