"""A folder saved under one transformers release loads and generates the same tokens under another, as remote code.

Needs a second Python environment with another transformers release and turner_tfm installed: `.ci/run` runs this
file from its newest lane with `TURNER_OTHER_PYTHON` naming the floors lane's interpreter (the `cross_release` marker
keeps it out of the default run, which has one environment).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers

from .tiny import TEXT_DEFAULTS, random_ids

pytestmark = pytest.mark.cross_release

SWITCHES = {
    "learned": {},
    "rotary-rmsnorm": {"position_embedding_type": "rotary", "normalization": "rmsnorm"},
    "shared-qk-concat": {"share_query_key": True, "position_embedding_combine": "concat", "mlp_hidden_layers": 2},
}
NEW_TOKENS = 8

# Saves a folder per switch and the greedy tokens of a left-padded batch, or loads each folder as remote code where
# turner_tfm cannot be imported and writes the tokens it generates. Runs in either environment.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch, transformers
    mode, folder_root, payload = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    prompts, mask = torch.tensor(payload["prompts"]), torch.tensor(payload["mask"])
    tokens = {"transformers": transformers.__version__}
    if mode == "save":
        from turner_tfm import TurnerConfig, TurnerForCausalLM
        for name, switches in payload["switches"].items():
            torch.manual_seed(0)
            model = TurnerForCausalLM(TurnerConfig(**payload["config"], **switches)).eval()
            model.save_pretrained(f"{folder_root}/{name}")
    else:
        sys.modules["turner_tfm"] = None  # the folder's own code, not the package
    for name in payload["switches"]:
        model = transformers.AutoModelForCausalLM.from_pretrained(f"{folder_root}/{name}", trust_remote_code=True)
        for cache in (True, False):  # with the cache, and the reference: every step reads the whole sequence
            out = model.eval().generate(
                prompts, attention_mask=mask, max_new_tokens=payload["new"], do_sample=False, use_cache=cache
            )
            tokens[name if cache else f"{name} without a cache"] = out.tolist()
    print(json.dumps(tokens))
    """
)


def run(python: str, mode: str, folder_root: Path, payload: dict) -> dict:
    result = subprocess.run(
        [python, "-c", SCRIPT, mode, str(folder_root), json.dumps(payload)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=folder_root,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""},
    )
    assert result.returncode == 0, f"{python} {mode} failed:\n{result.stderr[-4000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def payload() -> dict:
    prompts = random_ids(2, 6)
    mask = torch.ones_like(prompts)
    mask[0, :2] = 0  # left padding
    return {
        "prompts": prompts.tolist(),
        "mask": mask.tolist(),
        "config": TEXT_DEFAULTS,
        "switches": SWITCHES,
        "new": NEW_TOKENS,
    }


@pytest.mark.parametrize("direction", ["saved here, loaded there", "saved there, loaded here"])
def test_a_folder_saved_under_one_release_generates_the_same_tokens_under_the_other(payload, direction, tmp_path):
    other = os.environ["TURNER_OTHER_PYTHON"]  # this test is meaningless without a second environment
    saver, loader = (sys.executable, other) if direction.startswith("saved here") else (other, sys.executable)
    saved = run(saver, "save", tmp_path, payload)
    loaded = run(loader, "load", tmp_path, payload)
    assert saved["transformers"] != loaded["transformers"], "both environments run the same transformers"
    assert {saved["transformers"], loaded["transformers"]} >= {transformers.__version__}
    for name in SWITCHES:
        assert saved[name] == saved[f"{name} without a cache"], f"{name}: the cache changes the tokens"
        assert loaded[name] == saved[name], f"{name}: {loaded[name]} under {loaded['transformers']}"
        assert len(saved[name][0]) == 6 + NEW_TOKENS
