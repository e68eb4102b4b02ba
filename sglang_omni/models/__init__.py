"""The built-in model packages. Importing this package registers each one's pipeline config
classes (``config.schema.register_pipeline``); config loads it by name
(``config.schema.BUILT_IN_MODELS``) before it resolves a ``config_cls``, so neither config nor
the HTTP layer names a model. A model package outside Omni registers the same way and is named
by the config's ``model_packages``."""

from sglang_omni.models import cosmos3

__all__ = ["cosmos3"]
