"""Histograms and counters of a monitor of your own, drawn live by the web UI.

A :class:`daqflow.Component` has a :class:`Histograms` set in ``self.histograms``: book a
histogram by name where you first fill it, fill it from the events you decode, and daqflow does
the rest: the set is emptied when a run starts, published with the component's statistics once
a second (``detail.histograms``), drawn in the web UI's Histograms view next to the built-in
monitors', and summed with the same histograms of the other members of a parallel group::

    class AdcMonitor(daqflow.Component):
        def on_event(self, event):                       # called by your own consumer loop
            for fragment in event.fragments:
                adc = numpy.frombuffer(fragment.payload, dtype="<u2")
                self.histograms.h1(f"adc_src{fragment.source_id}", f"ADC, source {fragment.source_id}",
                                   "ADC counts", 0, 4096, 128).fill(adc)
                self.histograms.h2("hitmap", "Hits", ("channel", 0, 64, 64),
                                   ("time (ns)", 0, 400, 40)).fill(channels, times)
                self.histograms.counter("events", "Events seen", "events").add()

The published form is the same as the Rust crate's (``daqflow_component::histogram``): a
one-dimensional histogram ``{"name", "title", "x_label", "low", "high", "bins", "underflow",
"overflow", "entries", "sum", "min", "max", "mean", "unit"}``, a two-dimensional one ``{"kind":
"h2", "name", "title", "x": {"label", "low", "high", "bins"}, "y": {…}, "bins": [row by row],
"outside", "entries"}``, a counter ``{"kind": "counter", "name", "title", "unit", "value"}``
(docs/web.md, ``GET /api/histograms``). Filling takes a number or, with numpy installed, an
array of them (filled in one numpy call).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

__all__ = ["H1", "H2", "Counter", "Histograms"]

Values = Any  # a number, a sequence of numbers, or a numpy array


def _as_array(values: Values):
    try:
        import numpy as np
    except ImportError:
        return None
    return np.asarray(values, dtype=np.float64).ravel()


def _bins_of(values, low: float, high: float, n: int):
    """numpy: the bin index of each value, -1 outside (and NaN)."""
    import numpy as np

    inside = (values >= low) & (values < high)
    index = np.full(values.shape, -1, dtype=np.int64)
    index[inside] = np.minimum(((values[inside] - low) / (high - low) * n).astype(np.int64), n - 1)
    return index


class H1:
    """A one-dimensional histogram of ``bins`` equal bins from ``low`` to ``high``, with the true
    sum, extremes and mean of what was filled (under- and overflow included)."""

    def __init__(self, name: str, title: str, x_label: str, low: float, high: float, bins: int,
                 unit: Optional[str] = None):
        if not (bins >= 1 and high > low):
            raise ValueError(f"histogram {name!r}: needs bins ≥ 1 and high > low (got {bins}, {low} … {high})")
        self.name, self.title, self.x_label, self.unit = name, title, x_label, x_label if unit is None else unit
        self.low, self.high = float(low), float(high)
        self.counts = [0] * int(bins)
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Empties it (a run starts)."""
        with self._lock:
            self._reset()

    def _reset(self) -> None:
        self.counts = [0] * len(self.counts)
        self.underflow = self.overflow = self.entries = 0
        self.sum = 0.0
        self.min: Optional[float] = None
        self.max: Optional[float] = None

    def fill(self, values: Values, weight: int = 1) -> None:
        """Counts each of ``values`` (a number or many) ``weight`` times."""
        weight = int(weight)
        if weight <= 0:
            return
        with self._lock:
            self._fill(values, weight)

    def _fill(self, values: Values, weight: int) -> None:
        if isinstance(values, (int, float)):
            self._fill_one(float(values), weight)
            return
        array = _as_array(values)
        if array is None:
            for v in values:
                self._fill_one(float(v), weight)
            return
        if array.size == 0:
            return
        import numpy as np

        n = len(self.counts)
        index = _bins_of(array, self.low, self.high, n)
        counts = np.bincount(index[index >= 0], minlength=n)
        self.counts = [c + int(k) * weight for c, k in zip(self.counts, counts)]
        finite = array[~np.isnan(array)]
        self.underflow += int(np.count_nonzero(np.isnan(array)) + np.count_nonzero(finite < self.low)) * weight
        self.overflow += int(np.count_nonzero(finite >= self.high)) * weight
        self.entries += int(array.size) * weight
        if finite.size:
            self.sum += float(finite.sum()) * weight
            lo, hi = float(finite.min()), float(finite.max())
            self.min = lo if self.min is None else min(self.min, lo)
            self.max = hi if self.max is None else max(self.max, hi)

    def _fill_one(self, x: float, weight: int) -> None:
        self.entries += weight
        if math.isnan(x) or x < self.low:
            self.underflow += weight
        elif x >= self.high:
            self.overflow += weight
        else:
            n = len(self.counts)
            self.counts[min(int((x - self.low) / (self.high - self.low) * n), n - 1)] += weight
        if not math.isnan(x):
            self.sum += x * weight
            self.min = x if self.min is None else min(self.min, x)
            self.max = x if self.max is None else max(self.max, x)

    @property
    def mean(self) -> Optional[float]:
        """The mean of the values filled (None while empty)."""
        return self.sum / self.entries if self.entries and self.min is not None else None

    def to_json(self) -> Dict[str, Any]:
        """The published form (a consistent copy, also while another thread fills)."""
        with self._lock:
            return {"name": self.name, "title": self.title, "x_label": self.x_label, "low": self.low,
                    "high": self.high, "bins": list(self.counts), "underflow": self.underflow,
                    "overflow": self.overflow, "entries": self.entries, "sum": self.sum, "min": self.min,
                    "max": self.max, "mean": self.mean, "unit": self.unit}


Axis = Tuple[str, float, float, int]
"""An axis of :class:`H2`: ``(label, low, high, bins)``."""


class H2:
    """A two-dimensional histogram over ``x`` × ``y`` (each ``(label, low, high, bins)``);
    ``outside`` counts the entries outside either range."""

    def __init__(self, name: str, title: str, x: Axis, y: Axis):
        for axis in (x, y):
            label, low, high, bins = axis
            if not (int(bins) >= 1 and high > low):
                raise ValueError(f"histogram {name!r}: axis {label!r} needs bins ≥ 1 and high > low")
        self.name, self.title = name, title
        self.x = (str(x[0]), float(x[1]), float(x[2]), int(x[3]))
        self.y = (str(y[0]), float(y[1]), float(y[2]), int(y[3]))
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Empties it."""
        with self._lock:
            self.counts = [0] * (self.x[3] * self.y[3])
            self.outside = self.entries = 0

    def fill(self, xs: Values, ys: Values, weight: int = 1) -> None:
        """Counts each pair ``(xs[i], ys[i])`` (or one pair of numbers) ``weight`` times."""
        weight = int(weight)
        if weight <= 0:
            return
        with self._lock:
            self._fill(xs, ys, weight)

    def _fill(self, xs: Values, ys: Values, weight: int) -> None:
        nx, ny = self.x[3], self.y[3]
        if isinstance(xs, (int, float)) and isinstance(ys, (int, float)):
            xs, ys = [xs], [ys]
        ax, ay = _as_array(xs), _as_array(ys)
        if ax is None:
            pairs = list(zip(xs, ys))
            if len(pairs) != len(xs) or len(pairs) != len(ys):
                raise ValueError("fill(xs, ys): as many x as y values")
            for x, y in pairs:
                ix, iy = _one_bin(float(x), self.x), _one_bin(float(y), self.y)
                self.entries += weight
                if ix is None or iy is None:
                    self.outside += weight
                else:
                    self.counts[iy * nx + ix] += weight
            return
        if ax.shape != ay.shape:
            raise ValueError(f"fill(xs, ys): as many x as y values ({ax.size} and {ay.size})")
        import numpy as np

        ix, iy = _bins_of(ax, self.x[1], self.x[2], nx), _bins_of(ay, self.y[1], self.y[2], ny)
        inside = (ix >= 0) & (iy >= 0)
        counts = np.bincount(iy[inside] * nx + ix[inside], minlength=nx * ny)
        self.counts = [c + int(k) * weight for c, k in zip(self.counts, counts)]
        self.outside += int(ax.size - np.count_nonzero(inside)) * weight
        self.entries += int(ax.size) * weight

    def bin(self, ix: int, iy: int) -> int:
        """The count of bin (``ix``, ``iy``)."""
        return self.counts[iy * self.x[3] + ix]

    def to_json(self) -> Dict[str, Any]:
        """The published form."""
        axis = lambda a: {"label": a[0], "low": a[1], "high": a[2], "bins": a[3]}  # noqa: E731
        with self._lock:
            return {"kind": "h2", "name": self.name, "title": self.title, "x": axis(self.x), "y": axis(self.y),
                    "bins": list(self.counts), "outside": self.outside, "entries": self.entries}


def _one_bin(v: float, axis: Axis) -> Optional[int]:
    _, low, high, n = axis
    if math.isnan(v) or v < low or v >= high:
        return None
    return min(int((v - low) / (high - low) * n), n - 1)


class Counter:
    """A named count (hits, errors, a detector's triggers)."""

    def __init__(self, name: str, title: str, unit: str = ""):
        self.name, self.title, self.unit = name, title, unit
        self.value = 0
        self._lock = threading.Lock()

    def add(self, n: int = 1) -> None:
        """Adds ``n`` (≥ 0)."""
        if n < 0:
            raise ValueError(f"counter {self.name!r}: a count only grows (add({n}))")
        with self._lock:
            self.value += int(n)

    def reset(self) -> None:
        """Back to 0."""
        self.value = 0

    def to_json(self) -> Dict[str, Any]:
        """The published form."""
        return {"kind": "counter", "name": self.name, "title": self.title, "unit": self.unit, "value": self.value}


Booked = Union[H1, H2, Counter]


class Histograms:
    """A component's histograms and counters by name, in booking order. Booking is by first
    use: ``h1(name, …)`` returns the histogram ``name``, made with these bins the first time
    (later calls return it as it is). Safe to fill from a thread of your own while daqflow
    publishes it."""

    def __init__(self) -> None:
        self._booked: Dict[str, Booked] = {}
        self._lock = threading.Lock()

    def _book(self, name: str, kind: type, make) -> Any:
        if not isinstance(name, str) or not name:
            raise ValueError("a histogram needs a name")
        with self._lock:
            h = self._booked.get(name)
            if not isinstance(h, kind):
                if h is not None:
                    raise ValueError(f"{name!r} is booked as a {type(h).__name__}, not a {kind.__name__}")
                h = self._booked[name] = make()
            return h

    def h1(self, name: str, title: str, x_label: str, low: float, high: float, bins: int,
           unit: Optional[str] = None) -> H1:
        """The one-dimensional histogram ``name`` (see :class:`H1`)."""
        return self._book(name, H1, lambda: H1(name, title, x_label, low, high, bins, unit))

    def h2(self, name: str, title: str, x: Axis, y: Axis) -> H2:
        """The two-dimensional histogram ``name`` over ``x`` × ``y``, each ``(label, low, high,
        bins)`` (see :class:`H2`)."""
        return self._book(name, H2, lambda: H2(name, title, x, y))

    def counter(self, name: str, title: str, unit: str = "") -> Counter:
        """The counter ``name``."""
        return self._book(name, Counter, lambda: Counter(name, title, unit))

    def __getitem__(self, name: str) -> Booked:
        return self._booked[name]

    def __contains__(self, name: str) -> bool:
        return name in self._booked

    def __len__(self) -> int:
        return len(self._booked)

    def reset(self) -> None:
        """Empties every histogram and counter, keeping them booked (daqflow calls it when a run
        starts, before :meth:`Component.start`)."""
        with self._lock:
            for h in self._booked.values():
                h.reset()

    def to_json(self) -> List[Dict[str, Any]]:
        """Every histogram and counter, published (``detail.histograms``)."""
        with self._lock:
            return [h.to_json() for h in self._booked.values()]
