"""The built-in model packages. Importing one registers its pipeline config classes
(``config.schema.register_pipeline``); config finds each by its ``sglang_omni.models`` entry
point (pyproject.toml; ``config.model_imports``) before it resolves a ``config_cls``, so neither
config nor the HTTP layer names a model. A model package outside Omni registers the same way: by
an entry point of its distribution, or named by the config's ``model_packages``."""

from sglang_omni.models import cosmos3

__all__ = ["cosmos3"]
