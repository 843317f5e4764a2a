//! The tests drift is judged by, built on `statrs` distributions (which give distributions,
//! not tests):
//!
//! - [`fisher_exact`]: Fisher's exact test on a 2×2 table through the hypergeometric
//!   distribution — exact at the small counts a regression set has (a few cases per run),
//!   where a z-test for two proportions would be wrong.
//! - [`mann_whitney_u`]: the Mann–Whitney U rank test with average ranks for ties, the tie
//!   correction of the variance and the continuity correction, normal approximation — the
//!   same as SciPy's `mannwhitneyu(..., method="asymptotic", use_continuity=True)`.

use statrs::distribution::{ContinuousCDF, Discrete, DiscreteCDF, Hypergeometric, Normal};

/// p-values of Fisher's exact test for the table `[[a, b], [c, d]]` (rows: groups; columns:
/// outcome yes / no).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fisher {
    /// H1: the first row's share of the first column is lower (`P(X <= a)`).
    pub less: f64,
    /// H1: it is higher (`P(X >= a)`).
    pub greater: f64,
    /// Sum of the probabilities of every table at most as likely as the observed one (R's and
    /// SciPy's definition).
    pub two_sided: f64,
}

/// Fisher's exact test. `X`, the top-left cell, is hypergeometric given the margins:
/// population `a+b+c+d`, "successes" `a+c` (first column), draws `a+b` (first row).
pub fn fisher_exact(a: u64, b: u64, c: u64, d: u64) -> Fisher {
    let n = a + b + c + d;
    let col = a + c;
    let row = a + b;
    let Ok(h) = Hypergeometric::new(n, col, row) else {
        // Only an empty table gets here (every margin zero): no evidence either way.
        return Fisher {
            less: 1.0,
            greater: 1.0,
            two_sided: 1.0,
        };
    };
    let lo = (row + col).saturating_sub(n);
    let hi = row.min(col);
    let less = h.cdf(a).min(1.0);
    let greater = if a == 0 { 1.0 } else { h.sf(a - 1).min(1.0) };
    let observed = h.pmf(a);
    // Relative tolerance, as R and SciPy use, so tables equally likely up to rounding count.
    let limit = observed * (1.0 + 1e-7);
    let two_sided: f64 = (lo..=hi).map(|x| h.pmf(x)).filter(|p| *p <= limit).sum();
    Fisher {
        less,
        greater,
        two_sided: two_sided.min(1.0),
    }
}

/// Result of [`mann_whitney_u`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MannWhitney {
    /// U of the first sample: how often an `x` beats a `y` (ties count one half).
    pub u: f64,
    /// Two-sided p-value (normal approximation with tie and continuity corrections).
    pub two_sided: f64,
    /// H1: `x` tends to be larger than `y`.
    pub greater: f64,
    /// H1: `x` tends to be smaller than `y`.
    pub less: f64,
}

/// The Mann–Whitney U test of `x` against `y`. Empty samples, or every value tied, give
/// p = 1 (nothing to tell them apart).
pub fn mann_whitney_u(x: &[f64], y: &[f64]) -> MannWhitney {
    let (n1, n2) = (x.len() as f64, y.len() as f64);
    let none = MannWhitney {
        u: n1 * n2 / 2.0,
        two_sided: 1.0,
        greater: 1.0,
        less: 1.0,
    };
    if x.is_empty() || y.is_empty() {
        return none;
    }
    // Average ranks over the pooled sample, tie groups collected for the variance.
    let mut pooled: Vec<(f64, bool)> = x
        .iter()
        .map(|v| (*v, true))
        .chain(y.iter().map(|v| (*v, false)))
        .collect();
    pooled.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = pooled.len();
    let mut rank_sum_x = 0.0;
    let mut tie_term = 0.0;
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && pooled[j + 1].0 == pooled[i].0 {
            j += 1;
        }
        let t = (j - i + 1) as f64;
        // Ranks i+1 ..= j+1, averaged.
        let rank = (i + j) as f64 / 2.0 + 1.0;
        rank_sum_x += rank * pooled[i..=j].iter().filter(|p| p.1).count() as f64;
        tie_term += t * t * t - t;
        i = j + 1;
    }
    let u = rank_sum_x - n1 * (n1 + 1.0) / 2.0;
    let nn = n1 + n2;
    let mean = n1 * n2 / 2.0;
    let var = n1 * n2 / 12.0 * ((nn + 1.0) - tie_term / (nn * (nn - 1.0)));
    if var.is_nan() || var <= 0.0 {
        return MannWhitney { u, ..none };
    }
    let sd = var.sqrt();
    let Ok(normal) = Normal::new(0.0, 1.0) else {
        return MannWhitney { u, ..none };
    };
    let sf = |z: f64| normal.sf(z);
    let greater = sf((u - mean - 0.5) / sd);
    let less = sf((n1 * n2 - u - mean - 0.5) / sd);
    let big = u.max(n1 * n2 - u);
    let two_sided = (2.0 * sf((big - mean - 0.5) / sd)).min(1.0);
    MannWhitney {
        u,
        two_sided,
        greater: greater.min(1.0),
        less: less.min(1.0),
    }
}

/// The median of `v` (`None` when empty).
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    Some(if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1e-300)
    }

    #[test]
    fn fisher_lady_tasting_tea() {
        // Fisher (1935): 3 of 4 cups right each way. One-sided p = 17/70, two-sided 34/70.
        let f = fisher_exact(3, 1, 1, 3);
        assert!(close(f.greater, 17.0 / 70.0, 1e-9), "{f:?}");
        assert!(close(f.two_sided, 34.0 / 70.0, 1e-9), "{f:?}");
        assert!(close(f.less, 69.0 / 70.0, 1e-9), "{f:?}");
    }

    #[test]
    fn fisher_known_table() {
        // [[1, 9], [11, 3]] (the dieting example, e.g. Wikipedia "Fisher's exact test"):
        // R fisher.test / scipy.stats.fisher_exact give two-sided p = 0.002759456,
        // alternative="less" p = 0.001379728.
        let f = fisher_exact(1, 9, 11, 3);
        assert!(close(f.two_sided, 0.002_759_456, 1e-6), "{f:?}");
        assert!(close(f.less, 0.001_379_728, 1e-6), "{f:?}");
        assert!(f.greater > 0.99, "{f:?}");
    }

    #[test]
    fn fisher_drift_shapes() {
        // 0 of 6 passing after 120 of 120 before: P = 1 / C(126, 6) — tiny.
        let f = fisher_exact(0, 6, 120, 0);
        assert!(f.less < 1e-9, "{f:?}");
        // 2 failures of 6 after none in 120: p = C(6,2)/C(126,2) = 15/7875.
        let f = fisher_exact(4, 2, 120, 0);
        assert!(close(f.less, 15.0 / 7875.0, 1e-9), "{f:?}");
        // Identical rates: no evidence.
        let f = fisher_exact(6, 0, 120, 0);
        assert!(close(f.less, 1.0, 1e-12), "{f:?}");
        assert_eq!(fisher_exact(0, 0, 0, 0).two_sided, 1.0);
    }

    #[test]
    fn mann_whitney_matches_scipy() {
        // SciPy docs example: males vs females.
        // mannwhitneyu(x, y, method="asymptotic") → statistic 17.0, pvalue 0.11134688653314041.
        let x = [19.0, 22.0, 16.0, 29.0, 24.0];
        let y = [20.0, 11.0, 17.0, 12.0];
        let r = mann_whitney_u(&x, &y);
        assert_eq!(r.u, 17.0);
        assert!(close(r.two_sided, 0.111_346_886_533_140_41, 1e-9), "{r:?}");
        // One-sided: z = (17 - 10 - 0.5) / sqrt(50/3), sf(z) = half of the two-sided value here.
        assert!(
            close(r.greater, 0.111_346_886_533_140_41 / 2.0, 1e-9),
            "{r:?}"
        );
    }

    #[test]
    fn mann_whitney_with_ties() {
        // x = [1, 2, 2, 3], y = [2, 3, 3, 4]: average ranks 1, 3, 3, 6 | 3, 6, 6, 8 → R1 = 13,
        // U1 = 13 - 10 = 3; ties {2: 3, 3: 3}: Σ(t³-t) = 48; var = 16/12·(9 - 48/56) = 10.857…;
        // two-sided p = 2·sf((13 - 8 - 0.5)/√10.857) = 2·sf(1.365698) = 0.172033708921823
        // (what scipy's asymptotic method gives for these samples).
        let r = mann_whitney_u(&[1.0, 2.0, 2.0, 3.0], &[2.0, 3.0, 3.0, 4.0]);
        assert_eq!(r.u, 3.0);
        assert!(close(r.two_sided, 0.172_033_708_921_823, 1e-9), "{r:?}");
        assert!(r.less < r.greater);
    }

    #[test]
    fn mann_whitney_degenerate() {
        assert_eq!(mann_whitney_u(&[], &[1.0]).two_sided, 1.0);
        assert_eq!(mann_whitney_u(&[1.0, 1.0], &[1.0, 1.0]).two_sided, 1.0);
        // Completely separated, moderate samples: small p.
        let lo: Vec<f64> = (0..30).map(f64::from).collect();
        let hi: Vec<f64> = (100..130).map(f64::from).collect();
        assert!(mann_whitney_u(&hi, &lo).greater < 1e-9);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }
}
