"""torch deprecating a call made from a module of ours, or from someone else's: run through pytest by
tests/test_torch_deprecations.py (pytest collects this file only when it is named), under tests/conftest.py and
pyproject's `filterwarnings`. The warnings are torch's own; the log records stand in for torch's (which log few
deprecations, from private functions), from a torch module's frame to torch's loggers."""

import logging

import pytest
import torch
import torch.nn.functional as F

CALLS = {
    "upsample": "F.upsample(torch.ones(1, 1, 2), scale_factor=2)",  # a plain UserWarning, attributed to its caller
    "cpu_autocast": "torch.cpu.amp.autocast()",  # a FutureWarning, through typing_extensions.deprecated
    "pytree_log": "torch_logs('torch.utils._pytree')",  # a logger that passes its records up to torch's
    "dynamo_log": "torch_logs('torch._dynamo')",  # one that torch stops at itself (propagate=False)
}
CALLERS = {"ours": "turner_tfm.caller", "remote_code": "transformers_modules.folder.x", "someone_elses": "someone.x"}


def _function(module: str, parameters: str, source: str, **names) -> object:
    """A function `call(parameters)` running `source`, defined in the module named `module`."""
    namespace = {"__name__": module, **names}
    exec(f"def call({parameters}):\n    {source}", namespace)
    return namespace["call"]


torch_logs = _function(
    "torch.fake", "name", "logging.getLogger(name).warning('`x` is deprecated, use `y`')", logging=logging
)


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("call", CALLS)
def test(call: str, caller: str) -> None:
    _function(CALLERS[caller], "", CALLS[call], F=F, torch=torch, torch_logs=torch_logs)()
