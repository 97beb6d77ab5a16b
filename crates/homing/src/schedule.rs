//! Periodic schedules (docs/schedules.md): what a schedule is, when its ticks fall, and the one
//! pure decision of the periodic loop, [`due`]: given the schedule's cursor (every tick at or
//! before it is already decided), the time now and the missed-tick policy, which ticks get a job
//! and where the cursor moves. The store applies that decision with a compare-and-set on the
//! cursor in the same transaction as the jobs' inserts, and each tick's job carries an
//! idempotency key derived from (schedule, tick) ([`tick_key`]), so however many schedulers run
//! the decision at once, each tick gets exactly one job.
//!
//! A leaf module: no I/O, no clock (the caller passes `now`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::job::{JobId, JobOptions};
use crate::time::Micros;

/// A tick later than this after its time is "missed" (nobody was running to enqueue it on time),
/// and the schedule's [`Missed`] policy decides whether it still gets a job. Within it, every
/// tick gets its job, so a scheduler that is merely slow (a busy machine, a loop backing off for
/// a few seconds) skips nothing.
pub const GRACE: Duration = Duration::from_secs(10);

/// The shortest interval of an `every` schedule (and the resolution of cron: whole seconds).
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The longest interval of an `every` schedule.
pub const MAX_INTERVAL: Duration = Duration::from_secs(366 * 24 * 3600);
/// The longest cron expression accepted (a real one is a few dozen bytes).
pub const MAX_CRON_BYTES: usize = 256;
/// The most missed ticks `all:N` may enqueue at once.
pub const MAX_CATCH_UP: u32 = 1000;

/// Idempotency keys of ticks' jobs start with this; producers cannot use it (see
/// [`crate::validate::idempotency_key`] callers), so a key of this form is always a tick's.
pub const KEY_PREFIX: &str = "homing.schedule:";

/// When a schedule's ticks fall.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Spec {
    /// A cron expression of 5 fields (minute resolution) or 6 (seconds first), read in an IANA
    /// time zone; across daylight-saving changes it behaves as cron does (croner: a time skipped
    /// by a jump forward runs at the jump, a repeated hour runs once).
    Cron { expr: String, timezone: String },
    /// Every `interval` from the schedule's anchor (the time it was set or resumed, whole
    /// seconds).
    Every {
        #[serde(with = "interval_text")]
        interval: Duration,
    },
}

/// What happens to ticks that were missed (older than [`GRACE`] when a scheduler first sees
/// them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Missed {
    /// Enqueue only the newest missed tick (once).
    #[default]
    Latest,
    /// Enqueue none of them.
    Skip,
    /// Enqueue each, at most the newest N.
    All(u32),
}

impl std::fmt::Display for Missed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missed::Latest => f.write_str("latest"),
            Missed::Skip => f.write_str("skip"),
            Missed::All(n) => write!(f, "all:{n}"),
        }
    }
}

impl std::str::FromStr for Missed {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "latest" => Ok(Missed::Latest),
            "skip" => Ok(Missed::Skip),
            _ => {
                let n = s
                    .strip_prefix("all:")
                    .and_then(|n| n.parse::<u32>().ok())
                    .filter(|n| (1..=MAX_CATCH_UP).contains(n));
                n.map(Missed::All).ok_or_else(|| {
                    format!(
                        "invalid missed-tick policy {:?}: use latest, skip or all:N with N from 1 to {MAX_CATCH_UP}",
                        s.chars().take(40).collect::<String>()
                    )
                })
            }
        }
    }
}

impl Serialize for Missed {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Missed {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What an operator sets: everything about a schedule but its progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleDef {
    pub name: String,
    pub task: String,
    #[serde(default)]
    pub args: serde_json::Value,
    pub queue: String,
    /// Options every tick's job gets (retries, time limit, crash budget, follow-ups, callback);
    /// `queue`, `idempotency_key` and `countdown` are not used.
    #[serde(default)]
    pub options: JobOptions,
    pub spec: Spec,
    #[serde(default)]
    pub missed: Missed,
}

/// A schedule as stored: its definition and its progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    #[serde(flatten)]
    pub def: ScheduleDef,
    pub paused: bool,
    /// Every tick at or before this is decided (enqueued or skipped).
    #[serde(with = "crate::time::as_rfc3339")]
    pub cursor: Micros,
    /// The newest tick that got a job, and that job.
    #[serde(with = "crate::time::opt_rfc3339")]
    pub last_tick: Option<Micros>,
    pub last_job: Option<JobId>,
    #[serde(with = "crate::time::as_rfc3339")]
    pub created_at: Micros,
    #[serde(with = "crate::time::as_rfc3339")]
    pub updated_at: Micros,
}

/// What the periodic pass reads of every unpaused schedule to find the due ones: not its task,
/// args or options, which may be large and are read only for a schedule with a tick due.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleHead {
    pub name: String,
    pub spec: Spec,
    pub cursor: Micros,
}

impl ScheduleHead {
    /// The schedule's first tick after its cursor: [`due`] has something to write for it at any
    /// `now` at or past this, whatever its missed-tick policy (the policy picks which ticks get a
    /// job, not whether the cursor moves). It depends on the spec and the cursor alone, so a
    /// caller may keep it until either changes.
    pub fn next_tick(&self) -> Option<Micros> {
        next_tick(&self.spec, self.cursor, self.cursor)
    }
}

/// One application of [`due`]: insert `jobs` (one per tick) and move the cursor from
/// `expected_cursor` to `new_cursor`, in one transaction, only if nobody moved it first.
#[derive(Debug, Clone, PartialEq)]
pub struct Firing {
    pub name: String,
    pub expected_cursor: Micros,
    pub new_cursor: Micros,
    /// `(tick, job)`, oldest first; the last one becomes the schedule's `last_tick`/`last_job`.
    pub jobs: Vec<(Micros, crate::job::NewJob)>,
}

/// An interval as text (`"90s"`, `"1h 30m"`), read back with the duration parser every flag uses.
mod interval_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        crate::time::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

const SECOND: Micros = 1_000_000;

/// The floor of `t` to a whole second (ticks and anchors are whole seconds, so a tick's RFC 3339
/// form names it exactly).
pub fn whole_second(t: Micros) -> Micros {
    t.div_euclid(SECOND).saturating_mul(SECOND)
}

/// The idempotency key of a tick's job: `homing.schedule:<name>@<tick RFC 3339>`.
pub fn tick_key(name: &str, tick: Micros) -> String {
    format!("{KEY_PREFIX}{name}@{}", crate::time::rfc3339(tick))
}

/// The schedule and tick a job's idempotency key names, when it is a tick's key.
pub fn parse_tick_key(key: &str) -> Option<(String, Micros)> {
    let rest = key.strip_prefix(KEY_PREFIX)?;
    let (name, tick) = rest.rsplit_once('@')?;
    Some((name.to_string(), crate::time::parse_rfc3339(tick)?))
}

/// `(schedule, tick)` for a job with a tick's idempotency key, `(None, None)` otherwise.
pub fn tick_of(key: Option<&str>) -> (Option<String>, Option<Micros>) {
    match key.and_then(parse_tick_key) {
        Some((name, tick)) => (Some(name), Some(tick)),
        None => (None, None),
    }
}

/// A cron expression parsed and checked: 5 or 6 fields (or a `@daily`-style nickname).
fn parse_cron(expr: &str) -> Result<croner::Cron, String> {
    if expr.len() > MAX_CRON_BYTES {
        return Err(format!(
            "invalid cron expression: at most {MAX_CRON_BYTES} bytes"
        ));
    }
    let fields = expr.split_whitespace().count();
    let nickname = expr.trim_start().starts_with('@');
    if !nickname && !(5..=6).contains(&fields) {
        return Err(format!(
            "invalid cron expression {:?}: use 5 fields (minute hour day month weekday) or 6 (seconds first)",
            shown(expr)
        ));
    }
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .year(croner::parser::Year::Disallowed)
        .build()
        .parse(expr)
        .map_err(|e| format!("invalid cron expression {:?}: {e}", shown(expr)))
}

/// Checks a cron expression alone (for a command-line flag).
pub fn check_cron(expr: &str) -> Result<(), String> {
    // The flag's zone is not known yet: UTC finds dates that never occur; the gap case waits
    // for the whole definition's check.
    fires(&parse_cron(expr)?, expr, &jiff::tz::TimeZone::UTC, false)
}

/// Refuses a pattern that parses but names no time that occurs in `tz`: no date matches its
/// day, month and weekday fields (`0 0 30 2 *`, the 30th of February), or every time it names
/// is skipped by a daylight-saving change. Stored, it would never fire, and every pass of the
/// scheduler would search to the library's year limit (5000) for its next tick. Without a year
/// field a pattern's dates repeat every 400 years (the Gregorian cycle), so one search from now
/// settles it. It costs microseconds for a pattern that fires, tens of milliseconds for one whose
/// dates never occur, and about a second for one whose times all fall in gaps (the search steps
/// through each gap second by second): callers that serve others run it off their runtime.
fn fires(
    cron: &croner::Cron,
    expr: &str,
    tz: &jiff::tz::TimeZone,
    name_zone: bool,
) -> Result<(), String> {
    let now = Ticks::zoned(crate::time::now(), tz)
        .ok_or_else(|| "the clock is outside the range of dates".to_string())?;
    match cron.find_next_occurrence(&now, false) {
        Ok(_) => Ok(()),
        Err(_) => Err(format!(
            "cron expression {:?} never fires{}: no date matches its day, month and weekday fields, \
             or every time it names is skipped by a daylight-saving change",
            shown(expr),
            tz.iana_name()
                .filter(|_| name_zone)
                .map(|n| format!(" in {n}"))
                .unwrap_or_default()
        )),
    }
}

/// Cron specs found never to fire in this process, so that a pass of the scheduler pays the
/// search once for each (a schedule stored before [`check`] refused such specs). Only specs that
/// never fire go in, and a deployment has few schedules, so it stays small.
static NEVER_FIRES: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

fn listed(never: &[(String, String)], expr: &str, tz: &str) -> bool {
    never.iter().any(|(e, z)| e == expr && z == tz)
}

fn known_never(expr: &str, tz: &str) -> bool {
    listed(
        &NEVER_FIRES.lock().unwrap_or_else(|p| p.into_inner()),
        expr,
        tz,
    )
}

/// Whether `spec` is a cron remembered as never firing (an interval always fires).
fn passed_over(spec: &Spec) -> bool {
    matches!(spec, Spec::Cron { expr, timezone } if known_never(expr, timezone))
}

/// 4000-01-01T00:00:00Z. A search for the next tick that starts after it can fail near the cron
/// library's year limit (5000) for a spec that does fire, so only a failure from before it says
/// the spec never fires (a cursor that far ahead is a corrupt one, not a reason to pass over
/// every schedule of that spec).
const PRESENT_UNTIL: Micros = 64_060_588_800 * SECOND;

/// Remembers a cron spec that had no tick after `from` (1970 to [`PRESENT_UNTIL`]), saying so
/// once.
fn remember_never(expr: &str, tz: &str, from: Micros) {
    if !(0..PRESENT_UNTIL).contains(&from) {
        return;
    }
    let first = {
        let mut never = NEVER_FIRES.lock().unwrap_or_else(|p| p.into_inner());
        let first = !listed(&never, expr, tz);
        if first {
            never.push((expr.to_string(), tz.to_string()));
        }
        first
    };
    if first {
        tracing::warn!(cron = %expr, timezone = %tz, "a schedule's cron expression never fires; it is passed over (delete it, or set it again with a spec that fires)");
    }
}

/// Checks an IANA time zone name alone (for a command-line flag).
pub fn check_timezone(tz: &str) -> Result<(), String> {
    parse_zone(tz).map(|_| ())
}

fn shown(s: &str) -> String {
    s.chars().take(80).collect()
}

fn parse_zone(tz: &str) -> Result<jiff::tz::TimeZone, String> {
    jiff::tz::TimeZone::get(tz).map_err(|_| {
        format!(
            "unknown time zone {:?}: use an IANA name such as UTC, Europe/Paris or Asia/Seoul",
            shown(tz)
        )
    })
}

/// Checks a definition: names, args, options, the spec (cron parses, zone exists, interval in
/// range) and the policy. The error is a one-line reason for the user.
pub fn check(def: &ScheduleDef) -> Result<(), String> {
    use crate::validate as v;
    v::name("schedule", &def.name)?;
    v::producer_task(&def.task)?;
    v::producer_queue(&def.queue)?;
    v::json("args", &def.args, v::MAX_ARGS_BYTES)?;
    if def.options.idempotency_key.is_some() || def.options.countdown.is_some() {
        return Err("a schedule's options cannot set idempotency_key or countdown: each tick's job gets its own key and runs at its tick".into());
    }
    match &def.spec {
        Spec::Cron { expr, timezone } => {
            let cron = parse_cron(expr)?;
            fires(&cron, expr, &parse_zone(timezone)?, true)?;
        }
        Spec::Every { interval } => {
            v::duration("interval", *interval, MIN_INTERVAL, MAX_INTERVAL)?;
            if interval.subsec_nanos() != 0 {
                return Err("interval must be a whole number of seconds".into());
            }
        }
    }
    if let Missed::All(n) = def.missed {
        v::count("missed all:N", n, 1, MAX_CATCH_UP)?;
    }
    Ok(())
}

/// Where a schedule's ticks fall, ready to be walked.
enum Ticks {
    // Boxed: a parsed pattern is large, and an interval is one number.
    Cron(Box<(croner::Cron, jiff::tz::TimeZone)>),
    Every(Micros),
}

impl Ticks {
    fn new(spec: &Spec) -> Result<Self, String> {
        Ok(match spec {
            Spec::Cron { expr, timezone } => {
                Ticks::Cron(Box::new((parse_cron(expr)?, parse_zone(timezone)?)))
            }
            Spec::Every { interval } => {
                let us = i64::try_from(interval.as_micros()).unwrap_or(i64::MAX);
                Ticks::Every(us.max(SECOND))
            }
        })
    }

    fn zoned(t: Micros, tz: &jiff::tz::TimeZone) -> Option<jiff::Zoned> {
        let ts = jiff::Timestamp::from_microsecond(t).ok()?;
        Some(ts.to_zoned(tz.clone()))
    }

    fn micros(z: &jiff::Zoned) -> Micros {
        z.timestamp().as_microsecond()
    }

    /// The first tick strictly after `t` (`anchor` is where an interval counts from).
    fn after(&self, t: Micros, anchor: Micros) -> Option<Micros> {
        #[cfg(test)]
        SEARCHES.with(|n| n.set(n.get() + 1));
        match self {
            Ticks::Cron(c) => {
                let (cron, tz) = &**c;
                let z = Self::zoned(t, tz)?;
                cron.find_next_occurrence(&z, false)
                    .ok()
                    .map(|z| Self::micros(&z))
            }
            Ticks::Every(i) => {
                if t < anchor {
                    return Some(anchor);
                }
                let k = (t - anchor) / i + 1;
                anchor.checked_add(k.checked_mul(*i)?)
            }
        }
    }

    /// The last tick at or before `t`, if it is after `floor`.
    fn at_or_before(&self, t: Micros, anchor: Micros, floor: Micros) -> Option<Micros> {
        let tick = match self {
            Ticks::Cron(c) => {
                let (cron, tz) = &**c;
                let z = Self::zoned(t, tz)?;
                Self::micros(&cron.find_previous_occurrence(&z, true).ok()?)
            }
            Ticks::Every(i) => {
                if t < anchor {
                    return None;
                }
                anchor + (t - anchor) / i * i
            }
        };
        (tick > floor).then_some(tick)
    }
}

#[cfg(test)]
thread_local! {
    /// How many forward searches for a tick this thread made: what the periodic loop's tests
    /// count to see that a pass over unchanged schedules searches nothing.
    pub(crate) static SEARCHES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The next tick after `t`, for views ("next tick" in lists and the dashboard) and the periodic
/// loop's look at which schedules are due.
pub fn next_tick(spec: &Spec, t: Micros, anchor: Micros) -> Option<Micros> {
    if passed_over(spec) {
        return None;
    }
    let next = Ticks::new(spec).ok()?.after(t, anchor);
    if let (None, Spec::Cron { expr, timezone }) = (next, spec) {
        remember_never(expr, timezone, t);
    }
    next
}

/// A schedule as the API, the CLI and the dashboard show it: the stored record and its next tick
/// (`null` while paused).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleView {
    #[serde(flatten)]
    pub schedule: Schedule,
    #[serde(with = "crate::time::opt_rfc3339")]
    pub next_tick: Option<Micros>,
}

impl From<Schedule> for ScheduleView {
    fn from(schedule: Schedule) -> Self {
        let next_tick = if schedule.paused {
            None
        } else {
            next_tick(&schedule.def.spec, schedule.cursor, schedule.cursor)
        };
        Self {
            schedule,
            next_tick,
        }
    }
}

/// What [`due`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// Ticks that get a job, oldest first.
    pub fire: Vec<Micros>,
    /// The new cursor: the newest tick at or before `now` (fired or skipped).
    pub cursor: Micros,
}

/// The most on-time ticks one decision returns (a 1 s schedule has at most [`GRACE`] / 1 s + 1).
const MAX_ON_TIME: usize = 64;

/// Decides which ticks in `(cursor, now]` get a job. Ticks within [`GRACE`] of `now` are on
/// time: each gets one (oldest first, at most 64 a call; the rest come next call). Older ones
/// were missed: `missed` decides (`Latest`: the newest of them; `Skip`: none; `All(n)`: the
/// newest `n`). `anchor` is where an `Every` schedule counts from. `None` when no tick is due
/// (nothing to write), or when the spec cannot be evaluated.
pub fn due(
    spec: &Spec,
    anchor: Micros,
    cursor: Micros,
    now: Micros,
    missed: Missed,
) -> Option<Due> {
    if passed_over(spec) {
        return None;
    }
    let ticks = Ticks::new(spec).ok()?;
    let grace = i64::try_from(GRACE.as_micros()).unwrap_or(i64::MAX);
    let edge = now.saturating_sub(grace).max(cursor);
    // The first tick after the edge, looked for before the walk back: a cron with none after a
    // present-day edge has none ever, and walking back would search as long again.
    let first_after = ticks.after(edge, anchor);
    if let (None, Spec::Cron { expr, timezone }) = (first_after, spec) {
        remember_never(expr, timezone, edge);
        return None;
    }
    // Missed: ticks in (cursor, edge]; pick the newest few by walking back from the edge.
    let keep = match missed {
        Missed::Skip => 0,
        Missed::Latest => 1,
        Missed::All(n) => n as usize,
    };
    let mut fire = Vec::new();
    let newest_missed = ticks.at_or_before(edge, anchor, cursor);
    let mut back = newest_missed;
    while let Some(t) = back {
        if fire.len() >= keep {
            break;
        }
        fire.push(t);
        back = ticks.at_or_before(t - 1, anchor, cursor);
    }
    fire.reverse();
    let mut new_cursor = newest_missed;
    // On time: ticks in (edge, now], oldest first.
    let mut t = edge;
    let mut next_after = Some(first_after);
    while fire.len() < keep + MAX_ON_TIME {
        match next_after.take().unwrap_or_else(|| ticks.after(t, anchor)) {
            Some(next) if next <= now => {
                fire.push(next);
                new_cursor = Some(next);
                t = next;
            }
            _ => break,
        }
    }
    let cursor = new_cursor?;
    Some(Due { fire, cursor })
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Micros = SECOND;

    fn every(secs: u64) -> Spec {
        Spec::Every {
            interval: Duration::from_secs(secs),
        }
    }

    fn cron(expr: &str, tz: &str) -> Spec {
        Spec::Cron {
            expr: expr.into(),
            timezone: tz.into(),
        }
    }

    fn utc(s: &str) -> Micros {
        crate::time::parse_rfc3339(s).unwrap()
    }

    #[test]
    fn nothing_is_due_before_the_first_tick() {
        assert_eq!(due(&every(60), 0, 0, 59 * S, Missed::Latest), None);
        let d = due(&every(60), 0, 0, 60 * S, Missed::Latest).unwrap();
        assert_eq!(d.fire, [60 * S]);
        assert_eq!(d.cursor, 60 * S);
        // Applied: the next call with the new cursor finds nothing.
        assert_eq!(due(&every(60), 0, d.cursor, 61 * S, Missed::Latest), None);
    }

    #[test]
    fn on_time_ticks_all_fire_whatever_the_policy() {
        for p in [Missed::Latest, Missed::Skip, Missed::All(1)] {
            let d = due(&every(1), 0, 0, 3 * S, p).unwrap();
            assert_eq!(d.fire, [S, 2 * S, 3 * S], "{p}");
            assert_eq!(d.cursor, 3 * S);
        }
    }

    #[test]
    fn missed_ticks_follow_the_policy() {
        // Down for 100 s with a 1 s schedule: ticks 1..=90 are missed, 91..=100 on time.
        let now = 100 * S;
        let on_time: Vec<Micros> = (91..=100).map(|k| k * S).collect();
        let d = due(&every(1), 0, 0, now, Missed::Skip).unwrap();
        assert_eq!(d.fire, on_time);
        let d = due(&every(1), 0, 0, now, Missed::Latest).unwrap();
        assert_eq!(d.fire[0], 90 * S);
        assert_eq!(&d.fire[1..], on_time);
        let d = due(&every(1), 0, 0, now, Missed::All(3)).unwrap();
        assert_eq!(&d.fire[..3], [88 * S, 89 * S, 90 * S]);
        assert_eq!(&d.fire[3..], on_time);
        assert_eq!(d.cursor, now);
        // An hourly schedule down a day: only missed ticks; latest fires one, skip moves on.
        let h = 3600 * S;
        let d = due(&every(3600), 0, 0, 24 * h + 30 * 60 * S, Missed::Latest).unwrap();
        assert_eq!(d.fire, [24 * h]);
        let d = due(&every(3600), 0, 0, 24 * h + 30 * 60 * S, Missed::Skip).unwrap();
        assert!(d.fire.is_empty());
        assert_eq!(d.cursor, 24 * h);
        let d = due(&every(3600), 0, 0, 24 * h + 30 * 60 * S, Missed::All(1000)).unwrap();
        assert_eq!(d.fire.len(), 24);
    }

    #[test]
    fn cron_in_utc_and_with_seconds() {
        let d = due(
            &cron("*/15 * * * *", "UTC"),
            0,
            utc("2026-01-01T00:00:00Z"),
            utc("2026-01-01T00:15:05Z"),
            Missed::Latest,
        )
        .unwrap();
        assert_eq!(d.fire, [utc("2026-01-01T00:15:00Z")]);
        let d = due(
            &cron("*/2 * * * * *", "UTC"),
            0,
            utc("2026-01-01T00:00:00Z"),
            utc("2026-01-01T00:00:05Z"),
            Missed::Latest,
        )
        .unwrap();
        assert_eq!(
            d.fire,
            [utc("2026-01-01T00:00:02Z"), utc("2026-01-01T00:00:04Z")]
        );
    }

    #[test]
    fn cron_follows_the_zone_across_daylight_saving() {
        // 02:30 every day in New York: on 2026-03-08 the clock jumps 02:00 → 03:00, and cron
        // runs the skipped time at the jump (07:00Z); other days it is 07:30Z or 06:30Z.
        let spec = cron("30 2 * * *", "America/New_York");
        let t1 = next_tick(&spec, utc("2026-03-07T00:00:00Z"), 0).unwrap();
        assert_eq!(t1, utc("2026-03-07T07:30:00Z"));
        let t2 = next_tick(&spec, t1, 0).unwrap();
        let t3 = next_tick(&spec, t2, 0).unwrap();
        assert_eq!(t3, utc("2026-03-09T06:30:00Z"));
        assert!(t2 > t1 && t2 < t3, "one tick on the day of the jump");
        // 01:30 on 2026-11-01 happens twice; cron runs it once.
        let spec = cron("30 1 * * *", "America/New_York");
        let a = next_tick(&spec, utc("2026-11-01T00:00:00Z"), 0).unwrap();
        let b = next_tick(&spec, a, 0).unwrap();
        assert!(b - a > 20 * 3600 * S, "{a} {b}");
    }

    #[test]
    fn checks_refuse_bad_specs_with_a_reason() {
        let mut def = ScheduleDef {
            name: "nightly".into(),
            task: "builtin.noop".into(),
            args: serde_json::json!({}),
            queue: "default".into(),
            options: JobOptions::default(),
            spec: cron("0 3 * * *", "Europe/Paris"),
            missed: Missed::Latest,
        };
        assert_eq!(check(&def), Ok(()));
        // Valid but for its length: repeated minutes.
        let long = format!("{} * * * *", vec!["1"; 200].join(","));
        for (expr, tz) in [
            ("0 3 * *", "UTC"),
            ("0 3 * * * * *", "UTC"),
            ("99 3 * * *", "UTC"),
            ("0 3 * * *", "Mars/Olympus"),
            ("", "UTC"),
            (long.as_str(), "UTC"),
        ] {
            def.spec = cron(expr, tz);
            assert!(check(&def).is_err(), "{expr} {tz}");
        }
        // Patterns that parse but name no date are refused, saying so; rare ones that do fire
        // are not: the 29th of February (in leap years), and the 30th of February with a
        // weekday, since cron fires when either the day of the month or the weekday matches.
        for expr in [
            "0 0 30 2 *",
            "0 0 31 4,6,9,11 *",
            "* * 31 2 *",
            "0 0 0 31 11 *",
        ] {
            def.spec = cron(expr, "Asia/Seoul");
            let e = check(&def).unwrap_err();
            assert!(e.contains("never fires"), "{expr}: {e}");
            assert!(
                check_cron(expr).unwrap_err().contains("never fires"),
                "{expr}"
            );
        }
        for expr in ["0 0 29 2 *", "0 0 30 2 1", "0 0 31 * *", "30 2 * * *"] {
            def.spec = cron(expr, "Europe/Paris");
            assert_eq!(check(&def), Ok(()), "{expr}");
            assert_eq!(check_cron(expr), Ok(()), "{expr}");
        }
        def.spec = every(0);
        assert!(check(&def).is_err());
        def.spec = Spec::Every {
            interval: Duration::from_millis(1500),
        };
        assert!(check(&def).is_err());
        def.spec = every(10);
        def.name = "bad name".into();
        assert!(check(&def).is_err());
        def.name = "ok".into();
        def.task = "builtin.webhook".into();
        assert!(check(&def).is_err());
        assert!("all:0".parse::<Missed>().is_err());
        assert!("all:1001".parse::<Missed>().is_err());
        assert_eq!("all:5".parse::<Missed>(), Ok(Missed::All(5)));
    }

    #[test]
    fn a_stored_cron_that_never_fires_is_searched_once() {
        // A spec no other test uses: the memory of such specs is the process's.
        let never = cron("0 0 31 11 *", "Pacific/Chatham");
        let now = utc("2026-12-06T12:00:00Z");
        assert!(!known_never("0 0 31 11 *", "Pacific/Chatham"));
        assert_eq!(
            due(&never, now - 60 * S, now - 60 * S, now, Missed::Latest),
            None
        );
        assert!(known_never("0 0 31 11 *", "Pacific/Chatham"), "remembered");
        assert_eq!(
            due(&never, now - 60 * S, now - 60 * S, now, Missed::Latest),
            None
        );
        // A search from near the library's year limit proves nothing: not remembered.
        let rare = cron("0 0 29 2 *", "Pacific/Chatham");
        let late = utc("4999-03-01T00:00:00Z");
        assert_eq!(next_tick(&rare, late, late), None);
        assert!(!known_never("0 0 29 2 *", "Pacific/Chatham"));
        // The views' next tick remembers too (a list or a dashboard showed it each time).
        let never_view = cron("0 0 31 9 *", "Pacific/Chatham");
        assert!(!known_never("0 0 31 9 *", "Pacific/Chatham"));
        assert_eq!(next_tick(&never_view, now, now), None);
        assert!(known_never("0 0 31 9 *", "Pacific/Chatham"));
        // One that fires is not remembered, and still fires.
        let daily = cron("0 12 * * *", "Pacific/Chatham");
        let noon = utc("2026-12-06T23:00:00Z"); // 12:00 at UTC+13:45 is 22:15 UTC the day before
        let got = due(
            &daily,
            noon - 86_400 * S,
            noon - 86_400 * S,
            noon,
            Missed::Latest,
        );
        assert!(got.is_some());
        assert!(!known_never("0 12 * * *", "Pacific/Chatham"));
    }

    #[test]
    fn tick_keys_round_trip() {
        let t = utc("2026-03-08T07:00:00Z");
        let k = tick_key("a:b.c-d", t);
        assert_eq!(k, "homing.schedule:a:b.c-d@2026-03-08T07:00:00.000Z");
        assert_eq!(parse_tick_key(&k), Some(("a:b.c-d".into(), t)));
        assert_eq!(parse_tick_key("order-42"), None);
    }

    proptest::proptest! {
        /// Applying `due` pass after pass, at any pace, enqueues each on-time tick exactly once,
        /// in order, and never a tick after `now`: what a live scheduler must do.
        #[test]
        fn passes_fire_each_tick_once(secs in 1u64..30, steps in proptest::collection::vec(0i64..9_000_000, 1..40)) {
            let spec = every(secs);
            let mut cursor = 0;
            let mut now = 0;
            let mut fired = Vec::new();
            for step in steps {
                now += step;
                if let Some(d) = due(&spec, 0, cursor, now, Missed::Skip) {
                    proptest::prop_assert!(d.cursor > cursor && d.cursor <= now);
                    for t in &d.fire {
                        proptest::prop_assert!(*t > cursor && *t <= now);
                    }
                    fired.extend(d.fire);
                    cursor = d.cursor;
                }
            }
            let i = (secs as i64) * S;
            let expected: Vec<Micros> = (1..).map(|k| k * i).take_while(|t| *t <= now).collect();
            // Steps are under the grace, so nothing was ever missed.
            proptest::prop_assert_eq!(fired, expected);
        }

        #[test]
        fn missed_ticks_never_exceed_the_policy(secs in 1u64..100, down in 0i64..100_000, n in 1u32..20) {
            let now = down * S;
            for p in [Missed::Skip, Missed::Latest, Missed::All(n)] {
                if let Some(d) = due(&every(secs), 0, 0, now, p) {
                    let edge = now - 10 * S;
                    let missed = d.fire.iter().filter(|t| **t <= edge).count();
                    let cap = match p { Missed::Skip => 0, Missed::Latest => 1, Missed::All(n) => n as usize };
                    proptest::prop_assert!(missed <= cap);
                    proptest::prop_assert!(d.fire.windows(2).all(|w| w[0] < w[1]));
                    proptest::prop_assert_eq!(d.cursor, now / ((secs as i64) * S) * (secs as i64) * S);
                }
            }
        }
    }
}
