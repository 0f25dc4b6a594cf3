"""llasmol: LoRA fine-tuning of causal LLMs on SMolInstruct, scored with the LlaSMol paper's metrics.

Kept import-light on purpose: commands import only the submodules they need.
"""

__version__ = "0.1.0"
