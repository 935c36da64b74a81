"""`turner-serve FOLDER [transformers serve options]`: serve a Turner folder with transformers' own OpenAI-compatible
server (`transformers serve`: `/v1/completions`, `/v1/chat/completions`, streaming, `--continuous-batching`).

This module is the Turner part and the command; `turner_tfm/serve_openai.py` is what turner-serve adds to
`transformers serve` for any model (OpenAI's meaning of each request field, one sampling setting per request or a
400, errors in OpenAI's shape, one client not holding the model, a clean shutdown, the upstream names it relies on).

1. The lookup. `ModelManager._load_model` finds the model class with
   `getattr(transformers, config.architectures[0])`, so a class known only to the Auto registry (`import turner_tfm`)
   or to the folder's `auto_map` (`--trust-remote-code`) is an `AttributeError` and the server does not start.
   `expose_architecture` resolves the folder's class the way the Auto classes would and sets it, under its own name,
   on the module object that line reads. It stands in for the upstream fix (docs/deploy.md, "Serve over HTTP"):
   fall back to `AutoModelForCausalLM` (which reads the registry and `auto_map`) when `transformers` has no such
   attribute, as TRL's own loader does since huggingface/trl#5802.
2. The positions. Learned positions end with their table (`max_position_embeddings`), rotary and sinusoidal ones
   continue past it when `max_tokens` asks: generate()'s rule (`checks_turner.check_generation_length`), read from the
   config's `max_positions` and handed to `serve_openai.ServedModel`, which checks each request against it.
3. The paged cache. `--continuous-batching` sizes its paged KV cache, unless told, from the device's free memory,
   which on the CPU is the machine's RAM: `paged_cache_options` sizes it from what the model can use instead, room
   for `--cb-max-requests` requests of `max_position_embeddings` positions each, unless `--cb-num-blocks` says
   otherwise.

Everything after the folder is `transformers serve`'s own options, parsed by its own command (`--help` lists them),
plus turner-serve's `--cb-max-requests`, `--max-tokens-limit` and `--max-waiting`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from .serve_openai import MAX_TOKENS_LIMIT, Admission, ServedModel, add_request_checks, missing_upstream_names

CB_MAX_REQUESTS = 16  # --cb-max-requests' default: requests the paged cache holds at once, at full length each
MAX_WAITING = 16  # --max-waiting's default: requests that wait while one generates (sequential configuration)


def learned_positions(folder: str, trust_remote_code: bool) -> bool:
    """Whether `folder`'s positions end with their table (generate()'s rule, `checks_turner.check_generation_length`):
    learned ones do; rotary and sinusoidal ones (`config.max_positions` None) are computed for any position. Remote
    code older than `max_positions` is taken as learned."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    return getattr(config, "max_positions", config.max_position_embeddings) is not None


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
    if missing := missing_upstream_names():
        print(
            "turner-serve: the installed transformers no longer has what turner-serve relies on (turner_tfm/"
            "serve_openai.py, UPSTREAM): " + "; ".join(missing),
            file=sys.stderr,
        )
        sys.exit(1)
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
    continuous = bool(params.get("continuous_batching"))
    served = ServedModel(
        folder,
        trust_remote_code,
        params["max_tokens_limit"],
        learned_positions=learned_positions(folder, trust_remote_code),
        continuous=continuous,
    )
    if cache := paged_cache_options(params, served.max_positions):
        print(
            f"turner-serve: continuous batching: {cache[1]} paged-cache blocks, room for "
            f"{params.get('cb_max_requests') or CB_MAX_REQUESTS} requests of max_position_embeddings="
            f"{served.max_positions} positions at once (--cb-max-requests; --cb-num-blocks sets the size itself): "
            f"{' '.join(cache)}",
            file=sys.stderr,
            flush=True,
        )
    sampling = served.sampling_card()
    if continuous:
        fixed = ", ".join(f"{key} {value}" for key, value in sampling["fixed"].items())
        how = (
            f"continuous batching generates for many requests at once, all with one sampling setting, {fixed} (the "
            "folder's generation config): a request asking for another temperature, top_p or a seed gets a 400"
        )
    else:
        default = ", ".join(f"{key} {value}" for key, value in sampling["default"].items())
        how = (
            f"one request generates at a time, at most {params['max_waiting']} wait (--max-waiting); each is "
            f"sampled with its own temperature, top_p and seed ({default} where it gives none)"
        )
    print(
        f"turner-serve: at most {served.max_tokens_limit} new tokens a request (--max-tokens-limit); {how}",
        file=sys.stderr,
        flush=True,
    )
    add_request_checks(served, Admission(None if continuous else params["max_waiting"]))
    command.main(args=[*argv, *cache], prog_name="turner-serve")


if __name__ == "__main__":
    main()
