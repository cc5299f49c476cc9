//! `ties`: TIES-Merging (Yadav et al., 2023): trim, elect sign, disjoint merge.
//!
//! With `trim_scope = global` the per-expert magnitude thresholds are taken over the whole model
//! in statistics passes, with bounded memory: pass 0 counts |τ| per expert in 2¹⁶ bins keyed by
//! the top 16 bits of the f32 bit pattern (monotone in |τ|), pass 1 counts the low 16 bits of the
//! values in the bin holding the k-th largest, which pins down the k-th largest |τ| exactly (a
//! two-digit radix selection: linear time, 2¹⁶ counters per expert, no sort, no model-sized
//! buffer). With `zero_sign = reference` a pass 2 sums the elected signs over the model for the
//! global majority sign. After that every element merges independently, so the instance is
//! elementwise. With `trim_scope = tensor` the thresholds come from the host's linear-time
//! `kth_largest_abs` per tensor.

use mergescope_plugin_api::abi::{
    BINARY_EQ, BINARY_GE, BINARY_MAXIMUM, CAP_ELEMENTWISE, CAP_NEEDS_BASE, CAP_THREAD_SAFE, REDUCE_SUM, STACK_MAX,
};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorMeta,
};
use std::sync::{Mutex, MutexGuard};

const HELP: &str = "TIES-Merging (Yadav et al., 2023). With task vectors τ_t = θ_t − θ0 (a base model is \
required):\n\
1. Trim: in each τ_t keep the entries with the largest magnitudes (fraction density), zero the rest;\n\
2. Elect: per coordinate, s = sign(Σ_t trimmed_t) (mass) or the sign of the count of positive minus \
negative entries (count);\n\
3. Disjoint merge: aggregate only the non-zero entries whose sign equals s: dis-mean = their mean \
(0 if none), dis-sum = their sum, dis-max = their largest magnitude times s;\n\
4. θ = θ0 + λ·τ_merged.\n\
Parameters (defaults follow the paper and its original code; the alternatives reproduce other \
implementations, see seeds-002-004 §4.2 and §4.7):\n\
- density (default 0.2, in [0, 1]): fraction kept by the trim (the paper's top-20%).\n\
- lambda (default 1.0): the paper tunes λ on validation data over 0.8..2.5; 1 is the usual choice \
without validation data (MIMA, CART's baselines). AdaMerging and FusionBench use 0.3 with dis-sum.\n\
- aggregation: dis-mean (default, the paper's), dis-sum (AdaMerging, FusionBench), dis-max.\n\
- trim_scope: global (default; the paper's and the original code's: the magnitude threshold of each \
expert is taken over the whole model, computed exactly in statistics passes with bounded memory) | \
tensor (mergekit: a threshold per tensor and expert).\n\
- count_rule: exact (default: k = round(density·n) of the n entries in scope, keep |τ| ≥ the k-th \
largest |τ|, ties at the threshold kept; k = 0 keeps nothing) | reference (the original code's \
kthvalue: int(n·density) + 1 entries kept, plus ties; density 1 keeps everything instead of raising). \
mergekit keeps exactly int(density·n) with ties broken arbitrarily, which no deterministic rule \
reproduces; exact differs from it only at magnitude ties.\n\
- election: mass (default, everyone's: the sign of the summed trimmed values) | count (mergekit's \
`count`: majority of the signs).\n\
- zero_sign, for coordinates whose elected sign is 0 (exact cancellation or nothing kept): none \
(default, the paper read literally and MergeLM: nothing is kept there, result 0) | reference (the \
original code and FusionBench: the zeros are replaced by the majority sign(Σ_j s_j) over the whole \
model; with trim_scope = tensor the majority is taken per tensor; if that sum is 0 too the negative \
entries are kept, and dis-max gives 0 because it multiplies by the sign) | positive (mergekit: a \
coordinate with Σ ≥ 0 elects +).\n\
Every tensor of every role takes part (the parameter-set policy is the host's).";

const BINS: usize = 1 << 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Aggregation {
    Mean,
    Sum,
    Max,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    Global,
    Tensor,
}

/// How many entries the trim keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountRule {
    /// k = round(density·n).
    Exact,
    /// int(n·density) + 1 (the original code's kthvalue), at most n.
    Reference,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Election {
    Mass,
    Count,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ZeroSign {
    None,
    Reference,
    Positive,
}

/// Rank k (1-based, from the largest |τ|) of the threshold entry among `n`, or 0 to keep nothing.
pub fn kept_count(n: u64, density: f64, rule: CountRule) -> u64 {
    if n == 0 {
        return 0;
    }
    let product = n as f64 * density;
    let k = match rule {
        CountRule::Exact => product.round(),
        CountRule::Reference => product.floor() + 1.0,
    };
    if k <= 0.0 {
        0
    } else if k >= n as f64 {
        n
    } else {
        k as u64
    }
}

/// State of the global statistics passes (behind a mutex: the host may run a pass's tensors on
/// several threads for a thread-safe instance).
#[derive(Default)]
struct Stats {
    /// Elements in the model (counted in pass 0).
    total: u64,
    /// Per expert: pass 0, counts by the top 16 bits of |τ|; pass 1, by the low 16 bits.
    hist: Vec<Vec<u64>>,
    /// Per expert, after pass 0: (top 16 bits of the threshold, its rank inside that bin).
    target: Vec<Option<(u32, u64)>>,
    /// Σ_j s_j over the model (pass 2).
    sign_sum: f64,
}

/// The TIES method.
pub struct Ties {
    density: f64,
    lambda: f64,
    aggregation: Aggregation,
    scope: Scope,
    count_rule: CountRule,
    election: Election,
    zero_sign: ZeroSign,
    n_experts: usize,
    stats: Mutex<Stats>,
    /// Global scope: per-expert threshold (None = keep nothing), known after pass 1.
    thresholds: Option<Vec<Option<f64>>>,
    /// Global scope with zero_sign = reference: sign(Σ_j s_j), known after pass 2.
    majority: Option<f64>,
}

fn choice<T: Copy>(params: &Params<'_>, name: &str, options: &[(&str, T)]) -> Result<T> {
    let value = params.choice(name)?;
    options
        .iter()
        .find(|(n, _)| *n == value)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
            Error::Message(format!(
                "parameter '{name}': unknown choice '{value}'; use one of {}",
                names.join(", ")
            ))
        })
}

fn need_base(base: Option<Tensor>, tensor: &TensorMeta<'_>) -> Result<Tensor> {
    base.ok_or_else(|| {
        Error::Message(format!(
            "tensor '{}': ties needs a base model (task vectors are θ_t − θ0); give one with --base",
            tensor.name
        ))
    })
}

/// Bits of |x| as an f32 pattern, which orders like |x|. NaN is refused.
fn abs_bits(values: &[f32], tensor: &TensorMeta<'_>, expert: usize) -> Result<Vec<u32>> {
    let mut bits = Vec::with_capacity(values.len());
    for (j, v) in values.iter().enumerate() {
        if v.is_nan() {
            return Err(Error::Message(format!(
                "tensor '{}': the task vector of expert {expert} is NaN at element {}; TIES cannot rank NaN \
                 magnitudes (check the inputs)",
                tensor.name,
                tensor.offset + j as u64
            )));
        }
        bits.push(v.abs().to_bits());
    }
    Ok(bits)
}

/// Finds the bin holding the `k`-th largest count (1-based), walking from the top: (bin, rank
/// inside the bin).
fn find_bin(hist: &[u64], k: u64) -> Option<(usize, u64)> {
    let mut above = 0u64;
    for bin in (0..hist.len()).rev() {
        let here = hist[bin];
        if above + here >= k {
            return Some((bin, k - above));
        }
        above += here;
    }
    None
}

impl Ties {
    fn lock_stats(&self) -> Result<MutexGuard<'_, Stats>> {
        self.stats
            .lock()
            .map_err(|_| Error::Message("ties: statistics state poisoned by an earlier failure".into()))
    }

    /// Task vectors τ_t = θ_t − θ0.
    fn task_vectors(host: &Host<'_>, base: Tensor, experts: &[Tensor]) -> Result<Vec<Tensor>> {
        experts.iter().map(|e| host.sub(*e, base)).collect()
    }

    /// Per-expert thresholds for this tensor (None = keep nothing).
    fn thresholds_for(&self, host: &Host<'_>, tensor: &TensorMeta<'_>, taus: &[Tensor]) -> Result<Vec<Option<f64>>> {
        match self.scope {
            Scope::Global => self.thresholds.clone().ok_or_else(|| {
                Error::Message(format!(
                    "tensor '{}': ties with trim_scope=global needs the host's statistics passes, which did not \
                     run; use a host that supports prepare passes or set trim_scope=tensor",
                    tensor.name
                ))
            }),
            Scope::Tensor => {
                let mut out = Vec::with_capacity(taus.len());
                for tau in taus {
                    let n = host.numel(*tau)? as u64;
                    let k = kept_count(n, self.density, self.count_rule);
                    out.push(if k == 0 {
                        None
                    } else {
                        Some(host.kth_largest_abs(*tau, k as usize)?)
                    });
                }
                Ok(out)
            }
        }
    }

    /// Trimmed task vectors.
    fn trim(host: &Host<'_>, taus: &[Tensor], thresholds: &[Option<f64>]) -> Result<Vec<Tensor>> {
        taus.iter()
            .zip(thresholds)
            .map(|(tau, thr)| match thr {
                None => host.full_like(*tau, 0.0),
                Some(thr) => {
                    let keep = host.compare_scalar(BINARY_GE, host.abs(*tau)?, *thr)?;
                    host.mul(keep, *tau)
                }
            })
            .collect()
    }

    /// The elected value before taking the sign: Σ_t trimmed_t (mass) or Σ_t sign(trimmed_t) (count).
    fn election_total(&self, host: &Host<'_>, trimmed: &[Tensor]) -> Result<Tensor> {
        match self.election {
            Election::Mass => host.weighted_sum(trimmed, None),
            Election::Count => {
                let signs = trimmed.iter().map(|t| host.sign(*t)).collect::<Result<Vec<_>>>()?;
                host.weighted_sum(&signs, None)
            }
        }
    }

    /// Merged value of one tensor (or chunk) from its task vectors.
    fn merge_taus(&self, host: &Host<'_>, tensor: &TensorMeta<'_>, base: Tensor, taus: &[Tensor]) -> Result<Tensor> {
        let thresholds = self.thresholds_for(host, tensor, taus)?;
        let trimmed = Self::trim(host, taus, &thresholds)?;
        let total = self.election_total(host, &trimmed)?;
        // `multiply`: the sign dis-max multiplies by; `select`: the sign entries must have to be kept.
        let (multiply, select) = match self.zero_sign {
            ZeroSign::None => {
                let s = host.sign(total)?;
                (s, s)
            }
            ZeroSign::Positive => {
                let s = host.affine(host.compare_scalar(BINARY_GE, total, 0.0)?, 2.0, -1.0)?;
                (s, s)
            }
            ZeroSign::Reference => {
                let raw = host.sign(total)?;
                let majority = match self.scope {
                    Scope::Global => self.majority.ok_or_else(|| {
                        Error::Message(format!(
                            "tensor '{}': ties with zero_sign=reference needs the global sign pass, which did not run",
                            tensor.name
                        ))
                    })?,
                    Scope::Tensor => host.reduce(REDUCE_SUM, raw)?.signum_or_zero(),
                };
                let is_zero = host.compare_scalar(BINARY_EQ, raw, 0.0)?;
                let s = host.select(is_zero, host.full_like(raw, majority)?, raw)?;
                if majority == 0.0 {
                    // The original code's `where(s > 0, v > 0, v < 0)`: sign 0 keeps negatives.
                    (s, host.select(is_zero, host.full_like(raw, -1.0)?, raw)?)
                } else {
                    (s, s)
                }
            }
        };
        let mut selected = Vec::with_capacity(trimmed.len());
        for t in &trimmed {
            let agree = host.binary(BINARY_EQ, host.sign(*t)?, select)?;
            selected.push(host.mul(agree, *t)?);
        }
        let merged = match self.aggregation {
            Aggregation::Sum => host.weighted_sum(&selected, None)?,
            Aggregation::Mean => {
                let nonzero = selected
                    .iter()
                    .map(|s| host.abs(host.sign(*s)?))
                    .collect::<Result<Vec<_>>>()?;
                let count = host.weighted_sum(&nonzero, None)?;
                let one = host.full_like(count, 1.0)?;
                host.div(
                    host.weighted_sum(&selected, None)?,
                    host.binary(BINARY_MAXIMUM, count, one)?,
                )?
            }
            Aggregation::Max => {
                let mags = selected.iter().map(|s| host.abs(*s)).collect::<Result<Vec<_>>>()?;
                host.mul(host.reduce_stack(STACK_MAX, &mags)?, multiply)?
            }
        };
        host.weighted_sum(&[base, merged], Some(&[1.0, self.lambda]))
    }
}

trait SignumOrZero {
    fn signum_or_zero(self) -> f64;
}

impl SignumOrZero for f64 {
    fn signum_or_zero(self) -> f64 {
        if self > 0.0 {
            1.0
        } else if self < 0.0 {
            -1.0
        } else {
            0.0
        }
    }
}

impl MergeMethod for Ties {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "ties",
            name: "TIES-Merging",
            version: "",
            description: "Trims small task-vector entries, elects a sign per weight, and averages the agreeing entries.",
            help: HELP,
            capabilities: CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::float(
                    "density",
                    0.2,
                    "Fraction of each task vector's entries kept by the magnitude trim.",
                )
                .range(0.0, 1.0),
                ParamSpec::float("lambda", 1.0, "Scaling coefficient λ of the merged task vector."),
                ParamSpec::choice(
                    "aggregation",
                    &["dis-mean", "dis-sum", "dis-max"],
                    "dis-mean",
                    "Disjoint aggregation of the entries that agree with the elected sign.",
                ),
                ParamSpec::choice(
                    "trim_scope",
                    &["global", "tensor"],
                    "global",
                    "Magnitude threshold over the whole model (paper) or per tensor (mergekit).",
                ),
                ParamSpec::choice(
                    "count_rule",
                    &["exact", "reference"],
                    "exact",
                    "Entries kept: round(density·n) plus ties, or the original code's int(n·density)+1 plus ties.",
                ),
                ParamSpec::choice(
                    "election",
                    &["mass", "count"],
                    "mass",
                    "Sign election by the summed values (mass) or by the number of positive/negative entries.",
                ),
                ParamSpec::choice(
                    "zero_sign",
                    &["none", "reference", "positive"],
                    "none",
                    "Where the elected sign is 0: keep nothing, use the model-wide majority sign (original code), or + (mergekit).",
                ),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        if ctx.n_experts == 0 {
            return Err(Error::Message("ties needs at least one expert model".into()));
        }
        let density = params.float("density")?;
        if !(0.0..=1.0).contains(&density) {
            return Err(Error::Message(format!(
                "parameter 'density': {density} is outside [0, 1]; give the fraction of entries to keep (0.2 = top 20%)"
            )));
        }
        let lambda = params.float("lambda")?;
        if !lambda.is_finite() {
            return Err(Error::Message(format!(
                "parameter 'lambda': {lambda} is not a finite number"
            )));
        }
        let aggregation = choice(
            params,
            "aggregation",
            &[
                ("dis-mean", Aggregation::Mean),
                ("dis-sum", Aggregation::Sum),
                ("dis-max", Aggregation::Max),
            ],
        )?;
        let scope = choice(
            params,
            "trim_scope",
            &[("global", Scope::Global), ("tensor", Scope::Tensor)],
        )?;
        let count_rule = choice(
            params,
            "count_rule",
            &[("exact", CountRule::Exact), ("reference", CountRule::Reference)],
        )?;
        let election = choice(
            params,
            "election",
            &[("mass", Election::Mass), ("count", Election::Count)],
        )?;
        let zero_sign = choice(
            params,
            "zero_sign",
            &[
                ("none", ZeroSign::None),
                ("reference", ZeroSign::Reference),
                ("positive", ZeroSign::Positive),
            ],
        )?;
        Ok(Ties {
            density,
            lambda,
            aggregation,
            scope,
            count_rule,
            election,
            zero_sign,
            n_experts: ctx.n_experts,
            stats: Mutex::new(Stats::default()),
            thresholds: None,
            majority: None,
        })
    }

    fn capabilities(&self) -> Option<u64> {
        // With global thresholds (and the global majority) fixed by the statistics passes every
        // element merges independently; per-tensor thresholds need the whole tensor.
        let elementwise = if self.scope == Scope::Global {
            CAP_ELEMENTWISE
        } else {
            0
        };
        Some(CAP_THREAD_SAFE | CAP_NEEDS_BASE | elementwise)
    }

    fn prepare_passes(&self) -> u32 {
        match (self.scope, self.zero_sign) {
            (Scope::Tensor, _) => 0,
            (Scope::Global, ZeroSign::Reference) => 3,
            (Scope::Global, _) => 2,
        }
    }

    fn prepare_tensor(
        &mut self,
        host: &Host<'_>,
        pass: u32,
        tensor: &TensorMeta<'_>,
        base: Option<Tensor>,
        experts: &[Tensor],
    ) -> Result<()> {
        host.check_cancelled()?;
        let base = need_base(base, tensor)?;
        if experts.len() != self.n_experts {
            return Err(Error::Message(format!(
                "tensor '{}': the instance was created for {} experts but got {}",
                tensor.name,
                self.n_experts,
                experts.len()
            )));
        }
        match pass {
            0 | 1 => {
                let taus = Self::task_vectors(host, base, experts)?;
                let mut bits = Vec::with_capacity(taus.len());
                for (t, tau) in taus.iter().enumerate() {
                    bits.push(abs_bits(&host.read_f32(*tau)?, tensor, t)?);
                }
                let mut stats = self.lock_stats()?;
                if stats.hist.is_empty() {
                    stats.hist = vec![vec![0u64; BINS]; self.n_experts];
                }
                if pass == 0 {
                    stats.total += bits.first().map_or(0, |b| b.len() as u64);
                    for (hist, b) in stats.hist.iter_mut().zip(&bits) {
                        for x in b {
                            hist[(*x >> 16) as usize] += 1;
                        }
                    }
                } else {
                    let Stats { hist, target, .. } = &mut *stats;
                    for ((hist, b), target) in hist.iter_mut().zip(&bits).zip(target.iter()) {
                        if let Some((hi, _)) = target {
                            for x in b.iter().filter(|x| *x >> 16 == *hi) {
                                hist[(*x & 0xffff) as usize] += 1;
                            }
                        }
                    }
                }
                Ok(())
            }
            2 => {
                let taus = Self::task_vectors(host, base, experts)?;
                let thresholds = self.thresholds_for(host, tensor, &taus)?;
                let trimmed = Self::trim(host, &taus, &thresholds)?;
                let signs = host.sign(self.election_total(host, &trimmed)?)?;
                let sum = host.reduce(REDUCE_SUM, signs)?;
                self.lock_stats()?.sign_sum += sum;
                Ok(())
            }
            _ => Err(Error::Message(format!(
                "ties: the host asked for statistics pass {pass}, but ties has only 3"
            ))),
        }
    }

    fn finish_pass(&mut self, _host: &Host<'_>, pass: u32) -> Result<()> {
        match pass {
            0 => {
                let mut stats = self.lock_stats()?;
                let total = stats.total;
                let k = kept_count(total, self.density, self.count_rule);
                let mut targets = Vec::with_capacity(self.n_experts);
                for hist in &stats.hist {
                    if k == 0 {
                        targets.push(None);
                        continue;
                    }
                    let (bin, rank) = find_bin(hist, k).ok_or_else(|| {
                        Error::Message(format!(
                            "ties: the statistics pass counted fewer than {k} task-vector entries (internal error)"
                        ))
                    })?;
                    targets.push(Some((bin as u32, rank)));
                }
                if stats.hist.is_empty() {
                    targets = vec![None; self.n_experts];
                }
                stats.target = targets;
                for hist in &mut stats.hist {
                    hist.iter_mut().for_each(|c| *c = 0);
                }
                Ok(())
            }
            1 => {
                let mut stats = self.lock_stats()?;
                let mut thresholds = Vec::with_capacity(self.n_experts);
                for (hist, target) in stats.hist.iter().zip(&stats.target) {
                    match target {
                        None => thresholds.push(None),
                        Some((hi, rank)) => {
                            let (lo, _) = find_bin(hist, *rank).ok_or_else(|| {
                                Error::Message(
                                    "ties: the two statistics passes saw different task vectors; the inputs changed \
                                     during the merge"
                                        .to_string(),
                                )
                            })?;
                            thresholds.push(Some(f64::from(f32::from_bits((hi << 16) | lo as u32))));
                        }
                    }
                }
                if thresholds.is_empty() {
                    thresholds = vec![None; self.n_experts];
                }
                stats.hist = Vec::new();
                drop(stats);
                self.thresholds = Some(thresholds);
                Ok(())
            }
            2 => {
                let sum = self.lock_stats()?.sign_sum;
                self.majority = Some(sum.signum_or_zero());
                Ok(())
            }
            _ => Err(Error::Message(format!(
                "ties: the host finished statistics pass {pass}, but ties has only 3"
            ))),
        }
    }

    fn merge_tensor(
        &mut self,
        host: &Host<'_>,
        tensor: &TensorMeta<'_>,
        base: Option<Tensor>,
        experts: &[Tensor],
    ) -> Result<Tensor> {
        let base = need_base(base, tensor)?;
        if experts.len() != self.n_experts {
            return Err(Error::Message(format!(
                "tensor '{}': the instance was created for {} experts but got {}",
                tensor.name,
                self.n_experts,
                experts.len()
            )));
        }
        let taus = Self::task_vectors(host, base, experts)?;
        self.merge_taus(host, tensor, base, &taus)
    }
}

mergescope_plugin_api::export_plugin!(Ties);
