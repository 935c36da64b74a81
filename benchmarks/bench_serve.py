"""Serving throughput: `turner-serve` (transformers' own server) with and without continuous batching, and vLLM's
OpenAI server (its Transformers backend), against sequential `generate()` calls in one process.

For each model, the same requests (prompts of `--prompt-chars` characters from the standard library's docstrings,
`max_tokens` new tokens, greedy) are answered up to four ways:

* `generate()`: the requests one after another, `model.generate(..., do_sample=False)` in this process (no server);
* `serve`: `turner-serve FOLDER` (sequential `generate()` calls on the server's inference thread);
* `serve --continuous-batching`: paged attention, requests batched as they arrive (turner-serve sizes the paged
  cache for `--cb-max-requests` requests of the model's positions; `--cb-num-blocks` sets it instead);
* `vllm`: `python -m vllm.entrypoints.openai.api_server --model FOLDER --model-impl transformers
  --trust-remote-code` run by `--vllm-python` (the interpreter of a vLLM environment, as `bash .ci/run --engines` makes
  it; default `$TURNER_VLLM_PYTHON`; left out when neither is given), the folder's own code, float32, eager, a KV
  cache of `--vllm-kv-cache-gib`, its worker bound to the first `--threads` cores (`VLLM_CPU_OMP_THREADS_BIND`).

The servers are asked by 1, 4 and 16 concurrent clients (threads of this process with the OpenAI client), each
sending its share of `--requests` requests back to back. requests/s = requests / wall time; tokens/s = generated
tokens (the server's `usage.completion_tokens`, `generate()`'s new tokens) / wall time. Both servers stay up (an idle
one costs no CPU) and every contender's rounds run in alternation, the order rotating each repetition after a
warm-up round each, so that the load of other processes, which drifts, falls on all alike. Each figure is the median
of `--repeats` rounds, with the lowest and highest 1-minute load average seen around them (noisy when above the core
count). Each server's start-up time (its process started to its first `/health` answer, the model loaded) is
reported beside its figures. Models: `quickstart` (examples/quickstart.py's shape: L4 H4 D128, rotary
positions; a character vocabulary of printable ASCII) and `d384` (L6 H6 D384), random weights unless `--folder` names
a trained folder to serve as the quickstart model.

    python -m benchmarks.bench_serve --threads 1 --vllm-python VLLM_ENV/bin/python --json benchmarks/results/serve.json
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks import benchutils

SHAPES = {
    "quickstart": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, max_position_embeddings=128),
    "d384": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, max_position_embeddings=256),
}
CHARACTERS = [chr(code) for code in range(32, 127)] + ["\n"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--folder", type=Path, default=None, help="a trained folder to serve as `quickstart`")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=32, help="requests per round")
    parser.add_argument("--prompt-chars", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--cb-num-blocks", type=int, default=None, help="default: turner-serve's own sizing")
    parser.add_argument(
        "--vllm-python",
        default=os.environ.get("TURNER_VLLM_PYTHON"),
        help="python of a vLLM environment (.ci/run --engines makes one); default $TURNER_VLLM_PYTHON; none: no vLLM",
    )
    parser.add_argument("--vllm-kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE")
    parser.add_argument("--startup-timeout", type=float, default=300)
    benchutils.add_run_arguments(parser, repeats=3, warmup=1)
    return parser


def random_folder(root: Path, shape: str, seed: int) -> Path:
    """A causal LM of `shape` with random weights and a character tokenizer, saved to `root / shape`."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from turner_tfm import TurnerConfig, TurnerForCausalLM

    vocab = {token: i for i, token in enumerate(["<pad>", "<unk>", "<eos>", *CHARACTERS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(".|\n"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    sizes = SHAPES[shape]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        unk_token="<unk>",
        eos_token="<eos>",
        model_max_length=sizes["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    torch.manual_seed(seed)
    config = TurnerConfig(
        vocab_size=len(vocab),
        intermediate_size=4 * sizes["hidden_size"],
        position_embedding_type="rotary",
        pad_token_id=0,
        eos_token_id=2,
        **sizes,
    )
    folder = root / shape
    TurnerForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def prompts(count: int, chars: int) -> list[str]:
    """`count` distinct prompts of `chars` printable characters from the standard library's docstrings."""
    import collections
    import json as json_module
    import re

    text = " ".join(module.__doc__ for module in (json_module, re, collections, os, argparse, subprocess))
    text = "".join(c if c in CHARACTERS and c != "\n" else " " for c in text)
    step = max(1, (len(text) - chars) // count)
    return [text[i * step : i * step + chars] for i in range(count)]


# ---- the server -------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def turner_serve_command(folder: Path, options: list[str], port: int) -> list[str]:
    command = [sys.executable, "-m", "turner_tfm.serve", str(folder), *options, "--host", "127.0.0.1"]
    return [*command, "--port", str(port), "--device", "cpu"]


def vllm_command(vllm_python: str, folder: Path, positions: int, port: int) -> list[str]:
    """vLLM's OpenAI server on the folder's own code (the `vllm` command of vllm-cpu does not start: it looks for a
    distribution named vllm)."""
    command = [vllm_python, "-I", "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    command += ["--model-impl", "transformers", "--trust-remote-code", "--dtype", "float32", "--enforce-eager"]
    return [*command, "--max-model-len", str(positions), "--host", "127.0.0.1", "--port", str(port)]


class Server:
    """A server process on 127.0.0.1 (`command(port)`), stopped by its pid; `start_s`: from its start to its first
    answer to /health."""

    def __init__(self, command: Any, env: dict[str, str], timeout: float, log: Path) -> None:
        self.port = free_port()
        self.log = log
        start = time.perf_counter()
        with log.open("wb") as output:
            self.process = subprocess.Popen(command(self.port), stdout=output, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"{self.process.args} exited ({self.process.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5):
                    self.start_s = time.perf_counter() - start
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.2)
        self.stop()
        raise SystemExit(f"{self.process.args} gave no /health in {timeout} s:\n{log.read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited 30 s later (`Popen` signals only its own, unreaped pid)."""
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def serve_round(server: Server, model: str, texts: list[str], max_tokens: int, concurrency: int) -> tuple[float, int]:
    """Wall seconds and generated tokens for `texts` sent by `concurrency` clients, each one request at a time."""
    from openai import OpenAI

    def client_work(share: list[str]) -> int:
        client = OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", timeout=600, max_retries=0)
        tokens = 0
        for text in share:
            answer = client.completions.create(model=model, prompt=text, max_tokens=max_tokens, temperature=0)
            tokens += answer.usage.completion_tokens
        return tokens

    shares = [texts[i::concurrency] for i in range(concurrency)]
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(client_work, shares))
    return time.perf_counter() - start, tokens


def generate_round(model: Any, tokenizer: Any, texts: list[str], max_tokens: int) -> tuple[float, int]:
    import torch

    start, tokens = time.perf_counter(), 0
    for text in texts:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            output = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        tokens += output.shape[1] - ids.shape[1]
    return time.perf_counter() - start, tokens


def rotated(contenders: dict[tuple[str, int | None], Any], repeats: int, warmup: int) -> dict[tuple, dict[str, Any]]:
    """Each contender's rounds, run in alternation (the order rotating every repetition, after `warmup` untimed
    rounds each) so that the other processes' load, which drifts, falls on all alike: per contender, the wall
    seconds, generated tokens and the load average before and after each timed round."""
    for _ in range(warmup):
        for round_fn in contenders.values():
            round_fn()
    names = list(contenders)
    rounds: dict[tuple, list[dict[str, Any]]] = {name: [] for name in names}
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            before = benchutils.load_average()
            wall, tokens = contenders[name]()
            rounds[name].append({"wall_s": wall, "tokens": tokens, **benchutils.under_load(before)})
    figures = {}
    for name, timed in rounds.items():
        median = statistics.median(r["wall_s"] for r in timed)
        figures[name] = {
            "wall_s": [r["wall_s"] for r in timed],
            "tokens": [r["tokens"] for r in timed],
            "median_s": median,
            "tokens_per_s": timed[0]["tokens"] / median,
            # the lowest and highest load average seen around its rounds, noisy if any was above the core count
            "load_before": min(min(r["load_before"], r["load_after"]) for r in timed),
            "load_after": max(max(r["load_before"], r["load_after"]) for r in timed),
            "noisy": any(r["noisy"] for r in timed),
        }
    return figures


def server_env(threads: int | None, vllm_kv_cache_gib: int) -> dict[str, str]:
    """Offline; `threads` torch threads (turner-serve), and vLLM's worker bound to as many cores (its API server and
    engine-core processes run beside it, as they do in deployment)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1"}
    env["VLLM_CPU_KVCACHE_SPACE"] = str(vllm_kv_cache_gib)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if threads == 1 else f"0-{threads - 1}"
    else:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    return env


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    env = benchutils.start_run(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import turner_tfm  # noqa: F401  (registers "turner" with the Auto classes)

    texts = prompts(args.requests, args.prompt_chars)
    results, rows = [], []
    cache = [] if args.cb_num_blocks is None else ["--cb-num-blocks", str(args.cb_num_blocks)]
    serving_env = server_env(args.threads, args.vllm_kv_cache_gib)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for shape in args.models:
            folder = args.folder if (shape == "quickstart" and args.folder) else random_folder(root, shape, args.seed)
            model = AutoModelForCausalLM.from_pretrained(folder).eval()
            tokenizer = AutoTokenizer.from_pretrained(folder)
            print(f"{shape}: {folder}, {sum(p.numel() for p in model.parameters()):,} parameters", flush=True)
            commands = {
                "serve": functools.partial(turner_serve_command, folder, []),
                "serve --continuous-batching": functools.partial(
                    turner_serve_command, folder, ["--continuous-batching", *cache]
                ),
            }
            if args.vllm_python:
                positions = model.config.max_position_embeddings
                commands["vllm"] = functools.partial(vllm_command, args.vllm_python, folder, positions)
            servers: dict[str, Server] = {}
            try:  # every server stays up (an idle one costs little CPU) so that their rounds can alternate
                for mode, command in commands.items():
                    log = root / f"{shape}-{len(servers)}.log"
                    servers[mode] = Server(command, serving_env, args.startup_timeout, log)
                    print(f"  {mode}: started in {servers[mode].start_s:.1f} s", flush=True)
                contenders = {
                    ("generate()", None): functools.partial(generate_round, model, tokenizer, texts, args.max_tokens)
                }
                for mode, server in servers.items():
                    for concurrency in args.concurrency:
                        contenders[mode, concurrency] = functools.partial(
                            serve_round, server, str(folder), texts, args.max_tokens, concurrency
                        )
                figures = rotated(contenders, args.repeats, args.warmup)
            finally:
                for server in servers.values():
                    server.stop()
            for (mode, concurrency), figure in figures.items():
                figure["requests_per_s"] = args.requests / figure["median_s"]
                figure["start_s"] = servers[mode].start_s if mode in servers else None
                results.append({"model": shape, "mode": mode, "concurrency": concurrency, **figure})
                print(
                    f"  {mode} x{concurrency or 1}: {figure['requests_per_s']:.2f} req/s, "
                    f"{figure['tokens_per_s']:.1f} tok/s, load {figure['load_before']:.1f}-{figure['load_after']:.1f}",
                    flush=True,
                )
            del model
    env = benchutils.finish_run(env)
    for shape in args.models:
        base = next(r for r in results if r["model"] == shape and r["mode"] == "generate()")
        for r in (r for r in results if r["model"] == shape):
            rows.append(
                [
                    shape,
                    r["mode"],
                    "-" if r["concurrency"] is None else r["concurrency"],
                    f"{r['requests_per_s']:.2f}",
                    f"{r['tokens_per_s']:.1f}",
                    f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x",
                    "-" if r["start_s"] is None else f"{r['start_s']:.1f}",
                    f"{r['load_before']:.1f}-{r['load_after']:.1f}" + (" (noisy)" if r["noisy"] else ""),
                ]
            )
    header = ["model", "answered by", "clients", "requests/s", "generated tokens/s", "vs generate()", "start (s)"]
    header.append("load average")
    intro = (
        f"{args.requests} requests per round, prompts of {args.prompt_chars} characters, max_tokens {args.max_tokens}, "
        f"greedy; median of {args.repeats} rounds, all contenders in rotation"
    )
    print()
    benchutils.print_report(env, benchutils.markdown_table(header, rows), intro)
    benchutils.save_run(args, "serve", env, results=results)


if __name__ == "__main__":
    main()
