//! The cells of a sweep: what each unit of work is (an expert on its task, or a merge of a task
//! group with a method), their order, the fine-tuning runs they still need, where the runs'
//! checkpoints live, and the result rows a cell gives.

use super::spec::{EXPERT, Hyper, SweepSpec, task_groups};
use super::store::{CellKey, Row, cell_key, expert_cell_key};
use mergescope_lab::evaluator::EvalReport;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One (run, task) fine-tuning job: its folder, the steps it checkpoints.
pub(super) struct RunJob {
    pub(super) hyper: Hyper,
    pub(super) snapshots: Vec<usize>,
}

/// The checkpoint of task `task` after `steps` steps of the run of `hyper`, relative to the
/// sweep's models folder.
pub fn expert_file(hyper: &Hyper, task: &str, steps: usize) -> String {
    format!("experts/{}/{task}.k{steps}.safetensors", hyper.run_id())
}

/// The marker a diverged run leaves beside its snapshots: the step whose loss was not
/// finite, then the error. The snapshots from that step on do not exist: those experts, and
/// every merge that needs one, are recorded as collapsed (accuracy and loss NaN).
pub fn diverged_file(hyper: &Hyper, task: &str) -> String {
    format!("experts/{}/{task}.diverged", hyper.run_id())
}

/// The step at which the run of `hyper` on `task` diverged, if it did.
pub(super) fn diverged_at(models: &Path, hyper: &Hyper, task: &str) -> Option<usize> {
    std::fs::read_to_string(models.join(diverged_file(hyper, task)))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Whether the expert of `task` at `hyper` (its `steps`) collapsed: its run diverged first.
fn collapsed(models: &Path, hyper: &Hyper, task: &str) -> bool {
    diverged_at(models, hyper, task).is_some_and(|step| step <= hyper.steps)
}

/// A unit of work with its own rows.
pub(super) enum Cell {
    /// An expert on its own task.
    Expert { hyper: Hyper, task: usize },
    /// A merge of a task group with a method, on each of the group's tasks.
    Merge {
        hyper: Hyper,
        group: usize,
        tasks: Vec<usize>,
        method: usize,
    },
}

impl Cell {
    /// The sweep point the cell belongs to.
    pub(super) fn hyper(&self) -> &Hyper {
        match self {
            Cell::Expert { hyper, .. } | Cell::Merge { hyper, .. } => hyper,
        }
    }

    /// The pool indices of the tasks whose experts the cell needs (and evaluates).
    pub(super) fn tasks(&self) -> &[usize] {
        match self {
            Cell::Expert { task, .. } => std::slice::from_ref(task),
            Cell::Merge { tasks, .. } => tasks,
        }
    }

    /// Names of the cell's tasks.
    pub(super) fn task_names(&self, pool: &[String]) -> Vec<String> {
        self.tasks().iter().map(|&t| pool[t].clone()).collect()
    }

    /// The key of the cell in the results file.
    pub(super) fn key(&self, spec: &SweepSpec, pool: &[String]) -> CellKey {
        match self {
            Cell::Expert { hyper, task } => expert_cell_key(hyper, &pool[*task]),
            Cell::Merge {
                hyper, group, method, ..
            } => cell_key(hyper, Some(*group), spec.methods[*method].name()),
        }
    }

    /// What every row of the cell shares: an expert's rows have N = 0 and no group; a merge's
    /// carry its group and method. Task empty, metrics NaN, no examples, no time yet.
    pub(super) fn template(&self, spec: &SweepSpec, pool: &[String]) -> Row {
        let (hyper, group, group_tasks, method) = match self {
            Cell::Expert { hyper, .. } => (
                Hyper {
                    tasks: 0,
                    ..hyper.clone()
                },
                None,
                String::new(),
                EXPERT.to_owned(),
            ),
            Cell::Merge {
                hyper, group, method, ..
            } => (
                hyper.clone(),
                Some(*group),
                self.task_names(pool).join("+"),
                spec.methods[*method].name().to_owned(),
            ),
        };
        Row {
            hyper,
            group,
            group_tasks,
            method,
            task: String::new(),
            accuracy: f64::NAN,
            loss: f64::NAN,
            examples: 0,
            seconds: 0.0,
        }
    }

    /// Whether one of the experts the cell needs collapsed (its run diverged before the
    /// cell's step count).
    pub(super) fn collapsed(&self, models: &Path, pool: &[String]) -> bool {
        self.tasks().iter().any(|&t| collapsed(models, self.hyper(), &pool[t]))
    }
}

/// The rows of a collapsed cell: one per task, accuracy and loss NaN.
pub(super) fn collapsed_rows(template: &Row, tasks: &[String]) -> Vec<Row> {
    tasks
        .iter()
        .map(|t| Row {
            task: t.clone(),
            ..template.clone()
        })
        .collect()
}

/// The rows of an evaluated cell: one per task of `report`, taking `seconds`.
pub(super) fn rows_from_report(template: &Row, report: &EvalReport, seconds: f64) -> Vec<Row> {
    report
        .tasks
        .iter()
        .map(|s| Row {
            task: s.task.clone(),
            accuracy: s.accuracy,
            loss: s.loss.unwrap_or(f64::NAN),
            examples: s.examples,
            seconds,
            ..template.clone()
        })
        .collect()
}

/// Every cell of the sweep, in order: each point's task groups, the experts of a group (each
/// (point, task) once, whatever groups it is in) before the group's merges, one per method.
pub(super) fn plan_cells(spec: &SweepSpec, pool: &[String]) -> Vec<Cell> {
    let mut cells: Vec<Cell> = Vec::new();
    let mut seen = BTreeSet::new();
    for h in &spec.points() {
        for (g, group) in task_groups(pool.len(), h.tasks, spec.groups, spec.seed)
            .into_iter()
            .enumerate()
        {
            for &t in &group {
                if seen.insert(expert_cell_key(h, &pool[t])) {
                    cells.push(Cell::Expert {
                        hyper: h.clone(),
                        task: t,
                    });
                }
            }
            for m in 0..spec.methods.len() {
                cells.push(Cell::Merge {
                    hyper: h.clone(),
                    group: g,
                    tasks: group.clone(),
                    method: m,
                });
            }
        }
    }
    cells
}

/// The fine-tuning runs that `cells` still need: one per (run, task) whose snapshots are not
/// all in `models` (a diverged run is not asked for the snapshots from its divergence on).
pub(super) fn runs_needed<'c>(
    spec: &SweepSpec,
    pool: &[String],
    cells: impl Iterator<Item = &'c Cell>,
    models: &Path,
) -> BTreeMap<(String, usize), RunJob> {
    let snapshots = spec.snapshots();
    let mut needed: BTreeMap<(String, usize), RunJob> = BTreeMap::new();
    for c in cells {
        let hyper = c.hyper();
        for &t in c.tasks() {
            let snaps = snapshots.get(&hyper.run_id()).cloned().unwrap_or_default();
            let stop = diverged_at(models, hyper, &pool[t]).unwrap_or(usize::MAX);
            if snaps
                .iter()
                .any(|&k| k < stop && !models.join(expert_file(hyper, &pool[t], k)).is_file())
            {
                needed.entry((hyper.run_id(), t)).or_insert(RunJob {
                    hyper: hyper.clone(),
                    snapshots: snaps,
                });
            }
        }
    }
    needed
}

#[cfg(test)]
mod tests {
    use super::*;
    use mergescope_lab::data::SplitKind;
    use mergescope_lab::evaluator::{TaskScore, summarise};
    use mergescope_lab::nn::Arch;

    /// The Experiments window test's tiny sweep: K ∈ {2, 4} around 6, N ∈ {2, 3} around 2,
    /// two groups, task arithmetic and TIES, on three tasks.
    fn tiny_spec() -> (SweepSpec, Vec<String>) {
        let mut spec = SweepSpec::paper_002(Arch::Mlp);
        spec.methods.truncate(2);
        spec.grid.steps = vec![2, 4];
        spec.grid.lr.clear();
        spec.grid.batch.clear();
        spec.grid.data_ratio.clear();
        spec.grid.optimizer.clear();
        spec.grid.tasks = vec![2, 3];
        spec.defaults.steps = 6;
        spec.defaults.batch = 16;
        spec.defaults.tasks = 2;
        spec.groups = 2;
        let pool = ["fashion_mnist", "letters", "mnist"].map(str::to_owned).to_vec();
        (spec, pool)
    }

    fn expert_tasks(cells: &[Cell], steps: usize) -> BTreeSet<usize> {
        cells
            .iter()
            .filter_map(|c| match c {
                Cell::Expert { hyper, task } if hyper.steps == steps => Some(*task),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn cells_are_each_expert_once_then_the_merges_that_need_them() {
        let (spec, pool) = tiny_spec();
        let cells = plan_cells(&spec, &pool);
        // By hand: K = 6, 2, 4 with N = 2 each give two 2-subsets of 3 tasks, which cover all 3
        // (3 experts + 2 groups × 2 methods = 7 cells each); N = 3 at K = 6 has one group and
        // reuses K = 6's experts (2 merges): 7 + 7 + 7 + 2 = 23.
        assert_eq!(cells.len(), 23);
        for k in [2, 4, 6] {
            assert_eq!(expert_tasks(&cells, k), BTreeSet::from([0, 1, 2]), "K = {k}");
        }
        let experts = cells.iter().filter(|c| matches!(c, Cell::Expert { .. })).count();
        assert_eq!(experts, 9);
        // Every merge comes after the expert cells of its group's tasks at its step count.
        for (i, c) in cells.iter().enumerate() {
            if let Cell::Merge {
                hyper, tasks, method, ..
            } = c
            {
                assert!(*method < 2);
                for t in tasks {
                    let before = cells[..i]
                        .iter()
                        .any(|e| matches!(e, Cell::Expert { hyper: h, task } if task == t && h.steps == hyper.steps));
                    assert!(before, "merge {i} ({:?}) before its expert of task {t}", hyper.run_id());
                }
            }
        }
    }

    #[test]
    fn runs_needed_are_the_runs_with_a_missing_snapshot_before_any_divergence() {
        let (spec, pool) = tiny_spec();
        let cells = plan_cells(&spec, &pool);
        let models = tempfile::tempdir().unwrap();
        let h = spec.defaults.clone();
        let needed = |models: &Path| runs_needed(&spec, &pool, cells.iter(), models);
        // One run per task (the steps are snapshots of one run), each saving K = 2, 4 and 6.
        let all = needed(models.path());
        assert_eq!(all.len(), 3);
        assert!(all.values().all(|j| j.snapshots == [2, 4, 6]));
        let touch = |rel: String, text: &str| {
            let p = models.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        // Task 0 has every snapshot: not needed any more.
        for k in [2, 4, 6] {
            touch(expert_file(&h, &pool[0], k), "");
        }
        // Task 1 diverged at step 3 and has its K = 2 snapshot: nothing it can still give.
        touch(diverged_file(&h, &pool[1]), "3 loss NaN");
        touch(expert_file(&h, &pool[1], 2), "");
        let left = needed(models.path());
        assert_eq!(left.keys().map(|(_, t)| *t).collect::<Vec<_>>(), [2]);
        // Without its K = 2 snapshot the diverged run is needed again (for K = 2 only).
        std::fs::remove_file(models.path().join(expert_file(&h, &pool[1], 2))).unwrap();
        assert_eq!(needed(models.path()).len(), 2);
    }

    /// An expert's rows belong to no group (N = 0); a merge's carry its group, its tasks and
    /// its method; every row takes its task's scores and the cell's time.
    #[test]
    fn rows_of_a_cell_take_its_identity_and_each_tasks_scores() {
        let (spec, pool) = tiny_spec();
        let cells = plan_cells(&spec, &pool);
        let expert = &cells[0];
        let t = expert.template(&spec, &pool);
        assert_eq!((t.hyper.tasks, t.group, t.method.as_str()), (0, None, EXPERT));
        assert!(t.accuracy.is_nan() && t.loss.is_nan());
        let merge = cells
            .iter()
            .find(|c| matches!(c, Cell::Merge { method: 1, .. }))
            .unwrap();
        let t = merge.template(&spec, &pool);
        assert_eq!(t.method, spec.methods[1].name());
        assert_eq!(t.group_tasks, merge.task_names(&pool).join("+"));
        assert_eq!(t.hyper.tasks, merge.hyper().tasks);
        let mut b = TaskScore::classification("letters", 0.5, 1.5, None, 40);
        b.loss = None;
        let report = summarise(
            SplitKind::Test,
            vec![TaskScore::classification("mnist", 0.9, 0.25, None, 50), b],
        );
        let rows = rows_from_report(&t, &report, 2.5);
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (rows[0].task.as_str(), rows[0].accuracy, rows[0].loss),
            ("mnist", 0.9, 0.25)
        );
        assert_eq!((rows[0].examples, rows[0].seconds), (50, 2.5));
        // A task without a loss is recorded with NaN, as the results file writes it.
        assert!(rows[1].loss.is_nan());
        assert!(rows.iter().all(|r| r.cell() == merge.key(&spec, &pool)));
        // A collapsed cell: one NaN row per task, same key.
        let c = collapsed_rows(&t, &merge.task_names(&pool));
        assert_eq!(c.len(), merge.tasks().len());
        assert!(
            c.iter()
                .all(|r| r.accuracy.is_nan() && r.cell() == merge.key(&spec, &pool))
        );
    }

    #[test]
    fn a_cell_collapses_when_one_of_its_runs_diverged_before_its_steps() {
        let (spec, pool) = tiny_spec();
        let cells = plan_cells(&spec, &pool);
        let models = tempfile::tempdir().unwrap();
        let merge = cells.iter().find(|c| matches!(c, Cell::Merge { .. })).unwrap();
        assert!(!merge.collapsed(models.path(), &pool));
        let h = merge.hyper();
        let t = merge.tasks()[1];
        let marker = models.path().join(diverged_file(h, &pool[t]));
        std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
        // Diverged after the cell's steps: its snapshot exists, nothing collapsed.
        std::fs::write(&marker, format!("{} loss NaN", h.steps + 1)).unwrap();
        assert!(!merge.collapsed(models.path(), &pool));
        std::fs::write(&marker, format!("{} loss NaN", h.steps)).unwrap();
        assert!(merge.collapsed(models.path(), &pool));
    }
}
