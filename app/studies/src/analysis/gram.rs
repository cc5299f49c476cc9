//! Principal-component projections of checkpoints and
//! trajectories through their Gram matrix (n×n for n points, never D×D), and cosine-similarity
//! matrices of task vectors. Inputs arrive chunk by chunk (one tensor of every point at a
//! time) and are accumulated in f64, so no model is ever flattened into one big vector.

use mergescope_engine::error::{EngineError, Result};

/// Inner products ⟨x_i, x_j⟩ of n flat vectors, accumulated in f64 over aligned chunks.
#[derive(Clone, Debug)]
pub struct Gram {
    n: usize,
    g: Vec<f64>,
}

impl Gram {
    /// An empty Gram matrix of `n` points.
    pub fn new(n: usize) -> Gram {
        Gram { n, g: vec![0.0; n * n] }
    }

    /// Number of points.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether there are no points.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Adds one aligned chunk of every point (the same tensor of each model): `chunks[i]` is
    /// point i's part; all must have the same length.
    pub fn add(&mut self, chunks: &[&[f32]]) -> Result<()> {
        if chunks.len() != self.n {
            return Err(EngineError::Invalid(format!(
                "Gram matrix of {} points got {} chunks",
                self.n,
                chunks.len()
            )));
        }
        if let Some(first) = chunks.first()
            && let Some(bad) = chunks.iter().position(|c| c.len() != first.len())
        {
            return Err(EngineError::Invalid(format!(
                "point {bad} has a chunk of {} values, point 0 one of {}",
                chunks[bad].len(),
                first.len()
            )));
        }
        for i in 0..self.n {
            for j in i..self.n {
                let d: f64 = chunks[i]
                    .iter()
                    .zip(chunks[j])
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                self.g[i * self.n + j] += d;
                if i != j {
                    self.g[j * self.n + i] += d;
                }
            }
        }
        Ok(())
    }

    /// ⟨x_i, x_j⟩.
    pub fn get(&self, i: usize, j: usize) -> f64 {
        self.g[i * self.n + j]
    }

    /// cos(x_i, x_j) for every pair (row-major n×n; 0 where a vector is zero, 1 on the
    /// diagonal of non-zero vectors): the task-vector similarity matrix when the points are
    /// task vectors.
    pub fn cosines(&self) -> Vec<f64> {
        let n = self.n;
        let mut c = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                let d = (self.get(i, i) * self.get(j, j)).sqrt();
                c[i * n + j] = if d > 0.0 { self.get(i, j) / d } else { 0.0 };
            }
        }
        c
    }

    /// The points' principal-component coordinates on the first `k` components: the
    /// eigen-decomposition of the doubly centred Gram matrix J G J (J = I − 11ᵀ/n), whose
    /// eigenvectors scaled by √eigenvalue are the coordinates (classical MDS = PCA).
    pub fn pca(&self, k: usize) -> Result<Projection> {
        let n = self.n;
        if n < 2 {
            return Err(EngineError::Invalid(format!(
                "a projection needs at least two checkpoints, not {n}"
            )));
        }
        let row: Vec<f64> = (0..n)
            .map(|i| (0..n).map(|j| self.get(i, j)).sum::<f64>() / n as f64)
            .collect();
        let all = row.iter().sum::<f64>() / n as f64;
        let centred = faer::Mat::<f64>::from_fn(n, n, |i, j| self.get(i, j) - row[i] - row[j] + all);
        let eig = centred
            .self_adjoint_eigen(faer::Side::Lower)
            .map_err(|e| EngineError::Invalid(format!("the eigen-decomposition did not converge: {e:?}")))?;
        let (u, s) = (eig.U(), eig.S().column_vector());
        // Nondecreasing order: the largest come last. Round-off can leave tiny negatives.
        let values: Vec<f64> = (0..n).rev().map(|i| s[i].max(0.0)).collect();
        let total: f64 = values.iter().sum();
        let k = k.min(n - 1).max(1);
        let coords = (0..n)
            .map(|p| {
                (0..k)
                    .map(|c| {
                        let col = n - 1 - c;
                        let v = u[(p, col)] * values[c].sqrt();
                        // Sign convention: the component's largest-magnitude entry is positive,
                        // so projections do not flip between runs.
                        let flip = (0..n)
                            .map(|q| u[(q, col)])
                            .fold(0.0f64, |m, x| if x.abs() > m.abs() { x } else { m });
                        if flip < 0.0 { -v } else { v }
                    })
                    .collect()
            })
            .collect();
        Ok(Projection {
            coords,
            explained: values[..k]
                .iter()
                .map(|v| if total > 0.0 { v / total } else { 0.0 })
                .collect(),
            total_variance: total / n as f64,
        })
    }
}

/// Points on their principal components.
#[derive(Clone, Debug, PartialEq)]
pub struct Projection {
    /// Coordinates, one row of k values per point.
    pub coords: Vec<Vec<f64>>,
    /// Fraction of the total variance each component explains.
    pub explained: Vec<f64>,
    /// Mean squared distance of the points from their centroid.
    pub total_variance: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gram(points: &[Vec<f32>], split: usize) -> Gram {
        let mut g = Gram::new(points.len());
        let (a, b): (Vec<&[f32]>, Vec<&[f32]>) = points.iter().map(|p| p.split_at(split)).unzip();
        g.add(&a).unwrap();
        g.add(&b).unwrap();
        g
    }

    /// Four points on a 4×2 rectangle in 3-D (constant third coordinate), fed in two chunks:
    /// PC1 is the long side (variance 4 of 5 → 80 %), PC2 the short one, coordinates ±2 and ±1
    /// around the centre, exactly as by hand.
    #[test]
    fn pca_of_a_rectangle_by_hand() {
        let pts = vec![
            vec![0.0, 0.0, 7.0],
            vec![4.0, 0.0, 7.0],
            vec![0.0, 2.0, 7.0],
            vec![4.0, 2.0, 7.0],
        ];
        let p = gram(&pts, 1).pca(2).unwrap();
        assert!(
            (p.explained[0] - 0.8).abs() < 1e-12 && (p.explained[1] - 0.2).abs() < 1e-12,
            "{p:?}"
        );
        assert!((p.total_variance - 5.0).abs() < 1e-9);
        // ±2 along PC1 and ±1 along PC2 (each component's sign is a convention).
        for c in &p.coords {
            assert!(
                (c[0].abs() - 2.0).abs() < 1e-9 && (c[1].abs() - 1.0).abs() < 1e-9,
                "{c:?}"
            );
        }
        // Distances are preserved whatever the signs.
        let d = |a: &[f64], b: &[f64]| ((a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2)).sqrt();
        assert!((d(&p.coords[0], &p.coords[3]) - 20f64.sqrt()).abs() < 1e-9);
        assert!((d(&p.coords[0], &p.coords[1]) - 4.0).abs() < 1e-9);
    }

    /// Collinear points: one component explains everything and the projection keeps their
    /// spacing along the line.
    #[test]
    fn pca_of_collinear_points() {
        let pts: Vec<Vec<f32>> = (0..5).map(|i| vec![i as f32, 2.0 * i as f32, -(i as f32)]).collect();
        let p = gram(&pts, 2).pca(2).unwrap();
        assert!((p.explained[0] - 1.0).abs() < 1e-12, "{p:?}");
        let xs: Vec<f64> = p.coords.iter().map(|c| c[0]).collect();
        let step = 6f64.sqrt();
        for w in xs.windows(2) {
            assert!(((w[1] - w[0]).abs() - step).abs() < 1e-9, "{xs:?}");
        }
    }

    /// The cosine matrix of the digest's three task vectors (seed 002–004 digest §4.6): checked
    /// against dot products computed here directly.
    #[test]
    fn cosine_matrix_of_task_vectors() {
        let t = [
            vec![0.5f32, -0.2, 0.1, 0.0, 0.9, -0.7, 0.05, 0.3, -0.4, 0.6],
            vec![-0.6, 0.25, 0.1, 0.2, -0.8, 0.7, -0.05, 0.35, 0.45, -0.1],
            vec![0.4, -0.3, -0.15, -0.2, 0.1, 0.2, 0.0, -0.3, 0.5, 0.55],
        ];
        let c = gram(&t, 4).cosines();
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum::<f64>();
        for i in 0..3 {
            assert!((c[i * 3 + i] - 1.0).abs() < 1e-12);
            for j in 0..3 {
                let want = dot(&t[i], &t[j]) / (dot(&t[i], &t[i]) * dot(&t[j], &t[j])).sqrt();
                assert!(
                    (c[i * 3 + j] - want).abs() < 1e-12,
                    "({i},{j}) {} vs {want}",
                    c[i * 3 + j]
                );
            }
        }
        // By hand: τ1·τ2 = −1.6875, ‖τ1‖² = 2.2125, ‖τ2‖² = 1.94, so cos = −0.814519…
        assert!((c[1] + 1.6875 / (2.2125f64 * 1.94).sqrt()).abs() < 1e-6, "{}", c[1]);
    }

    #[test]
    fn mismatched_chunks_are_refused() {
        let mut g = Gram::new(2);
        let e = g.add(&[&[1.0, 2.0], &[1.0]]).unwrap_err().to_string();
        assert!(e.contains("point 1"), "{e}");
        assert!(Gram::new(1).pca(2).is_err());
    }
}
