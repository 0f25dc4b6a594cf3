"""llasmol: LoRA fine-tuning of causal LLMs on SMolInstruct, scored with the LlaSMol paper's metrics.

Kept import-light on purpose: commands import only the submodules they need.
"""

from llasmol.core.quiet import quiet_known_log_lines

__version__ = "0.1.0"

# PEFT imports bitsandbytes, whose CPU backend looks for an optional Hub kernel at every start and says so:
# noise, quieted by its message wherever llasmol is imported (a notebook too), not only in its commands.
quiet_known_log_lines()
