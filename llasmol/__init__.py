"""llasmol: LoRA fine-tuning of causal LLMs on SMolInstruct, scored with the LlaSMol paper's metrics.

Kept import-light on purpose: commands import only the submodules they need.
"""

import logging

__version__ = "0.1.0"

# PEFT imports bitsandbytes, whose CPU backend warns at every start that an optional Hub kernel is
# absent; we use no 4-bit CPU kernels, so on CPU the warning is noise.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
