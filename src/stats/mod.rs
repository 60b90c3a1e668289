//! Lock-free latency histograms: recorded on the hot path with two relaxed atomic adds, read
//! by the API (mean, p99) and by `/metrics` (Prometheus cumulative buckets).
//!
//! Values are microseconds in log-linear buckets: four buckets per power of two, so a
//! quantile read back is within 25 % of the true value, from 1 µs to centuries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Sub-buckets per power of two.
const SUB: u64 = 4;
/// Enough buckets for any `u64` of microseconds.
const BUCKETS: usize = 252;

/// The Prometheus bucket bounds exported, in microseconds: powers of two from 16 µs to ~16 s,
/// each of which is an exact bucket boundary here.
pub const EXPORT_BOUNDS_US: [u64; 21] = [
    1 << 4,
    1 << 5,
    1 << 6,
    1 << 7,
    1 << 8,
    1 << 9,
    1 << 10,
    1 << 11,
    1 << 12,
    1 << 13,
    1 << 14,
    1 << 15,
    1 << 16,
    1 << 17,
    1 << 18,
    1 << 19,
    1 << 20,
    1 << 21,
    1 << 22,
    1 << 23,
    1 << 24,
];

pub struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }
}

fn index(us: u64) -> usize {
    if us < SUB {
        return us as usize;
    }
    let e = 63 - us.leading_zeros() as u64;
    ((e - 1) * SUB + ((us >> (e - 2)) & (SUB - 1))) as usize
}

/// The smallest value that falls in bucket `i`.
fn lower(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i;
    }
    let e = i / SUB + 1;
    (SUB + i % SUB) << (e - 2)
}

/// What a histogram holds at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub mean_ms: f64,
    pub p99_ms: f64,
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        self.buckets[index(us)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The sum of the recorded values, in microseconds.
    pub fn sum_us(&self) -> u64 {
        self.sum_us.load(Ordering::Relaxed)
    }

    pub fn sum_seconds(&self) -> f64 {
        self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// The value below which a fraction `q` of the recorded values lie (the upper edge of the
    /// bucket that holds it), in microseconds. 0 when empty.
    pub fn quantile_us(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return if i + 1 < BUCKETS {
                    lower(i + 1).saturating_sub(1)
                } else {
                    u64::MAX
                };
            }
        }
        u64::MAX
    }

    pub fn summary(&self) -> Summary {
        let count = self.count();
        let mean_ms = if count == 0 {
            0.0
        } else {
            self.sum_us.load(Ordering::Relaxed) as f64 / count as f64 / 1000.0
        };
        Summary {
            count,
            mean_ms,
            p99_ms: self.quantile_us(0.99) as f64 / 1000.0,
        }
    }

    /// Cumulative counts at each of [`EXPORT_BOUNDS_US`] (values strictly below the bound).
    pub fn cumulative(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::with_capacity(EXPORT_BOUNDS_US.len());
        let mut seen = 0;
        let mut next = 0;
        for bound in EXPORT_BOUNDS_US {
            let end = index(bound);
            while next < end {
                seen += self.buckets[next].load(Ordering::Relaxed);
                next += 1;
            }
            out.push((bound, seen));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_monotonic() {
        let mut last = 0;
        for us in 0..5000u64 {
            let i = index(us);
            assert!(i >= last && i <= last + 1, "at {us}");
            assert!(lower(i) <= us && us < lower(i + 1), "at {us}");
            last = i;
        }
        assert!(index(u64::MAX) < BUCKETS);
    }

    #[test]
    fn quantiles_and_exports_reflect_what_was_recorded() {
        let h = Histogram::default();
        for _ in 0..99 {
            h.record(Duration::from_micros(100));
        }
        h.record(Duration::from_millis(50));
        let p50 = h.quantile_us(0.5);
        assert!((100..=125).contains(&p50), "{p50}");
        let p99 = h.quantile_us(0.99);
        assert!((100..=125).contains(&p99), "{p99}");
        let max = h.quantile_us(1.0);
        assert!((50_000..=62_500).contains(&max), "{max}");
        let cum = h.cumulative();
        assert_eq!(cum[0], (16, 0));
        assert_eq!(cum.iter().find(|(b, _)| *b == 128).unwrap().1, 99);
        assert_eq!(cum.last().unwrap().1, 100);
        assert_eq!(h.summary().count, 100);
    }
}
