//! Estimates of the bound's data-dependent constants from gradients on calibration data
//! (reference §1.4; these estimators are ours, not the paper's): the per-example gradient
//! noise σ_i² = mean_z ‖∇ℓ(x; z) − ∇f_i(x)‖² and the heterogeneity
//! ζ_i² = ‖∇f_i(x) − Σ_k λ_k ∇f_k(x)‖², both at a point x (the base by default), with each
//! task's frozen head.

use candle_core::{Device, Var};
use mergescope_engine::error::{EngineError, Result};
use mergescope_lab::data::{SplitKind, TaskData};
use mergescope_lab::nn::{Arch, Head, Params, cross_entropy, images_tensor, labels_tensor};
use std::sync::atomic::{AtomicBool, Ordering};

/// The gradient statistics of each task at one point.
#[derive(Clone, Debug, PartialEq)]
pub struct GradientStats {
    /// Task names, in order.
    pub tasks: Vec<String>,
    /// Per-example gradient noise σ_i².
    pub sigma2: Vec<f64>,
    /// Heterogeneity ζ_i² against the λ-weighted mean gradient.
    pub zeta2: Vec<f64>,
    /// Mean cross-entropy f_i(x) on the examples used.
    pub loss: Vec<f64>,
    /// Calibration examples used per task.
    pub examples: usize,
}

/// One example's (or a batch's) loss gradient at `at`, flattened in `at`'s key order.
fn gradient(
    arch: Arch,
    at: &Params,
    head: &Head,
    images: &[u8],
    labels: &[u8],
    device: &Device,
) -> Result<(f64, Vec<f32>)> {
    let vars: Vec<(String, Var)> = at
        .iter()
        .map(|(k, t)| Ok((k.clone(), Var::from_tensor(&t.detach())?)))
        .collect::<Result<_>>()?;
    let p: Params = vars.iter().map(|(k, v)| (k.clone(), v.as_tensor().clone())).collect();
    let x = images_tensor(images, device)?;
    let y = labels_tensor(labels, device)?;
    let loss = cross_entropy(&head.logits(&arch.features(&p, &x)?)?, &y)?;
    let value = f64::from(loss.to_scalar::<f32>()?);
    let store = loss.backward()?;
    let mut flat = Vec::new();
    for (_, v) in &vars {
        match store.get(v.as_tensor()) {
            Some(g) => flat.extend(g.flatten_all()?.to_vec1::<f32>()?),
            None => flat.extend(std::iter::repeat_n(0.0, v.as_tensor().elem_count())),
        }
    }
    Ok((value, flat))
}

/// σ_i², ζ_i² and f_i at `at` from the first `per_task` calibration examples of each task of
/// `tasks` (with its head in `heads`), ζ against the weights `lambdas` (normalised to sum 1).
pub fn gradient_statistics(
    arch: Arch,
    at: &Params,
    tasks: &[(&TaskData, &Head)],
    lambdas: &[f64],
    per_task: usize,
    device: &Device,
    cancel: &AtomicBool,
) -> Result<GradientStats> {
    if lambdas.len() != tasks.len() {
        return Err(EngineError::Param(format!(
            "{} weights for {} tasks: give one λ per task",
            lambdas.len(),
            tasks.len()
        )));
    }
    if per_task < 2 {
        return Err(EngineError::Param(
            "the gradient noise needs at least 2 examples per task".into(),
        ));
    }
    let total: f64 = lambdas.iter().sum();
    let weights: Vec<f64> = lambdas
        .iter()
        .map(|l| if total > 0.0 { l / total } else { 0.0 })
        .collect();
    let mut means: Vec<Vec<f64>> = Vec::new();
    let (mut sigma2, mut loss) = (Vec::new(), Vec::new());
    let mut used = per_task;
    for (data, head) in tasks {
        let split = data.split(SplitKind::Calibration);
        let n = split.len().min(per_task);
        used = used.min(n);
        let side = data.image_size.0 * data.image_size.1;
        let mut per_example: Vec<Vec<f32>> = Vec::with_capacity(n);
        let mut l = 0.0;
        for i in 0..n {
            if cancel.load(Ordering::Relaxed) {
                return Err(EngineError::Cancelled);
            }
            let (v, g) = gradient(
                arch,
                at,
                head,
                &split.images[i * side..(i + 1) * side],
                &split.labels[i..=i],
                device,
            )?;
            l += v;
            per_example.push(g);
        }
        let d = per_example.first().map_or(0, Vec::len);
        let mean: Vec<f64> = (0..d)
            .map(|j| per_example.iter().map(|g| f64::from(g[j])).sum::<f64>() / n as f64)
            .collect();
        let noise = per_example
            .iter()
            .map(|g| {
                g.iter()
                    .zip(&mean)
                    .map(|(a, m)| (f64::from(*a) - m).powi(2))
                    .sum::<f64>()
            })
            .sum::<f64>()
            / n as f64;
        sigma2.push(noise);
        loss.push(l / n as f64);
        means.push(mean);
    }
    let d = means.first().map_or(0, Vec::len);
    let avg: Vec<f64> = (0..d)
        .map(|j| means.iter().zip(&weights).map(|(g, w)| w * g[j]).sum())
        .collect();
    let zeta2 = means
        .iter()
        .map(|g| g.iter().zip(&avg).map(|(a, b)| (a - b).powi(2)).sum())
        .collect();
    Ok(GradientStats {
        tasks: tasks.iter().map(|(t, _)| t.name.clone()).collect(),
        sigma2,
        zeta2,
        loss,
        examples: used,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With one example per task repeated, every per-example gradient is the mean: σ² = 0. Two
    /// identical tasks have ζ² = 0; ζ² of two tasks with λ = ½ each is ‖g_1 − g_2‖²/4 for both.
    #[test]
    fn noise_and_heterogeneity_on_hand_cases() {
        let dev = Device::Cpu;
        let all = mergescope_lab::data::demo_tasks().unwrap();
        let mnist = all.iter().find(|t| t.name == "mnist").unwrap();
        let letters = all.iter().find(|t| t.name == "letters").unwrap();
        let base = Arch::Mlp.init(0, &dev).unwrap();
        let head10 = Head::init(128, 10, 1, &dev).unwrap();
        let head_l = Head::init(128, letters.classes.len(), 2, &dev).unwrap();
        // One example copied: σ² = 0 exactly (up to rounding).
        let mut one = mnist.clone();
        let side = 28 * 28;
        let first = one.train.images[..side].to_vec();
        let label = one.train.labels[0];
        one.train.images = first.repeat(one.train.len());
        one.train.labels = vec![label; one.train.len()];
        let no = AtomicBool::new(false);
        let s = gradient_statistics(Arch::Mlp, &base, &[(&one, &head10)], &[1.0], 5, &dev, &no).unwrap();
        assert!(s.sigma2[0] < 1e-10, "{}", s.sigma2[0]);
        assert_eq!(s.zeta2[0], 0.0);
        // The same task twice: ζ² = 0 for both.
        let s = gradient_statistics(
            Arch::Mlp,
            &base,
            &[(mnist, &head10), (mnist, &head10)],
            &[1.0, 1.0],
            4,
            &dev,
            &no,
        )
        .unwrap();
        assert!(s.zeta2.iter().all(|z| *z < 1e-12), "{:?}", s.zeta2);
        assert!(s.sigma2[0] > 0.0 && (s.sigma2[0] - s.sigma2[1]).abs() < 1e-9 * s.sigma2[0]);
        // Two different tasks at λ = ½: ζ_1² = ζ_2² = ‖g_1 − g_2‖²/4.
        let s = gradient_statistics(
            Arch::Mlp,
            &base,
            &[(mnist, &head10), (letters, &head_l)],
            &[2.0, 2.0],
            4,
            &dev,
            &no,
        )
        .unwrap();
        assert!((s.zeta2[0] - s.zeta2[1]).abs() < 1e-6 * s.zeta2[0] && s.zeta2[0] > 0.0);
        // The batch gradient of the 4 examples is the mean of the per-example ones.
        let split = mnist.split(SplitKind::Calibration);
        let (_, g1) = gradient(
            Arch::Mlp,
            &base,
            &head10,
            &split.images[..4 * side],
            &split.labels[..4],
            &dev,
        )
        .unwrap();
        let (_, g2) = gradient(
            Arch::Mlp,
            &base,
            &head_l,
            &letters.split(SplitKind::Calibration).images[..4 * side],
            &letters.split(SplitKind::Calibration).labels[..4],
            &dev,
        )
        .unwrap();
        let diff: f64 = g1.iter().zip(&g2).map(|(a, b)| f64::from(a - b).powi(2)).sum();
        assert!(
            (s.zeta2[0] - diff / 4.0).abs() < 1e-4 * s.zeta2[0],
            "{} vs {}",
            s.zeta2[0],
            diff / 4.0
        );
    }
}
