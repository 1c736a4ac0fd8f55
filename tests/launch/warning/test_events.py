"""Events of SCIENCE.md 23.1 on hand-built loss series whose events are known."""

import math

from normlab.launch.warning.events import (
    Event,
    events_text,
    find_events,
    first_divergence,
    first_return,
    smoothed,
)


def rows(losses, start=1, every=1, **extra):
    return [{"step": start + i * every, "loss": v, **extra} for i, v in enumerate(losses)]


def test_smoothed_is_the_median_of_the_last_eleven():
    series = [float(i % 5) for i in range(30)]
    got = smoothed(series)
    assert got[0] == 0.0 and got[2] == 1.0  # median of (0, 1, 2)
    for i in range(10, 30):
        window = sorted(series[i - 10 : i + 1])
        assert got[i] == window[5]


def test_a_single_spike_is_no_divergence():
    series = [5.0 - 0.01 * i for i in range(300)]
    series[150] = 50.0  # one step: the median of 11 ignores it
    assert first_divergence(range(1, 301), series) is None
    assert find_events(rows(series)) == []


def test_divergence_starts_where_the_excursion_starts_and_must_hold():
    # falls to 3.0 at step 100, then jumps to 4.0 (1 nat above) from step 201 on
    series = [4.0 - i / 100 for i in range(100)] + [3.0] * 100 + [4.0] * 150
    steps = list(range(1, 351))
    # the median of 11 crosses 3.0 + 0.5 once 6 of the 11 values are 4.0: step 206
    assert first_divergence(steps, series) == 206
    # the same excursion lasting 60 steps, then back: not held for 100 steps
    short = [4.0 - i / 100 for i in range(100)] + [3.0] * 100 + [4.0] * 60 + [3.0] * 100
    assert first_divergence(list(range(1, 361)), short) is None
    # ... but one running to the end of a run that stopped early counts
    assert first_divergence(steps[:260], series[:260]) == 206
    # ... and one cut off by the last step of a completed run is censored
    assert first_divergence(steps[:260], series[:260], completed=True) is None
    kinds = [e.kind for e in find_events(rows(series[:260]), total_steps=260)]
    assert kinds == ["return_to_init"]  # back at l_0 = 4.0: E3 needs no hold
    assert Event("divergence", 206) in find_events(rows(series[:260]), total_steps=400)


def test_divergence_counts_steps_not_rows():
    # logged every 10 steps: the excursion holds from step 2000 to 2100 over 11 logged rows
    series = [3.0] * 200 + [4.0] * 20
    got = first_divergence([10 * (i + 1) for i in range(220)], series)
    assert got == 10 * (200 + 6)


def test_return_to_init_needs_a_departure_and_the_end_of_warmup():
    l0 = math.log(256)
    flat = [l0] * 50  # never left l_0: no return, even after warm-up
    assert first_return(range(1, 51), flat, l0, 0) is None
    series = [l0 - 1.0] * 50 + [l0] * 50  # left, then back from row 51 (the median at 56)
    assert first_return(range(1, 101), series, l0, 10) == 56
    assert first_return(range(1, 101), series, l0, 80) == 81  # not during warm-up


def test_nonfinite_loss_grad_or_activation():
    base = rows([3.0] * 20, grad_norm=1.0)
    base[7]["grad_norm"] = math.inf
    assert find_events(base)[0] == Event("nonfinite", 8)
    assert find_events(base, fp16=True) == []  # an fp16 scaler skip is no event
    base[7]["grad_norm"] = 1.0
    base[12]["resid_rms/01"] = "nan"  # metrics.jsonl writes NaN as a string
    assert find_events(base) == [Event("nonfinite", 13)]


def test_a_run_that_blows_up_has_all_three_in_order():
    l0 = 5.5
    series = [l0 - 2.0 * i / 100 for i in range(100)] + [l0] * 30 + [math.nan]
    got = find_events(rows(series), warmup_steps=10, init_loss=l0)
    kinds = [(e.kind, e.step) for e in got]
    # smoothed loss passes 3.5 + 0.5 and l0 - 0.1 at the 6th row of l0 (step 106)
    assert kinds == [("divergence", 106), ("return_to_init", 106), ("nonfinite", 131)]
    assert events_text(got).startswith("E2 divergence@106")
    assert events_text([]) == "none" and events_text(None) == "-"


def test_a_nan_alone_is_e1_not_e2():
    series = [3.0 - i / 1000 for i in range(50)] + [math.nan]
    assert find_events(rows(series)) == [Event("nonfinite", 51)]


def test_study_report_counts_seeds_per_event_kind():
    from normlab.launch.study.report import event_cell

    group = [{"event_kinds": ["divergence", "nonfinite"]}, {"event_kinds": ["divergence"]}, {}]
    assert event_cell(group) == "E1 1/3, E2 2/3"
    assert event_cell([{"event_kinds": []}]) == "none"
