"""The bundled tiny tokenizer: reproducible from the sample, SMILES-aware, round-trips text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import HANG_TIMEOUT, compose_config
from llasmol.model.base import TINY_TOKENIZER_DIR, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def test_rebuild_is_byte_for_byte_identical(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build_tiny_tokenizer.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True, timeout=HANG_TIMEOUT)
    for committed in sorted(TINY_TOKENIZER_DIR.iterdir()):
        assert (tmp_path / committed.name).read_bytes() == committed.read_bytes(), committed.name


def test_smiles_pieces_stay_whole_and_text_round_trips():
    tok = load_tokenizer(compose_config(["paths.output_dir=/tmp/unused"]).model)
    smiles = "Cl[C@@H](Br)c1ccc%10cc1"
    pieces = tok.convert_ids_to_tokens(tok(smiles, add_special_tokens=False)["input_ids"])
    whole = {"Cl", "Br", "[C@@H]"}
    assert whole <= set(pieces)
    # No piece glues a halogen, bracket atom or ring-closure digit to a neighbouring atom.
    for piece in set(pieces) - whole:
        assert not any(s in piece for s in ("Cl", "Br", "[", "]")), piece
        assert not any(ch.isdigit() for ch in piece) or piece.lstrip("%").isdigit(), piece
    text = "[INST] How soluble is <SMILES> CC(=O)O </SMILES> ? [/INST] It is <NUMBER> -0.17 </NUMBER> log mol/L."
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    for tag in ("<SMILES>", "</SMILES>", "<NUMBER>", "[INST]", "[/INST]"):
        assert tag in tok.convert_ids_to_tokens(ids)
