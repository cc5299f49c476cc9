//! `dare`: DARE, Drop And REscale (Yu et al., 2024, "Language Models are Super Mario").
//!
//! u_t = w_t·r_t·(m_t ⊙ τ_t) with m_t ~ Bernoulli(1 − p_t) drawn by the host's counter-based
//! generator, so a merge is reproducible from its seed whatever the device or chunking; the u_t
//! are summed (mergekit's dare_linear) or go through a TIES sign election (dare_ties), with
//! mergekit's `normalize` divisors. Unit weights take the exact operations of the unweighted
//! method, so recipes from before per-expert weights give the same bits.
//!
//! The merge is one fused sweep over copies of the inputs (`fused`): the host draws the masks
//! (`bernoulli_mask`), the plugin makes m_t ⊙ τ_t and combines (weighted sum, or sign election and
//! disjoint sum or mean) block by block in cache, with the same f32 operations in the same order
//! as the chain of host operations it replaced, so the merged bits did not change. The l1 rescale
//! needs ‖τ_t‖₁ / ‖m_t ⊙ τ_t‖₁ over the whole tensor before any element can be combined: a
//! statistics pass takes the two norms, and the merge pass is then elementwise like the others.
//! The norms are the f64 sums of the host's `reduce` in its lane order (element i to lane i mod 8,
//! each lane in element order; summing chunks apart and adding the partials would change the last
//! bits), so the pass asks for ordered chunks (`CAP_ORDERED_STATISTICS`, ABI 1.4): the host hands
//! each tensor's chunks over in index order and the running sums carry from one chunk to the
//! next, for all experts side by side, with the masks drawn a block at a time. A tensor's factors
//! depend on its own norms only (`CAP_TENSOR_STATISTICS`, ABI 1.5), so the host may merge each
//! tensor right after its statistics, while its inputs are still mapped. The masks the statistics
//! pass draws are kept as bits (at most 64 MiB, `kept_masks`) for that tensor's merge, which then
//! does not draw them again; beyond that no statistics or merge call holds more than a chunk.

use mergescope_plugin_api::abi::{
    CAP_CHUNKED_STATISTICS, CAP_ELEMENTWISE, CAP_NEEDS_BASE, CAP_ORDERED_STATISTICS, CAP_TENSOR_STATISTICS,
    CAP_THREAD_SAFE,
};
use mergescope_plugin_api::sdk::PerTensor;
use mergescope_plugin_api::sdk::sums::LaneSum;
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput, TensorMeta,
};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

const HELP: &str = "DARE, Drop And REscale (Yu et al., 2024). With task vectors τ_t = θ_t − θ0 (a base \
model is required), each expert's task vector is sparsified at random, rescaled and weighted:\n\
  u_t = w_t·r_t·(m_t ⊙ τ_t),  m_t,j ~ Bernoulli(1 − p_t) i.i.d. (1 = kept),\n\
then combined: θ = θ0 + λ·Σ_t u_t (combine = sum, optionally / Σ_t w_t) or θ = θ0 + λ·TIES(u) \
(combine = ties or ties-sum).\n\
Parameters:\n\
- drop_rate p_t (per task, default 0.5, in [0, 1]): probability of dropping each entry of expert t's \
task vector; one value for every expert or one per expert in input order. mergekit's per-model \
density is 1 − p_t. p_t = 0 keeps every entry (τ̃ = τ); p_t = 1 drops every entry of that expert \
(all experts at 1 give θ = θ0; never NaN, unlike FusionBench's unconditional 1/(1 − p)).\n\
- task_weights (per task, default 1.0): w_t, mergekit's per-model weight.\n\
- rescale (default inverse): inverse = r_t = 1/(1 − p_t), the paper's rescale (also MergeLM with \
--use_weight_rescale and FusionBench), which keeps E[r_t·m_t ⊙ τ_t] = τ_t; l1 = mergekit's rescale \
since 2024-04 (PR #245, its rescale: true, the default of dare_linear and dare_ties): r_t = ‖τ_t‖₁ / \
‖m_t ⊙ τ_t‖₁ per tensor, left at 1 if either norm is below 1e-7; none = r = 1 (MergeLM's command-line \
default, mergekit's rescale: false).\n\
- combine (default sum): sum = DARE followed by task arithmetic, θ0 + λ·Σ_t u_t (the paper's use, \
mergekit's dare_linear); ties = the original DARE-TIES, without trimming: per coordinate the sign s of \
Σ_t u_t is elected (mass), and the non-zero u_t that agree with it are averaged with their weights, \
Σ u_t / Σ w_t over them (with unit weights their plain mean; mergekit's dare_ties with normalize: \
true); ties-sum = the same election, then the agreeing Σ u_t (mergekit's dare_ties with its default \
normalize: false). A coordinate whose elected sign is 0 gets 0 (mergekit elects + where Σ_t u_t is \
exactly 0).\n\
- normalize (default false, mergekit's normalize): with combine = sum, divide by Σ_t w_t over every \
expert (left undivided when |Σ_t w_t| < 1e-8); with ties-sum, divide by the agreeing Σ_t w_t (a \
divisor of 0 counts as 1), which makes it ties; ties always divides. The default false leaves every \
recipe written before these parameters existed with its old result, bit for bit (ties was the mean \
already).\n\
- lambda (default 1.0): scaling of the combined task vector (1 = the paper's \"add to the base\").\n\
mergekit's dare_linear is combine = sum, rescale = l1, drop_rate = 1 − density, task_weights = weight, \
normalize and lambda as they are; its dare_ties is combine = ties-sum (normalize: false) or ties \
(normalize: true) with the same mapping. mergekit draws its masks from torch's generator, so the two \
agree on the expected result and the kept fractions, not draw for draw.\n\
Randomness: the mask of expert t on tensor `name` uses the seed s_t = splitmix64(splitmix64(seed XOR \
fnv1a64(name)) XOR t) (t 0-based, fnv1a64 of the UTF-8 name), and element j of the full tensor gets \
the host's draw bernoulli(s_t, j, 1 − p). The same seed therefore gives the same merge on any device, \
thread count or chunk size. Every tensor of every role is dropped (no linear-weights-only scope).";

mergescope_plugin_api::choice_enum! {
    /// How the kept entries are rescaled.
    enum Rescale {
        /// 1/(1 − p) (paper).
        Inverse = "inverse",
        /// ‖τ‖₁ / ‖m ⊙ τ‖₁ per tensor (mergekit).
        L1 = "l1",
        /// No rescaling.
        None = "none",
    }
}

mergescope_plugin_api::choice_enum! {
    /// How the sparsified task vectors are combined.
    enum Combine {
        /// θ0 + λ·Σ u (optionally / Σ w).
        Sum = "sum",
        /// Mass sign election and weighted disjoint mean on u, no trimming.
        Ties = "ties",
        /// Mass sign election and disjoint sum on u (weighted mean with normalize).
        TiesSum = "ties-sum",
    }
}

mod fused;
mod kept_masks;

/// Elements of the masks the l1 rescale draws at a time over a whole tensor: small enough that
/// the masks of every expert are still in cache when the norms and m ⊙ τ are taken from them
/// (with blocks of 2²² elements those loops waited on memory for the masks).
const MASK_BLOCK: usize = 1 << 16;

/// The DARE method.
pub struct Dare {
    /// Per expert: the drop probability p_t.
    drop_rate: Vec<f64>,
    /// Per expert: the weight w_t.
    weights: Vec<f64>,
    normalize: bool,
    rescale: Rescale,
    combine: Combine,
    lambda: f64,
    seed: u64,
    /// The l1 statistics pass's running sums, by tensor (while its chunks come in) and the
    /// rescale factors of the tensors it has finished.
    l1: Mutex<L1Pass>,
    /// After the l1 statistics pass: per tensor, r_t of every expert (1 where nothing is drawn).
    l1_factors: PerTensor<Vec<f64>>,
}

/// Where an expert's mask over a merge chunk comes from.
enum ChunkMask<'a> {
    /// Drawn by the host for this chunk.
    Drawn(std::borrow::Cow<'a, [f32]>),
    /// Kept by the statistics pass for the whole tensor.
    Kept(&'a kept_masks::MaskBits),
}

/// The l1 statistics pass in progress.
#[derive(Default)]
struct L1Pass {
    /// Tensors whose chunks have not all come: elements summed so far, and per expert ‖τ_t‖₁
    /// and ‖m_t ⊙ τ_t‖₁ of those elements.
    running: HashMap<String, (u64, Vec<LaneSum>, Vec<LaneSum>)>,
    /// Tensors done: r_t per expert.
    done: HashMap<String, Vec<f64>>,
    /// The masks drawn for the norms, kept for the merge.
    kept: kept_masks::KeptMasks,
}

/// The seed rule of the masks, shared with the other plugins through the SDK (re-exported so
/// tests and users of this crate keep their paths).
pub use mergescope_plugin_api::sdk::{expert_seed, fnv1a64, splitmix64};

impl MergeMethod for Dare {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "dare",
            name: "DARE",
            version: "",
            description: "Randomly drops task-vector entries, rescales the rest, and adds them to the base.",
            help: HELP,
            capabilities: CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::float(
                    "drop_rate",
                    0.5,
                    "Probability p of dropping each task-vector entry (one for all experts, or one per expert; mergekit's density is 1 − p).",
                )
                .range(0.0, 1.0)
                .per_task(),
                ParamSpec::choice_of(
                    "rescale",
                    Rescale::Inverse,
                    "Rescale of kept entries: 1/(1−p) (paper), L1-norm match per tensor (mergekit), or none.",
                ),
                ParamSpec::choice_of(
                    "combine",
                    Combine::Sum,
                    "How the sparsified task vectors are combined: task arithmetic (dare_linear), TIES sign election + weighted disjoint mean, or + disjoint sum (dare_ties).",
                ),
                ParamSpec::float("lambda", 1.0, "Scaling coefficient λ of the combined task vector."),
                ParamSpec::float("task_weights", 1.0, "Weight w_t of each expert's sparsified task vector (mergekit's weight).")
                    .per_task(),
                ParamSpec::bool(
                    "normalize",
                    false,
                    "Divide by the summed weights (sum: all of them; ties-sum: the agreeing ones, as ties always does).",
                ),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        // The host validated every value against the schema (drop_rate in [0, 1], λ and the weights
        // finite, one value per expert).
        let drop_rate = params.per_task("drop_rate")?;
        let weights = params.per_task("task_weights")?;
        let normalize = params.bool("normalize")?;
        let rescale = params.choice_of("rescale")?;
        let combine = params.choice_of("combine")?;
        let lambda = params.float("lambda")?;
        if drop_rate.len() != weights.len() {
            return Err(Error::Message(format!(
                "dare: parameter 'drop_rate' has {} values and 'task_weights' {}; give one value for all experts or \
                 one per expert for each",
                drop_rate.len(),
                weights.len()
            )));
        }
        Ok(Dare {
            drop_rate,
            weights,
            normalize,
            rescale,
            combine,
            lambda,
            seed: ctx.seed,
            l1: Mutex::new(L1Pass::default()),
            l1_factors: PerTensor::default(),
        })
    }

    fn capabilities(&self) -> Option<u64> {
        // Every element merges on its own (the masks are drawn per element of the full tensor,
        // whatever the chunking); the l1 rescale's whole-tensor norms come from a statistics
        // pass that sees each tensor's chunks in order.
        let statistics = if self.rescale == Rescale::L1 {
            CAP_CHUNKED_STATISTICS | CAP_ORDERED_STATISTICS | CAP_TENSOR_STATISTICS
        } else {
            0
        };
        Some(CAP_THREAD_SAFE | CAP_NEEDS_BASE | CAP_ELEMENTWISE | statistics)
    }

    fn prepare_passes(&self) -> u32 {
        u32::from(self.rescale == Rescale::L1)
    }

    fn prepare_tensor(&mut self, host: &Host<'_>, pass: u32, input: &TensorInput<'_>) -> Result<()> {
        let (tensor, experts) = (&input.meta, input.experts);
        let base = input.require_base("dare")?;
        if pass != 0 || self.rescale != Rescale::L1 {
            return Err(Error::Message(format!(
                "dare: the host asked for statistics pass {pass}, but dare has {}",
                self.prepare_passes()
            )));
        }
        self.l1_chunk(host, tensor, base, experts)
    }

    fn finish_pass(&mut self, _host: &Host<'_>, _pass: u32) -> Result<()> {
        let mut l1 = self.lock_l1()?;
        if let Some(name) = l1.running.keys().next() {
            return Err(Error::Message(format!(
                "tensor '{name}': the l1 pass of dare ended before every chunk of it was summed; the host skipped \
                 part of the tensor (internal error)"
            )));
        }
        // The tensors `finish_tensor` did not take (all of them, on a host older than ABI 1.5).
        for (name, factors) in std::mem::take(&mut l1.done) {
            self.l1_factors.insert(name, factors);
        }
        Ok(())
    }

    fn finish_tensor(&mut self, _host: &Host<'_>, _pass: u32, tensor: &TensorMeta<'_>) -> Result<()> {
        let factors = self.lock_l1()?.done.remove(tensor.name);
        if let Some(factors) = factors {
            self.l1_factors.insert(tensor.name.to_owned(), factors);
        }
        Ok(())
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let (tensor, experts) = (&input.meta, input.experts);
        let base = input.require_base("dare")?;
        if experts.len() != self.drop_rate.len() {
            return Err(Error::Message(format!(
                "tensor '{}': dare was created for {} experts but got {} (internal error)",
                tensor.name,
                self.drop_rate.len(),
                experts.len()
            )));
        }
        if self.drop_rate.iter().all(|p| *p >= 1.0) {
            // Everything is dropped: τ̃ = 0 and θ = θ0 (no 0/0).
            return host.affine(base, 1.0, 0.0);
        }
        // The experts that add something: (input t, its handle, p_t, w_t). Every entry dropped,
        // or weight 0: nothing to add, nothing to vote (its weight still counts in the divisor
        // of combine = sum with normalize).
        let mut active = Vec::with_capacity(experts.len());
        for (t, (e, (p, w))) in experts.iter().zip(self.drop_rate.iter().zip(&self.weights)).enumerate() {
            if *p >= 1.0 || *w == 0.0 {
                host.release(*e)?;
            } else {
                active.push((t, *e, *p, *w));
            }
        }
        if active.is_empty() {
            // Every expert dropped everything or has weight 0: θ = θ0.
            return host.affine(base, 1.0, 0.0);
        }
        // The inputs are viewed (the host's storage where it lends it, else copies) and
        // released at once; what the host lends stays readable until this call returns.
        let shape = host.shape(base)?;
        let b = host.view_f32(base)?;
        host.release(base)?;
        // With l1: r_t of every expert, from the statistics pass, and the masks it kept.
        let (l1, kept) = match self.rescale {
            Rescale::L1 => (
                Some(self.l1_factors.get(tensor, "dare with rescale=l1")?),
                self.lock_l1()?
                    .kept
                    .for_merge(tensor.name, b.len() as u64, tensor.full_numel),
            ),
            _ => (None, None),
        };
        let at = usize::try_from(tensor.offset).unwrap_or(usize::MAX);
        let mut deltas = Vec::with_capacity(active.len());
        // Per expert: θ_t, its 0/1 mask (`None`: nothing dropped) and (r_t, w_t); the combine
        // step makes m ⊙ (θ_t − θ0) block by block.
        let mut masks = Vec::with_capacity(active.len());
        let mut factors = Vec::with_capacity(active.len());
        for &(t, e, p, w) in &active {
            host.check_cancelled()?;
            let values = host.view_f32(e)?;
            let keep = 1.0 - p;
            if p <= 0.0 {
                // Nothing is dropped: m ⊙ τ = τ, and the l1 rescale is ‖τ‖₁/‖τ‖₁ = 1.
                host.release(e)?;
                masks.push(None);
                factors.push((1.0, w));
            } else {
                if let Some(bits) = kept.as_ref().and_then(|k| k.of(t)) {
                    masks.push(Some(ChunkMask::Kept(bits)));
                } else {
                    // One mask for the whole chunk, drawn for the chunk's elements of the full
                    // tensor.
                    let mask = host.bernoulli_mask(e, keep, expert_seed(self.seed, tensor.name, t), tensor.offset)?;
                    masks.push(Some(ChunkMask::Drawn(host.view_f32(mask)?)));
                    host.release(mask)?;
                }
                host.release(e)?;
                let r = match (self.rescale, &l1) {
                    (Rescale::Inverse, _) => 1.0 / keep,
                    (Rescale::L1, Some(r)) => r.get(t).copied().unwrap_or(1.0),
                    _ => 1.0,
                };
                factors.push((r, w));
            }
            deltas.push(values);
        }
        let (terms_factors, how) = self.combine_plan(&factors);
        let terms: Vec<fused::Term<'_>> = deltas
            .iter()
            .zip(terms_factors)
            .zip(&masks)
            .map(|((values, factor), mask)| fused::Term {
                values,
                mask: mask.as_ref().map(|m| match m {
                    ChunkMask::Drawn(v) => fused::Mask::Values(v),
                    ChunkMask::Kept(bits) => fused::Mask::Bits(bits, at),
                }),
                raw: true,
                factor,
            })
            .collect();
        let out = fused::combine(&b, &terms, &how);
        host.from_f32(&out, &shape)
    }
}

impl Dare {
    fn lock_l1(&self) -> Result<MutexGuard<'_, L1Pass>> {
        self.l1
            .lock()
            .map_err(|_| Error::Message("dare: the l1 pass's state was poisoned by an earlier failure".into()))
    }

    /// The l1 statistics pass over one chunk (chunks of a tensor come in index order, one at a
    /// time): adds ‖τ_t‖₁ and ‖m_t ⊙ τ_t‖₁ of its elements to the tensor's running f64 sums of
    /// every expert that draws a mask, in element order, with the masks drawn `MASK_BLOCK`
    /// elements at a time; after the tensor's last chunk, r_t = ‖τ_t‖₁ / ‖m_t ⊙ τ_t‖₁ (1 when
    /// either is below 1e-7, or when the expert draws no mask).
    fn l1_chunk(&self, host: &Host<'_>, tensor: &TensorMeta<'_>, base: Tensor, experts: &[Tensor]) -> Result<()> {
        let b = host.view_f32(base)?;
        let n = b.len();
        // The experts that draw a mask: (t, seed, keep, θ_t).
        let mut pending = Vec::new();
        for (t, (e, (p, w))) in experts.iter().zip(self.drop_rate.iter().zip(&self.weights)).enumerate() {
            if *p > 0.0 && *p < 1.0 && *w != 0.0 {
                host.check_cancelled()?;
                pending.push((t, expert_seed(self.seed, tensor.name, t), 1.0 - p, host.view_f32(*e)?));
            }
        }
        let keep_bytes = kept_masks::bytes_for(tensor.full_numel, pending.len());
        let ((seen, mut full, mut kept), mut keep) = {
            let mut l1 = self.lock_l1()?;
            let running = l1.running.remove(tensor.name).unwrap_or_else(|| {
                (
                    0,
                    vec![LaneSum::default(); pending.len()],
                    vec![LaneSum::default(); pending.len()],
                )
            });
            let keep = l1.kept.take_filling(tensor.name, tensor.offset == 0, keep_bytes);
            (running, keep)
        };
        if let Some(k) = keep.as_mut().filter(|k| k.experts.is_empty()) {
            let numel = usize::try_from(tensor.full_numel).unwrap_or(0);
            k.experts = pending
                .iter()
                .map(|(t, ..)| (*t, kept_masks::MaskBits::with_capacity(numel)))
                .collect();
        }
        if seen != tensor.offset || full.len() != pending.len() {
            return Err(Error::Message(format!(
                "tensor '{}': dare's l1 pass got the chunk at element {} after {seen} elements; it needs the chunks \
                 in order (CAP_ORDERED_STATISTICS: use a host of ABI 1.4 or newer)",
                tensor.name, tensor.offset
            )));
        }
        let mut like: Option<(usize, Tensor)> = None;
        let mut from = 0;
        while from < n {
            host.check_cancelled()?;
            let len = MASK_BLOCK.min(n - from);
            let like_handle = match like {
                Some((l, h)) if l == len => h,
                _ => {
                    if let Some((_, h)) = like.take() {
                        host.release(h)?;
                    }
                    let h = if len == n {
                        base
                    } else {
                        host.from_f32(&vec![0f32; len], &[len])?
                    };
                    like = Some((len, h));
                    h
                }
            };
            let mut masks = Vec::with_capacity(pending.len());
            for (_, seed, keep, _) in &pending {
                let mask = host.bernoulli_mask(like_handle, *keep, *seed, tensor.offset + from as u64)?;
                // Lent (readable until the call returns, also after the release): the masks of one
                // chunk of the ordered pass are a few MB.
                masks.push(host.view_f32(mask)?);
                host.release(mask)?;
            }
            let blocks: Vec<&[f32]> = pending.iter().map(|(.., v)| &v[from..from + len]).collect();
            let ms: Vec<&[f32]> = masks.iter().map(AsRef::as_ref).collect();
            let at = usize::try_from(tensor.offset).unwrap_or(usize::MAX) + from;
            // Kept for the merge pass where they fit (in order: each mask ends where this block
            // starts, else nothing more is kept for this tensor).
            if let Some(k) = keep.as_mut() {
                if k.experts.len() == ms.len() && k.experts.iter().all(|(_, b)| b.len() == at) {
                    k.experts.iter_mut().zip(&ms).for_each(|((_, b), m)| b.push(m));
                } else {
                    keep = None;
                    self.lock_l1()?.kept.drop_filling(keep_bytes);
                }
            }
            fused::l1_norms(&blocks, &b[from..from + len], &ms, &mut full, &mut kept, at);
            from += len;
        }
        if let Some((_, h)) = like.filter(|(_, h)| *h != base) {
            host.release(h)?;
        }
        host.release(base)?;
        let seen = seen + n as u64;
        let mut l1 = self.lock_l1()?;
        if let Some(k) = keep {
            l1.kept.put_filling(tensor.name, k, tensor.full_numel, keep_bytes);
        }
        if seen < tensor.full_numel {
            l1.running.insert(tensor.name.to_owned(), (seen, full, kept));
            return Ok(());
        }
        let mut factors = vec![1.0; experts.len()];
        for ((t, ..), (full, kept)) in pending.iter().zip(full.iter().zip(&kept)) {
            if let Some(r) = factors.get_mut(*t) {
                let (full, kept) = (full.total(), kept.total());
                *r = if full < 1e-7 || kept < 1e-7 { 1.0 } else { full / kept };
            }
        }
        l1.done.insert(tensor.name.to_owned(), factors);
        Ok(())
    }

    /// Per term (r_t, w_t in the order of the active experts) the f32 factor of the fused
    /// combine step, and the combine step itself, with the coefficients the host operations
    /// used: combine = sum multiplies d_t by λ·(w_t·r_t) (÷ Σ w), ties scales d_t by w_t·r_t
    /// (skipped when that is exactly 1) before the election.
    fn combine_plan(&self, factors: &[(f64, f64)]) -> (Vec<Option<f32>>, fused::Combine) {
        match self.combine {
            Combine::Sum => {
                // mergekit's dare_linear divisor: Σ_t w_t over every expert, 1 when it is ~0.
                let total: f64 = self.weights.iter().sum();
                let divisor = if self.normalize && total.abs() >= 1e-8 {
                    Some(total)
                } else {
                    None
                };
                // w = 1 leaves w·r = r exactly, so unit weights give the coefficients λ·r as before.
                let coefficients = factors
                    .iter()
                    .map(|(r, w)| {
                        Some(match divisor {
                            Some(total) => (self.lambda * (w * r) / total) as f32,
                            None => (self.lambda * (w * r)) as f32,
                        })
                    })
                    .collect();
                (coefficients, fused::Combine::Sum)
            }
            Combine::Ties | Combine::TiesSum => {
                // Mass election over u_t = w_t·r_t·τ̃_t, then the agreeing u_t (a coordinate
                // whose elected sign is 0 gets 0), averaged with their weights or summed.
                let scale = factors
                    .iter()
                    .map(|(r, w)| {
                        let factor = w * r;
                        (factor != 1.0).then_some(factor as f32)
                    })
                    .collect();
                let lambda = self.lambda as f32;
                let normalized = self.combine == Combine::Ties || self.normalize;
                let how = if !normalized {
                    fused::Combine::TiesSum(lambda)
                } else if factors.iter().all(|(_, w)| *w == 1.0) {
                    // Unit weights: Σ u / Σ w over the agreeing entries is their plain mean.
                    fused::Combine::TiesMean(lambda)
                } else {
                    fused::Combine::TiesWeightedMean(lambda, factors.iter().map(|(_, w)| *w as f32).collect())
                };
                (scale, how)
            }
        }
    }
}

mergescope_plugin_api::export_plugin!(Dare);
