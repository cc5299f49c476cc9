//! Effective task weights (Algorithm 002-B) and the excess-risk bound calculator (Algorithm
//! 002-C, Theorem 3 / Eq. 24) of seed 002, with the paper's ambiguities as options: the χ²
//! term as printed (÷λ²) or standard (÷λ), and the constant 5 (main text) or 12 (appendix).

use serde::{Deserialize, Serialize};

/// λ_i = K_i / Σ_j K_j: the weights plain averaging really gives experts trained for K_i
/// steps of plain SGD (Eq. 14).
pub fn effective_weights(steps: &[f64]) -> Vec<f64> {
    let total: f64 = steps.iter().sum();
    steps
        .iter()
        .map(|k| if total > 0.0 { k / total } else { 0.0 })
        .collect()
}

/// Effective weights and local steps from normalised step-size schedules a_i (η_i^k/η_l):
/// λ_i = ‖a_i‖₁ / Σ_j ‖a_j‖₁ and τ_eff = (1/N) Σ_i ‖a_i‖₁.
pub fn effective_weights_of_schedules(schedules: &[Vec<f64>]) -> (Vec<f64>, f64) {
    let norms: Vec<f64> = schedules.iter().map(|a| a.iter().map(|x| x.abs()).sum()).collect();
    let tau = norms.iter().sum::<f64>() / schedules.len().max(1) as f64;
    (effective_weights(&norms), tau)
}

/// Which χ² term.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChiSquare {
    /// Σ_i (1/N − λ_i)² / λ_i², as printed in seed 002.
    AsPrinted,
    /// Σ_i (1/N − λ_i)² / λ_i, the usual χ² divergence from uniform.
    Standard,
}

/// The χ² term of weights `lambdas` (normalised to sum to 1 first); +∞ when a weight is 0.
pub fn chi_square(lambdas: &[f64], variant: ChiSquare) -> f64 {
    let total: f64 = lambdas.iter().sum();
    let n = lambdas.len() as f64;
    lambdas
        .iter()
        .map(|l| {
            let l = if total > 0.0 { l / total } else { 0.0 };
            let d = (1.0 / n - l).powi(2);
            match (variant, l) {
                (_, l) if l <= 0.0 => f64::INFINITY,
                (ChiSquare::AsPrinted, l) => d / (l * l),
                (ChiSquare::Standard, l) => d / l,
            }
        })
        .sum()
}

/// One expert's terms in the bound.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskTerms {
    /// Merge weight λ_i (normalised with the others).
    pub lambda: f64,
    /// Fine-tuning steps K_i.
    pub steps: f64,
    /// Batch size b_i.
    pub batch: f64,
    /// Training examples n_i.
    pub examples: f64,
    /// Gradient noise σ_i² (per example).
    pub sigma2: f64,
    /// Gradient heterogeneity ζ_i².
    pub zeta2: f64,
}

/// The global constants of the bound.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BoundInputs {
    /// The experts.
    pub tasks: Vec<TaskTerms>,
    /// Fine-tuning learning rate η_l.
    pub lr: f64,
    /// Smoothness L.
    pub smoothness: f64,
    /// PL-type constant C (1/(2μ) for PL).
    pub pl: f64,
    /// Δ0 = f̃(x0) − f̃_inf.
    pub delta0: f64,
    /// The constant of ε_sgd's last term: 5 (main text, Theorem 2) or 12 (appendix).
    pub last_constant: f64,
    /// Which χ².
    pub chi: ChiSquare,
}

/// The bound and its parts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bound {
    /// 8(L+1) η² Σ λ_i K_i (σ_i²/n_i + 3 b_i ζ_i²/n_i): drives the generalisation gap.
    pub stability: f64,
    /// (2C+1)[χ² Σ λ_i ζ_i² + (χ²+1) ε_sgd]: the optimisation error.
    pub optimisation: f64,
    /// The χ² term used.
    pub chi2: f64,
    /// ε_sgd of Theorem 2 / Corollary 2.
    pub eps_sgd: f64,
    /// Side conditions of Lemma 3 (and Assumption 4) that the inputs violate.
    pub warnings: Vec<String>,
}

impl Bound {
    /// Stability plus optimisation.
    pub fn total(&self) -> f64 {
        self.stability + self.optimisation
    }
}

/// Evaluates the bound of Theorem 3 (Eq. 24) for `inputs`.
pub fn bound(inputs: &BoundInputs) -> Bound {
    let t = &inputs.tasks;
    let n = t.len().max(1) as f64;
    let mut warnings = Vec::new();
    let lambda_sum: f64 = t.iter().map(|x| x.lambda).sum();
    if t.iter().any(|x| x.lambda < 0.0) || (lambda_sum - 1.0).abs() > 1e-9 {
        warnings.push(format!(
            "Assumption 4 wants λ ≥ 0 with Σλ = 1 (here Σλ = {lambda_sum:.4}); the weights were normalised"
        ));
    }
    let lam = |x: &TaskTerms| if lambda_sum > 0.0 { x.lambda / lambda_sum } else { 0.0 };
    let (eta, l, c) = (inputs.lr, inputs.smoothness, inputs.pl);
    let s: f64 = t
        .iter()
        .map(|x| lam(x) * x.steps * (x.sigma2 / x.examples + 3.0 * x.batch * x.zeta2 / x.examples))
        .sum();
    let sigma2 = t.iter().map(|x| x.sigma2).fold(0.0, f64::max);
    let zeta2 = t.iter().map(|x| x.zeta2).fold(0.0, f64::max);
    let b = t.iter().map(|x| x.batch).fold(f64::INFINITY, f64::min);
    let k_bar = t.iter().map(|x| x.steps).sum::<f64>() / n;
    let a1 = n * t.iter().map(|x| k_bar / x.steps * lam(x).powi(2)).sum::<f64>();
    let a2: f64 = t.iter().map(|x| lam(x) * (x.steps - 1.0)).sum();
    let a3 = t.iter().map(|x| x.steps * (x.steps - 1.0)).fold(0.0, f64::max);
    let root = (n * k_bar).sqrt();
    let eps_sgd = 4.0 * inputs.delta0 / root
        + 4.0 * l * sigma2 * a1 / (b * root)
        + 6.0 * n * l * l * sigma2 * a2 / (b * k_bar)
        + inputs.last_constant * n * l * l * zeta2 * a3 / k_bar;
    let lambdas: Vec<f64> = t.iter().map(lam).collect();
    let chi2 = chi_square(&lambdas, inputs.chi);
    let weighted_zeta: f64 = t.iter().map(|x| lam(x) * x.zeta2).sum();
    let o_prime = chi2 * weighted_zeta + (chi2 + 1.0) * eps_sgd;
    if chi2.is_infinite() {
        warnings.push("a weight is 0: χ² and the optimisation term are infinite".into());
    }
    let k_max = t.iter().map(|x| x.steps).fold(0.0, f64::max);
    if eta > 1.0 / (8.0 * k_max * l) {
        warnings.push(format!(
            "Lemma 3 needs η ≤ 1/(8 K L) = {:.3e}; η = {eta:.3e} is larger",
            1.0 / (8.0 * k_max * l)
        ));
    }
    if let Some(x) = t.iter().find(|x| x.batch / x.examples > 0.5) {
        warnings.push(format!(
            "Lemma 3 needs b_i/n_i ≤ 1/2; a task has b = {} and n = {}",
            x.batch, x.examples
        ));
    }
    if 2.0 * eta * l > 1.0 {
        warnings.push("Lemma 3 needs 1 + 2ηL ≤ 2".into());
    }
    Bound {
        stability: 8.0 * (l + 1.0) * eta * eta * s,
        optimisation: (2.0 * c + 1.0) * o_prime,
        chi2,
        eps_sgd,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_weights_follow_the_step_counts() {
        assert_eq!(effective_weights(&[1000.0, 3000.0]), vec![0.25, 0.75]);
        let (l, tau) = effective_weights_of_schedules(&[vec![1.0, 1.0], vec![1.0; 4]]);
        assert!((l[0] - 1.0 / 3.0).abs() < 1e-12 && (l[1] - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(tau, 3.0);
    }

    #[test]
    fn both_chi_square_variants_on_a_hand_case() {
        // λ = (1/4, 3/4), N = 2: (1/4)²/(1/16) + (1/4)²/(9/16) = 1 + 1/9; ÷λ: 1/4 + 1/12.
        assert!((chi_square(&[0.25, 0.75], ChiSquare::AsPrinted) - 10.0 / 9.0).abs() < 1e-12);
        assert!((chi_square(&[0.25, 0.75], ChiSquare::Standard) - 1.0 / 3.0).abs() < 1e-12);
        // Unnormalised weights are normalised; uniform gives 0; a zero weight gives ∞.
        assert!((chi_square(&[1.0, 3.0], ChiSquare::Standard) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(chi_square(&[0.5, 0.5], ChiSquare::AsPrinted), 0.0);
        assert!(chi_square(&[0.0, 1.0], ChiSquare::Standard).is_infinite());
    }

    fn two_tasks() -> BoundInputs {
        let task = TaskTerms {
            lambda: 0.5,
            steps: 10.0,
            batch: 2.0,
            examples: 100.0,
            sigma2: 1.0,
            zeta2: 0.5,
        };
        BoundInputs {
            tasks: vec![task.clone(), task],
            lr: 0.001,
            smoothness: 1.0,
            pl: 0.5,
            delta0: 1.0,
            last_constant: 5.0,
            chi: ChiSquare::AsPrinted,
        }
    }

    #[test]
    fn the_bound_of_a_hand_computed_case() {
        // S = 2·0.5·10·(1/100 + 3·2·0.5/100) = 0.4; stability = 8·2·1e-6·0.4 = 6.4e-6.
        // A1 = 1, A2 = 9, A3 = 90, N K̄ = 20: ε = 4/√20 + 4·1/(2√20) + 6·2·9/(2·10) + 5·2·0.5·90/10.
        let b = bound(&two_tasks());
        let eps = 4.0 / 20f64.sqrt() + 2.0 / 20f64.sqrt() + 5.4 + 45.0;
        assert!((b.stability - 6.4e-6).abs() < 1e-15);
        assert!((b.eps_sgd - eps).abs() < 1e-12);
        assert_eq!(b.chi2, 0.0);
        assert!((b.optimisation - 2.0 * eps).abs() < 1e-12, "(2C+1)(χ²+1)ε with χ² = 0");
        assert!(b.warnings.is_empty(), "{:?}", b.warnings);
        // The appendix constant 12 changes only the last term: +7·2·0.5·90/10 = +63.
        let mut twelve = two_tasks();
        twelve.last_constant = 12.0;
        assert!((bound(&twelve).eps_sgd - (eps + 63.0)).abs() < 1e-9);
    }

    #[test]
    fn violated_side_conditions_are_reported() {
        let mut i = two_tasks();
        i.lr = 0.1; // > 1/(8·10·1) = 0.0125
        i.tasks[0].batch = 80.0; // b/n = 0.8
        i.tasks[1].lambda = 0.0;
        let b = bound(&i);
        assert!(b.chi2.is_infinite());
        let all = b.warnings.join("\n");
        for needle in ["Assumption 4", "1/(8 K L)", "b_i/n_i", "infinite"] {
            assert!(all.contains(needle), "{needle} missing in {all}");
        }
    }
}
