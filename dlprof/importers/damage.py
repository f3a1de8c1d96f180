"""What makes an imported event unusable, named as the manifest's ``dropped`` counts it, for every
importer (Kineto's JSON, TensorFlow's XPlane)."""

from __future__ import annotations

from enum import StrEnum

# The largest time or duration kept, in ns (about the year 2065 as an epoch time): a trace's base,
# an event's start and its duration each this large still add up inside int64.
MAX_TIME_NS = 3 * 10**18


class Damage(StrEnum):
    """Why an event was dropped: the first field found wrong, named as the manifest counts it."""

    NOT_AN_OBJECT = "not_an_object"
    NO_PHASE = "ph_missing_or_not_a_string"
    NAME = "name_missing_or_not_a_string"
    CATEGORY = "cat_not_a_string"
    ARGS = "args_not_an_object"
    TS = "ts_missing_or_not_a_number"
    TS_RANGE = "ts_out_of_range"
    DUR = "dur_missing_or_not_a_number"
    DUR_NEGATIVE = "dur_negative"
    DUR_RANGE = "dur_out_of_range"
    # An event whose JSON could not be read (a string with bare quotes outside Kineto's field
    # per line, a stray byte), dropped alone: found as a piece that does not parse is read event
    # by event (see dlprof.importers.json_repair).
    INVALID_JSON = "invalid_json"
    # An event whose start (or end) lies implausibly far from the other events of its piece of the
    # trace (a day and ten spreads from their median: see dlprof.importers.plausible_times).
    TS_IMPLAUSIBLE = "ts_implausible"
    DUR_IMPLAUSIBLE = "dur_implausible"
    # Not an event but one value of a counter's series (or a range's metric): a string where a
    # number belongs, or a number past a float's range (1e400). Found as the rows are made.
    VALUE = "counter_value_not_a_finite_number"
