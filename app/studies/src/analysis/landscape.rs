//! Loss landscapes: evaluations of models `origin + Σ_i c_i · d_i` over a line or a grid of
//! coefficients. Task arithmetic's λ line (origin θ0, direction Σ_t τ_t), CART's rank × λ grid
//! (origin θ̄, direction Σ_t SVD_k(θ_t − θ̄) for each rank k) and planes through chosen
//! checkpoints (origin, two directions) are all such families. Grids are visited coarse to
//! fine, so a preview appears after a few evaluations, and kept in a cache keyed by the inputs.

use candle_core::{Device, Tensor};
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::plugin::host_ext::linalg::truncated_svd;
use mergescope_lab::demo::cache_dir;
use mergescope_lab::evaluator::{EvalReport, InMemoryEvaluator};
use mergescope_lab::nn::Params;
use mergescope_plugin_api::sdk::rank_from_ratio;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// What a landscape shows of each evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetricKind {
    /// Mean cross-entropy.
    Loss,
    /// Accuracy.
    Accuracy,
    /// Accuracy ÷ the task's expert.
    Normalized,
}

/// A metric of one task, or averaged over tasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metric {
    /// Which number.
    pub kind: MetricKind,
    /// One task, or the mean over tasks (`None`).
    pub task: Option<String>,
}

impl Metric {
    /// Parses `loss|accuracy|normalized` and an optional task.
    pub fn parse(kind: &str, task: Option<&str>) -> Result<Metric> {
        let kind = match kind {
            "loss" => MetricKind::Loss,
            "accuracy" | "acc" => MetricKind::Accuracy,
            "normalized" | "normalised" | "norm" => MetricKind::Normalized,
            other => {
                return Err(EngineError::Param(format!(
                    "unknown metric '{other}'; use loss, accuracy or normalized"
                )));
            }
        };
        Ok(Metric {
            kind,
            task: task.map(str::to_owned),
        })
    }

    /// The metric's value in `report` (NaN where it is not known).
    pub fn value(&self, report: &EvalReport) -> f64 {
        match &self.task {
            None => match self.kind {
                MetricKind::Loss => report.mean_loss.unwrap_or(f64::NAN),
                MetricKind::Accuracy => report.mean_accuracy,
                MetricKind::Normalized => report.mean_normalized.unwrap_or(f64::NAN),
            },
            Some(t) => report.task(t).map_or(f64::NAN, |s| match self.kind {
                MetricKind::Loss => s.loss.unwrap_or(f64::NAN),
                MetricKind::Accuracy => s.accuracy,
                MetricKind::Normalized => s.normalized.unwrap_or(f64::NAN),
            }),
        }
    }

    /// Whether lower values are better.
    pub fn lower_is_better(&self) -> bool {
        self.kind == MetricKind::Loss
    }

    /// A label such as "mean accuracy" or "loss on mnist".
    pub fn label(&self) -> String {
        let what = match self.kind {
            MetricKind::Loss => "loss",
            MetricKind::Accuracy => "accuracy",
            MetricKind::Normalized => "normalised accuracy",
        };
        match &self.task {
            None => format!("mean {what}"),
            Some(t) => format!("{what} on {t}"),
        }
    }
}

/// Models `origin + Σ_i c_i · directions[i]`.
pub struct AffineFamily {
    /// The model at all-zero coefficients.
    pub origin: Params,
    /// One parameter-shaped direction per coefficient.
    pub directions: Vec<Params>,
}

fn combine(base: &Params, terms: &[(&Params, f64)]) -> Result<Params> {
    base.iter()
        .map(|(k, t)| {
            let mut acc = t.clone();
            for (d, c) in terms {
                if *c == 0.0 {
                    continue;
                }
                let dk = d
                    .get(k)
                    .ok_or_else(|| EngineError::Invalid(format!("direction lacks tensor '{k}'")))?;
                acc = (acc + dk.affine(*c, 0.0)?)?;
            }
            Ok((k.clone(), acc))
        })
        .collect()
}

fn sub(a: &Params, b: &Params) -> Result<Params> {
    a.iter()
        .map(|(k, t)| {
            let o = b
                .get(k)
                .ok_or_else(|| EngineError::Incompatible(format!("a checkpoint lacks tensor '{k}'")))?;
            Ok((k.clone(), (t - o)?))
        })
        .collect()
}

fn dot(a: &Params, b: &Params) -> Result<f64> {
    let mut s = 0.0;
    for (k, t) in a {
        if let Some(o) = b.get(k) {
            s += f64::from((t * o)?.sum_all()?.to_scalar::<f32>()?);
        }
    }
    Ok(s)
}

impl AffineFamily {
    /// The model at `coeffs` (one per direction).
    pub fn at(&self, coeffs: &[f64]) -> Result<Params> {
        let terms: Vec<(&Params, f64)> = self.directions.iter().zip(coeffs.iter().copied()).collect();
        combine(&self.origin, &terms)
    }

    /// Task arithmetic's line: origin θ0, direction Σ_t (θ_t − θ0).
    pub fn task_arithmetic(base: &Params, experts: &[Params]) -> Result<AffineFamily> {
        let taus: Vec<Params> = experts.iter().map(|e| sub(e, base)).collect::<Result<_>>()?;
        let zero: Params = base
            .iter()
            .map(|(k, t)| Ok((k.clone(), t.zeros_like()?)))
            .collect::<Result<_>>()?;
        let terms: Vec<(&Params, f64)> = taus.iter().map(|t| (t, 1.0)).collect();
        let direction = combine(&zero, &terms)?;
        Ok(AffineFamily {
            origin: base.clone(),
            directions: vec![direction],
        })
    }

    /// The plane through `origin`, `a` and `b`: directions a − origin and b − origin, so (1, 0)
    /// is `a` and (0, 1) is `b`.
    pub fn plane(origin: &Params, a: &Params, b: &Params) -> Result<AffineFamily> {
        Ok(AffineFamily {
            origin: origin.clone(),
            directions: vec![sub(a, origin)?, sub(b, origin)?],
        })
    }

    /// The plane of a trajectory's first two principal directions (seed 001 Fig. 5 right):
    /// origin the iterates' mean, directions of unit length (coefficients are distances in
    /// parameter space), through the n×n Gram matrix of the centred iterates. Returns the
    /// family and each iterate's coordinates.
    pub fn principal_plane(iterates: &[Params]) -> Result<(AffineFamily, Vec<[f64; 2]>)> {
        let n = iterates.len();
        if n < 3 {
            return Err(EngineError::Param(format!(
                "a trajectory plane needs at least 3 iterates; this trajectory has {n}"
            )));
        }
        let terms: Vec<(&Params, f64)> = iterates[1..].iter().map(|x| (x, 1.0)).collect();
        let mean: Params = combine(&iterates[0], &terms)?
            .into_iter()
            .map(|(k, t)| Ok((k, t.affine(1.0 / n as f64, 0.0)?)))
            .collect::<Result<_>>()?;
        let centred: Vec<Params> = iterates.iter().map(|x| sub(x, &mean)).collect::<Result<_>>()?;
        let mut g = vec![0.0; n * n];
        for i in 0..n {
            for j in i..n {
                let d = dot(&centred[i], &centred[j])?;
                g[i * n + j] = d;
                g[j * n + i] = d;
            }
        }
        let eig = faer::Mat::<f64>::from_fn(n, n, |i, j| g[i * n + j])
            .self_adjoint_eigen(faer::Side::Lower)
            .map_err(|e| EngineError::Invalid(format!("the eigen-decomposition did not converge: {e:?}")))?;
        let (u, s) = (eig.U(), eig.S().column_vector());
        let mut directions = Vec::new();
        let mut scales = Vec::new();
        for c in [n - 1, n - 2] {
            let value = s[c];
            if value <= 1e-12 * s[n - 1].max(f64::MIN_POSITIVE) {
                return Err(EngineError::Param(
                    "the trajectory's iterates lie on a line; a plane needs two directions".into(),
                ));
            }
            let root = value.sqrt();
            let zero: Params = mean
                .iter()
                .map(|(k, t)| Ok((k.clone(), t.zeros_like()?)))
                .collect::<Result<_>>()?;
            let weights: Vec<(&Params, f64)> = centred.iter().enumerate().map(|(j, x)| (x, u[(j, c)] / root)).collect();
            directions.push(combine(&zero, &weights)?);
            scales.push(root);
        }
        let coords = (0..n)
            .map(|j| [u[(j, n - 1)] * scales[0], u[(j, n - 2)] * scales[1]])
            .collect();
        Ok((
            AffineFamily {
                origin: mean,
                directions,
            },
            coords,
        ))
    }

    /// The coordinates of `x` projected orthogonally onto a two-direction family's plane.
    pub fn project(&self, x: &Params) -> Result<[f64; 2]> {
        let [d1, d2] = self.directions.as_slice() else {
            return Err(EngineError::Invalid("projection needs a plane (two directions)".into()));
        };
        let r = sub(x, &self.origin)?;
        let (a, b, c) = (dot(d1, d1)?, dot(d1, d2)?, dot(d2, d2)?);
        let (p, q) = (dot(d1, &r)?, dot(d2, &r)?);
        let det = a * c - b * b;
        if det.abs() <= 1e-12 * (a * c).max(f64::MIN_POSITIVE) {
            return Err(EngineError::Param(
                "the two directions of the plane are parallel; pick checkpoints that differ".into(),
            ));
        }
        Ok([(c * p - b * q) / det, (a * q - b * p) / det])
    }
}

/// CART's family for each rank fraction: origin θ̄ (the experts' mean), direction
/// Σ_t SVD_k(θ_t − θ̄) on 2-D weights (zero elsewhere: vectors stay at the mean), with
/// k = ⌈fraction · min(m, n)⌉ by the SDK's [`rank_from_ratio`], as in the cart plugin. The SVD of each centred matrix is taken
/// once for all ranks.
pub fn cart_families(experts: &[Params], fractions: &[f64], device: &Device) -> Result<Vec<AffineFamily>> {
    let first = experts
        .first()
        .ok_or_else(|| EngineError::Param("CART needs at least one expert".into()))?;
    let n = experts.len() as f64;
    let terms: Vec<(&Params, f64)> = experts[1..].iter().map(|e| (e, 1.0)).collect();
    let mean: Params = combine(first, &terms)?
        .into_iter()
        .map(|(k, t)| Ok((k, t.affine(1.0 / n, 0.0)?)))
        .collect::<Result<_>>()?;
    let mut dirs: Vec<Params> = vec![Params::new(); fractions.len()];
    for (name, m_t) in &mean {
        let dims = m_t.dims().to_vec();
        let &[m, cols] = dims.as_slice() else {
            for d in &mut dirs {
                d.insert(name.clone(), m_t.zeros_like()?);
            }
            continue;
        };
        let r = m.min(cols);
        let mut sums = vec![vec![0f64; m * cols]; fractions.len()];
        for e in experts {
            let centred: Vec<f32> = (&e[name] - m_t)?.flatten_all()?.to_vec1()?;
            let (u, s, vt) = truncated_svd(&centred, m, cols, r).map_err(EngineError::Invalid)?;
            for (f, sum) in fractions.iter().zip(sums.iter_mut()) {
                let k = rank_from_ratio(r, *f);
                for j in 0..k {
                    for i in 0..m {
                        let ui = u[i * r + j] * s[j];
                        let row = &mut sum[i * cols..(i + 1) * cols];
                        row.iter_mut()
                            .zip(&vt[j * cols..(j + 1) * cols])
                            .for_each(|(o, v)| *o += ui * v);
                    }
                }
            }
        }
        for (d, sum) in dirs.iter_mut().zip(sums) {
            let v: Vec<f32> = sum.iter().map(|x| *x as f32).collect();
            d.insert(name.clone(), Tensor::from_vec(v, (m, cols), device)?);
        }
    }
    Ok(dirs
        .into_iter()
        .map(|d| AffineFamily {
            origin: mean.clone(),
            directions: vec![d],
        })
        .collect())
}

/// The cells of an `nx × ny` grid in coarse-to-fine order: every 2^m-th point first, then
/// the points of each finer stride; each cell appears once.
pub fn coarse_to_fine(nx: usize, ny: usize) -> Vec<(usize, usize)> {
    let span = nx.max(ny).saturating_sub(1).max(1);
    let mut stride = span.next_power_of_two();
    let mut seen = vec![false; nx * ny];
    let mut order = Vec::with_capacity(nx * ny);
    loop {
        for r in (0..ny).step_by(stride) {
            for c in (0..nx).step_by(stride) {
                if !seen[r * nx + c] {
                    seen[r * nx + c] = true;
                    order.push((r, c));
                }
            }
        }
        if stride == 1 {
            break;
        }
        stride /= 2;
    }
    order
}

/// Evaluations over a grid of coefficients (row r ↔ `ys[r]`, column c ↔ `xs[c]`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LandscapeGrid {
    /// Horizontal coordinates.
    pub xs: Vec<f64>,
    /// Vertical coordinates.
    pub ys: Vec<f64>,
    /// Row-major evaluations (`None`: not computed yet).
    pub cells: Vec<Option<EvalReport>>,
}

impl LandscapeGrid {
    /// An empty grid.
    pub fn new(xs: Vec<f64>, ys: Vec<f64>) -> LandscapeGrid {
        let n = xs.len() * ys.len();
        LandscapeGrid {
            xs,
            ys,
            cells: vec![None; n],
        }
    }

    /// `metric` per cell (`values[row][col]`, NaN where not computed).
    pub fn values(&self, metric: &Metric) -> Vec<Vec<f64>> {
        let nx = self.xs.len();
        (0..self.ys.len())
            .map(|r| {
                (0..nx)
                    .map(|c| self.cells[r * nx + c].as_ref().map_or(f64::NAN, |e| metric.value(e)))
                    .collect()
            })
            .collect()
    }

    /// Like [`Self::values`], with each missing cell showing the nearest computed cell above
    /// and to the left on the coarse lattice: the preview while a grid fills in.
    pub fn preview(&self, metric: &Metric) -> Vec<Vec<f64>> {
        let mut v = self.values(metric);
        for r in 0..v.len() {
            for c in 0..v[r].len() {
                if v[r][c].is_nan() {
                    let mut s = 1;
                    while s <= self.xs.len().max(self.ys.len()) {
                        s *= 2;
                        let (rr, cc) = (r - r % s, c - c % s);
                        if !v[rr][cc].is_nan() {
                            v[r][c] = v[rr][cc];
                            break;
                        }
                    }
                }
            }
        }
        v
    }

    /// Number of computed cells.
    pub fn done(&self) -> usize {
        self.cells.iter().filter(|c| c.is_some()).count()
    }
}

/// Evaluates `model(row, col)` at every cell not yet computed, coarse to fine, as many cells
/// at a time as there are worker threads, calling `on_cell(row, col, report, done, total)`
/// after each. Stops with [`EngineError::Cancelled`] when `cancel` is set; the grid keeps what
/// was computed.
pub fn fill_grid(
    grid: &mut LandscapeGrid,
    evaluator: &dyn InMemoryEvaluator,
    model: &(dyn Fn(usize, usize) -> Result<Params> + Sync),
    on_cell: &mut dyn FnMut(usize, usize, &EvalReport, usize, usize),
    cancel: &AtomicBool,
) -> Result<()> {
    use rayon::prelude::*;
    let nx = grid.xs.len();
    let total = grid.cells.len();
    let mut done = grid.done();
    let todo: Vec<(usize, usize)> = coarse_to_fine(nx, grid.ys.len())
        .into_iter()
        .filter(|(r, c)| grid.cells[r * nx + c].is_none())
        .collect();
    // Small models leave cores idle inside one evaluation: evaluate cells side by side.
    let width = rayon::current_num_threads().max(1);
    for chunk in todo.chunks(width) {
        if cancel.load(Ordering::Relaxed) {
            return Err(EngineError::Cancelled);
        }
        let reports: Vec<Result<EvalReport>> = chunk
            .par_iter()
            .map(|&(r, c)| evaluator.evaluate(&model(r, c)?))
            .collect();
        for (&(r, c), report) in chunk.iter().zip(reports) {
            let report = report?;
            done += 1;
            on_cell(r, c, &report, done, total);
            grid.cells[r * nx + c] = Some(report);
        }
    }
    Ok(())
}

/// A cache key for a landscape: what it is (`description`) and the identity (path, size,
/// modification time) of every input file.
pub fn cache_key(description: &str, inputs: &[PathBuf]) -> String {
    let mut h = Sha256::new();
    h.update(description.as_bytes());
    for p in inputs {
        let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        h.update(p.to_string_lossy().as_bytes());
        if let Ok(m) = std::fs::metadata(&p) {
            h.update(m.len().to_le_bytes());
            if let Ok(t) = m
                .modified()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).map_err(std::io::Error::other))
            {
                h.update(t.as_nanos().to_le_bytes());
            }
        }
    }
    h.finalize().iter().take(12).map(|b| format!("{b:02x}")).collect()
}

fn cache_path(root: Option<&Path>, key: &str) -> Result<PathBuf> {
    let root = match root {
        Some(r) => r.to_path_buf(),
        None => cache_dir()?,
    };
    Ok(root.join("landscapes").join(format!("{key}.json")))
}

/// The cached grid of `key` under `root` (default: the cache folder), if a complete or
/// partial one was saved.
pub fn load_cached(root: Option<&Path>, key: &str) -> Option<LandscapeGrid> {
    let bytes = std::fs::read(cache_path(root, key).ok()?).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Saves `grid` (complete or partial) under `key` in `root` (default: the cache folder),
/// atomically.
pub fn save_cached(root: Option<&Path>, key: &str, grid: &LandscapeGrid) -> Result<()> {
    let path = cache_path(root, key)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| EngineError::io("cannot create", dir, e))?;
    }
    let bytes = serde_json::to_vec(grid).map_err(|e| EngineError::Invalid(e.to_string()))?;
    mergescope_engine::writer::write_atomic(&path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: &[f32]) -> Params {
        let mut p = Params::new();
        p.insert("w".into(), Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu).unwrap());
        p
    }

    fn values(p: &Params) -> Vec<f32> {
        p["w"].to_vec1().unwrap()
    }

    #[test]
    fn coarse_to_fine_visits_corners_first_and_every_cell_once() {
        let order = coarse_to_fine(5, 5);
        assert_eq!(order.len(), 25);
        assert_eq!(&order[..4], &[(0, 0), (0, 4), (4, 0), (4, 4)]);
        // The stride-2 lattice (9 cells) is complete before any odd cell.
        assert!(order[..9].iter().all(|(r, c)| r % 2 == 0 && c % 2 == 0));
        let mut sorted = order.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 25);
        assert_eq!(coarse_to_fine(3, 1), vec![(0, 0), (0, 2), (0, 1)]);
    }

    #[test]
    fn task_arithmetic_line_and_plane_projection() {
        let base = params(&[1.0, 0.0]);
        let experts = [params(&[2.0, 0.0]), params(&[1.0, 3.0])];
        let ta = AffineFamily::task_arithmetic(&base, &experts).unwrap();
        assert_eq!(values(&ta.directions[0]), vec![1.0, 3.0]);
        assert_eq!(values(&ta.at(&[0.5]).unwrap()), vec![1.5, 1.5]);
        let plane = AffineFamily::plane(&base, &experts[0], &experts[1]).unwrap();
        assert_eq!(values(&plane.at(&[1.0, 0.0]).unwrap()), vec![2.0, 0.0]);
        let [a, b] = plane.project(&params(&[1.5, 6.0])).unwrap();
        assert!((a - 0.5).abs() < 1e-6 && (b - 2.0).abs() < 1e-6);
        assert!(
            AffineFamily::plane(&base, &experts[0], &experts[0])
                .unwrap()
                .project(&base)
                .is_err()
        );
    }

    #[test]
    fn a_trajectory_plane_reproduces_iterates_that_lie_in_it() {
        // Iterates in the plane of e1 and e2 (of R³): their principal plane contains them, so
        // the family at each iterate's coordinates is the iterate itself.
        let pts = [[0.0, 0.0, 1.0], [2.0, 0.0, 1.0], [2.0, 1.0, 1.0], [0.0, 3.0, 1.0]];
        let iterates: Vec<Params> = pts.iter().map(|p| params(&p.map(|x| x as f32))).collect();
        let (fam, coords) = AffineFamily::principal_plane(&iterates).unwrap();
        assert_eq!(values(&fam.origin), vec![1.0, 1.0, 1.0]);
        for (x, c) in iterates.iter().zip(&coords) {
            let back = values(&fam.at(c).unwrap());
            for (a, b) in back.iter().zip(values(x)) {
                assert!((a - b).abs() < 1e-5, "{back:?}");
            }
            let p = fam.project(x).unwrap();
            assert!((p[0] - c[0]).abs() < 1e-5 && (p[1] - c[1]).abs() < 1e-5);
        }
        // Unit directions: distances in the plane are distances in parameter space.
        let d0 = values(&fam.directions[0]);
        assert!((d0.iter().map(|v| v * v).sum::<f32>() - 1.0).abs() < 1e-5);
        assert!(AffineFamily::principal_plane(&iterates[..2]).is_err());
    }

    #[test]
    fn cart_at_full_rank_and_lambda_one_is_the_experts_sum_recentred() {
        // Full rank keeps every centred delta exactly: θ̄ + Σ_t (θ_t − θ̄) = Σ_t θ_t − (T−1)θ̄.
        let mk = |v: [f32; 4]| {
            let mut p = Params::new();
            p.insert("m".into(), Tensor::from_vec(v.to_vec(), (2, 2), &Device::Cpu).unwrap());
            p.insert("b".into(), Tensor::from_vec(vec![v[0]], 1, &Device::Cpu).unwrap());
            p
        };
        let experts = [
            mk([1.0, 2.0, 3.0, 4.0]),
            mk([0.0, 1.0, 0.0, 2.0]),
            mk([2.0, 0.0, 1.0, 0.0]),
        ];
        let fams = cart_families(&experts, &[1.0, 0.0], &Device::Cpu).unwrap();
        let full = fams[0].at(&[1.0]).unwrap();
        let got: Vec<f32> = full["m"].flatten_all().unwrap().to_vec1().unwrap();
        // Σ θ_t = [3, 3, 4, 6]; θ̄ = [1, 1, 4/3, 2] → Σ − 2θ̄ = [1, 1, 4/3, 2] (= θ̄ since Σ = 3θ̄).
        for (g, e) in got.iter().zip([1.0, 1.0, 4.0 / 3.0, 2.0]) {
            assert!((g - e).abs() < 1e-5, "{got:?}");
        }
        // Rank 0: only the mean, whatever λ; vectors always stay at the mean.
        let zero = fams[1].at(&[2.0]).unwrap();
        assert_eq!(zero["b"].to_vec1::<f32>().unwrap(), vec![1.0]);
        assert_eq!(rank_from_ratio(10, 0.08), 1);
        assert_eq!(rank_from_ratio(64, 0.08), 6);
    }

    #[test]
    fn preview_fills_missing_cells_from_the_coarse_lattice() {
        let mut g = LandscapeGrid::new(vec![0.0, 1.0, 2.0], vec![0.0, 1.0, 2.0]);
        let report = |acc: f64| {
            mergescope_lab::evaluator::summarise(
                mergescope_lab::data::SplitKind::Test,
                vec![mergescope_lab::evaluator::TaskScore::classification(
                    "t",
                    acc,
                    1.0 - acc,
                    None,
                    1,
                )],
            )
        };
        g.cells[0] = Some(report(0.5));
        g.cells[2] = Some(report(0.9));
        let m = Metric::parse("accuracy", None).unwrap();
        let v = g.values(&m);
        assert!(v[0][1].is_nan());
        let p = g.preview(&m);
        assert_eq!(p[0][1], 0.5);
        assert_eq!(p[2][2], 0.5, "(2, 2) falls back to the stride-4 cell (0, 0)");
        assert_eq!(p[0][2], 0.9);
        assert_eq!(
            Metric::parse("loss", Some("t"))
                .unwrap()
                .value(g.cells[2].as_ref().unwrap()),
            1.0 - 0.9
        );
    }
}
