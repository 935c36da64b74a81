"""`turner-serve FOLDER [transformers serve options]`: serve a Turner folder with transformers' own OpenAI-compatible
server (`transformers serve`: `/v1/completions`, `/v1/chat/completions`, streaming, `--continuous-batching`).

Two things stand between that server (transformers 5.23) and a model that does not ship inside `transformers`; this
module adds the smallest piece for each and leaves the server itself alone:

1. The lookup. `ModelManager._load_model` finds the model class with
   `getattr(transformers, config.architectures[0])`, so a class known only to the Auto registry (`import turner_tfm`)
   or to the folder's `auto_map` (`--trust-remote-code`) is an `AttributeError` and the server does not start.
   `expose_architecture` resolves the folder's class the way the Auto classes would and sets it, under its own name,
   on the module object that line reads. It stands in for the upstream fix (docs/deploy.md, "Serve over HTTP"):
   fall back to `AutoModelForCausalLM` (which reads the registry and `auto_map`) when `transformers` has no such
   attribute, as TRL's own loader does since huggingface/trl#5802.
2. Requests the model cannot answer. Upstream, a negative or huge `max_tokens`, a prompt longer than the positions,
   and a chat request to a tokenizer without a chat template all end as a 500 (or a stream that carries the model's
   error). `RequestChecks` reads each `/v1/completions` and `/v1/chat/completions` body before the server does and
   answers those with a 400 whose message names the field and the value; a request without `max_tokens` gets the
   positions left after its prompt instead of the server's 1024. The rule is generate()'s: learned positions end
   with their table (`max_position_embeddings`), rotary and sinusoidal ones continue past it when `max_tokens` asks.
   Malformed JSON and non-UTF-8 bodies go on to the server, which answers them (422, 400) itself.

3. Leaving it running. `GET /v1/models`, the first call many OpenAI clients and chat UIs make, is a 500 upstream
   (it scans the Hub cache, and would not list a local folder anyway): `RequestChecks` answers it with the served
   model, under the name requests use. And `--continuous-batching` sizes its paged KV cache, unless told, from the
   device's free memory, which on the CPU is the machine's RAM (a 256-position model's server grew from 0.4 to
   14 GiB at its first request): `paged_cache_options` sizes it from what the model can use instead, room for
   `--cb-max-requests` requests of `max_position_embeddings` positions each, unless `--cb-num-blocks` says otherwise.

4. One client must not hold the model from everyone (`Admission`). Upstream, a non-streamed request runs to its last
   token after its client hung up, every later request waits behind it in the sequential configuration, and SIGTERM
   waits for it. Here a request may ask for at most `--max-tokens-limit` new tokens (400 past it); a generation stops
   at its next token once its client is gone (a stopping criterion in sequential `generate()`, the paged scheduler's
   own cancellation under `--continuous-batching`); in the sequential configuration at most `--max-waiting` requests
   wait while one generates and more get a 503 at once (continuous batching interleaves requests instead); and
   SIGTERM or SIGINT stops every generation in flight, so the server exits in seconds.

Everything after the folder is `transformers serve`'s own options, parsed by its own command (`--help` lists them),
plus turner-serve's `--cb-max-requests`, `--max-tokens-limit` and `--max-waiting`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

SERVED_ROUTES = ("/v1/completions", "/v1/chat/completions")
MODELS_ROUTE = "/v1/models"
CB_MAX_REQUESTS = 16  # --cb-max-requests' default: requests the paged cache holds at once, at full length each
MAX_TOKENS_LIMIT = 1024  # --max-tokens-limit's default: new tokens one request may ask for (upstream's default ask)
MAX_WAITING = 16  # --max-waiting's default: requests that wait while one generates (sequential configuration)
SAMPLING_RANGES = {"temperature": (0.0, 2.0, True), "top_p": (0.0, 1.0, False)}  # OpenAI's: (low, high, low allowed)
X_REQUEST_ID = b"x-request-id"  # the header `transformers serve` takes a request's id from


def model_class_for(folder: str, config: Any, trust_remote_code: bool) -> type:
    """The causal-LM class the Auto classes load `folder` (whose config is `config`) as: the folder's own code
    (`auto_map`) with `trust_remote_code`, else the class registered for its config (`import turner_tfm`)."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    class_ref = (getattr(config, "auto_map", None) or {}).get("AutoModelForCausalLM")
    if trust_remote_code and class_ref is not None:
        return get_class_from_dynamic_module(class_ref, folder)
    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    raise SystemExit(
        f"turner-serve: {folder} (model_type {config.model_type!r}, architectures {config.architectures}) has no "
        "causal language model class: transformers serve generates text, so the folder must hold a "
        "TurnerForCausalLM (or name one in auto_map['AutoModelForCausalLM'] and be served with --trust-remote-code)"
    )


def expose_architecture(folder: str, trust_remote_code: bool) -> type | None:
    """Workaround of `getattr(transformers, config.architectures[0])` in
    `transformers/cli/serving/model_manager.py` (`ModelManager._load_model`): make that lookup find `folder`'s
    class. Returns the class set, or None where `transformers` already has one by that name.

    The attribute goes on `model_manager.transformers`, the object the lookup reads: importing
    `transformers.modeling_layers` replaces `sys.modules["transformers"]`, so `import transformers` here may bind
    another object than the one the server module holds."""
    from transformers import AutoConfig
    from transformers.cli.serving import model_manager

    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    architectures = config.architectures or []
    if not architectures:
        raise SystemExit(f"turner-serve: {folder}/config.json names no `architectures`; save it with save_pretrained")
    name = architectures[0]
    if hasattr(model_manager.transformers, name):
        return None
    model_class = model_class_for(folder, config, trust_remote_code)
    if model_class.__name__ != name:
        raise SystemExit(
            f"turner-serve: {folder} holds a {name} (config.json `architectures`); transformers serve generates text "
            f"and needs the causal language model, {model_class.__name__}: serve a folder saved from one"
        )
    setattr(model_manager.transformers, name, model_class)
    return model_class


# ---- request checks ---------------------------------------------------------------------------------------------


class RequestChecks:
    """ASGI middleware: answers 400 to a completion request the model cannot serve before the server reads it, 503 to
    one it has no room for (`Admission`), and passes every other request through (the body replayed as it came, or
    with the `max_tokens` a request without one may use), its generation watched by `Admission`."""

    def __init__(self, app: Any, model: ServedModel, admission: Admission) -> None:
        self.app = app
        self.model = model
        self.admission = admission

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == MODELS_ROUTE:
            await _send_json(send, 200, {"object": "list", "data": [self.model.card()]})
            return
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in SERVED_ROUTES:
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            body = self.model.checked(scope["path"], body)
        except RequestError as error:
            await _send_json(send, 400, {"error": {"message": str(error), "type": "invalid_request_error"}})
            return
        if refusal := self.admission.refusal():
            error = {"error": {"message": refusal, "type": "server_busy"}}
            await _send_json(send, 503, error, [(b"retry-after", b"1")])
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
        await self.admission.run(request_id, lambda answer: self.app(scope, replay, answer), receive, send)


class Admission:
    """Which completion requests generate now, and the end of each: when its client hangs up (`watch`) or the server
    is told to stop (`stop`), its generation stops at its next token and its handler is cancelled. Under
    `--continuous-batching` (`max_waiting` None) the paged scheduler interleaves requests; otherwise one generates at
    a time and at most `max_waiting` wait for it."""

    def __init__(self, max_waiting: int | None) -> None:
        self.max_waiting = max_waiting
        self.running: dict[str, asyncio.Task] = {}  # by request id: the handlers of requests admitted, not yet answered
        self.gone: dict[str, threading.Event] = {}  # by request id: set once its answer is no longer wanted
        self.stopping = False
        self.generation_state: Any = None  # transformers serve's GenerationState, once the server is built

    def refusal(self) -> str | None:
        """Why a new request cannot be admitted now, or None."""
        if self.stopping:
            return "the server is shutting down"
        if self.max_waiting is not None and len(self.running) > self.max_waiting:
            return (
                f"the server is busy: one request is generating and {len(self.running) - 1} wait for it, the most "
                f"it lets wait (turner-serve --max-waiting {self.max_waiting}); retry later, or serve with "
                "--continuous-batching, which generates for many requests at once"
            )
        return None

    async def run(self, request_id: str, handler: Any, receive: Any, send: Any) -> None:
        """Run `handler(send)`, the server's answer to request `request_id`, watching its client for a hang-up until
        the answer is sent."""
        answered = asyncio.Event()

        async def answer(message: dict) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered.set()

        task = asyncio.ensure_future(handler(answer))
        self.running[request_id], self.gone[request_id] = task, threading.Event()
        watcher = asyncio.ensure_future(self.watch(request_id, receive, answered))
        try:
            await task
        except asyncio.CancelledError:
            if not task.cancelled():  # this middleware itself was cancelled, not the handler
                raise
        finally:
            watcher.cancel()
            del self.running[request_id], self.gone[request_id]

    async def watch(self, request_id: str, receive: Any, answered: asyncio.Event) -> None:
        """Wait for the client of `request_id` to hang up before its answer is sent; then abandon the request."""
        while (await receive())["type"] != "http.disconnect":
            pass
        if not answered.is_set():
            self.abandon(request_id)

    def abandon(self, request_id: str) -> None:
        """Stop generating for `request_id`: sequential `generate()` stops at its next token (`ClientGone`), the
        paged scheduler drops the request, and its handler is cancelled."""
        self.gone[request_id].set()
        cancel_paged_request(self.generation_state, request_id)
        task = self.running[request_id]
        task.get_loop().call_soon_threadsafe(task.cancel)

    def stop(self) -> None:
        """Admit nothing more and abandon every request in flight (SIGTERM, SIGINT)."""
        self.stopping = True
        for request_id in list(self.running):
            self.abandon(request_id)


class ClientGone:
    """A `generate()` stopping criterion: true once `gone` is set (its client hung up, or the server is stopping)."""

    def __init__(self, gone: threading.Event) -> None:
        self.gone = gone

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        return torch.full((input_ids.shape[0],), self.gone.is_set(), dtype=torch.bool, device=input_ids.device)


def cancel_paged_request(generation_state: Any, request_id: str) -> None:
    """Drop `request_id` from `--continuous-batching`'s scheduler, if it runs one. Upstream cancels a streamed request
    when its client leaves, not a non-streamed one, and `GenerationState` keeps its paged manager private (transformers
    5.24): this reads it where `CBStreamer.cancel` reaches it."""
    manager = getattr(getattr(generation_state, "_cb_manager", None), "_cb", None)
    if manager is not None:
        manager.cancel_request(request_id)


def stop_abandoned_generations(admission: Admission) -> None:
    """Give each sequential `generate()` of `transformers serve` (`GenerateManager`) a `ClientGone` criterion for its
    request. Upstream stops a streamed generation when its client leaves and nothing else: a non-streamed one runs to
    its last token after its client hung up, and every request behind it waits (transformers 5.24). The criterion
    travels in the tokenized inputs, which both methods spread into `generate()`'s arguments."""
    from transformers import StoppingCriteriaList
    from transformers.cli.serving.utils import GenerateManager

    def with_criterion(method: Any) -> Any:
        def generate(self, model, processor, inputs, gen_config, *args, request_id: str, **kwargs):
            gone = admission.gone.get(request_id) or threading.Event()
            inputs = {**inputs, "stopping_criteria": StoppingCriteriaList([ClientGone(gone)])}
            return method(self, model, processor, inputs, gen_config, *args, request_id=request_id, **kwargs)

        return generate

    for name in ("generate_streaming", "generate_non_streaming"):
        setattr(GenerateManager, name, with_criterion(getattr(GenerateManager, name)))


def stop_generating_on_exit(admission: Admission) -> None:
    """Make uvicorn's SIGTERM and SIGINT handler (`Server.handle_exit`) stop every generation first: upstream waits
    for each request in flight to finish, which a long generation makes minutes."""
    import uvicorn

    handle_exit = uvicorn.Server.handle_exit

    def handle_exit_and_stop(server: Any, sig: int, frame: Any) -> None:
        admission.stop()
        handle_exit(server, sig, frame)

    uvicorn.Server.handle_exit = handle_exit_and_stop


class RequestError(ValueError):
    """A request the model cannot serve; the message names the field and its value."""


async def _send_json(send: Any, status: int, payload: dict, headers: list | None = None) -> None:
    content = json.dumps(payload).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(content)).encode()),
        *(headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


class ServedModel:
    """What a request is checked against: the folder's tokenizer (and chat template) and its positions."""

    def __init__(self, folder: str, trust_remote_code: bool, max_tokens_limit: int = MAX_TOKENS_LIMIT) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.folder = folder
        self.max_tokens_limit = max_tokens_limit
        self.created = int(Path(folder, "config.json").stat().st_mtime)
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        self.tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
        self.max_positions = config.max_position_embeddings
        # generate()'s rule (checks_turner.check_generation_length): learned positions end with their table, so a
        # prompt and its completion must fit in them; rotary and sinusoidal ones (config.max_positions is None) are
        # computed for any position, so only the default length stops at max_position_embeddings, as transformers'
        # default max_length does. Remote code older than `max_positions` is taken as learned.
        self.learned = getattr(config, "max_positions", self.max_positions) is not None
        self.limit = f"the model's learned positions (max_position_embeddings) allow {self.max_positions}"

    def card(self) -> dict:
        """The served model as `GET /v1/models` lists it (OpenAI's model object): its id is the name requests must
        use, the FOLDER as given on the command line (the server refuses any other); and the most new tokens one
        request may ask for (`--max-tokens-limit`)."""
        return {
            "id": self.folder,
            "object": "model",
            "created": self.created,
            "owned_by": "turner-serve",
            "max_tokens_limit": self.max_tokens_limit,
        }

    def checked(self, path: str, raw: bytes) -> bytes:
        """The body to pass on to the server for a request to `path`; `RequestError` if it cannot be served. A body
        that is not a JSON object goes on unread: the server answers it (422 or 400) itself."""
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return raw
        if not isinstance(body, dict):
            return raw
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = body.get(key)
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
            raise RequestError(f"{key} must be a positive integer, got {max_tokens!r}")
        check_sampling(body)
        if path == "/v1/chat/completions" and "messages" in body and self.tokenizer.chat_template is None:
            raise RequestError(
                f"the model {self.folder} has no chat template, so it cannot answer chat requests "
                "(/v1/chat/completions): send a prompt to /v1/completions, or save the tokenizer with a chat_template"
            )
        prompt_tokens = self.prompt_tokens(path, body)
        if prompt_tokens is None:
            return raw  # no prompt the model would read: the server names what is wrong
        if prompt_tokens == 0:
            raise RequestError(
                "the prompt is empty: its tokenizer gives no token for the model to continue (this one adds no BOS "
                "token); send at least one character"
            )
        room = self.max_positions - prompt_tokens
        if room < 1 and (self.learned or max_tokens is None):
            raise RequestError(self.too_long(prompt_tokens))
        if max_tokens is not None and max_tokens > self.max_tokens_limit:
            raise RequestError(
                f"{key}={max_tokens} is more new tokens than this server gives one request, {self.max_tokens_limit} "
                f"(turner-serve --max-tokens-limit): ask for at most {min(self.max_tokens_limit, room)}"
            )
        if max_tokens is None:  # the server's default (1024 new tokens) may run past max_position_embeddings
            return json.dumps({**body, "max_tokens": min(room, self.max_tokens_limit)}).encode()
        if self.learned and max_tokens > room:
            raise RequestError(
                f"{key}={max_tokens} after a prompt of {prompt_tokens} tokens needs {prompt_tokens + max_tokens} "
                f"positions; {self.limit}: ask for at most {room}"
            )
        return raw

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


def check_sampling(body: dict) -> None:
    """`RequestError` for a sampling parameter outside OpenAI's range (temperature in [0, 2], top_p in (0, 1]):
    upstream passes a negative temperature on to generate() or to the paged scheduler."""
    for name, (low, high, low_allowed) in SAMPLING_RANGES.items():
        value = body.get(name)
        if value is None:
            continue
        number = type(value) in (int, float)
        if not number or not (low <= value <= high) or (value == low and not low_allowed):
            bounds = f"{'[' if low_allowed else '('}{low:g}, {high:g}]"
            raise RequestError(f"{name} must be a number in {bounds}, as OpenAI's API takes it; got {value!r}")


def add_request_checks(model: ServedModel, admission: Admission) -> None:
    """Wrap the app that `transformers serve` builds (`serving.server.build_server`) in `RequestChecks`, and let
    `admission` stop the server's generations (`stop_abandoned_generations`, `stop_generating_on_exit`)."""
    from transformers.cli.serving import server

    build_server = server.build_server

    def build_checked_server(*args: Any, **kwargs: Any) -> Any:
        app = build_server(*args, **kwargs)
        admission.generation_state = kwargs.get("generation_state")
        app.add_middleware(RequestChecks, model=model, admission=admission)
        return app

    stop_abandoned_generations(admission)
    stop_generating_on_exit(admission)

    server.build_server = build_checked_server


# ---- the paged cache of --continuous-batching -------------------------------------------------------------------


def paged_cache_options(params: dict, max_positions: int) -> list[str]:
    """The `transformers serve` options that size `--continuous-batching`'s paged KV cache from what the model can
    use: `--cb-max-requests` requests of `max_positions` positions each, `ceil(max_positions / page size)` blocks a
    request. Upstream, an unset `--cb-num-blocks` is sized from the device's free memory (on the CPU: 90% of the
    machine's RAM less the server's own) and an unset `--cb-max-batch-tokens` is 8192 tokens a forward pass, whose
    attention masks grow with the cache. Returns no options when continuous batching is off or `--cb-num-blocks` is
    given (the user asked for a size); `--cb-max-batch-tokens`, when given, is kept."""
    from transformers import ContinuousBatchingConfig

    if not params.get("continuous_batching") or params.get("cb_num_blocks") is not None:
        return []
    requests = params.get("cb_max_requests") or CB_MAX_REQUESTS
    page = params.get("cb_block_size") or ContinuousBatchingConfig().page_size
    options = ["--cb-num-blocks", str(requests * -(-max_positions // page))]
    if params.get("cb_max_batch_tokens") is None:  # every request's whole prompt in one forward pass, at most
        options += ["--cb-max-batch-tokens", str(min(requests * max_positions, 8192))]
    return options


# ---- the command ------------------------------------------------------------------------------------------------


TURNER_OPTIONS = {  # turner-serve's own options, read by main() and not passed on: name: (default, least, help)
    "cb_max_requests": (
        CB_MAX_REQUESTS,
        1,
        "turner-serve: with --continuous-batching and no --cb-num-blocks, the paged KV cache holds this many requests "
        "of max_position_embeddings positions each (more wait for room), and --cb-max-batch-tokens defaults to this "
        "many whole prompts (at most 8192). Without it the cache is sized from free memory: on the CPU, most of the "
        "machine's RAM.",
    ),
    "max_tokens_limit": (
        MAX_TOKENS_LIMIT,
        1,
        "turner-serve: the most new tokens (max_tokens) one request may ask for; a larger ask gets a 400 naming this "
        "limit, and a request without max_tokens gets at most this many.",
    ),
    "max_waiting": (
        MAX_WAITING,
        0,
        "turner-serve: without --continuous-batching, how many requests may wait while one generates; more get a 503 "
        "(retry later) at once. A request whose client hangs up stops generating at its next token, waiting or not.",
    ),
}


def serve_command() -> Any:
    """`transformers serve` as a click command of its own (its options, its parser, its help), plus turner-serve's
    own `TURNER_OPTIONS`, which are not passed on to it."""
    import copy
    import inspect
    from typing import Annotated

    import typer
    from transformers.cli.serve import Serve

    upstream = inspect.signature(Serve.__init__, eval_str=True)
    own = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=default,
            annotation=Annotated[int, typer.Option(min=least, help=text)],
        )
        for name, (default, least, text) in TURNER_OPTIONS.items()
    ]
    parameters = [*list(upstream.parameters.values())[1:], *own]  # less `self`
    for index, parameter in enumerate(parameters):
        if parameter.name == "cb_num_blocks":  # its help says what turner-serve does when it is not given
            option = copy.copy(parameter.annotation.__metadata__[0])
            option.help = f"{option.help} Default (turner-serve): room for --cb-max-requests whole requests."
            annotation = Annotated[parameter.annotation.__origin__, option]
            parameters[index] = parameter.replace(annotation=annotation)

    def serve(**options: Any) -> Any:
        for name in TURNER_OPTIONS:  # read by main() before the command runs
            options.pop(name)
        return Serve(**options)

    serve.__signature__ = upstream.replace(parameters=parameters)
    serve.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command(help=Serve.__doc__)(serve)
    return typer.main.get_command(app)


def main(argv: list[str] | None = None) -> None:
    import typer

    usage_error = getattr(typer, "TyperException", None)  # typer 0.29 carries its own click
    if usage_error is None:
        from click import ClickException as usage_error

    argv = list(sys.argv[1:] if argv is None else argv)
    command = serve_command()
    if {"--help", "-h"} & set(argv):
        command.main(args=["--help"], prog_name="turner-serve")
        return
    try:  # a bad option is refused now, before the folder is read
        with command.make_context("turner-serve", list(argv)) as context:
            params = dict(context.params)
    except usage_error as error:
        error.show()
        sys.exit(error.exit_code)
    folder, trust_remote_code = params.get("force_model"), bool(params.get("trust_remote_code"))
    if folder is None:
        print(
            "turner-serve: give the FOLDER to serve: turner-serve FOLDER [transformers serve options]", file=sys.stderr
        )
        sys.exit(2)
    if not (Path(folder) / "config.json").is_file():
        print(f"turner-serve: FOLDER {folder!r} is not a folder with a config.json", file=sys.stderr)
        sys.exit(2)
    # `import turner_tfm.serve` has registered "turner" with the Auto classes; with --trust-remote-code the class
    # comes from the folder's own code instead.
    model_class = expose_architecture(folder, trust_remote_code)
    if model_class is not None:
        source = "the folder's own code (auto_map)" if trust_remote_code else "the Auto registry"
        print(
            f"turner-serve: {folder}: {model_class.__name__} is {model_class.__module__}.{model_class.__name__}, "
            f"from {source}",
            file=sys.stderr,
            flush=True,
        )
    served = ServedModel(folder, trust_remote_code, params["max_tokens_limit"])
    if cache := paged_cache_options(params, served.max_positions):
        print(
            f"turner-serve: continuous batching: {cache[1]} paged-cache blocks, room for "
            f"{params.get('cb_max_requests') or CB_MAX_REQUESTS} requests of max_position_embeddings="
            f"{served.max_positions} positions at once (--cb-max-requests; --cb-num-blocks sets the size itself): "
            f"{' '.join(cache)}",
            file=sys.stderr,
            flush=True,
        )
    continuous = bool(params.get("continuous_batching"))
    print(
        f"turner-serve: at most {served.max_tokens_limit} new tokens a request (--max-tokens-limit); "
        + (
            "continuous batching generates for many requests at once"
            if continuous
            else f"one request generates at a time, at most {params['max_waiting']} wait (--max-waiting)"
        ),
        file=sys.stderr,
        flush=True,
    )
    add_request_checks(served, Admission(None if continuous else params["max_waiting"]))
    command.main(args=[*argv, *cache], prog_name="turner-serve")


if __name__ == "__main__":
    main()
