"""Continue a prompt with a saved Turner language model, in one process or sharded over several (tensor parallel).

Each process of a tensor-parallel run holds a slice of every weight matrix (whole attention heads, part of the MLP,
part of the vocabulary) and the processes exchange partial results at every layer; the tokens are the same as in
one process.

    python -m examples.generate ./turner-quickstart --prompt "Return the"
    torchrun --nproc_per_node 2 -m examples.generate ./turner-quickstart --prompt "Return the" --tp-size 2
"""

import argparse
import os
import sys

from examples.helpers.argtypes import positive_int, saved_model


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "model_name_or_path", type=saved_model, help="a saved Turner causal LM folder (with its tokenizer)"
    )
    parser.add_argument("--prompt", default="Return the", help="the text to continue")
    parser.add_argument("--max-new-tokens", type=positive_int, default=50, help="tokens to generate (greedy)")
    parser.add_argument(
        "--tp-size",
        type=positive_int,
        default=1,
        help="tensor-parallel processes (as in transformers.DistributedConfig); start that many with torchrun",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if args.tp_size != world_size:
        parser.error(
            f"argument --tp-size: {args.tp_size} is not valid: it must equal the number of processes, {world_size} "
            f"(start {args.tp_size} with: torchrun --nproc_per_node {args.tp_size} -m examples.generate ...)"
        )
    from examples.helpers import training

    try:
        training.run(lambda: generate(parser, args))  # leaves the process group a tensor-parallel run opened
    except ValueError as error:  # a config the plan cannot shard is refused by name
        parser.error(f"argument --tp-size: {args.tp_size} is not valid for this model: {error}")


def generate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, DistributedConfig

    import turner_tfm  # noqa: F401  (registers "turner" with the Auto classes)
    from examples.helpers import distributed

    sharding = {"distributed_config": DistributedConfig(tp_size=args.tp_size)} if args.tp_size > 1 else {}
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, **sharding)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    inputs = tokenizer(args.prompt, return_tensors="pt")
    limit = model.config.max_positions  # None: positions without a limit
    room = None if limit is None else limit - inputs["input_ids"].shape[1]
    if room is not None and args.max_new_tokens > room:
        parser.error(
            f"argument --max-new-tokens: {args.max_new_tokens} is not valid: the model has "
            f"{limit} positions and the prompt takes {inputs['input_ids'].shape[1]}; "
            f"use at most {room}"
        )
    output = model.eval().generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
    distributed.announce(f"{held_parameters(model)}\n{tokenizer.decode(output[0], skip_special_tokens=True)}")


def held_parameters(model: object) -> str:
    """How many of the model's parameters this process holds: all of them, or its shard of each sharded tensor."""
    from torch.distributed.tensor import DTensor

    parameters = list(model.parameters())
    total = sum(parameter.numel() for parameter in parameters)
    if not model.tp_size:
        return f"model: {total:,} parameters in one process"
    held = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in parameters)
    return f"model: {total:,} parameters; tensor parallel over {model.tp_size} processes, the first holds {held:,}"


if __name__ == "__main__":
    sys.exit(main())
