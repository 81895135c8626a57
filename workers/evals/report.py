"""Scores, the side-by-side report and the gate of an eval run.

Every item is scored the same way on both sides: the **baseline** is the
recorded call (the dataset's ``output`` and ``status``), the **candidate** what
the eval run's call answered. An item passes when

- its call produced outputs (``succeeded`` or ``partial``) that meet the
  candidate's output contract (``contract``),
- they meet the optional validator schema (``--schema``; ``validator``),
- they agree with the item's gold output (``agreement``): an approved review's
  outputs when there was one, else the recorded output. Each field of the gold
  output is compared by its named comparison (``--compare FIELD=NAME``):
  ``exact`` (the default), ``normalized`` (strings compared case-folded with
  runs of whitespace as one space), ``token_f1`` (the F1 of the two texts'
  word multisets, at least 0.5, or ``token_f1:0.8``) or ``ignore``; an item
  with no gold output is not compared;
- and, with a judge, the judge's answer says it passes (candidate only; a judge
  that failed or answered off its schema is the item's ``judge_error`` and
  leaves the item scored without it).

The pass rate's confidence interval is a percentile bootstrap: ``BOOTSTRAP_N``
(1,000) resamples of the items with replacement, drawn from
``random.Random(BOOTSTRAP_SEED)``, so the same report has the same interval.
The gate (:func:`gate`) compares candidate and baseline on the thresholds given.
"""

from __future__ import annotations

import random
import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiworker.schemas import safe_schema
from aiworker.schemas.evals import EvalItemResult
from aiworker.schemas.names import OK_STATUSES
from aiworker.workers.evals.dataset import DatasetItem

BOOTSTRAP_N = 1000
BOOTSTRAP_SEED = 33
COMPARISONS = ("exact", "normalized", "token_f1", "ignore")
_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class Comparison:
    """How one field is compared: ``name`` of :data:`COMPARISONS`, ``threshold`` for token_f1."""

    name: str = "exact"
    threshold: float = 0.5


def parse_compare(text: str) -> tuple[str, Comparison]:
    """``FIELD=NAME`` (``summary=token_f1:0.6``) as (field, comparison).

    Raises:
        ValueError: not that form, or an unknown comparison.
    """
    fname, sep, spec = text.partition("=")
    name, _, thr = spec.partition(":")
    if not sep or not fname or name not in COMPARISONS:
        raise ValueError(
            f"--compare {text!r}: give FIELD=NAME with NAME one of {', '.join(COMPARISONS)} "
            "(token_f1 may take a threshold: token_f1:0.7)"
        )
    if thr and name != "token_f1":
        raise ValueError(f"--compare {text!r}: only token_f1 takes a threshold")
    threshold = 0.5
    if thr:
        try:
            threshold = float(thr)
        except ValueError:
            raise ValueError(f"--compare {text!r}: {thr!r} is not a number") from None
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"--compare {text!r}: the threshold is between 0 and 1")
    return fname, Comparison(name, threshold)


def _normal(value: Any) -> Any:
    return " ".join(value.casefold().split()) if isinstance(value, str) else value


def token_f1(a: str, b: str) -> float:
    """The F1 of the word multisets of ``a`` and ``b`` (case-folded); 1.0 for two empty texts."""
    wa, wb = Counter(_WORD.findall(a.casefold())), Counter(_WORD.findall(b.casefold()))
    if not wa and not wb:
        return 1.0
    common = sum((wa & wb).values())
    if common == 0:
        return 0.0
    p, r = common / sum(wa.values()), common / sum(wb.values())
    return 2 * p * r / (p + r)


def agrees(cmp: Comparison, gold: Any, value: Any) -> bool:
    """Whether ``value`` agrees with ``gold`` under ``cmp``."""
    if cmp.name == "ignore":
        return True
    if cmp.name == "normalized":
        return bool(_normal(gold) == _normal(value))
    if cmp.name == "token_f1" and isinstance(gold, str) and isinstance(value, str):
        return token_f1(gold, value) >= cmp.threshold
    return bool(gold == value)


@dataclass(frozen=True)
class Scoring:
    """What scores an item: the candidate's output contract, an optional validator
    schema, the comparison of each field (``exact`` for any not named)."""

    output_schema: dict[str, Any] | None = None
    validator_schema: dict[str, Any] | None = None
    compare: Mapping[str, Comparison] = field(default_factory=dict)


@dataclass
class Side:
    """One side of one item, scored."""

    status: str
    error_code: str | None
    output: dict[str, Any] | None
    tokens: int
    cost_usd: float
    latency_ms: float | None
    contract: bool
    validator: bool | None
    fields: dict[str, bool] | None
    judge: dict[str, Any] | None = None
    error_message: str | None = None
    error_field: str | None = None

    @property
    def agreement(self) -> bool | None:
        return None if self.fields is None else all(self.fields.values())

    @property
    def passed(self) -> bool:
        judged = self.judge.get("passed") if self.judge else None
        return (
            self.contract
            and self.validator is not False
            and self.agreement is not False
            and judged is not False
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": self.status,
            "error_code": self.error_code,
            "passed": self.passed,
            "checks": {
                "contract": self.contract,
                "validator": self.validator,
                "agreement": self.agreement,
                "fields": self.fields,
            },
            "output": self.output,
            "tokens": self.tokens,
            "cost_usd": self.cost_usd,
            "latency_ms": self.latency_ms,
        }
        if self.error_message is not None:
            out["error_message"] = self.error_message
        if self.error_field is not None:
            out["error_field"] = self.error_field
        if self.judge is not None:
            out["judge"] = self.judge
            if "error_code" in self.judge:
                out["judge_error"] = self.judge["error_code"]
        return out


def _tokens(usage: Mapping[str, Any]) -> int:
    total = 0
    for k in ("input_tokens", "output_tokens"):
        v = usage.get(k)
        total += v if isinstance(v, int) else 0
    return total


def _checks(
    scoring: Scoring, gold: dict[str, Any] | None, status: str, output: dict[str, Any] | None
) -> tuple[bool, bool | None, dict[str, bool] | None]:
    ok = status in OK_STATUSES and output is not None
    contract = ok and (
        scoring.output_schema is None or safe_schema.is_valid(scoring.output_schema, output)
    )
    validator = None
    if scoring.validator_schema is not None:
        validator = ok and safe_schema.is_valid(scoring.validator_schema, output)
    fields = None
    if gold is not None:
        got = output or {}
        fields = {
            k: ok and k in got and agrees(scoring.compare.get(k, Comparison()), v, got[k])
            for k, v in sorted(gold.items())
        }
    return contract, validator, fields


def score_baseline(item: DatasetItem, scoring: Scoring) -> Side:
    """The recorded call of ``item``, scored (against the candidate's contract)."""
    contract, validator, fields = _checks(scoring, item.gold, item.status, item.output)
    return Side(
        status=item.status,
        error_code=item.error_code,
        output=item.output,
        tokens=_tokens(item.usage),
        cost_usd=item.cost_usd,
        latency_ms=item.duration_ms if item.status in OK_STATUSES else None,
        contract=contract,
        validator=validator,
        fields=fields,
    )


def score_candidate(item: DatasetItem, result: EvalItemResult, scoring: Scoring) -> Side:
    """The eval run's call of ``item``, scored."""
    contract, validator, fields = _checks(scoring, item.gold, result.status, result.outputs)
    usage = result.usage.model_dump(mode="json")
    return Side(
        status=result.status,
        error_code=result.error_code,
        output=result.outputs,
        tokens=_tokens(usage),
        cost_usd=float(result.usage.cost_usd),
        latency_ms=result.duration_ms if result.status in OK_STATUSES else None,
        contract=contract,
        validator=validator,
        fields=fields,
        judge=result.judge,
        error_message=result.error_message,
        error_field=result.error_field,
    )


def bootstrap_ci(
    passes: Sequence[bool], n: int = BOOTSTRAP_N, seed: int = BOOTSTRAP_SEED
) -> list[float]:
    """The 95% percentile bootstrap interval of the pass rate of ``passes``."""
    if not passes:
        return [0.0, 0.0]
    rng = random.Random(seed)
    k = len(passes)
    values = [1 if p else 0 for p in passes]
    rates = sorted(sum(rng.choices(values, k=k)) / k for _ in range(n))
    return [round(rates[int(0.025 * (n - 1))], 4), round(rates[int(0.975 * (n - 1))], 4)]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of ``values``, linear between ranks; None if empty."""
    if not values:
        return None
    if len(values) == 1:
        return round(float(values[0]), 3)
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return round(cuts[int(q) - 1], 3) if 1 <= q <= 99 else round(float(max(values)), 3)


def summary(sides: Sequence[Side]) -> dict[str, Any]:
    """One side's figures (the report's ``baseline`` and ``candidate``)."""
    passes = [s.passed for s in sides]
    latencies = [s.latency_ms for s in sides if s.latency_ms is not None]
    per_field: dict[str, list[bool]] = {}
    for s in sides:
        for k, v in (s.fields or {}).items():
            per_field.setdefault(k, []).append(v)
    n = len(sides)
    cost = sum(s.cost_usd for s in sides)
    return {
        "items": n,
        "passed": sum(passes),
        "pass_rate": round(sum(passes) / n, 4) if n else 0.0,
        "pass_rate_ci": bootstrap_ci(passes),
        "field_agreement": {k: round(sum(v) / len(v), 4) for k, v in sorted(per_field.items())},
        "tokens": sum(s.tokens for s in sides),
        "cost_usd": round(cost, 8),
        "cost_per_item_usd": round(cost / n, 8) if n else 0.0,
        "latency_ms_p50": percentile(latencies, 50),
        "latency_ms_p95": percentile(latencies, 95),
        "error_codes": dict(sorted(Counter(s.error_code for s in sides if s.error_code).items())),
    }


@dataclass(frozen=True)
class Thresholds:
    """The gate: the largest drop in pass rate (absolute, 0.05 = 5 points) and the
    largest rise in cost per item (relative, 0.2 = 20%) the candidate may show."""

    max_pass_drop: float | None = None
    max_cost_rise: float | None = None


def gate(base: Mapping[str, Any], cand: Mapping[str, Any], t: Thresholds) -> dict[str, Any]:
    """``{passed, reasons}``: each threshold the candidate breaks is one reason."""
    reasons: list[str] = []
    if t.max_pass_drop is not None:
        drop = base["pass_rate"] - cand["pass_rate"]
        if drop > t.max_pass_drop + 1e-12:
            reasons.append(
                f"pass rate dropped by {drop:.4f} ({base['pass_rate']:.4f} -> "
                f"{cand['pass_rate']:.4f}), more than --max-pass-drop {t.max_pass_drop:g}"
            )
    if t.max_cost_rise is not None:
        b, c = base["cost_per_item_usd"], cand["cost_per_item_usd"]
        if b > 0 and (c - b) / b > t.max_cost_rise + 1e-12:
            reasons.append(
                f"cost per item rose by {(c - b) / b:.2%} (${b:.6f} -> ${c:.6f}), more than "
                f"--max-cost-rise {t.max_cost_rise:g}"
            )
        elif b == 0 and c > 0:
            reasons.append(
                f"cost per item rose from $0 to ${c:.6f}: no rise is allowed over a free baseline"
            )
    return {"passed": not reasons, "reasons": reasons}


def build_report(
    items: Sequence[DatasetItem],
    results: Sequence[EvalItemResult],
    scoring: Scoring,
    thresholds: Thresholds,
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    """The report JSON: ``baseline``, ``candidate``, ``items``, ``gate`` and ``eval`` (meta)."""
    by_id = {r.id: r for r in results}
    base_sides: list[Side] = []
    cand_sides: list[Side] = []
    rows: list[dict[str, Any]] = []
    for item in items:
        b = score_baseline(item, scoring)
        c = score_candidate(item, by_id[item.id], scoring)
        base_sides.append(b)
        cand_sides.append(c)
        rows.append(
            {
                "id": item.id,
                "input": item.input,
                "gold": item.gold,
                "gold_source": item.gold_source,
                "changed": b.passed != c.passed or b.output != c.output,
                "baseline": b.to_json(),
                "candidate": c.to_json(),
            }
        )
    base, cand = summary(base_sides), summary(cand_sides)
    return {
        "eval": dict(meta),
        "baseline": base,
        "candidate": cand,
        "items": rows,
        "gate": gate(base, cand, thresholds),
    }


def _money(v: float) -> str:
    return f"${v:.6f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f} ms"


def markdown(report: Mapping[str, Any], max_items: int = 20) -> str:
    """The report as Markdown for a pull request comment."""
    b, c, g = report["baseline"], report["candidate"], report["gate"]
    meta = report.get("eval", {})
    lines = [
        f"### Eval of `{meta.get('candidate', 'candidate')}` on "
        f"`{meta.get('dataset', 'dataset')}` ({b['items']} items)",
        "",
        f"**Gate: {'passed' if g['passed'] else 'FAILED'}**",
    ]
    lines += [f"- {r}" for r in g["reasons"]]
    ci = "{:.1%} to {:.1%}"
    lines += [
        "",
        "| | baseline (recorded) | candidate |",
        "| --- | --- | --- |",
        f"| pass rate | {b['pass_rate']:.1%} | {c['pass_rate']:.1%} |",
        f"| 95% CI (bootstrap) | {ci.format(*b['pass_rate_ci'])} | "
        f"{ci.format(*c['pass_rate_ci'])} |",
        f"| tokens | {b['tokens']} | {c['tokens']} |",
        f"| cost | {_money(b['cost_usd'])} | {_money(c['cost_usd'])} |",
        f"| latency p50 | {_ms(b['latency_ms_p50'])} | {_ms(c['latency_ms_p50'])} |",
        f"| latency p95 | {_ms(b['latency_ms_p95'])} | {_ms(c['latency_ms_p95'])} |",
        f"| error codes | {_codes(b['error_codes'])} | {_codes(c['error_codes'])} |",
    ]
    for k in sorted(set(b["field_agreement"]) | set(c["field_agreement"])):
        lines.append(
            f"| agreement `{k}` | {b['field_agreement'].get(k, 0):.1%} | "
            f"{c['field_agreement'].get(k, 0):.1%} |"
        )
    changed = [r for r in report["items"] if r["changed"]]
    if changed:
        lines += ["", f"Changed items ({len(changed)}):", ""]
        lines += ["| item | baseline | candidate |", "| --- | --- | --- |"]
        for r in changed[:max_items]:
            lines.append(
                f"| `{r['id']}` | {_verdict(r['baseline'])} | {_verdict(r['candidate'])} |"
            )
        if len(changed) > max_items:
            lines.append(f"| ... {len(changed) - max_items} more | | |")
    return "\n".join(lines) + "\n"


def _codes(codes: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in codes.items()) or "-"


def _verdict(side: Mapping[str, Any]) -> str:
    if side["passed"]:
        return "pass"
    return f"fail ({side['error_code'] or 'disagrees'})"


__all__ = [
    "BOOTSTRAP_N",
    "BOOTSTRAP_SEED",
    "Comparison",
    "Scoring",
    "Side",
    "Thresholds",
    "agrees",
    "bootstrap_ci",
    "build_report",
    "gate",
    "markdown",
    "parse_compare",
    "percentile",
    "score_baseline",
    "score_candidate",
    "summary",
    "token_f1",
]
