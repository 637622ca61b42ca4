"""Log timestamps: the one reader of a line's time, with one year rule and one zone rule.

Policy (every caller — the card's ISO time, the job's clock-corrected times, the kernel/app
correlation — reads times through here, so they agree):

* **Year.** A stamp without a year (vLLM ``11-20 14:37:16``, glog ``I1120 14:37:16.1``, syslog
  ``Nov 20 14:37:16``, dmesg ``-H``) takes the latest year that puts it *not after the reference
  time* — the log file's mtime when known, else the host's clock, else now — with a day of
  slack for clocks and zones (``SLACK_S``). A log written on 2 January may hold 31 December lines
  of the year before, never next year's; 29 February goes back to the last leap year.
* **Zone.** A stamp that names its zone (``Z``, ``+02:00``, ``-0500``) is read in it; one that does
  not is read in the host's zone (an IANA name, ``±hh:mm``, seconds east of UTC or a tzinfo),
  UTC when the host's zone is unknown. ``iso`` keeps a zone-less stamp zone-less when no host
  zone is given, since inventing one would misstate it.
* Times relative to boot (dmesg's ``[ 12.5]``) are not wall times: they are the kernel reader's
  business (``evidence.kernel``), which adds them to the boot time it measured.
"""

from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

SLACK_S = 86400.0  # a stamp may lie this far after the reference time (skewed clocks, zones)

MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_abbr) if m}
# Months as tools print them under other locales (glibc's abmon of de, fr, es, it, pt, nl, pl, ru, uk, sv, cs, tr,
# da, nb, fi, hu, ro; lower case, no closing dot; none names two months): `dmesg -T` and `journalctl -o short`
# format their stamps with the user's LC_TIME, so a ticket's attachment may say "kwi 11" for April 11.
LOCAL_MONTHS = {
    name: month
    for month, names in {
        1: "janv ene gen sty янв січ led oca tammi ian",
        2: "févr fev lut фев лют úno şub helmi febr",
        3: "mär mars mrt мар бер bře maalis márc",
        4: "avril abr kwi апр кві dub nis april huhti ápr",
        5: "mai mag mei maj мая тра kvě touko máj",
        6: "juin giu cze июн чер čen haz juni kesä jún iun",
        7: "juil lug lip июл лип čec tem juli heinä júl iul",
        8: "août ago sie авг сер srp ağu elo",
        9: "sept set wrz сен вер zář eyl syys szept",
        10: "okt ott out paź окт жов říj eki loka",
        11: "lis ноя лис kas marras",
        12: "dez déc dic gru дек гру pro ara des joulu",
    }.items()
    for name in names.split()
}


# A month as a stamp may print it: a word of 3-6 letters in any script ("Apr", "kwi", "févr.", "ago") or the
# CJK locales' number and sign ("2月", "2월"); month_number says which month, if any, a match names
MONTH_WORD = r"(?:[^\W\d_]{3,6}\.?|\d{1,2}[月월])"
_CJK_MONTH = re.compile(r"(\d{1,2})[月월]")


def month_number(name: str) -> int | None:
    """1-12 for a month's abbreviation in English, one of LOCAL_MONTHS's locales ("Apr", "kwi", "févr.") or a CJK
    locale ("2月"), else None."""
    key = name.lower().rstrip(".")
    m = _CJK_MONTH.fullmatch(key)
    if m:
        n = int(m.group(1))
        return n if 1 <= n <= 12 else None
    return MONTHS.get(key) or LOCAL_MONTHS.get(key)


_ISO = re.compile(
    r"(?<!\d)(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[T _-](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d+))?"
    r"\s*(?P<z>Z|[+-]\d\d:?\d\d)?"
)
_MD = re.compile(  # vLLM, Ray: 11-20 14:37:16
    r"(?<![\d-])(?P<mo>\d\d)[-/](?P<d>\d\d)[ T](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d+))?"
)
_GLOG_LINE = re.compile(r"(?:^|[\[\]:\s])[IWEF](?P<t>\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)?)")
_GLOG = re.compile(  # glog: 1120 14:37:16.123, 626 06:24:44.9 (26 June)
    r"(?<![\d-])(?P<mo>\d{1,2}?)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d+))?"
)
_SYSLOG = re.compile(  # syslog: Nov 20 14:37:16 (or under another locale: "ago 27 14:15:42", "2月 25 17:49:00")
    r"(?<![^\W\d_])(?P<mon>" + MONTH_WORD + r")\s+(?P<d>\d{1,2}) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d+))?"
)


@dataclass(frozen=True)
class Stamp:
    """The fields a log line's time spells out; ``year`` and ``zone`` are None when it does not say."""

    month: int
    day: int
    hour: int
    minute: int
    second: int
    frac: str = ""  # the fraction's digits as written (``"9"`` for ``.9``)
    year: int | None = None
    zone: tzinfo | None = None


def zone(spec: Any) -> tzinfo:
    """A host's zone as a tzinfo: IANA name, ``±hh:mm``/``±hhmm``, seconds east of UTC, or a tzinfo; UTC if unknown."""
    if isinstance(spec, tzinfo):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return timezone(timedelta(seconds=float(spec)))
    if isinstance(spec, str) and spec:
        if spec in ("Z", "UTC", "GMT"):
            return timezone.utc
        m = re.fullmatch(r"([+-])(\d\d):?(\d\d)", spec)
        if m:
            sec = (int(m.group(2)) * 3600 + int(m.group(3)) * 60) * (1 if m.group(1) == "+" else -1)
            return timezone(timedelta(seconds=sec))
        try:
            from zoneinfo import ZoneInfo

            return ZoneInfo(spec)
        except (KeyError, ValueError, OSError):  # an unknown zone name: UTC, as when no zone is known
            return timezone.utc
    return timezone.utc


def parse(text: str | None) -> Stamp | None:
    """The first timestamp in ``text`` (ISO, torchrun's ``_``, vLLM, glog, syslog), or None."""
    if not text or not isinstance(text, str):
        return None
    m = _ISO.search(text)
    if m:
        z = m.group("z")
        return _stamp(m, int(m.group("y")), zone(z) if z else None)
    g = _GLOG_LINE.search(text)
    m = _MD.search(text) or (_GLOG.search(g.group("t")) if g else None) or _GLOG.search(text)
    if m:
        return _stamp(m, None, None)
    m = _SYSLOG.search(text)
    month = month_number(m.group("mon")) if m else None
    if m and month:
        return Stamp(
            month,
            int(m.group("d")),
            int(m.group("h")),
            int(m.group("mi")),
            int(m.group("s")),
            m.group("f") or "",
        )
    return None


def _stamp(m: re.Match[str], year: int | None, tz: tzinfo | None) -> Stamp:
    return Stamp(
        int(m.group("mo")),
        int(m.group("d")),
        int(m.group("h")),
        int(m.group("mi")),
        int(m.group("s")),
        m.group("f") or "",
        year,
        tz,
    )


def year_for(st: Stamp, ref: float | None = None, tz: tzinfo = timezone.utc) -> int | None:
    """The stamp's year: its own, else the latest one not after ``ref`` (+ ``SLACK_S``); None if no year fits."""
    if st.year is not None:
        return st.year
    ref = time.time() if ref is None else ref
    y0 = datetime.fromtimestamp(ref, tz).year + 1
    for y in range(y0, y0 - 9, -1):  # back to the last 29 February
        t = _at(st, y, tz)
        if t is not None and t <= ref + SLACK_S:
            return y
    return None


def _at(st: Stamp, year: int, tz: tzinfo) -> float | None:
    try:
        d = datetime(year, st.month, st.day, st.hour, st.minute, min(st.second, 59), tzinfo=st.zone or tz)
    except ValueError:  # 29 February in a year without one, month 13
        return None
    return d.timestamp() + (float("0." + st.frac) if st.frac else 0.0)


def epoch(text: str | None, host_zone: Any = None, ref: float | None = None) -> float | None:
    """A log line's time as epoch seconds on the host's clock (the module's year and zone rules), or None."""
    st = parse(text)
    return None if st is None else stamp_epoch(st, host_zone, ref)


def stamp_epoch(st: Stamp, host_zone: Any = None, ref: float | None = None) -> float | None:
    """A parsed stamp as epoch seconds on the host's clock."""
    tz = zone(host_zone)
    y = year_for(st, ref, tz)
    return None if y is None else _at(st, y, tz)


def wall(
    month: int, day: int, hms: str, tz_offset: int, ref: float | None = None, year: int | None = None
) -> float | None:
    """A kernel-log wall time (``Nov 20`` + ``14:37[:16]``) as epoch seconds: ``year`` if the line (or the
    caller) knows it, else the module's year rule against ``ref``."""
    parts = hms.split(":")
    try:
        h, mi, s = int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) > 2 else 0
    except (ValueError, IndexError):
        return None
    return stamp_epoch(Stamp(month, day, h, mi, s, year=year), tz_offset, ref)


def iso(text: str | None, ref: float | None = None, tz_offset: int | None = None) -> str | None:
    """A log line's time as ISO 8601 as the host wrote it (no conversion); the year by the module's rule.

    With ``tz_offset`` (seconds east of UTC, the host's zone) a zone-less stamp gets that offset;
    without, it stays zone-less. None when the stamp cannot be read.
    """
    st = parse(text.strip() if text else text)
    if st is None:
        return None
    tz = st.zone or zone(tz_offset if tz_offset is not None else None)
    y = year_for(st, ref, tz)
    if y is None:
        return None
    try:
        out = datetime(y, st.month, st.day, st.hour, st.minute, min(st.second, 59)).isoformat()
    except ValueError:
        return None
    if st.frac:
        out += "." + st.frac.ljust(3, "0")[:6]
    z = st.zone if st.zone is not None else (zone(tz_offset) if tz_offset is not None else None)
    if z is not None:
        off = z.utcoffset(None) or timedelta(0)
        sec = int(off.total_seconds())
        sign = "+" if sec >= 0 else "-"
        h, rem = divmod(abs(sec), 3600)
        out += f"{sign}{h:02d}:{rem // 60:02d}"
    return out


def find(text: str) -> str | None:
    """The text of a line's own timestamp (ISO, vLLM, or glog after its level letter), None without one."""
    m = _ISO.search(text) or _MD.search(text)
    if m is not None:
        return m.group(0)
    g = _GLOG_LINE.search(text)
    return g.group("t") if g else None
