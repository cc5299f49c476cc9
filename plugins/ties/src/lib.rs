//! `ties`: TIES-Merging (Yadav et al., 2023): trim, elect sign, disjoint merge.
//!
//! The merge pass is elementwise for every setting, so the host may chunk any tensor: whatever
//! needs more than one element is computed beforehand in statistics passes and looked up per
//! chunk.
//!
//! With `trim_scope = global` the per-expert magnitude thresholds are taken over the whole model
//! with bounded memory: pass 0 counts |τ| per expert in 2¹⁶ bins keyed by the top 16 bits of the
//! f32 bit pattern (monotone in |τ|), pass 1 counts the low 16 bits of the values in the bin
//! holding the k-th largest, which pins down the k-th largest |τ| exactly (a two-digit radix
//! selection: linear time, 2¹⁶ counters per expert, no sort, no model-sized buffer). With
//! `zero_sign = reference` a pass 2 sums the elected signs over the model for the global majority
//! sign. Every one of these statistics is an integer sum over elements, so the global scope
//! reports `CAP_CHUNKED_STATISTICS`: the host streams the passes in chunks (in parallel), each
//! call counting its chunk into a histogram set of its own (no lock held while counting), and
//! the sums come out the same whatever the split or the order.
//!
//! With `trim_scope = tensor` the same passes run per tensor, and also accept chunks, so no
//! statistics pass holds a whole tensor (a 128k × 4096 embedding is 2 GB per input in f32): a
//! tensor the host hands over whole gets its per-expert thresholds (and, with `zero_sign =
//! reference`, its majority sign) at once in pass 0, by the same radix selection or by a direct
//! selection for small tensors; a tensor that comes in chunks is counted chunk by chunk into
//! histogram sets of its own (pass 0: top digits, pass 1: low digits, pass 2: sign votes), which
//! are summed when its last element has been counted. Both ways give the exact k-th largest |τ|,
//! so the thresholds, and the merged bits, do not depend on the chunking. The results are kept
//! by tensor name. A tensor's statistics serve only that tensor (`CAP_TENSOR_STATISTICS`), so
//! the host may run its passes and merge it while its inputs are still mapped, one tensor after
//! another, instead of reading the whole model once per pass.
//!
//! The statistics loops read the inputs in place where the host lends them (`view_f32`, ABI 1.4;
//! else copies), the host tensors released at once. A whole tensor's loops are split over the host's worker threads when it is large
//! (`Host::map_ranges`, the host's parallel extension: no thread pool of its own); those jobs never
//! call the host. Chunks already run in parallel on the host's workers, so each call counts on its
//! own thread. The loops refuse NaN task-vector entries, which no threshold can rank.
//!
//! Per chunk the merge is one fused sweep over copies of the chunk's inputs (`fused`): τ_t =
//! θ_t − θ0, the trim, the weight w_t (skipped for w_t = 1), the elected sign, the zero-sign rule,
//! the disjoint aggregation (for dis-mean with weights other than 1: the agreeing sum divided by
//! the agreeing weights) and θ0 + λ·τ_m, block by block in cache, with the same f32 operations in
//! the same order as the chain of host operations (`sub`, `trim_abs`, `scale`, `elect_sign`,
//! `disjoint_merge`, `weighted_sum`) it replaced, so the merged bits did not change. The sign
//! votes of the statistics passes weight the trimmed values the same way (the same f32 product).

use mergescope_plugin_api::abi::{
    CAP_CHUNKED_STATISTICS, CAP_ELEMENTWISE, CAP_NEEDS_BASE, CAP_TENSOR_STATISTICS, CAP_THREAD_SAFE,
};
use mergescope_plugin_api::sdk::PerTensor;
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput, TensorMeta,
};
use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

const HELP: &str = "TIES-Merging (Yadav et al., 2023). With task vectors τ_t = θ_t − θ0 (a base model is \
required):\n\
1. Trim: in each τ_t keep the entries with the largest magnitudes (fraction density_t), zero the rest, \
giving τ̃_t;\n\
2. Weight: u_t = w_t·τ̃_t (task_weights, default 1);\n\
3. Elect: per coordinate, s = sign(Σ_t u_t) (mass) or the sign of the count of positive minus \
negative u_t (count);\n\
4. Disjoint merge: aggregate only the non-zero u_t whose sign equals s: dis-mean = Σ u_t / Σ w_t over \
them (the weighted mean; with unit weights their plain mean; 0 if none agree), dis-sum = Σ u_t over \
them, dis-max = their largest |u_t| times s;\n\
5. θ = θ0 + λ·τ_merged.\n\
Parameters (defaults follow the paper and its original code; the alternatives reproduce other \
implementations, see seeds-002-004 §4.2 and §4.7):\n\
- density (per task, default 0.2, in [0, 1]): fraction kept by the trim (the paper's top-20%): one \
value for every expert, or one per expert in input order (mergekit's per-model density). Each expert's \
threshold comes from its own density, over the whole model (trim_scope = global) or per tensor.\n\
- task_weights (per task, default 1.0): w_t, mergekit's per-model weight; it multiplies the trimmed \
task vector before the election, so a heavy expert can outvote several light ones. A weight of 0 \
leaves the expert out.\n\
- normalize (default true): mergekit's normalize. With aggregation = dis-mean, true divides the \
agreeing Σ w_t·τ̃_t by the agreeing Σ w_t (mergekit's normalize: true; a divisor of 0 counts as 1) and \
false keeps the agreeing sum (= dis-sum, mergekit's normalize: false). It does not change dis-sum or \
dis-max, so the defaults (unit weights, normalize true) give every recipe written before these \
parameters existed its old result, bit for bit.\n\
- lambda (default 1.0): the paper tunes λ on validation data over 0.8..2.5; 1 is the usual choice \
without validation data (MIMA, CART's baselines). AdaMerging and FusionBench use 0.3 with dis-sum.\n\
- aggregation: dis-mean (default, the paper's), dis-sum (AdaMerging, FusionBench), dis-max.\n\
- trim_scope: global (default; the paper's and the original code's: the magnitude threshold of each \
expert is taken over the whole model, computed exactly in statistics passes with bounded memory) | \
tensor (mergekit: a threshold per tensor and expert).\n\
- count_rule: exact (default: k = round(density·n) of the n entries in scope, keep |τ| ≥ the k-th \
largest |τ|, ties at the threshold kept; k = 0 keeps nothing) | reference (the original code's \
kthvalue: int(n·density) + 1 entries kept, plus ties; density 1 keeps everything instead of raising) | \
mergekit (mergekit 0.1.5's k = max(1, int(density·n)) for 0 < density < 1, plus ties). mergekit keeps \
exactly k entries, breaking magnitude ties at the threshold in torch.argsort's order, which no \
deterministic rule reproduces; with count_rule = mergekit the results differ from mergekit's only \
where an expert has a magnitude tie at its threshold (docs/mergekit.md).\n\
- election: mass (default, everyone's: the sign of the summed trimmed values) | count (mergekit's \
`count`: majority of the signs).\n\
- zero_sign, for coordinates whose elected sign is 0 (exact cancellation or nothing kept): none \
(default, the paper read literally and MergeLM: nothing is kept there, result 0) | reference (the \
original code and FusionBench: the zeros are replaced by the majority sign(Σ_j s_j) over the whole \
model; with trim_scope = tensor the majority is taken per tensor; if that sum is 0 too the negative \
entries are kept, and dis-max gives 0 because it multiplies by the sign) | positive (mergekit: a \
coordinate with Σ ≥ 0 elects +).\n\
mergekit's `ties` (0.1.5) is trim_scope = tensor, count_rule = mergekit, election = mass, zero_sign = \
positive, aggregation = dis-mean, with density, weight (as task_weights), normalize and lambda carried \
over as they are (its `consensus_method: count` is election = count).\n\
Every tensor of every role takes part (the parameter-set policy is the host's).";

const BINS: usize = 1 << 16;

mod fused;

mergescope_plugin_api::choice_enum! {
    /// The disjoint aggregation of the entries that agree with the elected sign.
    enum Aggregation {
        Mean = "dis-mean",
        Sum = "dis-sum",
        Max = "dis-max",
    }
}

mergescope_plugin_api::choice_enum! {
    /// Where the magnitude thresholds are taken.
    enum Scope {
        Global = "global",
        Tensor = "tensor",
    }
}

mergescope_plugin_api::choice_enum! {
    /// How many entries the trim keeps.
    pub enum CountRule {
        /// k = round(density·n).
        Exact = "exact",
        /// int(n·density) + 1 (the original code's kthvalue), at most n.
        Reference = "reference",
        /// max(1, int(n·density)) for 0 < density < 1 (mergekit 0.1.5's `magnitude`).
        Mergekit = "mergekit",
    }
}

mergescope_plugin_api::choice_enum! {
    /// How the sign of a coordinate is elected.
    enum Election {
        Mass = "mass",
        Count = "count",
    }
}

mergescope_plugin_api::choice_enum! {
    /// What a coordinate whose elected sign is 0 becomes.
    enum ZeroSign {
        None = "none",
        Reference = "reference",
        Positive = "positive",
    }
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
        CountRule::Mergekit if density >= 1.0 => n as f64,
        CountRule::Mergekit if density <= 0.0 => 0.0,
        CountRule::Mergekit => product.floor().max(1.0),
    };
    if k <= 0.0 {
        0
    } else if k >= n as f64 {
        n
    } else {
        k as u64
    }
}

/// What the merge pass needs to know about one tensor with `trim_scope = tensor`.
#[derive(Clone, Debug, Default)]
struct TensorStats {
    /// Per expert: the magnitude threshold (None = keep nothing).
    thresholds: Vec<Option<f64>>,
    /// sign(Σ_j s_j) over the tensor (used with `zero_sign = reference`; 0 otherwise).
    majority: f64,
}

/// Per expert, a histogram of one digit of |τ| (`BINS` counters).
type Histograms = Vec<Vec<u64>>;

/// Integer sums of the statistics passes over a set of elements: the whole model (global scope)
/// or one tensor that comes in chunks (tensor scope). Being integers, they do not depend on how
/// the host split the elements or in which order the pieces came.
#[derive(Default)]
struct Counts {
    /// Elements counted in the current pass.
    seen: u64,
    /// Idle histogram sets of the current pass (0: counts by the top 16 bits of |τ|; 1: by the
    /// low 16 bits). A call takes one (or makes one), counts its piece into it without holding
    /// the lock and puts it back, so there are about as many as concurrent calls; they are
    /// summed when the pass is complete.
    spare: Vec<Histograms>,
    /// Per expert, after pass 0: (top 16 bits of the threshold, its rank inside that bin).
    target: Vec<Option<(u32, u64)>>,
    /// Σ_j s_j (pass 2), an integer so that the sum is exact in any order.
    sign_sum: i64,
}

/// State of the statistics passes (behind a mutex: the host may run a pass's tensors, or chunks
/// of them, on several threads for a thread-safe instance).
#[derive(Default)]
struct Stats {
    /// Global scope: the model's counts.
    global: Counts,
    /// Per-tensor statistics by tensor name (tensor scope).
    per_tensor: HashMap<String, TensorStats>,
    /// Tensor scope: the counts of the tensors that come in chunks, until their statistics are
    /// complete.
    partial: HashMap<String, Counts>,
}

/// The TIES method.
pub struct Ties {
    /// Per expert: the fraction kept by the trim.
    density: Vec<f64>,
    /// Per expert: w_t, multiplied into the trimmed task vector before the election.
    weights: Vec<f64>,
    /// With dis-mean: divide by the agreeing weights (false: the agreeing sum, i.e. dis-sum).
    normalize: bool,
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
    /// Tensor scope: the statistics of each tensor, once its last statistics pass is complete
    /// (`finish_tensor`, or `finish_pass` on hosts that do not finish tensors one by one).
    per_tensor: PerTensor<TensorStats>,
}

/// A statistics pass that ended with part of tensor `name` not counted (a host bug).
fn uncounted(name: &str, pass: u32) -> Error {
    Error::Message(format!(
        "tensor '{name}': ties statistics pass {pass} ended before every chunk of it was counted; the host skipped \
         part of the tensor (internal error)"
    ))
}

fn nan_error(tensor: &TensorMeta<'_>, expert: usize, element: Option<u64>) -> Error {
    let at = element.map_or_else(String::new, |j| format!(" at element {j}"));
    Error::Message(format!(
        "tensor '{}': the task vector of expert {expert} is NaN{at}; TIES cannot rank NaN magnitudes (check the \
         inputs)",
        tensor.name
    ))
}

/// Bits of |x| above this are NaN.
const INF_BITS: u32 = 0x7f80_0000;

/// Which 16-bit digit of the bit pattern of |τ| a histogram counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Digit {
    /// The top 16 bits.
    High,
    /// The low 16 bits of the entries whose top 16 bits are the given ones.
    Low(u32),
}

/// Elements whose |τ| bit patterns `count_digit` computes at once (in a vectorised loop) before
/// counting them.
const BLOCK: usize = 1024;

/// A histogram as the fixed-size array the counting loops index without bounds checks.
fn as_bins(hist: &mut [u64]) -> Result<&mut [u64; BINS]> {
    let len = hist.len();
    hist.try_into()
        .map_err(|_| Error::Message(format!("ties: a histogram has {len} bins, not {BINS} (internal error)")))
}

mergescope_plugin_api::avx2_dispatch! {
    /// Adds the histogram of a digit of |e_j − b_j| (τ exactly as the host computes it, in f32) to
    /// `hist`. `Err(j)`: τ_j is NaN (the first one). Works block by block: the bit patterns of a
    /// block and their maximum (NaN patterns are the largest) in one vectorised loop, then the counts.
    fn count_digit(hist: &mut [u64; BINS], e: &[f32], b: &[f32], digit: Digit) -> std::result::Result<(), usize> {
        let mut bits = [0u32; BLOCK];
        for (block, (e, b)) in e.chunks(BLOCK).zip(b.chunks(BLOCK)).enumerate() {
            let bits = &mut bits[..e.len().min(b.len())];
            let mut largest = 0u32;
            for ((m, x), y) in bits.iter_mut().zip(e).zip(b) {
                *m = (x - y).abs().to_bits();
                largest = largest.max(*m);
            }
            if largest > INF_BITS {
                let j = bits.iter().position(|&m| m > INF_BITS).unwrap_or(0);
                return Err(block * BLOCK + j);
            }
            match digit {
                Digit::High => bits.iter().for_each(|&m| hist[(m >> 16) as usize] += 1),
                Digit::Low(hi) => bits.iter().for_each(|&m| {
                    if m >> 16 == hi {
                        hist[(m & 0xffff) as usize] += 1;
                    }
                }),
            }
        }
        Ok(())
    }
}

/// Below this many elements per job the statistics loops of one tensor stay on one thread.
const MIN_PER_JOB: usize = 1 << 18;

/// `count_digit` over a whole tensor, split over the host's threads when it is large.
/// `Ok(Err(j))`: τ_j is NaN (the first one); `Err(_)`: a job failed.
fn par_count_digit(
    host: &Host<'_>,
    hist: &mut [u64; BINS],
    e: &[f32],
    b: &[f32],
    digit: Digit,
) -> Result<std::result::Result<(), usize>> {
    let n = e.len().min(b.len());
    if n < 2 * MIN_PER_JOB || host.threads() == 1 {
        // One job: count straight into `hist`.
        return Ok(count_digit(hist, &e[..n], &b[..n], digit));
    }
    let parts = host.map_ranges(n, MIN_PER_JOB, |r| {
        let mut local = vec![0u64; BINS];
        let counted = count_digit(as_bins(&mut local)?, &e[r.clone()], &b[r.clone()], digit);
        Ok::<_, Error>(counted.map(|()| local).map_err(|j| r.start + j))
    })?;
    for part in parts {
        match part? {
            Ok(local) => hist.iter_mut().zip(&local).for_each(|(h, c)| *h += c),
            Err(j) => return Ok(Err(j)),
        }
    }
    Ok(Ok(()))
}

/// Up to this many elements a tensor's k-th largest |τ| is selected directly instead of by the
/// radix histograms (whose 2¹⁶ bins would dominate).
const SMALL_TENSOR: usize = 1 << 14;

fn sgn(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

fn sgn_int(x: f32) -> i8 {
    if x > 0.0 {
        1
    } else if x < 0.0 {
        -1
    } else {
        0
    }
}

/// An expert that keeps something, as the sign-vote loops see it: its values, its magnitude
/// threshold and its weight w_t (as the f32 the host's `scale` multiplies by).
type Voter<'v> = (&'v [f32], f32, f32);

/// Σ_j s_j over `range` of a tensor (or chunk), where s_j is the raw elected sign of element j:
/// the sign of the f32 sum, in expert order, of the weighted trimmed τ (mass) or of their signs
/// (count), exactly like the host's `elect_sign` over the weighted trimmed task vectors (w·τ̃ is
/// the one f32 product the host's `scale` makes; w = 1 leaves τ̃ as it is).
fn sign_votes_in(b: &[f32], experts: &[Voter<'_>], count: bool, range: Range<usize>) -> i64 {
    let base = &b[range.clone()];
    let values: Vec<Voter<'_>> = experts
        .iter()
        .map(|(v, thr, w)| (&v[range.clone()], *thr, *w))
        .collect();
    let mut sum = 0i64;
    for (j, y) in base.iter().enumerate() {
        let mut total = 0f32;
        for (v, thr, w) in &values {
            let tau = v[j] - y;
            let trimmed = if tau.abs() >= *thr { tau } else { 0.0 };
            let weighted = if *w == 1.0 { trimmed } else { trimmed * w };
            total += if count { sgn(weighted) } else { weighted };
        }
        sum += i64::from(sgn_int(total));
    }
    sum
}

/// `sign_votes_in` over the whole of `b`, split over the host's threads when it is large.
fn sign_votes(host: &Host<'_>, b: &[f32], experts: &[Voter<'_>], count: bool) -> Result<i64> {
    if experts.is_empty() {
        return Ok(0);
    }
    let parts = host.map_ranges(b.len(), MIN_PER_JOB, |r| sign_votes_in(b, experts, count, r))?;
    Ok(parts.into_iter().sum())
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

/// The sum of histogram sets (integer counts, so the order does not matter); zeros when there
/// are none.
fn sum_sets(sets: Vec<Histograms>, n_experts: usize) -> Histograms {
    let mut sets = sets.into_iter();
    let mut sum = sets.next().unwrap_or_else(|| vec![vec![0u64; BINS]; n_experts]);
    for set in sets {
        for (acc, hist) in sum.iter_mut().zip(&set) {
            acc.iter_mut().zip(hist).for_each(|(a, c)| *a += c);
        }
    }
    sum
}

/// The error for a per-task list shorter than the experts (the host checks the length, so this
/// is a host/plugin mismatch).
fn per_task_error(name: &str, len: usize, expert: usize) -> Error {
    Error::Message(format!(
        "ties: parameter '{name}' has {len} values but expert {expert} was asked for; give one value for all \
         experts or one per expert"
    ))
}

/// The majority sign of a sum of votes, as the factor the merge pass uses.
fn majority_of(votes: i64) -> f64 {
    match votes.signum() {
        1 => 1.0,
        -1 => -1.0,
        _ => 0.0,
    }
}

impl Ties {
    fn lock_stats(&self) -> Result<MutexGuard<'_, Stats>> {
        self.stats
            .lock()
            .map_err(|_| Error::Message("ties: statistics state poisoned by an earlier failure".into()))
    }

    /// Global scope: the per-expert thresholds of the statistics passes.
    fn global_thresholds(&self, tensor: &TensorMeta<'_>) -> Result<&[Option<f64>]> {
        self.thresholds.as_deref().ok_or_else(|| {
            Error::Message(format!(
                "tensor '{}': ties with trim_scope=global needs the host's statistics passes, which did not run; \
                 use a host that supports prepare passes",
                tensor.name
            ))
        })
    }

    /// Thresholds and majority sign (0 where unused) for the tensor a chunk belongs to.
    fn lookup(&self, tensor: &TensorMeta<'_>) -> Result<(Cow<'_, [Option<f64>]>, f64)> {
        match self.scope {
            Scope::Global => {
                let thresholds = self.global_thresholds(tensor)?;
                let majority = if self.zero_sign == ZeroSign::Reference {
                    self.majority.ok_or_else(|| {
                        Error::Message(format!(
                            "tensor '{}': ties with zero_sign=reference needs the global sign pass, which did not run",
                            tensor.name
                        ))
                    })?
                } else {
                    0.0
                };
                Ok((Cow::Borrowed(thresholds), majority))
            }
            Scope::Tensor => {
                let stats = self.per_tensor.get(tensor, "ties with trim_scope=tensor")?;
                Ok((Cow::Owned(stats.thresholds), stats.majority))
            }
        }
    }

    /// The density of expert `t` (one per expert: the host broadcasts a single value).
    fn density_of(&self, t: usize) -> Result<f64> {
        self.density
            .get(t)
            .copied()
            .ok_or_else(|| per_task_error("density", self.density.len(), t))
    }

    /// The weight w_t of expert `t`.
    fn weight_of(&self, t: usize) -> Result<f64> {
        self.weights
            .get(t)
            .copied()
            .ok_or_else(|| per_task_error("task_weights", self.weights.len(), t))
    }

    /// The aggregation the merge pass runs: dis-mean without normalize is the agreeing sum.
    fn effective_aggregation(&self) -> Aggregation {
        match self.aggregation {
            Aggregation::Mean if !self.normalize => Aggregation::Sum,
            other => other,
        }
    }

    /// What a coordinate whose raw elected sign is 0 selects by (the zero-sign rule; `None`:
    /// it stays 0). For dis-max the sign is also what the magnitude is multiplied by.
    fn zero_fill(&self, majority: f64) -> Option<f32> {
        match self.zero_sign {
            ZeroSign::None => None,
            ZeroSign::Positive => Some(1.0),
            ZeroSign::Reference if majority != 0.0 => Some(majority as f32),
            // The original code's `where(s > 0, v > 0, v < 0)` with s = 0: the negative entries
            // are kept, but dis-max multiplies by s = 0.
            ZeroSign::Reference if self.aggregation == Aggregation::Max => None,
            ZeroSign::Reference => Some(-1.0),
        }
    }

    /// The disjoint aggregation of the merge pass, for the experts that vote (`active`: handle,
    /// threshold, w_t). dis-mean with weights other than 1 divides by the agreeing weights;
    /// with unit weights that is the plain mean, which is computed as such (the same bits as
    /// before weights existed).
    fn aggregate(&self, active: &[(Tensor, f64, f64)]) -> fused::Aggregate {
        match self.effective_aggregation() {
            Aggregation::Mean if active.iter().any(|(_, _, w)| *w != 1.0) => {
                fused::Aggregate::WeightedMean(active.iter().map(|(_, _, w)| *w as f32).collect())
            }
            Aggregation::Mean => fused::Aggregate::Mean,
            Aggregation::Sum => fused::Aggregate::Sum,
            Aggregation::Max => fused::Aggregate::Max,
        }
    }

    /// An expert's values, copied out of the host (whose tensor is released at once).
    fn read_expert<'h>(host: &Host<'h>, e: Tensor) -> Result<Cow<'h, [f32]>> {
        let values = host.view_f32(e)?;
        host.release(e)?;
        Ok(values)
    }

    /// Adds the histogram of a digit of |τ| for one expert to `hist` (NaN refused).
    fn expert_histogram(
        host: &Host<'_>,
        hist: &mut [u64],
        tensor: &TensorMeta<'_>,
        expert: usize,
        e: &[f32],
        b: &[f32],
        digit: Digit,
    ) -> Result<()> {
        par_count_digit(host, as_bins(hist)?, e, b, digit)?
            .map_err(|j| nan_error(tensor, expert, Some(tensor.offset + j as u64)))
    }

    /// The k-th largest |τ| (1 ≤ k ≤ n) of one expert on one tensor, exactly: by direct selection
    /// for small tensors, otherwise by the two-digit radix selection of the global passes.
    fn kth_largest(
        host: &Host<'_>,
        tensor: &TensorMeta<'_>,
        expert: usize,
        e: &[f32],
        b: &[f32],
        k: u64,
    ) -> Result<f64> {
        let internal = || {
            Error::Message(format!(
                "tensor '{}': ties lost count of the task-vector entries (internal error)",
                tensor.name
            ))
        };
        let n = e.len().min(b.len());
        if n <= SMALL_TENSOR {
            let mut bits = Vec::with_capacity(n);
            for (j, (x, y)) in e.iter().zip(b).enumerate() {
                let m = (x - y).abs().to_bits();
                if m > INF_BITS {
                    return Err(nan_error(tensor, expert, Some(tensor.offset + j as u64)));
                }
                bits.push(m);
            }
            let at = n.checked_sub(k as usize).ok_or_else(internal)?;
            let (_, kth, _) = bits.select_nth_unstable(at);
            return Ok(f64::from(f32::from_bits(*kth)));
        }
        let mut high = vec![0u64; BINS];
        Self::expert_histogram(host, &mut high, tensor, expert, e, b, Digit::High)?;
        let (hi, rank) = find_bin(&high, k).ok_or_else(internal)?;
        let hi = hi as u32;
        let mut low = high;
        low.iter_mut().for_each(|c| *c = 0);
        Self::expert_histogram(host, &mut low, tensor, expert, e, b, Digit::Low(hi))?;
        let (lo, _) = find_bin(&low, rank).ok_or_else(internal)?;
        Ok(f64::from(f32::from_bits((hi << 16) | lo as u32)))
    }

    /// Per-tensor thresholds (and majority sign) for trim_scope = tensor, from the whole tensor.
    fn tensor_statistics(
        &self,
        host: &Host<'_>,
        tensor: &TensorMeta<'_>,
        b: &[f32],
        experts: &[Tensor],
    ) -> Result<TensorStats> {
        let reference = self.zero_sign == ZeroSign::Reference;
        let mut thresholds = Vec::with_capacity(experts.len());
        let mut kept = Vec::new();
        for (t, e) in experts.iter().enumerate() {
            host.check_cancelled()?;
            let k = kept_count(b.len() as u64, self.density_of(t)?, self.count_rule);
            if k == 0 {
                host.release(*e)?;
                thresholds.push(None);
                continue;
            }
            let values = Self::read_expert(host, *e)?;
            let thr = Self::kth_largest(host, tensor, t, &values, b, k)?;
            thresholds.push(Some(thr));
            if reference {
                kept.push((values, thr as f32, self.weight_of(t)? as f32));
            }
        }
        let majority = if reference {
            let votes: Vec<Voter<'_>> = kept.iter().map(|(v, thr, w)| (v.as_ref(), *thr, *w)).collect();
            majority_of(sign_votes(host, b, &votes, self.election == Election::Count)?)
        } else {
            0.0
        };
        Ok(TensorStats { thresholds, majority })
    }

    /// Passes 0 and 1 over one tensor or chunk, into the counts `which` picks from the state (the
    /// model's or the tensor's): one digit of |τ| per expert counted into a histogram set taken
    /// from their spares, without holding the lock (so concurrent chunks do not wait for each
    /// other); the set put back and the piece's own length (`b.len()`, not the full tensor's)
    /// added to `seen`. Returns the state, still locked, for the caller to look at the counts.
    fn count_piece<'s>(
        &'s self,
        host: &Host<'_>,
        pass: u32,
        tensor: &TensorMeta<'_>,
        b: &[f32],
        experts: &[Tensor],
        which: &dyn Fn(&mut Stats) -> &mut Counts,
    ) -> Result<MutexGuard<'s, Stats>> {
        let (spare, targets) = {
            let mut stats = self.lock_stats()?;
            let counts = which(&mut stats);
            if pass == 1 && counts.target.len() != self.n_experts {
                return Err(Error::Message(format!(
                    "tensor '{}': ties ran its statistics passes out of order (internal error)",
                    tensor.name
                )));
            }
            (counts.spare.pop(), counts.target.clone())
        };
        let mut hists = spare.unwrap_or_else(|| vec![vec![0u64; BINS]; self.n_experts]);
        Self::count_experts(host, tensor, b, experts, pass, &targets, &mut hists)?;
        let mut stats = self.lock_stats()?;
        let counts = which(&mut stats);
        counts.spare.push(hists);
        counts.seen += b.len() as u64;
        Ok(stats)
    }

    /// Adds one digit of |τ| of every expert of a tensor or chunk to `hists`: the top digits in
    /// pass 0, later the low digits inside each expert's target bin (an expert without one keeps
    /// nothing and is skipped).
    fn count_experts(
        host: &Host<'_>,
        tensor: &TensorMeta<'_>,
        b: &[f32],
        experts: &[Tensor],
        pass: u32,
        targets: &[Option<(u32, u64)>],
        hists: &mut Histograms,
    ) -> Result<()> {
        for (t, (e, hist)) in experts.iter().zip(hists).enumerate() {
            host.check_cancelled()?;
            let digit = match (pass, targets.get(t).copied().flatten()) {
                (0, _) => Digit::High,
                (_, Some((hi, _))) => Digit::Low(hi),
                (_, None) => {
                    host.release(*e)?;
                    continue;
                }
            };
            let values = Self::read_expert(host, *e)?;
            count_digit(as_bins(hist)?, &values, b, digit)
                .map_err(|j| nan_error(tensor, t, Some(tensor.offset + j as u64)))?;
        }
        Ok(())
    }

    /// Per expert, from the top-digit histograms of `n` entries: the bin of its threshold and
    /// its rank inside the bin (`None`: its density keeps nothing).
    fn targets_from(&self, hists: &Histograms, n: u64) -> Result<Vec<Option<(u32, u64)>>> {
        hists
            .iter()
            .enumerate()
            .map(|(t, hist)| {
                // Each expert's own density fixes its own k.
                let k = kept_count(n, self.density_of(t)?, self.count_rule);
                if k == 0 {
                    return Ok(None);
                }
                let (bin, rank) = find_bin(hist, k).ok_or_else(|| {
                    Error::Message(format!(
                        "ties: the statistics pass counted fewer than {k} task-vector entries (internal error)"
                    ))
                })?;
                Ok(Some((bin as u32, rank)))
            })
            .collect()
    }

    /// Per expert, its threshold from the low-digit histograms inside its target bin.
    fn thresholds_from(hists: &Histograms, targets: &[Option<(u32, u64)>]) -> Result<Vec<Option<f64>>> {
        hists
            .iter()
            .zip(targets)
            .map(|(hist, target)| match target {
                None => Ok(None),
                Some((hi, rank)) => {
                    let (lo, _) = find_bin(hist, *rank).ok_or_else(|| {
                        Error::Message(
                            "ties: the two statistics passes saw different task vectors; the inputs changed during \
                             the merge"
                                .to_string(),
                        )
                    })?;
                    Ok(Some(f64::from(f32::from_bits((hi << 16) | lo as u32))))
                }
            })
            .collect()
    }

    /// Σ_j s_j over one tensor or chunk with the given per-expert thresholds (pass 2).
    fn chunk_sign_votes(
        &self,
        host: &Host<'_>,
        b: &[f32],
        experts: &[Tensor],
        thresholds: &[Option<f64>],
    ) -> Result<i64> {
        let mut kept = Vec::new();
        for (t, (e, thr)) in experts.iter().zip(thresholds).enumerate() {
            host.check_cancelled()?;
            match thr {
                Some(thr) => kept.push((Self::read_expert(host, *e)?, *thr as f32, self.weight_of(t)? as f32)),
                None => host.release(*e)?,
            }
        }
        let votes: Vec<Voter<'_>> = kept.iter().map(|(v, thr, w)| (v.as_ref(), *thr, *w)).collect();
        Ok(sign_votes_in(b, &votes, self.election == Election::Count, 0..b.len()))
    }

    /// Tensor scope, one chunk of a tensor that comes in chunks: pass 0 counts the top digits of
    /// |τ| per expert, pass 1 the low digits inside each expert's threshold bin, pass 2 the sign
    /// votes; the call that counts the tensor's last element turns the sums into the tensor's
    /// thresholds (pass 1) or majority sign (pass 2).
    fn tensor_chunk_pass(
        &self,
        host: &Host<'_>,
        pass: u32,
        tensor: &TensorMeta<'_>,
        b: &[f32],
        experts: &[Tensor],
    ) -> Result<()> {
        let internal = |what: &str| {
            Error::Message(format!(
                "tensor '{}': ties {what} in statistics pass {pass} (internal error)",
                tensor.name
            ))
        };
        if pass == 2 {
            let thresholds = self
                .lock_stats()?
                .per_tensor
                .get(tensor.name)
                .map(|s| s.thresholds.clone())
                .ok_or_else(|| internal("found no thresholds"))?;
            let sum = self.chunk_sign_votes(host, b, experts, &thresholds)?;
            let mut stats = self.lock_stats()?;
            let part = stats.partial.entry(tensor.name.to_owned()).or_default();
            part.sign_sum += sum;
            part.seen += b.len() as u64;
            if part.seen == tensor.full_numel {
                let votes = part.sign_sum;
                stats.partial.remove(tensor.name);
                let entry = stats
                    .per_tensor
                    .get_mut(tensor.name)
                    .ok_or_else(|| internal("lost the thresholds"))?;
                entry.majority = majority_of(votes);
            }
            return Ok(());
        }
        let name = tensor.name;
        let mut stats = self.count_piece(host, pass, tensor, b, experts, &|s: &mut Stats| {
            s.partial.entry(name.to_owned()).or_default()
        })?;
        let part = stats.partial.entry(name.to_owned()).or_default();
        if part.seen < tensor.full_numel {
            return Ok(());
        }
        // The tensor is complete in this pass: its sets summed (integer counts, any order).
        let sum = sum_sets(std::mem::take(&mut part.spare), self.n_experts);
        part.seen = 0;
        if pass == 0 {
            // Only the targets wait for pass 1 (no histograms: every chunked tensor waits).
            part.target = self.targets_from(&sum, tensor.full_numel)?;
            return Ok(());
        }
        let thresholds = Self::thresholds_from(&sum, &part.target)?;
        if self.zero_sign == ZeroSign::Reference {
            // Pass 2 counts the sign votes with these thresholds.
            part.target.clear();
        } else {
            stats.partial.remove(tensor.name);
        }
        stats.per_tensor.insert(
            tensor.name.to_owned(),
            TensorStats {
                thresholds,
                majority: 0.0,
            },
        );
        Ok(())
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
            capabilities: CAP_THREAD_SAFE | CAP_NEEDS_BASE | CAP_ELEMENTWISE,
            params: vec![
                ParamSpec::float(
                    "density",
                    0.2,
                    "Fraction of each task vector's entries kept by the magnitude trim (one for all experts, or one per expert).",
                )
                .range(0.0, 1.0)
                .per_task(),
                ParamSpec::float(
                    "task_weights",
                    1.0,
                    "Weight w_t multiplying each expert's trimmed task vector before the sign election (mergekit's weight).",
                )
                .per_task(),
                ParamSpec::bool(
                    "normalize",
                    true,
                    "With dis-mean: divide the agreeing Σ w·τ by the agreeing Σ w (true) or keep the sum (false, = dis-sum).",
                ),
                ParamSpec::float("lambda", 1.0, "Scaling coefficient λ of the merged task vector."),
                ParamSpec::choice_of(
                    "aggregation",
                    Aggregation::Mean,
                    "Disjoint aggregation of the entries that agree with the elected sign.",
                ),
                ParamSpec::choice_of(
                    "trim_scope",
                    Scope::Global,
                    "Magnitude threshold over the whole model (paper) or per tensor (mergekit).",
                ),
                ParamSpec::choice_of(
                    "count_rule",
                    CountRule::Exact,
                    "Entries kept: round(density·n), the original code's int(n·density)+1, or mergekit's max(1, int(density·n)); ties at the threshold kept.",
                ),
                ParamSpec::choice_of(
                    "election",
                    Election::Mass,
                    "Sign election by the summed values (mass) or by the number of positive/negative entries.",
                ),
                ParamSpec::choice_of(
                    "zero_sign",
                    ZeroSign::None,
                    "Where the elected sign is 0: keep nothing, use the model-wide majority sign (original code), or + (mergekit).",
                ),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        // The host validated every value against the schema (density in [0, 1], λ and the
        // weights finite, one value per expert).
        let density = params.per_task("density")?;
        let weights = params.per_task("task_weights")?;
        let normalize = params.bool("normalize")?;
        let lambda = params.float("lambda")?;
        let aggregation = params.choice_of("aggregation")?;
        let scope = params.choice_of("trim_scope")?;
        let count_rule = params.choice_of("count_rule")?;
        let election = params.choice_of("election")?;
        let zero_sign = params.choice_of("zero_sign")?;
        Ok(Ties {
            density,
            weights,
            normalize,
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
            per_tensor: PerTensor::default(),
        })
    }

    fn capabilities(&self) -> Option<u64> {
        // Everything that spans more than one element (thresholds, majority signs) is fixed by
        // the statistics passes, so every element merges independently. The statistics, global
        // or per tensor, are integer sums over elements, so they accept chunks too.
        // Per-tensor statistics serve their own tensor only, so the host may take each tensor's
        // passes and merge one tensor after another while its inputs are at hand.
        let per_tensor = if self.scope == Scope::Tensor {
            CAP_TENSOR_STATISTICS
        } else {
            0
        };
        Some(CAP_THREAD_SAFE | CAP_NEEDS_BASE | CAP_ELEMENTWISE | CAP_CHUNKED_STATISTICS | per_tensor)
    }

    fn prepare_passes(&self) -> u32 {
        // Whole tensors need only pass 0; the later passes serve tensors that come in chunks.
        match self.zero_sign {
            ZeroSign::Reference => 3,
            _ => 2,
        }
    }

    fn prepare_tensor(&mut self, host: &Host<'_>, pass: u32, input: &TensorInput<'_>) -> Result<()> {
        let (tensor, base, experts) = (&input.meta, input.base, input.experts);
        host.check_cancelled()?;
        let base = tensor.require_base(base, "ties")?;
        if pass >= self.prepare_passes() {
            return Err(Error::Message(format!(
                "ties: the host asked for statistics pass {pass}, but ties has only {}",
                self.prepare_passes()
            )));
        }
        let whole = tensor.offset == 0 && host.numel(base)? as u64 == tensor.full_numel;
        if self.scope == Scope::Tensor && whole && pass > 0 {
            // A whole tensor got all its statistics in pass 0.
            return Ok(());
        }
        // The statistics loops read the inputs through views (copies where the host cannot lend
        // them); the host tensors are released at once.
        let b = host.view_f32(base)?;
        host.release(base)?;
        match (self.scope, pass) {
            (Scope::Tensor, _) if whole => {
                let stats = self.tensor_statistics(host, tensor, &b, experts)?;
                self.lock_stats()?.per_tensor.insert(tensor.name.to_owned(), stats);
            }
            (Scope::Tensor, _) => self.tensor_chunk_pass(host, pass, tensor, &b, experts)?,
            (Scope::Global, 0 | 1) => {
                // The model's counts are complete only in `finish_pass`.
                drop(self.count_piece(host, pass, tensor, &b, experts, &|s: &mut Stats| &mut s.global)?);
            }
            (Scope::Global, _) => {
                let sum = self.chunk_sign_votes(host, &b, experts, self.global_thresholds(tensor)?)?;
                self.lock_stats()?.global.sign_sum += sum;
            }
        }
        Ok(())
    }

    fn finish_tensor(&mut self, _host: &Host<'_>, pass: u32, tensor: &TensorMeta<'_>) -> Result<()> {
        if self.scope != Scope::Tensor || pass + 1 != self.prepare_passes() {
            return Ok(());
        }
        let mut stats = self.lock_stats()?;
        if stats.partial.get(tensor.name).is_some_and(|p| p.seen != 0) {
            return Err(uncounted(tensor.name, pass));
        }
        if let Some(done) = stats.per_tensor.remove(tensor.name) {
            drop(stats);
            self.per_tensor.insert(tensor.name.to_owned(), done);
        }
        Ok(())
    }

    fn finish_pass(&mut self, _host: &Host<'_>, pass: u32) -> Result<()> {
        match (self.scope, pass) {
            (Scope::Tensor, _) => {
                let mut stats = self.lock_stats()?;
                if let Some(name) = stats.partial.iter().find_map(|(name, p)| (p.seen != 0).then_some(name)) {
                    return Err(uncounted(name, pass));
                }
                // The tensors `finish_tensor` did not finish (all of them, on a host older than
                // ABI 1.5).
                if pass + 1 == self.prepare_passes() {
                    for (name, done) in stats.per_tensor.drain() {
                        self.per_tensor.insert(name, done);
                    }
                }
                Ok(())
            }
            (Scope::Global, 0) => {
                let mut stats = self.lock_stats()?;
                let global = &mut stats.global;
                let mut hists = sum_sets(std::mem::take(&mut global.spare), self.n_experts);
                // Each expert's k comes from the elements of the whole model.
                global.target = self.targets_from(&hists, std::mem::take(&mut global.seen))?;
                // The set is reused, zeroed, by pass 1.
                hists.iter_mut().for_each(|hist| hist.iter_mut().for_each(|c| *c = 0));
                global.spare.push(hists);
                Ok(())
            }
            (Scope::Global, 1) => {
                let mut stats = self.lock_stats()?;
                let global = &mut stats.global;
                let hists = sum_sets(std::mem::take(&mut global.spare), self.n_experts);
                let thresholds = Self::thresholds_from(&hists, &global.target)?;
                drop(stats);
                self.thresholds = Some(thresholds);
                Ok(())
            }
            (Scope::Global, 2) => {
                let votes = self.lock_stats()?.global.sign_sum;
                self.majority = Some(majority_of(votes));
                Ok(())
            }
            _ => Err(Error::Message(format!(
                "ties: the host finished statistics pass {pass}, but ties has only {}",
                self.prepare_passes()
            ))),
        }
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let (tensor, experts) = (&input.meta, input.experts);
        let base = input.require_base("ties")?;
        let (thresholds, majority) = self.lookup(tensor)?;
        // The experts that keep something (a threshold) with a weight other than 0: the others
        // neither vote nor agree.
        let mut active = Vec::with_capacity(experts.len());
        for (t, (e, thr)) in experts.iter().zip(thresholds.iter()).enumerate() {
            let w = self.weight_of(t)?;
            match *thr {
                Some(thr) if w != 0.0 => active.push((*e, thr, w)),
                _ => host.release(*e)?,
            }
        }
        if active.is_empty() {
            // Every expert keeps nothing (or has weight 0): τ_m = 0 and θ = θ0.
            return host.affine(base, 1.0, 0.0);
        }
        let shape = host.shape(base)?;
        let b = Self::read_expert(host, base)?.into_owned();
        let mut values = Vec::with_capacity(active.len());
        for (e, _, _) in &active {
            host.check_cancelled()?;
            values.push(Self::read_expert(host, *e)?);
        }
        let voters: Vec<fused::Voter<'_>> = values
            .iter()
            .zip(&active)
            .map(|(v, (_, thr, w))| fused::Voter {
                values: v,
                // `trim_abs` compares with the threshold as f32; a threshold of 0 keeps every entry.
                threshold: if *thr > 0.0 { *thr as f32 } else { 0.0 },
                weight: (*w != 1.0).then_some(*w as f32),
            })
            .collect();
        let plan = fused::Plan {
            count: self.election == Election::Count,
            fill: self.zero_fill(majority),
            aggregate: self.aggregate(&active),
            lambda: self.lambda as f32,
        };
        // The result is written over the copy of θ0.
        let mut out = b;
        fused::merge(&mut out, &voters, &plan);
        host.from_f32(&out, &shape)
    }
}

mergescope_plugin_api::export_plugin!(Ties);
