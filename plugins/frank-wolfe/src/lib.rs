//! `frank-wolfe`: Frank-Wolfe merging (seed 000), a model-level method. The merged model moves
//! inside the convex hull of the experts towards the vertex (expert) that most decreases the
//! calibration loss, found by a linear minimisation oracle on the loss gradient (the soft
//! variant with `simplex = none`, FusionBench's, may leave the hull).
//!
//! The pure parts of the algorithm ([`algo`]) are tested against the digest's golden cases; the
//! session glue ([`FrankWolfe::run`]) turns them into tensor operations on the host.

pub mod algo;

use algo::StepRule;
use mergescope_plugin_api::abi::{self, CAP_NEEDS_BASE};
use mergescope_plugin_api::model::{
    Granularity, ModelMethod, ObjectiveChoice, Session, Tasks, combine, dots, json_number, minibatch_param,
    minibatch_size,
};
use mergescope_plugin_api::{CreateContext, Descriptor, Error, Host, ParamSpec, Params, Result, Tensor};

const HELP: &str = "Frank-Wolfe merging (Chen et al., seed 000). Minimises the calibration loss ℓ(θ) over \
the convex hull of the experts. Each iteration takes the gradient g = ∇ℓ(θ) on the calibration data \
(100 training examples per task), scores every expert θ_i by ⟨g, θ_i − θ⟩ (the linear minimisation \
oracle) and moves towards the best.\n\
- variant = hard: θ ← θ + γ_t (s − θ) with s the best expert (granularity task) or, per tensor, the \
best expert's tensor (granularity layer; a tensor no expert improves is left alone); γ_t = step_scale·2/(t+2).\n\
- variant = soft: the top_k best experts s_j (0: all) and θ ← θ + Σ_j λ*_j (s_j − θ), with λ* \
minimising ℓ on the simplex {λ ≥ 0, Σλ ≤ 1} (or Σλ = 1 with simplex = equal), found by Adam \
(soft_lr, soft_steps; each step on batch_size calibration examples per task, 0: all) on softmax logits (projected Adam, the digest's suggestion, stalls at points \
that are not optimal). With simplex = none, λ is free (from 0), as in FusionBench's fw_soft, which never \
projects: the merge may then leave the experts' hull, as task arithmetic's λ = 0.5 on five experts does. \
With granularity = layer every tensor has its own λ_j (FusionBench's soft step learns them with a \
layer-wise AdaMerging).\n\
Parameters: iterations (10), init (task-arithmetic: θ0 + 0.3·Σ τ_t; base; average), objective \
(cross-entropy on labelled calibration data, or entropy: unlabelled), lmo_score (raw ⟨g, θ_i − θ⟩, \
the FW gap; or cosine: Σ_p cos(g_p, θ_i,p), FusionBench's choice).\n\
Paper defaults: hard, init TA, 10 iterations (NLP); soft from the pretrained model, 15 iterations \
(vision). The paper's 500 inner AdaMerging steps per soft iteration are replaced by soft_steps = 30 \
Adam steps at soft_lr = 0.05, which reach the same λ on this benchmark at a fraction of the cost; \
like AdaMerging's, each takes a mini-batch of batch_size = 16 calibration examples per task (0: all), \
while the gradient that picks the vertices uses every calibration example.\n\
Every iterate is reported, so the run leaves a trajectory; a cancelled run keeps its last iterate.";

mergescope_plugin_api::choice_enum! {
    /// Hard (one vertex per step) or soft (a learned mix) Frank-Wolfe.
    enum Variant {
        Hard = "hard",
        Soft = "soft",
    }
}

mergescope_plugin_api::choice_enum! {
    /// The `init` parameter.
    enum InitChoice {
        TaskArithmetic = "task-arithmetic",
        Base = "base",
        Average = "average",
    }
}

mergescope_plugin_api::choice_enum! {
    /// How the linear minimisation oracle scores a vertex.
    enum LmoScore {
        Raw = "raw",
        Cosine = "cosine",
    }
}

mergescope_plugin_api::choice_enum! {
    /// The soft variant's constraint on λ.
    enum Simplex {
        AtMostOne = "at-most-one",
        Equal = "equal",
        None = "none",
    }
}

/// How candidates start.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Init {
    Base,
    TaskArithmetic(f64),
    Average,
}

/// The Frank-Wolfe method.
pub struct FrankWolfe {
    soft: bool,
    layer_wise: bool,
    iterations: usize,
    step: StepRule,
    init: Init,
    objective: abi::Objective,
    cosine: bool,
    top_k: usize,
    simplex: Simplex,
    soft_steps: usize,
    soft_lr: f64,
    batch_size: u64,
    seed: u64,
}

impl ModelMethod for FrankWolfe {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "frank-wolfe",
            name: "Frank-Wolfe merging",
            version: "",
            description: "Moves the merge towards the experts that most lower the calibration loss (hard or soft FW).",
            help: HELP,
            capabilities: CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::choice_of(
                    "variant",
                    Variant::Hard,
                    "hard: one vertex per step; soft: a learned mix of the top-k vertices.",
                ),
                ParamSpec::int("iterations", 10, "Frank-Wolfe iterations.").range(1.0, 1000.0),
                ParamSpec::choice_of(
                    "granularity",
                    Granularity::Task,
                    "Hard FW: one expert for the whole model, or one per tensor. Soft FW: one λ per vertex, or one per \
                     vertex and tensor (FusionBench's layer-wise step).",
                ),
                ParamSpec::choice_of(
                    "init",
                    InitChoice::TaskArithmetic,
                    "Starting point (task arithmetic uses λ = init_lambda).",
                ),
                ParamSpec::float("init_lambda", 0.3, "λ of the task-arithmetic starting point.").range(0.0, 2.0),
                ParamSpec::choice_of(
                    "objective",
                    ObjectiveChoice::CrossEntropy,
                    "Loss on the calibration data: labelled cross-entropy, or prediction entropy (no labels).",
                ),
                ParamSpec::choice_of(
                    "lmo_score",
                    LmoScore::Raw,
                    "Vertex score: ⟨g, θ_i − θ⟩ (the FW gap) or Σ_p cos(g_p, θ_i,p).",
                ),
                ParamSpec::float(
                    "step_scale",
                    1.0,
                    "Multiplier of the step 2/(t+2) (FusionBench uses 0.03).",
                )
                .range(0.0, 1.0),
                ParamSpec::int(
                    "top_k",
                    0,
                    "Soft FW: number of vertices mixed per step (0: all experts).",
                )
                .range(0.0, 64.0),
                ParamSpec::choice_of(
                    "simplex",
                    Simplex::AtMostOne,
                    "Soft FW: Σλ ≤ 1 (the current model is an implicit vertex), Σλ = 1 (Prop. 1), or none: λ free, \
                     as FusionBench has it (the merge may leave the experts' hull).",
                ),
                ParamSpec::int("soft_steps", 30, "Soft FW: Adam steps on λ per iteration.").range(1.0, 10000.0),
                ParamSpec::float("soft_lr", 0.05, "Soft FW: Adam learning rate on λ.").range(1e-6, 1.0),
                minibatch_param(
                    "Soft FW: calibration examples per task in each Adam step on λ (AdaMerging's 16); 0: all of them.",
                ),
            ],
        }
    }

    fn create(_host: &Host<'_>, p: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        let init = match p.choice_of("init")? {
            InitChoice::Base => Init::Base,
            InitChoice::Average => Init::Average,
            InitChoice::TaskArithmetic => Init::TaskArithmetic(p.float("init_lambda")?),
        };
        let top_k = p.int("top_k")? as usize;
        Ok(FrankWolfe {
            soft: p.choice_of::<Variant>("variant")? == Variant::Soft,
            layer_wise: p.choice_of::<Granularity>("granularity")? == Granularity::Layer,
            iterations: p.int("iterations")? as usize,
            step: StepRule {
                scale: p.float("step_scale")?,
            },
            init,
            objective: p.choice_of::<ObjectiveChoice>("objective")?.abi(),
            cosine: p.choice_of::<LmoScore>("lmo_score")? == LmoScore::Cosine,
            top_k: if top_k == 0 {
                ctx.n_experts
            } else {
                top_k.min(ctx.n_experts)
            },
            simplex: p.choice_of("simplex")?,
            soft_steps: p.int("soft_steps")? as usize,
            soft_lr: p.float("soft_lr")?,
            batch_size: minibatch_size(p)?,
            seed: ctx.seed,
        })
    }

    fn run(&mut self, host: &Host<'_>, session: &Session<'_>) -> Result<Vec<Tensor>> {
        let n_experts = session.expert_count();
        if n_experts == 0 {
            return Err(Error::Message("Frank-Wolfe needs at least one expert".into()));
        }
        let base = session.base()?;
        let experts: Vec<Vec<Tensor>> = (0..n_experts).map(|e| session.expert(e)).collect::<Result<_>>()?;
        let start = session.mark();
        let mut theta = match self.init {
            Init::Base => base.clone(),
            Init::Average => {
                let refs: Vec<&[Tensor]> = experts.iter().map(Vec::as_slice).collect();
                combine(host, &refs, |_, _| 1.0 / n_experts as f64)?
            }
            Init::TaskArithmetic(lambda) => {
                let mut refs: Vec<&[Tensor]> = vec![&base];
                refs.extend(experts.iter().map(Vec::as_slice));
                let w0 = 1.0 - lambda * n_experts as f64;
                combine(host, &refs, |_, m| if m == 0 { w0 } else { lambda })?
            }
        };
        let loss0 = session.loss(&theta, Tasks::All, self.objective)?;
        session.report_iterate(&theta, "init", &format!("{{\"loss\":{}}}", json_number(loss0)))?;
        for t in 0..self.iterations {
            host.check_cancelled()?;
            host.report_progress(t as f64 / self.iterations as f64);
            let (loss, g) = session.loss_and_grad(&theta, Tasks::All, self.objective)?;
            // d[i][p] = ⟨g_p, θ_i,p − θ_p⟩
            let at_theta = dots(host, &g, &theta)?;
            let mut d = Vec::with_capacity(n_experts);
            let mut cos = Vec::with_capacity(n_experts);
            for e in &experts {
                let de = dots(host, &g, e)?;
                d.push(de.iter().zip(&at_theta).map(|(a, b)| a - b).collect::<Vec<f64>>());
                if self.cosine {
                    cos.push(cosine_sum(host, &g, e)?);
                }
            }
            let task_scores: Vec<f64> = if self.cosine {
                cos
            } else {
                d.iter().map(|row| row.iter().sum()).collect()
            };
            let (next, info) = if self.soft {
                self.soft_step(host, session, t, &theta, &experts, &task_scores)?
            } else {
                self.hard_step(host, t, &theta, &experts, &d, &task_scores)?
            };
            let gap = algo::fw_gap(&d);
            session.release_since(start, &next)?;
            theta = next;
            let metrics = format!(
                "{{\"loss_before\":{},\"fw_gap\":{},{info}}}",
                json_number(loss),
                json_number(gap)
            );
            host.report_progress((t + 1) as f64 / self.iterations as f64);
            session.report_iterate(&theta, &format!("iteration {}", t + 1), &metrics)?;
        }
        host.report_progress(1.0);
        Ok(theta)
    }
}

impl FrankWolfe {
    /// θ + γ_t (s − θ) with s chosen per model or per tensor; returns the next θ and metrics.
    fn hard_step(
        &self,
        host: &Host<'_>,
        t: usize,
        theta: &[Tensor],
        experts: &[Vec<Tensor>],
        d: &[Vec<f64>],
        task_scores: &[f64],
    ) -> Result<(Vec<Tensor>, String)> {
        let gamma = self.step.gamma(t);
        if self.layer_wise {
            let picks = algo::layer_lmo(d);
            let next = theta
                .iter()
                .enumerate()
                .map(|(p, th)| match picks[p] {
                    Some(i) => host.weighted_sum(&[*th, experts[i][p]], Some(&[1.0 - gamma, gamma])),
                    None => Ok(*th),
                })
                .collect::<Result<Vec<_>>>()?;
            let moved = picks.iter().filter(|p| p.is_some()).count();
            Ok((
                next,
                format!("\"gamma\":{},\"tensors_moved\":{moved}", json_number(gamma)),
            ))
        } else {
            let i = algo::argmin(task_scores);
            let next = combine(
                host,
                &[theta, &experts[i]],
                |_, m| if m == 0 { 1.0 - gamma } else { gamma },
            )?;
            Ok((next, format!("\"gamma\":{},\"vertex\":{i}", json_number(gamma))))
        }
    }

    /// θ + Σ_j λ*_j (s_j − θ) over the top-k vertices, λ* by Adam on softmax weights.
    fn soft_step(
        &self,
        host: &Host<'_>,
        session: &Session<'_>,
        iteration: usize,
        theta: &[Tensor],
        experts: &[Vec<Tensor>],
        task_scores: &[f64],
    ) -> Result<(Vec<Tensor>, String)> {
        let picks = algo::top_k_smallest(task_scores, self.top_k);
        let k = picks.len();
        // Directions D_j = s_j − θ.
        let dirs: Vec<Vec<Tensor>> = picks
            .iter()
            .map(|&i| combine(host, &[&experts[i], theta], |_, m| if m == 0 { 1.0 } else { -1.0 }))
            .collect::<Result<_>>()?;
        let start = match self.simplex {
            Simplex::AtMostOne => algo::SoftWeights::Simplex(algo::SimplexWeights::new(k, true)),
            Simplex::Equal => algo::SoftWeights::Simplex(algo::SimplexWeights::new(k, false)),
            Simplex::None => algo::SoftWeights::Free(vec![0.0; k]),
        };
        let n_groups = if self.layer_wise { theta.len() } else { 1 };
        let mut weights = algo::GroupedWeights::new(&start, n_groups, self.soft_lr);
        let candidate = |lambda: &[Vec<f64>]| -> Result<Vec<Tensor>> {
            let mut refs: Vec<&[Tensor]> = vec![theta];
            refs.extend(dirs.iter().map(Vec::as_slice));
            combine(host, &refs, |p, m| {
                if m == 0 {
                    1.0
                } else {
                    lambda[algo::group_of(lambda.len(), p)][m - 1]
                }
            })
        };
        for i in 0..self.soft_steps {
            host.check_cancelled()?;
            let mark = session.mark();
            let c = candidate(&weights.lambda())?;
            // Mini-batches continue across iterations rather than restart at batch 0.
            let step = (iteration * self.soft_steps + i) as u64;
            let (_, g) =
                session.loss_and_grad_minibatch(&c, Tasks::All, self.objective, self.batch_size, self.seed, step)?;
            // grad[j][p] = ⟨∇_p ℓ, D_j,p⟩, summed over a group's tensors by the step.
            let grad: Vec<Vec<f64>> = dirs.iter().map(|dj| dots(host, &g, dj)).collect::<Result<_>>()?;
            weights.step(&grad);
            session.release_since(mark, &[])?;
        }
        let lambda = weights.lambda();
        let next = candidate(&lambda)?;
        let picks_json: Vec<String> = picks.iter().map(usize::to_string).collect();
        let list = |v: &[f64]| v.iter().map(|x| json_number(*x)).collect::<Vec<_>>().join(",");
        // Per vertex, its λ (task-wise) or its mean λ over tensors (layer-wise), and layer-wise
        // the whole table, one row of k weights per tensor.
        let mean: Vec<f64> = (0..k)
            .map(|j| lambda.iter().map(|row| row[j]).sum::<f64>() / lambda.len() as f64)
            .collect();
        let per_tensor = if self.layer_wise {
            let rows: Vec<String> = lambda.iter().map(|row| format!("[{}]", list(row))).collect();
            format!(",\"lambda_per_tensor\":[{}]", rows.join(","))
        } else {
            String::new()
        };
        Ok((
            next,
            format!(
                "\"vertices\":[{}],\"lambda\":[{}]{per_tensor}",
                picks_json.join(","),
                list(&mean)
            ),
        ))
    }
}

/// Σ_p cos(g_p, θ_p) over tensors (0 for a zero tensor).
fn cosine_sum(host: &Host<'_>, g: &[Tensor], theta: &[Tensor]) -> Result<f64> {
    let mut s = 0.0;
    for (a, b) in g.iter().zip(theta) {
        let na = host.dot(*a, *a)?.sqrt();
        let nb = host.dot(*b, *b)?.sqrt();
        if na > 0.0 && nb > 0.0 {
            s += host.dot(*a, *b)? / (na * nb);
        }
    }
    Ok(s)
}

mergescope_plugin_api::export_model_plugin!(FrankWolfe);
