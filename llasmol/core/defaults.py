"""The paper's values that the library's constructors and the benchmarks default to, stated once for Python.

The configs under `conf/` state the same values for the commands (`seed`, `data.max_length`,
`generation.max_prompt_tokens`); `tests/test_data.py` checks that the two agree.
"""

SEED = 13  # the paper's runs' seed: shuffling, subsets, in-context examples

# Tokens: a training sample is cut there (`data.max_length`) and a longer prompt is skipped at evaluation
# (`generation.max_prompt_tokens`), as in the paper (Sec. 5.1: 512 tokens cover 99.7% of the samples).
MAX_LENGTH = 512
