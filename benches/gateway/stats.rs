//! Sample summaries: median, p95 (nearest rank), min, max, mean.

use serde::Serialize;

/// A summary of one series of samples (milliseconds unless said otherwise).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p95: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    /// Summarises `samples`; an empty series gives all zeros with `n == 0`.
    pub fn of(samples: &[f64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let p50 = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Self {
            n,
            p50,
            p95: percentile(&s, 0.95),
            min: s[0],
            max: s[n - 1],
            mean: s.iter().sum::<f64>() / n as f64,
        }
    }
}

/// Nearest-rank percentile of sorted samples (`q` in 0..=1).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `a / b`, or NaN when `b` is zero.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        f64::NAN
    } else {
        a / b
    }
}

/// A 95 % bootstrap interval for `p50(a) / p50(b)`: both series resampled with replacement
/// 2,000 times. It says how far the ratio of medians could move from sampling alone, which on
/// a shared machine is often more than the distance to a target. The resampling is seeded, so
/// the same samples always give the same interval.
pub fn ratio_interval(a: &[f64], b: &[f64]) -> (f64, f64) {
    const ROUNDS: usize = 2_000;
    if a.is_empty() || b.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    // xorshift64*: enough to pick sample indices; no statistical quality beyond that is needed.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut pick = |n: usize| {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    };
    let mut resample = |s: &[f64]| {
        let drawn: Vec<f64> = (0..s.len()).map(|_| s[pick(s.len())]).collect();
        Summary::of(&drawn).p50
    };
    let mut ratios: Vec<f64> = (0..ROUNDS)
        .map(|_| ratio(resample(a), resample(b)))
        .collect();
    ratios.sort_by(f64::total_cmp);
    (percentile(&ratios, 0.025), percentile(&ratios, 0.975))
}
