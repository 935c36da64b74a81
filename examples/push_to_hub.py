"""Publish a saved Turner model folder to the Hugging Face Hub: weights, code, tokenizer or image processor, card.

The folder is what the training scripts save (config.json with `auto_map`, the model's code, safetensors weights,
tokenizer or preprocessor files, README.md). The card's usage snippet is pointed at the new repo, and everything goes
up in one commit, so anyone can load it with `trust_remote_code=True` without installing turner_tfm.

    hf auth login   # or export HF_TOKEN=hf_...
    python -m examples.push_to_hub --model-dir ./turner-quickstart --repo-id your-name/turner-quickstart

The Hub address comes from HF_ENDPOINT (default https://huggingface.co), the token from --token, HF_TOKEN or the
saved login.
"""

import argparse
import json
import sys
from pathlib import Path

from examples.helpers.argtypes import existing_dir

REQUIRED = {
    "config.json": "the model's config",
    "configuration_turner.py": "the config's code (saved by save_pretrained after `import turner_tfm`)",
    "modeling_turner.py": "the model's code",
    "README.md": "the model card",
}
PROCESSOR_FILES = ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json")
SKIPPED = ("checkpoint-", "runs", ".git")  # Trainer checkpoints and logs stay local


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=existing_dir, default="./turner-quickstart", help="the saved model folder")
    parser.add_argument("--repo-id", required=True, help="namespace/name of the model repo; created if missing")
    parser.add_argument("--private", action="store_true", help="create the repo as private")
    parser.add_argument("--token", default=None, help="a Hub token with write access (default: HF_TOKEN or login)")
    parser.add_argument("--commit-message", default="Upload Turner model", help="message of the commit")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = check_model_dir(args.model_dir)
    if problem:
        parser.error(f"argument --model-dir: {str(args.model_dir)!r} is not valid: {problem}")
    if args.repo_id.count("/") != 1 or not all(args.repo_id.split("/")):
        parser.error(f"argument --repo-id: {args.repo_id!r} is not valid: expected namespace/name")

    from huggingface_hub import CommitOperationAdd, HfApi, ModelCard, get_token
    from huggingface_hub.errors import HfHubHTTPError

    token = args.token or get_token()
    if token is None:
        parser.error("argument --token: no Hub token found: pass --token, set HF_TOKEN, or run `hf auth login`")

    from turner_tfm.cards import retarget_model_card

    api = HfApi(token=token)
    card = retarget_model_card(ModelCard.load(args.model_dir / "README.md"), args.repo_id)
    operations = [CommitOperationAdd("README.md", str(card).encode("utf-8"))]
    for path in sorted(files_to_push(args.model_dir)):
        operations.append(CommitOperationAdd(path.relative_to(args.model_dir).as_posix(), str(path)))
    try:
        repo_url = api.create_repo(args.repo_id, private=args.private, exist_ok=True)
        commit = api.create_commit(args.repo_id, operations, commit_message=args.commit_message)
    except HfHubHTTPError as error:
        sys.exit(f"push_to_hub.py: the Hub at {api.endpoint} refused: {error}")

    print(f"pushed {len(operations)} files to {repo_url}: {', '.join(op.path_in_repo for op in operations)}")
    print(f"commit: {commit.oid}")
    auto_class = usage_class(args.model_dir)
    print(f'load it anywhere: {auto_class}.from_pretrained("{args.repo_id}", trust_remote_code=True)')


def check_model_dir(model_dir: Path) -> str | None:
    """What a publishable Turner folder lacks, or None."""
    missing = [f"{name} ({why})" for name, why in REQUIRED.items() if not (model_dir / name).is_file()]
    if not any(model_dir.glob("*.safetensors")):
        missing.append("*.safetensors (the weights)")
    if not any((model_dir / name).is_file() for name in PROCESSOR_FILES):
        missing.append("a tokenizer or image processor (tokenizer.json or preprocessor_config.json)")
    if (model_dir / "modeling_turner.py").is_file():
        from transformers.dynamic_module_utils import get_relative_imports

        siblings = [f"{name}.py" for name in get_relative_imports(model_dir / "modeling_turner.py")]
        missing += [f"{name} (imported by modeling_turner.py)" for name in siblings if not (model_dir / name).is_file()]
    if missing:
        return "it lacks " + "; ".join(missing)
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") != "turner" or "auto_map" not in config:
        return "its config.json is not a Turner config with auto_map (save the model after `import turner_tfm`)"
    return None


def files_to_push(model_dir: Path) -> list[Path]:
    """Every file of the folder except the card (pushed retargeted) and the Trainer's checkpoints and logs."""
    return [
        path
        for path in model_dir.rglob("*")
        if path.is_file()
        and path.relative_to(model_dir).as_posix() != "README.md"
        and not any(part.startswith(SKIPPED) for part in path.relative_to(model_dir).parts)
    ]


def usage_class(model_dir: Path) -> str:
    """The Auto class that loads the folder's model: the `auto_map` entry naming the class it was saved as."""
    config = json.loads((model_dir / "config.json").read_text())
    saved = (config.get("architectures") or ["TurnerModel"])[0]
    return next((name for name, path in config["auto_map"].items() if path.endswith(f".{saved}")), "AutoModel")


if __name__ == "__main__":
    sys.exit(main())
