"""Calibration files: schema errors name the file and the dotted key; shipped files load."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from services.config.calibration import (
    list_setups,
    load_calibration,
    load_calibration_file,
    parse_calibration,
)
from services.datacenter.perfmodel import PerfModel
from services.model.errors import ConfigError, InvalidInput

from .conftest import TINY_CAL, tiny_cal_dict

OPTIONAL_TOP = {"setup", "derived", "provenance"}


def leaves(d: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.extend(leaves(v, key + "."))
        else:
            out.append(key)
    return out


REQUIRED = [k for k in leaves(TINY_CAL) if k.split(".")[0] not in OPTIONAL_TOP]
TEXT_KEYS = {"gpu", "model"}


def set_key(d: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        d = d[p]
    d[last] = value


def del_key(d: dict[str, Any], dotted: str) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        d = d[p]
    del d[last]


def write(tmp_path: Path, data: Any, name: str = "cal.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def assert_names(exc: ConfigError, path: Path, key: str) -> None:
    msg = str(exc)
    assert str(path) in msg
    assert exc.path == str(path)
    assert exc.key == key
    if key:
        assert key in msg
    assert isinstance(exc, InvalidInput) and exc.status_code == "INVALID_ARGUMENT"


def test_required_keys_are_the_documented_set() -> None:
    assert len(REQUIRED) == 34  # 3 top-level, 8 engine, 6 prefill, 2 decode, 9 energy, 6 freq
    assert "frequency.levels_mhz" in REQUIRED and "engine.max_model_len" in REQUIRED


def test_valid_file_loads(tmp_path) -> None:
    p = write(tmp_path, tiny_cal_dict())
    cal = load_calibration_file(p)
    assert cal.path == str(p)
    assert cal.engine.kv_capacity_tokens(cal.tp) == 128
    assert cal.decode.alpha_s == tuple(TINY_CAL["decode"]["alpha_s"])
    assert cal.frequency.max_mhz == 2000.0
    assert cal == load_calibration_file(p)


@pytest.mark.parametrize("key", REQUIRED)
def test_missing_key_names_file_and_key(tmp_path, key) -> None:
    d = tiny_cal_dict()
    del_key(d, key)
    p = write(tmp_path, d)
    with pytest.raises(ConfigError) as exc:
        load_calibration_file(p)
    assert_names(exc.value, p, key)


@pytest.mark.parametrize("section", ["engine", "prefill", "decode", "energy", "frequency"])
def test_missing_section_names_the_section(tmp_path, section) -> None:
    d = tiny_cal_dict()
    del d[section]
    p = write(tmp_path, d)
    with pytest.raises(ConfigError) as exc:
        load_calibration_file(p)
    assert exc.value.key.split(".")[0] == section
    assert str(p) in str(exc.value) and section in str(exc.value)


@pytest.mark.parametrize("key", REQUIRED)
def test_wrong_type_names_file_and_key(tmp_path, key) -> None:
    d = tiny_cal_dict()
    set_key(d, key, 42 if key in TEXT_KEYS else "oops")
    p = write(tmp_path, d)
    with pytest.raises(ConfigError) as exc:
        load_calibration_file(p)
    assert_names(exc.value, p, key)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tp", 0),
        ("tp", 65),
        ("tp", True),
        ("tp", 1.5),
        ("engine.max_num_seqs", 0),
        ("engine.max_num_batched_tokens", 8),
        ("engine.gpu_memory_utilization", 1.5),
        ("engine.gpu_memory_utilization", 0.01),
        ("engine.kv_block_tokens", 0),
        ("engine.max_model_len", 1),
        ("engine.weight_bytes", -1),
        ("prefill.b0_s", -0.1),
        ("prefill.b2_s", 0.01),
        ("prefill.tok_slope_s", 2.0),
        ("prefill.knee_tokens", -1.0),
        ("prefill.b1_s", float("nan")),
        ("prefill.b0_s", float("inf")),
        ("prefill.b0_s", True),
        ("decode.alpha_s", [0.1, 0.2]),
        ("decode.beta_s", [0.1, 0.2, float("nan")]),
        ("decode.alpha_s", [0.1, True, 0.2]),
        ("energy.prefill.e0_j", -1.0),
        ("energy.decode.e_k_j", -1e-9),
        ("energy.idle_w_per_gpu", 6000.0),
        ("energy.tdp_w_per_gpu", 0.5),
        ("energy.host_w_per_node", -300.0),
        ("frequency.static_power_fraction", 1.5),
        ("frequency.prefill.compute_fraction", -0.1),
        ("frequency.decode.power_exponent", 5.0),
        ("frequency.levels_mhz", [2000, 500]),
        ("frequency.levels_mhz", [0, 500]),
        ("frequency.levels_mhz", []),
        ("gpu", ""),
    ],
)
def test_out_of_range_value_names_file_and_key(tmp_path, key, value) -> None:
    d = tiny_cal_dict()
    set_key(d, key, value)
    p = write(tmp_path, d)
    with pytest.raises(ConfigError) as exc:
        load_calibration_file(p)
    assert_names(exc.value, p, key)


def test_kv_capacity_below_context_is_rejected(tmp_path) -> None:
    d = tiny_cal_dict()
    d["engine"]["max_model_len"] = 200          # 128 KV tokens cannot hold one request
    p = write(tmp_path, d)
    with pytest.raises(ConfigError) as exc:
        load_calibration_file(p)
    assert str(p) in str(exc.value)
    assert exc.value.key in {"engine.weight_bytes", "engine.max_model_len"}
    assert "max_model_len" in str(exc.value)


def test_provenance_must_be_a_mapping(tmp_path) -> None:
    d = tiny_cal_dict()
    d["provenance"] = ["a", "b"]
    p = write(tmp_path, d)
    with pytest.raises(ConfigError) as exc:
        load_calibration_file(p)
    assert_names(exc.value, p, "provenance")


@pytest.mark.parametrize(
    "text", ["tp: [1, 2\n", "engine: {max_num_seqs: 4\n", "a: b: c\n", "\t- x\n"]
)
def test_invalid_yaml_names_the_file(tmp_path, text) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_calibration_file(p)
    assert str(p) in str(exc.value) and exc.value.path == str(p)


@pytest.mark.parametrize("text", ["", "- 1\n- 2\n", "just text\n", "42\n"])
def test_top_level_not_a_mapping(tmp_path, text) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_calibration_file(p)
    assert exc.value.path == str(p) and str(p) in str(exc.value)


def test_missing_file_names_the_path(tmp_path) -> None:
    p = tmp_path / "nowhere" / "x.yaml"
    with pytest.raises(ConfigError) as exc:
        load_calibration_file(p)
    assert exc.value.path == str(p) and str(p) in str(exc.value)


def test_unknown_setup_lists_known_ones() -> None:
    with pytest.raises(ConfigError) as exc:
        load_calibration("no-such-gpu/no-such-model-tp1")
    msg = str(exc.value)
    assert "no-such-gpu/no-such-model-tp1" in msg
    for s in list_setups():
        assert s in msg


def test_parse_calibration_reports_given_path() -> None:
    d = tiny_cal_dict()
    del d["engine"]["kv_block_tokens"]
    with pytest.raises(ConfigError) as exc:
        parse_calibration(d, "mem://tiny")
    assert exc.value.path == "mem://tiny" and exc.value.key == "engine.kv_block_tokens"


def test_custom_root_lists_and_loads(tmp_path) -> None:
    (tmp_path / "gpu-x").mkdir()
    write(tmp_path / "gpu-x", tiny_cal_dict(), "tiny-model-tp1.yaml")
    assert list_setups(tmp_path) == ["gpu-x/tiny-model-tp1"]
    cal = load_calibration("gpu-x/tiny-model-tp1", root=tmp_path)
    assert cal.model == "tiny-model" and cal.path == str(tmp_path / "gpu-x/tiny-model-tp1.yaml")


def test_custom_root_setup_name_is_path_below_root(tmp_path) -> None:
    (tmp_path / "gpu-x").mkdir()
    write(tmp_path / "gpu-x", tiny_cal_dict(), "tiny-model-tp1.yaml")
    cal = load_calibration("gpu-x/tiny-model-tp1", root=tmp_path)
    assert cal.setup == "gpu-x/tiny-model-tp1"


# ---------------------------------------------------------------------------- shipped files
SHIPPED = list_setups()


def test_at_least_one_setup_is_shipped() -> None:
    assert "a100-40gb/llama-3.1-8b-tp1" in SHIPPED


@pytest.mark.parametrize("setup", SHIPPED)
def test_every_shipped_setup_loads_and_is_sane(setup) -> None:
    cal = load_calibration(setup)
    assert cal.setup == setup
    assert setup == f"{cal.gpu}/{cal.model}-tp{cal.tp}"        # calibration/<gpu>/<model>-tp<N>
    eng = cal.engine
    assert eng.kv_capacity_tokens(cal.tp) >= eng.max_model_len
    assert eng.max_num_batched_tokens >= 16 and eng.max_num_seqs >= 1
    assert list(cal.frequency.levels_mhz) == sorted(cal.frequency.levels_mhz)
    assert cal.frequency.factors(cal.frequency.max_mhz, "prefill") == (1.0, 1.0)
    assert cal.frequency.factors(cal.frequency.max_mhz, "decode") == (1.0, 1.0)
    assert cal.energy.idle_w_per_gpu < cal.energy.tdp_w_per_gpu
    # every step the engine can plan takes positive, finite time and energy
    perf = PerfModel(cal)
    k_max = eng.kv_capacity_tokens(cal.tp)
    for n in np.unique(np.linspace(1, eng.max_num_batched_tokens, 40).astype(int)):
        n = int(n)
        for b in {1, min(eng.max_num_seqs, n)}:
            sq_lo = (n // b) ** 2 * b                      # most even split
            sq_hi = (n - b + 1) ** 2 + (b - 1)             # most uneven split
            for sq in (sq_lo, sq_hi):
                t = perf.prefill_time(n, b, sq)
                assert t > 0 and math.isfinite(t)
                assert perf.prefill_energy(n, sq) > 0
    for b in range(1, eng.max_num_seqs + 1):
        for k in (b, min(b * eng.max_model_len, k_max)):
            t = perf.decode_time(b, k)
            assert t > 0 and math.isfinite(t), (b, k, t)
            assert perf.decode_energy(b, k) > 0
    for lv in cal.frequency.levels_mhz:
        perf.set_frequency(lv)
        assert perf.decode_time(1, 1) > 0 and perf.prefill_time(1, 1, 1) > 0


@pytest.mark.parametrize(("mhz", "level"), [
    (499.0, 500.0), (740.0, 500.0), (760.0, 1000.0), (1750.0, 1500.0), (1751.0, 2000.0),
    (2600.0, 2000.0), (1e300, 2000.0), (1e-300, 500.0),
])
def test_frequency_snaps_to_the_nearest_level_and_clamps_beyond_the_range(mhz, level) -> None:
    # levels 500/1000/1500/2000 MHz (conftest); a tie goes to the lower level, and a value
    # far above the range (where every distance rounds to the same float) to the top one
    cal = parse_calibration(tiny_cal_dict(), "tiny.yaml")
    assert cal.frequency.snap(mhz) == level
