"""The demo base (llasmol/model/demo_base/): what ships is what scripts/pretrain_demo_base.py makes with its
settings, its corpus holds no molecule of the held-out splits, `model=tiny` loads it, and adapters of the random
tiny model and of the pretrained base are told apart where they load."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_TIMEOUT, QUICK, compose_config
from refusals import refused

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "llasmol" / "model" / "demo_base"


def _script():
    if "pretrain_demo_base" not in sys.modules:  # registered first: its dataclasses look their module up
        spec = importlib.util.spec_from_file_location("pretrain_demo_base", ROOT / "scripts" / "pretrain_demo_base.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["pretrain_demo_base"]


def test_the_shipped_card_holds_the_scripts_settings_and_its_weights_fit_the_package():
    script = _script()
    card = json.loads((SHIPPED / "card.json").read_text())
    assert card["settings"] == json.loads(json.dumps(script.Settings().__dict__))  # every setting, as the script has it
    assert card["architecture"] == script.ARCH == compose_config(["paths.output_dir=/unused"]).model.arch
    weights = SHIPPED / "model.safetensors"
    assert weights.stat().st_size <= 16 * 2**20
    settings, training = card["settings"], card["training"]
    for stage, steps in (("facts", "steps"), ("reading", "reading_steps")):
        done = training[stage]
        assert done["steps"] == settings[steps] == done["loss_curve"][-1][0], stage
        assert done["tokens_seen"] == done["steps"] * settings["batch_size"] * settings["seq_len"], stage
    assert training["facts"]["loss_curve"][-1][1] < training["facts"]["loss_curve"][0][1]
    assert training["reading"]["samples_read"] == 3_300  # the bundled training split, each sample once
    assert card["corpus"]["molecules"] == card["corpus"]["training_split_molecules"] + card["corpus"]["brics_molecules"]
    assert card["corpus"]["molecules"] == card["settings"]["molecules"]
    readme = (SHIPPED / "README.md").read_text()
    assert readme == script.card_text(card) and card["corpus"]["sha256"] in readme


def test_model_tiny_is_the_pretrained_base_and_random_init_its_untrained_architecture():
    import torch
    from safetensors.torch import load_file

    from llasmol.model.base import load_base_model, load_tokenizer

    shipped = load_file(SHIPPED / "model.safetensors")
    cfg = compose_config(["paths.output_dir=/unused"])
    tokenizer = load_tokenizer(cfg.model)
    base = load_base_model(cfg.model, tokenizer)
    state = base.state_dict()
    for name, tensor in shipped.items():
        torch.testing.assert_close(state[name], tensor.to(state[name].dtype), rtol=0, atol=0, msg=name)
    random = load_base_model(compose_config(["paths.output_dir=/unused", "model.random_init=true"]).model, tokenizer)
    assert {k: v.shape for k, v in random.state_dict().items()} == {k: v.shape for k, v in state.items()}
    name = "model.embed_tokens.weight"
    assert not torch.equal(random.state_dict()[name], state[name])


@pytest.mark.slow
def test_the_script_makes_a_base_whose_card_says_how_and_whose_corpus_holds_no_held_out_molecule(tmp_path):
    from rdkit import Chem

    out, corpus = tmp_path / "base", tmp_path / "corpus.jsonl"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "pretrain_demo_base.py"), "--steps", "4",
                           "--molecules", "400", "--tasks", "name_conversion-s2f", "--reading-steps", "2",
                           "--log-every", "2", "--eval-every", "4", "--workers", "1", "--out", str(out),
                           "--corpus-out", str(corpus)], capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert done.returncode == 0, done.stderr[-2000:]
    card = json.loads((out / "card.json").read_text())
    assert card["settings"]["steps"] == 4 and card["settings"]["tasks"] == ["name_conversion-s2f"]
    assert [s for s, _ in card["training"]["facts"]["loss_curve"]] == [2, 4]
    assert [s for s, _ in card["training"]["reading"]["loss_curve"]] == [2]
    assert card["training"]["reading"]["samples_read"] == 300  # the s2f training samples, each once
    assert card["corpus"]["molecules"] == 400 > card["corpus"]["training_split_molecules"]  # BRICS made the rest
    assert card["corpus"]["documents"] == 400 - card["corpus"]["held_out_molecules"]
    documents = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    assert len(documents) == card["corpus"]["documents"]
    import hashlib
    assert hashlib.sha256("\n".join(documents).encode()).hexdigest() == card["corpus"]["sha256"]
    # An independent look: no skeleton of a held-out molecule (any task, dev or test) among the corpus' SMILES.
    script = _script()
    held = set()
    for split in ("dev", "test"):
        smiles, _ = script.split_texts(split)
        held |= {Chem.MolToInchiKey(m)[:14] for m in map(Chem.MolFromSmiles, smiles) if m is not None}
    import re
    found = {Chem.MolToInchiKey(Chem.MolFromSmiles(s))[:14] for d in documents
             for s in re.findall(r"<SMILES> (\S+) </SMILES>", d)}
    assert found and not found & held
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert sum(p.numel() for p in model.parameters()) == card["training"]["parameters"]


@pytest.mark.slow
def test_the_audit_reads_a_corpus_and_fails_on_a_held_out_molecule_in_it(tmp_path):
    from llasmol.audit import exit_status, run_audit

    test_molecule = json.loads((ROOT / "llasmol/data/bundled/raw/test/name_conversion-s2f.jsonl").read_text()
                               .splitlines()[0])["input"]
    clean = tmp_path / "clean.jsonl"
    clean.write_text(json.dumps({"text": "<SMILES> CC(C)(C)OC(=O)N1CCCCC1 </SMILES> : formula C10H19NO2"}) + "\n")
    leaky = tmp_path / "leaky.txt"  # plain text, one document a line; a Kekule spelling is the same molecule
    aromatic = Chem_aromatic(test_molecule)
    leaky.write_text(f"<SMILES> CC(C)(C)OC(=O)N1CCCCC1 </SMILES>\n<SMILES> {aromatic} </SMILES> is written <SMILES> x </SMILES>\n")
    results = {}
    for name, path in (("clean", clean), ("leaky", leaky)):
        cfg = compose_config([f"paths.output_dir={tmp_path / name}", f"corpus={path}"], "audit")
        results[name] = run_audit(cfg)
    assert results["clean"]["corpus"]["passed"] and exit_status(results["clean"]) == 0
    assert results["clean"]["corpus"]["molecules"] == 1 and results["clean"]["corpus"]["shared_molecules"] == 0
    leak = results["leaky"]["corpus"]
    assert not leak["passed"] and exit_status(results["leaky"]) == 1
    assert leak["shared_molecules"] == 1 and leak["examples"][0]["line"] == 2
    assert "(test): C1=C(CC2=NCCN2)CCC2=CC=CC=C12" in leak["examples"][0]["held_out"]  # the split and its spelling
    assert "LEAK corpus" in (tmp_path / "leaky" / "audit.md").read_text()  # the report names it too
    with refused("corpus=", "does not exist"):
        run_audit(compose_config([f"paths.output_dir={tmp_path / 'none'}", f"corpus={tmp_path / 'nope.jsonl'}"],
                                 "audit"))


def Chem_aromatic(smiles: str) -> str:
    from rdkit import Chem

    return Chem.MolToSmiles(Chem.MolFromSmiles(smiles))  # RDKit's aromatic canonical form, not SMolInstruct's


@pytest.mark.slow
def test_an_adapter_of_the_random_tiny_model_and_one_of_the_demo_base_load_only_on_their_own(tmp_path):
    from llasmol.inference.loading import _check_adapter_base
    from llasmol.train import train

    runs = {}
    for name, extra in (("random", ["model.random_init=true"]), ("pretrained", [])):
        out = tmp_path / name
        train(compose_config([f"paths.output_dir={out}", *QUICK, *extra]))
        runs[name] = next((out / "checkpoints").glob("step*.adapter"))
    config = json.loads((runs["pretrained"] / "adapter_config.json").read_text())
    from llasmol.model.lora import demo_weights_digest

    assert config["base_model_name_or_path"] == f"llasmol/demo-base (pretrained, weights sha256 {demo_weights_digest(SHIPPED)})"
    pretrained = compose_config(["paths.output_dir=/unused"]).model
    random = compose_config(["paths.output_dir=/unused", "model.random_init=true"]).model
    _check_adapter_base(runs["pretrained"], pretrained)
    _check_adapter_base(runs["random"], random)
    with refused("trained on the tiny model's random weights", "pass model=tiny model.random_init=true"):
        _check_adapter_base(runs["random"], pretrained)
    with refused("trained on the pretrained demo base", "without model.random_init=true"):
        _check_adapter_base(runs["pretrained"], random)
    other = tmp_path / "other_base"  # the same shapes, other weights: another release's base
    other.mkdir()
    for f in SHIPPED.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    from safetensors.torch import load_file, save_file

    tensors = load_file(other / "model.safetensors")
    tensors["lm_head.weight"] = tensors["lm_head.weight"] * 0.5
    save_file(tensors, other / "model.safetensors", metadata={"format": "pt"})
    moved = compose_config(["paths.output_dir=/unused", f"model.path={other}"]).model
    with refused("weights' sha256 begins", f"model.path={other}"):
        _check_adapter_base(runs["pretrained"], moved)
