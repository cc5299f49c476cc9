//! `mima`: MIMA, multi-task iterated model averaging (seed 003), a model-level method. Starting
//! from the base θ0, each of `rounds` rounds fine-tunes one model per task from the current
//! average for K = total_steps / rounds steps and averages the results; the final experts are
//! merged by uniform averaging, task arithmetic or TIES with task vectors relative to θ0.
//!
//! The experts given to the merge only name the tasks (expert t = task t): MIMA trains its own
//! experts on the tasks' train splits through the session's `finetune`.

use mergescope_plugin_api::abi::{self, CAP_NEEDS_BASE};
use mergescope_plugin_api::model::{
    ModelMethod, OptimizerChoice, Session, combine, dots, finetune_options, json_number,
};
use mergescope_plugin_api::{CreateContext, Descriptor, Error, Host, ParamSpec, Params, Result, Tensor};

const HELP: &str = "MIMA (seed 003): iterated model averaging and fine-tuning.\n\
θ̄⁰ = θ0 (the base). For round i = 1..N (rounds): θ_t⁽ⁱ⁾ = FineTune(θ̄⁽ⁱ⁻¹⁾, task t, K steps) for every \
task, with K = total_steps / N so that every task gets the same budget S = total_steps whatever N; \
then θ̄⁽ⁱ⁾ = (1/T) Σ_t θ_t⁽ⁱ⁾. N = 1 is ordinary independent fine-tuning followed by a merge.\n\
The final experts θ_t⁽ᴺ⁾ are merged (final) by\n\
- average: (1/T) Σ_t θ_t⁽ᴺ⁾ (λ-free; the paper's Uniform Averaging);\n\
- task-arithmetic: θ0 + λ Σ_t τ_t with τ_t = θ_t⁽ᴺ⁾ − θ0 (λ = 0.4 without validation, as the paper);\n\
- ties: trim each τ_t to its top density share per tensor, elect signs by mass, disjoint mean, θ0 + λ·τ_m \
(λ = 1 without validation).\n\
Fine-tuning runs on each task's train split through its frozen head, with a fresh optimiser per \
round (the paper's FineTune(θ̄, D, K)) and a constant learning rate; the defaults (AdamW, lr 5e-4, \
batch 64, S = 300) are the demo experts' recipe, so N = 1 reproduces independent experts.\n\
Each round reports its average θ̄⁽ⁱ⁾ as an iterate with the mean pairwise cosine of the task \
vectors θ_t⁽ⁱ⁾ − θ0 (which rises with N: seed 003, Prop. 1 and Fig. 5) and of the round's updates \
θ_t⁽ⁱ⁾ − θ̄⁽ⁱ⁻¹⁾. A cancelled run keeps its last average.";

mergescope_plugin_api::choice_enum! {
    /// The final merge of MIMA's experts.
    enum Final {
        Average = "average",
        TaskArithmetic = "task-arithmetic",
        Ties = "ties",
    }
}

/// The MIMA method.
pub struct Mima {
    rounds: usize,
    total_steps: usize,
    optimizer: abi::OptimizerKind,
    lr: f64,
    batch_size: u64,
    weight_decay: f64,
    final_merge: Final,
    ta_lambda: f64,
    ties_lambda: f64,
    density: f64,
    seed: u64,
}

impl ModelMethod for Mima {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mima",
            name: "MIMA",
            version: "",
            description: "Iterated averaging and fine-tuning from the base: experts trained to merge well.",
            help: HELP,
            capabilities: CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::int("rounds", 4, "N: rounds of fine-tuning and averaging.").range(1.0, 1000.0),
                ParamSpec::int(
                    "total_steps",
                    300,
                    "S: fine-tuning steps per task over all rounds (K = S/N per round).",
                )
                .range(1.0, 1_000_000.0),
                ParamSpec::choice_of(
                    "optimizer",
                    OptimizerChoice::AdamW,
                    "Fine-tuning optimiser (fresh each round).",
                ),
                ParamSpec::float("lr", 5e-4, "Fine-tuning learning rate.").range(1e-7, 10.0),
                ParamSpec::int("batch_size", 64, "Minibatch size (0: full batch).").range(0.0, 1_000_000.0),
                ParamSpec::float("weight_decay", 0.0, "AdamW weight decay.").range(0.0, 1.0),
                ParamSpec::choice_of("final", Final::Average, "How the final experts are merged."),
                ParamSpec::float("ta_lambda", 0.4, "Task arithmetic: λ on the sum of task vectors.").range(0.0, 4.0),
                ParamSpec::float("ties_lambda", 1.0, "TIES: λ on the merged task vector.").range(0.0, 4.0),
                ParamSpec::float("density", 0.2, "TIES: share of each task vector kept per tensor.").range(0.0, 1.0),
            ],
        }
    }

    fn create(_host: &Host<'_>, p: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        let rounds = p.int("rounds")? as usize;
        let total_steps = p.int("total_steps")? as usize;
        if total_steps < rounds {
            return Err(Error::Message(format!(
                "total_steps ({total_steps}) must be at least rounds ({rounds}): each round fine-tunes \
                 K = total_steps / rounds steps; raise total_steps or lower rounds"
            )));
        }
        Ok(Mima {
            rounds,
            total_steps,
            optimizer: p.choice_of::<OptimizerChoice>("optimizer")?.abi(),
            lr: p.float("lr")?,
            batch_size: p.int("batch_size")? as u64,
            weight_decay: p.float("weight_decay")?,
            final_merge: p.choice_of("final")?,
            ta_lambda: p.float("ta_lambda")?,
            ties_lambda: p.float("ties_lambda")?,
            density: p.float("density")?,
            seed: ctx.seed,
        })
    }

    fn run(&mut self, host: &Host<'_>, session: &Session<'_>) -> Result<Vec<Tensor>> {
        let n_tasks = session.expert_count();
        if n_tasks == 0 {
            return Err(Error::Message("MIMA needs at least one task (expert)".into()));
        }
        let base = session.base()?;
        let start = session.mark();
        let steps = self.steps_per_round();
        let mut average = base.clone();
        let mut experts: Vec<Vec<Tensor>> = Vec::new();
        for round in 0..self.rounds {
            let mut tuned = Vec::with_capacity(n_tasks);
            for t in 0..n_tasks {
                host.check_cancelled()?;
                host.report_progress((round * n_tasks + t) as f64 / (self.rounds * n_tasks) as f64);
                let seed = self.seed.wrapping_add((round * n_tasks + t) as u64);
                let mut o = finetune_options(steps as u64, self.lr, self.batch_size, seed);
                o.optimizer = self.optimizer;
                o.weight_decay = self.weight_decay;
                tuned.push(session.finetune(&average, t, &o)?);
            }
            let refs: Vec<&[Tensor]> = tuned.iter().map(Vec::as_slice).collect();
            let next = combine(host, &refs, |_, _| 1.0 / n_tasks as f64)?;
            let tau_cos = mean_pairwise_cosine(host, &tuned, &base)?;
            let delta_cos = mean_pairwise_cosine(host, &tuned, &average)?;
            let mut keep: Vec<Tensor> = next.clone();
            keep.extend(tuned.iter().flatten().copied());
            session.release_since(start, &keep)?;
            average = next;
            experts = tuned;
            let metrics = format!(
                "{{\"round\":{},\"steps_per_round\":{steps},\"task_vector_cosine\":{},\"update_cosine\":{}}}",
                round + 1,
                json_number(tau_cos),
                json_number(delta_cos)
            );
            host.report_progress((round + 1) as f64 / self.rounds as f64);
            session.report_iterate(&average, &format!("round {}", round + 1), &metrics)?;
        }
        host.report_progress(1.0);
        let merged = match self.final_merge {
            Final::Average => average,
            Final::TaskArithmetic => {
                let mut refs: Vec<&[Tensor]> = vec![&base];
                refs.extend(experts.iter().map(Vec::as_slice));
                let w0 = 1.0 - self.ta_lambda * n_tasks as f64;
                combine(host, &refs, |_, m| if m == 0 { w0 } else { self.ta_lambda })?
            }
            Final::Ties => self.ties(host, &base, &experts)?,
        };
        Ok(merged)
    }
}

impl Mima {
    /// K = ⌊S/N⌋ (at least 1).
    fn steps_per_round(&self) -> usize {
        (self.total_steps / self.rounds.max(1)).max(1)
    }

    /// TIES on the task vectors θ_t − θ0, tensor by tensor: trim to the top `density` share by
    /// magnitude, elect signs by mass, disjoint mean, θ0 + λ·τ_m.
    fn ties(&self, host: &Host<'_>, base: &[Tensor], experts: &[Vec<Tensor>]) -> Result<Vec<Tensor>> {
        (0..base.len())
            .map(|p| {
                let numel = host.numel(base[p])?;
                let k = ((self.density * numel as f64).round() as usize).min(numel);
                let trimmed = experts
                    .iter()
                    .map(|e| {
                        let tau = host.sub(e[p], base[p])?;
                        if k == 0 {
                            return host.scale(tau, 0.0);
                        }
                        let threshold = host.kth_largest_abs(tau, k)?;
                        host.trim_abs(tau, threshold)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let sign = host.elect_sign(&trimmed, abi::ELECT_MASS)?;
                let tau_m = host.disjoint_merge(&trimmed, sign, abi::DISJOINT_MEAN)?;
                host.weighted_sum(&[base[p], tau_m], Some(&[1.0, self.ties_lambda]))
            })
            .collect()
    }
}

/// Mean over pairs s < t of cos(θ_s − ref, θ_t − ref), on the whole flattened models (f64 sums
/// of per-tensor inner products); 1 with a single model, 0 for a zero vector.
pub fn mean_pairwise_cosine(host: &Host<'_>, models: &[Vec<Tensor>], reference: &[Tensor]) -> Result<f64> {
    let vectors: Vec<Vec<Tensor>> = models
        .iter()
        .map(|m| combine(host, &[m, reference], |_, i| if i == 0 { 1.0 } else { -1.0 }))
        .collect::<Result<_>>()?;
    let gram = |a: &[Tensor], b: &[Tensor]| -> Result<f64> { Ok(dots(host, a, b)?.iter().sum()) };
    let norms: Vec<f64> = vectors
        .iter()
        .map(|v| gram(v, v).map(f64::sqrt))
        .collect::<Result<_>>()?;
    let mut cosines = Vec::new();
    for s in 0..vectors.len() {
        for t in s + 1..vectors.len() {
            let denom = norms[s] * norms[t];
            cosines.push(if denom > 0.0 {
                gram(&vectors[s], &vectors[t])? / denom
            } else {
                0.0
            });
        }
    }
    for v in vectors.iter().flatten() {
        host.release(*v)?;
    }
    Ok(if cosines.is_empty() {
        1.0
    } else {
        cosines.iter().sum::<f64>() / cosines.len() as f64
    })
}

mergescope_plugin_api::export_model_plugin!(Mima);
