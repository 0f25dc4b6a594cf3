"""`model=hf`: a base that is not listed, from a local folder; its LoRA roles read from its module names (#25)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import HANG_TIMEOUT, compose_config
from refusals import error_line, refused, run_cli

from llasmol.model.base import TINY_TOKENIZER_DIR
from llasmol.core.schema import check_config
from llasmol.model.roles import role_map

LLAMA = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
         "down": "down_proj"}
OPT = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj", "gate": None, "up": "fc1", "down": "fc2"}
GPT2 = {"q": "attn.c_attn", "k": "attn.c_attn", "v": "attn.c_attn", "o": "attn.c_proj", "gate": None,
        "up": "mlp.c_fc", "down": "mlp.c_proj"}
# Two blocks of each family, small enough to build, save and train in seconds.
SIZES = {
    "llama": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 1024},
    "opt": {"hidden_size": 32, "ffn_dim": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "word_embed_proj_dim": 32, "max_position_embeddings": 1024},
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 1024},
    "mamba": {"hidden_size": 32, "num_hidden_layers": 2, "state_size": 4},
}


def write_base(folder: Path, model_type: str, weights: bool = True) -> Path:
    """A folder as `hf download` leaves one: config.json, tokenizer files and random weights as safetensors
    (the embedded model's tokenizer); with `weights=False` the config.json alone."""
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(TINY_TOKENIZER_DIR))
    config = AutoConfig.for_model(model_type, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **SIZES[model_type])
    if not weights:
        config.save_pretrained(folder)
        return folder
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _hf(folder: Path, *extra: str) -> list[str]:
    return ["model=hf", f"model.name=someone/{folder.name}", f"model.path={folder}", *extra]


@pytest.mark.parametrize("model_type,expected", [("llama", LLAMA), ("opt", OPT), ("gpt2", GPT2)])
def test_the_role_map_is_read_from_the_folder_and_params_counts_it(tmp_path, model_type, expected, caplog):
    from transformers import AutoConfig, AutoModelForCausalLM

    from llasmol.model.counting import count_trainable

    folder = write_base(tmp_path / f"tiny-{model_type}", model_type, weights=model_type != "gpt2")
    cfg = compose_config(_hf(folder, "lora=full"), "params")
    with caplog.at_level("INFO"):
        assert role_map(cfg.model) == expected
    # The run's log says which module names it took for which role, once.
    said = [r.getMessage() for r in caplog.records if "LoRA roles of" in r.getMessage()]
    assert said == [f"LoRA roles of someone/{folder.name} read from its module names: "
                    + ", ".join(f"{r}={n}" for r, n in expected.items())]
    counts = count_trainable(cfg)
    # What the folder holds, counted the plain way: the base's parameters, and r × (in + out) per adapted layer.
    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    targets = {name for name in expected.values() if name}
    adapted = [m for name, m in base.named_modules()
               if any(name.endswith("." + t) for t in targets) and hasattr(m, "weight")]
    assert len(adapted) == 2 * len(targets)  # each block's
    shape = (lambda m: m.weight.shape[::-1]) if model_type == "gpt2" else (lambda m: m.weight.shape)  # Conv1D: (in, out)
    assert counts["base"] == sum(p.numel() for p in base.parameters())
    assert counts["trainable"] == sum(16 * (shape(m)[0] + shape(m)[1]) for m in adapted)


def test_a_fused_projection_trains_all_its_roles_or_none(tmp_path):
    from llasmol.model.lora import target_modules

    folder = write_base(tmp_path / "tiny-gpt2", "gpt2", weights=False)
    cfg = compose_config(_hf(folder, "lora=attn"), "params")
    assert target_modules(cfg.model, cfg.lora) == ["attn.c_attn", "attn.c_proj"]  # c_attn once for q, k, v
    lite = compose_config(_hf(folder, "lora=lite"), "params")
    with refused("q, k, v", "attn.c_attn", "lora.targets ['q', 'v']", "add k"):
        target_modules(lite.model, lite.lora)


def test_a_given_role_map_wins_and_a_role_it_misnames_is_one_line(tmp_path):
    folder = write_base(tmp_path / "tiny-mamba", "mamba", weights=False)
    cfg = compose_config(_hf(folder, "model.lora_targets={q:mixer.in_proj,o:mixer.out_proj}"), "params")
    assert role_map(cfg.model) == {"q": "mixer.in_proj", "k": None, "v": None, "o": "mixer.out_proj", "gate": None,
                                   "up": None, "down": None}
    bad = compose_config(_hf(folder, "model.lora_targets={query:mixer.in_proj}"), "params")
    with refused("model.lora_targets", "'query'"):
        check_config(bad)  # the schema checks the role names; the library takes checked ones


def _params(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    return run_cli(["llasmol.params", *overrides], tmp_path)


def test_a_base_whose_linear_layers_have_unknown_names_is_one_line_naming_them(tmp_path):
    folder = write_base(tmp_path / "tiny-mamba", "mamba", weights=False)
    proc = _params(tmp_path, *_hf(folder))
    line = error_line(proc, "model.lora_targets", "someone/tiny-mamba",
                      "mixer.in_proj, mixer.x_proj, mixer.dt_proj, mixer.out_proj")
    assert proc.stderr.strip() == line  # nothing else said
    # As the line says: named, it counts.
    named = _params(tmp_path, *_hf(folder, "model.lora_targets={q:mixer.in_proj,o:mixer.x_proj}"), "lora=attn")
    assert named.returncode == 0, named.stderr[-2000:]
    assert json.loads(named.stdout.splitlines()[-1])["trainable"] > 0
    # A name PEFT will not adapt (Mamba's out_proj) is one line too.
    not_adapted = _params(tmp_path, *_hf(folder, "model.lora_targets={q:mixer.out_proj}"), "lora=attn")
    line = error_line(not_adapted, "['mixer.out_proj']", "someone/tiny-mamba", "model.lora_targets")
    assert not_adapted.stderr.strip() == line


def test_a_folder_without_config_json_or_a_missing_path_is_one_line(tmp_path):
    proc = _params(tmp_path, *_hf(tmp_path))
    line = error_line(proc, tmp_path, "config.json", "model.path")
    assert proc.stderr.strip() == line
    proc = _params(tmp_path, "model=hf", "model.name=someone/base")
    line = error_line(proc, "model.path", "model=hf")
    assert proc.stderr.strip() == line


@pytest.mark.slow
def test_a_base_that_is_not_listed_trains_from_its_folder(tmp_path, cfg_factory):
    """The demo job on a tiny Llama-type folder: its adapters on every projection, its folder as their base."""
    from safetensors import safe_open

    from llasmol.train import train

    folder = write_base(tmp_path / "tiny-llama", "llama")
    out = tmp_path / "run"
    result = train(cfg_factory(*_hf(folder), "setup/model=tiny", "model.dtype=float32", f"paths.output_dir={out}",
                               "trainer.max_steps=3", "val_every_n_steps=2", "data.tasks=[forward_synthesis]",
                               "data.max_samples_per_task={validation:2}", "generation.max_new_tokens_limit=4",
                               "trainer.enable_progress_bar=false"))
    assert result["global_step"] == 3
    adapter = out / "checkpoints" / "last.adapter"
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as fh:
        keys = list(fh.keys())
    assert sum(".lora_A." in k or ".lora_B." in k for k in keys) == 2 * 7 * 2  # 2 blocks × 7 projections × (A, B)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(folder)
    assert sorted(config["target_modules"]) == sorted(LLAMA.values())
    # ... and its adapter is evaluated over the same folder.
    from llasmol.evaluate import evaluate

    scored = evaluate(compose_config([*_hf(folder), "setup/model=tiny", "model.dtype=float32", f"ckpt={adapter}",
                                      f"paths.output_dir={tmp_path / 'eval'}", "data.tasks=[forward_synthesis]",
                                      "data.max_samples_per_task={test:2}", "generation.max_new_tokens_limit=4",
                                      "intervals.resamples=0"], "evaluate"))
    assert scored["metrics"]["forward_synthesis"]["num_samples"] == 2


@pytest.fixture
def probe_hub(monkeypatch):
    """`hub_unreachable` asked afresh (it is asked once per process), with no offline flag or proxy set."""
    from llasmol.core import offline

    for name in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)

    def ask(endpoint: str):
        from huggingface_hub import constants

        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        offline.hub_unreachable.cache_clear()
        try:
            return offline.hub_unreachable()
        finally:
            offline.hub_unreachable.cache_clear()

    return ask


@pytest.mark.parametrize("flag, reason", [("1", "HF_HUB_OFFLINE is set"), ("TRUE", "HF_HUB_OFFLINE is set"),
                                          ("0", "127.0.0.1 unreachable: Connection refused")])
def test_the_hub_probe_answers_from_the_offline_flag_or_a_connection(probe_hub, monkeypatch, flag, reason):
    import socket

    with socket.socket() as closed:  # a port nothing listens on: refused at once, on the loopback only
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HF_HUB_OFFLINE", flag)
    assert probe_hub(f"http://127.0.0.1:{port}") == reason


def test_the_hub_probe_finds_a_listening_hub_and_leaves_a_proxy_to_decide(probe_hub, monkeypatch):
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert probe_hub(f"http://127.0.0.1:{server.getsockname()[1]}") is None
    monkeypatch.setenv("https_proxy", "http://proxy.invalid:3128")
    assert probe_hub("http://127.0.0.1:9") is None  # not probed: the proxy may reach what a direct line cannot


def test_the_hub_probe_asks_the_endpoints_port_and_gives_up_after_its_timeout(probe_hub, monkeypatch):
    import socket
    import threading

    from llasmol.core import offline

    asked, hold = [], threading.Event()

    def connect(address, timeout=None):
        asked.append((address, timeout))
        hold.wait(5)  # a name lookup that hangs (it has no timeout of its own)
        raise OSError("no answer")

    monkeypatch.setattr(socket, "create_connection", connect)
    monkeypatch.setattr(offline, "_PROBE_SECONDS", 0.05)
    try:
        assert probe_hub("https://hub.example") == "hub.example did not answer within 0.05 s"
        assert probe_hub("http://hub.example") == "hub.example did not answer within 0.05 s"
        assert asked == [(("hub.example", 443), 0.05), (("hub.example", 80), 0.05)]
    finally:
        hold.set()


def test_the_hub_probe_waits_3_s_for_the_default_endpoint_and_names_the_refusal(probe_hub, monkeypatch):
    """An endpoint without a host or port is huggingface.co's on port 80 (443 for https); a refusal is named by
    its strerror, an error without one by its type."""
    import socket

    asked, errors = [], [OSError(111, "Connection refused"), OSError("no strerror"), OSError(111, "Connection refused")]

    def connect(address, timeout=None):
        asked.append((address, timeout))
        raise errors.pop(0)

    monkeypatch.setattr(socket, "create_connection", connect)
    assert probe_hub("https://hub.example") == "hub.example unreachable: Connection refused"
    assert probe_hub("https://hub.example:8443") == "hub.example unreachable: OSError"
    assert probe_hub("") == "huggingface.co unreachable: Connection refused"
    assert asked == [(("hub.example", 443), 3.0), (("hub.example", 8443), 3.0), (("huggingface.co", 80), 3.0)]
    for flag in ("yes", " On ", "true"):
        monkeypatch.setenv("HF_HUB_OFFLINE", flag)
        assert probe_hub("https://hub.example") == "HF_HUB_OFFLINE is set"
    assert len(asked) == 3  # the flag answers without a connection


def test_the_hub_probe_waits_a_second_past_the_connection_timeout(probe_hub, monkeypatch):
    """A refusal that takes longer than the connection timeout itself (name lookup) is still heard: the probe
    waits the timeout plus one second. The wait asked of the thread is recorded (no race with the clock)."""
    import socket
    import threading

    from llasmol.core import offline

    waits = []

    class Recorded(threading.Thread):
        def join(self, timeout=None):
            waits.append(timeout)
            super().join()  # the refusal is always heard here, however slow the machine

    def refusal(address, timeout=None):
        raise OSError(111, "Connection refused")

    monkeypatch.setattr(socket, "create_connection", refusal)
    monkeypatch.setattr(offline, "threading", SimpleNamespace(Thread=Recorded))  # this module's threads only
    monkeypatch.setattr(offline, "_PROBE_SECONDS", 0.05)
    assert probe_hub("https://hub.example") == "hub.example unreachable: Connection refused"
    assert waits == [pytest.approx(1.05)]


def test_cached_on_disk_reads_the_hub_cache_only(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from llasmol.core.offline import cached_on_disk

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    snapshot = tmp_path / "models--someone--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--someone--tiny" / "refs").mkdir()
    (tmp_path / "models--someone--tiny" / "refs" / "main").write_text("abc123")
    assert cached_on_disk("someone/tiny") is True
    assert cached_on_disk("someone/tiny", "tokenizer.json") is False
    assert cached_on_disk("someone/other") is False
    assert cached_on_disk("not a // valid id") is False  # no repository of that name can be cached


def test_architecture_facts_are_read_or_refused_in_one_line(tmp_path, monkeypatch):
    """A bundled name, a folder named by a path (or a bare name that is a folder here), and what is wrong
    with each said in one line."""
    from llasmol.model.base import arch_config, arch_facts

    with refused("model.arch 'no-such-arch'", "codellama-7b", "tiny-mistral", "model=hf"):
        arch_facts("no-such-arch")
    with refused("/nonexistent/base", "config.json", "model.path"):
        arch_facts("/nonexistent/base")
    assert arch_facts("tiny-mistral")["model_type"] == "mistral"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mybase").mkdir()
    (tmp_path / "mybase" / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    assert arch_facts("mybase") == {"model_type": "llama", "hidden_size": 32}
    config = tmp_path / "mybase" / "config.json"
    for text, words in (("{not json", "not valid JSON"), ("[1]", "no model_type"),
                        ('{"model_type": 3}', "no model_type")):
        config.write_text(text)
        with refused(config, words):
            arch_facts(str(tmp_path / "mybase"))
    # A model_type this transformers does not know: its long complaint cut to 200 characters.
    config.write_text(json.dumps({"model_type": "nosuchtype" * 3}))
    with refused(f"{tmp_path / 'mybase'}/config.json", "transformers", "model_type") as seen:
        arch_config(str(tmp_path / "mybase"))
    why = seen.message.split(" (", 1)[1].rsplit("): ", 1)[0]  # transformers' complaint, in parentheses
    assert len(why) == 200, seen.message


def test_a_base_is_loaded_from_its_folder_with_its_own_weights_and_a_pad_token(tmp_path, monkeypatch):
    """model.path: the folder's safetensors as saved; a config without a pad id gets the tokenizer's, and a
    tokenizer without a pad token takes its unk token. A folder without weights or tokenizer is one line."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from llasmol.model.base import load_base_model, load_tokenizer

    folder = write_base(tmp_path / "base", "llama")
    config = AutoConfig.from_pretrained(folder)
    config.pad_token_id = None
    config.save_pretrained(folder)
    tok_json = json.loads((folder / "tokenizer_config.json").read_text())
    tok_json.pop("pad_token", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_json))
    special = folder / "special_tokens_map.json"
    if special.is_file():
        special.write_text(json.dumps({k: v for k, v in json.loads(special.read_text()).items() if k != "pad_token"}))
    given = ["model=hf", f"model.path={folder}", "model.name=someone/base", "model.dtype=float32"]
    with refused("model.tokenizer_legacy='maybe'"):  # the schema's check, before anything is loaded
        check_config(compose_config([*given, "model.tokenizer_legacy=maybe"], "params"))
    cfg = compose_config(given, "params").model
    tok = load_tokenizer(cfg)
    assert tok.pad_token == tok.unk_token == "<unk>"
    model = load_base_model(cfg, tok)
    saved = load_file(str(folder / "model.safetensors"))
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(model.state_dict()[weight], saved[weight])
    assert model.config.pad_token_id == tok.pad_token_id == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg.path = str(empty)
    for load, what in ((lambda: load_base_model(cfg, tok), "base weights"), (lambda: load_tokenizer(cfg),
                                                                             "the tokenizer files")):
        with refused(what, "someone/base", f"model.path={empty}"):
            load()


def test_a_base_cached_while_the_hub_is_out_of_reach_is_read_from_the_cache_alone(monkeypatch):
    from omegaconf import OmegaConf

    from llasmol.core import offline
    from llasmol.model.base import _local_only

    monkeypatch.setattr(offline, "hub_unreachable", lambda: "HF_HUB_OFFLINE is set")
    monkeypatch.setattr(offline, "cached_on_disk", lambda *args, **kwargs: True)
    assert _local_only(OmegaConf.create({"hf_id": "someone/base", "path": None}), "base weights") is True


def test_a_probe_that_never_answers_cannot_keep_the_command_from_exiting(probe_hub, monkeypatch):
    """The probe runs in a daemon thread: a name lookup hung past the timeout is abandoned, and the interpreter
    still exits when the command ends."""
    import socket
    import threading

    from llasmol.core import offline

    probes, hold = [], threading.Event()

    def hang(address, timeout=None):
        probes.append(threading.current_thread())
        hold.wait()  # until the test ends (its finally), however slow the machine
        raise OSError("no answer")

    monkeypatch.setattr(socket, "create_connection", hang)
    monkeypatch.setattr(offline, "_PROBE_SECONDS", 0.01)
    try:
        assert probe_hub("https://hub.example") == "hub.example did not answer within 0.01 s"
        deadline = time.monotonic() + HANG_TIMEOUT  # a loaded machine may start the thread late
        while not probes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(probes) == 1 and probes[0].is_alive() and probes[0].daemon
    finally:
        hold.set()


@pytest.mark.parametrize("key, value, shown", [("intermediate_size", 1 << 41, "2199023255552"),
                                               ("num_hidden_layers", "2", '"2"'), ("hidden_size", -1, "-1"),
                                               ("num_attention_heads", True, "true"), ("vocab_size", 2.5, "2.5"),
                                               # heads that do not split the width (32), or the attention heads (4)
                                               ("num_attention_heads", 5, "5"), ("num_key_value_heads", 3, "3"),
                                               ("num_key_value_heads", 8, "8")])  # more key/value heads than heads
def test_a_config_json_with_a_size_no_base_has_is_one_line_naming_it(tmp_path, key, value, shown):
    """Taken unchecked, 2^41 took 35 s to end in "Storage size calculation overflowed", "2" a traceback."""
    from llasmol.model.counting import count_trainable

    folder = write_base(tmp_path / "odd", "llama", weights=False)
    facts = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**facts, key: value}))
    with refused(folder / "config.json", f"{key}={shown}"):
        count_trainable(compose_config(_hf(folder), "params"))



def test_a_base_that_needs_its_own_code_is_one_line_naming_trust_remote_code(tmp_path):
    """Once called "weights not found" (transformers' refusal to run a base's code, read as files missing)."""
    from llasmol.model.base import load_base_model, load_tokenizer

    folder = write_base(tmp_path / "base", "llama")
    facts = json.loads((folder / "config.json").read_text())
    facts.update(model_type="mycustom", auto_map={"AutoConfig": "configuration_my.MyConfig",
                                                  "AutoModelForCausalLM": "modeling_my.MyModel"})
    (folder / "config.json").write_text(json.dumps(facts))
    cfg = compose_config([*_hf(folder), "model.dtype=float32"], "train").model
    with refused("someone/base needs its own modelling code", "model.trust_remote_code=true"):
        load_base_model(cfg, load_tokenizer(cfg))
