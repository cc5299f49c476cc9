//! `adamerging`: AdaMerging (Yang et al., 2024), a model-level method, with the AdaMerging+CART
//! combination of seed 001 (Eq. 8). Merging coefficients λ (one per task, or one per task and
//! tensor) are learned by Adam on the prediction entropy of the merged model on unlabelled
//! calibration data; the gradient of the objective with respect to λ_t^p is ⟨∇_θp L, τ_t^p⟩.

use mergescope_plugin_api::abi::{self, CAP_NEEDS_BASE, ROLE_MATRIX};
use mergescope_plugin_api::model::{
    Adam, Granularity, ModelMethod, ObjectiveChoice, Session, Tasks, combine, dots, json_number, minibatch_param,
    minibatch_size,
};
use mergescope_plugin_api::{CreateContext, Descriptor, Error, Host, ParamSpec, Params, Result, Tensor};

const HELP: &str = "AdaMerging (Yang et al., ICLR 2024) and AdaMerging+CART (seed 001, Eq. 8).\n\
θ^p = anchor^p + Σ_t λ_t^p · τ_t^p, with\n\
- merge = task-arithmetic: anchor θ0 (the base), τ_t = θ_t − θ0;\n\
- merge = cart: anchor θ_avg (mean of the experts), τ_t = SVD_k(θ_t − θ_avg) on 2-D weight matrices \
(k = ⌈rank_ratio·min(m, n)⌉) and θ_t − θ_avg elsewhere.\n\
λ is one coefficient per task (granularity task) or per task and tensor (layer, the stronger \
variant), initialised to init (0.3, AdaMerging's value) or cart_init (1.0, CART's value), and \
learned by Adam (lr 1e-3, β = 0.9, 0.999) for steps (500) on the summed prediction entropy of the \
merged model on the tasks' calibration examples (the first 100 training images per task, labels \
unused; objective = cross-entropy uses the labels instead), one mini-batch of batch_size (16) \
examples per task and step, shuffled with the merge's seed and reshuffled every epoch (0: every \
calibration example in every step, full-batch). After each step λ is clamped to [0, 1] (clamp). \
The original minimises entropy on the test images in batches of 16 per task; mergescope never looks \
at test data, so its batches come from the calibration examples.\n\
The run reports an iterate every report_every steps (the step's mini-batch loss and mean λ; the last \
iterate's loss is over every calibration example), so it leaves a trajectory; a cancelled run keeps \
its last reported iterate.";

/// The AdaMerging method.
pub struct AdaMerging {
    layer_wise: bool,
    cart: bool,
    init: f64,
    lr: f64,
    steps: usize,
    clamp: bool,
    objective: abi::Objective,
    rank_ratio: f64,
    report_every: usize,
    batch_size: u64,
    seed: u64,
}

/// k = ⌈ratio·min(m, n)⌉ clamped to [0, min(m, n)], with the cart plugin's tolerance for
/// round-off (seed 001 digest, §1.7 item 1): the SDK's
/// [`rank_from_ratio`](mergescope_plugin_api::sdk::rank_from_ratio).
pub fn cart_rank(ratio: f64, m: usize, n: usize) -> usize {
    mergescope_plugin_api::sdk::rank_from_ratio(m.min(n), ratio)
}

mergescope_plugin_api::choice_enum! {
    /// What the coefficients scale.
    enum MergeOn {
        TaskArithmetic = "task-arithmetic",
        Cart = "cart",
    }
}

impl ModelMethod for AdaMerging {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "adamerging",
            name: "AdaMerging",
            version: "",
            description: "Learns task- or layer-wise merging coefficients by minimising prediction entropy (on TA or CART).",
            help: HELP,
            capabilities: CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::choice_of(
                    "granularity",
                    Granularity::Layer,
                    "One coefficient per task and tensor, or per task.",
                ),
                ParamSpec::choice_of(
                    "merge",
                    MergeOn::TaskArithmetic,
                    "What the coefficients scale: task vectors θ_t − θ0, or CART's low-rank centred deltas.",
                ),
                ParamSpec::float(
                    "init",
                    0.3,
                    "Initial λ with merge = task-arithmetic (AdaMerging's 0.3).",
                )
                .range(0.0, 1.0),
                ParamSpec::float(
                    "cart_init",
                    1.0,
                    "Initial λ with merge = cart (CART's 1.0; above 1 only with clamp = false, as CART's own λ search may pick).",
                )
                .range(0.0, 10.0),
                ParamSpec::float("lr", 1e-3, "Adam learning rate.").range(1e-6, 1.0),
                ParamSpec::int("steps", 500, "Adam steps.").range(1.0, 100000.0),
                minibatch_param(
                    "Calibration examples per task in each step (AdaMerging's 16); 0: all of them (full batch).",
                ),
                ParamSpec::bool("clamp", true, "Clamp λ to [0, 1] after each step."),
                ParamSpec::choice_of(
                    "objective",
                    ObjectiveChoice::Entropy,
                    "Prediction entropy (unlabelled, the original) or labelled cross-entropy.",
                ),
                ParamSpec::float("rank_ratio", 0.08, "CART: fraction of each matrix's rank kept.").range(0.0, 1.0),
                ParamSpec::int("report_every", 10, "Report an iterate every this many steps.").range(1.0, 100000.0),
            ],
        }
    }

    fn create(_host: &Host<'_>, p: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        let cart = p.choice_of::<MergeOn>("merge")? == MergeOn::Cart;
        let clamp = p.bool("clamp")?;
        let cart_init = p.float("cart_init")?;
        if cart && clamp && cart_init > 1.0 {
            return Err(Error::Message(format!(
                "parameter 'cart_init' is {cart_init}, but with clamp = true every λ is clamped to [0, 1] after the \
                 first step, so the merge would not start where asked; set clamp=false to learn λ above 1, or give \
                 cart_init ≤ 1"
            )));
        }
        Ok(AdaMerging {
            layer_wise: p.choice_of::<Granularity>("granularity")? == Granularity::Layer,
            cart,
            init: if cart { cart_init } else { p.float("init")? },
            lr: p.float("lr")?,
            steps: p.int("steps")? as usize,
            clamp,
            objective: p.choice_of::<ObjectiveChoice>("objective")?.abi(),
            rank_ratio: p.float("rank_ratio")?,
            report_every: p.int("report_every")?.max(1) as usize,
            batch_size: minibatch_size(p)?,
            seed: ctx.seed,
        })
    }

    fn run(&mut self, host: &Host<'_>, session: &Session<'_>) -> Result<Vec<Tensor>> {
        let n = session.expert_count();
        if n == 0 {
            return Err(Error::Message("AdaMerging needs at least one expert".into()));
        }
        let meta = session.tensors()?;
        let base = session.base()?;
        let experts: Vec<Vec<Tensor>> = (0..n).map(|e| session.expert(e)).collect::<Result<_>>()?;
        let (anchor, deltas) = self.directions(host, &meta, &base, &experts)?;
        let n_tensors = anchor.len();
        let per_task = if self.layer_wise { n_tensors } else { 1 };
        let mut lambda = vec![self.init; n * per_task];
        let mut adam = Adam::new(lambda.len(), self.lr);
        let start = session.mark();
        let build = |lambda: &[f64]| -> Result<Vec<Tensor>> {
            let mut refs: Vec<&[Tensor]> = vec![&anchor];
            refs.extend(deltas.iter().map(Vec::as_slice));
            combine(host, &refs, |p, m| {
                if m == 0 {
                    1.0
                } else {
                    lambda[(m - 1) * per_task + if per_task == 1 { 0 } else { p }]
                }
            })
        };
        for step in 0..self.steps {
            host.check_cancelled()?;
            host.report_progress(step as f64 / self.steps as f64);
            let candidate = build(&lambda)?;
            let (loss, g) = session.loss_and_grad_minibatch(
                &candidate,
                Tasks::All,
                self.objective,
                self.batch_size,
                self.seed,
                step as u64,
            )?;
            if step % self.report_every == 0 {
                session.report_iterate(&candidate, &format!("step {step}"), &self.metrics(loss, &lambda))?;
            }
            let mut grad = vec![0.0; lambda.len()];
            for (t, d) in deltas.iter().enumerate() {
                for (p, v) in dots(host, &g, d)?.into_iter().enumerate() {
                    grad[t * per_task + if per_task == 1 { 0 } else { p }] += v;
                }
            }
            adam.step(&mut lambda, &grad);
            if self.clamp {
                lambda.iter_mut().for_each(|l| *l = l.clamp(0.0, 1.0));
            }
            session.release_since(start, &[])?;
        }
        let merged = build(&lambda)?;
        let loss = session.loss(&merged, Tasks::All, self.objective)?;
        host.report_progress(1.0);
        session.report_iterate(&merged, &format!("step {}", self.steps), &self.metrics(loss, &lambda))?;
        Ok(merged)
    }
}

impl AdaMerging {
    /// The anchor and the per-task directions the coefficients scale.
    fn directions(
        &self,
        host: &Host<'_>,
        meta: &[mergescope_plugin_api::TensorMeta<'_>],
        base: &[Tensor],
        experts: &[Vec<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Vec<Tensor>>)> {
        let n = experts.len();
        let anchor = if self.cart {
            let refs: Vec<&[Tensor]> = experts.iter().map(Vec::as_slice).collect();
            combine(host, &refs, |_, _| 1.0 / n as f64)?
        } else {
            base.to_vec()
        };
        let deltas = experts
            .iter()
            .map(|e| {
                let diff = combine(host, &[e, &anchor], |_, m| if m == 0 { 1.0 } else { -1.0 })?;
                if !self.cart {
                    return Ok(diff);
                }
                diff.into_iter()
                    .zip(meta)
                    .map(|(d, m)| {
                        if m.role == ROLE_MATRIX && m.full_shape.len() == 2 {
                            let k = cart_rank(self.rank_ratio, m.full_shape[0], m.full_shape[1]);
                            host.low_rank(d, k)
                        } else {
                            Ok(d)
                        }
                    })
                    .collect()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((anchor, deltas))
    }

    fn metrics(&self, loss: f64, lambda: &[f64]) -> String {
        let mean = lambda.iter().sum::<f64>() / lambda.len().max(1) as f64;
        let values: Vec<String> = lambda.iter().map(|v| format!("{v:.6}")).collect();
        format!(
            "{{\"loss\":{},\"mean_lambda\":{mean:.6},\"lambda\":[{}]}}",
            json_number(loss),
            values.join(",")
        )
    }
}

mergescope_plugin_api::export_model_plugin!(AdaMerging);

#[cfg(test)]
mod tests {
    use super::cart_rank;

    /// The digest's rounding cases: 3·0.32 → 1, 3·0.34 → 2, γ = 0.08 on rank 2 → 1, γ = 1 → full.
    #[test]
    fn cart_rank_rounds_as_the_digest_says() {
        assert_eq!(cart_rank(0.32, 3, 3), 1);
        assert_eq!(cart_rank(0.34, 3, 3), 2);
        assert_eq!(cart_rank(0.08, 2, 2), 1);
        assert_eq!(cart_rank(1.0, 2, 5), 2);
        assert_eq!(cart_rank(0.0, 4, 4), 0);
    }
}
