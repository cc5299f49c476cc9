//! CMA-ES, the covariance matrix adaptation evolution strategy, as in N. Hansen, "The CMA
//! Evolution Strategy: A Tutorial" (2016), Algorithm 1 with positive recombination weights:
//! minimises a function of a few dozen variables from its values alone, which is what a
//! search over merge coefficients scored by an evaluator needs (mergekit-evolve does the same
//! with the `cma` package). Ask for a population, tell their values, repeat.

use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::rng::SplitMix64;

/// The state of one CMA-ES run (minimisation).
#[derive(Clone, Debug)]
pub struct CmaEs {
    n: usize,
    lambda: usize,
    weights: Vec<f64>,
    mu_eff: f64,
    c_sigma: f64,
    d_sigma: f64,
    c_c: f64,
    c_1: f64,
    c_mu: f64,
    chi_n: f64,
    mean: Vec<f64>,
    sigma: f64,
    p_sigma: Vec<f64>,
    p_c: Vec<f64>,
    /// Covariance, row-major n × n.
    cov: Vec<f64>,
    /// Eigenvectors of `cov` (columns, row-major) and the square roots of its eigenvalues.
    b: Vec<f64>,
    d: Vec<f64>,
    generation: usize,
    rng: SplitMix64,
    /// The standard normal draws of the last population (to rebuild its steps).
    pending: Vec<Vec<f64>>,
}

impl CmaEs {
    /// A run from `mean` with step size `sigma` (about a quarter of the search range is a good
    /// start); `population` candidates a generation (default 4 + ⌊3 ln n⌋); draws from `seed`.
    pub fn new(mean: Vec<f64>, sigma: f64, population: Option<usize>, seed: u64) -> Result<CmaEs> {
        let n = mean.len();
        if n == 0 || !(sigma.is_finite() && sigma > 0.0) || mean.iter().any(|m| !m.is_finite()) {
            return Err(EngineError::Param(format!(
                "CMA-ES needs at least one finite variable and a positive step size (got {n} variables, σ = {sigma})"
            )));
        }
        let nf = n as f64;
        let lambda = population.unwrap_or(4 + (3.0 * nf.ln()).floor() as usize).max(2);
        let mu = lambda / 2;
        let raw: Vec<f64> = (1..=mu)
            .map(|i| ((lambda as f64 + 1.0) / 2.0).ln() - (i as f64).ln())
            .collect();
        let total: f64 = raw.iter().sum();
        let weights: Vec<f64> = raw.iter().map(|w| w / total).collect();
        let mu_eff = 1.0 / weights.iter().map(|w| w * w).sum::<f64>();
        let c_sigma = (mu_eff + 2.0) / (nf + mu_eff + 5.0);
        let d_sigma = 1.0 + 2.0 * (((mu_eff - 1.0) / (nf + 1.0)).sqrt() - 1.0).max(0.0) + c_sigma;
        let c_c = (4.0 + mu_eff / nf) / (nf + 4.0 + 2.0 * mu_eff / nf);
        let c_1 = 2.0 / ((nf + 1.3).powi(2) + mu_eff);
        let c_mu = (1.0 - c_1).min(2.0 * (mu_eff - 2.0 + 1.0 / mu_eff) / ((nf + 2.0).powi(2) + mu_eff));
        let chi_n = nf.sqrt() * (1.0 - 1.0 / (4.0 * nf) + 1.0 / (21.0 * nf * nf));
        let identity: Vec<f64> = (0..n * n).map(|k| if k / n == k % n { 1.0 } else { 0.0 }).collect();
        Ok(CmaEs {
            n,
            lambda,
            weights,
            mu_eff,
            c_sigma,
            d_sigma,
            c_c,
            c_1,
            c_mu,
            chi_n,
            mean,
            sigma,
            p_sigma: vec![0.0; n],
            p_c: vec![0.0; n],
            cov: identity.clone(),
            b: identity,
            d: vec![1.0; n],
            generation: 0,
            rng: SplitMix64::new(seed),
            pending: Vec::new(),
        })
    }

    /// Candidates per generation.
    pub fn population(&self) -> usize {
        self.lambda
    }

    /// The distribution's mean (the current estimate of the optimum).
    pub fn mean(&self) -> &[f64] {
        &self.mean
    }

    /// The overall step size σ.
    pub fn sigma(&self) -> f64 {
        self.sigma
    }

    /// Generations told so far.
    pub fn generation(&self) -> usize {
        self.generation
    }

    /// The next population: `population()` points x = m + σ·B·D·z, z ~ N(0, I).
    pub fn ask(&mut self) -> Vec<Vec<f64>> {
        let n = self.n;
        self.pending = (0..self.lambda)
            .map(|_| (0..n).map(|_| self.rng.normal()).collect())
            .collect();
        self.pending
            .iter()
            .map(|z| {
                let y = self.bdz(z);
                (0..n).map(|i| self.mean[i] + self.sigma * y[i]).collect()
            })
            .collect()
    }

    /// B·D·z.
    fn bdz(&self, z: &[f64]) -> Vec<f64> {
        let n = self.n;
        (0..n)
            .map(|i| (0..n).map(|j| self.b[i * n + j] * self.d[j] * z[j]).sum())
            .collect()
    }

    /// Updates the distribution with the values of the population `ask` gave, in its order
    /// (lower is better; a non-finite value ranks last).
    pub fn tell(&mut self, values: &[f64]) -> Result<()> {
        let n = self.n;
        if values.len() != self.pending.len() || self.pending.is_empty() {
            return Err(EngineError::Bug(format!(
                "CMA-ES was told {} values for a population of {}",
                values.len(),
                self.pending.len()
            )));
        }
        let mut order: Vec<usize> = (0..values.len()).collect();
        let key = |v: f64| if v.is_finite() { v } else { f64::INFINITY };
        order.sort_by(|a, b| key(values[*a]).total_cmp(&key(values[*b])));
        let steps: Vec<Vec<f64>> = order
            .iter()
            .take(self.weights.len())
            .map(|&k| self.bdz(&self.pending[k]))
            .collect();
        // y_w = Σ w_i y_i:λ, and the mean moves by σ·y_w.
        let y_w: Vec<f64> = (0..n)
            .map(|i| self.weights.iter().zip(&steps).map(|(w, y)| w * y[i]).sum())
            .collect();
        for (m, y) in self.mean.iter_mut().zip(&y_w) {
            *m += self.sigma * y;
        }
        // C^{-1/2}·y_w = B·D⁻¹·Bᵀ·y_w.
        let bt_y: Vec<f64> = (0..n)
            .map(|j| (0..n).map(|i| self.b[i * n + j] * y_w[i]).sum::<f64>() / self.d[j])
            .collect();
        let c_inv_sqrt_y: Vec<f64> = (0..n)
            .map(|i| (0..n).map(|j| self.b[i * n + j] * bt_y[j]).sum())
            .collect();
        let cs = (self.c_sigma * (2.0 - self.c_sigma) * self.mu_eff).sqrt();
        for (p, y) in self.p_sigma.iter_mut().zip(&c_inv_sqrt_y) {
            *p = (1.0 - self.c_sigma) * *p + cs * y;
        }
        let ps_norm = self.p_sigma.iter().map(|v| v * v).sum::<f64>().sqrt();
        self.generation += 1;
        let h_sigma = ps_norm / (1.0 - (1.0 - self.c_sigma).powi(2 * self.generation as i32)).sqrt()
            < (1.4 + 2.0 / (n as f64 + 1.0)) * self.chi_n;
        let cc = (self.c_c * (2.0 - self.c_c) * self.mu_eff).sqrt();
        for (p, y) in self.p_c.iter_mut().zip(&y_w) {
            *p = (1.0 - self.c_c) * *p + if h_sigma { cc * y } else { 0.0 };
        }
        let delta = if h_sigma { 0.0 } else { self.c_c * (2.0 - self.c_c) };
        let keep = 1.0 - self.c_1 - self.c_mu;
        for i in 0..n {
            for j in 0..n {
                let rank_mu: f64 = self.weights.iter().zip(&steps).map(|(w, y)| w * y[i] * y[j]).sum();
                let c = &mut self.cov[i * n + j];
                *c = keep * *c + self.c_1 * (self.p_c[i] * self.p_c[j] + delta * *c) + self.c_mu * rank_mu;
            }
        }
        self.sigma *= ((self.c_sigma / self.d_sigma) * (ps_norm / self.chi_n - 1.0)).exp();
        self.decompose()?;
        self.pending.clear();
        Ok(())
    }

    /// B and D from the (symmetrised) covariance.
    fn decompose(&mut self) -> Result<()> {
        let n = self.n;
        let c = faer::Mat::<f64>::from_fn(n, n, |i, j| 0.5 * (self.cov[i * n + j] + self.cov[j * n + i]));
        let eig = c.self_adjoint_eigen(faer::Side::Lower).map_err(|e| {
            EngineError::Invalid(format!(
                "CMA-ES: the covariance's eigen-decomposition did not converge: {e:?}"
            ))
        })?;
        let (u, s) = (eig.U(), eig.S().column_vector());
        for j in 0..n {
            self.d[j] = s[j].max(1e-20).sqrt();
            for i in 0..n {
                self.b[i * n + j] = u[(i, j)];
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs CMA-ES on `f` for `generations` and returns the best point seen and its value.
    fn minimise(f: impl Fn(&[f64]) -> f64, x0: Vec<f64>, sigma: f64, generations: usize, seed: u64) -> (Vec<f64>, f64) {
        let mut es = CmaEs::new(x0, sigma, None, seed).unwrap();
        let mut best = (Vec::new(), f64::INFINITY);
        for _ in 0..generations {
            let xs = es.ask();
            let vs: Vec<f64> = xs.iter().map(|x| f(x)).collect();
            for (x, v) in xs.iter().zip(&vs) {
                if *v < best.1 {
                    best = (x.clone(), *v);
                }
            }
            es.tell(&vs).unwrap();
        }
        best
    }

    #[test]
    fn finds_the_minimum_of_a_shifted_sphere() {
        let target = [0.3, -1.2, 2.0, 0.7, -0.4];
        let f = |x: &[f64]| x.iter().zip(&target).map(|(a, b)| (a - b).powi(2)).sum::<f64>();
        let (x, v) = minimise(f, vec![0.0; 5], 1.0, 150, 1);
        assert!(v < 1e-10, "f = {v}");
        for (a, b) in x.iter().zip(&target) {
            assert!((a - b).abs() < 1e-4, "{x:?}");
        }
    }

    /// An ill-conditioned ellipsoid (condition 10⁶) needs the covariance to adapt.
    #[test]
    fn adapts_to_an_ill_conditioned_ellipsoid() {
        let n = 6;
        let f = |x: &[f64]| {
            x.iter()
                .enumerate()
                .map(|(i, v)| 1e6f64.powf(i as f64 / (n - 1) as f64) * v * v)
                .sum::<f64>()
        };
        let (_, v) = minimise(f, vec![1.0; n], 0.5, 400, 2);
        assert!(v < 1e-8, "f = {v}");
    }

    /// Rosenbrock's valley: the minimum (1, 1, 1, 1) at 0.
    #[test]
    fn follows_rosenbrocks_valley() {
        let f = |x: &[f64]| {
            x.windows(2)
                .map(|w| 100.0 * (w[1] - w[0] * w[0]).powi(2) + (1.0 - w[0]).powi(2))
                .sum::<f64>()
        };
        let (x, v) = minimise(f, vec![0.0; 4], 0.5, 600, 3);
        assert!(v < 1e-8, "f = {v} at {x:?}");
        assert!(x.iter().all(|xi| (xi - 1.0).abs() < 1e-3), "{x:?}");
    }

    #[test]
    fn the_same_seed_gives_the_same_run() {
        let f = |x: &[f64]| x.iter().map(|v| (v - 0.5).powi(2)).sum::<f64>();
        assert_eq!(
            minimise(f, vec![0.0; 3], 0.3, 20, 9),
            minimise(f, vec![0.0; 3], 0.3, 20, 9)
        );
        assert_ne!(
            minimise(f, vec![0.0; 3], 0.3, 20, 9).0,
            minimise(f, vec![0.0; 3], 0.3, 20, 10).0
        );
    }

    #[test]
    fn bad_starts_are_refused() {
        assert!(CmaEs::new(vec![], 1.0, None, 0).is_err());
        assert!(CmaEs::new(vec![0.0], 0.0, None, 0).is_err());
        let mut es = CmaEs::new(vec![0.0, 0.0], 1.0, None, 0).unwrap();
        let xs = es.ask();
        assert_eq!(xs.len(), es.population());
        assert!(es.tell(&[1.0]).is_err());
    }
}
