"""turner_tfm: the transformer block of Turner's *An Introduction to Transformers* as a `transformers` model family.

Importing the package registers `model_type="turner"` with the Auto classes, and marks every class so that
`save_pretrained` writes `auto_map` and copies the code next to the weights (`trust_remote_code=True` loading).
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
)

from .configuration_turner import TurnerConfig
from .modeling_turner import (
    TurnerForCausalLM,
    TurnerForImageClassification,
    TurnerForSequenceClassification,
    TurnerModel,
    TurnerPreTrainedModel,
)

__version__ = "0.1.0"

_AUTO_CLASSES = {
    AutoModel: TurnerModel,
    AutoModelForCausalLM: TurnerForCausalLM,
    AutoModelForSequenceClassification: TurnerForSequenceClassification,
    AutoModelForImageClassification: TurnerForImageClassification,
}

AutoConfig.register(TurnerConfig.model_type, TurnerConfig, exist_ok=True)
TurnerConfig.register_for_auto_class()
for _auto_class, _model_class in _AUTO_CLASSES.items():
    _auto_class.register(TurnerConfig, _model_class, exist_ok=True)
    _model_class.register_for_auto_class(_auto_class.__name__)

__all__ = [
    "TurnerConfig",
    "TurnerForCausalLM",
    "TurnerForImageClassification",
    "TurnerForSequenceClassification",
    "TurnerModel",
    "TurnerPreTrainedModel",
]
