"""The converter ships in the wheel: after a plain (non-editable) install, `turner-convert` and
`python -m turner_tfm.convert` convert a checkpoint, while the repository keeps `convert/` at its top level."""

import sys
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from convert.cli import main
from turner_tfm import TurnerForCausalLM

from .convert_helpers import assert_same_outputs, assert_same_state_dict, masked_ids


def test_the_installed_wheel_converts_with_its_command_and_as_a_module(installed_wheel, tmp_path: Path) -> None:
    names = installed_wheel.names
    assert {"turner_tfm/convert/cli.py", "turner_tfm/convert/__main__.py", "turner_tfm/convert/gpt2.py"} <= set(names)
    assert not any(name.startswith("convert/") for name in names)  # no top-level `convert` package in site-packages
    entry_points = next(name for name in names if name.endswith(".dist-info/entry_points.txt"))
    assert "turner-convert = turner_tfm.convert.cli:main" in installed_wheel.read(entry_points)

    torch.manual_seed(0)
    source = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=2)).eval()
    source.save_pretrained(tmp_path / "gpt2")
    module = installed_wheel.run([sys.executable, "-m", "turner_tfm.convert", "gpt2", "gpt2", "turner"], cwd=tmp_path)
    assert module.returncode == 0, module.stderr[-3000:]
    assert "GPT2LMHeadModel (gpt2) -> TurnerForCausalLM (turner)" in module.stdout
    assert_same_outputs(
        source, TurnerForCausalLM.from_pretrained(tmp_path / "turner"), masked_ids(40, 0, (6,)), ("logits",)
    )

    command = installed_wheel.run(["turner-convert", "gpt2", "turner", "back", "--reverse"], cwd=tmp_path)
    assert command.returncode == 0, command.stderr[-3000:]
    assert_same_state_dict(source, GPT2LMHeadModel.from_pretrained(tmp_path / "back"))


def test_help_names_the_command_the_user_ran(monkeypatch, capsys) -> None:
    for argv0, prog in (("/site/bin/turner-convert", "turner-convert"), ("-m", "python -m convert")):
        monkeypatch.setattr(sys, "argv", [argv0])
        with pytest.raises(SystemExit):
            main(["--help"])
        assert capsys.readouterr().out.startswith(f"usage: {prog} "), prog
