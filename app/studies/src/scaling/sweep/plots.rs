//! From a sweep's rows to seed 002's scaling plots: per swept variable, the average accuracy
//! and loss of each method's merged models (mean and standard error over task groups), the
//! experts before merging beside them, the law of §1.3 fitted to each method's loss and
//! accuracy, and whether the fitted direction agrees with the paper's prediction.

use super::spec::{Aggregate, EXPERT, Hyper, SweepSpec, Variable};
use super::store::Row;
use crate::scaling::fit::{Direction, Fit, Law, fit};
use mergescope_figures::{Figure, Lines, Series};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Mean and standard error of a value over task groups.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stat {
    /// Mean over groups.
    pub mean: f64,
    /// Standard error of the mean (sample standard deviation ÷ √groups; 0 for one group).
    pub se: f64,
    /// Groups.
    pub n: usize,
}

impl Stat {
    /// The statistics of `values`.
    pub fn of(values: &[f64]) -> Stat {
        let n = values.len();
        let mean = values.iter().sum::<f64>() / n.max(1) as f64;
        let se = if n > 1 {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt() / (n as f64).sqrt()
        } else {
            0.0
        };
        Stat { mean, se, n }
    }
}

/// One method's (or the experts') measurements along a variable.
#[derive(Clone, Debug, PartialEq)]
pub struct Curve {
    /// Method name, or [`EXPERT`].
    pub method: String,
    /// `(x, accuracy, loss)` in x order.
    pub points: Vec<(f64, Stat, Stat)>,
}

/// Whether a measurement agrees with the paper's prediction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The fitted direction is the predicted one.
    Agrees,
    /// It is the opposite.
    Disagrees,
    /// Steps: a U was predicted, the grid shows one monotone side of it (the paper allows
    /// this "if one side dominates").
    OneSide,
}

impl Verdict {
    /// Short text.
    pub fn text(self) -> &'static str {
        match self {
            Verdict::Agrees => "agrees",
            Verdict::Disagrees => "disagrees",
            Verdict::OneSide => "one side of the U",
        }
    }
}

/// The law fitted to one method's mean loss along a variable.
#[derive(Clone, Debug, PartialEq)]
pub struct LawFit {
    /// Method name.
    pub method: String,
    /// The fit of the loss.
    pub loss: Fit,
    /// The fit of the accuracy (same form).
    pub accuracy: Fit,
    /// The loss's direction over the grid, by the fit.
    pub measured: Direction,
    /// Against the prediction.
    pub verdict: Verdict,
}

/// A point left out because fine-tuning diverged there (its rows hold NaN).
#[derive(Clone, Debug, PartialEq)]
pub struct Collapsed {
    /// Method name, or [`EXPERT`].
    pub method: String,
    /// Where along the variable.
    pub x: f64,
    /// Task groups that collapsed there.
    pub groups: usize,
    /// Task groups measured there.
    pub of: usize,
}

/// Everything measured along one swept variable.
#[derive(Clone, Debug, PartialEq)]
pub struct VariableResult {
    /// The variable.
    pub variable: Variable,
    /// Category names when the variable is not numeric (the optimiser).
    pub categories: Vec<String>,
    /// Methods in the specification's order, then the experts.
    pub curves: Vec<Curve>,
    /// Fits of the methods (where the law exists and the grid determines it).
    pub fits: Vec<LawFit>,
    /// Whether the grid is geometric (drawn on a log axis).
    pub log_x: bool,
    /// Points left out of the curves and fits because fine-tuning diverged.
    pub collapsed: Vec<Collapsed>,
}

impl VariableResult {
    /// `x` as the user reads it: the category's name for the optimiser, else the value.
    pub fn x_text(&self, x: f64) -> String {
        if self.categories.is_empty() {
            format!("{x}")
        } else {
            let i = (x.round() as usize).saturating_sub(1);
            self.categories.get(i).cloned().unwrap_or_else(|| format!("{x}"))
        }
    }

    /// One line naming the collapsed points, if any.
    pub fn collapsed_text(&self) -> Option<String> {
        if self.collapsed.is_empty() {
            return None;
        }
        let parts: Vec<String> = self
            .collapsed
            .iter()
            .map(|c| {
                let who = if c.method == EXPERT { "experts" } else { &c.method };
                format!("{who} at {} ({}/{} groups)", self.x_text(c.x), c.groups, c.of)
            })
            .collect();
        Some(format!(
            "collapsed (fine-tuning diverged; left out of curves and fits): {}",
            parts.join(", ")
        ))
    }
}

/// Splits the per-group `(accuracy, loss)` of one point into the point's statistics, or, when
/// a group collapsed (non-finite values), the record of the collapse.
fn point(method: &str, x: f64, groups: Vec<(f64, f64)>, collapsed: &mut Vec<Collapsed>) -> Option<(f64, Stat, Stat)> {
    let bad = groups.iter().filter(|(a, l)| !(a.is_finite() && l.is_finite())).count();
    if bad > 0 {
        collapsed.push(Collapsed {
            method: method.to_owned(),
            x,
            groups: bad,
            of: groups.len(),
        });
        return None;
    }
    let (acc, loss): (Vec<f64>, Vec<f64>) = groups.into_iter().unzip();
    Some((x, Stat::of(&acc), Stat::of(&loss)))
}

/// The loss direction along a variable as fitted over `[lo, hi]`, against the prediction.
pub fn verdict(law: Law, measured: Direction) -> Verdict {
    match (law.predicted(), measured) {
        (p, m) if p == m => Verdict::Agrees,
        (Direction::UShaped, _) => Verdict::OneSide,
        _ => Verdict::Disagrees,
    }
}

fn aggregate(rows: &[&Row], how: Aggregate) -> (f64, f64) {
    match how {
        Aggregate::Mean => {
            let n = rows.len().max(1) as f64;
            (
                rows.iter().map(|r| r.accuracy).sum::<f64>() / n,
                rows.iter().map(|r| r.loss).sum::<f64>() / n,
            )
        }
        Aggregate::Union => {
            let n = rows.iter().map(|r| r.examples).sum::<usize>().max(1) as f64;
            (
                rows.iter().map(|r| r.accuracy * r.examples as f64).sum::<f64>() / n,
                rows.iter().map(|r| r.loss * r.examples as f64).sum::<f64>() / n,
            )
        }
    }
}

/// The points along `var`: the other variables at their defaults, in x order.
fn slice(spec: &SweepSpec, var: Variable) -> Vec<Hyper> {
    let mut pts: Vec<Hyper> = spec
        .points()
        .into_iter()
        .filter(|h| Variable::ALL.iter().all(|v| *v == var || v.same(h, &spec.defaults)))
        .collect();
    match var {
        Variable::Optimizer => pts.sort_by(|a, b| a.optimizer.cmp(&b.optimizer)),
        v => pts.sort_by(|a, b| v.value(a).unwrap_or(0.0).total_cmp(&v.value(b).unwrap_or(0.0))),
    }
    pts
}

fn geometric(xs: &[f64]) -> bool {
    xs.len() >= 3
        && xs.first().is_some_and(|a| *a > 0.0)
        && xs.windows(2).all(|w| w[1] / w[0] >= 1.45)
        && xs.last().zip(xs.first()).is_some_and(|(b, a)| b / a >= 4.0)
}

/// The results along every swept variable, from the rows there are (a running sweep's
/// points without rows are left out).
pub fn analyse(spec: &SweepSpec, rows: &[Row]) -> Vec<VariableResult> {
    spec.swept()
        .into_iter()
        .map(|var| {
            let pts = slice(spec, var);
            let categories: Vec<String> = if var == Variable::Optimizer {
                pts.iter().map(|h| h.optimizer.clone()).collect()
            } else {
                Vec::new()
            };
            let x_of = |i: usize, h: &Hyper| var.value(h).unwrap_or((i + 1) as f64);
            let mut curves = Vec::new();
            let mut collapsed = Vec::new();
            for m in &spec.methods {
                let mut points = Vec::new();
                for (i, h) in pts.iter().enumerate() {
                    let mut by_group: BTreeMap<usize, Vec<&Row>> = BTreeMap::new();
                    for r in rows.iter().filter(|r| r.method == m.name() && &r.hyper == h) {
                        by_group.entry(r.group.unwrap_or(0)).or_default().push(r);
                    }
                    if by_group.is_empty() {
                        continue;
                    }
                    let groups = by_group.values().map(|g| aggregate(g, spec.aggregate)).collect();
                    points.extend(point(m.name(), x_of(i, h), groups, &mut collapsed));
                }
                curves.push(Curve {
                    method: m.name().to_owned(),
                    points,
                });
            }
            // The experts of each group (the groups the first method merged).
            let mut experts = Vec::new();
            for (i, h) in pts.iter().enumerate() {
                let mut groups: BTreeMap<usize, Vec<String>> = BTreeMap::new();
                for r in rows.iter().filter(|r| r.method != EXPERT && &r.hyper == h) {
                    groups
                        .entry(r.group.unwrap_or(0))
                        .or_insert_with(|| r.group_tasks.split('+').map(str::to_owned).collect());
                }
                let expert_hyper = Hyper { tasks: 0, ..h.clone() };
                let per_group: Vec<(f64, f64)> = groups
                    .values()
                    .filter_map(|names| {
                        let rs: Vec<&Row> = rows
                            .iter()
                            .filter(|r| r.method == EXPERT && r.hyper == expert_hyper && names.contains(&r.task))
                            .collect();
                        (rs.len() == names.len()).then(|| aggregate(&rs, spec.aggregate))
                    })
                    .collect();
                if !per_group.is_empty() {
                    experts.extend(point(EXPERT, x_of(i, h), per_group, &mut collapsed));
                }
            }
            curves.push(Curve {
                method: EXPERT.to_owned(),
                points: experts,
            });
            let fits = var
                .law()
                .map(|law| {
                    curves
                        .iter()
                        .filter(|c| c.method != EXPERT)
                        .filter_map(|c| {
                            let loss: Vec<(f64, f64)> = c.points.iter().map(|(x, _, l)| (*x, l.mean)).collect();
                            let acc: Vec<(f64, f64)> = c.points.iter().map(|(x, a, _)| (*x, a.mean)).collect();
                            let (lo, hi) = (loss.first()?.0, loss.last()?.0);
                            let loss_fit = fit(law, &loss).ok()?;
                            let measured = loss_fit.direction_over(lo, hi);
                            Some(LawFit {
                                method: c.method.clone(),
                                accuracy: fit(law, &acc).ok()?,
                                verdict: verdict(law, measured),
                                loss: loss_fit,
                                measured,
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            let xs: Vec<f64> = pts.iter().enumerate().map(|(i, h)| x_of(i, h)).collect();
            VariableResult {
                variable: var,
                categories,
                log_x: var != Variable::Optimizer && geometric(&xs),
                curves,
                fits,
                collapsed,
            }
        })
        .collect()
}

fn arrow(d: Direction) -> &'static str {
    match d {
        Direction::Decreasing => "falls",
        Direction::Increasing => "rises",
        Direction::UShaped => "U-shaped",
    }
}

/// The accuracy and loss figures of one variable: a series per method with standard-error
/// bars, the experts dashed, each method's fitted law dotted in its colour, and the paper's
/// prediction with the verdict per method as notes.
pub fn figures(result: &VariableResult) -> [(String, Figure); 2] {
    let var = result.variable;
    let law = var.law();
    let x_label = if result.categories.is_empty() {
        var.label().to_owned()
    } else {
        let names: Vec<String> = result
            .categories
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{} = {c}", i + 1))
            .collect();
        format!("{} ({})", var.label(), names.join(", "))
    };
    let make = |metric: &str| -> Figure {
        let is_loss = metric == "loss";
        let mut series = Vec::new();
        for (i, c) in result.curves.iter().enumerate() {
            let value = |p: &(f64, Stat, Stat)| if is_loss { p.2 } else { p.1 };
            let mut s = Series::new(
                if c.method == EXPERT {
                    "experts before merging (dashed)".to_owned()
                } else {
                    c.method.clone()
                },
                c.points.iter().map(|p| [p.0, value(p).mean]).collect(),
            );
            s.errors = c.points.iter().map(|p| value(p).se).collect();
            s.dashed = c.method == EXPERT;
            s.color = Some(i);
            series.push(s);
            if let Some(f) = result.fits.iter().find(|f| f.method == c.method)
                && let (Some(lo), Some(hi)) = (c.points.first(), c.points.last())
            {
                let fitted = if is_loss { &f.loss } else { &f.accuracy };
                let n = 40;
                let xs: Vec<f64> = (0..=n)
                    .map(|k| {
                        let t = k as f64 / n as f64;
                        if result.log_x {
                            (lo.0.ln() + t * (hi.0.ln() - lo.0.ln())).exp()
                        } else {
                            lo.0 + t * (hi.0 - lo.0)
                        }
                    })
                    .collect();
                let mut fs = Series::new(
                    format!("{} fit (dashed)", c.method),
                    xs.iter().map(|&x| [x, fitted.predict(x)]).collect(),
                );
                fs.dashed = true;
                fs.color = Some(i);
                series.push(fs);
            }
        }
        let mut notes = Vec::new();
        if let Some(law) = law {
            let predicted = law.predicted();
            let said = if is_loss {
                arrow(predicted).to_owned()
            } else {
                match predicted {
                    Direction::Decreasing => "rises".to_owned(),
                    Direction::Increasing => "falls".to_owned(),
                    Direction::UShaped => "inverted U".to_owned(),
                }
            };
            notes.push(format!("seed 002 predicts: {metric} {said} with {}", var.key()));
            for f in &result.fits {
                let mut line = format!(
                    "{}: loss {} ({}), R² {:.2}",
                    f.method,
                    arrow(f.measured),
                    f.verdict.text(),
                    f.loss.r_squared
                );
                if let Some(k) = f.loss.optimum().filter(|_| law == Law::Steps) {
                    let _ = write!(line, ", K* ≈ {k:.0}");
                }
                notes.push(line);
            }
        }
        notes.extend(result.collapsed_text());
        Figure::Lines(Lines {
            title: format!(
                "Merged models' average {} against {}",
                if is_loss { "loss" } else { "accuracy" },
                var.label()
            ),
            x_label: x_label.clone(),
            y_label: if is_loss {
                "average test loss (cross-entropy)".into()
            } else {
                "average test accuracy".into()
            },
            y2_label: None,
            log_x: result.log_x,
            log_y: false,
            series,
            better: None,
            notes,
        })
    };
    [
        (format!("{}-accuracy", var.key()), make("accuracy")),
        (format!("{}-loss", var.key()), make("loss")),
    ]
}

/// A Markdown table of every fit: law, coefficients, R², measured and predicted direction,
/// verdict, and K* for the steps law.
pub fn fits_markdown(results: &[VariableResult]) -> String {
    let mut out = String::from(
        "| variable | method | law (loss) | coefficients | R² | loss over the grid | predicted | verdict |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let Some(law) = r.variable.law() else { continue };
        for f in &r.fits {
            let coefs: Vec<String> = f.loss.coefficients.iter().map(|c| format!("{c:.4}")).collect();
            let mut measured = arrow(f.measured).to_owned();
            if let Some(k) = f.loss.optimum().filter(|_| law == Law::Steps) {
                let _ = write!(measured, " (K* ≈ {k:.0})");
            }
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.3} | {} | {} | {} |",
                r.variable.key(),
                f.method,
                law.formula(),
                coefs.join(", "),
                f.loss.r_squared,
                measured,
                arrow(law.predicted()),
                f.verdict.text()
            );
        }
    }
    for r in results {
        if let Some(text) = r.collapsed_text() {
            let _ = write!(out, "\n{}: {text}\n", r.variable.key());
        }
    }
    out
}

/// The plots folder of a sweep folder.
pub const PLOTS_DIR: &str = "plots";

/// Writes every figure of `results` as PNG (`width`×`height`) and CSV into `<out_dir>/plots`,
/// and the fits table as `<out_dir>/fits.md`, each atomically; returns the files written.
pub fn write_plots(
    out_dir: &std::path::Path,
    results: &[VariableResult],
    width: u32,
    height: u32,
) -> mergescope_engine::error::Result<Vec<std::path::PathBuf>> {
    use mergescope_engine::error::EngineError;
    let dir = out_dir.join(PLOTS_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| EngineError::io("cannot create", &dir, e))?;
    let mut written = Vec::new();
    for r in results {
        for (name, figure) in figures(r) {
            let png = dir.join(format!("{name}.png"));
            let bytes = mergescope_figures::render_png(&figure, width, height)
                .map_err(|e| EngineError::Invalid(format!("cannot draw {name}: {e}")))?;
            mergescope_engine::writer::write_atomic(&png, &bytes)?;
            let csv = dir.join(format!("{name}.csv"));
            mergescope_engine::writer::write_atomic(&csv, mergescope_figures::to_csv(&figure).as_bytes())?;
            written.extend([png, csv]);
        }
    }
    let md = out_dir.join("fits.md");
    mergescope_engine::writer::write_atomic(&md, fits_markdown(results).as_bytes())?;
    written.push(md);
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scaling::sweep::spec::{Grid, MethodSpec};
    use mergescope_lab::nn::Arch;

    fn row(h: &Hyper, group: Option<usize>, method: &str, task: &str, acc: f64, loss: f64, n: usize) -> Row {
        Row {
            hyper: h.clone(),
            group,
            group_tasks: "a+b".into(),
            method: method.into(),
            task: task.into(),
            accuracy: acc,
            loss,
            examples: n,
            seconds: 0.0,
        }
    }

    /// One method (TA) over the learning rates `lr`, N = 2, default η = 10⁻³.
    fn lr_spec(lr: Vec<f64>) -> SweepSpec {
        let mut spec = SweepSpec::preset("paper-002", Arch::Mlp).unwrap();
        spec.grid = Grid { lr, ..Grid::default() };
        spec.defaults.tasks = 2;
        spec.defaults.lr = 1e-3;
        spec.methods = vec![MethodSpec {
            plugin: "task-arithmetic".into(),
            label: Some("TA".into()),
            params: Default::default(),
        }];
        spec
    }

    #[test]
    fn stat_is_mean_and_standard_error() {
        let s = Stat::of(&[1.0, 2.0, 3.0]);
        assert!((s.mean - 2.0).abs() < 1e-12);
        // sd = 1, se = 1/√3.
        assert!((s.se - 1.0 / 3f64.sqrt()).abs() < 1e-12);
        assert_eq!(Stat::of(&[4.0]).se, 0.0);
    }

    /// Rows made from a known law come back as that law, with SE bars over groups, the union
    /// aggregation weighting by examples, and the experts beside.
    #[test]
    fn a_known_learning_rate_law_is_recovered_from_rows() {
        let mut spec = lr_spec(vec![1e-4, 1e-3, 3e-3, 1e-2]);
        let mut rows = Vec::new();
        for h in spec.points() {
            let law = 1.0 + 2000.0 * h.lr * h.lr;
            for g in 0..2 {
                let shift = if g == 0 { 0.1 } else { -0.1 };
                // Task a: 100 examples, task b: 300.
                rows.push(row(&h, Some(g), "TA", "a", 0.8, law + shift, 100));
                rows.push(row(&h, Some(g), "TA", "b", 0.4, law + shift, 300));
            }
            let e = Hyper { tasks: 0, ..h.clone() };
            rows.push(row(&e, None, EXPERT, "a", 0.9, 0.3, 100));
            rows.push(row(&e, None, EXPERT, "b", 0.7, 0.5, 300));
        }
        let results = analyse(&spec, &rows);
        assert_eq!(results.len(), 1);
        let r = &results[0];
        assert_eq!(r.variable, Variable::LearningRate);
        assert!(r.log_x, "1e-4 … 1e-2 is geometric");
        let ta = &r.curves[0];
        assert_eq!(ta.points.len(), 4);
        let (_, acc, loss) = ta.points[0];
        assert!((acc.mean - 0.6).abs() < 1e-12, "mean over tasks");
        // Groups at law ± 0.1: sd = 0.1414, se = 0.1.
        assert!((loss.se - 0.1).abs() < 1e-9, "{loss:?}");
        let f = &r.fits[0];
        assert!((f.loss.coefficients[0] - 1.0).abs() < 1e-6 && (f.loss.coefficients[1] - 2000.0).abs() < 1e-3);
        assert_eq!(f.measured, Direction::Increasing);
        assert_eq!(f.verdict, Verdict::Agrees);
        let experts = &r.curves[1];
        assert_eq!(experts.method, EXPERT);
        assert!((experts.points[0].1.mean - 0.8).abs() < 1e-12);
        // Over the union, task b counts three times as much: 0.25·0.8 + 0.75·0.4 = 0.5.
        spec.aggregate = Aggregate::Union;
        let u = analyse(&spec, &rows);
        assert!((u[0].curves[0].points[0].1.mean - 0.5).abs() < 1e-12);
        // The figures carry bars, a fitted curve and the verdict.
        let [(name, acc_fig), (_, loss_fig)] = figures(&r.clone());
        assert_eq!(name, "lr-accuracy");
        let Figure::Lines(l) = loss_fig else { panic!() };
        assert_eq!(l.series.len(), 3, "TA, its fit, the experts");
        assert_eq!(l.series[0].errors.len(), 4);
        assert!(
            l.notes.iter().any(|n| n.contains("TA: loss rises (agrees)")),
            "{:?}",
            l.notes
        );
        assert!(matches!(acc_fig, Figure::Lines(_)));
        let md = fits_markdown(&results);
        assert!(md.contains("| lr | TA | a + c·η² |"), "{md}");
    }

    /// A point where fine-tuning diverged (NaN rows) is left out of the curve and the fit and
    /// named as collapsed, with how many groups collapsed there.
    #[test]
    fn collapsed_points_are_named_and_left_out_of_the_fit() {
        let spec = lr_spec(vec![1e-4, 1e-3, 3e-3, 1e-2, 1.0]);
        let mut rows = Vec::new();
        for h in spec.points() {
            let law = 1.0 + 2000.0 * h.lr * h.lr;
            let blown = h.lr == 1.0;
            for g in 0..2 {
                let (acc, loss) = if blown && g == 1 {
                    (f64::NAN, f64::NAN)
                } else {
                    (0.5, law)
                };
                rows.push(row(&h, Some(g), "TA", "a", acc, loss, 100));
                rows.push(row(&h, Some(g), "TA", "b", acc, loss, 100));
            }
            let e = Hyper { tasks: 0, ..h.clone() };
            let b = if blown { f64::NAN } else { 0.5 };
            rows.push(row(&e, None, EXPERT, "a", 0.9, 0.3, 100));
            rows.push(row(&e, None, EXPERT, "b", b, b, 100));
        }
        let r = &analyse(&spec, &rows)[0];
        assert_eq!(r.curves[0].points.len(), 4);
        assert_eq!(r.curves[1].points.len(), 4);
        let c = &r.fits[0].loss.coefficients;
        assert!((c[0] - 1.0).abs() < 1e-6 && (c[1] - 2000.0).abs() < 1e-3, "{c:?}");
        assert_eq!(
            r.collapsed,
            vec![
                Collapsed {
                    method: "TA".into(),
                    x: 1.0,
                    groups: 1,
                    of: 2
                },
                Collapsed {
                    method: EXPERT.into(),
                    x: 1.0,
                    groups: 2,
                    of: 2
                }
            ]
        );
        let text = "collapsed (fine-tuning diverged; left out of curves and fits): TA at 1 (1/2 groups), experts at 1 (2/2 groups)";
        let [(_, Figure::Lines(l)), _] = figures(r) else {
            panic!()
        };
        assert!(l.notes.iter().any(|n| n == text), "{:?}", l.notes);
        assert!(fits_markdown(std::slice::from_ref(r)).contains(&format!("lr: {text}")));
    }

    #[test]
    fn verdicts() {
        assert_eq!(verdict(Law::Tasks, Direction::Increasing), Verdict::Agrees);
        assert_eq!(verdict(Law::Batch, Direction::Increasing), Verdict::Disagrees);
        assert_eq!(verdict(Law::Steps, Direction::Decreasing), Verdict::OneSide);
        assert_eq!(verdict(Law::Steps, Direction::UShaped), Verdict::Agrees);
    }
}
