"""The ``hf`` backend: the real Cosmos3 model code from transformers (the Reasoner) and diffusers
(the generation tower), without native SGLang. It runs on a CPU or one GPU per stage; with the
tiny checkpoint (``sgl-omni make-tiny-checkpoint``) the whole product runs on a laptop.

Install with the ``hf`` extra. Importing this package imports no heavy library; the engines
import torch, transformers and diffusers when they load.
"""

from sglang_omni.engines.hf.generation import HFGenerator
from sglang_omni.engines.hf.reasoner import HFReasoner

__all__ = ["HFGenerator", "HFReasoner"]
