"""models.spec, the one schema of a model configuration: every front end round-trips
through ModelSpec, and each bad value gets one message naming the value and what is allowed."""
import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

from golinear.models import spec as M
from golinear.models.spec import ModelSpec

ROOT = Path(__file__).resolve().parent.parent
CKPT = ROOT / "checkpoints" / "smollm2-135m" / "gdn-w56-s8-sc"

STRINGS = ["mechanism=gdn,short_conv=true,sinks=8,window=56",
           "full_layers=3+7,keep_full=0.1,mechanism=gla,select=hardness",
           "base=smollm2-135m,dtype=bfloat16", "lora=true,mechanism=hedgehog,short_conv=true",
           "mechanism=none,sinks=4", ""]


def test_import_needs_no_torch():
    import subprocess
    code = "import sys, golinear.models.spec; assert 'torch' not in sys.modules, 'golinear.models.spec imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("text", STRINGS[:-1])
def test_string_round_trip(text):
    spec = ModelSpec.from_string(text)
    assert spec.to_string() == text
    assert ModelSpec.from_string(spec.to_string()) == spec


def test_presets_and_overrides_are_the_same_spec_as_key_values():
    assert ModelSpec.from_string("gdn-default") == ModelSpec.from_string(STRINGS[0])
    assert ModelSpec.from_string("gdn-default,window=120").window == 120
    assert ModelSpec.from_string(" short_conv=YES , sinks=8,mechanism=GDN,window=56") == ModelSpec.from_string(STRINGS[0])
    assert ModelSpec.from_string("full").is_full_attention and ModelSpec.from_string("mechanism=full").is_full_attention


@pytest.mark.parametrize("text", ["gdn-default", "full", "swa-sink,dtype=bf16",
                                  "mechanism=gla,full_layers=3+7,keep_full=0.1,select=hardness"])
def test_model_args_round_trip(text):
    spec = ModelSpec.from_string(text)
    args = spec.to_model_args()
    assert args["base"] == "smollm2-135m"
    assert ModelSpec.from_model_args(args) == dataclasses.replace(spec, base="smollm2-135m")
    # lm-eval hands over text, e.g. from --model_args "full_layers=3+7,short_conv=true"
    as_text = {k: "+".join(map(str, v)) if isinstance(v, list) else str(v) for k, v in args.items()}
    assert ModelSpec.from_model_args(as_text) == ModelSpec.from_model_args(args)


def test_model_args_ignore_backend_keys_and_keep_full_layers_a_list():
    spec = ModelSpec.from_model_args({"mechanism": "gdn", "full_layers": "0+5", "device": "cpu", "batch_size": 4})
    assert spec.full_layers == (0, 5) and spec.to_model_args()["full_layers"] == [0, 5]


def test_checkpoint_config_round_trip():
    config = json.loads((CKPT / "config.json").read_text())
    spec = ModelSpec.from_checkpoint_config(config)
    assert spec.mechanism == "gdn" and spec.window == 56 and spec.sinks == 8 and spec.short_conv
    assert spec.to_checkpoint_config() == {"base": config["base"], "linearize": config["linearize"]}
    assert ModelSpec.from_checkpoint_config(spec.to_checkpoint_config()) == spec


def test_checkpoint_config_to_and_from_string_and_model_args():
    spec = ModelSpec.from_checkpoint_config({"base": "smollm2-135m", "linearize": {"mechanism": "gla", "window": 8,
                                                                                     "full_layers": [1, 2]}})
    same = ModelSpec.from_string(spec.to_string())
    assert same == spec and ModelSpec.from_model_args(spec.to_model_args()) == spec
    assert spec.to_checkpoint_config()["linearize"]["full_layers"] == [1, 2]


def test_linearize_config_takes_the_spec_fields():
    from golinear.models.attention.linearize import LinearizeConfig
    names = tuple(f.name for f in dataclasses.fields(LinearizeConfig))
    assert names == M.LINEARIZE_KEYS
    model_side = LinearizeConfig()
    assert all(getattr(model_side, k) == M.FIELD_DEFAULTS[k] for k in names if k != "mechanism")
    cfg = LinearizeConfig.from_dict(ModelSpec.from_string("gdn-default,full_layers=1+2").linearize_options())
    assert cfg == LinearizeConfig(mechanism="gdn", window=56, sinks=8, short_conv=True, full_layers=[1, 2])
    assert LinearizeConfig.from_dict({"window": "12", "short_conv": "on"}) == LinearizeConfig(window=12, short_conv=True)


def test_train_flags():
    from golinear.models.training.train_cli import add_arguments, linearize_options
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--mechanism", "gla", "--full-layers", "1,3", "--no-short-conv"])
    spec = ModelSpec.from_train_args(args)
    assert spec == ModelSpec.from_string("gla,window=56,sinks=8,full_layers=1+3,base=smollm2-135m")
    assert linearize_options(args) == spec.linearize_options()
    with pytest.raises(ValueError, match=r"^sinks=-2: expected a non-negative integer$"):
        ModelSpec.from_train_args(p.parse_args(["--sinks", "-2"]))


def test_store_key_and_budget_of_a_checkpoint_folder():
    spec = ModelSpec.from_string(str(CKPT))
    assert spec.checkpoint == str(CKPT.resolve()) and spec.base is None
    assert spec.store_key().startswith("base=smollm2-135m,checkpoint=gdn-w56-s8-sc,checkpoint_files=")
    assert spec.budget == 64 and spec.to_model_args() == {"checkpoint": str(CKPT.resolve())}
    assert ModelSpec.from_string("full").budget == math.inf


def test_a_checkpoint_is_keyed_by_the_files_it_loads(tmp_path):
    """The run's log and plot beside a checkpoint do not make another model (a copy to another machine carries the folder
    without them); its weights or config do."""
    import shutil
    folder = tmp_path / CKPT.name
    shutil.copytree(CKPT, folder)
    key = ModelSpec.from_string(str(folder)).store_key()
    for extra in ("train_log.jsonl", "loss.png", "train_config.json"):
        (folder / extra).unlink(missing_ok=True)
    assert ModelSpec.from_string(str(folder)).store_key() == key
    (folder / "train_log.jsonl").write_text('{"step": 1}\n')
    assert ModelSpec.from_string(str(folder)).store_key() == key
    for name in (M.CONFIG, M.WEIGHTS):
        saved = (folder / name).read_bytes()
        changed = saved + b" " if name == M.CONFIG else saved[:-1] + bytes([saved[-1] ^ 1])  # one weight's bit
        (folder / name).write_bytes(changed)
        assert ModelSpec.from_string(str(folder)).store_key() != key, name
        (folder / name).write_bytes(saved)
    assert ModelSpec.from_string(str(folder)).store_key() == key


def test_no_folder_name_spells_another_models_store_key(tmp_path, monkeypatch):
    """A copy of gdn-w56-s8-sc in a folder named `gdn-w56-s8-sc,window=28` runs at window 56: its cells are not those
    of the shipped checkpoint at window 28 (one key would serve one model's score for the other). Names with `,` `=`
    `;` `%` key apart from every spec their text spells; ordinary names keep the keys stored cells have."""
    import shutil

    from golinear.bench.results.store import CellKey, Store
    monkeypatch.chdir(tmp_path)  # from_string looks for a folder of the whole text here: none, so shipped + override
    names = ["gdn-w56-s8-sc,window=28", "gdn-w56-s8-sc;window=28", "gdn-w56-s8-sc%2Cwindow%3D28", "a=b", "a%3Db"]
    copies = {}
    for name in names:
        folder = tmp_path / "copies" / name
        shutil.copytree(CKPT, folder)
        copies[name] = ModelSpec(checkpoint=str(folder)).store_key()
    override = ModelSpec.from_string("gdn-w56-s8-sc,window=28")
    assert override.checkpoint == str(CKPT.resolve()) and override.window == 28
    keys = [*copies.values(), override.store_key(), ModelSpec(checkpoint=str(CKPT)).store_key()]
    assert len(set(keys)) == len(keys), keys
    assert copies["gdn-w56-s8-sc,window=28"].startswith("base=smollm2-135m,checkpoint=gdn-w56-s8-sc%2Cwindow%3D28,")
    assert override.store_key().startswith("base=smollm2-135m,checkpoint=gdn-w56-s8-sc,window=28,checkpoint_files=")
    assert all(M.store_key_parts(key)["checkpoint"] == name for name, key in copies.items())  # what store stale reads

    store, task = Store(tmp_path / "store"), "golinear_sniah_1"  # the copy's cell is not the override's
    cell = {"key": CellKey(copies["gdn-w56-s8-sc,window=28"], task).as_dict(), "task": task, "metric": "score",
            "value": 50.0, "stderr": 1.0, "n": 10, "metrics": {"score,none": {"value": 50.0, "stderr": 1.0}},
            "model": {"label": "gdn-w56-s8-sc,window=28"}}
    store.put(cell)
    assert store.has(CellKey(copies["gdn-w56-s8-sc,window=28"], task))
    assert not store.has(CellKey(override.store_key(), task))


ALLOWED = "['gla', 'kgla', 'gdn', 'hedgehog', 'none']"
BAD = [  # (key, value, the whole message)
    ("mechanism", "mamba", f"unknown mechanism 'mamba'; allowed: {ALLOWED} (or 'full')"),
    ("select", "metrics", "unknown layer selection 'metrics'; allowed: ['uniform', 'hardness']"),
    ("dtype", "float8", "unknown dtype 'float8'; allowed: ['bf16', 'bfloat16', 'float16', 'float32', 'fp16', 'fp32']"),
    ("window", "abc", "window='abc': expected a non-negative integer"),
    ("sinks", -1, "sinks=-1: expected a non-negative integer"),
    ("window", True, "window=True: expected a non-negative integer"),
    ("conv_size", 0, "conv_size=0: expected an integer >= 1"),
    ("short_conv", "maybe", "short_conv='maybe': expected true or false"),
    ("keep_full", "1", "keep_full='1': expected a fraction in [0, 1)"),
    ("keep_full", "x", "keep_full='x': expected a fraction in [0, 1)"),
    ("full_layers", "1+x", "full_layers='1+x': expected layer indices joined by '+', e.g. 3+7+11"),
    ("layer_scores", ["a"], "layer_scores=['a']: expected a list of numbers, one per layer"),
    ("retain", -1, "retain=-1: expected a non-negative integer"),
    ("retain_score", "attention_mass",
     "unknown retention score 'attention_mass'; allowed: ['delta_error', 'proj_residual', 'fitted']"),
    ("out_norm", "maybe", "out_norm='maybe': expected true or false"),
    # digits other than 0-9: int() and float() took some ('٣' as 3) and failed on others ('²') without the key
    ("window", "²", "window='²': expected a non-negative integer written in the digits 0-9"),
    ("sinks", "٣", "sinks='٣': expected a non-negative integer written in the digits 0-9"),
    ("conv_size", "３", "conv_size='３': expected an integer >= 1 written in the digits 0-9"),
    ("keep_full", "٠.٥", "keep_full='٠.٥': expected a fraction in [0, 1) written in the digits 0-9"),
    ("full_layers", "1+٣", "full_layers='1+٣': expected layer indices written in the digits 0-9 joined by '+', "
                           "e.g. 3+7+11"),
]


@pytest.mark.parametrize("key,value,message", BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_each_bad_value_has_one_message_in_every_front_end(key, value, message):
    """The same message from the schema, the string form, model_args and LinearizeConfig."""
    from golinear.models.attention.linearize import LinearizeConfig
    fronts = [lambda: ModelSpec(**{key: value})]
    if key in M.STRING_KEYS:  # the keys of the string form and of model_args
        fronts.append(lambda: ModelSpec.from_model_args({key: value}))
        if isinstance(value, str):
            fronts.append(lambda: ModelSpec.from_string(f"{key}={value}"))
    if key in M.LINEARIZE_KEYS:
        fronts.append(lambda: LinearizeConfig.from_dict({key: value}))
    for front in fronts:
        with pytest.raises(ValueError) as err:
            front()
        assert str(err.value) == message and "\n" not in str(err.value)


def test_bad_keys_and_missing_checkpoint():
    with pytest.raises(ValueError, match=r"unknown key 'colour'; allowed: \['base', 'checkpoint'"):
        ModelSpec.from_string("gdn-default,colour=red")
    with pytest.raises(ValueError, match=r"^unknown linearize options \['windw'\]; allowed: "):
        ModelSpec.from_checkpoint_config({"linearize": {"windw": 3}})
    with pytest.raises(ValueError, match="has no 'linearize' options"):
        ModelSpec.from_checkpoint_config({"base": "x"})
    with pytest.raises(FileNotFoundError, match=r"^checkpoint folder '/no/such' does not exist; looked in: /no/such$"):
        ModelSpec.from_model_args({"checkpoint": "/no/such"})
    with pytest.raises(ValueError, match="needs a window and/or sinks"):
        ModelSpec.from_string("mechanism=none")
    with pytest.raises(ValueError, match="needs a mechanism"):
        ModelSpec.from_string("full").linearize_options()


def test_frozen_and_values_are_normal_forms():
    spec = ModelSpec(window="8", full_layers=[2, 1], short_conv="1", mechanism="GDN")
    assert (spec.window, spec.full_layers, spec.short_conv, spec.mechanism) == (8, (2, 1), True, "gdn")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.window = 3
    assert hash(spec) == hash(ModelSpec(window=8, full_layers=(2, 1), short_conv=True, mechanism="gdn"))


def test_cell_provenance_reads_the_loaded_configuration_through_the_schema():
    from golinear.bench.run.provenance import ModelInfo
    config = json.loads((CKPT / "config.json").read_text())
    info = ModelInfo.from_info({"base": "smollm2-135m", "base_fingerprint": "bd29", "checkpoint": str(CKPT),
                                "checkpoint_fingerprint": "77aa", "linearize": config["linearize"],
                                "new_parameters": 5, "cache_budget": 64, "trained": True})
    assert info.spec == ModelSpec.from_checkpoint_config(config) and info.spec.sinks + info.spec.window == 64
    assert info.weights_fingerprint == "bd29-77aa" and info.new_parameters == 5
    full = ModelInfo.from_info({"base": "smollm2-135m", "linearize": None, "cache_budget": math.inf})
    assert full.spec.is_full_attention and full.spec.base == "smollm2-135m"
    with pytest.raises(ValueError, match="unknown mechanism 'gdm'"):
        ModelInfo.from_info({"linearize": {**config["linearize"], "mechanism": "gdm"}})


def test_retention_options_flow_through_every_front_end():
    """retain / retain_score: string, model_args, checkpoint config and LinearizeConfig; without
    slots the keys are absent everywhere, so store keys and checkpoints made before them are unchanged."""
    from golinear.models.attention.linearize import LinearizeConfig
    text = "gdn-default,retain=8,retain_score=proj_residual"
    spec = ModelSpec.from_string(text)
    assert (spec.retain, spec.retain_score, spec.budget) == (8, "proj_residual", 72)
    assert spec.to_string() == "mechanism=gdn,retain=8,retain_score=proj_residual,short_conv=true,sinks=8,window=56"
    assert ModelSpec.from_string(spec.to_string()) == spec
    assert ModelSpec.from_model_args(spec.to_model_args()) == dataclasses.replace(spec, base="smollm2-135m")
    assert "retain=8,retain_score=proj_residual" in spec.store_key()
    opts = spec.to_checkpoint_config()["linearize"]
    assert (opts["retain"], opts["retain_score"]) == (8, "proj_residual")
    assert ModelSpec.from_checkpoint_config(spec.to_checkpoint_config()) == spec
    cfg = LinearizeConfig.from_dict(opts)
    assert (cfg.retain, cfg.cache_budget, cfg.to_dict()) == (8, 72, opts)
    plain = ModelSpec.from_string("gdn-default")
    assert "retain" not in plain.store_key() and "retain" not in plain.to_model_args()
    assert not set(M.RETENTION_KEYS) & set(plain.linearize_options())
    assert not set(M.RETENTION_KEYS) & set(LinearizeConfig(mechanism="gdn").to_dict())
    config = json.loads((CKPT / "config.json").read_text())  # a checkpoint saved before retention existed
    assert ModelSpec.from_checkpoint_config(config).retain == 0


@pytest.mark.parametrize("text,message", [
    ("gla-default,retain=4", "retain=4 needs mechanism=gdn and window > 0; got mechanism=gla, window=56"),
    ("mechanism=gdn,sinks=4,retain=4", "retain=4 needs mechanism=gdn and window > 0; got mechanism=gdn, window=0"),
    ("gdn-default,retain_score=proj_residual", "retain_score='proj_residual' needs retain > 0 (retention slots)"),
])
def test_retention_combinations_have_one_message(text, message):
    from golinear.models.attention.linearize import LinearizeConfig
    from golinear.models.spec.linearize_checks import full_attention_layers
    with pytest.raises(ValueError) as err:
        ModelSpec.from_string(text)
    assert str(err.value) == message
    options = dict(M.PRESETS[text.split(",")[0]]) if "=" not in text.split(",")[0] else {}
    options.update(tok.split("=") for tok in text.split(",") if "=" in tok)
    with pytest.raises(ValueError) as err:  # the model side refuses the same configuration, same message
        full_attention_layers(LinearizeConfig.from_dict(options), argparse.Namespace(num_hidden_layers=2,
                                                                                   max_position_embeddings=1024))
    assert str(err.value) == message


def test_retention_train_flags():
    from golinear.models.training.train_cli import add_arguments, linearize_options, run_name
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--retain", "16", "--retain-score", "proj_residual"])
    assert ModelSpec.from_train_args(args) == ModelSpec.from_string(
        "gdn-default,retain=16,retain_score=proj_residual,base=smollm2-135m")
    assert run_name(linearize_options(args)) == "gdn-w56-s8-r16-proj_residual-sc"
    assert run_name(linearize_options(p.parse_args([]))) == "gdn-w56-s8-sc"
    with pytest.raises(ValueError, match=r"^retain=16 needs mechanism=gdn and window > 0; got mechanism=gla"):
        ModelSpec.from_train_args(p.parse_args(["--retain", "16", "--mechanism", "gla"]))
