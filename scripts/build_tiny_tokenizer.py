"""Build the tiny model's tokenizer (llasmol/model/tiny_tokenizer/) from the bundled sample data.

    python scripts/build_tiny_tokenizer.py [--data llasmol/data/bundled] [--out llasmol/model/tiny_tokenizer]

A byte-level BPE (any text encodes, nothing is unknown) whose pre-tokenizer first isolates SMILES pieces
that must stay whole: bracket atoms ([nH], [C@@H]), two-letter halogens (Cl, Br), two-digit ring closures
(%10) and single digits, so merges cannot glue an atom to its neighbours or numbers into opaque chunks.
The paper's tags (<SMILES>, </SMILES>, ...) and the [INST] markers are single tokens. Deterministic:
the same data gives the same files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Iterator

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from llasmol.core.tasks import SMOLINSTRUCT

ROOT = Path(__file__).resolve().parents[1]
# One pre-token per match; BPE merges never cross pre-tokens. SMILES pieces come first; letter runs stop
# before Cl/Br so "CCl" is C + Cl (the price: "Clear" is Cl + ear); the rest is GPT-2-like word splitting.
PRETOKENS = (
    r" ?\[[^\]\s]{1,12}\]| ?%\d\d| ?\d| ?(?:Cl|Br)| ?(?:(?!Cl|Br)\p{L})+"
    r"| ?[^\s\p{L}\p{N}\[%]+|\s+(?!\S)|\s+"
)
# Written out because the order fixes the tags' token ids in the committed tokenizer; the tags themselves are the
# answer tags of the task table (and SELFIES), checked here.
TAGS = ["SMILES", "SELFIES", "IUPAC", "MOLFORMULA", "NUMBER", "BOOLEAN"]
assert sorted(TAGS) == sorted(SMOLINSTRUCT.answer_tags()), f"the tokenizer's tags {TAGS} are not {SMOLINSTRUCT.answer_tags()}"
MARKERS = ["[INST]", "[/INST]"] + [f"<{t}>" for t in TAGS] + [f"</{t}>" for t in TAGS]
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]


def corpus(data: Path) -> Iterator[str]:
    """Every template and raw record of the data folder, in a fixed order."""
    for path in sorted(data.glob("template/*/*.json")):
        for tpl in json.loads(path.read_text()):
            yield tpl["input"]
            yield tpl["output"]
    for path in sorted(data.glob("raw/*/*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            for value in (record["input"], record["output"]):
                yield json.dumps(value) if isinstance(value, dict) else value


def build(data: Path, vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENS), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(data), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.add_tokens(MARKERS)
    fast.model_max_length = 1024
    return fast


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "llasmol" / "data" / "bundled")
    parser.add_argument("--out", type=Path, default=ROOT / "llasmol" / "model" / "tiny_tokenizer")
    parser.add_argument("--vocab-size", type=int, default=2048)
    args = parser.parse_args()
    tokenizer = build(args.data, args.vocab_size)
    tokenizer.save_pretrained(str(args.out))
    print(f"wrote {args.out} ({len(tokenizer)} tokens)")


if __name__ == "__main__":
    main()
