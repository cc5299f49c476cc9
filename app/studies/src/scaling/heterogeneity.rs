//! The checkpoint-only heterogeneity proxy of seed 002 (Algorithm 002-D): ‖τ_i − Σ_k λ_k τ_k‖²
//! per task before and after a TIES or DARE mask, and the per-task reduction
//! δ_i(M) = Σ_{j dropped for i} [(τ_ij − τ̄_j)² − (0 − τ̃̄_j)²], where τ̄ is the weighted mean
//! before masking and τ̃̄ after. The paper asserts δ_i > 0; it can be negative, and is
//! reported with its sign.

use mergescope_engine::rng::{bernoulli_keep, mix64};
use serde::{Deserialize, Serialize};

/// The proxy per task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heterogeneity {
    /// ‖τ_i − τ̄‖² before masking.
    pub before: Vec<f64>,
    /// ‖m_i⊙τ_i − τ̃̄‖² after masking.
    pub after: Vec<f64>,
    /// δ_i(M), signed.
    pub delta: Vec<f64>,
}

/// The proxy of task vectors `taus` (equal lengths) merged with weights `lambdas`, masked by
/// `masks` (true = kept).
pub fn heterogeneity(taus: &[&[f32]], lambdas: &[f64], masks: &[Vec<bool>]) -> Heterogeneity {
    let d = taus.first().map_or(0, |t| t.len());
    let mean = |masked: bool| -> Vec<f64> {
        (0..d)
            .map(|j| {
                taus.iter()
                    .zip(lambdas)
                    .zip(masks)
                    .map(|((t, l), m)| if masked && !m[j] { 0.0 } else { l * f64::from(t[j]) })
                    .sum()
            })
            .collect()
    };
    let (bar, bar_masked) = (mean(false), mean(true));
    let mut out = Heterogeneity {
        before: Vec::new(),
        after: Vec::new(),
        delta: Vec::new(),
    };
    for (t, m) in taus.iter().zip(masks) {
        let (mut before, mut after, mut delta) = (0.0, 0.0, 0.0);
        for j in 0..d {
            let x = f64::from(t[j]);
            before += (x - bar[j]).powi(2);
            let kept = if m[j] { x } else { 0.0 };
            after += (kept - bar_masked[j]).powi(2);
            if !m[j] {
                delta += (x - bar[j]).powi(2) - bar_masked[j].powi(2);
            }
        }
        out.before.push(before);
        out.after.push(after);
        out.delta.push(delta);
    }
    out
}

/// TIES masks: keep each task's `density` fraction of largest-magnitude entries (linear-time
/// selection), elect each coordinate's sign by the mass of the kept entries, and keep the
/// kept entries that agree with it.
pub fn ties_masks(taus: &[&[f32]], density: f64) -> Vec<Vec<bool>> {
    let d = taus.first().map_or(0, |t| t.len());
    let keep = ((density.clamp(0.0, 1.0) * d as f64).ceil() as usize).min(d);
    let trimmed: Vec<Vec<bool>> = taus
        .iter()
        .map(|t| {
            if keep == 0 {
                return vec![false; d];
            }
            let mut mags: Vec<f32> = t.iter().map(|x| x.abs()).collect();
            let (_, kth, _) = mags.select_nth_unstable_by(d - keep, |a, b| a.total_cmp(b));
            let threshold = *kth;
            t.iter().map(|x| x.abs() >= threshold && *x != 0.0).collect()
        })
        .collect();
    let elected: Vec<f64> = (0..d)
        .map(|j| {
            taus.iter()
                .zip(&trimmed)
                .map(|(t, k)| if k[j] { f64::from(t[j]) } else { 0.0 })
                .sum::<f64>()
                .signum()
        })
        .collect();
    taus.iter()
        .zip(&trimmed)
        .map(|(t, k)| (0..d).map(|j| k[j] && f64::from(t[j]).signum() == elected[j]).collect())
        .collect()
}

/// DARE masks: keep each entry with probability 1 − `drop`, independently per task (seeded).
pub fn dare_masks(tasks: usize, len: usize, drop: f64, seed: u64) -> Vec<Vec<bool>> {
    (0..tasks)
        .map(|t| {
            let task_seed = mix64(seed ^ mix64(t as u64 + 1));
            (0..len)
                .map(|j| bernoulli_keep(task_seed, j as u64, 1.0 - drop))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_computed_masked_example() {
        // τ1 = [1, −2, 3], τ2 = [1, 2, −1], λ = ½: τ̄ = [1, 0, 1]. Task 1 drops coordinate 1,
        // task 2 drops coordinate 2: τ̃̄ = [1, 1, 1.5].
        let (t1, t2) = ([1.0f32, -2.0, 3.0], [1.0f32, 2.0, -1.0]);
        let masks = vec![vec![true, false, true], vec![true, true, false]];
        let h = heterogeneity(&[&t1, &t2], &[0.5, 0.5], &masks);
        assert_eq!(h.before, vec![8.0, 8.0]);
        assert_eq!(h.after, vec![3.25, 3.25]);
        // δ1 = (−2 − 0)² − 1² = 3; δ2 = (−1 − 1)² − 1.5² = 1.75.
        assert_eq!(h.delta, vec![3.0, 1.75]);
    }

    #[test]
    fn the_reduction_can_be_negative_and_is_not_clamped() {
        // Dropping task 1's small entry moves the masked mean to 2.5: (0.1 − 2.55)² − 2.5² < 0.
        let h = heterogeneity(&[&[0.1f32], &[5.0f32]], &[0.5, 0.5], &[vec![false], vec![true]]);
        assert!((h.delta[0] - (2.45f64.powi(2) - 6.25)).abs() < 1e-6);
        assert!(h.delta[0] < 0.0);
    }

    #[test]
    fn ties_trims_then_keeps_entries_of_the_elected_sign() {
        let t1 = [3.0f32, -1.0, 0.5, -4.0];
        let t2 = [1.0f32, 2.0, -3.0, -0.5];
        // Density ½ keeps {3, −4} and {2, −3}; elected signs +, +, −, −: no conflicts left.
        assert_eq!(
            ties_masks(&[&t1, &t2], 0.5),
            vec![vec![true, false, false, true], vec![false, true, true, false]]
        );
        // Full density: coordinate 0 (+3, +1) keeps both; coordinate 3 (−4, −0.5) keeps both;
        // coordinate 1 (−1 vs +2: mass +1) drops task 1; coordinate 2 (0.5 vs −3) drops task 1.
        assert_eq!(
            ties_masks(&[&t1, &t2], 1.0),
            vec![vec![true, false, false, true], vec![true, true, true, true]]
        );
    }

    #[test]
    fn dare_keeps_about_one_minus_p_and_is_seeded() {
        let m = dare_masks(2, 10_000, 0.9, 7);
        let kept = m[0].iter().filter(|k| **k).count();
        assert!((900..1100).contains(&kept), "{kept}");
        let same = m[0].iter().zip(&m[1]).filter(|(a, b)| a == b).count();
        assert!(same < 9_500, "tasks draw independently ({same} of 10000 equal)");
        assert!(m == dare_masks(2, 10_000, 0.9, 7), "the same seed gives the same masks");
    }
}
