"""The emulated grid as carbon-signal APIs (sans-IO): answers to the Carbon Aware SDK Web
API and Electricity Maps' ``carbon-intensity`` endpoints, from a topology's CI sources at
the emulated time.

Rules
-----
* Locations are the topology's DC names and their Electricity Maps zone ids (a zone of
  several DCs answers with its first DC's source; they share the trace).
* Calendar: a trace answers with its own UTC times (``datetime_at``: emulated t = 0 is the
  trace's start hour); a constant source with the run's epoch as t = 0. Query times are
  read in the same calendar, so "now" is always the emulated now.
* Values are the trace's steps (5 minutes to an hour; an hour for constants), in
  gCO2/kWh; ``average`` integrates exactly over the interval.
* Forecasts are `CIForecast` of each source (``forecast_error`` 0: the trace itself) over
  the next ``FORECAST_H`` hours from the current step; the Carbon Aware SDK's optimal
  window is the lowest mean over ``windowSize`` minutes.
* Bad input raises `InvalidInput` naming the query parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from services.model.carbon import CIForecast, CISource, step_of
from services.model.errors import InvalidInput
from services.model.signals import utc_time

FORECAST_H = 24
HISTORY_H = 24


@dataclass(frozen=True)
class Site:
    name: str               # DC name
    zone: str               # Electricity Maps zone id
    source: CISource
    forecast: CIForecast


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


class CarbonApi:
    """Endpoint answers for `sites` at emulated time ``now()`` (see the module docstring)."""

    def __init__(self, sites: Sequence[Site], now: Callable[[], float], epoch_utc: datetime
                 ) -> None:
        self.sites = list(sites)
        self.now = now
        self.epoch_utc = epoch_utc
        self._by: dict[str, Site] = {}
        for s in self.sites:
            self._by.setdefault(s.name, s)
            self._by.setdefault(s.zone, s)

    # ------------------------------------------------------------------ calendar
    def locations(self) -> list[str]:
        """Every name a location can be asked by: DC names and zone ids."""
        return sorted(self._by)

    def site(self, location: str | None, field: str = "location") -> Site:
        if not location:
            raise InvalidInput(field, f"required; one of {self.locations()}")
        s = self._by.get(location)
        if s is None:
            raise InvalidInput(field, f"unknown location {location!r}; known: {self.locations()}")
        return s

    def _origin(self, s: Site) -> datetime:
        at0 = getattr(s.source, "datetime_at", None)
        got = at0(0.0) if at0 is not None else None
        return got if got is not None else self.epoch_utc

    def to_dt(self, s: Site, t: float) -> datetime:
        return self._origin(s) + timedelta(seconds=t)

    def to_t(self, s: Site, text: str | None, field: str, default: float) -> float:
        if text is None or text == "":
            return default
        try:
            when = utc_time(text)
        except ValueError:
            raise InvalidInput(field, f"expected an ISO 8601 time, got {text!r}") from None
        t = (when - self._origin(s)).total_seconds()
        if not math.isfinite(t):
            raise InvalidInput(field, f"out of range: {text!r}")
        return t

    def _steps(self, s: Site, t0: float, t1: float) -> list[tuple[float, float]]:
        """(start, end) of the source's steps that overlap [t0, t1), at most 10,000."""
        step = step_of(s.source)
        start = math.floor(t0 / step) * step
        n = max(1, math.ceil((t1 - start) / step))
        if n > 10_000:
            raise InvalidInput("time", f"{n} steps asked; at most 10000")
        return [(start + k * step, start + (k + 1) * step) for k in range(n)]

    # ------------------------------------------------------------------ Carbon Aware SDK
    def bylocation(self, location: str | None, time: str | None = None,
                   to_time: str | None = None) -> list[dict[str, Any]]:
        """``GET /emissions/bylocation``: the steps in [time, toTime) (default: now)."""
        s = self.site(location)
        now = self.now()
        t0 = self.to_t(s, time, "time", now)
        t1 = self.to_t(s, to_time, "toTime", t0)  # default: the step in force at `time`
        if t1 < t0:
            raise InvalidInput("toTime", "before time")
        return [{"location": location, "time": _iso(self.to_dt(s, a)),
                 "rating": s.source.at(a), "duration": _duration(b - a)}
                for a, b in self._steps(s, t0, max(t1, t0 + 1e-9))]

    def best(self, locations: Sequence[str], time: str | None = None,
             to_time: str | None = None) -> list[dict[str, Any]]:
        """``GET /emissions/bylocations/best``: the lowest-rated entry of the locations."""
        if not locations:
            raise InvalidInput("location", "at least one is required")
        rows = [r for loc in locations for r in self.bylocation(loc, time, to_time)]
        return [min(rows, key=lambda r: float(r["rating"]))]

    def average(self, location: str | None, start: str | None, end: str | None
                ) -> dict[str, Any]:
        """``GET /emissions/average-carbon-intensity``: exact mean over [startTime, endTime]."""
        s = self.site(location)
        if not start or not end:
            raise InvalidInput("startTime" if not start else "endTime", "required (ISO 8601)")
        t0, t1 = self.to_t(s, start, "startTime", 0.0), self.to_t(s, end, "endTime", 0.0)
        if t1 <= t0:
            raise InvalidInput("endTime", "must be after startTime")
        return {"location": location, "startTime": start, "endTime": end,
                "carbonIntensity": s.source.mean(t0, t1)}

    def _forecast_points(self, s: Site, now: float, horizon_h: float
                         ) -> list[tuple[float, float, float]]:
        step = step_of(s.source)
        first = math.floor(now / step) * step
        return [(a, b, s.forecast.forecast(now, a, b))
                for a, b in self._steps(s, first, first + horizon_h * 3600.0)]

    def forecast_current(self, location: str | None, start: str | None = None,
                         end: str | None = None, window_min: str | None = None
                         ) -> list[dict[str, Any]]:
        """``GET /emissions/forecasts/current``: the forecast from now, and its optimal
        window of ``windowSize`` minutes (default one step) within [dataStartAt,
        dataEndAt]."""
        s = self.site(location)
        now = self.now()
        pts = self._forecast_points(s, now, FORECAST_H)
        lo = self.to_t(s, start, "dataStartAt", pts[0][0])
        hi = self.to_t(s, end, "dataEndAt", pts[-1][1])
        pts = [p for p in pts if p[0] >= lo - 1e-9 and p[1] <= hi + 1e-9]
        if not pts:
            raise InvalidInput("dataStartAt", "no forecast step inside [dataStartAt, dataEndAt]")
        step = pts[0][1] - pts[0][0]
        try:
            window = float(window_min) * 60.0 if window_min else step
        except ValueError:
            raise InvalidInput("windowSize", f"expected minutes, got {window_min!r}") from None
        k = max(1, round(window / step))
        if k > len(pts):
            raise InvalidInput("windowSize", f"longer than the forecast ({len(pts)} steps)")
        means = [sum(v for _, _, v in pts[i:i + k]) / k for i in range(len(pts) - k + 1)]
        best = min(range(len(means)), key=means.__getitem__)

        def point(a: float, b: float, v: float) -> dict[str, Any]:
            return {"location": location, "timestamp": _iso(self.to_dt(s, a)),
                    "duration": int(round((b - a) / 60)), "value": v}

        return [{
            "generatedAt": _iso(self.to_dt(s, now)),
            "requestedAt": _iso(self.to_dt(s, now)),
            "location": location,
            "dataStartAt": _iso(self.to_dt(s, pts[0][0])),
            "dataEndAt": _iso(self.to_dt(s, pts[-1][1])),
            "windowSize": int(round(k * step / 60)),
            "optimalDataPoints": [{**point(pts[best][0], pts[best + k - 1][1], means[best]),
                                   "duration": int(round(k * step / 60))}],
            "forecastData": [point(a, b, v) for a, b, v in pts],
        }]

    # ------------------------------------------------------------------ Electricity Maps
    def _em_point(self, s: Site, a: float, v: float, now: float) -> dict[str, Any]:
        return {"zone": s.zone, "carbonIntensity": v, "datetime": _iso(self.to_dt(s, a)),
                "updatedAt": _iso(self.to_dt(s, now)), "createdAt": _iso(self.to_dt(s, now)),
                "emissionFactorType": "lifecycle", "isEstimated": False,
                "estimationMethod": None}

    def em_latest(self, zone: str | None) -> dict[str, Any]:
        """``GET /v3/carbon-intensity/latest?zone=Z``."""
        s = self.site(zone, "zone")
        now = self.now()
        a, b = self._steps(s, now, now + 1e-9)[0]
        return self._em_point(s, a, s.source.at(a), now)

    def em_history(self, zone: str | None) -> dict[str, Any]:
        """``GET /v3/carbon-intensity/history?zone=Z``: the last ``HISTORY_H`` hours."""
        s = self.site(zone, "zone")
        now = self.now()
        steps = self._steps(s, now - HISTORY_H * 3600.0, now + 1e-9)
        return {"zone": s.zone,
                "history": [self._em_point(s, a, s.source.at(a), now) for a, _ in steps]}

    def em_forecast(self, zone: str | None) -> dict[str, Any]:
        """``GET /v3/carbon-intensity/forecast?zone=Z``: the next ``FORECAST_H`` hours."""
        s = self.site(zone, "zone")
        now = self.now()
        return {"zone": s.zone, "updatedAt": _iso(self.to_dt(s, now)),
                "forecast": [{"carbonIntensity": v, "datetime": _iso(self.to_dt(s, a))}
                             for a, _, v in self._forecast_points(s, now, FORECAST_H)]}


def route(api: CarbonApi, path: str, query: Mapping[str, list[str]]) -> Any:
    """The answer of ``GET path?query`` (raises `InvalidInput`, or KeyError for no route)."""
    one = {k: v[-1] for k, v in query.items() if v}
    routes: dict[str, Callable[[], Any]] = {
        "/emissions/bylocation": lambda: api.bylocation(one.get("location"), one.get("time"),
                                                        one.get("toTime")),
        "/emissions/bylocations": lambda: [r for loc in query.get("location", [])
                                           for r in api.bylocation(loc, one.get("time"),
                                                                   one.get("toTime"))],
        "/emissions/bylocations/best": lambda: api.best(query.get("location", []),
                                                        one.get("time"), one.get("toTime")),
        "/emissions/average-carbon-intensity": lambda: api.average(
            one.get("location"), one.get("startTime"), one.get("endTime")),
        "/emissions/forecasts/current": lambda: api.forecast_current(
            one.get("location"), one.get("dataStartAt"), one.get("dataEndAt"),
            one.get("windowSize")),
        "/v3/carbon-intensity/latest": lambda: api.em_latest(one.get("zone")),
        "/v3/carbon-intensity/history": lambda: api.em_history(one.get("zone")),
        "/v3/carbon-intensity/forecast": lambda: api.em_forecast(one.get("zone")),
        "/health": lambda: {"status": "ok", "locations": api.locations()},
    }
    return routes[path.rstrip("/") or "/"]()
