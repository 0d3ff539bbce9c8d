"""The promotion gate's decision logic on constructed evidence (no database)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from shadow.gate import (
    EXIT_CODES,
    GATE_METRICS,
    Evidence,
    Thresholds,
    ThresholdsError,
    WindowPair,
    decide,
    explain,
    histogram_text,
    load_thresholds,
    paired_ratio_bootstrap,
)

FAST = Thresholds(bootstrap_resamples=2000)


def make_windows(
    n: int = 60,
    *,
    throughput: float = 1.04,
    tpot: float = 0.96,
    imbalance: float = 0.5,
    noise: float = 0.01,
    aa_noise: float = 0.005,
    aa_bias: float = 0.0,
    fidelity: float = 1.0,
    fidelity_noise: float = 0.02,
    aa: bool = True,
    seed: int = 0,
) -> tuple[WindowPair, ...]:
    """N windows whose candidate/incumbent ratios are the given ones, with seeded noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        inc = {
            "throughput_tok_s": 10_000.0 * (1 + 0.1 * rng.standard_normal()),
            "tpot_p95_ms": 60.0 * (1 + 0.1 * rng.standard_normal()),
            "imbalance_mean": 50_000.0 * (1 + 0.1 * rng.standard_normal()),
            "gap_mean": 1e5,
            "step_ms_mean": 60.0,
            "steps": 500.0,
        }
        ratios = {"throughput_tok_s": throughput, "tpot_p95_ms": tpot, "imbalance_mean": imbalance}
        cand = dict(inc)
        for key, r in ratios.items():
            cand[key] = inc[key] * r * (1 + noise * rng.standard_normal())
        twin = None
        if aa:
            twin = dict(inc)
            for key in ratios:
                twin[key] = inc[key] * (1 + aa_bias) * (1 + aa_noise * rng.standard_normal())
        out.append(
            WindowPair(
                window_index=i,
                requests=200,
                incumbent=inc,
                candidate=cand,
                aa=twin,
                fidelity_imbalance=fidelity * (1 + fidelity_noise * rng.standard_normal()),
                fidelity_step=1 + fidelity_noise * rng.standard_normal(),
            )
        )
    return tuple(out)


def make_evidence(windows: tuple[WindowPair, ...] | None = None, **overrides) -> Evidence:
    base = dict(
        fleet="default",
        candidate="brh-survival",
        baseline="jsq",
        since=None,
        until=None,
        windows=make_windows() if windows is None else windows,
        decisions=5000,
        critical_violations=0,
        candidate_errors=0,
        decision_latency_p99_ms=1.2,
        step_ms_mean=60.0,
        calibration_auc=0.82,
        evidence_ids={"windows": [0, 1, 2], "database": "x.duckdb"},
        disagreements=({"request_id": "r1", "snapshot": {"loads": [1, 2]}},),
    )
    base.update(overrides)
    return Evidence(**base)


def dumped(evidence: Evidence, thresholds: Thresholds = FAST) -> str:
    return json.dumps(decide(evidence, thresholds).as_json("0.1.0"), sort_keys=True)


# --- verdicts ---------------------------------------------------------------------------


def test_pass_on_a_clear_improvement():
    report = decide(make_evidence(), FAST)
    assert report.verdict == "PASS" and report.exit_code == 0
    assert [r.metric for r in report.rows] == list(GATE_METRICS)
    assert report.deciding_rule.startswith("PASS: throughput ratio 1.0")
    assert "all guards in bounds." in report.deciding_rule
    thr = report.row("throughput_ratio")
    assert thr.label == "pass" and thr.ci_low >= 0.99 and thr.n == 60
    assert 1.03 < thr.ratio < 1.05
    assert report.row("imbalance_ratio").label == "shown"
    assert report.row("noise_floor").label == "within margins"
    assert report.row("replay_fidelity").label == "pass"


def test_default_thresholds_pass_too():
    assert decide(make_evidence(), Thresholds()).verdict == "PASS"


def test_fail_on_one_critical_violation_despite_great_throughput():
    report = decide(make_evidence(make_windows(throughput=1.5), critical_violations=1), FAST)
    assert report.verdict == "FAIL" and report.exit_code == 1
    assert report.deciding_rule == (
        "FAIL: HARD rule critical_violations: 1 critical invariant violation (allowed 0)."
    )
    assert report.row("throughput_ratio").label == "pass"


def test_fail_when_tpot_p95_is_clearly_worse():
    report = decide(make_evidence(make_windows(tpot=1.2)), FAST)
    assert report.verdict == "FAIL"
    assert report.deciding_rule.startswith("FAIL: PRIMARY rule tpot_p95_ratio: TPOT P95 ratio 1.")
    assert "entirely above 1.05" in report.deciding_rule
    row = report.row("tpot_p95_ratio")
    assert row.label == "fail" and row.ci_low > 1.05


def test_fail_on_decision_latency_against_the_step_time():
    report = decide(make_evidence(decision_latency_p99_ms=4.0, step_ms_mean=30.0), FAST)
    assert report.verdict == "FAIL"
    assert "decision_latency_p99_ms" in report.deciding_rule
    assert "0.1 x 30.00 ms step" in report.deciding_rule


def test_unknown_latency_is_missing_evidence_not_a_pass():
    report = decide(make_evidence(decision_latency_p99_ms=None), FAST)
    assert report.verdict == "INCONCLUSIVE"
    assert report.row("decision_latency_p99_ms").label == "missing"
    assert "not measured" in report.deciding_rule


def test_inconclusive_with_ten_windows():
    report = decide(make_evidence(make_windows(10)), FAST)
    assert report.verdict == "INCONCLUSIVE" and report.exit_code == 3
    assert report.deciding_rule.startswith(
        "INCONCLUSIVE: too little evidence: 10 windows (need >= 30)"
    )
    assert report.row("evidence").label == "too little"


def test_inconclusive_when_replay_fidelity_is_off():
    report = decide(make_evidence(make_windows(fidelity=1.3)), FAST)
    assert report.verdict == "INCONCLUSIVE"
    assert report.deciding_rule.startswith("INCONCLUSIVE: GUARD replay_fidelity failed:")
    assert report.row("replay_fidelity").label == "failed"


def test_fidelity_share_rule_ten_percent_of_windows_off_still_passes_but_more_does_not():
    windows = list(make_windows(60, fidelity_noise=0.0))
    off = [dataclasses.replace(w, fidelity_step=1.5) for w in windows[:6]]  # exactly 10%
    report = decide(make_evidence(tuple(off + windows[6:])), FAST)
    assert report.row("replay_fidelity").label == "pass"
    off = [dataclasses.replace(w, fidelity_step=1.5) for w in windows[:7]]
    report = decide(make_evidence(tuple(off + windows[7:])), FAST)
    assert report.row("replay_fidelity").label == "failed"
    assert report.verdict == "INCONCLUSIVE"


def test_fidelity_not_measured_is_inconclusive():
    windows = tuple(
        dataclasses.replace(w, fidelity_imbalance=None, fidelity_step=math.nan)
        for w in make_windows()
    )
    report = decide(make_evidence(windows), FAST)
    assert report.verdict == "INCONCLUSIVE"
    assert report.row("replay_fidelity").label == "missing"


def test_marginal_when_calibration_is_below_its_guard():
    report = decide(make_evidence(calibration_auc=0.6), FAST)
    assert report.verdict == "MARGINAL" and report.exit_code == 4
    assert report.deciding_rule == (
        "MARGINAL: GUARD predictor_calibration out of bounds: AUC 0.600 < 0.7."
    )
    assert report.exit_code_for(allow_marginal=True) == 0


def test_no_predictor_means_the_calibration_guard_does_not_apply():
    report = decide(make_evidence(calibration_auc=None), FAST)
    assert report.verdict == "PASS"
    assert report.row("predictor_calibration").label == "n/a"


def test_marginal_when_the_objective_is_not_shown():
    report = decide(make_evidence(make_windows(imbalance=1.0)), FAST)
    assert report.verdict == "MARGINAL"
    assert report.deciding_rule.startswith("MARGINAL: OBJECTIVE imbalance_ratio not shown")


def test_inconclusive_when_a_primary_interval_straddles_its_margin():
    report = decide(make_evidence(make_windows(throughput=0.99, noise=0.03)), FAST)
    assert report.verdict == "INCONCLUSIVE"
    assert report.row("throughput_ratio").label == "straddles"
    assert "straddles 0.99" in report.deciding_rule


def test_error_with_no_windows():
    report = decide(make_evidence(()), FAST)
    assert report.verdict == "ERROR" and report.exit_code == 5
    assert report.deciding_rule.startswith("ERROR: no windows")
    assert report.exit_code_for(dry_run=True) == 0


def test_error_when_the_candidate_was_never_replayed():
    windows = tuple(dataclasses.replace(w, candidate={}) for w in make_windows())
    report = decide(make_evidence(windows), FAST)
    assert report.verdict == "ERROR"
    assert "candidate brh-survival was never replayed" in report.deciding_rule


def test_error_on_unreadable_values():
    windows = make_windows()
    bad = dataclasses.replace(windows[3], candidate={"throughput_tok_s": "fast"})
    report = decide(make_evidence((*windows[:3], bad, *windows[4:])), FAST)
    assert report.verdict == "ERROR"
    assert "window 3 candidate throughput_tok_s" in report.deciding_rule


def test_an_effect_inside_the_aa_deviation_is_inconclusive():
    """The incumbent moved 5% against itself, more than the candidate's 4% gain: not
    called."""
    report = decide(make_evidence(make_windows(aa_bias=-0.05)), FAST)
    floor = report.bootstrap["noise_floor.throughput"]
    assert floor.ci_low < 0.99
    assert report.row("throughput_ratio").ci_low >= 0.99  # would pass without the floor
    assert report.verdict == "INCONCLUSIVE"
    assert report.deciding_rule.startswith("INCONCLUSIVE: PRIMARY throughput_ratio: ")
    assert "widened by the A/A deviation" in report.deciding_rule
    assert report.row("throughput_ratio").label == "straddles"
    noise = report.row("noise_floor")
    assert noise.label == "wider than margins" and "judged widened" in noise.rule


def test_an_effect_beyond_the_aa_deviation_is_still_called():
    """A floor wider than the margins does not hide a gain (or a loss) larger than it."""
    windows = make_windows(aa_bias=-0.05, throughput=1.15, tpot=0.85)
    report = decide(make_evidence(windows), FAST)
    floor = report.bootstrap["noise_floor.throughput"]
    assert floor.ci_low < 0.99 and report.row("noise_floor").label == "wider than margins"
    assert report.verdict == "PASS", report.deciding_rule
    assert report.row("throughput_ratio").ci_low - abs(floor.point - 1) >= 0.99
    worse = decide(make_evidence(make_windows(aa_bias=-0.05, throughput=0.85)), FAST)
    assert worse.verdict == "FAIL"
    assert worse.deciding_rule.startswith("FAIL: PRIMARY rule throughput_ratio: ")
    assert "widened by the A/A deviation" in worse.deciding_rule


def test_a_loss_inside_the_aa_deviation_is_not_failed():
    """0.98 is below the 0.99 margin, but the incumbent moved 3% against itself."""
    windows = make_windows(aa_bias=0.03, throughput=0.98, noise=0.002)
    report = decide(make_evidence(windows), FAST)
    assert report.row("throughput_ratio").ci_high < 0.99  # would FAIL without the floor
    assert report.verdict == "INCONCLUSIVE"
    assert report.row("throughput_ratio").label == "straddles"
    bare = decide(make_evidence(make_windows(throughput=0.98, noise=0.002)), FAST)
    assert bare.verdict == "FAIL"


def test_a_noisy_but_unbiased_aa_does_not_widen_a_clear_pass():
    """A wide A/A interval centred on 1 is the windows' resampling noise, which the
    candidate's interval already carries: a candidate no worse than the incumbent passes."""
    report = decide(make_evidence(make_windows(aa_noise=0.2, seed=3)), FAST)
    floor = report.bootstrap["noise_floor.throughput"]
    assert floor.ci_low < 0.99 < 1.0 < floor.ci_high  # wide, around 1
    deviation = abs(floor.point - 1)
    thr = report.row("throughput_ratio")
    assert thr.label == "pass" and thr.ci_low - deviation >= 0.99, (thr, floor)


def test_no_aa_replay_is_inconclusive():
    report = decide(make_evidence(make_windows(aa=False)), FAST)
    assert report.verdict == "INCONCLUSIVE"
    assert report.row("noise_floor").label == "missing"


def test_a_dry_run_metric_that_would_fail_does_not_decide():
    evidence = make_evidence(make_windows(tpot=1.2))
    thresholds = dataclasses.replace(FAST, dry_run=frozenset({"tpot_p95_ratio"}))
    report = decide(evidence, thresholds)
    assert report.verdict == "PASS"
    row = report.row("tpot_p95_ratio")
    assert row.dry_run and row.label == "dry run"
    assert row.rule.startswith("dry run (would be fail):")
    assert "TPOT P95 ratio 1." in report.deciding_rule and "dry run" in report.deciding_rule


def test_dry_run_hard_rule_does_not_decide():
    thresholds = dataclasses.replace(FAST, dry_run=frozenset({"critical_violations"}))
    assert decide(make_evidence(critical_violations=3), thresholds).verdict == "PASS"


# --- report -----------------------------------------------------------------------------


def test_same_evidence_gives_the_same_json_bytes():
    first = dumped(make_evidence())
    second = dumped(make_evidence())  # rebuilt from scratch, same seed
    assert first == second
    document = json.loads(first)
    assert document["schema"] == 1
    assert document["verdict"] == "PASS" and document["exit_code"] == 0
    assert document["tool_version"] == "0.1.0"
    assert len(document["config_hash"]) == 64
    assert document["evidence_ids"]["windows"] == [0, 1, 2]
    assert document["disagreements"][0]["request_id"] == "r1"
    assert document["thresholds"]["min_windows"] == 30
    json.dumps(document, allow_nan=False)  # strict JSON


def test_config_hash_follows_the_configuration_not_the_evidence():
    a = decide(make_evidence(), FAST).as_json("x")["config_hash"]
    b = decide(make_evidence(make_windows(seed=5)), FAST).as_json("x")["config_hash"]
    c = decide(make_evidence(), dataclasses.replace(FAST, seed=1)).as_json("x")["config_hash"]
    d = decide(make_evidence(candidate="br0"), FAST).as_json("x")["config_hash"]
    assert a == b and len({a, c, d}) == 3


def test_error_report_serialises():
    document = json.loads(dumped(make_evidence(())))
    assert document["verdict"] == "ERROR" and document["exit_code"] == 5


def test_explain_shows_the_histogram_and_the_rule():
    report = decide(make_evidence(), FAST)
    text = explain(report, "throughput_ratio")
    assert "throughput_ratio (PRIMARY)" in text and "CI low >= 0.99" in text
    assert "#" in text and "2000 resamples" in text
    assert text.count("bootstrap noise_floor") == 0
    noise = explain(report, "noise_floor")
    assert "noise_floor.throughput" in noise and "noise_floor.tpot_p95" in noise
    assert "no bootstrap" in explain(report, "critical_violations")
    with pytest.raises(ValueError, match="throughput_ratio"):
        explain(report, "latency")


def test_exit_codes():
    assert EXIT_CODES == {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 3, "MARGINAL": 4, "ERROR": 5}


# --- thresholds -------------------------------------------------------------------------


def test_thresholds_defaults_follow_gate_md():
    t = Thresholds()
    assert (t.critical_violations_max, t.candidate_errors_max) == (0, 0)
    assert t.decision_latency_p99_ms_max == 5.0
    assert t.throughput_ratio_ci_low_min == 0.99 and t.tpot_p95_ratio_ci_high_max == 1.05
    assert t.imbalance_ratio_ci_high_max == 1.0 and t.fidelity_tolerance == 0.10
    assert t.calibration_auc_min == 0.7 and (t.min_windows, t.min_decisions) == (30, 2000)
    assert (t.bootstrap_resamples, t.confidence, t.seed) == (10_000, 0.95, 0)
    assert t.dry_run == frozenset()


def test_thresholds_toml_round_trip(tmp_path):
    t = Thresholds(
        min_windows=12,
        throughput_ratio_ci_low_min=0.995,
        decision_latency_p99_ms_max=math.inf,
        dry_run=frozenset({"imbalance_ratio", "noise_floor"}),
    )
    path = tmp_path / "gate.toml"
    path.write_text(t.as_toml())
    assert load_thresholds(path) == t
    assert load_thresholds(path).as_toml() == t.as_toml()
    path.write_text(Thresholds().as_toml())
    assert load_thresholds(path) == Thresholds()


def test_thresholds_partial_file_keeps_defaults(tmp_path):
    path = tmp_path / "gate.toml"
    path.write_text('min_windows = 10\nconfidence = 0.9\ndry_run = ["tpot_p95_ratio"]\n')
    t = load_thresholds(path)
    assert t.min_windows == 10 and t.confidence == 0.9 and t.min_decisions == 2000
    assert t.dry_run == frozenset({"tpot_p95_ratio"})
    assert t.as_dict()["dry_run"] == ["tpot_p95_ratio"]


def test_thresholds_integer_for_a_float_is_fine(tmp_path):
    path = tmp_path / "gate.toml"
    path.write_text("decision_latency_p99_ms_max = 3\n")
    value = load_thresholds(path).decision_latency_p99_ms_max
    assert value == 3.0 and isinstance(value, float)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("min_windowz = 10\nfoo = 1\n", "unknown threshold key\\(s\\): foo, min_windowz"),
        ('min_windows = "30"\n', "min_windows must be an integer"),
        ("min_windows = 3.5\n", "min_windows must be an integer"),
        ("confidence = true\n", "confidence must be a number"),
        ("confidence = 1.5\n", "confidence must be in"),
        ('dry_run = "noise_floor"\n', "dry_run must be a list"),
        ('dry_run = ["latency"]\n', "unknown dry_run metric"),
        ("min_windows = \n", "not valid TOML"),
    ],
)
def test_thresholds_errors_are_clear(tmp_path, text, message):
    path = tmp_path / "gate.toml"
    path.write_text(text)
    with pytest.raises(ThresholdsError, match=message):
        load_thresholds(path)


def test_thresholds_missing_file(tmp_path):
    with pytest.raises(ThresholdsError, match="cannot read"):
        load_thresholds(tmp_path / "nope.toml")


# --- statistics -------------------------------------------------------------------------


def test_bootstrap_is_deterministic_and_seeded():
    rng = np.random.default_rng(3)
    inc = rng.uniform(50, 150, 40)
    cand = inc * 1.1 * (1 + 0.05 * rng.standard_normal(40))
    a = paired_ratio_bootstrap(inc, cand, resamples=3000, confidence=0.95, seed=7)
    b = paired_ratio_bootstrap(inc, cand, resamples=3000, confidence=0.95, seed=7)
    c = paired_ratio_bootstrap(inc, cand, resamples=3000, confidence=0.95, seed=8)
    assert np.array_equal(a.samples, b.samples) and (a.ci_low, a.ci_high) == (b.ci_low, b.ci_high)
    assert not np.array_equal(a.samples, c.samples)
    assert a.point == pytest.approx(cand.sum() / inc.sum())
    assert a.ci_low < a.point < a.ci_high and a.samples.shape == (3000,) and a.n == 40


def test_bootstrap_ci_covers_the_true_ratio():
    rng = np.random.default_rng(11)
    true_ratio, trials, covered = 1.07, 200, 0
    for trial in range(trials):
        inc = rng.lognormal(mean=4.0, sigma=0.3, size=40)
        cand = inc * true_ratio * (1 + 0.08 * rng.standard_normal(40))
        b = paired_ratio_bootstrap(inc, cand, resamples=1000, confidence=0.95, seed=trial)
        covered += b.ci_low <= true_ratio <= b.ci_high
    assert 0.88 <= covered / trials <= 0.995


def test_bootstrap_drops_non_finite_windows():
    inc = np.array([10.0, np.nan, 10.0, np.inf, 10.0])
    cand = np.array([11.0, 500.0, 11.0, 11.0, np.nan])
    b = paired_ratio_bootstrap(inc, cand, resamples=500, confidence=0.9, seed=0)
    assert (b.n, b.dropped) == (2, 3)
    assert b.point == pytest.approx(1.1) and b.ci_low == pytest.approx(1.1)


def test_bootstrap_with_no_usable_window_is_nan():
    b = paired_ratio_bootstrap(np.array([np.nan]), np.array([1.0]), resamples=10, seed=0)
    assert math.isnan(b.point) and math.isnan(b.ci_low) and b.samples.size == 0


def test_bootstrap_chunking_handles_many_windows():
    rng = np.random.default_rng(0)
    inc = rng.uniform(1, 2, 5000)
    b = paired_ratio_bootstrap(inc, inc * 0.9, resamples=1000, seed=0)
    assert b.ci_low == pytest.approx(0.9) and b.ci_high == pytest.approx(0.9)


def test_histogram_text():
    samples = np.random.default_rng(0).normal(1.0, 0.01, 1000)
    text = histogram_text(samples, bins=10, width=20)
    lines = text.splitlines()
    assert len(lines) == 10 and lines[0].startswith("[") and lines[-1].split()[-1].isdigit()
    assert sum(int(line.split()[-1]) for line in lines) == 1000
    assert max(line.count("#") for line in lines) == 20
    assert histogram_text(np.array([])) == "(no finite samples)"


def test_imbalance_within_the_aa_floor_is_not_shown():
    """An imbalance gain no larger than what the incumbent's own tie-breaks move is not
    the candidate's: the A/A imbalance interval bounds the OBJECTIVE."""
    windows = make_windows(imbalance=0.995, noise=0.002, aa_noise=0.05)
    report = decide(make_evidence(windows), FAST)
    rows = {r.metric: r for r in report.rows}
    assert rows["imbalance_ratio"].ci_high < 1.0  # below the margin
    assert rows["imbalance_ratio"].label == "not shown"
    assert "A/A noise floor" in rows["imbalance_ratio"].rule
    assert report.verdict != "PASS"
    clear = {r.metric: r for r in decide(make_evidence(make_windows(imbalance=0.5)), FAST).rows}
    assert clear["imbalance_ratio"].label == "shown"
    assert "A/A imbalance ratio" in clear["noise_floor"].rule  # shown beside the others


def test_an_aa_identical_to_the_incumbent_is_said_so():
    windows = tuple(
        dataclasses.replace(w, aa=dict(w.incumbent)) for w in make_windows(aa_noise=0.0)
    )
    rule = {r.metric: r for r in decide(make_evidence(windows), FAST).rows}["noise_floor"].rule
    assert "equals the incumbent in every window" in rule
    other = {r.metric: r for r in decide(make_evidence(), FAST).rows}["noise_floor"].rule
    assert "equals the incumbent" not in other


def test_the_evidence_says_when_its_decisions_are_a_sample():
    from shadow.gate.render import sample_note

    full = make_evidence(decisions=4000, dispatches=4000)
    sampled = make_evidence(decisions=1000, dispatches=4000)
    assert full.audited_share == 1.0 and sample_note(full.audited_share, full.dispatches) == ""
    assert sampled.audited_share == 0.25
    assert sample_note(sampled.audited_share, sampled.dispatches) == ", a 25% sample of 4,000"
    assert make_evidence(dispatches=None).audited_share is None


@pytest.mark.parametrize(("held", "kept"), [(0, 12), (5, 8), (None, 8)])
def test_the_warm_up_is_dropped_only_after_a_start_that_held_requests(held, kept):
    """A continuous run started from a fleet holding requests carries what the incumbent
    placed for a while (its first `warmup_windows` are dropped); one started empty holds
    nothing of it, and a full replay measures its ramp-up: all of its windows count.
    Unknown (rows stored before the count was) is treated as held."""
    from shadow.gate.verdict import after_warmup

    windows = tuple(
        dataclasses.replace(w, run_start=0, run_start_held=held) for w in make_windows(12)
    )
    left = after_warmup(make_evidence(windows), 4).windows
    assert len(left) == kept
    assert [w.window_index for w in left] == list(range(12 - kept, 12))
