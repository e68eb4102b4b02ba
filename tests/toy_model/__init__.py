"""A toy model package outside Omni, the proof that a second model serves through the same
routes: its own adapter (a one-line decision format), its own prompts and its own limits (a
largest side of 512 and a size multiple of 32 on the scripted engines). Importing it registers
its pipelines (``ToyUMMPipelineConfig``, ``ToyPipelineConfig``), as Cosmos3's do; its
``sglang_omni.models`` entry point (``toy = tests.toy_model``, in the ``.dist-info`` that
``distribution.py`` writes) has config loading import it, or a config names it with
``model_packages: [tests.toy_model]``."""

from tests.toy_model.configs import ToyPipelineConfig, ToyUMMPipelineConfig

__all__ = ["ToyPipelineConfig", "ToyUMMPipelineConfig"]
