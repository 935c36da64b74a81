"""What `turner-serve` adds to `transformers serve` (transformers 5.23-5.24) for any model, so that an OpenAI client
gets OpenAI's answers or an OpenAI-shaped refusal, never a silently different answer. Nothing here knows the Turner
family: `turner_tfm/serve.py` holds what does (the class lookup, the positions rule) and the command.

- `ServedModel.checked`: each `/v1/completions` and `/v1/chat/completions` body is read before the server reads it.
  A request the model cannot answer (`max_tokens`, prompt length, chat template) or a field the server cannot honour
  (`FIELDS`) gets a 400 naming the field, the value and what is valid. What it forwards carries the request's own
  generation settings as a `generation_config` (a request field of `transformers serve`), with OpenAI's meaning of
  `temperature`, `top_p` and `seed` (`Sampling`): upstream answers a positive temperature greedily unless the folder's
  generation config samples, and applies a seed to the process, not to the request.
- Under `--continuous-batching` the paged scheduler applies one generation config, its first request's, to every
  request (an upstream TODO). Here that config is fixed when the server starts, from the folder's generation config,
  and a request asking for another temperature, top_p or a seed gets a 400 naming the setting and the fixed value
  (`ServedModel.fixed`), stated in `GET /v1/models` and the startup line.
- `Admission`: one client cannot hold the model from everyone (`--max-waiting`, a hang-up stops its generation), and
  SIGTERM/SIGINT answer every request in flight with an OpenAI error (a stream with a final error event) before the
  server exits, instead of a bare 500 and a traceback.
- `openai_errors`: every error body the server sends is OpenAI's shape, `{"error": {"message", "type", "param",
  "code"}}` (upstream's own errors come as `{"detail": ...}`).
- `UPSTREAM`: every name of `transformers serve` (and uvicorn) this module reaches, checked when the server starts and
  by a test each, so that a release that moves one fails loudly instead of serving without the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import math
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVED_ROUTES = ("/v1/completions", "/v1/chat/completions")
MODELS_ROUTE = "/v1/models"
MAX_TOKENS_LIMIT = 1024  # --max-tokens-limit's default: new tokens one request may ask for (upstream's default ask)
SAMPLING_RANGES = {"temperature": (0.0, 2.0, True), "top_p": (0.0, 1.0, False)}  # OpenAI's: (low, high, low allowed)
X_REQUEST_ID = b"x-request-id"  # the header `transformers serve` takes a request's id from
# generate() flags that only sampling reads: a greedy request leaves them unset (else generate() warns about them)
SAMPLING_ONLY = ("temperature", "top_p", "top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


# ---- the names of transformers serve this module relies on --------------------------------------------------------


def _attribute(module: str, path: str) -> Callable[[], Any]:
    def resolve() -> Any:
        value: Any = importlib.import_module(module)
        for part in path.split("."):
            value = getattr(value, part)
        return value

    return resolve


def _instance_attribute(module: str, cls: str, name: str, **init: Any) -> Callable[[], Any]:
    def resolve() -> Any:
        instance = getattr(importlib.import_module(module), cls)(**init)
        if name not in vars(instance):
            raise AttributeError(f"{cls}() has no attribute {name!r}")
        return vars(instance)[name]

    return resolve


def _params_key(module: str, cls: str, key: str) -> Callable[[], Any]:
    def resolve() -> Any:
        params = getattr(importlib.import_module(module), cls)._valid_params_class
        if key not in getattr(params, "__mutable_keys__", ()):
            raise AttributeError(f"{cls} no longer takes a {key!r} field in a request")
        return params

    return resolve


UTILS = "transformers.cli.serving.utils"
UPSTREAM: dict[str, tuple[Callable[[], Any], str]] = {  # name: (how to find it, what turner-serve does with it)
    "transformers.cli.serving.server.build_server": (
        _attribute("transformers.cli.serving.server", "build_server"),
        "replaced by a wrapper that adds the RequestChecks middleware to the app it builds",
    ),
    f"{UTILS}.GenerateManager.generate_streaming": (
        _attribute(UTILS, "GenerateManager.generate_streaming"),
        "wrapped: a stopping criterion (hang-up, shutdown) and the request's seed go into generate()'s inputs",
    ),
    f"{UTILS}.GenerateManager.generate_non_streaming": (
        _attribute(UTILS, "GenerateManager.generate_non_streaming"),
        "wrapped, as generate_streaming",
    ),
    f"{UTILS}.GenerationState._cb_manager": (
        _instance_attribute(UTILS, "GenerationState", "_cb_manager", continuous_batching=True),
        "read: the continuous-batching manager, to cancel a request whose client left",
    ),
    f"{UTILS}.CBGenerateManager._cb": (
        _instance_attribute(UTILS, "CBGenerateManager", "_cb"),
        "read: the paged scheduler (ContinuousBatchingManager.cancel_request)",
    ),
    f"{UTILS}.BaseHandler.get_processor_inputs_from_messages": (
        _attribute(UTILS, "BaseHandler.get_processor_inputs_from_messages"),
        "called: renders a chat request's messages as the server will, to count its prompt tokens",
    ),
    f"{UTILS}.Modality.LLM": (_attribute(UTILS, "Modality.LLM"), "passed to get_processor_inputs_from_messages"),
    "transformers.cli.serving.completion.CompletionHandler: request field generation_config": (
        _params_key("transformers.cli.serving.completion", "CompletionHandler", "generation_config"),
        "sent: carries each request's own generation settings (a key of CompletionHandler._valid_params_class)",
    ),
    "transformers.cli.serving.chat_completion.ChatCompletionHandler: request field generation_config": (
        _params_key("transformers.cli.serving.chat_completion", "ChatCompletionHandler", "generation_config"),
        "sent, as for completions (a key of ChatCompletionHandler._valid_params_class)",
    ),
    "transformers.cli.serving.model_manager.transformers": (
        _attribute("transformers.cli.serving.model_manager", "transformers"),
        "set on: the module object ModelManager._load_model looks the model class up in (turner_tfm/serve.py)",
    ),
    "transformers.cli.serve.Serve.__init__": (
        _attribute("transformers.cli.serve", "Serve.__init__"),
        "read: its signature is turner-serve's options (turner_tfm/serve.py)",
    ),
    "uvicorn.Server.handle_exit": (
        _attribute("uvicorn", "Server.handle_exit"),
        "wrapped: SIGTERM/SIGINT answer every request in flight first",
    ),
}


def missing_upstream_names() -> list[str]:
    """The names of `UPSTREAM` the installed transformers (or uvicorn) no longer has, each with the error."""
    missing = []
    for name, (resolve, _) in UPSTREAM.items():
        try:
            resolve()
        except (ImportError, AttributeError) as error:
            missing.append(f"{name} ({error})")
    return missing


# ---- errors -------------------------------------------------------------------------------------------------------


class RequestError(ValueError):
    """A request the server will not answer; the message names the field (`param`) and its value."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None, code: Any = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


async def send_json(send: Any, status: int, payload: dict, headers: list | None = None) -> None:
    content = json.dumps(payload).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(content)).encode()),
        *(headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


def openai_errors(send: Any) -> Any:
    """`send` that rewrites an error answer of the server (status >= 400, a JSON body not already OpenAI's, such as
    FastAPI's `{"detail": ...}` or `{"error": "text"}`) into OpenAI's shape; a 422 becomes a 400, as OpenAI and vLLM
    answer a malformed request."""
    held: dict = {}

    async def rewriting(message: dict) -> None:
        if (
            message["type"] == "http.response.start"
            and message["status"] >= 400
            and dict(message.get("headers", [])).get(b"content-type", b"").startswith(b"application/json")
        ):
            held.update(start=message, body=b"")
            return
        if not held or message["type"] != "http.response.body":
            await send(message)
            return
        held["body"] += message.get("body", b"")
        if message.get("more_body", False):
            return
        status = held["start"]["status"]
        try:
            payload = json.loads(held["body"])
        except ValueError:
            payload = {"detail": held["body"].decode(errors="replace")}
        if not (isinstance(payload, dict) and isinstance(payload.get("error"), dict)):
            detail = payload.get("detail", payload.get("error", payload)) if isinstance(payload, dict) else payload
            message_text = detail if isinstance(detail, str) else json.dumps(detail)
            kind = "invalid_request_error" if status < 500 else "server_error"
            payload = error_body(message_text, kind)
        headers = [(k, v) for k, v in held["start"].get("headers", []) if k.lower() != b"content-length"]
        held.clear()
        await send_json(
            send, 400 if status == 422 else status, payload, [h for h in headers if h[0] != b"content-type"]
        )

    return rewriting


# ---- the fields of a request ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """A field of OpenAI's request that the server cannot honour beyond `allowed` (its values that ask for nothing:
    null always does), and why."""

    allowed: tuple
    why: str


IGNORED_FIELDS = ("user", "store", "metadata", "service_tier", "parallel_tool_calls")  # no effect on the text
FIELDS = {
    "n": Field((1,), "one choice per request (send n requests)"),
    "best_of": Field((1,), "one candidate per request"),
    "echo": Field((False,), "the prompt is not returned with the completion"),
    "logprobs": Field((False,), "no log probabilities are returned"),
    "top_logprobs": Field((0,), "no log probabilities are returned"),
    "presence_penalty": Field((0,), "no penalty on tokens already present is applied"),
    "frequency_penalty": Field(
        (0,), "OpenAI's frequency penalty is not applied (transformers serve would apply a repetition penalty instead)"
    ),
    "logit_bias": Field(({},), "no per-token bias is applied to the logits"),
    "response_format": Field(({"type": "text"},), "only plain text is generated (no JSON mode or schema)"),
    "stop": Field(
        ([],),
        "stop sequences are not honoured as OpenAI means them (transformers would return the stop text, and "
        "continuous batching ignores it)",
    ),
    "suffix": Field(("",), "no text is inserted before a suffix"),
    "tools": Field(([],), "the model has no tool-call format"),
    "functions": Field(([],), "the model has no tool-call format"),
    "tool_choice": Field(("none",), "the model has no tool-call format"),
    "function_call": Field(("none",), "the model has no tool-call format"),
    "audio": Field((), "the model generates text only"),
    "modalities": Field((["text"],), "the model generates text only"),
    "prediction": Field((), "predicted outputs are not used"),
    "reasoning_effort": Field((), "the model does not reason in a separate channel"),
    "web_search_options": Field((), "the server does not search the web"),
}


def _same(value: Any, allowed: Any) -> bool:
    """`value` is `allowed` (a number of either type for a number; the same type otherwise: `0` is not `False`)."""
    numbers = (int, float)
    if type(allowed) in numbers:
        return type(value) in numbers and value == allowed
    return type(value) is type(allowed) and value == allowed


def check_fields(body: dict, continuous: bool) -> None:
    """`RequestError` for a field of `FIELDS` asking for something, a malformed `seed` or `stream_options`, or a
    `generation_config` under continuous batching."""
    for name, field in FIELDS.items():
        value = body.get(name)
        if value is None or any(_same(value, allowed) for allowed in field.allowed):
            continue
        accepted = " or ".join(["null", *(json.dumps(allowed) for allowed in field.allowed)])
        raise RequestError(
            f"{name}={json.dumps(value)} is not supported by turner-serve: {field.why}; leave it out or send "
            f"{accepted}",
            name,
        )
    seed = body.get("seed")
    if seed is not None and (type(seed) is not int or not -(2**63) <= seed < 2**63):
        raise RequestError(f"seed must be an integer (a 64-bit one), got {seed!r}", "seed")
    options = body.get("stream_options")
    if options is not None:
        if body.get("stream") is not True:
            raise RequestError(
                "stream_options is only allowed when stream is true, as in OpenAI's API", "stream_options"
            )
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise RequestError(
                f'stream_options={json.dumps(options)}: turner-serve takes only {{"include_usage": true or false}} '
                "(the stream's last chunk carries the usage either way)",
                "stream_options",
            )
    if continuous and body.get("generation_config") is not None:
        raise RequestError(
            "generation_config is not taken under --continuous-batching, where one generation config serves every "
            "request (GET /v1/models shows it); serve without --continuous-batching to send one per request",
            "generation_config",
        )


def check_sampling(body: dict) -> None:
    """`RequestError` for a sampling parameter outside OpenAI's range (temperature in [0, 2], top_p in (0, 1])."""
    for name, (low, high, low_allowed) in SAMPLING_RANGES.items():
        value = body.get(name)
        if value is None:
            continue
        number = type(value) in (int, float) and math.isfinite(value)
        if not number or not (low <= value <= high) or (value == low and not low_allowed):
            bounds = f"{'[' if low_allowed else '('}{low:g}, {high:g}]"
            raise RequestError(f"{name} must be a number in {bounds}, as OpenAI's API takes it; got {value!r}", name)


# ---- sampling: OpenAI's meaning -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    """How one request chooses its tokens: greedy (temperature 0), or sampled at `temperature` from the `top_p`
    nucleus (None: the whole distribution), with `seed` making it repeatable."""

    temperature: float
    top_p: float | None = None
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def describe(self) -> dict:
        if self.greedy:
            return {"temperature": 0}
        return {"temperature": self.temperature, "top_p": 1.0 if self.top_p is None else self.top_p}


def folder_sampling(defaults: dict) -> Sampling:
    """What a request that says nothing gets: the folder's generation config, as `generate()` reads it (greedy unless
    it sets `do_sample`)."""
    if not defaults.get("do_sample"):
        return Sampling(0.0)
    return Sampling(float(defaults.get("temperature") or 1.0), defaults.get("top_p"))


def request_sampling(body: dict, defaults: dict) -> Sampling:
    """OpenAI's meaning: temperature 0 is greedy, a positive one samples at that temperature, top_p and seed apply
    where given; what the request leaves out comes from the folder's generation config (the request wins)."""
    folder = folder_sampling(defaults)
    temperature = body.get("temperature")
    temperature = folder.temperature if temperature is None else float(temperature)
    if temperature == 0:
        return Sampling(0.0, seed=body.get("seed"))
    top_p = body.get("top_p")
    top_p = defaults.get("top_p") if top_p is None else float(top_p)
    return Sampling(temperature, top_p, body.get("seed"))


def generation_settings(sampling: Sampling, defaults: dict, max_new_tokens: int) -> dict:
    """The generation config one request is answered with: the folder's, then the request's sampling and length.
    Sampling takes the folder's `top_k` only if it sets one (OpenAI samples from the whole distribution, where
    transformers' default would keep the 50 likeliest tokens)."""
    settings = {key: value for key, value in defaults.items() if key != "transformers_version"}
    settings["max_new_tokens"] = max_new_tokens
    if sampling.greedy:
        settings["do_sample"] = False
        for key in SAMPLING_ONLY:
            settings.pop(key, None)
        return settings
    settings.update(do_sample=True, temperature=sampling.temperature, top_k=defaults.get("top_k") or 0)
    if sampling.top_p is not None:
        settings["top_p"] = sampling.top_p
    return settings


class SeedOnFirstStep:
    """A `generate()` logits processor that seeds torch's generator once, just before the first token is sampled, in
    the thread that samples: a request's seed then gives the same text whatever else the server is doing (upstream
    seeds the process when the request arrives, while another request may be sampling)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.seeded = False

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if not self.seeded:
            import torch

            torch.manual_seed(self.seed)
            self.seeded = True
        return scores


# ---- the model a request is checked against -------------------------------------------------------------------------


class ServedModel:
    """What a request is checked against: the folder's tokenizer (and chat template), its positions, its generation
    config, and whether continuous batching fixes the sampling.

    `learned_positions`: positions end with their table (`max_position_embeddings`), so a prompt and its completion
    must fit in it; otherwise they are computed for any position and only the default length stops there."""

    def __init__(
        self,
        folder: str,
        trust_remote_code: bool,
        max_tokens_limit: int = MAX_TOKENS_LIMIT,
        learned_positions: bool = True,
        continuous: bool = False,
    ) -> None:
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        self.folder = folder
        self.max_tokens_limit = max_tokens_limit
        self.created = int(Path(folder, "config.json").stat().st_mtime)
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        self.tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
        self.max_positions = config.max_position_embeddings
        self.learned = learned_positions
        self.limit = f"the model's learned positions (max_position_embeddings) allow {self.max_positions}"
        if Path(folder, "generation_config.json").is_file():
            generation_config = GenerationConfig.from_pretrained(folder)
        else:
            generation_config = GenerationConfig.from_model_config(config)
        self.defaults = generation_config.to_diff_dict()
        self.continuous = continuous
        # continuous batching: the one sampling setting of every request (the folder's), else None (per request)
        self.fixed = folder_sampling(self.defaults) if continuous else None

    def sampling_card(self) -> dict:
        """How requests are sampled, as `GET /v1/models` and the startup line state it."""
        if self.fixed is None:
            return {"per_request": True, "default": folder_sampling(self.defaults).describe()}
        return {"per_request": False, "fixed": self.fixed.describe()}

    def card(self) -> dict:
        """The served model as `GET /v1/models` lists it (OpenAI's model object): its id is the name requests must
        use, the FOLDER as given on the command line (the server refuses any other); the most new tokens one request
        may ask for (`--max-tokens-limit`); and how requests are sampled."""
        return {
            "id": self.folder,
            "object": "model",
            "created": self.created,
            "owned_by": "turner-serve",
            "max_tokens_limit": self.max_tokens_limit,
            "sampling": self.sampling_card(),
        }

    def checked(self, path: str, raw: bytes) -> tuple[bytes, Sampling | None]:
        """The body to pass on to the server for a request to `path`, and the request's sampling; `RequestError` if
        it cannot be served. A body that is not a JSON object goes on unread: the server answers it itself."""
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return raw, None
        if not isinstance(body, dict):
            return raw, None
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = body.get(key)
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
            raise RequestError(f"{key} must be a positive integer, got {max_tokens!r}", key)
        check_sampling(body)
        check_fields(body, self.continuous)
        defaults = self.defaults
        if body.get("generation_config") is not None:
            try:
                given = json.loads(body["generation_config"])
            except (TypeError, ValueError):
                given = None
            if not isinstance(given, dict):
                raise RequestError(
                    f"generation_config must be a JSON object in a string, got {body['generation_config']!r}",
                    "generation_config",
                )
            defaults = {**defaults, **given}
        sampling = request_sampling(body, defaults)
        self.check_fixed(body, sampling)
        if path == "/v1/chat/completions" and "messages" in body and self.tokenizer.chat_template is None:
            raise RequestError(
                f"the model {self.folder} has no chat template, so it cannot answer chat requests "
                "(/v1/chat/completions): send a prompt to /v1/completions, or save the tokenizer with a chat_template",
                "messages",
            )
        prompt_tokens = self.prompt_tokens(path, body)
        if prompt_tokens is None:
            return raw, None  # no prompt the model would read: the server names what is wrong
        if prompt_tokens == 0:
            raise RequestError(
                "the prompt is empty: its tokenizer gives no token for the model to continue (this one adds no BOS "
                "token); send at least one character",
                "prompt",
            )
        room = self.max_positions - prompt_tokens
        if room < 1 and (self.learned or max_tokens is None):
            raise RequestError(self.too_long(prompt_tokens), "prompt" if path == "/v1/completions" else "messages")
        most = min(self.max_tokens_limit, room) if self.learned else self.max_tokens_limit
        if max_tokens is not None and max_tokens > self.max_tokens_limit:
            raise RequestError(
                f"{key}={max_tokens} is more new tokens than this server gives one request, {self.max_tokens_limit} "
                f"(turner-serve --max-tokens-limit): ask for at most {most}",
                key,
            )
        if self.learned and max_tokens is not None and max_tokens > room:
            raise RequestError(
                f"{key}={max_tokens} after a prompt of {prompt_tokens} tokens needs {prompt_tokens + max_tokens} "
                f"positions; {self.limit}: ask for at most {room}",
                key,
            )
        new_tokens = min(room, self.max_tokens_limit) if max_tokens is None else max_tokens
        forwarded = {k: v for k, v in body.items() if k not in (*FIELDS, *IGNORED_FIELDS, "stream_options")}
        for name in ("temperature", "top_p", "seed", "max_completion_tokens"):
            forwarded.pop(name, None)
        forwarded["max_tokens"] = new_tokens
        forwarded["generation_config"] = json.dumps(generation_settings(sampling, defaults, new_tokens))
        return json.dumps(forwarded).encode(), sampling

    def check_fixed(self, body: dict, sampling: Sampling) -> None:
        """Under continuous batching: `RequestError` naming the setting whose value differs from the fixed one."""
        fixed = self.fixed
        if fixed is None:
            return
        fixed_text = ", ".join(f"{k} {v}" for k, v in fixed.describe().items())
        why = (
            f"under --continuous-batching this server answers every request with one sampling setting, "
            f"{'greedy' if fixed.greedy else 'sampled'} ({fixed_text}: {self.folder}'s generation config, as "
            "GET /v1/models shows), since the batch shares one generation config"
        )
        advice = "or serve without --continuous-batching, which samples each request with its own settings"
        if sampling.greedy != fixed.greedy or sampling.temperature != fixed.temperature:
            raise RequestError(
                f"temperature={body.get('temperature')!r}: {why}; send temperature={fixed.temperature:g} or leave "
                f"it out, {advice}",
                "temperature",
            )
        if not fixed.greedy and sampling.describe()["top_p"] != fixed.describe()["top_p"]:  # None is 1.0
            raise RequestError(
                f"top_p={body.get('top_p')!r}: {why}; send top_p={fixed.describe()['top_p']:g} or leave it out, "
                f"{advice}",
                "top_p",
            )
        if not fixed.greedy and sampling.seed is not None:
            raise RequestError(
                f"seed={sampling.seed}: {why}, and one random stream for the whole batch, so a seed cannot make one "
                f"request repeatable; leave it out, {advice}",
                "seed",
            )

    def too_long(self, prompt_tokens: int) -> str:
        """Why a prompt of `prompt_tokens` tokens leaves no room for a completion."""
        if self.learned:
            return (
                f"the prompt is {prompt_tokens} tokens; {self.limit}, prompt and completion together, so at most "
                f"{self.max_positions - 1} for the prompt"
            )
        return (
            f"the prompt is {prompt_tokens} tokens, and without max_tokens a completion ends at the model's "
            f"max_position_embeddings={self.max_positions} positions: give max_tokens to continue past them (this "
            f"model's positions are computed, not learned, so it can; generate() needs max_new_tokens the same way)"
        )

    def prompt_tokens(self, path: str, body: dict) -> int | None:
        """How many tokens the server will feed the model for `body`, or None if it will not read a prompt."""
        from transformers.cli.serving.utils import BaseHandler, Modality

        try:
            if path == "/v1/completions":
                prompt = body["prompt"]
                return len(self.tokenizer(prompt)["input_ids"]) if isinstance(prompt, str) else None
            messages = BaseHandler.get_processor_inputs_from_messages(body["messages"], Modality.LLM)
            rendered = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=True
            )
            return len(rendered["input_ids"])
        except Exception:  # a malformed request: the server's own validation answers it
            return None


# ---- the middleware ---------------------------------------------------------------------------------------------


class RequestChecks:
    """ASGI middleware: answers `GET /v1/models`; answers 400 to a completion request the model cannot serve before
    the server reads it, 503 to one it has no room for (`Admission`); passes every other request through (a
    completion's body as `ServedModel.checked` rewrote it), its answer watched by `Admission`; and gives every error
    answer OpenAI's shape."""

    def __init__(self, app: Any, model: ServedModel, admission: Admission) -> None:
        self.app = app
        self.model = model
        self.admission = admission

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = openai_errors(send)
        if scope["method"] == "GET" and scope["path"] == MODELS_ROUTE:
            await send_json(send, 200, {"object": "list", "data": [self.model.card()]})
            return
        if scope["method"] != "POST" or scope["path"] not in SERVED_ROUTES:
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        try:
            body, sampling = self.model.checked(scope["path"], b"".join(chunks))
        except RequestError as error:
            await send_json(send, 400, error_body(str(error), param=error.param))
            return
        if refusal := self.admission.refusal():
            status, kind = (503, "server_shutting_down") if self.admission.stopping else (503, "server_busy")
            await send_json(send, status, error_body(refusal, kind), [(b"retry-after", b"1")])
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        request_id = dict(scope["headers"]).get(X_REQUEST_ID, b"").decode() or str(uuid.uuid4())
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"content-length", X_REQUEST_ID)]
        headers += [(b"content-length", str(len(body)).encode()), (X_REQUEST_ID, request_id.encode())]
        scope = {**scope, "headers": headers}
        seed = sampling.seed if sampling is not None and not sampling.greedy else None
        await self.admission.run(request_id, seed, lambda answer: self.app(scope, replay, answer), receive, send)


class Flight:
    """One admitted request: the answer sent so far, and what ends it early (`gone`: its client hung up, or the
    server is stopping)."""

    def __init__(self, send: Any, seed: int | None) -> None:
        self.send = send
        self.seed = seed
        self.gone = threading.Event()
        self.started = self.streaming = self.closed = False
        self.task: asyncio.Task | None = None

    async def forward(self, message: dict) -> None:
        """Send the server's `message`, unless this answer was already ended (`end_with`)."""
        if self.closed:
            return
        if message["type"] == "http.response.start":
            self.started = True
            content_type = dict(message.get("headers", [])).get(b"content-type", b"")
            self.streaming = content_type.startswith(b"text/event-stream")
        await self.send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.closed = True

    async def end_with(self, status: int, error: dict) -> None:
        """End the answer with `error`: the whole answer if nothing was sent yet, else a stream's last event."""
        if self.closed:
            return
        self.closed = True
        if not self.started:
            await send_json(self.send, status, error)
        elif self.streaming:
            event = f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode()
            await self.send({"type": "http.response.body", "body": event, "more_body": False})
        else:
            await self.send({"type": "http.response.body", "body": b"", "more_body": False})


class Admission:
    """Which completion requests generate now, and the end of each: when its client hangs up (`watch`) or the server
    is told to stop (`stop`), its generation stops at its next token. Under `--continuous-batching` (`max_waiting`
    None) the paged scheduler interleaves requests; otherwise one generates at a time and at most `max_waiting` wait
    for it."""

    def __init__(self, max_waiting: int | None) -> None:
        self.max_waiting = max_waiting
        self.flights: dict[str, Flight] = {}  # by request id: requests admitted, not yet answered
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.generation_state: Any = None  # transformers serve's GenerationState, once the server is built

    def refusal(self) -> str | None:
        """Why a new request cannot be admitted now, or None."""
        if self.stopping:
            return "the server is shutting down; retry on another server or once it is back"
        waiting = sum(not flight.gone.is_set() for flight in self.flights.values()) - 1
        if self.max_waiting is not None and waiting >= self.max_waiting:
            return (
                f"the server is busy: one request is generating and {waiting} wait for it, the most it lets wait "
                f"(turner-serve --max-waiting {self.max_waiting}); retry later, or serve with "
                "--continuous-batching, which generates for many requests at once"
            )
        return None

    async def run(self, request_id: str, seed: int | None, handler: Any, receive: Any, send: Any) -> None:
        """Run `handler(answer)`, the server's answer to request `request_id`, watching its client for a hang-up
        until the answer is sent."""
        self.loop = asyncio.get_running_loop()
        flight = Flight(send, seed)
        flight.task = asyncio.ensure_future(handler(flight.forward))
        self.flights[request_id] = flight
        watcher = asyncio.ensure_future(self.watch(request_id, receive))
        try:
            await flight.task
        except asyncio.CancelledError:
            if not flight.task.cancelled():  # this middleware itself was cancelled, not the handler
                raise
        finally:
            watcher.cancel()
            del self.flights[request_id]

    async def watch(self, request_id: str, receive: Any) -> None:
        """Wait for the client of `request_id` to hang up before its answer is sent; then abandon the request."""
        while (await receive())["type"] != "http.disconnect":
            pass
        flight = self.flights.get(request_id)
        if flight is not None and not flight.closed:
            flight.closed = True
            self.abandon(request_id)

    def abandon(self, request_id: str) -> None:
        """Stop generating for `request_id`: sequential `generate()` stops at its next token (`ClientGone`) and its
        handler then returns (cancelling it would leave the inference thread a cancelled future to resolve); the
        paged scheduler drops the request, and its handler, which would wait for it forever, is cancelled."""
        flight = self.flights[request_id]
        flight.gone.set()
        if self.max_waiting is None:
            cancel_paged_request(self.generation_state, request_id)
            flight.task.cancel()

    async def stop_flight(self, request_id: str) -> None:
        flight = self.flights.get(request_id)
        if flight is None:
            return
        error = error_body(
            "the server is shutting down (SIGTERM or SIGINT) and stopped this request before its end; retry on "
            "another server or once it is back",
            "server_shutting_down",
        )
        with contextlib.suppress(OSError):  # the client has gone too
            await flight.end_with(503, error)
        if request_id in self.flights:
            self.abandon(request_id)

    def stop(self) -> None:
        """Admit nothing more, answer every request in flight with an error and stop its generation (SIGTERM,
        SIGINT). Called from the signal handler: the answers are sent from the event loop."""
        self.stopping = True
        if self.loop is None:
            return
        for request_id in list(self.flights):
            self.loop.call_soon_threadsafe(asyncio.ensure_future, self.stop_flight(request_id))


class ClientGone:
    """A `generate()` stopping criterion: true once `gone` is set (its client hung up, or the server is stopping)."""

    def __init__(self, gone: threading.Event) -> None:
        self.gone = gone

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        return torch.full((input_ids.shape[0],), self.gone.is_set(), dtype=torch.bool, device=input_ids.device)


def cancel_paged_request(generation_state: Any, request_id: str) -> None:
    """Drop `request_id` from `--continuous-batching`'s scheduler, if it runs one. Upstream cancels a streamed request
    when its client leaves, not a non-streamed one, and `GenerationState` keeps its paged manager private: this reads
    it where `CBStreamer.cancel` reaches it (`UPSTREAM`)."""
    manager = getattr(getattr(generation_state, "_cb_manager", None), "_cb", None)
    if manager is not None:
        manager.cancel_request(request_id)


def per_request_generation(admission: Admission) -> None:
    """Give each sequential `generate()` of `transformers serve` (`GenerateManager`) what belongs to its request: a
    `ClientGone` criterion (upstream stops a streamed generation when its client leaves and nothing else) and its
    seed (`SeedOnFirstStep`). Both travel in the tokenized inputs, which both methods spread into `generate()`."""
    from transformers import LogitsProcessorList, StoppingCriteriaList
    from transformers.cli.serving.utils import GenerateManager

    def with_request(method: Any) -> Any:
        def generate(self, model, processor, inputs, gen_config, *args, request_id: str, **kwargs):
            flight = admission.flights.get(request_id)
            gone = flight.gone if flight is not None else threading.Event()
            inputs = {**inputs, "stopping_criteria": StoppingCriteriaList([ClientGone(gone)])}
            if flight is not None and flight.seed is not None:
                inputs["logits_processor"] = LogitsProcessorList([SeedOnFirstStep(flight.seed)])
            return method(self, model, processor, inputs, gen_config, *args, request_id=request_id, **kwargs)

        generate.__wrapped__ = method
        return generate

    for name in ("generate_streaming", "generate_non_streaming"):
        setattr(GenerateManager, name, with_request(getattr(GenerateManager, name)))


def stop_generating_on_exit(admission: Admission) -> None:
    """Make uvicorn's SIGTERM and SIGINT handler (`Server.handle_exit`) answer and stop every request first:
    upstream waits for each to finish (minutes for a long generation) or, once cancelled, answers a bare 500."""
    import uvicorn

    handle_exit = uvicorn.Server.handle_exit

    def handle_exit_and_stop(server: Any, sig: int, frame: Any) -> None:
        admission.stop()
        handle_exit(server, sig, frame)

    uvicorn.Server.handle_exit = handle_exit_and_stop


def add_request_checks(model: ServedModel, admission: Admission) -> None:
    """Wrap the app that `transformers serve` builds (`serving.server.build_server`) in `RequestChecks`, and let
    `admission` reach the server's generations (`per_request_generation`, `stop_generating_on_exit`)."""
    from transformers.cli.serving import server

    build_server = server.build_server

    def build_checked_server(*args: Any, **kwargs: Any) -> Any:
        app = build_server(*args, **kwargs)
        admission.generation_state = kwargs.get("generation_state")
        app.add_middleware(RequestChecks, model=model, admission=admission)
        return app

    per_request_generation(admission)
    stop_generating_on_exit(admission)
    server.build_server = build_checked_server
