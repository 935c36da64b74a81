"""turner_tfm: the transformer block of Turner's *An Introduction to Transformers* as a `transformers` model family.

Importing the package registers `model_type="turner"` with the Auto classes, and marks every class so that
`save_pretrained` writes `auto_map` (every Auto class of the model's modality, whichever class was saved) and copies the
code next to the weights (`trust_remote_code=True` loading).

Which files travel with a saved folder: `modeling_turner.py` and the `*_turner.py` modules it imports, relatively, at
any depth (transformers copies exactly those). They hold the model and what every user of it needs; nothing else may
import a sibling of this package. What only the installed package offers (an integration such as Liger's patch, the
converters, the server, plots, model cards) lives in modules without the `_turner` suffix, which no `*_turner.py`
imports.
"""

import transformers
from transformers import AutoConfig

from . import modeling_turner
from .configuration_turner import TurnerConfig
from .liger import register_when_liger_loads
from .modeling_turner import *  # noqa: F403 (its __all__: the model classes, exported below)
from .pretrained_turner import AUTO_CLASSES

__version__ = "0.1.0"

AutoConfig.register(TurnerConfig.model_type, TurnerConfig, exist_ok=True)
TurnerConfig.register_for_auto_class()
for _classes in AUTO_CLASSES.values():
    for _auto_name, _class_name in _classes.items():
        _model_class = getattr(modeling_turner, _class_name)
        getattr(transformers, _auto_name).register(TurnerConfig, _model_class, exist_ok=True)
        _model_class.register_for_auto_class(_auto_name)
register_when_liger_loads()  # `use_liger_kernel=True` finds Turner in Liger's table (installed only: liger.py)

__all__ = ["TurnerConfig"]
__all__ += modeling_turner.__all__  # the model classes; a form type checkers follow
