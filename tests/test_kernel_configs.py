"""The recorded Triton autotuning choices (models/attention/ops/kernel_configs.py): recorded from a process's
autotuners, matched to a new key (its own, else the nearest compatible), pinned so the autotuner times nothing, and
given up for a key no recorded choice fits. On the CPU with Triton's own Autotuner and Config classes."""
import json

import pytest

triton = pytest.importorskip("triton")
from triton.runtime.autotuner import Autotuner  # noqa: E402

from golinear.models.attention.ops import kernel_configs  # noqa: E402


class Tensor:
    def __init__(self, dtype):
        self.dtype = dtype


def fake_tuner(calls):
    """An Autotuner over a stand-in kernel whose run records the config it was launched with."""

    def fake_kernel():
        pass

    fake_kernel.__module__ = "fla.ops.fake"

    class Kernel:
        fn = staticmethod(fake_kernel)  # Triton's Autotuner follows .fn down to the Python function (its base_fn)
        arg_names = ["x", "T", "K", "FLAG"]

        def run(self, *args, **kwargs):
            calls.append({k: kwargs[k] for k in ("BK",) if k in kwargs})

    configs = [triton.Config({"BK": bk}, num_warps=w) for bk in (32, 64) for w in (2, 4)]
    tuner = Autotuner(Kernel(), Kernel.arg_names, configs, key=["T", "K", "FLAG"], reset_to_zero=None,
                      restore_value=None)
    tuner._bench = lambda *a, config, **k: [float(config.kwargs["BK"] == 64) + config.num_warps / 10] * 3
    tuner.cache_results = False  # no on-disk timings (TRITON_CACHE_AUTOTUNING): a stand-in kernel has no cache key
    return tuner


def test_nearest_prefers_the_own_key_then_the_closest_numbers():
    entries = [{"key": [4096, 64, True, "torch.bfloat16"], "config": {"kwargs": {"BK": 64}}},
               {"key": [128, 64, True, "torch.bfloat16"], "config": {"kwargs": {"BK": 32}}},
               {"key": [3000, 64, False, "torch.bfloat16"], "config": {"kwargs": {"BK": 16}}}]
    assert kernel_configs.nearest(entries, (4096, 64, True, "torch.bfloat16"))["kwargs"] == {"BK": 64}
    assert kernel_configs.nearest(entries, (3000, 64, True, "torch.bfloat16"))["kwargs"] == {"BK": 64}
    assert kernel_configs.nearest(entries, (200, 64, True, "torch.bfloat16"))["kwargs"] == {"BK": 32}
    assert kernel_configs.nearest(entries, (200, 64, False, "torch.bfloat16"))["kwargs"] == {"BK": 16}
    # a dtype or flag no entry has: nothing recorded fits, the kernel autotunes
    assert kernel_configs.nearest(entries, (4096, 64, True, "torch.float32")) is None
    assert kernel_configs.nearest(entries, (4096, 64, None, "torch.bfloat16")) is None


def test_tuning_key_is_the_autotuners_own():
    tuner = fake_tuner([])
    key = kernel_configs.tuning_key(tuner, (Tensor("torch.bfloat16"), 300), {"K": 64, "FLAG": True})
    assert key == (300, 64, True, "torch.bfloat16")
    tuner.run(Tensor("torch.bfloat16"), 300, K=64, FLAG=True)  # Triton's run tunes under the same key
    assert list(tuner.cache) == [key]


def test_recorded_choices_pin_a_fresh_autotuner(tmp_path, monkeypatch):
    calls = []
    first = fake_tuner(calls)
    monkeypatch.setattr(kernel_configs, "autotuners", lambda: {"fla.ops.fake:fake_kernel": first})
    first.run(Tensor("torch.bfloat16"), 4096, K=64, FLAG=True)
    assert first.cache[(4096, 64, True, "torch.bfloat16")].kwargs == {"BK": 32}  # the fastest stand-in config
    path = tmp_path / "card.json"
    data = kernel_configs.record(path, "Some Card")
    assert json.loads(path.read_text()) == data
    [entry] = data["kernels"]["fla.ops.fake:fake_kernel"]
    assert entry["key"] == [4096, 64, True, "torch.bfloat16"] and entry["config"]["num_warps"] == 2

    fresh = fake_tuner(calls)
    fresh._bench = lambda *a, **k: pytest.fail("a pinned kernel was timed")
    monkeypatch.setattr(kernel_configs, "autotuners", lambda: {"fla.ops.fake:fake_kernel": fresh})
    assert kernel_configs.pin(path) == 1 and kernel_configs.pin(path) == 0  # pinned once
    calls.clear()
    fresh.run(Tensor("torch.bfloat16"), 1000, K=64, FLAG=True)  # a new length: the recorded choice serves it
    assert calls == [{"BK": 32}] and fresh.cache[(1000, 64, True, "torch.bfloat16")].num_warps == 2

    timed = []
    fresh._bench = lambda *a, config, **k: timed.append(config) or [1.0] * 3
    fresh.run(Tensor("torch.float32"), 1000, K=64, FLAG=True)  # no entry of this dtype: it autotunes
    assert len(timed) == 4


def test_a_recorded_choice_that_does_not_compile_falls_back_to_tuning(tmp_path, monkeypatch):
    calls = []
    tuner = fake_tuner(calls)
    path = tmp_path / "card.json"
    path.write_text(json.dumps({"card": "c", "kernels": {"fla.ops.fake:fake_kernel": [
        {"key": [4096, 64, True, "torch.bfloat16"], "config": {"kwargs": {"BK": 128}, "num_warps": 8}}]}}))
    real_run = tuner.fn.run

    def run(*args, **kwargs):
        if kwargs.get("BK") == 128:
            raise triton.runtime.errors.OutOfResources(1 << 20, 1 << 18, "shared memory")
        return real_run(*args, **kwargs)

    tuner.fn.run = run
    monkeypatch.setattr(kernel_configs, "autotuners", lambda: {"fla.ops.fake:fake_kernel": tuner})
    kernel_configs.pin(path)
    tuner.run(Tensor("torch.bfloat16"), 4096, K=64, FLAG=True)
    assert calls == [{"BK": 32}]  # tuned after the recorded choice failed


def test_off_and_no_cuda_pin_nothing(monkeypatch):
    monkeypatch.setenv("GOLINEAR_KERNEL_CONFIGS", "off")
    assert kernel_configs.card_file() is None and kernel_configs.pin() == 0
    monkeypatch.delenv("GOLINEAR_KERNEL_CONFIGS")
    import torch
    if not torch.cuda.is_available():
        assert kernel_configs.card_file() is None


def test_card_names_are_file_names():
    assert kernel_configs.card_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    assert kernel_configs.card_name("NVIDIA H200") == "NVIDIA_H200"


def test_an_unreadable_file_warns_and_pins_nothing(tmp_path):
    bad = tmp_path / "card.json"
    bad.write_text("{not json")
    with pytest.warns(UserWarning, match="not used"):
        assert kernel_configs.pin(bad) == 0
    with pytest.warns(UserWarning, match="not used"):
        assert kernel_configs.pin(tmp_path / "missing.json") == 0


def test_the_lazy_fla_namespace_is_not_a_kernel():
    """fla_backend.kernels imports FLA on attribute access; a name it lacks is an AttributeError (getattr's
    default applies), so scanning the loaded modules for autotuners passes over it."""
    from golinear.models.attention.ops import fla_backend
    try:
        fla_backend.load_fla()
    except Exception:  # no FLA or no GPU here: the lookup raises the import's error, which the scan also skips
        pass
    else:
        assert getattr(fla_backend.kernels, "fn", None) is None
    assert isinstance(kernel_configs.autotuners(), dict)


def test_a_cells_provenance_names_the_configurations_it_ran_with(tmp_path, monkeypatch):
    """On CUDA a cell records which recorded configurations were pinned (name and content hash), or that none were."""
    from golinear.bench.run.provenance import kernel_configs_used
    monkeypatch.setenv("GOLINEAR_KERNEL_CONFIGS", "off")
    assert kernel_configs_used() == "off"
    path = tmp_path / "Some_Card.json"
    path.write_text('{"card": "Some Card", "kernels": {}}\n')
    monkeypatch.setenv("GOLINEAR_KERNEL_CONFIGS", str(path))
    first = kernel_configs_used()
    assert first.startswith("Some_Card.json sha256:")
    path.write_text('{"card": "Some Card", "kernels": {"k": []}}\n')
    assert kernel_configs_used() != first  # another file content, another hash
    monkeypatch.setenv("GOLINEAR_KERNEL_CONFIGS", str(tmp_path / "missing.json"))
    assert kernel_configs_used() == "none"


def test_the_recording_script_refuses_bad_input_before_running(tmp_path):
    """No `--` before the run's arguments, or no CUDA device: one line and exit 2, nothing written."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    script = root / "scripts" / "gpu" / "kernel_configs.py"
    r = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "x.json")], capture_output=True,
                       text=True, cwd=root)
    assert r.returncode == 2 and "usage" in r.stderr and not (tmp_path / "x.json").exists()
    import torch
    if not torch.cuda.is_available():
        r = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "x.json"), "--", "--suites", "sniah"],
                           capture_output=True, text=True, cwd=root)
        assert r.returncode == 2 and "no CUDA device" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "x.json").exists()


def test_a_card_with_no_recorded_file_is_told_so(monkeypatch):
    import torch
    monkeypatch.delenv("GOLINEAR_KERNEL_CONFIGS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Some Unrecorded Card")
    with pytest.warns(UserWarning, match="no recorded kernel configurations for 'Some Unrecorded Card'"):
        assert kernel_configs.pin() == 0
    assert kernel_configs.card_file() is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert kernel_configs.card_file().name == "NVIDIA_H100_80GB_HBM3.json"  # the shipped file, found by card name
