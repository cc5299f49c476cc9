//! `wudi`: "Whoever Started the Interference Should End It: Guiding Data-Free Model Merging via
//! Task Vectors" (Cheng et al., ICML 2025), as FusionBench 0.2.33's `wudi.wudi_merging` computes
//! it: per matrix, Adam on the merged task vector against the task vectors' interference.

use mergescope_plugin_api::abi::{CAP_NEEDS_BASE, CAP_THREAD_SAFE};
use mergescope_plugin_api::sdk::subspace;
use mergescope_plugin_api::{
    CreateContext, Descriptor, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "WUDI (Cheng et al., ICML 2025): data-free merging that removes the interference the task \
vectors themselves define. With the task vectors τ_t = θ_t − θ0 of T experts:\n\
- every 2-D tensor: starting from τ = Σ_t τ_t, `iterations` Adam steps (learning rate `lr`, \
β = (0.9, 0.999), ε = 1e-8, as torch.optim.Adam) minimise\n\
  L(τ) = Σ_t ‖(τ − τ_t)·τ_tᵀ‖²_F / ‖τ_t‖²_F,\n\
  the interference of the merged update with each task's own input directions (the rows of τ_t \
span the inputs the task was trained on); then θ = θ0 + λ·τ.\n\
- every other tensor: θ = θ0 + λ·(1/T)·Σ_t τ_t.\n\
Parameters:\n\
- iterations (default 400, FusionBench's `iter_num`): Adam steps per matrix; 0 gives task \
arithmetic with λ = 1 on matrices.\n\
- lr (default 1e-5, > 0): Adam's learning rate (fixed in FusionBench).\n\
- lambda (default 1.0): scaling of the merged task vector (FusionBench adds it unscaled).\n\
The gradient 2·Σ_t (τ − τ_t)·τ_tᵀτ_t/‖τ_t‖² is computed as 2·(τ·A − B) with A = Σ_t τ_tᵀτ_t/‖τ_t‖² \
(n×n) and B = Σ_t τ_t·τ_tᵀτ_t/‖τ_t‖², one m×n×n product per step; when n > 2·T·m the m×m form \
Σ_t (τ·τ_tᵀ)·τ_t/‖τ_t‖² − B is used instead. A task vector that is 0 on a matrix adds nothing to \
L (the reference divides by 0 there). Cost: iterations × that product per matrix, which bounds WUDI \
on large models (an embedding of 32000×2048 takes 400 × 0.27 TFLOP). Progress is reported and \
cancel checked at every step.\n\
Reference: FusionBench 0.2.33, method/wudi/wudi.py::wudi_merging, then WUDIMerging.run's θ0 + τ.";

/// The WUDI method.
pub struct Wudi {
    iterations: usize,
    lr: f64,
    lambda: f64,
}

/// torch.optim.Adam's state and step for one f32 parameter (no weight decay, no amsgrad).
struct Adam {
    lr: f64,
    step: i32,
    m: Vec<f32>,
    v: Vec<f32>,
}

impl Adam {
    const BETA1: f64 = 0.9;
    const BETA2: f64 = 0.999;
    const EPS: f64 = 1e-8;

    fn new(len: usize, lr: f64) -> Self {
        Adam {
            lr,
            step: 0,
            m: vec![0.0; len],
            v: vec![0.0; len],
        }
    }

    /// One step of `param` along `grad`, in torch's order of operations.
    fn step(&mut self, param: &mut [f32], grad: &[f32]) {
        self.step += 1;
        let bias1 = 1.0 - Self::BETA1.powi(self.step);
        let bias2_sqrt = (1.0 - Self::BETA2.powi(self.step)).sqrt();
        let step_size = -(self.lr / bias1) as f32;
        let w1 = (1.0 - Self::BETA1) as f32;
        let (b2, w2) = (Self::BETA2 as f32, (1.0 - Self::BETA2) as f32);
        let inv_bias2 = (1.0 / bias2_sqrt) as f32;
        let eps = Self::EPS as f32;
        for (((p, g), m), v) in param.iter_mut().zip(grad).zip(&mut self.m).zip(&mut self.v) {
            *m += w1 * (g - *m);
            *v = *v * b2 + w2 * g * g;
            let denom = v.sqrt() * inv_bias2 + eps;
            *p += step_size * *m / denom;
        }
    }
}

/// The interference gradient's fixed parts for one matrix.
struct Interference {
    /// A = Σ_t τ_tᵀτ_t/‖τ_t‖² (n×n), or the task vectors' transposes scaled by 1/‖τ_t‖² with
    /// the task vectors themselves (m×m form).
    form: Form,
    /// B = Σ_t τ_t·τ_tᵀτ_t/‖τ_t‖² (m×n).
    b: Vec<f32>,
}

enum Form {
    Gram(Tensor),
    Rows(Vec<(Tensor, Tensor)>),
}

impl Interference {
    /// The fixed parts for the task vectors `taus` of an m×n matrix; `None` when every one is 0
    /// there, so that the loss is 0 for every τ and Adam would not move (its first and second
    /// moments stay 0).
    fn new(host: &Host<'_>, taus: &[Tensor], m: usize, n: usize) -> Result<Option<Self>> {
        let mut grams = Vec::new();
        let mut b_terms = Vec::new();
        let mut weights = Vec::new();
        let mut rows = Vec::new();
        let gram_form = n <= 2 * taus.len().max(1) * m;
        for &tau in taus {
            let norm2 = host.dot(tau, tau)?;
            if norm2 == 0.0 {
                continue;
            }
            let tau_t = host.transpose(tau)?;
            let gram = host.matmul(tau_t, tau)?;
            b_terms.push(host.matmul(tau, gram)?);
            weights.push(1.0 / norm2);
            if gram_form {
                host.release(tau_t)?;
                grams.push(gram);
            } else {
                host.release(gram)?;
                rows.push((host.scale(tau_t, 1.0 / norm2)?, tau));
                host.release(tau_t)?;
            }
        }
        if b_terms.is_empty() {
            return Ok(None);
        }
        let b_sum = host.weighted_sum(&b_terms, Some(&weights))?;
        let b = host.read_f32(b_sum)?;
        for t in b_terms.into_iter().chain([b_sum]) {
            host.release(t)?;
        }
        let form = if gram_form {
            let a = host.weighted_sum(&grams, Some(&weights))?;
            for g in grams {
                host.release(g)?;
            }
            Form::Gram(a)
        } else {
            Form::Rows(rows)
        };
        Ok(Some(Interference { form, b }))
    }

    /// ∇L at `tau` (m×n, row-major) into `grad`.
    fn gradient(&self, host: &Host<'_>, tau: &[f32], shape: &[usize], grad: &mut [f32]) -> Result<()> {
        let current = host.from_f32(tau, shape)?;
        let first = match &self.form {
            Form::Gram(a) => host.matmul(current, *a)?,
            Form::Rows(rows) => {
                let mut terms = Vec::with_capacity(rows.len());
                for (scaled_t, task) in rows {
                    let overlap = host.matmul(current, *scaled_t)?;
                    terms.push(host.matmul(overlap, *task)?);
                    host.release(overlap)?;
                }
                let sum = host.weighted_sum(&terms, None)?;
                for t in terms {
                    host.release(t)?;
                }
                sum
            }
        };
        host.release(current)?;
        let data = host.view_f32(first)?;
        for ((g, x), b) in grad.iter_mut().zip(data.iter()).zip(&self.b) {
            *g = 2.0 * (x - b);
        }
        drop(data);
        host.release(first)
    }

    fn release(self, host: &Host<'_>) -> Result<()> {
        match self.form {
            Form::Gram(a) => host.release(a),
            Form::Rows(rows) => rows.into_iter().try_for_each(|(t, _)| host.release(t)),
        }
    }
}

impl MergeMethod for Wudi {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "wudi",
            name: "WUDI",
            version: "",
            description: "Data-free merging: Adam on each merged matrix against the interference its task vectors define.",
            help: HELP,
            capabilities: CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::int("iterations", 400, "Adam steps per matrix (FusionBench's iter_num).").min(0.0),
                ParamSpec::float("lr", 1e-5, "Adam's learning rate (greater than 0).").min(0.0),
                ParamSpec::float("lambda", 1.0, "Scaling λ of the merged task vector: θ = θ0 + λ·τ."),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        let lr = params.float_strictly_between(
            "lr",
            0.0,
            f64::INFINITY,
            "Adam needs a learning rate greater than 0 (FusionBench uses 1e-5); for no optimisation set iterations=0",
        )?;
        let iterations = params.int("iterations")?;
        Ok(Wudi {
            iterations: usize::try_from(iterations)
                .map_err(|_| format!("parameter 'iterations': {iterations} is negative"))?,
            lr,
            lambda: params.float("lambda")?,
        })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let all = input.base_and_experts("wudi")?;
        let (base, experts) = (all[0], &all[1..]);
        let shape = host.shape(base)?;
        let Some((m, n)) = subspace::matrix_shape(&shape) else {
            return subspace::base_plus_mean_task_vector(host, &all, self.lambda);
        };
        let start = subspace::task_vector_sum(host, &all)?;
        let mut tau = host.read_f32(start)?;
        host.release(start)?;
        if self.iterations > 0 {
            let taus = experts.iter().map(|e| host.sub(*e, base)).collect::<Result<Vec<_>>>()?;
            if let Some(interference) = Interference::new(host, &taus, m, n)? {
                let mut adam = Adam::new(tau.len(), self.lr);
                let mut grad = vec![0f32; tau.len()];
                for step in 0..self.iterations {
                    host.check_cancelled()?;
                    interference.gradient(host, &tau, &shape, &mut grad)?;
                    adam.step(&mut tau, &grad);
                    host.report_progress((step + 1) as f64 / self.iterations as f64);
                }
                interference.release(host)?;
            }
            for t in taus {
                host.release(t)?;
            }
        }
        let merged = host.from_f32(&tau, &shape)?;
        subspace::base_plus(host, base, merged, self.lambda)
    }
}

mergescope_plugin_api::export_plugin!(Wudi);

#[cfg(test)]
mod tests {
    use super::Adam;

    #[test]
    fn adams_first_step_moves_each_parameter_by_lr_against_its_gradient_sign() {
        // Step 1: m = 0.1·g, v = 0.001·g², bias-corrected m̂/√v̂ = g/|g| (up to ε).
        let mut adam = Adam::new(3, 0.01);
        let mut p = [1.0f32, 1.0, 1.0];
        adam.step(&mut p, &[0.5, -2.0, 0.0]);
        assert!((p[0] - 0.99).abs() < 1e-6, "{p:?}");
        assert!((p[1] - 1.01).abs() < 1e-6, "{p:?}");
        assert_eq!(p[2], 1.0);
    }
}
