"""What the online actions of instruments.early_warning did (SCIENCE.md 23.4, issue 32 item 6).

Runs with the early warning on are set against unprotected runs of the same settings and seed
(their *twins*): until its first alarm a protected run is its twin step for step, so whether the
action "fired before the event" is read against the twin's event step. Per run: the first alarm
(the first logged step whose `early_warning/alarms` count is positive), the actions taken (restores
to a checkpoint, the final learning-rate scale), its own first event (SCIENCE.md 23.1) and its final
smoothed loss (median of the last 11 finite losses). A run is *saved* when its twin had an event and
it has none: it ended finite, never 0.5 nats above its running minimum for 100 steps, never back at
the initial loss. Per setting and action: how many twins had an event, on how many the action
fired first and with what lead, how many runs were saved (Wilson 95 % interval), and on healthy
twins how many alarm episodes fired (each a false alarm). `paired` sets the alarm-driven back-off
against its placebo (the same back-off once at a fixed step) on the same (lr, seed): the runs each
saved, the discordant pairs and the exact one-sided McNemar p; `paired_sentence` says it in words
no stronger than the p. No torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from normlab.launch.metric_keys import EW_ALARMS, EW_LR_SCALE, EW_ROLLBACKS
from normlab.launch.warning.events import events_from_summary, smoothed
from normlab.launch.warning.scoring import wilson
from scipy.stats import binomtest


@dataclass(frozen=True)
class Outcome:
    """One protected run set against its twin."""

    lr: float
    seed: int
    action: str
    first_alarm: int | None
    alarms: int  # episodes
    restores: int  # returns to a checkpoint (rollback, or back-off from a checkpoint)
    lr_scale: float  # the learning-rate factor at the end
    event: tuple[str, int] | None  # its own first event
    twin_event: tuple[str, int] | None  # the unprotected run's first event
    final_loss: float | None  # smoothed, at its last finite step
    twin_final_loss: float | None
    curve: str = ""  # content hash of (lr, seed, its loss curve): equal runs count once
    placebo_step: int = 0  # a placebo's fixed back-off step (0: not a placebo)

    @property
    def fired_first(self) -> bool:
        return (
            self.twin_event is not None
            and self.first_alarm is not None
            and self.first_alarm < self.twin_event[1]
        )

    @property
    def saved(self) -> bool:
        return self.twin_event is not None and self.event is None


def first_event(summary: dict[str, Any]) -> tuple[str, int] | None:
    events = events_from_summary(summary)
    return (events[0].kind, events[0].step) if events else None


def final_loss(rows: Sequence[dict[str, Any]]) -> float | None:
    """The smoothed loss (SCIENCE.md 23.1's median of 11) at the last finite logged loss."""
    losses = [float(r["loss"]) for r in rows if "loss" in r]
    finite = [v for v in smoothed(losses) if math.isfinite(v)]
    return finite[-1] if finite else None


def _last(rows: Sequence[dict[str, Any]], key: str, default: float) -> float:
    vals = [float(r[key]) for r in rows if key in r]
    return vals[-1] if vals else default


def outcome(
    config: dict[str, Any],
    summary: dict[str, Any],
    rows: Sequence[dict[str, Any]],
    twin: tuple[dict[str, Any], Sequence[dict[str, Any]]],
) -> Outcome:
    """One protected run (its resolved config, summary.json, metric rows) and its twin's
    (summary, rows)."""
    ew = (config.get("instruments") or {}).get("early_warning") or {}
    alarmed = [int(r["step"]) for r in rows if float(r.get(EW_ALARMS, 0.0)) > 0]
    return Outcome(
        lr=float(config["optim"]["lr"]),
        seed=int(config["training"]["seed"]),
        action=("placebo_" if ew.get("placebo_step") else "") + str(ew.get("action", "checkpoint")),
        first_alarm=alarmed[0] if alarmed else None,
        alarms=int(_last(rows, EW_ALARMS, 0.0)),
        restores=int(_last(rows, EW_ROLLBACKS, 0.0)),
        lr_scale=_last(rows, EW_LR_SCALE, 1.0),
        event=first_event(summary),
        twin_event=first_event(twin[0]),
        final_loss=final_loss(rows),
        twin_final_loss=final_loss(twin[1]),
        curve=curve_hash(config, rows),
        placebo_step=int(ew.get("placebo_step") or 0),
    )


def curve_hash(config: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """sha256 of the run's lr, seed and logged (step, loss) pairs: a run whose alarm never fired
    trains exactly as under another action, and the two are one run, not two."""
    key: list[Any] = [float(config["optim"]["lr"]), int(config["training"]["seed"])]
    key += [[int(r["step"]), repr(float(r["loss"]))] for r in rows if "loss" in r]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()


def distinct(outcomes: Sequence[Outcome]) -> int:
    """How many distinct runs (by `curve_hash`) the outcomes are."""
    return len({o.curve or id(o) for o in outcomes})


def split_refusal(selection: Sequence[int], evaluation: Sequence[int]) -> str | None:
    """One line when the seeds the signals were chosen on (`selection`) and the seeds the
    actions are evaluated on overlap (SCIENCE.md 23.3, multiplicity and selection); None when
    they are disjoint."""
    both = sorted(set(selection) & set(evaluation))
    if not both:
        return None
    return (
        f"Refused: the action study's seeds {sorted(set(evaluation))} overlap the seeds its "
        f"signals were chosen on {sorted(set(selection))} (both: {both}); its actions are not "
        "evaluated out of sample."
    )


def _median(xs: Sequence[float]) -> str:
    return f"{statistics.median(xs):.3g}" if xs else "-"


def table(outcomes: Sequence[Outcome]) -> str:
    """Markdown, one row per (learning rate, action), then one per action over every rate."""
    head = [
        "lr", "action", "runs (seeds)", "twin events: count, step median",
        "fired before the event (lead median)", "saved [Wilson 95%]",
        "alarm episodes on healthy twins", "restores, final lr scale: median",
        "final smoothed loss: median (twin)",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups: dict[tuple[float, str], list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault((o.lr, o.action), []).append(o)
    for (lr, action), runs in sorted(groups.items()):
        lines.append(_row(f"{lr:g}", action, runs))
    for action in sorted({o.action for o in outcomes}):
        lines.append(_row("all", action, [o for o in outcomes if o.action == action]))
    healthy = [o for o in outcomes if o.twin_event is None]
    if healthy:
        lines += [
            "",
            f"Healthy twins: {len(healthy)} protected runs, {distinct(healthy)} distinct "
            "(counted by a hash of lr, seed and loss curve: where no alarm fired, the actions "
            "train identically).",
        ]
    return "\n".join(lines) + "\n"


def _row(lr: str, action: str, runs: Sequence[Outcome]) -> str:
    runs = sorted(runs, key=lambda o: (o.lr, o.seed))
    ev = [o for o in runs if o.twin_event is not None]
    healthy = [o for o in runs if o.twin_event is None]
    first = [o for o in ev if o.fired_first]
    leads = [o.twin_event[1] - o.first_alarm for o in first]  # type: ignore[index,operator]
    saved = sum(o.saved for o in ev)
    lo, hi = wilson(saved, len(ev))
    seeds = sorted({o.seed for o in runs})
    cells = [
        lr,
        action,
        f"{len(runs)} ({', '.join(map(str, seeds))})",
        f"{len(ev)}, {_median([o.twin_event[1] for o in ev])}" if ev else "0",  # type: ignore[index]
        f"{len(first)}/{len(ev)} ({_median(leads)})" if ev else "-",
        f"{saved}/{len(ev)} [{lo:.2f}, {hi:.2f}]" if ev else "-",
        f"{sum(o.alarms for o in healthy)} in {distinct(healthy)} runs" if healthy else "-",
        f"{_median([o.restores for o in runs])}, {_median([o.lr_scale for o in runs])}",
        f"{_median([o.final_loss for o in runs if o.final_loss is not None])} "
        f"({_median([o.twin_final_loss for o in runs if o.twin_final_loss is not None])})",
    ]
    return "| " + " | ".join(cells) + " |"


@dataclass(frozen=True)
class Paired:
    """The alarm-driven arm against its placebo, paired by (lr, seed) (issue 49 item 4)."""

    pairs: int  # (lr, seed) with both arms whose twin had an event
    saved: int  # by the alarm-driven arm
    placebo_saved: int
    b: int  # saved by the alarm-driven arm, not by the placebo
    c: int  # saved by the placebo, not by the alarm-driven arm
    p: float  # exact one-sided McNemar: P(Binomial(b + c, 1/2) >= b); 1 when b + c = 0
    placebo_late: int  # of `pairs`: the twin's event at or before the placebo's step (not acted)
    healthy_pairs: int  # (lr, seed) with both arms whose twin had no event
    false_alarms: int  # alarm episodes of the alarm-driven arm on those (each a false alarm)
    placebo_false_alarms: int  # the placebo's, counted and not acted on
    healthy_distinct: int  # distinct runs (`distinct`) among both arms' runs on healthy twins
    seeds: int = 0  # distinct seeds among `pairs`
    seed_p: float = 1.0  # exact one-sided sign-flip p over seeds (`seed_sign_flip`)


def mcnemar_greater(b: int, c: int) -> float:
    """Exact one-sided McNemar p that the first arm saves more: P(Binomial(b + c, 1/2) >= b)."""
    return 1.0 if b + c == 0 else float(binomtest(b, b + c, 0.5, alternative="greater").pvalue)


def seed_sign_flip(diffs: Sequence[int]) -> float:
    """Exact one-sided sign-flip p with the seed as the unit: `diffs` holds each seed's (runs saved
    by the back-off only) - (by the placebo only), summed over the rates it ran at. A seed's pairs
    share its init and data order, so they are not independent; under H0 each seed's difference is
    symmetric about 0, and p = share of the 2^n sign assignments whose sum is >= the observed one
    (seeds with difference 0 change no sum). With n seeds the smallest p is 2^-n: 4 seeds cannot
    reach 0.05, 5 can (1/32). Enumerated exactly (2^n sums, n up to 20)."""
    d = [int(x) for x in diffs if x]
    if not d:
        return 1.0
    if len(d) > 20:
        raise ValueError(f"{len(d)} seeds: the exact sign flip enumerates at most 20")
    observed = sum(d)
    hits = 0
    for mask in range(1 << len(d)):
        total = sum(-x if mask >> i & 1 else x for i, x in enumerate(d))
        hits += total >= observed
    return hits / (1 << len(d))


def paired(
    outcomes: Sequence[Outcome], arm: str = "backoff", placebo: str = "placebo_backoff"
) -> Paired:
    """Pair the `arm` and `placebo` outcomes by (lr, seed); an outcome without its partner is
    left out. Raises ValueError on two outcomes of one arm for one (lr, seed), or a pair whose
    twins disagree (they are the same unprotected run)."""
    by: dict[str, dict[tuple[float, int], Outcome]] = {arm: {}, placebo: {}}
    for o in outcomes:
        if o.action in by:
            if (o.lr, o.seed) in by[o.action]:
                raise ValueError(f"two {o.action} runs at lr {o.lr:g}, seed {o.seed}")
            by[o.action][(o.lr, o.seed)] = o
    both = [(by[arm][k], by[placebo][k]) for k in sorted(by[arm].keys() & by[placebo].keys())]
    for a, q in both:
        if a.twin_event != q.twin_event:
            raise ValueError(f"lr {a.lr:g}, seed {a.seed}: the arms' twins disagree")
    ev = [(a, q) for a, q in both if a.twin_event is not None]
    healthy = [(a, q) for a, q in both if a.twin_event is None]
    b = sum(a.saved and not q.saved for a, q in ev)
    c = sum(q.saved and not a.saved for a, q in ev)
    by_seed: dict[int, int] = {}
    for a, q in ev:
        by_seed[a.seed] = by_seed.get(a.seed, 0) + int(a.saved) - int(q.saved)
    return Paired(
        pairs=len(ev),
        saved=sum(a.saved for a, _ in ev),
        placebo_saved=sum(q.saved for _, q in ev),
        b=b,
        c=c,
        p=mcnemar_greater(b, c),
        placebo_late=sum(q.twin_event[1] <= q.placebo_step for _, q in ev),  # type: ignore[index]
        healthy_pairs=len(healthy),
        false_alarms=sum(a.alarms for a, _ in healthy),
        placebo_false_alarms=sum(q.alarms for _, q in healthy),
        healthy_distinct=distinct([o for pair in healthy for o in pair]),
        seeds=len(by_seed),
        seed_p=seed_sign_flip(list(by_seed.values())),
    )


DOSE = (
    "The placebo backs off once, at its fixed step; the alarm-driven arm backs off again each 50 "
    "steps the alarm lasts, so the arms differ in dose as well as in timing: a win reads "
    '"alarm-driven back-offs beat one back-off at a fixed step", not timing alone.'
)


ALPHA = 0.05  # the level of both the pair-level and the seed-level test
SEEDS_NEEDED = math.ceil(math.log2(1 / ALPHA))  # the fewest seeds whose sign flip can reach it: 5


def shown(result: Paired) -> str | None:
    """How far the back-off's win is shown, the one rule the page and the headline state:
    "seeds" (both p < ALPHA), "pairs" (only the pair-level p < ALPHA) or None."""
    if result.p >= ALPHA:
        return None
    return "seeds" if result.seed_p < ALPHA else "pairs"


def verdict(result: Paired) -> str:
    """The claim the pairs support, no stronger (`shown`): over seeds only when both the
    pair-level and the seed-level p are < 0.05; over the (lr, seed) pairs run when only the
    pair-level is."""
    claim = "alarm-driven back-offs saved more runs than one back-off at a fixed step"
    reach = shown(result)
    if reach == "seeds":
        return f"{claim} (p < 0.05 over pairs and over seeds)"
    if reach == "pairs":
        return (
            f"{claim} on these (lr, seed) pairs (p < 0.05), not yet shown over seeds (seed-level "
            f"p {result.seed_p:.3g} over {result.seeds} seeds; {SEEDS_NEEDED} needed at the least)"
        )
    return f"that {claim.replace('saved', 'save')} is not shown at these seeds"


def paired_sentence(result: Paired) -> str:
    """The paired comparison in words (one paragraph)."""
    if not result.pairs:
        text = "No (lr, seed) with both arms had a twin event: nothing to compare."
    else:
        text = (
            f"Paired by (lr, seed) over the {result.pairs} runs whose twin had an event: the "
            f"alarm-driven back-off saved {result.saved}, its placebo {result.placebo_saved}; "
            f"{result.b} saved by the back-off only, {result.c} by the placebo only (exact "
            f"one-sided McNemar p {result.p:.3g}). A seed's pairs share its init and data "
            f"order, so the seed is also taken as the unit: exact one-sided sign-flip p "
            f"{result.seed_p:.3g} over {result.seeds} seeds. Verdict: {verdict(result)}. {DOSE}"
        )
        if result.placebo_late:
            text += (
                f" On {result.placebo_late} of the {result.pairs} pairs the twin's event came at "
                "or before the placebo's fixed step (chosen before these runs), so the placebo "
                "had not acted yet."
            )
    if result.healthy_pairs:
        text += (
            f" On the {result.healthy_pairs} healthy twins (no event) the alarm-driven arm raised "
            f"{result.false_alarms} false alarm episodes (the placebo's detector counted "
            f"{result.placebo_false_alarms}, which it does not act on); their "
            f"{2 * result.healthy_pairs} protected runs are {result.healthy_distinct} distinct."
        )
    return text
