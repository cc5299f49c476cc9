//! Least-squares shape fits of seed 002's scaling laws (reference §1.3, column e): each law is
//! linear in its coefficients over a few basis functions of the swept variable, so a fit is a
//! small linear least-squares problem. The fits are shapes, not the bound's constants.

use mergescope_engine::error::{EngineError, Result};
use serde::{Deserialize, Serialize};

/// A swept hyperparameter and the form fitted to the loss against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Law {
    /// Fine-tuning steps K: a + c1·K + c2/√K (U-shaped; optimum K* = (c2 / 2c1)^(2/3)).
    Steps,
    /// Batch size b: a + c1·b + c2/b.
    Batch,
    /// Learning rate η: a + c·η².
    LearningRate,
    /// Data ratio α: a + c/α.
    DataRatio,
    /// Number of tasks N: a + c1·N + c2/√N.
    Tasks,
}

/// What the paper predicts for the loss as the variable grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    /// The loss falls.
    Decreasing,
    /// The loss rises.
    Increasing,
    /// The loss falls, then rises.
    UShaped,
}

impl Law {
    /// The basis functions' values at `x`.
    pub fn basis(self, x: f64) -> Vec<f64> {
        match self {
            Law::Steps | Law::Tasks => vec![1.0, x, 1.0 / x.sqrt()],
            Law::Batch => vec![1.0, x, 1.0 / x],
            Law::LearningRate => vec![1.0, x * x],
            Law::DataRatio => vec![1.0, 1.0 / x],
        }
    }

    /// The fitted form, for labels.
    pub fn formula(self) -> &'static str {
        match self {
            Law::Steps => "a + c1·K + c2/√K",
            Law::Batch => "a + c1·b + c2/b",
            Law::LearningRate => "a + c·η²",
            Law::DataRatio => "a + c/α",
            Law::Tasks => "a + c1·N + c2/√N",
        }
    }

    /// The paper's prediction for the loss (seed 002 §1.3, column b).
    pub fn predicted(self) -> Direction {
        match self {
            Law::Steps => Direction::UShaped,
            Law::Batch | Law::DataRatio => Direction::Decreasing,
            Law::LearningRate | Law::Tasks => Direction::Increasing,
        }
    }
}

/// A fitted law.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fit {
    /// The form.
    pub law: Law,
    /// Coefficients, in the order of [`Law::basis`].
    pub coefficients: Vec<f64>,
    /// Coefficient of determination of the fit.
    pub r_squared: f64,
}

impl Fit {
    /// The fitted value at `x`.
    pub fn predict(&self, x: f64) -> f64 {
        self.law
            .basis(x)
            .iter()
            .zip(&self.coefficients)
            .map(|(b, c)| b * c)
            .sum()
    }

    /// The steps law's optimum K* = (c2 / 2c1)^(2/3), when the fit is U-shaped (c1, c2 > 0).
    pub fn optimum(&self) -> Option<f64> {
        match (self.law, self.coefficients.as_slice()) {
            (Law::Steps | Law::Tasks, [_, c1, c2]) if *c1 > 0.0 && *c2 > 0.0 => Some((c2 / (2.0 * c1)).powf(2.0 / 3.0)),
            _ => None,
        }
    }

    /// The direction the fitted curve shows over `[lo, hi]`: U-shaped when its minimum lies
    /// strictly inside, otherwise by its ends.
    pub fn direction_over(&self, lo: f64, hi: f64) -> Direction {
        if let Some(k) = self.optimum()
            && k > lo
            && k < hi
        {
            return Direction::UShaped;
        }
        if self.predict(hi) < self.predict(lo) {
            Direction::Decreasing
        } else {
            Direction::Increasing
        }
    }
}

/// Fits `law` to the points `(x, loss)` by least squares (columns scaled for conditioning).
pub fn fit(law: Law, points: &[(f64, f64)]) -> Result<Fit> {
    let p = law.basis(1.0).len();
    if points.len() < p {
        return Err(EngineError::Param(format!(
            "fitting {} needs at least {p} points, got {}",
            law.formula(),
            points.len()
        )));
    }
    if let Some((x, _)) = points
        .iter()
        .find(|(x, y)| !(x.is_finite() && *x > 0.0 && y.is_finite()))
    {
        return Err(EngineError::Param(format!(
            "fitting {}: the swept value {x} must be positive and every loss finite",
            law.formula()
        )));
    }
    let rows: Vec<Vec<f64>> = points.iter().map(|(x, _)| law.basis(*x)).collect();
    let scale: Vec<f64> = (0..p)
        .map(|j| {
            rows.iter()
                .map(|r| r[j].abs())
                .fold(0.0, f64::max)
                .max(f64::MIN_POSITIVE)
        })
        .collect();
    // Normal equations on the scaled columns, solved by Gaussian elimination with pivoting.
    let mut m = vec![vec![0.0; p + 1]; p];
    for (r, (_, y)) in rows.iter().zip(points) {
        for i in 0..p {
            for j in 0..p {
                m[i][j] += r[i] / scale[i] * r[j] / scale[j];
            }
            m[i][p] += r[i] / scale[i] * y;
        }
    }
    for col in 0..p {
        let pivot = (col..p)
            .max_by(|a, b| m[*a][col].abs().total_cmp(&m[*b][col].abs()))
            .unwrap_or(col);
        m.swap(col, pivot);
        if m[col][col].abs() < 1e-12 {
            return Err(EngineError::Param(format!(
                "fitting {}: the swept values do not determine it (too few distinct values)",
                law.formula()
            )));
        }
        let pivot_row = m[col].clone();
        for (r, row) in m.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                row.iter_mut().zip(&pivot_row).skip(col).for_each(|(x, p)| *x -= f * p);
            }
        }
    }
    let coefficients: Vec<f64> = (0..p).map(|i| m[i][p] / m[i][i] / scale[i]).collect();
    let fitted = Fit {
        law,
        coefficients,
        r_squared: 0.0,
    };
    let mean = points.iter().map(|(_, y)| y).sum::<f64>() / points.len() as f64;
    let total: f64 = points.iter().map(|(_, y)| (y - mean).powi(2)).sum();
    let residual: f64 = points.iter().map(|(x, y)| (y - fitted.predict(*x)).powi(2)).sum();
    Ok(Fit {
        r_squared: if total > 0.0 { 1.0 - residual / total } else { 1.0 },
        ..fitted
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recover(law: Law, truth: &[f64], xs: &[f64]) -> Fit {
        let exact = Fit {
            law,
            coefficients: truth.to_vec(),
            r_squared: 1.0,
        };
        let pts: Vec<(f64, f64)> = xs.iter().map(|x| (*x, exact.predict(*x))).collect();
        let f = fit(law, &pts).unwrap();
        for (got, want) in f.coefficients.iter().zip(truth) {
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                "{law:?}: {:?} vs {truth:?}",
                f.coefficients
            );
        }
        assert!(f.r_squared > 0.999_999);
        f
    }

    #[test]
    fn every_law_recovers_known_coefficients_from_exact_data() {
        let k = recover(Law::Steps, &[0.5, 2e-4, 8.0], &[1000.0, 2000.0, 3000.0, 4000.0]);
        // K* = (8 / 4e-4)^(2/3) = 20000^(2/3) ≈ 736.8.
        assert!((k.optimum().unwrap() - 20000f64.powf(2.0 / 3.0)).abs() < 1e-3);
        assert_eq!(k.direction_over(1000.0, 4000.0), Direction::Increasing);
        assert_eq!(k.direction_over(100.0, 4000.0), Direction::UShaped);
        let b = recover(Law::Batch, &[1.2, 1e-4, 30.0], &[64.0, 128.0, 256.0, 512.0]);
        assert_eq!(b.direction_over(64.0, 256.0), Direction::Decreasing);
        let lr = recover(Law::LearningRate, &[0.9, 4000.0], &[0.001, 0.005, 0.01]);
        assert_eq!(lr.direction_over(0.001, 0.01), Direction::Increasing);
        recover(Law::DataRatio, &[0.7, 0.2], &[0.5, 0.8, 1.0]);
        recover(Law::Tasks, &[0.3, 0.05, 0.4], &[2.0, 3.0, 5.0, 7.0]);
    }

    #[test]
    fn noisy_data_is_fitted_in_the_least_squares_sense() {
        // y = 1 + 2/α plus alternating ±0.01: the fit stays within the noise.
        let pts: Vec<(f64, f64)> = [0.25, 0.5, 0.75, 1.0]
            .iter()
            .enumerate()
            .map(|(i, a)| (*a, 1.0 + 2.0 / a + if i % 2 == 0 { 0.01 } else { -0.01 }))
            .collect();
        let f = fit(Law::DataRatio, &pts).unwrap();
        assert!((f.coefficients[0] - 1.0).abs() < 0.05 && (f.coefficients[1] - 2.0).abs() < 0.02);
        assert!(
            fit(Law::Steps, &pts[..2]).is_err(),
            "two points cannot fix three coefficients"
        );
        assert!(fit(Law::LearningRate, &[(0.0, 1.0), (1.0, 2.0)]).is_err());
    }
}
