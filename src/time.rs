//! Wall-clock timestamps as the API shows them: RFC 3339, UTC, milliseconds; a thread's CPU
//! time.

use serde::{Serialize, Serializer};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One of the system's clocks now, as seconds and nanoseconds (a reading before its zero as
/// zero); `None` where it cannot be read. One `clock_gettime`, no arithmetic of `Duration`s:
/// a hop reads the wall clock several times.
#[cfg(target_os = "linux")]
fn read_clock(clock: libc::clockid_t) -> Option<(u64, u32)> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own and reads nothing of ours.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(match u64::try_from(ts.tv_sec) {
        Ok(s) => (s, ts.tv_nsec.clamp(0, 999_999_999) as u32),
        Err(_) => (0, 0),
    })
}

/// CPU time the calling OS thread has used so far (zero where it cannot be read).
pub fn thread_cpu_time() -> Duration {
    #[cfg(target_os = "linux")]
    if let Some((s, ns)) = read_clock(libc::CLOCK_THREAD_CPUTIME_ID) {
        return Duration::new(s, ns);
    }
    Duration::ZERO
}

/// Milliseconds since the Unix epoch; serializes as `2026-01-15T10:30:01.123Z`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub u64);

/// The system's wall clock now, as seconds and nanoseconds since the Unix epoch (zero before
/// it).
fn wall_clock() -> (u64, u32) {
    #[cfg(target_os = "linux")]
    if let Some(now) = read_clock(libc::CLOCK_REALTIME) {
        return now;
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| (d.as_secs(), d.subsec_nanos()))
        .unwrap_or((0, 0))
}

impl Timestamp {
    pub fn now() -> Self {
        let (s, ns) = wall_clock();
        Timestamp(
            s.saturating_mul(1000)
                .saturating_add(u64::from(ns / 1_000_000)),
        )
    }

    /// Reads an RFC 3339 date-time (any offset; sub-millisecond digits dropped).
    pub fn parse_rfc3339(s: &str) -> Option<Timestamp> {
        let t =
            time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
        let ms = t.unix_timestamp_nanos() / 1_000_000;
        u64::try_from(ms).ok().map(Timestamp)
    }

    /// [`Timestamp::parse_rfc3339`] for a bound of a filter: any RFC 3339 time, one before
    /// 1970 taken as 1970 (nothing is logged before it).
    pub fn parse_rfc3339_bound(s: &str) -> Option<Timestamp> {
        let t =
            time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
        let ms = (t.unix_timestamp_nanos() / 1_000_000).max(0);
        Some(Timestamp(u64::try_from(ms).unwrap_or(u64::MAX)))
    }

    pub fn to_rfc3339(self) -> String {
        let format = time::macros::format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
        );
        time::OffsetDateTime::from_unix_timestamp_nanos(self.0 as i128 * 1_000_000)
            .ok()
            .and_then(|t| t.format(&format).ok())
            .unwrap_or_default()
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> serde::Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Timestamp::parse_rfc3339(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("`{text}` is not an RFC 3339 time")))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_rfc3339_with_millis() {
        assert_eq!(
            super::Timestamp(1_705_314_601_123).to_rfc3339(),
            "2024-01-15T10:30:01.123Z"
        );
        assert_eq!(
            super::Timestamp::parse_rfc3339("2024-01-15T11:30:01.123+01:00"),
            Some(super::Timestamp(1_705_314_601_123))
        );
        assert_eq!(super::Timestamp::parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn now_is_the_systems_clock_in_milliseconds() {
        use std::time::{SystemTime, UNIX_EPOCH};
        let ms = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        let before = ms(SystemTime::now());
        let now = super::Timestamp::now().0;
        let after = ms(SystemTime::now());
        assert!(before <= now && now <= after, "{before} {now} {after}");
    }

    #[test]
    fn a_threads_cpu_time_grows_with_its_work_only() {
        use std::time::{Duration, Instant};
        let before = super::thread_cpu_time();
        let started = Instant::now();
        let mut x = 0u64;
        while super::thread_cpu_time() - before < Duration::from_millis(10) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the clock does not move"
            );
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        // A new thread has used next to nothing: the clock is the thread's, not the process's.
        let other = std::thread::spawn(super::thread_cpu_time).join().unwrap();
        assert!(other < Duration::from_millis(10), "{other:?}");
    }
}

/// Where the wall-clock timers of the organism (approval timeouts) read the time: the
/// system's clock, or one a test moves by hand ([`Clock::manual`]) to cross a timeout
/// without waiting for it.
#[derive(Clone, Default)]
pub struct Clock(Option<std::sync::Arc<std::sync::atomic::AtomicU64>>);

impl Clock {
    /// The system's clock.
    pub fn system() -> Clock {
        Clock(None)
    }

    /// A clock that starts at the system's time now and moves only by [`Clock::advance`].
    pub fn manual() -> Clock {
        Clock(Some(std::sync::Arc::new(
            std::sync::atomic::AtomicU64::new(Timestamp::now().0),
        )))
    }

    pub fn now(&self) -> Timestamp {
        match &self.0 {
            None => Timestamp::now(),
            Some(t) => Timestamp(t.load(std::sync::atomic::Ordering::SeqCst)),
        }
    }

    /// Moves a manual clock forward (a system clock does not move by hand).
    pub fn advance(&self, by: Duration) {
        if let Some(t) = &self.0 {
            let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
            t.fetch_add(ms, std::sync::atomic::Ordering::SeqCst);
        }
    }
}
