//! The numeric core of Frank-Wolfe merging, on plain numbers: the linear minimisation oracle,
//! the step size, the FW gap and the simplex weights of the soft variant.

use mergescope_plugin_api::model::Adam;

/// The step size γ_t = scale · 2/(t+2), t counted from 0 (γ_0 = scale).
#[derive(Clone, Copy, Debug)]
pub struct StepRule {
    /// Multiplier (1 in the paper; 0.1·0.3 = 0.03 in FusionBench).
    pub scale: f64,
}

impl StepRule {
    /// γ_t.
    pub fn gamma(&self, t: usize) -> f64 {
        self.scale * 2.0 / (t as f64 + 2.0)
    }
}

/// Index of the smallest score (the first on ties).
pub fn argmin(scores: &[f64]) -> usize {
    let mut best = 0;
    for (i, s) in scores.iter().enumerate() {
        if *s < scores[best] {
            best = i;
        }
    }
    best
}

/// The `k` smallest scores' indices, best first (ties by index).
pub fn top_k_smallest(scores: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|a, b| scores[*a].total_cmp(&scores[*b]).then(a.cmp(b)));
    idx.truncate(k);
    idx
}

/// Layer-wise LMO: per tensor p, the expert with the most negative `d[i][p]` = ⟨g_p, θ_i,p − θ_p⟩,
/// or `None` when no expert lowers the loss to first order there (the tensor is left alone).
pub fn layer_lmo(d: &[Vec<f64>]) -> Vec<Option<usize>> {
    let n_tensors = d.first().map_or(0, Vec::len);
    (0..n_tensors)
        .map(|p| {
            let col: Vec<f64> = d.iter().map(|row| row[p]).collect();
            let i = argmin(&col);
            (col[i] < 0.0).then_some(i)
        })
        .collect()
}

/// The FW gap max_i ⟨g, θ − θ_i⟩ = −min_i Σ_p d[i][p] (≥ 0 when θ is in the hull).
pub fn fw_gap(d: &[Vec<f64>]) -> f64 {
    let totals: Vec<f64> = d.iter().map(|row| row.iter().sum()).collect();
    if totals.is_empty() {
        return 0.0;
    }
    -totals[argmin(&totals)]
}

/// Weights on the simplex {λ ≥ 0, Σλ = 1} (or {λ ≥ 0, Σλ ≤ 1} when `capped`: an extra slack
/// weight stands for the current model), parametrised by a softmax so that Adam runs
/// unconstrained. Projected Adam has spurious fixed points: its per-coordinate normalisation
/// turns any gradient with same-sign coordinates into a step the projection undoes.
#[derive(Clone, Debug)]
pub struct SimplexWeights {
    logits: Vec<f64>,
    capped: bool,
}

impl SimplexWeights {
    /// `k` equal weights: 1/(k+1) each when capped (the slack gets the rest), else 1/k.
    pub fn new(k: usize, capped: bool) -> SimplexWeights {
        SimplexWeights {
            logits: vec![0.0; k + usize::from(capped)],
            capped,
        }
    }

    /// The unconstrained parameters Adam updates.
    pub fn logits_mut(&mut self) -> &mut [f64] {
        &mut self.logits
    }

    fn softmax(&self) -> Vec<f64> {
        let m = self.logits.iter().fold(f64::NEG_INFINITY, |a, b| a.max(*b));
        let e: Vec<f64> = self.logits.iter().map(|z| (z - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    /// The k weights λ (without the slack).
    pub fn lambda(&self) -> Vec<f64> {
        let p = self.softmax();
        if self.capped { p[1..].to_vec() } else { p }
    }

    /// The gradient with respect to the logits of a loss whose gradient with respect to λ is
    /// `grad` (the slack's is 0): ∂ℓ/∂z_i = p_i (g_i − Σ_j p_j g_j).
    pub fn logit_gradient(&self, grad: &[f64]) -> Vec<f64> {
        let p = self.softmax();
        let g: Vec<f64> = if self.capped {
            std::iter::once(0.0).chain(grad.iter().copied()).collect()
        } else {
            grad.to_vec()
        };
        let mean: f64 = p.iter().zip(&g).map(|(a, b)| a * b).sum();
        p.iter().zip(&g).map(|(pi, gi)| pi * (gi - mean)).collect()
    }
}

/// The soft step's weights λ over the chosen vertices.
#[derive(Clone, Debug)]
pub enum SoftWeights {
    /// On a simplex, through softmax logits ([`SimplexWeights`]).
    Simplex(SimplexWeights),
    /// Unconstrained, as FusionBench's soft Frank-Wolfe has them (it never projects): λ itself,
    /// from 0 (the current model). The step may leave the experts' convex hull, as task
    /// arithmetic's λ does.
    Free(Vec<f64>),
}

impl SoftWeights {
    /// The k weights λ.
    pub fn lambda(&self) -> Vec<f64> {
        match self {
            SoftWeights::Simplex(w) => w.lambda(),
            SoftWeights::Free(l) => l.clone(),
        }
    }

    /// The unconstrained parameters Adam updates (logits, or λ itself).
    pub fn params_mut(&mut self) -> &mut [f64] {
        match self {
            SoftWeights::Simplex(w) => w.logits_mut(),
            SoftWeights::Free(l) => l,
        }
    }

    /// The gradient with respect to the parameters of a loss whose gradient with respect to λ
    /// is `grad`.
    pub fn param_gradient(&self, grad: &[f64]) -> Vec<f64> {
        match self {
            SoftWeights::Simplex(w) => w.logit_gradient(grad),
            SoftWeights::Free(_) => grad.to_vec(),
        }
    }
}

/// The group of tensor `p` among `n_groups` groups of soft weights: the only one, or its own.
pub fn group_of(n_groups: usize, p: usize) -> usize {
    if n_groups == 1 { 0 } else { p }
}

/// The soft step's λ with their Adam state: one set of k weights for the whole model
/// (granularity task) or one per tensor (granularity layer, as in FusionBench's soft step, whose
/// inner AdaMerging learns a weight per vertex and parameter tensor).
#[derive(Clone, Debug)]
pub struct GroupedWeights {
    groups: Vec<(SoftWeights, Adam)>,
}

impl GroupedWeights {
    /// `n_groups` copies of `start` (1 for task-wise weights, the tensor count for layer-wise),
    /// each stepped by its own Adam at learning rate `lr`.
    pub fn new(start: &SoftWeights, n_groups: usize, lr: f64) -> GroupedWeights {
        let group = || {
            let mut w = start.clone();
            let n = w.params_mut().len();
            (w, Adam::new(n, lr))
        };
        GroupedWeights {
            groups: (0..n_groups.max(1)).map(|_| group()).collect(),
        }
    }

    /// λ per group: `lambda()[g][j]` is vertex j's weight in group g.
    pub fn lambda(&self) -> Vec<Vec<f64>> {
        self.groups.iter().map(|(w, _)| w.lambda()).collect()
    }

    /// One Adam step from `grad[j][p]` = ∂ℓ/∂λ_j restricted to tensor p (⟨∇_p ℓ, s_j,p − θ_p⟩):
    /// a group's gradient sums its tensors' terms.
    pub fn step(&mut self, grad: &[Vec<f64>]) {
        let mut per_group = vec![vec![0.0; grad.len()]; self.groups.len()];
        for (j, row) in grad.iter().enumerate() {
            for (p, g) in row.iter().enumerate() {
                per_group[group_of(self.groups.len(), p)][j] += g;
            }
        }
        for ((w, adam), g) in self.groups.iter_mut().zip(&per_group) {
            let gp = w.param_gradient(g);
            adam.step(w.params_mut(), &gp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
    }

    /// G-F1 of seeds-000-001 §6: θ = (W = I, b = 0), g = ([[1,−1],[0,2]], (1,0)), pool θ_1..θ_3.
    fn g_f1() -> Vec<Vec<f64>> {
        // d[i][p] = ⟨g_p, θ_i,p⟩ − ⟨g_p, θ_p⟩ with ⟨g_W, I⟩ = 3, ⟨g_b, 0⟩ = 0.
        let g_w = [1.0, -1.0, 0.0, 2.0];
        let g_b = [1.0, 0.0];
        let pool = [
            ([2.0, 0.0, 0.0, 0.0], [1.0, 1.0]),
            ([0.0, 1.0, 1.0, 0.0], [-1.0, 0.0]),
            ([1.0, 0.0, 0.0, -2.0], [0.0, 2.0]),
        ];
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        pool.iter()
            .map(|(w, b)| vec![dot(&g_w, w) - 3.0, dot(&g_b, b)])
            .collect()
    }

    #[test]
    fn g_f1_task_wise_lmo_picks_theta3_with_gap_6() {
        let d = g_f1();
        // Raw scores ⟨g, θ_i⟩ are 3, −2, −3 and ⟨g, θ⟩ = 3: the differences are 0, −5, −6.
        let totals: Vec<f64> = d.iter().map(|r| r.iter().sum()).collect();
        assert!(close(&totals, &[0.0, -5.0, -6.0], 1e-12), "{totals:?}");
        assert_eq!(argmin(&totals), 2);
        assert!((fw_gap(&d) - 6.0).abs() < 1e-12);
    }

    #[test]
    fn g_f1_layer_wise_lmo_picks_theta3_for_w_and_theta2_for_b() {
        // W scores 2, −1, −3 (minus 3) and b scores 1, −1, 0.
        assert_eq!(layer_lmo(&g_f1()), vec![Some(2), Some(1)]);
    }

    #[test]
    fn g_f1_updates_at_t1() {
        // γ_1 = 2/3; task-wise: θ + γ(θ_3 − θ) gives W = [[1,0],[0,−1]], b = (0, 4/3).
        let gamma = StepRule { scale: 1.0 }.gamma(1);
        assert!((gamma - 2.0 / 3.0).abs() < 1e-15);
        let w: Vec<f64> = [1.0, 0.0, 0.0, 1.0]
            .iter()
            .zip([1.0, 0.0, 0.0, -2.0])
            .map(|(a, s)| a + gamma * (s - a))
            .collect();
        assert!(close(&w, &[1.0, 0.0, 0.0, -1.0], 1e-12));
        let b: Vec<f64> = [0.0, 0.0]
            .iter()
            .zip([0.0, 2.0])
            .map(|(a, s)| a + gamma * (s - a))
            .collect();
        assert!(close(&b, &[0.0, 4.0 / 3.0], 1e-12));
        // FusionBench's multiplier 0.1·0.3 at t = 1: γ = 0.02.
        assert!((StepRule { scale: 0.03 }.gamma(1) - 0.02).abs() < 1e-15);
        assert_eq!(StepRule { scale: 1.0 }.gamma(0), 1.0);
    }

    #[test]
    fn simplex_weights_start_equal_and_stay_on_the_simplex() {
        let mut w = SimplexWeights::new(3, true);
        assert!(close(&w.lambda(), &[0.25, 0.25, 0.25], 1e-12));
        assert!(close(&SimplexWeights::new(2, false).lambda(), &[0.5, 0.5], 1e-12));
        w.logits_mut().copy_from_slice(&[-1.0, 3.0, 0.5, -7.0]);
        let l = w.lambda();
        assert!(l.iter().all(|x| *x >= 0.0) && l.iter().sum::<f64>() < 1.0);
        // Finite-difference check of the chain rule on ℓ(λ) = Σ c_i λ_i.
        let c = [0.3, -1.2, 2.0];
        let loss = |w: &SimplexWeights| w.lambda().iter().zip(&c).map(|(a, b)| a * b).sum::<f64>();
        let g = w.logit_gradient(&c);
        for (i, gi) in g.iter().enumerate() {
            let mut w2 = w.clone();
            w2.logits_mut()[i] += 1e-6;
            let fd = (loss(&w2) - loss(&w)) / 1e-6;
            assert!((fd - gi).abs() < 1e-5, "logit {i}: {fd} vs {gi}");
        }
    }

    /// G-F3: ℓ(θ) = ½‖θ − (1, 0.5)‖² from θ = 0 with pool (2,0), (0,2), (−1,−1). The top-2 LMO
    /// picks s_1, s_2; soft FW with Σλ = 1 lands on (1.25, 0.75), with Σλ ≤ 1 on the optimum
    /// (1, 0.5); hard FW on s_1 = (2, 0).
    #[test]
    fn g_f3_soft_versus_hard() {
        let target = [1.0, 0.5];
        let pool = [[2.0, 0.0], [0.0, 2.0], [-1.0, -1.0]];
        let g = [-target[0], -target[1]]; // ∇ℓ(0) = 0 − target
        let scores: Vec<f64> = pool.iter().map(|s| g[0] * s[0] + g[1] * s[1]).collect();
        assert!(close(&scores, &[-2.0, -1.0, 1.5], 1e-12));
        let picks = top_k_smallest(&scores, 2);
        assert_eq!(picks, vec![0, 1]);
        assert_eq!(pool[argmin(&scores)], [2.0, 0.0]);
        let solve = |capped: bool| {
            let mut w = SimplexWeights::new(2, capped);
            let mut adam = Adam::new(2 + usize::from(capped), 0.05);
            for _ in 0..5000 {
                let lambda = w.lambda();
                let theta = [
                    lambda[0] * pool[0][0] + lambda[1] * pool[1][0],
                    lambda[0] * pool[0][1] + lambda[1] * pool[1][1],
                ];
                let r = [theta[0] - target[0], theta[1] - target[1]];
                let grad: Vec<f64> = picks.iter().map(|&j| r[0] * pool[j][0] + r[1] * pool[j][1]).collect();
                let gz = w.logit_gradient(&grad);
                adam.step(w.logits_mut(), &gz);
            }
            w.lambda()
        };
        assert!(close(&solve(false), &[0.625, 0.375], 2e-3), "{:?}", solve(false));
        assert!(close(&solve(true), &[0.5, 0.25], 2e-3), "{:?}", solve(true));
    }

    /// Beyond G-F3: target (2, 1) from θ = 0 with vertices (2, 0) and (0, 2). Free weights reach
    /// it, λ = (1, 0.5) (Σλ = 1.5, outside the hull); Σλ ≤ 1 stops on the hull's edge at its
    /// projection λ = (0.75, 0.25), loss ½(0.5² + 0.5²) = 0.25.
    #[test]
    fn free_weights_leave_the_hull_where_the_simplex_cannot() {
        let target = [2.0, 1.0];
        let solve = |mut w: SoftWeights| {
            let mut adam = Adam::new(w.params_mut().len(), 0.05);
            for _ in 0..5000 {
                let l = w.lambda();
                let r = [2.0 * l[0] - target[0], 2.0 * l[1] - target[1]];
                let grad = [2.0 * r[0], 2.0 * r[1]];
                let gp = w.param_gradient(&grad);
                adam.step(w.params_mut(), &gp);
            }
            w.lambda()
        };
        let free = solve(SoftWeights::Free(vec![0.0; 2]));
        assert!(close(&free, &[1.0, 0.5], 1e-3), "{free:?}");
        let capped = solve(SoftWeights::Simplex(SimplexWeights::new(2, true)));
        assert!(close(&capped, &[0.75, 0.25], 1e-2), "{capped:?}");
        assert!(capped.iter().sum::<f64>() <= 1.0);
    }

    /// Two tensors (one number each) from θ = 0 towards one vertex s = (2, 2), target (2, 1),
    /// ℓ = ½ Σ_p (λ_p s_p − t_p)². Layer-wise free weights fit each tensor, λ = (1, 0.5), loss 0;
    /// one task-wise λ can only fit both at once: λ = 0.75, loss ½(0.5² + 0.5²) = 0.25.
    #[test]
    fn layer_wise_weights_fit_each_tensor_where_one_weight_cannot() {
        let (s, target) = ([2.0, 2.0], [2.0, 1.0]);
        let solve = |n_groups: usize| {
            let mut w = GroupedWeights::new(&SoftWeights::Free(vec![0.0]), n_groups, 0.05);
            for _ in 0..5000 {
                let lambda = w.lambda();
                let grad: Vec<Vec<f64>> = vec![
                    (0..2)
                        .map(|p| (lambda[group_of(lambda.len(), p)][0] * s[p] - target[p]) * s[p])
                        .collect(),
                ];
                w.step(&grad);
            }
            w.lambda()
        };
        let layer = solve(2);
        assert_eq!(layer.len(), 2);
        assert!(close(&[layer[0][0], layer[1][0]], &[1.0, 0.5], 1e-3), "{layer:?}");
        let task = solve(1);
        assert_eq!(task.len(), 1);
        assert!(close(&task[0], &[0.75], 1e-3), "{task:?}");
    }
}
