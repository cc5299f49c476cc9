//! Singular-value spectra of task matrices and CART's rank curves (seed 001): the
//! reconstruction error R(k) = Σ_t Σ_{j>k} σ_{t,j}² and the row-space interference
//! I(k) = Σ_{t≠s} ‖Σ̃_t V_tᵀ V_s Σ̃_s‖_F with V_t the top-k right singular vectors and
//! Σ̃_t = diag(σ_1..σ_k)/‖τ_t‖_F (App. A), for task vectors from the base ("original") and
//! from the experts' mean ("centred").

use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::plugin::host_ext::linalg::truncated_svd;
use std::path::PathBuf;

/// The thin SVD of one task matrix: singular values and right singular vectors (k × n rows).
#[derive(Clone, Debug)]
pub struct TaskSvd {
    /// σ_1 ≥ σ_2 ≥ … (min(m, n) values).
    pub sigma: Vec<f64>,
    /// Right singular vectors as rows (`sigma.len()` rows of n).
    pub vt: Vec<f64>,
    /// Columns of the matrix.
    pub n: usize,
}

impl TaskSvd {
    /// SVD of a row-major m×n matrix.
    pub fn of(data: &[f32], m: usize, n: usize) -> Result<TaskSvd> {
        let (_, sigma, vt) = truncated_svd(data, m, n, m.min(n)).map_err(EngineError::Invalid)?;
        Ok(TaskSvd { sigma, vt, n })
    }

    /// ‖τ‖_F.
    pub fn frobenius(&self) -> f64 {
        self.sigma.iter().map(|s| s * s).sum::<f64>().sqrt()
    }
}

/// Spectra of one weight matrix's task vectors, original and centred.
#[derive(Clone, Debug)]
pub struct MatrixSpectra {
    /// Tensor name.
    pub tensor: String,
    /// Its shape (m, n).
    pub shape: (usize, usize),
    /// Task names (expert file names).
    pub tasks: Vec<String>,
    /// SVD of θ_t − θ_base per task.
    pub original: Vec<TaskSvd>,
    /// SVD of θ_t − mean_s θ_s per task.
    pub centered: Vec<TaskSvd>,
}

/// R(k) and I(k) for k = 0..=r.
#[derive(Clone, Debug, PartialEq)]
pub struct RankCurves {
    /// Ranks.
    pub ks: Vec<usize>,
    /// Reconstruction error of the original task vectors.
    pub r_original: Vec<f64>,
    /// Reconstruction error of the centred task vectors.
    pub r_centered: Vec<f64>,
    /// Row-space interference of the original task vectors.
    pub i_original: Vec<f64>,
    /// Row-space interference of the centred task vectors.
    pub i_centered: Vec<f64>,
}

/// Σ_t Σ_{j>k} σ_{t,j}².
pub fn reconstruction_error(svds: &[TaskSvd], k: usize) -> f64 {
    svds.iter()
        .map(|s| s.sigma.iter().skip(k).map(|x| x * x).sum::<f64>())
        .sum()
}

/// Σ_{t≠s} ‖Σ̃_t V_tᵀ V_s Σ̃_s‖_F over ordered pairs, with the top k singular pairs.
pub fn interference(svds: &[TaskSvd], k: usize) -> f64 {
    interference_curve(svds, k).last().copied().unwrap_or(0.0)
}

/// I(k) for every k in 0..=k_max at once: for each pair the matrix of weighted products
/// E_ij = (σ̃_t,i ⟨v_t,i, v_s,j⟩ σ̃_s,j)² is computed once (one matrix product), and I(k) sums
/// the square roots of its leading k×k block sums, grown one row and column at a time.
pub fn interference_curve(svds: &[TaskSvd], k_max: usize) -> Vec<f64> {
    let mut curve = vec![0.0; k_max + 1];
    for (t, a) in svds.iter().enumerate() {
        for b in svds.iter().skip(t + 1) {
            let (ka, kb) = (k_max.min(a.sigma.len()), k_max.min(b.sigma.len()));
            let (na, nb) = (a.frobenius(), b.frobenius());
            if na == 0.0 || nb == 0.0 || a.n != b.n {
                continue;
            }
            let va = faer::Mat::<f64>::from_fn(ka, a.n, |i, c| a.vt[i * a.n + c]);
            let vb = faer::Mat::<f64>::from_fn(b.n, kb, |c, j| b.vt[j * b.n + c]);
            let dots = &va * &vb;
            let e = |i: usize, j: usize| {
                let x = a.sigma[i] / na * dots[(i, j)] * b.sigma[j] / nb;
                x * x
            };
            let mut block = 0.0;
            for (i, slot) in curve.iter_mut().skip(1).enumerate() {
                if i < ka {
                    block += (0..i.min(kb)).map(|j| e(i, j)).sum::<f64>();
                }
                if i < kb {
                    block += (0..i.min(ka)).map(|r| e(r, i)).sum::<f64>();
                }
                if i < ka && i < kb {
                    block += e(i, i);
                }
                // ‖Σ̃_s V_sᵀ V_t Σ̃_t‖_F is the same norm (the transpose): count both orders.
                *slot += 2.0 * block.sqrt();
            }
        }
    }
    curve
}

impl MatrixSpectra {
    /// R(k) and I(k), original and centred, for every k from 0 to the full rank.
    pub fn rank_curves(&self) -> RankCurves {
        let r = self.shape.0.min(self.shape.1);
        let ks: Vec<usize> = (0..=r).collect();
        RankCurves {
            r_original: ks.iter().map(|&k| reconstruction_error(&self.original, k)).collect(),
            r_centered: ks.iter().map(|&k| reconstruction_error(&self.centered, k)).collect(),
            i_original: interference_curve(&self.original, r),
            i_centered: interference_curve(&self.centered, r),
            ks,
        }
    }
}

fn stem(p: &std::path::Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The 2-D float tensors of a checkpoint, in name order: the matrices spectra can be taken of.
pub fn matrix_names(path: &std::path::Path) -> Result<Vec<(String, (usize, usize))>> {
    let c = Checkpoint::open(path)?;
    Ok(c.tensors
        .iter()
        .filter(|(_, t)| t.dtype.is_float() && t.shape.len() == 2)
        .map(|(k, t)| (k.clone(), (t.shape[0], t.shape[1])))
        .collect())
}

/// Spectra of `tensor` (a 2-D weight) of every expert's task vector.
pub fn task_spectra(base: &std::path::Path, experts: &[PathBuf], tensor: &str) -> Result<MatrixSpectra> {
    if experts.len() < 2 {
        return Err(EngineError::Param(
            "spectra and interference need at least two experts".into(),
        ));
    }
    let read = |p: &std::path::Path| -> Result<(Vec<f32>, Vec<usize>)> {
        let c = Checkpoint::open(p)?;
        let e = c.tensors.get(tensor).ok_or_else(|| {
            EngineError::Param(format!(
                "'{}' has no tensor '{tensor}'; pick one of its 2-D weights (mergescope inspect lists them)",
                p.display()
            ))
        })?;
        Ok((c.read_f32(e)?, e.shape.clone()))
    };
    let (base_v, shape) = read(base)?;
    let &[m, n] = shape.as_slice() else {
        return Err(EngineError::Param(format!(
            "tensor '{tensor}' has shape {shape:?}; spectra need a 2-D weight matrix"
        )));
    };
    let mut thetas = Vec::new();
    for p in experts {
        let (v, s) = read(p)?;
        if s != shape {
            return Err(EngineError::Incompatible(format!(
                "'{}': tensor '{tensor}' has shape {s:?}, the base {shape:?}",
                p.display()
            )));
        }
        thetas.push(v);
    }
    let mean: Vec<f32> = (0..base_v.len())
        .map(|i| thetas.iter().map(|t| t[i]).sum::<f32>() / thetas.len() as f32)
        .collect();
    let diff = |a: &[f32], b: &[f32]| -> Vec<f32> { a.iter().zip(b).map(|(x, y)| x - y).collect() };
    let original = thetas
        .iter()
        .map(|t| TaskSvd::of(&diff(t, &base_v), m, n))
        .collect::<Result<_>>()?;
    let centered = thetas
        .iter()
        .map(|t| TaskSvd::of(&diff(t, &mean), m, n))
        .collect::<Result<_>>()?;
    Ok(MatrixSpectra {
        tensor: tensor.to_owned(),
        shape: (m, n),
        tasks: experts.iter().map(|p| stem(p)).collect(),
        original,
        centered,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svd(rows: &[[f32; 2]]) -> TaskSvd {
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        TaskSvd::of(&flat, rows.len(), 2).unwrap()
    }

    #[test]
    fn reconstruction_error_sums_the_discarded_squared_singular_values() {
        // diag(3, 1) and diag(2, 2): σ² = {9, 1} and {4, 4}.
        let s = [svd(&[[3.0, 0.0], [0.0, 1.0]]), svd(&[[2.0, 0.0], [0.0, 2.0]])];
        assert!((reconstruction_error(&s, 0) - 18.0).abs() < 1e-9);
        assert!((reconstruction_error(&s, 1) - 5.0).abs() < 1e-9);
        assert!(reconstruction_error(&s, 2).abs() < 1e-9);
    }

    #[test]
    fn interference_vanishes_for_orthogonal_row_spaces_and_matches_a_hand_case() {
        // Task a = [[1, 0]] (row space e1), b = [[0, 2]] (row space e2): orthogonal → I = 0.
        let a = svd(&[[1.0, 0.0]]);
        let b = svd(&[[0.0, 2.0]]);
        assert!(interference(&[a.clone(), b], 1).abs() < 1e-12);
        // c = [[3, 4]]: σ = 5, v = (0.6, 0.8), Σ̃ = 1. ⟨e1, v⟩ = 0.6 in both orders → 1.2.
        let c = svd(&[[3.0, 4.0]]);
        assert!((interference(&[a.clone(), c.clone()], 1) - 1.2).abs() < 1e-9);
        // k = 0 keeps nothing: no interference.
        assert_eq!(interference(&[a, c], 0), 0.0);
    }

    #[test]
    fn the_incremental_curve_matches_a_direct_sum_at_every_rank() {
        let mut rng = mergescope_engine::rng::SplitMix64::new(7);
        let mut random = |m: usize, n: usize| -> TaskSvd {
            let v: Vec<f32> = (0..m * n).map(|_| rng.uniform() as f32 - 0.5).collect();
            TaskSvd::of(&v, m, n).unwrap()
        };
        let svds = [random(5, 4), random(5, 4), random(5, 4)];
        let curve = interference_curve(&svds, 4);
        for (k, &got) in curve.iter().enumerate() {
            // Direct: Σ over ordered pairs of sqrt(Σ_{i<k, j<k} E_ij).
            let mut direct = 0.0;
            for (t, a) in svds.iter().enumerate() {
                for (s, b) in svds.iter().enumerate() {
                    if t == s {
                        continue;
                    }
                    let mut sq = 0.0;
                    for i in 0..k {
                        for j in 0..k {
                            let d: f64 = (0..4).map(|c| a.vt[i * 4 + c] * b.vt[j * 4 + c]).sum();
                            let x = a.sigma[i] / a.frobenius() * d * b.sigma[j] / b.frobenius();
                            sq += x * x;
                        }
                    }
                    direct += sq.sqrt();
                }
            }
            assert!((got - direct).abs() < 1e-9, "k = {k}: {got} vs {direct}");
        }
    }
}
