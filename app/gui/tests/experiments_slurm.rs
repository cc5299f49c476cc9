#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Experiments window's Executor choice: its Slurm fields (labels, the options they make, a
//! snapshot with a job's state drawn from fixed values), and the tiny sweep of
//! `experiments.rs` run through the Slurm executor from the window against a real Slurm (the
//! single-node cluster of scripts/slurm-cluster.sh, or the one `SLURM_CONF` names): the job's
//! state is shown while it runs, Cancel cancels the array job, Resume submits the rest, and
//! the results are the local run's (the reference rows, within the same tolerances). Without a cluster that part prints why and passes, unless
//! MERGESCOPE_REQUIRE_SLURM=1 (CI), where it fails.
//!
//! One test in this binary: it may set `SLURM_CONF` for the `sbatch`/`squeue` the window runs,
//! before any other thread starts.

mod common;

use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::{Queryable as _, by};
use mergescope_gui::MergescopeApp;
use mergescope_gui::experiments::{ExecutorKind, Outcome, SlurmStatus, mergescope_binary};
use mergescope_gui::settings::Theme;
use mergescope_studies::scaling::sweep::store::{Row, read_rows};
use mergescope_studies::scaling::sweep::{analyse, figures};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "../../../tests/support/external.rs"]
#[allow(dead_code)] // each test binary uses part of it
mod external;

use external::slurm_required as required;

/// The `SLURM_CONF` of a running cluster (started by scripts/slurm-cluster.sh when none is
/// named), or why there is none, as the CLI's Slurm tests find it.
fn cluster() -> Result<String, String> {
    external::start_slurm().map(|(conf, _)| conf)
}

fn harness(runs_dir: &Path) -> Harness<'static, MergescopeApp> {
    common::harness(common::app(runs_dir, Theme::Light))
}

/// Steps frames until `done` holds (or fails after `limit`), then three more.
fn step_until(
    h: &mut Harness<'static, MergescopeApp>,
    what: &str,
    limit: Duration,
    done: impl FnMut(&MergescopeApp) -> bool,
) {
    common::step_until(h, what, limit, done);
    h.run_steps(3);
}

/// See `SWEEP_ACCURACY_TOLERANCE` in experiments.rs.
const SWEEP_ACCURACY_TOLERANCE: f64 = 2.0 / 64.0 + 1e-9;
/// See `SWEEP_LOSS_TOLERANCE` in experiments.rs.
const SWEEP_LOSS_TOLERANCE: f64 = 1e-3;

/// The rows are the reference's (the local run's, `tests/fixtures/sweep/results.csv`): the
/// same cells and tasks and example counts, accuracies and losses within the tolerances.
fn assert_close_to_reference(rows: &[Row], reference: &[Row]) {
    let key = |r: &Row| format!("{} | {}", r.cell(), r.task);
    let by_key: BTreeMap<String, &Row> = reference.iter().map(|r| (key(r), r)).collect();
    let got: BTreeSet<String> = rows.iter().map(key).collect();
    assert_eq!(got.len(), rows.len(), "one row per cell and task");
    assert_eq!(got, by_key.keys().cloned().collect::<BTreeSet<_>>());
    for r in rows {
        let e = by_key[&key(r)];
        assert_eq!(r.examples, e.examples, "{}", key(r));
        assert!(
            (r.accuracy - e.accuracy).abs() <= SWEEP_ACCURACY_TOLERANCE,
            "{}: accuracy {} vs {}",
            key(r),
            r.accuracy,
            e.accuracy
        );
        assert!(
            (r.loss - e.loss).abs() <= SWEEP_LOSS_TOLERANCE * e.loss.abs().max(1.0),
            "{}: loss {} vs {}",
            key(r),
            r.loss,
            e.loss
        );
    }
}

/// Opens the window and makes its specification the tiny sweep of experiments.rs (K ∈ {2, 4,
/// 6}, N ∈ {2, 3}, two groups, TA and TIES, 64 test examples a task: 23 cells).
fn tiny_sweep(h: &mut Harness<'static, MergescopeApp>) {
    h.get_by_label("View").click();
    h.run_steps(2);
    h.get_by_label_contains("Experiments: fine-tuning sweeps…").click();
    h.run_steps(3);
    let e = &mut h.state_mut().doc.experiments;
    assert!(e.open);
    let mut spec = e.spec.clone();
    spec.methods
        .retain(|m| ["task-arithmetic", "ties"].contains(&m.plugin.as_str()));
    spec.grid.steps = vec![2, 4];
    spec.grid.lr.clear();
    spec.grid.batch.clear();
    spec.grid.data_ratio.clear();
    spec.grid.tasks = vec![2, 3];
    spec.defaults.steps = 6;
    spec.defaults.batch = 16;
    spec.defaults.tasks = 2;
    spec.groups = 2;
    spec.eval_examples = Some(64);
    e.set_spec(spec);
    h.run_steps(2);
    h.get_by_label("4 sweep points; swept: steps K, tasks N");
}

#[test]
fn the_executor_is_chosen_in_the_window_and_a_slurm_sweep_shows_its_job_and_the_local_results() {
    // Before any thread: the cluster, for the Slurm tools the window runs.
    let conf = cluster();
    if let Ok(c) = &conf
        && std::env::var_os("SLURM_CONF").is_none()
    {
        // SAFETY: no other thread runs yet (the only test of this binary, first thing).
        unsafe { std::env::set_var("SLURM_CONF", c) };
    }
    let runs = tempfile::tempdir().unwrap();
    let mut h = harness(runs.path());
    h.run_steps(3);
    tiny_sweep(&mut h);

    // Local by default; the Slurm fields appear once Slurm is chosen.
    assert_eq!(h.state().doc.experiments.executor, ExecutorKind::Local);
    assert!(h.query_by_label("partition").is_none());
    h.get(by().role(Role::RadioButton).label("Slurm")).click();
    h.run_steps(2);
    assert_eq!(h.state().doc.experiments.executor, ExecutorKind::Slurm);
    for name in ["partition", "time limit", "work folder", "setup line"] {
        h.get(by().role(Role::TextInput).label(name));
    }
    for name in ["CPUs per cell", "GPUs per cell", "max parallel cells"] {
        h.get(by().role(Role::SpinButton).label(name));
    }
    // A time limit sbatch would refuse is named under the fields, and Run says so too.
    h.get(by().role(Role::TextInput).label("time limit"))
        .set_text_value_accesskit("half an hour");
    h.run_steps(2);
    h.get_by_label_contains("Slurm time limit 'half an hour': write it as sbatch takes it");
    h.get(by().role(Role::TextInput).label("time limit"))
        .set_text_value_accesskit("00:10:00");
    h.get(by().role(Role::TextInput).label("partition"))
        .set_text_value_accesskit("debug");
    h.run_steps(2);
    h.get(by().role(Role::SpinButton).label("max parallel cells"))
        .set_value_accesskit(4.0);
    h.run_steps(2);
    let opts = h.state().doc.experiments.slurm.options().unwrap();
    assert_eq!(opts.partition.as_deref(), Some("debug"));
    assert_eq!(opts.time.as_deref(), Some("00:10:00"));
    assert_eq!(
        (opts.cpus_per_task, opts.gpus, opts.array_parallelism),
        (1, None, Some(4))
    );

    // A picture of the form and of a job's state, from fixed values (ids, paths and timings
    // vary from run to run).
    let reference = read_rows(&common::fixtures().join("sweep").join("results.csv")).unwrap();
    let results_file = h.state().doc.experiments.results_file();
    std::fs::create_dir_all(results_file.parent().unwrap()).unwrap();
    std::fs::copy(common::fixtures().join("sweep").join("results.csv"), &results_file).unwrap();
    let e = &mut h.state_mut().doc.experiments;
    e.reload();
    e.slurm_warning = None;
    e.slurm_status = Some(SlurmStatus {
        jobs: vec!["41".into(), "42".into()],
        cells: 23,
        reused: 4,
        done: 22,
        running: 0,
        pending: 0,
        retried: 1,
        events: vec![
            "submitted array job 41: 19 cells (4-22)".into(),
            "cell 9 ended TIMEOUT without a result (log sweeps/slurm/logs/cell-9.41.log); submitting it again (try 2 of 3)".into(),
            "submitted array job 42: 1 cells (9)".into(),
        ],
        failures: vec![
            "cell 17 (ties|K=4|N=3|g1) failed: FAILED after 1 try: out of memory\n  log: sweeps/slurm/logs/cell-17.41.log"
                .into(),
        ],
        first_result: Some(1.2),
    });
    e.outcome = Some(Outcome::OnSlurm {
        cells: 23,
        missing: 1,
        summary: String::new(),
        plots: Ok(PathBuf::new()),
    });
    h.remove_cursor();
    h.run_steps(3);
    h.get_by_label("Slurm jobs 41, 42: 22 / 23 cells done (4 reused), 0 running, 0 pending, 1 retried");
    h.get_by_label_contains("1 of 23 cells have no result");
    h.snapshot("experiments_slurm_light");

    // The tiny sweep on Slurm.
    let conf = match conf {
        Ok(c) => c,
        Err(why) if required() => panic!("MERGESCOPE_REQUIRE_SLURM=1 but Slurm could not be started: {why}"),
        Err(why) => {
            eprintln!(
                "SKIPPED the Slurm run: no Slurm cluster ({why}); set MERGESCOPE_REQUIRE_SLURM=1 to fail instead"
            );
            return;
        }
    };
    let bin = match mergescope_binary() {
        Ok(b) => b,
        Err(why) if required() => panic!("{why}"),
        Err(why) => {
            eprintln!("SKIPPED the Slurm run: {why}");
            return;
        }
    };
    // The cells load the sweep's plugins beside that binary, where `cargo build` puts them
    // (`cargo test` alone leaves them in target/<profile>/deps).
    let plugin = bin.with_file_name(format!(
        "{}mergescope_plugin_task_arithmetic{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    if !plugin.is_file() {
        let why = format!(
            "no plugin libraries beside {} for the Slurm cells ({} is missing): run `cargo build` first",
            bin.display(),
            plugin.display()
        );
        assert!(!required(), "{why}");
        eprintln!("SKIPPED the Slurm run: {why}");
        return;
    }
    eprintln!("Slurm at {conf}; the nodes run {}", bin.display());
    std::fs::remove_file(&results_file).unwrap();
    let e = &mut h.state_mut().doc.experiments;
    e.reload();
    e.slurm_status = None;
    e.outcome = None;
    e.slurm.poll_seconds = 0.5;
    e.slurm.partition.clear();
    h.run_steps(2);
    // Run one cell at a time, and cancel once two cells are in: the array job is cancelled.
    h.state_mut().doc.experiments.slurm.max_parallel = 1;
    h.get_by_label("▶ Run sweep").click();
    step_until(&mut h, "the first Slurm cells", Duration::from_secs(300), |a| {
        let e = &a.doc.experiments;
        assert!(e.error.is_none(), "{:?}", e.error);
        e.slurm_status
            .as_ref()
            .is_some_and(|s| !s.jobs.is_empty() && s.done >= 2)
    });
    let job = h.state().doc.experiments.slurm_status.as_ref().unwrap().jobs[0].clone();
    // The job's state line and the progress bar's stage both name the job.
    assert_eq!(h.get_all_by_label_contains(&format!("Slurm job {job}: ")).count(), 2);
    h.get_by_label_contains("/ 23 cells done (0 reused)");
    h.get_by_label("■ Cancel").click();
    step_until(&mut h, "the cancellation", Duration::from_secs(120), |a| {
        !a.doc.experiments.running()
    });
    let e = &h.state().doc.experiments;
    assert!(e.error.is_none(), "{:?}", e.error);
    let Some(Outcome::Cancelled { cells_done, cells }) = e.outcome.clone() else {
        panic!("not cancelled: {:?}", e.outcome)
    };
    assert_eq!(cells, 23);
    assert!((2..23).contains(&cells_done), "{cells_done} cells done");
    h.get_by_label_contains("Resume continues from there");
    let start = Instant::now();
    loop {
        let o = Command::new("squeue")
            .args(["-h", "-j", &job, "-t", "PENDING,RUNNING"])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&o.stdout).trim().is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "job {job} still queued after Cancel"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Resume: the cells still missing, four at a time; the plots fill in as they finish.
    let e = &mut h.state_mut().doc.experiments;
    e.slurm.max_parallel = 4;
    e.outcome = None;
    h.get_by_label("⟳ Resume").click();
    h.run_steps(1);
    let mut seen_job = false;
    let mut seen_partial = false;
    step_until(&mut h, "the resumed Slurm sweep", Duration::from_secs(600), |a| {
        let e = &a.doc.experiments;
        if let Some(s) = &e.slurm_status
            && e.running()
        {
            seen_job |= !s.jobs.is_empty();
            seen_partial |= s.done > 0 && s.done < s.cells && !e.rows.is_empty();
        }
        !e.running() && (e.outcome.is_some() || e.error.is_some())
    });
    let e = &h.state().doc.experiments;
    assert!(e.error.is_none(), "{:?}", e.error);
    assert!(seen_job, "the job id was shown while it ran");
    let Some(Outcome::OnSlurm {
        cells: all,
        missing,
        plots,
        ..
    }) = e.outcome.clone()
    else {
        panic!("not a Slurm outcome: {:?}", e.outcome)
    };
    assert_eq!((all, missing), (23, 0));
    let s = e.slurm_status.clone().unwrap();
    assert_eq!((s.cells, s.done, s.reused), (23, 23, cells_done));
    assert!(!s.jobs.contains(&job), "a new array job");
    assert!(s.failures.is_empty(), "{:?}", s.failures);
    assert!(
        s.events.iter().any(|l| l.starts_with("submitted array job")),
        "{:?}",
        s.events
    );
    eprintln!("slurm jobs {:?}; plots filled in while it ran: {seen_partial}", s.jobs);
    let status_line = format!(
        "Slurm job{} {}: 23 / 23 cells done ({cells_done} reused), 0 running, 0 pending, {} retried",
        if s.jobs.len() == 1 { "" } else { "s" },
        s.jobs.join(", "),
        s.retried
    );
    h.get_by_label(&status_line);
    h.get_by_label_contains(&format!(
        "done on Slurm: 23 cells ({cells_done} reused from an earlier run, {} run in Slurm job",
        23 - cells_done
    ));
    // The results, the plots and the files are the local run's.
    let rows = read_rows(&results_file).unwrap();
    assert_close_to_reference(&rows, &reference);
    assert_eq!(e.rows, rows);
    let expected = analyse(&e.spec, &rows);
    assert_eq!(e.results, expected);
    for (shown, r) in e.figures.iter().zip(&expected) {
        assert_eq!(shown, &figures(r));
    }
    let plots = plots.unwrap();
    assert!(plots.join("steps-loss.png").is_file() && e.folder.join("fits.md").is_file());
    assert!(
        e.folder.join("slurm").join("grid.json").is_file(),
        "the default work folder"
    );

    // Resume: every cell is finished, nothing is submitted.
    h.state_mut().doc.experiments.outcome = None;
    h.get_by_label("⟳ Resume").click();
    h.run_steps(1);
    step_until(&mut h, "the resumed sweep", Duration::from_secs(60), |a| {
        let e = &a.doc.experiments;
        !e.running() && (e.outcome.is_some() || e.error.is_some())
    });
    let e = &h.state().doc.experiments;
    assert!(e.error.is_none(), "{:?}", e.error);
    h.get_by_label_contains("all 23 cells were finished already");
    assert_eq!(e.slurm_status.as_ref().map(|s| s.jobs.len()), Some(0));
}
