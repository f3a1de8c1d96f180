"""How far each rank lags the others, and which ranks held the others up: the straggler rule of
:mod:`dlprof.analysis.ranks`, on the frames it builds.

    lag_behind_latest_other(arrivals["arrival_ns"], [step, collective, occurrence])
    step_lag(steps["step_ns"], step_key)

A rank is compared with the *other* ranks, never with a median it takes part in: with two ranks
the median is their mean, so one of the two always lagged it by half their difference, and a rank
that arrived last at one collective and first at the next lagged it in both.

- Arrival lag at a collective: the rank's arrival minus the latest arrival of the other ranks.
  It is positive only for the last rank to arrive, and is then how long every other rank waited
  for it alone; negative, how long the rank waited for the last one. A rank alone at a
  collective lags by 0.
- Arrival lag in a step: the time the others waited for the rank alone less the time it waited
  for the latest of them, each the length of a union of intervals (from the runner-up's arrival to
  its own where it came last, from its own arrival to the latest where it did not), so that one
  wait seen twice (``c10d::allreduce_`` and the ``gloo:all_reduce`` under it on another thread)
  counts once. Arrival jitter, last here and first there, cancels out; a rank that held the others
  up at one collective after another adds up. It is positive only for a rank that arrived last
  somewhere.
- Step lag: the rank's step time minus the median of the other ranks' (with two ranks, the other
  rank's). It is positive only for a rank slower than the others' median.
- A rank is a straggler in a step when its arrival lag in the step is positive and more than the
  threshold percentage of the step's median time over ranks. Its step lag decides only in a step
  without collectives: where ranks meet, the rank that waited has the longer step, and its step
  lag would blame it for the one it waited for. So in a step of two ranks at most one is a
  straggler, and a rank faster than the others (a negative lag) never is.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def lag_behind_latest_other(values: pd.Series, keys: list[pd.Series]) -> pd.Series:
    """Each value minus the largest other value of its group: positive only for the largest.

    Exact for epoch nanoseconds (they pass 2**53, where a float loses hundreds of ns): values are
    taken from their group's least first.

    Args:
        values: integer times, one per rank.
        keys: what groups the ranks that meet (step, collective, occurrence).

    Returns:
        Floats aligned with ``values``; 0 where a group holds one value, or where the largest is
        shared (no one waited for one rank alone).
    """
    offsets = (values - values.groupby(keys).transform("min")).astype("float64")
    latest = offsets.groupby(keys).transform("max")
    is_latest = offsets == latest
    latest_count = is_latest.groupby(keys).transform("sum")
    runner_up = offsets.where(~is_latest).groupby(keys).transform("max")
    others_latest = latest.where(~(is_latest & (latest_count == 1)), runner_up)
    return (offsets - others_latest).fillna(0.0).astype("float64")


def held_less_waited(key: pd.Series, rank: pd.Series, arrival_ns: pd.Series, lag_ns: pd.Series) -> pd.Series:
    """Each rank's arrival lag in each step: time held up for it alone less time it waited.

    Args:
        key: the step of each arrival, matched across ranks.
        rank: the rank of each arrival.
        arrival_ns: the arrival times.
        lag_ns: each arrival's :func:`lag_behind_latest_other`.

    Returns:
        Floats indexed by (key, rank), for every (key, rank) that has arrivals.
    """
    lag = lag_ns.round().astype("int64")
    arrival = arrival_ns.astype("int64")
    # Held: from the runner-up's arrival to its own; waited: from its own to the latest.
    frame = pd.DataFrame({"key": key.to_numpy(), "rank": rank.to_numpy(),
                          "sign": np.sign(lag.to_numpy()),
                          "low": np.minimum(arrival - lag, arrival).to_numpy(),
                          "high": np.maximum(arrival - lag, arrival).to_numpy()})
    frame = frame.sort_values(["key", "rank", "sign", "low"], kind="stable")
    groups = [frame["key"], frame["rank"], frame["sign"]]
    # How far the intervals before each reach; integers throughout (epoch ns pass 2**53).
    reach = frame["high"].groupby(groups).cummax().groupby(groups).shift(1, fill_value=np.iinfo(np.int64).min)
    start = np.maximum(frame["low"], reach)
    frame["covered"] = (frame["high"] - start).clip(lower=0) * frame["sign"]
    # Every (key, rank) stays, with 0 where it neither held nor waited.
    return frame.groupby(["key", "rank"])["covered"].sum().astype("float64")


def step_lag(step_ns: pd.Series, key: pd.Series) -> pd.Series:
    """Each rank's step time minus the median of the other ranks' times in the same step.

    Args:
        step_ns: step times, one per (rank, step).
        key: the step each row is, matched across ranks.

    Returns:
        Floats aligned with ``step_ns``; 0 for a step only one rank has.
    """
    lags = pd.Series(0.0, index=step_ns.index)
    for _, group in step_ns.groupby(key, sort=False):
        values = group.to_numpy(dtype=np.float64)
        lags[group.index] = values - _median_of_others(values)
    return lags


def _median_of_others(values: np.ndarray) -> np.ndarray:
    """For each value, the median of the others (the value itself when there are none)."""
    n = len(values)
    if n < 2:
        return values.copy()
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    left_out = np.arange(n)  # the sorted position each row leaves out

    def at(position: int) -> np.ndarray:
        """The value at ``position`` among the n - 1 others, for every row left out."""
        return ordered[np.where(position < left_out, position, position + 1)]

    others = n - 1
    medians = (at((others - 1) // 2) + at(others // 2)) / 2.0
    result = np.empty(n, dtype=np.float64)
    result[order] = medians
    return result


def held_others_up(step_lag_ns: pd.Series, arrival_lag_ns: pd.Series, scale_ns: pd.Series,
                   threshold_pct: float) -> pd.Series:
    """Which (rank, step) rows are stragglers: the arrival lag, else the step lag, is positive
    and over ``threshold_pct`` percent of ``scale_ns``.

    Args:
        step_lag_ns: step lags (:func:`step_lag`).
        arrival_lag_ns: arrival lags summed over the step's collectives; missing where the step
            has none, where the step lag decides.
        scale_ns: what the percentages are of (the step's median time over ranks).
        threshold_pct: the percentage a lag must exceed.

    Returns:
        Booleans; false where the scale is missing or not positive.
    """
    lag = arrival_lag_ns.astype("float64").fillna(step_lag_ns.astype("float64"))
    return ((lag > 0) & (100.0 * lag > threshold_pct * scale_ns.where(scale_ns > 0))).fillna(False).astype(bool)


def match_key(frame: pd.DataFrame) -> pd.Series:
    """What a step is matched across ranks by: its number, else its name."""
    return frame["step_number"].astype("string").fillna(frame["step"].astype("string"))


def lag_table(steps: pd.DataFrame, arrivals: pd.DataFrame, threshold_pct: float) -> pd.DataFrame:
    """Each rank's lags in each step, and whether it was a straggler there.

    Args:
        steps: one row per (rank, step): ``rank, step, step_number, step_ns`` at least.
        arrivals: one row per arrival: ``step, step_number, collective, occurrence, rank,
            arrival_ns`` and ``lag_ns`` (:func:`lag_behind_latest_other`).
        threshold_pct: as for :func:`held_others_up`.

    Returns:
        ``steps`` with ``median_step_ns, step_lag_ns, step_lag_pct, arrival_lag_ns,
        arrival_lag_pct, late_collective, late_occurrence, straggler`` added (see
        :func:`dlprof.analysis.ranks.rank_steps`).
    """
    key = match_key(steps)
    median = steps.groupby(key)["step_ns"].transform("median")
    table = steps.assign(median_step_ns=median, step_lag_ns=step_lag(steps["step_ns"], key), key=key)
    arrivals = arrivals.assign(key=match_key(arrivals))
    per_step = arrivals.groupby(["key", "rank"])
    # The collective each rank held the others up at the longest (or came nearest to).
    worst = arrivals.loc[per_step["lag_ns"].idxmax()].rename(columns={
        "collective": "late_collective", "occurrence": "late_occurrence"})
    net = held_less_waited(arrivals["key"], arrivals["rank"], arrivals["arrival_ns"], arrivals["lag_ns"])
    worst = worst.assign(arrival_lag_ns=net.loc[list(zip(worst["key"], worst["rank"], strict=True))].to_numpy())
    columns = ["key", "rank", "arrival_lag_ns", "late_collective", "late_occurrence"]
    table = table.merge(worst[columns], on=["key", "rank"], how="left")
    scale = table["median_step_ns"].where(table["median_step_ns"] > 0)
    table["step_lag_pct"] = (100.0 * table["step_lag_ns"] / scale).astype("float64")
    table["arrival_lag_pct"] = (100.0 * table["arrival_lag_ns"] / scale).astype("float64")
    table["late_occurrence"] = table["late_occurrence"].astype("Int64")
    table["straggler"] = held_others_up(table["step_lag_ns"], table["arrival_lag_ns"], table["median_step_ns"],
                                        threshold_pct)
    return table.drop(columns="key")
