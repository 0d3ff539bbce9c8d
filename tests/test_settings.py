"""Settings: the core's config dataclasses as sections, from TOML, environment and
overrides; the flat names of before still read, with a deprecation warning."""

from __future__ import annotations

import logging
import os

import pytest

from shadow.modes import ModeConfig
from shadow.service.ingest.pipeline import PipelineConfig
from shadow.service.settings import load_settings

DEPRECATED = "deprecated settings names"


@pytest.fixture(autouse=True)
def _no_shadow_env(monkeypatch):
    for name in [n for n in os.environ if n.startswith("SHADOW_")]:
        monkeypatch.delenv(name)


def _toml(tmp_path, text: str):
    path = tmp_path / "service.toml"
    path.write_text(text)
    return path


def _deprecations(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if DEPRECATED in r.getMessage()]


def test_defaults_are_the_dataclasses_own():
    settings = load_settings(None)
    assert settings.pipeline() == PipelineConfig()
    assert settings.mode_config() == ModeConfig()


def test_a_toml_section_sets_a_nested_value(tmp_path, caplog):
    path = _toml(
        tmp_path,
        '[modes]\ntrip_k = 2\n[windows]\nlength_s = 12.5\npolicies = ["jsq", "br0"]\n'
        "[limits]\nmax_fleets = 3\n[balance_route]\nhorizon = 10\n"
        "[ingest]\naudit_enabled = false\n",
    )
    settings = load_settings(path)
    pipeline = settings.pipeline()
    assert settings.mode_config().trip_k == 2
    assert pipeline.windows.length_s == 12.5 and pipeline.windows.policies == ("jsq", "br0")
    assert pipeline.limits.max_fleets == 3 and not pipeline.audit_enabled
    # one [balance_route] for the audit and the windows alike
    assert pipeline.audit.balance_route.horizon == pipeline.windows.balance_route.horizon == 10
    assert not _deprecations(caplog)


def test_an_env_variable_with_double_underscore_sets_a_nested_value(monkeypatch, caplog):
    monkeypatch.setenv("SHADOW_MODES__TRIP_K", "4")
    monkeypatch.setenv("SHADOW_WINDOWS__POLICIES", "jsq,br0")
    monkeypatch.setenv("SHADOW_INVARIANTS__GHOST_TTL_S", "7.5")
    settings = load_settings(None)
    assert settings.modes.trip_k == 4
    assert settings.windows.policies == ("jsq", "br0")
    assert settings.pipeline().invariants.ghost_ttl_s == 7.5
    assert not _deprecations(caplog)


def test_flat_names_in_toml_still_work_and_warn_once(tmp_path, caplog):
    path = _toml(tmp_path, "mode_trip_k = 2\nwindow_s = 5.0\naudit = false\nbr_horizon = 9\n")
    with caplog.at_level(logging.WARNING):
        settings = load_settings(path)
    pipeline = settings.pipeline()
    assert settings.modes.trip_k == 2 and pipeline.windows.length_s == 5.0
    assert not pipeline.audit_enabled and pipeline.audit.balance_route.horizon == 9
    [warning] = _deprecations(caplog)
    assert "mode_trip_k -> [modes] trip_k" in warning
    assert "window_s -> [windows] length_s" in warning
    assert "audit -> [ingest] audit_enabled" in warning


def test_flat_env_names_still_work_and_warn(monkeypatch, caplog):
    monkeypatch.setenv("SHADOW_MODE_TRIP_K", "2")
    monkeypatch.setenv("SHADOW_WINDOWS", "false")
    monkeypatch.setenv("SHADOW_AUDIT_POLICIES", "jsq,br0")
    with caplog.at_level(logging.WARNING):
        settings = load_settings(None)
    assert settings.modes.trip_k == 2 and not settings.ingest.windows_enabled
    assert settings.audit.policies == ("jsq", "br0")
    [warning] = _deprecations(caplog)
    assert "SHADOW_MODE_TRIP_K -> SHADOW_MODES__TRIP_K" in warning
    assert "SHADOW_WINDOWS -> SHADOW_INGEST__WINDOWS_ENABLED" in warning


def test_the_section_spelling_wins_over_a_flat_name_in_the_same_file(tmp_path):
    path = _toml(tmp_path, "window_s = 5.0\n[windows]\nlength_s = 8.0\n")
    assert load_settings(path).windows.length_s == 8.0


def test_file_then_environment_then_overrides(tmp_path, monkeypatch):
    path = _toml(tmp_path, "[modes]\ntrip_k = 2\ntrip_m = 6\n")
    monkeypatch.setenv("SHADOW_MODES__TRIP_K", "3")
    settings = load_settings(path, mode_trip_m=7)
    assert (settings.modes.trip_k, settings.modes.trip_m) == (3, 7)


def test_overrides_and_copies_take_flat_names_quietly(caplog):
    with caplog.at_level(logging.WARNING):
        settings = load_settings(None, windows=False, window_s=10.0, max_fleets=5)
    assert not _deprecations(caplog)
    assert settings.windows.length_s == 10.0 and settings.limits.max_fleets == 5
    copy = settings.model_copy(update={"window_s": 30.0, "demo": True})
    assert copy.pipeline().windows.length_s == 30.0 and copy.demo
    assert settings.windows.length_s == 10.0
    with pytest.raises(ValueError, match="unknown setting 'window_length'"):
        settings.model_copy(update={"window_length": 30.0})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "[limits]\nmax_fleets = 0\n",
            "limits.max_fleets: Input should be greater than or equal to 1",
        ),
        ("max_fleets = 0\n", "limits.max_fleets: Input should be greater than or equal to 1"),
        ("[windows]\nlength_s = 0\n", "windows.length_s: Input should be greater than 0"),
        (
            "[modes]\nlatch_trips = 0\n",
            "modes.latch_trips: Input should be greater than or equal to 1",
        ),
        ("[modes]\ntrip_k = 9\n", "modes: Value error, need 1 <= trip_k <= trip_m, got 9, 5"),
        ("[balance_route]\ngamma = 2\n", "balance_route: Value error, gamma must be in (0, 1]"),
        ("[modes]\ntrip_kk = 1\n", "modes.trip_kk: Extra inputs are not permitted"),
        ("[audit.balance_route]\nhorizon = 1\n", "audit.balance_route: Extra inputs"),
    ],
)
def test_an_out_of_range_value_names_the_field(tmp_path, text, problem):
    with pytest.raises(ValueError, match="invalid settings: ") as error:
        load_settings(_toml(tmp_path, text))
    assert problem in str(error.value)


def test_an_unknown_policy_in_a_section_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown policy nope; choose from random, rr"):
        load_settings(_toml(tmp_path, '[windows]\nincumbent = "nope"\n'))
