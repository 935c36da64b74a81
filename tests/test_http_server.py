"""`turner-serve`: transformers' own OpenAI-compatible server (`transformers serve`) on a Turner folder, started as a
real process on 127.0.0.1 and talked to over HTTP with the OpenAI client (and raw sockets for hostile clients).

Two servers run the same checks: the package's own classes with sequential `generate()`, and the folder's own code
(`--trust-remote-code`) under `--continuous-batching` (paged attention). Every answer at temperature 0 must equal
`generate()`'s greedy tokens from the same folder in this process."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from threading import Barrier

import psutil
import pytest
import torch
from openai import APIError, APIStatusError, BadRequestError, OpenAI
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from turner_tfm import TurnerForCausalLM, TurnerForSequenceClassification

from .tiny import text_config
from .workflow_utils import free_port, run_module, script_env

SPECIALS = ["<pad>", "<unk>", "<eos>"]
CHARACTERS = [chr(code) for code in range(32, 127)] + ["\n"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
POSITIONS = 64  # learned positions: a prompt and its completion must fit in 64
STARTUP_TIMEOUT = 180  # seconds for the server to answer /health
REQUEST_TIMEOUT = 120
# Continuous batching runs with turner-serve's own paged-cache size (upstream's would be most of the machine's RAM):
# room for 16 requests (--cb-max-requests' default) of 64 positions, one 256-token block each.
MAX_TOKENS_LIMIT = 32  # the servers' --max-tokens-limit: new tokens one request may ask for
SERVERS = {  # name: (folder, turner-serve options, the command: the installed script or the module)
    "installed": ("chat", ["--max-tokens-limit", str(MAX_TOKENS_LIMIT)], "script"),
    "remote-code-cb": (
        "chat",
        ["--trust-remote-code", "--continuous-batching", "--max-tokens-limit", str(MAX_TOKENS_LIMIT)],
        "module",
    ),
}
FOLDER_TEMPERATURE = 1.5  # the `sampling` folder's generation config: do_sample, at this temperature
SERVER_MEMORY = 2 * 2**30  # bytes of RSS a server of these tiny models stays under, its paged cache included
SCRIPT = Path(sys.executable).with_name("turner-serve")  # what `pip install` put beside this interpreter


def char_tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    """One token per printable ASCII character, plus <pad>, <unk> and <eos> (ids 0, 1, 2)."""
    vocab = {token: index for index, token in enumerate([*SPECIALS, *CHARACTERS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(".|\n"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        unk_token="<unk>",
        eos_token="<eos>",
        model_max_length=POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = chat_template
    return tokenizer


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """`chat`: a causal LM with a chat template; `plain`: the same model, its tokenizer without one. A wide
    initialisation (std 0.5) so that greedy continuations differ from prompt to prompt and token to token."""
    root = tmp_path_factory.mktemp("served")
    torch.manual_seed(0)
    config = text_config(vocab_size=len(SPECIALS) + len(CHARACTERS), max_position_embeddings=POSITIONS)
    config.initializer_range = 0.5
    model = TurnerForCausalLM(config)
    paths = {}
    for name, template in (("chat", CHAT_TEMPLATE), ("plain", None), ("sampling", None)):
        # `sampling`: the same weights, a generation config that samples (do_sample, temperature 1.5)
        model.generation_config.do_sample = name == "sampling"
        model.generation_config.temperature = FOLDER_TEMPERATURE if name == "sampling" else None
        model.save_pretrained(root / name)
        char_tokenizer(template).save_pretrained(root / name)
        paths[name] = root / name
    return paths


# ---- the server process -----------------------------------------------------------------------------------------


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    log: Path
    model: str  # the folder, as requests name the model

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def client(self) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key="unused", timeout=REQUEST_TIMEOUT, max_retries=0)

    def alive(self) -> bool:
        return self.process.poll() is None


def start_server(folder: Path, options: list[str], tmp_path: Path, launcher: list[str] | None = None) -> Server:
    """`turner-serve folder options` on a free port of 127.0.0.1, once its /health answers. `launcher`: the command
    that starts it (default `python -m turner_tfm.serve`)."""
    launcher = launcher or [sys.executable, "-m", "turner_tfm.serve"]
    port = free_port()
    command = [*launcher, str(folder), *options, "--host", "127.0.0.1"]
    command += ["--port", str(port), "--device", "cpu", "--log-level", "info"]
    return launch(command, port, folder, script_env(tmp_path), tmp_path / f"server-{port}.log", "turner-serve")


def launch(
    command: list[str], port: int, folder: Path, env: dict, log: Path, name: str, timeout: float = STARTUP_TIMEOUT
) -> Server:
    """Start `command`, a server of `folder` on 127.0.0.1:`port` writing to `log`, and return it once its /health
    answers; fail with its output if it exits or does not answer within `timeout` seconds."""
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
    server = Server(process, port, log, str(folder))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.alive():
            pytest.fail(f"{name} exited with {process.returncode}; its output ends:\n{server.output()[-6000:]}")
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=5) as response:
                if response.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.5)
    stop_server(server)
    pytest.fail(f"{name} did not answer /health in {timeout} s; its output ends:\n{server.output()[-6000:]}")


def stop_server(server: Server) -> None:
    """SIGTERM to the server's pid, SIGKILL if it has not exited 20 s later."""
    if server.alive():
        os.kill(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=20)


@pytest.fixture(scope="module", params=list(SERVERS))
def server(request, folders, tmp_path_factory):
    folder, options, launcher = SERVERS[request.param]
    if launcher == "script":
        assert SCRIPT.is_file(), f"no {SCRIPT}: install the package (pip install -e '.[dev]')"
    command = [str(SCRIPT)] if launcher == "script" else None
    running = start_server(folders[folder], options, tmp_path_factory.mktemp(request.param), command)
    yield running
    stop_server(running)
    assert running.process.returncode is not None


def greedy_reference(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Callable[..., tuple[str, int]]:
    """Greedy `generate()` of `model` on a prompt or on chat `messages`, as a server answers at temperature 0:
    (text, token count)."""

    def generate(max_new_tokens: int, prompt: str | None = None, messages: list | None = None) -> tuple[str, int]:
        if messages is not None:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        else:
            ids = tokenizer(prompt)["input_ids"]
        with torch.no_grad():
            output = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)
        new = output[0, len(ids) :]
        return tokenizer.decode(new, skip_special_tokens=True), len(new)

    return generate


def streamed_chat_text(client: OpenAI, model: str, messages: list[dict], max_tokens: int) -> str:
    """The text of a chat completion streamed at temperature 0: its chunks' deltas, joined."""
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True
    )
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


@pytest.fixture(scope="module")
def reference(folders):
    """Greedy `generate()` on the `chat` folder, loaded here with the package's classes: (text, token count)."""
    model = AutoModelForCausalLM.from_pretrained(folders["chat"]).eval()
    return greedy_reference(model, AutoTokenizer.from_pretrained(folders["chat"]))


@pytest.fixture(scope="module")
def sampled(folders):
    """Sampling `generate()` on the `chat` folder as OpenAI means a request's fields: the whole distribution at
    `temperature` (no top-k), the `top_p` nucleus, torch seeded with `seed` just before: (text, token count)."""
    model = AutoModelForCausalLM.from_pretrained(folders["chat"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(folders["chat"])

    def generate(prompt: str, max_new_tokens: int, temperature: float, seed: int, top_p: float = 1.0) -> tuple:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        torch.manual_seed(seed)
        with torch.no_grad():
            output = model.generate(
                ids, max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature, top_p=top_p, top_k=0
            )
        new = output[0, ids.shape[1] :]
        return tokenizer.decode(new, skip_special_tokens=True), len(new)

    return generate


def check_answers_correctly(server: Server, reference, prompt: str = "The quick brown fox") -> None:
    """A good request after whatever came before: the server is up and its answer is `generate()`'s."""
    assert server.alive(), server.output()[-4000:]
    answer = server.client().completions.create(model=server.model, prompt=prompt, max_tokens=12, temperature=0)
    assert (answer.choices[0].text, answer.usage.completion_tokens) == reference(12, prompt=prompt)


# ---- the command and the lookup it works around -----------------------------------------------------------------


def test_turner_serve_is_an_installed_command():
    commands = {entry.name: entry.value for entry in entry_points(group="console_scripts")}
    assert commands.get("turner-serve") == "turner_tfm.serve:main"


def test_the_servers_model_lookup_finds_a_turner_folder_only_with_the_workaround(folders):
    """`ModelManager._load_model` reads `getattr(transformers, config.architectures[0])`: an AttributeError for a
    Turner folder until `expose_architecture` sets the class on the object that line reads."""
    from transformers.cli.serving import model_manager

    from turner_tfm.serve import expose_architecture

    manager = model_manager.ModelManager(device="cpu")
    assert not hasattr(model_manager.transformers, "TurnerForCausalLM")
    with pytest.raises(AttributeError, match="TurnerForCausalLM"):
        manager._load_model(f"{folders['chat']}@main")
    try:
        assert expose_architecture(str(folders["chat"]), trust_remote_code=False) is TurnerForCausalLM
        assert type(manager._load_model(f"{folders['chat']}@main")) is TurnerForCausalLM
    finally:
        delattr(model_manager.transformers, "TurnerForCausalLM")


def test_a_folder_that_is_not_a_causal_lm_is_refused_by_name(tmp_path):
    TurnerForSequenceClassification(text_config(is_causal=False)).save_pretrained(tmp_path / "classifier")
    from turner_tfm.serve import expose_architecture

    with pytest.raises(SystemExit, match=r"holds a TurnerForSequenceClassification.*needs the causal language model"):
        expose_architecture(str(tmp_path / "classifier"), trust_remote_code=False)


def test_turner_serve_refuses_a_path_without_a_config_and_names_it(tmp_path, capsys):
    from turner_tfm.serve import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "missing"), "--port", "0"])
    assert exit_info.value.code == 2
    assert f"FOLDER '{tmp_path / 'missing'}' is not a folder with a config.json" in capsys.readouterr().err


def test_turner_serve_help_lists_the_options_of_transformers_serve(capsys, monkeypatch):
    from turner_tfm.serve import main

    monkeypatch.setenv("COLUMNS", "250")  # rich shortens option names to fit a narrow terminal

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    for option in (
        "--continuous-batching",
        "--trust-remote-code",
        "--cb-num-blocks",
        "--cb-max-requests",
        "--port",
        "--attn-implementation",
    ):
        assert option in shown, shown


@pytest.mark.parametrize(
    ("options", "positions", "expected"),
    [
        (["--continuous-batching"], 64, ["--cb-num-blocks", "16", "--cb-max-batch-tokens", "1024"]),
        (["--continuous-batching"], 256, ["--cb-num-blocks", "16", "--cb-max-batch-tokens", "4096"]),
        (["--continuous-batching"], 2048, ["--cb-num-blocks", "128", "--cb-max-batch-tokens", "8192"]),
        (
            ["--continuous-batching", "--cb-max-requests", "3"],
            300,
            ["--cb-num-blocks", "6", "--cb-max-batch-tokens", "900"],
        ),
        (
            ["--continuous-batching", "--cb-block-size", "32"],
            64,
            ["--cb-num-blocks", "32", "--cb-max-batch-tokens", "1024"],
        ),
        (["--continuous-batching", "--cb-max-batch-tokens", "77"], 64, ["--cb-num-blocks", "16"]),
        (["--continuous-batching", "--cb-num-blocks", "5"], 64, []),  # the user's size, as given
        ([], 64, []),  # no paged cache
    ],
    ids=[
        "default",
        "256-positions",
        "batch-tokens-capped",
        "max-requests",
        "block-size",
        "batch-tokens-given",
        "num-blocks-given",
        "no-continuous-batching",
    ],
)
def test_the_paged_cache_is_sized_from_the_positions_and_the_requests_unless_given(options, positions, expected):
    """Blocks: --cb-max-requests whole requests of max_position_embeddings positions, a whole number of blocks of the
    page size each; tokens a forward pass: that many whole prompts, at most upstream's 8192."""
    from turner_tfm.serve import paged_cache_options, serve_command

    with serve_command().make_context("turner-serve", ["folder", *options]) as context:
        assert paged_cache_options(context.params, positions) == expected


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_turner_serve_refuses_a_cb_max_requests_that_is_not_a_positive_integer(folders, capsys, value):
    """Refused by the parser before the folder is read (nothing is loaded, no server starts)."""
    from turner_tfm.serve import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(folders["chat"]), "--continuous-batching", "--cb-max-requests", value])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "Invalid value for '--cb-max-requests'" in error, error


def test_turner_serve_without_a_folder_says_what_it_needs(capsys):
    from turner_tfm.serve import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--port", "0"])
    assert exit_info.value.code == 2
    assert "give the FOLDER to serve: turner-serve FOLDER [transformers serve options]" in capsys.readouterr().err


# ---- answers equal generate() -----------------------------------------------------------------------------------


def test_the_model_list_names_the_served_model_as_requests_name_it(server, reference):
    """`GET /v1/models` (upstream: a 500, from a scan of the Hub cache) lists the one model served, under the name a
    completion request must use; the OpenAI client reads it, and a request with that name is answered."""
    models = server.client().models.list().data
    assert [(model.id, model.object, model.owned_by) for model in models] == [(server.model, "model", "turner-serve")]
    assert models[0].max_tokens_limit == MAX_TOKENS_LIMIT  # --max-tokens-limit, for clients to read
    answer = server.client().completions.create(model=models[0].id, prompt="Hi", max_tokens=12, temperature=0)
    assert (answer.choices[0].text, answer.usage.completion_tokens) == reference(12, prompt="Hi")


def test_the_server_stays_small_after_answering(server, reference):
    """Continuous batching sizes its paged cache from the positions (16 requests of 64: 16 blocks), not from the
    machine's free RAM, and says so; after 12 concurrent requests the server's memory is still that of a tiny model."""
    sizing = [line for line in server.output().splitlines() if "paged-cache blocks" in line]
    if "--continuous-batching" in server.process.args:
        assert sizing == [
            "turner-serve: continuous batching: 16 paged-cache blocks, room for 16 requests of "
            "max_position_embeddings=64 positions at once (--cb-max-requests; --cb-num-blocks sets the size itself): "
            "--cb-num-blocks 16 --cb-max-batch-tokens 1024"
        ], server.output()[-4000:]
    else:
        assert sizing == []
    prompts = [f"x{index}" for index in range(12)]
    expected = [reference(12, prompt=prompt) for prompt in prompts]

    def ask(prompt: str) -> tuple[str, int]:
        answer = server.client().completions.create(model=server.model, prompt=prompt, max_tokens=12, temperature=0)
        return answer.choices[0].text, answer.usage.completion_tokens

    with ThreadPoolExecutor(len(prompts)) as pool:
        assert list(pool.map(ask, prompts)) == expected
    memory = psutil.Process(server.process.pid).memory_info().rss
    assert memory < SERVER_MEMORY, f"the server holds {memory / 2**30:.1f} GiB"


def test_the_server_loads_the_class_it_was_asked_to(server):
    """Installed: the package's class; --trust-remote-code: the folder's copy of the code (transformers_modules)."""
    line = next(line for line in server.output().splitlines() if line.startswith("turner-serve: "))
    remote = "--trust-remote-code" in server.process.args
    expected = "transformers_modules." if remote else "turner_tfm.modeling_turner."
    assert f"TurnerForCausalLM is {expected}" in line, line


@pytest.mark.parametrize("prompt", ["Hello", "def main():\n    return"])
def test_a_completion_at_temperature_0_is_generates_greedy_text(server, reference, prompt):
    answer = server.client().completions.create(model=server.model, prompt=prompt, max_tokens=16, temperature=0)
    text, count = reference(16, prompt=prompt)
    assert answer.choices[0].text == text
    assert answer.usage.completion_tokens == count
    assert answer.choices[0].finish_reason == ("length" if count == 16 else "stop")


def test_a_chat_completion_at_temperature_0_is_generates_greedy_text(server, reference):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    answer = server.client().chat.completions.create(
        model=server.model, messages=messages, max_tokens=16, temperature=0
    )
    assert (answer.choices[0].message.content, answer.usage.completion_tokens) == reference(16, messages=messages)


def test_streamed_completions_carry_the_same_text(server, reference):
    client = server.client()
    chunks = list(
        client.completions.create(model=server.model, prompt="Once", max_tokens=16, temperature=0, stream=True)
    )
    assert "".join(chunk.choices[0].text for chunk in chunks) == reference(16, prompt="Once")[0]
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    messages = [{"role": "user", "content": "Tell me"}]
    assert streamed_chat_text(client, server.model, messages, max_tokens=16) == reference(16, messages=messages)[0]


def test_a_request_without_max_tokens_gets_the_positions_left(server, reference):
    """The server's default, 1024 new tokens, would run past the 64 learned positions: the request gets what is left."""
    prompt = "x" * 40
    answer = server.client().completions.create(model=server.model, prompt=prompt, temperature=0)
    assert (answer.choices[0].text, answer.usage.completion_tokens) == reference(POSITIONS - 40, prompt=prompt)


def test_eight_concurrent_requests_each_get_their_own_greedy_text(server, reference):
    prompts = [f"{word} {index}" for index, word in enumerate(["alpha", "beta", "gamma", "delta"] * 2)]
    lengths = [8, 20, 12, 24, 10, 16, 6, 18]
    barrier = Barrier(len(prompts))

    def ask(prompt: str, max_tokens: int) -> tuple[str, int]:
        client = server.client()
        barrier.wait(timeout=60)
        answer = client.completions.create(model=server.model, prompt=prompt, max_tokens=max_tokens, temperature=0)
        return answer.choices[0].text, answer.usage.completion_tokens

    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(ask, prompts, lengths))
    expected = [reference(length, prompt=prompt) for prompt, length in zip(prompts, lengths, strict=True)]
    assert answers == expected
    assert len({text for text, _ in answers}) > 1  # the prompts lead to different texts: a mix-up would show


# ---- hostile clients --------------------------------------------------------------------------------------------


def post_raw(server: Server, path: str, body: bytes) -> tuple[int, str]:
    """POST `body` as it is (no client-side encoding or validation); the status and the body of the answer."""
    request = urllib.request.Request(
        f"{server.url}{path}", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model": "m", "prompt": "Hi", "max_tokens": ', "JSON decode error"),
        (b'["not", "an", "object"]', "body"),
        (b'{"model": "m", "prompt": "\xff\xfe caf\xe9"}', "error parsing the body"),
    ],
    ids=["truncated-json", "json-array", "not-utf8"],
)
def test_a_body_that_is_not_a_json_object_gets_a_4xx_naming_it(server, reference, body, expected):
    status, answer = post_raw(server, "/v1/completions", body)
    assert 400 <= status < 500 and expected in answer, (status, answer)
    check_answers_correctly(server, reference)


def test_an_unknown_model_name_gets_a_400_naming_both(server, reference):
    body = {"model": "gpt-4o", "prompt": "Hi", "max_tokens": 4}
    status, answer = post_raw(server, "/v1/completions", json.dumps(body).encode())
    assert status == 400, answer
    error = json.loads(answer)["error"]  # OpenAI's shape, as every error of the server (upstream: {"detail": ...})
    assert error["message"] == f"Server is pinned to '{server.model}'; requested 'gpt-4o'."
    assert error["type"] == "invalid_request_error"
    check_answers_correctly(server, reference)


@pytest.mark.parametrize("max_tokens", [-5, 0, 2.5, True, "12"])
def test_a_max_tokens_that_is_not_a_positive_integer_gets_a_400_naming_it(server, reference, max_tokens):
    body = {"model": server.model, "prompt": "Hi", "max_tokens": max_tokens}
    status, answer = post_raw(server, "/v1/completions", json.dumps(body).encode())
    assert status == 400, answer
    assert f"max_tokens must be a positive integer, got {max_tokens!r}" in json.loads(answer)["error"]["message"]
    check_answers_correctly(server, reference)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_huge_max_tokens_gets_a_400_saying_how_many_fit(server, reference, path):
    prompt = {"prompt": "Hello"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "Hi"}]}
    body = {"model": server.model, **prompt, "max_tokens": 10**9}
    status, answer = post_raw(server, path, json.dumps(body).encode())
    message = json.loads(answer)["error"]["message"]
    assert status == 400 and "max_tokens=1000000000" in message and "ask for at most" in message, answer
    check_answers_correctly(server, reference)


@pytest.mark.parametrize("stream", [False, True])
def test_a_max_tokens_over_the_servers_limit_gets_a_400_naming_the_limit(server, reference, stream):
    """The prompt leaves 62 positions, but the server gives one request at most --max-tokens-limit new tokens."""
    asked = MAX_TOKENS_LIMIT + 8
    limit = rf"max_tokens={asked} is more new tokens than this server gives one request, {MAX_TOKENS_LIMIT} "
    with pytest.raises(BadRequestError, match=limit + r"\(turner-serve --max-tokens-limit\)"):
        server.client().completions.create(model=server.model, prompt="Hi", max_tokens=asked, stream=stream)
    answer = server.client().completions.create(model=server.model, prompt="Hi", max_tokens=MAX_TOKENS_LIMIT)
    assert answer.usage.completion_tokens == MAX_TOKENS_LIMIT
    check_answers_correctly(server, reference)


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("temperature", -0.5, "[0, 2]"),
        ("temperature", 2.5, "[0, 2]"),
        ("temperature", "hot", "[0, 2]"),
        ("top_p", 0, "(0, 1]"),
        ("top_p", 1.5, "(0, 1]"),
        ("top_p", True, "(0, 1]"),
    ],
)
def test_a_sampling_parameter_outside_openais_range_gets_a_400_naming_it(server, reference, name, value, allowed):
    body = {"model": server.model, "prompt": "Hi", "max_tokens": 4, name: value}
    status, answer = post_raw(server, "/v1/completions", json.dumps(body).encode())
    assert status == 400, answer
    message = json.loads(answer)["error"]["message"]
    assert message == f"{name} must be a number in {allowed}, as OpenAI's API takes it; got {value!r}"
    check_answers_correctly(server, reference)


@pytest.mark.parametrize("stream", [False, True])
def test_an_empty_prompt_gets_a_400_naming_it(server, reference, stream):
    """The folder's tokenizer adds no BOS token, so an empty prompt leaves generate() nothing to continue."""
    with pytest.raises(BadRequestError, match=r"the prompt is empty: .* send at least one character"):
        server.client().completions.create(model=server.model, prompt="", max_tokens=4, stream=stream)
    check_answers_correctly(server, reference)


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_longer_than_the_learned_positions_gets_a_400(server, reference, stream):
    prompt = "a" * (POSITIONS + 10)
    with pytest.raises(BadRequestError, match=rf"the prompt is {POSITIONS + 10} tokens.*max_position_embeddings"):
        server.client().completions.create(model=server.model, prompt=prompt, max_tokens=4, stream=stream)
    check_answers_correctly(server, reference)


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_longer_than_the_learned_positions_gets_a_400(server, reference, stream):
    messages = [{"role": "user", "content": "a" * POSITIONS}]
    rendered = len(f"user: {'a' * POSITIONS}\nassistant:")  # the template's text, one token a character
    with pytest.raises(BadRequestError, match=rf"the prompt is {rendered} tokens.*max_position_embeddings"):
        server.client().chat.completions.create(model=server.model, messages=messages, max_tokens=4, stream=stream)
    check_answers_correctly(server, reference)


@contextmanager
def unread_request(server: Server, body: dict) -> Iterator[socket.socket]:
    """A completion request for `body` sent on a raw connection and left unread: the client hangs up when the block
    ends."""
    data = json.dumps({"model": server.model, **body})
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n{data}"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=REQUEST_TIMEOUT) as connection:
        connection.sendall(request)
        yield connection


def test_a_client_that_disconnects_mid_stream_leaves_the_server_serving(server, reference):
    body = {"prompt": "Stream", "max_tokens": 30, "temperature": 0, "stream": True}
    with unread_request(server, body) as connection:
        received = b""
        while b"data: " not in received:  # the first streamed token has arrived
            chunk = connection.recv(4096)
            assert chunk, received
            received += chunk
        assert received.startswith(b"HTTP/1.1 200")
    check_answers_correctly(server, reference)
    check_answers_correctly(server, reference, prompt="Stream")


# ---- sampling: each request's own settings, as OpenAI means them -------------------------------------------------


def complete(server: Server, prompt: str, max_tokens: int, **sampling) -> tuple[str, int]:
    answer = server.client().completions.create(model=server.model, prompt=prompt, max_tokens=max_tokens, **sampling)
    return answer.choices[0].text, answer.usage.completion_tokens


def test_a_positive_temperature_samples_with_the_requests_top_p_and_seed(server, reference, sampled):
    """Sequential: temperature 1.5 samples (the folder's generation config does not), at that temperature from the
    top_p nucleus, and the seed makes it repeatable: generate()'s text with torch seeded the same; another seed, other
    text. Continuous batching, whose batch shares one sampling setting (here the folder's: greedy): a 400 naming the
    temperature and the setting it is fixed to."""
    asked = {"temperature": 1.5, "top_p": 0.9}
    if "--continuous-batching" in server.process.args:
        with pytest.raises(BadRequestError) as refusal:
            complete(server, "Hello", 12, **asked, seed=1)
        error = refusal.value.body
        assert error["param"] == "temperature", error
        assert error["message"].startswith("temperature=1.5: under --continuous-batching"), error
        assert "greedy (temperature 0" in error["message"] and "send temperature=0 or leave it out" in error["message"]
        card = server.client().models.list().data[0].sampling
        assert card == {"per_request": False, "fixed": {"temperature": 0}}
        return
    first, again, other = (complete(server, "Hello", 12, **asked, seed=seed) for seed in (1, 1, 2))
    assert first == again == sampled("Hello", 12, seed=1, **asked)
    assert other == sampled("Hello", 12, seed=2, **asked) and other != first
    assert first != reference(12, prompt="Hello")  # greedy text: what upstream answered
    assert server.client().models.list().data[0].sampling == {"per_request": True, "default": {"temperature": 0}}
    log = server.output()
    assert "may be ignored" not in log and "Ignoring unsupported fields" not in log, log[-3000:]


def test_requests_of_different_settings_sent_together_each_get_their_own(server, reference, sampled):
    """A greedy request G and a sampling one H (other temperature, seed, length), each sent alone, then twice each
    at once: every answer is the one its request got alone (upstream, continuous batching gave one of them the other's
    setting). Continuous batching fixes one setting (greedy here): H gets a 400 naming it, together or alone."""
    greedy = {"prompt": "alpha beta", "max_tokens": 10, "temperature": 0}
    sampling = {"prompt": "gamma", "max_tokens": 14, "temperature": 1.3, "seed": 7}
    continuous = "--continuous-batching" in server.process.args

    def ask(body: dict) -> tuple[str, int] | str:
        try:
            return complete(server, **body)
        except BadRequestError as error:
            return error.body["param"]

    alone = [ask(greedy), ask(sampling)]
    assert alone[0] == reference(10, prompt="alpha beta")
    assert alone[1] == ("temperature" if continuous else sampled("gamma", 14, temperature=1.3, seed=7))
    bodies = [greedy, sampling, greedy, sampling]
    barrier = Barrier(len(bodies))

    def together(body: dict) -> tuple[str, int] | str:
        barrier.wait(timeout=60)
        return ask(body)

    with ThreadPoolExecutor(len(bodies)) as pool:
        assert list(pool.map(together, bodies)) == alone * 2


@pytest.mark.parametrize("served", list(SERVERS))
def test_a_folder_that_samples_by_default_is_overruled_by_the_request(folders, reference, sampled, served, tmp_path):
    """The `sampling` folder's generation config samples at temperature 1.5. Sequential: a request without a
    temperature samples at 1.5 (the folder's default), one with temperature 0 is greedy (the request wins).
    Continuous batching serves every request at the folder's 1.5 and says so; temperature 0 and a seed, which the
    shared batch cannot honour, get a 400 naming the setting and the fixed value."""
    _, options, _ = SERVERS[served]
    server = start_server(folders["sampling"], options, tmp_path)
    try:
        card = server.client().models.list().data[0].sampling
        if "--continuous-batching" in options:
            assert card == {"per_request": False, "fixed": {"temperature": 1.5, "top_p": 1.0}}
            assert "all with one sampling setting, temperature 1.5, top_p 1.0" in server.output()
            for asked, param in (({"temperature": 0}, "temperature"), ({"seed": 3}, "seed"), ({"top_p": 0.5}, "top_p")):
                with pytest.raises(BadRequestError) as refusal:
                    complete(server, "Hello", 8, **asked)
                error = refusal.value.body
                assert error["param"] == param and "sampled (temperature 1.5, top_p 1" in error["message"], error
            for asked in ({"temperature": 1.5}, {"top_p": 1.0}, {}):  # the fixed setting, said or not
                answer = server.client().completions.create(model=server.model, prompt="Hello", max_tokens=8, **asked)
                # answered, sampled (no text to compare): 8 tokens, or fewer when a sampled token was EOS
                finish, count = answer.choices[0].finish_reason, answer.usage.completion_tokens
                assert (finish, count) == ("length", 8) or (finish == "stop" and 0 < count <= 8), (finish, count)
        else:
            assert card == {"per_request": True, "default": {"temperature": 1.5, "top_p": 1.0}}
            assert complete(server, "Hello", 12, temperature=0) == reference(12, prompt="Hello")
            assert complete(server, "Hello", 12, seed=5) == sampled("Hello", 12, temperature=1.5, seed=5)
    finally:
        stop_server(server)


# ---- fields the server cannot honour: a 400 naming each --------------------------------------------------------


REFUSED = [  # (route, field, value)
    ("/v1/completions", "n", 2),
    ("/v1/completions", "best_of", 3),
    ("/v1/completions", "echo", True),
    ("/v1/completions", "logprobs", 0),
    ("/v1/completions", "presence_penalty", 0.5),
    ("/v1/completions", "frequency_penalty", 1.0),
    ("/v1/completions", "logit_bias", {"5": 10}),
    ("/v1/completions", "stop", ["\n"]),
    ("/v1/completions", "suffix", " end"),
    ("/v1/chat/completions", "n", 2),
    ("/v1/chat/completions", "logprobs", True),
    ("/v1/chat/completions", "top_logprobs", 2),
    ("/v1/chat/completions", "presence_penalty", -1),
    ("/v1/chat/completions", "frequency_penalty", 0.5),
    ("/v1/chat/completions", "logit_bias", {"5": -100}),
    ("/v1/chat/completions", "response_format", {"type": "json_object"}),
    ("/v1/chat/completions", "stop", "."),
    ("/v1/chat/completions", "stream_options", {"include_usage": True}),  # without stream: true
    ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("/v1/chat/completions", "seed", 1.5),
]


@pytest.mark.parametrize(("route", "field", "value"), REFUSED, ids=[f"{r[10:]}-{f}" for r, f, _ in REFUSED])
def test_a_field_the_server_cannot_honour_gets_a_400_naming_it(server, route, field, value):
    prompt = {"prompt": "Hi"} if route == "/v1/completions" else {"messages": [{"role": "user", "content": "Hi"}]}
    body = {"model": server.model, **prompt, "max_tokens": 4, field: value}
    status, answer = post_raw(server, route, json.dumps(body).encode())
    error = json.loads(answer)["error"]
    assert status == 400 and error["param"] == field and error["type"] == "invalid_request_error", answer
    assert error["message"].startswith(field), answer


def test_fields_that_ask_for_nothing_are_answered_as_without_them(server, reference):
    """OpenAI's defaults of the fields above, and fields that only label a request (`user`), change nothing; a
    stream with stream_options.include_usage ends with the usage."""
    client = server.client()
    defaults = {"n": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "stop": [], "user": "u"}
    answer = client.completions.create(model=server.model, prompt="Hi", max_tokens=12, temperature=0, **defaults)
    assert (answer.choices[0].text, answer.usage.completion_tokens) == reference(12, prompt="Hi")
    messages = [{"role": "user", "content": "Hi"}]
    chat = {"logprobs": False, "response_format": {"type": "text"}, "stream_options": {"include_usage": True}}
    stream = client.chat.completions.create(
        model=server.model, messages=messages, max_tokens=12, temperature=0, stream=True, **defaults, **chat
    )
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert (text, chunks[-1].usage.completion_tokens) == reference(12, messages=messages)
    log = server.output()
    assert "Ignoring unsupported fields" not in log, log[-3000:]


def test_every_name_turner_serve_reaches_in_transformers_serve_is_listed_and_there():
    """One check for each name of `UPSTREAM` (what serve_openai.py and serve.py reach in transformers serve and
    uvicorn): a release that moves one fails here, and turner-serve refuses to start naming it."""
    from turner_tfm.serve_openai import UPSTREAM, missing_upstream_names

    assert missing_upstream_names() == []
    assert len(UPSTREAM) == 12
    source = "".join(Path("turner_tfm", name).read_text() for name in ("serve.py", "serve_openai.py"))
    for private in ("_cb_manager", "_cb", "_valid_params_class", "_load_model"):
        assert private in source and any(private in name or private in why for name, (_, why) in UPSTREAM.items())


@pytest.mark.parametrize("name", ["uvicorn.Server.handle_exit", "transformers.cli.serving.utils.CBGenerateManager._cb"])
def test_turner_serve_refuses_to_start_naming_an_upstream_name_that_moved(folders, capsys, monkeypatch, name):
    from turner_tfm import serve_openai
    from turner_tfm.serve import main

    def moved():
        raise AttributeError("moved in the next release")

    monkeypatch.setitem(serve_openai.UPSTREAM, name, (moved, serve_openai.UPSTREAM[name][1]))
    with pytest.raises(SystemExit) as exit_info:
        main([str(folders["chat"])])
    assert exit_info.value.code == 1
    assert f"no longer has what turner-serve relies on (turner_tfm/serve_openai.py, UPSTREAM): {name} (moved" in (
        capsys.readouterr().err
    )


# ---- rotary positions: no table to run off ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def rotary_folder(tmp_path_factory) -> Path:
    """The `chat` folder's shape with rotary positions (the quickstart's), 64 of them."""
    folder = tmp_path_factory.mktemp("rotary") / "rotary"
    torch.manual_seed(0)
    config = text_config(
        vocab_size=len(SPECIALS) + len(CHARACTERS), max_position_embeddings=POSITIONS, position_embedding_type="rotary"
    )
    config.initializer_range = 0.5
    TurnerForCausalLM(config).save_pretrained(folder)
    char_tokenizer(None).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("served", list(SERVERS))
def test_a_rotary_model_answers_a_prompt_past_its_positions_as_generate_does(rotary_folder, served, tmp_path):
    """Rotary positions are computed for any position, so generate() continues a prompt longer than
    max_position_embeddings when max_new_tokens asks, and refuses to pick its default length past it; the server
    answers the same requests the same way (`max_tokens`), with generate()'s greedy tokens."""
    model = AutoModelForCausalLM.from_pretrained(rotary_folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(rotary_folder)
    long_prompt, short_prompt = "The quick brown fox. " * 4, "x" * 40
    long_ids, short_ids = (tokenizer(text, return_tensors="pt")["input_ids"] for text in (long_prompt, short_prompt))
    assert long_ids.shape[1] == 84 > POSITIONS

    def greedy(ids: torch.Tensor, **length: int) -> tuple[str, int]:
        with torch.no_grad():
            new = model.generate(ids, do_sample=False, **length)[0, ids.shape[1] :]
        return tokenizer.decode(new, skip_special_tokens=True), len(new)

    past_the_positions = greedy(long_ids, max_new_tokens=8)
    with pytest.raises(ValueError, match=rf"Input length of input_ids is 84, but `max_length` is set to {POSITIONS}"):
        greedy(long_ids)  # transformers' default length stops at max_position_embeddings
    up_to_the_positions = greedy(short_ids, max_new_tokens=POSITIONS - 40)

    _, options, _ = SERVERS[served]
    server = start_server(rotary_folder, options, tmp_path)
    try:
        client = server.client()
        answer = client.completions.create(model=server.model, prompt=long_prompt, max_tokens=8, temperature=0)
        assert (answer.choices[0].text, answer.usage.completion_tokens) == past_the_positions
        with pytest.raises(BadRequestError, match=r"the prompt is 84 tokens.*give max_tokens to continue past them"):
            client.completions.create(model=server.model, prompt=long_prompt, temperature=0)
        answer = client.completions.create(model=server.model, prompt=short_prompt, temperature=0)
        assert (answer.choices[0].text, answer.usage.completion_tokens) == up_to_the_positions
        for prompt in (short_prompt, long_prompt):  # past the server's limit: the hint is the limit, not the positions
            with pytest.raises(BadRequestError, match=rf"ask for at most {MAX_TOKENS_LIMIT}$"):
                client.completions.create(model=server.model, prompt=prompt, max_tokens=MAX_TOKENS_LIMIT + 1)
    finally:
        stop_server(server)


CARELESS_OPTIONS = ["--max-tokens-limit", "1000000", "--max-waiting", "0"]  # a huge ask is let through, nobody waits


@pytest.fixture(scope="module")
def endless_folder(tmp_path_factory) -> Path:
    """A rotary model without an end-of-sequence id: only max_tokens ends its completions."""
    folder = tmp_path_factory.mktemp("endless") / "endless"
    torch.manual_seed(0)
    config = text_config(
        vocab_size=len(SPECIALS) + len(CHARACTERS), position_embedding_type="rotary", eos_token_id=None
    )
    TurnerForCausalLM(config).save_pretrained(folder)
    char_tokenizer(None).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("served", list(SERVERS))
def test_one_careless_client_does_not_take_the_server_from_everyone(endless_folder, served, tmp_path):
    """A client asks for far more tokens than it wants and hangs up: its generation stops, and the next request is
    answered at once. While such a request generates, another gets a 503 at once from the sequential server (none may
    wait here) and is answered by continuous batching. SIGTERM with it still in flight ends the server in seconds."""
    _, options, _ = SERVERS[served]
    continuous = "--continuous-batching" in options
    # the paged cache has room for 16 requests of 1024 positions; sequential generate() would run for many minutes
    huge = {"prompt": "Once upon", "max_tokens": 10_000 if continuous else 200_000, "temperature": 0}
    model = AutoModelForCausalLM.from_pretrained(endless_folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(endless_folder)
    ids = tokenizer("Hello", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        expected = tokenizer.decode(model.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1] :])
    server = start_server(endless_folder, [*options[:-2], *CARELESS_OPTIONS], tmp_path)  # less --max-tokens-limit

    def answered_at_once() -> str:
        client = server.client().with_options(timeout=30)
        return (
            client.completions.create(model=server.model, prompt="Hello", max_tokens=6, temperature=0).choices[0].text
        )

    try:
        with unread_request(server, huge):
            time.sleep(1)  # its generation has begun
        assert answered_at_once() == expected
        with unread_request(server, huge):
            time.sleep(1)
            if continuous:
                assert answered_at_once() == expected
            else:
                status, answer = post_raw(
                    server, "/v1/completions", json.dumps({"model": server.model, **huge}).encode()
                )
                assert status == 503 and "the server is busy" in answer and "--max-waiting 0" in answer, answer
        check_shutdown_answers_every_request_in_flight(server, huge, continuous)
    finally:
        stop_server(server)


def check_shutdown_answers_every_request_in_flight(server: Server, huge: dict, continuous: bool) -> None:
    """SIGTERM with requests generating (continuous batching: a streamed and a non-streamed one; sequential: a
    streamed one, as --max-waiting 0 lets no other wait): the non-streamed one gets OpenAI's error (503), the stream a
    last event carrying it (the OpenAI client raises it), the server exits within 10 s and logs no traceback
    (upstream: a bare 500, a stream cut without an event, an asyncio InvalidStateError in the log)."""
    streaming = threading.Event()
    client = server.client().with_options(timeout=30)

    def streamed() -> str:
        try:
            for _ in client.completions.create(model=server.model, stream=True, **huge):
                streaming.set()
        except APIError as error:
            return error.message
        return "the stream ended without an error"

    def whole() -> str:
        try:
            client.completions.create(model=server.model, **huge)
        except APIStatusError as error:
            return f"{error.status_code} {error.body['message']}"
        return "answered"

    with ThreadPoolExecutor(2) as pool:
        stream_answer = pool.submit(streamed)
        whole_answer = pool.submit(whole) if continuous else None
        assert streaming.wait(timeout=30), server.output()[-3000:]
        time.sleep(0.5)  # the non-streamed request has been admitted too
        started = time.monotonic()
        os.kill(server.process.pid, signal.SIGTERM)
        server.process.wait(timeout=20)
        assert time.monotonic() - started < 10, server.output()[-3000:]
        assert stream_answer.result(timeout=30).startswith("the server is shutting down"), server.output()[-3000:]
        if whole_answer is not None:
            assert whole_answer.result(timeout=30).startswith("503 the server is shutting down")
    log = server.output()
    assert "Traceback" not in log and "InvalidStateError" not in log, log[-5000:]


# ---- a folder without a chat template ---------------------------------------------------------------------------


def test_a_chat_request_to_a_model_without_a_chat_template_gets_a_400(folders, reference, tmp_path):
    server = start_server(folders["plain"], [], tmp_path)
    try:
        for stream in (False, True):
            with pytest.raises(BadRequestError, match=r"has no chat template.*send a prompt to /v1/completions"):
                server.client().chat.completions.create(
                    model=server.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=stream
                )
        check_answers_correctly(server, reference)  # the same weights as the `chat` folder
    finally:
        stop_server(server)


# ---- the benchmark ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_serving_benchmark_runs_and_reports_every_figure_with_its_load(tmp_path, monkeypatch):
    """benchmarks/bench_serve.py at tiny sizes: generate(), serve and serve --continuous-batching at 1 and 2 clients,
    each figure with its request and token rates, its server's start-up time and the load average around it (vLLM
    left out: tests/test_vllm.py runs it with vLLM). Timings are not asserted."""
    out = tmp_path / "serve.json"
    args = ["--models", "quickstart", "--concurrency", "1", "2", "--requests", "2", "--max-tokens", "4"]
    args += ["--repeats", "1", "--warmup", "1", "--threads", "1", "--json", str(out), "--vllm-python", ""]
    run_module("benchmarks.bench_serve", args, monkeypatch)
    payload = json.loads(out.read_text())
    assert payload["benchmark"] == "serve"
    assert [(r["mode"], r["concurrency"]) for r in payload["results"]] == [
        ("generate()", None),
        ("serve", 1),
        ("serve", 2),
        ("serve --continuous-batching", 1),
        ("serve --continuous-batching", 2),
    ]
    for result in payload["results"]:
        assert result["requests_per_s"] > 0 and result["tokens_per_s"] > 0
        assert {"load_before", "load_after", "noisy"} <= set(result)
        assert (result["start_s"] is None) == (result["mode"] == "generate()")
    # greedy and the same requests: every way of answering generates the same number of tokens
    assert len({tuple(result["tokens"]) for result in payload["results"]}) == 1
