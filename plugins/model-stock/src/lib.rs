//! `model-stock`: Model Stock (Jang et al., 2024, "Model Stock: All we need is just a few
//! fine-tuned models"), as mergekit computes it (mergekit/merge_methods/model_stock.py).
//!
//! Per tensor, with offsets δ_i = θ_i − θ0 of the N experts: c is the mean over pairs i < j of
//! cos(δ_i, δ_j) = ⟨δ_i, δ_j⟩ / max(‖δ_i‖‖δ_j‖, 1e-6), clamped to [−1, 1];
//! t = N·c / (1 + (N − 1)·c); θ = t·(Σ_i θ_i / N) + (1 − t)·θ0. With `filter_wise` the same is
//! done per row (per vector along the last dimension) instead of over the whole tensor.
//!
//! Over whole tensors the norms and dot products are summed in a statistics pass over chunks
//! (partial sums added in offset order, so the result does not depend on the threads), and the
//! merge pass is elementwise, in parallel chunks; filter-wise merges take whole tensors. A
//! tensor's t depends on its own sums only (`CAP_TENSOR_STATISTICS`), so the host may merge each
//! tensor right after its statistics, while its inputs are still mapped.

use mergescope_plugin_api::abi::{
    CAP_CHUNKED_STATISTICS, CAP_ELEMENTWISE, CAP_NEEDS_BASE, CAP_TENSOR_STATISTICS, CAP_THREAD_SAFE,
};
use mergescope_plugin_api::sdk::{ChunkSums, PerTensor, gram_sums};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput, TensorMeta,
};

const HELP: &str = "Model Stock (Jang et al., 2024; mergekit's `model_stock`). From the angle between \
the experts' task vectors δ_i = θ_i − θ0 it picks how far to move from the base θ0 towards the \
experts' average: c = mean over pairs i < j of cos(δ_i, δ_j) (each cosine's norm product is at least \
1e-6 and the cosine is clamped to [−1, 1], as mergekit does), t = N·c / (1 + (N − 1)·c) for N experts, \
and θ = t·θ_avg + (1 − t)·θ0. Similar task vectors (c near 1) give t near 1 (the average); \
orthogonal ones (c = 0) give the base. The paper states the rule for two fine-tuned models; for more, \
the mean pairwise cosine is mergekit's choice. Where 1 + (N − 1)·c is within 1e-6 of 0 (opposing task \
vectors) t is undefined and the base is kept, with a warning, as in mergekit 0.1.5.\n\
Parameters:\n\
- filter_wise (default false): compute c and t for every row (every vector along the last dimension; \
a 1-D tensor is one row) instead of once per tensor (mergekit's `filter_wise`).\n\
A base model and at least two experts are required.";

/// Smallest norm product a cosine divides by (mergekit's `clamp(min=1e-6)`).
const MIN_NORM_PRODUCT: f64 = 1e-6;

/// The Model Stock method.
pub struct ModelStock {
    filter_wise: bool,
    n_experts: usize,
    /// Statistics pass: per tensor and chunk, ‖δ_i‖² for every expert and then ⟨δ_i, δ_j⟩ for
    /// every pair i < j.
    sums: ChunkSums,
    /// After the pass: per tensor, t.
    ratios: PerTensor<f64>,
}

/// The interpolation t = N·c / (1 + (N − 1)·c) for the mean pairwise cosine `cos` of `n`
/// experts, or `None` at the singularity |1 + (N − 1)·c| < 1e-6 (c = −1/(N − 1): the task
/// vectors oppose each other), where mergekit 0.1.5 keeps the base (t = 0).
pub fn ratio(cos: f64, n: usize) -> Option<f64> {
    let n = n as f64;
    let denominator = 1.0 + (n - 1.0) * cos;
    (denominator.abs() >= 1e-6).then(|| n * cos / denominator)
}

/// The mean over pairs of the clamped cosines, from the pairs' dot products and the squared
/// norms: `dots[i][j]` for i < j.
pub fn mean_cosine(norms_sq: &[f64], dot: impl Fn(usize, usize) -> f64) -> f64 {
    let n = norms_sq.len();
    let mut sum = 0.0;
    let mut pairs = 0usize;
    for i in 0..n {
        for j in i + 1..n {
            let product = (norms_sq[i].sqrt() * norms_sq[j].sqrt()).max(MIN_NORM_PRODUCT);
            sum += (dot(i, j) / product).clamp(-1.0, 1.0);
            pairs += 1;
        }
    }
    sum / pairs.max(1) as f64
}

/// t for the mean pairwise cosine `cos` of `n` experts; at the singularity, 0 (the base is kept,
/// as mergekit does) with a warning naming the tensor.
fn ratio_or_base(host: &Host<'_>, tensor: &str, n: usize, cos: f64) -> f64 {
    ratio(cos, n).unwrap_or_else(|| {
        host.warn(&format!(
            "model-stock: tensor '{tensor}': the experts' task vectors have a mean pairwise cosine of {cos:.6} \
             ≈ −1/(N − 1) for N = {n}, where t = N·c/(1 + (N − 1)·c) is undefined; the base is kept there (as \
             mergekit does)"
        ));
        0.0
    })
}

impl ModelStock {
    /// ‖δ_i‖² of every expert, then ⟨δ_i, δ_j⟩ of every pair i < j, over one chunk, from the
    /// host's lent values: the same sequential f64 sums as the host's `sub`, then
    /// `reduce(REDUCE_SUM_SQUARES)` and `dot`, made before, so the same bits ([`gram_sums`]).
    fn chunk_sums(host: &Host<'_>, base: Tensor, experts: &[Tensor]) -> Result<Vec<f64>> {
        let b = host.view_f32(base)?;
        let es = experts.iter().map(|e| host.view_f32(*e)).collect::<Result<Vec<_>>>()?;
        let es: Vec<&[f32]> = es.iter().map(AsRef::as_ref).collect();
        Ok(gram_sums(&es, Some(&b)))
    }

    /// t from a tensor's summed statistics (layout of [`ModelStock::chunk_sums`]).
    fn ratio_from(&self, host: &Host<'_>, tensor: &str, sums: &[f64]) -> f64 {
        let n = self.n_experts;
        let (norms_sq, dots) = sums.split_at(n);
        // Index of pair (i, j), i < j, in the row-major list of pairs.
        let pair = |i: usize, j: usize| i * (2 * n - i - 1) / 2 + (j - i - 1);
        let cos = mean_cosine(norms_sq, |i, j| dots[pair(i, j)]);
        ratio_or_base(host, tensor, n, cos)
    }

    /// Row by row (vectors along the last dimension), from the host's lent values; each row's
    /// norms and dot products are [`gram_sums`] over it, as a tensor's are over its chunks.
    fn rows(&self, host: &Host<'_>, tensor: &TensorMeta<'_>, base: Tensor, experts: &[Tensor]) -> Result<Tensor> {
        let shape = host.shape(base)?;
        let width = shape.last().copied().unwrap_or(1).max(1);
        let b = host.view_f32(base)?;
        let es = experts.iter().map(|e| host.view_f32(*e)).collect::<Result<Vec<_>>>()?;
        let n = es.len();
        let mut out = vec![0f32; b.len()];
        for (r, row) in out.chunks_mut(width).enumerate() {
            let at = r * width..(r * width + row.len());
            let b = &b[at.clone()];
            let rows: Vec<&[f32]> = es.iter().map(|e| &e[at.clone()]).collect();
            let t = self.ratio_from(host, tensor.name, &gram_sums(&rows, Some(b)));
            for (k, o) in row.iter_mut().enumerate() {
                let avg: f64 = rows.iter().map(|e| f64::from(e[k])).sum::<f64>() / n as f64;
                *o = (t * avg + (1.0 - t) * f64::from(b[k])) as f32;
            }
        }
        host.from_f32(&out, &shape)
    }
}

impl MergeMethod for ModelStock {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "model-stock",
            name: "Model Stock",
            version: "",
            description: "Moves from the base towards the experts' average by an amount set by the angle between their task vectors.",
            help: HELP,
            capabilities: CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![ParamSpec::bool(
                "filter_wise",
                false,
                "One ratio t per row (vector along the last dimension) instead of per tensor.",
            )],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        if ctx.n_experts < 2 {
            return Err(Error::Message(format!(
                "model-stock needs at least two experts besides the base (it measures the angle between their \
                 task vectors), but this merge has {}; add another --expert",
                ctx.n_experts
            )));
        }
        Ok(ModelStock {
            filter_wise: params.bool("filter_wise")?,
            n_experts: ctx.n_experts,
            sums: ChunkSums::default(),
            ratios: PerTensor::default(),
        })
    }

    fn capabilities(&self) -> Option<u64> {
        // Filter-wise ratios need whole rows, so whole tensors; otherwise statistics and merge
        // both go in chunks.
        let chunked = if self.filter_wise {
            0
        } else {
            CAP_ELEMENTWISE | CAP_CHUNKED_STATISTICS | CAP_TENSOR_STATISTICS
        };
        Some(CAP_THREAD_SAFE | CAP_NEEDS_BASE | chunked)
    }

    fn prepare_passes(&self) -> u32 {
        u32::from(!self.filter_wise)
    }

    fn prepare_tensor(&mut self, host: &Host<'_>, _pass: u32, input: &TensorInput<'_>) -> Result<()> {
        let (tensor, experts) = (&input.meta, input.experts);
        let base = input.require_base("model-stock")?;
        self.sums.add(tensor, Self::chunk_sums(host, base, experts)?);
        Ok(())
    }

    fn finish_tensor(&mut self, host: &Host<'_>, _pass: u32, tensor: &TensorMeta<'_>) -> Result<()> {
        if let Some(total) = self.sums.take_total(tensor.name) {
            self.ratios
                .insert(tensor.name.to_owned(), self.ratio_from(host, tensor.name, &total));
        }
        Ok(())
    }

    fn finish_pass(&mut self, host: &Host<'_>, _pass: u32) -> Result<()> {
        // The tensors `finish_tensor` did not finish (all of them, on a host older than ABI 1.5).
        for (name, total) in self.sums.take_totals() {
            let t = self.ratio_from(host, &name, &total);
            self.ratios.insert(name, t);
        }
        Ok(())
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let (tensor, experts) = (&input.meta, input.experts);
        let base = input.require_base("model-stock")?;
        if self.filter_wise {
            return self.rows(host, tensor, base, experts);
        }
        let t = self.ratios.get(tensor, "model-stock")?;
        let n = experts.len();
        let mut terms = vec![base];
        terms.extend_from_slice(experts);
        let mut weights = vec![1.0 - t];
        weights.extend(std::iter::repeat_n(t / n as f64, n));
        host.weighted_sum(&terms, Some(&weights))
    }
}

mergescope_plugin_api::export_plugin!(ModelStock);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_ratio() {
        // Two experts at 60°: c = 1/2, t = 2·½ / (1 + ½) = 2/3.
        assert!((ratio(0.5, 2).unwrap() - 2.0 / 3.0).abs() < 1e-15);
        // Orthogonal task vectors keep the base; identical ones give the average.
        assert_eq!(ratio(0.0, 3), Some(0.0));
        assert_eq!(ratio(1.0, 3), Some(1.0));
        // c = −1/(N − 1) has no t (the base is kept there).
        assert_eq!(ratio(-0.5, 3), None);
        assert_eq!(ratio(-0.5 + 1e-7, 3), None);
        assert!(ratio(-0.49, 3).is_some());
    }

    #[test]
    fn mean_cosine_clamps_and_averages_pairs() {
        // δ0 = (1, 0), δ1 = (0, 1), δ2 = (1, 1): cosines 0, 1/√2, 1/√2.
        let d = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]];
        let norms: Vec<f64> = d.iter().map(|v| v[0] * v[0] + v[1] * v[1]).collect();
        let c = mean_cosine(&norms, |i, j| d[i][0] * d[j][0] + d[i][1] * d[j][1]);
        assert!((c - 2.0 / 3.0 * std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-12, "{c}");
        // Zero task vectors: the norm product is clamped to 1e-6, the cosine is 0.
        assert_eq!(mean_cosine(&[0.0, 0.0], |_, _| 0.0), 0.0);
    }
}
